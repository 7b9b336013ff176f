"""The three engine bugs an independent MATCH_RECOGNIZE reference found, as minimal cases through
the whole engine (`run_embedded`: event time, batching, end of input), at every batch size.

1. End of input lost complete matches of rules without a time limit (the key was woken at the
   end only if its matcher had a deadline).
2. A rule without PARTITION BY never matched in the embedded engine.
3. An absence deadline fired when event time *reached* it, so an `x` exactly at the limit
   cancelled the absence or not depending on batch boundaries.
"""

from __future__ import annotations

import pytest

from cep.compile import check_text, compile_rules
from cep.runtime.bind import build_engine
from cep.runtime.engine import Event, run_embedded
from cep.runtime.matcher import Match, Timeout

STREAM = "STREAM s (ts INT, k STRING, t STRING) TIME BY ts LATENESS 0s;\n"
BATCHES = (1, 2, 3, 7, 1000)


def found(rules: str, events: list[tuple[int, str, str]], batch: int) -> list[tuple]:
    engine = build_engine(compile_rules(STREAM + rules, "t.cep"))
    evs = [Event("s", ts, i, {"ts": ts, "k": k, "t": t}) for i, (ts, k, t) in enumerate(events)]
    return sorted((r.kind, r.rule_id, str(r.key), tuple(e.ts for e in r.events))
                  for r in run_embedded(engine, evs, batch_size=batch)
                  if isinstance(r, Match | Timeout))


@pytest.mark.parametrize("batch", BATCHES)
def test_end_of_input_emits_a_greedy_optional_tail_without_time_limit(batch: int) -> None:
    rule = ("RULE r FROM s PARTITION BY k PATTERN (A B?) "
            "DEFINE A AS t = 'a', B AS t = 'b' EMIT 'r';")
    assert found(rule, [(0, "k1", "a")], batch) == [("match", "r", "k1", (0,))]


@pytest.mark.parametrize("batch", BATCHES)
def test_end_of_input_emits_an_unbounded_greedy_tail(batch: int) -> None:
    rule = ("RULE r FROM s PARTITION BY k PATTERN (A B+) "
            "DEFINE A AS t = 'a', B AS t = 'b' ALLOW UNBOUNDED EMIT 'r';")
    got = found(rule, [(0, "k1", "a"), (5, "k1", "b")], batch)
    assert got == [("match", "r", "k1", (0, 5))]


@pytest.mark.parametrize("batch", BATCHES)
def test_end_of_input_keeps_the_last_match_of_skip_to_next_row(batch: int) -> None:
    rule = ("RULE r FROM s PARTITION BY k PATTERN (A B+ C+ D?) "
            "DEFINE A AS t = 'a', B AS t = 'b', C AS t = 'c', D AS t = 'd' "
            "ALLOW UNBOUNDED AFTER MATCH SKIP TO NEXT ROW EMIT 'r';")
    events = [(1, "k1", "a"), (2, "k1", "b"), (3, "k1", "c"), (4, "k1", "a"), (5, "k1", "b"),
              (6, "k1", "c")]
    got = found(rule, events, batch)
    assert got == [("match", "r", "k1", (1, 2, 3)), ("match", "r", "k1", (4, 5, 6))]


@pytest.mark.parametrize("batch", BATCHES)
def test_a_rule_without_partition_by_sees_the_stream_as_one_partition(batch: int) -> None:
    rule = "RULE r FROM s PATTERN (A B) DEFINE A AS t = 'a', B AS t = 'b' WITHIN 1m EMIT 'r';"
    assert not check_text(STREAM + rule, "t.cep")
    # Keys differ: without PARTITION BY they do not matter.
    got = found(rule, [(0, "k1", "a"), (1, "k2", "b"), (2, "k3", "x")], batch)
    assert got == [("match", "r", "", (0, 1))]


@pytest.mark.parametrize("batch", BATCHES)
def test_an_event_exactly_at_the_absence_deadline_cancels_it_whatever_the_batching(
        batch: int) -> None:
    rule = ("RULE r FROM s PARTITION BY k PATTERN (a -> NOT x) "
            "DEFINE a AS t = 'a', x AS t = 'x' WITHIN 10s EMIT 'r';")
    events = [(0, "k1", "a"), (10_000, "k2", "y"), (10_000, "k1", "x")]
    assert found(rule, events, batch) == []
    # One millisecond later, the x no longer cancels: the absence is proven at 10 s.
    late_x = [(0, "k1", "a"), (10_000, "k2", "y"), (10_001, "k1", "x")]
    assert found(rule, late_x, batch) == [("match", "r", "k1", (0,))]


@pytest.mark.parametrize("batch", BATCHES)
def test_an_event_exactly_at_the_within_limit_extends_a_match_whatever_the_batching(
        batch: int) -> None:
    rule = ("RULE r FROM s PARTITION BY k PATTERN (a -> b) "
            "DEFINE a AS t = 'a', b AS t = 'b' WITHIN 10s ON TIMEOUT EMIT 'late' EMIT 'r';")
    events = [(0, "k1", "a"), (10_000, "k2", "y"), (10_000, "k1", "b")]
    assert found(rule, events, batch) == [("match", "r", "k1", (0, 10_000))]


@pytest.mark.parametrize("batch", BATCHES)
def test_an_event_exactly_at_the_step_limit_extends_a_match_whatever_the_batching(
        batch: int) -> None:
    rule = ("RULE r FROM s PARTITION BY k PATTERN (a -> b -> c) "
            "DEFINE a AS t = 'a', b AS t = 'b', c AS t = 'c' STEP WITHIN 5s "
            "ON TIMEOUT EMIT 'late' EMIT 'r';")
    events = [(0, "k1", "a"), (5_000, "k2", "y"), (5_000, "k1", "b"), (10_000, "k2", "y"),
              (10_000, "k1", "c")]
    assert found(rule, events, batch) == [("match", "r", "k1", (0, 5_000, 10_000))]
    # A step of 5,001 ms is past the limit: the partial match times out at 5 s.
    slow = [(0, "k1", "a"), (5_001, "k2", "y"), (5_001, "k1", "b")]
    assert found(rule, slow, batch) == [("timeout", "r", "k1", (0,))]


def test_skip_to_last_of_the_only_first_variable_is_rejected() -> None:
    rule = ("RULE r FROM s PARTITION BY k PATTERN (A B+) DEFINE A AS t = 'a', B AS t = 'b' "
            "WITHIN 1m AFTER MATCH SKIP TO LAST A EMIT 'r';")
    errors = check_text(STREAM + rule, "t.cep")
    assert len(errors) == 1 and "SKIP TO LAST A would restart at the same event" in str(errors[0])
    # A repeated first variable can have a later last row: allowed.
    ok = rule.replace("PATTERN (A B+)", "PATTERN (A+ B)")
    assert not check_text(STREAM + ok, "t.cep")
