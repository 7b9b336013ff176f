"""The batch replay's dead letters keep their source position however Spark splits a file:
a JSON-lines file cut into many input splits (each read by its own task, which counts lines
from its split's start) gives every bad line its line number in the file, as named on the
command line; blank lines count as lines but are not records; CRLF line ends are not part of
the record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.replay import InputSpec, run_replay

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "rules" / "fraud.cep"
T = 1767225600000


def _line(i: int) -> bytes:
    ev = {"ts": T + i * 1000, "card": f"c{i % 7}", "amount": 10.5, "merchant": "m",
          "country": "NL"}
    if i % 23 == 5:
        return b"{not json " + str(i).encode()
    if i % 31 == 7:
        return json.dumps({**ev, "amount": "cheap"}).encode()
    if i % 17 == 3:
        return b""  # a blank line
    if i % 13 == 2:
        return json.dumps(ev).encode() + b"\r"  # a CRLF line end
    return json.dumps(ev).encode()


def test_dead_letters_keep_file_and_line_across_input_splits(spark, settings, tmp_path,
                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("in").mkdir()
    lines = [_line(i) for i in range(600)]
    Path("in/events.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    spark.conf.set("spark.sql.files.maxPartitionBytes", "3000")  # about 30 splits
    try:
        summary = run_replay(settings, str(RULES), [InputSpec("transactions", "in")],
                             "out/alerts.jsonl", show_progress=False)
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
    dead = [json.loads(x) for x in Path("out/alerts.dead-letters.jsonl").read_text()
            .splitlines()]
    expected = [i + 1 for i, raw in enumerate(lines)
                if raw.startswith(b"{not") or b'"cheap"' in raw]
    assert [d["line"] for d in dead] == expected
    assert {d["file"] for d in dead} == {"in/events.jsonl"}
    assert all(not d["value"].endswith("\r") for d in dead)
    records = sum(1 for raw in lines if raw.strip())
    assert summary.events_read == records and summary.dead_letters == len(expected)
    assert summary.events_processed == records - len(expected) and summary.balanced


TWO_KEYS = """
STREAM pay (ts INT, card STRING, shop STRING, amount FLOAT) TIME BY ts LATENESS 0s;
RULE card_pair FROM pay PARTITION BY card PATTERN (a b) DEFINE a AS amount < 5,
  b AS amount > 100 WITHIN 1m EMIT 'card: small then big';
RULE shop_burst FROM pay PARTITION BY shop PATTERN (a{3}) DEFINE a AS amount > 50
  WITHIN 30s EMIT 'shop: three big';
RULE anything FROM pay PATTERN (a b) DEFINE a AS amount = 1, b AS amount = 2 WITHIN 5s
  EMIT 'whole stream';
"""


@pytest.mark.parametrize("partitions", [1, 3])
def test_a_stream_with_several_key_fields_equals_the_embedded_engine(spark, settings,
                                                                      tmp_path, partitions):
    """Each event goes to the shard of each of its keys (card, shop, and '' for the rule
    without PARTITION BY); every copy is matched once, by that key field's rules."""
    import random

    from cep.compile import compile_rules
    from cep.runtime.bind import build_engine
    from cep.runtime.embedded import alerts_for, canonical_lines

    rng = random.Random(7)
    events = [{"ts": 1000 * i + rng.randrange(3), "card": f"c{rng.randrange(9)}",
               "shop": f"s{rng.randrange(4)}", "amount": rng.choice([1, 2, 3, 60, 150])}
              for i in range(1500)]
    rules = tmp_path / "two.cep"
    rules.write_text(TWO_KEYS)
    (tmp_path / "in").mkdir()
    for i in range(2):
        (tmp_path / "in" / f"{i}.jsonl").write_text(
            "".join(json.dumps(e) + "\n" for e in events[i::2]))
    out = tmp_path / "alerts.jsonl"
    summary = run_replay(settings.with_overrides({"shuffle_partitions": partitions}),
                         str(rules), [InputSpec("pay", str(tmp_path / "in"))], str(out),
                         show_progress=False)
    engine = build_engine(compile_rules(TWO_KEYS, str(rules)))
    embedded = canonical_lines(alerts_for(engine, {"pay": events}))
    assert out.read_text().splitlines() == embedded
    assert {json.loads(a)["rule_id"] for a in embedded} == {"card_pair", "shop_burst",
                                                            "anything"}
    assert summary.events_processed == summary.events_read == len(events)


@pytest.mark.parametrize("partitions", [2, 3, 4, 7])
def test_engine_partitions_get_the_shards_in_turn(spark, partitions):
    """`partition_key`: shard s is in engine partition s mod N (Spark's own hash of 64 shard
    numbers gave 4 partitions 171k to 332k of 1M events); which partition holds a shard does not
    change an alert (the determinism tests), only how even the engine's tasks are."""
    from pyspark.sql import functions as F

    from cep.spark.batch import partition_key

    shards = 64
    df = spark.range(shards).select(F.col("id").cast("int").alias("shard"))
    got = (df.repartition(partitions, partition_key(F.col("shard"), shards, partitions))
           .select("shard", F.spark_partition_id().alias("p")).collect())
    assert sorted((r.shard, r.p) for r in got) == [(s, s % partitions) for s in range(shards)]
