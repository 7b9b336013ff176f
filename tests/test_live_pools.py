"""The live job's stateful operators (`live_pools`, session 27): a checkpoint keeps the plan it
was started with, one operator or several (each in its own Python worker pool), whatever the
setting says now (no Spark: the plan is decided before the query starts); and the pooled
branches read their source once (one Spark test). The pooled job itself runs in
tests/test_live.py (kill -9 and restart: exactly once, each shard in one process, each input
row read once)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cep.spark.query import pool_of
from jobs.live import (
    SHARDS_FILE,
    LiveJobError,
    checkpoint_pools,
    checkpoint_record_row,
    checkpoint_shards,
)


def test_a_new_checkpoint_records_its_operators(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    assert checkpoint_shards(ck, 6, pools=2) == 6
    # Not `"record_in_log": true` (which it implies): an older build, which knows only that
    # object, stops on this one naming shards.json instead of running one operator.
    assert json.loads((ck / SHARDS_FILE).read_text()) == {
        "shards": {"count": 6, "pools": 2}, "layout1_log": False}
    assert checkpoint_pools(ck, 2) == 2 and checkpoint_record_row(ck) is True


@pytest.mark.parametrize(("started", "now"), [(2, 1), (1, 2), (3, 2)])
def test_a_restart_keeps_the_recorded_plan(tmp_path: Path, started: int, now: int) -> None:
    ck = tmp_path / "ck"
    checkpoint_shards(ck, 6, pools=started)
    assert checkpoint_shards(ck, 6, pools=now) == 6
    assert checkpoint_pools(ck, now) == started


def test_an_older_checkpoint_keeps_one_operator(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    (ck / "alerts" / "offsets").mkdir(parents=True)
    (ck / "alerts" / "offsets" / "0").write_text("v1\n")
    checkpoint_shards(ck, 6, pools=2)  # state from before the record: 64 shards, one operator
    assert checkpoint_pools(ck, 2) == 1
    s18 = tmp_path / "s18"
    s18.mkdir()
    (s18 / SHARDS_FILE).write_text(json.dumps({"shards": {"count": 6, "record_in_log": True},
                                               "layout1_log": False}))
    assert checkpoint_pools(s18, 2) == 1


def test_at_most_one_operator_per_shard(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    checkpoint_shards(ck, 2, pools=4)
    assert checkpoint_pools(ck, 4) == 2


def test_an_unreadable_pool_count_is_an_error(tmp_path: Path) -> None:
    (tmp_path / SHARDS_FILE).write_text(json.dumps({"shards": {"count": 6, "pools": "two"}}))
    with pytest.raises(LiveJobError, match="shards.json"):
        checkpoint_pools(tmp_path, 2)


def test_the_pools_split_the_shards() -> None:
    for shards, pools in [(6, 2), (8, 3), (2, 2)]:
        groups = [[s for s in range(shards) if pool_of(s, pools) == p] for p in range(pools)]
        assert sorted(s for g in groups for s in g) == list(range(shards))
        assert max(map(len, groups)) - min(map(len, groups)) <= 1


@pytest.mark.spark
def test_the_pooled_operators_share_one_read_of_the_source(spark, tmp_path: Path) -> None:
    """`pooled`'s branches are one exchange in the executed plan (`ReusedExchange`): the source
    is read, and what is below the exchange run, once per batch (a filter pushed below it
    would make two)."""
    import time

    from pyspark.sql import functions as F

    from cep.spark.query import pooled

    rows = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 60).load()
            .select((F.col("value") % 6).cast("int").alias("shard"), "timestamp")
            .withWatermark("timestamp", "1 second"))
    out = pooled(rows, 6, 2, lambda part: part.groupBy("shard").count())
    q = (out.writeStream.outputMode("update").foreachBatch(lambda df, _: df.collect())
         .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        deadline = time.monotonic() + 120
        while q.lastProgress is None and time.monotonic() < deadline:
            time.sleep(0.5)
        plan = q._jsq.streamingQuery().lastExecution().executedPlan().toString()
    finally:
        q.stop()
    assert plan.count("ReusedExchange") == 1, plan
    assert plan.count("MicroBatchScan") == 1, plan
