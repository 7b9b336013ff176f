"""The end-to-end latency benchmark (bench/latency.py) in its quick mode, so that it does not rot:
its own Kafka broker and Redis server, `cep run` as a process, one rate for 10 s. Alerts must come
back through Redis with positive, finite latencies. Nothing is timed against a target (the
machine is shared; issue 7: tests do not time anything)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

# Not in `make test`: the live job only just keeps up at 1,000 events/s. On the clean-clone CI
# run of session 4 (load 2-4) its batches took 11 s for 14k events: the operator spent 637 µs per
# event (metrics.json python_us) while the engine alone costs 28 µs/event with native matchers;
# the suspect, not yet profiled, is the state store (5.8k reads/writes of ~13 KB buckets). The
# run passed once on a quiet machine (92 s) and failed in CI. Issue 14 (the live job keeps up)
# is the fix; until then `make bench-quick` runs it.
pytestmark = [pytest.mark.services, pytest.mark.spark, pytest.mark.bench]


def test_quick_latency_run_sees_alerts_with_positive_finite_latency(tmp_path: Path) -> None:
    from bench.latency import render_md, run

    res = run(rates=(1000,), seconds=10, warmup=10, work=tmp_path, quick=True)
    (v,) = res["variants"]
    (r,) = v["rates"]
    assert r["alerts_expected"] > 0
    assert r["alerts_arrived"] > 0, r
    assert v["unexpected_alerts"] == 0  # the background never matches a rule
    assert v["late_events"] in (0, None)
    for value in (r["min_s"], r["arrived_max_s"]):
        assert 0 < value < math.inf
    p50 = r["latency_s"]["p50"]
    assert 0 < p50["s"] < math.inf
    assert r["achieved_rate"] > 0
    md = render_md(res)
    assert md.startswith("### End-to-end latency")
    assert "| default |" in md
