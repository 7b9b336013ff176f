"""What a stateful operator shaped like ours costs in Spark itself, without our work: the
ceiling's no-op (bench.live_ceiling's `noop`, unchanged) against the same job with our
operator's obligations to Spark added (`spark_costs` below), and `cep run` (ours), alternated
in the same minutes over one loaded topic (bench.live_ceiling's input, Services and figures).

`spark_costs` = the no-op's job plus, as `cep run`'s operator (cep/spark/operator.py with the
native store, cep/runtime/state_store.py): an event-time watermark and `timeMode="EventTime"`
(ours' `match_packed`; the no-op's is "None"), one MapState declared per task (`nrows`, ours'
log rows, its record in row -1), and per call the record read, one row of `ROW_BYTES` appended
with the record rewritten, and the shard's timer replaced (a delete and a register: ours
replaces its timer on nearly every call, since its wake is due in the next batch). No engine,
no map-stage Python pass, no delivery sinks: what is left between it and ours is our own work.
The watermark's column is the Kafka record's timestamp (the no-op parses no JSON); its timers
are set 1 s past the watermark, due in a later batch, as ours' are.

    python -m bench.live_spark_costs --events 400000 --batch 20000 --rounds 2 --json out.json

Session 26 (docs/spark-runtime.md, "... (session 26, live26)").
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

from bench.latency import Services
from bench.live_ceiling import STATEFUL_JOB, load_topic, run_noop, run_ours
from cep.config import Settings

ROW_BYTES = 50_000  # about one compressed log row of ours at this input (session 16: ~51 KB)
COLUMNS = ["kind", "rule_id", "key", "id", "payload"]

# The no-op's job (bench.live_ceiling's template) with this module's processor, the Kafka
# record's timestamp as the event-time watermark's column, and event-time timers.
JOB = STATEFUL_JOB.substitute(
    module="bench.live_spark_costs", app="cep-spark-costs",
    columns=',\n                  F.col("timestamp").alias("event_time")',
    watermark='rows = rows.withWatermark("event_time", "5 seconds").drop("event_time")\n',
    processor="SparkCostsProcessor", time_mode="EventTime")


def _stats(events: int) -> pd.DataFrame:
    return pd.DataFrame([("stats", "", "", "", json.dumps({"events": events}))],
                        columns=COLUMNS)


class SparkCostsProcessor(StatefulProcessor):
    """The no-op's reading of its rows, plus our operator's state and timer calls (the module
    docstring); the record is a JSON text: (rows, timer)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        from pyspark.sql.types import BinaryType, IntegerType, StructField, StructType

        self.handle = handle
        self.log = handle.getMapState(
            "nrows", StructType([StructField("row", IntegerType())]),
            StructType([StructField("v", BinaryType()), StructField("prev", BinaryType())]))
        self.row = os.urandom(ROW_BYTES)  # incompressible, as a zstd frame

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                        timerValues: Any) -> Iterator[pd.DataFrame]:
        events = 0
        for pdf in rows:
            events += int(pdf["primary"].sum())
        got = self.log.getValue((-1,)) if self.log.containsKey((-1,)) else None
        n, timer = json.loads(got[0]) if got is not None else (0, None)
        self.log.updateValue((n,), (self.row, b""))
        want = int(timerValues.getCurrentWatermarkInMs()) + 1000
        if timer is not None:
            self.handle.deleteTimer(timer)
        self.handle.registerTimer(want)
        self.log.updateValue((-1,), (json.dumps([n + 1, want]).encode(), b""))
        yield _stats(events)

    def handleExpiredTimer(self, key: Any, timerValues: Any,
                           expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        got = self.log.getValue((-1,))
        n = json.loads(got[0])[0] if got is not None else 0
        self.log.updateValue((-1,), (json.dumps([n, None]).encode(), b""))
        yield _stats(0)

    def close(self) -> None:
        pass


run_costs = functools.partial(run_noop, job=JOB, variant="spark_costs")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.live_spark_costs")
    ap.add_argument("--events", type=int, default=400_000)
    ap.add_argument("--batch", type=int, default=20_000)
    ap.add_argument("--rate", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--skip", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("/tmp/cep-live-spark-costs"))
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    shards = Settings().live_shards
    a.work.mkdir(parents=True, exist_ok=True)
    services = Services(a.work / "services")
    out: dict[str, Any] = {"events": a.events, "batch": a.batch, "load_start": os.getloadavg(),
                           "runs": [], "ratios": []}
    jobs = [("noop", run_noop), ("spark_costs", run_costs), ("ours", run_ours)]
    try:
        services.start()
        topic = f"spark-costs-{os.getpid()}"
        load_topic(services.bootstrap, topic, a.events, a.rate)
        for r in range(a.rounds):
            order = jobs if r % 2 == 0 else jobs[::-1]
            got = {}
            for name, fn in order:
                res = fn(services, a.work, topic, a.batch, a.skip, str(r), shards=shards)
                res["load"] = os.getloadavg()
                out["runs"].append(res)
                got[name] = res["rows_per_s"]
                print(json.dumps({k: v for k, v in res.items() if k != "batch_ms"}), flush=True)
            if all(got.values()):
                ratios = {"ours/noop": got["ours"] / got["noop"],
                          "ours/spark_costs": got["ours"] / got["spark_costs"],
                          "spark_costs/noop": got["spark_costs"] / got["noop"]}
                out["ratios"].append(ratios)
                print(f"round {r}: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()),
                      flush=True)
    finally:
        services.stop()
    out["load_end"] = os.getloadavg()
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
