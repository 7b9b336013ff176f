from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class OutRecord:
    """One alert or notification, addressed to its destinations.

    `id` is deterministic (the same input yields the same id after a re-run), which is what makes
    both sinks idempotent. Empty destination strings mean "not there".
    """

    id: str
    payload: dict[str, Any]
    key: str = ""
    kafka_topic: str = ""
    redis_stream: str = ""
    redis_channel: str = ""
    # Latest-per-key: hash name and field (e.g. "cep:latest:<rule>", "<key>").
    redis_latest_hash: str = ""
    redis_latest_field: str = ""

    def payload_json(self) -> str:
        return json.dumps(self.payload, sort_keys=True, separators=(",", ":"), default=str)
