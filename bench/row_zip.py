"""The store's row compression in the core or in Python, in one process (session 23).

Two `EngineState`s of the operator's shard (`track_dirty`, the live job's per-shard budget of
decoded keys) fed the same calls of the live ceiling's input (bench.state_moves' shard: fraud
rules, cards each seen every 20 s at 20,000 events/s, `--per-call` events a call). After each
call one state writes its rows as the store did until session 23 (`Engine.export_blobs`, then
`zip_row`: pyarrow's zstd) and the other as it does since (`Engine.export_rows`: the core's
zstd); then each is caught up from the other's rows the two ways (`unzip_row` then
`import_blob`, against `Engine.import_row`) into a third and fourth state. Which way goes first
alternates per call. Prints the CPU seconds of each way, summed over the calls after
`--warmup`, per round (`--rounds`, each in this process).

    python -m bench.row_zip [--calls 20 --per-call 3333 --rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from bench.state_moves import _batch


class _Shard:
    def __init__(self, budget: int) -> None:
        from cep import _core

        self.state = _core.EngineState(track_dirty=True, keep_decoded=budget)

    def native_state(self, _engine: object) -> object:
        return self.state


def run(calls: int, per_call: int, warmup: int) -> dict[str, Any]:
    from cep.compile import compile_rules
    from cep.runtime.bind import build_embedded_engine
    from cep.runtime.state_store import NativeShardStore, unzip_row, zip_row

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "bench", "rules", "fraud.cep")) as f:
        engine = build_embedded_engine(compile_rules(f.read(), "fraud.cep"))
    core = engine.core
    budget = NativeShardStore.for_shards(6)
    py, rs, py_in, rs_in = (_Shard(budget) for _ in range(4))
    t = {"python_export_s": 0.0, "core_export_s": 0.0, "python_import_s": 0.0,
         "core_import_s": 0.0}
    at, wm, stored = 0, -(2**62), 0
    for c in range(calls):
        rb, at, last = _batch(at, per_call)
        for s in (py, rs):
            engine.ingest_batch(s, rb, wm)
        wm = last - 5_000

        def python_export() -> list[bytes]:
            return [zip_row(b) for b in core.export_blobs(py.state)]

        def core_export() -> list[bytes]:
            return [row for row, _, _ in core.export_rows(rs.state)]

        def python_import(rows: list[bytes]) -> None:
            for row in rows:
                core.import_blob(py_in.state, unzip_row(row))

        def core_import(rows: list[bytes]) -> None:
            for row in rows:
                core.import_row(rs_in.state, row)

        got: dict[str, list[bytes]] = {}
        ways = [("python", python_export, python_import), ("core", core_export, core_import)]
        for name, export, _ in ways[:: 1 if c % 2 else -1]:
            t0 = time.process_time()
            got[name] = export()
            if c >= warmup:
                t[f"{name}_export_s"] += time.process_time() - t0
        # Each way imports the other's rows (the same blobs: checked).
        assert [unzip_row(r) for r in got["python"]] == [unzip_row(r) for r in got["core"]]
        for name, _, imp in ways[:: 1 if c % 2 else -1]:
            t0 = time.process_time()
            imp(got["core" if name == "python" else "python"])
            if c >= warmup:
                t[f"{name}_import_s"] += time.process_time() - t0
        stored += sum(map(len, got["core"]))
    return {**{k: round(v, 4) for k, v in t.items()}, "keys": len(rs_in.state),
            "stored_bytes": stored}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--per-call", type=int, default=3333)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    for r in range(a.rounds):
        print(json.dumps({"round": r, "load": os.getloadavg()[0],
                          **run(a.calls, a.per_call, a.warmup)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
