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
  offset, and alert ids are the same as with Spark's source;
- a broker restart ridden out (`_fetch`): the driver's offset fetches retried as Spark's source
  retries them (`fetchOffset.numRetries` attempts, `fetchOffset.retryIntervalMs` apart, each
  retrying the transient errors of a restart until its deadline as the Java client does within
  an admin call), latest offsets below the start re-fetched and then a data-loss error
  (KAFKA-7703); a read task waits out an unreachable broker up to `POLL_TIMEOUT_S`.

Streams from their topics: one stream from one topic (`live_pass.slim_input`'s case, the usual
live job) hands the pass only the values and `seq`; several streams (each from its topic) also
each record's stream and Kafka position, the columns Spark's plan gives it (`LiveJob._source`).
A table's records are read too, its tombstones as their delete records (`table_deletes`), but
`jobs.live` refuses a table with this source for now (its `events_read` would miss the table's
records). Each read task's consumer is kept per Python worker process (`_consumer`) and reused
by the next task there.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from cep.errors import CepError
from cep.spark.live_pass import KAFKA_POSITION, SEQ_PARTITION_SHIFT, ValidatePack
from cep.spark.pipeline import PACKED_SCHEMA_DDL, Plan, StreamPlan

log = logging.getLogger(__name__)
T = TypeVar("T")

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


def _drop_consumer(conf: dict[str, Any]) -> None:
    """Close and forget this process's consumer for `conf`: the next `_consumer` makes a new one."""
    c = _CONSUMERS.pop(json.dumps(conf, sort_keys=True), None)
    if c is not None:
        try:
            c.close()
        except Exception as e:  # a client that failed may fail to close: dropped all the same
            log.debug("Kafka: closing a consumer: %s", e)


# The errors of a broker that is down, restarting or moving a partition's leadership: librdkafka
# flags none of them `retriable()` in the synchronous calls (measured: `get_watermark_offsets`
# raised _UNKNOWN_PARTITION at once while the broker was down, NOT_LEADER_FOR_PARTITION as it
# came back; `list_topics` _TRANSPORT at its timeout). _UNKNOWN_PARTITION is transient on the
# driver because the call that raises it follows a metadata answer that listed the partition,
# and in a read task because its range was planned from such an answer (and it waits at most
# `POLL_TIMEOUT_S`).
TRANSIENT = frozenset((
    "_TRANSPORT", "_ALL_BROKERS_DOWN", "_TIMED_OUT", "_TIMED_OUT_QUEUE", "_UNKNOWN_PARTITION",
    "_WAIT_COORD", "_RESOLVE", "LEADER_NOT_AVAILABLE", "NOT_LEADER_FOR_PARTITION",
    "REQUEST_TIMED_OUT", "BROKER_NOT_AVAILABLE", "REPLICA_NOT_AVAILABLE", "NETWORK_EXCEPTION",
    "NOT_CONTROLLER", "KAFKA_STORAGE_ERROR", "FENCED_LEADER_EPOCH", "UNKNOWN_LEADER_EPOCH",
    "OFFSET_NOT_AVAILABLE"))


def _transient(err: Any) -> bool:
    """Whether a `KafkaError` is one a broker restart gives for a while (`TRANSIENT`)."""
    return bool(err.name() in TRANSIENT or err.retriable())


def _kafka_error(e: BaseException) -> Any:
    """The `KafkaError` of a confluent-kafka exception, or None."""
    from confluent_kafka import KafkaError, KafkaException

    if isinstance(e, KafkaException) and e.args and isinstance(e.args[0], KafkaError):
        return e.args[0]
    return None


# Spark's Kafka source's defaults (`KafkaOffsetReaderAdmin`: `fetchOffset.numRetries` "3", the
# attempts in all; `fetchOffset.retryIntervalMs` "1000", the pause after a failed attempt).
NUM_RETRIES = 3
RETRY_INTERVAL_MS = 1000


@dataclass(frozen=True)
class Retries:
    """How the driver's offset fetches are retried (the source's options, as Spark's source
    names them): `attempts` in all, `interval_s` apart."""

    attempts: int = NUM_RETRIES
    interval_s: float = RETRY_INTERVAL_MS / 1000

    @classmethod
    def of(cls, options: dict[str, str]) -> Retries:
        o = {k.lower(): v for k, v in options.items()}
        attempts = int(o.get("fetchoffset.numretries") or NUM_RETRIES)
        interval = int(o.get("fetchoffset.retryintervalms") or RETRY_INTERVAL_MS)
        if attempts < 1 or interval < 0:
            raise KafkaSourceError(f"fetchOffset.numRetries {attempts} must be >= 1 and "
                                   f"fetchOffset.retryIntervalMs {interval} >= 0")
        return cls(attempts, interval / 1000)

    def describe(self) -> str:
        return (f"fetchOffset.numRetries {self.attempts}, fetchOffset.retryIntervalMs "
                f"{self.interval_s * 1000:.0f}")


