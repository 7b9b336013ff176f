"""The main correctness net: the compiled NFA run by the matcher core finds exactly the matches
that the brute-force reference finds, on random small patterns and event sequences, for every
skip strategy, contiguity, quantifier, negation and time limit."""

from __future__ import annotations

import pickle

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cep.compile import compile_file, parse_file
from cep.runtime import Match, Matcher
from tests.hyp import examples
from tests.rules.reference import Reference
from tests.rules.strategies import rule_statement

DEFINES = {
    "a": ("t = 'a'", "t IN ('a', 'b')", "v >= 2", "SUM(a.v) <= 3", None),
    "b": ("t = 'b'", "v > PREV(v)", "v = a.v", "t != 'a' AND v < 3", None),
    "c": ("t = 'c'", "v <= 1", "COUNT(*) >= 2", "v >= FIRST(a.v)"),
    "x": ("t = 'c'", "v = 0", "v = a.v"),
    "y": ("t = 'b'", "v >= 3"),
}


@st.composite
def rule_text(draw: st.DrawFn) -> str:
    rule = draw(rule_statement(DEFINES))
    return "STREAM s (ts INT, t STRING, v INT) TIME BY ts;\n" + rule


events_strategy = st.lists(
    st.tuples(st.sampled_from("abc"), st.integers(0, 3), st.integers(0, 3)), max_size=8
)


def run_matcher(rule, events, ticks, roundtrip, end):  # type: ignore[no-untyped-def]
    m = Matcher(rule)
    state = None
    out: list = []
    for i, (ev, ts) in enumerate(events):
        state, res = m.on_event(state, ev, ts, i)
        out.extend(res)
        if roundtrip:
            state = pickle.loads(pickle.dumps(state))
        nxt = events[i + 1][1] if i + 1 < len(events) else ts + 10
        if ticks and nxt > ts and (not end or i + 1 < len(events)):
            state, res = m.on_time(state, ts + (ticks[i % len(ticks)] % (nxt - ts)))
            out.extend(res)
    if end:
        if events:
            state, res = m.on_time(state, events[-1][1])
            out.extend(res)
        state, res = m.on_end(state)
    else:
        state, res = m.flush(state)
    out.extend(res)
    assert state is None
    return [tuple((e.var, e.seq) for e in r.events) for r in out if isinstance(r, Match)]


@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
)
@given(
    text=rule_text(),
    raw=events_strategy,
    ticks=st.lists(st.integers(0, 5), max_size=3),
    roundtrip=st.booleans(),
    end=st.booleans(),
)
def test_nfa_matches_reference(
    text: str, raw: list, ticks: list, roundtrip: bool, end: bool
) -> None:
    ruleset, errors = compile_file(text, "p.cep")  # one compile: the checked text is the run one
    assume(not errors)
    assert ruleset is not None
    rule = ruleset.get("r")
    tree = parse_file(text, "p.cep")
    pattern = next(c.value for c in tree.rules[0].clauses if c.name == "PATTERN")
    events = []
    ts = 0
    for t, v, gap in raw:
        ts += gap
        events.append(({"t": t, "v": v, "ts": ts}, ts))
    ref = Reference(rule, pattern, events, events[-1][1] if end and events else None)
    expected = [tuple((rule.nfa.vars[v], j) for v, j, *_ in c) for c in ref.matches()]
    got = run_matcher(rule, events, ticks, roundtrip, end)
    if rule.skip.kind.name == "ALL_MATCHES":
        assert sorted(got) == sorted(expected), (text, events)
    else:
        assert got == expected, (text, events)
