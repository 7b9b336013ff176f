"""The rule-file syntax tree: what the grammar builds, before any checking.

Every node is a frozen, slotted dataclass holding tuples (never lists) and a `span` that is
excluded from equality, so two trees parsed from differently formatted texts compare equal.
Passes in `cep.compile` read these nodes and build new objects; nothing mutates a tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cep.errors import Span
from cep.nfa import Conn  # a pattern's connectors are the NFA's (defined there for the runtime)

NOSPAN = Span("<none>", 0, 0)


def _span() -> Span:
    return field(default=NOSPAN, compare=False, repr=False)  # type: ignore[no-any-return]




# ---------------------------------------------------------------------------------- expressions


@dataclass(frozen=True, slots=True)
class Literal:
    value: object  # int, float, str, bool or None
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Name:
    """`field`, `` `odd field` ``, `VAR.field`, or `VAR` alone (only inside COUNT).

    `path`: the keys of a nested JSON field after the field, `payload:amount` is
    `Name(("payload",), ("amount",))` and `b.device:geo:country` is
    `Name(("b", "device"), ("geo", "country"))` (docs/rule-language.md, "Nested fields")."""

    parts: tuple[str, ...]
    path: tuple[str, ...] = ()
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Star:
    """`*` or `VAR.*` inside COUNT."""

    var: str | None
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Over:
    """`OVER 30d [EXCLUDE CURRENT ROW]` after an aggregate: a sliding window over the key's
    history (docs/windows.md)."""

    width: Duration
    exclude_current: bool = False
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Call:
    func: str  # upper-cased
    args: tuple[Expr, ...]
    span: Span = _span()
    over: Over | None = None  # `AGG(x) OVER 30d`: a sliding window aggregate


@dataclass(frozen=True, slots=True)
class Unary:
    op: str  # "-" or "NOT"
    operand: Expr
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Binary:
    op: str  # + - * / % = != < <= > >= AND OR
    left: Expr
    right: Expr
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class IsNull:
    operand: Expr
    negated: bool
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class InList:
    operand: Expr
    items: tuple[Expr, ...]
    negated: bool
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Between:
    operand: Expr
    low: Expr
    high: Expr
    negated: bool
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class StrPredicate:
    op: str  # CONTAINS, STARTS WITH, ENDS WITH, MATCHES
    operand: Expr
    arg: Expr
    negated: bool
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Lookup:
    """`table[key].column`: a column of the table row whose key is the event's field `key`
    (a `Name`: `card` or `a.card`), as of the event's time (docs/tables.md)."""

    table: str
    key: Name
    column: str
    span: Span = _span()


Expr = (Literal | Name | Star | Call | Unary | Binary | IsNull | InList | Between | StrPredicate
        | Lookup)

# ------------------------------------------------------------------------------------- patterns


@dataclass(frozen=True, slots=True)
class Quantifier:
    min: int
    max: int | None  # None: unbounded
    greedy: bool = True
    span: Span = _span()

    def __str__(self) -> str:
        if (self.min, self.max) == (0, 1):
            text = "?"
        elif (self.min, self.max) == (0, None):
            text = "*"
        elif (self.min, self.max) == (1, None):
            text = "+"
        elif self.min == self.max:
            text = f"{{{self.min}}}"
        elif self.max is None:
            text = f"{{{self.min},}}"
        else:
            text = f"{{{self.min},{self.max}}}" if self.min else f"{{,{self.max}}}"
        return text if self.greedy else text + "?"


@dataclass(frozen=True, slots=True)
class PVar:
    name: str
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class PNot:
    """`NOT X` inside a pattern: "not next" after juxtaposition, "not followed by" after `->`."""

    name: str
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class PItem:
    """One element of a sequence with the connector written before it (None: none written)."""

    conn: Conn | None
    element: PVar | PNot | PAlt
    quant: Quantifier | None
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class PSeq:
    items: tuple[PItem, ...]
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class PAlt:
    """Alternation of sequences; a parenthesised group is a PAlt (often with one branch)."""

    branches: tuple[PSeq, ...]
    span: Span = _span()


# ------------------------------------------------------------------------------------ rule file


@dataclass(frozen=True, slots=True)
class Duration:
    ms: int
    text: str
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class FieldDecl:
    name: str
    type: str  # STRING INT FLOAT BOOL STRUCT ... (upper-case, as written)
    span: Span = _span()
    fields: tuple[FieldDecl, ...] | None = None  # the sub-fields of a STRUCT


@dataclass(frozen=True, slots=True)
class StreamDecl:
    name: str
    fields: tuple[FieldDecl, ...] | None
    time_field: str
    lateness: Duration | None
    span: Span = _span()
    time_keys: tuple[str, ...] = ()  # `TIME BY a:b` (nested: reported as not supported)
    time_span: Span = _span()


