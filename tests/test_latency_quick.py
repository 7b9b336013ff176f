"""The end-to-end latency benchmark (bench/latency.py) in its quick mode, so that it does not rot:
its own Kafka broker and Redis server, `cep run` as a process, one rate for 10 s. What it checks is
completeness, not speed: every alert the producer completed arrives in Redis, with a
positive, finite latency, and nothing else arrives. No wall-clock window (issue 14: a loaded CI
machine is not a stopwatch): the run is `patient`, so the job's start, its first micro-batch and
the drain are waited for as long as they take, and the drain ends on the job's own progress —
once a finished micro-batch's watermark has passed every measured completing event, the job has
released them, and each must then be in Redis. What bounds it is progress, not time: a job that
stays alive but neither starts its query nor finishes a micro-batch reading new input for
`bench.latency.STALL_S` (900 s; `CEP_LATENCY_STALL_S`) fails the run with a message naming its
last progress (tests/test_latency_guard.py), so a stuck job cannot hang CI. How fast is the
benchmark's business (`make bench`: bench/results/latency.md), never a test's."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytestmark = [pytest.mark.services, pytest.mark.spark, pytest.mark.slow]


def test_quick_latency_run_sees_alerts_with_positive_finite_latency(tmp_path: Path) -> None:
    from bench.latency import render_md, run

    # No fixed warm-up: the warm-up still lasts until the job has finished two micro-batches at
    # the rate and caught up (bench.latency._warm_up); a fixed 10 s before that only added time.
    res = run(rates=(1000,), seconds=10, warmup=0, work=tmp_path, quick=True, patient=True)
    (v,) = res["variants"]
    (r,) = v["rates"]
    assert r["alerts_expected"] > 0
    assert r["alerts_arrived"] == r["alerts_expected"], r
    assert v["unexpected_alerts"] == 0  # the background never matches a rule
    assert v["late_events"] in (0, None)
    for value in (r["min_s"], r["arrived_max_s"]):
        assert 0 < value < math.inf
    p50 = r["latency_s"]["p50"]
    assert 0 < p50["s"] < math.inf
    assert r["achieved_rate"] > 0
    # Each arrived alert is cut into links, from every batch's start in the job's log (the links
    # are differences of consecutive timestamps: their sum is the latency by construction).
    assert r["breakdown"]["all"]["alerts"] == r["alerts_arrived"]
    rows = r["alerts_detail"]
    # Read from Redis after the job emitted it. (`release` and `wait` may be a few ms below 0: the
    # event is sent just after its tick's time, and a batch fixes its offsets just after its
    # start; `run` is >= 0 by construction.)
    assert all(row["deliver"] >= 0 for row in rows), rows
    # Most alerts come from the first batch that started after their releasing event.
    assert sum(row.get("skipped", 0) for row in rows) <= len(rows), rows
    md = render_md(res)
    assert md.startswith("### End-to-end latency")
    assert "| default |" in md
