"""Hand-written temporal cases for the matcher core. Timelines: one column per event, ts below.

Each case states the events (type letter, ts) and the expected output in order."""

from __future__ import annotations

import pickle

from cep.compile import compile_rules
from cep.runtime import Dropped, Match, Matcher, Timeout

HEAD = "STREAM s (ts INT, k STRING, t STRING, v INT) TIME BY ts;\n"


def rule(body: str):
    text = HEAD + "RULE r FROM s PARTITION BY k " + body + ";"
    return compile_rules(text, "case.cep").get("r")


def ev(t: str, ts: int, v: int = 0, k: str = "k1") -> dict:
    return {"t": t, "ts": ts, "v": v, "k": k}


def feed(matcher: Matcher, events, state=None):
    out = []
    for i, e in enumerate(events):
        state, res = matcher.on_event(state, e, e["ts"], i)
        out.extend(res)
    return state, out


def labels(results):
    return [
        (r.kind, "".join(e.var for e in r.events), [e.ts for e in r.events])
        for r in results
        if not isinstance(r, Dropped)
    ]


def test_greedy_tail_waits_for_the_event_that_ends_it():
    # a  b  b  b  x
    # 0  1  2  3  4
    m = Matcher(rule("PATTERN (a b+) DEFINE a AS t = 'a', b AS t = 'b' WITHIN 1m EMIT 'm'"))
    state, out = feed(m, [ev("a", 0), ev("b", 1), ev("b", 2), ev("b", 3)])
    assert out == [] and state is not None
    state, out = m.on_event(state, ev("x", 4), 4, 9)
    assert labels(out) == [("match", "abbb", [0, 1, 2, 3])]
    assert state is None


def test_greedy_tail_is_ended_by_its_time_limit():
    m = Matcher(rule("PATTERN (a b+) DEFINE a AS t = 'a', b AS t = 'b' WITHIN 10ms EMIT 'm'"))
    state, out = feed(m, [ev("a", 0), ev("b", 1), ev("b", 2)])
    assert m.next_deadline(state) == 10
    state, out = m.on_time(state, 9)
    assert out == []
    state, out = m.on_time(state, 10)
    assert labels(out) == [("match", "abb", [0, 1, 2])] and state is None


def test_reluctant_tail_does_not_wait():
    m = Matcher(rule("PATTERN (a b+?) DEFINE a AS t = 'a', b AS t = 'b' WITHIN 1m EMIT 'm'"))
    _, out = feed(m, [ev("a", 0), ev("b", 1)])
    assert labels(out) == [("match", "ab", [0, 1])]


def test_absence_completes_when_time_passes_the_deadline():
    # order ... (no ship) ... deadline 100
    m = Matcher(
        rule("PATTERN (o -> NOT s) DEFINE o AS t = 'o', s AS t = 's' WITHIN 100ms EMIT 'm'")
    )
    state, out = feed(m, [ev("o", 0), ev("x", 50)])
    assert out == []
    state, out = m.on_time(state, 99)
    assert out == [] and state is not None
    state, out = m.on_time(state, 100)
    assert labels(out) == [("match", "o", [0])] and state is None


def test_absence_is_broken_by_an_event_on_the_deadline_but_not_after():
    r = rule("PATTERN (o -> NOT s) DEFINE o AS t = 'o', s AS t = 's' WITHIN 100ms EMIT 'm'")
    _, out = feed(Matcher(r), [ev("o", 0), ev("s", 100)])
    assert out == []  # inclusive limit: a ship at exactly 100 ms is in time
    _, out = feed(Matcher(r), [ev("o", 0), ev("s", 101)])
    assert labels(out) == [("match", "o", [0])]  # decided before the late ship is looked at


def test_end_of_input_does_not_invent_absence_but_flush_does():
    r = rule("PATTERN (o -> NOT s) DEFINE o AS t = 'o', s AS t = 's' WITHIN 100ms EMIT 'm'")
    m = Matcher(r)
    state, _ = feed(m, [ev("o", 0)])
    assert m.on_end(state) == (None, [])
    assert labels(m.flush(state)[1]) == [("match", "o", [0])]


def test_timeouts_are_their_own_kind_and_only_when_asked():
    body = (
        "PATTERN (a -> b) DEFINE a AS t = 'a', b AS t = 'b' WITHIN 10ms EMIT 'm' "
        "ON TIMEOUT EMIT 'late'"
    )
    m = Matcher(rule(body))
    state, out = feed(m, [ev("a", 0), ev("x", 5)])
    state, out = m.on_time(state, 10)
    assert len(out) == 1 and isinstance(out[0], Timeout)
    assert out[0].alert == "late" and out[0].deadline_ts == 10 and out[0].key == "k1"
    assert labels(out) == [("timeout", "a", [0])] and state is None
    m2 = Matcher(rule(body.replace(" ON TIMEOUT EMIT 'late'", "")))
    state, _ = feed(m2, [ev("a", 0)])
    assert m2.on_time(state, 10) == (None, [])


