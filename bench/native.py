"""Native matcher core vs the Python matcher, embedded engine, one core, same events.

    .venv/bin/python -m bench.native [--events N] [--keys K] [--domain fraud|trading|machines]

Both engines run the bundled bench rules over the same generated stream through `run_embedded`
(batches of 10,000 events); the alerts must be identical. Prints events/s (wall and CPU) of
each and the ratio. Stage 1 of issue 13 moves only the matcher into Rust: the engine loop, the
per-event Python objects and the results are still Python, so this is not the issue's target
measurement (that one feeds Arrow batches to a native engine).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench.workloads import dataset, load_rules, rules_path, stream_of
from cep.runtime.bind import build_engine, matcher_kind
from cep.runtime.engine import events_from_dicts, run_embedded

RULES = Path(__file__).resolve().parent / "rules"


def _run(ruleset, events, use_native: bool):  # type: ignore[no-untyped-def]
    engine = build_engine(ruleset, use_native=use_native)
    kinds = {matcher_kind(r.matcher) for r in engine.rules.values()}
    t0, c0 = time.perf_counter(), time.process_time()
    alerts = [(r.kind, r.rule_id, str(r.key), r.first_ts, r.last_ts,
               tuple(sorted((k, repr(v)) for k, v in getattr(r, "measures", {}).items())))
              for r in run_embedded(engine, events, batch_size=10_000)]
    return alerts, time.perf_counter() - t0, time.process_time() - c0, kinds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--domain", default="fraud")
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=10_000)
    args = ap.parse_args()
    ruleset = load_rules(rules_path(RULES, args.domain))
    ds = dataset(args.domain, args.events, args.keys, 10)
    events = sorted(events_from_dicts(stream_of(ruleset), ds.events), key=lambda e: (e.ts, e.seq))
    py_alerts, py_wall, py_cpu, py_kinds = _run(ruleset, events, False)
    nat_alerts, nat_wall, nat_cpu, nat_kinds = _run(ruleset, events, True)
    n = len(events)
    print(f"{args.domain}: {n:,} events, {args.keys:,} keys, {len(ruleset.rules)} rules")
    print(f"  python matcher ({'/'.join(sorted(py_kinds))}): {n / py_wall:>10,.0f} ev/s wall, "
          f"{n / py_cpu:>10,.0f} ev/s cpu, {len(py_alerts)} alerts")
    print(f"  native matcher ({'/'.join(sorted(nat_kinds))}): {n / nat_wall:>10,.0f} ev/s wall, "
          f"{n / nat_cpu:>10,.0f} ev/s cpu, {len(nat_alerts)} alerts")
    print(f"  ratio native/python: {py_wall / nat_wall:.2f}x wall, {py_cpu / nat_cpu:.2f}x cpu")
    print(f"  identical alerts: {py_alerts == nat_alerts}")
    if py_alerts != nat_alerts:
        raise SystemExit("native and Python alerts differ")


if __name__ == "__main__":
    main()
