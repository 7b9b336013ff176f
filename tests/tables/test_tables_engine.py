"""Reference tables (docs/tables.md) through the engine, against a brute-force temporal lookup
written separately here: for each event, scan every table record of its key and take the one
with the greatest (time, seq) at or before the event's time.

Covers event time (lateness, batching), the order in which table records and events arrive
(before, after, interleaved), deletes, and the end of input.
"""

from __future__ import annotations

import pickle
import random
from typing import Any

import pytest

from cep.compile import compile_rules
from cep.expr import EventWithRows
from cep.runtime.alerts import alert_record
from cep.runtime.bind import build_embedded_engine, build_engine, matcher_report
from cep.runtime.engine import (
    TABLE_PREFIX,
    Event,
    MemoryKeyStore,
    as_of,
    insert_version,
    run_embedded,
)
from cep.runtime.matcher import Match

LATENESS_MS = 3000
RULES = """
STREAM tx (ts INT, card STRING, amount FLOAT, country STRING) TIME BY ts LATENESS 3s;
TABLE customers (card STRING, home STRING, lim FLOAT, t INT) KEY card TIME BY t
  FROM KAFKA 'customers';

-- one event: three-valued (a missing row or column is NULL: no match)
RULE single FROM tx PARTITION BY card
  PATTERN (x)
  DEFINE x AS country <> customers[card].home AND amount > customers[card].lim
  MEASURES customers[card].home AS home, customers[card].lim AS lim
  EMIT 'single';

-- two events: b reads a's row as of a's time, and its own as of its own time
RULE pair FROM tx PARTITION BY card
  PATTERN (a b)
  DEFINE a AS amount > customers[card].lim,
         b AS country <> customers[a.card].home
  MEASURES customers[a.card].home AS a_home, customers[card].home AS b_home
  EMIT 'pair';
"""
assert LATENESS_MS == 3000


def ruleset() -> Any:
    return compile_rules(RULES, "tables.cep")


# ------------------------------------------------------------------------ the reference


def ref_row(records: list[dict[str, Any]], key: str, ts: int, key_field: str = "card",
            ) -> dict[str, Any] | None:
    """The record of `key` with the greatest (time, seq) at or before `ts`; None if none or
    deleted."""
    best = None
    for r in records:
        if r[key_field] == key and r["t"] <= ts and (best is None or
                                                    (r["t"], r["seq"]) > (best["t"], best["seq"])):
            best = r
    if best is None or best.get("_deleted"):
        return None
    return best


def _gt(a: Any, b: Any) -> bool | None:
    return None if a is None or b is None else a > b


def _ne(a: Any, b: Any) -> bool | None:
    return None if a is None or b is None else a != b


def _and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def reference(events: list[dict[str, Any]], records: list[dict[str, Any]]) -> list[tuple]:
    """Every alert as (rule, key, event seqs, measures), by brute force."""
    out: list[tuple] = []
    for card in sorted({e["card"] for e in events}):
        evs = sorted((e for e in events if e["card"] == card), key=lambda e: (e["ts"], e["seq"]))
        rows = [ref_row(records, card, e["ts"]) or {} for e in evs]
        for e, row in zip(evs, rows, strict=True):
            if _and(_ne(e["country"], row.get("home")), _gt(e["amount"], row.get("lim"))):
                out.append(("single", card, (e["seq"],),
                            (("home", row.get("home")), ("lim", row.get("lim")))))
        i = 0
        while i + 1 < len(evs):
            a, b = evs[i], evs[i + 1]
            if (_gt(a["amount"], rows[i].get("lim")) is True
                    and _ne(b["country"], rows[i].get("home")) is True):
                out.append(("pair", card, (a["seq"], b["seq"]),
                            (("a_home", rows[i].get("home")), ("b_home", rows[i + 1].get("home")))))
                i += 2
            else:
                i += 1
    return sorted(out, key=repr)


# ------------------------------------------------------------------------ the engine


def engine_alerts(engine: Any, items: list[Event], batch: int) -> list[tuple]:
    out = []
    for r in run_embedded(engine, items, batch_size=batch):
        if isinstance(r, Match):
            rec = alert_record(engine, r)
            out.append((rec["rule_id"], rec["key"], tuple(e["seq"] for e in rec["events"]),
                        tuple(sorted(rec["measures"].items()))))
    return sorted(out, key=repr)


