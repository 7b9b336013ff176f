"""Keys packed at rest (core/src/pack.rs, docs/native-core.md "Many keys: the packed key
(session 18)"): with many keys (`compact_from=0` here: every key) a key without buffered events
or family states is packed each time it is put back and unpacked when an event or a deadline
reaches it. Held to the Python engine call by call (results, late reports, keys, wakes), for
Arrow events, Python-object events with int and with non-int `seq`s, shared captures (ALL
MATCHES); a packed key's `CEPNK` bytes equal the live key's; an export read back goes on the same.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis.strategies import lists, one_of

from cep.runtime.bind import build_embedded_engine, build_engine
from cep.runtime.engine import NEG_INF, Event, MemoryKeyStore
from tests.core.test_native_engine import (
    _batch,
    _broken_probe_bytes,
    _probe_with_a_partial_match,
    native_bundled,
)
from tests.core.test_native_engine_differential import (
    both_engines,
    compile_valid,
    drive,
    make_events,
    ruleset_text,
    streams,
)
from tests.core.test_native_engine_keys import (
    _GROWING,
    _call_by_call,
    _growing_events,
    _records,
    _waves,
)
from tests.core.test_native_families_differential import _copies as _family_copies
from tests.hyp import profile


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

    ruleset = compile_rules(_GROWING, "growing")
    events = _growing_events(batch)
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


@pytest.mark.parametrize("compact_from", [0, 1 << 30])
def test_keys_read_back_write_the_bytes_of_keys_never_exported(compact_from: int) -> None:
    """Two states fed the same calls, one read back from its exports at every call: after
    each call every key's `CEPNK` bytes are the same in both, packed or live. An event that
    several parts of a key capture is one event of the key's table, also once read back and
    run on (a row read back is one `Ev`, its values in it, shared by the parts and the buffer:
    docs/native-core.md, "Many keys: one block per event (session 19, core19k)")."""
    from cep import _core

    core = build_embedded_engine(native_bundled()).core

    def fresh() -> Any:
        return _core.EngineState(track_dirty=True, keep_decoded=0, compact_from=compact_from)
    kept, moved = _core.EngineState(compact_from=compact_from), fresh()
    log: list[Any] = []
    events, max_ts, compared = _waves(400, seed=33), NEG_INF, 0
    for i in range(0, len(events), 61):
        chunk = events[i:i + 61]
        for st in (kept, moved):
            core.ingest_arrow(st, _batch(chunk, False), max_ts)
        log += core.export_blobs(moved)  # the keys this call changed
        moved = fresh()
        for blob in log:
            assert core.import_blob(moved, blob) == 0
        keys = core.keys(kept)
        assert core.keys(moved) == keys
        for gid, key in keys:
            assert core.key_bytes(moved, gid, key) == core.key_bytes(kept, gid, key)
            compared += 1
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


_AT_END = """
STREAM s (ts INT, card STRING, amount FLOAT, country STRING) TIME BY ts LATENESS 5s;
RULE quiet FROM s PARTITION BY card
  PATTERN (A B) DEFINE A AS A.amount > 100, B AS B.country <> A.country WITHIN 1h EMIT 'quiet';
RULE timed FROM s PARTITION BY card
  PATTERN (A B) DEFINE A AS A.amount > 200, B AS B.amount > A.amount WITHIN 30m
  EMIT 'timed' ON TIMEOUT EMIT 'timed_out';
RULE absent FROM s PARTITION BY card
  PATTERN (A -> NOT B) DEFINE A AS A.amount > 500, B AS B.amount < 20 WITHIN 2h EMIT 'absent';
RULE star FROM s PARTITION BY card
  PATTERN (A B* C) DEFINE A AS A.amount < 100, B AS B.amount < 500, C AS C.amount >= 900
  WITHIN 3h EMIT 'star';
RULE stepped FROM s PARTITION BY card
  PATTERN (A B+ C) DEFINE A AS A.amount > 100, B AS B.amount > 20, C AS C.amount >= 900
  WITHIN 3h STEP WITHIN 10m EMIT 'stepped';
RULE every FROM s PARTITION BY card
  PATTERN (A -> C+) DEFINE A AS A.amount < 100, C AS C.amount > A.amount WITHIN 1h
  ALL MATCHES EMIT 'every' ON TIMEOUT EMIT 'every_out';
RULE next FROM s PARTITION BY card
  PATTERN (A -> B+) DEFINE A AS A.amount > 100, B AS B.amount > 20 WITHIN 45m
  AFTER MATCH SKIP TO NEXT ROW EMIT 'next';
RULE gap FROM s PARTITION BY card
  PATTERN (A -> NOT B -> C) DEFINE A AS A.amount > 500, B AS B.country = 'DE', C AS C.amount < 100
  WITHIN 2h EMIT 'gap';
