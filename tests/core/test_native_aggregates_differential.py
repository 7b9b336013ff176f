"""Differential test of the core's incremental aggregates: rules whose conditions read SUM, AVG,
COUNT, MIN and MAX over quantified variables (kept per partial match in the core, `CapVec::acc`),
against the Python matcher and engine, which recompute them over the match on every check.

The conditions are built from random aggregates (every function, over one variable or every
event, of a field or of an expression, `COUNT(b.*)`, in the variable's own DEFINE so the tested
row counts, several in one condition, compared with constants, fields, `PREV`, `FIRST` and each
other) on patterns where variables repeat (`b{2,}`, `a+`, `(a b)+`, reluctant and ANY
contiguity), with the repeating variables mostly behind permissive filters so matches grow
long. Streams (up to 24-30 events, longer than the other differential tests') are clean (numbers
in every event: aggregates run over many values and cross their thresholds) or dirty (missing
fields and None, NaN, strings beside numbers so `sum()` and `min()` raise TypeError: NULL,
ints beyond 64 bits once summed, booleans). A mutant core that stops folding after three values
fails both legs.

Two legs:
- the matcher (`native_matcher` vs `Matcher`): event by event and in batches of 2 and 4, with
  ticks of event time and, in some streams, the state pickled after every call (the running
  aggregates are not serialised: they are rebuilt from the captures after a load);
- the engine loop (`build_embedded_engine` vs the Python engine), with several keys, at batch
  sizes 1, 2, 3, 7 and all, the key states through their bytes after every call in some
  streams, and from Arrow batches where the fields have one type each.

CI profile: 60 rules x 12 streams per leg; HYPOTHESIS_PROFILE=dev 10 rules, deep 600
(`CEP_AGG_DIFF_EXAMPLES` sets the number of rules).
"""

from __future__ import annotations

import math
import os

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cep.compile import CompileErrors, compile_rules
from cep.runtime import Matcher
from cep.runtime.engine import Event
from cep.runtime.native import native_matcher, why_not_native
from tests.core.test_native_differential import drive, timed
from tests.core.test_native_engine_differential import (
    BATCHES,
    arrow_table,
    both_engines,
    make_events,
    same_results,
)
from tests.hyp import profile

EXAMPLES = int(os.environ.get("CEP_AGG_DIFF_EXAMPLES")
               or {"dev": 10, "ci": 60, "deep": 600}[profile()])
STREAMS = 12

# Patterns where variables repeat, so partial matches hold several captures of one variable.
PATTERNS = ("a b{2,} c", "a b+ c", "a+ b", "a b* c", "(a b)+ c", "a b{1,3}? c", "a -> b+ -> c",
            "a{2,} b?", "a b+", "a ->> b{2,4} c", "a (b | c)+", "a+ b+ c", "a b{3,}")
FUNCS = ("SUM", "AVG", "MIN", "MAX", "COUNT")
# Row expressions over one event; `{p}` is the variable's prefix (`b.`) or nothing.
ROWS = ("{p}v", "{p}v", "{p}f", "{p}v - {p}f", "{p}v * 2", "{p}s", "LENGTH({p}s)",
        "COALESCE({p}n, {p}v)", "{p}v / {p}f", "ABS({p}v)")
CMPS = ("<", "<=", ">", ">=", "=", "!=")
FILTERS = ("t != 'c'", "v IS NOT NULL", "v >= 0", "t = 'a' OR v >= 2", "f > 0", "v < 3")


@st.composite
def aggregate(draw: st.DrawFn, variables: list[str]) -> str:
    func = draw(st.sampled_from(FUNCS))
    var = draw(st.sampled_from([*variables, None]))
    if func == "COUNT" and var is not None and draw(st.integers(0, 2)) == 0:
        return f"COUNT({var}.*)"
    row = draw(st.sampled_from(ROWS)).format(p=f"{var}." if var else "")
    return f"{func}({row})"


THRESHOLDS = ("0", "1", "1.5", "2", "3", "4", "5", "6", "8", "10", "-1", "'b'")


@st.composite
def comparison(draw: st.DrawFn, variables: list[str]) -> str:
    """An aggregate against a threshold (which it crosses as the match grows), against the
    tested row (`v > AVG(b.v) * 2`, the trading rules' shape), against another aggregate, or
    tested for NULL."""
    left = draw(aggregate(variables))
    op = draw(st.sampled_from(CMPS))
    kind = draw(st.integers(0, 7))
    if kind <= 3:
        return f"{left} {op} {draw(st.sampled_from(THRESHOLDS))}"
    if kind <= 5:
        field = draw(st.sampled_from(("v", "f", "s", "PREV(v)", f"FIRST({variables[0]}.v)",
                                      "v - f")))
        scale = draw(st.sampled_from(("", " * 2", " * 0.5", " + 1")))
        return f"{field} {op} {left}{scale}"
    if kind == 6:
        return f"{left} {op} {draw(aggregate(variables))}"
    return f"{left} IS {draw(st.sampled_from(('', 'NOT ')))}NULL"


@st.composite
def condition(draw: st.DrawFn, variables: list[str]) -> str:
    parts = [draw(comparison(variables)) for _ in range(draw(st.integers(1, 3)))]
    text = parts[0]
    for p in parts[1:]:
        text = f"({text}) {draw(st.sampled_from(('AND', 'OR')))} {p}"
    if draw(st.integers(0, 3)) == 0:
        also = draw(st.sampled_from((f"t = '{variables[-1]}'", "v IS NOT NULL", "v >= 1")))
        text = f"({text}) AND {also}"
    return text


