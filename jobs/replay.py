"""`cep replay`: run every rule over historical events on Spark and write every alert.

Inputs are files (JSON lines, CSV, Parquet) or a Kafka range, each tagged with the stream it
carries (`--input transactions=data/`). Kafka ranges and CSV/Parquet are first written to JSON
lines in a staging folder, so every replay runs the same streaming plan as the live job:

1. the query runs to completion with `availableNow` (batch size: `--max-files-per-trigger`);
2. an end-of-input marker file is added and the same query runs again from its checkpoint, so
   every shard flushes at the input's last event time (docs/spark-runtime.md).

Alerts are written sorted to `--out` (JSON lines), late events and dead letters beside it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cep.config import Settings
from cep.errors import CepError
from cep.runtime.engine import EOF_TS

EOF_LINE = json.dumps({"__end_of_input__": True})


class ReplayError(CepError):
    pass


@dataclass
class ReplaySummary:
    events_read: int = 0
    events_processed: int = 0
    alerts: Counter[str] = field(default_factory=Counter)
    late: int = 0
    dead_letters: int = 0
    dropped_by_watermark: int = 0
    partials_dropped: int = 0
    max_ts: int | None = None
    batches: int = 0
    seconds: float = 0.0
    out: str = ""

    def table(self) -> str:
        lines = [f"{'rule':<28} {'alerts':>8}"]
        for rule, n in sorted(self.alerts.items()):
            lines.append(f"{rule:<28} {n:>8}")
        lines.append(f"{'(total)':<28} {sum(self.alerts.values()):>8}")
        lines.append("")
        lines.append(f"events read {self.events_read}, processed {self.events_processed}, "
                     f"late {self.late}, dead letters {self.dead_letters}, "
                     f"dropped by watermark {self.dropped_by_watermark}, "
                     f"partial matches dropped at the cap {self.partials_dropped}; "
                     f"{self.batches} micro-batches in {self.seconds:.1f} s")
        return "\n".join(lines)


@dataclass(frozen=True)
class InputSpec:
    stream: str
    path: str  # a file, a folder, or kafka:TOPIC


def parse_input(text: str, default_stream: str | None) -> InputSpec:
    stream, sep, path = text.partition("=")
    if not sep:
        if default_stream is None:
            raise ReplayError(f"input {text!r}: say which stream it carries, as STREAM=PATH")
        stream, path = default_stream, text
    return InputSpec(stream, path)


def _stage_files(spec: InputSpec, dest: Path, spark: Any) -> int:
    """Link (or convert) the input's files into dest; returns the number of events."""
    src = Path(spec.path)
    if not src.exists():
        raise ReplayError(f"input {spec.path} does not exist")
    files = sorted(p for p in (src.rglob("*") if src.is_dir() else [src])
                   if p.is_file() and not p.name.startswith((".", "_")))
    if not files:
        raise ReplayError(f"input {spec.path} has no files")
    dest.mkdir(parents=True, exist_ok=True)
    jsonl = [p for p in files if p.suffix in (".json", ".jsonl", ".ndjson", ".txt", "")]
    other = [p for p in files if p not in jsonl]
    count = 0
    first = len(list(dest.iterdir()))
    for i, p in enumerate(jsonl):
        target = dest / f"{first + i:06d}-{p.name}"
        shutil.copyfile(p, target)
        with p.open("rb") as fh:
            count += sum(1 for line in fh if line.strip())
    first += len(jsonl)
    for kind in ("csv", "parquet"):
        paths = [str(p) for p in other if p.suffix == f".{kind}"]
        if not paths:
            continue
        reader = spark.read.option("header", True).option("inferSchema", True)
        df = reader.csv(paths) if kind == "csv" else spark.read.parquet(*paths)
        from pyspark.sql import functions as F

        tmp = dest.parent / f".{dest.name}-{kind}"
        df.select(F.to_json(F.struct("*")).alias("value")).write.mode("overwrite").text(str(tmp))
        for j, part in enumerate(sorted(tmp.glob("part-*"))):
            shutil.move(str(part), dest / f"{first + j:06d}-{kind}.jsonl")
        first += j + 1
        shutil.rmtree(tmp)
        count += df.count()
    unknown = [p for p in other if p.suffix not in (".csv", ".parquet")]
    if unknown:
        raise ReplayError(f"input {spec.path}: cannot read {unknown[0].name} "
                          "(JSON lines, CSV or Parquet)")
    return count


