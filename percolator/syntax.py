"""Lucene query text → `percolator.ast` nodes, with positions and hints on errors.

luqum does the Lucene grammar. Before handing the text to luqum we cut out our one extension,
similarity clauses (`title:~"blue bike"@85`, `title:~token_set"blue bike"@90`), replacing each
with a placeholder word of exactly the same length so every offset luqum reports stays true.

Boolean semantics (documented in docs/percolator.md): explicit `AND`/`OR`/`NOT` are logical
operators with precedence NOT > AND > OR; inside a run of clauses with no operator between them
(`a +b -c`), Lucene's must/should/must-not rules apply with the default operator (OR).
A query made only of negations (`-status:ok`) matches every event without those clauses, as in
Elasticsearch's query_string.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from luqum import tree as lt
from luqum.exceptions import IllegalCharacterError, ParseError
from luqum.thread import parse as luqum_parse

from cep.errors import QueryError, Span
from percolator import ast, geo, wildcards

MAX_QUERY_CHARS = 16_384
MAX_CLAUSES = 1_024
MAX_DEPTH = 48
SCORERS = ("wratio", "ratio", "partial", "token_sort", "token_set", "qratio")
DEFAULT_SIMILARITY = 80.0
_PLACEHOLDER = "\ue000"
_PAD = "\ue001"
_GEO = "\ue002"
_SIM_RE = re.compile(r'~([a-z_]*)"((?:[^"\\]|\\.)*)"(?:@(\d+(?:\.\d+)?))?')
_BOUNDARY = set(" \t\r\n(:+-!")
_POS_RE = re.compile(r"position (\d+)")
_ESCAPE_RE = re.compile(r"\\(.)", re.S)


def parse(text: str, *, default_operator: str = "OR", path: str = "<query>") -> ast.Query:
    """Parse Lucene query `text`; raise `QueryError` (with span and hint) if it is not valid."""
    if default_operator not in ("OR", "AND"):
        raise ValueError("default_operator must be 'OR' or 'AND'")
    fast = parse_fast(text)  # the common shapes without luqum; None for everything else
    if fast is not None:
        return fast
    return _Parser(text, default_operator, path).run()


def parse_luqum(text: str, *, default_operator: str = "OR", path: str = "<query>"
                ) -> ast.Query:
    """`parse` without the fast path (tests compare the two)."""
    return _Parser(text, default_operator, path).run()


class _Parser:
    def __init__(self, text: str, default_operator: str, path: str) -> None:
        self.text = text
        self.default_and = default_operator == "AND"
        self.path = path
        self.similar: list[tuple[int, int, str, str, float]] = []
        self.geo: list[tuple[str, tuple[float, ...]]] = []
        self.clauses = 0

    def error(self, message: str, start: int, end: int | None = None, hint: str | None = None
              ) -> QueryError:
        span = Span.from_offset(self.text, start, self.path)
        if end is not None and end > start and "\n" not in self.text[start:end]:
            span = Span(span.path, span.line, span.col, span.line, span.col + end - start)
        return QueryError(message, span, source=self.text, hint=hint)

    def run(self) -> ast.Query:
        text = self.text
        if len(text) > MAX_QUERY_CHARS:
            raise self.error(f"query is {len(text)} characters long; the limit is "
                             f"{MAX_QUERY_CHARS}", MAX_QUERY_CHARS, hint="split it into several "
                             "saved searches")
        if not text.strip():
            raise self.error("empty query", 0, hint="to match every event, write *:*")
        for bad in (_PLACEHOLDER, _PAD, _GEO):
            if bad in text:
                raise self.error("reserved character in query", text.index(bad))
        prepared = self._cut_similarity(text)
        try:
            tree = luqum_parse(prepared)
        except IllegalCharacterError as exc:
            raise self._luqum_error(exc, illegal=True) from None
        except ParseError as exc:
            raise self._luqum_error(exc, illegal=False) from None
        except RecursionError:  # pragma: no cover - PLY is iterative, kept as a guard
            raise self.error("query nests too deeply", 0) from None
        return self.convert(tree, None, 0)

    # -- the similarity extension --------------------------------------------------------------
    def _cut_similarity(self, text: str) -> str:
        out: list[str] = []
        i, n = 0, len(text)
        while i < n:
            c = text[i]
            if c == "\\":
                out.append(text[i:i + 2])
                i += 2
                continue
            at_start = i == 0 or text[i - 1] in _BOUNDARY
            if c == '"' or (c == "/" and at_start):
                j = _closing(text, i, c)
                out.append(text[i:j])
                i = j
                continue
            if c == "g" and at_start and text.startswith(("geo_distance(", "geo_box("), i):
                out.append(self._cut_geo(text, i))
                i += len(out[-1])
                continue
            if c == "~" and at_start:
                m = _SIM_RE.match(text, i)
                if m is None:
                    raise self.error("malformed similarity clause", i, hint='write '
                                     'field:~"some text"@85 (scorer optional: ~token_set"...")')
                scorer = m.group(1) or "wratio"
                if scorer not in SCORERS:
                    raise self.error(f"unknown similarity scorer {scorer!r}", i + 1,
                                     i + 1 + len(scorer), hint="one of " + ", ".join(SCORERS))
                threshold = float(m.group(3)) if m.group(3) else DEFAULT_SIMILARITY
                if not 0 <= threshold <= 100:
                    raise self.error("similarity threshold must be between 0 and 100",
                                     m.start(3), m.end(3))
                phrase = _ESCAPE_RE.sub(r"\1", m.group(2))
                if not phrase.strip():
                    raise self.error("empty similarity text", i, m.end())
                marker = _PLACEHOLDER + str(len(self.similar))
                width = m.end() - i
                if len(marker) > width:
                    raise self.error("too many similarity clauses", i)
                self.similar.append((i, m.end(), phrase, scorer, threshold))
                out.append(marker + _PAD * (width - len(marker)))
                i = m.end()
                continue
            out.append(c)
            i += 1
        return "".join(out)

    def _cut_geo(self, text: str, i: int) -> str:
        """A geo clause at `i` → a placeholder of the same width (see percolator.geo)."""
        is_box = text.startswith("geo_box(", i)
        m = (geo.BOX_RE if is_box else geo.DISTANCE_RE).match(text, i)
        if m is None:
            raise self.error("malformed geo clause", i, hint="write field:geo_distance(52.37, "
                             "4.89, 10km) or field:geo_box(top, left, bottom, right)")
        nums = [float(g) for g in m.groups()[:4 if is_box else 3]]
        lats = (nums[0], nums[2]) if is_box else (nums[0],)
        lons = (nums[1], nums[3]) if is_box else (nums[1],)
        if any(not -90 <= v <= 90 for v in lats) or any(not -180 <= v <= 180 for v in lons):
            raise self.error("latitude must be in [-90, 90] and longitude in [-180, 180]",
                             i, m.end(), hint="geo_distance(lat, lon, radius)")
        if is_box and nums[0] < nums[2]:
            raise self.error("geo_box top latitude is below its bottom", i, m.end(),
                             hint="geo_box(top, left, bottom, right)")
        if not is_box:
            unit = m.group(4) or "m"
            nums[2] *= geo.UNITS[unit]
            if nums[2] <= 0:
                raise self.error("geo_distance radius must be positive", i, m.end())
        marker = _GEO + str(len(self.geo))
        width = m.end() - i
        if len(marker) > width:  # pragma: no cover - a geo clause is longer than its marker
            raise self.error("too many geo clauses", i)
        self.geo.append(("box" if is_box else "distance", tuple(nums)))
        return marker + _PAD * (width - len(marker))

    def _luqum_error(self, exc: ParseError, illegal: bool) -> QueryError:
        message = str(exc)
        m = _POS_RE.search(message)
        pos = int(m.group(1)) if m else len(self.text)
        depth = 0
        for ch in self.text:
            depth += ch == "("
            depth -= ch == ")"
        hint = None
        if illegal:
            what = f"illegal character {self.text[pos:pos + 1]!r}"
            hint = "escape special characters with a backslash, or quote the value"
        elif m is None:
            what = "unexpected end of query"
            if depth > 0:
                hint = "a '(' is not closed"
            elif self.text.count('"') % 2:
                hint = 'a \'"\' is not closed'
            elif "[" in self.text or "{" in self.text:
                hint = "ranges are written [low TO high] or {low TO high}"
            else:
                hint = "an operator (AND, OR, NOT, +, -) needs something after it"
        else:
            ch = self.text[pos:pos + 1]
            what = f"unexpected {ch!r}"
            if ch == ")":
                hint = "this ')' has no matching '('"
            elif ch in "]}":
                hint = "ranges are written [low TO high] or {low TO high}"
            elif ch == ":":
                hint = "a field name goes before ':'; quote or escape a ':' in a value (\\:)"
            else:
                hint = "check the operator or field before this point"
        return self.error(what, pos, hint=hint)

    # -- luqum tree → our AST ------------------------------------------------------------------
    def _loc(self, node: lt.Item) -> tuple[int, int]:
        start, end = node.span()
        return (start or 0, end or 0)

    def _meta(self, node: lt.Item) -> dict[str, Any]:
        start, end = self._loc(node)
        return {"loc": (start, end), "label": self.text[start:end]}

    def _leaf_meta(self, node: lt.Item, field_node: lt.Item | None, field: str | None = None
                   ) -> dict[str, Any]:
        start, end = self._loc(node)
        if field_node is not None:
            start = self._loc(field_node)[0]
        self.clauses += 1
        if self.clauses > MAX_CLAUSES:
            raise self.error(f"more than {MAX_CLAUSES} clauses", start,
                             hint="split the query into several saved searches")
        label = " ".join(self.text[start:end].split())
        if field_node is None and field is not None:
            label = f"{field}:{label}"
        return {"loc": self._loc(node), "label": label}

    def convert(self, node: lt.Item, field: str | None, depth: int,
                field_node: lt.Item | None = None) -> ast.Query:
        if depth > MAX_DEPTH:
            raise self.error("query nests too deeply", self._loc(node)[0],
                             hint=f"at most {MAX_DEPTH} levels of grouping")
        d = depth + 1
        if isinstance(node, lt.SearchField):
            return self._field(node, d)
        if isinstance(node, (lt.Group, lt.FieldGroup)):
            return self.convert(node.expr, field, d, None)
        if isinstance(node, lt.Boost):
            return self.convert(node.expr, field, d, field_node)
        if isinstance(node, lt.Plus):
            return self.convert(node.a, field, d, None)
        if isinstance(node, (lt.Not, lt.Prohibit)):
            return ast.Not(self.convert(node.a, field, d, None), **self._meta(node))
        if isinstance(node, lt.AndOperation):
            kids = [self._operand(o, field, d) for o in node.operands]
            return _and(kids, self._meta(node))
        if isinstance(node, lt.OrOperation):
            kids = [self._operand(o, field, d) for o in node.operands]
            return _or(kids, self._meta(node))
        if isinstance(node, lt.UnknownOperation):
            return self._implicit(node, field, d)
        return self._leaf(node, field, field_node)

    def _operand(self, node: lt.Item, field: str | None, depth: int) -> ast.Query:
        return self.convert(node, field, depth, None)

    def _implicit(self, node: lt.UnknownOperation, field: str | None, depth: int) -> ast.Query:
        must: list[ast.Query] = []
        should: list[ast.Query] = []
        nots: list[ast.Query] = []
        for op in node.operands:
            q = self.convert(op, field, depth, None)
            if isinstance(op, lt.Plus):
                must.append(q)
            elif isinstance(q, ast.Not):
                nots.append(q)
            elif self.default_and:
                must.append(q)
            else:
                should.append(q)
        meta = self._meta(node)
        if not must and should:
            must.append(_or(should, meta) if len(should) > 1 else should[0])
        return _and(must + nots, meta)

    def _field(self, node: lt.SearchField, depth: int) -> ast.Query:
        name = _ESCAPE_RE.sub(r"\1", node.name)
        start = self._loc(node)[0]
        if name == "_exists_":
            expr = node.expr
            if not isinstance(expr, lt.Word) or expr.has_wildcard():
                raise self.error("_exists_ takes a field name", self._loc(expr)[0],
                                 hint="write _exists_:address.city")
            return ast.Exists(expr.unescaped_value, **self._leaf_meta(expr, node))
        if name == "*":
            if isinstance(node.expr, lt.Word) and node.expr.value == "*":
                return ast.MatchAll(**self._leaf_meta(node.expr, node))
            raise self.error("'*' as a field name is only allowed in *:*", start,
                             hint="leave the field out to search the default fields")
        if name.startswith(".") or name.endswith(".") or ".." in name:
            raise self.error(f"bad field name {name!r}", start, start + len(node.name),
                             hint="nested fields are written as a dotted path: address.city")
        return self.convert(node.expr, name, depth, node)

    def _leaf(self, node: lt.Item, field: str | None, fnode: lt.Item | None) -> ast.Query:
        meta = self._leaf_meta(node, fnode, field)
        start, end = self._loc(node)
        if isinstance(node, lt.Word):
            value = node.value
            if value.startswith(_PLACEHOLDER):
                body = value[1:].rstrip(_PAD)
                if not (body.isdigit() and int(body) < len(self.similar)):
                    raise self.error("a similarity clause runs into the text after it", start,
                                     end, hint='put a space after it: title:~"blue bike"@85 x')
                _, _, text, scorer, threshold = self.similar[int(body)]
                return ast.Similar(field, text, threshold, scorer, **meta)
            if value.startswith(_GEO):
                body = value[1:].rstrip(_PAD)
                if not (body.isdigit() and int(body) < len(self.geo)) or field is None:
                    raise self.error("a geo clause needs a field and a space after it", start,
                                     end, hint="location:geo_distance(52.37, 4.89, 10km)")
                kind, nums = self.geo[int(body)]
                if kind == "box":
                    return ast.GeoBox(field, *nums, **meta)
                return ast.GeoDistance(field, *nums, **meta)
            return self._word(value, field, start, end, meta)
        if isinstance(node, lt.Phrase):
            return ast.Phrase(field, _ESCAPE_RE.sub(r"\1", node.value[1:-1]), 0, **meta)
        if isinstance(node, lt.Proximity):
            text = _ESCAPE_RE.sub(r"\1", node.term.value[1:-1])
            return ast.Phrase(field, text, int(node.degree), **meta)
        if isinstance(node, lt.Regex):
            pattern = node.value[1:-1].replace("\\/", "/")
            from percolator.terms import compile_regex  # late: terms imports re2
            try:
                compile_regex(pattern)
            except ValueError as exc:
                raise self.error(f"invalid regular expression: {exc}", start, end,
                                 hint="regexes use RE2 syntax (no look-around or "
                                      "back-references) and match the whole term") from None
            return ast.Regexp(field, pattern, **meta)
        if isinstance(node, lt.Fuzzy):
            return self._fuzzy(node, field, meta)
        if isinstance(node, lt.Range):
            low = self._bound(node.low)
            high = self._bound(node.high)
            return ast.Range(field, low, high, node.include_low, node.include_high, **meta)
        if isinstance(node, lt.From):
            return ast.Range(field, self._bound(node.a), None, node.include, False, **meta)
        if isinstance(node, lt.To):
            return ast.Range(field, None, self._bound(node.a), False, node.include, **meta)
        raise self.error(f"unsupported syntax: {type(node).__name__}", start, end)

    def _word(self, value: str, field: str | None, start: int, end: int,
              meta: dict[str, Any]) -> ast.Query:
        if value == "*":
            if field is None:
                return ast.MatchAll(**meta)
            return ast.Exists(field, **meta)
        literal, wild = wildcards.split(value)
        if not wild:
            return ast.Term(field, literal, **meta)
        if wild == [len(value) - 1] and value.endswith("*"):
            return ast.Prefix(field, literal, **meta)
        return ast.Wildcard(field, wildcards.canonical(value), **meta)

    def _fuzzy(self, node: lt.Fuzzy, field: str | None, meta: dict[str, Any]) -> ast.Query:
        start, end = self._loc(node)
        term = node.term
        if not isinstance(term, lt.Word) or term.has_wildcard() or term.value.startswith(
                _PLACEHOLDER):
            raise self.error("fuzzy '~' applies to a single plain term", start, end,
                             hint="write term~1; on a quoted phrase ~N is word slop")
        if getattr(node, "_implicit_degree", False):
            distance = 2
        else:
            degree = Decimal(node.degree)
            if degree != degree.to_integral_value() or not 0 <= degree <= 2:
                raise self.error(f"fuzzy edit distance must be 0, 1 or 2, not {degree}",
                                 start, end, hint="term~ means term~2 (Damerau-Levenshtein)")
            distance = int(degree)
        return ast.Fuzzy(field, term.unescaped_value, distance, **meta)

    def _bound(self, node: lt.Item) -> str | None:
        if isinstance(node, lt.Prohibit):  # a negative number: [-5 TO 5]
            inner = self._bound(node.a)
            return None if inner is None else "-" + inner
        if isinstance(node, lt.Phrase):
            return _ESCAPE_RE.sub(r"\1", node.value[1:-1])
        if isinstance(node, lt.Word):
            if node.value == "*":
                return None
            return node.unescaped_value
        start, end = self._loc(node)
        raise self.error("a range bound must be a value or *", start, end)


def _closing(text: str, i: int, quote: str) -> int:
    """Index just after the quote/slash closing the one at `i` (or the end of the text)."""
    j = i + 1
    while j < len(text):
        if text[j] == "\\":
            j += 2
            continue
        if text[j] == quote:
            return j + 1
        j += 1
    return len(text)


def _flatten(kids: list[ast.Query], kind: type[ast.And] | type[ast.Or]
             ) -> tuple[ast.Query, ...]:
    out: list[ast.Query] = []
    for k in kids:
        if isinstance(k, kind):
            out.extend(k.children)
        else:
            out.append(k)
    return tuple(out)


def _and(kids: list[ast.Query], meta: dict[str, Any]) -> ast.Query:
    flat = _flatten(kids, ast.And)
    return flat[0] if len(flat) == 1 else ast.And(flat, **meta)


def _or(kids: list[ast.Query], meta: dict[str, Any]) -> ast.Query:
    flat = _flatten(kids, ast.Or)
    return flat[0] if len(flat) == 1 else ast.Or(flat, **meta)


# Last: fastparse reuses this module's limits and AST helpers.
from percolator.fastparse import parse_fast  # noqa: E402
