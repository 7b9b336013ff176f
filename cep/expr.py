"""Compiled condition and measure expressions: immutable trees that bind into closures.

A tree is built once by `cep.compile.expressions` from the syntax tree, with every name resolved:
fields of the current event, fields of earlier matched events (`A.amount`), `PREV`, `FIRST`,
`LAST` and running aggregates. `bind()` turns a tree into a closure `(event, caps) -> value`
that the matcher calls; nothing is interpreted per event and nothing is ever `eval`ed.

`caps` is the match so far: a tuple of `(var_index, row_index, event, ts, seq)` entries in
match order, *not* including the event being tested. Values follow SQL's three-valued logic:
`None` is NULL (unknown); a comparison with NULL is NULL; `AND`/`OR` are Kleene; a condition
that is NULL does not hold. Missing fields are NULL; division by zero and comparisons between
incompatible types are NULL (a stream must not stop on one odd event).

Trees whose `is_local` is true read only the current event. (`cep.expr_columns` can evaluate
them over whole numpy columns at once; no engine does so today — it is kept with its
differential test, tests/rules/test_expr.py, for a vectorised path.)
"""

from __future__ import annotations

import datetime as dt
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import reduce
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import re2

Caps = tuple[tuple[int, int, Any, int, Any], ...]
Fn = Callable[[Mapping[str, Any], Caps], Any]

_SEQUENCES = (str, bytes, bytearray, list, tuple)


def _mul(a: Any, b: Any) -> Any:
    """`a * b` for numbers. Python's sequence repetition (`'ab' * 3`, `[1] * 3`) is not
    arithmetic here: a number in an event would decide how much memory the engine takes
    (`'x' * 10**12`), so it is a TypeError, which the operator turns into NULL."""
    if isinstance(a, _SEQUENCES) or isinstance(b, _SEQUENCES):
        raise TypeError("* of a string or list")
    return a * b


def _mod(a: Any, b: Any) -> Any:
    """`a % b` for numbers. Python's `%` on a string is printf-style formatting
    (`'%0999999999d' % 1` asks for a gigabyte), not arithmetic: a TypeError (NULL)."""
    if isinstance(a, str | bytes | bytearray):
        raise TypeError("% of a string")
    return a % b


