"""The stateful operator: `transformWithStateInPandas` over shards of the partition key.

Thin by design: it turns pandas rows into `Event`s, gives the engine a `KeyStore` backed by the
shard's MapState, converts between Spark's watermark and the engine's max event time
(docs/spark-runtime.md), keeps one timer per shard, and turns the engine's output into rows.
"""

from __future__ import annotations

import json
import pickle
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, IntegerType, StructField, StructType

from cep.runtime.engine import (
    EOF_TS,
    Engine,
    Event,
    KeyState,
    Output,
    StateKey,
    Wake,
    content_seq,
)
from cep.spark.pipeline import EOF_STREAM

OUTPUT_SCHEMA = "kind string, rule_id string, key string, id string, payload string"
_BUCKET_SCHEMA = StructType([StructField("bucket", IntegerType())])
_BLOB_SCHEMA = StructType([StructField("v", BinaryType())])
_NO_WATERMARK = 0  # Spark reports 0 before the first watermark exists

# Rows the operator emits: alerts, timeouts, late events, and a per-call stats row.
class EngineFactory(Protocol):
    def load(self) -> tuple[int, Callable[[], Engine]]: ...
RowsFromOutput = Callable[[Engine, Output], list[tuple[str, str, str, str, str]]]


class MapStateKeyStore:
    """The engine's `KeyStore` over a shard's state: key states in buckets, one MapState entry
    per bucket, plus one `ValueState` with the shard's layout and wake index.

    Each state-server call costs ~0.1 ms (bench: `state_only`), far more than the engine spends
    on a key, so a call reads and writes buckets, not keys: a bucket is read at most once per
    call and written once if it changed (`flush`). The number of buckets doubles when they
    average more than `MAX_PER_BUCKET` keys, so a bucket stays small while a call that touches
    every key of the shard costs a few dozen state calls instead of thousands. Bucket of a key:
    crc32 of (group, key), stable across processes.
    """

    MIN_BUCKETS = 8
    MAX_PER_BUCKET = 32

    def __init__(self, buckets: Any, meta: Any) -> None:
        self._buckets = buckets
        self._meta = meta
        self.writes = 0  # bucket writes
        self.reads = 0   # bucket reads
        # Read lazily: the handles serve whichever shard the current call is for.
        self._loaded = False
        self._cache: dict[int, dict[StateKey, KeyState]] = {}
        self._dirty: set[int] = set()

    def _begin(self) -> None:
        row = self._meta.get()
        if row is None:
            self.n_buckets, self.n_keys, self._wake = self.MIN_BUCKETS, 0, Wake()
        else:
            self.n_buckets, self.n_keys, self._wake = pickle.loads(row[0])  # noqa: S301
        self._cache, self._dirty = {}, set()
        self._loaded = True

    def _bucket(self, sk: StateKey) -> tuple[int, dict[StateKey, KeyState]]:
        """The key's bucket number and contents (read at most once per call)."""
        if not self._loaded:
            self._begin()
        b = self._index(sk)
        found = self._cache.get(b)
        if found is None:
            found = self._read(b)
            self._cache[b] = found
        return b, found

    def _index(self, sk: StateKey) -> int:
        return zlib.crc32(f"{sk[0]}\x00{sk[1]}".encode()) % self.n_buckets

    def _read(self, b: int) -> dict[StateKey, KeyState]:
        self.reads += 1
        row = self._buckets.getValue((b,))
        return {} if row is None else pickle.loads(row[0])  # noqa: S301 - our own state

    def get(self, sk: StateKey) -> KeyState | None:
        return self._bucket(sk)[1].get(sk)

    def put(self, sk: StateKey, state: KeyState) -> None:
        b, bucket = self._bucket(sk)
        if sk not in bucket:
            self.n_keys += 1
        bucket[sk] = state
        self._dirty.add(b)

    def delete(self, sk: StateKey) -> None:
        b, bucket = self._bucket(sk)
        if bucket.pop(sk, None) is not None:
            self.n_keys -= 1
            self._dirty.add(b)

    def load_wake(self) -> Wake:
        if not self._loaded:
            self._begin()
        return self._wake

    def save_wake(self, wake: Wake) -> None:
        self._wake = wake

    def flush(self) -> None:
        """Write what changed in this call; grow the buckets if they got too full."""
        if not self._loaded:
            return
        if self.n_keys > self.MAX_PER_BUCKET * self.n_buckets:
            self._grow()
        for b in sorted(self._dirty):
            self._write(b, self._cache[b])
        if len(self._wake) or self.n_keys or self.n_buckets != self.MIN_BUCKETS:
            self._meta.update((pickle.dumps((self.n_buckets, self.n_keys, self._wake),
                                            protocol=5),))
        elif self._meta.exists():
            self._meta.clear()
        self._cache, self._dirty = {}, set()
        self._loaded = False  # the next call re-reads: Spark may hand the shard elsewhere

    def _write(self, b: int, bucket: dict[StateKey, KeyState]) -> None:
        self.writes += 1
        if bucket:
            self._buckets.updateValue((b,), (pickle.dumps(bucket, protocol=5),))
        else:
            self._buckets.removeKey((b,))

    def _grow(self) -> None:
        old = self.n_buckets
        every: dict[StateKey, KeyState] = {}
        for b in range(old):
            every.update(self._cache[b] if b in self._cache else self._read(b))
        new = old
        while len(every) > self.MAX_PER_BUCKET * new:
            new *= 2
        self.n_buckets, self.n_keys = new, len(every)
        self._cache = {b: {} for b in range(new)}
        for sk, st in every.items():
            self._cache[self._index(sk)][sk] = st
        # Every old bucket is rewritten or removed; new ones are written when not empty.
        self._dirty = {b for b in range(new) if b < old or self._cache[b]}


