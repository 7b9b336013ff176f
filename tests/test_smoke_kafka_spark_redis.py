"""Kafka → Spark Structured Streaming → Kafka + Redis, through every real part.

confluent-kafka produces JSON events; Spark's `kafka` source reads them; a trivial transformation
runs; our foreachBatch delivery writes a Kafka transaction and Redis (stream, latest-per-key hash).
The test reads both back. A second run restarts from the checkpoint after its last commit was
removed, which forces Spark to re-run a delivered batch: Kafka and Redis must not see it twice.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from cep.delivery.record import OutRecord
from cep.spark.delivery import BatchDelivery
from tests.kafka_util import produce_json, read_topic

pytestmark = [pytest.mark.services, pytest.mark.spark]


def _run_query(spark, settings, in_topic, out_topic, stream, checkpoint) -> list[dict]:
    raw = (spark.readStream.format("kafka")
           .option("kafka.bootstrap.servers", settings.kafka_bootstrap)
           .option("subscribe", in_topic).option("startingOffsets", "earliest").load())
    events = raw.select(
        "partition", "offset",
        F.from_json(F.col("value").cast("string"), "card string, amount double").alias("e"),
    ).select("partition", "offset", "e.card", (F.col("e.amount") * 100).cast("long").alias("cents"))

    def to_records(rows):
        for r in rows:
            yield OutRecord(
                id=f"{in_topic}:{r.partition}:{r.offset}",
                payload={"card": r.card.upper(), "cents": r.cents},
                key=r.card, kafka_topic=out_topic, redis_stream=stream,
                redis_latest_hash=f"{stream}:latest", redis_latest_field=r.card,
            )

    batches: list[dict] = []
    deliver = BatchDelivery(settings, "smoke", checkpoint, to_records,
                            on_batch=lambda _bid, info: batches.append(info))
    q = (events.writeStream.foreachBatch(deliver)
         .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    q.awaitTermination(300)
    deliver.close()
    assert q.exception() is None, q.exception()
    return batches


def test_kafka_to_spark_to_kafka_and_redis(spark, settings, kafka_bootstrap, redis_url,
                                           redis_client, topic, tmp_path: Path):
    settings = settings.with_overrides({"kafka_bootstrap": kafka_bootstrap, "redis_url": redis_url})
    out_topic, stream = f"{topic}-out", f"smoke:{topic}"
    checkpoint = str(tmp_path / "ck")
    first = [{"card": f"c{i % 4}", "amount": i + 0.5} for i in range(1, 21)]
    produce_json(kafka_bootstrap, topic, first, key_field="card")
    _run_query(spark, settings, topic, out_topic, stream, checkpoint)

    kafka_out = read_topic(kafka_bootstrap, out_topic)
    got = sorted((json.loads(v)["card"], json.loads(v)["cents"]) for _, v, _ in kafka_out)
    want = sorted((e["card"].upper(), int(e["amount"] * 100)) for e in first)
    assert got == want
    assert redis_client.xlen(stream) == 20
    assert json.loads(redis_client.hget(f"{stream}:latest", "c3"))["card"] == "C3"

    # Forget that the last batch committed: the restarted query re-runs it (same batch id).
    commits = [p for p in (Path(checkpoint) / "commits").iterdir() if p.name.isdigit()]
    last = max(commits, key=lambda p: int(p.name))
    last.unlink()
    (last.parent / f".{last.name}.crc").unlink(missing_ok=True)
    second = [{"card": "c9", "amount": 1.25}]
    produce_json(kafka_bootstrap, topic, second, key_field="card")
    batches = _run_query(spark, settings, topic, out_topic, stream, checkpoint)
    replayed = [b for b in batches if b["kafka_skipped_replayed_batch"]]
    assert replayed, f"the removed commit did not make Spark re-run a batch: {batches}"
    assert replayed[0]["redis_duplicates"] == replayed[0]["records"] > 0

    kafka_out = read_topic(kafka_bootstrap, out_topic)
    ids = [h["cep-id"] for _, _, h in kafka_out]
    assert len(ids) == len(set(ids)) == 21, f"duplicates or loss in Kafka: {len(ids)} records"
    entries = redis_client.xrange(stream)
    redis_ids = [fields["id"] for _, fields in entries]
    assert len(redis_ids) == len(set(redis_ids)) == 21
    shutil.rmtree(checkpoint)
