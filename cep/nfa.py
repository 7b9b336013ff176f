"""The compiled, immutable artefacts the runtime consumes: `Nfa`, `CompiledRule`, `RuleSet`.

An `Nfa` is validated once in its constructor and never changes. Its states are *consuming*
states (each tests one pattern variable against one event) plus, for patterns that end in a
negation, one *absence* state that waits for a deadline. All epsilon moves are resolved at
compile time: every state lists, in preference order, where a thread goes after it consumes an
event (`next`), and `initial` lists the states a new match can start in. `ACCEPT` (-1) in `next`
means the pattern is complete.

Connectors say what a thread waiting in a state does with an event that it does not consume:
STRICT - dies; RELAXED (`->`) - skips events that fail the state's condition; ANY (`->>`) - may
skip any event (the thread forks: one copy consumes, one keeps waiting).
Negations compile to guards on the state that follows them: `not_next` variables are tested on
the first event after arriving (the thread dies if one holds), `not_followed` variables on every
event the thread skips. `after_first` is where the thread moves after its first event when
`not_next` guards are armed (a copy of the state without them).

This module imports neither the parser nor the syntax tree: `cep.runtime` needs only this and
`cep.expr`. `Conn` is defined here; `cep.ast` uses it for patterns.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from cep.errors import CepError
from cep.expr import Expr

ACCEPT = -1


class Conn(enum.IntEnum):
    """How a pattern step is entered from the previously matched event."""

    STRICT = 0  # juxtaposition: the very next event (MATCH_RECOGNIZE, Flink `next`)
    RELAXED = 1  # `->`: the first later event that satisfies the step (Flink `followedBy`)
    ANY = 2  # `->>`: any later event that satisfies the step (Flink `followedByAny`)

    @property
    def symbol(self) -> str:
        return ("", "->", "->>")[self]


class StateKind(enum.Enum):
    STEP = "step"
    ABSENCE = "absence"


class NfaError(CepError):
    """An NFA that breaks an invariant (a compiler bug, never a user error)."""


@dataclass(frozen=True, slots=True)
class State:
    id: int
    kind: StateKind
    var: int  # variable tested (STEP); -1 for ABSENCE
    conn: Conn
    next: tuple[int, ...]  # after consuming: targets in preference order (ACCEPT allowed)
    not_next: tuple[int, ...] = ()
    not_followed: tuple[int, ...] = ()
    after_first: int = -1  # state after the first event when not_next is armed (-1: self)
    label: str = ""  # where this state comes from in the pattern, for people


class Skip(enum.Enum):
    PAST_LAST_ROW = "PAST LAST ROW"
    TO_NEXT_ROW = "TO NEXT ROW"
    TO_FIRST = "TO FIRST"
    TO_LAST = "TO LAST"
    ALL_MATCHES = "ALL MATCHES"


@dataclass(frozen=True, slots=True)
class SkipStrategy:
    kind: Skip
    var: int | None = None
    var_name: str | None = None

    def __str__(self) -> str:
        if self.kind is Skip.ALL_MATCHES:
            return "ALL MATCHES"
        return f"AFTER MATCH SKIP {self.kind.value}" + (
            f" {self.var_name}" if self.var_name else ""
        )


def _ms(ms: int | None) -> str:
    if ms is None:
        return "-"
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


@dataclass(frozen=True, slots=True)
class Nfa:
    vars: tuple[str, ...]
    conditions: tuple[Expr | None, ...]  # per variable; None: matches any event
    states: tuple[State, ...]
    initial: tuple[int, ...]
    within_ms: int | None = None
    step_ms: int | None = None
    pattern: str = ""  # the pattern as written, normalised

    def __post_init__(self) -> None:
        n = len(self.states)
        if len(self.conditions) != len(self.vars):
            raise NfaError("one condition slot per variable expected")
        if not self.initial:
            raise NfaError("an NFA needs at least one initial state")
        for i, st in enumerate(self.states):
            if st.id != i:
                raise NfaError(f"state {i} has id {st.id}")
            targets = (*st.next, st.after_first) if st.after_first >= 0 else st.next
            for t in targets:
                if t != ACCEPT and not 0 <= t < n:
                    raise NfaError(f"state q{i} points at missing state {t}")
            for v in (*st.not_next, *st.not_followed):
                if not 0 <= v < len(self.vars):
                    raise NfaError(f"state q{i} guards unknown variable {v}")
            if st.kind is StateKind.STEP:
                if not 0 <= st.var < len(self.vars) or not st.next:
                    raise NfaError(f"step state q{i} needs a variable and successors")
            elif st.next or not (st.not_next or st.not_followed):
                raise NfaError(f"absence state q{i} must have guards and no successors")
            if st.not_next and st.after_first < 0:
                raise NfaError(f"state q{i} has not-next guards but no disarmed copy")
        for s in self.initial:
            if not 0 <= s < n or self.states[s].kind is not StateKind.STEP:
                raise NfaError(f"initial state {s} must be a step state")
        for ms in (self.within_ms, self.step_ms):
            if ms is not None and ms <= 0:
                raise NfaError("time limits must be positive")

    @property
    def history_free(self) -> bool:
        """No condition reads earlier events: threads in the same state are interchangeable."""
        return all(c is None or c.is_local for c in self.conditions)

    @property
    def has_absence(self) -> bool:
        return any(s.kind is StateKind.ABSENCE for s in self.states)

    def _target(self, t: int) -> str:
        return "ACCEPT" if t == ACCEPT else f"q{t}"

    def __str__(self) -> str:
        lines = [
            f"pattern: {self.pattern}",
            f"within: {_ms(self.within_ms)}  step: {_ms(self.step_ms)}",
            "start: " + " | ".join(self._target(s) for s in self.initial),
            f"{'state':<6} {'var':<10} {'enter':<8} {'on match':<22} guards",
        ]
        for st in self.states:
            var = self.vars[st.var] if st.var >= 0 else "(absence)"
            nxt = " | ".join(self._target(t) for t in st.next) or "-"
            guards = [f"not next {self.vars[v]}" for v in st.not_next]
            guards += [f"not followed by {self.vars[v]}" for v in st.not_followed]
            if st.after_first >= 0 and st.after_first != st.id:
                guards.append(f"then q{st.after_first}")
            conn = {Conn.STRICT: "strict", Conn.RELAXED: "->", Conn.ANY: "->>"}[st.conn]
            lines.append(f"q{st.id:<5} {var:<10} {conn:<8} {nxt:<22} {', '.join(guards)}".rstrip())
        lines.append("define:")
        for name, cond in zip(self.vars, self.conditions, strict=True):
            local = "" if cond is None or not cond.is_local else "  [local]"
            lines.append(f"  {name}: {cond if cond is not None else 'TRUE (any event)'}{local}")
        return "\n".join(lines)

    def to_dot(self, name: str = "nfa") -> str:
        def q(text: str) -> str:
            return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

        out = [
            f"digraph {q(name)} {{",
            "  rankdir=LR;",
            '  node [shape=circle fontname="Helvetica"];',
            "  start [shape=point];",
            '  ACCEPT [shape=doublecircle label="accept"];',
        ]
        for st in self.states:
            if st.kind is StateKind.ABSENCE:
                guards = ", ".join(self.vars[v] for v in (*st.not_next, *st.not_followed))
                out.append(
                    f"  q{st.id} [shape=octagon label={q(f'q{st.id}: absence of {guards}')}];"
                )
                out.append(f"  q{st.id} -> ACCEPT [style=dashed label={q('deadline passes')}];")
                continue
            notes = [f"not next {self.vars[v]}" for v in st.not_next]
            notes += [f"not followed by {self.vars[v]}" for v in st.not_followed]
            text = f"q{st.id}: {self.vars[st.var]}" + "".join(f"\n{g}" for g in notes)
            label = q(text).replace("\n", "\\n")  # DOT's line break inside a label
            out.append(f"  q{st.id} [label={label}{' shape=box' if notes else ''}];")
            if st.conn is not Conn.STRICT:
                out.append(
                    f"  q{st.id} -> q{st.id} [style=dotted label={q('skip ' + st.conn.symbol)}];"
                )
            for rank, t in enumerate(st.next):
                label = q(f"{self.vars[st.var]} #{rank + 1}")
                out.append(f"  q{st.id} -> {self._target(t)} [label={label}];")
            if st.after_first >= 0 and st.after_first != st.id:
                label = q("first event skipped")
                out.append(f"  q{st.id} -> q{st.after_first} [style=dotted label={label}];")
        for rank, s in enumerate(self.initial):
            out.append(f"  start -> q{s} [label={q(f'#{rank + 1}')}];")
        out.append("}")
        return "\n".join(out)


# ------------------------------------------------------------------------------- compiled rules


@dataclass(frozen=True, slots=True)
class FieldSpec:
    name: str
    type: str  # STRING INT FLOAT BOOL STRUCT
    fields: tuple[FieldSpec, ...] | None = None  # a STRUCT's sub-fields (nested JSON object)

    def __repr__(self) -> str:  # as before STRUCTs when `fields` is None (rule hashes hold it)
        inner = "" if self.fields is None else f", fields={self.fields!r}"
        return f"FieldSpec(name={self.name!r}, type={self.type!r}{inner})"


@dataclass(frozen=True, slots=True)
class StreamSpec:
    name: str
    time_field: str  # epoch milliseconds (int)
    lateness_ms: int
    fields: tuple[FieldSpec, ...] | None  # None: no declared schema


@dataclass(frozen=True, slots=True)
class TableSpec:
    """A declared reference table (docs/tables.md). `rows`: a static (FILE) table's rows,
    read when the rules are compiled; a KAFKA table's rows arrive with the events."""

    name: str
    key: str  # the key column
    time_field: str | None  # the version's valid-from time (KAFKA); None: static
    fields: tuple[FieldSpec, ...]
    source_kind: str  # KAFKA | FILE
    source: str  # topic or path (as written)
    rows: tuple[dict[str, Any], ...] = field(default=(), compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Destination:
    kind: str  # KAFKA | REDIS
    target: str


@dataclass(frozen=True, slots=True)
class EmitSpec:
    """A rule's compiled EMIT (or ON TIMEOUT EMIT) clause: the alert name and where it goes.
    (Not `cep.runtime.engine.Output`, which is what the engine returns per call.)"""

    alert: str
    destinations: tuple[Destination, ...]


# Sub-bucket sizes of a sliding window, largest first (docs/windows.md).
BUCKET_SIZES = (86_400_000, 3_600_000, 600_000, 60_000, 10_000, 1000, 100, 10, 1)
MIN_BUCKETS = 20


def bucket_ms(width_ms: int) -> int:
    """The largest of BUCKET_SIZES that cuts `width_ms` into at least MIN_BUCKETS buckets."""
    for r in BUCKET_SIZES:
        if width_ms % r == 0 and width_ms // r >= MIN_BUCKETS:
            return r
    return 1


@dataclass(frozen=True, slots=True)
class AggSpec:
    """One aggregate of a window: COUNT(*) (row None), COUNT(x), SUM, AVG, MIN, MAX of `row`
    (an expression over one event's fields)."""

    func: str
    row: Expr | None

    def __str__(self) -> str:
        return f"{self.func}({'*' if self.row is None else self.row})"


@dataclass(frozen=True, slots=True)
class OverSpec:
    """A sliding aggregate `AGG(x) OVER width [EXCLUDE CURRENT ROW]` over the key's history,
    kept in buckets of `bucket_ms` (docs/windows.md)."""

    agg: AggSpec
    width_ms: int
    exclude_current: bool = False

    @property
    def bucket_ms(self) -> int:
        return bucket_ms(self.width_ms)

    def __str__(self) -> str:
        return (f"{self.agg} OVER {_ms(self.width_ms)}"
                + (" EXCLUDE CURRENT ROW" if self.exclude_current else ""))


@dataclass(frozen=True, slots=True)
class WindowSpec:
    """A window rule's WINDOW, WHERE, HAVING and the aggregates its HAVING and MEASURES read
    (`cep.expr.WindowAgg` slots index `aggs`)."""

    kind: str  # TUMBLING | HOPPING | SESSION
    size_ms: int  # SESSION: the gap
    advance_ms: int  # TUMBLING: = size; SESSION: = size (unused)
    where: Expr | None
    having: Expr | None
    aggs: tuple[AggSpec, ...]

    def __str__(self) -> str:
        if self.kind == "SESSION":
            head = f"WINDOW SESSION ({_ms(self.size_ms)})"
        elif self.kind == "HOPPING":
            head = f"WINDOW HOPPING (SIZE {_ms(self.size_ms)}, ADVANCE BY {_ms(self.advance_ms)})"
        else:
            head = f"WINDOW TUMBLING (SIZE {_ms(self.size_ms)})"
        return "\n".join([
            head,
            f"where: {self.where if self.where is not None else 'TRUE (every event)'}",
            f"having: {self.having if self.having is not None else 'TRUE (every window)'}",
            "aggregates: " + ", ".join(f"#{i} {a}" for i, a in enumerate(self.aggs)),
        ])


@dataclass(frozen=True, slots=True)
class CompiledRule:
    id: str
    version: int
    title: str | None
    description: str
    tags: tuple[str, ...]
    severity: str
    enabled: bool
    stream: StreamSpec
    key_field: str | None
    nfa: Nfa
    skip: SkipStrategy
    measures: tuple[tuple[str, Expr], ...]
    emit: EmitSpec
    on_timeout: EmitSpec | None
    max_partial_matches: int | None
    allow_unbounded: bool
    source: str  # "path:line" of the RULE keyword
    # Table lookups the rule's expressions make, as (table, event field): the engine captures
    # these rows for each event it feeds (docs/tables.md).
    lookups: tuple[tuple[str, str], ...] = ()
    # Sliding aggregates (`AVG(amount) OVER 30d`) its conditions and measures read, by the
    # slot of their `cep.expr.WindowAgg` (docs/windows.md).
    over: tuple[OverSpec, ...] = ()
    # A window rule (WINDOW ... HAVING ...): `nfa` is then a one-state stand-in for its WHERE.
    window: WindowSpec | None = None

    @property
    def within_ms(self) -> int | None:
        return self.nfa.within_ms

    @property
    def step_ms(self) -> int | None:
        return self.nfa.step_ms

    def explain(self) -> str:
        def out(o: EmitSpec) -> str:
            dests = ", ".join(f"{d.kind} {d.target!r}" for d in o.destinations)
            return f"{o.alert!r}" + (f" to {dests}" if dests else "")

        head = [
            f"rule {self.id} v{self.version}" + (f" — {self.title}" if self.title else ""),
            f"severity {self.severity}; {'enabled' if self.enabled else 'disabled'}"
            + (f"; tags {', '.join(self.tags)}" if self.tags else ""),
            f"from {self.stream.name} (time {self.stream.time_field}, lateness "
            f"{_ms(self.stream.lateness_ms)}) partition by {self.key_field or '-'}",
            f"{self.skip}; emit {out(self.emit)}"
            + (f"; on timeout emit {out(self.on_timeout)}" if self.on_timeout else ""),
        ]
        if self.max_partial_matches is not None or self.allow_unbounded:
            head.append(
                f"max partial matches {self.max_partial_matches or 'default'}"
                + ("; unbounded allowed" if self.allow_unbounded else "")
            )
        body = str(self.window) if self.window is not None else str(self.nfa)
        if self.over:
            body += "\nover:\n" + "\n".join(f"  #{i} {o}" for i, o in enumerate(self.over))
        measures = [f"  {name}: {expr}" for name, expr in self.measures]
        return "\n".join(head + [body] + (["measures:", *measures] if measures else []))


@dataclass(frozen=True, slots=True)
class RuleSet:
    rules: tuple[CompiledRule, ...]
    streams: tuple[StreamSpec, ...] = field(default=())
    tables: tuple[TableSpec, ...] = field(default=())

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for r in self.rules:
            if r.id in seen:
                raise NfaError(f"duplicate rule id {r.id!r}")
            seen.add(r.id)

    def __iter__(self) -> Any:
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def get(self, rule_id: str) -> CompiledRule:
        for r in self.rules:
            if r.id == rule_id:
                return r
        raise KeyError(rule_id)

    def for_stream(self, stream: str) -> tuple[CompiledRule, ...]:
        return tuple(r for r in self.rules if r.stream.name == stream and r.enabled)
