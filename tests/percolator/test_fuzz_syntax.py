"""Fuzzing the saved-search query parser: any text gives a query or our QueryError (with a
position), never another exception, and inputs up to the size limit are handled (no
wall-clock window is asserted: speed belongs to benchmarks)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cep.errors import QueryError
from percolator.engine import compile_query
from percolator.syntax import MAX_QUERY_CHARS
from tests.hyp import examples

TOKENS = ["title:", "price:", "AND", "OR", "NOT", "+", "-", "(", ")", '"', "[", "]", "{", "}",
          " TO ", "*", "?", "~", "~1", "~2", "/", "^2", ">=", "<", "_exists_:", ":", "\\",
          "amsterdam", "3", "2024-01-31", "a.b:", "~\"blue bike\"@85", " ", "\t", "\n", "é", "∑"]


def _check(text: str) -> None:
    try:
        compile_query(text)  # parse, analyse, compile matchers and index keys
    except QueryError as err:
        assert err.span is not None and err.span.line >= 1 and err.span.col >= 1
        assert err.render()


@settings(max_examples=examples(300), deadline=None)
@given(st.text(max_size=200))
def test_random_text(text):
    _check(text)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.sampled_from(TOKENS), max_size=60))
def test_token_soup(tokens):
    _check("".join(tokens))


@settings(max_examples=examples(20), deadline=None)
@given(st.lists(st.sampled_from(TOKENS), min_size=500, max_size=2000))
def test_large_inputs_bounded_time(tokens):
    _check("".join(tokens)[:MAX_QUERY_CHARS + 100])


def test_deep_nesting_is_a_clear_error_not_a_crash():
    _check("(" * 5000 + "a" + ")" * 5000)
    _check("NOT " * 3000 + "a")
