"""A/B driver for the native engine (session 9): caches bench.native_flink's Arrow batches in /tmp/core9 and runs
the engine only over them N times (same loop as bench.native_flink.native_run).

    PYTHONPATH=<tree> python bench/native_ab.py EVENTS KEYS RUNS   (DOMAIN=trading, RULESFILE=path optional)
"""
import os, sys, time, pickle
from pathlib import Path
import pyarrow as pa
sys.path.insert(0, os.environ["PYTHONPATH"])
from bench.native import arrow_batches
from bench.workloads import dataset, load_rules, rules_path, stream_of
from cep.runtime.bind import build_embedded_engine
from cep.runtime.engine import NEG_INF, MemoryKeyStore, events_from_dicts
RULES = Path(os.environ["PYTHONPATH"]) / "bench" / "rules"
domain = os.environ.get("DOMAIN", "fraud")
ev, keys, runs = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rulesfile = os.environ.get("RULESFILE")
ruleset = load_rules(Path(rulesfile) if rulesfile else rules_path(RULES, domain))
cache = Path(f"/tmp/core9/{domain}_{ev}_{keys}.pkl")
if cache.exists():
    batches = pickle.loads(cache.read_bytes())
else:
    ds = dataset(domain, ev, keys, 100)
    events = sorted(events_from_dicts(stream_of(ruleset), ds.events), key=lambda e: (e.ts, e.seq))
    batches = arrow_batches(events, 100_000)
    cache.write_bytes(pickle.dumps(batches))
n = sum(rb.num_rows for rb, _ in batches)
for r in range(runs):
    engine = build_embedded_engine(ruleset)
    store, max_ts = MemoryKeyStore(), NEG_INF
    cnt = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for rb, top in batches:
        cnt += len(engine.ingest_batch(store, rb, max_ts).matches)
        max_ts = max(max_ts, top)
    cnt += len(engine.advance(store, max_ts, end_of_input=max_ts).matches)
    w, c = time.perf_counter() - t0, time.process_time() - c0
    print(f"run {r}: {n} events {n/w:,.0f} ev/s wall {n/c:,.0f} ev/s CPU; {cnt} results", flush=True)
