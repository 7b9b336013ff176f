"""Per-batch metrics of the live job: logged, and written as JSON (and Prometheus text) files.

Counters come from the operator's stats rows and the delivery step; rates, watermark and state
size come from Spark's query progress (a StreamingQueryListener).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("cep.metrics")


class Metrics:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.counters: Counter[str] = Counter()
        self.queries: dict[str, dict[str, Any]] = {}
        self.rules: dict[str, str] = {}
        self.rule_files: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        # Both queries' foreachBatch threads and the progress listener write: one at a time.
        self._write_lock = threading.Lock()

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counters[name] += n

    def add_stats(self, stats: dict[str, Any]) -> None:
        with self._lock:
            for k in ("events", "late", "keys_touched", "keys_released", "state_writes",
                      "state_reads", "python_us"):
                self.counters[k] += int(stats.get(k) or 0)

    def set_rules(self, versions: dict[str, str]) -> None:
        with self._lock:
            self.rules = dict(versions)
        self.write()

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
                self.counters[_metric_name(f"{query}_records")] += int(info.get("records", 0))
            self.write()
        return record

    def on_progress(self, progress: dict[str, Any]) -> None:
        name = progress.get("name") or "query"
        ops = progress.get("stateOperators") or [{}]
        event_time = progress.get("eventTime") or {}
        with self._lock:
            if name == "alerts":  # every input record, good or bad, passes the alerts query
                self.counters["events_read"] += int(progress.get("numInputRows") or 0)
            q = self.queries.setdefault(name, {})
            q.update(
                batch=progress.get("batchId"),
                input_rows=progress.get("numInputRows"),
                input_rows_per_s=progress.get("inputRowsPerSecond"),
                processed_rows_per_s=progress.get("processedRowsPerSecond"),
                batch_ms=(progress.get("durationMs") or {}).get("triggerExecution"),
                # Where the batch's time went (addBatch, getBatch, latestOffset, walCommit...).
                durations_ms=progress.get("durationMs"),
                watermark=event_time.get("watermark"),
                max_event_time=event_time.get("max"),
                state_rows=ops[0].get("numRowsTotal"),
                state_bytes=ops[0].get("memoryUsedBytes"),
                dropped_by_watermark=ops[0].get("numRowsDroppedByWatermark"),
                sources=[{"end": s.get("endOffset")} for s in progress.get("sources", [])],
            )
        log.info("progress %s", json.dumps(self.queries[name], default=str))
        self.write()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"time": time.time(), "counters": dict(self.counters),
                    "queries": json.loads(json.dumps(self.queries, default=str)),
                    "rules": dict(self.rules),
                    "rules_files": json.loads(json.dumps(self.rule_files, default=str))}

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
        tmp = prom.with_suffix(".ptmp")
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, prom)

    def attach(self, spark: Any) -> None:
        from pyspark.sql.streaming import StreamingQueryListener

        metrics = self

        class Listener(StreamingQueryListener):  # type: ignore[misc]
            def onQueryStarted(self, event: Any) -> None:
                log.info("query started: %s", event.name)

            def onQueryProgress(self, event: Any) -> None:
                metrics.on_progress(json.loads(event.progress.json))

            def onQueryIdle(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                if event.exception:
                    log.error("query terminated with error: %s", event.exception)

        spark.streams.addListener(Listener())


def _metric_name(name: str) -> str:
    """A valid Prometheus metric name: `dead-letters_records` → `dead_letters_records`."""
    out = re.sub(r"[^a-zA-Z0-9_:]", "_", name)
    return out if out and not out[0].isdigit() else f"_{out}"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