ARITH: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": _mul,
    "/": operator.truediv,
    "%": _mod,
}
COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def _lit(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


class Expr:
    """Base of compiled expressions. Subclasses are frozen dataclasses."""

    __slots__ = ()

    @property
    def is_local(self) -> bool:
        """True when the value depends only on the current event's fields."""
        return all(child.is_local for child in self.children())

    def children(self) -> tuple[Expr, ...]:
        return ()

    def fields(self) -> frozenset[str]:
        """Current-event fields read by this expression (for vectorised evaluation)."""
        out: frozenset[str] = frozenset()
        for child in self.children():
            out |= child.fields()
        return out

    def bind(self) -> Fn:
        raise NotImplementedError

    def test(self, event: Mapping[str, Any], caps: Caps = ()) -> bool:
        """Convenience: does this condition hold (True, not False or NULL)?"""
        return self.bind()(event, caps) is True


@dataclass(frozen=True, slots=True)
class Const(Expr):
    value: Any

    def bind(self) -> Fn:
        value = self.value
        return lambda e, c: value

    def __str__(self) -> str:
        return _lit(self.value)


@dataclass(frozen=True, slots=True)
class Field(Expr):
    """A field of the current event (in MEASURES: of the last matched event)."""

    name: str

    def fields(self) -> frozenset[str]:
        return frozenset((self.name,))

    def bind(self) -> Fn:
        name = self.name
        return lambda e, c: e.get(name)

    def __str__(self) -> str:
        return self.name if self.name.isidentifier() else f"`{self.name}`"


def _ident(name: str) -> str:
    return name if name.isidentifier() else "`" + name.replace("`", "``") + "`"


@dataclass(frozen=True, slots=True)
class Path(Expr):
    """A nested JSON field: `name:keys[0]:keys[1]...` (`payload:amount`). NULL when a level is
    missing, null or not an object; the leaf's value as the event holds it otherwise."""

    name: str
    keys: tuple[str, ...]

    def fields(self) -> frozenset[str]:
        return frozenset((self.name,))

    def bind(self) -> Fn:
        name, keys = self.name, self.keys
        if len(keys) == 1:
            (key,) = keys

            def one(e: Mapping[str, Any], c: Caps) -> Any:
                v = e.get(name)
                return v.get(key) if isinstance(v, dict) else None

            return one

        def walk(e: Mapping[str, Any], c: Caps) -> Any:
            v = e.get(name)
            for k in keys:
                if not isinstance(v, dict):
                    return None
                v = v.get(k)
            return v

        return walk

    def __str__(self) -> str:
        return ":".join(_ident(p) for p in (self.name, *self.keys))


class EventWithRows(dict):  # type: ignore[type-arg]
    """An event as the engine feeds it to the matchers of rules that read tables: the event's
    own fields (the dict), and `rows`, the table rows looked up for it as of its time, by
    (table, event field); a missing row is None (docs/tables.md). Serialised, it is the event."""

    __slots__ = ("rows",)

    def __init__(self, data: Mapping[str, Any], rows: dict[tuple[str, str], Any]) -> None:
        super().__init__(data)
        self.rows = rows

    def __reduce__(self) -> Any:
        return (EventWithRows, (dict(self), self.rows))


@dataclass(frozen=True, slots=True)
class Lookup(Expr):
    """`table[field].column`: `column` of the row of `table` keyed by the event's `field`, as
    the engine looked it up for this event (`EventWithRows`); NULL without a row."""

    table: str
    field: str
    column: str

    @property
    def is_local(self) -> bool:
        return False  # not a plain field of the event: no vectorised evaluation

    def fields(self) -> frozenset[str]:
        return frozenset()

    def bind(self) -> Fn:
        slot, column = (self.table, self.field), self.column

        def get(e: Mapping[str, Any], c: Caps) -> Any:
            rows = getattr(e, "rows", None)
            if rows is None:
                return None
            row = rows.get(slot)
            return None if row is None else row.get(column)

        return get

    def __str__(self) -> str:
        return f"{_ident(self.table)}[{_ident(self.field)}].{_ident(self.column)}"


def _row_fn(row: Expr) -> Callable[[Mapping[str, Any]], Any]:
    fn = row.bind()
    return lambda ev: fn(ev, ())


@dataclass(frozen=True, slots=True)
class VarRow(Expr):
    """`LAST(A.x)` / `A.x` / `FIRST(A.x)`: `row` evaluated on the last/first event matched to A.

    With `include_current` (inside A's own DEFINE) the event being tested counts as the last A.
    """

    var: int
    var_name: str
    which: str  # "LAST" | "FIRST"
    row: Expr
    include_current: bool

    @property
    def is_local(self) -> bool:
        return False

    def fields(self) -> frozenset[str]:
        return frozenset()

    def bind(self) -> Fn:
        var, row = self.var, _row_fn(self.row)
        if self.which == "LAST":
            if self.include_current:
                return lambda e, c: row(e)

            def last(e: Mapping[str, Any], c: Caps) -> Any:
                for i in range(len(c) - 1, -1, -1):
                    if c[i][0] == var:
                        return row(c[i][2])
                return None

            return last
        current = self.include_current

        def first(e: Mapping[str, Any], c: Caps) -> Any:
            for entry in c:
                if entry[0] == var:
                    return row(entry[2])
            return row(e) if current else None

        return first

    def __str__(self) -> str:
        inner = str(self.row)
        return (
            f"{self.which}({self.var_name}.{inner})"
            if self.which == "FIRST"
            else f"{self.var_name}.{inner}"
        )


@dataclass(frozen=True, slots=True)
class Prev(Expr):
    """`PREV(x, n)`: `row` on the n-th matched event before the current one (NULL if none)."""

    row: Expr
    n: int
    offset: int  # 0 in DEFINE (current event not in caps); 1 in MEASURES (it is)

    @property
    def is_local(self) -> bool:
        return False

    def fields(self) -> frozenset[str]:
        return frozenset()

    def bind(self) -> Fn:
        row, back = _row_fn(self.row), self.n + self.offset

        def prev(e: Mapping[str, Any], c: Caps) -> Any:
            return row(c[-back][2]) if len(c) >= back else None

        return prev

    def __str__(self) -> str:
        return f"PREV({self.row})" if self.n == 1 else f"PREV({self.row}, {self.n})"


@dataclass(frozen=True, slots=True)
class Agg(Expr):
    """Running aggregate over the events matched to `var` (all events when var is None)."""

    func: str  # SUM AVG COUNT MIN MAX
    var: int | None
    var_name: str | None
    row: Expr | None  # None: COUNT(*) / COUNT(A)
    include_current: bool

    @property
    def is_local(self) -> bool:
        return False

    def fields(self) -> frozenset[str]:
        return frozenset()

    def bind(self) -> Fn:
        var, func, current = self.var, self.func, self.include_current
        row = _row_fn(self.row) if self.row is not None else None

        def values(e: Mapping[str, Any], c: Caps) -> list[Any]:
            events = [x[2] for x in c if var is None or x[0] == var]
            if current:
                events.append(e)
            if row is None:
                return events
            return [v for v in map(row, events) if v is not None]

        def agg(e: Mapping[str, Any], c: Caps) -> Any:
            vals = values(e, c)
            if func == "COUNT":
                return len(vals)
            if not vals:
                return None
            try:
                if func == "SUM":
                    return _sum(vals)
                if func == "AVG":
                    return _sum(vals) / len(vals)
                return min(vals) if func == "MIN" else max(vals)
            except TypeError:
                return None

        return agg

    def __str__(self) -> str:
        if self.row is None:
            return f"{self.func}({self.var_name}.*)" if self.var_name else f"{self.func}(*)"
        inner = str(self.row)
        return f"{self.func}({self.var_name}.{inner})" if self.var_name else f"{self.func}({inner})"


def _sum(vals: list[Any]) -> Any:
    """`0 + v1 + v2 + ...` left to right with Python's `+`: Python 3.11's `sum()`, which the
    core reproduces. Not the builtin: from Python 3.12 it adds floats with compensated
    summation (sum([1e16, 1.0, -1e16]) is 1.0 there, 0.0 here), which would make the answer
    depend on the Python version and differ from the core's."""
    return reduce(operator.add, vals, 0)


class Windowed(dict):  # type: ignore[type-arg]
    """An event with the window values computed for it (`win`, by `WindowAgg` slot), and the
    table rows looked up for it when it came as an `EventWithRows` (`rows`, read by `Lookup`):
    a plain dict of the user's fields everywhere else (JSON, `dict(e)`, equality)."""

    __slots__ = ("rows", "win")

    def __init__(self, data: Mapping[str, Any], win: tuple[Any, ...]) -> None:
        super().__init__(data)
        self.win = win
        self.rows = getattr(data, "rows", None)

    def __reduce__(self) -> Any:
        return (_windowed, (dict(self), self.win, self.rows))


def _windowed(data: dict[str, Any], win: tuple[Any, ...], rows: Any) -> Windowed:
    event = Windowed(data, win)
    event.rows = rows
    return event


@dataclass(frozen=True, slots=True)
class WindowAgg(Expr):
    """A window aggregate's value, computed by the runtime (`cep.runtime.windows`) and carried
    by the event (`Windowed.win[slot]`): a sliding `AGG(x) OVER d` in a pattern rule, or an
    aggregate of the window in a window rule's HAVING and MEASURES."""

    slot: int
    text: str

    @property
    def is_local(self) -> bool:
        # The value rides on the event being tested: the same for every partial match, so the
        # matcher may compute a condition reading it once per event (it reads no other event).
        return True

    def fields(self) -> frozenset[str]:
        return frozenset()

    def bind(self) -> Fn:
        slot = self.slot

        def value(e: Mapping[str, Any], c: Caps) -> Any:
            win = getattr(e, "win", None)
            return None if win is None else win[slot]

        return value

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class Neg(Expr):
    operand: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.operand,)

    def bind(self) -> Fn:
        f = self.operand.bind()

        def neg(e: Mapping[str, Any], c: Caps) -> Any:
            v = f(e, c)
            try:
                return None if v is None or isinstance(v, bool) else -v
            except TypeError:
                return None

        return neg

    def __str__(self) -> str:
        return f"-{self.operand}"


