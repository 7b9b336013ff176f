"""The engine on the native matcher against the engine on the Python matcher: the bundled rules
over generated streams (with injected alerts), at several batch sizes, give identical results;
and the native boundary turns a panic into an exception naming the rule. Stage 2: the engine loop
in the core (`build_embedded_engine`) against the Python engine on the bundled rules, from
events and from Arrow batches, its key state bytes, and a panic in it."""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cep import _core
from cep.compile import compile_rules, load_rules_dir
from cep.datagen import GENERATORS
from cep.nfa import RuleSet
from cep.runtime.alerts import alert_record
from cep.runtime.bind import (
    build_embedded_engine,
    build_engine,
    engine_kind,
    matcher_kind,
    matcher_report,
)
from cep.runtime.embedded import alerts_for
from cep.runtime.engine import NEG_INF, Event, MemoryKeyStore, events_from_dicts, run_embedded
from cep.runtime.native import native_matcher
from tests.hyp import examples, profile

RULES = Path(__file__).resolve().parents[2] / "rules"
# rules/history.cep's rules read windows of a key's history, which the core does not run: they
# run on the Python engine (docs/windows.md).
WINDOW_RULES = {"spend_far_above_usual", "failed_login_burst", "failed_login_spray",
                "cnp_session_spree"}


def native_bundled() -> RuleSet:
    """The bundled rules the core runs: those that read tables (docs/tables.md; tests/tables/
    checks them) or windows (docs/windows.md) run on the Python engine."""
    bundled = load_rules_dir(RULES)
    return RuleSet(tuple(r for r in bundled.rules if not r.lookups and r.id not in WINDOW_RULES),
                   bundled.streams)


def test_bundled_window_rules_say_why_they_are_not_native() -> None:
    python = {rule: why for rule, kind, why in matcher_report(load_rules_dir(RULES))
              if kind == "python"}
    assert WINDOW_RULES <= set(python)
    assert all("run on the Python engine (docs/windows.md)" in (python[r] or "")
               for r in WINDOW_RULES)


def _results(engine, events, batch):  # type: ignore[no-untyped-def]
    store = MemoryKeyStore()
    out = []
    for r in run_embedded(engine, events, batch_size=batch, store=store):
        measures = tuple(sorted((k, repr(v)) for k, v in getattr(r, "measures", {}).items()))
        evs = tuple((e.var, e.ts, e.seq) for e in getattr(r, "events", ()))
        out.append((r.kind, r.rule_id, str(r.key), getattr(r, "first_ts", None), evs, measures))
    assert store.states == {}
    return out


@pytest.mark.parametrize("domain", ["fraud", "machines", "trading"])
def test_engine_native_equals_python_on_bundled_rules(domain: str) -> None:
    ruleset = native_bundled()
    assert all(kind == "native" for _, kind, _ in matcher_report(ruleset))
    ds = GENERATORS[domain](n_events=1_000 if profile() == "dev" else 3_000, n_keys=40, seed=3,
                            inject=4)
    events = events_from_dicts(ds.stream, ds.events)
    native = build_engine(ruleset, use_native=True)
    python = build_engine(ruleset, use_native=False)
    assert {matcher_kind(r.matcher) for r in native.rules.values()} == {"native"}
    assert {matcher_kind(r.matcher) for r in python.rules.values()} == {"python"}
    for batch in (1, 500):
        expected = _results(python, events, batch)
        assert expected, "the generator injects alerts"
        assert _results(native, events, batch) == expected


def test_engine_state_pickles_with_native_matchers() -> None:
    ruleset = native_bundled()
    ds = GENERATORS["fraud"](n_events=1_000, n_keys=20, seed=5, inject=2)
    events = sorted(events_from_dicts(ds.stream, ds.events), key=lambda e: (e.ts, e.seq))
    engine = build_engine(ruleset, use_native=True)
    store = MemoryKeyStore()
    half = len(events) // 2
    engine.ingest(store, events[:half], events[0].ts)
    store.states = pickle.loads(pickle.dumps(store.states))
    out = engine.ingest(store, events[half:], events[half - 1].ts)
    ref_store = MemoryKeyStore()
    ref = build_engine(ruleset, use_native=False)
    ref.ingest(ref_store, events[:half], events[0].ts)
    ref_out = ref.ingest(ref_store, events[half:], events[half - 1].ts)
    assert [(r.rule_id, str(r.key), r.first_ts) for r in out.matches] == [
        (r.rule_id, str(r.key), r.first_ts) for r in ref_out.matches]


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """(value, next offset) of the LEB128 varint at `at`."""
    shift = value = 0
    while True:
        b = data[at]
        at += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, at