def _stage_kafka(spec: InputSpec, dest: Path, spark: Any, settings: Settings,
                 start: str | None, end: str | None) -> int:
    topic = spec.path.removeprefix("kafka:")
    reader = (spark.read.format("kafka")
              .option("kafka.bootstrap.servers", settings.kafka_bootstrap)
              .option("subscribe", topic)
              .option("startingOffsets", start or "earliest")
              .option("endingOffsets", end or "latest"))
    for k, v in settings.kafka_options:
        reader = reader.option(f"kafka.{k}", v)
    from pyspark.sql import functions as F

    df = reader.load().orderBy("partition", "offset").select(
        F.col("value").cast("string").alias("value"))
    tmp = dest.parent / f".{dest.name}-kafka"
    df.coalesce(1).write.mode("overwrite").text(str(tmp))
    dest.mkdir(parents=True, exist_ok=True)
    for j, part in enumerate(sorted(tmp.glob("part-*"))):
        shutil.move(str(part), dest / f"{j:06d}-kafka.jsonl")
    shutil.rmtree(tmp)
    return int(df.count())


class _Collector:
    """foreachBatch on the driver: gathers alerts, late events and stats; drives progress."""

    def __init__(self, summary: ReplaySummary, progress: Any) -> None:
        self.summary = summary
        self.alerts: list[str] = []
        self.late: list[str] = []
        self.progress = progress

    def __call__(self, df: Any, batch_id: int) -> None:
        self.summary.batches += 1
        for row in df.toLocalIterator():
            if row.kind == "stats":
                stats = json.loads(row.payload)
                self.summary.events_processed += stats["events"]
                if stats["max_ts"] is not None:
                    self.summary.max_ts = max(self.summary.max_ts or stats["max_ts"],
                                              stats["max_ts"])
                if self.progress is not None:
                    self.progress.advance(stats["events"])
            elif row.kind == "late":
                self.late.append(row.payload)
                self.summary.late += 1
            elif row.kind == "dropped":  # the partial-match cap was hit: reported, not silent
                self.summary.partials_dropped += json.loads(row.payload)["count"]
            else:
                self.alerts.append(row.payload)
                self.summary.alerts[row.rule_id] += 1


def _raw_lines(lines: Any) -> Any:
    """Staged text lines as (stream, value, seq): the stream is the staged folder's name; files
    carry no source position, so seq is left to the operator (a content hash)."""
    from pyspark.sql import functions as F

    return lines.select(
        F.regexp_extract(F.input_file_name(), r"/([^/]+)/[^/]+$", 1).alias("stream"),
        F.col("value"), F.lit(None).cast("bigint").alias("seq"),
    ).where(F.length(F.trim("value")) > 0)


def _stream_query(spark: Any, staged: Path, plan: Any, factory: Any, checkpoint: Path,
                  collector: _Collector, max_files: int | None, end_of_input: int | None) -> Any:
    from pyspark.sql import functions as F

    from cep.runtime.alerts import output_rows
    from cep.spark.operator import OUTPUT_SCHEMA, CepProcessor
    from cep.spark.pipeline import fan_out, parse

    reader = spark.readStream.format("text")
    if max_files:
        reader = reader.option("maxFilesPerTrigger", max_files)
    raw = _raw_lines(reader.load(str(staged / "*" / "*")))
    good = parse(raw, plan).where(F.col("reason").isNull())
    delay = f"{plan.watermark_delay_ms} milliseconds"
    # The watermark is computed from event_time; the column itself is not handed to the
    # operator (so Spark does not drop late rows there: the engine reports them instead).
    rows = fan_out(good, plan).withWatermark("event_time", delay).drop("event_time")
    processor = CepProcessor(factory, output_rows, plan.watermark_delay_ms, end_of_input)
    out = rows.groupBy("shard").transformWithStateInPandas(
        statefulProcessor=processor, outputStructType=OUTPUT_SCHEMA,
        outputMode="Append", timeMode="EventTime")
    return (out.writeStream.foreachBatch(collector)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True).start())


def _dead_letters(spark: Any, staged: Path, plan: Any) -> list[dict[str, Any]]:
    from pyspark.sql import functions as F

    from cep.spark.pipeline import parse

    raw = _raw_lines(spark.read.text(str(staged / "*" / "*")))
    bad = parse(raw, plan).where(F.col("reason").isNotNull())
    return [{"stream": r.stream, "reason": r.reason, "value": r.value}
            for r in bad.select("stream", "reason", "value").collect()]


