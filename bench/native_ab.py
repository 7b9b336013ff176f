"""A/B driver for the native engine: bench.native_flink's loop (engine only, Arrow batches of
100,000, a fresh engine per run) over batches cached on disk, so that two builds of `cep._core`
can be alternated within minutes without regenerating the data set each time.

    python -m bench.native_ab EVENTS KEYS RUNS [--domain fraud] [--rules FILE] [--json]

`--json`: each event's fields as one JSON text column (`ts`, `seq`, `data`), the form replay's
engine step and the live operator hand the core, so the figure includes the core's JSON reading.

The batches are pickled under $CEP_AB_CACHE (default /tmp/cep-native-ab), one file per
(domain, events, keys). Prints events/s (wall and CPU) per run, and the CPU's user and system
parts: system time is mostly the host's cost of fresh memory, which varies from run to run on
this kind of machine (docs/native-core.md, "Many keys: what the 1M-card run pays besides its
keys' state (session 18, core18n)").
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import time
from pathlib import Path
from typing import Any

from bench.native import arrow_batches
from bench.workloads import dataset, load_rules, rules_path, stream_of
from cep.runtime.bind import build_embedded_engine
from cep.runtime.engine import NEG_INF, MemoryKeyStore, events_from_dicts

RULES = Path(__file__).resolve().parent / "rules"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("events", type=int)
    ap.add_argument("keys", type=int)
    ap.add_argument("runs", type=int)
    ap.add_argument("--domain", default="fraud")
    ap.add_argument("--rules", type=Path, default=None)
    ap.add_argument("--json", action="store_true", help="events as a JSON text column")
    a = ap.parse_args(argv)
    ruleset = load_rules(a.rules or rules_path(RULES, a.domain))
    cache_dir = Path(os.environ.get("CEP_AB_CACHE", "/tmp/cep-native-ab"))
    cache_dir.mkdir(parents=True, exist_ok=True)
    cache = cache_dir / f"{a.domain}_{a.events}_{a.keys}.pkl"
    if cache.exists():
        batches = pickle.loads(cache.read_bytes())
    else:
        ds = dataset(a.domain, a.events, a.keys, 100)
        events = sorted(events_from_dicts(stream_of(ruleset), ds.events),
                        key=lambda e: (e.ts, e.seq))
        batches = arrow_batches(events, 100_000)
        cache.write_bytes(pickle.dumps(batches))
    if a.json:
        batches = [(json_batch(rb), top) for rb, top in batches]
    n = sum(rb.num_rows for rb, _ in batches)
    for r in range(a.runs):
        engine = build_embedded_engine(ruleset)
        store, max_ts, count = MemoryKeyStore(), NEG_INF, 0
        t0, c0 = time.perf_counter(), os.times()
        for rb, top in batches:
            count += len(engine.ingest_batch(store, rb, max_ts).matches)
            max_ts = max(max_ts, top)
        count += len(engine.advance(store, max_ts, end_of_input=max_ts).matches)
        wall, c1 = time.perf_counter() - t0, os.times()
        user, sys_ = c1.user - c0.user, c1.system - c0.system
        print(f"run {r}: {n} events {n / wall:,.0f} ev/s wall {n / (user + sys_):,.0f} ev/s CPU"
              f" (user {user:.2f} s, system {sys_:.2f} s: {n / user:,.0f} ev/s user); "
              f"{count} results", flush=True)
    return 0


def json_batch(rb: Any) -> Any:
    """A batch of typed columns as `ts`, `seq` and the other fields as one JSON text each."""
    import pyarrow as pa

    cols = rb.to_pydict()
    names = [c for c in cols if c not in ("stream", "seq")]
    data = [json.dumps({c: cols[c][i] for c in names}) for i in range(rb.num_rows)]
    return pa.RecordBatch.from_pydict({"ts": cols["ts"], "seq": cols["seq"], "data": data})


if __name__ == "__main__":
    raise SystemExit(main())
