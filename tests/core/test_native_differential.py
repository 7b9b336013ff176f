"""Differential test: the native matcher core (`cep._core`) against the Python matcher.

Random rules (patterns with every quantifier, connector, negation and skip strategy; conditions
and measures over every operator and function, on a schema-less stream so runtime type errors,
NULLs and int/float/str mixes happen) and random event streams go through both matchers with
the same calls (event by event or in `on_events` batches, ticks of event time, pickled state,
`on_end` or `flush`). Every result (matches, timeouts, dropped counts, with their events,
times, keys and measures, in order), the state's emptiness and next deadline after every call,
and the counters must be identical.

Each example is one rule and STREAMS_PER_RULE (20) streams (compiling a rule costs far more
than running it): 100 examples = 2,000 (rule, stream) cases by default (`make test`),
HYPOTHESIS_PROFILE=dev 10 examples, HYPOTHESIS_PROFILE=deep 1,000 examples = 20,000 cases
(`CEP_DIFF_EXAMPLES` sets the number of examples).
"""

from __future__ import annotations

import math
import os
import pickle

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cep import _core  # built by `pip install -e .`: a missing build fails here, never skips
from cep.compile import CompileErrors, compile_rules
from cep.runtime import Matcher
from cep.runtime.native import native_matcher, why_not_native
from tests.rules.strategies import rule_statement

EXAMPLES = int(os.environ.get("CEP_DIFF_EXAMPLES")
               or {"dev": 10, "ci": 100, "deep": 1_000}[os.environ.get("HYPOTHESIS_PROFILE", "ci")])
STREAMS_PER_RULE = 20

DEFINES = {
    "a": ("t = 'a'", "t IN ('a', 'b')", "v >= 2", "SUM(a.v) <= 3", None, "v / 2 > 0.5",
          "v % 2 = 1", "f IS NULL", "COALESCE(n, v) > 1", "s CONTAINS 'b'", "LENGTH(s) >= 2",
          "UPPER(s) STARTS WITH 'A'", "s MATCHES '^a.b'", "ABS(v - 2) <= 1", "NOT (v = 1)",
          "v = 1 OR n > 0", "v + f > 2", "s ENDS WITH 'b'", "-v < -1", "v * 1.5 >= 3",
          "s NOT IN ('ab', 'xyz')", "s > 'a'", "v != s"),
    "b": ("t = 'b'", "v > PREV(v)", "v = a.v", "t != 'a' AND v < 3", None, "AVG(b.v) >= 1.5",
          "MAX(b.v) - MIN(b.v) <= 1", "v > a.v * 1.5", "COUNT(b.*) <= 2", "v IN (1, 2.0, a.v)",
          "s = LOWER(FIRST(a.s))", "MIN(b.s) < 'b'", "SUM(b.f) > 1"),
    "c": ("t = 'c'", "v <= 1", "COUNT(*) >= 2", "v >= FIRST(a.v)", "SUM(v) / COUNT(*) > 1",
          "v - PREV(v, 2) != 0", "AVG(f) > v", "v % PREV(v) = 0"),
    "x": ("t = 'c'", "v = 0", "v = a.v", "s MATCHES 'y'"),
    "y": ("t = 'b'", "v >= 3", "f > v"),
}
MEASURES = ("COUNT(*) AS k", "SUM(a.v) AS sa", "AVG(v) AS av", "FIRST(a.s) AS fs",
            "LAST(b.v) AS lb", "MAX(f) AS mf", "MIN(s) AS ms", "PREV(v) AS pv", "v * 2 AS v2",
            "COALESCE(n, f, v) AS co", "b.v - a.v AS d", "v / PREV(v) AS q", "UPPER(a.s) AS us",
            "LENGTH(s) AS ls", "ABS(v) AS av2", "a.v > b.v AS gt", "SUM(f) AS sf")


@st.composite
def rule_text(draw: st.DrawFn) -> str:
    rule = draw(rule_statement(DEFINES, partition=True, timeouts=True, measures=MEASURES,
                               max_partial=True))
    return "STREAM s TIME BY ts;\n" + rule


values = st.one_of(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3),
                   st.sampled_from((1.5, 0.0, -2.5, 2**62, "2", None, True, math.nan)))
