"""Many keys on the native engine (core/src/keys.rs: integer key ids, a slab of key slots, a
bucketed wake index): keys that come in waves, are released and come back under the same text
(their ids reused by other keys meanwhile) give the Python engine's results, late reports, live
keys, wake keys and next wake time, call by call; and a key state exported and imported
(`export_blobs` / `import_blob`, what the Spark operator stores) mid-stream continues to the
same results.

Timeline of one card (W = wave length, 2 h; cards of wave w start at w * W):

    card c{i % 90}:  |--- 4 charges over ~12 min ---|....1 h window....|  (released)
    same text, wave + 3:                                                   |--- charges ---|
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from cep.runtime.alerts import alert_record
from cep.runtime.bind import build_embedded_engine, build_engine
from cep.runtime.engine import NEG_INF, Event, MemoryKeyStore
from tests.core.test_native_engine import _batch, native_bundled

HOUR = 3_600_000
WAVE = 2 * HOUR


def _waves(n_cards: int, seed: int) -> list[Event]:
    """Cards in waves of 30; card texts repeat every 90 cards (three waves later, after the
    earlier card's state is released). Some charges probe (< 2.00), some go abroad, a few
    come late (before the watermark)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n_cards):
        t = (i // 30) * WAVE + rng.randrange(20 * 60_000)
        home = rng.choice(["NL", "DE", "FR"])
        for _ in range(rng.choice([1, 2, 2, 4, 6])):
            amount = rng.choice([1.5, 25.0, 120.0, 900.0])
            country = home if rng.random() < 0.8 else "US"
            rows.append({"ts": t, "card": f"c{i % 90}", "amount": amount, "merchant": "m1",
                         "country": country})
            t += rng.choice([5_000, 9_000, 30_000, 4 * 60_000])
    events = [Event("transactions", r["ts"], seq, r) for seq, r in enumerate(rows)]
    events.sort(key=lambda e: (e.ts, e.seq))
    # A few events come after many later ones (minutes): reported late by both engines.
    for k in range(40, len(events) - 600, 97):
        events.insert(k + 600, events.pop(k))
    return events


def _records(engine: Any, results: list[Any]) -> list[dict[str, Any]]:
    return [alert_record(engine, r) for r in results]


@pytest.mark.parametrize("batch", [1, 37, 500])
def test_keys_in_waves_match_the_python_engine_call_by_call(batch: int) -> None:
    events = _waves(450 if batch == 1 else 900, seed=batch)
    ruleset = native_bundled()
    python = build_engine(ruleset, use_native=False)
    native = build_embedded_engine(ruleset)
    py_store, nat_store, max_ts = MemoryKeyStore(), MemoryKeyStore(), NEG_INF
    results = late = peak = 0
    for i in range(0, len(events), batch):
        chunk = events[i:i + batch]
        want = python.ingest(py_store, chunk, max_ts)
        got = native.ingest(nat_store, chunk, max_ts)
        assert _records(native, got.matches) == _records(python, want.matches)
        assert [(x.rule_ids, x.key, x.event.seq) for x in got.late] == \
            [(x.rule_ids, x.key, x.event.seq) for x in want.late]
        assert native.live_keys(nat_store) == len(py_store.states)
        assert native.wake_keys(nat_store) == len(py_store.wake)
        assert native.next_wake(nat_store) == python.next_wake(py_store)
        max_ts = max(max_ts, max(e.ts for e in chunk))
        results, late = results + len(want.matches), late + len(want.late)
        peak = max(peak, len(py_store.states))
    want = python.advance(py_store, max_ts, end_of_input=max_ts)
    got = native.advance(nat_store, max_ts, end_of_input=max_ts)
    assert _records(native, got.matches) == _records(python, want.matches)
    assert native.live_keys(nat_store) == 0 and native.wake_keys(nat_store) == 0
    assert native.next_wake(nat_store) is None
    assert results + len(want.matches) > 10 and late > 0, \
        "the stream raises alerts and late reports"
    assert peak >= 30, "many keys are live at once"


def _engines() -> tuple[Any, Any]:
    """The Python and the native engine of the bundled rules."""
    ruleset = native_bundled()
    return build_engine(ruleset, use_native=False), build_embedded_engine(ruleset)


def test_a_state_exported_and_imported_mid_stream_continues_the_same() -> None:
    """The Spark operator's round trip, with keys held as bytes past a small decoded budget:
    every call's changed keys are exported and logged; at the middle of the stream a new
    EngineState reads the log back and goes on. Results equal an uninterrupted Python run."""
    from cep import _core

    events, python, native = _waves(600, seed=11), *_engines()
    core = native.core
    py_store, max_ts = MemoryKeyStore(), NEG_INF
    state = _core.EngineState(track_dirty=True, keep_decoded=2_000)
    log: list[bytes] = []
    half = len(events) // 2
    for i in range(0, len(events), 200):
        if i >= half and log is not None:
            state = _core.EngineState(track_dirty=True, keep_decoded=2_000)
            for blob in log:
                assert core.import_blob(state, blob) == 0
            assert sorted(core.keys(state)) == sorted(
                (gid, str(key)) for gid, key in py_store.states)
            log = None  # type: ignore[assignment]
        chunk = events[i:i + 200]
        want = python.ingest(py_store, chunk, max_ts).matches
        got, _late, *_ = core.ingest_arrow(state, _batch(chunk, False), max_ts)
        assert _records(native, got) == _records(python, want)
        if log is not None:
            log += core.export_blobs(state)
        # The running count of keys with state (decoded, held as bytes, or read back).
        assert len(state) == len(core.keys(state)) == len(py_store.states)
        max_ts = max(max_ts, max(e.ts for e in chunk))
    want = python.advance(py_store, max_ts, end_of_input=max_ts).matches
    got, *_ = core.ingest_arrow(state, _batch(events[:1], False).slice(0, 0), max_ts, max_ts)
    assert _records(native, got) == _records(python, want)
    assert len(state) == 0 and state.wake_len() == 0


@pytest.mark.parametrize("max_bytes", [1, 300, 4 << 20])
def test_a_shard_moving_between_two_states_every_call_continues_the_same(max_bytes: int) -> None:
    """The live job's two stateful workers: a shard's calls alternate between two
    EngineStates, each catching up first by importing the blobs the other exported since it
    last ran (keys decoded in it are replaced by the other's bytes), blobs cut at `max_bytes`
    (1: a blob per record). Results equal an uninterrupted Python run, call by call; and the
    log read into a new state holds every key with the same bytes as the last state."""
    from cep import _core

    events, python, native = _waves(600, seed=5), *_engines()
    core = native.core
    py_store, max_ts = MemoryKeyStore(), NEG_INF
    states = [_core.EngineState(track_dirty=True, keep_decoded=2_000) for _ in range(2)]
    log: list[bytes] = []
    seen = [0, 0]  # blobs of the log each state has applied
    sizes, alerts = [], 0
    for call, i in enumerate(range(0, len(events), 150)):
        w = call % 2
        for blob in log[seen[w]:]:
            assert core.import_blob(states[w], blob) == 0
        chunk = events[i:i + 150]
        want = python.ingest(py_store, chunk, max_ts).matches
        got, *_ = core.ingest_arrow(states[w], _batch(chunk, False), max_ts)
        assert _records(native, got) == _records(python, want)
        alerts += len(want)
        blobs = core.export_blobs(states[w], max_bytes=max_bytes)
        sizes += [len(b) for b in blobs]
        log += blobs
        seen[w] = len(log)
        assert len(states[w]) == len(py_store.states)
        max_ts = max(max_ts, max(e.ts for e in chunk))
    if max_bytes == 1:
        assert all(int.from_bytes(b[7:11], "little") == 1 for b in log)
    assert len(log) > 2 and max(sizes) > 1
    last = states[call % 2]
    replayed = _core.EngineState()
    for blob in log:
        core.import_blob(replayed, blob)
    keys = core.keys(last)
    assert core.keys(replayed) == keys and len(keys) > 20
    assert all(core.key_bytes(replayed, g, k) == core.key_bytes(last, g, k) for g, k in keys)
    w = (call + 1) % 2
    for blob in log[seen[w]:]:
        core.import_blob(states[w], blob)
    want = python.advance(py_store, max_ts, end_of_input=max_ts).matches
    got, *_ = core.ingest_arrow(states[w], _batch(events[:1], False).slice(0, 0), max_ts, max_ts)
    assert _records(native, got) == _records(python, want)
    assert alerts + len(want) > 10, "the stream raises alerts"


def _blob(gid: str, key: str, wake: int, data: bytes) -> bytes:
    """One key record in `export_blobs`' format (magic, version, count, no tables, one group)."""
    from cep import _core

    def uv(v: int) -> bytes:
        out = bytearray()
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        return bytes(out + bytes([v]))

    def s(b: bytes) -> bytes:
        return uv(len(b)) + b

    rec = uv(0) + s(key.encode()) + uv((wake << 1) ^ (wake >> 63)) + s(data)
    head = b"CEPNB" + _core.BLOB_VERSION.to_bytes(2, "little") + (1).to_bytes(4, "little")
    return head + uv(0) + uv(1) + s(gid.encode()) + rec


def test_a_key_that_fails_to_decode_keeps_its_bytes_and_the_other_due_keys_their_wake() -> None:
    """A call fails on a key whose stored bytes do not decode (advanced first: lowest id). Its
    bytes stay (it still counts, is still due), the due keys after it stay due, and once it is
    deleted the next call gives what a state that never had it gives."""
    from cep import _core

    events = _waves(60, seed=5)[:150]
    native = build_embedded_engine(native_bundled())
    core = native.core
    first = _core.EngineState()
    max_ts = max(e.ts for e in events)
    core.ingest_arrow(first, _batch(events, False), max_ts)
    good = core.export_blobs(first, all=True)
    gid = core.keys(first)[0][0]

    def fresh(with_bad: bool) -> Any:
        st = _core.EngineState()
        if with_bad:
            assert core.import_blob(st, _blob(gid, "bad", 0, b"CEPNK\xff\xff\xff")) == 0
        for blob in good:
            assert core.import_blob(st, blob) == 0
        return st

    state, clean = fresh(True), fresh(False)
    keys, wake, nxt = len(state), state.wake_len(), state.next_wake()
    assert keys == len(clean) + 1 and wake == clean.wake_len() + 1 and nxt == 0
    late = max_ts + 3 * HOUR  # every key is due
    empty = _batch(events[:1], False).slice(0, 0)
    with pytest.raises(Exception):
        core.ingest_arrow(state, empty, late)
    assert (len(state), state.wake_len(), state.next_wake()) == (keys, wake, nxt)
    assert (gid, "bad") in core.keys(state)
    core.delete_key(state, gid, "bad")
    assert sorted(core.keys(state)) == sorted(core.keys(clean))
    more = [e for e in _waves(600, seed=5) if e.ts > late]
    out = []
    for st in (state, clean):
        got, top, n_late = [], late, 0
        for i in range(0, len(more), 200):
            chunk = more[i:i + 200]
            res, late_rows, *_ = core.ingest_arrow(st, _batch(chunk, False), top)
            top = max(top, max(e.ts for e in chunk))
            got += _records(native, res)
            n_late += len(late_rows)
        end, *_ = core.ingest_arrow(st, empty, top, top)
        out.append((got + _records(native, end), n_late))
    assert out[0] == out[1] and len(out[0][0]) > 0
    assert (len(state), state.wake_len()) == (len(clean), clean.wake_len()) == (0, 0)


def test_a_state_belongs_to_the_rules_of_the_engine_that_filled_it() -> None:
    """An EngineState keeps its keys by group index and rule fingerprint: another engine built
    from the same rules goes on with it, one with other rules gets a clear error (not a
    misread), and the way across is export_blobs / import_blob into a new state."""
    from dataclasses import replace

    from cep import _core

    events = _waves(60, seed=3)[:120]
    ruleset = native_bundled()
    first, again = build_embedded_engine(ruleset), build_embedded_engine(ruleset)
    fewer = build_embedded_engine(replace(ruleset, rules=ruleset.rules[1:]))
    state = _core.EngineState()
    max_ts = max(e.ts for e in events)
    first.core.ingest_arrow(state, _batch(events, False), max_ts)
    keys = first.core.keys(state)
    assert keys and len(state) == len(keys)
    key_bytes = first.core.key_bytes(state, *keys[0])
    blobs = first.core.export_blobs(state, all=True)
    assert again.core.keys(state) == keys and again.core.next_wake(state) == state.next_wake()
    for call in (lambda: fewer.core.ingest_arrow(state, _batch(events[:1], False), max_ts),
                 lambda: fewer.core.ingest(state, events[:1], max_ts),
                 lambda: fewer.core.keys(state), lambda: fewer.core.next_wake(state),
                 lambda: fewer.core.export_blobs(state),
                 lambda: fewer.core.key_bytes(state, *keys[0]),
                 lambda: fewer.core.load_key(state, *keys[0], key_bytes),
                 lambda: fewer.core.delete_key(state, *keys[0]),
                 lambda: fewer.core.raw_bytes(state),
                 lambda: fewer.core.import_blob(state, blobs[0])):
        with pytest.raises(ValueError, match="engine with other rules"):
            call()
    assert first.core.keys(state) == keys and len(state) == len(keys), "refused: no change"
    assert first.core.key_bytes(state, *keys[0]) == key_bytes
    # A blob refused for its header or version leaves a new state free for any engine.
    loose = _core.EngineState()
    bad_version = blobs[0][:5] + (_core.BLOB_VERSION + 1).to_bytes(2, "little") + blobs[0][7:]
    for bad, why in ((b"XXXXX" + blobs[0][5:], "wrong header"), (bad_version, "format version")):
        with pytest.raises(ValueError, match=why):
            first.core.import_blob(loose, bad)
    fewer.core.ingest(loose, [], max_ts)
    moved = _core.EngineState()
    for blob in first.core.export_blobs(state, all=True):
        fewer.core.import_blob(moved, blob)
    assert set(fewer.core.keys(moved)) <= set(keys) and len(moved) > 0
    with pytest.raises(ValueError, match="engine with other rules"):
        first.core.ingest(moved, [], max_ts)
    # The refused calls changed nothing: the state goes on as an untouched copy does.
    twin = _core.EngineState()
    first.core.ingest_arrow(twin, _batch(events, False), max_ts)
    more = [e for e in _waves(60, seed=3)[120:] if e.ts > max_ts]
    top = max(e.ts for e in more)
    ends = []
    for st in (state, twin):
        res, late, *_ = first.core.ingest_arrow(st, _batch(more, False), max_ts)
        end, *_ = first.core.ingest(st, [], top, top)
        ends.append((_records(first, res + end), len(late), first.core.keys(st)))
    assert ends[0] == ends[1] and ends[0][0], "the same results after the refused calls"


def _call_by_call(native: Any, state: Any, events: list[Event], batch: int,
                  after_call: Callable[[], None] = lambda: None,
                  ruleset: Any = None) -> tuple[int, int]:
    """The bundled rules (or `ruleset`) on `native` (an embedded native engine) with `state` and
    on the Python engine, `batch` events a call: results, late reports, keys with state, wake
    keys and the next wake equal call by call (`after_call` runs after each native call), and at
    the end of input, after which no key is left. Returns (late reports, results)."""
    python = build_engine(ruleset or native_bundled(), use_native=False)
    core = native.core
    py_store, max_ts, n_late, n_results = MemoryKeyStore(), NEG_INF, 0, 0
    for i in range(0, len(events), batch):
        chunk = events[i:i + batch]
        want = python.ingest(py_store, chunk, max_ts)
        got, late, *_ = core.ingest_arrow(state, _batch(chunk, False), max_ts)
        assert _records(native, got) == _records(python, want.matches)
        assert [(tuple(ids), key, chunk[j].seq) for ids, key, j, _ in late] == \
            [(tuple(x.rule_ids), x.key, x.event.seq) for x in want.late]
        n_late, n_results = n_late + len(late), n_results + len(got)
        after_call()
        assert len(state) == len(core.keys(state)) == len(py_store.states)
        assert state.wake_len() == len(py_store.wake)
        assert core.next_wake(state) == python.next_wake(py_store)
        max_ts = max(max_ts, max(e.ts for e in chunk))
    end = python.advance(py_store, max_ts, end_of_input=max_ts).matches
    got, *_ = core.ingest_arrow(state, _batch(events[:1], False).slice(0, 0), max_ts, max_ts)
    assert _records(native, got) == _records(python, end)
    assert len(state) == 0 and state.wake_len() == 0
    return n_late, n_results + len(got)


@pytest.mark.parametrize(("batch", "track_dirty"), [(37, False), (500, True)])
def test_keys_held_as_bytes_between_calls_match_the_python_engine(batch: int,
                                                                  track_dirty: bool) -> None:
    """Every key held as its `CEPNK` bytes between calls (`export_blobs` after each call with
    `keep_decoded=0`: what docs/native-core.md "Compact key state" measured), decoded when an
    event or a deadline reaches it: results, late reports, keys with state, wake keys and the
    next wake equal the Python engine's, call by call."""
    from cep import _core

    native = build_embedded_engine(native_bundled())
    core = native.core
    state = _core.EngineState(track_dirty=track_dirty, keep_decoded=0)
    held = [0]

    def export() -> None:
        core.export_blobs(state)
        held[0] = max(held[0], core.raw_bytes(state))

    n_late, _ = _call_by_call(native, state, _waves(600, seed=batch), batch, export)
    assert held[0] > 0 and n_late > 0, "keys were held as bytes, some events came late"


@pytest.mark.parametrize("batch", [1, 37])
def test_compacted_key_states_match_the_python_engine(batch: int) -> None:
    """Every key's state compacted each time it is put back (`compact_from=0`; by default only
    from 65,536 decoded keys on, docs/native-core.md "Compact key state (session 14)"): runs,
    entries and captures given back their spare room and grown again by the next events give
    the Python engine's results, late reports, keys with state, wake keys and next wake, call
    by call, and the same at the end of input."""
    from cep import _core

    native = build_embedded_engine(native_bundled())
    n_late, n_results = _call_by_call(native, _core.EngineState(compact_from=0),
                                      _waves(600, seed=100 + batch), batch)
    assert n_results > 0 and n_late > 0


def test_compacted_keys_with_rule_families_match_the_python_engine() -> None:
    """Both of session 15's many-keys paths at once (`compact_from=0`): `ingest_arrow`'s key
    prefetch and one key text per key (the row names its key by the slot's text), with rule
    families whose vectors are reused from key to key and one results list per key (the fraud
    rules' varied copies, three families), against the Python engine call by call."""
    from pathlib import Path

    from bench.native_rules import varied_rules_text
    from cep import _core
    from cep.compile import compile_rules

    path = Path(__file__).resolve().parents[2] / "bench" / "rules" / "fraud.cep"
    ruleset = compile_rules(varied_rules_text(path.read_text(), 3), "varied")
    native = build_embedded_engine(ruleset, use_native=True, families=True)
    assert len(native.families) == 3
    n_late, n_results = _call_by_call(native, _core.EngineState(compact_from=0),
                                      _waves(300, seed=7), 37, ruleset=ruleset)
    assert n_results > 0 and n_late > 0


def _mass_expiry(seed: int) -> list[Event]:
    """~3,000 cards charging within 20 minutes, 150 of them every 10 minutes for 5 h; at 2.5 h
    a second wave, half of it under the first wave's texts (their ids reused meanwhile by other
    keys), half new. The call that crosses the 2 h gap releases every first-wave key but the
    150 in one call, whatever the batch size (docs/native-core.md "Many keys: the mass expiry
    (session 16)"); the calls around it release a few."""
    rng = random.Random(seed)
    rows = []

    def charges(card: str, t: int, n: int, step: int) -> None:
        home = rng.choice(["NL", "DE"])
        for _ in range(n):
            rows.append({"ts": t, "card": card, "amount": rng.choice([1.5, 25.0, 900.0]),
                         "merchant": "m1", "country": home if rng.random() < 0.8 else "US"})
            t += step

    for i in range(3_000):
        charges(f"c{i}", rng.randrange(20 * 60_000), rng.choice([1, 2, 3]), 7_000)
    for i in range(3_000, 3_150):
        charges(f"c{i}", rng.randrange(60_000), 30, 10 * 60_000)
    for i in range(1_500, 4_500):
        if not 3_000 <= i < 3_150:
            charges(f"c{i}", int(2.5 * HOUR) + rng.randrange(20 * 60_000), rng.choice([1, 2]),
                    9_000)
    events = [Event("transactions", r["ts"], seq, r) for seq, r in enumerate(rows)]
    events.sort(key=lambda e: (e.ts, e.seq))
    return events


@pytest.mark.parametrize(("batch", "compact_from"), [(97, 65_536), (1_000, 0), (6_000, 65_536)])
def test_many_keys_released_in_one_call_match_the_python_engine(batch: int,
                                                               compact_from: int) -> None:
    """Most keys expire in one call (their ids freed in `FreeIds`, the due ids put in order
    through a bitmap) while others stay live and new keys, some under released texts and
    reused ids, arrive: results, late reports, keys with state, wake keys and next wake equal
    the Python engine's call by call, at several batch sizes, and at the end of input."""
    from cep import _core

    native = build_embedded_engine(native_bundled())
    state = _core.EngineState(compact_from=compact_from)
    live = [0]

    def peak() -> None:
        live[0] = max(live[0], len(state))

    _, n_results = _call_by_call(native, state, _mass_expiry(batch), batch, peak)
    assert live[0] >= 2_500 and n_results > 0


class _Raising(Mapping[str, Any]):
    """An event's data whose `amount` cannot be read: the rules' condition raises (a
    condition's own errors give NULL, docs/semantics.md; a failing read of the event does not)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def __getitem__(self, name: str) -> Any:
        if name == "amount":
            raise RuntimeError("amount unreadable")
        return self.data[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


def test_a_key_whose_rule_raises_keeps_its_events_not_released_as_the_python_engine() -> None:
    """A rule raises while a key is advanced (an event whose field cannot be read): the call
    fails in both engines, and the key keeps the events the call did not release (the Python
    engine's store keeps its buffer); three probes then a large charge, the first probe
    buffered during the failed call, raise the same card-testing alert afterwards."""
    ruleset = native_bundled()
    python = build_engine(ruleset, use_native=False)
    native = build_embedded_engine(ruleset)
    t0, t1 = 10 * HOUR, 11 * HOUR

    def charge(seq: int, ts: int, amount: float, data: Any = None) -> Event:
        row = {"ts": ts, "card": "k", "amount": amount, "merchant": "m1", "country": "NL"}
        return Event("transactions", ts, seq, data(row) if data else row)

    calls = [[charge(0, t0, 25.0)], [charge(1, t0 + 1000, 30.0, _Raising)],
             [charge(2, t1, 1.5)],  # releases the two events above: the rule raises
             [charge(3, t1 + 10_000, 1.5), charge(4, t1 + 20_000, 1.5),
              charge(5, t1 + 30_000, 900.0)]]
    out = [_with_a_failing_call(engine, calls, 2)[0] for engine in (python, native)]
    assert out[0] == out[1]
    assert [r["rule_id"] for r in out[0]] == ["card_testing"], "the buffered probe counts"


def _held(engine: Any, store: MemoryKeyStore) -> tuple[int, int]:
    """(keys with state, keys in the wake index) of either engine."""
    if hasattr(engine, "live_keys"):
        return engine.live_keys(store), engine.wake_keys(store)
    return len(store.states), len(store.wake)


def _with_a_failing_call(engine: Any, calls: list[list[Event]], failing: int) -> tuple[
        list[dict[str, Any]], tuple[int, int], tuple[int, int]]:
    """The calls through `engine`, call `failing` raising the unreadable amount, then the end
    of input: (the results, `_held` after the failed call, `_held` at the end)."""
    store, max_ts = MemoryKeyStore(), NEG_INF
    got: list[Any] = []
    after_error = (-1, -1)
    for i, chunk in enumerate(calls):
        if i == failing:
            with pytest.raises(RuntimeError, match="amount unreadable"):
                engine.ingest(store, chunk, max_ts)
            after_error = _held(engine, store)
        else:
            got += engine.ingest(store, chunk, max_ts).matches
        max_ts = max(max_ts, max(e.ts for e in chunk))
    got += engine.ingest(store, [], max_ts, end_of_input=max_ts).matches
    return _records(engine, got), after_error, _held(engine, store)


def test_a_key_without_buffered_events_whose_rule_raises_keeps_the_same_state_in_both() -> None:
    """The rule error path when the key had nothing buffered before the call: both engines keep
    the call's events not released (the Python engine used to lose them: its buffer was a new
    list, not the stored one) and set the wake of the keys the failed call did not finish (the
    Python engine used to lose the wake of a due key not reached: its buffered event was then
    never released, even at the end of input). Same live keys and wake keys after the failed
    call, same results and no state left at the end.

        card a:  . . . . . . . . . . . . raise@t0+1s ... probe@t1 | probes, large charge
        card b:  probe@t0 (buffered; due in the failed call, not reached: a fails first)
    """
    ruleset = native_bundled()
    python = build_engine(ruleset, use_native=False)
    native = build_embedded_engine(ruleset)
    t0, t1 = 10 * HOUR, 11 * HOUR

    def charge(seq: int, card: str, ts: int, amount: float, data: Any = None) -> Event:
        row = {"ts": ts, "card": card, "amount": amount, "merchant": "m1", "country": "NL"}
        return Event("transactions", ts, seq, data(row) if data else row)

    calls = [[charge(0, "b", t0, 1.5)],
             [charge(1, "a", t0 + 1000, 30.0, _Raising), charge(2, "a", t1, 1.5)],
             [charge(3, "a", t1 + 10_000, 1.5), charge(4, "a", t1 + 20_000, 1.5),
              charge(5, "a", t1 + 30_000, 900.0)]]
    (want, want_err, want_end), (got, got_err, got_end) = (
        _with_a_failing_call(engine, calls, 1) for engine in (python, native))
    assert want_err == got_err == (2, 2)
    assert want == got and want_end == got_end == (0, 0)
    assert [r["rule_id"] for r in want] == ["card_testing"], "the probe kept counts"


def test_a_state_belongs_to_the_declared_tables_of_the_engine_that_filled_it() -> None:
    """The declared streams' column tables are part of what ties an `EngineState` to its engine
    (`engine_ident`): a key held as bytes names a known table by its fingerprint only, so an
    engine built from the same rules without that table (or with another) could not read it
    back. It refuses the state instead; an engine with the same tables goes on with it."""
    from cep import _core
    from cep.runtime.native import native_program
    from cep.runtime.native_engine import _declared_fields

    runtimes = list(build_embedded_engine(native_bundled()).rules.values())
    rules = [(native_program(r.meta), None, r.stream, r.key_field, r.lateness_ms, r.content_hash)
             for r in runtimes]
    tables = _declared_fields(runtimes)
    assert tables, "the bundled streams declare their fields"
    first, same = _core.Engine(rules, tables), _core.Engine(rules, tables)
    events = _waves(30, seed=4)[:60]
    state = _core.EngineState()
    max_ts = max(e.ts for e in events)
    first.ingest_arrow(state, _batch(events, False), max_ts)
    assert len(state) > 0
    first.export_blobs(state, all=True)  # (keys held as bytes: keep_decoded=0)
    assert same.keys(state) == first.keys(state)
    for other in ([], [*tables, ["x", "y"]], [[*t, "extra"] for t in tables]):
        with pytest.raises(ValueError, match="engine with other rules"):
            _core.Engine(rules, other).ingest(state, [], max_ts)
    end, *_ = same.ingest(state, [], max_ts, max_ts)
    assert len(state) == 0


_TWO_STREAMS = """
STREAM pay (ts INT, card STRING, amount FLOAT, country STRING) TIME BY ts LATENESS 5s;
STREAM atm (ts INT, card STRING, amount FLOAT, country STRING) TIME BY ts LATENESS 5s;
RULE pay_travel FROM pay PARTITION BY card
  PATTERN (A B) DEFINE B AS B.country <> A.country WITHIN 1h EMIT 'pay_travel';
RULE pay_burst FROM pay PARTITION BY card PATTERN (A{3}) WITHIN 10m EMIT 'pay_burst';
RULE atm_big FROM atm PARTITION BY card
  PATTERN (S L) DEFINE S AS S.amount < 50, L AS L.amount >= 500 WITHIN 30m EMIT 'atm_big';
"""


@pytest.mark.parametrize(("batch", "int_cards"), [(1, False), (37, False), (37, True)])
def test_key_cells_of_two_streams_sharing_a_key_column_match_the_python_engine(
        batch: int, int_cards: bool) -> None:
    """`ingest_arrow` with many keys (`compact_from=0`) reads a row's key cell as the key's own
    text (`keyed_row`, docs/native-core.md "Many keys: memory per key (session 16)"): two
    streams in one batch whose groups share the `card` column and the same card texts (each
    group's key its own), null cards, and cards that are integers (no string cell: read as
    before) give the Python engine's results, late reports and keys, call by call."""
    from cep import _core
    from cep.compile import compile_rules

    ruleset = compile_rules(_TWO_STREAMS, "two_streams")
    native = build_embedded_engine(ruleset, use_native=True)
    rng = random.Random(batch)
    events = []
    for seq in range(1_500):
        t = seq * 7_000 + rng.randrange(5_000)
        card = None if rng.random() < 0.05 else rng.randrange(60)
        if card is not None and not int_cards:
            card = f"c{card}"
        events.append(Event(rng.choice(["pay", "atm"]), t, seq,
                            {"ts": t, "card": card, "amount": rng.choice([10.0, 80.0, 900.0]),
                             "country": rng.choice(["NL", "NL", "NL", "DE"])}))
    events.sort(key=lambda e: (e.ts, e.seq))
    for k in range(30, len(events) - 100, 211):
        events.insert(k + 100, events.pop(k))
    n_late, n_results = _call_by_call(native, _core.EngineState(compact_from=0), events, batch,
                                      ruleset=ruleset)
    assert n_results > 0 and n_late > 0


_GROWING = """
STREAM s (ts INT, card STRING, amount FLOAT, country STRING) TIME BY ts LATENESS 5s;
RULE star FROM s PARTITION BY card
  PATTERN (A B* C) DEFINE A AS A.amount < 100, B AS B.amount < 500, C AS C.amount >= 500
  WITHIN 10m EMIT 'star';
RULE alt FROM s PARTITION BY card
  PATTERN ((A | B) C{2,3}) DEFINE A AS A.country = 'NL', B AS B.amount > 50, C AS C.amount > 20
  WITHIN 5m EMIT 'alt';
RULE every FROM s PARTITION BY card
  PATTERN (A C+) DEFINE C AS C.amount > A.amount WITHIN 3m ALL MATCHES EMIT 'every';
RULE travel FROM s PARTITION BY card
  PATTERN (A B) DEFINE B AS B.country <> A.country WITHIN 1h EMIT 'travel';
"""


def _growing_events(seed: int) -> list[Event]:
    """`_GROWING`'s stream: 80 cards in 6 hourly waves, 1-8 charges each, a few late."""
    rng = random.Random(seed)
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
    for k in range(25, len(events) - 80, 113):
        events.insert(k + 80, events.pop(k))
    return events


@pytest.mark.parametrize("batch", [1, 29, 400])
def test_compacted_vectors_of_many_keys_match_the_python_engine(batch: int) -> None:
    """With many keys (`compact_from=0` here) a key's vectors are moved into blocks of their
    length each time its state is put back (`matcher::fit`, docs/native-core.md "Many keys:
    compaction into blocks of the length (session 17)"): runs added to a key's runs, entries
    that grow and shrink, several start variables and next positions, captures grown in place
    and shared by several entries (ALL MATCHES), keys with one to four live rules: the Python
    engine's results, late reports, keys and wakes, call by call; and the same with the
    default `compact_from` (no compaction)."""
    from cep import _core
    from cep.compile import compile_rules

    ruleset = compile_rules(_GROWING, "growing")
    events = _growing_events(batch)
    for compact_from in (0, 65_536):
        native = build_embedded_engine(ruleset, use_native=True)
        n_late, n_results = _call_by_call(native, _core.EngineState(compact_from=compact_from),
                                          events, batch, ruleset=ruleset)
        assert n_results > 0 and n_late > 0


@pytest.mark.parametrize("keep_decoded", [400, 3_000])
def test_keys_evicted_past_a_budget_at_every_export_keep_their_bytes_and_state(
        keep_decoded: int) -> None:
    """The operator's shard: every call's changed keys exported, then the decoded keys past a
    budget of a few keys held as bytes (`export_blobs`' eviction, in id order with their states
    asked for ahead: docs/native-core.md, "The live operator's calls: the eviction's drops, out
    of the caches (session 22, export22)"), more than the prefetch's reach in some export (and
    a budget that holds them all). After every call each key's bytes equal those of a state
    never exported, and the results the Python engine's, to the end of input."""
    from cep import _core

    events, python, native = _waves(900, seed=23), *_engines()
    core = native.core
    py_store, max_ts = MemoryKeyStore(), NEG_INF
    kept = _core.EngineState()
    state = _core.EngineState(track_dirty=True, keep_decoded=keep_decoded)
    compared = evicted = 0
    for i in range(0, len(events), 150):
        chunk = events[i:i + 150]
        want = python.ingest(py_store, chunk, max_ts).matches
        core.ingest_arrow(kept, _batch(chunk, False), max_ts)
        got, *_ = core.ingest_arrow(state, _batch(chunk, False), max_ts)
        assert _records(native, got) == _records(python, want)
        core.export_blobs(state)
        keys = core.keys(kept)
        assert sorted(core.keys(state)) == sorted(keys)
        held = [core.key_bytes(state, gid, key) for gid, key in keys]
        assert held == [core.key_bytes(kept, gid, key) for gid, key in keys]
        # Every key's bytes held once (decoded beside its bytes, or held as bytes).
        assert core.raw_bytes(state) == sum(len(b) for b in held)
        compared += len(keys)
        # The decoded keys' bytes total at most the budget, so the rest are held as bytes: at
        # least as many keys as the largest sizes it takes to cover the excess.
        excess, sizes = sum(map(len, held)) - keep_decoded, sorted(map(len, held), reverse=True)
        evicted = max(evicted, next((n for n in range(len(sizes) + 1)
                                     if sum(sizes[:n]) >= excess), len(sizes)))
        max_ts = max(max_ts, max(e.ts for e in chunk))
    want = python.advance(py_store, max_ts, end_of_input=max_ts).matches
    got, *_ = core.ingest_arrow(state, _batch(events[:1], False).slice(0, 0), max_ts, max_ts)
    assert _records(native, got) == _records(python, want) and compared > 0
    assert len(state) == 0
    # 400: some export evicted more keys than `prefetch_ahead` looks ahead (14); 3,000: the
    # budget holds every key's bytes at every export, so none is evicted.
    assert evicted > 14 if keep_decoded == 400 else evicted == 0