RULE strict FROM s PARTITION BY card
  PATTERN (A NOT B) DEFINE A AS A.amount > 500, B AS B.amount < 20 WITHIN 1h EMIT 'strict';
RULE endless FROM s PARTITION BY card
  PATTERN (A B) DEFINE A AS A.amount > 900, B AS B.country <> A.country ALLOW UNBOUNDED
  EMIT 'endless';
"""


_SHAPES = {"quiet": slice(0, 1), "quiet+timed": slice(0, 2), "absent": slice(2, 3),
           "star": slice(3, 4), "stepped": slice(4, 5), "every": slice(5, 6), "next": slice(6, 7),
           "gap": slice(7, 8), "strict": slice(8, 9), "endless": slice(9, 10),
           "all": slice(0, 10)}


@pytest.mark.parametrize(("rules", "batch"), [(s, 50) for s in _SHAPES.values()]
                         + [(_SHAPES["all"], b) for b in (1, 29, 400)],
                         ids=[*_SHAPES, "all-1", "all-29", "all-400"])
def test_packed_keys_at_the_end_of_input_match_the_python_engine(rules: slice, batch: int) -> None:
    """A packed key due by time (no new event) or at the end of input is released from its
    words, without an unpack, when its rules report and keep nothing (`Packed::ends_quietly`):
    every entry's deadline passed, a rule without ON TIMEOUT, no complete match waiting; not
    when a rule reports timeouts, a pattern ends in an absence (`-> NOT`, completed by time or
    the end), or some entry's deadline is still ahead (kept: unpacked and advanced). Each rule
    alone and all together (keys with both kinds of parts): the Python engine's results, keys
    and wakes at every call and at the end of input.

        card:  |--1-3 charges, 20 s to 40 min apart--|...WITHIN (30 m-3 h) passes: released
    """
    import random

    from cep import _core
    from cep.compile import compile_rules
    from cep.nfa import RuleSet

    every = compile_rules(_AT_END, "at_end")
    ruleset = RuleSet(every.rules[rules], every.streams)
    rng = random.Random(rules.start * 10 + rules.stop)
    events, seq = [], 0
    for i in range(300):
        t = rng.randrange(4 * 3_600_000)
        for _ in range(rng.choice([1, 2, 3])):
            row = {"ts": t, "card": f"c{i}",
                   "amount": rng.choice([10.0, 50.0, 150.0, 300.0, 600.0, 950.0]),
                   "country": rng.choice(["NL", "NL", "DE"])}
            events.append(Event("s", t, seq, row))
            seq += 1
            t += rng.choice([20_000, 5 * 60_000, 40 * 60_000])
    events.sort(key=lambda e: (e.ts, e.seq))
    native = build_embedded_engine(ruleset, use_native=True)
    state = _core.EngineState(compact_from=0)
    peak, after = _packed_peak(state)
    _, n_results = _call_by_call(native, state, events, batch, after, ruleset=ruleset)
    assert n_results > 0 and peak[0] > 0


_PACKED_EXAMPLES = int(os.environ.get("CEP_PACKED_DIFF_EXAMPLES")
                       or {"dev": 10, "ci": 60, "deep": 600}[profile()])


@contextmanager
def _packing_states() -> Iterator[None]:
    """Every `EngineState` the native engine makes (its `MemoryKeyStore`s', `_through_bytes`'s
    too) packs every key it puts back (`compact_from=0`)."""
    from cep import _core

    made = _core.EngineState
    with patch.object(_core, "EngineState", lambda: made(compact_from=0)):
        yield


@settings(max_examples=_PACKED_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(text=one_of(ruleset_text(), ruleset_text(max_rules=2, copies=_family_copies)),
       cases=lists(streams, min_size=6, max_size=6))
def test_random_rules_on_packed_keys_match_the_python_engine(text: tuple[str, list[str]],
                                                             cases: list) -> None:
    """Random rules (absences, STEP WITHIN, every skip strategy, ALL MATCHES, ON TIMEOUT,
    MAX PARTIAL MATCHES, two streams; sometimes with rule families) on packed keys: every
    call's results, late reports, counters (touched, released, reset), next wake and keys
    equal the Python engine's at batches 1, 29 and 400 and at the end of input, key states
    through `CEPNK` bytes between calls in some streams. Broad but weak on the shortcut of
    `Packed::ends_quietly` (streams of 12 events, few keys due by time alone): the test above
    is the one that fails when one of its conditions is dropped (checked by mutation)."""
    ruleset = compile_valid(*text)
    assume(ruleset is not None)
    python, native, lateness = both_engines(ruleset, text)
    with _packing_states():
        for raw, seed, extra_late, seq_kind, roundtrip in cases:
            events = make_events(raw, seed, extra_late, seq_kind, lateness)
            for batch in (1, 29, 400):
                got = drive(native, events, batch, roundtrip and batch == 1)
                assert got == drive(python, events, batch, False), (text, batch)


def test_packed_keys_after_a_failed_key_come_due_again_as_live_ones() -> None:
    """A call that fails at one key (a panic inside its rule) leaves the keys after it with
    their states and a wake computed from them (`Engine::wake_again`, which unpacks a packed
    key for it): packed (`compact_from=0`) and live (the default) states give the same keys,
    wakes and next wake, and the same results once the failed key is mended."""
    from cep import _core

    engine, store = _probe_with_a_partial_match()
    core, data = engine.core, _broken_probe_bytes(engine, store)

    def run(compact_from: int) -> tuple:
        state = _core.EngineState(compact_from=compact_from)
        cards = [f"A{i}" for i in range(3)]
        core.ingest(state, [Event("s", 0, i, {"k": k, "v": 1, "ts": 0})
                            for i, k in enumerate(["K", *cards])], NEG_INF)
        core.ingest(state, [], 1)  # released: a partial match each, packed with compact_from=0
        core.load_key(state, "s:k", "K", data)  # the first key (advanced first), broken
        packed = state.packed_len()
        with pytest.raises(_core.CoreError, match="rule probe"):
            core.ingest(state, [Event("s", 3, 10 + i, {"k": k, "v": 5, "ts": 3})
                                for i, k in enumerate(["K", *cards])], 2)
        after = (len(state), state.wake_len(), core.next_wake(state))
        core.load_key(state, "s:k", "K", engine.key_bytes(store, "s:k", "K"))  # mended
        got, *_ = core.ingest(state, [Event("s", 4, 20 + i, {"k": k, "v": 2, "ts": 4})
                                      for i, k in enumerate(["K", *cards])], 3, 4)
        return packed, after, _records(engine, got)

    (packed, *at_rest), (live, *as_live) = run(0), run(1 << 30)
    assert packed == 3 and live == 0
    assert at_rest == as_live and len(as_live[1]) == 3  # the cards match (K: strict a b broken)


def test_packed_keys_partial_counts_equal_the_live_keys() -> None:
    """With `track_partials` (the live job's metrics) a packed key is always unpacked to be
    advanced (no release from its words): each call's results and per-rule changes in partial
    matches (`take_partials`) from packed (`compact_from=0`) and live states are the same, up
    to the end of input."""
    from cep import _core

    native = build_embedded_engine(native_bundled())
    core = native.core
    core.track_partials = True
    packed, live = _core.EngineState(compact_from=0), _core.EngineState()
    events, max_ts, peak, moved = _waves(400, seed=9), NEG_INF, 0, 0
    calls = [(events[i:i + 53], False) for i in range(0, len(events), 53)] + [([], True)]
    for chunk, eof in calls:
        table = _batch(chunk or events[:1], False).slice(0, len(chunk))
        outs = []
        for state in (packed, live):
            got, *_ = core.ingest_arrow(state, table, *((max_ts, max_ts) if eof else (max_ts,)))
            outs.append((_records(native, got), core.take_partials()))
        assert outs[0] == outs[1]
        peak, moved = max(peak, packed.packed_len()), moved + len(outs[0][1])
        max_ts = max([max_ts, *(e.ts for e in chunk)])
    assert len(packed) == len(live) == 0 and peak > 0 and moved > 0


@pytest.mark.parametrize("batch", [1, 29, 400])
def test_a_key_past_the_packed_limit_stays_live_and_matches_the_python_engine(batch: int) -> None:
    """A partial match capturing more events than `pack.rs`'s `MAX_SHARED` (64) stays live
    (compacted) while the other keys with an open match are packed:
    the Python engine's results, keys and wakes call by call and at the end of input."""
    from cep import _core
    from cep.compile import compile_rules

    ruleset = compile_rules(
        "STREAM s (ts INT, card STRING, amount FLOAT, country STRING) TIME BY ts LATENESS 5s;\n"
        "RULE long FROM s PARTITION BY card PATTERN (A B+ C) DEFINE A AS A.amount > 100, "
        "B AS B.amount < 50, C AS C.amount > 900 WITHIN 1h EMIT 'long';", "long")
    events, seq = [], 0
    ends = [500.0, *[10.0] * 148, 950.0]
    for card, amounts in (("open", [500.0, 10.0]), ("big", ends), ("c1", [500.0, 10.0, 950.0]),
                          ("c2", [500.0, *[10.0] * 3, 950.0]), ("big", [500.0, 950.0])):
        for amount in amounts:
            events.append(Event("s", seq * 1000, seq, {"ts": seq * 1000, "card": card,
                                                       "amount": amount, "country": "NL"}))
            seq += 1
    native = build_embedded_engine(ruleset, use_native=True)
    state = _core.EngineState(compact_from=0)
    peak, after = _packed_peak(state)
    _, n_results = _call_by_call(native, state, events, batch, after, ruleset=ruleset)
    assert n_results == 3 and peak[0] > 0
