"""Kafka delivery: one transaction per micro-batch with a batch marker (docs/delivery.md)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cep.delivery.preflight import quiet_kafka_conf
from cep.delivery.record import OutRecord
from cep.errors import CepError

MARKER_TOPIC = "cep.delivery-markers"


class KafkaDeliveryError(CepError):
    pass


@dataclass
class KafkaStats:
    written: int = 0
    skipped_batch: bool = False


def ensure_topics(
    bootstrap: str, topics: Iterable[str], *, partitions: int = 1,
    config: Mapping[str, str] | None = None, client_conf: Mapping[str, str] | None = None,
) -> None:
    """Create missing topics (idempotent)."""
    # librdkafka's own log lines (e.g. "Purging 1 unserved events" when the client goes away)
    # go to the `cep.kafka.client` logger, not to the user's terminal.
    admin = AdminClient(quiet_kafka_conf({"bootstrap.servers": bootstrap, **(client_conf or {})}))
    existing = set(admin.list_topics(timeout=10).topics)
    wanted = [t for t in dict.fromkeys(topics) if t and t not in existing]
    if not wanted:
        return
    futures = admin.create_topics(
        [NewTopic(t, num_partitions=partitions, replication_factor=1, config=dict(config or {}))
         for t in wanted]
    )
    for name, fut in futures.items():
        try:
            fut.result(timeout=30)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise KafkaDeliveryError(f"cannot create topic {name}: {exc}") from exc


class TransactionalKafkaSink:
    """Writes each micro-batch's records in one Kafka transaction, once per batch id."""

    def __init__(
        self, bootstrap: str, query_name: str, *, client_conf: Mapping[str, str] | None = None,
        marker_topic: str = MARKER_TOPIC,
    ) -> None:
        self.bootstrap = bootstrap
        self.query_name = query_name
        self.marker_topic = marker_topic
        self.client_conf = dict(client_conf or {})
        ensure_topics(bootstrap, [marker_topic], config={"cleanup.policy": "compact"},
                      client_conf=self.client_conf)
        self._last_committed: int | None = self._read_last_marker()
        self.producer = Producer({
            "bootstrap.servers": bootstrap,
            "transactional.id": f"cep-{query_name}",
            "enable.idempotence": True,
            "linger.ms": 5,
            **self.client_conf,
        })
        # Fences any earlier producer with this transactional.id (a crashed run's zombie).
        self.producer.init_transactions(30)

    def _read_last_marker(self) -> int | None:
        consumer = Consumer({
            "bootstrap.servers": self.bootstrap,
            "group.id": f"cep-marker-reader-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **self.client_conf,
        })
        try:
            meta = consumer.list_topics(self.marker_topic, timeout=10).topics[self.marker_topic]
            last: int | None = None
            for pid in meta.partitions:
                lo, hi = consumer.get_watermark_offsets(TopicPartition(self.marker_topic, pid),
                                                        timeout=10)
                if hi <= lo:
                    continue
                consumer.assign([TopicPartition(self.marker_topic, pid, lo)])
                done = False
                while not done:
                    msgs = consumer.consume(500, timeout=2)
                    if not msgs:
                        break
                    for m in msgs:
                        value = m.value()
                        if (m.error() is None and value is not None
                                and m.key() == self.query_name.encode()):
                            bid = int(json.loads(value)["batch_id"])
                            last = bid if last is None else max(last, bid)
                        if (m.offset() or 0) >= hi - 1:
                            done = True
            return last
        finally:
            consumer.close()

    def deliver_batch(self, batch_id: int, records: Iterable[OutRecord]) -> KafkaStats:
        stats = KafkaStats()
        if self._last_committed is not None and batch_id <= self._last_committed:
            stats.skipped_batch = True
            return stats
        errors: list[str] = []

        def on_delivery(err: object, _msg: object) -> None:
            if err is not None:
                errors.append(str(err))

        try:
            self.producer.begin_transaction()
            for rec in records:
                if not rec.kafka_topic:
                    continue
                self.producer.produce(
                    rec.kafka_topic, key=rec.key.encode(), value=rec.payload_json().encode(),
                    headers=[("cep-id", rec.id.encode())], on_delivery=on_delivery,
                )
                stats.written += 1
                self.producer.poll(0)
            marker = json.dumps({"query": self.query_name, "batch_id": batch_id})
            self.producer.produce(self.marker_topic, key=self.query_name.encode(),
                                  value=marker.encode(), on_delivery=on_delivery)
            self.producer.flush(60)
            if errors:
                raise KafkaDeliveryError("; ".join(errors[:5]))
            self.producer.commit_transaction(60)
        except (KafkaException, KafkaDeliveryError) as exc:
            try:
                self.producer.abort_transaction(30)
            except KafkaException:
                pass
            raise KafkaDeliveryError(f"batch {batch_id}: Kafka transaction failed: {exc}") from exc
        self._last_committed = batch_id
        return stats

    def send(self, batch_id: int, records: Sequence[OutRecord]) -> dict[str, Any]:
        """`cep.delivery.sink.Sink`: one transaction for the batch."""
        stats = self.deliver_batch(batch_id, records)
        return {"kafka_written": stats.written, "kafka_skipped_replayed_batch": stats.skipped_batch}

    def close(self) -> None:
        self.producer.flush(10)
        del self.producer  # confluent-kafka has no close(); dropping the handle stops its threads
