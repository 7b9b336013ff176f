"""`cep run`: the live job. Kafka in; every rule in one stateful operator; alerts to Kafka and
Redis effectively once (docs/delivery.md); bad input to a dead-letter topic; late events to a
late topic; rules changed while it runs.

One streaming query (`alerts`): Kafka → validate (`cep.events`) → fan-out by key →
transformWithStateInPandas → delivery. A bad event travels with the good ones as a dead-letter
row (its reason, bytes and Kafka position: `cep.spark.live_pass`, one Python pass): the operator
never gives it to the engine, only passes it on to the dead-letter topic, in the same Kafka
transaction as the batch's alerts. So bad input can never stall or crash the rules, and each
message is read and validated once (until session 5 a second query read the topic again for the
dead letters: two reads, two validations, two checkpoints per batch).

Rules: the driver polls the rules directory between micro-batches (`RulesWatcher`), per file:
a file that compiles is accepted, one that does not is rejected (its previous text keeps
running) and the others are not held back. The accepted texts are written as the snapshot,
which every task loads when it starts, so a change takes effect at the next micro-batch. A
change that needs a different query plan (a new stream or key field) restarts the query
in-process from its checkpoint. Each file's status and errors are in the metrics
(`rules_files`, `cep_rules_file_accepted`).

`--rules kafka:TOPIC` follows a rules topic instead (`cep.rules_topic.TopicSource`, one unit
per deployed rule; docs/rules-topic.md): the same watcher, snapshot and semantics.

What ran is kept in the checkpoint: `rules-archive/<rule>-<rule_hash>.json` holds every
accepted rule version's text and provenance (topic version, content hash, who deployed it),
under the `rule_hash` each alert carries; `rules-log.jsonl` has a line for the first batch
delivered under each set of rules in force (batch id, rule id -> rule_hash and topic version).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from cep.config import QUICK_JIT, Settings, parse_trigger, quick_jit_unless_set
from cep.delivery.dead_letters import dead_letter_record
from cep.delivery.kafka_sink import ensure_topics
from cep.delivery.preflight import claim_checkpoint, one_line, require_redis, require_topics
from cep.delivery.record import OutRecord
from cep.errors import CepError
from cep.events import MAX_BYTES
from cep.runtime.alerts import AlertRow, DeadRow, DroppedRow, LateRow, StatsRow, decode_rows
from jobs.metrics import Metrics

log = logging.getLogger("cep.live")


def plan_tables(plan: Any) -> list[str]:
    """The names of the tables the plan's rules read."""
    return sorted(s.name for s in plan.streams if s.is_table)


def kafka_source_for(setting: str, plan: Any) -> tuple[str, str]:
    """The Kafka source the live job reads with (`live_source`), and why: "auto" is the Python
    source (lower CPU per row and latency: docs/spark-runtime.md, session 27-28) unless the
    rules read a table, which only Spark's source reads in `cep run` yet."""
    if setting != "auto":
        return setting, "live_source setting"
    if tables := plan_tables(plan):
        return "spark", f"live_source auto; the rules read the table(s) {', '.join(tables)}"
    return "python", "live_source auto"


class LiveJobError(CepError):
    pass


@dataclass
class LiveOptions:
    rules: str
    checkpoint: str
    topics: dict[str, str] = field(default_factory=dict)  # stream -> topic (default: same name)
    # Seconds between micro-batch starts (`cep run --trigger`); None: `live_trigger`.
    trigger_seconds: float | None = None
    once: bool = False  # process what is there, then stop (tests, backfills)
    max_offsets_per_trigger: int | None = None
    starting_offsets: str = "earliest"
    poll_seconds: float = 1.0
    max_partial_matches: int | None = None


def alert_topic(rule: Any) -> str:
    for d in getattr(rule.emit, "destinations", ()):
        if d.kind == "KAFKA":
            return str(d.target)
    return f"alerts.{rule.id}"


def alert_channel(rule: Any) -> str:
    for d in getattr(rule.emit, "destinations", ()):
        if d.kind == "REDIS":
            return str(d.target)
    return f"cep:alerts:{rule.id}"