def _with_a_bad_position(data: bytes) -> bytes:
    """A matcher state (CEPNS v2, varints) whose first entry's state position points at a state
    that does not exist: walk magic 5 + version 2, row, deadline, runs, start, matched, tpart
    (none), entries, then replace the position by 999."""
    _, at = _varint(data, 7)  # row
    at = _varint(data, at + 1)[1] if data[at] else at + 1  # deadline
    _, at = _varint(data, at)  # runs
    _, at = _varint(data, at)  # start
    at += 1  # matched
    assert data[at] == 0  # no tpart
    _, at = _varint(data, at + 1)  # entries
    _, end = _varint(data, at)  # the position
    return data[:at] + bytes([0xCE, 0x0F]) + data[end:]  # 999, zigzag varint


def test_a_panic_in_the_core_is_an_exception_naming_the_rule() -> None:
    rule = compile_rules("STREAM s TIME BY ts;\nRULE probe FROM s PATTERN (a b) "
                         "DEFINE a AS v = 1 WITHIN 5ms EMIT 'm';", "p.cep").get("probe")
    m = native_matcher(rule)
    state, _ = m.on_event(None, {"v": 1, "ts": 0}, 0, 0)
    broken = _core.state_from_bytes(_with_a_bad_position(state.to_bytes()))
    with pytest.raises(_core.CoreError, match="rule probe"):
        m.on_event(broken, {"v": 2, "ts": 1}, 1, 1)


# -- stage 2: the engine loop in the core (cep.runtime.native_engine) ------------------------

def _engine_results(engine, events, batch):  # type: ignore[no-untyped-def]
    store, late = MemoryKeyStore(), []  # type: ignore[var-annotated]
    out = []
    for r in run_embedded(engine, events, batch_size=batch, store=store, late=late):
        measures = tuple(sorted((k, repr(v)) for k, v in getattr(r, "measures", {}).items()))
        evs = tuple((e.var, e.ts, e.seq, repr(sorted(e.event.items())))
                    for e in getattr(r, "events", ()))
        out.append((r.kind, r.rule_id, str(r.key), getattr(r, "first_ts", None), evs, measures))
    if engine_kind(engine) == "native":
        assert engine.live_keys(store) == 0 and engine.wake_keys(store) == 0
    else:
        assert store.states == {} and len(store.wake) == 0
    return out, [(lt.rule_ids, lt.key, lt.event.seq, lt.watermark) for lt in late]


@pytest.mark.parametrize("domain", ["fraud", "machines", "trading"])
def test_native_engine_equals_python_engine_on_bundled_rules(domain: str) -> None:
    ruleset = native_bundled()
    # The inner loop (`dev` profile) runs a third of the stream: the Python engine at batch
    # size 1 on the trading rules is the slowest part of `make test-fast`.
    n_events = 1_000 if profile() == "dev" else 3_000
    ds = GENERATORS[domain](n_events=n_events, n_keys=40, seed=3, inject=4)
    events = events_from_dicts(ds.stream, ds.events)  # generator order: some events are late
    native = build_embedded_engine(ruleset)
    assert engine_kind(native) == "native"
    python = build_engine(ruleset, use_native=False)
    for batch in (1, 7, 500):
        expected = _engine_results(python, events, batch)
        assert expected[0], "the generator injects alerts"
        assert _engine_results(native, events, batch) == expected
    assert alerts_for(native, {ds.stream: ds.events}) == alerts_for(python, {ds.stream: ds.events})


def test_cep_engine_python_selects_the_python_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    ruleset = native_bundled()
    monkeypatch.setenv("CEP_ENGINE", "python")
    assert engine_kind(build_embedded_engine(ruleset)) == "python"
    monkeypatch.delenv("CEP_ENGINE")
    assert engine_kind(build_embedded_engine(ruleset)) == "native"


def _batch(events, json_data: bool):  # type: ignore[no-untyped-def]
    import pyarrow as pa

    cols = {"stream": [e.stream for e in events], "ts": [e.ts for e in events],
            "seq": [e.seq for e in events]}
    if json_data:
        cols["data"] = [json.dumps(e.data) for e in events]
    else:
        for name in events[0].data:
            if name != "ts":
                cols[name] = [e.data.get(name) for e in events]
    return pa.RecordBatch.from_pydict(cols)


