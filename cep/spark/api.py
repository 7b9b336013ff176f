"""The DataFrame API: `detect(df, rules="rules/")` → the alerts of `df` as a DataFrame.

For notebooks and pipelines that already have their events in Spark:

    from cep.spark import detect
    alerts = detect(spark.read.json("data/"), rules="rules/")         # batch: the batch plan
    alerts = detect(spark.readStream.schema(s).json("in/"), rules="rules/")  # streaming
    alerts.writeStream.format("delta").option("checkpointLocation", ...).start()  # your sink

What `df` holds, row by row:
- a `value` column (string or binary): the event's JSON as read (Kafka's `value`, a text file's
  lines). With Kafka's `topic`, `partition`, `offset` columns too, ties in event time are
  ordered by source position as in `cep run` (same alert ids); otherwise by content.
- otherwise, each row's columns are the event's fields (`to_json` of the row);
- a `stream` column, when present and `stream=` is not given, names each row's stream.

Every row goes through the one validator (`cep.events`): a row that is not a valid event of
its stream is not an alert (`detect_rows` returns it as a `dead` row with its reason).

A batch DataFrame runs `cep.spark.batch.match_bounded`: the alerts equal the embedded engine's
and `cep replay`'s, end of input included. A streaming DataFrame (`df.isStreaming`) runs the
live job's stateful query (`cep.spark.query.match_rules`): alerts come out as the watermark
passes them; there is no end of input.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cep.engines import RulesEngineFactory
from cep.errors import CepError
from cep.spark.live_pass import kafka_seq
from cep.spark.pipeline import Plan, plan_for

ALERT_KINDS = ("match", "timeout")
# The parsed part of an alert record (docs/alerts.md), beside its full JSON (`payload`).
ALERT_FIELDS = ("alert string, severity string, rule_version int, first_ts bigint, "
                "last_ts bigint, detected_at bigint")
DEFAULT_SHARDS = 64


class DetectError(CepError):
    pass


def detect(df: DataFrame, rules: str | Path, *, stream: str | None = None,
           shards: int = DEFAULT_SHARDS, partitions: int | None = None,
           max_partial_matches: int | None = None) -> DataFrame:
    """The alerts (matches and timeouts) of the rules in `rules` (a .cep file or a folder)
    over `df`: columns `rule_id`, `key`, `id` (the alert id), `kind`, `alert`, `severity`,
    `rule_version`, `first_ts`, `last_ts`, `detected_at` (event time, ms) and `payload` (the
    alert record's JSON, docs/alerts.md). `stream`: the stream `df` carries, needed when the
    rules read several. `shards`, `partitions` (batch: engine tasks, default the session's
    shuffle partitions) change how the work is spread, never the alerts."""
    rows = detect_rows(df, rules, stream=stream, shards=shards, partitions=partitions,
                       max_partial_matches=max_partial_matches)
    parsed = F.from_json(F.col("payload"), ALERT_FIELDS)
    return (rows.where(F.col("kind").isin(*ALERT_KINDS))
            .select("rule_id", "key", "id", "kind", parsed.alias("a"), "payload")
            .select("rule_id", "key", "id", "kind", "a.*", "payload"))


def detect_rows(df: DataFrame, rules: str | Path, *, stream: str | None = None,
                shards: int = DEFAULT_SHARDS, partitions: int | None = None,
                max_partial_matches: int | None = None) -> DataFrame:
    """Every output row (`kind`, `rule_id`, `key`, `id`, `payload`): alerts (`match`,
    `timeout`), `late` events, `dropped` partial matches, per-task `stats`, and in batch
    `dead` rows (payload: the dead letter, with its reason). `cep.runtime.alerts.decode_rows`
    reads them (after leaving out `dead`)."""
    factory = RulesEngineFactory.from_path(rules, max_partial_matches)
    plan = plan_for(factory.ruleset(), shards)
    raw = _raw(df, plan, stream, streaming=df.isStreaming)
    if df.isStreaming:
        from cep.spark.pipeline import validated
        from cep.spark.query import match_rules

        good = validated(raw.select("stream", "value", "seq"), plan)
        return match_rules(good.where(F.col("reason").isNull()), plan, factory)
    from cep.spark.batch import match_bounded

    if partitions is None:
        partitions = int(df.sparkSession.conf.get("spark.sql.shuffle.partitions") or 4)
    return match_bounded(raw, plan, factory, partitions)


def _raw(df: DataFrame, plan: Plan, stream: str | None, *, streaming: bool) -> DataFrame:
    """`df` as raw rows (`cep.spark.batch.RAW_COLUMNS`). A dead letter's position: Kafka's
    topic, partition and offset; else `row`, Spark's `monotonically_increasing_id()` + 1 of the
    row (a DataFrame has no line numbers)."""
    names = {s.name for s in plan.streams}
    if not names:
        raise DetectError("no enabled rule in the rules given")
    cols = set(df.columns)
    if stream is not None:
        if stream not in names:
            raise DetectError(f"no enabled rule reads stream {stream!r} "
                              f"(rules read: {', '.join(sorted(names))})")
        stream_col = F.lit(stream)
    elif "stream" in cols:
        stream_col = F.col("stream").cast("string")
    elif len(names) == 1:
        stream_col = F.lit(next(iter(names)))
    else:
        raise DetectError(f"the rules read several streams ({', '.join(sorted(names))}): "
                          "say which one the DataFrame carries (stream=...)")
    kafka = {"value", "topic", "partition", "offset"} <= cols
    if "value" in cols:
        value = F.col("value").cast("binary")
    else:
        fields = [c for c in df.columns if not (c == "stream" and stream is None)]
        value = F.to_json(F.struct(*[F.col(f"`{c}`") for c in fields])).cast("binary")
    if kafka:
        return df.select(stream_col.alias("stream"), value.alias("value"),
                         kafka_seq(F.col("partition"), F.col("offset"))
                         .alias("seq"), F.col("topic").cast("string").alias("src"),
                         F.col("partition").cast("bigint").alias("part"),
                         F.col("offset").cast("bigint").alias("off"),
                         F.lit("kafka").alias("form"))
    return df.select(stream_col.alias("stream"), value.alias("value"),
                     F.lit(None).cast("bigint").alias("seq"),
                     F.lit(None).cast("string").alias("src"),
                     F.lit(None).cast("bigint").alias("part"),
                     (F.lit(None) if streaming else F.monotonically_increasing_id())
                     .cast("bigint").alias("off"), F.lit("row").alias("form"))


__all__ = ["ALERT_FIELDS", "DetectError", "detect", "detect_rows"]
