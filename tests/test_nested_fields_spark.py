"""`cep replay` on Spark local mode over events with nested JSON fields and ISO-8601 event times
(tests/rules/nested/payments.cep): the same alerts as the embedded engine, and every record the
validator rejects (a nested value of the wrong type, a STRUCT that is not an object, a time that
is not ISO-8601) is a dead letter with the validator's reason and its file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cep.compile import compile_rules
from cep.events import EventSchema, validate
from cep.runtime.bind import build_engine
from cep.runtime.embedded import alerts_for, canonical_lines, validate_records
from jobs.replay import InputSpec, run_replay
from tests.rules.test_nested_fields import _payments

pytestmark = pytest.mark.spark
RULES = Path(__file__).resolve().parent / "rules" / "nested" / "payments.cep"

BAD = [
    {"ts": "2026-01-01T00:05:00Z", "card": "c1", "payload": {"amount": "99"}},
    {"ts": "2026-01-01T00:06:00Z", "card": "c1", "payload": 99},
    {"ts": "2026-01-01T00:07:00Z", "card": "c2", "device": {"id": "d0", "geo": "FR"}},
    {"ts": "yesterday", "card": "c2", "payload": {"amount": 1.0}},
]


def test_replay_of_nested_fields_equals_the_embedded_engine(spark, settings, tmp_path):
    events = _payments()
    lines = [json.dumps(e) for e in events]
    # The bad records between the good ones, in the second file.
    first, second = lines[:30], lines[30:]
    for i, bad in enumerate(BAD):
        second.insert(2 * i, json.dumps(bad))
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("\n".join(first) + "\n")
    (tmp_path / "in" / "b.jsonl").write_text("\n".join(second) + "\n")
    out = tmp_path / "alerts.jsonl"
    summary = run_replay(settings, str(RULES), [InputSpec("payments", str(tmp_path / "in"))],
                         str(out), show_progress=False)

    rules = compile_rules(RULES.read_text(), str(RULES))
    schema = EventSchema.of(rules.streams[0], ["card"])
    good, dead = validate_records(first + second, schema)
    assert len(good) == len(events) and len(dead) == len(BAD)
    embedded = canonical_lines(alerts_for(build_engine(rules), {"payments": good}))
    got = out.read_text().splitlines()
    assert got == embedded
    assert {json.loads(line)["rule_id"] for line in got} == {"new_country", "device_burst"}
    # The ISO-8601 times became epoch milliseconds in the alerts' events.
    first_alert = json.loads(got[0])
    assert all(isinstance(e["ts"], int) for e in first_alert["events"])

    letters = [json.loads(line) for line in (tmp_path / "alerts.dead-letters.jsonl")
               .read_text().splitlines()]
    where = {(Path(d["file"]).name, d["line"]): d["reason"] for d in letters}
    expected = {("b.jsonl", 2 * i + 1): validate(json.dumps(b), schema)[2]
                for i, b in enumerate(BAD)}
    assert where == expected
    assert set(where.values()) == {
        "field 'payload:amount' is FLOAT, got a string \"99\"",
        "field 'payload' is STRUCT, got a number 99",
        "field 'device:geo' is STRUCT, got a string \"FR\"",
        "time field 'ts' is 'yesterday': neither epoch milliseconds (a JSON integer) nor an "
        "ISO-8601 timestamp",
    }
    assert summary.events_read == len(events) + len(BAD)
    assert summary.events_processed == len(events)
    assert summary.dead_letters == len(BAD) and summary.balanced and summary.late == 0


def test_detect_reads_struct_columns_as_nested_fields(spark):
    """`cep.spark.detect` on a DataFrame with STRUCT columns: each row's JSON (`to_json`) holds
    them as nested objects, which the rules read with `payload:amount`."""
    from cep.spark.api import detect

    events = _payments()
    ddl = ("ts string, card string, payload struct<amount: double, currency: string>, "
           "device struct<id: string, geo: struct<country: string, city: string>>")
    df = spark.createDataFrame(
        [(e["ts"], e["card"], e["payload"], e["device"]) for e in events], ddl)
    got = sorted((r.rule_id, r.key, r.first_ts, r.last_ts)
                 for r in detect(df, RULES, stream="payments").collect())

    rules = compile_rules(RULES.read_text(), str(RULES))
    schema = EventSchema.of(rules.streams[0], ["card"])
    good, dead = validate_records([json.dumps(e) for e in events], schema)
    assert not dead
    expected = sorted((a["rule_id"], a["key"], a["first_ts"], a["last_ts"])
                      for a in alerts_for(build_engine(rules), {"payments": good}))
    assert got == expected
    assert {g[0] for g in got} == {"new_country", "device_burst"}
