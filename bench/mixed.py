"""The embedded engine on the bundled rules (rules/): the mixed engine (native rules on the
core's loop, table/OVER/window rules on the Python loop) against the Python loop for the whole
rule set (what `build_embedded_engine` returned before the mixed engine), in one run.

`python -m bench.mixed [--events N] [--batch B] [--repeat R]`: generated fraud, trading and
machines events (cep.datagen, bench.workloads.dataset) merged by time, fed with `run_embedded`
at batch size B; the best of R runs per engine; the two must give the same alerts.
"""

from __future__ import annotations

import argparse
import time

from bench.workloads import ROOT, dataset
from cep.engines import RulesEngineFactory
from cep.runtime.bind import build_embedded_engine, build_engine, engine_kind
from cep.runtime.engine import events_from_dicts, run_embedded


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=100_000, help="events per domain")
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    ruleset = RulesEngineFactory.from_path(ROOT / "rules").ruleset()
    names = {"fraud": "transactions", "trading": "ticks", "machines": "machine_events"}
    keys = {"fraud": 10_000, "trading": 500, "machines": 5_000}
    events = []
    for domain, stream in names.items():
        ds = dataset(domain, args.events, keys[domain], 20)
        events += events_from_dicts(stream, ds.events)
    events.sort(key=lambda e: (e.ts, e.seq))
    engines = {"python loop (before)": build_engine(ruleset),
               "mixed (after)": build_embedded_engine(ruleset)}
    assert engine_kind(engines["mixed (after)"]) == "mixed"
    best: dict[str, float] = {}
    alerts: dict[str, list[str]] = {}
    for _ in range(args.repeat):
        for name, engine in engines.items():
            start = time.perf_counter()
            got = list(run_embedded(engine, events, batch_size=args.batch))
            took = time.perf_counter() - start
            best[name] = min(best.get(name, took), took)
            alerts[name] = sorted(repr((r.rule_id, r.key, r.first_ts, r.last_ts)) for r in got)
    a, b = alerts.values()
    assert a == b, "the engines disagree"
    n = len(events)
    print(f"{n:,} events (fraud+trading+machines, {args.events:,} each), batch {args.batch}, "
          f"{len(a):,} results, best of {args.repeat}")
    for name, t in best.items():
        print(f"  {name:22s} {t:7.2f} s  {n / t:10,.0f} ev/s")
    before, after = best.values()
    print(f"  ratio (after/before throughput): {before / after:.2f}x")


if __name__ == "__main__":
    main()
