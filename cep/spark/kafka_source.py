"""The live job's Kafka input as a Python streaming source that yields the packs (`live_source`
"python"; docs/spark-runtime.md, "A Python Kafka source that yields the packs (session 27,
src27)").

With Spark's Kafka source the map task reads each record into the JVM (a `ConsumerRecord`, a
row), writes the rows to Arrow for the one Python pass (`live_pass.ValidatePack`) and reads the
packs back. Here a read task consumes its offset range with confluent-kafka in the Python worker
and hands the values straight to the same pass: only the packs (one row per shard and batch)
enter the JVM.

What it keeps of Spark's Kafka source (what its users expect):

- offsets per topic partition in the offset log, as Spark's source writes them
  (`{"topic": {"0": 42}}`: the next offset to read);
- a batch reads exactly [start, end) of each partition: a gap (transaction markers, compacted
  records) is skipped, nothing at or past `end` is used;
- `startingOffsets` earliest, latest or Spark's JSON; a partition that appears later starts at
  its earliest offset; `failOnDataLoss` always: a start below a partition's log start (records
  deleted before they were read) fails the batch with a message naming it;
- the client options of the settings (`kafka_options`) on every consumer; the isolation level
  is the Kafka client's default (read_uncommitted), as with Spark's source, unless set there;
- `maxOffsetsPerTrigger` as admission control (a batch's records spread over the partitions in
  proportion to what each has), `Trigger.AvailableNow` (`--once`) up to the offsets it found
  at the start;
- the read split (`live_read_tasks`, `live_read_task_rows`) as Spark's Kafka source computes it
  (`KafkaOffsetRangeCalculator`), a task per part;
- the records' `seq` (`live_pass.kafka_seq`), so dead letters carry their topic, partition and
  offset, and alert ids are the same as with Spark's source.

One stream from one topic, no table (`live_pass.slim_input`'s case, the usual live job):
`jobs.live` refuses `live_source` "python" otherwise. Each read task's consumer is kept per
Python worker process (`_consumer`) and reused by the next task there.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from cep.errors import CepError
from cep.spark.live_pass import SEQ_PARTITION_SHIFT, ValidatePack
from cep.spark.pipeline import PACKED_SCHEMA_DDL

SOURCE_NAME = "cep_kafka_packs"
# A read task's records reach the pass in Arrow batches of at most this many (one pack per
# shard each): `jobs.live.ARROW_BATCH_ROWS`, the same bound on the pass's memory.
BATCH_ROWS = 50_000

# A read task that gets no record for this long fails (Spark's source: `pollTimeoutMs`, 120 s).
POLL_TIMEOUT_S = 120.0

Offsets = dict[str, dict[str, int]]  # topic -> partition (as a string) -> offset


class KafkaSourceError(CepError):
    pass


# librdkafka's prefetch (`queued.min.messages`, 100,000 by default): records fetched past a
# task's end are thrown away at its end. At 20,000 (unless `kafka_options` sets it) a task of
# 30,000 records cost 1.7-2.0 µs per record of the process's CPU against 2.3-3.5 (load ~20).
# And librdkafka (>= 2.x) postpones a partition's next fetch by `fetch.queue.backoff.ms`
# (1,000 by default) once its queue is over those thresholds: a task reassigned to a new
# range after the previous one's prefetch filled the queue waited that second in 1 of 3-4
# tasks (10,000-record ranges read in turn by two cached consumers: 1,020-1,037 ms where the
# others took 20-80; at 10 ms none did). The queue is emptied at every task's end
# (`unassign`), so a short backoff costs nothing.
PREFETCH = {"queued.min.messages": "20000", "fetch.queue.backoff.ms": "10"}


def client_conf(options: dict[str, str]) -> dict[str, Any]:
    """The consumers' settings: the job's bootstrap and client options (`kafka.*` of Spark's
    source, without the prefix; `PREFETCH` unless they set it), no group management and no
    offset commits (the offsets are Spark's), and an out-of-range offset an error rather than a
    silent jump."""
    return {**PREFETCH, **json.loads(options["kafka_conf"]),
            "bootstrap.servers": options["bootstrap"],
            "group.id": options.get("group_id", "cep-live-source"),
            "enable.auto.commit": False, "enable.auto.offset.store": False,
            "auto.offset.reset": "error", "enable.partition.eof": True}


# A consumer per Python worker process and client configuration: a read task's worker is reused
# by the next task (Spark's `spark.python.worker.reuse`), and so is its connection.
_CONSUMERS: dict[str, Any] = {}


def _consumer(conf: dict[str, Any]) -> Any:
    from confluent_kafka import Consumer

    key = json.dumps(conf, sort_keys=True)
    c = _CONSUMERS.get(key)
    if c is None:
        c = _CONSUMERS[key] = Consumer(conf)
    return c


def close_consumers() -> None:
    """Close this process's cached consumers (`_consumer`): a process that outlives its broker
    (a test session) would otherwise keep them reconnecting."""
    while _CONSUMERS:
        _CONSUMERS.popitem()[1].close()


def _watermarks(conf: dict[str, Any], topic: str) -> dict[int, tuple[int, int]]:
    """Each partition's (log start, end) offsets now. The end is the high watermark, or with
    `isolation.level` read_committed the last stable offset (what Spark's source reads too)."""
    from confluent_kafka import TopicPartition

    c = _consumer(conf)
    meta = c.list_topics(topic, timeout=30)
    t = meta.topics.get(topic)
    if t is None or t.error is not None:
        raise KafkaSourceError(f"Kafka topic {topic!r}: {t.error if t else 'not found'}")
    return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            for p in sorted(t.partitions)}


def _split(ranges: list[tuple[int, int, int]], tasks: int, task_rows: int,
           ) -> list[tuple[int, int, int]]:
    """(partition, start, end) ranges cut as Spark's `KafkaOffsetRangeCalculator` cuts them:
    each into ceil(size / task_rows) equal parts (task_rows > 0), then, when that is fewer than
    `tasks` parts, each range into round(size / (total / tasks)) parts, at least one (the cut
    points rounded down where Spark's may round otherwise)."""
    ranges = [r for r in ranges if r[2] > r[1]]

    def cut(r: tuple[int, int, int], parts: int) -> list[tuple[int, int, int]]:
        p, s, e = r
        size = e - s
        return [(p, s + size * i // parts, s + size * (i + 1) // parts) for i in range(parts)]

    if task_rows > 0:
        ranges = [x for r in ranges for x in cut(r, math.ceil((r[2] - r[1]) / task_rows))]
    if ranges and len(ranges) < tasks:
        total = sum(e - s for _, s, e in ranges)
        ranges = [x for r in ranges
                  for x in cut(r, max(1, math.floor((r[2] - r[1]) * tasks / total + 0.5)))]
    return [r for r in ranges if r[2] > r[1]]


class KafkaRange(InputPartition):
    """A read task: [start, end) of one topic partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


def read_range(conf: dict[str, Any], part: KafkaRange) -> Iterator[tuple[Any, Any]]:
    """The records of `part` as (values, offsets) Arrow arrays, at most `BATCH_ROWS` each: exactly
    the records at offsets in [start, end), a gap (a transaction marker, a compacted record)
    skipped. A start below the partition's log start (its records deleted) is an error."""
    import pyarrow as pa
    from confluent_kafka import KafkaError, TopicPartition

    c = _consumer(conf)
    c.assign([TopicPartition(part.topic, part.partition, part.start)])
    at = part.start  # every offset below is done
    values: list[Any] = []
    offsets: list[int] = []
    since = time.monotonic()  # the last record (or the start)
    try:
        while at < part.end:
            msgs = c.consume(num_messages=min(part.end - at, BATCH_ROWS - len(values)), timeout=1.0)
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if m.offset() >= part.end:  # the range ends in a gap (e.g. a marker)
                            at = part.end
                        continue
                    if err.code() == KafkaError._AUTO_OFFSET_RESET or \
                            err.code() == KafkaError.OFFSET_OUT_OF_RANGE:
                        raise KafkaSourceError(
                            f"Kafka {part.topic} partition {part.partition}: offset {at} is no "
                            f"longer in the log ({err.str()}): records were deleted before this "
                            "job read them (failOnDataLoss)")
                    raise KafkaSourceError(f"Kafka {part.topic} partition {part.partition}: "
                                           f"{err.str()}")
                off = m.offset()
                if off >= part.end:
                    at = part.end
                    break
                values.append(m.value())
                offsets.append(off)
                at = off + 1
            if len(values) >= BATCH_ROWS or (values and at >= part.end):
                yield pa.array(values, pa.binary()), pa.array(offsets, pa.int64())
                values, offsets = [], []
            if msgs:
                since = time.monotonic()
            elif at < part.end:
                if time.monotonic() - since >= POLL_TIMEOUT_S:
                    raise KafkaSourceError(
                        f"Kafka {part.topic} partition {part.partition}: no record at offset "
                        f"{at} of [{part.start}, {part.end}) after {POLL_TIMEOUT_S:.0f} s")
                lo, hi = c.get_watermark_offsets(
                    TopicPartition(part.topic, part.partition), timeout=30)
                if at < lo:
                    raise KafkaSourceError(
                        f"Kafka {part.topic} partition {part.partition}: offset {at} is below "
                        f"the log start {lo}: records were deleted before this job read them "
                        "(failOnDataLoss)")
                if hi <= at:  # a gap at the range's end that no EOF reported yet
                    pos = c.position([TopicPartition(part.topic, part.partition)])[0].offset
                    if pos >= part.end:
                        at = part.end
    finally:
        c.unassign()


class PackReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The driver's side (offsets, admission control, the split) and the read tasks (`read`)."""

    def __init__(self, options: dict[str, str], pass_: ValidatePack) -> None:
        self.options = options
        self.topic = options["topic"]
        self.pass_ = pass_
        self.max_rows = int(options.get("max_offsets_per_trigger") or 0)
        self.tasks = int(options.get("read_tasks") or 1)
        self.task_rows = int(options.get("read_task_rows") or 0)
        self.until: Offsets | None = None  # Trigger.AvailableNow's end

    def _conf(self) -> dict[str, Any]:
        return client_conf(self.options)

    def _now(self) -> dict[int, tuple[int, int]]:
        return _watermarks(self._conf(), self.topic)

    def initialOffset(self) -> dict:  # noqa: N802 - PySpark's names
        starting = self.options.get("starting", "earliest")
        marks = self._now()
        if starting in ("earliest", "latest"):
            i = 0 if starting == "earliest" else 1
            return {self.topic: {str(p): m[i] for p, m in marks.items()}}
        given = json.loads(starting).get(self.topic, {})
        # Spark's JSON: -2 is earliest, -1 latest; a partition not named starts at earliest.
        return {self.topic: {str(p): (m[0] if given.get(str(p), -2) == -2 else
                                      m[1] if given[str(p)] == -1 else int(given[str(p)]))
                             for p, m in marks.items()}}

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self.until = {self.topic: {str(p): m[1] for p, m in self._now().items()}}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadMaxRows(self.max_rows) if self.max_rows > 0 else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # noqa: N802
        ends = {str(p): m[1] for p, m in self._now().items()}
        if self.until is not None:
            ends = {p: min(e, self.until[self.topic].get(p, e)) for p, e in ends.items()}
        begun = start.get(self.topic, {})
        # A partition that appeared since the start offsets: read from its beginning.
        starts = {p: int(begun.get(p, 0)) for p in ends}
        ends = {p: max(e, starts[p]) for p, e in ends.items()}
        if isinstance(limit, ReadMaxRows):
            # Spark's rate limit: the batch's records spread over the partitions in proportion
            # to what each has, at least one record from a partition that has some.
            avail = {p: ends[p] - starts[p] for p in ends}
            total = sum(avail.values())
            if total > limit.max_rows:
                ends = {p: starts[p] + (min(a, max(1, int(limit.max_rows * a / total)))
                                        if a else 0) for p, a in avail.items()}
        return {self.topic: ends}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        s, e = start.get(self.topic, {}), end[self.topic]
        ranges = [(int(p), int(s.get(p, 0)), int(x)) for p, x in e.items()]
        return [KafkaRange(self.topic, p, a, b)
                for p, a, b in _split(ranges, self.tasks, self.task_rows)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.compute as pc

        part = partition
        assert isinstance(part, KafkaRange)
        base = part.partition << SEQ_PARTITION_SHIFT

        def batches() -> Iterator[Any]:
            for values, offsets in read_range(self._conf(), part):
                seqs = pc.add(offsets, base) if base else offsets
                yield pa.RecordBatch.from_arrays([values, seqs], names=["value", "seq"])

        yield from self.pass_(batches())

    def commit(self, end: dict) -> None:
        pass


class PackSource(DataSource):
    """`spark.readStream.format(SOURCE_NAME)`: the packs of one stream's topic (`pack_source`
    makes the subclass that carries the job's pass)."""

    pass_: ValidatePack

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return PACKED_SCHEMA_DDL

    def streamReader(self, schema: Any) -> DataSourceStreamReader:  # noqa: N802
        return PackReader(dict(self.options), self.pass_)


def pack_source(pass_: ValidatePack) -> type[PackSource]:
    """A `PackSource` for `pass_` (a slim `ValidatePack`: one stream, one topic), to register
    with `spark.dataSource.register`."""
    if pass_.slim is None:
        raise KafkaSourceError("the Python Kafka source reads one stream from one topic")
    return type("LivePackSource", (PackSource,), {"pass_": pass_})


__all__ = ["SOURCE_NAME", "KafkaRange", "KafkaSourceError", "PackReader", "PackSource",
           "client_conf", "close_consumers", "pack_source", "read_range"]