@pytest.mark.parametrize("json_data", [False, True])
def test_native_engine_from_arrow_batches(json_data: bool) -> None:
    ruleset = native_bundled()
    ds = GENERATORS["fraud"](n_events=2_000, n_keys=30, seed=4, inject=3)
    events = sorted(events_from_dicts(ds.stream, ds.events), key=lambda e: (e.ts, e.seq))
    python = build_engine(ruleset, use_native=False)
    native = build_embedded_engine(ruleset)
    got, want = [], []
    py_store, nat_store, max_ts = MemoryKeyStore(), MemoryKeyStore(), NEG_INF
    for i in range(0, len(events), 300):
        chunk = events[i:i + 300]
        want += python.ingest(py_store, chunk, max_ts).matches
        got += native.ingest_batch(nat_store, _batch(chunk, json_data), max_ts).matches
        max_ts = max(max_ts, chunk[-1].ts)
    want += python.advance(py_store, max_ts, end_of_input=max_ts).matches
    got += native.advance(nat_store, max_ts, end_of_input=max_ts).matches
    assert want
    assert [alert_record(native, r) for r in got] == [alert_record(python, r) for r in want]


def test_native_engine_orders_results_by_key_text_beyond_16_bytes() -> None:
    """The core sorts a call's keys through their first 16 bytes held inline and reads the text
    only on ties: keys sharing a long prefix, keys that are prefixes of others, and non-ASCII
    keys must still come out in the Python engine's (group, key) order, call by call."""
    ruleset = native_bundled()
    ds = GENERATORS["fraud"](n_events=2_000, n_keys=30, seed=5, inject=3)
    prefix = "customer/account/0042/"  # 22 bytes: past the inline part
    names = {}
    for i, card in enumerate(sorted({e["card"] for e in ds.events})):
        names[card] = [prefix + str(i), prefix + str(i)[:1], prefix + "é" + str(i), str(i)][i % 4]
    rows = [{**e, "card": names[e["card"]]} for e in ds.events]
    events = sorted(events_from_dicts(ds.stream, rows), key=lambda e: (e.ts, e.seq))
    python = build_engine(ruleset, use_native=False)
    native = build_embedded_engine(ruleset)
    py_store, nat_store, max_ts = MemoryKeyStore(), MemoryKeyStore(), NEG_INF
    calls = 0
    for i in range(0, len(events), 250):
        chunk = events[i:i + 250]
        want = python.ingest(py_store, chunk, max_ts).matches
        got = native.ingest_batch(nat_store, _batch(chunk, False), max_ts).matches
        assert [alert_record(native, r) for r in got] == [alert_record(python, r) for r in want]
        calls += len(want) > 1
        max_ts = max(max_ts, chunk[-1].ts)
    want = python.advance(py_store, max_ts, end_of_input=max_ts).matches
    got = native.advance(nat_store, max_ts, end_of_input=max_ts).matches
    assert [alert_record(native, r) for r in got] == [alert_record(python, r) for r in want]
    assert calls or len(want) > 1, "some call orders several results"


def _probe_with_a_partial_match() -> tuple[Any, MemoryKeyStore]:
    """The native engine of a two-step rule, and a store where key K holds a partial match."""
    ruleset = compile_rules("STREAM s TIME BY ts;\nRULE probe FROM s PARTITION BY k PATTERN (a b) "
                            "DEFINE a AS v = 1, b AS v = 2 WITHIN 5ms EMIT 'm';", "p.cep")
    engine = build_embedded_engine(ruleset)
    store = MemoryKeyStore()
    engine.ingest(store, [Event("s", 0, 0, {"k": "K", "v": 1, "ts": 0})], NEG_INF)
    engine.ingest(store, [Event("s", 1, 1, {"k": "K", "v": 3, "ts": 1})], 0)
    return engine, store


