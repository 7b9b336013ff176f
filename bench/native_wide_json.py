"""Wide JSON events through the native engine (core/src/json.rs): events of 10, 50 and 200
fields given as JSON text (the live operator's and replay's `data` column), one trivial rule,
CPU time per event of `ingest_batch` + the end of input, best of 3. Field lists:
- `same`: every row the same fields in the same order (the reader reuses the last row's names);
- `4shapes`: rows cycle through 4 field lists (one optional field missing, at 4 places);
- `drop1`: each row misses one random field (a new list nearly every row);
- `shuffled`: each row its own field order;
- `repeats`: the same fields, then a tenth of them again with new values (json.loads keeps each
  repeated field's first place and last value; json.dumps cannot write this, so built by hand).

    python -m bench.native_wide_json [--events 20000] [--widths 10,50,200] [--shapes repeats,...]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from typing import Any

from cep.compile import compile_rules
from cep.runtime.bind import build_embedded_engine
from cep.runtime.engine import NEG_INF, MemoryKeyStore

TEXT = """STREAM s TIME BY ts LATENESS 0ms;
RULE r FROM s PARTITION BY k PATTERN (a -> b) DEFINE a AS f0 > 0.9, b AS f1 > 0.9
  WITHIN 1s EMIT 'x';
"""
SHAPES = ("same", "4shapes", "drop1", "shuffled", "repeats")


def json_batch(n: int, width: int, shape: str, seed: int = 1) -> Any:
    import pyarrow as pa

    rnd = random.Random(seed)
    names = [f"f{i}" for i in range(width)]
    data = []
    for i in range(n):
        order = names[:]
        if shape == "shuffled":
            rnd.shuffle(order)
        elif shape == "drop1":
            order.pop(rnd.randrange(width))
        elif shape == "4shapes":
            order.pop((i % 4) * width // 5)
        row: dict[str, Any] = {"k": f"k{i % 1000}", "ts": i}
        row.update((name, round(rnd.random(), 3)) for name in order)
        text = json.dumps(row)
        if shape == "repeats":
            again = rnd.sample(names, width // 10)
            text = text[:-1] + "".join(f", {json.dumps(n)}: {round(rnd.random(), 3)}"
                                       for n in again) + "}"
        data.append(text)
    return pa.RecordBatch.from_pydict({"stream": ["s"] * n, "ts": list(range(n)),
                                       "seq": list(range(n)), "data": data})


def cpu_per_event(rb: Any, runs: int = 3) -> float:
    """The best CPU seconds per event over `runs` fresh engines."""
    ruleset = compile_rules(TEXT, "wide.cep")
    best = float("inf")
    for _ in range(runs):
        engine = build_embedded_engine(ruleset, use_native=True)
        store = MemoryKeyStore()
        c0 = time.process_time()
        engine.ingest_batch(store, rb, NEG_INF)
        engine.advance(store, rb.num_rows, end_of_input=rb.num_rows)
        best = min(best, time.process_time() - c0)
    return best / rb.num_rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--widths", default="10,50,200")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    a = ap.parse_args(argv)
    print(f"load {os.getloadavg()[0]:.1f}")
    for width in map(int, a.widths.split(",")):
        for shape in a.shapes.split(","):
            t = cpu_per_event(json_batch(a.events, width, shape))
            print(f"width {width:3d} {shape:8s}: {t * 1e6:6.2f} us/event ({1 / t:,.0f} ev/s CPU)",
                  flush=True)
    print(f"load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
