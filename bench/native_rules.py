"""Many rules on the native engine: bench/rules/fraud.cep's 3 rules against 96 rules that differ
only in their constants (32 copies of each rule: thresholds and windows shifted per copy), same
events, same run, engine only from Arrow batches (bench/native_flink.py's loop). The 96 rules run
twice: with rule families (docs/rule-families.md: copies that differ only in constants share one
set of NFA runs) and without (`families=False`, every rule its own pass), for A/B.

Method (session 20, docs/native-core.md "Many rules: ... (session 20, rules20f)"): `--warmup`
untimed rounds of both configurations, then `--pairs` pairs of timed runs, the two configurations
alternated in the same process (the order swapped every pair), each run started after a
`gc.collect()` with the previous run's results dropped; the figure is each pair's ratio (3-rule
CPU time / 96-rule CPU time) and their median. Before, one 96-rule run was compared with the
best of two 3-rule runs, the first of them the process's first engine run (slower: page faults,
first calls), on a machine whose speed drifts within seconds.

    python -m bench.native_rules [--events 100000] [--keys 10000] [--copies 32] [--pairs 6]
                                 [--no-off] [--out results.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
from pathlib import Path
from typing import Any

from bench.native_flink import arrow_batches, native_run
from bench.workloads import dataset, load_rules, rules_path, stream_of
from cep.compile import compile_rules
from cep.runtime.engine import events_from_dicts

RULES = Path(__file__).resolve().parent / "rules"


def varied_rules_text(text: str, copies: int) -> str:
    """`copies` copies of every RULE block, renamed, each copy with its numbers shifted: decimal
    thresholds by i/100, integer thresholds by i, windows by i of their unit."""
    blocks = re.split(r"(?m)^(?=RULE )", text)
    header, rules = blocks[0], blocks[1:]
    out = [header]
    for i in range(copies):
        for block in rules:
            b = re.sub(r"^RULE (\w+)", lambda m, i=i: f"RULE {m.group(1)}_{i}", block, count=1)
            b = re.sub(r"(?<![\w.{])(\d+\.\d+)",
                       lambda m, i=i: f"{float(m.group(1)) + i / 100:.2f}", b)
            b = re.sub(r"(>=|<=|<|>) (\d+)(?![\d.])",
                       lambda m, i=i: f"{m.group(1)} {int(m.group(2)) + i}", b)
            b = re.sub(r"WITHIN (\d+)(ms|s|m|h)",
                       lambda m, i=i: f"WITHIN {int(m.group(1)) + i}{m.group(2)}", b)
            out.append(b)
    return "".join(out)


def measure(n_events: int, keys: int, copies: int = 32, batch: int = 100_000,
            n_pairs: int = 6, warmup: int = 2, off_run: bool = True) -> dict[str, Any]:
    """The method above: the pairs' ratios (3-rule CPU time / many-rule CPU time), their median,
    min and max, and (`off_run`) one run of the many rules without families."""
    path = rules_path(RULES, "fraud")
    base = load_rules(path)
    many = compile_rules(varied_rules_text(path.read_text(), copies), f"{path}-varied")
    ds = dataset("fraud", n_events, keys, 100)
    events = sorted(events_from_dicts(stream_of(base), ds.events), key=lambda e: (e.ts, e.seq))
    batches = arrow_batches(events, batch)
    n = len(events)
    # Only the batches are needed from here: the generator's dicts and events are not part of
    # the engine's heap (a full collection the runs trigger would walk them; as bench.native_flink
    # does; measured in session 20: no change in the ratio beyond the noise).
    del events, ds
    nm = f"{len(many.rules)} rules"
    load0 = os.getloadavg()[0]

    def run(rs: object, families: bool) -> tuple[float, float, int]:
        gc.collect()
        wall, cpu, results = native_run(rs, batches, families)
        return wall, cpu, len(results)

    for _ in range(warmup):  # not timed: the process's first runs fault in its heap
        for rs in (base, many):
            run(rs, True)
    pairs: list[dict[str, Any]] = []
    ratios: list[float] = []
    threes: list[float] = []
    for p in range(n_pairs):
        order = [("3 rules", base), (nm, many)]
        if p % 2:
            order.reverse()
        got = {}
        for name, rs in order:
            wall, cpu, nres = run(rs, True)
            got[name] = (wall, cpu, nres, os.getloadavg()[0])
            print(f"pair {p + 1} {name}: {n / wall:,.0f} ev/s wall, {n / cpu:,.0f} ev/s CPU, "
                  f"{nres} results, load {got[name][3]:.1f}", flush=True)
        ratio = got["3 rules"][1] / got[nm][1]
        ratios.append(ratio)
        threes.append(n / got["3 rules"][1])
        pairs.append({"pair": p + 1, "first": order[0][0], "ratio": ratio,
                      **{f"{k} ev/s CPU": n / v[1] for k, v in got.items()},
                      **{f"{k} results": v[2] for k, v in got.items()},
                      **{f"{k} load": v[3] for k, v in got.items()}})
        print(f"pair {p + 1} ratio {nm} / 3 rules (CPU): {ratio:.3f}", flush=True)
    med = statistics.median(ratios)
    under = sum(r < 0.5 for r in ratios)
    print(f"ratio {nm} / 3 rules (CPU), {len(ratios)} pairs: median {med:.3f}, "
          f"min {min(ratios):.3f}, max {max(ratios):.3f}, under 0.5 in {under}")
    off = None
    if off_run:
        wall, cpu, nres = run(many, False)
        off = n / cpu
        three = statistics.median(threes)
        print(f"{nm} without families: {n / wall:,.0f} ev/s wall, {off:,.0f} ev/s CPU, "
              f"{nres} results; over the median 3-rule run {off / three:.3f}")
    load1 = os.getloadavg()[0]
    print(f"load {load0:.1f} → {load1:.1f}")
    return {"events": n, "keys": keys, "copies": copies, "rules": len(many.rules),
            "warmup": warmup, "pairs": pairs, "median": med, "min": min(ratios),
            "max": max(ratios), "under_0.5": under, "without_families_ev_s": off,
            "load": [load0, load1]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--copies", type=int, default=32)
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--pairs", type=int, default=6, help="timed pairs (3 rules, many rules)")
    ap.add_argument("--warmup", type=int, default=2,
                    help="untimed rounds of both configurations first (page faults, first calls)")
    ap.add_argument("--no-off", action="store_true", help="skip the run without families")
    ap.add_argument("--out", type=Path, default=None, help="write the runs as JSON here")
    a = ap.parse_args(argv)
    if a.pairs < 1:
        ap.error("--pairs must be at least 1 (the figure is their median)")
    res = measure(a.events, a.keys, a.copies, a.batch, a.pairs, a.warmup, not a.no_off)
    if a.out is not None:
        a.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
