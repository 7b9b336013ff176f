"""A brute-force reference for docs/windows.md, written from the document and not from
`cep.runtime.windows`: every value is recomputed by rescanning the key's whole history (no
buckets kept, no running totals, no open-window bookkeeping)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

DAY, HOUR, MINUTE = 86_400_000, 3_600_000, 60_000
LADDER = (DAY, HOUR, 10 * MINUTE, MINUTE, 10_000, 1000, 100, 10, 1)


def resolution(width: int) -> int:
    """docs/windows.md: the largest ladder step dividing the width into >= 20 buckets."""
    return next((r for r in LADDER if width % r == 0 and width // r >= 20), 1)


def aggregate(func: str, values: Sequence[Any], star: bool) -> Any:
    """SQL aggregates over the values of the events in a window (None: NULL)."""
    if func == "COUNT":
        return len(values) if star else sum(1 for v in values if v is not None)
    nums = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if not nums:
        return None
    if func == "SUM":
        return sum(nums)
    if func == "AVG":
        return sum(nums) / len(nums)
    return min(nums) if func == "MIN" else max(nums)


Ev = Mapping[str, Any]


def over_values(events: Sequence[Ev], func: str, field: str | None, width: int,
                exclude_current: bool) -> list[Any]:
    """Per event of one key (given in (ts, seq) order), `func(field) OVER width` as of it."""
    r = resolution(width)
    k = width // r
    out = []
    for i, ev in enumerate(events):
        now = ev["ts"] // r
        window = [e for e in events[: i if exclude_current else i + 1]
                  if now - k < e["ts"] // r <= now]
        values = [None if field is None else e.get(field) for e in window]
        out.append(aggregate(func, values, field is None))
    return out


def windows(events: Sequence[Ev], kind: str, size: int, advance: int,
            where: Callable[[Ev], bool], end_of_input: int) -> list[tuple[int, int, list[Ev]]]:
    """The closed windows of one key: (start, end, events) for every window with at least one
    event passing `where` and whose end - 1 the input reached."""
    kept = [e for e in events if where(e)]
    found: list[tuple[int, int, list[Ev]]] = []
    if kind == "SESSION":
        session: list[Ev] = []
        for e in kept:
            if session and e["ts"] >= session[-1]["ts"] + size:
                found.append((session[0]["ts"], session[-1]["ts"] + size, session))
                session = []
            session.append(e)
        if session:
            found.append((session[0]["ts"], session[-1]["ts"] + size, session))
    else:
        starts = sorted({s for e in kept
                         for s in range(e["ts"] - e["ts"] % advance - (size // advance + 1)
                                        * advance, e["ts"] + 1, advance)
                         if s <= e["ts"] < s + size})
        for s in starts:
            found.append((s, s + size, [e for e in kept if s <= e["ts"] < s + size]))
    return [(s, e, evs) for s, e, evs in found if e - 1 <= end_of_input]