def _attempt(conf: dict[str, Any], label: str, body: Callable[[Any, float], T]) -> T:
    """One attempt of `body(consumer, deadline)`: what the Java client does within one admin
    call (Spark's source's attempt). A transient error (`_transient`) is retried after librdkafka's
    `retry.backoff.ms` doubling up to `retry.backoff.max.ms` (100 and 1,000 ms by default) until
    the attempt's deadline, the client's `socket.timeout.ms` (60 s by default, as the Java client's
    `default.api.timeout.ms`); any other error, or a transient one at the deadline, is raised.
    The first transient error of an attempt is logged (a warning: the broker is away)."""
    timeout = float(conf.get("socket.timeout.ms", 60_000)) / 1000
    backoff = float(conf.get("retry.backoff.ms", 100)) / 1000
    most = float(conf.get("retry.backoff.max.ms", 1000)) / 1000
    deadline = time.monotonic() + timeout
    warned = False
    while True:
        try:
            return body(_consumer(conf), deadline)
        except Exception as e:
            err = _kafka_error(e)
            if err is None or not _transient(err) or time.monotonic() + backoff >= deadline:
                raise
            if not warned:
                log.warning("%s: %s: %s; retrying for up to %.0f s", label, err.name(),
                            err.str(), deadline - time.monotonic())
                warned = True
            time.sleep(backoff)
            backoff = min(2 * backoff, most)


def _fetch(conf: dict[str, Any], topic: str, what: str, retries: Retries,
           body: Callable[[Any, float], T]) -> T:
    """`body(consumer, deadline)` (a driver-side call to Kafka) with Spark's source's retries:
    `retries.attempts` attempts (`_attempt`), `retries.interval_s` apart, each with a new consumer
    (Spark's source resets its admin client after a failed attempt). A non-transient error (the
    topic does not exist, authorisation) ends its attempt at once, so it fails after the attempts'
    pauses (~2 s by default), not after minutes; a broker down throughout fails after the attempts'
    deadlines (3 x 60 s by default, as Spark's source). The error names the topic, what failed and
    the last error."""
    began = time.monotonic()
    last: BaseException | None = None
    for attempt in range(1, retries.attempts + 1):
        try:
            return _attempt(conf, f"Kafka topic {topic!r}: {what}", body)
        except Exception as e:
            err = _kafka_error(e)
            if err is None and not isinstance(e, _TopicMissing):
                raise
            last = e
            log.warning("Kafka topic %r: %s failed (attempt %d of %d): %s", topic, what, attempt,
                        retries.attempts, e)
            _drop_consumer(conf)
        if attempt < retries.attempts:
            time.sleep(retries.interval_s)
    err = _kafka_error(last) if last is not None else None
    reason = f"{err.name()}: {err.str()}" if err is not None else str(last)
    raise KafkaSourceError(
        f"Kafka topic {topic!r}: {what} failed in {retries.attempts} attempts over "
        f"{time.monotonic() - began:.0f} s ({retries.describe()}; each attempt up to the client's "
        f"socket.timeout.ms): {reason}") from last


class _TopicMissing(Exception):
    """The broker answered that the topic does not exist (or is not readable)."""


def _watermarks(conf: dict[str, Any], topic: str,
                retries: Retries = Retries()) -> dict[int, tuple[int, int]]:
    """Each partition's (log start, end) offsets now. The end is the high watermark, or with
    `isolation.level` read_committed the last stable offset (what Spark's source reads too).
    Retried as Spark's source retries its offset fetches (`_fetch`)."""
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    def body(c: Any, deadline: float) -> dict[int, tuple[int, int]]:
        meta = c.list_topics(topic, timeout=_left(deadline))
        t = meta.topics.get(topic)
        if t is None:
            raise _TopicMissing("not in the broker's metadata")
        if t.error is not None:
            if _transient(t.error):
                raise KafkaException(t.error)
            if t.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise _TopicMissing(f"the topic does not exist ({t.error.str()})")
            raise _TopicMissing(f"{t.error.name()}: {t.error.str()}")
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=_left(deadline))
                for p in sorted(t.partitions)}

    return _fetch(conf, topic, "fetching the offsets", retries, body)


