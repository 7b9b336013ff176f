"""The Spark plan shared by replay and the live job.

raw rows (stream, value bytes, seq, …) ──validate──► good events ──fan-out──► shard ──► operator
                                     └► bad events (reason, raw) → dead letters

- Validation is `cep.events.validate`, in Python (mapInArrow), on the bytes exactly as read: the
  JVM never parses an event, so nothing it accepts can be unreadable to the engine (issue 18:
  Spark's JSON reader took single quotes and trailing garbage that `json.loads` then refused,
  crashing the query). Costs one Python pass per event.
- Fan-out: one row per (event, key field used by the stream's rules); rules that share a key
  field share the row. The grouping key is `shard = pmod(xxhash64(field, key), shards)`.
- Watermark delay D = the largest allowed lateness; the operator computes each rule's own
  watermark from it (docs/spark-runtime.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cep.events import MAX_BYTES, EventSchema, schema_fields, validate_text
from cep.nfa import RuleSet, StreamSpec
from cep.runtime.engine import EOF_TS
from cep.tables import table_fields

EOF_STREAM = "__end_of_input__"
# A bad event travelling with the good ones (the live job's one query): the operator passes it
# on as a dead-letter row; its `data` is the dead letter's fields as JSON (`live_pass`).
DEAD_STREAM = "__dead_letter__"


@dataclass(frozen=True)
class StreamPlan:
    name: str
    time_field: str
    lateness_ms: int
    key_fields: tuple[str, ...]
    # Declared (field, STRING|INT|FLOAT|BOOL), or (field, a STRUCT's own fields): cep.events
    schema: tuple[tuple[str, Any], ...] | None = None
    # A table's changelog (docs/tables.md): its records are routed like events, each key field
    # reading the table's key column; the key field BROADCAST sends a record to every shard.
    table_key: str | None = None
    topic: str | None = None  # a table's Kafka topic (streams: the stream's name)

    @property
    def is_table(self) -> bool:
        return self.table_key is not None


@dataclass(frozen=True)
class Plan:
    streams: tuple[StreamPlan, ...]
    shards: int

    @property
    def watermark_delay_ms(self) -> int:
        return max((s.lateness_ms for s in self.streams), default=0)

    def stream(self, name: str) -> StreamPlan:
        for s in self.streams:
            if s.name == name:
                return s
        raise KeyError(name)


def plan_for(ruleset: RuleSet, shards: int) -> Plan:
    specs: dict[str, StreamSpec] = {}
    keys: dict[str, list[str]] = {}
    for rule in ruleset.rules:
        if not rule.enabled:
            continue
        specs.setdefault(rule.stream.name, rule.stream)
        kf = rule.key_field or ""
        if kf not in keys.setdefault(rule.stream.name, []):
            keys[rule.stream.name].append(kf)
    streams = tuple(
        StreamPlan(
            name, spec.time_field, spec.lateness_ms, tuple(keys[name]),
            None if spec.fields is None else schema_fields(spec.fields),
        )
        for name, spec in sorted(specs.items())
    )
    return Plan(streams + table_plans(ruleset), shards)


BROADCAST = "*"  # the key field of a table record sent to every shard


def table_plans(ruleset: RuleSet) -> tuple[StreamPlan, ...]:
    """The versioned tables the enabled rules read, as inputs routed to where their lookups
    run: to the shard of (the rule's key field, the record's key) when the lookup is by the
    rule's PARTITION BY field (co-partitioned), else to every shard (broadcast). A static
    (FILE) table is in the rules themselves: nothing to route."""
    routes: dict[str, list[str]] = {}
    for rule in ruleset.rules:
        if not rule.enabled:
            continue
        for table, fname in rule.lookups:
            route = fname if fname == (rule.key_field or "") else BROADCAST
            if route not in routes.setdefault(table, []):
                routes[table].append(route)
    out = []
    for t in ruleset.tables:
        if t.name not in routes or t.time_field is None:
            continue
        out.append(StreamPlan(t.name, t.time_field, 0, tuple(routes[t.name]),
                              table_fields(t), table_key=t.key, topic=t.source))
    return tuple(out)


class Validate:
    """The mapInArrow function: raw rows → validated rows, by the one validator (`cep.events`).

    Spark never interprets the bytes of an event: they reach Python as they were read, and this
    is the only parse. Good rows carry `ts`, the canonical `data` and the key values (`keys`, in
    the order of the stream's key fields, as the engine spells them: `str()` of non-strings);
    bad rows carry the `reason` and the `raw` bytes. Other input columns pass through.

    `fast` (the live job, `detect`): the rows of an event stream go first through the core's
    fast path (`_core.validate_fast`, as replay's first step: docs/spark-runtime.md), which
    accepts only records the Python validator accepts unchanged and gives their time and keys
    with no Python object per record; every other record (bad input, ISO times, conversions,
    any doubt) goes to `validate_text`, still the one definition of a valid event."""

    def __init__(self, plan: Plan, passthrough: tuple[str, ...], max_bytes: int,
                 fast: bool = True) -> None:
        self.schemas = {s.name: EventSchema(s.name, s.time_field,
                                            (s.table_key,) if s.table_key else
                                            tuple(k for k in s.key_fields if k), s.schema)
                        for s in plan.streams}
        # Where each key field's value is read: the field itself, or a table's key column.
        self.key_order = {s.name: tuple(s.table_key or k for k in s.key_fields)
                          for s in plan.streams}
        self.passthrough = passthrough
        self.max_bytes = max_bytes
        # Per event stream: (time field, key order, declared fields) for the fast path. Tables
        # are left to Python (a tombstone's delete record, `_deleted`).
        self.fast = ({s.name: (s.time_field, list(self.key_order[s.name]), s.schema)
                      for s in plan.streams if not s.is_table} if fast else {})

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            yield self.validate_batch(batch)

    def validate_batch(self, batch: Any) -> Any:
        """One Arrow batch of raw rows → its validated rows, in the input's order."""
        if self.fast and not native_on_this_worker():
            self.fast = {}
        import numpy as np
        import pyarrow as pa

        n = batch.num_rows
        if not n:
            return self._slow(batch)  # an empty batch keeps the output's columns
        accepted, slow = self._fast(batch) if self.fast else ([], np.arange(n))
        parts = [*accepted]
        if len(slow):
            sub = batch if len(slow) == n else batch.take(pa.array(slow))
            parts.append((slow, self._slow(sub)))
        if len(parts) == 1:
            return parts[0][1]  # every row in one part: in the input's order already
        order = np.concatenate([rows for rows, _ in parts])
        table = pa.Table.from_batches([out for _, out in parts])
        # Back to the input's order.
        return table.take(pa.array(np.argsort(order, kind="stable"))).combine_chunks() \
            .to_batches()[0]

    def _fast(self, batch: Any) -> tuple[list[tuple[Any, Any]], Any]:
        """The core's fast path over each event stream's rows: `[(row indices, validated
        rows)]` for the records it accepted, and the indices of the rest (for `_slow`)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        n = batch.num_rows
        stream = batch.column("stream")
        done = np.zeros(n, bool)
        out: list[tuple[Any, Any]] = []
        for name, (tf, key_order, fields) in self.fast.items():
            # A null stream is not this stream (Python makes it a dead letter).
            if len(self.fast) == 1 and pc.all(pc.equal(stream, name),
                                              skip_nulls=False).as_py():
                idx = None  # the usual batch: one stream
                sub = batch
            else:
                mask = pc.equal(stream, name).fill_null(False)
                if not pc.any(mask).as_py():
                    continue
                idx = np.flatnonzero(mask.to_numpy(zero_copy_only=False))
                sub = batch.take(pa.array(idx))
            local, ts, _, keys = fast_validated(sub.column("value"), tf, key_order, fields,
                                                self.max_bytes, content_seq=False)
            if not len(local):
                continue
            rows = local if idx is None else idx[local]
            done[rows] = True
            take = None if len(local) == sub.num_rows else pa.array(local)

            def col(c: str, take: Any = take, sub: Any = sub) -> Any:
                return sub.column(c) if take is None else sub.column(c).take(take)

            nulls = len(local)
            arrays = [col("stream"), ts, col("seq"), accepted_text(col("value")), keys,
                      pa.nulls(nulls, pa.string()), pa.nulls(nulls, pa.binary())]
            arrays += [col(c) for c in self.passthrough]
            out.append((rows, pa.RecordBatch.from_arrays(arrays, names=self._names())))
        return out, np.flatnonzero(~done)

    def _names(self) -> list[str]:
        return ["stream", "ts", "seq", "data", "keys", "reason", "raw", *self.passthrough]

    def _slow(self, batch: Any) -> Any:
        """The Python validator over the rows, one by one."""
        import pyarrow as pa

        ts: list[int | None] = []
        data: list[str | None] = []
        keys: list[list[str] | None] = []
        reasons: list[str | None] = []
        raws: list[bytes | None] = []
        for stream, raw in zip(batch.column("stream").to_pylist(),
                               batch.column("value").to_pylist(), strict=True):
            text, event, t, reason = self._one(stream, raw)
            if event is None or text is None:
                ts.append(None)
                data.append(None)
                keys.append(None)
                reasons.append(reason)
                raws.append(raw)
                continue
            ts.append(t)
            data.append(text)
            keys.append([_key(event.get(k)) if k else "" for k in self.key_order[stream]]
                        if stream != EOF_STREAM else [""])
            reasons.append(None)
            raws.append(None)
        arrays = [batch.column("stream"), pa.array(ts, pa.int64()),
                  batch.column("seq"), pa.array(data, pa.string()),
                  pa.array(keys, pa.list_(pa.string())), pa.array(reasons, pa.string()),
                  pa.array(raws, pa.binary())]
        arrays += [batch.column(c) for c in self.passthrough]
        return pa.RecordBatch.from_arrays(arrays, names=self._names())

    def _one(self, stream: str | None, raw: bytes | None,
             ) -> tuple[str | None, dict[str, Any] | None, int | None, str | None]:
        if stream == EOF_STREAM:
            return "{}", {}, EOF_TS, None
        schema = self.schemas.get(stream or "")
        if schema is None:
            return None, None, None, f"unknown stream {stream!r}"
        return validate_text(raw, schema, self.max_bytes)


def tombstones_as_deletes(value: Any, stream: Any, plan: Plan) -> Any:
    """A Kafka read's `value`, where a table's tombstone (a null value) becomes the delete
    record `{"<key>": <the Kafka key>, "<time>": <the Kafka timestamp, ms>, "_deleted": true}`
    (docs/tables.md); other records as they are. Needs the read's `key` and `timestamp`."""
    out = value
    for s in plan.streams:
        if not s.is_table:
            continue
        types = dict(s.schema or ())
        key = F.col("key").cast("string")
        if types.get(s.table_key or "") == "INT":
            key = key.cast("long")
        delete = F.to_json(F.struct(key.alias(str(s.table_key)),
                                    F.unix_millis(F.col("timestamp")).alias(s.time_field),
                                    F.lit(True).alias("_deleted"))).cast("binary")
        out = F.when((stream == s.name) & value.isNull() & F.col("key").isNotNull(),
                     delete).otherwise(out)
    return out


def fast_validated(values: Any, time_field: str, key_order: list[str], fields: Any,
                   max_bytes: int, content_seq: bool = True) -> tuple[Any, Any, Any, Any]:
    """The core's fast validator (`_core.validate_fast`) over an Arrow column of records:
    the indices of the records it accepted, and for those their times (int64 array), content
    seqs (numpy int64) and keys (`list<string>`, in `key_order`). The rest is for Python.
    `content_seq` False (the live pass: its seq is the Kafka position) skips the canonical text
    and hash of each record, a third to a half of the validator's time; the seqs are then None."""
    import numpy as np
    import pyarrow as pa

    from cep import _core  # type: ignore[attr-defined]

    ok_b, ts_b, seq_b, koff, kdata = _core.validate_fast(
        values.to_pylist(), time_field, key_order, fields, max_bytes, content_seq)
    ok = np.frombuffer(ok_b, np.uint8).astype(bool)
    n, k = len(ok), len(key_order)
    rows = np.flatnonzero(ok)
    flat = pa.Array.from_buffers(pa.string(), n * k,
                                 [None, pa.py_buffer(koff), pa.py_buffer(kdata)])
    if len(rows) != n:
        flat = flat.take(pa.array((rows[:, None] * k + np.arange(k)).reshape(-1)))
    keys = pa.ListArray.from_arrays(pa.array(np.arange(0, len(rows) * k + 1, k,
                                                       dtype=np.int32)), flat)
    seqs = None if seq_b is None else np.frombuffer(seq_b, np.int64)[rows]
    return rows, pa.array(np.frombuffer(ts_b, np.int64)[rows]), seqs, keys


def accepted_text(value: Any) -> Any:
    """The record bytes the core's fast validator accepted, as text: it accepts only records
    that are UTF-8 as a whole, so binary bytes are viewed as text, not cast (no copy, no check)."""
    import pyarrow as pa

    return value.view(pa.string()) if value.type == pa.binary() else value.cast(pa.string())


def native_on_this_worker() -> bool:
    """Whether this Python process can import the native core. On a cluster the package may
    reach the workers as a zip (`spark.submit.pyFiles`), from which an extension module cannot
    load: the fast paths then step aside and the Python validator does all the work."""
    from cep.runtime import native

    return native.available()


def _key(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


def validated(raw: DataFrame, plan: Plan, passthrough: tuple[str, ...] = (),
              max_bytes: int = MAX_BYTES) -> DataFrame:
    """`raw` has `stream`, `value` (binary or string: the event exactly as read) and `seq`;
    adds `ts`, `data`, `keys`, `reason` (null when the event is good) and `raw` (bad rows)."""
    rows = raw.select("stream", F.col("value").cast("binary").alias("value"),
                      F.col("seq").cast("bigint").alias("seq"), *passthrough)
    types = dict(rows.dtypes)
    ddl = ", ".join(["stream string", "ts bigint", "seq bigint", "data string",
                     "keys array<string>", "reason string", "raw binary"]
                    + [f"{c} {types[c]}" for c in passthrough])
    return rows.mapInArrow(Validate(plan, passthrough, max_bytes), ddl)


def parse(raw: DataFrame, plan: Plan) -> DataFrame:
    """`validated` without pass-through columns (the benchmark harness calls it)."""
    return validated(raw, plan)


def fan_out(events: DataFrame, plan: Plan) -> DataFrame:
    """One row per (event, key field); adds `shard` and the watermark's `event_time`."""
    per_stream = F.array().cast("array<string>")
    for s in plan.streams:
        per_stream = F.when(F.col("stream") == s.name,
                            F.array(*[F.lit(k) for k in s.key_fields])).otherwise(per_stream)
    per_stream = F.when(F.col("stream").isin(EOF_STREAM, DEAD_STREAM),
                        F.array(F.lit(""))).otherwise(per_stream)
    out = events.select("*", F.posexplode(per_stream).alias("kf_pos", "key_field"))
    key = F.element_at(F.col("keys"), F.col("kf_pos") + 1)
    shard = F.pmod(F.xxhash64(F.col("key_field"), key), F.lit(plan.shards)).cast("int")
    tables = [s.name for s in plan.streams if s.is_table]
    not_event = F.col("stream").isin(EOF_STREAM, DEAD_STREAM, *tables)
    if any(BROADCAST in s.key_fields for s in plan.streams):
        shard = F.explode(F.when(F.col("key_field") == BROADCAST,
                                 F.sequence(F.lit(0), F.lit(plan.shards - 1)))
                          .otherwise(F.array(shard)))
    # A table record never moves the watermark (docs/tables.md): its watermark time is 0.
    event_time = F.when(F.col("stream").isin(*tables), F.lit(0).cast("bigint")) \
        .otherwise(F.col("ts")) if tables else F.col("ts")
    # `primary`: the event's first fan-out row, so that counts see each event once.
    return (out.select("*", shard.alias("shard"))
            .withColumn("event_time", F.timestamp_millis(event_time))
            .select("shard", "stream", "ts", "seq", "data", "key_field",
                    ((F.col("kf_pos") == 0) & ~not_event).alias("primary"),
                    "event_time"))




# The columns of a fan-out row that the operator reads, as packed by `Pack` (in this order).
PACKED_SCHEMA_DDL = "shard int, wm bigint, pack binary"


def _pack_schema() -> Any:
    import pyarrow as pa

    return pa.schema([("stream", pa.string()), ("ts", pa.int64()), ("seq", pa.int64()),
                      ("data", pa.string()), ("key_field", pa.string()),
                      ("primary", pa.bool_())])


def packed_batch(rows: Any) -> Any:
    """Fan-out rows (an Arrow batch or table with `shard`, `wm` — the row's watermark time in
    ms — and the operator's columns) → one `shard, wm, pack` batch, a row per shard in them:
    the largest `wm` of that shard's rows and the rows as an Arrow IPC stream; None for no
    rows. The packs are written one after the other into one buffer, the `pack` column's data
    (no copy per pack).

    Why: transformWithStateInPandas hands a group's rows to Python one row at a time (PySpark
    4.3's worker turns each Arrow batch into pandas, walks it with `itertuples` to split it by
    key and builds a DataFrame per group from the row tuples), and the JVM moves, sorts and
    converts each row. A row per (shard, input batch) instead of a row per event leaves that
    per-event work to Arrow: the operator reads the packed events back as one Arrow batch
    (`unpack`), which the native engine ingests as it is. The watermark is the same (Spark takes
    the maximum of `wm` over the rows, which is the maximum over the events)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if rows.num_rows == 0:
        return None
    schema = _pack_schema()
    ordered = rows.take(pc.sort_indices(rows.column("shard")))
    shards = ordered.column("shard").to_numpy(zero_copy_only=False)
    wms = ordered.column("wm").to_numpy(zero_copy_only=False)
    cols = [ordered.column(f.name).cast(f.type) for f in schema]
    body = pa.RecordBatch.from_arrays(
        [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in cols],
        schema=schema)
    cuts = np.flatnonzero(np.diff(shards)) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [len(shards)]))
    sink = pa.BufferOutputStream()
    offsets = [0]
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        with pa.ipc.new_stream(sink, schema) as w:  # closing it ends this pack's stream
            w.write_batch(body.slice(s, e - s))
        offsets.append(sink.tell())
    pack = pa.Array.from_buffers(pa.binary(), len(starts), [
        None, pa.array(offsets, pa.int32()).buffers()[1], sink.getvalue()])
    return pa.RecordBatch.from_arrays(
        [pa.array(shards[starts], pa.int32()),
         pa.array(np.maximum.reduceat(wms, starts), pa.int64()), pack],
        names=["shard", "wm", "pack"])


def unpack(packs: Iterable[bytes]) -> Any:
    """`packed_batch`'s packs → one Arrow RecordBatch of their rows (the operator's columns)."""
    import pyarrow as pa

    tables = [pa.ipc.open_stream(p).read_all() for p in packs]
    if not tables:
        return pa.RecordBatch.from_pylist([], schema=_pack_schema())
    table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    batches = table.combine_chunks().to_batches()
    return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=_pack_schema())


class Pack:
    """The mapInArrow function of `packed`."""

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            out = packed_batch(batch)
            if out is not None:
                yield out


def packed(rows: DataFrame) -> DataFrame:
    """`fan_out`'s rows, packed per shard (`packed_batch`), with the watermark's `event_time`: the
    stateful operator's input."""
    return (rows.select("shard", "stream", "ts", "seq", "data", "key_field", "primary",
                        F.unix_millis(F.col("event_time")).alias("wm"))
            .mapInArrow(Pack(), PACKED_SCHEMA_DDL)
            .withColumn("event_time", F.timestamp_millis(F.col("wm"))).drop("wm"))
