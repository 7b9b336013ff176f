"""AST → plan: each leaf analysed per its field's type into a matcher closure plus the presearcher
keys an event must produce for that leaf to match (its *anchor*).

Keys are tuples, produced identically by `percolator.index.event_keys` from an event:
  ("t", field, term)      a term: analysed token (text) or whole value (keyword)
  ("n", field, "3.5")     a number, canonical form
  ("b", field, "true")    a boolean
  ("p", field, prefix)    some term of the field starts with `prefix`
  ("f", field, variant, k)  a deletion variant (≤ k deletions) of some term (fuzzy)
  ("e", field)            the field is present
  ("g", field, (level, x, y))  a grid cell holding one of the field's geo_points
  ("r", field, kind, lo, hi, include_lo, include_hi)   kind: num | date | str (range index)
A leaf's anchor is a tuple of keys, one of which any matching event produces; `()` means the
leaf can never match; None means it cannot be anchored (match-all).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cep.errors import QueryError, Span
from percolator import ast, geo
from percolator import match as m
from percolator.analysis import (
    AnalysedEvent,
    FieldType,
    Schema,
    canonical_number,
    normalise,
    parse_date,
    parse_number,
    tokenise,
)
from percolator.terms import (
    deletion_variants,
    map_wildcard_literals,
    wildcard_literal_prefix,
    wildcard_to_regex,
)

Key = tuple[Any, ...]
STRING_KINDS = (None, FieldType.TEXT, FieldType.KEYWORD)


@dataclass(slots=True, eq=False)
class PLeaf:
    id: int
    label: str
    fields: tuple[str, ...]
    fn: m.Matcher
    anchor: tuple[Key, ...] | None
    source: ast.Leaf | None = None           # the AST leaf (for highlighting)
    field_fns: tuple[m.Matcher, ...] = ()    # per field, aligned with `fields`; () for one
    # Read by percolator.batch: (field, term) of a plain term leaf; the columnar description
    # of a prefix or range leaf (see match.prefix, match.range_of); else None.
    term: tuple[str, str] | None = None
    columnar: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        self.term = getattr(self.fn, "term", None)
        self.columnar = getattr(self.fn, "columnar", None)

    def per_field(self) -> tuple[m.Matcher, ...]:
        return self.field_fns or (self.fn,)


# Plan nodes are not frozen, which halves their construction time (a frozen dataclass sets
# fields through object.__setattr__): an inner node is made per stored search, a leaf per new
# clause. Nothing assigns to them after construction.
@dataclass(slots=True, eq=False)
class PAnd:
    children: tuple[PNode, ...]


@dataclass(slots=True, eq=False)
class POr:
    children: tuple[PNode, ...]


@dataclass(slots=True, eq=False)
class PNot:
    child: PNode


PNode = PLeaf | PAnd | POr | PNot


class LeafTable:
    """Interns leaves by meaning so that queries sharing a clause share its matcher and, per
    event, its result."""

    def __init__(self) -> None:
        self._ids: dict[Key, tuple[int, m.Matcher, tuple[Key, ...] | None]] = {}
        self.fields: dict[tuple[str, ...], tuple[str, ...]] = {}  # one tuple per field list
        self.leaves: dict[Key, PLeaf] = {}  # plan leaves shared by queries (same label too)

    def __len__(self) -> int:
        return len(self._ids)

    def get(self, key: Key, build: Callable[[], tuple[m.Matcher, tuple[Key, ...] | None]]
            ) -> tuple[int, m.Matcher, tuple[Key, ...] | None]:
        hit = self._ids.get(key)
        if hit is None:
            fn, anchor = build()
            leaf_id = len(self._ids)
            hit = self._ids[key] = (leaf_id, m.memoised(leaf_id, fn), anchor)
        return hit


def plan(query: ast.Query, schema: Schema, source: str = "", table: LeafTable | None = None
         ) -> PNode:
    """Compile `query` to a plan; QueryError (with span) when a clause does not fit its field."""
    return _Compiler(schema, source, table if table is not None else LeafTable()).node(query)


class _Compiler:
    def __init__(self, schema: Schema, source: str, table: LeafTable) -> None:
        self.schema = schema
        self.source = source
        self.table = table

    def error(self, node: ast.Node, message: str, hint: str | None = None) -> QueryError:
        start, end = node.loc
        span = Span.from_offset(self.source, start, "<query>")
        if end > start and "\n" not in self.source[start:end]:
            span = Span(span.path, span.line, span.col, span.line, span.col + end - start)
        return QueryError(message, span, source=self.source or None, hint=hint)

    def node(self, q: ast.Query) -> PNode:
        if isinstance(q, ast.And):
            return PAnd(tuple(self.node(c) for c in q.children))
        if isinstance(q, ast.Or):
            return POr(tuple(self.node(c) for c in q.children))
        if isinstance(q, ast.Not):
            return PNot(self.node(q.child))
        fields = self.fields_of(q)
        ikey = (q, q.label, len(fields))  # the fields follow from q and the schema
        shared = self.table.leaves.get(ikey)
        if shared is not None:
            return shared
        leaf = self.table.leaves[ikey] = self.plan_leaf(q, fields)
        return leaf

    def plan_leaf(self, q: ast.Leaf, fields: list[str]) -> PLeaf:
        parts = [self.leaf(q, f) for f in fields]
        fns = [p[1] for p in parts]
        anchors = [p[2] for p in parts]
        anchor: tuple[Key, ...] | None = None
        if all(a is not None for a in anchors):
            anchor = tuple(k for a in anchors if a is not None for k in a)
        fn = fns[0] if len(fns) == 1 else m.any_of(fns)
        fs = tuple(fields)
        fs = self.table.fields.setdefault(fs, fs)
        # field_fns stays empty for one field (then it is (fn,)): a tuple less per leaf.
        return PLeaf(parts[0][0] if len(parts) == 1 else -1, q.label or type(q).__name__,
                     fs, fn, anchor, q, tuple(fns) if len(fns) > 1 else ())

    def fields_of(self, q: ast.Leaf) -> list[str]:
        field = getattr(q, "field", None)
        if isinstance(q, ast.MatchAll):
            return ["*"]
        if field is not None:
            return [field]
        if self.schema.default_fields:
            return list(self.schema.default_fields)
        return ["*"]

    def leaf(self, q: ast.Leaf, field: str) -> tuple[int, m.Matcher, tuple[Key, ...] | None]:
        # AST leaves compare by meaning (type and values; positions and labels left out).
        return self.table.get((q, field), lambda: self.build(q, field))

    # -- per leaf type -------------------------------------------------------------------------
    def build(self, q: ast.Leaf, field: str) -> tuple[m.Matcher, tuple[Key, ...] | None]:
        kind = None if field == "*" else self.schema.type_of(field)
        if isinstance(q, ast.MatchAll):
            return m.always, None
        if isinstance(q, ast.Exists):
            return m.exists(field), (("e", field),)
        if isinstance(q, (ast.GeoDistance, ast.GeoBox)):
            return self.geo(q, field, kind)
        if kind is FieldType.GEO_POINT:
            raise self.error(q, f"{type(q).__name__.lower()} query on geo_point field {field!r}",
                             hint="geo_point fields take geo_distance(lat, lon, 10km), "
                                     "geo_box(top, left, bottom, right) or _exists_")
        if isinstance(q, ast.Term):
            return self.term(q, field, kind, q.value)
        if isinstance(q, ast.Phrase):
            if kind in (FieldType.NUMBER, FieldType.DATE, FieldType.BOOLEAN):
                return self.term(q, field, kind, q.text)
            if kind is FieldType.KEYWORD:
                return m.term_in(field, q.text), (("t", field, q.text),)
            return self.text(field, tokenise(q.text), q.slop)
        if isinstance(q, ast.Similar):
            self.need_string(q, field, kind, "similarity")
            return (m.similar(field, " ".join(tokenise(q.text)), q.scorer, q.threshold),
                    (("e", field),))
        if isinstance(q, ast.Range):
            return self.range(q, field, kind)
        self.need_string(q, field, kind, type(q).__name__.lower())
        norm = (lambda s: s) if kind is FieldType.KEYWORD else normalise
        if isinstance(q, ast.Prefix):
            p = norm(q.prefix)
            if not p:
                return m.exists(field), (("e", field),)
            return m.prefix(field, p), (("p", field, p),)
        if isinstance(q, ast.Wildcard):
            pattern = map_wildcard_literals(q.pattern, norm)
            lit = wildcard_literal_prefix(pattern)
            anchor = (("p", field, lit),) if lit else (("e", field),)
            return m.regex(field, wildcard_to_regex(pattern)), anchor
        if isinstance(q, ast.Regexp):
            lit = regex_literal_prefix(q.pattern)
            anchor = (("p", field, lit),) if lit else (("e", field),)
            return m.regex(field, q.pattern), anchor
        if isinstance(q, ast.Fuzzy):
            term = norm(q.value)
            if q.distance == 0 or not term:
                return m.term_in(field, term), (("t", field, term),)
            variants = sorted(deletion_variants(term, q.distance))
            keys = tuple(("f", field, v, q.distance) for v in variants)
            return m.fuzzy(field, term, q.distance), keys
        raise self.error(q, f"unsupported clause {type(q).__name__}")  # pragma: no cover

    def geo(self, q: ast.GeoDistance | ast.GeoBox, field: str, kind: FieldType | None
            ) -> tuple[m.Matcher, tuple[Key, ...]]:
        if kind is not FieldType.GEO_POINT:
            raise self.error(q, f"geo query on {'undeclared' if kind is None else kind} field "
                             f"{field!r}", hint="declare it in the schema: "
                             f"fields: {{{field}: geo_point}}")
        if isinstance(q, ast.GeoDistance):
            fn = m.geo_distance(field, q.lat, q.lon, q.meters)
            box = geo.circle_box(q.lat, q.lon, q.meters)
        else:
            box = (q.top, q.left, q.bottom, q.right)
            fn = m.geo_box(field, box)
        return fn, tuple(("g", field, c) for c in geo.box_cells(box))

    def need_string(self, q: ast.Node, field: str, kind: FieldType | None, what: str) -> None:
        if kind not in STRING_KINDS:
            raise self.error(q, f"{what} query on {kind} field {field!r}",
                             hint=f"{what} queries need a text or keyword field; "
                                  "use a term or a range on this field")

    def text(self, field: str, tokens: Sequence[str], slop: int = 0
             ) -> tuple[m.Matcher, tuple[Key, ...]]:
        if not tokens:
            return m.never, ()
        best = max(tokens, key=len)
        if len(tokens) == 1:
            return m.term_in(field, tokens[0]), (("t", field, best),)
        return m.phrase(field, tokens, slop), (("t", field, best),)

    def term(self, q: ast.Node, field: str, kind: FieldType | None, value: str
             ) -> tuple[m.Matcher, tuple[Key, ...]]:
        if kind is FieldType.TEXT or field == "*":
            return self.text(field, tokenise(value))
        if kind is FieldType.KEYWORD:
            return m.term_in(field, value), (("t", field, value),)
        if kind is FieldType.NUMBER:
            n = parse_number(value)
            if n is None:
                raise self.error(q, f"{value!r} is not a number (field {field!r} is a number)",
                                 hint=f"write {field}:300 or a range {field}:[100 TO 400]")
            return m.number_eq(field, n), (("n", field, canonical_number(n)),)
        if kind is FieldType.DATE:
            d = parse_date(value)
            if d is None:
                raise self.error(q, f"{value!r} is not an ISO 8601 date (field {field!r})",
                                 hint="write 2024-05-01 or 2024-05-01T12:00:00Z")
            start, end = d
            fn = m.range_of(AnalysedEvent.dates, field, start, end, True, False)
            return fn, (("r", field, "date", start, end, True, False),)
        if kind is FieldType.BOOLEAN:
            if value not in ("true", "false"):
                raise self.error(q, f"{value!r} is not true or false (field {field!r})")
            return m.bool_eq(field, value == "true"), (("b", field, value),)
        # Undeclared field: every reading of the term that an event value could satisfy.
        fns: list[m.Matcher] = []
        keys: list[Key] = []
        fn, anchor = self.text(field, tokenise(value))
        if anchor:
            fns.append(fn)
            keys.extend(anchor)
        n = parse_number(value)
        if n is not None:
            fns.append(m.number_eq(field, n))
            keys.append(("n", field, canonical_number(n)))
        if value in ("true", "false"):
            fns.append(m.bool_eq(field, value == "true"))
            keys.append(("b", field, value))
        return m.any_of(fns), tuple(keys)

    def range(self, q: ast.Range, field: str, kind: FieldType | None
              ) -> tuple[m.Matcher, tuple[Key, ...]]:
        bounds = [b for b in (q.low, q.high) if b is not None]
        if not bounds:
            return m.exists(field), (("e", field),)
        if kind is None and field != "*":
            if all(parse_number(b) is not None for b in bounds):
                kind = FieldType.NUMBER
            elif all(parse_date(b) is not None for b in bounds):
                kind = FieldType.DATE
        lo: Any
        hi: Any
        il, ih = q.include_low, q.include_high
        values: Callable[[AnalysedEvent, str], Sequence[Any]]
        if kind is FieldType.NUMBER:
            nums = [None if b is None else parse_number(b) for b in (q.low, q.high)]
            for b, n in zip((q.low, q.high), nums, strict=True):
                if b is not None and n is None:
                    raise self.error(q, f"range bound {b!r} is not a number "
                                        f"(field {field!r} is a number)")
            lo, hi = nums
            values, rkind = AnalysedEvent.numbers, "num"
        elif kind is FieldType.DATE:
            lo = hi = None
            for b, is_low in ((q.low, True), (q.high, False)):
                if b is None:
                    continue
                d = parse_date(b)
                if d is None:
                    raise self.error(q, f"range bound {b!r} is not an ISO 8601 date",
                                     hint="write [2024-01-01 TO 2024-01-31T23:59:59Z]")
                # As Elasticsearch: a coarse bound rounds so that `[.. TO 2024-01-31]` includes
                # the whole day and `{2024-01-01 TO ..` excludes it.
                inclusive = il if is_low else ih
                edge = (d[0] if inclusive else d[1] - 1) if is_low else (
                    d[1] - 1 if inclusive else d[0])
                if is_low:
                    lo = edge
                else:
                    hi = edge
            values, rkind = AnalysedEvent.dates, "date"
        elif kind is FieldType.BOOLEAN:
            raise self.error(q, f"range query on boolean field {field!r}")
        else:
            norm = (lambda s: s) if kind is FieldType.KEYWORD else normalise
            lo = None if q.low is None else norm(q.low)
            hi = None if q.high is None else norm(q.high)
            values, rkind = _terms_list, "str"
        if lo is not None and hi is not None and (lo > hi or (lo == hi and not (il and ih))):
            return m.never, ()
        fn = m.range_of(values, field, lo, hi, il, ih)
        return fn, (("r", field, rkind, lo, hi, il if lo is not None else True,
                     ih if hi is not None else True),)


def _terms_list(ev: AnalysedEvent, field: str) -> Sequence[str]:
    return tuple(ev.terms(field))


_REGEX_META = set(".^$*+?()[]{}|\\")


def regex_literal_prefix(pattern: str) -> str:
    """Literal characters every match must start with (conservative: '' when unsure)."""
    if "|" in pattern:
        return ""
    out: list[str] = []
    for i, ch in enumerate(pattern):
        if ch in _REGEX_META:
            if ch in "?*{" and out:
                out.pop()  # the previous character is optional / repeated
            break
        if not ch.isalnum():
            break
        out.append(ch)
        if i + 1 == len(pattern):
            break
    return "".join(out)
