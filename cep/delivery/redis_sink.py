"""Redis delivery, idempotent by record id (docs/delivery.md)."""

from __future__ import annotations

import time
from collections.abc import Iterable
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


class RedisDeliveryError(CepError):
    pass


@dataclass
class RedisStats:
    applied: int = 0
    duplicates: int = 0


class RedisSink:
    def __init__(
        self, url: str, *, stream_maxlen: int = 100_000, dedupe_ttl_s: int = 7 * 24 * 3600,
        retries: int = 5, backoff_s: float = 0.5, client: Any = None,
    ) -> None:
        self.client = client or redis.Redis.from_url(url, socket_timeout=10)
        self.stream_maxlen = stream_maxlen
        self.dedupe_ttl_s = dedupe_ttl_s
        self.retries = retries
        self.backoff_s = backoff_s
        self._script = self.client.register_script(_APPLY)

    def deliver(self, records: Iterable[OutRecord], chunk: int = 500) -> RedisStats:
        stats = RedisStats()
        batch: list[OutRecord] = []
        for rec in records:
            batch.append(rec)
            if len(batch) >= chunk:
                self._deliver_chunk(batch, stats)
                batch = []
        if batch:
            self._deliver_chunk(batch, stats)
        return stats

    def _deliver_chunk(self, records: list[OutRecord], stats: RedisStats) -> None:
        for attempt in range(self.retries + 1):
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
                if attempt == self.retries:
                    raise RedisDeliveryError(
                        f"Redis unavailable after {self.retries + 1} attempts: {exc}"
                    ) from exc
                time.sleep(self.backoff_s * (2**attempt))
