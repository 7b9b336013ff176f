"""`cep tail`: print alerts as they arrive, from a Kafka topic (read_committed) or Redis."""

from __future__ import annotations

import json
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from cep.config import Settings
from cep.errors import CepError


def format_alert(alert: dict[str, Any]) -> str:
    when = datetime.fromtimestamp(alert.get("detected_at", 0) / 1000, UTC)
    measures = " ".join(f"{k}={_show(v)}"
                        for k, v in sorted((alert.get("measures") or {}).items()))
    return (f"{when:%Y-%m-%d %H:%M:%S}Z {str(alert.get('severity') or '-'):<8} "
            f"{alert.get('alert')} key={alert.get('key')} rule={alert.get('rule_id')}"
            f"@v{alert.get('rule_version')} events={len(alert.get('events') or [])}"
            + (f" {measures}" if measures else ""))


def _show(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def tail(settings: Settings, topic: str | None, *, redis_channel: str | None = None,
         from_beginning: bool = False, max_alerts: int | None = None,
         timeout: float | None = None, raw: bool = False) -> int:
    seen = 0
    last = time.monotonic()

    def show(value: bytes | str) -> None:
        nonlocal seen, last
        text = value.decode() if isinstance(value, bytes) else value
        print(text if raw else format_alert(json.loads(text)), flush=True)
        seen += 1
        last = time.monotonic()

    def done() -> bool:
        if max_alerts is not None and seen >= max_alerts:
            return True
        return timeout is not None and time.monotonic() - last > timeout

    if redis_channel:
        import redis

        pubsub = redis.Redis.from_url(settings.redis_url).pubsub()
        pubsub.subscribe(redis_channel)
        while not done():
            msg = pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
            if msg is not None:
                show(msg["data"])
        return 0
    if not topic:
        raise CepError("cep tail: give an alert topic, or --redis CHANNEL")
    from confluent_kafka import Consumer

    consumer = Consumer({
        "bootstrap.servers": settings.kafka_bootstrap,
        "group.id": f"cep-tail-{uuid.uuid4().hex[:8]}",
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest" if from_beginning else "latest",
        "enable.auto.commit": False,
        **dict(settings.kafka_options),
    })
    consumer.subscribe([topic])
    try:
        while not done():
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                print(f"cep tail: {msg.error()}", file=sys.stderr)
                continue
            value = msg.value()
            if value is not None:  # a tombstone carries no alert
                show(value)
    finally:
        consumer.close()
    return 0
