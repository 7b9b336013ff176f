"""percolator/shapes.py: a search compiled from its cached shape and clauses has the plan the
full path (`compile_query`) gives with the same LeafTable — the same tree over the same leaf
objects — or declines (None); it never accepts a text the full path rejects."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench import apt_corpus
from cep.errors import QueryError
from percolator import FieldType, Schema
from percolator.compile import LeafTable, PAnd, PLeaf, PNode, PNot, POr
from percolator.engine import compile_query
from percolator.fastparse import parse_fast
from percolator.shapes import _CLAUSE, ShapeCache, _leaf
from tests.hyp import examples
from tests.percolator.test_fastparse import full, leaf, query

SCHEMA = Schema({"title": FieldType.TEXT, "body": FieldType.TEXT, "section": FieldType.KEYWORD,
                 "size": FieldType.NUMBER, "day": FieldType.DATE},
                default_fields=("title", "body"))


def same(a: PNode, b: PNode) -> bool:
    if isinstance(a, PLeaf) or isinstance(b, PLeaf):
        return a is b
    if type(a) is not type(b):
        return False
    if isinstance(a, PNot):
        assert isinstance(b, PNot)
        return same(a.child, b.child)
    assert isinstance(a, (PAnd, POr)) and isinstance(b, (PAnd, POr))
    return len(a.children) == len(b.children) and all(
        same(x, y) for x, y in zip(a.children, b.children, strict=True))


def check(cache: ShapeCache, text: str) -> PNode | None:
    """Both ways of `text` (the second call takes the no-regex path when the first cached its
    clauses) against the full path."""
    got = [cache.plan(text), cache.plan(text)]
    try:
        want = compile_query(text, cache.schema, table=cache.table).plan
    except QueryError:
        assert got == [None, None], text
        return None
    for g in got:
        assert g is None or same(g, want), text
    return got[1]


def test_corpus_searches_all_take_the_shape_path() -> None:
    events, _ = apt_corpus.load("sample")
    cache = ShapeCache(apt_corpus.SCHEMA, LeafTable())
    searches = apt_corpus.queries(events, 3000)
    for s in searches:
        assert check(cache, s.query) is not None, s.query
    assert len(cache.shapes) <= 12  # a handful of shapes serve every search


TRICKY = [
    "body:foo", "body:AND", "body:AND*", "body:NOT bar", "body:foo AND", "AND body:foo",
    "body:foo  AND body:bar", " body:foo", "body:foo ", "body:foo*", "body:foo~1",
    "body:foo~3", "body:foo~1.5", 'body:"a b"', 'body:"a  b"', 'body:"a b"~2', 'body:"a b',
    "body:[a TO b]", "body:[a TO b", "size:[1 TO 9]", "size:[a TO 9]", "size:abc",
    "size:12 AND day:2024-01-01", "day:[2024-01-01 TO 2024-02-01]", "body:foo:bar",
    "xbody:foo", "1body:foo", "a.body:foo", "(body:a OR body:b) AND NOT section:c",
    "((body:a))", "(body:a", "body:a)", "NOT NOT body:a", "body:a AND (body:b OR (body:c "
    "AND NOT body:d))", "body:a OR body:b OR body:c", "body:a AND body:b OR body:c",
    "body:a body:b", "+body:a", "-body:a", "body:a^2", "body:foo-bar AND body:x.y",
    "body:foo.", "body:(a OR b)", "_exists_:body", "section:web", "section:[a TO z]",
    "title:a~0", "body:\"it's\"", "body:a AND title:\"x y\" AND size:[1 TO *]",
    "body:a\tAND body:b", "body:a AND NOT", "body:TO", "body:[TO TO b]",
]


def test_tricky_texts_agree_or_decline() -> None:
    cache = ShapeCache(SCHEMA, LeafTable())
    for _ in range(2):  # the second round finds every clause cached
        for text in TRICKY:
            check(cache, text)


@st.composite
def searches(draw: st.DrawFn) -> list[str]:
    """Several searches over shared clauses, so later ones hit the caches."""
    return draw(st.lists(query(), min_size=1, max_size=6))


@settings(max_examples=examples(300), deadline=None)
@given(searches())
def test_generated_texts_agree_or_decline(texts: list[str]) -> None:
    cache = ShapeCache(SCHEMA, LeafTable())
    for text in texts + texts:
        check(cache, text)


@pytest.mark.parametrize("schema", [SCHEMA, Schema()])
def test_clauses_are_shared_between_shapes(schema: Schema) -> None:
    cache = ShapeCache(schema, LeafTable())
    a = check(cache, "body:x AND body:y")
    b = check(cache, "(body:y OR body:z) AND NOT body:x")
    assert isinstance(a, PAnd) and isinstance(b, PAnd)
    assert a.children[0] is b.children[1].child  # type: ignore[union-attr]


@settings(max_examples=examples(300), deadline=None)
@given(leaf())
def test_one_clause_is_read_as_parse_fast_reads_it(text: str) -> None:
    got, want = _leaf(text), parse_fast(text)
    if got is None:  # declines only what parse_fast declines, among the split's clauses
        assert want is None or not _CLAUSE.fullmatch(text), text
        return
    assert want is not None and full(got) == full(want), text
