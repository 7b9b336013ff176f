"""`cep replay`: run every rule over historical events on Spark and write every alert.

Inputs are files (JSON lines, CSV, Parquet) or a Kafka range, each tagged with the stream it
carries (`--input transactions=data/`). Bounded input is one Spark **batch** job
(`cep.spark.batch.match_bounded`, docs/spark-runtime.md "Replay as a batch job"): read →
validate and fan out on the executors → shuffle by shard → sort by event time within each
partition → the embedded mode's engine over each partition, ending at the input's last event
time. No state store, no micro-batches, nothing staged: the alerts equal the embedded engine's,
whatever the shard and partition counts.

Alerts are written sorted to `--out` (JSON lines), late events and dead letters beside it.
The summary's `batches` is the number of Spark tasks that ran the engine (one per shuffle
partition that had events); `--max-files-per-trigger` no longer applies (there are no
micro-batches) and is accepted for compatibility.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cep.config import Settings
from cep.errors import CepError
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
                     f"{self.batches} engine tasks in {self.seconds:.1f} s")
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


def _files(spec: InputSpec) -> list[Path]:
    from cep.spark.batch import JSONL, TABLES

    src = Path(spec.path)
    if not src.exists():
        raise ReplayError(f"input {spec.path} does not exist")
    files = sorted(p for p in (src.rglob("*") if src.is_dir() else [src])
                   if p.is_file() and not p.name.startswith((".", "_")))
    if not files:
        raise ReplayError(f"input {spec.path} has no files")
    unknown = [p for p in files if p.suffix not in JSONL + TABLES]
    if unknown:
        raise ReplayError(f"input {spec.path}: cannot read {unknown[0].name} "
                          "(JSON lines, CSV or Parquet)")
    return files


def _raw(spark: Any, spec: InputSpec, settings: Settings, start: str | None, end: str | None,
         names: dict[str, str], plan: Any = None) -> Any:
    """The input's raw rows (`cep.spark.batch.RAW_COLUMNS`); `names` learns each file's
    resolved path → the path as given (dead letters name files as the user did)."""
    from cep.spark.batch import kafka_rows, read_files

    if spec.path.startswith("kafka:"):
        from cep.spark.kafka import kafka_reader

        topic = spec.path.removeprefix("kafka:")
        reader = kafka_reader(spark.read, settings, [topic], starting=start or "earliest",
                              ending=end or "latest")
        return kafka_rows(reader.load(), spec.stream, plan)
    files = _files(spec)
    names.update((str(p.resolve()), str(p)) for p in files)
    return read_files(spark, spec.stream, files)


@dataclass
class _Outputs:
    alerts: list[str] = field(default_factory=list)
    late: list[str] = field(default_factory=list)
    dead: list[dict[str, Any]] = field(default_factory=list)


def _gather(rows: list[Any], summary: ReplaySummary, names: dict[str, str]) -> _Outputs:
    """The job's rows (`match_bounded`), decoded on the driver into the summary and outputs."""
    from cep.runtime.alerts import AlertRow, DroppedRow, LateRow, StatsRow, decode_rows
    from cep.spark.batch import finish_dead_letter

    got = _Outputs()
    for row in rows:
        if row.kind == "dead":
            got.dead.append(finish_dead_letter(json.loads(row.payload), names))
    for r in decode_rows(row for row in rows if row.kind != "dead"):
        if isinstance(r, StatsRow):
            stats = r.info
            summary.events_read += stats["read"]
            summary.events_processed += stats["events"]
            if stats["rows"]:  # a task whose partition had events
                summary.batches += 1
            if stats["max_ts"] is not None:
                summary.max_ts = max(summary.max_ts or stats["max_ts"], stats["max_ts"])
        elif isinstance(r, LateRow):
            got.late.append(r.payload)
            summary.late += 1
        elif isinstance(r, DroppedRow):  # the partial-match cap was hit: not silent
            summary.partials_dropped += r.info["count"]
        elif isinstance(r, AlertRow):
            got.alerts.append(r.payload)
            summary.alerts[r.rule_id] += 1
    summary.dead_letters = len(got.dead)
    return got


