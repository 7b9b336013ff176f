"""The latency benchmark's no-progress guard (bench/latency.py, `LiveJob.check_progress`): its
patient mode (tests/test_latency_quick.py) has no wall-clock window, so a job that stays alive
but stops making progress must fail the run with a message that says so, instead of hanging
it. A stand-in process (`sleep`) plays the stuck job: alive, never starting a query, never
finishing a micro-batch. No Kafka, Redis or Spark."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench.latency import LatencyBenchError, LiveJob, Services, Variant


def _stuck_job(tmp_path: Path, stall_s: float) -> LiveJob:
    variant = Variant("default", None, "default", (1000,), 10, 10)
    job = LiveJob(Services(tmp_path / "services"), tmp_path, variant)
    job.proc = subprocess.Popen(["sleep", "120"], start_new_session=True)
    job.progressed("the job was started")
    job.stall_s = stall_s
    return job


def test_a_job_alive_without_progress_fails_with_a_clear_message(tmp_path: Path) -> None:
    job = _stuck_job(tmp_path, stall_s=0.3)
    try:
        # wait_started has no timeout in the patient mode: the guard is what ends it.
        with pytest.raises(LatencyBenchError, match="alive but made no progress") as err:
            job.wait_started(None)
        assert "the job was started" in str(err.value)  # the last progress it saw
        assert "CEP_LATENCY_STALL_S" in str(err.value)
    finally:
        assert job.proc is not None
        job.proc.kill()
        job.proc.wait()


def test_progress_resets_the_guard(tmp_path: Path) -> None:
    import time

    job = _stuck_job(tmp_path, stall_s=60)
    try:
        job.check_progress()  # well within the limit
        job.stall_s = 0.2
        time.sleep(0.3)
        with pytest.raises(LatencyBenchError, match="no progress"):
            job.check_progress()
        job.progressed("micro-batch 3 read input up to offset 100")
        job.check_progress()  # progress: the guard starts again
    finally:
        assert job.proc is not None
        job.proc.kill()
        job.proc.wait()
    with pytest.raises(LatencyBenchError, match="exited"):  # an exited job: as before
        job.check_progress()
