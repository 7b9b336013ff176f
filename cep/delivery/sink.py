"""The one interface every destination of output records implements.

A job's delivery step (`cep.spark.delivery.BatchDelivery`) hands each micro-batch's records to
its sinks in order — Kafka first (one transaction with a batch marker), then Redis (idempotent
by record id) — and logs what each reports. Implementations:

- `cep.delivery.kafka_sink.TransactionalKafkaSink`  (Kafka, exactly once per batch id)
- `cep.delivery.redis_sink.RedisSink`               (Redis streams, pub/sub, latest-per-key)
- `MemorySink` (below)                              (in-process, for tests and embedding)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from cep.delivery.record import OutRecord


@runtime_checkable
class Sink(Protocol):
    def send(self, batch_id: int, records: Sequence[OutRecord]) -> dict[str, Any]:
        """Deliver one batch's records (a batch id may come again after a crash: a sink must
        not deliver a record twice); returns figures for the delivery log (`name: value`)."""
        ...

    def close(self) -> None: ...


@dataclass
class MemorySink:
    """Keeps what it is sent, idempotently by record id as the real sinks are: a re-sent
    batch or record adds nothing. `records` in delivery order; `batches` the ids seen."""

    records: list[OutRecord] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)
    closed: bool = False
    _ids: set[str] = field(default_factory=set, repr=False)

    def send(self, batch_id: int, records: Sequence[OutRecord]) -> dict[str, Any]:
        self.batches.append(batch_id)
        applied = 0
        for rec in records:
            if rec.id not in self._ids:
                self._ids.add(rec.id)
                self.records.append(rec)
                applied += 1
        return {"memory_applied": applied, "memory_duplicates": len(records) - applied}

    def close(self) -> None:
        self.closed = True

    def payloads(self, kafka_topic: str | None = None) -> list[dict[str, Any]]:
        """The payloads delivered (to one Kafka topic, if given)."""
        return [r.payload for r in self.records
                if kafka_topic is None or r.kafka_topic == kafka_topic]
