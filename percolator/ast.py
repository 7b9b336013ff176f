"""The query AST: frozen dataclasses, tuples for children, source positions excluded from equality.

`percolator.syntax` builds these nodes from Lucene query text; `percolator.compile` turns them into
matchers and presearcher anchors. Nothing here knows about analysis or field types: a `Term` holds
the text the user typed (unescaped), and the field's type decides later what it means.

Every node carries `loc = (start, end)`, character offsets into the query text, and `label`, the
source text of the clause; both are left out of `==` and `hash` so that two queries written
differently but meaning the same compare equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NO_LOC: tuple[int, int] = (0, 0)

# A field of None means "the default field(s)" (see docs/percolator.md, "Default field").
FieldName = str | None


@dataclass(frozen=True, slots=True)
class Node:
    loc: tuple[int, int] = field(default=NO_LOC, compare=False, kw_only=True, repr=False)
    label: str = field(default="", compare=False, kw_only=True, repr=False)


@dataclass(frozen=True, slots=True)
class Term(Node):
    """`field:value` — one term; analysed per the field's type."""

    field: FieldName
    value: str


@dataclass(frozen=True, slots=True)
class Phrase(Node):
    """`field:"a b c"` or `"a b"~2` — tokens in order, with up to `slop` moves."""

    field: FieldName
    text: str
    slop: int = 0


@dataclass(frozen=True, slots=True)
class Prefix(Node):
    """`field:amst*` — a term starting with `prefix`."""

    field: FieldName
    prefix: str


@dataclass(frozen=True, slots=True)
class Wildcard(Node):
    """`field:te?m*` — `pattern` keeps `*`/`?` as wildcards; literal ones are backslash-escaped."""

    field: FieldName
    pattern: str


@dataclass(frozen=True, slots=True)
class Regexp(Node):
    """`field:/pattern/` — RE2 syntax, anchored to the whole term (as Lucene)."""

    field: FieldName
    pattern: str


@dataclass(frozen=True, slots=True)
class Fuzzy(Node):
    """`field:term~N` — within N (0..2) Damerau-Levenshtein (OSA) edits."""

    field: FieldName
    value: str
    distance: int = 2


@dataclass(frozen=True, slots=True)
class Range(Node):
    """`[lo TO hi]`, `{lo TO hi}`, `>=x`, `<x`; a bound of None is open."""

    field: FieldName
    low: str | None
    high: str | None
    include_low: bool = True
    include_high: bool = True


@dataclass(frozen=True, slots=True)
class Exists(Node):
    """`_exists_:field` (also `field:*`) — the field is present and not null."""

    field: str


@dataclass(frozen=True, slots=True)
class Similar(Node):
    """`field:~"text"@85` — rapidfuzz `scorer(text, value) >= threshold` (0..100)."""

    field: FieldName
    text: str
    threshold: float = 80.0
    scorer: str = "wratio"


@dataclass(frozen=True, slots=True)
class GeoDistance(Node):
    """`field:geo_distance(lat, lon, 10km)` — a geo_point within `meters` (arc distance)."""

    field: FieldName
    lat: float
    lon: float
    meters: float


@dataclass(frozen=True, slots=True)
class GeoBox(Node):
    """`field:geo_box(top, left, bottom, right)` — a geo_point in the box (edges included;
    left > right crosses the antimeridian)."""

    field: FieldName
    top: float
    left: float
    bottom: float
    right: float


@dataclass(frozen=True, slots=True)
class MatchAll(Node):
    """`*` or `*:*`."""


@dataclass(frozen=True, slots=True)
class And(Node):
    children: tuple[Query, ...]


@dataclass(frozen=True, slots=True)
class Or(Node):
    children: tuple[Query, ...]


@dataclass(frozen=True, slots=True)
class Not(Node):
    child: Query


Leaf = (Term | Phrase | Prefix | Wildcard | Regexp | Fuzzy | Range | Exists | Similar | MatchAll
        | GeoDistance | GeoBox)
Query = Leaf | And | Or | Not
LEAF_TYPES: tuple[type, ...] = (
    Term, Phrase, Prefix, Wildcard, Regexp, Fuzzy, Range, Exists, Similar, MatchAll,
    GeoDistance, GeoBox,
)


def leaves(query: Query) -> list[Leaf]:
    """All leaves of `query`, left to right."""
    out: list[Leaf] = []
    stack: list[Query] = [query]
    while stack:
        node = stack.pop()
        if isinstance(node, (And, Or)):
            stack.extend(reversed(node.children))
        elif isinstance(node, Not):
            stack.append(node.child)
        else:
            out.append(node)
    return out


def depth(query: Query) -> int:
    if isinstance(query, (And, Or)):
        return 1 + max(depth(c) for c in query.children)
    if isinstance(query, Not):
        return 1 + depth(query.child)
    return 1