@dataclass(frozen=True, slots=True)
class Arith(Expr):
    op: str
    left: Expr
    right: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.left, self.right)

    def bind(self) -> Fn:
        fl, fr, op = self.left.bind(), self.right.bind(), ARITH[self.op]

        def arith(e: Mapping[str, Any], c: Caps) -> Any:
            a = fl(e, c)
            if a is None:
                return None
            b = fr(e, c)
            if b is None:
                return None
            try:
                return op(a, b)
            except (TypeError, ZeroDivisionError, OverflowError):
                return None

        return arith

    def __str__(self) -> str:
        return f"({self.left} {self.op} {self.right})"


@dataclass(frozen=True, slots=True)
class Compare(Expr):
    op: str
    left: Expr
    right: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.left, self.right)

    def bind(self) -> Fn:
        op = COMPARE[self.op]
        fl = self.left.bind()
        if isinstance(self.right, Const) and self.right.value is not None:
            const = self.right.value

            def compare_const(e: Mapping[str, Any], c: Caps) -> Any:
                a = fl(e, c)
                if a is None:
                    return None
                try:
                    return bool(op(a, const))
                except TypeError:
                    return None

            return compare_const
        fr = self.right.bind()

        def compare(e: Mapping[str, Any], c: Caps) -> Any:
            a = fl(e, c)
            if a is None:
                return None
            b = fr(e, c)
            if b is None:
                return None
            try:
                return bool(op(a, b))
            except TypeError:
                return None

        return compare

    def __str__(self) -> str:
        return f"{self.left} {self.op} {self.right}"


