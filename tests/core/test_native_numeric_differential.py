"""Differential test of the core's numeric fast path (`Expr::num` in core/src/expr.rs: ints,
bools and floats compared and computed without `Value`s or Python, condition aggregates read from
a partial match's running state) and of the per-run deadline of rules without STEP WITHIN
(core/src/matcher.rs `advance` / `settle`), against the Python engine, which is the
specification.

Conditions are random arithmetic over fields whose values mix ints, bools, floats (0.0, NaN,
infinities), NULL (missing or None), ints near and beyond 64 bits and strings, with constants of
both kinds: `+ - * / %` (so division and modulo by zero, int overflow, inexact int division), all
six comparisons, nested to depth 2, and the aggregates the fast path reads (`SUM AVG MIN MAX
COUNT`, over another variable and in the variable's own DEFINE so the tested row counts, of a
field or of an expression). Patterns repeat variables (the trading shape `a{2,} b` among them)
under WITHIN alone, WITHIN with STEP WITHIN, or no limit, some with ON TIMEOUT, so deadlines are
read per run and per entry. Every stream goes through both engines at batch sizes 1, 3 and all,
from events and from Arrow where the fields have one type each; everything observable must be
identical (results and their value types, late reports, keys, wake times).

CI profile: 60 rule sets x 8 streams; HYPOTHESIS_PROFILE=dev 10, deep 600
(`CEP_NUM_DIFF_EXAMPLES` sets the number).
"""

from __future__ import annotations

import math
import os

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cep.compile import CompileErrors, compile_rules
from cep.runtime.engine import Event
from tests.core.test_native_engine_differential import (
    arrow_table,
    both_engines,
    make_events,
    same_results,
)
from tests.hyp import examples

EXAMPLES = int(os.environ.get("CEP_NUM_DIFF_EXAMPLES") or examples(60))
STREAMS = 8
BATCHES = (1, 3, 10_000)

PATTERNS = ("a{2,} b", "a b+ c", "a+ b", "a b{2,}", "a -> b+ -> c", "(a b)+ c", "a b")
# `i` ints (and bools, big ints, strings in dirty streams), `f` floats (zeros, NaN, inf), `z`
# a zero of either kind or NULL, `n` mostly NULL.
LEAVES = ("i", "f", "z", "n", "2", "0", "-3", "0.5", "1.5", "-2.0", "9223372036854775807",
          "PREV(i)", "PREV(f)", "{v}.f", "FIRST({v}.i)", "LAST({v}.f)")
OPS = ("+", "-", "*", "/", "%")
CMPS = ("<", "<=", ">", ">=", "=", "!=")
FUNCS = ("SUM", "AVG", "MIN", "MAX", "COUNT")


@st.composite
def term(draw: st.DrawFn, variables: list[str], own: str, depth: int = 0) -> str:
    """A numeric term of `own`'s condition: a leaf, an aggregate (mostly over `own` itself,
    so the tested row counts) or an operation on two terms."""
    kind = draw(st.integers(0, 6 if depth < 2 else 4))
    if kind <= 2:
        return draw(st.sampled_from(LEAVES)).format(v=draw(st.sampled_from(variables)))
    if kind <= 4:
        func = draw(st.sampled_from(FUNCS))
        var = draw(st.sampled_from((own, own, *variables)))
        row = draw(st.sampled_from(("{v}.i", "{v}.f", "{v}.i - {v}.f", "{v}.f * 2", "{v}.z",
                                    "{v}.i / {v}.z"))).format(v=var)
        return f"{func}({row})"
    left, right = draw(term(variables, own, depth + 1)), draw(term(variables, own, depth + 1))
    return f"({left} {draw(st.sampled_from(OPS))} {right})"


@st.composite
def condition(draw: st.DrawFn, variables: list[str], own: str) -> str:
    text = (f"{draw(term(variables, own))} {draw(st.sampled_from(CMPS))} "
            f"{draw(term(variables, own))}")
    if draw(st.integers(0, 3)) == 0:
        text = f"({text}) {draw(st.sampled_from(('AND', 'OR')))} t = 'a'"
    return text