def history(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    cards = [f"c{i}" for i in range(rng.randint(1, 3))]
    countries = ["NL", "FR", "DE"]
    events = []
    for i in range(rng.randint(1, 40)):
        events.append({"ts": rng.randrange(0, 30_000, 500), "card": rng.choice(cards),
                       "amount": float(rng.choice([5, 50, 500])),
                       "country": rng.choice(countries), "seq": i})
    records = []
    for i in range(rng.randint(0, 12)):
        rec: dict[str, Any] = {"card": rng.choice(cards), "t": rng.randrange(-2000, 30_000, 500),
                               "seq": 1000 + i}
        if rng.random() < 0.15:
            rec["_deleted"] = True
        else:
            rec["home"] = rng.choice(countries)
            rec["lim"] = None if rng.random() < 0.1 else float(rng.choice([10, 100]))
        records.append(rec)
    return events, records


def as_events(events: list[dict[str, Any]]) -> list[Event]:
    return [Event("tx", e["ts"], e["seq"],
                  {k: v for k, v in e.items() if k != "seq"}) for e in events]


def as_records(records: list[dict[str, Any]]) -> list[Event]:
    return [Event("customers", r["t"], r["seq"],
                  {k: v for k, v in r.items() if k != "seq"}) for r in records]


def streamed(rng: random.Random, events: list[dict[str, Any]],
             records: list[dict[str, Any]]) -> list[Event]:
    """Events in time order, each table record at a random place before the first event that
    could release an event at its time (ts >= its time + LATENESS + 1): the live order in which
    no update reaches the job later than LATENESS."""
    evs = sorted(events, key=lambda e: (e["ts"], e["seq"]))
    slots: list[list[Event]] = [[] for _ in range(len(evs) + 1)]
    for rec, ev in zip(records, as_records(records), strict=True):
        limit = next((i for i, e in enumerate(evs) if e["ts"] >= rec["t"] + LATENESS_MS + 1),
                     len(evs))
        slots[rng.randint(0, limit)].append(ev)
    out: list[Event] = []
    for i, ev in enumerate(as_events(evs)):
        out.extend(slots[i])
        out.append(ev)
    out.extend(slots[-1])
    return out


@pytest.mark.parametrize("seed", range(150))
def test_engine_equals_brute_force_temporal_lookup(seed: int) -> None:
    rng = random.Random(seed)
    events, records = history(rng)
    want = reference(events, records)
    rs = ruleset()
    items = streamed(rng, events, records)
    got = engine_alerts(build_engine(rs), items, rng.choice([1, 2, 5, 1000]))
    assert got == want


def test_the_random_histories_raise_alerts_of_both_rules() -> None:
    """The property above is not vacuous: its histories raise alerts of both rules."""
    rules = [a[0] for seed in range(150) for a in reference(*history(random.Random(seed)))]
    assert rules.count("single") >= 100 and rules.count("pair") >= 100


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("order", ["tables first", "tables last", "interleaved"])
def test_bounded_input_any_read_order(seed: int, order: str) -> None:
    """A replay has all its input: in one call, the order of the two inputs does not matter."""
    rng = random.Random(seed)
    events, records = history(rng)
    evs, recs = as_events(events), as_records(records)
    rng.shuffle(evs)
    if order == "tables first":
        items = recs + evs
    elif order == "tables last":
        items = evs + recs
    else:
        items = evs + recs
        rng.shuffle(items)
    got = engine_alerts(build_engine(ruleset()), items, len(items) or 1)
    assert got == reference(events, records)


def test_the_reference_and_engine_agree_on_a_known_story() -> None:
    """Hand-written: the holder moves from NL to FR at t=10s; a limit of 100."""
    records = [{"card": "c1", "t": 0, "home": "NL", "lim": 100.0, "seq": 100},
               {"card": "c1", "t": 10_000, "home": "FR", "lim": 100.0, "seq": 101}]
    events = [{"ts": 5_000, "card": "c1", "amount": 500.0, "country": "FR", "seq": 0},
              {"ts": 15_000, "card": "c1", "amount": 500.0, "country": "FR", "seq": 1},
              {"ts": 20_000, "card": "c1", "amount": 500.0, "country": "NL", "seq": 2}]
    want = [("pair", "c1", (0, 1), (("a_home", "NL"), ("b_home", "FR"))),
             ("single", "c1", (0,), (("home", "NL"), ("lim", 100.0))),
             ("single", "c1", (2,), (("home", "FR"), ("lim", 100.0)))]
    assert reference(events, records) == sorted(want, key=repr)
    items = streamed(random.Random(1), events, records)
    assert engine_alerts(build_engine(ruleset()), items, 1) == sorted(want, key=repr)


def test_table_records_do_not_move_event_time() -> None:
    """A table snapshot read ahead of the events (times far in the future) makes no event
    late."""
    records = [{"card": "c1", "t": 10**9, "home": "DE", "lim": 1.0, "seq": 100},
               {"card": "c1", "t": 0, "home": "NL", "lim": 1.0, "seq": 101}]
    events = [{"ts": 1000, "card": "c1", "amount": 5.0, "country": "FR", "seq": 0}]
    late: list[Any] = []
    engine = build_engine(ruleset())
    got = list(run_embedded(engine, as_records(records) + as_events(events), late=late))
    assert late == []
    assert [m.rule_id for m in got if isinstance(m, Match)] == ["single"]


def test_versions_are_pruned_behind_the_watermark() -> None:
    """Retention: a key keeps the version in force at the safe time and the newer ones."""
    engine = build_engine(ruleset())
    store = MemoryKeyStore()
    items = []
    for i in range(100):  # an update every second, and an event every second
        items.append(Event("customers", i * 1000, 1000 + i,
                           {"card": "c1", "t": i * 1000, "home": "NL", "lim": float(i)}))
        items.append(Event("tx", i * 1000, i, {"ts": i * 1000, "card": "c1", "amount": 1.0,
                                                "country": "NL"}))
    list(run_embedded(engine, items, batch_size=1, store=store))
    versions = store.get((TABLE_PREFIX + "customers", "c1"))
    # the one in force at the watermark from before the last call (one event time per call
    # here), plus the versions after it: LATENESS (3 s of one-a-second updates) and the call's
    assert versions is not None and len(versions) == 1 + LATENESS_MS // 1000 + 2
    assert versions[-1][2]["lim"] == 99.0


def test_a_deleted_key_leaves_the_store() -> None:
    engine = build_engine(ruleset())
    store = MemoryKeyStore()
    items = [Event("customers", 0, 1, {"card": "c1", "t": 0, "home": "NL", "lim": 1.0}),
             Event("customers", 1000, 2, {"card": "c1", "t": 1000, "_deleted": True}),
             Event("tx", 60_000, 0, {"ts": 60_000, "card": "c2", "amount": 1.0,
                                     "country": "NL"}),
             Event("customers", 61_000, 3, {"card": "c3", "t": 61_000, "home": "NL",
                                            "lim": 1.0})]
    list(run_embedded(engine, items, batch_size=1, store=store))
    assert store.get((TABLE_PREFIX + "customers", "c1")) is None
    assert store.get((TABLE_PREFIX + "customers", "c3")) is not None


def test_as_of_and_insert_version() -> None:
    vs: list[Any] = []
    for t, seq, row in [(10, 2, {"v": 2}), (0, 1, {"v": 1}), (10, 3, None), (10, 2, {"v": 9})]:
        vs = insert_version(vs, (t, seq, row), keep_from=-1)
    assert [v[:2] for v in vs] == [(0, 1), (10, 2), (10, 3)]
    assert vs[1][2] == {"v": 9}  # the same (time, seq) delivered again replaces
    assert as_of(vs, -1) is None and as_of(vs, 9) == {"v": 1} and as_of(vs, 10) is None
    assert len(insert_version(vs, (20, 4, {"v": 4}), keep_from=15)) == 2


def test_rows_travel_with_the_event_through_pickling() -> None:
    e = EventWithRows({"card": "c1"}, {("customers", "card"): {"home": "NL"}})
    back = pickle.loads(pickle.dumps(e))
    assert back == {"card": "c1"} and back.rows == e.rows and isinstance(back, EventWithRows)


def test_table_rules_run_on_the_python_engine_with_a_reason() -> None:
    rs = ruleset()
    report = dict((r, why) for r, _, why in matcher_report(rs))
    assert report["single"] is not None and "table" in report["single"]
    assert type(build_embedded_engine(rs)).__name__ == "Engine"
