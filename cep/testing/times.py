"""Times in test files: epoch milliseconds, ISO-8601, or offsets such as `+30s` from a base."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

# 2026-01-01T00:00:00Z, the same origin as the sample-data generators (cep.datagen.base.T0).
DEFAULT_BASE_MS = 1_767_225_600_000

_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_OFFSET = re.compile(r"^([+-])\s*((?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+|0)$")


def parse_duration(text: str) -> int | None:
    """`1m30s` → 90000; None if `text` is not a duration."""
    text = text.strip()
    if text == "0":
        return 0
    pos, total = 0, 0.0
    for m in _PART.finditer(text):
        if m.start() != pos:
            return None
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or pos == 0:
        return None
    return round(total)


def parse_time(value: Any, base_ms: int) -> int:
    """An event time in epoch milliseconds; raises ValueError with a human message."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a time")
    if isinstance(value, int):
        return value
    if isinstance(value, dt.datetime):
        return _datetime_ms(value)
    if isinstance(value, dt.date):
        return _datetime_ms(dt.datetime(value.year, value.month, value.day, tzinfo=dt.UTC))
    if isinstance(value, str):
        text = value.strip()
        m = _OFFSET.match(text)
        if m:
            ms = parse_duration(m.group(2))
            if ms is not None:
                return base_ms + (ms if m.group(1) == "+" else -ms)
        try:
            return _datetime_ms(dt.datetime.fromisoformat(text.replace("Z", "+00:00")))
        except ValueError:
            pass
    raise ValueError(
        f"{value!r} is not a time: write epoch milliseconds (1767225600000), ISO-8601 "
        "(2026-01-01T00:00:30Z) or an offset from the base (+30s, +1m30s, +2h)")


def _datetime_ms(value: dt.datetime) -> int:
    if value.tzinfo is None:  # YAML timestamps without a zone: UTC, as event times are
        value = value.replace(tzinfo=dt.UTC)
    return round(value.timestamp() * 1000)


def format_offset(ms: int) -> str:
    """90500 → `1m30s500ms` (no sign)."""
    if ms == 0:
        return "0s"
    parts = []
    for unit in ("d", "h", "m", "s", "ms"):
        size = _UNITS[unit]
        if ms >= size:
            parts.append(f"{ms // size}{unit}")
            ms %= size
    return "".join(parts)


def format_time(ts: int, base_ms: int) -> str:
    """`+1m30s` from the base when within a week of it, else ISO-8601 UTC."""
    delta = ts - base_ms
    if abs(delta) < 7 * _UNITS["d"]:
        return ("+" if delta >= 0 else "-") + format_offset(abs(delta))
    return iso(ts)


def iso(ts: int) -> str:
    when = dt.datetime.fromtimestamp(ts / 1000, tz=dt.UTC)
    text = when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return text.replace(".000Z", "Z")
