"""The live job's trigger, JIT and read split (jobs/live.py, `live_trigger`, `live_jvm`,
`read_split`): which Spark trigger a `cep run` gets from `--once`, the `trigger` setting and
`--trigger`, which JIT its JVMs run, and how many records a Kafka read task takes at most.
No Spark here (the choice is made before the query starts), but for one case that gives
`read_split`'s options to Spark's own range calculation. What the defaults cost and save is
measured in bench/results/latency_live.md, not here."""

from __future__ import annotations

import pytest

from cep.config import QUICK_JIT, Settings, load_settings
from jobs.live import (
    ARROW_BATCH_ROWS,
    CONTINUOUS,
    LIVE_JAVA_OPTIONS,
    LiveOptions,
    arrow_batch_conf,
    live_jvm,
    live_trigger,
    live_worker_env,
    local_shuffle_conf,
    read_split,
)


def _opts(**kw: object) -> LiveOptions:
    return LiveOptions(rules="rules", checkpoint="ck", **kw)  # type: ignore[arg-type]


def test_default_starts_each_batch_when_the_previous_is_done() -> None:
    assert live_trigger(Settings(), _opts()) == CONTINUOUS == {"processingTime": "0 seconds"}


@pytest.mark.parametrize(("setting", "seconds", "once", "want"), [
    ("default", 2.0, False, {"processingTime": "2.0 seconds"}),          # --trigger 2
    ("processingTime:500ms", None, False, {"processingTime": "500 milliseconds"}),
    ("processingTime:500ms", 2.0, False, {"processingTime": "500 milliseconds"}),  # setting wins
    ("processingTime:500ms", 2.0, True, {"availableNow": True}),        # --once wins
    ("default", None, True, {"availableNow": True}),
])
def test_precedence(setting: str, seconds: float | None, once: bool,
                    want: dict[str, object]) -> None:
    got = live_trigger(Settings(trigger=setting), _opts(trigger_seconds=seconds, once=once))
    assert got == want


def test_the_live_jvm_runs_the_quick_jit_unless_options_are_given() -> None:
    assert live_jvm(Settings()).java_options == LIVE_JAVA_OPTIONS
    assert LIVE_JAVA_OPTIONS.startswith(QUICK_JIT)
    assert live_jvm(Settings(java_options="-Xmx4g")).java_options == "-Xmx4g"


def test_the_live_workers_run_mimalloc_without_huge_pages_unless_the_environment_says(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MIMALLOC_ALLOW_THP", raising=False)
    assert live_worker_env() == {"spark.executorEnv.MIMALLOC_ALLOW_THP": "0"}
    # The job's own setting reaches the workers as it is.
    monkeypatch.setenv("MIMALLOC_ALLOW_THP", "1")
    assert live_worker_env() == {"spark.executorEnv.MIMALLOC_ALLOW_THP": "1"}


def test_a_batch_is_read_by_one_task_per_core_unless_set_otherwise() -> None:
    """Spark's `minPartitions`: by default the session's cores (a one-partition topic's batch
    in that many equal tasks, whatever its size); `live_read_tasks` sets it, and
    `live_read_task_rows` adds `maxRecordsPerPartition` (ceil(records / that) tasks)."""
    assert read_split(Settings(), 2) == {"minPartitions": 2}
    assert read_split(Settings(live_read_tasks=1), 2) == {"minPartitions": 1}
    env = {"CEP_LIVE_READ_TASK_ROWS": "50000"}
    assert read_split(load_settings(env=env), 4) == {"minPartitions": 4,
                                                     "maxRecordsPerPartition": 50000}


def test_a_read_task_hands_its_rows_to_python_as_one_arrow_batch() -> None:
    assert arrow_batch_conf(Settings()) == {
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(ARROW_BATCH_ROWS)}
    assert arrow_batch_conf(Settings(live_read_task_rows=25000)) == {
        "spark.sql.execution.arrow.maxRecordsPerBatch": "25000"}


def test_a_local_job_does_not_compress_its_shuffle() -> None:
    assert local_shuffle_conf(Settings()) == {"spark.shuffle.compress": "false"}
    assert local_shuffle_conf(Settings(spark_master="spark://host:7077")) == {}


def _spark_read_tasks(spark, split: dict[str, int], records: list[int]) -> list[int]:
    """The read tasks (their sizes) Spark's Kafka source plans for a micro-batch of `records`
    per topic partition under the options `split`: its own `KafkaOffsetRangeCalculator`."""
    jvm = spark.sparkContext._jvm
    kafka = jvm.org.apache.spark.sql.kafka010
    options = jvm.java.util.HashMap()
    for k, v in split.items():
        options.put(k, str(v))
    calc = kafka.KafkaOffsetRangeCalculator.apply(
        jvm.org.apache.spark.sql.util.CaseInsensitiveStringMap(options))
    ranges = jvm.java.util.ArrayList()
    for p, n in enumerate(records):
        ranges.add(kafka.KafkaOffsetRange.apply(jvm.org.apache.kafka.common.TopicPartition("t", p),
                                                1000, 1000 + n, jvm.scala.Option.apply(None)))
    seq = jvm.scala.jdk.javaapi.CollectionConverters.asScala(ranges).toSeq()
    none = jvm.scala.jdk.javaapi.CollectionConverters.asScala(jvm.java.util.ArrayList()).toSeq()
    got = jvm.scala.jdk.javaapi.CollectionConverters.asJava(calc.getRanges(seq, none))
    return sorted((r.size() for r in got), reverse=True)


@pytest.mark.spark
def test_spark_plans_the_read_tasks_read_split_asks_for(spark) -> None:
    """What `read_split`'s options give in Spark's own range calculation (one topic partition
    unless said): the default, one task per core whatever the batch's size; session 15's
    split (1 task, at most 25,000 records each); and a cap alone (1 task, at most 50,000):
    one task for a small batch, two for 60k-100k records, three above 100k."""
    default = read_split(Settings(), 2)
    assert _spark_read_tasks(spark, default, [1_000]) == [500, 500]
    assert _spark_read_tasks(spark, default, [60_000]) == [30_000, 30_000]
    assert _spark_read_tasks(spark, default, [150_000]) == [75_000, 75_000]
    assert _spark_read_tasks(spark, default, [7, 7]) == [7, 7]  # a task per topic partition
    s15 = read_split(Settings(live_read_tasks=1, live_read_task_rows=25_000), 2)
    assert _spark_read_tasks(spark, s15, [20_000]) == [20_000]
    assert len(_spark_read_tasks(spark, s15, [60_000])) == 3
    cap = read_split(load_settings(env={"CEP_LIVE_READ_TASKS": "1",
                                        "CEP_LIVE_READ_TASK_ROWS": "50000"}), 2)
    assert cap == {"minPartitions": 1, "maxRecordsPerPartition": 50_000}
    assert _spark_read_tasks(spark, cap, [1_000]) == [1_000]
    assert _spark_read_tasks(spark, cap, [50_000]) == [50_000]
    assert _spark_read_tasks(spark, cap, [60_000]) == [30_000, 30_000]
    assert _spark_read_tasks(spark, cap, [100_000]) == [50_000, 50_000]
    assert len(_spark_read_tasks(spark, cap, [100_001])) == 3
