"""Windows over a key's history (docs/windows.md): sliding `AGG(x) OVER d` aggregates in pattern
rules, and window rules (WINDOW TUMBLING / HOPPING / SESSION ... HAVING ...).

Both implement the engine's `RuleMatcher` protocol (`cep.runtime.engine`), so the engine drives
them as it drives the pattern matcher: one key's events in `(ts, seq)` order, `on_time` as the
watermark passes deadlines, `on_end` at the end of input. States are plain lists and tuples
(picklable), `None` when nothing is kept.

- `OverMatcher` wraps the pattern `Matcher`: per event it updates each OVER aggregate's
  sub-buckets, computes the values, and hands the matcher the event as a `cep.expr.Windowed`
  (the user's fields plus `win`, read by `cep.expr.WindowAgg`). Its deadline includes the time
  its newest bucket leaves the window, when the key's window state is dropped.
- `WindowRuleMatcher` keeps the open windows' accumulators and emits each window when the safe
  time reaches its end - 1.

The Rust core runs neither: `cep.program.export_program` refuses such rules, so they run here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cep.expr import Windowed
from cep.nfa import AggSpec, CompiledRule, OverSpec, WindowSpec
from cep.runtime.matcher import Match, Matcher, Result

RowFn = Callable[[Mapping[str, Any]], Any] | None


def _row(spec: AggSpec) -> RowFn:
    if spec.row is None:
        return None
    fn = spec.row.bind()
    return lambda ev: fn(ev, ())


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _counts(func: str, v: Any) -> bool:
    """Does value `v` count in aggregate `func`? COUNT(x): any non-NULL; the others: numbers."""
    return v is not None if func == "COUNT" else _number(v)


# -- accumulators ----------------------------------------------------------------------------
# One aggregate's accumulator: [n_rows, n, sum, min, max] (n: values that count, see `_counts`).


def _acc() -> list[Any]:
    return [0, 0, 0, None, None]


def _add(acc: list[Any], func: str, v: Any) -> None:
    acc[0] += 1
    if not _counts(func, v):
        return
    acc[1] += 1
    if func == "COUNT":
        return
    acc[2] += v
    if acc[3] is None or v < acc[3]:
        acc[3] = v
    if acc[4] is None or v > acc[4]:
        acc[4] = v


def _value(func: str, star: bool, acc: Sequence[Any]) -> Any:
    if func == "COUNT":
        return acc[0] if star else acc[1]
    if acc[1] == 0:
        return None
    if func == "SUM":
        return acc[2]
    if func == "AVG":
        return acc[2] / acc[1]
    return acc[3] if func == "MIN" else acc[4]


# -- sliding OVER aggregates -----------------------------------------------------------------


class _Over:
    """One `AGG(x) OVER d` with its sub-buckets. State: [buckets, n_rows, n, sum] with buckets a
    list of [bucket, n_rows, n, sum, min, max], oldest first; n_rows/n/sum are running totals."""

    __slots__ = ("exclude", "func", "k", "r", "row", "star")

    def __init__(self, spec: OverSpec) -> None:
        self.func = spec.agg.func
        self.star = spec.agg.row is None
        self.row = _row(spec.agg)
        self.r = spec.bucket_ms
        self.k = spec.width_ms // self.r  # buckets in the window
        self.exclude = spec.exclude_current

    def evict(self, st: list[Any], t: int) -> None:
        """Drop the buckets that are out of the window at time t."""
        buckets = st[0]
        lo = t // self.r - self.k  # buckets b <= lo are out
        while buckets and buckets[0][0] <= lo:
            b = buckets.pop(0)
            st[1] -= b[1]
            st[2] -= b[2]
            st[3] -= b[3]
        if st[2] == 0:
            st[3] = 0  # no drift left behind by float subtraction

    def add(self, st: list[Any], ev: Mapping[str, Any], ts: int) -> None:
        v = None if self.row is None else self.row(ev)
        b = ts // self.r
        buckets = st[0]
        if not buckets or buckets[-1][0] != b:
            buckets.append([b, 0, 0, 0, None, None])
        bucket = buckets[-1]
        bucket[1] += 1
        st[1] += 1
        if not _counts(self.func, v):
            return
        bucket[2] += 1
        st[2] += 1
        if self.func == "COUNT":
            return
        bucket[3] += v
        st[3] += v
        if bucket[4] is None or v < bucket[4]:
            bucket[4] = v
        if bucket[5] is None or v > bucket[5]:
            bucket[5] = v

    def value(self, st: list[Any]) -> Any:
        func = self.func
        if func in ("MIN", "MAX"):
            vals = [b[4 if func == "MIN" else 5] for b in st[0] if b[2]]
            if not vals:
                return None
            return min(vals) if func == "MIN" else max(vals)
        # The sum from the buckets' own sums (at most the window's bucket count), exactly
        # rounded: a running total that subtracts evicted buckets keeps their rounding error
        # (1e17 in, then out, wipes the small values beside it) for as long as the key is busy.
        total = math.fsum(b[3] for b in st[0]) if func in ("SUM", "AVG") else st[3]
        return _value(func, self.star, (st[1], st[2], total))

    def expiry(self, st: list[Any]) -> int | None:
        """When the newest bucket leaves the window (the state is empty from then on)."""
        buckets = st[0]
        return (buckets[-1][0] + self.k) * self.r if buckets else None


class OverMatcher:
    """A pattern `Matcher` whose rule reads sliding aggregates. State: None, or
    (matcher state, [one `_Over` state per OVER aggregate])."""

    def __init__(self, rule: CompiledRule, inner: Matcher) -> None:
        self.rule = rule
        self.inner = inner
        self.overs = [_Over(spec) for spec in rule.over]
        self.stats = inner.stats

    def initial(self) -> Any:
        return None

    @staticmethod
    def is_empty(state: Any) -> bool:
        return state is None

    def _pack(self, inner: Any, wins: list[Any]) -> Any:
        if inner is None and all(not w[0] for w in wins):
            return None
        return (inner, wins)

    def _unpack(self, state: Any) -> tuple[Any, list[Any]]:
        if state is None:
            return None, [[[], 0, 0, 0] for _ in self.overs]
        return state  # type: ignore[no-any-return]

    def _windowed(self, wins: list[Any], event: Mapping[str, Any], ts: int) -> Windowed:
        """Add the event to each window; the event with the values as of it."""
        values = []
        for over, st in zip(self.overs, wins, strict=True):
            over.evict(st, ts)
            if over.exclude:
                values.append(over.value(st))
                over.add(st, event, ts)
            else:
                over.add(st, event, ts)
                values.append(over.value(st))
        return Windowed(event, tuple(values))

    def on_event(self, state: Any, event: Mapping[str, Any], ts: int, seq: Any = 0,
                 key: Any = None) -> tuple[Any, list[Result]]:
        inner, wins = self._unpack(state)
        inner, out = self.inner.on_event(inner, self._windowed(wins, event, ts), ts, seq, key)
        return self._pack(inner, wins), out

    def on_events(self, state: Any, items: Sequence[tuple[int, Any, Mapping[str, Any]]],
                  key: Any, out: list[Result]) -> Any:
        """The engine's hot path: the window values of every event first (they do not depend
        on the matcher), then the events through the matcher's own `on_events`, which fires
        its deadlines before each event as `on_event` callers do."""
        inner, wins = self._unpack(state)
        windowed = self._windowed
        fed = [(ts, seq, windowed(wins, data, ts)) for ts, seq, data in items]
        inner = self.inner.on_events(inner, fed, key, out)
        return self._pack(inner, wins)

    def on_time(self, state: Any, now: int, key: Any = None) -> tuple[Any, list[Result]]:
        if state is None:
            return None, []
        inner, wins = state
        out: list[Result] = []
        deadline = self.inner.next_deadline(inner)
        if deadline is not None and deadline <= now:
            inner, out = self.inner.on_time(inner, now, key)
        for over, st in zip(self.overs, wins, strict=True):
            over.evict(st, now)
        return self._pack(inner, wins), out

    def on_end(self, state: Any, key: Any = None) -> tuple[Any, list[Result]]:
        if state is None:
            return None, []
        inner, wins = state
        inner, out = self.inner.on_end(inner, key)
        return self._pack(inner, wins), out

    def next_deadline(self, state: Any) -> int | None:
        if state is None:
            return None
        inner, wins = state
        times = [t for t in (over.expiry(st) for over, st in zip(self.overs, wins, strict=True))
                 if t is not None]
        deadline = self.inner.next_deadline(inner)
        if deadline is not None:
            times.append(deadline)
        return min(times) if times else None

    def partial_count(self, state: Any) -> int:
        return 0 if state is None or state[0] is None else self.inner.partial_count(state[0])


# -- window rules ----------------------------------------------------------------------------


class WindowRuleMatcher:
    """A window rule. State: None, or a list of open windows ordered by (end, start), each
    [start, end, first_ts, last_ts, accumulators..., rows] (one accumulator per aggregate;
    `rows` only when the rule reads a table: the table rows of the window's last event, which
    its HAVING and MEASURES read, docs/windows.md "Tables in window rules")."""

    def __init__(self, rule: CompiledRule) -> None:
        spec = rule.window
        assert spec is not None
        self.rule = rule
        self.spec: WindowSpec = spec
        self.kind = spec.kind
        self.size, self.advance = spec.size_ms, spec.advance_ms
        where = spec.where.bind() if spec.where is not None else None
        self.where = (lambda ev: where(ev, ()) is True) if where is not None else None
        having = spec.having.bind() if spec.having is not None else None
        self.having = having
        self.aggs = [(a.func, a.row is None, _row(a)) for a in spec.aggs]
        self.measures = tuple((name, e.bind()) for name, e in rule.measures)
        self.rows_at = 4 + len(self.aggs) if rule.lookups else None  # the `rows` slot
        self.stats = _Stats()

    def initial(self) -> Any:
        return None

    @staticmethod
    def is_empty(state: Any) -> bool:
        return state is None

    def _starts(self, ts: int) -> list[int]:
        if self.kind == "TUMBLING":
            return [ts - ts % self.size]
        a = self.advance
        last = ts - ts % a
        first = last
        while first - a > ts - self.size:
            first -= a
        return list(range(first, last + 1, a))

    def _open(self, start: int, end: int, ts: int) -> list[Any]:
        win = [start, end, ts, ts, *(_acc() for _ in self.aggs)]
        if self.rows_at is not None:
            win.append(None)
        return win

    def on_event(self, state: Any, event: Mapping[str, Any], ts: int, seq: Any = 0,
                 key: Any = None) -> tuple[Any, list[Result]]:
        self.stats.events += 1
        if self.where is not None and not self.where(event):
            return state, []
        wins: list[Any] = state if state is not None else []
        if self.kind == "SESSION":
            # An open session has end > ts: the engine closed it otherwise (deadline end - 1).
            if wins:
                win = wins[0]
                win[1] = max(win[1], ts + self.size)
            else:
                win = self._open(ts, ts + self.size, ts)
                wins.append(win)
            targets = [win]
        else:
            by_start = {w[0]: w for w in wins}
            targets = []
            for start in self._starts(ts):
                win = by_start.get(start)
                if win is None:
                    win = self._open(start, start + self.size, ts)
                    wins.append(win)
                targets.append(win)
            wins.sort(key=lambda w: (w[1], w[0]))
        values = [None if row is None else row(event) for _, _, row in self.aggs]
        at = self.rows_at
        rows = getattr(event, "rows", None) if at is not None else None
        for win in targets:
            win[3] = ts
            if at is not None:
                win[at] = rows
            for i, (func, _, _) in enumerate(self.aggs):
                _add(win[4 + i], func, values[i])
        return wins, []

    def on_time(self, state: Any, now: int, key: Any = None) -> tuple[Any, list[Result]]:
        if state is None:
            return None, []
        out: list[Result] = []
        keep = []
        for win in state:
            if win[1] - 1 <= now:
                self._emit(win, key, out)
            else:
                keep.append(win)
        return (keep or None), out

    def _emit(self, win: list[Any], key: Any, out: list[Result]) -> None:
        values = tuple(_value(func, star, win[4 + i])
                       for i, (func, star, _) in enumerate(self.aggs))
        row = Windowed({}, values)
        if self.rows_at is not None:
            row.rows = win[self.rows_at]
        if self.having is not None and self.having(row, ()) is not True:
            return
        measures = {"window_start": win[0], "window_end": win[1]}
        measures.update((name, fn(row, ())) for name, fn in self.measures)
        self.stats.matches += 1
        rule = self.rule
        out.append(Match(rule.id, rule.version, rule.emit.alert, key, (), win[2], win[3],
                         measures))

    def on_end(self, state: Any, key: Any = None) -> tuple[Any, list[Result]]:
        # A window the input never closed is not over: not emitted (docs/windows.md).
        return None, []

    def next_deadline(self, state: Any) -> int | None:
        if not state:
            return None
        return min(w[1] for w in state) - 1

    def partial_count(self, state: Any) -> int:
        return 0 if state is None else len(state)


class _Stats:
    __slots__ = ("dropped", "events", "matches", "max_partial_matches_seen", "timeouts")

    def __init__(self) -> None:
        self.events = self.matches = self.timeouts = self.dropped = 0
        self.max_partial_matches_seen = 0


def python_matcher(rule: CompiledRule, *, max_partial_matches: int | None = None,
                   near_misses: bool = False) -> Any:
    """The Python matcher of any rule: a window rule's, an OVER rule's wrapper, or `Matcher`."""
    if rule.window is not None:
        return WindowRuleMatcher(rule)
    inner = Matcher(rule, max_partial_matches=max_partial_matches, near_misses=near_misses)
    return OverMatcher(rule, inner) if rule.over else inner


__all__ = ["OverMatcher", "WindowRuleMatcher", "python_matcher"]
