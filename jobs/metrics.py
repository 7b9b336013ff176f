"""Per-batch metrics of the live job: logged, and written as JSON (and Prometheus text) files.

Counters come from the operator's stats rows and the delivery step; rates, watermark and state
size come from Spark's query progress (a StreamingQueryListener).

Per rule (`rules_live` in the JSON, `cep_rule_*` in the Prometheus text), read by the console's
Rules view:
- alerts: total, per minute over the last 5 minutes, and in the last hour, counted as the
  delivery step routes them (`count_alert`);
- live partial matches: the operator's stats rows may carry `partial_matches`, a map rule id →
  the change in that rule's live partial matches over the call (the engine's delta). The deltas
  of a micro-batch are applied once, when its delivery completes (`on_batch` of the `alerts`
  query) and only if that batch id is newer than the last one applied; the total and that batch
  id are kept in metrics.json and read back when the job restarts on the same checkpoint, so a
  batch that Spark runs again after a crash is not counted twice. Rules that are no longer
  running are dropped from the count.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("cep.metrics")

RATE_WINDOW_S = 300  # alerts per minute are averaged over the last 5 minutes
HOUR_S = 3600


def kafka_offsets(text: Any) -> dict[tuple[str, str], int] | None:
    """A source's offsets as Spark's Kafka JSON (`{"topic": {"0": 42}}`, text or parsed) →
    {(topic, partition): offset}; None for anything else."""
    try:
        got = json.loads(text) if isinstance(text, str) else text
        return {(str(t), str(p)): int(o) for t, parts in got.items() for p, o in parts.items()}
    except (TypeError, ValueError, AttributeError):
        return None


def _source_ends(sources: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
    return {k: v for s in sources for k, v in (kafka_offsets(s.get("endOffset")) or {}).items()}


def offset_records(sources: list[dict[str, Any]],
                   last_ends: dict[tuple[str, str], int] | None) -> int | None:
    """A batch's Kafka records from its progress report's offset ranges: per topic partition,
    the end offset less the start (the report's `startOffset`, else the previous report's end).
    Transaction markers in a range count as records, as offsets do. None where a partition's
    start is not known (the job's first batch of a new checkpoint, when Spark reports none)."""
    starts = {k: v for s in sources
              for k, v in (kafka_offsets(s.get("startOffset")) or {}).items()}
    total = 0
    for k, end in _source_ends(sources).items():
        start = starts.get(k, (last_ends or {}).get(k))
        if start is None:
            return None
        total += max(0, end - start)
    return total


class Metrics:
    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.clock = clock
        self.counters: Counter[str] = Counter()
        self.queries: dict[str, dict[str, Any]] = {}
        self.rules: dict[str, str] = {}
        self.rule_files: dict[str, dict[str, Any]] = {}
        # Per rule: alerts in all, and (minute, count) buckets of the last hour.
        self.rule_alerts: Counter[str] = Counter()
        self._alert_minutes: dict[str, deque[list[int]]] = {}
        # Has anything called count_alert: until then (a router that only calls
        # count("alerts")) there are no per-rule alert figures, rather than zeros.
        self.alerts_per_rule = False
        # Live partial matches per rule: applied totals, the last batch applied, and the deltas
        # of the batch being delivered (applied by `on_batch`).
        self.partials: Counter[str] = Counter()
        self.partials_batch = -1
        self.partials_seen = False  # has any stats row carried `partial_matches`
        self._pending_partials: Counter[str] = Counter()
        # The input rows are packs (`live_source` "python"), not records: `events_read` is then
        # the operator's events plus the dead letters, as the records come out of the pass.
        self.events_read_from_operator = False
        self._last_ends: dict[str, dict[tuple[str, str], int]] = {}  # per query
        self._lock = threading.Lock()
        # Both queries' foreachBatch threads and the progress listener write: one at a time.
        self._write_lock = threading.Lock()
        self._restore()

    def _restore(self) -> None:
        """The live partial-match totals of the previous run on this checkpoint (a gauge built
        from deltas must go on from where it was, unlike the counters, which restart at 0)."""
        try:
            old = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        saved = old.get("partial_matches") if isinstance(old, dict) else None
        if isinstance(saved, dict) and isinstance(saved.get("by_rule"), dict):
            self.partials = Counter({str(k): int(v) for k, v in saved["by_rule"].items()})
            self.partials_batch = int(saved.get("batch", -1))
            self.partials_seen = True

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counters[name] += n
            if name == "dead_letters" and self.events_read_from_operator:
                self.counters["events_read"] += n

    def count_alert(self, rule_id: str, n: int = 1) -> None:
        """An alert (match or timeout) of `rule_id` routed for delivery: counts `alerts` as
        `count("alerts")` does, and the rule's own total and per-minute buckets."""
        minute = int(self.clock() // 60)
        with self._lock:
            self.alerts_per_rule = True
            self.counters["alerts"] += n
            self.rule_alerts[rule_id] += n
            buckets = self._alert_minutes.setdefault(rule_id, deque())
            if buckets and buckets[-1][0] == minute:
                buckets[-1][1] += n
            else:
                buckets.append([minute, n])
            while buckets and buckets[0][0] <= minute - HOUR_S // 60:
                buckets.popleft()

    def add_stats(self, stats: dict[str, Any]) -> None:
        with self._lock:
            for k in ("events", "late", "keys_touched", "keys_released", "state_writes",
                      "state_reads", "state_reloads", "state_catchups", "load_us", "read_us",
                      "state_compactions", "python_us",
                      "rows_in_us", "prepare_us", "engine_us", "store_us", "timer_us",
                      "encode_us", "write_us", "init_us", "unzip_us", "import_us", "reload_us",
                      "state_shared_rows", "state_budget_none"):
                self.counters[k] += int(stats.get(k) or 0)
            if self.events_read_from_operator:
                self.counters["events_read"] += int(stats.get("events") or 0)
            deltas = stats.get("partial_matches")
            if isinstance(deltas, dict):
                self.partials_seen = True
                for rule, d in deltas.items():
                    self._pending_partials[str(rule)] += int(d or 0)

    def set_rules(self, versions: dict[str, str]) -> None:
        with self._lock:
            self.rules = dict(versions)
            for gone in set(self.partials) - set(self.rules):
                del self.partials[gone]  # its state is dropped by the engine
        self.write()

    def rules_live(self) -> dict[str, dict[str, Any]]:
        """Per rule: alerts (total, per minute over the last 5 minutes, last hour) once the
        router counts them per rule (`count_alert`), and live partial matches once the operator
        reports them; a figure nobody feeds is absent, not 0."""
        now_min = int(self.clock() // 60)
        with self._lock:
            names = set(self.rules) | set(self.rule_alerts) | set(self.partials)
            out: dict[str, dict[str, Any]] = {}
            for rule in sorted(names):
                buckets = self._alert_minutes.get(rule, ())
                hour = sum(c for m, c in buckets if m > now_min - HOUR_S // 60)
                recent = sum(c for m, c in buckets if m > now_min - RATE_WINDOW_S // 60)
                entry: dict[str, Any] = {}
                if self.alerts_per_rule:
                    entry.update(alerts=self.rule_alerts.get(rule, 0), alerts_last_hour=hour,
                                 alerts_per_min=round(recent / (RATE_WINDOW_S / 60), 3))
                if self.partials_seen:
                    entry["partial_matches"] = max(0, self.partials.get(rule, 0))
                out[rule] = entry
            return out

    def set_rule_files(self, files: dict[str, dict[str, Any]]) -> None:
        """Per rules file: accepted or rejected (with its errors), and which text runs."""
        with self._lock:
            self.rule_files = {k: dict(v) for k, v in files.items()}
        self.write()

    def on_batch(self, query: str) -> Callable[[int, dict[str, Any]], None]:
        def record(batch_id: int, info: dict[str, Any]) -> None:
            with self._lock:
                q = self.queries.setdefault(query, {})
                q["last_batch"] = batch_id
                q["last_delivery"] = info
                if query == "alerts":  # the batch's partial-match deltas, once per batch id
                    if batch_id > self.partials_batch:
                        self.partials.update(self._pending_partials)
                        self.partials_batch = batch_id
                    self._pending_partials.clear()
                self.counters[_metric_name(f"{query}_records")] += int(info.get("records", 0))
            self.write()
        return record

    def on_progress(self, progress: dict[str, Any]) -> None:
        name = progress.get("name") or "query"
        ops = progress.get("stateOperators") or [{}]
        event_time = progress.get("eventTime") or {}
        with self._lock:
            # every input record, good or bad, passes the alerts query (its input rows are
            # packs with the Python Kafka source: then counted from the operator's stats)
            if name == "alerts" and not self.events_read_from_operator:
                self.counters["events_read"] += int(progress.get("numInputRows") or 0)
            q = self.queries.setdefault(name, {})
            rows = progress.get("numInputRows")
            rates = {k: progress.get(k) for k in ("inputRowsPerSecond", "processedRowsPerSecond")}
            if self.events_read_from_operator:
                # Spark's input rows are the Python source's packs: the batch's records are
                # its offset ranges (`offset_records`), the rates scaled to them (None: not known).
                records = offset_records(progress.get("sources") or [],
                                         self._last_ends.get(name))
                self._last_ends[name] = _source_ends(progress.get("sources") or [])
                scale = records / rows if records is not None and rows else 0.0
                rates = {k: v * scale if isinstance(v, (int, float)) and records is not None
                         else None for k, v in rates.items()}
                rows = records
            q.update(
                batch=progress.get("batchId"),
                # When the trigger started (ISO, UTC): with batch_ms, when the batch ran.
                started=progress.get("timestamp"),
                input_rows=rows,
                input_rows_per_s=rates["inputRowsPerSecond"],
                processed_rows_per_s=rates["processedRowsPerSecond"],
                batch_ms=(progress.get("durationMs") or {}).get("triggerExecution"),
                # Where the batch's time went (addBatch, getBatch, latestOffset, walCommit...).
                durations_ms=progress.get("durationMs"),
                watermark=event_time.get("watermark"),
                max_event_time=event_time.get("max"),
                # Not counted (`trackTotalNumberOfRows=false`, jobs/session.py): Spark says 0;
                # shown as unknown, not as an empty state.
                state_rows=ops[0].get("numRowsTotal") or None,
                state_bytes=ops[0].get("memoryUsedBytes"),
                dropped_by_watermark=ops[0].get("numRowsDroppedByWatermark"),
                # The state store's share of the batch (ms): writing updates, committing (the
                # RocksDB changelog), and its own figures (rocksdb* latencies and sizes).
                state_ms={k: ops[0].get(k) for k in ("allUpdatesTimeMs", "commitTimeMs",
                                                     "allRemovalsTimeMs")
                          if ops[0].get(k) is not None},
                state_custom=ops[0].get("customMetrics"),
                sources=[{"end": s.get("endOffset")} for s in progress.get("sources", [])],
            )
            # The log's copy also carries the counters (the operator's stats summed over the
            # job so far, this batch's included: its delivery ran first), so that a batch's
            # operator figures can be read from the log (bench.latency's per-batch detail).
            logged = {**self.queries[name], "counters": dict(self.counters)}
        log.info("progress %s", json.dumps(logged, default=str))
        self.write()

    def snapshot(self) -> dict[str, Any]:
        live = self.rules_live()
        with self._lock:
            snap = {"time": self.clock(), "counters": dict(self.counters),
                    "queries": json.loads(json.dumps(self.queries, default=str)),
                    "rules": dict(self.rules),
                    "rules_files": json.loads(json.dumps(self.rule_files, default=str)),
                    "rules_live": live}
            if self.partials_seen:
                snap["partial_matches"] = {"by_rule": dict(self.partials),
                                           "batch": self.partials_batch}
            return snap

    def write(self) -> None:
        """Never raises: metrics must not be able to stop the job."""
        try:
            with self._write_lock:
                self._write()
        except OSError as exc:
            log.warning("could not write metrics to %s: %s", self.path, exc)

    def _write(self) -> None:
        snap = self.snapshot()
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(snap, indent=1, sort_keys=True))
        os.replace(tmp, self.path)
        prom = self.path.with_suffix(".prom")
        lines = []
        for k, v in sorted(snap["counters"].items()):
            name = _metric_name(f"cep_{k}_total")
            lines.append(f"# TYPE {name} counter\n{name} {v}")
        for qname, q in sorted(snap["queries"].items()):
            for k in ("input_rows_per_s", "processed_rows_per_s", "state_rows", "state_bytes"):
                if isinstance(q.get(k), int | float):
                    lines.append(f'cep_{k}{{query="{_label(qname)}"}} {q[k]}')
        files = snap["rules_files"]
        if files:
            lines.append("# TYPE cep_rules_file_accepted gauge")
            for path, f in sorted(files.items()):
                ok = 1 if f.get("status") == "accepted" else 0
                lines.append(f'cep_rules_file_accepted{{file="{_label(path)}"}} {ok}')
            rejected = sum(1 for f in files.values() if f.get("status") != "accepted")
            lines.append(f"# TYPE cep_rules_files_rejected gauge\ncep_rules_files_rejected "
                         f"{rejected}")
        lines.append(f"# TYPE cep_rules_running gauge\ncep_rules_running {len(snap['rules'])}")
        live = snap["rules_live"]
        for name, field, kind in (("cep_rule_alerts_total", "alerts", "counter"),
                                  ("cep_rule_alerts_per_minute", "alerts_per_min", "gauge"),
                                  ("cep_rule_partial_matches", "partial_matches", "gauge")):
            rows = [(r, v[field]) for r, v in sorted(live.items()) if field in v]
            if rows:
                lines.append(f"# TYPE {name} {kind}")
                lines += [f'{name}{{rule="{_label(r)}"}} {n}' for r, n in rows]
        tmp = prom.with_suffix(".ptmp")
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, prom)

    def attach(self, spark: Any) -> Any:
        """Receive the session's query progress (`on_progress`): a listener the JVM calls back
        through py4j, taking each report as one JSON string (`ProgressListener`). Returns the
        JVM listener (for `spark._jsparkSession.streams().removeListener`)."""
        from pyspark.java_gateway import ensure_callback_server_started

        sc = spark.sparkContext
        ensure_callback_server_started(sc._gateway)
        wrapper = sc._jvm.org.apache.spark.sql.streaming.PythonStreamingQueryListenerWrapper(
            ProgressListener(self))
        spark._jsparkSession.streams().addListener(wrapper)
        return wrapper


class ProgressListener:
    """Spark's Python streaming listener interface, implemented directly (py4j callback).

    PySpark's `StreamingQueryListener` turns each progress report into Python objects field by
    field: about a hundred py4j calls per micro-batch, some of which (`is_instance_of`, the
    `jvm.…` lookups) make py4j look for a class by a package name through every jar of the
    class path. Profiled in the live job (session 13, JFR at 1,000 events/s): that listener's
    thread was ~27% of the driver JVM's CPU samples, 25% in py4j's class lookups. Here each
    report is two calls: `progress()`, then its `json()`."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    # Each callback logs its own errors: one raised here would reach the JVM's listener bus.
    def onQueryStarted(self, jevent: Any) -> None:  # noqa: N802 - the JVM's names
        try:
            log.info("query started: %s", jevent.name())
        except Exception:
            log.exception("could not report a query's start")

    def onQueryProgress(self, jevent: Any) -> None:  # noqa: N802
        try:
            self.metrics.on_progress(json.loads(jevent.progress().json()))
        except Exception:  # metrics must not be able to stop the job
            log.exception("could not record a progress report")

    def onQueryIdle(self, jevent: Any) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, jevent: Any) -> None:  # noqa: N802
        try:
            exc = jevent.exception()
            if exc.isDefined():
                log.error("query terminated with error: %s", exc.get())
        except Exception:
            log.exception("could not report a query's end")

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


def _metric_name(name: str) -> str:
    """A valid Prometheus metric name: `dead-letters_records` → `dead_letters_records`."""
    out = re.sub(r"[^a-zA-Z0-9_:]", "_", name)
    return out if out and not out[0].isdigit() else f"_{out}"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
