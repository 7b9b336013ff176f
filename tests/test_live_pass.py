"""The live job's one Python pass (`cep.spark.live_pass`) gives the rows of the plan it
replaced, which Spark computes: `validated` → `with_dead_letters` → `fan_out` (the shard by
Spark's own `pmod(xxhash64(key_field, key), shards)`). Same shard, stream, time, seq, text,
key field, `primary` and watermark time for every row, over bad input, several streams, a
rule with no key, a co-partitioned and a broadcast table. And `spark_shards` (the core's and
the Python fallback) equals Spark's function on generated strings. A key's shard is part of
its checkpointed state: a checkpoint written by one plan must be read by the other."""

from __future__ import annotations

import base64
import json
import random
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from cep.compile import compile_rules
from cep.spark.live_pass import (
    MAX_KAFKA_OFFSET,
    ValidatePack,
    kafka_position,
    kafka_seq,
    slim_input,
    spark_shards,
)
from cep.spark.pipeline import DEAD_STREAM, fan_out, plan_for, unpack, validated
from tests.test_bad_input import FRAUD, MIXED, T
from tests.test_validate_live_fast import POSITION, _raw, several_streams_rows
from tests.test_validate_live_fast import RULES as SEVERAL

pytestmark = [pytest.mark.spark]

# test_validate_live_fast's rules, and one whose lookup is not by its key: a broadcast table.
RULES = SEVERAL + """
RULE here FROM tx PARTITION BY country
  PATTERN (x) DEFINE x AS country = customers[card].home EMIT 'here';
"""


def with_dead_letters(parsed: Any, *position: str) -> Any:
    """The replaced plan's dead-letter step, in the JVM (cep/spark/pipeline.py until session
    11), kept here as the reference: each bad row as a `DEAD_STREAM` event whose `data` holds
    the dead letter's fields, ts 0, key ""."""
    bad = F.col("reason").isNotNull()
    info = F.to_json(F.struct(F.col("reason"), F.base64(F.col("raw")).alias("raw_b64"),
                              F.col("stream"), *[F.col(c) for c in position]))
    return parsed.select(
        F.when(bad, F.lit(DEAD_STREAM)).otherwise(F.col("stream")).alias("stream"),
        F.when(bad, F.lit(0).cast("bigint")).otherwise(F.col("ts")).alias("ts"),
        "seq", F.when(bad, info).otherwise(F.col("data")).alias("data"),
        F.when(bad, F.array(F.lit(""))).otherwise(F.col("keys")).alias("keys"))


COLS = ["shard", "stream", "ts", "seq", "data", "key_field", "primary", "wm"]