def test_state_returns_to_empty_on_a_long_stream():
    m = Matcher(
        rule(
            "PATTERN (a -> b c) DEFINE a AS t = 'a', b AS t = 'b', c AS t = 'c' "
            "WITHIN 20ms EMIT 'm'"
        )
    )
    state = None
    sizes = []
    for i in range(2000):
        state, _ = m.on_event(state, ev("a" if i % 3 else "x", i * 7), i * 7, i)
        sizes.append(Matcher.partial_count(state))
    assert max(sizes) <= 4
    state, _ = m.on_time(state, 2000 * 7 + 100)
    assert state is None


def test_cap_drops_oldest_and_reports_it():
    m = Matcher(
        rule("PATTERN (a ->> b) DEFINE a AS t = 'a', b AS t = 'b' WITHIN 1h EMIT 'm'"),
        max_partial_matches=3,
    )
    state, out = feed(m, [ev("a", i) for i in range(5)])
    dropped = [r for r in out if isinstance(r, Dropped)]
    assert sum(d.count for d in dropped) == 2 and m.stats.dropped == 2
    assert Matcher.partial_count(state) == 3
    _, out = m.on_event(state, ev("b", 10), 10, 99)
    assert [r.events[0].ts for r in out if isinstance(r, Match)] == [2]


def test_match_contents_measures_and_key():
    m = Matcher(
        rule(
            "PATTERN (a b{2,} c) DEFINE a AS t = 'a', b AS v > PREV(v), c AS t = 'c' "
            "WITHIN 1m MEASURES a.v AS start, LAST(b.v) AS top, SUM(b.v) AS total, "
            "COUNT(b.*) AS n, c.ts - a.ts AS took EMIT 'rise'"
        )
    )
    _, out = feed(m, [ev("a", 0, 1), ev("b", 1, 2), ev("b", 2, 3), ev("b", 3, 5), ev("c", 4, 0)])
    (match,) = out
    assert isinstance(match, Match) and match.alert == "rise" and match.rule_id == "r"
    assert match.key == "k1" and (match.first_ts, match.last_ts) == (0, 4)
    assert match.measures == {"start": 1, "top": 5, "total": 10, "n": 3, "took": 4}
    assert [e.seq for e in match.by_var()["b"]] == [1, 2, 3]


def test_state_is_picklable_and_resumable():
    r = rule(
        "PATTERN (a ->> b ->> c) DEFINE a AS t = 'a', b AS t = 'b', c AS t = 'c' WITHIN 1m "
        "ALL MATCHES EMIT 'm'"
    )
    events = [ev("a", 0), ev("b", 1), ev("x", 2), ev("b", 3), ev("c", 4)]
    m1, m2 = Matcher(r), Matcher(r)
    _, direct = feed(m1, events)
    state, out = feed(m2, events[:3])
    state = pickle.loads(pickle.dumps(state))
    state, rest = feed(m2, events[3:], state)
    assert labels(out + rest) == labels(direct) and len(direct) == 2


def test_precomputed_masks_give_the_same_answer():
    r = rule("PATTERN (a b+ c) DEFINE a AS t = 'a', b AS t = 'b', c AS t = 'c' WITHIN 1m EMIT 'm'")
    events = [ev(t, i) for i, t in enumerate("abbcabxabbbc")]
    _, plain = feed(Matcher(r), events)
    m = Matcher(r)
    state, masked = None, []
    for i, e in enumerate(events):
        pre = [cond.test(e) for cond in r.nfa.conditions]
        state, res = m.on_event(state, e, e["ts"], i, pre=pre)
        masked.extend(res)
    assert labels(masked) == labels(plain) and len(plain) == 2


def test_threads_in_the_same_state_with_different_step_deadlines_are_kept_apart():
    # a  b  b  c      STEP WITHIN 5: (a b@1 c@8) breaks the step limit, (a b@4 c@8) does not
    # 0  1  4  8
    m = Matcher(
        rule(
            "PATTERN (a ->> b ->> c) DEFINE a AS t = 'a', b AS t = 'b', c AS t = 'c' "
            "STEP WITHIN 5ms EMIT 'm'"
        )
    )
    _, out = feed(m, [ev("a", 0), ev("b", 1), ev("b", 4), ev("c", 8)])
    assert labels(out) == [("match", "abc", [0, 4, 8])]


def test_skip_to_last_variable_chains_matches():
    # impossible travel style: FR US FR -> two matches sharing the middle event
    m = Matcher(
        rule("PATTERN (h t) DEFINE t AS v <> h.v WITHIN 1h AFTER MATCH SKIP TO LAST t EMIT 'm'")
    )
    _, out = feed(m, [ev("x", 0, 1), ev("x", 1, 2), ev("x", 2, 1)])
    assert labels(out) == [("match", "ht", [0, 1]), ("match", "ht", [1, 2])]
