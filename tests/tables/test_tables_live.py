"""`cep run` with a table (docs/tables.md), real Kafka (the test fixtures' broker): kcat
produces the table's changelog and the events; the table and the rule are updated while the
job runs; the alerts before and after the updates carry the row versions of their events'
times and the rule version in force; nothing is lost or duplicated; a Kafka tombstone deletes
a row from its record's timestamp."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest
from confluent_kafka import Producer

from cep.compile import compile_rules
from cep.delivery.kafka_sink import ensure_topics
from cep.runtime.bind import rule_hash
from tests.test_live import _wait_for, cep_run, kcat_produce, kcat_read

pytestmark = [pytest.mark.services, pytest.mark.spark]
ROOT = Path(__file__).resolve().parents[2]
T = 1767225600000  # 2026-01-01T00:00:00Z
MIN = 60_000


def _tx(ts: int, card: str, country: str, amount: float = 300.0) -> str:
    ev = {"ts": ts, "card": card, "amount": amount, "merchant": "shop", "country": country}
    return f"{card}\t{json.dumps(ev)}\n"


def _profile(card: str, at: int, home: str, usual: float = 40.0) -> str:
    row = {"card": card, "updated": at, "home_country": home, "avg_amount": usual}
    return f"{card}\t{json.dumps(row)}\n"


def _records_read(metrics: Path) -> int:
    """The records of both topics the running job has read (its metrics file's counter)."""
    try:
        return int(json.loads(metrics.read_text())["counters"].get("events_read", 0))
    except (OSError, ValueError, KeyError):
        return 0


def _job(kafka_bootstrap: str, redis_url: str, tmp_path: Path, topic: str):
    """rules/customers.cep reading this test's topics, `cep run`'s environment, its log."""
    rules = tmp_path / "rules"
    rules.mkdir()
    text = (ROOT / "rules" / "customers.cep").read_text()
    text = re.sub(r"TO KAFKA '[^']*'", f"TO KAFKA '{topic}.alerts'", text)
    text = text.replace("FROM KAFKA 'customers'", f"FROM KAFKA '{topic}-customers'")
    (rules / "customers.cep").write_text(text)
    env = {"CEP_KAFKA_BOOTSTRAP": kafka_bootstrap, "CEP_REDIS_URL": redis_url,
           "CEP_SHARDS": "8", "CEP_SHUFFLE_PARTITIONS": "2",
           "CEP_DEAD_LETTER_TOPIC": f"{topic}-dlq", "CEP_LATE_TOPIC": f"{topic}-late"}
    ensure_topics(kafka_bootstrap, [f"{topic}-in", f"{topic}-customers"], partitions=2)
    return rules, env, tmp_path / "run.log"


def test_table_updated_while_cep_run_runs(kafka_bootstrap, redis_url, tmp_path, topic):
    rules, env, log = _job(kafka_bootstrap, redis_url, tmp_path, topic)
    cards = [f"c{i}" for i in range(1, 6)]
    kcat_produce(kafka_bootstrap, f"{topic}-customers",
                 [_profile(c, T - 86_400_000, "NL") for c in cards])
    # Part 1: every card abroad (FR) far above its usual 40 -> an alert each; at home, none.
    part1 = [_tx(T + i * 1000, c, "FR") for i, c in enumerate(cards)]
    part1 += [_tx(T + 10_000 + i * 1000, c, "NL") for i, c in enumerate(cards)]
    part1 += [_tx(T + 30 * MIN, "nobody", "FR")]  # moves the watermark past part 1
    kcat_produce(kafka_bootstrap, f"{topic}-in", part1)
    proc = cep_run(env, ["--rules", str(rules), "--checkpoint", str(tmp_path / "ck"),
                         "--topic", f"transactions={topic}-in", "--trigger", "0.5"], log)
    try:
        _wait_for(lambda: len(kcat_read(kafka_bootstrap, f"{topic}.alerts")) >= len(cards),
                  "part 1's alerts", log)
        # While the job runs, the rule too: version 2 alerts from 4x the usual spend (was 5x).
        path = rules / "customers.cep"
        v2 = path.read_text().replace("VERSION 1", "VERSION 2").replace(
            "amount > 5 * customers", "amount > 4 * customers")
        assert v2.count("VERSION 2") == 1 and "4 * customers" in v2
        path.write_text(v2)
        (new_rule,) = compile_rules(v2, str(path)).rules
        metrics = tmp_path / "ck" / "metrics.json"
        _wait_for(lambda: metrics.exists() and json.loads(metrics.read_text()).get("rules", {})
                  .get(new_rule.id) == rule_hash(new_rule), "version 2 in force", log)
        # While the job runs: c1 moves to France, c2's usual spend becomes 1000 (both from
        # +1h), and a bad record (no key) goes to the dead letters.
        kcat_produce(kafka_bootstrap, f"{topic}-customers",
                     [_profile("c1", T + 60 * MIN, "FR"),
                      _profile("c2", T + 60 * MIN, "NL", 1000.0),
                      'c9\t{"updated": 1767225600000, "home_country": "NL"}\n'])
        part2 = [_tx(T + 120 * MIN, "c1", "FR"),             # home now: no alert
                 _tx(T + 120 * MIN + 1000, "c1", "NL"),      # abroad now: alert, home FR
                 _tx(T + 120 * MIN + 2000, "c2", "FR"),      # 300 < 5 x 1000: no alert
                 _tx(T + 120 * MIN + 3000, "c3", "FR"),      # unchanged: alert, home NL
                 _tx(T + 121 * MIN, "c3", "FR", 180.0)]      # 4.5x: an alert of version 2
        # The topic has two partitions and Spark's watermark is the query's highest event time
        # (docs/spark-runtime.md, "Event time and lateness"): had the events at +125m below
        # been read in a micro-batch before these (another partition, produced in the same
        # call), they would have made these late (CI, session 15). So these are read first.
        kcat_produce(kafka_bootstrap, f"{topic}-in", part2)
        read = 5 + 3 + len(part1) + len(part2)  # both topics' records so far
        _wait_for(lambda: _records_read(metrics) >= read, "part 2's first events read", log)
        part2 = [_tx(T + 125 * MIN, "c4", "FR")]             # see c4's update below
        # c5's profile is deleted by a Kafka tombstone (null value) with event time +100m.
        producer = Producer({"bootstrap.servers": kafka_bootstrap})
        producer.produce(f"{topic}-customers", key=b"c5", value=None, timestamp=T + 100 * MIN)
        assert producer.flush(30) == 0
        # No profile any more: NULL, no alert. At c4's time, not later: no event of part 2 is
        # after +125m, so none is released before the next event time passes it, whichever
        # micro-batch c4's update below falls in (a later time here let a split between
        # part 2 and that update release c4's event with its old profile).
        part2.append(_tx(T + 125 * MIN, "c5", "FR"))
        kcat_produce(kafka_bootstrap, f"{topic}-in", part2)
        # c4's move, read after its event (at +125m) but effective before it (+124m), and
        # within the watermark: the event is not matched until a later event time passes.
        kcat_produce(kafka_bootstrap, f"{topic}-customers", [_profile("c4", T + 124 * MIN,
                                                                      "FR")])
        kcat_produce(kafka_bootstrap, f"{topic}-in", [_tx(T + 180 * MIN, "nobody", "FR")])
        _wait_for(lambda: len(kcat_read(kafka_bootstrap, f"{topic}.alerts")) >= len(cards) + 3
                  and kcat_read(kafka_bootstrap, f"{topic}-dlq"), "part 2's alerts", log,
                  describe=lambda: {t: kcat_read(kafka_bootstrap, f"{topic}{t}")
                                    for t in (".alerts", "-dlq", "-late")})
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    alerts = kcat_read(kafka_bootstrap, f"{topic}.alerts")
    got = sorted((a["key"], a["first_ts"], a["measures"]["home"], a["rule_version"])
                 for a in alerts)
    want = sorted([(c, T + i * 1000, "NL", 1) for i, c in enumerate(cards)]
                  + [("c1", T + 120 * MIN + 1000, "FR", 2), ("c3", T + 120 * MIN + 3000, "NL", 2),
                     ("c3", T + 121 * MIN, "NL", 2)])
    assert got == want
    assert {a["rule_hash"] for a in alerts if a["rule_version"] == 2} == {rule_hash(new_rule)}
    ids = [a["alert_id"] for a in alerts]
    assert len(ids) == len(set(ids))
    dead = kcat_read(kafka_bootstrap, f"{topic}-dlq")
    assert len(dead) == 1 and "card" in dead[0]["reason"] and dead[0]["stream"] == "customers"


@pytest.mark.chaos
def test_table_versions_survive_kill_9_and_restart(kafka_bootstrap, redis_url, tmp_path, topic):
    """The table's versions are operator state, checkpointed with both topics' offsets: after
    kill -9 and a restart from the checkpoint, the profiles read before the crash (from the
    checkpointed state; or read again if the crash came before their batch committed) still
    govern the events, and an update read after the restart takes effect at its time; no alert
    is lost or duplicated."""
    rules, env, log = _job(kafka_bootstrap, redis_url, tmp_path, topic)
    cards = [f"c{i}" for i in range(1, 4)]
    kcat_produce(kafka_bootstrap, f"{topic}-customers",
                 [_profile(c, T - 86_400_000, "NL") for c in cards])
    kcat_produce(kafka_bootstrap, f"{topic}-in",
                 [_tx(T + i * 1000, c, "FR") for i, c in enumerate(cards)]
                 + [_tx(T + 30 * MIN, "nobody", "FR")])
    args = ["--rules", str(rules), "--checkpoint", str(tmp_path / "ck"),
            "--topic", f"transactions={topic}-in", "--trigger", "0.5"]
    proc = cep_run(env, args, log)
    try:
        _wait_for(lambda: len(kcat_read(kafka_bootstrap, f"{topic}.alerts")) >= len(cards),
                  "the alerts before the crash", log)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    # While the job is down: c1 moves to France (+60m); then charges at +120m.
    kcat_produce(kafka_bootstrap, f"{topic}-customers", [_profile("c1", T + 60 * MIN, "FR")])
    kcat_produce(kafka_bootstrap, f"{topic}-in",
                 [_tx(T + 120 * MIN, "c1", "FR"), _tx(T + 120 * MIN + 1000, "c2", "FR"),
                  _tx(T + 120 * MIN + 2000, "c3", "DE"), _tx(T + 180 * MIN, "nobody", "FR")])
    proc = cep_run(env, [*args, "--once"], log)
    try:
        rc = proc.wait(400)
    except Exception:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert rc == 0, log.read_text()[-3000:]
    alerts = kcat_read(kafka_bootstrap, f"{topic}.alerts")
    got = sorted((a["key"], a["first_ts"], a["measures"]["home"]) for a in alerts)
    want = sorted([(c, T + i * 1000, "NL") for i, c in enumerate(cards)]
                  + [("c2", T + 120 * MIN + 1000, "NL"), ("c3", T + 120 * MIN + 2000, "NL")])
    assert got == want
    ids = [a["alert_id"] for a in alerts]
    assert len(ids) == len(set(ids))