class AlertRouter:
    """Operator rows → OutRecords, with destinations from the currently accepted rules."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.rules: dict[str, Any] = {}

    def __call__(self, rows: Iterable[Any]) -> Iterable[OutRecord]:
        emitted_at = int(time.time() * 1000)
        for row in decode_rows(rows):
            if isinstance(row, StatsRow):
                self.metrics.add_stats(row.info)
            elif isinstance(row, AlertRow):
                self.metrics.count_alert(row.rule_id)
                rule = self.rules.get(row.rule_id)
                topic = alert_topic(rule) if rule else f"alerts.{row.rule_id}"
                channel = alert_channel(rule) if rule else f"cep:alerts:{row.rule_id}"
                payload = row.record()
                payload["emitted_at"] = emitted_at
                yield OutRecord(
                    id=row.id, payload=payload, key=row.key, kafka_topic=topic,
                    redis_stream=f"cep:alerts:{row.rule_id}", redis_channel=channel,
                    redis_latest_hash=f"cep:latest:{row.rule_id}", redis_latest_field=row.key,
                )
            elif isinstance(row, LateRow):  # counted from the operator's stats rows
                rid = hashlib.sha256(row.payload.encode()).hexdigest()[:32]
                yield OutRecord(id=f"late-{rid}", payload=json.loads(row.payload),
                                key=row.key, kafka_topic=self.settings.late_topic)
            elif isinstance(row, DroppedRow):
                self.metrics.count("partial_matches_dropped", row.info["count"])
                log.warning("partial-match cap hit: %s", json.dumps(row.info))
            elif isinstance(row, DeadRow):
                d = row.info
                raw = None if d.get("raw_b64") is None else base64.b64decode(d["raw_b64"])
                yield dead_letter_record(d["reason"], raw, d.get("stream"), d["topic"],
                                         int(d["partition"]), int(d["offset"]), self.metrics,
                                         self.settings.dead_letter_topic)


# The live job's default trigger: the next micro-batch starts as soon as the previous one is
# done, with whatever arrived meanwhile; when nothing has, Spark waits `pollingDelay`
# (IDLE_POLL_MS) before it asks the topics again (its default, 10 ms, would ask ~100 times a
# second while idle).
# A fixed interval (Spark's processingTime, `--trigger 1` until session 12) adds up to one
# interval of waiting to every event's latency: the batch that reads an event starts only at
# the next multiple of the interval (docs/spark-runtime.md, "Latency and triggers").
CONTINUOUS: dict[str, Any] = {"processingTime": "0 seconds"}
IDLE_POLL_MS = 100


def live_trigger(settings: Settings, opts: LiveOptions) -> dict[str, Any]:
    """`DataStreamWriter.trigger` keyword arguments: `--once` wins; else the `trigger` setting
    (not "default"); else `--trigger` seconds; else `CONTINUOUS`."""
    if opts.once:
        return {"availableNow": True}
    chosen = parse_trigger(settings.trigger)
    if chosen is not None:
        return chosen
    if opts.trigger_seconds is not None:
        return {"processingTime": f"{opts.trigger_seconds} seconds"}
    return CONTINUOUS


# The live job's JVM options unless `java_options` is set: the quick JIT, and G1 regions of
# 16 MB (`live_jvm`).
LIVE_JAVA_OPTIONS = f"{QUICK_JIT} -XX:G1HeapRegionSize=16m"


def live_jvm(settings: Settings) -> Settings:
    """The live job's JVMs run the quick JIT only (`QUICK_JIT`, C1) unless `java_options` is
    set. Each micro-batch plans and runs much the same JVM code again; with the full JIT the
    C2 compiler's threads took half the JVM's CPU minutes into a run, on the cores the batch
    needs (bench/results/latency_live.md, sessions 10 and 12: C1 about halved the CPU per
    micro-batch and its duration; session 16 at 60k-row batches: C2's code took 40% off the map
    stage's JVM CPU, and its compiler ~9 µs per row over the run's first minute). Session 22 ran
    C2 up to ten minutes (docs/spark-runtime.md, "The JIT over longer warm-ups"): its compiling
    was still a third of its JVM's CPU after five, and C1 had the lower or equal latency in every
    pair. Whether C2's faster code pays back over hours is not measured: `java_options` (e.g.
    "-XX:+TieredCompilation") brings the JVM's default back.

    And G1 regions of 16 MB (`LIVE_JAVA_OPTIONS`): the job's byte arrays of 1-4 MB (packs, state
    blobs) are then young objects, not humongous ones in G1's 1 MB regions (docs/spark-runtime.md,
    "The read split and the cores": ~0.3 µs per row of JVM CPU on a quiet machine)."""
    return quick_jit_unless_set(settings, LIVE_JAVA_OPTIONS)


# The live job's checkpoint is a local directory (`--checkpoint`); Spark writes a few files to it
# every micro-batch (the offset log, the commit log, the state store's changelog), each as a
# temporary file renamed into place, with Hadoop's `.crc` beside it. Through Spark's default
# checkpoint manager (Hadoop's FileContext API) each rename made the driver JVM start
# `readlink` processes (Hadoop without its native library asks `readlink` whether a path is a
# link, passing a `file:` URI, which fails) on top of a `chmod` per file written: 31 processes
# per micro-batch, counted with strace over a run of `bench.latency` (session 13), in the
# batch's critical path (walCommit, the state commit, commitOffsets). The FileSystem API
# renames with plain Java I/O (rename(2), atomic on a local disk): the `chmod` of each new
# file is left, ~6 processes per batch. (The raw local file system, with no `.crc` and no
# `chmod`, cannot be `fs.file.impl`: Spark's RocksDB store casts it to LocalFileSystem.)
# A crash window: Hadoop's checksummed rename moves the file, then its `.crc`, in two steps. The
# offset and commit logs are never overwritten, but the state store's files for a batch run again
# after a crash are: a crash between the two renames leaves the new file with the old `.crc`, and
# the next start fails with a ChecksumException naming the file. Recovery: delete that file's
# `.NAME.crc` (docs/spark-runtime.md). No conf stops LocalFileSystem writing `.crc` files
# (`setWriteChecksum` is API only); `fs.file.checksum.verify=false` would hide the stale one by
# checking no checkpoint file at all, so it is not set.
LOCAL_CHECKPOINT_CONF = {
    "spark.sql.streaming.checkpointFileManagerClass":
        "org.apache.spark.sql.execution.streaming.checkpointing."
        "FileSystemBasedCheckpointFileManager",
}


def live_worker_env() -> dict[str, str]:
    """Environment of the live job's Python workers: mimalloc (the core's allocator) without
    transparent huge pages (`MIMALLOC_ALLOW_THP=0`: no `MADV_HUGEPAGE` on its memory, and THP
    off for the worker process), or the job's own `MIMALLOC_ALLOW_THP` if its environment sets
    one (passed on as it is: executors on a cluster do not inherit the driver's). The operator's
    worker holds every shard's keys and frees and refills much of its memory each batch; with
    huge pages each fault on purged memory zeroed 2 MiB (perf of the operator's loop without
    Spark: ~20% of its samples in the kernel's `clear_page_erms`). Measured (docs/spark-runtime.md,
    "The operator's export of changed keys"): the core's export of changed keys 3.4 -> 1.5 µs
    per event. The embedded engine keeps mimalloc's default (docs/native-core.md: THP off was
    3-9% slower on the 10k-card fraud run)."""
    return {"spark.executorEnv.MIMALLOC_ALLOW_THP": os.environ.get("MIMALLOC_ALLOW_THP", "0")}


def read_split(settings: Settings, cores: int) -> dict[str, int]:
    """Kafka source options that split a micro-batch's read: `minPartitions`, i.e. at least
    `live_read_tasks` tasks (0: `cores`, the session's), each topic partition's range cut in
    equal parts; and, when `live_read_task_rows` is set, at most that many records per task
    (`maxRecordsPerPartition`). By default a one-partition topic's batch is one read task per
    core, whatever its size: the map stage (the Kafka read and the one Python pass) ends on
    all cores at once, where a cap on records per task made an odd count of tasks on two
    cores, the last one alone (docs/spark-runtime.md, "The live job's map stage")."""
    split = {"minPartitions": settings.live_read_tasks or cores}
    if settings.live_read_task_rows > 0:
        split["maxRecordsPerPartition"] = settings.live_read_task_rows
    return split


# The live job's Arrow batch when read tasks have no record cap: a read task of up to this
# many records hands them to the pass as one batch (one pack per shard), a bigger one (a
# batch catching up) in batches of this size, which bounds the pass's memory.
ARROW_BATCH_ROWS = 50_000


def arrow_batch_conf(settings: Settings) -> dict[str, str]:
    """Spark's Arrow batch size for the live job: a read task's rows (up to
    `live_read_task_rows`, or `ARROW_BATCH_ROWS` without that cap) reach the one Python pass as
    one Arrow batch, not Spark's batches of 10,000, so fewer packs per shard
    (docs/spark-runtime.md, "The live job's map stage"). A session setting: the job's other
    Python UDF, the operator, reads packs (a few rows per shard), far below either size;
    `cep run` owns its process's session."""
    rows = settings.live_read_task_rows or ARROW_BATCH_ROWS
    return {"spark.sql.execution.arrow.maxRecordsPerBatch": str(rows)}


def local_shuffle_conf(settings: Settings) -> dict[str, str]:
    """On a local master, the live job's shuffle (the packs, one row per shard and read task:
    each micro-batch's events as Arrow IPC, ~8 MB per 60k events) is written and read back on
    the same machine, through the page cache: Spark's LZ4 of it each way is CPU the two stages
    share with nothing saved (`spark.shuffle.compress` false; measured in
    docs/spark-runtime.md, "The live job's map stage", session 16). A cluster keeps Spark's
    default: there the shuffle crosses the network."""
    if not settings.spark_master.startswith("local"):
        return {}
    return {"spark.shuffle.compress": "false"}


def rules_source(settings: Settings, rules: str) -> Any:
    """`--rules`: a directory (its path) or `kafka:TOPIC` (a rules topic)."""
    if rules.startswith("kafka:"):
        from cep.rules_topic import TopicSource

        return TopicSource(settings.kafka_bootstrap, rules[len("kafka:"):],
                           dict(settings.kafka_options))
    return rules


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


SHARDS_FILE = "shards.json"
# The live job's only shard count before the checkpoint recorded it (Settings.shards' default
# until session 9): a checkpoint with query state and no record was started with it.
LEGACY_SHARDS = 64
# The field of `shards.json` that says whether the query's state may hold the native store's
# layout 1 log (`nlog`, a ListState written until session 14). The operator declares it in each
# stateful task, a round trip in which the JVM builds its encoders, so a checkpoint that cannot
# hold it (a query started since session 17: `false`) leaves it undeclared; a record without
# the field (a checkpoint started by an older build, whatever its layout) keeps declaring it.
LAYOUT1_LOG = "layout1_log"
# Since session 18 a new query records its shards as an object, `{"count": n, "record_in_log":
# true}`: the native store keeps each shard's record in its log's reserved row, not in the
# ValueState `nshard` (one state variable per task: `checkpoint_record_row`). An object, not a
# field beside the count, so that an older build stops on it (naming `shards.json`) instead
# of finding no record in `nshard` and starting every shard afresh over its log's rows.
RECORD_IN_LOG = "record_in_log"
# Since session 27 a query started with `live_pools` > 1 records `{"count": n, "pools": p}`:
# its shards run in p stateful operators, each a task in its own Python worker pool
# (`cep.spark.query.pooled`), at one shuffle partition. Its records are in the log (as
# `RECORD_IN_LOG`, which it implies). Without `RECORD_IN_LOG: true` an older build stops on
# the object (naming `shards.json`) rather than run one operator over state kept by several.
POOLS = "pools"


class _Recorded(NamedTuple):
    shards: int
    record_in_log: bool  # `RECORD_IN_LOG`
    layout1_log: bool  # `LAYOUT1_LOG`
    pools: int  # `POOLS` (1: one operator)


def _recorded(ck: Path) -> _Recorded | None:
    """Checkpoint `ck`'s `shards.json` read (None without one). Its `shards` is the count
    (sessions 9-17: records not in the log) or `{"count": n, RECORD_IN_LOG: true}` (since
    session 18); `LAYOUT1_LOG` false, or absent (true). Anything else is an error naming the
    file, not a guess."""
    record = ck / SHARDS_FILE
    if not record.exists():
        return None
    try:
        got = json.loads(record.read_text())
        n = got["shards"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LiveJobError(f"checkpoint {ck}: unreadable {SHARDS_FILE} ({exc}): the shard "
                           "count its state was written with is unknown") from exc
    pools = n.get(POOLS, 1) if isinstance(n, dict) else 1
    in_log = isinstance(n, dict) and (n.get(RECORD_IN_LOG) is True or POOLS in n)
    count = n.get("count") if in_log else n
    if type(count) is not int or count < 1 or type(pools) is not int or pools < 1:
        raise LiveJobError(f"checkpoint {ck}: {SHARDS_FILE} has shards={n!r}, not a positive "
                           f'integer nor {{"count": n, "{RECORD_IN_LOG}": true}} nor '
                           f'{{"count": n, "{POOLS}": p}}')
    return _Recorded(count, in_log, got.get(LAYOUT1_LOG, True) is not False, pools)


def checkpoint_shards(ck: Path, wanted: int, pools: int = 1) -> int:
    """The live job's shard count for checkpoint `ck`: the one recorded in it (`shards.json`),
    else `wanted`, recorded now. A key's shard is part of its state's key, so a restart with
    another count would look for the key's state in the wrong shard: a checkpoint keeps its
    count, whatever the setting says (logged when they differ). A checkpoint whose query state
    predates the record was started with `LEGACY_SHARDS`. An unreadable record is an error, not
    a guess. A new checkpoint records `pools` too (`checkpoint_pools`), at most one per shard."""
    recorded = _recorded(ck)
    if recorded is not None:
        n = recorded.shards
        if n != wanted:
            log.info("checkpoint %s was started with %d shards: keeping them (the setting, "
                     "%d, applies to a new checkpoint)", ck, n, wanted)
        return n
    offsets = ck / "alerts" / "offsets"
    started = offsets.is_dir() and any(offsets.iterdir())  # by a build before the record
    n = LEGACY_SHARDS if started else wanted
    if n != wanted:
        log.info("checkpoint %s has state from before its shard count was recorded: %d "
                 "shards (the setting, %d, applies to a new checkpoint)", ck, n, wanted)
    ck.mkdir(parents=True, exist_ok=True)
    # A new query's state is written by this build: the native store's layout 1 log can never
    # be in it, so the operator does not declare it (`checkpoint_layout1_log`).
    pools = min(pools, n)
    layout: dict[str, Any] = ({"count": n, POOLS: pools} if pools > 1
                              else {"count": n, RECORD_IN_LOG: True})
    _write_atomic(ck / SHARDS_FILE, json.dumps({"shards": n} if started else
                                            {"shards": layout, LAYOUT1_LOG: False}))
    return n


def checkpoint_layout1_log(ck: Path) -> bool:
    """Whether checkpoint `ck`'s state may hold the native store's layout 1 log: unless its
    record (`checkpoint_shards` writes it first) says it cannot."""
    recorded = _recorded(ck)
    return recorded is None or recorded.layout1_log


def checkpoint_pools(ck: Path, wanted: int) -> int:
    """The stateful operators (each its own Python worker pool) of checkpoint `ck`'s query: the
    count its record has (`POOLS`; `checkpoint_shards` writes it first), else 1 (a query
    started before session 27, or with `live_pools` 1). Kept whatever the setting says (logged
    when they differ): each operator keeps its shards' state under its own operator id, at the
    one shuffle partition the query was started with; the other plan would look for a shard's
    state in another operator (one operator's partitions: state not found, the keys started
    afresh)."""
    recorded = _recorded(ck)
    pools = 1 if recorded is None else recorded.pools
    if recorded is not None and pools != max(1, min(wanted, recorded.shards)):
        log.info("checkpoint %s was started with %d stateful operator(s) (`live_pools`): "
                 "keeping them (the setting, %d, applies to a new checkpoint)", ck, pools, wanted)
    return pools


def checkpoint_record_row(ck: Path) -> bool:
    """Whether checkpoint `ck`'s native store keeps each shard's record in its log's reserved
    row (`RECORD_IN_LOG`: a query started since session 18; `checkpoint_shards` writes the
    record first)."""
    recorded = _recorded(ck)
    return recorded is not None and recorded.record_in_log


class LiveJob:
    def __init__(self, settings: Settings, options: LiveOptions) -> None:
        from cep.engines import RulesWatcher

        self.settings = settings
        self.opts = options
        self.ck = Path(options.checkpoint)
        claim_checkpoint(self.ck, "cep run", {})
        self.shards = checkpoint_shards(self.ck, settings.live_shards, settings.live_pools)
        self.pools = checkpoint_pools(self.ck, settings.live_pools)
        self.layout1_log = checkpoint_layout1_log(self.ck)
        self.record_row = checkpoint_record_row(self.ck)
        self.snapshot = str(self.ck / "rules-snapshot.json")
        self.watcher = RulesWatcher(rules_source(settings, options.rules), self.snapshot)
        self._logged_rules: dict[str, Any] | None = None
        self.metrics = Metrics(self.ck / "metrics.json")
        self.router = AlertRouter(settings, self.metrics)
        self.queries: list[Any] = []
        self.plan: Any = None

    # -- lifecycle ------------------------------------------------------------------------
    def run(self, max_seconds: float | None = None) -> int:
        from jobs.session import get_spark

        change = self.watcher.poll()
        if change is None or not change.accepted:
            first = change.errors[0].render().splitlines()[0] if change and change.errors else ""
            raise LiveJobError(f"the rules do not compile ({first}); fix them (`cep check`) and "
                               "start again")
        if change.ruleset is None:
            raise LiveJobError(f"no rules in {self.opts.rules}: nothing to run")
        self.metrics.set_rule_files(change.files)
        self._preflight(change.ruleset)
        self._adopt(change)
        self.spark = get_spark(live_jvm(self.settings), "cep-live", kafka=True,
                               extra_conf={**LOCAL_CHECKPOINT_CONF, **live_worker_env(),
                                           **arrow_batch_conf(self.settings),
                                           **local_shuffle_conf(self.settings)})
        manager = "spark.sql.streaming.checkpointFileManagerClass"
        log.info("checkpoint file manager: %s", self.spark.conf.get(manager, "Spark's default"))
        # The stateful tasks per batch (two by default since session 15): see
        # `Settings.live_partitions`; with several operators (`live_pools`) one partition, a
        # task per operator (`cep.spark.query.pooled`). A checkpoint keeps its own count.
        partitions = 1 if self.pools > 1 else self.settings.live_partitions
        self.spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
        self.metrics.attach(self.spark)
        self._start()
        started = time.monotonic()
        try:
            while True:
                if all(not q.isActive for q in self.queries):
                    break
                self._raise_if_failed()
                time.sleep(self.opts.poll_seconds)
                change = self.watcher.poll()
                if change is not None:
                    self.metrics.set_rule_files(change.files)
                if change is not None and change.accepted:
                    restart = self._adopt(change)
                    if restart:
                        log.info("rules need a new query plan: restarting from the checkpoint")
                        self._stop()
                        self._start()
                if max_seconds is not None and time.monotonic() - started > max_seconds:
                    break
        finally:
            self._stop()
        self._raise_if_failed()
        return 0

    def _raise_if_failed(self) -> None:
        for q in self.queries:
            exc = q.exception()
            if exc is not None:  # one line; the JVM trace with --verbose (the cause)
                raise LiveJobError(f"Error: query {q.name} failed: {type(exc).__name__}: "
                                   f"{one_line(exc)} (--verbose: the full trace)") from exc

    def _preflight(self, ruleset: Any) -> None:
        """Kafka, the input topics and Redis are there — else one line naming what is not."""
        from cep.spark.pipeline import plan_for

        plans = plan_for(ruleset, self.shards).streams
        if not plans:  # no rules, or every rule disabled: a query would have no source
            raise LiveJobError(f"no enabled rule in {self.opts.rules} reads a stream: "
                               "nothing to run")
        wanted = {f"{'table' if s.is_table else 'stream'} {s.name}": self._topic(s)
                  for s in plans}
        require_topics(self.settings.kafka_bootstrap, wanted, dict(self.settings.kafka_options))
        require_redis(self.settings.redis_url)

    def _adopt(self, change: Any) -> bool:
        from cep.spark.pipeline import plan_for

        ruleset = change.ruleset
        self.router.rules = {r.id: r for r in ruleset.rules}
        self.metrics.set_rules(change.versions)
        self._archive(change)
        topics = [alert_topic(r) for r in ruleset.rules if r.enabled]
        topics += [self.settings.dead_letter_topic, self.settings.late_topic]
        ensure_topics(self.settings.kafka_bootstrap, topics,
                      client_conf=dict(self.settings.kafka_options))
        plan = plan_for(ruleset, self.shards)
        if not plan.streams and self.plan is not None:
            # No enabled rule reads any stream: keep reading the topics the query reads (its
            # events match nothing) rather than restart a query with no source.
            log.warning("no enabled rule reads any stream: the job keeps its input and "
                        "matches nothing until rules come back")
            return False
        restart = self.plan is not None and plan.streams != self.plan.streams
        self.plan = plan
        return restart

    # -- which rules produced what (kept in the checkpoint) ------------------------------
    def _archive(self, change: Any) -> None:
        """Every accepted rule version, under the `rule_hash` its alerts carry."""
        archive = self.ck / "rules-archive"
        archive.mkdir(parents=True, exist_ok=True)
        texts = self.watcher.accepted
        for rid, prov in change.provenance.items():
            path = archive / f"{rid}-{prov['rule_hash']}.json"
            if not path.exists():
                unit = str(prov.get("source", ""))
                _write_atomic(path, json.dumps({"rule": rid, **prov,
                                                "text": texts.get(unit)}, sort_keys=True))

    def _in_force(self) -> dict[str, Any]:
        return {rid: {"rule_hash": p.get("rule_hash"), "version": p.get("version"),
                      "source": p.get("source")}
                for rid, p in sorted(self.watcher.provenance.items())}

    def _on_batch(self, query: str) -> Any:
        record = self.metrics.on_batch(query)

        def on_batch(batch_id: int, info: dict[str, Any]) -> None:
            record(batch_id, info)
            rules = self._in_force()
            if rules != self._logged_rules:  # a line per change of the rules in force
                with (self.ck / "rules-log.jsonl").open("a") as f:
                    f.write(json.dumps({"batch_id": batch_id, "query": query,
                                        "at": int(time.time() * 1000), "rules": rules},
                                       sort_keys=True) + "\n")
                self._logged_rules = rules
        return on_batch

    def _stop(self) -> None:
        for q in self.queries:
            if q.isActive:
                q.stop()
        for d in getattr(self, "_deliveries", []):
            d.close()

    # -- the query --------------------------------------------------------------------
    def _topic(self, plan: Any) -> str:
        """A stream's topic (its name, or `--topic STREAM=TOPIC`); a table's, as declared."""
        return str(self.opts.topics.get(plan.name, plan.topic or plan.name))

    def _source(self) -> Any:
        from pyspark.sql import functions as F

        from cep.spark.kafka import kafka_reader
        from cep.spark.live_pass import kafka_seq
        from cep.spark.pipeline import tombstones_as_deletes

        # A table's changelog is read from its topic (TABLE ... FROM KAFKA 'topic') in the same
        # query as the events, and joins them in the same operator (docs/tables.md).
        topic_of = {s.name: self._topic(s) for s in self.plan.streams}
        reader = kafka_reader(self.spark.readStream, self.settings, topic_of.values(),
                              starting=self.opts.starting_offsets, fail_on_data_loss=True,
                              max_offsets_per_trigger=self.opts.max_offsets_per_trigger)
        split = read_split(self.settings, self.spark.sparkContext.defaultParallelism)
        for option, value in split.items():
            reader = reader.option(option, value)
        stream_col = F.lit(None).cast("string")
        for stream, topic in topic_of.items():
            stream_col = F.when(F.col("topic") == topic, F.lit(stream)).otherwise(stream_col)
        # The value's bytes as read: only `cep.events` interprets them (cep/spark/pipeline.py);
        # a table's tombstone (null value) is its delete record.
        value = tombstones_as_deletes(F.col("value"), stream_col, self.plan)
        return reader.load().select(
            stream_col.alias("stream"), value.alias("value"),
            kafka_seq(F.col("partition"), F.col("offset")).alias("seq"),
            "topic", "partition", "offset")

    def _packed(self) -> Any:
        """The stateful operator's input (`live_pass.live_packed`'s rows): Spark's Kafka source
        and the one Python pass over its rows, or with `live_source` "python" the Python source
        that runs the pass in its read tasks (`cep.spark.kafka_source`; streams, a table is
        refused)."""
        from cep.spark.kafka import check_topic
        from cep.spark.live_pass import (
            KAFKA_POSITION,
            ValidatePack,
            live_packed,
            slim_input,
            with_event_time,
        )

        topics = {s.name: self._topic(s) for s in self.plan.streams}
        source, why = kafka_source_for(self.settings.live_source, self.plan)
        log.info("Kafka source: %s (%s)", source, why)
        if source != "python":
            return live_packed(self._source(), self.plan, KAFKA_POSITION, MAX_BYTES, topics)
        from cep.spark.kafka_source import SOURCE_NAME, pack_source

        # The source reads tables too (tombstones as delete records, `table_deletes`, tested
        # against Spark's plan), but the job's `events_read` comes from the operator with it,
        # whose stats count no table record: refused until they do (docs/spark-runtime.md,
        # "A broker restart with the Python Kafka source (session 28, src28)").
        if tables := plan_tables(self.plan):
            raise LiveJobError("live_source 'python' reads streams, not yet a table; these rules "
                               f"read {', '.join(tables)}: set live_source to 'spark'")
        # One stream from one topic: the slim pass (only value and seq); else each record's
        # stream and Kafka position, as with Spark's source.
        slim = slim_input(self.plan, KAFKA_POSITION, topics)
        self.spark.dataSource.register(
            pack_source(ValidatePack(self.plan, KAFKA_POSITION, MAX_BYTES, slim), self.plan))
        split = read_split(self.settings, self.spark.sparkContext.defaultParallelism)
        reader = (self.spark.readStream.format(SOURCE_NAME)
                  .option("topics", json.dumps({s: check_topic(t, s) for s, t in topics.items()}))
                  .option("bootstrap", self.settings.kafka_bootstrap)
                  .option("kafka_conf", json.dumps(dict(self.settings.kafka_options)))
                  .option("starting", self.opts.starting_offsets)
                  .option("max_offsets_per_trigger", self.opts.max_offsets_per_trigger or 0)
                  .option("read_tasks", split["minPartitions"])
                  .option("read_task_rows", split.get("maxRecordsPerPartition", 0)))
        self.metrics.events_read_from_operator = True  # the source's rows are packs
        return with_event_time(reader.load())

    def _start(self) -> None:

        from cep.engines import SnapshotEngineFactory
        from cep.spark.delivery import BatchDelivery
        from cep.spark.query import match_packed

        trigger = live_trigger(self.settings, self.opts)
        # Idle (a trigger found no new input): the next look at the topics IDLE_POLL_MS later.
        self.spark.conf.set("spark.sql.streaming.pollingDelay", f"{IDLE_POLL_MS}ms")
        # Validation, dead letters, fan-out, shard and packing in one Python pass
        # (cep/spark/live_pass.py): each input row goes from the JVM to Python once.
        rows = self._packed()
        factory = SnapshotEngineFactory(self.snapshot, self.opts.max_partial_matches)
        out = match_packed(rows, self.plan, factory, layout1_log=self.layout1_log,
                           record_row=self.record_row, pools=self.pools)
        alerts_ck = str(self.ck / "alerts")
        deliver = BatchDelivery(self.settings, "alerts", alerts_ck, self.router,
                                on_batch=self._on_batch("alerts"))
        q1 = (out.writeStream.queryName("alerts").foreachBatch(deliver)
              .option("checkpointLocation", alerts_ck).trigger(**trigger).start())
        self.queries = [q1]
        self._deliveries = [deliver]
