"""The Rust core's cost in the live Spark operator's calls, offline (session 22).

One `EngineState(track_dirty=True, keep_decoded=budget)` as the operator's shard holds it:
per call `ingest_batch` of `--batch` fraud events over `--cards` cards, then `export_blobs`
(the changed keys encoded, the state evicted down to the budget). Prints the process CPU per
event of the ingest and of the export over the calls after `--warmup`. From live22's profiling
script (docs/spark-runtime.md, "The operator's Python per row at a high rate (session 22,
live22)"); run from a tree's root so that it imports that tree's core:
    python -m bench.operator_core [--calls 30 --batch 20000 --cards 400000 --budget-mb 2.67]
    python -m bench.operator_core --input ceiling --batch 3333 --calls 40 [--gap-s 20] [--adaptive]
(as a module: run as a file from bench/, bench/operator.py would shadow the standard library's
`operator`; for a tree without this file, run a copy of it kept outside any bench/ directory
with that tree's root as the working directory and PYTHONPATH.)
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import pyarrow as pa

from bench import operator as bo
from cep import _core
from cep.engines import RulesEngineFactory


class _Store:
    """The operator's shard as the engine sees it: one native state."""

    def __init__(self, budget: int, adaptive: bool) -> None:
        self.st = (_core.EngineState(track_dirty=True, keep_decoded=budget, adaptive=True)
                   if adaptive else _core.EngineState(track_dirty=True, keep_decoded=budget))

    def native_state(self, _engine: object) -> object:
        return self.st


def _batch(lo: int, hi: int, t0: int, n: int, cards: int) -> pa.RecordBatch:
    """Events `lo`..`hi` over one second from `t0`, cards round-robin. One amount and country
    for all (unlike `bench.operator.batch_frames`): no rule matches, and a card's partial
    matches are those of the same charge repeated."""
    rows = [
        (t0 + j * 1000 // n, i,
         json.dumps({"ts": t0 + j * 1000 // n, "card": f"c{i % cards}", "amount": 50,
                     "merchant": "m", "country": "NL"}))
        for j, i in enumerate(range(lo, hi))
    ]
    return pa.RecordBatch.from_arrays(
        [pa.array(["transactions"] * len(rows)), pa.array([r[0] for r in rows], pa.int64()),
         pa.array([r[1] for r in rows], pa.int64()), pa.array([r[2] for r in rows]),
         pa.array(["card"] * len(rows))],
        names=["stream", "ts", "seq", "data", "route"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=20000)
    ap.add_argument("--cards", type=int, default=400000)
    ap.add_argument("--budget-mb", type=float, default=16 / 6, help="keep_decoded, MB")
    ap.add_argument("--input", choices=("alike", "ceiling"), default="alike",
                    help="ceiling: one shard's calls of the live ceiling's input instead "
                         "(bench.state_moves' `_batch`: every 6th card; --cards unused)")
    ap.add_argument("--gap-s", type=float, default=20.0,
                    help="with --input ceiling: each card seen every this many seconds "
                         "(bench.live_ceiling.CARD_GAP_S; a call is one second)")
    ap.add_argument("--adaptive", action="store_true",
                    help="the budget or none, as the keys' returns favour (session 24, live24; "
                         "a core without it refuses the option)")
    ap.add_argument("--paired", action="store_true",
                    help="two states in this process fed the same calls, which goes first "
                         "alternating per call: the fixed budget and the adaptive one (or "
                         "--paired-mb's fixed budget); each one's CPU per event")
    ap.add_argument("--paired-mb", type=float, help="with --paired: a fixed budget, MB, as B")
    args = ap.parse_args()
    if args.calls <= args.warmup:
        ap.error("--calls must exceed --warmup")
    _, build = RulesEngineFactory.from_path(bo.RULES).load()
    eng: Any = build()  # the native engine (`ingest_batch`, `core`)
    eng.track_partials = True
    n = args.batch
    s = _Store(int(args.budget_mb * (1 << 20)), args.adaptive)
    batches = [(_batch(b * n, (b + 1) * n, bo.T0 + 1000 * b, n, args.cards),
                bo.T0 + 1000 * b - 5000) for b in range(args.calls)]
    if args.input == "ceiling":  # (session 23, live23: the decoded-keys budget's worth)
        import bench.live_ceiling as lc
        from bench.state_moves import _batch as shard_batch

        lc.CARD_GAP_S = args.gap_s
        batches, at, wm = [], 0, -(2**62)
        for _ in range(args.calls):
            bt, at, last = shard_batch(at, n)
            batches.append((bt, wm))
            wm = last - 5000
    if args.paired:
        _paired(eng, batches, args)
        return
    ing = exp = 0.0
    for b, (bt, wm) in enumerate(batches):
        t = time.process_time()
        eng.ingest_batch(s, bt, wm)
        a = time.process_time()
        eng.core.export_blobs(s.st)
        e = time.process_time()
        if b >= args.warmup:
            ing += a - t
            exp += e - a
    m = (args.calls - args.warmup) * n
    out = {"core": _core.__file__, "ingest_us_ev": round(1e6 * ing / m, 2),
           "export_us_ev": round(1e6 * exp / m, 2), "keys": len(s.st),
           "raw_bytes": eng.core.raw_bytes(s.st)}
    if hasattr(s.st, "budget_stats"):  # (session 24: the budget chosen, what it saw)
        out["budget_end"] = s.st.decoded_budget
        out["hits_ghosthits_cold_evicted"] = s.st.budget_stats()
    print(json.dumps(out))


def _paired(eng: Any, batches: list[Any], args: Any) -> None:
    """A (the fixed `--budget-mb`) and B (adaptive, or `--paired-mb`) in one process, under
    the same load: per call each ingests and exports the call's events, the first of the two
    alternating (session 24, live24)."""
    cap = int(args.budget_mb * (1 << 20))
    a = _Store(cap, False)
    b = (_Store(int(args.paired_mb * (1 << 20)), False) if args.paired_mb is not None
         else _Store(cap, True))
    cpu = {"A": 0.0, "B": 0.0}
    for i, (bt, wm) in enumerate(batches):
        for name, s in (("A", a), ("B", b)) if i % 2 == 0 else (("B", b), ("A", a)):
            t = time.process_time()
            eng.ingest_batch(s, bt, wm)
            eng.core.export_blobs(s.st)
            if i >= args.warmup:
                cpu[name] += time.process_time() - t
    m = (args.calls - args.warmup) * args.batch
    out: dict[str, Any] = {"core": _core.__file__, "A_us_ev": round(1e6 * cpu["A"] / m, 2),
                           "B_us_ev": round(1e6 * cpu["B"] / m, 2),
                           "B_over_A": round(cpu["B"] / cpu["A"], 3)}
    if args.paired_mb is None:
        out["B_budget_end"] = b.st.decoded_budget
        out["B_hits_ghosthits_cold_evicted"] = b.st.budget_stats()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
