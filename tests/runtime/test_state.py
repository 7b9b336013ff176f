"""State is released as soon as no partial match can complete (Flink CEP's most-reported bugs are
state that never shrinks), mid-stream — not only at the end of input — and stays small."""

from __future__ import annotations

import pickle
from pathlib import Path

from cep.compile import load_rules_dir
from cep.datagen import GENERATORS
from cep.runtime.bind import build_engine
from cep.runtime.engine import MemoryKeyStore, events_from_dicts

RULES = Path(__file__).resolve().parents[2] / "rules"


def _run_without_end(domain: str, n_events: int, n_keys: int):
    ds = GENERATORS[domain](n_events=n_events, n_keys=n_keys, inject=2)
    engine = build_engine(load_rules_dir(RULES))
    store = MemoryKeyStore()
    events = sorted(events_from_dicts(ds.stream, ds.events), key=lambda e: (e.ts, e.seq))
    peak_keys = peak_bytes = 0
    for i in range(0, len(events), 200):
        chunk = events[i:i + 200]
        engine.ingest(store, chunk, chunk[0].ts)
        peak_keys = max(peak_keys, len(store.states))
        peak_bytes = max(peak_bytes, len(pickle.dumps(store.states)))
    return ds, engine, store, events[-1].ts, peak_keys, peak_bytes


def test_fraud_state_returns_to_empty_once_time_passes_every_deadline():
    ds, engine, store, last, peak_keys, peak_bytes = _run_without_end("fraud", 20_000, 200)
    assert peak_keys > 0
    # Event time moves on (e.g. other keys' events arrive) past the longest WITHIN (1 h) plus
    # lateness: no partial match can complete any more, so no partial match may be left. What
    # is left is the cards' 30-day windows of rules/history.cep's spend_far_above_usual
    # (docs/windows.md: state bounded by the window), until the window has passed too.
    engine.advance(store, last + 2 * 3_600_000)
    assert store.states and all(set(parts) == {"spend_far_above_usual"} and state[0] is None
                                for buffer, parts in store.states.values()
                                for _, state in parts.values())
    engine.advance(store, last + 31 * 86_400_000)
    assert store.states == {} and len(store.wake) == 0


def test_machine_state_with_absence_rules_returns_to_empty():
    ds, engine, store, last, peak_keys, _ = _run_without_end("machines", 20_000, 100)
    # Every machine has a pending "missing heartbeat" check after its last heartbeat.
    assert peak_keys >= 100
    out = engine.advance(store, last + 3_600_000)
    # ...which all fire when time passes (the stream simply stopped), and then state is empty.
    assert {m.rule_id for m in out.matches} == {"missing_heartbeat"}
    assert store.states == {} and len(store.wake) == 0


def test_state_per_key_is_small_and_bounded_by_live_partial_matches():
    _, _, store, _, peak_keys, peak_bytes = _run_without_end("trading", 20_000, 50)
    # A key's state is its buffer (events within the lateness) plus live partial matches.
    assert peak_bytes / max(peak_keys, 1) < 64 * 1024