@dataclass(frozen=True, slots=True)
class And(Expr):
    left: Expr
    right: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.left, self.right)

    def bind(self) -> Fn:
        fl, fr = self.left.bind(), self.right.bind()

        def and_(e: Mapping[str, Any], c: Caps) -> Any:
            a = fl(e, c)
            if a is False:
                return False
            b = fr(e, c)
            if b is False:
                return False
            return True if (a is True and b is True) else None

        return and_

    def __str__(self) -> str:
        return f"({self.left} AND {self.right})"


@dataclass(frozen=True, slots=True)
class Or(Expr):
    left: Expr
    right: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.left, self.right)

    def bind(self) -> Fn:
        fl, fr = self.left.bind(), self.right.bind()

        def or_(e: Mapping[str, Any], c: Caps) -> Any:
            a = fl(e, c)
            if a is True:
                return True
            b = fr(e, c)
            if b is True:
                return True
            return False if (a is False and b is False) else None

        return or_

    def __str__(self) -> str:
        return f"({self.left} OR {self.right})"


@dataclass(frozen=True, slots=True)
class Not(Expr):
    operand: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.operand,)

    def bind(self) -> Fn:
        f = self.operand.bind()

        def not_(e: Mapping[str, Any], c: Caps) -> Any:
            v = f(e, c)
            return None if v is None else (v is not True)

        return not_

    def __str__(self) -> str:
        return f"NOT {self.operand}"


