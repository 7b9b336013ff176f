"""`cep percolate`: every event from Kafka matched against every saved search; notifications to
Kafka and Redis effectively once (docs/delivery.md); bad input to the dead-letter topic.

One streaming query, `notifications`, with foreachBatch. Per micro-batch:

  driver:    pin the index version: the changelog's end offsets when the batch first ran,
             recorded under the checkpoint so that a re-run uses the same ones
  executors: mapInArrow(MatchTask, percolator/worker.py, no Spark): each Python worker keeps
             a cached Percolator, brings it to exactly the pinned offsets
             (`KafkaChangeReader.read_to`), parses and matches its slice of the batch →
             notification rows, dead-letter rows and one stats row
  driver:    rows → OutRecords (defaults + each search's targets) → BatchDelivery (one Kafka
             transaction with a batch marker, then Redis idempotently by record id)

The index is state derived from the changelog (the Luwak-on-Samza design): a search added,
changed or removed through the registry takes effect at the next micro-batch, without a restart.
Notification ids are sha256(search id, search version, topic, partition, offset), and a re-run
batch sees the same index version, so a re-run produces the same records with the same ids.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cep.config import Settings
from cep.delivery.dead_letters import dead_letter_records
from cep.delivery.kafka_sink import MARKER_TOPIC, ensure_topics
from cep.delivery.preflight import one_line
from cep.delivery.record import OutRecord
from cep.errors import CepError
from cep.spark.kafka import is_topic_name
from jobs.metrics import Metrics
from percolator.analysis import Schema
from percolator.changelog import DEFAULT_TOPIC
from percolator.worker import OUTPUT_DDL, IndexSource, MatchTask

log = logging.getLogger("cep.percolate")

QUERY_NAME = "notifications"
DEFAULT_NOTIFICATION_TOPIC = "notifications"
_PINS_KEPT = 100  # as Spark's spark.sql.streaming.minBatchesToRetain


class PercolateJobError(CepError):
    pass


@dataclass
class PercolateOptions:
    checkpoint: str
    topics: tuple[str, ...]
    changelog_topic: str = DEFAULT_TOPIC
    notification_topic: str = DEFAULT_NOTIFICATION_TOPIC
    schema: Schema = field(default_factory=Schema)
    trigger_seconds: float = 1.0
    once: bool = False  # process what is there, then stop
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None  # split Kafka partitions into more tasks
    starting_offsets: str = "earliest"
    poll_seconds: float = 1.0
    changelog_timeout_s: float = 60.0


# -- driver ---------------------------------------------------------------------------------

def owner_channel(owner: str) -> str:
    return f"cep:notify:{owner}"


def owner_stream(owner: str) -> str:
    return f"cep:notifications:{owner}"


class NotificationRouter:
    """Output rows → OutRecords: every notification to the defaults (the notifications topic,
    the owner's channel and stream) and to its search's targets; dead letters; batch stats."""

    def __init__(self, settings: Settings, opts: PercolateOptions, metrics: Metrics) -> None:
        self.settings = settings
        self.opts = opts
        self.metrics = metrics
        # Kafka topics a search may not target: ours, the inputs, and Kafka's internal ones.
        self.reserved = {opts.changelog_topic, opts.notification_topic, MARKER_TOPIC,
                         settings.dead_letter_topic, settings.late_topic, *opts.topics}
        self.known_topics: set[str] = set()
        self.refused: set[tuple[str, Any, Any]] = set()  # logged once each
        self.batch: dict[str, Any] = {}

    def __call__(self, rows: Iterable[Any]) -> list[OutRecord]:
        emitted_at = int(time.time() * 1000)
        records: list[OutRecord] = []
        dead: list[Any] = []
        tasks: list[dict[str, Any]] = []
        for row in rows:
            if row.kind == "note":
                records.extend(self.route(row, emitted_at))
            elif row.kind == "dead":
                dead.append(row)
            elif row.kind == "stats":
                tasks.append(json.loads(row.payload))
        records.extend(dead_letter_records(dead, self.metrics, self.settings.dead_letter_topic))
        self.batch = _sum_stats(tasks)
        self.metrics.count("events", self.batch["events"])
        self.metrics.count("candidates", self.batch["candidates"])
        self.metrics.count("notifications", self.batch["matched"])
        new = {r.kafka_topic for r in records if r.kafka_topic} - self.known_topics
        if new:
            ensure_topics(self.settings.kafka_bootstrap, sorted(new),
                          client_conf=dict(self.settings.kafka_options))
            self.known_topics |= new
        return records

    def route(self, row: Any, emitted_at: int) -> Iterator[OutRecord]:
        payload = json.loads(row.payload)
        payload["emitted_at"] = emitted_at
        owner, sid, nid = row.owner, row.search_id, row.id
        yield OutRecord(id=nid, payload=payload, key=sid,
                        kafka_topic=self.opts.notification_topic,
                        redis_stream=owner_stream(owner), redis_channel=owner_channel(owner))
        for target in payload.get("targets") or ():
            kind, name = target.get("kind"), target.get("name", "")
            if kind == "kafka" and self._allowed_topic(name):
                yield OutRecord(id=f"{nid}:kafka:{name}", payload=payload, key=sid,
                                kafka_topic=name)
            elif kind == "redis":
                # The channel is the user's; the stream key stays in our namespace (an owner
                # cannot contain ':'), so a target can never clobber another Redis key.
                yield OutRecord(id=f"{nid}:redis:{name}", payload=payload, key=sid,
                                redis_channel=name, redis_stream=f"{owner_stream(owner)}:{name}")
            else:
                self.metrics.count("targets_refused")
                if (sid, kind, name) not in self.refused:
                    self.refused.add((sid, kind, name))
                    log.warning("search %s: target %s %r refused (not a valid topic, or one "
                                "of the job's own or Kafka's internal topics)", sid, kind, name)

    def _allowed_topic(self, name: str) -> bool:
        return (is_topic_name(name) and not name.startswith("__")
                and name not in self.reserved)


def _sum_stats(tasks: list[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {"tasks": len(tasks)}
    for k in ("events", "candidates", "matched", "applied", "deleted", "rejected"):
        total[k] = sum(int(t.get(k) or 0) for t in tasks)
    total["queries"] = max((int(t["queries"]) for t in tasks), default=0)
    total["always_run"] = max((int(t["always_run"]) for t in tasks), default=0)
    pairs = total["events"] * total["queries"]
    total["verified_fraction"] = total["candidates"] / pairs if pairs else 0.0
    total["match_seconds"] = sum(float(t.get("seconds") or 0) for t in tasks)
    total["sync_seconds"] = max((float(t.get("sync_seconds") or 0) for t in tasks), default=0.0)
    total["rebuilt"] = sum(1 for t in tasks if t.get("rebuilt"))
    total["changelog_end"] = tasks[0]["changelog_end"] if tasks else None
    return total


class IndexPins:
    """Per micro-batch, the changelog end offsets its index is built at. Recorded before the
    batch runs, under the Spark checkpoint's query id, so a re-run batch sees the same index."""

    def __init__(self, root: Path, ends: Any) -> None:
        self.root = root
        self.ends = ends  # () -> {partition: end offset}, e.g. percolator.changelog.ChangelogEnds

    def for_batch(self, query_id: str, batch_id: int) -> dict[int, int]:
        folder = self.root / query_id
        path = folder / f"{batch_id}.json"
        if path.exists():
            pinned = {int(k): int(v) for k, v in json.loads(path.read_text()).items()}
            log.info("batch %d re-runs at its pinned changelog offsets %s", batch_id, pinned)
            return pinned
        pinned = dict(self.ends())
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(pinned))
        tmp.replace(path)
        for old in folder.glob("*.json"):
            if old.stem.isdigit() and int(old.stem) < batch_id - _PINS_KEPT:
                old.unlink(missing_ok=True)
        return pinned


