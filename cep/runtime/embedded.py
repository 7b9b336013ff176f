"""The embedded mode: the same engine in-process, over lists of events. Used by `cep test`, by
tests, and as the reference the Spark path must equal (byte for byte, on sorted alert files)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from cep.events import EventSchema, conform, validate
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


def validate_records(records: Iterable[bytes | str | Mapping[str, Any]], schema: EventSchema,
                     ) -> tuple[list[dict[str, Any]], list[tuple[int, str]]]:
    """Raw records (JSON bytes or text, or decoded objects) → the valid events and the dead
    letters as (index, reason), by the one definition of a valid event (`cep.events`) that
    replay, the live job and `cep test` apply. Feed the events to `alerts_for`."""
    events: list[dict[str, Any]] = []
    dead: list[tuple[int, str]] = []
    for i, rec in enumerate(records):
        if isinstance(rec, Mapping):
            event, _, reason = conform(rec, schema)
        else:
            event, _, reason = validate(rec, schema)
        if event is None:
            dead.append((i, reason or "invalid"))
        else:
            events.append(event)
    return events, dead


def canonical_lines(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """Sorted canonical JSON lines, as `cep replay` writes them."""
    return sorted(json.dumps(json.loads(json.dumps(r, default=str)), sort_keys=True)
                  for r in records)
