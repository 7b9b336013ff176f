"""The live job's progress listener (jobs/metrics.py, `ProgressListener`): every micro-batch's
progress report reaches `Metrics.on_progress` as Spark's own JSON (batch id, input rows, the
durations, the trigger's start), through the py4j callback. A file source read with
availableNow, one file per batch: two batches, both recorded. The listener bus is drained
before looking (no wall-clock wait)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jobs.metrics import Metrics, ProgressListener

pytestmark = [pytest.mark.spark]


def test_every_progress_report_reaches_the_metrics(spark: Any, tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    for i in range(2):
        (src / f"{i}.json").write_text("\n".join(json.dumps({"n": n}) for n in range(3 + i)))
    metrics = Metrics(tmp_path / "metrics.json")
    seen: list[dict[str, Any]] = []
    on_progress = metrics.on_progress

    def record(progress: dict[str, Any]) -> None:
        seen.append(progress)
        on_progress(progress)

    metrics.on_progress = record  # type: ignore[method-assign]
    listener = metrics.attach(spark)
    try:
        q = (spark.readStream.schema("n INT").option("maxFilesPerTrigger", 1).json(str(src))
             .writeStream.queryName("listened").format("noop")
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
        q.awaitTermination()
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
    finally:
        spark._jsparkSession.streams().removeListener(listener)
    mine = sorted((p for p in seen if p["name"] == "listened"), key=lambda p: p["batchId"])
    assert [p["batchId"] for p in mine] == [0, 1]
    assert sorted(p["numInputRows"] for p in mine) == [3, 4]  # a file per batch, either order
    assert all(p["timestamp"] and "triggerExecution" in p["durationMs"] for p in seen)
    q_metrics = metrics.snapshot()["queries"]["listened"]
    assert q_metrics["batch"] == 1 and q_metrics["input_rows"] == mine[1]["numInputRows"]
    assert q_metrics["started"] == seen[-1]["timestamp"]
    assert json.loads((tmp_path / "metrics.json").read_text())["queries"]["listened"]["batch"] == 1


class _Event:
    """A listener event whose report cannot be read (the py4j side failing)."""

    def progress(self) -> Any:
        raise RuntimeError("py4j: the gateway is gone")

    name = exception = progress


def test_a_report_that_cannot_be_read_is_logged_not_raised(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    listener = ProgressListener(Metrics(tmp_path / "metrics.json"))
    with caplog.at_level("ERROR", logger="cep.metrics"):
        listener.onQueryStarted(_Event())
        listener.onQueryProgress(_Event())
        listener.onQueryTerminated(_Event())
    assert [r.getMessage() for r in caplog.records] == [
        "could not report a query's start", "could not record a progress report",
        "could not report a query's end"]
    assert all(r.exc_info and "gateway is gone" in str(r.exc_info[1]) for r in caplog.records)
