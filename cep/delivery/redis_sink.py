"""Redis delivery, idempotent by record id (docs/delivery.md)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from cep.delivery.record import OutRecord
from cep.errors import CepError

# KEYS: 1 seen-key, 2 stream, 3 latest hash. ARGV: 1 id, 2 payload, 3 maxlen, 4 channel,
# 5 latest field, 6 ttl seconds. Returns 1 when applied, 0 when the id was seen before.
_APPLY = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[6]) then return 0 end
if KEYS[2] ~= '' then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 'id', ARGV[1], 'data', ARGV[2])
end
if KEYS[3] ~= '' and ARGV[5] ~= '' then redis.call('HSET', KEYS[3], ARGV[5], ARGV[2]) end
if ARGV[4] ~= '' then redis.call('PUBLISH', ARGV[4], ARGV[2]) end
return 1
"""


log = logging.getLogger(__name__)


class RedisDeliveryError(CepError):
    pass


@dataclass
class RedisStats:
    applied: int = 0
    duplicates: int = 0


class RedisSink:
    def __init__(
        self, url: str, *, stream_maxlen: int = 100_000, dedupe_ttl_s: int = 7 * 24 * 3600,
        retry_seconds: float = 120.0, backoff_s: float = 0.5, client: Any = None,
    ) -> None:
        self.client = client or redis.Redis.from_url(url, socket_timeout=10,
                                                     socket_connect_timeout=5)
        self.stream_maxlen = stream_maxlen
        self.dedupe_ttl_s = dedupe_ttl_s
        # How long an outage the sink rides out (retrying with capped backoff) before the batch
        # fails; a failed batch is re-run on restart and delivered then (docs/delivery.md).
        self.retry_seconds = retry_seconds
        self.backoff_s = backoff_s
        self.retries_done = 0
        self._script = self.client.register_script(_APPLY)

    def send(self, batch_id: int, records: Sequence[OutRecord]) -> dict[str, Any]:
        """`cep.delivery.sink.Sink`: idempotent by record id, whatever the batch."""
        stats = self.deliver(records)
        return {"redis_applied": stats.applied, "redis_duplicates": stats.duplicates}

    def close(self) -> None:
        self.client.close()

    def deliver(self, records: Iterable[OutRecord], chunk: int = 500) -> RedisStats:
        stats = RedisStats()
        batch: list[OutRecord] = []
        for rec in records:
            if not (rec.redis_stream or rec.redis_channel or rec.redis_latest_hash):
                continue  # Kafka-only records (dead letters, late events) leave no dedupe key
            batch.append(rec)
            if len(batch) >= chunk:
                self._deliver_chunk(batch, stats)
                batch = []
        if batch:
            self._deliver_chunk(batch, stats)
        return stats

    def _deliver_chunk(self, records: list[OutRecord], stats: RedisStats) -> None:
        deadline = time.monotonic() + self.retry_seconds
        attempt = 0
        while True:
            try:
                pipe = self.client.pipeline(transaction=False)
                for rec in records:
                    self._script(
                        keys=[f"cep:seen:{rec.id}", rec.redis_stream, rec.redis_latest_hash],
                        args=[rec.id, rec.payload_json(), self.stream_maxlen, rec.redis_channel,
                              rec.redis_latest_field, self.dedupe_ttl_s],
                        client=pipe,
                    )
                results = pipe.execute()
                applied = sum(1 for r in results if int(r) == 1)
                stats.applied += applied
                stats.duplicates += len(results) - applied
                return
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if time.monotonic() >= deadline:
                    raise RedisDeliveryError(
                        f"Redis unavailable for {self.retry_seconds:.0f} s "
                        f"({attempt + 1} attempts): {exc}") from exc
                log.warning("Redis unavailable (%s); retrying", exc)
                self.retries_done += 1
                time.sleep(min(self.backoff_s * (2**attempt), 5.0))
                attempt += 1
