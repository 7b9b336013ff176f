"""The engine's per-rule partial-match deltas (what the live job's metrics and the console show)
add up, after every call, to the partial matches actually held in the key store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cep.compile import load_rules_dir
from cep.runtime.bind import build_engine
from cep.runtime.engine import Event, MemoryKeyStore

ROOT = Path(__file__).resolve().parents[2]


def _held(engine, store: MemoryKeyStore) -> dict[str, int]:
    held: dict[str, int] = {}
    for _buffer, parts in store.states.values():
        for rule_id, (_version, state) in parts.items():
            n = engine.rules[rule_id].matcher.partial_count(state)
            if n:
                held[rule_id] = held.get(rule_id, 0) + n
    return held


@pytest.mark.parametrize("engine_kind", ["python", "native"])
@pytest.mark.parametrize("batch", [1, 37, 500])
def test_partial_match_deltas_sum_to_what_the_store_holds(monkeypatch, engine_kind, batch):
    monkeypatch.setenv("CEP_ENGINE", engine_kind)
    engine = build_engine(load_rules_dir(ROOT / "rules"))
    engine.track_partials = True
    store = MemoryKeyStore()
    lines = (ROOT / "examples" / "transactions.jsonl").read_text().splitlines()[:1500]
    events = [Event("transactions", int(d["ts"]), i, d, None)
              for i, d in enumerate(map(json.loads, lines))]
    total: dict[str, int] = {}
    seen_nonzero = False
    for i in range(0, len(events), batch):
        chunk = events[i:i + batch]
        out = engine.ingest(store, chunk, max(e.ts for e in chunk))
        for rule_id, delta in out.partial_matches.items():
            total[rule_id] = total.get(rule_id, 0) + delta
        assert {k: v for k, v in total.items() if v} == _held(engine, store)
        seen_nonzero = seen_nonzero or any(total.values())
    if batch < 100:  # the check above was not only 0 == 0 (with 500, no batch ends mid-match)
        assert seen_nonzero
    out = engine.ingest(store, [], 2**62, end_of_input=events[-1].ts)
    for rule_id, delta in out.partial_matches.items():
        total[rule_id] = total.get(rule_id, 0) + delta
    assert not any(total.values()) and _held(engine, store) == {}


def test_partials_are_not_counted_unless_asked():
    engine = build_engine(load_rules_dir(ROOT / "rules"))
    line = (ROOT / "examples" / "transactions.jsonl").read_text().splitlines()[0]
    d = json.loads(line)
    out = engine.ingest(MemoryKeyStore(), [Event("transactions", int(d["ts"]), 0, d, None)],
                        int(d["ts"]) + 60_000)
    assert out.partial_matches == {}