class PercolateJob:
    def __init__(self, settings: Settings, options: PercolateOptions) -> None:
        if not options.topics:
            raise PercolateJobError("no input topic: pass --topic TOPIC")
        self.settings = settings
        self.opts = options
        self.ck = Path(options.checkpoint)
        self.ck.mkdir(parents=True, exist_ok=True)
        self.metrics = Metrics(self.ck / "metrics.json")
        self.router = NotificationRouter(settings, options, self.metrics)
        self.source = IndexSource(settings.kafka_bootstrap, options.changelog_topic,
                                  tuple(settings.kafka_options), options.schema)
        self.query: Any = None
        self._stop_requested = False

    def run(self, max_seconds: float | None = None, *, stop_session: bool = False) -> int:
        """Run until the input is done (`once`), `max_seconds` pass or SIGTERM.
        `stop_session`: stop Spark at the end (the CLI does: it lets the listener bus drain
        while the Python side still answers it)."""
        from cep.spark.delivery import BatchDelivery
        from jobs.session import get_spark
        from percolator.changelog import ChangelogEnds, ensure_topic

        opts, st = self.opts, self.settings
        ensure_topic(st.kafka_bootstrap, opts.changelog_topic, dict(st.kafka_options))
        ensure_topics(st.kafka_bootstrap, [opts.notification_topic, st.dead_letter_topic],
                      client_conf=dict(st.kafka_options))
        ends = ChangelogEnds(st.kafka_bootstrap, opts.changelog_topic, dict(st.kafka_options))
        self.pins = IndexPins(self.ck / "index-pins", ends)
        spark = get_spark(st, "cep-percolate", kafka=True)
        self.metrics.attach(spark)
        spark_ck = str(self.ck / QUERY_NAME)
        record = self.metrics.on_batch(QUERY_NAME)

        def on_batch(batch_id: int, info: dict[str, Any]) -> None:
            record(batch_id, {**info, "percolator": self.router.batch})

        self.delivery = BatchDelivery(st, QUERY_NAME, spark_ck, self.router, on_batch=on_batch)
        self.spark_ck = spark_ck
        trigger = ({"availableNow": True} if opts.once
                   else {"processingTime": f"{opts.trigger_seconds} seconds"})
        self.query = (self._source(spark).writeStream.queryName(QUERY_NAME)
                      .foreachBatch(self._batch).option("checkpointLocation", spark_ck)
                      .trigger(**trigger).start())
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, self._on_sigterm) if main else None
        started = time.monotonic()
        failure = None
        try:
            while self.query.isActive and not self._stop_requested:
                if max_seconds is not None and time.monotonic() - started > max_seconds:
                    break
                self.query.awaitTermination(opts.poll_seconds)
        finally:
            if main:
                signal.signal(signal.SIGTERM, previous)
            if self.query.isActive:
                self.query.stop()
            failure = self.query.exception()
            self.delivery.close()
            ends.close()
            if stop_session:
                spark.stop()
        if failure is not None:
            raise PercolateJobError(  # one line; the JVM trace with --verbose (the cause)
                f"Error: query {QUERY_NAME} failed: {type(failure).__name__}: "
                f"{one_line(failure)} (--verbose: the full trace)") from failure
        return 0

    def _on_sigterm(self, _signum: int, _frame: Any) -> None:
        # A micro-batch cut short re-runs from the checkpoint on restart, with its pinned index
        # version: same records, same ids (Kafka skips it by marker if it was committed).
        log.info("SIGTERM: stopping the query")
        self._stop_requested = True

    def _source(self, spark: Any) -> Any:
        from cep.spark.kafka import kafka_reader

        reader = kafka_reader(spark.readStream, self.settings, self.opts.topics,
                              starting=self.opts.starting_offsets, fail_on_data_loss=True,
                              max_offsets_per_trigger=self.opts.max_offsets_per_trigger,
                              min_partitions=self.opts.min_partitions)
        return reader.load().select("value", "topic", "partition", "offset")

    def _batch(self, df: Any, batch_id: int) -> None:
        """foreachBatch: pin the index version, match on the executors, deliver."""
        from pyspark import StorageLevel

        from cep.spark.delivery import checkpoint_identity

        ends = self.pins.for_batch(checkpoint_identity(self.spark_ck), batch_id)
        task = MatchTask(self.source, ends, self.opts.changelog_timeout_s)
        out = df.mapInArrow(task, OUTPUT_DDL).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            # Materialised (persisted) first, so that matching is timed on its own and
            # BatchDelivery's collect() reads these rows instead of matching again.
            started = time.perf_counter()
            rows = out.count()
            matched_s = time.perf_counter() - started
            self.delivery(out, batch_id)
            log.info("batch %d: %d output rows matched in %.2f s, delivered in %.2f s", batch_id,
                     rows, matched_s, time.perf_counter() - started - matched_s)
        finally:
            out.unpersist()
