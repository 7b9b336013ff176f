"""The saved-search changelog: a compacted Kafka topic, keyed by search id.

Message: key = search id (UTF-8); value = the search as JSON (`SavedSearch.to_json`), or null
for a delete (a tombstone, so compaction forgets deleted searches). One partition keeps a total
order of changes. The running percolator derives its index from this topic (the Luwak-on-Samza
design): read it from the beginning at start, then apply what arrived at each batch boundary.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from cep.errors import CepError
from percolator.model import Change

DEFAULT_TOPIC = "cep.percolator.searches"


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
    """Reads the changelog from the beginning; `poll()` returns what is new since last call."""

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

    def poll(self, timeout: float = 1.0) -> list[Change]:
        """Every change up to the current end of the topic (waits at most ~`timeout` s for the
        first message when nothing is pending)."""
        from confluent_kafka import KafkaError

        out: list[Change] = []
        eof: set[int] = set()
        wait = timeout
        while len(eof) < len(self._parts):
            msgs = self._consumer.consume(500, timeout=wait)
            if not msgs:
                break
            wait = min(wait, 0.2)
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        eof.add(int(msg.partition() or 0))
                        continue
                    raise ChangelogError(f"changelog read failed: {err}")
                eof.discard(int(msg.partition() or 0))
                out.append(Change.decode(msg.key() or b"", msg.value()))
        return out

    def close(self) -> None:
        self._consumer.close()


def replay(changes: Iterable[Change]) -> dict[str, Change]:
    """The last change per search id (what compaction keeps)."""
    last: dict[str, Change] = {}
    for c in changes:
        last[c.search_id] = c
    return last