@st.composite
def rule_text(draw: st.DrawFn) -> str:
    pattern = draw(st.sampled_from(PATTERNS))
    variables = [v for v in "abc" if v in pattern]
    conds = []
    for v in variables:
        # The earlier variables mostly take nothing, a permissive filter or a random condition
        # or'ed with one, so partial matches grow long; the last mostly a random condition.
        kind = draw(st.integers(0, 5)) if v != variables[-1] else draw(st.integers(3, 6))
        if kind <= 1:
            continue
        if kind == 2:
            conds.append(f"{v} AS {draw(st.sampled_from(('f >= 0', 'i != 3', 't != (SELF)')))}"
                         .replace("(SELF)", f"'{v}'"))
        elif kind == 3:
            conds.append(f"{v} AS ({draw(condition(variables, v))}) OR t != 'c'")
        else:
            conds.append(f"{v} AS {draw(condition(variables, v))}")
    limit = draw(st.sampled_from(("WITHIN 8ms", "WITHIN 8ms", "WITHIN 9ms STEP WITHIN 3ms",
                                  "ALLOW UNBOUNDED")))
    parts = ["RULE r FROM s PARTITION BY k", f"PATTERN ({pattern})"]
    if conds:
        parts.append("DEFINE " + ", ".join(conds))
    parts.append(limit)
    parts.append(f"MEASURES {draw(term(variables, variables[0]))} AS m0, AVG(f) AS m1")
    parts.append(draw(st.sampled_from(("AFTER MATCH SKIP PAST LAST ROW",
                                       "AFTER MATCH SKIP TO NEXT ROW", "ALL MATCHES"))))
    parts.append("EMIT 'r'")
    if limit != "ALLOW UNBOUNDED" and draw(st.booleans()):
        parts.append("ON TIMEOUT EMIT 'to'")
    return " ".join(parts) + ";"


clean_i = st.integers(-3, 4)
dirty_i = st.one_of(clean_i, st.sampled_from((None, True, False, 2**62, 2**63 - 1, -2**63,
                                              2**70, "2", 1.0)))
clean_f = st.sampled_from((0.5, -2.5, 1.0, 3.25, 0.0, -0.0, 1e300))
dirty_f = st.one_of(clean_f, st.sampled_from((math.nan, math.inf, -math.inf, None, 3, "x")))


def event(dirty: bool):  # type: ignore[no-untyped-def]
    return st.fixed_dictionaries(
        {"t": st.sampled_from("abc"), "k": st.sampled_from(("K", "J")),
         "i": dirty_i if dirty else clean_i, "f": dirty_f if dirty else clean_f,
         "z": st.sampled_from((0, 0.0, None, 1))},
        optional={"n": st.sampled_from((None, 2, 0.5))},
    )


streams = st.booleans().flatmap(lambda dirty: st.tuples(
    st.lists(st.tuples(event(dirty), st.integers(0, 3)), min_size=4, max_size=24),
    st.integers(0, 2**32), st.booleans()))


def _compiled(text: str):  # type: ignore[no-untyped-def]
    try:
        return compile_rules("STREAM s TIME BY ts LATENESS 2ms;\n" + text, "p.cep")
    except CompileErrors:
        return None


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(text=rule_text(), cases=st.lists(streams, min_size=STREAMS, max_size=STREAMS))
def test_native_numeric_fast_path_equals_python(text: str, cases: list) -> None:
    ruleset = _compiled(text)
    assume(ruleset is not None)
    python, native, lateness = both_engines(ruleset, text)
    for raw, seed, roundtrip in cases:
        events: list[Event] = make_events([(d, gap, "s") for d, gap in raw], seed, 0, "int",
                                          lateness)
        table = arrow_table(events)
        for batch in BATCHES:
            same_results(python, native, events, table, batch, roundtrip, text)


# The trading rule's shape (bench/rules/trading.cep, spread_spike) on ticks where the spread
# is an int, a float, NULL or zero: the AVG of the calm ticks' spreads (ints: a float average)
# against the tested tick's spread, many runs alive at once under WITHIN.
SPIKE = """
STREAM s TIME BY ts LATENESS 2ms;
RULE spike FROM s PARTITION BY k
  PATTERN (calm{3,} spike)
  DEFINE calm AS ask - bid < 0.002 * price, spike AS ask - bid > 3 * AVG(calm.ask - calm.bid)
  WITHIN 20ms
  MEASURES AVG(calm.ask - calm.bid) AS normal, spike.ask - spike.bid AS spread
  AFTER MATCH SKIP PAST LAST ROW
  EMIT 'spike';
"""

