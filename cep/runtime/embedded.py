"""The embedded mode: the same engine in-process, over lists of events. Used by `cep test`, by
tests, and as the reference the Spark path must equal (byte for byte, on sorted alert files)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from cep.runtime.alerts import alert_record
from cep.runtime.engine import Engine, Event, LateEvent, events_from_dicts, run_embedded
from cep.runtime.matcher import Match, Timeout


def alerts_for(engine: Engine, streams: Mapping[str, Iterable[Mapping[str, Any]]], *,
               time_fields: Mapping[str, str] | None = None, batch_size: int = 1,
               late: list[LateEvent] | None = None) -> list[dict[str, Any]]:
    """Run every stream's events (merged in (ts, seq) order) and return the alert records."""
    events: list[Event] = []
    for stream, dicts in streams.items():
        tf = (time_fields or {}).get(stream, "ts")
        events.extend(events_from_dicts(stream, dicts, tf))
    events.sort(key=lambda e: (e.ts, e.seq))
    return [alert_record(engine, r)
            for r in run_embedded(engine, events, batch_size=batch_size, late=late)
            if isinstance(r, Match | Timeout)]


def canonical_lines(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """Sorted canonical JSON lines, as `cep replay` writes them."""
    return sorted(json.dumps(json.loads(json.dumps(r, default=str)), sort_keys=True)
                  for r in records)
