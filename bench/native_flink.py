"""Issue 13's headline ratio: the native engine, embedded, engine only from Arrow batches on one
core, against Flink CEP's two-slot throughput measured in the same run.

Workload: bench/run.py's fraud data set (`dataset("fraud", events, keys, inject)`: 1M events,
10k cards, 100 injected fraud cases by default) and bench/rules/fraud.cep (3 rules; Flink runs
the same patterns, bench/flink/.../FraudPatterns.java, parallelism 2, its last warm run counts).

Native: the events sorted by (ts, seq) and cut into pyarrow RecordBatches of `--batch` events
(columns stream, seq and the event fields) before timing; timed: `NativeEngine.ingest_batch` per
batch with the watermark from before it, then the end of input (`advance(..., end_of_input)`);
events/s = events / wall time of that loop (CPU time of the process reported too). Best of
`--runs` runs, each on a fresh engine and store. The alerts (kind, rule, key, first/last time) of
the native engine and of Flink are compared (as sets).

    python -m bench.native_flink [--events 1000000] [--keys 10000] [--batch 100000] [--runs 3]
                                 [--no-flink] [--out bench/results/native.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from bench.native import arrow_batches
from bench.workloads import dataset, files_for, load_rules, rules_path, stream_of
from cep.runtime.bind import build_embedded_engine, engine_kind
from cep.runtime.engine import NEG_INF, MemoryKeyStore, events_from_dicts

RULES = Path(__file__).resolve().parent / "rules"


def native_run(ruleset: Any, batches: list[tuple[Any, int]],
               families: bool | None = None) -> tuple[float, float, list[Any]]:
    engine = build_embedded_engine(ruleset, families=families)
    assert engine_kind(engine) == "native"
    store, max_ts = MemoryKeyStore(), NEG_INF
    results: list[Any] = []
    t0, c0 = time.perf_counter(), time.process_time()
    for rb, top in batches:
        results.extend(engine.ingest_batch(store, rb, max_ts).matches)
        max_ts = max(max_ts, top)
    results.extend(engine.advance(store, max_ts, end_of_input=max_ts).matches)
    return time.perf_counter() - t0, time.process_time() - c0, results


def native_runs(ruleset: Any, ds: Any, batch: int, runs: int) -> dict[str, Any]:
    """`runs` timed runs of `native_run` over the data set `ds` as Arrow batches of `batch`
    events (built before timing): the event count, each run's (wall s, CPU s), the best wall
    figure in events/s and the match alerts (kind, rule, key, first ts, last ts) of the last."""
    events = sorted(events_from_dicts(stream_of(ruleset), ds.events), key=lambda e: (e.ts, e.seq))
    n = len(events)
    batches = arrow_batches(events, batch)
    del events
    timed: list[tuple[float, float]] = []
    alerts: set[tuple[Any, ...]] = set()
    for _ in range(runs):
        wall, cpu, results = native_run(ruleset, batches)
        timed.append((wall, cpu))
        alerts = {(r.kind, r.rule_id, str(r.key), r.first_ts, r.last_ts)
                  for r in results if r.kind == "match"}
    return {"events": n, "batch": batch, "runs": timed,
            "events_per_s": n / min(w for w, _ in timed), "alerts": alerts}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--inject", type=int, default=100)
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-flink", action="store_true")
    ap.add_argument("--work", type=Path, default=Path("/tmp/cep-native-flink"))
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    load0 = os.getloadavg()
    ruleset = load_rules(rules_path(RULES, "fraud"))
    ds = dataset("fraud", a.events, a.keys, a.inject)
    measured = native_runs(ruleset, ds, a.batch, a.runs)
    n, runs, native_alerts = measured["events"], measured["runs"], measured["alerts"]
    best_wall = min(w for w, _ in runs)
    print(f"native, Arrow batches of {a.batch:,}: {n:,} events, runs "
          + ", ".join(f"{n / w:,.0f} ev/s wall ({n / c:,.0f} CPU)" for w, c in runs)
          + f"; {len(native_alerts)} match alerts")
    flink: dict[str, Any] | None = None
    if not a.no_flink:
        from bench import flink_peer

        data = files_for(ds, stream_of(ruleset), a.work, 10)
        flink = flink_peer.run(data, runs=2)
        print(f"flink (parallelism 2, warm run): {flink['events_per_s']:,.0f} ev/s "
              f"(cold {flink['cold_events_per_s']:,.0f}); {len(flink['alerts'])} alerts")
    load1 = os.getloadavg()
    print(f"load {load0[0]:.1f} → {load1[0]:.1f}")
    ratio = (n / best_wall) / flink["events_per_s"] if flink else None
    if ratio is not None:
        print(f"ratio native (best wall) / flink (warm): {ratio:.2f}x")
    if a.out is not None:
        cmd = "python -m bench.native_flink " + " ".join(sys.argv[1:] if argv is None else argv)
        lines = [f"\n## Native engine vs Flink CEP, fraud {n:,} events, {a.keys:,} cards, "
                 f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n",
                 f"`{cmd}` on {platform.machine()} ({os.cpu_count()} cores, shared), load "
                 f"{load0[0]:.1f} at start, {load1[0]:.1f} at end. Native: one process (one "
                 f"core), Arrow batches of {a.batch:,} built before timing, engine only; "
                 "Flink: MiniCluster, parallelism 2, warm run.\n",
                 "| engine | ev/s (wall) | ev/s (CPU) | match alerts |", "|---|---|---|---|"]
        for i, (w, c) in enumerate(runs):
            lines.append(f"| native, run {i + 1} | {n / w:,.0f} | {n / c:,.0f} | "
                         f"{len(native_alerts)} |")
        if flink:
            lines.append(f"| Flink CEP, 2 slots (warm; cold {flink['cold_events_per_s']:,.0f})"
                         f" | {flink['events_per_s']:,.0f} | | {len(flink['alerts'])} |")
            lines.append(f"\nRatio (best native wall / Flink warm): **{ratio:.2f}x** "
                         "(issue 13's target: 17x).")
        with a.out.open("a") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
