"""How a live micro-batch's Spark job splits: its map stage (the Kafka read and the one Python
pass) and its stateful stage (the operator), from a Spark event log (`spark.eventLog.enabled`;
`bench.live_cpu` with STAGES=1 writes one per run). Per job (one per micro-batch: the delivery's
collect): the stages' wall times and tasks, the tasks' run time and JVM CPU (the executor's
thread only: a Python worker's CPU is not in it), and the gaps around them.

    python -m bench.live_stages EVENT_LOG_DIR [FIRST_JOB]

Session 15 (bench/results/latency_live.md, "Session 15, live15m").
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def events(path: Path) -> Iterator[dict[str, Any]]:
    """The events of a log: a file (zstd-compressed or not) or a rolling log's directory."""
    if path.is_dir():
        parts = sorted(path.rglob("events_*"), key=lambda q: int(q.name.split("_")[1]))
        for q in parts:
            yield from events(q)
        return
    if ".zstd" in path.name:
        text = subprocess.run(["zstd", "-dc", str(path)], capture_output=True,
                              check=False).stdout.decode()
    else:
        text = path.read_text()
    for line in text.splitlines():
        try:
            yield json.loads(line)
        except ValueError:  # a log still being written ends in a partial line
            pass


def batches(path: Path) -> list[dict[str, Any]]:
    """Per Spark job with two or more stages (a micro-batch: map stage, stateful stage)."""
    jobs: dict[int, dict[str, Any]] = {}
    stages: dict[int, dict[str, Any]] = {}
    for e in events(path):
        kind = e.get("Event")
        if kind == "SparkListenerJobStart":
            jobs[e["Job ID"]] = {"start": e["Submission Time"], "stages": e["Stage IDs"]}
        elif kind == "SparkListenerJobEnd" and e["Job ID"] in jobs:
            jobs[e["Job ID"]]["end"] = e["Completion Time"]
        elif kind == "SparkListenerStageCompleted":
            info = e["Stage Info"]
            acc = {a["Name"]: a.get("Value") for a in info.get("Accumulables", [])}
            stages[info["Stage ID"]] = {
                "sub": info.get("Submission Time"), "end": info.get("Completion Time"),
                "tasks": info["Number of Tasks"],
                "run": int(acc.get("internal.metrics.executorRunTime") or 0),
                "cpu": int(acc.get("internal.metrics.executorCpuTime") or 0) // 10**6,
                "rows": int(acc.get("internal.metrics.input.recordsRead") or 0)}
    out = []
    for jid, job in sorted(jobs.items()):
        ran = sorted((stages[s] for s in job["stages"] if s in stages and stages[s]["sub"]),
                     key=lambda s: s["sub"])
        if len(ran) < 2 or "end" not in job:
            continue
        m, f = ran[0], ran[-1]
        out.append({"job": jid, "rows": m["rows"], "job_ms": job["end"] - job["start"],
                    "map_ms": m["end"] - m["sub"], "map_tasks": m["tasks"],
                    "map_run_ms": m["run"], "map_jvm_cpu_ms": m["cpu"],
                    "between_ms": f["sub"] - m["end"],
                    "stateful_ms": f["end"] - f["sub"], "stateful_tasks": f["tasks"],
                    "stateful_run_ms": f["run"], "stateful_jvm_cpu_ms": f["cpu"],
                    "around_ms": (m["sub"] - job["start"]) + (job["end"] - f["end"])})
    return out


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over `rows`, and the map stage's share of the job's wall time."""
    if not rows:
        return {}
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "job"}
    total = sum(r["job_ms"] for r in rows) or 1
    med["map_share"] = round(sum(r["map_ms"] for r in rows) / total, 3)
    med["stateful_share"] = round(sum(r["stateful_ms"] for r in rows) / total, 3)
    med["jobs"] = len(rows)
    return med


def main() -> None:
    rows = batches(Path(sys.argv[1]))[int(sys.argv[2]) if len(sys.argv) > 2 else 0:]
    for r in rows:
        print(json.dumps(r))
    print(json.dumps({"median": summary(rows)}))


if __name__ == "__main__":
    main()
