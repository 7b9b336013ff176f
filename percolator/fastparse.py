"""A fast path for the query shapes most saved searches have, beside luqum (issue 17).

luqum (PLY) costs ~1 ms per query, most of an index build. Most saved searches are a handful of
`field:value` clauses joined by explicit AND/OR/NOT with parentheses, where the value is a plain
word, `word*`, `word~N`, a `"phrase"`, a `[a TO b]` range or a comparison (`>=n`, `>n`, `<=n`,
`<n`). `parse_fast` recognises exactly that subset with one regular-expression tokenizer and a
recursive descent, and returns None for anything else (escapes, wildcards, regexes, boosts, `+`/`-`,
implicit operators, field groups, similarity, leading/trailing space, ...), which then goes to
`percolator.syntax.parse`.

It builds the same AST, positions and labels included, as the luqum path: tests/percolator/
test_fastparse.py checks that on the real-corpus searches and on generated shapes. Errors are
never raised here: an invalid query returns None and luqum reports it with its hint.
"""

from __future__ import annotations

import re
from typing import Any

from percolator import ast
from percolator.syntax import MAX_CLAUSES, MAX_DEPTH, _and, _or

# One token per match; the group name is the token kind. Whitespace after a token is its tail.
_TOKEN = re.compile(r"""
    (?P<op>(?:AND|OR|NOT)(?=\ ))
  | (?P<field>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*):
  | (?P<phrase>"[A-Za-z0-9_ .,']*")
  | (?P<range>[\[{](?P<lo>[A-Za-z0-9_.]+|\*)\ TO\ (?P<hi>[A-Za-z0-9_.]+|\*)[\]}])
  | (?P<fuzzy>(?P<fw>[A-Za-z0-9_]+)~(?P<fd>[012])(?![0-9.]))
  | (?P<prefix>[A-Za-z0-9_]+)\*
  | (?P<cmp>(?P<cop>[<>]=?)(?P<cv>[A-Za-z0-9_.]+))
  | (?P<word>[A-Za-z0-9_]+(?:[.-][A-Za-z0-9_]+)*)
  | (?P<open>\()
  | (?P<close>\))
""", re.VERBOSE)
_SPACE = re.compile(r" *")
_KEYWORDS = frozenset({"AND", "OR", "NOT", "TO"})


class _Bail(Exception):
    """Not a fast-path shape: use luqum."""


def parse_fast(text: str) -> ast.Query | None:
    """The AST of `text` if it is one of the common shapes, else None."""
    if not text or text[0] == " " or text[-1] == " " or len(text) > 4096:
        return None
    toks: list[tuple[str, Any, int, int, int]] = []  # kind, match, start, end, tail end
    pos, n = 0, len(text)
    tm, sm = _TOKEN.match, _SPACE.match
    while pos < n:
        m = tm(text, pos)
        if m is None:
            return None
        end = m.end()
        space = sm(text, end)
        tail = space.end() if space else end
        kind = m.lastgroup
        if kind in ("lo", "hi", "fw", "fd", "cop", "cv"):  # pragma: no cover - inner ones end later
            return None
        assert kind is not None
        toks.append((kind, m, m.start(), end, tail))
        pos = tail
    try:
        p = _Descent(text, toks)
        q = p.expr(0)
        if p.i != len(toks):
            return None
        return q
    except _Bail:
        return None


class _Descent:
    def __init__(self, text: str, toks: list[tuple[str, Any, int, int, int]]) -> None:
        self.text = text
        self.toks = toks
        self.i = 0
        self.clauses = 0

    def peek(self) -> tuple[str, Any, int, int, int] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def is_op(self, word: str) -> bool:
        t = self.peek()
        return t is not None and t[0] == "op" and t[1].group() == word

    def meta(self, first: int, last: int) -> dict[str, Any]:
        start, end = self.toks[first][2], self.toks[last][4]
        return {"loc": (start, end), "label": self.text[start:end]}

    def expr(self, depth: int) -> ast.Query:
        if depth > MAX_DEPTH - 8:
            raise _Bail
        first = self.i
        kids = [self.conj(depth)]
        while self.is_op("OR"):
            self.i += 1
            kids.append(self.conj(depth))
        if len(kids) == 1:
            return kids[0]
        return _or(kids, self.meta(first, self.i - 1))

    def conj(self, depth: int) -> ast.Query:
        first = self.i
        kids = [self.unary(depth)]
        while self.is_op("AND"):
            self.i += 1
            kids.append(self.unary(depth))
        if len(kids) == 1:
            return kids[0]
        return _and(kids, self.meta(first, self.i - 1))

    def unary(self, depth: int) -> ast.Query:
        first = self.i
        if self.is_op("NOT"):
            self.i += 1
            child = self.unary(depth + 1)
            return ast.Not(child, **self.meta(first, self.i - 1))
        t = self.peek()
        if t is None:
            raise _Bail
        if t[0] == "open":
            self.i += 1
            q = self.expr(depth + 1)
            t2 = self.peek()
            if t2 is None or t2[0] != "close":
                raise _Bail
            self.i += 1
            return q
        return self.leaf()

    def leaf(self) -> ast.Query:
        t = self.toks[self.i]
        field: str | None = None
        fstart = t[2]
        if t[0] == "field":
            field = t[1].group("field")
            if field == "_exists_" or self.toks[self.i][4] != self.toks[self.i][3]:
                raise _Bail  # `_exists_:` and `field: value` go to luqum
            self.i += 1
            t = self.peek()  # type: ignore[assignment]
            if t is None:
                raise _Bail
        kind, m, start, end, tail = t
        self.i += 1
        self.clauses += 1
        if self.clauses > MAX_CLAUSES:
            raise _Bail
        label = " ".join(self.text[fstart:end].split())
        if field is None:
            if kind in ("phrase", "range") or kind not in ("word", "prefix", "fuzzy"):
                raise _Bail
        meta: dict[str, Any] = {"loc": (start, end), "label": label}
        if kind == "word":
            value = m.group("word")
            if value in _KEYWORDS:
                raise _Bail
            return ast.Term(field, value, **meta)
        if kind == "prefix":
            return ast.Prefix(field, m.group("prefix"), **meta)
        if kind == "fuzzy":
            if m.group("fw") in _KEYWORDS:
                raise _Bail
            return ast.Fuzzy(field, m.group("fw"), int(m.group("fd")), **meta)
        if kind == "phrase":
            return ast.Phrase(field, m.group("phrase")[1:-1], 0, **meta)
        if kind == "range":
            g = m.group("range")
            lo, hi = m.group("lo"), m.group("hi")
            if lo in _KEYWORDS or hi in _KEYWORDS:
                raise _Bail
            return ast.Range(field, None if lo == "*" else lo, None if hi == "*" else hi,
                             g[0] == "[", g[-1] == "]", **meta)
        if kind == "cmp":  # `beds:>=3`: luqum's From/To, a half-open range
            op, v = m.group("cop"), m.group("cv")
            if v in _KEYWORDS:
                raise _Bail
            meta["loc"] = (start, tail)  # luqum's From/To span takes the spaces after it
            if op[0] == ">":
                return ast.Range(field, v, None, op == ">=", False, **meta)
            return ast.Range(field, None, v, False, op == "<=", **meta)
        raise _Bail
