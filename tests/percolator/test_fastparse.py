"""The fast path (percolator.fastparse) gives the luqum path's AST, positions and labels included,
or declines (None) — on the real-corpus searches and on generated query shapes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench import apt_corpus
from percolator import ast
from percolator.fastparse import parse_fast
from percolator.syntax import parse, parse_luqum
from tests.hyp import examples


def full(q: ast.Query) -> Any:
    """The node with its positions and labels (which `==` leaves out)."""
    if isinstance(q, (ast.And, ast.Or)):
        return (type(q).__name__, q.loc, q.label, tuple(full(c) for c in q.children))
    if isinstance(q, ast.Not):
        return ("Not", q.loc, q.label, full(q.child))
    return (q, q.loc, q.label)


@pytest.fixture(scope="module")
def corpus_queries() -> list[str]:
    events, _ = apt_corpus.load("sample")
    return [s.query for s in apt_corpus.queries(events, 3000)]


def test_corpus_queries_take_the_fast_path_and_agree(corpus_queries: list[str]) -> None:
    fast = 0
    for text in corpus_queries:
        got = parse_fast(text)
        if got is not None:
            fast += 1
            assert full(got) == full(parse_luqum(text)), text
    assert fast == len(corpus_queries)  # every generated shape is a fast-path shape


WORDS = st.sampled_from(["bike", "blue", "a", "x1", "3", "1.5", "amst", "AND", "TO", "ab_c",
                         "cli-mono", "a-1"])
FIELDS = st.sampled_from(["", "body:", "title:", "address.city:", "_exists_:", "f: "])


@st.composite
def leaf(draw: st.DrawFn) -> str:
    f = draw(FIELDS)
    w = draw(WORDS)
    kind = draw(st.sampled_from(["term", "prefix", "fuzzy", "phrase", "range", "cmp", "odd"]))
    if kind == "prefix":
        return f"{f}{w}*"
    if kind == "fuzzy":
        return f"{f}{w}~{draw(st.sampled_from(['0', '1', '2', '', '3', '1.5']))}"
    if kind == "phrase":
        return f'{f}"{w} {draw(WORDS)}"' + draw(st.sampled_from(["", "~2"]))
    if kind == "range":
        lo, hi = draw(WORDS), draw(st.sampled_from(["*", "9", "zz"]))
        return f"{f}{draw(st.sampled_from('[{'))}{lo} TO {hi}{draw(st.sampled_from(']}'))}"
    if kind == "cmp":
        return f"{f}{draw(st.sampled_from(['>', '>=', '<', '<=', '>= ', '=']))}{w}" + draw(
            st.sampled_from(["", "*", "~1", ")"]))
    if kind == "odd":
        return draw(st.sampled_from(["-x", "+y", "x^2", "a\\:b", "w?rd", "/re/", "*:*", "*"]))
    return f"{f}{w}"


@st.composite
def query(draw: st.DrawFn, depth: int = 0) -> str:
    if depth > 2 or draw(st.booleans()):
        return draw(leaf())
    op = draw(st.sampled_from([" AND ", " OR ", " AND NOT ", " ", "  AND  "]))
    parts = [draw(query(depth + 1)) for _ in range(draw(st.integers(2, 3)))]
    q = op.join(parts)
    if draw(st.booleans()):
        q = f"({q})"
    return draw(st.sampled_from(["NOT ", ""])) + q


@settings(max_examples=examples(400), deadline=None)
@given(query())
def test_fast_path_agrees_or_declines(text: str) -> None:
    got = parse_fast(text)
    try:
        want = parse_luqum(text)
    except Exception:
        assert got is None, text  # invalid text never takes the fast path
        return
    if got is not None:
        assert full(got) == full(want), text
    assert full(parse(text)) == full(want)


def test_structured_workload_takes_the_fast_path_and_agrees() -> None:
    # bench.percolation.structured: `city:x AND price:[lo TO hi] AND beds:>=n` among others.
    from bench.percolation import structured

    searches, _, _ = structured(2000, 1)
    texts = [s.query for s in searches] + ["a:>3 OR b:x", "a:>3  OR b:x", "(a:<=3) AND b:x",
                                           "NOT a:<1.5 AND b:x"]
    for text in texts:
        got = parse_fast(text)
        assert got is not None, text
        assert full(got) == full(parse_luqum(text)), text
