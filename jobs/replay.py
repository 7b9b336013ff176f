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
from cep.events import MAX_BYTES
from cep.runtime.engine import EOF_TS


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

    @property
    def balanced(self) -> bool:
        """The accounting invariant: every record read was processed or is a dead letter, and
        late events are among the processed ones."""
        return (self.events_read == self.events_processed + self.dead_letters
                and self.late <= self.events_processed)

    def to_json(self) -> dict[str, Any]:
        return {"events_read": self.events_read, "events_processed": self.events_processed,
                "dead_letters": self.dead_letters, "late": self.late,
                "dropped_by_watermark": self.dropped_by_watermark,
                "partials_dropped": self.partials_dropped, "alerts": dict(self.alerts),
                "alerts_total": sum(self.alerts.values()), "max_ts": self.max_ts,
                "batches": self.batches, "seconds": round(self.seconds, 3), "out": self.out,
                "balanced": self.balanced}

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
        verdict = "balances" if self.balanced else "DOES NOT BALANCE"
        lines.append(f"accounting: read {self.events_read} = processed {self.events_processed}"
                     f" + dead letters {self.dead_letters} ({verdict}; late {self.late} are "
                     "among the processed)")
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


@dataclass
class _Staging:
    """Every input record, validated once (`cep.events`), then staged in event-time order."""

    plan: Any
    max_bytes: int
    events: list[tuple[int, str, str]] = field(default_factory=list)  # (ts, stream, canonical)
    dead: list[dict[str, Any]] = field(default_factory=list)
    read: int = 0
    files: int = 0

    def __post_init__(self) -> None:
        from cep.events import EventSchema

        self.schemas = {s.name: EventSchema(s.name, s.time_field,
                                            tuple(k for k in s.key_fields if k), s.schema)
                        for s in self.plan.streams}

    def add(self, stream: str, raw: bytes | None, **position: Any) -> None:
        from cep.events import dead_letter, dumps, validate_text

        self.read += 1
        text, event, ts, reason = validate_text(raw, self.schemas[stream], self.max_bytes)
        if event is None or ts is None or text is None:
            self.dead.append(dead_letter(reason or "invalid", raw, stream, **position))
        else:  # one staged line per event
            self.events.append((ts, stream, dumps(event) if "\n" in text or "\r" in text
                                else text))

    def add_lines(self, stream: str, path: Path) -> None:
        """Every line of a JSON-lines file (the hot loop of staging: kept lean)."""
        from cep.events import dead_letter, dumps, validate_text

        schema, limit, events, name = self.schemas[stream], self.max_bytes, self.events, str(path)
        read = 0
        with path.open("rb") as fh:
            for lineno, line in enumerate(fh, 1):
                raw = line.rstrip(b"\r\n")
                if not raw or raw.isspace():  # a blank line is not a record
                    continue
                read += 1
                text, event, ts, reason = validate_text(raw, schema, limit)
                if text is None or ts is None:
                    self.dead.append(dead_letter(reason or "invalid", raw, stream, file=name,
                                                 line=lineno))
                else:  # Spark's text source also splits at a lone CR: one line per event
                    events.append((ts, stream, text if "\r" not in text else dumps(event or {})))
        self.read += read

    def write(self, dest: Path, chunks: int) -> None:
        """`chunks` files of about equal size, in event-time order; a chunk never splits one
        event time, so no batching can put an event after a later one (docs/spark-runtime.md,
        "Replay order")."""
        dest.mkdir(parents=True, exist_ok=True)
        self.events.sort(key=lambda e: e[0])  # stable: ties keep their input order
        n = len(self.events)
        size = max(1, -(-n // max(1, chunks)))
        start, k = 0, 0
        while start < n:
            end = min(n, start + size)
            while end < n and self.events[end][0] == self.events[end - 1][0]:
                end += 1
            with (dest / f"{k:06d}.jsonl").open("w", encoding="utf-8") as fh:
                fh.writelines(f"{st}\t{text}\n" for _, st, text in self.events[start:end])
            start, k = end, k + 1
        self.events = []


def _stage_files(spec: InputSpec, staging: _Staging, spark: Any) -> None:
    """Validate every line (JSON lines) or row (CSV, Parquet) of the input's files."""
    src = Path(spec.path)
    if not src.exists():
        raise ReplayError(f"input {spec.path} does not exist")
    files = sorted(p for p in (src.rglob("*") if src.is_dir() else [src])
                   if p.is_file() and not p.name.startswith((".", "_")))
    if not files:
        raise ReplayError(f"input {spec.path} has no files")
    unknown = [p for p in files if p.suffix not in JSONL + (".csv", ".parquet")]
    if unknown:
        raise ReplayError(f"input {spec.path}: cannot read {unknown[0].name} "
                          "(JSON lines, CSV or Parquet)")
    for p in files:
        staging.files += 1
        if p.suffix in JSONL:
            staging.add_lines(spec.stream, p)
            continue
        from pyspark.sql import functions as F

        reader = spark.read.option("header", True).option("inferSchema", True)
        df = reader.csv(str(p)) if p.suffix == ".csv" else spark.read.parquet(str(p))
        rows = df.select(F.to_json(F.struct("*")).alias("value")).toLocalIterator()
        for i, row in enumerate(rows, 1):
            staging.add(spec.stream, row.value.encode(), file=str(p), row=i)


JSONL = (".json", ".jsonl", ".ndjson", ".txt", "")


def _stage_kafka(spec: InputSpec, staging: _Staging, spark: Any, settings: Settings,
                 start: str | None, end: str | None) -> None:
    """Validate every message of the range, with its topic, partition and offset."""
    topic = spec.path.removeprefix("kafka:")
    from cep.spark.kafka import kafka_reader

    reader = kafka_reader(spark.read, settings, [topic], starting=start or "earliest",
                          ending=end or "latest")
    df = reader.load().orderBy("partition", "offset").select(
        "topic", "partition", "offset", "value")
    staging.files += 1
    for row in df.toLocalIterator():
        raw = None if row.value is None else bytes(row.value)
        staging.add(spec.stream, raw, topic=row.topic, partition=int(row.partition),
                    offset=int(row.offset))


class _Collector:
    """foreachBatch on the driver: gathers alerts, late events and stats; drives progress."""

    def __init__(self, summary: ReplaySummary, progress: Any) -> None:
        self.summary = summary
        self.alerts: list[str] = []
        self.late: list[str] = []
        self.progress = progress

    def __call__(self, df: Any, batch_id: int) -> None:
        from cep.runtime.alerts import AlertRow, DroppedRow, LateRow, StatsRow, decode_rows

        self.summary.batches += 1
        for row in decode_rows(df.toLocalIterator()):
            if isinstance(row, StatsRow):
                stats = row.info
                self.summary.events_processed += stats["events"]
                if stats["max_ts"] is not None:
                    self.summary.max_ts = max(self.summary.max_ts or stats["max_ts"],
                                              stats["max_ts"])
                if self.progress is not None:
                    self.progress.advance(stats["events"])
            elif isinstance(row, LateRow):
                self.late.append(row.payload)
                self.summary.late += 1
            elif isinstance(row, DroppedRow):  # the partial-match cap was hit: not silent
                self.summary.partials_dropped += row.info["count"]
            elif isinstance(row, AlertRow):
                self.alerts.append(row.payload)
                self.summary.alerts[row.rule_id] += 1


def _raw_lines(lines: Any) -> Any:
    """Staged lines (`STREAM<TAB>canonical JSON`) as (stream, value, seq). Files carry no
    source position the engine could order by, so seq is left to the operator (a content
    hash); dead letters were already taken out, with their positions, when staging."""
    from pyspark.sql import functions as F

    parts = F.split(F.col("value"), "\t", 2)
    return lines.select(parts.getItem(0).alias("stream"), parts.getItem(1).alias("value"),
                        F.lit(None).cast("bigint").alias("seq"))


def _stream_query(spark: Any, staged: Path, plan: Any, factory: Any, checkpoint: Path,
                  collector: _Collector, max_files: int | None, end_of_input: int | None) -> Any:
    from pyspark.sql import functions as F

    from cep.spark.pipeline import validated
    from cep.spark.query import match_rules

    reader = spark.readStream.format("text")
    if max_files:
        reader = reader.option("maxFilesPerTrigger", max_files)
    raw = _raw_lines(reader.load(str(staged / "*")))
    # The staged events are valid (staging validated them); they go through the same
    # validator again because that is the one way into the plan (cheap on canonical text).
    good = validated(raw, plan).where(F.col("reason").isNull())
    out = match_rules(good, plan, factory, end_of_input)
    return (out.writeStream.foreachBatch(collector)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True).start())


def run_replay(
    settings: Settings, rules: str, inputs: list[InputSpec], out: str, *,
    max_files_per_trigger: int | None = None, kafka_from: str | None = None,
    kafka_to: str | None = None, work_dir: str | None = None, show_progress: bool | None = None,
) -> ReplaySummary:
    from cep.engines import RulesEngineFactory
    from cep.spark.pipeline import EOF_STREAM, plan_for
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
    staging = _Staging(plan, MAX_BYTES)
    for spec in inputs:
        if spec.path.startswith("kafka:"):
            _stage_kafka(spec, staging, spark, settings, kafka_from, kafka_to)
        else:
            _stage_files(spec, staging, spark)
    staging.write(staged, staging.files)
    _order_mtimes(staged)
    dead = staging.dead
    summary.events_read, summary.dead_letters = staging.read, len(dead)
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
            (staged / "999999-end.jsonl").write_text(f"{EOF_STREAM}\t{{}}\n")
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
    for i, p in enumerate(sorted(staged.iterdir())):
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
