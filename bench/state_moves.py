"""A moved shard's catch-ups without Spark: the core's import and export of key records.

The live ceiling benchmark's input for one shard (bench/live_ceiling.py: the fraud rules, cards
each seen every 20 s of event time at 20,000 events/s, so at 400k events every card once; a
20k-row batch gives each of 6 shards ~3,333 events) through `NativeShardStore` over in-memory
state handles, the shard alternating between two worker processes (two held-copy maps) as
Spark hands it over: each call appends one row, and the process that gets the shard next
catches up by importing the rows the other appended. Per run, CPU seconds in the core's
`import_blob` (catch-ups), `export_blobs` (each call's changed keys), the stores' `load_us`
(catch-ups: decompression and import), and a reload of the whole log into a new
`EngineState` (the first call of a worker that holds no copy).

    python -m bench.state_moves [--calls 20] [--per-call 3333] [--rounds 3] [--core A.so ...]

With `--core`, each round runs every given build of `cep._core` in turn (alternated, each in
its own process: old vs new in the same minutes).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from typing import Any

from bench.live_ceiling import card_event

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RATE = 20_000


def _batch(start: int, n: int, shards: int = 6) -> tuple[Any, int, int]:
    """The events of one shard's call: `n` of the bench input's events from event `start`
    (every `shards`-th card, as the live job's hash spreads them), the next call's `start`
    and the last event's time."""
    import pyarrow as pa

    t0 = 1_700_000_000_000
    ts, data = [], []
    i = start
    while len(data) < n:
        card, t, body = card_event(i, t0, RATE)
        if int(card[2:]) % shards == 0:
            ts.append(t)
            data.append(body)
        i += 1
    return pa.RecordBatch.from_pydict({
        "stream": ["transactions"] * n, "ts": pa.array(ts, pa.int64()),
        "seq": pa.array(range(start, start + n), pa.int64()), "data": data,
        "route": ["card"] * n}), i, ts[-1]


def run(calls: int, per_call: int) -> dict[str, Any]:
    from cep import _core
    from cep.compile import compile_rules
    from cep.runtime.bind import build_embedded_engine
    from cep.runtime.state_store import NativeShardStore, unzip_row
    from tests.runtime.test_bucket_store import DictValueState
    from tests.runtime.test_native_shard_store import DictLogState

    with open(os.path.join(ROOT, "bench", "rules", "fraud.cep")) as f:
        engine = build_embedded_engine(compile_rules(f.read(), "fraud.cep"))
    core = engine.core
    t = {"import_s": 0.0, "export_s": 0.0}

    class Timed:  # the core with its import and export timed (CPU)
        def __getattr__(self, name: str) -> Any:
            method = getattr(core, name)
            if name not in ("import_blob", "export_blobs"):
                return method

            def call(*a: Any) -> Any:
                c = time.process_time()
                try:
                    return method(*a)
                finally:
                    t[name.split("_")[0] + "_s"] += time.process_time() - c
            return call

    engine.core = Timed()
    log, meta = DictLogState(), DictValueState()
    procs: list[dict[Any, Any]] = [{}, {}]
    load = encode = 0
    begin_s = flush_s = 0.0  # CPU of the store's begin (catch-ups) and flush (export, zstd)
    at, wm = 0, -(2**62)
    for c in range(calls):
        rb, at, last = _batch(at, per_call)
        # The shard moves in every other call (about half the batches of the live job).
        store = NativeShardStore(log, meta, procs[(c // 2) % 2],
                                 keep_decoded=NativeShardStore.for_shards(6))
        c0 = time.process_time()
        store.begin(("s",), engine)
        c1 = time.process_time()
        engine.ingest_batch(store, rb, wm)
        c2 = time.process_time()
        store.flush()
        begin_s, flush_s = begin_s + c1 - c0, flush_s + time.process_time() - c2
        wm = last - 5_000
        load += store.load_us
        encode += store.encode_us
    # A reload: the whole log into a new state.
    engine.core = core
    blobs = [unzip_row(r[0]) for r in log.rows]
    digest = hashlib.sha256(b"".join(blobs)).hexdigest()[:16]  # the same across builds
    c0 = time.process_time()
    state = _core.EngineState(track_dirty=True)
    for b in blobs:
        core.import_blob(state, b)
    reload_s = time.process_time() - c0
    return {"import_s": t["import_s"], "export_s": t["export_s"], "load_s": load / 1e6,
            "encode_s": encode / 1e6, "begin_cpu_s": begin_s, "flush_cpu_s": flush_s,
            "reload_s": reload_s, "rows": len(log.rows),
            "keys": len(state), "blobs_sha256": digest}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--per-call", type=int, default=3333)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--core", action="append", default=[],
                    help="a cep._core build to run (alternated per round; default: this tree's)")
    a = ap.parse_args(argv)
    cores = a.core or [""]
    for r in range(a.rounds):
        for so in cores:
            env = dict(os.environ, PYTHONPATH=ROOT, OPENBLAS_NUM_THREADS="1")
            out = subprocess.run(
                [sys.executable, "-c", _ONE, str(a.calls), str(a.per_call), so],
                env=env, cwd=ROOT, capture_output=True, text=True, check=True)
            got = json.loads(out.stdout.strip().splitlines()[-1])
            print(json.dumps({"round": r, "core": so or "tree",
                              "load": os.getloadavg()[0], **got}))
    return 0


# One run in a fresh process, with `cep._core` loaded from the given .so when one is given.
_ONE = r"""
import importlib.util, json, sys
calls, per_call, so = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
if so:
    spec = importlib.util.spec_from_file_location("cep._core", so)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["cep._core"] = mod
    spec.loader.exec_module(mod)
    import cep
    cep._core = mod
from bench.state_moves import run
print(json.dumps(run(calls, per_call)))
"""


if __name__ == "__main__":
    raise SystemExit(main())