tick = st.fixed_dictionaries({
    "k": st.sampled_from(("A", "B")),
    "price": st.sampled_from((10_000, 10_000.0, 5_000, None, 0)),
    "bid": st.sampled_from((100, 100.0, 99.5, None)),
    "ask": st.sampled_from((100, 100.0, 101, 101.5, 104, 110.0, 200)),
})


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(raw=st.lists(st.tuples(tick, st.integers(0, 4)), min_size=6, max_size=40),
       seed=st.integers(0, 2**32))
def test_native_spread_spike_equals_python(raw: list, seed: int) -> None:
    ruleset = compile_rules(SPIKE, "spike.cep")
    python, native, lateness = both_engines(ruleset, SPIKE)
    events = make_events([(d, gap, "s") for d, gap in raw], seed, 0, "int", lateness)
    table = arrow_table(events)
    for batch in BATCHES:
        same_results(python, native, events, table, batch, False, SPIKE)


# Fixed cases beside the random ones (each reaches one branch of the fast path for sure): an
# aggregate in its own variable's DEFINE (the tested row counts), ints averaged to a float, a
# division and a modulo by zero, an int sum leaving 64 bits, NaN, bools as ints, MIN/MAX with
# the tested row, under WITHIN (per-run deadlines) and STEP WITHIN (per-entry deadlines).
FIXED_CONDITIONS = (
    "AVG(a.i) < 2", "SUM(a.i) * 1.5 <= 6", "MIN(a.f) > -1", "MAX(a.i) - MIN(a.i) <= 2",
    "COUNT(a.i) * 0.5 < 2", "i / z >= 0", "i % z = 0", "f / (i - i) < 1", "SUM(a.i) > 0",
    "AVG(a.i - a.f) != 1.25", "i + 9223372036854775807 > 0", "f = f", "b2 + 1 = 2",
)
FIXED_STREAM = [
    {"t": "a", "k": "K", "i": 1, "f": 0.5, "z": 0, "b2": True},
    {"t": "a", "k": "K", "i": 2, "f": -2.5, "z": 0.0, "b2": False},
    {"t": "a", "k": "K", "i": 3, "f": 1.0, "z": None, "b2": True},
    {"t": "a", "k": "K", "i": 2**62, "f": math.nan, "z": 1, "b2": True},
    {"t": "a", "k": "K", "i": 1, "f": 0.5, "z": 0, "b2": False},
    {"t": "a", "k": "K", "i": 0, "f": 3.25, "z": 0, "b2": True},
    {"t": "b", "k": "K", "i": 2, "f": 0.0, "z": 0, "b2": True},
    {"t": "a", "k": "K", "i": None, "f": 1.0, "z": 1, "b2": None},
    {"t": "a", "k": "K", "i": 1, "f": 1.0, "z": 1, "b2": True},
    {"t": "b", "k": "K", "i": 1, "f": 1.0, "z": 1, "b2": True},
]


def test_native_numeric_fixed_cases_equal_python() -> None:
    for cond in FIXED_CONDITIONS:
        for limit in ("WITHIN 8ms", "WITHIN 9ms STEP WITHIN 2ms"):
            text = (f"RULE r FROM s PARTITION BY k PATTERN (a{{2,}} b) DEFINE a AS {cond}, "
                    f"b AS t = 'b' {limit} MEASURES AVG(i) AS m1, SUM(a.f) AS m2 "
                    "AFTER MATCH SKIP PAST LAST ROW EMIT 'r' ON TIMEOUT EMIT 'to';")
            ruleset = _compiled(text)
            assert ruleset is not None, text
            python, native, lateness = both_engines(ruleset, text)
            events = make_events([(d, 1, "s") for d in FIXED_STREAM], 0, 0, "int", lateness)
            for batch in BATCHES:
                same_results(python, native, events, None, batch, True, text)
