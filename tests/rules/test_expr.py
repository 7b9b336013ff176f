"""Expressions: three-valued logic, and vectorised evaluation equal to the closures."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cep.compile.diagnostics import Diagnostics
from cep.compile.expressions import Scope, resolve
from cep.expr_columns import condition_mask
from cep.grammar import parse_expression
from tests.hyp import examples

SCHEMA = {"v": "number", "x": "number", "name": "string", "flag": "boolean",
          "p": {"v": "number", "q": {"s": "string"}}}


def compile_expr(text: str):
    diag = Diagnostics(text)
    out = resolve(parse_expression(text), Scope({}, SCHEMA, None), diag)
    assert out is not None, [e.render() for e in diag.errors]
    return out[0]


def test_three_valued_logic():
    cases = {
        "v > 1": {None: None},
        "v > 1 OR TRUE": {None: True},
        "v > 1 AND FALSE": {None: False},
        "NOT v > 1": {None: None, 2: False, 0: True},
        "v IS NULL": {None: True, 1: False},
        "v IN (1, 2)": {None: None, 1: True, 3: False},
        "v NOT IN (1, 2)": {None: None, 1: False, 3: True},
        "v / 0 IS NULL": {1: True},
        "COALESCE(v, 7) = 7": {None: True, 1: False},
    }
    for text, expectations in cases.items():
        fn = compile_expr(text).bind()
        for value, expected in expectations.items():
            assert fn({"v": value}, ()) is expected, (text, value)


def test_strings_and_regex():
    fn = compile_expr("name MATCHES '^ab+c$' AND name CONTAINS 'b' AND name STARTS WITH 'a'").bind()
    assert fn({"name": "abbc"}, ()) is True
    assert fn({"name": "abd"}, ()) is False
    assert fn({"name": None}, ()) is None
    assert fn({"name": 5}, ()) is None  # wrong runtime type: NULL, not an exception


LOCAL = [
    "v > 1",
    "v + x * 2 >= 3",
    "NOT (v > 1 AND x < 2)",
    "v IS NULL OR x IS NOT NULL",
    "v IN (1, 2, 3)",
    "v BETWEEN 1 AND 2",
    "name CONTAINS 'a'",
    "name MATCHES '^[ab]'",
    "ABS(x) > 1 OR LOWER(name) = 'ab'",
    "v % 2 = 0",
    "-v < x",
    "flag = TRUE OR v / x > 1",
    "name = 'ab' OR name IS NULL",
    "COALESCE(v, x) > 1",
    "p:v > 1 OR p:q:s = 'a'",
    "p:v IS NULL AND p:q:s IS NOT NULL",
    "p:v + v >= 2 OR UPPER(p:q:s) = 'AB'",
]
values = st.one_of(st.none(), st.integers(-3, 3))
fvalues = st.one_of(st.none(), st.floats(-3, 3, allow_nan=False))
names = st.one_of(st.none(), st.sampled_from(["", "a", "ab", "ba", "AB"]))
rows = st.lists(
    st.fixed_dictionaries(
        {"v": values, "x": fvalues, "name": names, "flag": st.one_of(st.none(), st.booleans()),
         "p": st.one_of(st.none(), st.just("p"), st.fixed_dictionaries({}, optional={
             "v": values, "q": st.one_of(st.none(), st.fixed_dictionaries({}, optional={
                 "s": names}))}))}
    ),
    min_size=0,
    max_size=12,
)


@settings(max_examples=examples(150), deadline=None)
@given(rows=rows, which=st.sampled_from(LOCAL))
def test_eval_columns_equals_closure(rows, which):
    node = compile_expr(which)
    assert node.is_local
    fn = node.bind()
    expected = np.array([fn(r, ()) is True for r in rows], dtype=bool)
    # columns as the engine would build them: numbers as float with NaN for NULL, the rest object
    cols = {
        "v": np.array([np.nan if r["v"] is None else r["v"] for r in rows], dtype=float),
        "x": np.array([np.nan if r["x"] is None else r["x"] for r in rows], dtype=float),
        "name": np.array([r["name"] for r in rows], dtype=object),
        "flag": np.array([r["flag"] for r in rows], dtype=object),
        "p": np.array([r["p"] for r in rows] + [None], dtype=object)[:-1],  # (a 1-d array)
    }
    got = condition_mask(node, cols)
    assert got.dtype == bool and got.tolist() == expected.tolist(), (which, rows)


def test_non_local_expression_refuses_vectorisation():
    diag = Diagnostics("")
    tree = resolve(parse_expression("v > PREV(v)"), Scope({}, SCHEMA, None), diag)
    assert tree is not None and not tree[0].is_local
