"""foreachBatch delivery of output records to Kafka (transactional) and Redis (idempotent)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, Row

from cep.config import Settings
from cep.delivery.kafka_sink import TransactionalKafkaSink
from cep.delivery.record import OutRecord
from cep.delivery.redis_sink import RedisSink

log = logging.getLogger(__name__)


def checkpoint_identity(checkpoint_dir: str) -> str:
    """The streaming query id Spark keeps in the checkpoint (stable across restarts; a new
    checkpoint gets a new one, so its batch ids are never mistaken for delivered ones)."""
    meta = Path(checkpoint_dir) / "metadata"
    return str(json.loads(meta.read_text().splitlines()[0])["id"])


class BatchDelivery:
    """A foreachBatch function: rows → OutRecords → Kafka transaction, then Redis."""

    def __init__(
        self, settings: Settings, query_name: str, checkpoint_dir: str,
        to_records: Callable[[Iterable[Row]], Iterable[OutRecord]],
        *, kafka: bool = True, redis: bool = True,
        on_batch: Callable[[int, dict[str, Any]], None] | None = None,
    ) -> None:
        self.settings = settings
        self.query_name = query_name
        self.checkpoint_dir = checkpoint_dir
        self.to_records = to_records
        self.use_kafka = kafka
        self.use_redis = redis
        self.on_batch = on_batch
        self._kafka: TransactionalKafkaSink | None = None
        self._redis: RedisSink | None = None

    def _sinks(self) -> tuple[TransactionalKafkaSink | None, RedisSink | None]:
        if self.use_kafka and self._kafka is None:
            ident = f"{self.query_name}-{checkpoint_identity(self.checkpoint_dir)}"
            self._kafka = TransactionalKafkaSink(
                self.settings.kafka_bootstrap, ident, client_conf=dict(self.settings.kafka_options)
            )
        if self.use_redis and self._redis is None:
            self._redis = RedisSink(self.settings.redis_url)
        return self._kafka, self._redis

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        kafka, redis = self._sinks()
        # Output per batch is alerts/notifications, small next to the input: one collect() is
        # one Spark job, where toLocalIterator() would run one per partition in turn.
        records = list(self.to_records(df.collect()))
        info: dict[str, Any] = {"batch_id": batch_id, "records": len(records)}
        if kafka is not None:
            kstats = kafka.deliver_batch(batch_id, records)
            info["kafka_written"] = kstats.written
            info["kafka_skipped_replayed_batch"] = kstats.skipped_batch
        if redis is not None:
            rstats = redis.deliver(records)
            info["redis_applied"] = rstats.applied
            info["redis_duplicates"] = rstats.duplicates
        log.info("delivered %s", info)
        if self.on_batch is not None:
            self.on_batch(batch_id, info)

    def close(self) -> None:
        if self._kafka is not None:
            self._kafka.close()
