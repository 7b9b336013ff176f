"""The adaptive decoded-keys budget (`EngineState(adaptive=True)`, core/src/budget.rs;
docs/spark-runtime.md, "An adaptive decoded-keys budget (session 24, live24)"): the operator's
shard, every call's changed keys exported. Keys that come back only after the budget has
evicted them (the live ceiling's shape) make the state keep none decoded; keys that come back
within two calls keep the budget. Either way the alerts and the keys' bytes are
those of the Python engine and of a state that never evicts, call by call and at the end."""

from __future__ import annotations

import random

import pytest

from cep.runtime.engine import NEG_INF, Event, MemoryKeyStore
from tests.core.test_native_engine import _batch
from tests.core.test_native_engine_keys import _engines, _records

PER_CALL = 40  # cards a call
CALLS = 60


def _returning(gap: int, seed: int) -> list[list[Event]]:
    """`CALLS` calls of one second each, `PER_CALL` cards each; a card comes back every `gap`
    calls. Some charges probe (< 2.00), some go abroad, so the bundled rules alert."""
    rng = random.Random(seed)
    calls, seq = [], 0
    for c in range(CALLS):
        chunk = []
        for j in range(PER_CALL):
            ts = c * 1000 + j * 1000 // PER_CALL
            card = (c % gap) * PER_CALL + j
            data = {"ts": ts, "card": f"c{card}", "amount": rng.choice([1.5, 25.0, 120.0, 900.0]),
                    "merchant": "m1", "country": "NL" if rng.random() < 0.7 else "US"}
            chunk.append(Event("transactions", ts, seq, data))
            seq += 1
        calls.append(chunk)
    return calls


@pytest.mark.parametrize("gap", [20, 2])
def test_the_budget_follows_how_soon_keys_come_back_and_alerts_do_not_change(gap: int) -> None:
    from cep import _core

    python, native = _engines()
    core = native.core
    calls = _returning(gap, seed=gap)
    # The budget: half as much again as the bytes of every key of the shape that comes back
    # within two calls (its 80 cards; the other shape's 800 need ~7 times that).
    probe = _core.EngineState(track_dirty=True, keep_decoded=1 << 30)
    for chunk in _returning(2, seed=2):
        core.ingest_arrow(probe, _batch(chunk, False), NEG_INF)
        core.export_blobs(probe)
    cap = core.raw_bytes(probe) * 3 // 2
    kept = _core.EngineState()
    state = _core.EngineState(track_dirty=True, keep_decoded=cap, adaptive=True)
    assert state.decoded_budget == cap
    py_store, max_ts, alerts, budgets = MemoryKeyStore(), NEG_INF, 0, []
    for chunk in calls:
        want = python.ingest(py_store, chunk, max_ts)
        core.ingest_arrow(kept, _batch(chunk, False), max_ts)
        got, *_ = core.ingest_arrow(state, _batch(chunk, False), max_ts)
        assert _records(native, got) == _records(python, want.matches)
        alerts += len(got)
        core.export_blobs(state)
        budgets.append(state.decoded_budget)
        keys = core.keys(kept)
        assert sorted(core.keys(state)) == sorted(keys)
        assert [core.key_bytes(state, g, k) for g, k in keys] == \
            [core.key_bytes(kept, g, k) for g, k in keys]
        max_ts = max(max_ts, max(e.ts for e in chunk))
    want = python.advance(py_store, max_ts, end_of_input=max_ts).matches
    got, *_ = core.ingest_arrow(state, _batch(calls[0], False).slice(0, 0), max_ts, max_ts)
    assert _records(native, got) == _records(python, want)
    assert alerts + len(got) > 0
    hits, ghost_hits, cold, evicted = state.budget_stats()
    if gap == 20:
        # Each key is evicted unreached before it comes back: none kept from some call on, and
        # from then every changed key is evicted at its export (none comes back within `cap`).
        assert cold > 0 and 0 in budgets and budgets[-1] == 0
        assert evicted > cold and ghost_hits < evicted - cold
    else:
        # Every key comes back to find itself decoded: the budget is kept all along.
        assert set(budgets) == {cap} and hits > 0 and evicted == 0


def test_a_state_that_is_not_adaptive_keeps_its_budget() -> None:
    from cep import _core

    _, native = _engines()
    core = native.core
    state = _core.EngineState(track_dirty=True, keep_decoded=4_000)
    for chunk in _returning(20, seed=1):
        core.ingest_arrow(state, _batch(chunk, False), NEG_INF)
        core.export_blobs(state)
        assert state.decoded_budget == 4_000
    assert state.budget_stats()[2] > 0  # (kept keys were evicted unreached all the same)
