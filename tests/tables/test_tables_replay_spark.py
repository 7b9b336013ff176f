"""`cep replay` on Spark with tables (docs/tables.md): a history in which a customer's home
country changes mid-stream gives the same alerts whether the table input is read before,
after or interleaved with the events, equal to the embedded engine's and to hand-written
expectations. Covers both routings: a co-partitioned table (looked up by the rule's
PARTITION BY field) and a broadcast one (looked up by another field)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from cep.compile import compile_rules
from cep.runtime.bind import build_engine
from cep.runtime.embedded import alerts_for
from jobs.replay import InputSpec, run_replay

pytestmark = pytest.mark.spark
T = 1767225600000  # 2026-01-01T00:00:00Z
MIN = 60_000
ROOT = Path(__file__).resolve().parents[2]
EXTRA = """
TABLE merchants (name STRING, risk INT, since INT) KEY name TIME BY since
  FROM KAFKA 'merchants';

-- broadcast: looked up by merchant in a rule partitioned by card
RULE risky_merchant FROM transactions PARTITION BY card
  PATTERN (x) DEFINE x AS merchants[merchant].risk >= 8
  MEASURES merchants[merchant].risk AS risk
  EMIT 'risky-merchant';

-- a window rule reading both (docs/windows.md, "Tables in window rules"): WHERE the broadcast
-- one per event, HAVING and MEASURES the card's row as of the window's last event
RULE heavy_risky_spend FROM transactions PARTITION BY card
  WINDOW TUMBLING (SIZE 10m)
  WHERE merchants[merchant].risk >= 3
  HAVING SUM(amount) > 10 * customers[card].avg_amount
  MEASURES SUM(amount) AS spent, customers[card].avg_amount AS usual
  EMIT 'heavy-risky-spend';