@dataclass(frozen=True, slots=True)
class IsNull(Expr):
    operand: Expr
    negated: bool

    def children(self) -> tuple[Expr, ...]:
        return (self.operand,)

    def bind(self) -> Fn:
        f, negated = self.operand.bind(), self.negated
        return lambda e, c: (f(e, c) is None) is not negated

    def __str__(self) -> str:
        return f"{self.operand} IS {'NOT ' if self.negated else ''}NULL"


@dataclass(frozen=True, slots=True)
class InList(Expr):
    operand: Expr
    items: tuple[Expr, ...]
    negated: bool

    def children(self) -> tuple[Expr, ...]:
        return (self.operand, *self.items)

    def bind(self) -> Fn:
        f, negated = self.operand.bind(), self.negated
        if all(isinstance(i, Const) and i.value is not None for i in self.items):
            values = [i.value for i in self.items if isinstance(i, Const)]
            try:
                lookup: Any = frozenset(values)
            except TypeError:
                lookup = values

            def in_const(e: Mapping[str, Any], c: Caps) -> Any:
                v = f(e, c)
                if v is None:
                    return None
                try:
                    return (v in lookup) is not negated
                except TypeError:
                    return None

            return in_const
        fs = [i.bind() for i in self.items]

        def in_list(e: Mapping[str, Any], c: Caps) -> Any:
            v = f(e, c)
            if v is None:
                return None
            unknown = False
            for g in fs:
                w = g(e, c)
                if w is None:
                    unknown = True
                elif w == v:
                    return not negated
            return None if unknown else negated

        return in_list

    def __str__(self) -> str:
        items = ", ".join(map(str, self.items))
        return f"{self.operand} {'NOT ' if self.negated else ''}IN ({items})"


@dataclass(frozen=True, slots=True)
class StrOp(Expr):
    """CONTAINS, STARTS WITH, ENDS WITH on strings; MATCHES with a google-re2 regex."""

    op: str
    operand: Expr
    arg: Expr
    negated: bool
    # The compiled re2 pattern for MATCHES with a literal pattern: out of repr and equality
    # (its repr holds an address; a rule's hash, cep.runtime.bind.rule_hash, is made of reprs).
    regex: Any = field(default=None, repr=False, compare=False)

    def children(self) -> tuple[Expr, ...]:
        return (self.operand, self.arg)

    def bind(self) -> Fn:
        f, g, negated, op = self.operand.bind(), self.arg.bind(), self.negated, self.op
        regex = self.regex

        def test(v: str, w: str) -> bool:
            if op == "CONTAINS":
                return w in v
            if op == "STARTS WITH":
                return v.startswith(w)
            if op == "ENDS WITH":
                return v.endswith(w)
            pattern = regex if regex is not None else re2.compile(w)
            return pattern.search(v) is not None

        def strop(e: Mapping[str, Any], c: Caps) -> Any:
            v = f(e, c)
            if not isinstance(v, str):
                return None
            w = g(e, c)
            if not isinstance(w, str):
                return None
            try:
                return test(v, w) is not negated
            except re2.error:
                return None

        return strop

    def __str__(self) -> str:
        return f"{self.operand} {'NOT ' if self.negated else ''}{self.op} {self.arg}"


def _coalesce(*xs: Any) -> Any:
    return next((x for x in xs if x is not None), None)


def _int(x: Any) -> int:
    if isinstance(x, bool) or not isinstance(x, int | float) or x != x:
        raise TypeError("not a number")
    return int(x)


def _substr(s: str, start: Any, length: Any = None) -> str:
    """SQL's SUBSTRING: 1-based; positions before 1 count towards the length."""
    first = _int(start)
    end = None if length is None else first + _int(length)
    if end is not None and end <= max(first, 1):
        return ""
    return s[max(first, 1) - 1 : None if end is None else end - 1]


def _split_part(s: str, delim: str, n: Any) -> str:
    """The n-th (1-based) piece of `s` split on `delim`; '' past the last piece."""
    k = _int(n)
    if k < 1 or not delim:
        raise ValueError("SPLIT_PART takes a non-empty delimiter and a position from 1")
    parts = s.split(delim)
    return parts[k - 1] if k <= len(parts) else ""


