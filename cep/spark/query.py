"""The one Spark query that runs the rules, shared by `cep replay` and `cep run`:

validated events ──fan-out──► packed per (shard, input batch) ──► watermark ──groupBy(shard)
  ──► transformWithStateInPandas(CepProcessor) └► output rows (OUTPUT_SCHEMA)

The live job may split the shards over several operators, each in its own Python worker pool
(`pooled`, `live_pools`). The jobs differ only in where events come from (files, Kafka) and
where rows go (a collector, `BatchDelivery`); the operator's rows are decoded by one function,
`cep.runtime.alerts.decode_rows`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from pyspark.sql import DataFrame

from cep.engines import EngineFactory
from cep.runtime.alerts import output_rows
from cep.spark.operator import OUTPUT_SCHEMA, CepProcessor
from cep.spark.pipeline import Plan, fan_out, packed


def match_rules(good: DataFrame, plan: Plan, factory: EngineFactory,
                end_of_input: int | None = None) -> DataFrame:
    """Good (validated) events → the operator's output rows: alerts, timeouts, late events,
    dropped partial matches and a stats row per call. `end_of_input`: replay's last event
    time (the live job has none)."""
    # One row per (shard, input batch), not per event (`cep.spark.pipeline.packed_batch`).
    return match_packed(packed(fan_out(good, plan)), plan, factory, end_of_input)


def match_packed(rows: DataFrame, plan: Plan, factory: EngineFactory,
                 end_of_input: int | None = None, layout1_log: bool = True,
                 record_row: bool = False, pools: int = 1) -> DataFrame:
    """Packed rows (`shard`, `pack`, `event_time`: `cep.spark.pipeline.packed`, or the live
    job's one pass, `cep.spark.live_pass.live_packed`) → the operator's output rows.
    `layout1_log`: whether the query's state may hold the native store's layout 1 log
    (`CepProcessor`); `record_row`: whether each shard's record is its log's reserved row.
    `pools` > 1: the shards split over that many stateful operators (`pooled`), each a task
    per batch in its own Python worker pool; the query must run with one shuffle partition."""
    delay = plan.watermark_delay_ms
    # The watermark is computed from event_time; the column itself is not handed to the
    # operator (so Spark does not drop late rows there: the engine reports them instead).
    rows = rows.withWatermark("event_time", f"{delay} milliseconds").drop("event_time")
    processor = CepProcessor(factory, output_rows, delay, end_of_input, plan.shards,
                             layout1_log=layout1_log, record_row=record_row)
    if pools <= 1:
        return _operator(rows, processor)
    return pooled(rows, plan.shards, pools, lambda part: _operator(part, processor))


def _operator(rows: DataFrame, processor: CepProcessor) -> DataFrame:
    return rows.groupBy("shard").transformWithStateInPandas(  # type: ignore[no-any-return]
        statefulProcessor=processor, outputStructType=OUTPUT_SCHEMA,
        outputMode="Append", timeMode="EventTime")


POOL_ENV = "CEP_POOL"


def pool_of(shard: int, pools: int) -> int:
    """The operator (and Python worker pool) of `shard` when the shards are `pooled`."""
    return shard % pools


def pooled(rows: DataFrame, shards: int, pools: int,
           operator: Callable[[DataFrame], DataFrame]) -> DataFrame:
    """`operator` (a stateful operator over `rows` grouped by shard) once per pool, each over
    its shards (`pool_of`), the outputs unioned: a shard always runs in the same Python
    process (docs/spark-runtime.md, "One Python worker pool per stateful operator").

    - Spark keeps a pool of Python workers per (interpreter, environment) and a UDF's
      environment is `SparkContext.environment` when its JVM function is built: each operator
      is built with `POOL_ENV` set to its pool, so each has its own pool; with one task per
      operator and batch (the query's one shuffle partition), each pool keeps one worker.
    - The input is read and packed once per batch: `rows` goes through one exchange to a
      single partition (`repartition(1)`, which every operator's distribution accepts), and
      each operator takes its shards above it, so the two branches' exchanges are the same plan
      and Spark reuses one (`ReusedExchange`). The shard test is a non-deterministic filter
      (guarded by `spark_partition_id()`) only so that the optimizer does not push it below
      the exchange (a deterministic one went down to the map pass: two exchanges, the Kafka
      read and the pass twice per batch)."""
    from pyspark.sql import functions as F

    one = rows.repartition(1)
    env = one.sparkSession.sparkContext.environment
    saved = env.get(POOL_ENV)
    outs = []
    try:
        for pool in range(pools):
            mine = [s for s in range(shards) if pool_of(s, pools) == pool]
            part = one.filter(F.when(F.spark_partition_id() >= 0, F.col("shard").isin(mine)))
            env[POOL_ENV] = str(pool)
            outs.append(operator(part))
    finally:
        if saved is None:
            env.pop(POOL_ENV, None)
        else:
            env[POOL_ENV] = saved
    return functools.reduce(DataFrame.union, outs)
