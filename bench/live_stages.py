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


def slots(tasks: list[tuple[int, int]], stage: dict[str, Any], name: str,
          cores: int) -> dict[str, Any]:
    """A stage's tasks: the wait from the stage's submission to its first task, the longest and
    shortest task (skew), and `idle_ms`: the core time in the stage that no task held (cores ×
    the stage's wall time − the tasks' durations; e.g. the last of three tasks on two cores)."""
    if not tasks:
        return {}
    durs = [b - a for a, b in tasks]
    wall = stage["end"] - stage["sub"]
    return {f"{name}_first_launch_ms": min(a for a, _ in tasks) - stage["sub"],
            f"{name}_task_max_ms": max(durs), f"{name}_task_min_ms": min(durs),
            f"{name}_idle_ms": max(0, cores * wall - sum(durs))}


def busy(tasks: list[tuple[int, int]], start: int, end: int, cores: int) -> dict[str, Any]:
    """How much of `cores` × the job's wall time its tasks ran (a task holds a core from its
    launch to its finish; JVM or Python, running or waiting): `slots_busy` in [0, 1]."""
    wall = max(end - start, 1)
    held = sum(min(b, end) - max(a, start) for a, b in tasks if b > start and a < end)
    return {"slots_busy": round(held / (cores * wall), 3)}


def batches(path: Path, cores: int = 2) -> list[dict[str, Any]]:
    """Per Spark job with two or more stages (a micro-batch: map stage, stateful stage)."""
    jobs: dict[int, dict[str, Any]] = {}
    stages: dict[int, dict[str, Any]] = {}
    tasks: dict[int, list[tuple[int, int]]] = {}  # stage -> [(launch, finish) ms]
    for e in events(path):
        kind = e.get("Event")
        if kind == "SparkListenerTaskEnd":
            t = e.get("Task Info") or {}
            if t.get("Launch Time") and t.get("Finish Time"):
                tasks.setdefault(e["Stage ID"], []).append((t["Launch Time"], t["Finish Time"]))
        elif kind == "SparkListenerJobStart":
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
        ids = sorted((s for s in job["stages"] if s in stages and stages[s]["sub"]),
                     key=lambda s: stages[s]["sub"])
        if len(ids) < 2 or "end" not in job:
            continue
        m, f = stages[ids[0]], stages[ids[-1]]
        out.append({**slots(tasks.get(ids[0], []), m, "map", cores),
                    **slots(tasks.get(ids[-1], []), f, "stateful", cores),
                    **busy([t for s in ids for t in tasks.get(s, [])], job["start"],
                           job["end"], cores),
                    "job": jid, "rows": m["rows"], "job_ms": job["end"] - job["start"],
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
    med = {k: statistics.median(r[k] for r in rows if k in r) for k in rows[0] if k != "job"}
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
