"""The Spark plan shared by replay and the live job.

raw rows (stream, value, seq, source)  ──parse──►  good events ──fan-out──► shard ──► operator
                                                └► bad events (reason) → dead letters

- Parsing and validation run in the JVM (no Python per event): malformed JSON, a missing or
  unreadable time field, a missing key field, or a value of the wrong type for the stream's
  declared schema make a row *bad*, with a reason.
- Fan-out: one row per (event, key field used by the stream's rules); rules that share a key
  field share the row. The grouping key is `shard = pmod(xxhash64(field, key), shards)`.
- Watermark delay D = the largest allowed lateness; the operator computes each rule's own
  watermark from it (docs/spark-runtime.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cep.nfa import RuleSet, StreamSpec
from cep.runtime.engine import EOF_TS

SPARK_TYPES = {"STRING": "string", "INT": "bigint", "FLOAT": "double", "BOOL": "boolean"}
EOF_STREAM = "__end_of_input__"


@dataclass(frozen=True)
class StreamPlan:
    name: str
    time_field: str
    lateness_ms: int
    key_fields: tuple[str, ...]
    schema: tuple[tuple[str, str], ...] = ()  # (field, STRING|INT|FLOAT|BOOL) when declared


@dataclass(frozen=True)
class Plan:
    streams: tuple[StreamPlan, ...]
    shards: int

    @property
    def watermark_delay_ms(self) -> int:
        return max((s.lateness_ms for s in self.streams), default=0)

    def stream(self, name: str) -> StreamPlan:
        for s in self.streams:
            if s.name == name:
                return s
        raise KeyError(name)


def plan_for(ruleset: RuleSet, shards: int) -> Plan:
    specs: dict[str, StreamSpec] = {}
    keys: dict[str, list[str]] = {}
    for rule in ruleset.rules:
        if not rule.enabled:
            continue
        specs.setdefault(rule.stream.name, rule.stream)
        kf = rule.key_field or ""
        if kf not in keys.setdefault(rule.stream.name, []):
            keys[rule.stream.name].append(kf)
    streams = tuple(
        StreamPlan(
            name, spec.time_field, spec.lateness_ms, tuple(keys[name]),
            tuple((f.name, f.type) for f in spec.fields or ()),
        )
        for name, spec in sorted(specs.items())
    )
    return Plan(streams, shards)


def _field(fields: Column, name: str) -> Column:
    return fields.getItem(name)


def parse(raw: DataFrame, plan: Plan) -> DataFrame:
    """Adds `ts` (epoch ms), `fields` (map) and `reason` (null when the event is good)."""
    fields = F.from_json(F.col("value"), "map<string,string>")
    df = raw.withColumn("fields", fields)
    reason: Column = F.when(F.col("fields").isNull(), F.lit("malformed JSON: not a JSON object"))
    ts: Column = F.lit(None).cast("bigint")
    known = [s.name for s in plan.streams]
    reason = reason.when(~F.col("stream").isin(known) & (F.col("stream") != EOF_STREAM),
                         F.concat(F.lit("unknown stream "), F.col("stream")))
    for s in plan.streams:
        is_s = F.col("stream") == s.name
        raw_ts = _field(F.col("fields"), s.time_field)
        as_long = F.expr(f"try_cast(fields['{_q(s.time_field)}'] as bigint)")
        as_iso = F.expr(f"unix_millis(try_to_timestamp(fields['{_q(s.time_field)}']))")
        ts = F.when(is_s, F.coalesce(as_long, as_iso)).otherwise(ts)
        reason = reason.when(is_s & raw_ts.isNull(),
                             F.lit(f"missing time field '{s.time_field}'"))
        reason = reason.when(is_s & as_long.isNull() & as_iso.isNull(),
                             F.lit(f"time field '{s.time_field}' is neither epoch milliseconds "
                                   "nor an ISO-8601 timestamp"))
        for kf in s.key_fields:
            if kf:
                reason = reason.when(is_s & _field(F.col("fields"), kf).isNull(),
                                     F.lit(f"missing key field '{kf}'"))
        for name, typ in s.schema:
            if typ == "STRING" or name == s.time_field:
                continue
            value = _field(F.col("fields"), name)
            cast = F.expr(f"try_cast(fields['{_q(name)}'] as {SPARK_TYPES[typ]})")
            reason = reason.when(is_s & value.isNotNull() & cast.isNull(),
                                 F.lit(f"field '{name}' is not of type {typ}"))
    ts = F.when(F.col("stream") == EOF_STREAM, F.lit(EOF_TS)).otherwise(ts)
    reason = F.when(F.col("stream") == EOF_STREAM, F.lit(None)).otherwise(reason)
    return df.withColumn("ts", ts).withColumn("reason", reason)


def fan_out(events: DataFrame, plan: Plan) -> DataFrame:
    """One row per (event, key field); adds `shard` and the watermark's `event_time`."""
    per_stream = F.array().cast("array<string>")
    for s in plan.streams:
        per_stream = F.when(F.col("stream") == s.name,
                            F.array(*[F.lit(k) for k in s.key_fields])).otherwise(per_stream)
    per_stream = F.when(F.col("stream") == EOF_STREAM, F.array(F.lit(""))).otherwise(per_stream)
    out = events.select("*", F.posexplode(per_stream).alias("kf_pos", "key_field"))
    key = F.when(F.col("key_field") == "", F.lit("")).otherwise(
        F.element_at(F.col("fields"), F.col("key_field")))
    shard = F.pmod(F.xxhash64(F.col("key_field"), key), F.lit(plan.shards)).cast("int")
    # `primary`: the event's first fan-out row, so that counts see each event once.
    return (out.withColumn("shard", shard)
            .withColumn("event_time", F.timestamp_millis(F.col("ts")))
            .select("shard", "stream", "ts", "seq", F.col("value").alias("data"), "key_field",
                    ((F.col("kf_pos") == 0) & (F.col("stream") != EOF_STREAM)).alias("primary"),
                    "event_time"))


def _q(name: str) -> str:
    if "'" in name or "\\" in name:
        raise ValueError(f"field name {name!r} cannot be used")
    return name
