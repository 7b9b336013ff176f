"""The batch plan: the rules over bounded input as one Spark batch job (`cep replay`, and
`cep.spark.detect` on a batch DataFrame). No state store, no micro-batches, no staging copy.

raw rows ──Prepare (mapInArrow, per input split)──► repartition(shard) ──► sortWithinPartitions(ts)
  │  validate: `cep.spark.pipeline.Validate`                         ──► RunEngine (mapInArrow)
  │  good event → one row per key field of its stream (shard: JVM hash)   per partition: the
  │  bad record → one dead-letter row, with its source position          engine over its events
  └  end of the split → one end-of-input marker per shard (the split's    in ts order, then the
     last event time and how many records it read)                       end of input at the
                                                                          largest marker
                                                                      ──► OUTPUT_SCHEMA rows

Why it equals the embedded engine (docs/spark-runtime.md, "Replay as a batch job"): each
partition holds every event of its keys, sorted by event time, so no event is late; the engine
orders each key's events by (ts, seq) itself and its results do not depend on how the events
are cut into calls; and every partition ends its input at the same time, the input's last event
time, which the markers bring to every shard within the same job (one pass over the input, no
separate aggregate).

Raw rows (`RAW_COLUMNS`): `stream`, `value` (the record's bytes as read), `seq` (the source
position as an int, or null: files, whose ties in event time are ordered by content as in the
embedded mode), and where the record was, for dead letters: `src` (file URI or topic), `part`
(the file split's first byte, or the Kafka partition), `off` (the Kafka offset, a Parquet row
index, or null: counted here) and `form` (`line` for JSON lines, `row` for CSV/Parquet, `kafka`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cep.engines import RulesEngineFactory
from cep.events import MAX_BYTES, dead_letter
from cep.runtime.alerts import OUTPUT_SCHEMA, output_rows
from cep.runtime.bind import build_embedded_engine, engine_kind
from cep.runtime.engine import NEG_INF, Event, MemoryKeyStore, content_seq
from cep.spark.live_pass import kafka_seq
from cep.spark.pipeline import (
    BROADCAST,
    Plan,
    Validate,
    accepted_text,
    fast_validated,
    native_on_this_worker,
    tombstones_as_deletes,
)

RAW_COLUMNS = ("stream", "value", "seq", "src", "part", "off", "form")
# The rows between the two steps; `slim` plans (`slim_key_field`) leave out the columns that
# are the same on every row: stream, key_field, primary.
_PREPARED_TYPES = {"shard": "int", "kind": "string", "stream": "string", "ts": "bigint",
                   "seq": "bigint", "data": "string", "key_field": "string", "key": "string",
                   "primary": "boolean"}
_PREPARED_NAMES = list(_PREPARED_TYPES)
_SLIM_NAMES = ["shard", "kind", "ts", "seq", "data", "key"]
# The engine's chunks (`RunEngine`): 10k → 50k rows took 5-15 % off its CPU per event
# in-process (bench/results/replay_batch.md, session 11).
CHUNK_ROWS = 50_000
# Row kinds between the two steps: an event (per key field), a dead letter, an end marker.
EVENT, DEAD, MARK = "e", "d", "m"
JSONL = (".json", ".jsonl", ".ndjson", ".txt", "")
TABLES = (".csv", ".parquet")


def slim_key_field(plan: Plan) -> str | None:
    """The key field of every row, when the plan has one stream with one key field and no
    table (the usual replay): then each event is one row, routed by that field, and the rows
    between the two steps need no stream, key_field or primary column (each is the same on
    every row). None otherwise."""
    if len(plan.streams) != 1 or plan.streams[0].is_table:
        return None
    fields = plan.streams[0].key_fields
    return fields[0] if len(fields) == 1 and fields[0] != BROADCAST else None


def prepared_schema(plan: Plan) -> str:
    """`Prepare`'s output schema (DDL) for this plan."""
    return ", ".join(f"{n} {_PREPARED_TYPES[n]}" for n in _prepared_names(plan))


def _prepared_names(plan: Plan) -> list[str]:
    return _SLIM_NAMES if slim_key_field(plan) is not None else _PREPARED_NAMES


def _strings(values: list[str]) -> Any:
    import pyarrow as pa

    return pa.array(values, pa.string())