def test_native_engine_key_state_bytes_are_versioned() -> None:
    engine, store = _probe_with_a_partial_match()
    assert engine.keys(store) == [("s:k", "K")]
    data = engine.key_bytes(store, "s:k", "K")
    assert data[:5] == b"CEPNK" and engine.key_bytes(store, "s:k", "other") is None
    with pytest.raises(ValueError, match="format version 9"):
        engine.load_key(MemoryKeyStore(), "s:k", "K",
                        data[:5] + (9).to_bytes(2, "little") + data[7:])
    with pytest.raises(ValueError, match="wrong header"):
        engine.load_key(MemoryKeyStore(), "s:k", "K", b"nonsense")
    # Versions 1-3 (earlier releases) are not read: discard or replay, says the error.
    for old in (1, 2, 3):
        with pytest.raises(ValueError, match=f"format version {old}, but this cep._core reads "
                                             "version 4: .* discard it"):
            engine.load_key(MemoryKeyStore(), "s:k", "K",
                            data[:5] + old.to_bytes(2, "little") + data[7:])
    # The same state read back continues exactly as the original.
    again = MemoryKeyStore()
    engine.load_key(again, "s:k", "K", data)
    assert engine.next_wake(again) == engine.next_wake(store)
    assert ([r.first_ts for r in engine.advance(again, 2, end_of_input=2).matches]
            == [r.first_ts for r in engine.advance(store, 2, end_of_input=2).matches])


def _broken_probe_bytes(engine: Any, store: MemoryKeyStore) -> bytes:
    """Key K's bytes of `_probe_with_a_partial_match` with its entry at a state the rule does
    not have: advancing it panics inside the rule."""
    data = engine.key_bytes(store, "s:k", "K")
    # CEPNK v4 (core/src/keycodec.rs): magic, version, parts, then the part's fingerprint (4
    # bytes) and matcher state: row, runs, the first run's row offset, then its flag byte, which
    # holds the position + 2 of the run's one entry in bits 2-7: rewritten in the general form
    # (entries 1, position + 1 = 1000: state 999, which the rule does not have).
    assert data[5:7] == (4).to_bytes(2, "little")
    _, at = _varint(data, 7)  # parts
    at += 4
    _, at = _varint(data, at)  # row
    _, at = _varint(data, at)  # runs
    _, at = _varint(data, at)  # row - start
    flags = data[at]
    assert flags & 2 == 0 and flags >> 2 != 0  # no timeout part; one entry
    return data[:at] + bytes([flags & 3, 1, 0xE8, 0x07]) + data[at + 1:]


def test_a_panic_in_the_native_engine_is_an_exception_naming_the_rule() -> None:
    engine, store = _probe_with_a_partial_match()
    data = _broken_probe_bytes(engine, store)
    broken = MemoryKeyStore()
    engine.load_key(broken, "s:k", "K", data)
    with pytest.raises(_core.CoreError, match="rule probe"):
        engine.ingest(broken, [Event("s", 2, 2, {"k": "K", "v": 5, "ts": 2})], 1)


