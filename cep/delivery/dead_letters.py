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
        metrics.count("dead_letters")
        raw = bytes(r.raw) if r.raw is not None else None
        payload = dead_letter(r.reason, raw, r.stream, topic=r.topic,
                              partition=int(r.partition), offset=int(r.offset))
        yield OutRecord(id=f"dlq-{r.topic}-{r.partition}-{r.offset}", payload=payload,
                        key=f"{r.topic}/{r.partition}/{r.offset}", kafka_topic=topic)
