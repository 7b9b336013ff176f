"""A key's results when its group holds rule families (docs/rule-families.md, "Alerts in the
per-rule order"): the families run once per key and keep their results in one list tagged with
each result's rule; the engine then asks for every rule's results at that rule's turn
(`FOut::append_rule`, which since session 20 scans the tags instead of the list). The output
must be the per-rule loop's: rule by rule in the group's order, each rule's results in the
order it emitted them.

Here one call holds every event, so each member of a family has several results for one key in
that call, members of two families and a rule in no family alternate in the group's order, and
two keys have results; native (families on, from Event lists and from one Arrow batch) against
the Python engine and against families off, result by result.
"""

from __future__ import annotations

from cep.compile import compile_rules
from cep.runtime.bind import build_embedded_engine, build_engine, engine_kind
from cep.runtime.engine import NEG_INF, Event, MemoryKeyStore
from tests.core.test_native_engine_differential import _result, arrow_table, drive

STREAM = """STREAM tx (ts INT, card STRING, amount FLOAT, country STRING) TIME BY ts LATENESS 0s;
"""

# The group's order: big_0, pair_0, lone, big_1, pair_1, big_2. `big_i` and `pair_i` are two
# families (copies differing in a threshold and a window); `lone` has a shape of its own.
RULES = {
    "big": "RULE big_{i} FROM tx PARTITION BY card PATTERN (A) DEFINE A AS A.amount > {t} "
           "WITHIN {w}s EMIT 'big';\n",
    "pair": "RULE pair_{i} FROM tx PARTITION BY card PATTERN (A B) "
            "DEFINE B AS B.amount > {t} WITHIN {w}s EMIT 'pair';\n",
    "lone": "RULE lone FROM tx PARTITION BY card PATTERN (A B C) WITHIN 60s EMIT 'lone';\n",
}
ORDER = [("big", 0), ("pair", 0), ("lone", 0), ("big", 1), ("pair", 1), ("big", 2)]


def ruleset_text() -> str:
    out = [STREAM]
    for name, i in ORDER:
        out.append(RULES[name].format(i=i, t=10 * (i + 1), w=30 + 10 * i))
    return "".join(out)


def events() -> list[Event]:
    """Two cards, interleaved; amounts so that every member matches several times and the
    members with lower thresholds match more often."""
    amounts = [5, 15, 25, 35, 12, 40, 8, 33, 22, 50]
    out = []
    for k, amount in enumerate(amounts * 2):
        card = "c1" if k % 3 else "c2"
        out.append(Event("tx", 1_000 * (k + 1), k,
                         {"ts": 1_000 * (k + 1), "card": card, "amount": float(amount),
                          "country": "FR"}))
    return out


def test_family_results_come_rule_by_rule_in_group_order() -> None:
    ruleset = compile_rules(ruleset_text(), "order")
    native = build_embedded_engine(ruleset, use_native=True, families=True)
    assert engine_kind(native) == "native"
    assert sorted(sorted(f) for f in native.families) == [
        ["big_0", "big_1", "big_2"], ["pair_0", "pair_1"]]
    off = build_embedded_engine(ruleset, use_native=True, families=False)
    python = build_engine(ruleset, use_native=False)
    evs = events()
    want = drive(python, evs, len(evs), False)
    results = want[0][0]
    # What makes the order observable: in the one call, several results per member and key,
    # results on both keys, from every rule.
    per = {}
    for r in results:
        per[(r[1], r[4])] = per.get((r[1], r[4]), 0) + 1
    assert {rid for rid, _ in per} == {f"{n}_{i}" if n != "lone" else "lone" for n, i in ORDER}
    assert {key for _, key in per} == {("str", "'c1'"), ("str", "'c2'")}
    assert max(per.values()) >= 3
    # Results within one rule and key are not all at one time (a reversal would show).
    assert len({r[6] for r in results if r[1] == "big_0" and r[4] == ("str", "'c1'")}) >= 3
    assert drive(native, evs, len(evs), False) == want
    assert drive(off, evs, len(evs), False) == want


def test_family_results_order_from_arrow() -> None:
    """The same through `ingest_batch` (the core reads one Arrow batch): the results, in
    order, are the Python engine's."""
    ruleset = compile_rules(ruleset_text(), "order")
    native = build_embedded_engine(ruleset, use_native=True, families=True)
    python = build_engine(ruleset, use_native=False)
    evs = events()
    table = arrow_table(evs)
    assert table is not None
    store = MemoryKeyStore()
    got = []
    for rb in table.to_batches():
        got += [_result(r) for r in native.ingest_batch(store, rb, NEG_INF).matches]
    top = max(e.ts for e in evs)
    got += [_result(r) for r in native.advance(store, top, end_of_input=top).matches]
    want = [r for t in drive(python, evs, len(evs), False) for r in t[0]]
    assert len(got) > 20
    assert got == want
