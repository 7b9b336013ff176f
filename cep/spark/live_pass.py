"""The live job's map stage as one Python pass: raw Kafka rows → validated → dead letters →
fan-out by key field → shard → packed per shard (docs/spark-runtime.md, "The live job's map
stage").

Until session 11 this was two Python passes with a JVM step between them (`Validate` in a
`mapInArrow`, then `with_dead_letters` and `fan_out` in the JVM — where Spark computes the
shard as `pmod(xxhash64(key_field, key), shards)` — then `Pack` in a second `mapInArrow`):
every row crossed between the JVM and Python four times, through two Python workers. Here the
rows reach Python once, and only the packs (one row per shard and Arrow batch) go back.

The shard must stay exactly Spark's: a key's shard is part of the key of its checkpointed state
(the two plans put every key in the same shard; a checkpoint from before session 11 still
has to be reset or replayed: the key state format changed to v4, docs/native-core.md), so
`spark_shards` computes
Spark's own function (XXH64 with Spark's seed, then pmod), in the core (`_core.spark_shards`)
or, where the core cannot load (a cluster's zipped package), in Python (`xxh64`, slow, same
values); tests/test_live_pass.py checks both against Spark's `xxhash64`. The rows are the
ones `with_dead_letters` (now in tests/test_live_pass.py) + `fan_out` + `Pack` made (the test
compares them).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cep.events import MAX_BYTES
from cep.spark.pipeline import (
    BROADCAST,
    DEAD_STREAM,
    EOF_STREAM,
    PACKED_SCHEMA_DDL,
    Plan,
    Validate,
    native_on_this_worker,
    packed_batch,
)

_M = (1 << 64) - 1
_P1, _P2, _P3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
_P4, _P5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5
SPARK_SEED = 42  # the seed of Spark's `xxhash64(...)`


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M


def _round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _M, 31) * _P1) & _M


def xxh64(data: bytes, seed: int) -> int:
    """XXH64 of `data` (unsigned), the reference algorithm, in Python: the fallback of
    `spark_shards` and the second implementation its tests hold the core's to."""
    n, i = len(data), 0
    if n >= 32:
        v = [(seed + _P1 + _P2) & _M, (seed + _P2) & _M, seed & _M, (seed - _P1) & _M]
        while n - i >= 32:
            for j in range(4):
                v[j] = _round(v[j], int.from_bytes(data[i + 8 * j:i + 8 * j + 8], "little"))
            i += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M
        for lane in v:
            h = ((h ^ _round(0, lane)) * _P1 + _P4) & _M
    else:
        h = (seed + _P5) & _M
    h = (h + n) & _M
    while n - i >= 8:
        h = (_rotl(h ^ _round(0, int.from_bytes(data[i:i + 8], "little")), 27) * _P1 + _P4) & _M
        i += 8
    if n - i >= 4:
        w = int.from_bytes(data[i:i + 4], "little")
        h = (_rotl(h ^ ((w * _P1) & _M), 23) * _P2 + _P3) & _M
        i += 4
    while i < n:
        h = (_rotl(h ^ ((data[i] * _P5) & _M), 11) * _P1) & _M
        i += 1
    h ^= h >> 33
    h = (h * _P2) & _M
    h ^= h >> 29
    h = (h * _P3) & _M
    return h ^ (h >> 32)


def spark_shards(field: str, keys: Any, shards: int, native: bool | None = None) -> Any:
    """Spark's `pmod(xxhash64(field, key), shards)` for each key of an Arrow string array (no
    nulls), as an int32 numpy array. `native`: the core's function (default: when it loads).
    A null key is refused (ValueError): the validator already made an event whose key field is
    null or missing a dead letter ("missing key field ..."), so one here is a bug upstream
    (tests/test_live_pass.py, test_a_null_or_missing_key_is_a_dead_letter_before_the_shard)."""
    import numpy as np
    import pyarrow as pa

    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if keys.type != pa.string():
        keys = keys.cast(pa.string())
    n = len(keys)
    if not n:
        return np.zeros(0, np.int32)
    if keys.null_count:
        raise ValueError("spark_shards: a null key (Spark would hash the field alone)")
    if native is None:
        native = native_on_this_worker()
    if native:
        from cep import _core  # type: ignore[attr-defined]

        _, offs, data = keys.buffers()
        offsets = np.frombuffer(offs, np.int32)[keys.offset:keys.offset + n + 1]
        out = _core.spark_shards(field, offsets.tobytes(),
                                 b"" if data is None else data.to_pybytes(), shards)
        return np.frombuffer(out, np.int32)
    seed = xxh64(field.encode(), SPARK_SEED)
    signed = [(h - (1 << 64) if h >> 63 else h)
              for h in (xxh64(k.encode(), seed) for k in keys.to_pylist())]
    return np.array([h % shards for h in signed], np.int32)  # Python's % is pmod here