class _NoOrder:
    """An event's `seq` whose `<` answers at random: no total order."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def __lt__(self, other: object) -> bool:
        return self.rng.random() < 0.5


def test_a_panic_in_sorting_a_keys_events_keeps_them_in_time_order() -> None:
    """Events of equal time whose `seq`s have no order make the sort of the key's buffer panic,
    outside the rules' guards (docs/native-core.md, "A panic outside the rules' guards"): the
    call raises naming the rule, and the key keeps its events in time order, so an advance by
    time releases those at or before the watermark, and the end of input the rest."""
    ruleset = compile_rules("STREAM s TIME BY ts;\nRULE probe FROM s PARTITION BY k PATTERN (a) "
                            "DEFINE a AS v = 1 EMIT 'm';", "p.cep")
    engine, store, rng = build_embedded_engine(ruleset), MemoryKeyStore(), random.Random(1)
    tss = [20 if i % 2 == 0 else 10 for i in range(200)]
    events = [Event("s", ts, _NoOrder(rng), {"k": "K", "v": 1, "ts": ts}) for ts in tss]
    with pytest.raises(_core.CoreError, match="rule probe.*total order"):
        engine.ingest(store, events, NEG_INF)
    assert engine.live_keys(store) == 1
    assert [m.first_ts for m in engine.advance(store, 15).matches] == [10] * 100
    assert [m.first_ts for m in engine.advance(store, 30, end_of_input=30).matches] == [20] * 100
    assert engine.live_keys(store) == 0


def test_cep_test_cases_pass_on_the_native_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """`cep test rules/` runs on the native engine loop (the runner calls
    `build_embedded_engine`)."""
    import cep.testing.runner as runner
    from cep.cli import main

    kinds = set()

    def native_engine(ruleset):  # type: ignore[no-untyped-def]
        engine = build_embedded_engine(ruleset)
        kinds.add(engine_kind(engine))
        return engine

    monkeypatch.setattr(runner, "build_embedded_engine", native_engine)
    # rules/tests/customers.yaml and security.yaml test rules that read tables, history.yaml
    # rules that read windows: the Python engine's. machines.yaml's rules are native but one
    # (over_own_limit reads a table): a mixed engine.
    files = [str(p) for p in sorted((RULES / "tests").glob("*.yaml"))
             if p.stem not in ("customers", "history", "security", "machines")]
    assert len(files) == 2 and main(["test", *files]) == 0
    assert kinds == {"native"}
    kinds.clear()
    assert main(["test", str(RULES / "tests" / "machines.yaml")]) == 0
    assert kinds == {"mixed"}
    # rules/history.cep's windows run on the Python engine (docs/windows.md)
    kinds.clear()
    assert main(["test", str(RULES / "tests" / "history.yaml")]) == 0
    assert kinds == {"python"}


def test_a_key_state_of_another_rule_version_is_reset_as_in_the_python_engine() -> None:
    def rules(within: str):  # type: ignore[no-untyped-def]
        return compile_rules("STREAM s TIME BY ts;\nRULE probe FROM s PARTITION BY k PATTERN "
                             f"(a b) DEFINE a AS v = 1, b AS v = 2 WITHIN {within} EMIT 'm';",
                             "p.cep")

    old, new = build_embedded_engine(rules("5ms")), build_embedded_engine(rules("9ms"))
    store = MemoryKeyStore()
    old.ingest(store, [Event("s", 0, 0, {"k": "K", "v": 1, "ts": 0})], NEG_INF)
    old.ingest(store, [Event("s", 1, 1, {"k": "K", "v": 3, "ts": 1})], 0)
    data = old.key_bytes(store, "s:k", "K")
    moved = MemoryKeyStore()
    new.load_key(moved, "s:k", "K", data)
    out = new.ingest(moved, [Event("s", 2, 2, {"k": "K", "v": 2, "ts": 2})], 1)
    # The partial match (a at ts 0) belongs to the old version: dropped, counted as a reset;
    # the buffered event (ts 1) is matched by the new version.
    assert out.keys_reset == 1 and out.matches == []
    end = new.advance(moved, 2, end_of_input=2)
    assert end.matches == [] and new.live_keys(moved) == 0


def _declared(fields: str) -> Any:
    """A native engine on a declared stream `s (fields)`, LATENESS 10 ms: events stay buffered."""
    return build_embedded_engine(compile_rules(
        f"STREAM s ({fields}) TIME BY ts LATENESS 10ms;\nRULE probe FROM s PARTITION BY k "
        "PATTERN (a b) DEFINE a AS v = 1, b AS v = 2 WITHIN 5ms EMIT 'm';", "d.cep"))


def test_a_declared_streams_field_names_are_not_written_per_key() -> None:
    """Key state v4: rows whose columns are a declared stream's fields name that table by a
    fingerprint; a blob carries the tables its keys name, so a key read back by an engine whose
    stream declaration changed still has its events' fields."""
    import pyarrow as pa

    fields = "ts INT, k STRING, v INT, note STRING"
    engine, later = _declared(fields), _declared(fields + ", extra INT")
    batch = pa.RecordBatch.from_pydict({"stream": ["s", "s"], "ts": [0, 1], "seq": [0, 1],
                                        "k": ["K", "K"], "v": [1, 2], "note": ["n1", "n2"]})
    store = MemoryKeyStore()
    assert engine.ingest_batch(store, batch, NEG_INF).matches == []
    data = engine.key_bytes(store, "s:k", "K")
    assert b"note" not in data and b"n1" in data
    # The same engine reads it back, and matches as the original does.
    again = MemoryKeyStore()
    engine.load_key(again, "s:k", "K", data)
    want = [alert_record(engine, r) for r in engine.advance(store, 1, end_of_input=1).matches]
    assert [alert_record(engine, r) for r in engine.advance(again, 1, end_of_input=1).matches
            ] == want
    assert [e["event"] for e in want[0]["events"]] == [
        {"ts": 0, "k": "K", "v": 1, "note": "n1"}, {"ts": 1, "k": "K", "v": 2, "note": "n2"}]
    # An engine whose declaration differs does not know the table: a clear error, never a misread.
    with pytest.raises(ValueError, match="column table .* another declaration of the stream"):
        later.load_key(MemoryKeyStore(), "s:k", "K", data)
    # Through a blob (what the Spark operator stores) it has the table.
    store = MemoryKeyStore()
    engine.ingest_batch(store, batch, NEG_INF)
    blobs = engine.core.export_blobs(engine.state_of(store), True)
    moved = MemoryKeyStore()
    for blob in blobs:
        assert later.core.import_blob(later.state_of(moved), blob) == 0
    got = [alert_record(later, r) for r in later.advance(moved, 1, end_of_input=1).matches]
    assert [e["event"] for e in got[0]["events"]] == [e["event"] for e in want[0]["events"]]
    with pytest.raises(ValueError, match="blob format version 1, but this cep._core reads "
                                         "version 2: discard"):
        later.core.import_blob(later.state_of(MemoryKeyStore()),
                               blobs[0][:5] + (1).to_bytes(2, "little") + blobs[0][7:])


