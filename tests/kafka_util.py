"""Small Kafka helpers for tests (producing input, reading a topic to its end)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition


def produce_json(bootstrap: str, topic: str, events: Iterable[dict[str, Any]],
                 key_field: str | None = None) -> int:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    n = 0
    for ev in events:
        key = str(ev[key_field]).encode() if key_field else None
        producer.produce(topic, key=key, value=json.dumps(ev).encode())
        n += 1
        if n % 1000 == 0:
            producer.poll(0)
    remaining = producer.flush(30)
    assert remaining == 0, f"{remaining} messages not delivered to {topic}"
    return n


def read_topic(bootstrap: str, topic: str, *, committed_only: bool = True,
               timeout_s: float = 20.0) -> list[tuple[bytes | None, bytes, dict[str, bytes]]]:
    """Every message in `topic`, from the beginning to the current end of each partition."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"test-reader-{uuid.uuid4().hex}",
        "isolation.level": "read_committed" if committed_only else "read_uncommitted",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    })
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            return []
        out: list[tuple[bytes | None, bytes, dict[str, bytes]]] = []
        for pid in meta.partitions:
            tp = TopicPartition(topic, pid)
            lo, hi = consumer.get_watermark_offsets(tp, timeout=10)
            if hi <= lo:
                continue
            consumer.assign([TopicPartition(topic, pid, lo)])
            import time
            deadline = time.monotonic() + timeout_s
            pos = lo
            while pos < hi and time.monotonic() < deadline:
                for m in consumer.consume(1000, timeout=1):
                    if m.error() is not None:
                        continue
                    pos = m.offset() + 1
                    out.append((m.key(), m.value(), dict(m.headers() or [])))
                # Transaction markers occupy offsets but are not returned.
                if not consumer.consume(0, timeout=0) and consumer.position([tp])[0].offset >= hi:
                    break
        return out
    finally:
        consumer.close()
