"""The stateful operator: `transformWithStateInPandas` over shards of the partition key.

Thin by design: it turns pandas rows into `Event`s, gives the engine a key store backed by the
shard's state (plain logic in `cep.runtime.state_store`: `NativeShardStore` for the engine loop
in the native core, which keeps each shard's native state in the worker between calls and writes
back only the keys a call changed; `MapStateKeyStore` for the Python loop), converts between
Spark's watermark and the engine's max event time (docs/spark-runtime.md), keeps one timer per
shard, and turns the engine's output into rows.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, IntegerType, StructField, StructType

from cep.engines import EngineFactory
from cep.runtime.alerts import OUTPUT_SCHEMA
from cep.runtime.bind import engine_kind
from cep.runtime.engine import EOF_TS, Engine, Event, Output, content_seq
from cep.runtime.state_store import UNKNOWN, MapStateKeyStore, NativeShardStore, SharedRows
from cep.spark.pipeline import DEAD_STREAM, EOF_STREAM, unpack
from cep.spark.worker_daemon import reuses_workers

_OUT_COLUMNS = ["kind", "rule_id", "key", "id", "payload"]
_BUCKET_SCHEMA = StructType([StructField("bucket", IntegerType())])
_BLOB_SCHEMA = StructType([StructField("v", BinaryType())])
# The native store's log rows (layout 2): row number -> (blob, token it was appended onto).
_ROW_SCHEMA = StructType([StructField("row", IntegerType())])
_LOG_ROW_SCHEMA = StructType([StructField("v", BinaryType()), StructField("prev", BinaryType())])
_NO_WATERMARK = 0  # Spark reports 0 before the first watermark exists

# Rows the operator emits: alerts, timeouts, late events, and a per-call stats row.
RowsFromOutput = Callable[[Engine, Output], list[tuple[str, str, str, str, str]]]


class CepProcessor(StatefulProcessor):
    """Runs the engine for one shard. `engine_factory` is called once per worker process."""

    def __init__(self, engine_factory: EngineFactory, to_rows: RowsFromOutput,
                 watermark_delay_ms: int, end_of_input: int | None = None,
                 shards: int | None = None, layout1_log: bool = True,
                 record_row: bool = False) -> None:
        self.engine_factory = engine_factory
        # Whether the native store keeps each shard's record in its log's reserved row
        # (`RECORD_ROW`) instead of the ValueState `nshard`: one declaration per task, not two;
        # only for a query started so (the live job records it in its checkpoint since session
        # 18: `jobs.live.checkpoint_record_row`; an older checkpoint keeps `nshard`).
        self.record_row = record_row
        # Whether the native store's state may hold layout 1's log (`nlog`, a ListState; until
        # session 14), which is then declared in every task (`_native_store`); False for a
        # query whose state was started by a build that never wrote it (the live job records
        # that in its checkpoint: `jobs.live.checkpoint_layout1_log`).
        self.layout1_log = layout1_log
        # The job's shard count (None: unknown): the native store's decoded-keys budget per
        # shard (`NativeShardStore.for_shards`).
        self.shards = shards
        self.to_rows = to_rows
        self.delay = watermark_delay_ms
        # Replay only: the input's last event time, used once the end-of-input marker
        # (an event at EOF_TS) has moved the watermark to the end of time.
        self.end_of_input = end_of_input

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.engine = _cached_engine(self.engine_factory)
        started = time.perf_counter()
        # The job's metrics show each rule's live partial matches (the console's Rules view).
        self.engine.track_partials = True
        # The two engines keep differently shaped state, under different names: a rules change
        # that moves the job from one engine loop to the other starts the keys afresh
        # (docs/spark-runtime.md).
        # A mixed rule set (`cep.runtime.mixed.MixedEngine`: native rules on the native loop,
        # the others on the Python loop) keeps both, each under its own names.
        kind = engine_kind(self.engine)
        self.native = kind == "native"
        self.mixed = kind == "mixed"
        if self.native:
            self.store: Any = self._native_store(handle)
        elif self.mixed:
            from cep.runtime.mixed import MixedShardStore

            self.store = MixedShardStore(
                self._native_store(handle),
                MapStateKeyStore(handle.getMapState("buckets", _BUCKET_SCHEMA, _BLOB_SCHEMA),
                                 handle.getValueState("shard", _BLOB_SCHEMA)))
        else:
            self.store = MapStateKeyStore(
                handle.getMapState("buckets", _BUCKET_SCHEMA, _BLOB_SCHEMA),
                handle.getValueState("shard", _BLOB_SCHEMA),
            )
        # PySpark calls `init` once per task: the state variables' declarations (a round trip
        # each, in which the JVM builds the variable's encoders) are a fixed cost of every
        # stateful task, reported with the task's first call (`init_us`; the rules' compile,
        # once per worker process, is not in it).
        self._init_us = _us(time.perf_counter() - started)

    def _native_store(self, handle: StatefulProcessorHandle) -> NativeShardStore:
        """The native store over the shard's log rows and record (`nshard`, or the log's
        reserved row: `record_row`); `nlog`, layout 1's log (a
        ListState, until session 14), is declared when the state may hold it (`layout1_log`):
        a checkpoint written so is read from it once (and Spark keeps a query's state
        variables). Each declaration costs every task a round trip in which the JVM builds the
        variable's encoders (docs/spark-runtime.md, "The stateful stage's steady call")."""
        log = handle.getMapState("nrows", _ROW_SCHEMA, _LOG_ROW_SCHEMA)
        return NativeShardStore(log, None if self.record_row
                                else handle.getValueState("nshard", _BLOB_SCHEMA), _HELD,
                                NativeShardStore.for_shards(self.shards),
                                old_log=(handle.getListState("nlog", _BLOB_SCHEMA)
                                         if self.layout1_log else None),
                                shared=_shared_rows())

    def _begin(self, key: Any) -> None:
        if self.native:
            self.store.begin(tuple(key), self.engine)
        elif self.mixed:
            self.store.native.begin(tuple(key), self.engine.native)  # type: ignore[attr-defined]

    def _max_ts(self, timer_values: Any) -> int:
        wm = int(timer_values.getCurrentWatermarkInMs())
        return -(2**62) if wm <= _NO_WATERMARK else wm + self.delay

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                        timerValues: Any) -> Iterator[pd.DataFrame]:
        """`rows`: packed events (`cep.spark.pipeline.packed`: a `pack` column of Arrow IPC
        streams), read back as one Arrow batch; no pandas object per event."""
        import pyarrow.compute as pc

        started = time.perf_counter()
        packs = [p for frame in rows for p in frame["pack"]]
        got = time.perf_counter()  # includes waiting for Spark to hand the rows over
        table = unpack(packs)
        stream = table.column("stream")
        dead_at = pc.equal(stream, DEAD_STREAM)
        drop = pc.or_(dead_at, pc.equal(stream, EOF_STREAM))
        dead: list[str] = []
        if pc.any(drop).as_py():
            dead = table.filter(dead_at).column("data").to_pylist()
            table = table.filter(pc.invert(drop))
        primary = int(pc.sum(table.column("primary").cast("int64")).as_py() or 0)
        max_ts = pc.max(table.column("ts")).as_py() if table.num_rows else None
        batch: Any = (self._events_batch(table) if self.native
                      else self._events(table.to_pandas()))
        n = table.num_rows
        self._begin(key)
        try:
            ran = time.perf_counter()
            out = self._run(batch, timerValues)
            stored = time.perf_counter()
            self._reset_timer(timerValues)
            timed = time.perf_counter()
            self.store.flush()
        except BaseException:
            self._abandon()
            raise
        done = time.perf_counter()
        # Where the call's time went, in µs: rows in (Spark → pandas), events out of them and
        # the state read, the engine, the state write and timer (`python_us`: all of it).
        yield self._frame(out, {"events": primary, "rows": n, "max_ts": max_ts,
                                "rows_in_us": _us(got - started), "prepare_us": _us(ran - got),
                                "engine_us": _us(stored - ran), "store_us": _us(done - stored),
                                "timer_us": _us(timed - stored)},
                          started, dead)

    @staticmethod
    def _events(pdf: pd.DataFrame) -> list[Event]:
        """The rows (events only) as `Event`s, for the Python engine loop."""
        events: list[Event] = []
        for stream, ts, seq, data, route in zip(pdf["stream"], pdf["ts"], pdf["seq"],
                                                pdf["data"], pdf["key_field"], strict=True):
            fields = json.loads(data)
            # Files have no source position: order ties by content, as the embedded mode.
            pos = content_seq(fields) if pd.isna(seq) else int(seq)
            events.append(Event(stream, int(ts), pos, fields, route))
        return events

    @staticmethod
    def _events_batch(table: Any) -> Any:
        """The rows (events only) as one Arrow batch for the native engine loop: no Python
        object per event (the core parses `data`, the event's JSON text)."""
        import pyarrow as pa

        seq: Any = table.column("seq")
        if seq.null_count:  # no source position (files): order ties by content
            seq = pa.array([content_seq(json.loads(d)) if q is None else q
                            for q, d in zip(seq.to_pylist(), table.column("data").to_pylist(),
                                            strict=True)], pa.int64())
        return pa.RecordBatch.from_arrays(
            [table.column("stream"), table.column("ts"), seq, table.column("data"),
             table.column("key_field")],
            names=["stream", "ts", "seq", "data", "route"])

    def handleExpiredTimer(self, key: Any, timerValues: Any,
                           expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        started = time.perf_counter()
        self._begin(key)
        try:
            out = self._run([], timerValues)
            stored = time.perf_counter()
            self._reset_timer(timerValues, expired=True)
            timed = time.perf_counter()
            self.store.flush()
        except BaseException:
            self._abandon()
            raise
        done = time.perf_counter()
        # `store_us` and `timer_us` as in `handleInputRows`: this call's flush adds to
        # `encode_us` / `write_us` too (`_frame`).
        yield self._frame(out, {"events": 0, "rows": 0, "max_ts": None,
                                "store_us": _us(done - stored), "timer_us": _us(timed - stored)},
                          started)

    def _abandon(self) -> None:
        if self.native:
            self.store.abandon()
        elif self.mixed:
            self.store.native.abandon()

    def _run(self, events: Any, timer_values: Any) -> Output:
        """`events`: a list of `Event`s (Python loop) or an Arrow batch (native loop)."""
        max_ts = self._max_ts(timer_values)
        eoi = self.end_of_input if self.end_of_input is not None and max_ts >= EOF_TS else None
        if isinstance(events, list):
            return self.engine.ingest(self.store, events, max_ts, end_of_input=eoi)
        return self.engine.ingest_batch(  # type: ignore[attr-defined,no-any-return]
            self.store, events, max_ts, end_of_input=eoi)

    def _reset_timer(self, timer_values: Any, expired: bool = False) -> None:
        """One event-time timer per shard, at or before its next wake. Each timer call is a
        round trip to the state server: the native store remembers the timer it registered
        (in its record) and keeps it while it is the wake, or earlier and not due in this
        batch; otherwise it is replaced (two calls). Why an early timer may stay:
        docs/spark-runtime.md, "One state variable and fewer timer calls". Without a known
        timer (the Python loop) the timers are listed and replaced."""
        nxt = self.engine.next_wake(self.store)
        want = None if nxt is None else max(1, nxt - self.delay)
        known = self.store.timer if self.native else UNKNOWN
        if expired and known is not UNKNOWN:
            known = None  # Spark removed the timer that fired (the only one)
        if known is UNKNOWN:
            for t in list(self.handle.listTimers()):
                self.handle.deleteTimer(t)
            if want is not None:
                self.handle.registerTimer(want)
        elif known != want:
            wm = int(timer_values.getCurrentWatermarkInMs())
            if isinstance(known, int) and want is not None and wm < known < want:
                want = known  # early and not due: it stays
            else:
                if known is not None:
                    self.handle.deleteTimer(known)  # type: ignore[arg-type]
                if want is not None:
                    self.handle.registerTimer(want)
        if self.native:
            self.store.timer = want

    def _frame(self, out: Output, stats: dict[str, Any], started: float,
               dead: list[str] | None = None) -> pd.DataFrame:
        rows = self.to_rows(self.engine, out)
        rows += [("dead", "", "", "", d) for d in dead or ()]
        stats.update(late=len(out.late), keys_touched=out.keys_touched,
                     keys_released=out.keys_released, state_writes=self.store.writes,
                     state_reads=self.store.reads,
                     # Time in this call's Python (rows in, engine, state, rows out), in µs.
                     python_us=int(1e6 * (time.perf_counter() - started)))
        partials = getattr(out, "partial_matches", None)
        if partials:  # per rule, the change over this call (jobs/metrics.py)
            stats["partial_matches"] = partials
        if self.native or self.mixed:
            nstore = self.store.native if self.mixed else self.store
            # `load_us` (the record read, any catch-up or reload) holds `read_us` (the log
            # rows' reads), `unzip_us`, `import_us` and the reloads' part (`reload_us`);
            # `store_us` = `timer_us` + `encode_us` (the core) + `write_us` (state server), up
            # to the clock reads between them: both kinds of call report all four, each its own
            # flush's (the counters are reset here, once per call).
            stats.update(nstore.take_stats())
        self.store.writes = self.store.reads = 0
        if self._init_us:
            stats["init_us"], self._init_us = self._init_us, 0
        rows.append(("stats", "", "", "", json.dumps(stats)))
        # From an object array: about half the cost of pandas' own row-tuple path, paid on
        # every call (shards x batches).
        return pd.DataFrame(np.array(rows, dtype=object), columns=_OUT_COLUMNS, copy=False)

    def close(self) -> None:
        pass


def _us(seconds: float) -> int:
    return int(1e6 * seconds)


_ENGINES: dict[int, Engine] = {}
# Per worker process: each shard's native state as this process last wrote it (NativeShardStore).
_HELD: dict[Any, Any] = {}


@functools.cache
def _shared_rows() -> SharedRows | None:
    """The worker process's hand-over of log rows to the other workers of its executor
    (`SharedRows`: their catch-ups read the rows there, not from the state server); None when
    Spark does not reuse its Python workers: each task's process then exits after it, no
    process holds a copy that a catch-up would bring up to date, and the files would be
    written for nobody."""
    return SharedRows.for_worker() if reuses_workers() else None


def _cached_engine(factory: EngineFactory) -> Engine:
    """Compile once per Python worker and rules version (workers are reused across tasks)."""
    key, build = factory.load()
    engine = _ENGINES.get(key)
    if engine is None:
        if len(_ENGINES) > 8:
            _ENGINES.clear()
            _HELD.clear()
        engine = build()
        _ENGINES[key] = engine
    return engine


__all__ = ["OUTPUT_SCHEMA", "CepProcessor", "MapStateKeyStore"]