MULTI_STREAM_RULES = """
STREAM a TIME BY ts LATENESS 4ms;
STREAM b TIME BY ts LATENESS 4ms;
RULE up_down FROM a PARTITION BY k PATTERN (x y) DEFINE x AS x.v > 5, y AS y.v < x.v
  WITHIN 50ms EMIT 'up_down';
RULE pair FROM a PARTITION BY j PATTERN (x{2}) DEFINE x AS x.v >= 3 WITHIN 30ms EMIT 'pair';
RULE change FROM b PARTITION BY k PATTERN (x y) DEFINE y AS y.v <> x.v EMIT 'change';
"""


@pytest.mark.parametrize("size", [1, 7, 10_000])
def test_arrow_batches_of_several_streams_and_key_fields(size: int) -> None:
    """The Arrow path per row: the stream column read as bytes and its groups looked up when it
    changes (rows of streams a and b interleaved, runs of one stream, rows of an unknown stream
    and rows whose stream is null), an event of stream a reaching two groups (keys k and j: each
    group builds its own event on its projection, the last one takes the row), null keys and
    late events, at batch sizes 1, 7 and all: the Python engine's results and late reports."""
    import random

    import pyarrow as pa

    ruleset = compile_rules(MULTI_STREAM_RULES, "multi.cep")
    rng = random.Random(12)
    rows, ts = [], 0
    for seq in range(600):
        ts += rng.choice([0, 1, 2, 3, 9]) if rng.random() > 0.05 else -12  # some late ones
        stream = rng.choice(["a"] * 6 + ["b"] * 3 + ["c", None]) if seq % 50 > 20 else "a"
        rows.append({"stream": stream, "ts": max(ts, 0), "seq": seq,
                     "k": rng.choice(["K1", "K2", "K3", None]),
                     "j": rng.choice(["J1", "J2", None]), "v": rng.randint(0, 9)})
    python = build_engine(ruleset, use_native=False)
    native = build_embedded_engine(ruleset)
    py_store, nat_store, max_ts = MemoryKeyStore(), MemoryKeyStore(), NEG_INF
    got, want, got_late, want_late = [], [], [], []
    for i in range(0, len(rows), size):
        chunk = rows[i:i + size]
        events = [Event(r["stream"], r["ts"], r["seq"],
                        {n: r[n] for n in ("ts", "k", "j", "v")})
                  for r in chunk if r["stream"] is not None]
        batch = pa.RecordBatch.from_pydict({n: [r[n] for r in chunk]
                                            for n in ("stream", "seq", "ts", "k", "j", "v")})
        py_out = python.ingest(py_store, events, max_ts)
        nat_out = native.ingest_batch(nat_store, batch, max_ts)
        want += py_out.matches
        got += nat_out.matches
        want_late += [(x.rule_ids, x.key, x.event.seq) for x in py_out.late]
        got_late += [(x.rule_ids, x.key, x.event.seq) for x in nat_out.late]
        max_ts = max([max_ts, *(r["ts"] for r in chunk)])
    want += python.advance(py_store, max_ts, end_of_input=max_ts).matches
    got += native.advance(nat_store, max_ts, end_of_input=max_ts).matches
    assert {r.rule_id for r in want} == {"up_down", "pair", "change"}
    assert want_late or size >= len(rows)  # one batch: no watermark to be late for
    assert [alert_record(native, r) for r in got] == [alert_record(python, r) for r in want]
    assert got_late == want_late


