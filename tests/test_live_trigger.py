"""The live job's trigger, JIT and read split (jobs/live.py, `live_trigger`, `live_jvm`,
`read_split`): which Spark trigger a `cep run` gets from `--once`, the `trigger` setting and
`--trigger`, which JIT its JVMs run, and how many records a Kafka read task takes at most.
No Spark here: the choice is made before the query starts. What the defaults cost and save
is measured in bench/results/latency_live.md, not here."""

from __future__ import annotations

import pytest

from cep.config import QUICK_JIT, Settings, load_settings
from jobs.live import (
    ARROW_BATCH_ROWS,
    CONTINUOUS,
    LIVE_JAVA_OPTIONS,
    LiveOptions,
    arrow_batch_conf,
    live_jvm,
    live_trigger,
    live_worker_env,
    local_shuffle_conf,
    read_split,
)


def _opts(**kw: object) -> LiveOptions:
    return LiveOptions(rules="rules", checkpoint="ck", **kw)  # type: ignore[arg-type]


def test_default_starts_each_batch_when_the_previous_is_done() -> None:
    assert live_trigger(Settings(), _opts()) == CONTINUOUS == {"processingTime": "0 seconds"}


@pytest.mark.parametrize(("setting", "seconds", "once", "want"), [
    ("default", 2.0, False, {"processingTime": "2.0 seconds"}),          # --trigger 2
    ("processingTime:500ms", None, False, {"processingTime": "500 milliseconds"}),
    ("processingTime:500ms", 2.0, False, {"processingTime": "500 milliseconds"}),  # setting wins
    ("processingTime:500ms", 2.0, True, {"availableNow": True}),        # --once wins
    ("default", None, True, {"availableNow": True}),
])
def test_precedence(setting: str, seconds: float | None, once: bool,
                    want: dict[str, object]) -> None:
    got = live_trigger(Settings(trigger=setting), _opts(trigger_seconds=seconds, once=once))
    assert got == want


def test_the_live_jvm_runs_the_quick_jit_unless_options_are_given() -> None:
    assert live_jvm(Settings()).java_options == LIVE_JAVA_OPTIONS
    assert LIVE_JAVA_OPTIONS.startswith(QUICK_JIT)
    assert live_jvm(Settings(java_options="-Xmx4g")).java_options == "-Xmx4g"


def test_the_live_workers_run_mimalloc_without_huge_pages_unless_the_environment_says(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MIMALLOC_ALLOW_THP", raising=False)
    assert live_worker_env() == {"spark.executorEnv.MIMALLOC_ALLOW_THP": "0"}
    # The job's own setting reaches the workers as it is.
    monkeypatch.setenv("MIMALLOC_ALLOW_THP", "1")
    assert live_worker_env() == {"spark.executorEnv.MIMALLOC_ALLOW_THP": "1"}


def test_a_batch_is_read_by_one_task_per_core_unless_set_otherwise() -> None:
    """Spark's `minPartitions`: by default the session's cores (a one-partition topic's batch
    in that many equal tasks, whatever its size); `live_read_tasks` sets it, and
    `live_read_task_rows` adds `maxRecordsPerPartition` (ceil(records / that) tasks)."""
    assert read_split(Settings(), 2) == {"minPartitions": 2}
    assert read_split(Settings(live_read_tasks=1), 2) == {"minPartitions": 1}
    env = {"CEP_LIVE_READ_TASK_ROWS": "50000"}
    assert read_split(load_settings(env=env), 4) == {"minPartitions": 4,
                                                     "maxRecordsPerPartition": 50000}


def test_a_read_task_hands_its_rows_to_python_as_one_arrow_batch() -> None:
    assert arrow_batch_conf(Settings()) == {
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(ARROW_BATCH_ROWS)}
    assert arrow_batch_conf(Settings(live_read_task_rows=25000)) == {
        "spark.sql.execution.arrow.maxRecordsPerBatch": "25000"}


def test_a_local_job_does_not_compress_its_shuffle() -> None:
    assert local_shuffle_conf(Settings()) == {"spark.shuffle.compress": "false"}
    assert local_shuffle_conf(Settings(spark_master="spark://host:7077")) == {}