_FAN_NAMES = ["shard", "wm", "stream", "ts", "seq", "data", "key_field", "primary"]

# A Kafka record's position, as the live job reads it, and how its `seq` encodes it:
# partition × 2^40 + offset (`kafka_seq`, the one encoder; `kafka_position`, the one decoder).
KAFKA_POSITION = ("topic", "partition", "offset")
SEQ_PARTITION_SHIFT = 40
MAX_KAFKA_OFFSET = (1 << SEQ_PARTITION_SHIFT) - 1


def kafka_seq(partition: Column, offset: Column) -> Column:
    """A Kafka record's `seq` (alert ids, the order within a batch): partition × 2^40 + offset,
    as every Kafka read encodes it (the live job, bounded replays, the bench). Exact for offsets
    up to 2^40 - 1 (`MAX_KAFKA_OFFSET`, about 1.1 × 10^12 records in one partition: ~227 days
    at 56k records/s): past that a partition's seqs run into the next partition's numbers
    (as they always have) and `kafka_position` reads a slim dead letter's position as the next
    partition's. Not a failure: a query that raised here would fail again on every restart at
    the same record, stopping the job for good over a valid event."""
    return partition.cast("long") * F.lit(1 << SEQ_PARTITION_SHIFT) + offset


def kafka_position(seq: int) -> tuple[int, int]:
    """(partition, offset) of a `kafka_seq`."""
    return seq >> SEQ_PARTITION_SHIFT, seq & MAX_KAFKA_OFFSET


class ValidatePack:
    """The mapInArrow function of `live_packed`: raw rows → `(shard, wm, pack)` rows.

    `slim`: (stream, topic) of a one-stream Kafka job whose input batches hold only `value` and
    `seq` (`live_packed`): the stream is the same on every row and the position (topic,
    partition, offset) of a dead letter follows from its `seq`."""

    def __init__(self, plan: Plan, position: tuple[str, ...], max_bytes: int,
                 slim: tuple[str, str] | None = None) -> None:
        import pyarrow as pa

        self.slim = slim
        if slim is not None and position not in ((), KAFKA_POSITION):
            raise ValueError(f"ValidatePack: a slim input has the Kafka position or none, "
                             f"not {position}")
        self.validate = Validate(plan, () if slim else position, max_bytes)
        self.position = position
        self.shards = plan.shards
        self.key_fields = {s.name: s.key_fields for s in plan.streams}
        self.key_fields.setdefault(EOF_STREAM, ("",))
        self.tables = {s.name for s in plan.streams if s.is_table}
        # Dead letters' shard: Spark's shard of the empty key (a constant of the job).
        self.dead_shard = int(spark_shards("", pa.array([""]), self.shards)[0])

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for batch in batches:
            if self.slim is not None:  # the stream column the JVM did not send
                batch = pa.RecordBatch.from_arrays(
                    [pa.repeat(pa.scalar(self.slim[0]), batch.num_rows),
                     batch.column("value"), batch.column("seq")],
                    names=["stream", "value", "seq"])
            rows = self.fan_out(self.validate.validate_batch(batch))
            out = packed_batch(rows) if rows is not None else None
            if out is not None:
                yield out

    def fan_out(self, checked: Any) -> Any:
        """Validated rows → fan-out rows (`_FAN_NAMES`) as an Arrow table, or None: a bad
        row as one dead-letter row (`with_dead_letters`), a good one once per key field of its
        stream (`fan_out`), a BROADCAST table record once per shard."""
        import pyarrow as pa
        import pyarrow.compute as pc

        parts: list[Any] = []
        bad = checked.column("reason").is_valid()
        if pc.any(bad).as_py():
            parts.append(self._dead(checked.filter(bad)))
            checked = checked.filter(pc.invert(bad))
        if checked.num_rows:
            stream = checked.column("stream")
            for name, kfs in self.key_fields.items():
                of_name = pc.equal(stream, name)
                if pc.all(of_name).as_py():
                    sub = checked  # the usual batch: one stream
                else:
                    sub = checked.filter(of_name.fill_null(False))
                    if not sub.num_rows:
                        continue
                for pos, kf in enumerate(kfs):
                    parts.append(self._rows(sub, name, pos, kf))
                if sub is checked:
                    break
        if not parts:
            return None
        return pa.Table.from_batches(parts)

    def _rows(self, sub: Any, name: str, pos: int, kf: str) -> Any:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        keys = sub.column("keys")
        key = pc.list_flatten(keys) if len(self.key_fields[name]) == 1 and not keys.null_count \
            else pc.list_element(keys, pos)
        if kf == BROADCAST:
            n = sub.num_rows
            sub = sub.take(pa.array(np.repeat(np.arange(n), self.shards)))
            shard = np.tile(np.arange(self.shards, dtype=np.int32), n)
        else:
            shard = spark_shards(kf, key, self.shards)
        n = sub.num_rows
        if name in self.tables:
            wm: Any = pa.array(np.zeros(n, np.int64))  # a table record never moves it
        else:
            wm = sub.column("ts")
        primary = pos == 0 and name not in self.tables and name != EOF_STREAM
        return pa.RecordBatch.from_arrays(
            [pa.array(shard, pa.int32()), wm, sub.column("stream"), sub.column("ts"),
             sub.column("seq"), sub.column("data"), pa.repeat(pa.scalar(kf, pa.string()), n),
             pa.repeat(pa.scalar(primary), n)], names=_FAN_NAMES)

    def _dead(self, bad: Any) -> Any:
        """Bad rows as `DEAD_STREAM` events: `data` is the dead letter's fields as JSON
        (reason, the raw bytes in base64, stream, position), as `with_dead_letters` writes
        them (a null field left out, as Spark's `to_json`); ts 0, shard of ("", "")."""
        import numpy as np
        import pyarrow as pa

        n = bad.num_rows
        cols = {c: bad.column(c).to_pylist()
                for c in ("reason", "raw", "stream", *(() if self.slim else self.position))}
        if self.slim is not None and self.position:  # the Kafka position, from seq
            seqs = bad.column("seq").to_pylist()
            cols["topic"] = [self.slim[1]] * n
            cols["partition"], cols["offset"] = map(list, zip(*map(kafka_position, seqs),
                                                              strict=True)) if n else ([], [])
        data = []
        for i in range(n):
            raw = cols["raw"][i]
            info = {"reason": cols["reason"][i],
                    "raw_b64": None if raw is None else base64.b64encode(raw).decode(),
                    "stream": cols["stream"][i],
                    **{c: cols[c][i] for c in self.position}}
            data.append(json.dumps({k: v for k, v in info.items() if v is not None},
                                   separators=(",", ":")))
        shard = self.dead_shard
        zeros = pa.array(np.zeros(n, np.int64))
        return pa.RecordBatch.from_arrays(
            [pa.array(np.full(n, shard, np.int32)), zeros,
             pa.repeat(pa.scalar(DEAD_STREAM), n), zeros, bad.column("seq"),
             pa.array(data, pa.string()), pa.repeat(pa.scalar(""), n),
             pa.repeat(pa.scalar(False), n)], names=_FAN_NAMES)