event = st.fixed_dictionaries(
    {"t": st.sampled_from("abc"), "k": st.sampled_from(("K", "K", 7))},
    optional={"v": values, "f": st.sampled_from((0.5, 2.0, -1.0, 3, None)),
              "s": st.sampled_from(("ab", "a_b", "Ab", "Äbß", "xyz", "", "y", 5)),
              "n": st.sampled_from((None, 1, 0))},
)
streams = st.lists(st.tuples(event, st.integers(0, 3)), max_size=9)


def _value(v):  # type-sensitive, NaN-safe
    return (type(v).__name__, repr(v))


def _result(r):
    if r.kind == "dropped":
        return ("dropped", r.rule_id, r.version, _value(r.key), r.count, r.ts)
    events = tuple((e.var, e.ts, e.seq, repr(sorted(e.event.items()))) for e in r.events)
    measures = tuple((k, _value(v)) for k, v in r.measures.items())
    extra = (r.deadline_ts,) if r.kind == "timeout" else ()
    return (r.kind, r.rule_id, r.version, r.alert, _value(r.key), events, r.first_ts, r.last_ts,
            measures, *extra)


def timed(raw: list) -> list[tuple[dict, int]]:
    """(event, gap) pairs → (event with its time, time): times are the running sum of gaps."""
    events, ts = [], 0
    for ev, gap in raw:
        ts += gap
        events.append(({**ev, "ts": ts}, ts))
    return events


def drive(m, events, script):  # type: ignore[no-untyped-def]
    """The same calls for either matcher; a trace of everything observable."""
    batch, ticks, roundtrip, end, key = script
    trace: list = []
    state = m.initial()

    def note(res):  # type: ignore[no-untyped-def]
        trace.append(([_result(r) for r in res], m.is_empty(state), m.next_deadline(state)))

    i = 0
    while i < len(events):
        chunk = events[i:i + batch]
        if batch == 1:
            ev, ts = chunk[0]
            state, res = m.on_event(state, ev, ts, i, key)
        else:
            res = []
            state = m.on_events(state, [(ts, i + j, ev) for j, (ev, ts) in enumerate(chunk)],
                                key, res)
        note(res)
        i += len(chunk)
        if roundtrip and state is not None:
            state = pickle.loads(pickle.dumps(state))
        ts = chunk[-1][1]
        nxt = events[i][1] if i < len(events) else ts + 10
        if ticks and nxt > ts and (not end or i < len(events)):
            state, res = m.on_time(state, ts + (ticks[i % len(ticks)] % (nxt - ts)), key)
            note(res)
    if end:
        if events:
            state, res = m.on_time(state, events[-1][1], key)
            note(res)
        state, res = m.on_end(state, key)
    else:
        state, res = m.flush(state, key)
    note(res)
    s = m.stats
    trace.append((s.events, s.matches, s.timeouts, s.dropped, s.max_partial_matches_seen))
    return trace


scripts = st.tuples(st.sampled_from((1, 1, 2, 4)), st.lists(st.integers(0, 5), max_size=3),
                    st.booleans(), st.booleans(), st.sampled_from((None, None, "key")))


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(text=rule_text(),
       cases=st.lists(st.tuples(streams, scripts), min_size=STREAMS_PER_RULE,
                      max_size=STREAMS_PER_RULE))
def test_native_matcher_equals_python_matcher(text: str, cases: list) -> None:
    try:
        rule = compile_rules(text, "p.cep").get("r")
    except CompileErrors:
        assume(False)
        return
    native = native_matcher(rule)
    assert native is not None, why_not_native(rule)
    python = Matcher(rule)
    for raw, script in cases:
        events = timed(raw)
        expected = drive(python, events, script)
        got = drive(native, events, script)
        assert got == expected, (text, events, script)


def test_state_bytes_are_versioned() -> None:
    rule = compile_rules("STREAM s TIME BY ts;\nRULE r FROM s PATTERN (a b) DEFINE a AS v = 1 "
                         "WITHIN 5ms EMIT 'm';", "p.cep").get("r")
    m = native_matcher(rule)
    state, _ = m.on_event(None, {"v": 1, "ts": 0}, 0, 0)
    data = state.to_bytes()
    assert data[:5] == b"CEPNS"
    again = pickle.loads(pickle.dumps(state))
    assert m.next_deadline(again) == 5
    with pytest.raises(ValueError, match="format version 99"):
        _core.state_from_bytes(data[:5] + (99).to_bytes(2, "little") + data[7:])
    with pytest.raises(ValueError, match="wrong header"):
        _core.state_from_bytes(b"nonsense")
