"""Bad input rows → dead-letter records, for every job that reads Kafka (`cep run`,
`cep percolate`): one definition of the record (`cep.events.dead_letter`) and of its id."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from cep.delivery.record import OutRecord
from cep.events import dead_letter


class Counter(Protocol):
    def count(self, name: str, n: int = 1) -> None: ...


def dead_letter_records(rows: Iterable[Any], metrics: Counter, topic: str,
                        ) -> Iterable[OutRecord]:
    """Bad rows (reason, raw, stream, topic, partition, offset) → dead-letter records
    (`cep.events.dead_letter`: reason, topic, partition, offset, stream, the value cut at
    64 KiB), each counted as `dead_letters`."""
    for r in rows:
        raw = bytes(r.raw) if r.raw is not None else None
        yield dead_letter_record(r.reason, raw, r.stream, r.topic, int(r.partition),
                                 int(r.offset), metrics, topic)


def dead_letter_record(reason: str, raw: bytes | None, stream: str | None, source: str,
                       partition: int, offset: int, metrics: Counter, topic: str) -> OutRecord:
    """One bad Kafka message → its dead-letter record (id from its position: a re-run batch
    writes the same record), counted as `dead_letters`."""
    metrics.count("dead_letters")
    payload = dead_letter(reason, raw, stream, topic=source, partition=partition, offset=offset)
    return OutRecord(id=f"dlq-{source}-{partition}-{offset}", payload=payload,
                     key=f"{source}/{partition}/{offset}", kafka_topic=topic)
