"""The engine on the native matcher against the engine on the Python matcher: the bundled rules
over generated streams (with injected alerts), at several batch sizes, give identical results;
and the native boundary turns a panic into an exception naming the rule."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from cep import _core
from cep.compile import compile_rules, load_rules_dir
from cep.datagen import GENERATORS
from cep.runtime.bind import build_engine, matcher_kind, matcher_report
from cep.runtime.engine import MemoryKeyStore, events_from_dicts, run_embedded
from cep.runtime.native import native_matcher

RULES = Path(__file__).resolve().parents[2] / "rules"


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
    ruleset = load_rules_dir(RULES)
    assert all(kind == "native" for _, kind, _ in matcher_report(ruleset))
    ds = GENERATORS[domain](n_events=3_000, n_keys=40, seed=3, inject=4)
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
    ruleset = load_rules_dir(RULES)
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


def test_a_panic_in_the_core_is_an_exception_naming_the_rule() -> None:
    rule = compile_rules("STREAM s TIME BY ts;\nRULE probe FROM s PATTERN (a b) "
                         "DEFINE a AS v = 1 WITHIN 5ms EMIT 'm';", "p.cep").get("probe")
    m = native_matcher(rule)
    state, _ = m.on_event(None, {"v": 1, "ts": 0}, 0, 0)
    data = bytearray(state.to_bytes())
    # magic 5 + version 2 + row 8 + deadline 9 + runs 4 + start 8 + matched 1 + tpart 1 +
    # entries 4: the first entry's state position, pointed at a state that does not exist.
    data[42:46] = (999).to_bytes(4, "little", signed=True)
    broken = _core.state_from_bytes(bytes(data))
    with pytest.raises(_core.CoreError, match="rule probe"):
        m.on_event(broken, {"v": 2, "ts": 1}, 1, 1)