"""


def history(seed: int = 5) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                     list[dict[str, Any]]]:
    rng = random.Random(seed)
    customers = [{"card": f"c{i}", "updated": T - 86_400_000, "home_country": "NL",
                  "avg_amount": 40.0} for i in range(12)]
    # c1 moves to France at +30m; c2's usual spend rises at +20m; c3's profile is deleted
    customers += [{"card": "c1", "updated": T + 30 * MIN, "home_country": "FR",
                   "avg_amount": 40.0},
                  {"card": "c2", "updated": T + 20 * MIN, "home_country": "NL",
                   "avg_amount": 1000.0},
                  {"card": "c3", "updated": T + 40 * MIN, "_deleted": True}]
    merchants = [{"name": "shop", "risk": 1, "since": T - 86_400_000},
                 {"name": "casino", "risk": 3, "since": T - 86_400_000},
                 {"name": "casino", "risk": 9, "since": T + 25 * MIN}]
    tx = []
    for i in range(600):
        tx.append({"ts": T + i * 6_000, "card": f"c{rng.randrange(12)}",
                   "amount": rng.choice([5.0, 50.0, 300.0]), "merchant": rng.choice(
                       ["shop", "shop", "casino"]), "country": rng.choice(["NL", "FR"])})
    # the story, by hand: c1 charges 300 in FR at +10m (abroad) and at +50m (home by then)
    tx += [{"ts": T + 10 * MIN + 1, "card": "c1", "amount": 300.0, "merchant": "shop",
            "country": "FR"},
           {"ts": T + 50 * MIN + 1, "card": "c1", "amount": 300.0, "merchant": "shop",
            "country": "FR"}]
    return tx, customers, merchants


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _alerts(path: Path) -> list[tuple[str, str, tuple[int, ...], str]]:
    out = []
    for line in path.read_text().splitlines():
        a = json.loads(line)
        out.append((a["rule_id"], a["key"], tuple(e["ts"] for e in a["events"]),
                    json.dumps(a["measures"], sort_keys=True)))
    return sorted(out)


@pytest.fixture(scope="module")
def rules_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rules") / "customers.cep"
    path.write_text((ROOT / "rules" / "customers.cep").read_text() + EXTRA)
    return path


def test_replay_equals_embedded_whatever_the_read_order(spark, settings, tmp_path,
                                                        rules_file) -> None:
    del spark  # the session the job reuses
    tx, customers, merchants = history()
    rng = random.Random(1)
    rng.shuffle(customers)  # a changelog's order of reading does not matter either
    want_records = alerts_for(build_engine(compile_rules(rules_file.read_text(),
                                                         str(rules_file))),
                              {"transactions": tx, "customers": customers,
                               "merchants": merchants},
                              time_fields={"transactions": "ts", "customers": "updated",
                                           "merchants": "since"})
    want = sorted((a["rule_id"], a["key"], tuple(e["ts"] for e in a["events"]),
                   json.dumps(a["measures"], sort_keys=True)) for a in want_records)
    # hand-written: c1 abroad before its move, not after; casino risky only from +25m
    c1 = [w for w in want if w[0] == "far_above_usual_abroad" and w[1] == "c1"]
    assert (T + 10 * MIN + 1,) in [w[2] for w in c1]
    assert (T + 50 * MIN + 1,) not in [w[2] for w in c1]
    assert not [w for w in want if w[0] == "far_above_usual_abroad" and w[1] == "c3"
                and w[2][0] >= T + 40 * MIN]
    risky = [w for w in want if w[0] == "risky_merchant"]
    assert risky and all(w[2][0] >= T + 25 * MIN for w in risky)
    assert [w for w in want if w[0] == "risky_merchant" and json.loads(w[3])["risk"] == 9]
    # windows over the risky merchants' charges: c2's usual spend rises to 1000 at +20m, so
    # none of its windows from then on reaches 10x it
    heavy = [json.loads(w[3]) | {"key": w[1]} for w in want if w[0] == "heavy_risky_spend"]
    assert heavy and all(h["spent"] > 10 * h["usual"] for h in heavy)
    assert not [h for h in heavy if h["key"] == "c2" and h["window_start"] >= T + 20 * MIN]

    d = tmp_path
    _write(d / "tx" / "all.jsonl", tx)
    _write(d / "customers" / "all.jsonl", customers)
    _write(d / "merchants" / "all.jsonl", merchants)
    thirds = [tx[i::3] for i in range(3)]
    for i, part in enumerate(thirds):
        _write(d / f"tx{i}" / "p.jsonl", part)
        _write(d / f"customers{i}" / "p.jsonl", customers[i::3])
    orders = {
        "tables before": [InputSpec("customers", str(d / "customers")),
                          InputSpec("merchants", str(d / "merchants")),
                          InputSpec("transactions", str(d / "tx"))],
        "tables after": [InputSpec("transactions", str(d / "tx")),
                         InputSpec("merchants", str(d / "merchants")),
                         InputSpec("customers", str(d / "customers"))],
        "interleaved": [InputSpec("transactions", str(d / "tx0")),
                        InputSpec("customers", str(d / "customers0")),
                        InputSpec("transactions", str(d / "tx1")),
                        InputSpec("merchants", str(d / "merchants")),
                        InputSpec("customers", str(d / "customers1")),
                        InputSpec("transactions", str(d / "tx2")),
                        InputSpec("customers", str(d / "customers2"))],
    }
    for name, inputs in orders.items():
        out = d / name.replace(" ", "_") / "alerts.jsonl"
        summary = run_replay(settings, str(rules_file), inputs, str(out), show_progress=False)
        assert _alerts(out) == want, name
        assert summary.events_read == len(tx) and summary.balanced, name
        assert summary.dead_letters == 0 and summary.late == 0, name


def test_a_malformed_table_record_is_a_dead_letter(spark, settings, tmp_path,
                                                   rules_file) -> None:
    del spark
    tx, customers, merchants = history()
    _write(tmp_path / "tx" / "a.jsonl", tx[:50])
    (tmp_path / "customers").mkdir()
    (tmp_path / "customers" / "a.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in customers)
        + '{"card": "c9", "updated": "yesterday"}\n{not json\n'
        + json.dumps({"home_country": "NL", "updated": T}) + "\n")
    out = tmp_path / "out" / "alerts.jsonl"
    summary = run_replay(settings, str(rules_file),
                         [InputSpec("transactions", str(tmp_path / "tx")),
                          InputSpec("customers", str(tmp_path / "customers"))], str(out),
                         show_progress=False)
    dead = [json.loads(x) for x in (out.parent / "alerts.dead-letters.jsonl").read_text()
            .splitlines()]
    assert sorted(d["line"] for d in dead) == [len(customers) + 1, len(customers) + 2,
                                               len(customers) + 3]
    assert any("updated" in d["reason"] for d in dead)
    assert any("card" in d["reason"] for d in dead)
    assert summary.events_read == 50 + 3 and summary.balanced


@pytest.mark.services
def test_replay_from_kafka_topics_in_either_order(spark, settings, tmp_path, rules_file,
                                                  kafka_bootstrap, topic) -> None:
    """The same history in Kafka: the table's topic named before or after the events' topic
    gives the embedded engine's alerts; a tombstone (null value) deletes c3's profile from its
    record's timestamp."""
    from dataclasses import replace

    from confluent_kafka import Producer

    from cep.delivery.kafka_sink import ensure_topics

    del spark
    tx, customers, merchants = history()
    customers = [c for c in customers if not c.get("_deleted")]
    ensure_topics(kafka_bootstrap, [f"{topic}-tx", f"{topic}-customers", f"{topic}-merchants"],
                  partitions=2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for name, rows, key in ((f"{topic}-tx", tx, "card"), (f"{topic}-customers", customers,
                                                          "card"),
                            (f"{topic}-merchants", merchants, "name")):
        for r in rows:
            producer.produce(name, key=str(r[key]).encode(), value=json.dumps(r).encode())
    producer.produce(f"{topic}-customers", key=b"c3", value=None, timestamp=T + 40 * MIN)
    assert producer.flush(30) == 0
    deleted = customers + [{"card": "c3", "updated": T + 40 * MIN, "_deleted": True}]
    want_records = alerts_for(build_engine(compile_rules(rules_file.read_text(),
                                                         str(rules_file))),
                              {"transactions": tx, "customers": deleted,
                               "merchants": merchants},
                              time_fields={"transactions": "ts", "customers": "updated",
                                           "merchants": "since"})
    want = sorted((a["rule_id"], a["key"], tuple(e["ts"] for e in a["events"]),
                   json.dumps(a["measures"], sort_keys=True)) for a in want_records)
    assert not [w for w in want if w[0] == "far_above_usual_abroad" and w[1] == "c3"
                and w[2][0] >= T + 40 * MIN]
    kafka_settings = replace(settings, kafka_bootstrap=kafka_bootstrap)
    tables = [InputSpec("customers", f"kafka:{topic}-customers"),
              InputSpec("merchants", f"kafka:{topic}-merchants")]
    events = [InputSpec("transactions", f"kafka:{topic}-tx")]
    for name, inputs in (("before", tables + events), ("after", events + tables)):
        out = tmp_path / name / "alerts.jsonl"
        summary = run_replay(kafka_settings, str(rules_file), inputs, str(out),
                             show_progress=False)
        assert _alerts(out) == want, name
        assert summary.events_read == len(tx) and summary.dead_letters == 0, name