def _left(deadline: float) -> float:
    """The seconds to a deadline, at least 0.1 (a call's timeout)."""
    return max(0.1, deadline - time.monotonic())


Range = tuple[str, int, int, int]  # topic, partition, start, end


def _split(ranges: list[Range], tasks: int, task_rows: int) -> list[Range]:
    """(topic, partition, start, end) ranges cut as Spark's `KafkaOffsetRangeCalculator` cuts
    them: each into ceil(size / task_rows) equal parts (task_rows > 0), then, when that is fewer
    than `tasks` parts, each range into round(size / (total / tasks)) parts, at least one (the
    cut points rounded down where Spark's may round otherwise)."""
    ranges = [r for r in ranges if r[3] > r[2]]

    def cut(r: Range, parts: int) -> list[Range]:
        t, p, s, e = r
        size = e - s
        return [(t, p, s + size * i // parts, s + size * (i + 1) // parts)
                for i in range(parts)]

    if task_rows > 0:
        ranges = [x for r in ranges for x in cut(r, math.ceil((r[3] - r[2]) / task_rows))]
    if ranges and len(ranges) < tasks:
        total = sum(r[3] - r[2] for r in ranges)
        ranges = [x for r in ranges
                  for x in cut(r, max(1, math.floor((r[3] - r[2]) * tasks / total + 0.5)))]
    return [r for r in ranges if r[3] > r[2]]


class KafkaRange(InputPartition):
    """A read task: [start, end) of one topic partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


Deletes = Callable[[bytes | None, int], bytes | None]  # (key, timestamp ms) -> delete record


def read_range(conf: dict[str, Any], part: KafkaRange,
               deletes: Deletes | None = None) -> Iterator[tuple[Any, Any]]:
    """The records of `part` as (values, offsets) Arrow arrays, at most `BATCH_ROWS` each: exactly
    the records at offsets in [start, end), a gap (a transaction marker, a compacted record)
    skipped. A start below the partition's log start (its records deleted) is an error.

    A broker that is down or restarting is waited for, as Spark's source's task waits in its
    consumer's poll: librdkafka reconnects and fetches on from its position (no error from
    `consume`, measured), the transient errors of the checks made while no record comes
    (`_transient`: _UNKNOWN_PARTITION at once while the broker is down) are let pass, and only
    `POLL_TIMEOUT_S` without a record fails the task (which Spark then retries). Any other error
    fails the task too: it never ends early with part of its range.

    `deletes` (a table's topic): a record without a value (a tombstone) is read as
    `deletes(key, timestamp)`, its delete record (`table_deletes`)."""
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
                    if _transient(err):  # the broker away: waited for, up to POLL_TIMEOUT_S
                        continue
                    raise KafkaSourceError(f"Kafka {part.topic} partition {part.partition}: "
                                           f"{err.str()}")
                off = m.offset()
                if off >= part.end:
                    at = part.end
                    break
                if off < at:  # never seen; a record delivered twice must not be read twice
                    continue
                v = m.value()
                if v is None and deletes is not None:
                    v = deletes(m.key(), m.timestamp()[1])
                values.append(v)
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
                        f"{at} of [{part.start}, {part.end}) after {POLL_TIMEOUT_S:.0f} s "
                        "(is the broker up?)")
                tp = TopicPartition(part.topic, part.partition)
                try:
                    lo, hi = c.get_watermark_offsets(tp, timeout=30)
                except Exception as e:
                    err = _kafka_error(e)
                    if err is None or not _transient(err):
                        raise KafkaSourceError(f"Kafka {part.topic} partition {part.partition}: "
                                               f"fetching the offsets: {e}") from e
                    continue  # the broker away: the next poll waits for it
                if at < lo:
                    raise KafkaSourceError(
                        f"Kafka {part.topic} partition {part.partition}: offset {at} is below "
                        f"the log start {lo}: records were deleted before this job read them "
                        "(failOnDataLoss)")
                if hi <= at:  # a gap at the range's end that no EOF reported yet
                    pos = c.position([tp])[0].offset
                    if pos >= part.end:
                        at = part.end
    finally:
        c.unassign()


def table_deletes(table: StreamPlan) -> Deletes:
    """`pipeline.tombstones_as_deletes` for one table's records, in Python: a tombstone (no
    value) with a key is the delete record `{"<key>": <the Kafka key>, "<time>": <the Kafka
    timestamp, ms>, "_deleted": true}` as Spark's `to_json` writes it (compact, UTF-8); the key a
    string, or for an INT key a long (Spark's ANSI cast: surrounding whitespace trimmed, anything
    else not a long fails, here the read task); without a key it stays a null value."""
    as_long = dict(table.schema or ()).get(table.table_key or "") == "INT"
    key_field, time_field = str(table.table_key), table.time_field

    def delete(key: bytes | None, ts: int) -> bytes | None:
        if key is None:
            return None
        k: str | int = key.decode("utf-8", "replace")
        if as_long:
            text = str(k).strip()
            if not _LONG.fullmatch(text) or not -(1 << 63) <= int(text) < 1 << 63:
                raise KafkaSourceError(f"table {table.name}: the tombstone's key {text!r} is not "
                                       f"an INT ({key_field})")
            k = int(text)
        return json.dumps({key_field: k, time_field: ts, "_deleted": True},
                          separators=(",", ":"), ensure_ascii=False).encode()

    return delete


_LONG = re.compile(r"[+-]?[0-9]+")


class PackReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The driver's side (offsets, admission control, the split) and the read tasks (`read`).

    Options: `topics`, the streams' topics as JSON (stream -> topic), or `topic` (one topic; the
    pass is then slim); `bootstrap`, `kafka_conf` (JSON), `starting`, `max_offsets_per_trigger`,
    `read_tasks`, `read_task_rows`, `fetchOffset.numRetries`, `fetchOffset.retryIntervalMs`."""

    def __init__(self, options: dict[str, str], pass_: ValidatePack,
                 tables: Sequence[StreamPlan] = ()) -> None:
        self.options = options
        # A table's tombstones: its delete records (`table_deletes`), by the table's name.
        self.deletes = {t.name: table_deletes(t) for t in tables}
        named = json.loads(options["topics"]) if options.get("topics") else \
            {"": options["topic"]}
        # topic -> stream: of two streams on one topic the later one, as Spark's plan has it
        # (`LiveJob._source`: the last `when` is the outermost).
        self.stream_of = {t: st for st, t in named.items()}
        self.topics = sorted(self.stream_of)
        self.pass_ = pass_
        self.max_rows = int(options.get("max_offsets_per_trigger") or 0)
        self.tasks = int(options.get("read_tasks") or 1)
        self.task_rows = int(options.get("read_task_rows") or 0)
        self.until: Offsets | None = None  # Trigger.AvailableNow's end
        self.retries = Retries.of(options)

    def _conf(self) -> dict[str, Any]:
        return client_conf(self.options)

    def _now(self) -> dict[str, dict[int, tuple[int, int]]]:
        conf = self._conf()
        return {t: _watermarks(conf, t, self.retries) for t in self.topics}

    def _ends(self) -> Offsets:
        return {t: {str(p): m[1] for p, m in marks.items()} for t, marks in self._now().items()}

    def initialOffset(self) -> dict:  # noqa: N802 - PySpark's names
        starting = self.options.get("starting", "earliest")
        now = self._now()
        if starting in ("earliest", "latest"):
            i = 0 if starting == "earliest" else 1
            return {t: {str(p): m[i] for p, m in marks.items()} for t, marks in now.items()}
        named = json.loads(starting)
        out = {}
        for t, marks in now.items():
            given = named.get(t, {})
            # Spark's JSON: -2 is earliest, -1 latest; a partition not named starts at earliest.
            out[t] = {str(p): (m[0] if given.get(str(p), -2) == -2 else
                               m[1] if given[str(p)] == -1 else int(given[str(p)]))
                      for p, m in marks.items()}
        return out

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self.until = self._ends()

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadMaxRows(self.max_rows) if self.max_rows > 0 else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # noqa: N802
        ends = self._ends()
        # An end below the start (KAFKA-7703: a leader's offsets briefly wrong after a restart, or
        # records lost with the leader) is fetched again as Spark's source does, `retries` times
        # in all; still below, records this job read are gone: failOnDataLoss.
        for _ in range(1, self.retries.attempts):
            if not self._behind(start, ends):
                break
            log.warning("Kafka: latest offsets %s below the start %s; fetching again", ends, start)
            time.sleep(self.retries.interval_s)
            ends = self._ends()
        if behind := self._behind(start, ends):
            raise KafkaSourceError(
                "Kafka: the end offsets went back below this job's position ("
                + ", ".join(f"topic {t!r} partition {p}: {e} < {s}"
                            for (t, p), (s, e) in behind.items())
                + "): records it read are gone from Kafka (failOnDataLoss)")
        starts: dict[tuple[str, str], int] = {}
        tops: dict[tuple[str, str], int] = {}
        for t, parts in ends.items():
            begun = start.get(t, {})
            for p, e in parts.items():
                if self.until is not None:
                    e = min(e, self.until.get(t, {}).get(p, e))
                # A partition that appeared since the start offsets: read from its beginning.
                starts[t, p] = int(begun.get(p, 0))
                tops[t, p] = max(e, starts[t, p])
        if isinstance(limit, ReadMaxRows):
            # Spark's rate limit: the batch's records spread over the topics' partitions in
            # proportion to what each has, at least one record from a partition that has some.
            avail = {k: tops[k] - starts[k] for k in tops}
            total = sum(avail.values())
            if total > limit.max_rows:
                tops = {k: starts[k] + (min(a, max(1, int(limit.max_rows * a / total)))
                                        if a else 0) for k, a in avail.items()}
        out: Offsets = {t: {} for t in ends}
        for (t, p), e in tops.items():
            out[t][p] = e
        return out

    @staticmethod
    def _behind(start: dict, ends: Offsets) -> dict[tuple[str, str], tuple[int, int]]:
        """The partitions whose end is below their start: (start, end)."""
        return {(t, p): (int(start[t][p]), e) for t, parts in ends.items()
                for p, e in parts.items() if p in start.get(t, {}) and e < int(start[t][p])}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        ranges = [(t, int(p), int(start.get(t, {}).get(p, 0)), int(x))
                  for t in self.topics for p, x in end.get(t, {}).items()]
        return [KafkaRange(t, p, a, b) for t, p, a, b in _split(ranges, self.tasks,
                                                                self.task_rows)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.compute as pc

        part = partition
        assert isinstance(part, KafkaRange)
        base = part.partition << SEQ_PARTITION_SHIFT
        slim = self.pass_.slim is not None
        stream, topic = self.stream_of[part.topic], part.topic

        def batches() -> Iterator[Any]:
            for values, offsets in read_range(self._conf(), part, self.deletes.get(stream)):
                seqs = pc.add(offsets, base) if base else offsets
                if slim:
                    yield pa.RecordBatch.from_arrays([values, seqs], names=["value", "seq"])
                    continue
                # Spark's plan's columns (`LiveJob._source`): the stream of the record's topic
                # and its position, for `ValidatePack` without `slim`.
                n = len(values)
                yield pa.RecordBatch.from_arrays(
                    [pa.repeat(pa.scalar(stream, pa.string()), n), values, seqs,
                     pa.repeat(pa.scalar(topic, pa.string()), n),
                     pa.repeat(pa.scalar(part.partition, pa.int32()), n), offsets],
                    names=["stream", "value", "seq", *KAFKA_POSITION])

        yield from self.pass_(batches())

    def commit(self, end: dict) -> None:
        pass


class PackSource(DataSource):
    """`spark.readStream.format(SOURCE_NAME)`: the packs of the streams' topics (`pack_source`
    makes the subclass that carries the job's pass)."""

    pass_: ValidatePack
    tables: tuple[StreamPlan, ...] = ()

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return PACKED_SCHEMA_DDL

    def streamReader(self, schema: Any) -> DataSourceStreamReader:  # noqa: N802
        return PackReader(dict(self.options), self.pass_, self.tables)


def pack_source(pass_: ValidatePack, plan: Plan) -> type[PackSource]:
    """A `PackSource` for `pass_` (a `ValidatePack` of `plan`: slim for one stream from one
    topic, else with the Kafka position), to register with `spark.dataSource.register`."""
    if pass_.slim is None and pass_.position != KAFKA_POSITION:
        raise KafkaSourceError("the Python Kafka source gives the pass the Kafka position")
    return type("LivePackSource", (PackSource,),
                {"pass_": pass_, "tables": tuple(s for s in plan.streams if s.is_table)})


__all__ = ["SOURCE_NAME", "KafkaRange", "KafkaSourceError", "PackReader", "PackSource",
           "client_conf", "close_consumers", "pack_source", "read_range", "table_deletes"]
