"""`bench.live_stages`: a micro-batch's map and stateful stages from a Spark event log (a
rolling log's directory, as `bench.live_cpu` STAGES=1 writes it). A hand-made log: a job of two
stages (a micro-batch), a one-stage job (not one), a last line still being written."""

from __future__ import annotations

import json
from pathlib import Path

from bench.live_stages import batches, summary


def _stage(sid: int, sub: int, end: int, tasks: int, run: int, cpu_ns: int, rows: int) -> dict:
    acc = [{"Name": "internal.metrics.executorRunTime", "Value": run},
           {"Name": "internal.metrics.executorCpuTime", "Value": cpu_ns},
           {"Name": "internal.metrics.input.recordsRead", "Value": rows}]
    return {"Event": "SparkListenerStageCompleted",
            "Stage Info": {"Stage ID": sid, "Submission Time": sub, "Completion Time": end,
                           "Number of Tasks": tasks, "Accumulables": acc}}


def _task(sid: int, launch: int, finish: int) -> dict:
    return {"Event": "SparkListenerTaskEnd", "Stage ID": sid,
            "Task Info": {"Launch Time": launch, "Finish Time": finish}}


def test_a_micro_batch_is_its_map_stage_then_its_stateful_stage(tmp_path: Path) -> None:
    log = tmp_path / "eventlog_v2_local-1"
    log.mkdir()
    first = [{"Event": "SparkListenerJobStart", "Job ID": 0, "Submission Time": 1000,
              "Stage IDs": [0, 1]},
             # three read tasks on two cores: two at once, then the third alone
             _task(0, 1010, 1200), _task(0, 1010, 1210), _task(0, 1200, 1400),
             _stage(0, 1010, 1400, 3, 900, 500_000_000, 60000)]
    second = [_task(1, 1405, 2100), _stage(1, 1405, 2100, 1, 690, 400_000_000, 0),
              {"Event": "SparkListenerJobEnd", "Job ID": 0, "Completion Time": 2110},
              {"Event": "SparkListenerJobStart", "Job ID": 1, "Submission Time": 3000,
               "Stage IDs": [2]},
              _stage(2, 3000, 3050, 1, 40, 0, 10),
              {"Event": "SparkListenerJobEnd", "Job ID": 1, "Completion Time": 3060}]
    # The parts in the order of their number, not of their names (10 after 2).
    (log / "events_10_local-1").write_text("\n".join(json.dumps(e) for e in second) + '\n{"Ev')
    (log / "events_2_local-1").write_text("\n".join(json.dumps(e) for e in first) + "\n")

    rows = batches(log)
    assert rows == [{"job": 0, "rows": 60000, "job_ms": 1110, "map_ms": 390, "map_tasks": 3,
                     "map_run_ms": 900, "map_jvm_cpu_ms": 500, "between_ms": 5,
                     "stateful_ms": 695, "stateful_tasks": 1, "stateful_run_ms": 690,
                     "stateful_jvm_cpu_ms": 400, "around_ms": 20,
                     # 2 cores x 390 ms, less the tasks' 190 + 200 + 200 ms
                     "map_first_launch_ms": 0, "map_task_max_ms": 200, "map_task_min_ms": 190,
                     "map_idle_ms": 190,
                     "stateful_first_launch_ms": 0, "stateful_task_max_ms": 695,
                     "stateful_task_min_ms": 695, "stateful_idle_ms": 695,
                     # the tasks' 1,285 ms over 2 cores x the job's 1,110 ms
                     "slots_busy": round(1285 / 2220, 3)}]
    s = summary(rows)
    assert (s["map_share"], s["stateful_share"], s["jobs"]) == (round(390 / 1110, 3),
                                                                 round(695 / 1110, 3), 1)
    assert summary([]) == {}
