"""Plans for the common query shapes without parsing each search (issue 17: build ≥ 50k/s).

A search such as `body:a AND NOT (title:b OR title:c)` is a *shape*, its text with every
`field:value` clause cut out (`"" AND NOT ( OR )"`), filled with *clauses* (`body:a`, ...). The
searches of one service have few shapes and share many clauses, so `ShapeCache` compiles each
once and keeps it:

* a shape is parsed once, by `parse_fast`, on a stand-in text with every clause written `f:x`,
  and kept as its And/Or/Not tree over clause numbers. If the stand-in does not parse to exactly
  one `f:x` term per clause, in order, the shape is marked unusable and its searches take the
  full path (`compile_query`);
* a clause is compiled once by the full path (`parse_fast` on the clause alone, then the plan
  compiler with the percolator's `LeafTable`), and its plan leaf kept under its text.

A search then costs one regular-expression split, two dictionary lookups per clause and the plan
nodes. The clause expression is fastparse's own value tokens in fastparse's order, so the split
cuts where fastparse would; a clause fastparse would read otherwise (a keyword as value, a
field token as value, a stand-in that joins with its neighbours) declines. The plan is the same
object tree `compile_query` gives with the same `LeafTable` (tests/percolator/test_shapes.py,
on the corpus searches and generated texts, invalid ones included).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from operator import itemgetter
from typing import Any, cast

from percolator import ast
from percolator.analysis import Schema
from percolator.compile import LeafTable, PAnd, PLeaf, PNode, PNot, POr, plan
from percolator.syntax import parse_fast  # (syntax first: fastparse imports it)

# A field, a colon and a value (a quoted phrase, a range, a fuzzy term, a prefix or a term), as
# one literal pattern: the architecture test allows the stdlib `re` literal patterns only.
_CLAUSE = re.compile(r"((?:[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*):(?:"
                     r'"[A-Za-z0-9_ .,\']*"'
                     r"|[\[{](?:[A-Za-z0-9_.]+|\*) TO (?:[A-Za-z0-9_.]+|\*)[\]}]"
                     r"|[A-Za-z0-9_]+~[012](?![0-9.])"
                     r"|[A-Za-z0-9_]+\*"
                     r"|[<>]=?[A-Za-z0-9_.]+"
                     r"|[A-Za-z0-9_]+(?:[.-][A-Za-z0-9_]+)*"
                     r"))")
_STAND_IN = "f:x"
_UNSEEN: Any = object()
_OPS = frozenset({"AND", "OR", "NOT"})
MAX_CHARS = 4096  # parse_fast's limit

# A shape's tree: a clause number, or (kind, children) with kind "a" (and), "o" (or), "n" (not).
Shape = int | tuple[str, tuple["Shape", ...]]
Builder = Callable[[list[PLeaf]], PNode]


class ShapeCache:
    """Shapes and clause leaves of the searches compiled so far (see the module doc)."""

    def __init__(self, schema: Schema, table: LeafTable) -> None:
        self.schema = schema
        self.table = table
        self.shapes: dict[str, Builder | None] = {}  # shape text → plan builder
        # Clause text → its plan leaf; AND, OR and NOT map to themselves (one lookup a piece).
        self.clauses: dict[str, PLeaf | str] = {op: op for op in _OPS}
        # The same keys, mapped to what a search's shape key writes for them: "\0" for a
        # clause, the operator itself; and shape key → a builder that takes the list of pieces
        # looked up in `clauses` (leaves at the key's "\0" positions), None if not a shape.
        self.kinds: dict[str, str] = {op: op for op in _OPS}
        self.direct: dict[str, Builder | None] = {}

    def plan(self, text: str) -> PNode | None:
        """The plan of `text`, or None when it is not a cached-shape search (then compile it
        with `compile_query`, which also reports errors)."""
        if len(text) > MAX_CHARS:
            return None
        # First without a regular expression: split at spaces and look every piece up (a
        # known clause, or AND/OR/NOT); a search made only of those (no parentheses, phrases
        # or ranges, the most common kind) is built by its shape key's builder. A clause in
        # `clauses` was accepted by the regular-expression split below, so both ways cut the
        # text into the same shape and clauses.
        get = self.clauses.get
        pieces = text.split(" ")
        try:  # no Python loop: a piece that is not a known clause or operator raises
            key = " ".join(map(self.kinds.get, pieces))  # type: ignore[arg-type]
        except TypeError:
            return self._plan_split(text)
        direct = self.direct.get(key, _UNSEEN)
        if direct is _UNSEEN:
            direct = self.direct[key] = self._direct(key)
        if direct is None:
            return None
        return direct(list(map(get, pieces)))  # type: ignore[arg-type]

    def _direct(self, key: str) -> Builder | None:
        """The builder over the looked-up pieces for shape key `key` (see `kinds`)."""
        shape = self.shapes.get(key, _UNSEEN)
        if shape is None:
            return None
        tree = _shape(key.split("\0"))
        if tree is None:
            return None
        if shape is _UNSEEN:
            self.shapes[key] = _builder(tree)
        positions = [i for i, k in enumerate(key.split(" ")) if k == "\0"]
        return _builder(_remap(tree, positions), False)

    def _plan_split(self, text: str) -> PNode | None:
        parts = _CLAUSE.split(text)
        n = len(parts) >> 1
        if n == 0:
            return None
        key = "\0".join(parts[0::2])
        build = self.shapes.get(key)
        if build is None and key not in self.shapes:
            build = self.shapes[key] = _builder(_shape(parts[0::2]))
        if build is None:
            return None
        texts = parts[1::2]
        leaves = list(map(self.clauses.get, texts))
        if None in leaves:  # (a clause is never an operator: it has a field)
            for i, c in enumerate(texts):
                if leaves[i] is None:
                    leaf = self._clause(c)
                    if leaf is None:
                        return None
                    leaves[i] = leaf
        return build(leaves)  # type: ignore[arg-type]

    def _clause(self, text: str) -> PLeaf | None:
        q = _leaf(text)
        if q is None:
            return None
        try:
            leaf = plan(q, self.schema, text, self.table)
        except Exception:  # the full path reports it, with the span in the whole search
            return None
        assert isinstance(leaf, PLeaf)
        self.clauses[text] = leaf
        self.kinds[text] = "\0"
        return leaf


_ONE = re.compile(r"""(?P<field>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*):(?:
    (?P<phrase>"[A-Za-z0-9_ .,']*")
  | (?P<range>[\[{](?P<lo>[A-Za-z0-9_.]+|\*)\ TO\ (?P<hi>[A-Za-z0-9_.]+|\*)[\]}])
  | (?P<fuzzy>(?P<fw>[A-Za-z0-9_]+)~(?P<fd>[012])(?![0-9.]))
  | (?P<prefix>[A-Za-z0-9_]+)\*
  | (?P<cmp>(?P<cop>[<>]=?)(?P<cv>[A-Za-z0-9_.]+))
  | (?P<word>[A-Za-z0-9_]+(?:[.-][A-Za-z0-9_]+)*)
)\Z""", re.VERBOSE)
_KEYWORDS = frozenset({"AND", "OR", "NOT", "TO"})


def _leaf(text: str) -> ast.Leaf | None:
    """The AST `parse_fast` gives for one `field:value` clause (positions included), without
    its tokenizer; None where parse_fast declines (`_exists_`, a keyword as value)."""
    m = _ONE.match(text)
    if m is None:
        return None
    field = m.group("field")
    if field == "_exists_":
        return None
    kind = m.lastgroup
    start = len(field) + 1
    meta: dict[str, Any] = {"loc": (start, len(text)), "label": " ".join(text.split())}
    if kind == "word":
        value = m.group("word")
        return None if value in _KEYWORDS else ast.Term(field, value, **meta)
    if kind == "prefix":
        return ast.Prefix(field, m.group("prefix"), **meta)
    if kind == "fuzzy":
        w = m.group("fw")
        return None if w in _KEYWORDS else ast.Fuzzy(field, w, int(m.group("fd")), **meta)
    if kind == "phrase":
        return ast.Phrase(field, m.group("phrase")[1:-1], 0, **meta)
    if kind == "cmp":
        op, v = m.group("cop"), m.group("cv")
        if v in _KEYWORDS:
            return None
        if op[0] == ">":
            return ast.Range(field, v, None, op == ">=", False, **meta)
        return ast.Range(field, None, v, False, op == "<=", **meta)
    lo, hi, g = m.group("lo"), m.group("hi"), m.group("range")
    if lo in _KEYWORDS or hi in _KEYWORDS:
        return None
    return ast.Range(field, None if lo == "*" else lo, None if hi == "*" else hi,
                     g[0] == "[", g[-1] == "]", **meta)


def _shape(seps: list[str]) -> Shape | None:
    stand_in = _STAND_IN.join(seps)
    q = parse_fast(stand_in)
    if q is None:
        return None
    count = [0]

    def walk(node: ast.Query) -> Shape | None:
        if isinstance(node, (ast.And, ast.Or)):
            kids = []
            for c in node.children:
                k = walk(c)
                if k is None:
                    return None
                kids.append(k)
            return ("a" if isinstance(node, ast.And) else "o", tuple(kids))
        if isinstance(node, ast.Not):
            k = walk(node.child)
            return None if k is None else ("n", (k,))
        if isinstance(node, ast.Term) and node.field == "f" and node.value == "x" \
                and node.label == _STAND_IN:
            count[0] += 1
            return count[0] - 1
        return None

    tree = walk(q)
    if tree is None or count[0] != len(seps) - 1:
        return None
    return tree


def _remap(shape: Shape, positions: list[int]) -> Shape:
    """`shape` with clause number i replaced by positions[i]."""
    if isinstance(shape, int):
        return positions[shape]
    kind, kids = shape
    return (kind, tuple(_remap(k, positions) for k in kids))


def _builder(shape: Shape | None, top: bool = True) -> Builder | None:
    """A function from a search's clause leaves to its plan, for one shape."""
    if shape is None:
        return None
    if isinstance(shape, int):
        return itemgetter(shape)
    kind, kids = shape
    if kind == "n":
        inner = _builder(kids[0], False)
        assert inner is not None
        return lambda leaves: PNot(inner(leaves))
    node = PAnd if kind == "a" else POr
    if len(kids) > 1 and all(isinstance(k, int) for k in kids):
        ints = cast("tuple[int, ...]", kids)
        if top and ints == tuple(range(len(ints))):
            return lambda leaves: node(tuple(leaves))  # the whole search: `a AND b AND c`
        pick = itemgetter(*ints)
        return lambda leaves: node(pick(leaves))
    parts = [_builder(k, False) for k in kids]
    return lambda leaves: node(tuple([p(leaves) for p in parts]))  # type: ignore[misc]
