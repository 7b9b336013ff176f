"""What a valid event is: one definition, enforced in one place for every mode.

Replay, the live job, `cep test`, the embedded engine and the percolator all hand raw input to
this module and get back either an event (a `dict` conforming to the stream's schema, plus its
event time) or a one-line reason; nothing else parses user input. Spark reads raw bytes and
never interprets them (docs/spark-runtime.md, "Bad input"), so what the JVM accepts cannot
disagree with what the engine reads: there is only this parse.

Parsing is strict JSON (RFC 8259), in UTF-8:
- the message is at most `MAX_BYTES` (1 MiB, Kafka's default message size), not empty;
- it decodes as UTF-8 (no lone surrogates, no `\\ud800` escapes either);
- it is exactly one JSON *object*: no trailing garbage, no single quotes, no `NaN`/`Infinity`,
  no number that overflows a double (`1e400`), no integer of more than 4300 digits;
- containers nest at most `MAX_DEPTH` levels deep.

Types, by the stream's declared schema (`FIELDS (...)` in the rules); a field that is absent or
`null` is fine, except the time field and the key fields, which must be present:
- time field: epoch milliseconds as a JSON integer, or an ISO-8601 string (no zone = UTC); the
  event carries it as integer milliseconds afterwards, in every mode;
- `INT`: a JSON integer in the signed 64-bit range (an integral number such as `5.0` too);
- `FLOAT`: any finite JSON number;
- `BOOL`: `true` or `false`;
- `STRING`: a JSON string;
- `STRUCT(...)`: a JSON object, whose declared fields are checked by these same rules (absent
  or `null` is fine; a wrong type names the path: "field 'payload:amount' is FLOAT, got a
  string"); undeclared fields inside it pass unchanged.
Nothing is converted between strings and numbers: `"5000"` for a `FLOAT` field is a dead letter
("field 'amount' is FLOAT, got a string"), never a silently unmatched event. A JSON document has
number types; a number in quotes is a producer bug that conversion would hide (and `"5,000"` or
`"5e3"` would be guessed differently by different readers). Undeclared fields pass unchanged.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_BYTES = 1 << 20
MAX_DEPTH = 32
MIN_TS = -62_135_596_800_000     # 0001-01-01T00:00:00Z
MAX_TS = 253_402_300_799_000     # 9999-12-31T23:59:59Z: the end-of-input marker, excluded
_INT64 = 1 << 63
_MAXF = int(sys.float_info.max)  # larger integers do not fit a double
TYPES = ("STRING", "INT", "FLOAT", "BOOL")


@dataclass(frozen=True, slots=True)
class EventSchema:
    """What the rules expect of one stream's events."""

    stream: str
    time_field: str = "ts"
    key_fields: tuple[str, ...] = ()
    # Declared (name, type), or None. A STRUCT's type is the tuple of its own (name, type).
    fields: tuple[tuple[str, Any], ...] | None = None

    @classmethod
    def of(cls, spec: Any, key_fields: Iterable[str | None] = ()) -> EventSchema:
        """From a compiled `StreamSpec` (`cep.nfa`) and the key fields its rules partition by."""
        fields = None if spec.fields is None else schema_fields(spec.fields)
        keys = tuple(dict.fromkeys(k for k in key_fields if k))
        return cls(spec.name, spec.time_field, keys, fields)


def schema_fields(specs: Iterable[Any]) -> tuple[tuple[str, Any], ...]:
    """`cep.nfa.FieldSpec`s → `EventSchema.fields`: (name, STRING|INT|FLOAT|BOOL), or (name,
    the STRUCT's own fields)."""
    return tuple((f.name, schema_fields(f.fields) if f.fields is not None else f.type)
                 for f in specs)


