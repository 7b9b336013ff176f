"""Many rules on the native engine: bench/rules/fraud.cep's 3 rules against 96 rules that differ
only in their constants (32 copies of each rule: thresholds and windows shifted per copy), same
events, same run, engine only from Arrow batches (bench/native_flink.py's loop). The 96 rules run
twice: with rule families (docs/rule-families.md: copies that differ only in constants share one
set of NFA runs) and without (`families=False`, every rule its own pass), for A/B.

    python -m bench.native_rules [--events 100000] [--keys 10000] [--copies 32] [--no-off]
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--copies", type=int, default=32)
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--no-off", action="store_true", help="skip the run without families")
    a = ap.parse_args(argv)
    path = rules_path(RULES, "fraud")
    base = load_rules(path)
    many = compile_rules(varied_rules_text(path.read_text(), a.copies), f"{path}-varied")
    ds = dataset("fraud", a.events, a.keys, 100)
    events = sorted(events_from_dicts(stream_of(base), ds.events), key=lambda e: (e.ts, e.seq))
    batches = arrow_batches(events, a.batch)
    n = len(events)
    load = os.getloadavg()
    res = {}
    nm = f"{len(many.rules)} rules"
    runs = [("3 rules", base, True), (nm, many, True), ("3 rules again", base, True)]
    if not a.no_off:
        runs.insert(2, (f"{nm} without families", many, False))
    for name, rs, families in runs:
        wall, cpu, results = native_run(rs, batches, families)
        res[name] = cpu
        print(f"{name}: {n / wall:,.0f} ev/s wall, {n / cpu:,.0f} ev/s CPU, {len(results)} results")
    three = min(res["3 rules"], res["3 rules again"])
    for name in res:
        if name.startswith(nm):
            print(f"ratio {name} / 3 rules (CPU): {three / res[name]:.3f}")
    print(f"load {load[0]:.1f} → {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
