"""Rules sharing a stream and key field share one state per key; an event routed by one key
field reaches only that field's rules; rule changes reset only the changed rule's part."""

from __future__ import annotations

from cep.compile import compile_rules
from cep.runtime.bind import build_engine
from cep.runtime.engine import Event, MemoryKeyStore, events_from_dicts, run_embedded

STREAM = """STREAM tx (ts INT, card STRING, merchant STRING, amount FLOAT) TIME BY ts LATENESS 0s;
"""
BY_CARD = """
RULE pair FROM tx PARTITION BY card PATTERN (A B) WITHIN 1m EMIT 'pair';
RULE big FROM tx PARTITION BY card PATTERN (A B) DEFINE B AS B.amount > A.amount * 10
  WITHIN 1m EMIT 'big';
"""
BY_MERCHANT = """
RULE burst FROM tx PARTITION BY merchant PATTERN (A{3}) WITHIN 1m EMIT 'burst';
"""


def engine(text: str):
    return build_engine(compile_rules(STREAM + text, "t.cep"))


def tx(ts: int, card: str, merchant: str, amount: float) -> dict:
    return {"ts": ts, "card": card, "merchant": merchant, "amount": amount}


def test_rules_on_one_key_field_share_one_state_per_key():
    eng = engine(BY_CARD + BY_MERCHANT)
    assert sorted(eng.groups) == ["tx:card", "tx:merchant"]
    store = MemoryKeyStore()
    events = events_from_dicts("tx", [tx(1_000, "c1", "m1", 1.0), tx(2_000, "c2", "m1", 5.0)])
    eng.ingest(store, events, 0)
    # Two rules on card, one on merchant: one entry per card and one per merchant.
    assert sorted(store.states) == [("tx:card", "c1"), ("tx:card", "c2"), ("tx:merchant", "m1")]
    assert set(store.states[("tx:card", "c1")][1]) == {"pair", "big"}


def test_grouped_engine_finds_what_each_rule_finds_alone():
    dicts = [tx(1_000 * i, f"c{i % 3}", f"m{i % 2}", 1.0 + (i % 7) * 5) for i in range(1, 200)]
    events = events_from_dicts("tx", dicts)

    def found(text: str) -> list[tuple[str, str, int, int]]:
        return sorted((m.rule_id, m.key, m.first_ts, m.last_ts)
                      for m in run_embedded(engine(text), events, batch_size=17))

    together = found(BY_CARD + BY_MERCHANT)
    alone = sorted(found(BY_CARD.split("RULE big")[0]) + found("RULE big" + BY_CARD.split(
        "RULE big")[1]) + found(BY_MERCHANT))
    assert together == alone and {r for r, *_ in together} == {"pair", "big", "burst"}


def test_a_routed_event_reaches_only_its_key_fields_rules():
    eng = engine(BY_CARD + BY_MERCHANT)
    store = MemoryKeyStore()
    data = [tx(1_000 + i, "c1", "m1", 1.0) for i in range(3)]
    # The copies Spark sends to the card shard: only the card rules may see them.
    out = eng.ingest(store, [Event("tx", d["ts"], i, d, "card") for i, d in enumerate(data)], 0)
    assert {g for g, _ in store.states} == {"tx:card"}
    matches = out.matches + eng.advance(store, 10_000, end_of_input=10_000).matches
    assert {m.rule_id for m in matches} == {"pair"}  # not `burst`, though m1 has 3 events


def test_a_changed_rule_restarts_only_its_own_partial_matches():
    store = MemoryKeyStore()
    first = events_from_dicts("tx", [tx(1_000, "c1", "m1", 1.0)])
    old = engine(BY_CARD)
    old.ingest(store, first, 0)
    old.advance(store, 1_001)  # time passes 1 s: the event at 1 s is matched by the old rules
    changed = BY_CARD.replace("amount * 10", "amount * 20")
    eng = engine(changed)
    out = eng.ingest(store, events_from_dicts("tx", [tx(2_000, "c1", "m1", 30.0)]), 1_000)
    # The event at 2 s is released once time passes it (an event at exactly the watermark is
    # still on time, so it may yet be preceded by another at 2 s).
    later = eng.advance(store, 2_001)
    # `pair` kept its partial match (A at 1 s) and completes; `big` was reset by its new
    # version, so 30 > 1 * 20 is not matched against the old A.
    assert [(m.rule_id, m.first_ts) for m in out.matches + later.matches] == [("pair", 1_000)]
    assert out.keys_reset + later.keys_reset == 1


def test_a_removed_rule_leaves_no_state_behind():
    store = MemoryKeyStore()
    engine(BY_CARD).ingest(store, events_from_dicts("tx", [tx(1_000, "c1", "m1", 1.0)]), 0)
    only_pair = BY_CARD.split("RULE big")[0]
    eng = engine(only_pair)
    eng.ingest(store, events_from_dicts("tx", [tx(1_500, "c1", "m1", 1.0)]), 1_000)
    assert all(set(parts) <= {"pair"} for _, parts in store.states.values())