class _Reject(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _Reject(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _Reject(f"number {_clip(text)} overflows a double")
    return value


_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float)


def parse_object(raw: bytes | str | None, max_bytes: int = MAX_BYTES,
                 ) -> tuple[dict[str, Any] | None, str | None]:
    """Strict JSON object: `(object, None)` or `(None, reason)`. Never raises."""
    obj, _, reason = _parse(raw, max_bytes)
    return obj, reason


def _parse(raw: bytes | str | None, max_bytes: int,
           ) -> tuple[dict[str, Any] | None, str, str | None]:
    """`(object, its text, None)` or `(None, "", reason)`."""
    if raw is None or len(raw) == 0:
        return None, "", "empty message"
    if len(raw) > max_bytes:
        return None, "", f"message too large: {len(raw)} bytes (limit {max_bytes})"
    if isinstance(raw, bytes | bytearray | memoryview):
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            return None, "", f"not UTF-8: invalid byte at offset {exc.start}"
    else:
        text = raw
        if len(text.encode("utf-8", "surrogatepass")) > max_bytes:
            return None, "", f"message too large (limit {max_bytes} bytes)"
    if text.startswith("\ufeff"):
        return None, "", "malformed JSON: starts with a byte order mark"
    try:
        obj, end = _DECODER.raw_decode(text, _skip_ws(text, 0))
    except _Reject as exc:
        return None, "", f"malformed JSON: {exc}"
    except json.JSONDecodeError as exc:
        return None, "", f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    except RecursionError:
        return None, "", f"malformed JSON: nested more than {MAX_DEPTH} levels"
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        return None, "", f"malformed JSON: {_clip(str(exc), 120)}"
    if end != len(text) and text[end:].strip(" \t\n\r"):
        return None, "", (f"malformed JSON: trailing data after the object at character {end}: "
                      f"{_clip(text[end:].strip())!r}")
    if type(obj) is not dict:
        return None, "", f"malformed JSON: the top level is {_json_kind(obj)}, not an object"
    # The walk is needed only where C-speed scans of the text cannot rule a problem out:
    # nesting needs more brackets than the limit; a lone surrogate needs a `\u` escape (or,
    # for text input, a non-ASCII character); overflow and NaN are refused while parsing.
    if (text.count("{") + text.count("[") > MAX_DEPTH or "\\u" in text
            or (not isinstance(raw, bytes | bytearray | memoryview) and not text.isascii())):
        problem = _check_values(obj)
        if problem:
            return None, "", problem
    return obj, text, None


def validate(raw: bytes | str | None, schema: EventSchema, max_bytes: int = MAX_BYTES,
             ) -> tuple[dict[str, Any] | None, int | None, str | None]:
    """Raw input of `schema.stream` → `(event, ts, None)` or `(None, None, reason)`."""
    obj, _, reason = _parse(raw, max_bytes)
    if obj is None:
        return None, None, reason
    event, ts, reason, _ = _conform(obj, schema, True)
    return event, ts, reason


def validate_text(raw: bytes | str | None, schema: EventSchema, max_bytes: int = MAX_BYTES,
                  ) -> tuple[str | None, dict[str, Any] | None, int | None, str | None]:
    """As `validate`, plus the event's text for the engine: the input text itself when the
    event is exactly what it says (json.loads of it gives the event: the same parser on the
    same text), else the canonical text of the converted event (an ISO time, `5.0` as INT)."""
    obj, text, reason = _parse(raw, max_bytes)
    if obj is None:
        return None, None, None, reason
    event, ts, reason, changed = _conform(obj, schema, True)
    if event is None:
        return None, None, None, reason
    return (dumps(event) if changed else text), event, ts, None


def conform(data: Mapping[str, Any], schema: EventSchema,
            ) -> tuple[dict[str, Any] | None, int | None, str | None]:
    """An event already decoded (a JSON object, or a test file's mapping) → `(event, ts, None)`
    or `(None, None, reason)`. The event is a new dict, with the time field as epoch ms."""
    event, ts, reason, _ = _conform(data, schema, False)
    return event, ts, reason


def _conform(data: Mapping[str, Any], schema: EventSchema, owned: bool,
             ) -> tuple[dict[str, Any] | None, int | None, str | None, bool]:
    """`conform`, plus whether the event differs from `data` (a converted value). `owned`:
    `data` is the caller's fresh dict and may become the event."""
    changed = False
    tf = schema.time_field
    value = data.get(tf)
    if type(value) is int and MIN_TS <= value < MAX_TS:
        ts: int | None = value
    else:
        if value is None:
            return None, None, f"missing time field '{tf}'", False
        ts, why = event_time(value)
        changed = True
        if why:
            return None, None, f"time field '{tf}' {why}", False
    assert ts is not None
    for kf in schema.key_fields:
        key = data.get(kf)
        if key is None:
            return None, None, f"missing key field '{kf}'", False
        if type(key) is dict or type(key) is list:
            return None, None, f"key field '{kf}' is {_json_kind(key)}, not a value", False
    event = data if owned and type(data) is dict else dict(data)
    event[tf] = ts
    if schema.fields is not None:
        reason, converted = _check_fields(event, schema.fields, tf, "")
        if reason is not None:
            return None, None, reason, False
        changed = changed or converted
    return event, ts, None, changed


def _check_fields(obj: dict[str, Any], fields: tuple[tuple[str, Any], ...], tf: str | None,
                  prefix: str) -> tuple[str | None, bool]:
    """Check (and convert in place) `obj`'s declared fields: `(reason or None, converted)`.
    A STRUCT's type is the tuple of its own fields; its value must be a JSON object, whose
    fields are checked the same way (a nested dict is copied before a conversion, so the
    caller's data is never changed). Names in reasons are paths: `payload:amount`."""
    changed = False
    for name, typ in fields:
        value = obj.get(name)
        if value is None or name == tf:
            continue
        t = type(value)
        if type(typ) is tuple:
            if not isinstance(value, dict):
                return f"field '{prefix}{name}' is STRUCT, got {_describe(value)}", False
            inner = dict(value)
            reason, converted = _check_fields(inner, typ, None, f"{prefix}{name}:")
            if reason is not None:
                return reason, False
            if converted or t is not dict:  # (a test file's mapping becomes a plain dict)
                obj[name], changed = inner, True
            continue
        if typ == "STRING":
            ok = t is str
        elif typ == "FLOAT":
            ok = (t is float and value - value == 0.0) or (t is int and -_MAXF < value < _MAXF)
        else:
            ok, converted_value = _typed(value, typ)
            if converted_value is not value:
                obj[name], changed = converted_value, True
        if not ok:
            return f"field '{prefix}{name}' is {typ}, got {_describe(value)}", False
    return None, changed


def event_time(value: Any) -> tuple[int | None, str | None]:
    """Epoch ms from a JSON integer or an ISO-8601 string: `(ms, None)` or `(None, reason)`."""
    if isinstance(value, bool):
        return None, "is a boolean, not a time"
    if isinstance(value, int):
        ms = value
    elif isinstance(value, float):
        if not value.is_integer():
            return None, f"is {value!r}: epoch milliseconds are an integer"
        ms = int(value)
    elif isinstance(value, str):
        try:
            when = dt.datetime.fromisoformat(value.strip())
        except ValueError:
            return None, (f"is {_clip(value)!r}: neither epoch milliseconds (a JSON integer) "
                          "nor an ISO-8601 timestamp")
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        delta = when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        ms = (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000
    else:
        return None, f"is {_json_kind(value)}, not a time"
    if not MIN_TS <= ms < MAX_TS:
        return None, f"is {_clip(str(value))}: outside years 1-9999"
    return ms, None


def _typed(value: Any, typ: str) -> tuple[bool, Any]:
    if typ == "STRING":
        return isinstance(value, str), value
    if typ == "BOOL":
        return isinstance(value, bool), value
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False, value
    if typ == "INT":
        if isinstance(value, float):
            if not value.is_integer():
                return False, value
            value = int(value)
        return -_INT64 <= value < _INT64, value
    if typ == "FLOAT":
        try:
            return math.isfinite(float(value)), value
        except OverflowError:  # an integer beyond a double's range
            return False, value
    return True, value  # an unknown type name: the compiler rejects those


def _check_values(obj: Any) -> str | None:
    """Depth limit and strings that cannot be written back as UTF-8 (lone surrogates)."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"malformed JSON: nested more than {MAX_DEPTH} levels"
        items: Iterable[Any] = node.values() if isinstance(node, dict) else node
        for k in (node if isinstance(node, dict) else ()):
            if _bad_text(k):
                return "malformed JSON: a key is not valid Unicode (lone surrogate)"
        for v in items:
            if isinstance(v, str):
                if _bad_text(v):
                    return "malformed JSON: a string is not valid Unicode (lone surrogate)"
            elif isinstance(v, dict | list):
                stack.append((v, depth + 1))
            elif isinstance(v, float) and not math.isfinite(v):
                return "malformed JSON: a number is not finite"
    return None


def _bad_text(s: str) -> bool:
    if s.isascii():
        return False
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _skip_ws(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in " \t\n\r":
        i += 1
    return i


def _json_kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int | float):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


def _describe(v: Any) -> str:
    if isinstance(v, str):
        return f"a string {_clip(json.dumps(v))}"
    if isinstance(v, bool | int | float):
        return f"{_json_kind(v)} {_clip(json.dumps(v))}"
    return _json_kind(v)


def _clip(text: str, n: int = 40) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def dumps(event: Mapping[str, Any]) -> str:
    """The canonical text of a valid event (what replay stages and Spark hands the engine)."""
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False, allow_nan=False)



DEAD_LETTER_VALUE_BYTES = 64 * 1024


def dead_letter(reason: str, raw: bytes | str | None, stream: str | None,
                **position: Any) -> dict[str, Any]:
    """The dead-letter record, the same in replay (file, line) and live (topic, partition,
    offset): the reason, where the input was, and the input itself (`value` when it is UTF-8,
    else `value_base64`), cut at 64 KiB (`truncated`, `size` say so) so that a 5 MB message
    cannot make an undeliverable dead letter."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    record: dict[str, Any] = {"reason": reason, "stream": stream, **position,
                              "size": None if data is None else len(data)}
    if data is None:
        record["value"] = None
        return record
    cut = bytes(data[:DEAD_LETTER_VALUE_BYTES])
    record["truncated"] = len(data) > len(cut)
    try:
        record["value"] = cut.decode("utf-8")
    except UnicodeDecodeError as exc:
        if record["truncated"] and exc.start >= len(cut) - 3:  # cut inside a character
            record["value"] = cut[: exc.start].decode("utf-8", "replace")
        else:
            record["value_base64"] = base64.b64encode(cut).decode()
    return record


__all__ = ["MAX_BYTES", "MAX_DEPTH", "EventSchema", "conform", "dead_letter", "dumps",
           "event_time", "parse_object", "schema_fields", "validate", "validate_text"]