class _Validate(Validate):
    """`Validate`, keeping each record's event as the validator decoded it, so that its content
    seq needs no second parse (`events` is reset per batch; unused if `Validate` stops calling
    `_one`, in which case the seq is computed from the canonical text)."""

    def __init__(self, plan: Plan, max_bytes: int) -> None:
        super().__init__(plan, (), max_bytes, fast=False)  # Prepare has its own fast path
        self.events: list[dict[str, Any] | None] = []

    def _one(self, stream: str | None, raw: bytes | None,
             ) -> tuple[str | None, dict[str, Any] | None, int | None, str | None]:
        out = super()._one(stream, raw)
        self.events.append(out[1])
        return out


class Prepare:
    """The first step, on each input split: validation, fan-out, dead letters, markers. An
    event without a source position gets its content seq here (`content_seq`, as the embedded
    mode and the operator order ties in event time), so the engine's step is all Arrow. Rows
    of events carry their `key` (the JVM hashes it into `shard`, as `pipeline.fan_out` does);
    markers and dead letters carry their `shard`."""

    def __init__(self, plan: Plan, max_bytes: int = MAX_BYTES) -> None:
        self.validate = _Validate(plan, max_bytes)
        self.key_fields = {s.name: s.key_fields for s in plan.streams}
        self.streams = _strings(list(self.key_fields))
        # One stream (the usual case): its key fields, for the vectorised fan-out.
        self.only = plan.streams[0].key_fields if len(plan.streams) == 1 else None
        self.shards = plan.shards
        self.names = _prepared_names(plan)
        self.slim = self.names is _SLIM_NAMES
        # Table changelogs (docs/tables.md): routed like events, but not events: they count
        # in neither the events nor the input's last event time.
        self.tables = _strings([s.name for s in plan.streams if s.is_table])
        # One stream and no table (the usual replay): the native fast path checks the common
        # record (`_core.validate_fast`), with its time, keys and content seq, and leaves the
        # rest to `Validate` (docs/spark-runtime.md, "Replay as a batch job").
        self.fast: tuple[Any, ...] | None = None
        if self.only is not None and not len(self.tables):
            s = plan.streams[0]
            self.fast = (s.name, s.time_field, list(self.validate.key_order[s.name]),
                         s.schema, max_bytes)

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.compute as pc

        counted: dict[tuple[str, int], int] = {}  # lines (rows) so far per (file, split start)
        last: int | None = None
        read = dead = 0
        if self.fast is not None and not native_on_this_worker():
            self.fast = None
        for batch in batches:
            keep, nums = self._records(batch, counted)
            read += len(keep)
            if not len(keep):
                continue
            sub = batch if len(keep) == batch.num_rows else batch.take(pa.array(keep))
            if self.fast is not None:
                sub, keep, nums, events = self._fast(sub, keep, nums)
                if events is not None:
                    hi = pc.max(events.column("ts")).as_py()
                    if hi is not None:
                        last = hi if last is None or hi > last else last
                    yield events
                if not len(keep):
                    continue
            self.validate.events = []
            checked = next(iter(self.validate(iter([sub.select(["stream", "value", "seq"])]))))
            # (Validate passes its own end-of-input marker stream: not an event of the rules.)
            good = pc.and_(pc.is_null(checked.column("reason")),
                           pc.is_in(checked.column("stream"), self.streams).fill_null(False))
            n_good = pc.sum(good.cast(pa.int64())).as_py() or 0
            if n_good and len(self.tables):  # a table's good records are not events read
                read -= pc.sum(pc.and_(good, pc.is_in(checked.column("stream"), self.tables))
                               .cast(pa.int64())).as_py() or 0
            if n_good:
                events = self._fan_out(checked, good, n_good)
                hi = pc.max(events.filter(events.column("primary")).column("ts")).as_py() \
                    if len(self.tables) else pc.max(events.column("ts")).as_py()
                if hi is not None:
                    last = hi if last is None or hi > last else last
                yield events
            if n_good < checked.num_rows:
                letters = []
                for j in pc.indices_nonzero(pc.invert(good)).to_pylist():
                    i = int(keep[j])
                    row = checked.slice(j, 1).to_pylist()[0]
                    src, part, off, form = (batch.column(c)[i].as_py()
                                            for c in ("src", "part", "off", "form"))
                    reason = row["reason"] or f"unknown stream {row['stream']!r}"
                    letters.append(json.dumps(_letter(reason, row["raw"], row["stream"], src,
                                                      part, off, form, int(nums[j]))))
                yield _rows(pa, [(dead + n) % self.shards for n in range(len(letters))], DEAD,
                            data=letters).select(self.names)
                dead += len(letters)
        if read:  # every shard learns this split's last event time; shard 0 counts its reads
            shards = list(range(self.shards))
            yield _rows(pa, shards, MARK, ts=[last] * len(shards),
                        seq=[read] + [0] * (len(shards) - 1)).select(self.names)

    def _fast(self, sub: Any, keep: Any, nums: Any) -> tuple[Any, Any, Any, Any]:
        """The native fast path over a batch's records: the fan-out rows of the records it
        accepts (or None), and the rest (`sub`, `keep`, `nums`) for `Validate`."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        assert self.fast is not None
        name, tf, key_order, fields, max_bytes = self.fast
        if not pc.all(pc.equal(sub.column("stream"), name), skip_nulls=False).as_py():
            return sub, keep, nums, None
        rows, ts, content_seqs, keys = fast_validated(sub.column("value"), tf, key_order,
                                                      fields, max_bytes)
        n_ok, n = len(rows), sub.num_rows
        if not n_ok:
            return sub, keep, nums, None
        take = pa.array(rows)

        def accepted(col: Any) -> Any:  # (all of them, usually: no copy)
            return col if n_ok == n else col.take(take)

        seq = accepted(sub.column("seq"))
        seq = pa.array(content_seqs) if seq.null_count == n_ok else \
            pc.coalesce(seq, pa.array(content_seqs))
        text = accepted_text(accepted(sub.column("value")))
        checked = pa.RecordBatch.from_arrays(
            [accepted(sub.column("stream")), ts, seq, text, keys],
            names=["stream", "ts", "seq", "data", "keys"])
        events = self._fan_out(checked, pa.array(np.ones(n_ok, bool)), n_ok, decoded=[])
        if n_ok == n:
            return sub, keep[:0], nums[:0], events
        rest = np.setdiff1d(np.arange(n), rows, assume_unique=True)
        return sub.take(pa.array(rest)), keep[rest], nums[rest], events

    @staticmethod
    def _records(batch: Any, counted: dict[tuple[str, int], int]) -> tuple[Any, Any]:
        """The rows that are records (a blank line is not one) and, per record, its line or
        row number within its split (counted over every line, blank or not): two numpy int64
        arrays (line numbers are only read for dead letters)."""
        import numpy as np
        import pyarrow.compute as pc

        m = batch.num_rows
        if not m:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        src, part, off, form = (batch.column(c) for c in ("src", "part", "off", "form"))
        first = (src[0].as_py(), part[0].as_py() or 0)
        f0 = form[0].as_py()
        if (f0 != "kafka" and off.null_count == m and pc.all(pc.equal(form, f0)).as_py()
                and pc.all(pc.equal(src, first[0])).as_py()
                and pc.all(pc.equal(part.fill_null(0), first[1])).as_py()):
            # The usual batch: lines (or rows) of one split, in order.
            base = counted.get(first, 0)
            counted[first] = base + m
            if f0 != "line":
                return np.arange(m, dtype=np.int64), np.arange(base + 1, base + m + 1)
            blank = pc.match_substring_regex(batch.column("value"), r"^[ \t\r\n\x0b\x0c]*$")
            rows = np.flatnonzero(pc.invert(blank.fill_null(True)).to_numpy(
                zero_copy_only=False)).astype(np.int64)
            return rows, rows + (base + 1)
        keep: list[int] = []
        nums: list[int] = []
        for i, (raw, s, p, o, f) in enumerate(zip(
                batch.column("value").to_pylist(), src.to_pylist(), part.to_pylist(),
                off.to_pylist(), form.to_pylist(), strict=True)):
            if f == "kafka":
                nums.append(0)
            else:
                if o is not None:
                    n = o + 1
                else:
                    k = (s, p or 0)
                    n = counted.get(k, 0) + 1
                    counted[k] = n
                if f == "line" and (not raw or raw.isspace()):
                    continue
                nums.append(n)
            keep.append(i)
        return np.array(keep, np.int64), np.array(nums, np.int64)

    def _fan_out(self, checked: Any, good: Any, n_good: int,
                 decoded: list[Any] | None = None) -> Any:
        """The good events, one row per key field of their stream: `key_field`, `key`,
        `primary` (the event's first row, so that counts see each event once), and the seq
        (`decoded`: the validator's events, for a content seq; the fast path gives its seq)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        decoded = self.validate.events if decoded is None else decoded
        if len(decoded) != checked.num_rows and checked.column("seq").null_count:
            # Validate no longer calls _one: parse again
            decoded = [None if d is None else json.loads(d)
                       for d in checked.column("data").to_pylist()]
        rows = checked if n_good == checked.num_rows else checked.filter(good)
        seq = rows.column("seq")
        if seq.null_count:  # no source position: the content seq
            gidx = pc.indices_nonzero(good).to_pylist()
            seq = pa.array([content_seq(decoded[j] or {}) if q is None else q
                            for j, q in zip(gidx, seq.to_pylist(), strict=True)], pa.int64())
        keys = rows.column("keys")
        parent: Any = None  # None: one row per event (one key field), no take needed
        if self.only is not None:
            import numpy as np

            flat = pc.list_flatten(keys)
            k = len(self.only)
            if k > 1 or len(flat) != rows.num_rows:
                parent = pc.list_parent_indices(keys)
            within = pa.array(np.arange(len(flat), dtype=np.int32) % k if k > 1
                              else np.zeros(len(flat), np.int32))
            key_field = (pa.array(self.only, pa.string()).take(within) if k > 1
                         else pa.repeat(pa.scalar(self.only[0], pa.string()), len(flat)))
        else:
            parents: list[int] = []
            fields: list[str] = []
            pos: list[int] = []
            for j, stream in enumerate(rows.column("stream").to_pylist()):
                for p, kf in enumerate(self.key_fields.get(stream, ())):
                    parents.append(j)
                    fields.append(kf)
                    pos.append(p)
            flat = pc.list_flatten(keys)
            parent = pa.array(parents, pa.int32())
            within = pa.array(pos, pa.int32())
            key_field = pa.array(fields, pa.string())

        def per_row(col: Any) -> Any:
            return col if parent is None else col.take(parent)

        n = len(flat)
        if self.slim:  # one row per event: no stream, key_field, primary
            return pa.RecordBatch.from_arrays(
                [pa.nulls(n, pa.int32()), pa.repeat(pa.scalar(EVENT, pa.string()), n),
                 per_row(rows.column("ts")), per_row(seq), per_row(rows.column("data")), flat],
                names=_SLIM_NAMES)
        primary = pc.equal(within, 0)
        if len(self.tables):
            stream = per_row(rows.column("stream"))
            primary = pc.and_(primary, pc.invert(pc.is_in(stream, self.tables)))
        return pa.RecordBatch.from_arrays(
            [pa.nulls(n, pa.int32()), pa.repeat(pa.scalar(EVENT, pa.string()), n),
             per_row(rows.column("stream")), per_row(rows.column("ts")),
             per_row(seq), per_row(rows.column("data")), key_field, flat,
             primary], names=_PREPARED_NAMES)


def _rows(pa: Any, shards: list[int], kind: str, *, ts: list[int | None] | None = None,
          seq: list[int] | None = None, data: list[str] | None = None) -> Any:
    n = len(shards)
    none: list[None] = [None] * n
    return pa.RecordBatch.from_arrays(
        [pa.array(shards, pa.int32()), pa.array([kind] * n, pa.string()),
         pa.array(none, pa.string()), pa.array(ts or none, pa.int64()),
         pa.array(seq or none, pa.int64()), pa.array(data or none, pa.string()),
         pa.array(none, pa.string()), pa.array(none, pa.string()),
         pa.array([False] * n, pa.bool_())],
        names=_PREPARED_NAMES)


def _letter(reason: str | None, raw: bytes | None, stream: str | None, src: str | None,
            part: int | None, off: int | None, form: str, num: int) -> dict[str, Any]:
    """The dead letter, with its position as far as this task knows it: a line or row counted
    in a split that does not start the file is completed on the driver (`finish_dead_letter`)."""
    if form == "kafka":
        return dead_letter(reason or "invalid", raw, stream, topic=src, partition=part,
                           offset=off)
    if form == "line" and raw is not None:
        raw = raw.rstrip(b"\r\n")
    position: dict[str, Any] = {"file": src, form: num}
    if part and off is None:
        position["_split"] = part
    return dead_letter(reason or "invalid", raw, stream, **position)


class RunEngine:
    """The second step, on each partition (every event of its shards, sorted by event time):
    the embedded mode's engine (`build_embedded_engine`) over an in-memory key store, fed in
    chunks (Arrow batches) with the highest event time seen before each, then the end of input
    at the input's last event time (the largest end marker). The native engine loop reads the
    chunks as Arrow (the core parses the events' JSON); the Python loop gets `Event`s. Emits
    the operator's rows (`cep.runtime.alerts.output_rows`), the dead letters that came through
    (kind `dead`), and one stats row: events (each once), rows, max_ts, late, read (records
    read by the splits whose shard-0 marker came here), dead.

    `stream`: the one stream of a slim plan (`slim_key_field`), whose rows have no stream,
    key_field or primary column: each row is one event of that stream, routed by the stream's
    one key field, which every rule on it partitions by (so no route is needed).

    `chunk_rows`: Spark's batches (10k rows) are joined into chunks of at least this many
    rows before the engine sees them: the engine's work per key and call (its state, ordering
    the key's new events) is paid once per chunk. The partition is sorted by event time, so
    no event is late whatever the cut, and the engine's results do not depend on it."""

    def __init__(self, factory: RulesEngineFactory, stream: str | None = None,
                 chunk_rows: int = CHUNK_ROWS) -> None:
        self.factory = factory
        self.stream = stream
        self.chunk_rows = chunk_rows

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow.compute as pc

        engine = embedded_engine(self.factory)
        arrow = engine_kind(engine) == "native"
        tables = _strings(list(getattr(engine, "tables", None) or ()))
        store = MemoryKeyStore()
        max_ts = NEG_INF
        end: int | None = None
        n_events = n_rows = n_late = n_read = n_dead = 0
        for batch in _chunks(batches, self.chunk_rows):
            kind = batch.column("kind")
            rows: list[tuple[str, str, str, str, str]] = []
            is_event = pc.equal(kind, EVENT)
            if batch.num_rows and not pc.all(is_event).as_py():
                other = batch.filter(pc.invert(is_event))
                for k, ts, seq, data in zip(*(other.column(c).to_pylist() for c in
                                              ("kind", "ts", "seq", "data")), strict=True):
                    if k == MARK:
                        if ts is not None and (end is None or ts > end):
                            end = ts
                        n_read += seq or 0
                    else:
                        rows.append(("dead", "", "", "", data))
                        n_dead += 1
                batch = batch.filter(is_event)
            if batch.num_rows:
                n_events += batch.num_rows if self.stream is not None else \
                    pc.sum(batch.column("primary").cast("int64")).as_py() or 0
                n_rows += batch.num_rows
                events = batch.select(["ts", "seq", "data"] if self.stream is not None
                                      else ["stream", "ts", "seq", "data", "key_field"])
                # Table records do not move event time (docs/tables.md); every event row
                # has a primary row or a sibling (another key field's row) with its ts.
                top = pc.max(batch.column("ts")).as_py() if not tables or self.stream else \
                    pc.max(events.filter(pc.invert(pc.is_in(events.column("stream"),
                                                            tables))).column("ts")).as_py()
                if top is None:
                    top = max_ts
                if arrow:
                    out = engine.ingest_batch(store, events if self.stream is not None else
                                              events.rename_columns(
                                                  ["stream", "ts", "seq", "data", "route"]),
                                              max_ts)
                else:
                    cols = [c.to_pylist() for c in events.columns]
                    if self.stream is not None:
                        n = events.num_rows
                        cols = [[self.stream] * n, *cols, [None] * n]
                    out = engine.ingest(store, [
                        Event(s, t, q, json.loads(d), r)
                        for s, t, q, d, r in zip(*cols, strict=True)], max_ts)
                max_ts = max(max_ts, top)
                n_late += len(out.late)
                rows += output_rows(engine, out)
            if rows:
                yield _output(rows)
        if max_ts != NEG_INF:
            final = max_ts if end is None or end < max_ts else end
            out = engine.advance(store, final, end_of_input=final)
            rows = output_rows(engine, out)
            if rows:
                yield _output(rows)
        stats = {"events": n_events, "rows": n_rows, "late": n_late, "read": n_read,
                 "dead": n_dead, "max_ts": None if max_ts == NEG_INF else max_ts}
        yield _output([("stats", "", "", "", json.dumps(stats))])


def _chunks(batches: Iterator[Any], rows: int) -> Iterator[Any]:
    """Consecutive batches joined into chunks of at least `rows` rows (the last one may have
    fewer)."""
    import pyarrow as pa

    held: list[Any] = []
    n = 0
    for batch in batches:
        held.append(batch)
        n += batch.num_rows
        if n >= rows:
            yield held[0] if len(held) == 1 else pa.concat_batches(held)
            held, n = [], 0
    if held:
        yield held[0] if len(held) == 1 else pa.concat_batches(held)


def _output(rows: list[tuple[str, str, str, str, str]]) -> Any:
    import pyarrow as pa

    cols = list(zip(*rows, strict=True))
    return pa.RecordBatch.from_arrays([pa.array(c, pa.string()) for c in cols],
                                      names=["kind", "rule_id", "key", "id", "payload"])


_ENGINES: dict[int, Any] = {}


def embedded_engine(factory: RulesEngineFactory) -> Any:
    """The embedded mode's engine for these rules, compiled once per Python worker (workers
    are reused across tasks; each task brings its own key store)."""
    engine = _ENGINES.get(factory.cache_key)
    if engine is None:
        if len(_ENGINES) > 8:
            _ENGINES.clear()
        engine = build_embedded_engine(factory.ruleset(),
                                       max_partial_matches=factory.max_partial_matches)
        _ENGINES[factory.cache_key] = engine
    return engine


def match_bounded(raw: DataFrame, plan: Plan, factory: RulesEngineFactory,
                  partitions: int) -> DataFrame:
    """Raw rows (`RAW_COLUMNS`) → the engine's rows (OUTPUT_SCHEMA: alerts, late, dropped,
    stats) plus `dead` rows (payload: the dead letter's JSON; see `finish_dead_letter`).
    `partitions`: how many engine tasks (the alerts do not depend on it)."""
    prepared = raw.select(*RAW_COLUMNS).mapInArrow(Prepare(plan), prepared_schema(plan))
    # An event's shard as `pipeline.fan_out` computes it; markers and dead letters have theirs.
    slim = slim_key_field(plan)
    key_field = F.col("key_field") if slim is None else F.lit(slim)
    shard = F.when(F.col("kind") == EVENT, F.pmod(F.xxhash64(key_field, "key"),
                                                  F.lit(plan.shards)).cast("int"))
    shard = shard.otherwise(F.col("shard"))
    if any(BROADCAST in s.key_fields for s in plan.streams):  # a table record to every shard
        shard = F.explode(F.when((F.col("kind") == EVENT) & (F.col("key_field") == BROADCAST),
                                 F.sequence(F.lit(0), F.lit(plan.shards - 1)))
                          .otherwise(F.array(shard)))
    rows = prepared.select(shard.alias("shard"), *(c for c in prepared.columns
                                                   if c not in ("shard", "key")))
    # Shard s goes to engine partition s mod `partitions` (Spark's own hash of the shard number
    # put 171k rows in one partition and 332k in another of 1M events, 64 shards, 4 partitions).
    # The engine step does not read the shard.
    stream = plan.streams[0].name if slim is not None else None
    return (rows.repartition(partitions, partition_key(F.col("shard"), plan.shards, partitions))
            .sortWithinPartitions("ts").drop("shard")
            .mapInArrow(RunEngine(factory, stream), OUTPUT_SCHEMA))


def _murmur3_int(value: int, seed: int = 42) -> int:
    """Spark's `hash()` of an INT (Murmur3 x86 32-bit, seed 42), as a signed int."""
    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF

    k = (value & 0xFFFFFFFF) * 0xCC9E2D51 & 0xFFFFFFFF
    k = rotl(k, 15) * 0x1B873593 & 0xFFFFFFFF
    h = rotl(seed ^ k, 13)
    h = (h * 5 + 0xE6546B64) & 0xFFFFFFFF
    h ^= 4
    h ^= h >> 16
    h = h * 0x85EBCA6B & 0xFFFFFFFF
    h ^= h >> 13
    h = h * 0xC2B2AE35 & 0xFFFFFFFF
    h ^= h >> 16
    return h - (1 << 32) if h & 0x80000000 else h


def partition_key(shard: Any, shards: int, partitions: int) -> Any:
    """A column to `repartition(partitions, ...)` by so that shard s lands in partition
    s mod `partitions`: for each partition, the smallest int that Spark's hash partitioning
    sends there. Which partition holds a shard never changes an alert (every event of a key
    is in its shard); this only evens out the engine's tasks."""
    if partitions <= 1:
        return shard
    first: dict[int, int] = {}
    v = 0
    while len(first) < partitions and v < 1 << 20:
        first.setdefault(_murmur3_int(v) % partitions, v)
        v += 1
    if len(first) < partitions:  # cannot happen for a sane count; Spark's hash of the shard
        return shard
    values = F.array(*[F.lit(first[s % partitions]) for s in range(shards)])
    return F.element_at(values, shard + 1)


# -- sources -----------------------------------------------------------------------------------


def _located(df: DataFrame, stream: str, value: Any, form: str, row_index: bool = False,
             ) -> DataFrame:
    return df.select(F.lit(stream).alias("stream"), value.cast("binary").alias("value"),
                     F.lit(None).cast("bigint").alias("seq"),
                     F.col("_metadata.file_path").alias("src"),
                     F.col("_metadata.file_block_start").alias("part"),
                     (F.col("_metadata.row_index") if row_index
                      else F.lit(None)).cast("bigint").alias("off"),
                     F.lit(form).alias("form"))


def read_files(spark: Any, stream: str, files: list[Path]) -> DataFrame:
    """Raw rows of files: JSON lines (every line as read, split at `\\n` only), CSV (with a
    header; types inferred per file, as before) and Parquet, each row as its JSON. Paths are
    resolved here: the JVM's working directory need not be this process's."""
    files = [p.resolve() for p in files]
    lines = [str(p) for p in files if p.suffix in JSONL]
    parts: list[DataFrame] = []
    if lines:
        df = spark.read.option("lineSep", "\n").text(lines)
        parts.append(_located(df, stream, F.col("value"), "line"))
    for p in files:
        if p.suffix == ".csv":
            df = spark.read.option("header", True).option("inferSchema", True).csv(str(p))
            parts.append(_located(df, stream, F.to_json(F.struct("*")), "row"))
        elif p.suffix == ".parquet":
            df = spark.read.parquet(str(p))
            parts.append(_located(df, stream, F.to_json(F.struct("*")), "row", row_index=True))
    out = parts[0]
    for df in parts[1:]:
        out = out.unionByName(df)
    return out


def kafka_rows(df: DataFrame, stream: str, plan: Plan | None = None) -> DataFrame:
    """Raw rows of a Kafka read: seq is the source position, as the live job encodes it
    (`kafka_seq`: partition × 2^40 + offset), so a replay of a range gives the live job's alert
    ids. With the `plan`, a table's tombstones are read as deletes (`tombstones_as_deletes`)."""
    value = F.col("value").cast("binary")
    if plan is not None:
        value = tombstones_as_deletes(value, F.lit(stream), plan)
    return df.select(F.lit(stream).alias("stream"), value.alias("value"),
                     kafka_seq(F.col("partition"), F.col("offset"))
                     .alias("seq"), F.col("topic").alias("src"),
                     F.col("partition").cast("bigint").alias("part"),
                     F.col("offset").cast("bigint").alias("off"), F.lit("kafka").alias("form"))


def finish_dead_letter(record: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """A dead letter from `match_bounded`, its position completed on the driver: the file as
    the user named it (`names`: resolved path → given path), and for a record in a split that
    does not start its file, the lines (CSV: rows) before that split."""
    file = record.get("file")
    if file is None:
        return record
    path = _local_path(file)
    record["file"] = names.get(path, path)
    split = record.pop("_split", None)
    if split:
        before = _lines_before(path, int(split))
        if "line" in record:
            record["line"] += before
        else:  # CSV: the header is a line, not a row
            record["row"] += before - 1
    return record


def _local_path(uri: str) -> str:
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme in ("file", "") else uri


def _lines_before(path: str, split: int) -> int:
    """Lines that belong to the splits before the one starting at byte `split`: a split reads
    the lines that start after its first byte (Hadoop's line reader skips the line it starts
    in, which the previous split read), so every line starting at or before `split`."""
    n, left = 1, split
    with open(path, "rb") as fh:
        while left > 0:
            chunk = fh.read(min(left, 1 << 20))
            if not chunk:
                break
            n += chunk.count(b"\n")
            left -= len(chunk)
    return n


__all__ = ["JSONL", "RAW_COLUMNS", "TABLES", "Prepare", "RunEngine", "embedded_engine",
           "finish_dead_letter", "kafka_rows", "match_bounded", "partition_key", "read_files"]
