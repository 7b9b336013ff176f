"""The saved-search changelog: a compacted Kafka topic, keyed by search id.

Message: key = search id (UTF-8); value = the search as JSON (`SavedSearch.to_json`), or null
for a delete (a tombstone, so compaction forgets deleted searches). One partition keeps a total
order of changes. The running percolator derives its index from this topic (the Luwak-on-Samza
design): read it from the beginning at start, then apply what arrived at each batch boundary.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from cep.errors import CepError
from percolator.model import Change

DEFAULT_TOPIC = "cep.percolator.searches"
log = logging.getLogger(__name__)


class ChangelogError(CepError):
    pass


class Changelog(Protocol):
    def publish(self, change: Change) -> None: ...


class ChangeSource(Protocol):
    def poll(self, timeout: float = 0.0) -> list[Change]: ...


class InMemoryChangelog:
    """A list of changes; `reader()` gives independent cursors over it."""

    def __init__(self) -> None:
        self.changes: list[Change] = []

    def publish(self, change: Change) -> None:
        self.changes.append(change)

    def reader(self) -> InMemoryReader:
        return InMemoryReader(self)


class InMemoryReader:
    def __init__(self, log: InMemoryChangelog) -> None:
        self.log = log
        self.pos = 0

    def poll(self, timeout: float = 0.0) -> list[Change]:
        out = self.log.changes[self.pos:]
        self.pos = len(self.log.changes)
        return out


def _config(bootstrap: str, options: Mapping[str, str] | None) -> dict[str, Any]:
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap}
    conf.update(options or {})
    return conf


def ensure_topic(bootstrap: str, topic: str = DEFAULT_TOPIC,
                 options: Mapping[str, str] | None = None, replication: int = 1) -> None:
    """Create the compacted changelog topic if it does not exist."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(_config(bootstrap, options))
    meta = admin.list_topics(timeout=10)
    if topic in meta.topics:
        return
    new = NewTopic(topic, num_partitions=1, replication_factor=replication,
                   config={"cleanup.policy": "compact", "min.compaction.lag.ms": "0"})
    for fut in admin.create_topics([new]).values():
        try:
            fut.result(30)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise ChangelogError(f"cannot create changelog topic {topic}: {exc}") from None


class KafkaChangelog:
    """Publishes changes synchronously (each waits for the broker's ack: registry writes are
    rare and must not be lost)."""

    def __init__(self, bootstrap: str, topic: str = DEFAULT_TOPIC,
                 options: Mapping[str, str] | None = None, create: bool = True) -> None:
        from confluent_kafka import Producer

        self.topic = topic
        if create:
            ensure_topic(bootstrap, topic, options)
        conf = _config(bootstrap, options)
        conf.update({"enable.idempotence": True, "acks": "all", "linger.ms": 0})
        self._producer = Producer(conf)

    def publish(self, change: Change) -> None:
        errors: list[str] = []

        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        self._producer.produce(self.topic, key=change.key(), value=change.value(),
                               on_delivery=on_delivery)
        if self._producer.flush(30) or errors:
            raise ChangelogError(f"changelog publish failed: {errors or 'timeout'}")

    def close(self) -> None:
        self._producer.flush(30)