@dataclass(frozen=True, slots=True)
class TableDecl:
    """`TABLE name (columns) KEY column [TIME BY column] FROM KAFKA 'topic' | FILE 'path';`"""

    name: str
    fields: tuple[FieldDecl, ...]
    key: str
    time_field: str | None
    source_kind: str  # KAFKA | FILE
    source: str
    span: Span = _span()
    key_span: Span = _span()
    time_span: Span = _span()
    source_span: Span = _span()  # the quoted topic or path


@dataclass(frozen=True, slots=True)
class Define:
    var: str
    condition: Expr
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Measure:
    expr: Expr
    name: str
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Skip:
    kind: str  # PAST LAST ROW | TO NEXT ROW | TO FIRST | TO LAST | ALL MATCHES
    var: str | None = None
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Destination:
    kind: str  # KAFKA | REDIS
    target: str
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Emit:
    alert: str
    destinations: tuple[Destination, ...]
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Window:
    """`WINDOW TUMBLING (SIZE 5m)`, `HOPPING (SIZE 10m, ADVANCE BY 5m)`, `SESSION (30m)`."""

    kind: str  # TUMBLING | HOPPING | SESSION
    size: Duration  # the size, or a session's gap
    advance: Duration | None = None  # HOPPING only
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Clause:
    """One clause of a rule, as written. `value` depends on `name`; order is the source order.

    Clauses may come in any order; `RuleClauses.build` gives them named, typed fields and
    finds the duplicates, which `cep.compile.rules.compile_rule` reports with missing ones.
    """

    name: str  # VERSION, DESCRIPTION, TAGS, SEVERITY, ENABLED, FROM, PARTITION BY, PATTERN, ...
    value: object
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class RuleDecl:
    id: str
    title: str | None
    clauses: tuple[Clause, ...]
    span: Span = _span()


# The clause keywords, by the name of the typed field that holds them. AFTER MATCH SKIP and ALL
# MATCHES are one clause (`skip`), as are ENABLED and DISABLED (`enabled`): each may be given once.
CLAUSE_FIELDS: dict[str, str] = {
    "VERSION": "version",
    "DESCRIPTION": "description",
    "TAGS": "tags",
    "SEVERITY": "severity",
    "ENABLED": "enabled",
    "DISABLED": "enabled",
    "FROM": "stream",
    "PARTITION BY": "partition_by",
    "PATTERN": "pattern",
    "DEFINE": "define",
    "WITHIN": "within",
    "STEP WITHIN": "step_within",
    "MEASURES": "measures",
    "AFTER MATCH SKIP": "skip",
    "ALL MATCHES": "skip",
    "EMIT": "emit",
    "ON TIMEOUT EMIT": "on_timeout",
    "ALLOW UNBOUNDED": "allow_unbounded",
    "MAX PARTIAL MATCHES": "max_partial_matches",
    "WINDOW": "window",
    "WHERE": "where",
    "HAVING": "having",
}


@dataclass(frozen=True, slots=True)
class RuleClauses:
    """A rule's clauses as named, typed fields (None or empty: not given), built from
    `RuleDecl.clauses` by `RuleClauses.build`, which also returns every clause given twice.
    `spans` holds where each given clause is, by field name."""

    version: int | None = None
    description: str | None = None
    tags: tuple[str, ...] = ()
    severity: str | None = None
    enabled: bool | None = None
    stream: tuple[str, Span] | None = None  # FROM: the stream's name and where it is written
    partition_by: tuple[str, Span, tuple[str, ...]] | None = None  # field, where, nested keys
    pattern: PAlt | None = None
    define: tuple[Define, ...] = ()
    within: Duration | None = None
    step_within: Duration | None = None
    measures: tuple[Measure, ...] = ()
    skip: Skip | None = None
    emit: Emit | None = None
    on_timeout: Emit | None = None
    allow_unbounded: bool = False
    max_partial_matches: int | None = None
    window: Window | None = None
    where: Expr | None = None
    having: Expr | None = None
    spans: tuple[tuple[str, Span], ...] = field(default=(), compare=False, repr=False)

    @staticmethod
    def build(rule: RuleDecl) -> tuple[RuleClauses, tuple[tuple[Clause, Clause], ...]]:
        """The typed clauses (the first of each kind wins) and the duplicates, each as
        (the clause given again, the first one)."""
        first: dict[str, Clause] = {}
        duplicates: list[tuple[Clause, Clause]] = []
        for c in rule.clauses:
            name = CLAUSE_FIELDS[c.name]
            if name in first:
                duplicates.append((c, first[name]))
            else:
                first[name] = c
        # The grammar gives each clause's value its type (cep/grammar.py, `rule_clause`).
        values: dict[str, Any] = {name: c.value for name, c in first.items()}
        spans = tuple((name, c.span) for name, c in first.items())
        return RuleClauses(**values, spans=spans), tuple(duplicates)

    def span(self, name: str) -> Span:
        return dict(self.spans)[name]


@dataclass(frozen=True, slots=True)
class RuleFile:
    path: str
    streams: tuple[StreamDecl, ...]
    rules: tuple[RuleDecl, ...]
    span: Span = _span()
    tables: tuple[TableDecl, ...] = ()
