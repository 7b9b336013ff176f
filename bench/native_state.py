"""Serialised key-state size of the native engine (issue 13's "bytes per fraud key").

Two loads, both on bench/rules/fraud.cep (3 rules, one rule group: a card's state is one key):

- `growth`: bench/growth.py's CEP point (10 generated fraud events per card, the first half by
  event time ingested in batches of 10,000 with the watermark from before each batch, no end of
  input: every card is mid-stream). The native engine is fed Arrow batches (`ingest_batch`, the
  event fields as columns); the Python engine the same events as `Event` objects, its states
  pickled as bench/growth.py does (the figure latest.md reports, 269 B per key there).
  Native: every key's `CEPNK` bytes (`Engine.export_blobs(all)`, then `Engine.raw_bytes`) over
  the keys with state.
- `operator`: bench/operator.py's load (the Spark operator's Python without Spark, JSON events,
  1,000 events/s, each card every 20 s: `velocity` holds up to 3 events per card), native loop:
  `Engine.raw_bytes` over the held keys after the last batch.

    python -m bench.native_state [--keys 10000] [--operator-batches 14]
"""

from __future__ import annotations

import argparse
import os
import pickle
from pathlib import Path
from typing import Any

from bench.native import arrow_batches
from bench.workloads import dataset, load_rules, rules_path, stream_of
from cep.runtime.bind import build_embedded_engine, build_engine
from cep.runtime.engine import NEG_INF, MemoryKeyStore, events_from_dicts

RULES = Path(__file__).resolve().parent / "rules"
BATCH = 10_000


def growth_point(n_keys: int, per_key: int = 10) -> dict[str, Any]:
    ruleset = load_rules(rules_path(RULES, "fraud"))
    ds = dataset("fraud", per_key * n_keys, n_keys, 1)
    half = len(ds.events) // 2
    n_in = half - half % BATCH if half >= BATCH else half
    dicts = sorted(ds.events, key=lambda d: d["ts"])[:n_in]
    events = sorted(events_from_dicts(stream_of(ruleset), dicts), key=lambda e: (e.ts, e.seq))
    native = build_embedded_engine(ruleset)
    nstore = MemoryKeyStore()
    python = build_engine(ruleset, use_native=False)
    pstore = MemoryKeyStore()
    max_ts = NEG_INF
    for i, (batch, top) in zip(range(0, len(events), BATCH), arrow_batches(events, BATCH),
                               strict=True):
        native.ingest_batch(nstore, batch, max_ts)
        python.ingest(pstore, events[i:i + BATCH], max_ts)
        max_ts = max(max_ts, top)
    st = native.state_of(nstore)
    native.core.export_blobs(st, True)
    keys = len(st)
    pickled = sum(len(pickle.dumps(s, protocol=5)) for s in pstore.states.values())
    return {"keys": n_keys, "events_ingested": n_in, "native_keys": keys,
            "native_bytes": native.core.raw_bytes(st),
            "native_per_key": native.core.raw_bytes(st) / max(keys, 1),
            "python_states": len(pstore.states),
            "python_pickled_per_key": pickled / max(len(pstore.states), 1)}


def operator_point(batches: int) -> dict[str, Any]:
    from bench.operator import run_loop
    from cep.spark import operator as op

    rows = run_loop("native", 1000, 5.0, batches, 64)
    keys = sum(len(h.state) for h in op._HELD.values())
    raw = sum(h.engine.core.raw_bytes(h.state) for h in op._HELD.values())
    return {"batches": batches, "keys": keys, "native_bytes": raw,
            "native_per_key": raw / max(keys, 1),
            "per_batch": [round(r["key_bytes"] / max(r["keys"], 1)) for r in rows]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--operator-batches", type=int, default=14)
    a = ap.parse_args(argv)
    load = os.getloadavg()
    g = growth_point(a.keys)
    print(f"growth load ({a.keys:,} cards, {g['events_ingested']:,} events ingested): native "
          f"{g['native_per_key']:.0f} B per key ({g['native_keys']:,} keys, "
          f"{g['native_bytes']:,} B); Python engine pickled {g['python_pickled_per_key']:.0f} B "
          f"per key ({g['python_states']:,} states)")
    if a.operator_batches:
        o = operator_point(a.operator_batches)
        print(f"operator load ({a.operator_batches} batches of 5 s at 1,000 ev/s): native "
              f"{o['native_per_key']:.0f} B per key ({o['keys']:,} keys); per batch "
              f"{o['per_batch']}")
    print(f"load {load[0]:.1f} → {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