def _comparable(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Rows as sortable tuples; a dead letter's `data` as its parsed fields and raw bytes
    (Spark's `to_json` and Python's `json.dumps` may space or escape differently, and Spark's
    `base64` breaks lines every 76 characters, which the decoder skips)."""
    out = []
    for r in rows:
        data = r["data"]
        if r["stream"] == DEAD_STREAM:
            info = json.loads(data)
            if "raw_b64" in info:
                info["raw_b64"] = base64.b64decode(info["raw_b64"]).hex()
            data = json.dumps(info, sort_keys=True)
        out.append(tuple(data if c == "data" else r[c] for c in COLS))
    return sorted(out, key=repr)


def _spark_rows(spark: Any, plan: Any, batch: Any) -> list[dict[str, Any]]:
    raw = spark.createDataFrame(batch.to_pandas())
    rows = fan_out(with_dead_letters(validated(raw, plan, POSITION, 1 << 20), *POSITION), plan)
    return [r.asDict() for r in rows.select(*COLS[:-1], F.unix_millis("event_time").alias("wm"))
            .collect()]


def _one_pass(plan: Any, batch: Any) -> list[dict[str, Any]]:
    vp = ValidatePack(plan, POSITION, 1 << 20)
    table = vp.fan_out(vp.validate.validate_batch(batch))
    rows: list[dict[str, Any]] = table.to_pylist()
    # The packs the mapInArrow yields hold the same rows (less shard and wm, kept per pack).
    packs = [b for out in vp(iter([batch])) for b in out.to_pylist()]
    assert sorted(p["shard"] for p in packs) == sorted({r["shard"] for r in rows})
    for p in packs:
        mine = [r for r in rows if r["shard"] == p["shard"]]
        assert p["wm"] == max(r["wm"] for r in mine)
        assert sorted(map(repr, unpack([p["pack"]]).to_pylist())) == sorted(
            repr({k: r[k] for k in ("stream", "ts", "seq", "data", "key_field", "primary")})
            for r in mine)
    return rows


def test_bad_input_and_the_fraud_rules_as_spark_computes_them(spark: Any) -> None:
    plan = plan_for(FRAUD, 8)
    stream = plan.streams[0].name
    records: list[bytes | None] = [r for r in MIXED if len(r) < 1 << 20] + [
        None, b"", json.dumps({"ts": T, "card": "u\u00e9\u20ac", "amount": 1}).encode()]
    records += [json.dumps({"ts": T + i, "card": f"card-{i}", "amount": i}).encode()
                for i in range(200)]
    batch = _raw([stream] * (len(records) - 1) + ["nope"], records)
    mine = _one_pass(plan, batch)
    assert sum(r["stream"] == DEAD_STREAM for r in mine) >= 10
    assert len({r["shard"] for r in mine}) == 8
    assert _comparable(mine) == _comparable(_spark_rows(spark, plan, batch))


def test_several_streams_no_key_and_tables_as_spark_computes_them(spark: Any) -> None:
    plan = plan_for(compile_rules(RULES, "several.cep"), 4)
    assert any("*" in s.key_fields for s in plan.streams)  # a broadcast table
    rows = several_streams_rows(40, 6, lambda i: "NL" if i % 3 else "DE", bad_logins=False)
    batch = _raw([s for s, _ in rows], [v for _, v in rows])
    mine = _one_pass(plan, batch)
    assert {r["stream"] for r in mine} == {"tx", "logins", "customers", DEAD_STREAM}
    assert _comparable(mine) == _comparable(_spark_rows(spark, plan, batch))


def test_spark_shards_is_sparks_function(spark: Any) -> None:
    rnd = random.Random(11)
    alphabet = "ab09-_ \u00e9\u20ac\U0001f600"
    keys = ["", "card-1", *("x" * n for n in range(1, 80))]
    keys += ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 90)))
             for _ in range(600)]
    for field, shards in (("card", 8), ("", 64), ("user", 1), ("*", 7)):
        want = [r[0] for r in spark.createDataFrame([(k,) for k in keys], "k string")
                .select(F.pmod(F.xxhash64(F.lit(field), F.col("k")), F.lit(shards)))
                .collect()]
        arr = pa.array(["pad", *keys]).slice(1)  # an array with an offset, as Arrow slices
        assert spark_shards(field, arr, shards, native=True).tolist() == want
        assert spark_shards(field, arr, shards, native=False).tolist() == want


@pytest.mark.parametrize("native", [True, False])
def test_a_null_or_missing_key_is_a_dead_letter_before_the_shard(monkeypatch: Any,
                                                                 native: bool) -> None:
    """An event whose key field is null, missing or not a value never reaches `spark_shards`
    (which refuses a null key): the validator makes it a dead letter with the reason, as replay
    and `cep test` do (cep.events); the job goes on with the other rows. Both validators: the
    core's fast path and the Python one (a worker where the core does not load)."""
    import cep.spark.pipeline as pipeline

    monkeypatch.setattr(pipeline, "native_on_this_worker", lambda: native)
    plan = plan_for(compile_rules("STREAM s TIME BY ts LATENESS 1s;\n"
                                  "RULE r FROM s PARTITION BY card PATTERN (a) EMIT 'r';\n",
                                  "null.cep"), 4)
    records = [json.dumps({"ts": 5, "card": None}).encode(), json.dumps({"ts": 6}).encode(),
               json.dumps({"ts": 7, "card": {"n": 1}}).encode(),
               json.dumps({"ts": 8, "card": "c1"}).encode(),
               json.dumps({"ts": 9, "card": 12}).encode()]
    rows = _one_pass(plan, _raw(["s"] * len(records), records))
    dead = sorted(json.loads(r["data"])["reason"] for r in rows if r["stream"] == DEAD_STREAM)
    assert dead == ["key field 'card' is an object, not a value", "missing key field 'card'",
                    "missing key field 'card'"]
    good = {r["ts"]: r["shard"] for r in rows if r["stream"] == "s"}
    assert good == {8: int(spark_shards("card", pa.array(["c1"]), 4)[0]),
                    9: int(spark_shards("card", pa.array(["12"]), 4)[0])}
    for native_hash in (True, False):  # the precondition the validator guarantees
        with pytest.raises(ValueError, match="null key"):
            spark_shards("card", pa.array(["c1", None]), 4, native=native_hash)


def _packed_rows(vp: ValidatePack, batch: Any) -> list[tuple[Any, ...]]:
    """A pass's output as sortable (shard, wm, row) tuples, one per packed row."""
    return sorted(((p["shard"], p["wm"], repr(r)) for out in vp(iter([batch]))
                   for p in out.to_pylist() for r in unpack([p["pack"]]).to_pylist()),
                  key=repr)


def test_a_slim_input_gives_the_full_inputs_rows() -> None:
    """`live_packed` sends a one-stream Kafka job's rows to Python as `value` and `seq` only:
    the pass must give the same packed rows (dead letters with their topic, partition and
    offset) as from the full columns."""
    plan = plan_for(FRAUD, 8)
    stream = plan.streams[0].name
    records: list[bytes | None] = [r for r in MIXED if len(r) < 1 << 20] + [None, b""]
    records += [json.dumps({"ts": T + i, "card": f"card-{i}", "amount": i}).encode()
                for i in range(100)]
    n = len(records)
    # Two partitions, as the live job encodes a position: partition * 2^40 + offset.
    part = [i % 2 for i in range(n)]
    offset = [1000 + i for i in range(n)]
    full = pa.RecordBatch.from_arrays(
        [pa.array([stream] * n), pa.array(records, pa.binary()),
         pa.array([(p << 40) + o for p, o in zip(part, offset, strict=True)], pa.int64()),
         pa.array(["tx-topic"] * n), pa.array(part, pa.int32()), pa.array(offset, pa.int64())],
        names=["stream", "value", "seq", *POSITION])
    slim = full.select(["value", "seq"])
    wanted = _packed_rows(ValidatePack(plan, POSITION, 1 << 20), full)
    got = _packed_rows(ValidatePack(plan, POSITION, 1 << 20, (stream, "tx-topic")), slim)
    assert sum(DEAD_STREAM in r for _, _, r in wanted) >= 10
    assert got == wanted


def test_slim_input_only_for_one_stream_read_from_kafka() -> None:
    fraud = plan_for(FRAUD, 8)
    name = fraud.streams[0].name
    assert slim_input(fraud, POSITION, {name: "t"}) == (name, "t")
    assert slim_input(fraud, (), {name: "t"}) == (name, "t")
    assert slim_input(fraud, POSITION, None) is None
    assert slim_input(fraud, ("topic",), {name: "t"}) is None
    assert slim_input(fraud, POSITION, {"other": "t"}) is None
    several = plan_for(compile_rules(RULES, "several.cep"), 4)
    assert slim_input(several, POSITION, {s.name: s.name for s in several.streams}) is None


def test_kafka_position_reads_back_kafka_seq(spark: Any) -> None:
    """The one encoder (a Spark column, every Kafka read) and the one decoder (a slim dead
    letter's position) agree, up to the largest offset the encoding holds."""
    positions = [(0, 0), (0, 1), (1, 0), (3, 12345), ((1 << 23) - 1, MAX_KAFKA_OFFSET),
                 (7, MAX_KAFKA_OFFSET)]
    df = spark.createDataFrame(positions, "partition int, offset long")
    seqs = [r[0] for r in df.select(kafka_seq(F.col("partition"), F.col("offset"))).collect()]
    assert [kafka_position(q) for q in seqs] == positions
    assert len(set(seqs)) == len(seqs)


def test_a_position_past_the_seq_encoding_does_not_stop_the_read(spark: Any) -> None:
    """Past offset 2^40 - 1 the seq is still partition × 2^40 + offset (the documented limit of
    a slim dead letter's position), never a failed query: it would fail again at every restart."""
    df = spark.createDataFrame([(0, MAX_KAFKA_OFFSET + 1), (2, MAX_KAFKA_OFFSET + 7)],
                               "partition int, offset long")
    seqs = [r[0] for r in df.select(kafka_seq(F.col("partition"), F.col("offset"))).collect()]
    assert seqs == [1 << 40, (3 << 40) + 6]
    assert kafka_position(seqs[0]) == (1, 0)  # the documented wrong read-back
