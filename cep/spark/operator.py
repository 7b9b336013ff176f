"""The stateful operator: `transformWithStateInPandas` over shards of the partition key.

Thin by design: it turns pandas rows into `Event`s, gives the engine a `KeyStore` backed by the
shard's MapState (`cep.runtime.state_store.MapStateKeyStore`, plain logic), converts between
Spark's watermark and the engine's max event time (docs/spark-runtime.md), keeps one timer per
shard, and turns the engine's output into rows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, IntegerType, StructField, StructType

from cep.engines import EngineFactory
from cep.runtime.engine import EOF_TS, Engine, Event, Output, content_seq
from cep.runtime.state_store import MapStateKeyStore
from cep.spark.pipeline import EOF_STREAM

OUTPUT_SCHEMA = "kind string, rule_id string, key string, id string, payload string"
_BUCKET_SCHEMA = StructType([StructField("bucket", IntegerType())])
_BLOB_SCHEMA = StructType([StructField("v", BinaryType())])
_NO_WATERMARK = 0  # Spark reports 0 before the first watermark exists

# Rows the operator emits: alerts, timeouts, late events, and a per-call stats row.
RowsFromOutput = Callable[[Engine, Output], list[tuple[str, str, str, str, str]]]


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
        # The job's metrics show each rule's live partial matches (the console's Rules view).
        self.engine.track_partials = True
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
        partials = getattr(out, "partial_matches", None)
        if partials:  # per rule, the change over this call (jobs/metrics.py)
            stats["partial_matches"] = partials
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