class KafkaChangeReader:
    """Reads the changelog from the beginning. `poll()` returns what is new since the last call;
    `read_to(ends)` returns what is new below fixed end offsets (a micro-batch's pinned index
    version, see docs/percolator.md "The streaming job"). Records that do not decode are skipped
    and counted in `undecodable` (the registry validates every write, so this is corruption)."""

    def __init__(self, bootstrap: str, topic: str = DEFAULT_TOPIC,
                 options: Mapping[str, str] | None = None) -> None:
        from confluent_kafka import Consumer, TopicPartition

        conf = _config(bootstrap, options)
        conf.update({"group.id": f"cep-percolator-{uuid.uuid4().hex}",
                     "enable.auto.commit": False, "auto.offset.reset": "earliest",
                     "enable.partition.eof": True})
        self._consumer = Consumer(conf)
        meta = self._consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            raise ChangelogError(f"changelog topic {topic} not found")
        self._parts = [TopicPartition(topic, p, 0) for p in sorted(meta.partitions)]
        self._consumer.assign(self._parts)
        self.topic = topic
        self.undecodable = 0
        # Consumed from Kafka but not yet returned: (partition, offset, change).
        self._ahead: list[tuple[int, int, Change]] = []
        self._read: dict[int, int] = {p.partition: 0 for p in self._parts}      # fetch position
        self._returned: dict[int, int] = {p.partition: 0 for p in self._parts}  # handed out

    @property
    def position(self) -> dict[int, int]:
        """Per partition, the offset after the last change returned."""
        return dict(self._returned)

    def _consume(self, wait: float, limit: int = 500) -> tuple[bool, set[int]]:
        """Fetch up to `limit` records, waiting at most `wait` s for that many; returns
        (anything arrived, partitions at their end)."""
        from confluent_kafka import KafkaError

        msgs = self._consumer.consume(max(1, min(limit, 500)), timeout=wait)
        eof: set[int] = set()
        for msg in msgs:
            part = int(msg.partition() or 0)
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    eof.add(part)
                    self._read[part] = max(self._read[part], int(msg.offset() or 0))
                    continue
                raise ChangelogError(f"changelog read failed: {err}")
            eof.discard(part)
            offset = int(msg.offset() or 0)
            self._read[part] = max(self._read[part], offset + 1)
            try:
                change = Change.decode(msg.key() or b"", msg.value())
            except (ValueError, CepError) as exc:  # JSONDecodeError is a ValueError
                self.undecodable += 1
                log.error("changelog %s[%d]@%d does not decode, skipped: %s",
                          self.topic, part, offset, exc)
                continue
            self._ahead.append((part, offset, change))
        return bool(msgs), eof

    def _take(self, ends: Mapping[int, int] | None) -> list[Change]:
        out: list[Change] = []
        keep: list[tuple[int, int, Change]] = []
        for part, offset, change in self._ahead:
            if ends is None or offset < ends.get(part, 0):
                out.append(change)
                self._returned[part] = offset + 1
            else:
                keep.append((part, offset, change))
        self._ahead = keep
        if ends is None:
            self._returned.update(self._read)
        else:
            for part, end in ends.items():
                if part in self._returned and self._read[part] >= end:
                    self._returned[part] = max(self._returned[part], end)
        return out

    def poll(self, timeout: float = 1.0) -> list[Change]:
        """Every change up to the current end of the topic (waits at most ~`timeout` s for the
        first message when nothing is pending)."""
        eof: set[int] = set()
        wait = timeout
        while len(eof) < len(self._parts):
            arrived, at_end = self._consume(wait)
            if not arrived:
                break
            eof |= at_end
            wait = min(wait, 0.2)
        return self._take(None)

    def read_to(self, ends: Mapping[int, int], timeout: float = 60.0) -> list[Change]:
        """Every change not yet returned at offsets below `ends` (partition -> end offset,
        exclusive), exactly: later records stay buffered for the next call. Waits up to
        `timeout` s for them to arrive; raises ChangelogError if they do not, or if a change
        beyond `ends` was already returned (the caller must start from a fresh reader)."""
        ahead = [p for p, end in ends.items() if self._returned.get(p, 0) > end]
        if ahead:
            raise ChangelogError(f"reader is past the requested end on partitions {ahead}")
        deadline = time.monotonic() + timeout
        while any(self._read.get(p, 0) < end for p, end in ends.items()):
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChangelogError(
                    f"changelog {self.topic}: offsets {dict(ends)} not reached in {timeout} s "
                    f"(at {self._read})")
            # Asking for no more than the offsets still missing returns as soon as they are
            # here (fewer exist only after compaction; then the wait bounds it).
            missing = sum(max(0, end - self._read.get(p, 0)) for p, end in ends.items())
            self._consume(min(left, 0.5), missing)
        return self._take(ends)

    def close(self) -> None:
        self._consumer.close()


class ChangelogEnds:
    """The changelog's current end offsets, without reading it: what a micro-batch pins as its
    index version (`KafkaChangeReader.read_to`)."""

    def __init__(self, bootstrap: str, topic: str = DEFAULT_TOPIC,
                 options: Mapping[str, str] | None = None) -> None:
        from confluent_kafka import Consumer

        conf = _config(bootstrap, options)
        conf.update({"group.id": f"cep-percolator-ends-{uuid.uuid4().hex}",
                     "enable.auto.commit": False})
        self._consumer = Consumer(conf)
        self.topic = topic

    def __call__(self, timeout: float = 10.0) -> dict[int, int]:
        from confluent_kafka import TopicPartition

        meta = self._consumer.list_topics(self.topic, timeout=timeout).topics.get(self.topic)
        if meta is None or meta.error is not None:
            raise ChangelogError(f"changelog topic {self.topic} not found")
        ends: dict[int, int] = {}
        for part in sorted(meta.partitions):
            _lo, hi = self._consumer.get_watermark_offsets(
                TopicPartition(self.topic, part), timeout=timeout, cached=False)
            ends[part] = int(hi)
        return ends

    def close(self) -> None:
        self._consumer.close()


def replay(changes: Iterable[Change]) -> dict[str, Change]:
    """The last change per search id (what compaction keeps)."""
    last: dict[str, Change] = {}
    for c in changes:
        last[c.search_id] = c
    return last