def _concat(*xs: Any) -> str:
    if not all(isinstance(x, str) for x in xs):
        raise TypeError("CONCAT joins strings")
    return "".join(xs)


_ZONES: dict[str, Any] = {}


def zone(name: str) -> Any:
    """An IANA time zone by name (cached); raises ValueError for an unknown one."""
    found = _ZONES.get(name)
    if found is None:
        try:
            found = _ZONES[name] = ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown time zone {name!r}") from exc
    return found


def _moment(t: Any, tz: str) -> dt.datetime:
    """Event time (epoch ms) or an ISO-8601 string (no offset = UTC), in the zone `tz`."""
    if isinstance(t, str):
        parsed = dt.datetime.fromisoformat(t.replace("Z", "+00:00"))
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=dt.UTC)
        return parsed.astimezone(zone(tz))
    return dt.datetime.fromtimestamp(_int(t) / 1000, tz=zone(tz))


def _part(get: Callable[[dt.datetime], int]) -> Callable[..., int]:
    def part(t: Any, tz: str = "UTC") -> int:
        return get(_moment(t, tz))
    return part


# Date parts of an event time (epoch ms) or ISO-8601 string, in UTC or a given IANA zone.
DATE_PARTS: dict[str, Callable[[dt.datetime], int]] = {
    "YEAR": lambda d: d.year,
    "MONTH": lambda d: d.month,
    "DAY_OF_MONTH": lambda d: d.day,
    "DAY_OF_WEEK": lambda d: d.isoweekday(),  # ISO: Monday 1 ... Sunday 7
    "HOUR": lambda d: d.hour,
    "MINUTE": lambda d: d.minute,
}

FUNCS: dict[str, tuple[int, int, Callable[..., Any]]] = {
    # name: (min args, max args, implementation on non-NULL arguments). An argument that is
    # NULL makes the result NULL (except COALESCE); so does an argument of the wrong runtime
    # type or value (an event must not stop the stream).
    "ABS": (1, 1, abs),
    "LOWER": (1, 1, str.lower),
    "UPPER": (1, 1, str.upper),
    "LENGTH": (1, 1, len),
    "COALESCE": (1, 16, _coalesce),
    "SUBSTR": (2, 3, _substr),
    "REPLACE": (3, 3, str.replace),
    "TRIM": (1, 1, str.strip),
    "LTRIM": (1, 1, str.lstrip),
    "RTRIM": (1, 1, str.rstrip),
    "CONCAT": (2, 16, _concat),
    "SPLIT_PART": (3, 3, _split_part),
    **{name: (1, 2, _part(get)) for name, get in DATE_PARTS.items()},
}


@dataclass(frozen=True, slots=True)
class Func(Expr):
    name: str
    args: tuple[Expr, ...]

    def children(self) -> tuple[Expr, ...]:
        return self.args

    def bind(self) -> Fn:
        impl = FUNCS[self.name][2]
        fs = [a.bind() for a in self.args]
        if self.name == "COALESCE":
            return lambda e, c: _coalesce(*(g(e, c) for g in fs))
        if len(fs) == 1:
            (f,) = fs

            def call(e: Mapping[str, Any], c: Caps) -> Any:
                v = f(e, c)
                if v is None:
                    return None
                try:
                    return impl(v)
                except (TypeError, ValueError, OverflowError, OSError):
                    return None

            return call

        def call_n(e: Mapping[str, Any], c: Caps) -> Any:
            vs = [g(e, c) for g in fs]
            if any(v is None for v in vs):
                return None
            try:
                return impl(*vs)
            except (TypeError, ValueError, OverflowError, OSError, AttributeError):
                return None

        return call_n

    def __str__(self) -> str:
        return f"{self.name}({', '.join(map(str, self.args))})"