def test_a_family_panic_keeps_the_key_state() -> None:
    """A panic while a rule family (docs/rule-families.md) advances a key is an exception naming
    a member, and the key keeps what the call did not consume, as on a single rule's error
    (`keep_unconsumed`): its event not released and the part of the rule not run yet, whose
    match then completes. (The family's path dropped the whole key state before.)"""
    from cep.runtime.bind import rule_hash

    text = ("STREAM s TIME BY ts;\n"
            "RULE p1 FROM s PARTITION BY k PATTERN (a b) DEFINE a AS v = 1, b AS v = 2 "
            "WITHIN 5ms EMIT 'm';\n"
            "RULE p2 FROM s PARTITION BY k PATTERN (a b) DEFINE a AS v = 1, b AS v = 3 "
            "WITHIN 6ms EMIT 'm';\n"
            "RULE other FROM s PARTITION BY k PATTERN (x -> y -> z) DEFINE x AS v = 1, "
            "y AS v = 3, z AS v = 9 WITHIN 1s EMIT 'o';\n")
    ruleset = compile_rules(text, "f.cep")
    engine = build_embedded_engine(ruleset)
    assert engine.families == [["p1", "p2"]]
    store = MemoryKeyStore()
    engine.ingest(store, [Event("s", 0, 0, {"k": "K", "v": 1, "ts": 0})], NEG_INF)
    engine.ingest(store, [Event("s", 1, 1, {"k": "K", "v": 5, "ts": 1})], 0)
    data = engine.key_bytes(store, "s:k", "K")
    # p1's part (a family member's part: how a family's state is written): its fingerprint,
    # then as in test_a_panic_in_the_native_engine_is_an_exception_naming_the_rule.
    fp = _core.rule_fingerprint("p1", rule_hash(ruleset.get("p1"))).to_bytes(4, "little")
    at = data.index(fp) + 4
    _, at = _varint(data, at)  # row
    _, at = _varint(data, at)  # runs
    _, at = _varint(data, at)  # row - start
    flags = data[at]
    assert flags & 2 == 0 and flags >> 2 != 0
    data = data[:at] + bytes([flags & 3, 1, 0xE8, 0x07]) + data[at + 1:]
    broken = MemoryKeyStore()
    engine.load_key(broken, "s:k", "K", data)
    with pytest.raises(_core.CoreError, match="rule p1: the native engine failed"):
        engine.ingest(broken, [Event("s", 2, 2, {"k": "K", "v": 3, "ts": 2})], 1)
    assert engine.keys(broken) == [("s:k", "K")], "the key keeps its state"
    assert engine.next_wake(broken) is not None
    end = engine.ingest(broken, [Event("s", 3, 3, {"k": "K", "v": 9, "ts": 3})], 2,
                        end_of_input=3).matches
    assert [(r.rule_id, r.first_ts) for r in end] == [("other", 0)]
    assert engine.live_keys(broken) == 0


@settings(max_examples=examples(300), deadline=None)
@given(edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1,
                      max_size=3), blob=st.booleans())
def test_corrupt_key_bytes_never_let_a_panic_cross_the_boundary(
        edits: list[tuple[int, int]], blob: bool) -> None:
    """Key states and blobs with bytes overwritten, loaded and then advanced, encoded and
    exported: every call returns or raises an `Exception` (a `ValueError` for bytes it cannot
    read, `CoreError` naming the rule for a panic inside a rule's work); a panic anywhere else
    would cross as pyo3's `PanicException`, a `BaseException` (a Spark worker's death, not an
    error), which the boundary turns into `CoreError` too."""
    engine, store = _probe_with_a_partial_match()
    data = bytearray(engine.core.export_blobs(engine.state_of(store), all=True)[0] if blob
                     else engine.key_bytes(store, "s:k", "K"))
    for at, value in edits:
        data[7 + at % (len(data) - 7)] = value
    state = _core.EngineState()
    calls = [
        lambda: (engine.core.import_blob(state, bytes(data)) if blob
                 else engine.core.load_key(state, "s:k", "K", bytes(data))),
        lambda: engine.core.key_bytes(state, "s:k", "K"),
        lambda: engine.core.ingest(state, [Event("s", 2, 2, {"k": "K", "v": 2, "ts": 2})], 1),
        lambda: engine.core.export_blobs(state, all=True),
        lambda: engine.core.ingest(state, [], 10, 10),
    ]
    for call in calls:
        try:
            call()
        except Exception:  # noqa: S112 (an error is an allowed outcome; a BaseException is not)
            break
