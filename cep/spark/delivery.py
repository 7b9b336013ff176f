"""foreachBatch delivery of output records to its sinks (`cep.delivery.sink.Sink`): by default
Kafka (transactional), then Redis (idempotent)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, Row

from cep.config import Settings
from cep.delivery.kafka_sink import TransactionalKafkaSink
from cep.delivery.record import OutRecord
from cep.delivery.redis_sink import RedisSink
from cep.delivery.sink import Sink

log = logging.getLogger(__name__)


def checkpoint_identity(checkpoint_dir: str) -> str:
    """The streaming query id Spark keeps in the checkpoint (stable across restarts; a new
    checkpoint gets a new one, so its batch ids are never mistaken for delivered ones)."""
    meta = Path(checkpoint_dir) / "metadata"
    return str(json.loads(meta.read_text().splitlines()[0])["id"])


class BatchDelivery:
    """A foreachBatch function: rows → OutRecords → each sink in turn (by default a Kafka
    transaction, then Redis). `sinks` replaces the default ones (e.g. a `MemorySink`)."""

    def __init__(
        self, settings: Settings, query_name: str, checkpoint_dir: str,
        to_records: Callable[[Iterable[Row]], Iterable[OutRecord]],
        *, kafka: bool = True, redis: bool = True,
        on_batch: Callable[[int, dict[str, Any]], None] | None = None,
        sinks: Sequence[Sink] | None = None,
    ) -> None:
        self.settings = settings
        self.query_name = query_name
        self.checkpoint_dir = checkpoint_dir
        self.to_records = to_records
        self.use_kafka = kafka
        self.use_redis = redis
        self.on_batch = on_batch
        self._sinks: list[Sink] | None = list(sinks) if sinks is not None else None

    def sinks(self) -> list[Sink]:
        """The sinks, made on first use (on the driver, where foreachBatch runs)."""
        if self._sinks is None:
            made: list[Sink] = []
            if self.use_kafka:
                ident = f"{self.query_name}-{checkpoint_identity(self.checkpoint_dir)}"
                made.append(TransactionalKafkaSink(
                    self.settings.kafka_bootstrap, ident,
                    client_conf=dict(self.settings.kafka_options)))
            if self.use_redis:
                made.append(RedisSink(self.settings.redis_url))
            self._sinks = made
        return self._sinks

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        sinks = self.sinks()
        started = time.perf_counter()
        # Output per batch is alerts/notifications, small next to the input: one collect() is
        # one Spark job, where toLocalIterator() would run one per partition in turn.
        rows = df.collect()
        collected = time.perf_counter()
        records = list(self.to_records(rows))
        info: dict[str, Any] = {"batch_id": batch_id, "records": len(records)}
        routed = time.perf_counter()
        for sink in sinks:
            info.update(sink.send(batch_id, records))
        # Where the batch's delivery time went, in ms: the Spark job that computes the rows
        # (the whole micro-batch's work), turning them into records, the sinks.
        info.update(collect_ms=_ms(collected - started), route_ms=_ms(routed - collected),
                    sinks_ms=_ms(time.perf_counter() - routed))
        log.info("delivered %s", info)
        if self.on_batch is not None:
            self.on_batch(batch_id, info)

    def close(self) -> None:
        for sink in self._sinks or ():
            sink.close()


def _ms(seconds: float) -> int:
    return int(1000 * seconds)
