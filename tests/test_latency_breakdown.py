"""The latency benchmark's cut of each alert's latency − LATENESS into links (bench/latency.py,
`alert_breakdown`): made-up producer ticks, micro-batches and Redis arrivals, no services.
Timeline (seconds, LATENESS 5 s; the completing event produced at t=100.0 with event time
100.000):

    tick 105.00 ──(event time 105.000: releases the match)
    batch 7 ┣━━━━━━━┫ 104.9 → 105.5   (its offsets were fixed before 105.00)
    batch 8          ┣━━━━━━━━┫ 105.5 → 106.1, emitted_at 106.0
    Redis read at 106.05

    latency − L = 1.05 = release 0 + wait 0.5 (105.0 → 105.5) + run 0.5 + deliver 0.05
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from bench.latency import (
    BENCH_LATENESS,
    BENCH_RULES,
    LatencyBenchError,
    Phase,
    alert_breakdown,
    breakdown_summary,
    emitting_batches,
    lateness_ms,
    logged_batches,
    phase_stats,
    rules_lateness,
    rules_with_lateness,
)

KEY = ("velocity", "i-1", 100_000)


def _parts(read_at: float = 106.05, emitted_ms: int = 106_000) -> tuple[object, object]:
    producer = SimpleNamespace(
        produced=[(99.99, 1), (100.0, 2), (104.99, 3), (105.0, 4), (105.01, 5)],
        completing={KEY: 100.0})
    reader = SimpleNamespace(arrived={KEY: (read_at, emitted_ms, emitted_ms)})
    return producer, reader


def _batches() -> list[dict[str, object]]:
    return [{"batch": 7, "start": 104.9, "end": 105.5}, {"batch": 8, "start": 105.5, "end": 106.1}]


def test_the_links_of_one_alert() -> None:
    producer, reader = _parts()
    (row,) = alert_breakdown(producer, reader, _batches(), 5000, 99.0, 101.0)  # type: ignore[arg-type]
    assert row["batch"] == 8 and row["skipped"] == 0
    assert row["release"] == pytest.approx(0.0)
    assert row["wait"] == pytest.approx(0.5)
    assert row["run"] == pytest.approx(0.5)
    assert row["deliver"] == pytest.approx(0.05)
    assert row["latency"] == pytest.approx(1.05)
    assert row["gap_s"] == pytest.approx(0.0)


def test_an_alert_emitted_a_batch_late_counts_a_skipped_batch() -> None:
    # Batch 8 started after the releasing tick, yet the alert came from batch 9.
    producer, reader = _parts(read_at=106.75, emitted_ms=106_700)
    batches = [*_batches(), {"batch": 9, "start": 106.1, "end": 106.8}]
    (row,) = alert_breakdown(producer, reader, batches, 5000, 99.0, 101.0)  # type: ignore[arg-type]
    assert row["batch"] == 9 and row["skipped"] == 1
    summary = breakdown_summary([row])
    assert summary["all"]["skipped_batches"] == 1
    assert summary["tail_batches"] == [9]


def test_alerts_outside_the_window_or_not_arrived_are_left_out() -> None:
    producer, reader = _parts()
    assert alert_breakdown(producer, reader, _batches(), 5000, 101.0, 102.0) == []  # type: ignore[arg-type]
    reader.arrived = {}  # type: ignore[attr-defined]
    assert alert_breakdown(producer, reader, _batches(), 5000, 99.0, 101.0) == []  # type: ignore[arg-type]


def test_batches_come_from_the_jobs_progress_lines() -> None:
    log = "\n".join([
        'x INFO cep.metrics progress {"batch": 3, "started": "2026-11-26T02:39:52.500Z", '
        '"durations_ms": {"triggerExecution": 400}, "input_rows": 10}',
        "x INFO cep.spark.delivery delivered {'batch_id': 3}",
        'x INFO cep.metrics progress {"batch": 4, "started": null, "durations_ms": {}}',
        "x INFO cep.metrics progress {not json",
    ])
    (b,) = logged_batches(log)
    assert b["batch"] == 3 and b["input_rows"] == 10
    assert b["end"] - b["start"] == pytest.approx(0.4)


def test_the_batches_that_emitted_a_phases_alerts_with_the_operators_time_in_each() -> None:
    """From the job's progress lines (jobs/metrics.py logs the job's counters with each): every
    batch from the first to the last that emitted an alert, the operator's figures as the
    change of the counters since the batch before, and the batches over twice the median."""
    def line(batch: int, ms: int, compactions: int, store_us: int) -> str:
        return "x INFO cep.metrics progress " + json.dumps({
            "batch": batch, "started": f"2026-11-26T02:39:5{batch}.000Z",
            "durations_ms": {"triggerExecution": ms}, "input_rows": 10,
            "counters": {"state_compactions": compactions, "store_us": store_us,
                         "events": 100 * batch},
            "last_delivery": {"collect_ms": 7}})
    log = "\n".join([line(2, 400, 0, 1000), line(3, 400, 0, 1500), line(4, 1300, 8, 90_000),
                     line(5, 500, 8, 91_000), line(6, 400, 8, 91_200)])
    rows = [{"batch": 5}, {"batch": 3}, {}, {"batch": 4}]  # an alert with no batch is left out
    span = emitting_batches(logged_batches(log), rows)
    assert [b["batch"] for b in span["batches"]] == [3, 4, 5]
    assert span["median_ms"] == 500 and span["long"] == [4]
    by = {b["batch"]: b for b in span["batches"]}
    assert by[4]["operator"]["state_compactions"] == 8 and by[4]["operator"]["store_us"] == 88_500
    assert by[5]["operator"]["state_compactions"] == 0 and by[3]["operator"]["events"] == 100
    assert by[3]["collect_ms"] == 7
    assert emitting_batches(logged_batches(log), [{}]) == {"batches": [], "median_ms": None,
                                                           "long": []}


def test_a_phases_batches_with_the_jobs_cpu_and_the_keys_per_event() -> None:
    """Per batch of a rate's window (`batch_detail`): the job's CPU between the monitor's
    sightings of the batch before and this one, the operator's counters' change (reloads'
    `load_us` among them); over the window, the keys the engine ran per event. A batch whose
    predecessor the monitor missed has neither."""
    def batch(n: int, seen: float, cpu: float, events: int, touched: int, load_us: int,
              ) -> dict[str, object]:
        return {"batch": n, "seen": seen, "batch_ms": 900, "input_rows": 1000, "consumed": None,
                "cpu_s": cpu, "counters": {"events": events, "keys_touched": touched,
                                           "load_us": load_us, "state_reloads": n // 3}}
    batches = {1: batch(1, 99.5, 10.0, 1000, 2000, 5_000),
               2: batch(2, 100.5, 11.5, 2000, 4000, 6_000),
               3: batch(3, 101.5, 13.5, 3000, 7000, 906_000),
               5: batch(5, 103.5, 17.0, 5000, 11_000, 907_000)}
    producer = SimpleNamespace(produced=[(99.0, 0), (104.0, 5000)], completing={})
    reader = SimpleNamespace(arrived={})
    st = phase_stats(Phase(1000, 99.0, 100.0, 104.0), producer, reader,  # type: ignore[arg-type]
                     batches, 104.0)
    by = {b["batch"]: b for b in st["batch_detail"]}
    assert sorted(by) == [2, 3, 5]
    assert by[2]["job_cpu_s"] == 1.5 and by[3]["job_cpu_s"] == 2.0
    assert by[3]["operator"]["load_us"] == 900_000 and by[3]["operator"]["state_reloads"] == 1
    assert by[5]["job_cpu_s"] is None and by[5]["operator"] is None  # batch 4 was missed
    assert st["keys_touched_per_event"] == 2.5  # (2000 + 3000) keys / (1000 + 1000) events


def test_lateness_in_ms() -> None:
    assert lateness_ms(None) == lateness_ms(BENCH_LATENESS)
    assert lateness_ms("0s") == 0
    assert lateness_ms("250ms") == 250
    assert lateness_ms("2m") == 120_000


def test_the_bench_rules_lateness_is_read_from_their_file() -> None:
    assert f"LATENESS {BENCH_LATENESS}" in BENCH_RULES.read_text()
    assert rules_lateness("STREAM s TIME BY ts LATENESS 250ms;") == "250ms"
    assert rules_lateness(rules_with_lateness(BENCH_RULES.read_text(), "0s")) == "0s"
    with pytest.raises(LatencyBenchError, match="found 2"):
        rules_lateness("LATENESS 1s; LATENESS 2s;")
