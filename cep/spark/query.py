"""The one Spark query that runs the rules, shared by `cep replay` and `cep run`:

validated events ──fan-out──► packed per (shard, input batch) ──► watermark ──groupBy(shard)
  ──► transformWithStateInPandas(CepProcessor) └► output rows (OUTPUT_SCHEMA)

The jobs differ only in where events come from (files, Kafka) and where rows go (a collector,
`BatchDelivery`); the operator's rows are decoded by one function, `cep.runtime.alerts.decode_rows`.
"""

from __future__ import annotations

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
                 record_row: bool = False) -> DataFrame:
    """Packed rows (`shard`, `pack`, `event_time`: `cep.spark.pipeline.packed`, or the live
    job's one pass, `cep.spark.live_pass.live_packed`) → the operator's output rows.
    `layout1_log`: whether the query's state may hold the native store's layout 1 log
    (`CepProcessor`); `record_row`: whether each shard's record is its log's reserved row."""
    delay = plan.watermark_delay_ms
    # The watermark is computed from event_time; the column itself is not handed to the
    # operator (so Spark does not drop late rows there: the engine reports them instead).
    rows = rows.withWatermark("event_time", f"{delay} milliseconds").drop("event_time")
    processor = CepProcessor(factory, output_rows, delay, end_of_input, plan.shards,
                             layout1_log=layout1_log, record_row=record_row)
    return rows.groupBy("shard").transformWithStateInPandas(  # type: ignore[no-any-return]
        statefulProcessor=processor, outputStructType=OUTPUT_SCHEMA,
        outputMode="Append", timeMode="EventTime")