class CepProcessor(StatefulProcessor):
    """Runs the engine for one shard. `engine_factory` is called once per worker process."""

    def __init__(self, engine_factory: EngineFactory, to_rows: RowsFromOutput,
                 watermark_delay_ms: int, end_of_input: int | None = None) -> None:
        self.engine_factory = engine_factory
        self.to_rows = to_rows
        self.delay = watermark_delay_ms
        # Replay only: the input's last event time, used once the end-of-input marker
        # (an event at EOF_TS) has moved the watermark to the end of time.
        self.end_of_input = end_of_input

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.engine = _cached_engine(self.engine_factory)
        self.store = MapStateKeyStore(
            handle.getMapState("buckets", _BUCKET_SCHEMA, _BLOB_SCHEMA),
            handle.getValueState("shard", _BLOB_SCHEMA),
        )

    def _max_ts(self, timer_values: Any) -> int:
        wm = int(timer_values.getCurrentWatermarkInMs())
        return -(2**62) if wm <= _NO_WATERMARK else wm + self.delay

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                        timerValues: Any) -> Iterator[pd.DataFrame]:
        started = time.perf_counter()
        events: list[Event] = []
        primary = 0
        for pdf in rows:
            primary += int(pdf["primary"].sum())
            for stream, ts, seq, data, route in zip(pdf["stream"], pdf["ts"], pdf["seq"],
                                                    pdf["data"], pdf["key_field"], strict=True):
                if stream == EOF_STREAM:
                    continue
                fields = json.loads(data)
                # Files have no source position: order ties by content, as the embedded mode.
                pos = content_seq(fields) if pd.isna(seq) else int(seq)
                events.append(Event(stream, int(ts), pos, fields, route))
        out = self._run(events, timerValues)
        self._reset_timer()
        self.store.flush()
        max_ts = max((e.ts for e in events), default=None)
        yield self._frame(out, {"events": primary, "rows": len(events), "max_ts": max_ts},
                          started)

    def handleExpiredTimer(self, key: Any, timerValues: Any,
                           expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        started = time.perf_counter()
        out = self._run([], timerValues)
        self._reset_timer()
        self.store.flush()
        yield self._frame(out, {"events": 0, "rows": 0, "max_ts": None}, started)

    def _run(self, events: list[Event], timer_values: Any) -> Output:
        max_ts = self._max_ts(timer_values)
        if self.end_of_input is not None and max_ts >= EOF_TS:
            return self.engine.ingest(self.store, events, max_ts, end_of_input=self.end_of_input)
        return self.engine.ingest(self.store, events, max_ts)

    def _reset_timer(self) -> None:
        for t in list(self.handle.listTimers()):
            self.handle.deleteTimer(t)
        nxt = self.engine.next_wake(self.store)
        if nxt is not None:
            self.handle.registerTimer(max(1, nxt - self.delay))

    def _frame(self, out: Output, stats: dict[str, Any], started: float) -> pd.DataFrame:
        rows = self.to_rows(self.engine, out)
        stats.update(late=len(out.late), keys_touched=out.keys_touched,
                     keys_released=out.keys_released, state_writes=self.store.writes,
                     state_reads=self.store.reads,
                     # Time in this call's Python (rows in, engine, state, rows out), in µs.
                     python_us=int(1e6 * (time.perf_counter() - started)))
        self.store.writes = self.store.reads = 0
        rows.append(("stats", "", "", "", json.dumps(stats)))
        return pd.DataFrame(rows, columns=["kind", "rule_id", "key", "id", "payload"])

    def close(self) -> None:
        pass


_ENGINES: dict[int, Engine] = {}


def _cached_engine(factory: EngineFactory) -> Engine:
    """Compile once per Python worker and rules version (workers are reused across tasks)."""
    key, build = factory.load()
    engine = _ENGINES.get(key)
    if engine is None:
        if len(_ENGINES) > 8:
            _ENGINES.clear()
        engine = build()
        _ENGINES[key] = engine
    return engine


__all__ = ["OUTPUT_SCHEMA", "CepProcessor", "MapStateKeyStore"]
