"""The Spark operator's Python without Spark: `cep.spark.operator.CepProcessor` over in-memory
state handles (Spark's MapState/ValueState/ListState method names; timers fired as Spark fires
them), fed the latency benchmark's background load (bench/latency.py: each card every 20 s, so
keys hold live partial matches for the fraud rules' windows, and every batch touches a large
share of them). It measures what the operator itself costs per event, batch after batch as the
state grows, for both engine loops in one run (the native loop with its `NativeShardStore`, and
the Python loop with `MapStateKeyStore`, `CEP_ENGINE=python`), and the stored bytes per key.

What it leaves out: Spark's own costs (Arrow → pandas for the input rows, the state server's
socket round trips, RocksDB, the shuffle). The live job's metrics.json has the operator's
split per call (`rows_in_us`, `prepare_us`, `engine_us`, `store_us`).

    python -m bench.operator [--rate 1000] [--batch-s 5] [--batches 16] [--shards 64]
"""

from __future__ import annotations

import argparse
import json
import os
import time
import zlib
from collections.abc import Iterator
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RULES = os.path.join(ROOT, "bench", "rules", "fraud.cep")
DELAY_MS = 5_000  # the benchmark rules' LATENESS
COUNTRIES = ("NL", "DE", "FR", "BE")
T0 = 1_700_000_000_000  # the input's first event time


def pack_frame(rows: list[tuple[Any, ...]]) -> Any:
    """Fan-out rows `(shard, stream, ts, seq, data, key_field, primary)` of one shard as the
    operator receives them in Spark: a frame of packs (`cep.spark.pipeline.packed_batch`)."""
    import pandas as pd
    import pyarrow as pa

    from cep.spark.pipeline import packed_batch

    cols = list(zip(*rows, strict=True))
    batch = pa.RecordBatch.from_arrays(
        [pa.array(cols[0], pa.int32()), pa.array(cols[1], pa.string()),
         pa.array(cols[2], pa.int64()), pa.array(cols[3], pa.int64()),
         pa.array(cols[4], pa.string()), pa.array(cols[5], pa.string()),
         pa.array(cols[6], pa.bool_()), pa.array(cols[2], pa.int64())],
        names=["shard", "stream", "ts", "seq", "data", "key_field", "primary", "wm"])
    return pd.DataFrame({"pack": packed_batch(batch).column("pack").to_pylist()})


class ShardState:
    """Spark's per-shard state for `CepProcessor` without Spark, one object per kind (MapState,
    ValueState, ListState, timers); `at` is the shard the current call is for (set it before
    each call). Shared with tests/test_operator_offline.py."""

    def __init__(self) -> None:
        self.at: Any = None
        self.maps: dict[Any, dict[Any, Any]] = {}
        self.values: dict[Any, Any] = {}
        self.lists: dict[Any, list[Any]] = {}
        self.timers: dict[Any, set[int]] = {}


class _Map:
    """One named MapState (a mixed rule set's operator holds two: `buckets` and `nrows`)."""

    def __init__(self, s: ShardState, name: str = "") -> None:
        self.s = s
        self.name = name
        self.written = 0  # bytes handed to `updateValue` (the first field)

    def _m(self) -> dict[Any, Any]:
        return self.s.maps.setdefault((self.name, self.s.at), {})

    def getValue(self, k: Any) -> Any:  # noqa: N802 - Spark's names
        return self._m().get(k)

    def updateValue(self, k: Any, v: Any) -> None:  # noqa: N802
        self.written += len(v[0])
        self._m()[k] = v

    def containsKey(self, k: Any) -> bool:  # noqa: N802
        return k in self._m()

    def removeKey(self, k: Any) -> None:  # noqa: N802
        self._m().pop(k, None)

    def iterator(self) -> Iterator[Any]:
        return iter(list(self._m().items()))

    def clear(self) -> None:
        self.s.maps.pop((self.name, self.s.at), None)


class _Value:
    """One named ValueState (the operator's names differ per store: a mixed rule set's
    operator holds two, `shard` and `nshard`)."""

    def __init__(self, s: ShardState, name: str = "") -> None:
        self.s = s
        self.name = name

    def get(self) -> Any:
        return self.s.values.get((self.name, self.s.at))

    def update(self, v: Any) -> None:
        self.s.values[(self.name, self.s.at)] = v

    def exists(self) -> bool:
        return (self.name, self.s.at) in self.s.values

    def clear(self) -> None:
        self.s.values.pop((self.name, self.s.at), None)


