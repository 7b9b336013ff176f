"""Keys packed at rest (core/src/pack.rs, docs/native-core.md "Many keys: the packed key
(session 18)"): with many keys (`compact_from=0` here: every key) a key without buffered events
or family states is packed each time it is put back and unpacked when an event or a deadline
reaches it. Held to the Python engine call by call (results, late reports, keys, wakes), for
Arrow events, Python-object events with int and with non-int `seq`s, shared captures (ALL
MATCHES); a packed key's `CEPNK` bytes equal the live key's; an export read back goes on the same.
"""

from __future__ import annotations

from typing import Any

import pytest

from cep.runtime.bind import build_embedded_engine, build_engine
from cep.runtime.engine import NEG_INF, Event, MemoryKeyStore
from tests.core.test_native_engine import _batch, native_bundled
from tests.core.test_native_engine_keys import (
    _GROWING,
    _call_by_call,
    _records,
    _waves,
)


def _packed_peak(state: Any) -> tuple[list[int], Any]:
    """A list holding the most keys `state` held packed after any call, and the hook that
    updates it (`_call_by_call`'s `after_call`)."""
    peak = [0]

    def after() -> None:
        peak[0] = max(peak[0], state.packed_len())
    return peak, after


@pytest.mark.parametrize("batch", [1, 37])
def test_packed_arrow_keys_match_the_python_engine(batch: int) -> None:
    from cep import _core

    native = build_embedded_engine(native_bundled())
    state = _core.EngineState(compact_from=0)
    peak, after = _packed_peak(state)
    n_late, n_results = _call_by_call(native, state, _waves(600, seed=300 + batch), batch, after)
    assert n_results > 0 and n_late > 0 and peak[0] > 0


@pytest.mark.parametrize("batch", [1, 29, 400])
def test_packed_shared_captures_match_the_python_engine(batch: int) -> None:
    """Runs added to runs, entries sharing captures (ALL MATCHES), several live rules a key."""
    from cep import _core
    from cep.compile import compile_rules

    from tests.core.test_native_engine_keys import HOUR

    ruleset = compile_rules(_GROWING, "growing")
    import random
    rng = random.Random(batch)
    events, seq = [], 0
    for i in range(240):
        t = (i // 40) * HOUR + rng.randrange(15 * 60_000)
        for _ in range(rng.choice([1, 2, 3, 5, 8])):
            row = {"ts": t, "card": f"c{i % 80}",
                   "amount": rng.choice([10.0, 30.0, 80.0, 300.0, 900.0]),
                   "country": rng.choice(["NL", "NL", "DE"])}
            events.append(Event("s", t, seq, row))
            seq += 1
            t += rng.choice([3_000, 20_000, 70_000, 5 * 60_000])
    events.sort(key=lambda e: (e.ts, e.seq))
    native = build_embedded_engine(ruleset, use_native=True)
    state = _core.EngineState(compact_from=0)
    peak, after = _packed_peak(state)
    _, n_results = _call_by_call(native, state, events, batch, after, ruleset=ruleset)
    assert n_results > 0 and peak[0] > 0


@pytest.mark.parametrize("seq", ["int", "str"])
def test_packed_python_object_events_match_the_python_engine(seq: str) -> None:
    """Events handed in as Python objects (`Engine.ingest`: their `Ev` holds the object and its
    `seq` object, kept as they are by a pack), with int and with non-int (str) `seq`s."""
    from cep import _core

    ruleset = native_bundled()
    python, native = build_engine(ruleset, use_native=False), build_embedded_engine(ruleset)
    core = native.core
    events = [Event(e.stream, e.ts, e.seq if seq == "int" else f"s{e.seq:06d}", e.data)
              for e in _waves(300, seed=7)]
    state = _core.EngineState(compact_from=0)
    py_store, max_ts, peak, n_results = MemoryKeyStore(), NEG_INF, 0, 0
    for i in range(0, len(events), 41):
        chunk = events[i:i + 41]
        want = python.ingest(py_store, chunk, max_ts)
        got, late, *_ = core.ingest(state, chunk, max_ts)
        assert _records(native, got) == _records(python, want.matches)
        assert [(key, chunk[j].seq) for _, key, j, _ in late] == \
            [(x.key, x.event.seq) for x in want.late]
        assert len(state) == len(py_store.states) and state.wake_len() == len(py_store.wake)
        assert core.next_wake(state) == python.next_wake(py_store)
        peak, n_results = max(peak, state.packed_len()), n_results + len(got)
        max_ts = max(max_ts, max(e.ts for e in chunk))
    want = python.advance(py_store, max_ts, end_of_input=max_ts).matches
    got, *_ = core.ingest(state, [], max_ts, max_ts)
    assert _records(native, got) == _records(python, want)
    assert len(state) == 0 and peak > 0 and n_results + len(got) > 0


def test_a_packed_keys_bytes_equal_the_live_keys() -> None:
    """`key_bytes` of every key after every call: packed (`compact_from=0`) and live (the
    default) states fed the same batches give the same `CEPNK` bytes."""
    from cep import _core

    native = build_embedded_engine(native_bundled())
    core = native.core
    packed, live = _core.EngineState(compact_from=0), _core.EngineState()
    events, max_ts, compared = _waves(400, seed=21), NEG_INF, 0
    for i in range(0, len(events), 53):
        chunk = events[i:i + 53]
        for st in (packed, live):
            core.ingest_arrow(st, _batch(chunk, False), max_ts)
        keys = core.keys(live)
        assert core.keys(packed) == keys
        for gid, key in keys:
            assert core.key_bytes(packed, gid, key) == core.key_bytes(live, gid, key)
        compared += packed.packed_len()
        max_ts = max(max_ts, max(e.ts for e in chunk))
    assert compared > 0


@pytest.mark.parametrize("keep_decoded", [0, 1 << 30])
def test_packed_keys_exported_and_read_back_continue_the_same(keep_decoded: int) -> None:
    """Every call's changed keys exported from a packed state (kept packed, or held as bytes
    past the budget); at the middle of the stream a new state reads the log back and goes on:
    the Python engine's results, keys and wakes."""
    from cep import _core

    ruleset = native_bundled()
    python, native = build_engine(ruleset, use_native=False), build_embedded_engine(ruleset)
    core = native.core
    events, py_store, max_ts = _waves(500, seed=5), MemoryKeyStore(), NEG_INF

    def fresh() -> Any:
        return _core.EngineState(track_dirty=True, keep_decoded=keep_decoded, compact_from=0)
    state, log, half, peak = fresh(), [], len(events) // 2, 0
    for i in range(0, len(events), 97):
        if i >= half and log:
            state = fresh()
            for blob in log:
                assert core.import_blob(state, blob) == 0
            log = []
            half = len(events) + 1
        chunk = events[i:i + 97]
        want = python.ingest(py_store, chunk, max_ts).matches
        got, *_ = core.ingest_arrow(state, _batch(chunk, False), max_ts)
        assert _records(native, got) == _records(python, want)
        peak = max(peak, state.packed_len())
        if half <= len(events):
            log += core.export_blobs(state)
        assert len(state) == len(py_store.states) and state.wake_len() == len(py_store.wake)
        assert core.next_wake(state) == python.next_wake(py_store)
        max_ts = max(max_ts, max(e.ts for e in chunk))
    want = python.advance(py_store, max_ts, end_of_input=max_ts).matches
    got, *_ = core.ingest_arrow(state, _batch(events[:1], False).slice(0, 0), max_ts, max_ts)
    assert _records(native, got) == _records(python, want)
    assert len(state) == 0 and peak > 0
