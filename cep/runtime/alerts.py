"""Alert records: the documented JSON every sink writes (docs/alerts.md).

An alert id is a hash of rule id, rule version, key, kind and the (ts, seq) of every matched
event: the same input yields the same ids on a re-run, which makes delivery idempotent.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from cep.runtime.engine import Engine, Output
from cep.runtime.matcher import Dropped, Match, Timeout

Row = tuple[str, str, str, str, str]  # kind, rule_id, key, id, payload (JSON)

# `json.dumps(x, default=str)` and `json.dumps(x, sort_keys=True, default=str)`, the encoders
# made once: `json.dumps` with arguments builds a new `JSONEncoder` per call (two per alert;
# docs/native-core.md, session 21, gc21). Same text.
_DUMPS = json.JSONEncoder(default=str).encode
_DUMPS_SORTED = json.JSONEncoder(sort_keys=True, default=str).encode


def alert_id(rule_id: str, version: int, key: str, kind: str,
             positions: list[tuple[int, Any]]) -> str:
    h = hashlib.sha256()
    h.update(_DUMPS([rule_id, version, key, kind, positions]).encode())
    return h.hexdigest()[:32]


def alert_record(engine: Engine, result: Match | Timeout) -> dict[str, Any]:
    rule = engine.rules[result.rule_id].meta
    kind = result.kind
    key = "" if result.key is None else str(result.key)
    positions: list[Any] = [(e.ts, e.seq) for e in result.events]
    if getattr(rule, "window", None) is not None:
        # A window alert has no events: its window identifies it (docs/windows.md).
        positions = [("window", result.measures["window_start"], result.measures["window_end"])]
    record: dict[str, Any] = {
        "alert_id": alert_id(result.rule_id, result.version, key, kind, positions),
        "kind": kind,
        "alert": result.alert,
        "rule_id": result.rule_id,
        "rule_version": result.version,
        "rule_hash": engine.rules[result.rule_id].content_hash,
        "severity": getattr(rule, "severity", None),
        "key": key,
        "first_ts": result.first_ts,
        "last_ts": result.last_ts,
        "detected_at": detected_at(engine, result),
        "measures": _jsonable(result.measures),
        "events": [{"var": e.var, "ts": e.ts, "seq": e.seq, "event": dict(e.event)}
                   for e in result.events],
    }
    return record


def detected_at(engine: Engine, result: Match | Timeout) -> int:
    """The event time at which the alert became final (docs/alerts.md): a timeout's deadline;
    for a rule ending in an absence (`A -> NOT B WITHIN 2m`), the deadline the absence waited
    for (the first of `first_ts + WITHIN` and `last_ts` + the per-step limit); else `last_ts`.
    An absence without a deadline completes at the end of input: `last_ts` too."""
    if isinstance(result, Timeout):
        return result.deadline_ts
    if getattr(engine.rules[result.rule_id].meta, "window", None) is not None:
        return int(result.measures["window_end"])
    nfa = engine.rules[result.rule_id].meta.nfa
    if not nfa.has_absence:
        return result.last_ts
    limits = [t for t in (None if nfa.within_ms is None else result.first_ts + nfa.within_ms,
                          None if nfa.step_ms is None else result.last_ts + nfa.step_ms)
              if t is not None]
    return min(limits) if limits else result.last_ts


# The rows the engine's hosts emit (the Spark operator, the batch plan): `output_rows` writes
# them, `decode_rows` reads them back; as a Spark DDL schema.
OUTPUT_SCHEMA = "kind string, rule_id string, key string, id string, payload string"


def output_rows(engine: Engine, out: Output) -> list[Row]:
    rows: list[Row] = []
    for res in out.matches:
        if isinstance(res, Match | Timeout):
            rec = alert_record(engine, res)
            rows.append((rec["kind"], res.rule_id, rec["key"], rec["alert_id"],
                         _DUMPS_SORTED(rec)))
        elif isinstance(res, Dropped):
            info = {"rule_id": res.rule_id, "key": str(res.key), "count": res.count,
                    "ts": res.ts}
            rows.append(("dropped", res.rule_id, str(res.key), "", json.dumps(info)))
    for late in out.late:
        info = {"rule_ids": list(late.rule_ids), "key": late.key, "stream": late.event.stream,
                "ts": late.event.ts, "seq": late.event.seq, "watermark": late.watermark,
                "event": dict(late.event.data)}
        rows.append(("late", ",".join(late.rule_ids), late.key, "",
                     _DUMPS(info)))
    return rows


# -- the rows, read back (on the driver): one decoding for every job ---------------------------


@dataclass(frozen=True, slots=True)
class AlertRow:
    """A match or a timeout: `payload` is the alert record's JSON text (docs/alerts.md)."""

    kind: str  # "match" | "timeout"
    rule_id: str
    key: str
    id: str
    payload: str

    def record(self) -> dict[str, Any]:
        return json.loads(self.payload)  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class LateRow:
    """An event behind its rules' watermark: `payload` is the JSON text of what `output_rows`
    reports (rule ids, key, stream, ts, seq, watermark, the event)."""

    rule_ids: str  # comma-separated
    key: str
    payload: str


@dataclass(frozen=True, slots=True)
class DroppedRow:
    """The partial-match cap was hit: `info` has rule_id, key, count, ts."""

    rule_id: str
    info: dict[str, Any]


@dataclass(frozen=True, slots=True)
class StatsRow:
    """The operator's figures for one call (events, max_ts, …)."""

    info: dict[str, Any]


@dataclass(frozen=True, slots=True)
class DeadRow:
    """A bad event that travelled with the good ones (the live job's one query): `info` has
    reason, raw_b64 (its bytes, base64), stream and its source position (topic, partition,
    offset)."""

    info: dict[str, Any]


OperatorRow = AlertRow | LateRow | DroppedRow | StatsRow | DeadRow


def decode_rows(rows: Iterable[Any]) -> Iterator[OperatorRow]:
    """The operator's output rows (anything with kind, rule_id, key, id, payload: Spark `Row`s
    or `Row` tuples' fields), in order, as typed values."""
    for row in rows:
        kind = row.kind
        if kind == "stats":
            yield StatsRow(json.loads(row.payload))
        elif kind == "late":
            yield LateRow(row.rule_id, row.key, row.payload)
        elif kind == "dropped":
            yield DroppedRow(row.rule_id, json.loads(row.payload))
        elif kind == "dead":
            yield DeadRow(json.loads(row.payload))
        else:
            yield AlertRow(kind, row.rule_id, row.key, row.id, row.payload)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and value != value:  # NaN
        return None
    return value
