"""The event-time engine with a toy matcher: ordering, lateness, deadlines, end of input,
state release, and independence from batch boundaries."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from cep.runtime.engine import Engine, Event, MemoryKeyStore, RuleRuntime, run_embedded
from tests.hyp import examples


class WindowMatcher:
    """Collects events into windows of `width` ms opened by the first event; a window is
    emitted when its deadline passes (on_time) — enough to observe order and timing."""

    def __init__(self, width: int) -> None:
        self.width = width

    def initial(self):
        return None

    def on_event(self, state, event, ts, seq, key):
        if state is None:
            return (ts, ((ts, seq),)), []
        start, items = state
        return (start, items + ((ts, seq),)), []

    def on_time(self, state, now, key):
        if state is not None and state[0] + self.width <= now:
            return None, [("window", key, state[1])]
        return state, []

    def next_deadline(self, state):
        return None if state is None else state[0] + self.width

    def is_empty(self, state):
        return state is None

    def on_end(self, state, key):
        return None, []  # an unfinished window is dropped at end of input


def engine(lateness=5, width=10):
    return Engine([RuleRuntime("w", "s", "k", lateness, WindowMatcher(width))])


def ev(ts, seq, k="a"):
    return Event("s", ts, seq, {"k": k})


def test_out_of_order_within_lateness_is_reordered():
    events = [ev(100, 1), ev(98, 2), ev(103, 3), ev(101, 4), ev(130, 5)]
    got = list(run_embedded(engine(), events))
    assert got == [("window", "a", ((98, 2), (100, 1), (101, 4), (103, 3)))]


def test_late_events_reported_not_matched():
    late = []
    events = [ev(100, 1), ev(120, 2), ev(101, 3), ev(140, 4)]  # 101 < 120 - 5
    got = list(run_embedded(engine(), events, late=late))
    assert [(le.event.ts, le.watermark) for le in late] == [(101, 115)]
    assert got == [("window", "a", ((100, 1),)), ("window", "a", ((120, 2),))]


def test_end_of_input_fires_only_deadlines_up_to_the_last_event():
    # Window opened at 100 has deadline 110 <= last ts 112: fires. The one at 112 does not.
    got = list(run_embedded(engine(width=10), [ev(100, 1), ev(112, 2)]))
    assert got == [("window", "a", ((100, 1),))]


def test_state_released_when_nothing_can_complete():
    store = MemoryKeyStore()
    list(run_embedded(engine(), [ev(100, 1, "a"), ev(100, 2, "b"), ev(200, 3, "c")], store=store))
    assert store.states == {} and len(store.wake) == 0


def test_keys_are_independent():
    events = [ev(100, 1, "a"), ev(101, 2, "b"), ev(105, 3, "a"), ev(150, 4, "b")]
    got = sorted(run_embedded(engine(), events))
    assert got == [("window", "a", ((100, 1), (105, 3))), ("window", "b", ((101, 2),))]


@settings(max_examples=examples(150), deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 300), st.sampled_from("abc")), min_size=1, max_size=60),
    st.integers(1, 20), st.randoms(use_true_random=False),
)
def test_batch_size_does_not_change_results(raw, batch, rnd: random.Random):
    # Events arrive at most `lateness` out of order, so none is late whatever the batching.
    lateness = 5
    base = sorted(raw)
    events = [ev(ts + rnd.randint(0, lateness), i, k) for i, (ts, k) in enumerate(base)]
    events.sort(key=lambda e: e.ts)
    # Shuffle inside a sliding window of `lateness` ms.
    jittered = sorted(events, key=lambda e: (e.ts + rnd.randint(0, lateness)))
    maxes, ok = [], True
    for e in jittered:
        if maxes and e.ts < max(maxes) - lateness:
            ok = False
        maxes.append(e.ts)
    if not ok:
        return
    one = sorted(run_embedded(engine(lateness), jittered, batch_size=1))
    many = sorted(run_embedded(engine(lateness), jittered, batch_size=batch))
    ordered = sorted(run_embedded(engine(lateness), sorted(jittered, key=lambda e: (e.ts, e.seq))))
    assert one == many == ordered
