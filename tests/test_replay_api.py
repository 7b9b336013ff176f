"""The public DataFrame API (`from cep.spark import detect`): a batch DataFrame gives the
embedded engine's alerts (the batch plan), from columns or from a `value` JSON column; a
streaming DataFrame gives the same alerts through the stateful query, to a sink of the
caller's choosing (here foreachBatch with availableNow over files)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cep.compile import compile_rules, load_rules_dir
from cep.datagen import GENERATORS, write_jsonl
from cep.runtime.bind import build_engine
from cep.runtime.embedded import alerts_for, canonical_lines

pytestmark = pytest.mark.spark
RULES = Path(__file__).resolve().parent.parent / "rules"


def _embedded(events: list[dict], stream: str, rules: Path = RULES / "fraud.cep") -> list[str]:
    """The embedded (Python) engine's alerts: the rules of one file, or of a folder."""
    ruleset = load_rules_dir(rules) if rules.is_dir() else compile_rules(rules.read_text(),
                                                                         str(rules))
    return canonical_lines(alerts_for(build_engine(ruleset), {stream: events}))


def _lines(rows) -> list[str]:
    return sorted(json.dumps(json.loads(r.payload), sort_keys=True) for r in rows)


def test_detect_on_a_batch_dataframe_equals_the_embedded_engine(spark, tmp_path):
    from cep.spark import detect

    ds = GENERATORS["fraud"](n_events=3000, n_keys=30, inject=2, seed=3)
    write_jsonl(ds.events, tmp_path / "in", files=2)
    fraud_only = _embedded(ds.events, ds.stream)
    assert len(fraud_only) == len(ds.expected) > 0
    # All the rules of rules/: fraud.cep's, and those of other files on the same stream (a
    # 30-day spend history, a table of customers), which may also fire on these events.
    expected = _embedded(ds.events, ds.stream, RULES)

    # The events' JSON as a `value` column (every line as read), all the rules of rules/.
    text = spark.read.text(str(tmp_path / "in"))
    alerts = detect(text, rules=str(RULES), stream="transactions", partitions=3)
    assert alerts.columns[:4] == ["rule_id", "key", "id", "kind"]
    got = alerts.collect()
    assert _lines(got) == expected
    first = min(got, key=lambda r: r.detected_at)
    record = json.loads(first.payload)
    assert (first.first_ts, first.last_ts, first.detected_at, first.alert, first.id) == (
        record["first_ts"], record["last_ts"], record["detected_at"], record["alert"],
        record["alert_id"])

    # The fields as columns (Spark's JSON reader), one rules file: the stream is implied.
    table = spark.read.json(str(tmp_path / "in"))
    assert _lines(detect(table, rules=str(RULES / "fraud.cep")).collect()) == fraud_only


def test_detect_says_which_stream_is_missing(spark):
    from cep.spark.api import DetectError, detect

    df = spark.createDataFrame([("{}",)], "value string")
    with pytest.raises(DetectError, match="several streams"):
        detect(df, rules=str(RULES))


def test_detect_rows_gives_dead_letters_with_their_reason(spark):
    from cep.spark import detect_rows

    df = spark.createDataFrame([('{"ts": 1, "card": "c", "amount": "x"}',), ("nope",)],
                               "value string")
    rows = detect_rows(df, rules=str(RULES / "fraud.cep")).collect()
    dead = sorted(json.loads(r.payload)["reason"] for r in rows if r.kind == "dead")
    assert len(dead) == 2 and any("FLOAT" in d for d in dead)
    stats = [json.loads(r.payload) for r in rows if r.kind == "stats"]
    assert sum(s["read"] for s in stats) == 2 and sum(s["events"] for s in stats) == 0


def test_detect_on_a_streaming_dataframe_runs_the_stateful_query(spark, tmp_path):
    from cep.spark import detect

    ds = GENERATORS["fraud"](n_events=2000, n_keys=20, inject=2, seed=4)
    events = sorted(ds.events, key=lambda e: e["ts"])
    # A last event a day later moves the watermark past every other event (a stream has no
    # end of input): then every alert is out, as the embedded engine finds them.
    clock = {**events[-1], "card": "clock", "ts": events[-1]["ts"] + 86_400_000}
    (tmp_path / "in").mkdir()
    half = len(events) // 2
    for name, part in (("0.jsonl", events[:half]), ("1.jsonl", events[half:]),
                       ("2.jsonl", [clock])):
        (tmp_path / "in" / name).write_text("".join(json.dumps(e) + "\n" for e in part))
    expected = _embedded(events + [clock], ds.stream)
    lines = (spark.readStream.format("text").option("maxFilesPerTrigger", 1)
             .load(str(tmp_path / "in")))
    alerts = detect(lines, rules=str(RULES / "fraud.cep"))
    assert alerts.isStreaming
    got: list = []
    q = (alerts.writeStream.foreachBatch(lambda df, _: got.extend(df.collect()))
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True)
         .start())
    q.awaitTermination()
    assert q.exception() is None
    assert _lines(got) == expected and len(expected) == len(ds.expected)