def run_replay(
    settings: Settings, rules: str, inputs: list[InputSpec], out: str, *,
    max_files_per_trigger: int | None = None, kafka_from: str | None = None,
    kafka_to: str | None = None, work_dir: str | None = None, show_progress: bool | None = None,
) -> ReplaySummary:
    from cep.spark.pipeline import EOF_STREAM, plan_for
    from cep.spark.rules import RulesEngineFactory
    from jobs.session import get_spark

    factory = RulesEngineFactory.from_path(rules)
    ruleset = factory.ruleset()
    plan = plan_for(ruleset, settings.shards)
    streams = {s.name for s in plan.streams}
    for spec in inputs:
        if spec.stream not in streams:
            raise ReplayError(f"no enabled rule reads stream {spec.stream!r} "
                              f"(rules read: {', '.join(sorted(streams)) or 'nothing'})")
    started = time.monotonic()
    summary = ReplaySummary(out=out)
    work = Path(work_dir or f"{out}.work")
    shutil.rmtree(work, ignore_errors=True)
    staged = work / "input"
    spark = get_spark(settings, "cep-replay",
                      kafka=any(s.path.startswith("kafka:") for s in inputs))
    # getOrCreate may hand back a running session: apply the partition count explicitly.
    spark.conf.set("spark.sql.shuffle.partitions", str(settings.shuffle_partitions))
    for spec in inputs:
        dest = staged / spec.stream
        if spec.path.startswith("kafka:"):
            summary.events_read += _stage_kafka(spec, dest, spark,
                                                settings, kafka_from, kafka_to)
        else:
            summary.events_read += _stage_files(spec, dest, spark)

    _order_mtimes(staged)
    dead = _dead_letters(spark, staged, plan)
    summary.dead_letters = len(dead)
    progress = _progress(summary.events_read - len(dead), show_progress)
    collector = _Collector(summary, progress)
    checkpoint = work / "checkpoint"
    try:
        q = _stream_query(spark, staged, plan, factory, checkpoint, collector,
                          max_files_per_trigger, None)
        q.awaitTermination()
        _raise_if_failed(q)
        summary.dropped_by_watermark += _dropped(q)
        if summary.max_ts is not None:
            # End of input: a marker far in event time, then the same query once more.
            eof_dir = staged / EOF_STREAM
            eof_dir.mkdir(parents=True)
            (eof_dir / "end.jsonl").write_text(EOF_LINE + "\n")
            q = _stream_query(spark, staged, plan, factory, checkpoint, collector,
                              max_files_per_trigger, summary.max_ts)
            q.awaitTermination()
            _raise_if_failed(q)
    finally:
        if progress is not None:
            progress.stop()
    summary.seconds = time.monotonic() - started
    _write_outputs(Path(out), collector, dead)
    return summary


def _order_mtimes(staged: Path) -> None:
    """Spark's file source takes files oldest first: make that the staged name order."""
    base = time.time() - 86_400
    for i, p in enumerate(sorted(staged.rglob("*"))):
        if p.is_file():
            os.utime(p, (base + i, base + i))


def _raise_if_failed(q: Any) -> None:
    exc = q.exception()
    if exc is not None:
        raise ReplayError(f"the replay query failed: {exc}")


def _dropped(q: Any) -> int:
    """Rows Spark itself dropped as late (0 by design: see docs/spark-runtime.md)."""
    return sum(int(op.numRowsDroppedByWatermark or 0)
               for p in q.recentProgress for op in (p.stateOperators or []))


def _write_outputs(out: Path, collector: _Collector, dead: list[dict[str, Any]]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    # Sorted, canonical JSON: byte-identical for identical alert sets.
    alerts = sorted(json.dumps(json.loads(a), sort_keys=True) for a in collector.alerts)
    out.write_text("".join(a + "\n" for a in alerts))
    stem = out.with_suffix("")
    Path(f"{stem}.late.jsonl").write_text("".join(sorted(x + "\n" for x in collector.late)))
    Path(f"{stem}.dead-letters.jsonl").write_text(
        "".join(json.dumps(d, sort_keys=True) + "\n" for d in dead))


class _Bar:
    def __init__(self, total: int) -> None:
        from rich.progress import Progress

        self._p = Progress(transient=True)
        self._task = self._p.add_task("replaying", total=max(total, 1))
        self._p.start()

    def advance(self, n: int) -> None:
        self._p.update(self._task, advance=n)

    def stop(self) -> None:
        self._p.stop()


def _progress(total: int, show: bool | None) -> _Bar | None:
    if show is None:
        show = sys.stderr.isatty()
    return _Bar(total) if show else None


__all__ = ["EOF_TS", "InputSpec", "ReplayError", "ReplaySummary", "parse_input", "run_replay"]
