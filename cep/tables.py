"""Table records (docs/tables.md): the one validator of a reference table's rows, as
`cep.events` is the one validator of events. Base layer: it reads a compiled `TableSpec`
(`cep.nfa`) only through its attributes.

A record is a JSON object with the table's columns. Its key column must be there; a versioned
(KAFKA) table's record also needs its TIME BY column, which is read as an event time (epoch
ms or ISO-8601). `"_deleted": true`, or a Kafka tombstone (value null; see
`tombstone`), deletes the key's row from that time on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cep.events import EventSchema, conform, parse_object, schema_fields

DELETED = "_deleted"  # `{"id": "c1", "updated": ..., "_deleted": true}`: a delete
STATIC_TS = -(2**62)  # a static table's rows hold from the beginning of time
_T = "\x00t"  # the time a static row is validated with (never kept)
MAX_FILE_ROWS = 5_000_000


def table_fields(spec: Any) -> tuple[tuple[str, Any], ...]:
    """A table's columns as `EventSchema.fields`, with the delete marker (a BOOL)."""
    return (*schema_fields(spec.fields), (DELETED, "BOOL"))


def table_schema(spec: Any) -> EventSchema:
    return EventSchema(spec.name, spec.time_field or _T, (spec.key,), table_fields(spec))


def conform_row(data: Any, spec: Any, schema: EventSchema | None = None,
                ) -> tuple[str | None, int | None, dict[str, Any] | None, str | None]:
    """A decoded record → `(key, ts, row or None for a delete, None)`, or
    `(None, None, None, reason)` when it is malformed."""
    if not isinstance(data, dict):
        return None, None, None, "a table record is a JSON object"
    schema = schema or table_schema(spec)
    deleted = data.get(DELETED) is True  # anything but true/false/null is rejected below
    if spec.time_field is None:
        data = {**data, _T: 0}
    row, ts, reason = conform(data, schema)
    if row is None:
        return None, None, None, reason
    key = row[spec.key]
    if spec.time_field is None:
        row.pop(_T, None)
        ts = STATIC_TS
    if not deleted:
        row.pop(DELETED, None)
    return (key if isinstance(key, str) else str(key)), ts, (None if deleted else row), None


def parse_row(raw: bytes | str | None, spec: Any, schema: EventSchema | None = None,
              ) -> tuple[str | None, int | None, dict[str, Any] | None, str | None]:
    """Raw record bytes → as `conform_row`."""
    obj, reason = parse_object(raw)
    if obj is None:
        return None, None, None, reason
    return conform_row(obj, spec, schema)


def tombstone(spec: Any, key: str, ts: int) -> dict[str, Any]:
    """A Kafka tombstone (null value) as a delete record: its key from the record's Kafka key,
    its time from the Kafka timestamp."""
    return {spec.key: key, spec.time_field: ts, DELETED: True}


def load_file_rows(spec: Any, rules_path: str) -> tuple[tuple[dict[str, Any], ...], str | None]:
    """A static table's JSON-lines file (relative to the rules file) → its rows, or a reason."""
    base = Path(rules_path).parent if rules_path and not rules_path.startswith("<") else Path()
    path = base / spec.source
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return (), f"cannot read {spec.source!r}: {exc}"
    rows: list[dict[str, Any]] = []
    schema = table_schema(spec)
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if len(rows) >= MAX_FILE_ROWS:
            return (), f"{spec.source!r} has more than {MAX_FILE_ROWS} rows"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            return (), f"{spec.source}:{n}: not JSON ({exc.msg})"
        key, _, row, reason = conform_row(obj, spec, schema)
        if reason is not None:
            return (), f"{spec.source}:{n}: {reason}"
        if row is not None:
            rows.append(row)
    return tuple(rows), None
