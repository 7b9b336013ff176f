"""Bad input never stops alerting and never vanishes (issue 18).

One mixed input — valid events that raise alerts, and every kind of bad record the issue names
(trailing garbage, single quotes, arrays, numbers as strings, NaN/Infinity, huge numbers, deep
nesting, invalid UTF-8, an empty message, a 5 MB message) — goes through `cep test`, `cep replay`
and the live job (`cep run` on the real broker). In each mode every record gets the verdict the
shared validator (`cep.events`) gives it, the alerts are those of the valid events (each once),
every bad record is a dead letter with its reason and source position, and the counts balance:
read = processed + dead letters.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from cep.compile import compile_rules
from cep.events import EventSchema, validate
from cep.runtime.bind import build_engine
from cep.runtime.embedded import alerts_for
from cep.testing.runner import run_case
from cep.testing.spec import load_test_file
from tests.test_live import FRAUD_RULES, _route_alerts_to, cep_run, kcat_read, live, wait

__all__ = ["live"]  # the fixture, shared with tests/test_live.py

T = 1767225600000
FRAUD = compile_rules(FRAUD_RULES.read_text(), str(FRAUD_RULES))
SCHEMA = EventSchema.of(FRAUD.rules[0].stream, [r.key_field for r in FRAUD.rules])


def _ev(ts: int, card: str, amount: object) -> bytes:
    return json.dumps({"ts": T + ts * 1000, "card": card, "amount": amount,
                       "merchant": "shop", "country": "NL"}).encode()


def _probes(card: str) -> list[bytes]:
    return [_ev(0, card, 1.0), _ev(30, card, 1.5), _ev(60, card, 0.99)]


MIXED: list[bytes] = [
    *_probes("p1"), _ev(120, "p1", 900),                # card testing: an alert
    *_probes("p2"), _ev(120, "p2", "5000"),             # the big charge as a string: dead letter
    *_probes("p3"),
    _ev(120, "p3", 900).replace(b'"', b"'"),            # single quotes: dead letter
    _ev(121, "p3", 900) + b" trailing",                 # trailing garbage: dead letter
    b"[" + _ev(122, "p3", 900) + b"]",                  # an array: dead letter
    _ev(123, "p3", 1).replace(b'"amount": 1', b'"amount": NaN'),
    _ev(124, "p3", 1).replace(b'"amount": 1', b'"amount": Infinity'),
    _ev(125, "p3", 1).replace(b'"amount": 1', b'"amount": 1e400'),          # overflows
    _ev(126, "p3", 1).replace(b'"amount": 1', b'"amount": ' + b"9" * 5000),  # 5000 digits
    _ev(127, "p4", 2**70),                              # huge, but a finite FLOAT: valid
    json.dumps({"ts": str(T + 128_000), "card": "p4", "amount": 1}).encode(),  # ts as a string
    _ev(129, "p4", 1)[:-1] + b', "extra": ' + b"[" * 200 + b"]" * 200 + b"}",  # deep nesting
    _ev(130, "p6", 1).replace(b'"p6"', b'"p\xff"'),                         # invalid UTF-8
    _ev(131, "p5", 1)[:-1] + b', "pad": "' + b"x" * (5 << 20) + b'"}',       # 5 MB
    json.dumps({"card": "p5", "amount": 1}).encode(),   # no time field
    json.dumps({"ts": T + 132_000, "amount": 1}).encode(),  # no key
    _ev(600, "p9", 3),                                  # moves the watermark past everything
]
EMPTY = b""  # only a Kafka message can be empty (a blank line in a file is not a record)


def _verdicts(records: list[bytes]) -> list[str | None]:
    return [validate(r, SCHEMA)[2] for r in records]


def _reference() -> list[tuple]:
    engine = build_engine(FRAUD)
    events = [validate(r, SCHEMA)[0] for r in MIXED]
    alerts = alerts_for(engine, {"transactions": [e for e in events if e is not None]})
    return sorted((a["rule_id"], a["key"], a["first_ts"], a["last_ts"]) for a in alerts)


def test_the_mixed_input_has_what_the_issue_names():
    verdicts = _verdicts(MIXED)
    bad = [v for v in verdicts if v]
    for word in ("trailing", "double quotes", "array", 'FLOAT, got a string "5000"', "NaN",
                 "Infinity", "overflows", "digits", "nested", "UTF-8", "too large",
                 "missing time field", "missing key field", "ISO-8601"):
        assert any(word in v for v in bad), word
    assert len(bad) == 14 and validate(EMPTY, SCHEMA)[2] == "empty message"
    # Only p1 raises an alert: p2's and p3's big charges are dead letters, not silent misses.
    assert [a[:2] for a in _reference()] == [("card_testing", "p1")]


def test_cep_test_gives_every_line_the_validators_verdict(tmp_path):
    (tmp_path / "mixed.jsonl").write_bytes(b"\n".join(MIXED) + b"\n")
    dead = [i for i, v in enumerate(_verdicts(MIXED)) if v]
    (tmp_path / "case.yaml").write_text(textwrap.dedent(f"""\
        rules: {FRAUD_RULES.as_posix()}
        stream: transactions
        cases:
          - name: the mixed input
            events_file: mixed.jsonl
            dead_letters: {dead}
            expect:
              - {{rule: card_testing, key: p1}}
        """))
    test = load_test_file(tmp_path / "case.yaml")
    result = run_case(test, test.cases[0])
    assert result.passed
    assert [r for _, r in result.dead] == [v for v in _verdicts(MIXED) if v]
    got = sorted((g.rule, g.key, g.first_ts, g.last_ts) for g in result.got)
    assert got == _reference()

    # A case that does not expect the rejection fails and says why.
    (tmp_path / "case.yaml").write_text(textwrap.dedent(f"""\
        rules: {FRAUD_RULES.as_posix()}
        defaults: {{card: c1, merchant: shop, country: NL}}
        cases:
          - name: a number as a string
            events:
              - {{ts: +0s, amount: "5000"}}
            expect_none: true
        """))
    test = load_test_file(tmp_path / "case.yaml")
    result = run_case(test, test.cases[0])
    assert not result.passed
    assert result.dead_unexpected == [(0, 'field \'amount\' is FLOAT, got a string "5000"')]


@pytest.mark.spark
def test_replay_gives_every_line_the_validators_verdict(spark, settings, tmp_path):
    from jobs.replay import InputSpec, run_replay

    (tmp_path / "in").mkdir()
    # Two files, the later events first: replay orders by event time, not by file.
    (tmp_path / "in" / "a.jsonl").write_bytes(b"\n".join(MIXED[8:]) + b"\n")
    (tmp_path / "in" / "b.jsonl").write_bytes(b"\n\n".join(MIXED[:8]) + b"\n")
    out = tmp_path / "alerts.jsonl"
    summary = run_replay(settings, str(FRAUD_RULES), [InputSpec("transactions",
                                                                str(tmp_path / "in"))],
                         str(out), show_progress=False)
    alerts = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((a["rule_id"], a["key"], a["first_ts"], a["last_ts"])
                  for a in alerts) == _reference()
    dead = [json.loads(line) for line in (tmp_path / "alerts.dead-letters.jsonl")
            .read_text().splitlines()]
    # Source position: file and line (b.jsonl has a blank line between records).
    where = {(Path(d["file"]).name, d["line"]): d["reason"] for d in dead}
    expected = {("a.jsonl", i + 1): v for i, v in enumerate(_verdicts(MIXED[8:])) if v}
    expected |= {("b.jsonl", 2 * i + 1): v for i, v in enumerate(_verdicts(MIXED[:8])) if v}
    assert where == expected
    big = next(d for d in dead if d["reason"].startswith("message too large"))
    assert big["truncated"] and big["size"] > 5 << 20 and len(big["value"]) == 64 * 1024
    assert summary.events_read == len(MIXED)
    assert summary.events_processed == sum(1 for v in _verdicts(MIXED) if v is None)
    assert summary.dead_letters == len(dead) == 14 and summary.balanced
    assert "read 26 = processed 12 + dead letters 14 (balances" in summary.table()


@pytest.mark.services
@pytest.mark.spark
# A batch of 8 read by one task (`live_read_tasks` 1), by one per core (the default) and by
# three (`live_read_task_rows` 3): a dead letter's partition and offset come from its Kafka
# position (`seq`), not from where a task starts.
@pytest.mark.parametrize("read_split", [{"CEP_LIVE_READ_TASKS": "1"}, {},
                                        {"CEP_LIVE_READ_TASK_ROWS": "3"}])
def test_poison_messages_do_not_stop_the_live_job(live, kafka_bootstrap, read_split):
    from confluent_kafka import Producer

    from cep.delivery.kafka_sink import ensure_topics
    from tests.kafka_util import read_topic

    topic = live["topic"]
    _route_alerts_to(live["rules"], f"{topic}.alerts")
    messages = [*MIXED[:10], EMPTY, *MIXED[10:]]
    ensure_topics(kafka_bootstrap, [f"{topic}-in"], partitions=1,
                  config={"max.message.bytes": str(8 << 20)})
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "message.max.bytes": 8 << 20,
                         "enable.idempotence": True})
    for m in messages:
        producer.produce(f"{topic}-in", value=m)
    assert producer.flush(60) == 0

    env = {**live["env"], **read_split}
    proc = cep_run(env, ["--rules", str(live["rules"]), "--checkpoint", str(live["ck"]),
                         "--topic", f"transactions={topic}-in", "--once",
                         "--max-offsets-per-trigger", "8"], live["log"])
    wait(proc, live["log"])  # exit 0: the job ran through every poison message

    alerts = kcat_read(kafka_bootstrap, f"{topic}.alerts")
    assert sorted((a["rule_id"], a["key"], a["first_ts"], a["last_ts"])
                  for a in alerts) == _reference()
    assert len({a["alert_id"] for a in alerts}) == len(alerts)  # each exactly once
    dlq = [json.loads(v) for _, v, _ in read_topic(kafka_bootstrap, f"{topic}-dlq")]
    by_offset = {d["offset"]: d for d in dlq}
    assert len(by_offset) == len(dlq)  # one dead letter per bad message, none twice
    expected = {i: v for i, v in enumerate(_verdicts(messages)) if v}
    assert {o: d["reason"] for o, d in by_offset.items()} == expected
    assert all(d["topic"] == f"{topic}-in" and d["partition"] == 0 for d in dlq)
    assert by_offset[10]["value"] == "" and by_offset[10]["reason"] == "empty message"
    counters = json.loads((live["ck"] / "metrics.json").read_text())["counters"]
    assert counters["events_read"] == len(messages) == 27
    assert counters["events"] == len(messages) - len(expected) == 12
    assert counters["dead_letters"] == len(expected) == 15