def run_replay(
    settings: Settings, rules: str, inputs: list[InputSpec], out: str, *,
    max_files_per_trigger: int | None = None, kafka_from: str | None = None,
    kafka_to: str | None = None, work_dir: str | None = None, show_progress: bool | None = None,
) -> ReplaySummary:
    """`max_files_per_trigger` and `work_dir` are accepted for compatibility and unused: a
    replay is one batch job and stages nothing."""
    from cep.engines import RulesEngineFactory
    from cep.spark.batch import match_bounded
    from cep.spark.pipeline import plan_for
    from jobs.session import get_spark

    del max_files_per_trigger, work_dir
    factory = RulesEngineFactory.from_path(rules)
    plan = plan_for(factory.ruleset(), settings.shards)
    streams = {s.name for s in plan.streams}
    for spec in inputs:
        if spec.stream not in streams:
            raise ReplayError(f"no enabled rule reads stream {spec.stream!r} "
                              f"(rules read: {', '.join(sorted(streams)) or 'nothing'})")
    started = time.monotonic()
    summary = ReplaySummary(out=out)
    for spec in inputs:  # before Spark starts: a missing input is a one-line error
        if not spec.path.startswith("kafka:"):
            _files(spec)
    spark = get_spark(settings, "cep-replay",
                      kafka=any(s.path.startswith("kafka:") for s in inputs))
    names: dict[str, str] = {}
    raws = [_raw(spark, spec, settings, kafka_from, kafka_to, names, plan) for spec in inputs]
    raw = raws[0]
    for other in raws[1:]:
        raw = raw.unionByName(other)
    rows_df = match_bounded(raw, plan, factory, settings.shuffle_partitions)
    rows = _collect(spark, rows_df, show_progress)
    got = _gather(rows, summary, names)
    summary.seconds = time.monotonic() - started
    _write_outputs(Path(out), got)
    return summary


def _collect(spark: Any, df: Any, show: bool | None) -> list[Any]:
    """`df.collect()`, with a progress bar of the job's tasks (Spark's status tracker) on a
    terminal. The rows are few: alerts, late events, dead letters, one stats row per task."""
    if show is None:
        show = sys.stderr.isatty()
    if not show:
        return df.collect()  # type: ignore[no-any-return]
    import uuid

    group = f"cep-replay-{uuid.uuid4().hex[:8]}"
    result: dict[str, Any] = {}

    def run() -> None:
        spark.sparkContext.setJobGroup(group, "cep replay")
        try:
            result["rows"] = df.collect()
        except BaseException as exc:  # re-raised on the calling thread
            result["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    bar = _Bar()
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.25)
            bar.update(*_tasks(spark, group))
    finally:
        bar.stop()
    if "error" in result:
        raise result["error"]
    return result["rows"]  # type: ignore[no-any-return]


def _tasks(spark: Any, group: str) -> tuple[int, int]:
    """(tasks done, tasks known) over the job group's stages so far."""
    tracker = spark.sparkContext.statusTracker()
    done = total = 0
    for job in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job)
        for stage in (info.stageIds if info else []):
            st = tracker.getStageInfo(stage)
            if st is not None:
                done += st.numCompletedTasks
                total += st.numTasks
    return done, total


def _write_outputs(out: Path, got: _Outputs) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    # Sorted, canonical JSON: byte-identical for identical alert sets.
    alerts = sorted(json.dumps(json.loads(a), sort_keys=True) for a in got.alerts)
    out.write_text("".join(a + "\n" for a in alerts))
    stem = out.with_suffix("")
    Path(f"{stem}.late.jsonl").write_text("".join(sorted(x + "\n" for x in got.late)))
    dead = sorted(got.dead, key=lambda d: (str(d.get("file", d.get("topic"))),
                                           d.get("line", d.get("row", 0)) or 0,
                                           d.get("partition") or 0, d.get("offset") or 0))
    Path(f"{stem}.dead-letters.jsonl").write_text(
        "".join(json.dumps(d, sort_keys=True) + "\n" for d in dead))


class _Bar:
    def __init__(self) -> None:
        from rich.progress import Progress

        self._p = Progress(transient=True)
        self._task = self._p.add_task("replaying (Spark tasks)", total=None)
        self._p.start()

    def update(self, done: int, total: int) -> None:
        if total:
            self._p.update(self._task, completed=done, total=total)

    def stop(self) -> None:
        self._p.stop()


__all__ = ["EOF_TS", "InputSpec", "ReplayError", "ReplaySummary", "parse_input", "run_replay"]