def live_packed(raw: DataFrame, plan: Plan, position: tuple[str, ...] = (),
                max_bytes: int = MAX_BYTES, topics: Mapping[str, str] | None = None,
                ) -> DataFrame:
    """Raw rows (`stream`, `value`, `seq` and the `position` columns) → the stateful operator's
    input (`pipeline.packed`'s rows: `shard`, `pack`, the watermark's `event_time`), dead
    letters included, in one Python pass (`ValidatePack`).

    `topics` (stream → Kafka topic): a job reading one stream from one topic, whose `seq` is
    the Kafka position (`SEQ_PARTITION_SHIFT`) and `position` is `KAFKA_POSITION` or empty,
    sends only `value` and `seq` to Python: the stream and topic are the same on every row, a
    dead letter's partition and offset follow from its seq (docs/spark-runtime.md, "The live
    job's map stage")."""
    slim = slim_input(plan, position, topics)
    if slim is not None:
        rows = raw.select(F.col("value").cast("binary").alias("value"),
                          F.col("seq").cast("bigint").alias("seq"))
    else:
        rows = raw.select("stream", F.col("value").cast("binary").alias("value"),
                          F.col("seq").cast("bigint").alias("seq"), *position)
    return with_event_time(rows.mapInArrow(ValidatePack(plan, position, max_bytes, slim),
                                           PACKED_SCHEMA_DDL))


def with_event_time(packs: DataFrame) -> DataFrame:
    """`ValidatePack`'s rows (`shard`, `wm`, `pack`) as the operator's input: `wm` as the
    watermark's `event_time`."""
    return packs.withColumn("event_time", F.timestamp_millis(F.col("wm"))).drop("wm")


def slim_input(plan: Plan, position: tuple[str, ...],
               topics: Mapping[str, str] | None) -> tuple[str, str] | None:
    """(stream, topic) when `live_packed` can leave every column but `value` and `seq` in the
    JVM: one stream, no table, its topic known, the position Kafka's or none; else None.
    A dead letter's partition and offset are then read back from its seq (`kafka_position`),
    exact for offsets up to 2^40 - 1 (past that, `kafka_seq`'s documented limit, a slim dead
    letter's position reads as the next partition's)."""
    if topics is None or len(plan.streams) != 1 or position not in ((), KAFKA_POSITION):
        return None
    s = plan.streams[0]
    if s.is_table or s.name not in topics:
        return None
    return s.name, topics[s.name]


__all__ = ["KAFKA_POSITION", "MAX_KAFKA_OFFSET", "ValidatePack", "kafka_position", "kafka_seq",
           "live_packed", "slim_input", "spark_shards", "with_event_time", "xxh64"]