@st.composite
def rule_text(draw: st.DrawFn, rule_id: str = "r", partition: bool = False) -> str:
    pattern = draw(st.sampled_from(PATTERNS))
    variables = [v for v in "abc" if v in pattern]
    conds = []
    for v in variables:
        # The repeating variables mostly take a permissive filter (or nothing) so partial matches
        # grow long; the last variable mostly reads aggregates of the earlier ones.
        kind = draw(st.integers(0, 9))
        if v == variables[-1] and kind >= 2:
            kind = 9
        if kind <= 1:
            continue
        if kind <= 5:
            conds.append(f"{v} AS {draw(st.sampled_from(FILTERS))}")
            continue
        conds.append(f"{v} AS {draw(condition(variables))}")
    measures = [f"{draw(aggregate(variables))} AS m{i}" for i in range(draw(st.integers(0, 3)))]
    within = draw(st.sampled_from((None, 6, 12)))
    skip = draw(st.sampled_from(("AFTER MATCH SKIP PAST LAST ROW", "AFTER MATCH SKIP TO NEXT ROW",
                                 "ALL MATCHES")))
    parts = [f"RULE {rule_id} FROM s"]
    if partition:
        parts.append("PARTITION BY k")
    parts.append(f"PATTERN ({pattern})")
    if conds:
        parts.append("DEFINE " + ", ".join(conds))
    parts.append(f"WITHIN {within}ms" if within else "ALLOW UNBOUNDED")
    if measures:
        parts.append("MEASURES " + ", ".join(measures))
    if draw(st.integers(0, 4)) == 0:
        parts.append(f"MAX PARTIAL MATCHES {draw(st.integers(2, 6))}")
    parts.append(skip)
    parts.append(f"EMIT '{rule_id}'")
    if within and draw(st.booleans()):
        parts.append("ON TIMEOUT EMIT 'to'")
    return " ".join(parts) + ";"


# Dirty streams: any field may be missing, None, NaN, a string, a bool or 2**62 (so aggregates
# turn NULL, raise TypeError or leave 64 bits); clean streams: numbers in every event, so
# aggregates run over many values and cross their thresholds as matches grow.
dirty_values = st.one_of(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3), st.none(),
                         st.sampled_from((1.5, 0.0, -2.5, 2**62, "2", True, math.nan)))
clean_values = st.one_of(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3),
                         st.sampled_from((1.5, -1, 0.25, None)))
dirty_event = st.fixed_dictionaries(
    {"t": st.sampled_from("abc")},
    optional={"v": dirty_values, "f": st.sampled_from((0.5, 2.0, -1.0, 3, 0, None)),
              "s": st.sampled_from(("ab", "a_b", "Ab", "", "y", 5, None)),
              "n": st.sampled_from((None, 1, 0))},
)
clean_event = st.fixed_dictionaries(
    {"t": st.sampled_from("abc"), "v": clean_values, "f": st.sampled_from((0.5, 2.0, -1.0, 3)),
     "s": st.sampled_from(("ab", "a_b", "Ab", "", "y"))},
    optional={"n": st.sampled_from((None, 1, 0))},
)


def events_of(length: int):  # type: ignore[no-untyped-def]
    """Lists of (event, time gap): a clean stream (2 in 3) or a dirty one."""
    return st.sampled_from((clean_event, clean_event, dirty_event)).flatmap(
        lambda ev: st.lists(st.tuples(ev, st.integers(0, 2)), min_size=length // 3,
                            max_size=length))


def _compiled(text: str):  # type: ignore[no-untyped-def]
    try:
        return compile_rules("STREAM s TIME BY ts LATENESS 2ms;\n" + text, "p.cep")
    except CompileErrors:
        return None


scripts = st.tuples(st.sampled_from((1, 2, 4)), st.lists(st.integers(0, 5), max_size=3),
                    st.booleans(), st.booleans(), st.sampled_from((None, "key")))
matcher_streams = events_of(24)


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(text=rule_text(),
       cases=st.lists(st.tuples(matcher_streams, scripts), min_size=STREAMS, max_size=STREAMS))
def test_native_matcher_aggregates_equal_python(text: str, cases: list) -> None:
    ruleset = _compiled(text)
    assume(ruleset is not None)
    rule = ruleset.get("r")
    native = native_matcher(rule)
    assert native is not None, why_not_native(rule)
    python = Matcher(rule)
    for raw, script in cases:
        events = timed(raw)
        assert drive(native, events, script) == drive(python, events, script), (text, events,
                                                                                 script)


engine_streams = st.tuples(events_of(30), st.lists(st.sampled_from(("K", "K", "J", 7)),
                                                   min_size=30, max_size=30),
                           st.integers(0, 2**32), st.booleans())


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(texts=st.lists(st.integers(0, 1), min_size=1, max_size=2).flatmap(
           lambda ids: st.tuples(*[rule_text(f"r{i}", partition=True) for i in range(len(ids))])),
       cases=st.lists(engine_streams, min_size=STREAMS, max_size=STREAMS))
def test_native_engine_aggregates_equal_python(texts: tuple[str, ...], cases: list) -> None:
    text = "\n".join(texts)
    ruleset = _compiled(text)
    assume(ruleset is not None)
    python, native, lateness = both_engines(ruleset, text)
    for raw, keys, seed, roundtrip in cases:
        events: list[Event] = make_events(
            [({**data, "k": key}, gap, "s") for (data, gap), key in zip(raw, keys, strict=False)],
            seed, 0, "int", lateness)
        table = arrow_table(events)
        for batch in BATCHES:
            same_results(python, native, events, table, batch, roundtrip, text)
            if batch >= len(events):
                break