class _List:
    def __init__(self, s: ShardState) -> None:
        self.s = s
        self.written = 0  # bytes handed to `put` / `appendList`

    def get(self) -> Iterator[Any]:
        return iter(list(self.s.lists.get(self.s.at, [])))

    def put(self, rows: list[Any]) -> None:
        self.written += sum(len(r[0]) for r in rows)
        self.s.lists[self.s.at] = list(rows)

    def appendList(self, rows: list[Any]) -> None:  # noqa: N802
        self.written += sum(len(r[0]) for r in rows)
        self.s.lists.setdefault(self.s.at, []).extend(rows)

    def clear(self) -> None:
        self.s.lists.pop(self.s.at, None)


class Handle:
    def __init__(self, s: ShardState) -> None:
        self.s = s
        self.lists: list[Any] = []  # the states written to (`written`)

    def getMapState(self, name: str = "", *args: Any) -> _Map:  # noqa: N802
        self.lists.append(_Map(self.s, name))
        return self.lists[-1]

    def getValueState(self, name: str = "", *args: Any) -> _Value:  # noqa: N802
        return _Value(self.s, name)

    def getListState(self, *args: Any) -> _List:  # noqa: N802
        self.lists.append(_List(self.s))
        return self.lists[-1]

    def listTimers(self) -> list[int]:  # noqa: N802
        return sorted(self.s.timers.get(self.s.at, ()))

    def deleteTimer(self, t: int) -> None:  # noqa: N802
        self.s.timers.get(self.s.at, set()).discard(t)

    def registerTimer(self, t: int) -> None:  # noqa: N802
        self.s.timers.setdefault(self.s.at, set()).add(t)


class Watermark:
    def __init__(self, wm: int) -> None:
        self.wm = wm

    def getCurrentWatermarkInMs(self) -> int:  # noqa: N802
        return self.wm


def fire_timers(proc: Any, shard: ShardState, wm: int) -> None:
    """The operator's calls for the shards whose timers the watermark `wm` passed, as Spark
    makes them after a batch's input (each fired timer removed first)."""
    for key, ts_set in sorted(shard.timers.items()):
        expired = {t for t in ts_set if t <= wm}
        if expired:
            ts_set -= expired
            shard.at = key
            for _ in proc.handleExpiredTimer(key, Watermark(wm), None):
                pass


def run_batch(proc: Any, handle: Any, shard: ShardState, frames: dict[int, Any],
              wm: int) -> Iterator[Any]:
    """One micro-batch of the operator as Spark runs it: `init` (once per task), each shard's
    call over its frame at watermark `wm`, then the timers `wm` passed. Yields the calls'
    output frames."""
    proc.init(handle)
    for s, frame in sorted(frames.items()):
        shard.at = (s,)
        yield from proc.handleInputRows((s,), iter([frame]), Watermark(wm))
    fire_timers(proc, shard, wm)


def batch_wm(b: int, n: int, rate: int) -> int:
    """The watermark after the `b`-th batch of `n` events at `rate` events/s (`batch_frames`)."""
    return T0 + int((b + 1) * n * 1000 / rate) - DELAY_MS


def batch_frames(b: int, n: int, rate: int, shards: int) -> dict[int, Any]:
    """The `b`-th batch of `n` events of the input at `rate` events/s from `T0` (each card
    every 20 s: velocity's 5-in-1-minute never fits), as the operator's frame per shard."""
    cards = rate * 20
    by_shard: dict[int, list[tuple[Any, ...]]] = {}
    for i in range(b * n, (b + 1) * n):
        ts = T0 + int(i * 1000 / rate)
        card = f"c{i % cards}"
        data = json.dumps({"ts": ts, "card": card, "amount": 5 + (i * 7) % 295,
                           "merchant": "m", "country": COUNTRIES[i % cards % 4]})
        s = zlib.crc32(card.encode()) % shards
        by_shard.setdefault(s, []).append((s, "transactions", ts, i, data, "card", True))
    return {s: pack_frame(rows) for s, rows in by_shard.items()}


def stored_bytes(s: ShardState) -> int:
    maps = sum(len(v[0]) for m in s.maps.values() for v in m.values())
    return maps + sum(len(r[0]) for rows in s.lists.values() for r in rows)


def _cpu_meters() -> dict[str, float]:
    """CPU seconds spent in the native loop's engine call (`ingest_batch`) and state write
    (`NativeShardStore.flush`: `export_blobs` and the log append), reset per batch by
    `run_loop` (wrappers on the classes, set once per process)."""
    from cep.runtime import native_engine, state_store

    for cls, name, key in ((native_engine.NativeEngine, "ingest_batch", "engine"),
                           (state_store.NativeShardStore, "flush", "flush")):
        fn = getattr(cls, name)
        if getattr(fn, "_metered", False):
            continue

        def metered(*a: Any, _fn: Any = fn, _key: str = key, **k: Any) -> Any:
            t = time.process_time()
            try:
                return _fn(*a, **k)
            finally:
                _CPU[_key] += time.process_time() - t

        metered._metered = True  # type: ignore[attr-defined]
        setattr(cls, name, metered)
    return _CPU


_CPU = {"engine": 0.0, "flush": 0.0}


def run_loop(loop: str, rate: int, batch_s: float, batches: int, shards: int,
             ) -> list[dict[str, Any]]:
    """One engine loop ("native" or "python") over `batches` micro-batches of `batch_s`
    seconds of events at `rate` events/s; per batch: CPU µs per event, stored bytes, keys, and
    from the operator's stats rows the engine's and the state write's time (`engine_ms`,
    `store_ms`: the log append or compaction, `export_blobs` in it) and the bytes written."""

    os.environ["CEP_ENGINE"] = loop
    from cep.engines import RulesEngineFactory
    from cep.runtime.alerts import output_rows
    from cep.spark import operator as op

    op._ENGINES.clear()
    op._HELD.clear()
    cpu_in = _cpu_meters()
    shard = ShardState()
    proc = op.CepProcessor(RulesEngineFactory.from_path(RULES), output_rows, DELAY_MS,
                           shards=shards)
    handle = Handle(shard)
    wm, out = 0, []
    n = int(rate * batch_s)
    for b in range(batches):
        frames = batch_frames(b, n, rate, shards)
        cpu = time.process_time()
        cpu_in.update({k: 0.0 for k in cpu_in})
        written = sum(x.written for x in handle.lists)
        us = {"engine_us": 0, "store_us": 0}
        for res in run_batch(proc, handle, shard, frames, wm):
            stats = json.loads(res[res["kind"] == "stats"]["payload"].iloc[-1])
            for k in us:
                us[k] += stats.get(k, 0)
        cpu = time.process_time() - cpu
        wm = batch_wm(b, n, rate)
        keys = (sum(len(h.state) for h in op._HELD.values()) if loop == "native" else None)
        # After a call every held key has its `CEPNK` bytes (held as bytes, or kept beside the
        # decoded key): the key states' own size.
        key_bytes = (sum(h.engine.core.raw_bytes(h.state) for h in op._HELD.values())
                     if loop == "native" else None)
        out.append({"batch": b, "events": n, "cpu_us_per_event": round(1e6 * cpu / n, 1),
                    "stored_bytes": stored_bytes(shard), "keys": keys, "key_bytes": key_bytes,
                    "engine_ms": us["engine_us"] // 1000, "store_ms": us["store_us"] // 1000,
                    "engine_cpu_ms": round(1e3 * cpu_in["engine"]),
                    "flush_cpu_ms": round(1e3 * cpu_in["flush"]),
                    "written_bytes": sum(x.written for x in handle.lists) - written})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--batch-s", type=float, default=5.0)
    ap.add_argument("--batches", type=int, default=16)
    ap.add_argument("--shards", type=int, default=64)
    ap.add_argument("--native-only", action="store_true",
                    help="run only the native loop (the key-state size per batch)")
    a = ap.parse_args(argv)
    load = os.getloadavg()
    if a.native_only:
        rows = run_loop("native", a.rate, a.batch_s, a.batches, a.shards)
        print(f"load {load[0]:.1f} → {os.getloadavg()[0]:.1f}; {a.rate} ev/s, {a.batch_s} s "
              f"batches, {a.shards} shards; native loop only")
        print("| batch | µs/event (CPU) | keys | key state B per key (`Engine.raw_bytes`) | "
              "engine CPU ms | state write CPU ms | MB written |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['batch']} | {r['cpu_us_per_event']} | {r['keys']} | "
                  f"{r['key_bytes'] / max(r['keys'], 1):.0f} | {r['engine_cpu_ms']} | "
                  f"{r['flush_cpu_ms']} | {r['written_bytes'] / 1e6:.2f} |")
        return 0
    res = {loop: run_loop(loop, a.rate, a.batch_s, a.batches, a.shards)
           for loop in ("python", "native")}
    print(f"load {load[0]:.1f} → {os.getloadavg()[0]:.1f}; {a.rate} ev/s, {a.batch_s} s "
          f"batches, {a.shards} shards")
    print("| batch | Python loop µs/event (CPU) | native loop µs/event (CPU) | ratio | "
          "stored MB Python / native |")
    print("|---|---|---|---|---|")
    for p, n in zip(res["python"], res["native"], strict=True):
        print(f"| {p['batch']} | {p['cpu_us_per_event']} | {n['cpu_us_per_event']} | "
              f"{p['cpu_us_per_event'] / max(n['cpu_us_per_event'], 0.1):.1f}x | "
              f"{p['stored_bytes'] / 1e6:.1f} / {n['stored_bytes'] / 1e6:.1f} |")
    last = res["native"][-1]
    if last["keys"]:
        print(f"\nnative: {last['keys']} keys held; the stored log is "
              f"{last['stored_bytes'] / last['keys']:.0f} B per key (with records not yet "
              "compacted away)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
