"""The Spark path (local[2], from files) against its ceiling, in one Spark session.

Every variant reads the same staged JSON-lines files with the same streaming source
(`maxFilesPerTrigger=1`, `availableNow`), the same JVM parse/validate (`cep.spark.pipeline.parse`),
fan-out to `shard = hash(key) % 64`, watermark and shuffle, as jobs/replay.py builds them; only
the stateful step differs:

- `jvm_only`: no stateful step, `noop` sink (what the JVM side costs);
- `ceiling_tws`: `transformWithStateInPandas` with a no-op processor (our operator, doing nothing);
- `ceiling_aipws`: `applyInPandasWithState` with a no-op function (FACTS.md's ceiling);
- `state_only` (full runs): no engine, but our operator's JSON parsing and MapState traffic
  (`noop_ops.StateOnlyProcessor`): how much of the gap to the ceiling is state access;
- `ours`: `transformWithStateInPandas` with `cep.spark.operator.CepProcessor` (the engine);
- `ours_kafka`: the same, reading the same events from a Kafka topic (4 partitions, loaded
  before the run, `maxOffsetsPerTrigger` = events / files so batches match the file runs),
  on a broker of our own (scripts/kafka.sh) — the live job's source.

Two batch variants (issue 14: `cep replay` is a batch job) read the same input files with
`spark.read` instead and are timed end to end (wall clock of the Spark job). They run
alternated in one session, `BATCH_ROUNDS` rounds of one run each, the order swapped every
round; the figure of each is the median of its runs after the first round (Python workers are
reused between runs, and the JVM's JIT warms on both plans alike; until session 29 each ran its
runs in a row, replay first, so the ceiling ran on a JVM the replay had warmed):
- `replay_batch`: `cep.spark.batch.match_bounded` as `cep replay` runs it (read → validate and
  fan out → shuffle by shard → sort by ts → the engine per partition), rows collected;
- `ceiling_batch`: its ceiling — read → shard (JVM: xxhash64 of the card) → shuffle → sort
  (JVM: the line's ts) → `mapInArrow` identity → `noop` sink: Spark's own cost of that plan
  with one Python pass and no work in it.
Their figures go to the result's `batch` section (bench/run.py writes replay_batch.md).

Steady state: per-batch `numInputRows` and `durationMs.triggerExecution` from the query's
progress, leaving out the first `warmup` batches (worker start-up, JIT, first state commits).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench import noop_ops
from cep.config import Settings

VARIANTS = ("jvm_only", "ceiling_tws", "ceiling_aipws", "state_only", "ours", "ours_kafka",
            "replay_batch", "ceiling_batch")
BATCH_VARIANTS = ("replay_batch", "ceiling_batch")
BATCH_ROUNDS = 4  # the first is a warm-up round, not counted
# `make bench` leaves out state_only (it measured the state traffic that led to the bucketed
# store, docs/spark-runtime.md); `--spark-variants` runs it.
DEFAULT_VARIANTS = ("jvm_only", "ceiling_tws", "ceiling_aipws", "ours", "ours_kafka",
                    *BATCH_VARIANTS)
QUICK_VARIANTS = ("ceiling_aipws", "ours", "ours_kafka", *BATCH_VARIANTS)
STATE_BLOB_BYTES = 200  # about a fraud key state pickled (see the state benchmark)
SHARDS = 64


class Collector:
    """foreachBatch: counts events (from the per-call stats rows) and gathers alerts."""

    def __init__(self) -> None:
        self.events = 0
        self.stats: Counter[str] = Counter()  # summed per-call stats (ours: keys, writes)
        self.alerts: list[tuple[str, str, int, int]] = []
        self.kinds: Counter[str] = Counter()

    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        slim = df.select("kind", "rule_id", "key", F.when(F.col("kind") == "late", F.lit(None))
                         .otherwise(F.col("payload")).alias("payload"))
        for row in slim.collect():
            self.kinds[row.kind] += 1
            if row.kind == "stats":
                st = json.loads(row.payload)
                self.events += st["events"]
                self.stats["calls"] += 1
                for k in ("rows", "keys_touched", "keys_released", "state_writes",
                          "state_reads", "late"):
                    self.stats[k] += int(st.get(k) or 0)
            elif row.kind in ("match", "timeout"):
                rec = json.loads(row.payload)
                self.alerts.append((row.rule_id, row.key, rec["first_ts"], rec["last_ts"]))


class WorkerMemory:
    """Samples the memory of this run's Python workers (PSS, so forked workers' shared pages
    count once). Only descendants of this process count: other Spark jobs may share the box."""

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self.max_pss_total = 0
        self.max_rss_single = 0
        self.max_workers = 0
        self.root = os.getpid()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> WorkerMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            pss, rss, n = 0, 0, 0
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                    if b"pyspark.daemon" not in cmd and b"pyspark.worker" not in cmd:
                        continue
                    if not _descends_from(int(pid), self.root):
                        continue
                    fields = _kb_fields(Path(f"/proc/{pid}/smaps_rollup").read_text())
                except OSError:
                    continue
                n += 1
                pss += fields.get("Pss", 0)
                rss = max(rss, fields.get("Rss", 0))
            self.max_pss_total = max(self.max_pss_total, pss * 1024)
            self.max_rss_single = max(self.max_rss_single, rss * 1024)
            self.max_workers = max(self.max_workers, n)


def _descends_from(pid: int, root: int) -> bool:
    for _ in range(64):
        if pid == root:
            return True
        if pid <= 1:
            return False
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # field 4: ppid
    return False


def _kb_fields(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB":
            out[name] = int(parts[0])
    return out


def _stage(src: Path, staged: Path) -> None:
    """Copy the input files under staged/<stream>/ with mtimes in name order (the file source
    takes the oldest first), as jobs/replay.py stages them."""
    shutil.rmtree(staged, ignore_errors=True)
    dest = staged / src.name
    dest.mkdir(parents=True)
    base = time.time() - 86_400
    for i, p in enumerate(sorted(src.iterdir())):
        target = dest / p.name
        shutil.copyfile(p, target)
        os.utime(target, (base + i, base + i))


KAFKA_PARTITIONS = 4


class KafkaInput:
    """A broker of our own with the staged events in one topic (seq = partition, offset as the
    live job computes it)."""

    def __init__(self, work: Path) -> None:
        from bench.latency import Services

        self.services = Services(work / "kafka-services")
        self.topic = "bench-transactions"
        self.stream = ""
        self.per_batch = 0

    def __enter__(self) -> KafkaInput:
        self.services.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.services.stop()

    def load(self, staged: Path) -> int:
        from confluent_kafka import Producer
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.services.bootstrap})
        for f in admin.create_topics([NewTopic(self.topic, KAFKA_PARTITIONS, 1)]).values():
            f.result(60)
        # Idempotent: without it librdkafka may retry a failed message set after a later one
        # was written (max.in.flight > 1), and a partition then holds events out of the order
        # they were sent: Spark's one watermark makes the events behind the moved set late
        # (docs/spark-runtime.md, "The bench's Kafka input out of order (session 25, flake25)").
        producer = Producer({"bootstrap.servers": self.services.bootstrap, "linger.ms": 50,
                             "batch.size": 1 << 20, "compression.type": "lz4",
                             "enable.idempotence": True})
        files = sorted(p for p in staged.rglob("*") if p.is_file())
        self.stream = files[0].parent.name
        sent: list[list[bytes]] = [[] for _ in range(KAFKA_PARTITIONS)]
        n = 0
        for path in files:
            with path.open("rb") as fh:
                for line in fh:
                    line = line.strip()
                    if not line:
                        continue
                    while True:
                        try:
                            producer.produce(self.topic, line, partition=n % KAFKA_PARTITIONS)
                            break
                        except BufferError:
                            producer.poll(0.05)
                    sent[n % KAFKA_PARTITIONS].append(line)
                    n += 1
        if producer.flush(120) != 0:
            raise RuntimeError("could not load the events into Kafka")
        wrong = first_out_of_order(sent, self._read_back(n))
        if wrong is not None:
            raise RuntimeError(f"the Kafka topic does not hold the events as they were sent: "
                               f"partition {wrong[0]}, from offset {wrong[1]}")
        self.per_batch = -(-n // max(1, len(files)))
        return n

    def _read_back(self, n: int) -> list[list[bytes]]:
        """The topic's records, per partition in offset order (up to `n` in all)."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.services.bootstrap,
                             "group.id": "bench-check", "enable.auto.commit": False})
        consumer.assign([TopicPartition(self.topic, p, 0) for p in range(KAFKA_PARTITIONS)])
        got: list[list[tuple[int, bytes]]] = [[] for _ in range(KAFKA_PARTITIONS)]
        deadline, total = time.monotonic() + 120, 0
        try:
            while total < n and time.monotonic() < deadline:
                for m in consumer.consume(10_000, 1.0):
                    if m.error() is None:
                        got[m.partition()].append((m.offset(), m.value()))
                        total += 1
        finally:
            consumer.close()
        return [[v for _, v in sorted(recs)] for recs in got]


def first_out_of_order(sent: list[list[bytes]], read: list[list[bytes]]) -> tuple[int, int] | None:
    """(partition, offset) of the first record of `read` (each partition's records in offset
    order) that is not the one `sent` there in that place, a record missing included; None when
    every partition holds exactly what was sent, in the order it was sent."""
    for p, (want, have) in enumerate(zip(sent, read, strict=True)):
        for i in range(max(len(want), len(have))):
            if i >= len(want) or i >= len(have) or want[i] != have[i]:
                return p, i
    return None


def _source(spark: Any, staged: Path, kafka: KafkaInput | None) -> Any:
    from pyspark.sql import functions as F

    from cep.spark.live_pass import kafka_seq
    from jobs.session import kafka_jars

    if kafka is None:
        return (spark.readStream.format("text").option("maxFilesPerTrigger", 1)
                .load(str(staged / "*" / "*"))
                .select(F.regexp_extract(F.input_file_name(), r"/([^/]+)/[^/]+$", 1)
                        .alias("stream"), F.col("value"),
                        F.lit(None).cast("bigint").alias("seq")))
    assert kafka_jars()  # the connector is on the session's classpath (get_spark(kafka=True))
    return (spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", kafka.services.bootstrap)
            .option("subscribe", kafka.topic).option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", kafka.per_batch).load()
            .select(F.lit(kafka.stream).alias("stream"), F.col("value").cast("string"),
                    kafka_seq(F.col("partition"), F.col("offset"))
                    .alias("seq")))


def _query(spark: Any, variant: str, staged: Path, plan: Any, factory: Any,
           checkpoint: Path, collector: Collector, kafka: KafkaInput | None = None) -> Any:
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    from cep.runtime.alerts import output_rows
    from cep.spark.operator import OUTPUT_SCHEMA, CepProcessor
    from cep.spark.pipeline import fan_out, packed, parse

    raw = _source(spark, staged, kafka if variant == "ours_kafka" else None)
    raw = raw.where(F.length(F.trim("value")) > 0)
    good = parse(raw, plan).where(F.col("reason").isNull())
    delay = f"{plan.watermark_delay_ms} milliseconds"
    rows = fan_out(good, plan).withWatermark("event_time", delay).drop("event_time")
    if variant == "jvm_only":
        writer = rows.writeStream.format("noop")
    else:
        grouped = rows.groupBy("shard")
        if variant in ("ours", "ours_kafka"):
            # The live job's input: fan-out rows packed per (shard, input batch), as
            # cep.spark.query builds it (the operator reads packs).
            grouped = (packed(fan_out(good, plan)).withWatermark("event_time", delay)
                       .drop("event_time").groupBy("shard"))
            processor = CepProcessor(factory, output_rows, plan.watermark_delay_ms)
            out = grouped.transformWithStateInPandas(
                statefulProcessor=processor, outputStructType=OUTPUT_SCHEMA,
                outputMode="Append", timeMode="EventTime")
        elif variant == "state_only":
            groups = [(g.gid, g.key_field) for g in factory().groups.values()]
            out = grouped.transformWithStateInPandas(
                statefulProcessor=noop_ops.StateOnlyProcessor(groups, STATE_BLOB_BYTES),
                outputStructType=OUTPUT_SCHEMA, outputMode="Append", timeMode="EventTime")
        elif variant == "ceiling_tws":
            out = grouped.transformWithStateInPandas(
                statefulProcessor=noop_ops.NoopProcessor(), outputStructType=OUTPUT_SCHEMA,
                outputMode="Append", timeMode="EventTime")
        else:
            out = grouped.applyInPandasWithState(
                noop_ops.noop_apply, outputStructType=OUTPUT_SCHEMA,
                stateStructType="n long", outputMode="append",
                timeoutConf=GroupStateTimeout.NoTimeout)
        writer = out.writeStream.foreachBatch(collector)
    return (writer.option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True).start())


def _steady(progress: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    data = [p for p in progress if p["numInputRows"] > 0]
    steady = data[warmup:] if len(data) > warmup else data[-1:]
    rows = sum(p["numInputRows"] for p in steady)
    ms = sum(p["durationMs"]["triggerExecution"] for p in steady)
    return {
        "batches": len(data), "steady_batches": len(steady), "steady_events": rows,
        "steady_seconds": ms / 1000, "events_per_s": rows / (ms / 1000) if ms else 0.0,
        "all_events_per_s": sum(p["numInputRows"] for p in data) / max(1e-9, sum(
            p["durationMs"]["triggerExecution"] for p in data) / 1000),
        "batch_ms": [p["durationMs"]["triggerExecution"] for p in data],
        "batch_rows": [p["numInputRows"] for p in data],
        "no_data_batches_ms": [p["durationMs"]["triggerExecution"] for p in progress
                               if p["numInputRows"] == 0],
    }


def run_spark(rules_file: Path, input_dir: Path, work: Path, warmup: int,
              only: tuple[str, ...] = VARIANTS) -> dict[str, Any]:
    from pyspark import cloudpickle

    from cep.engines import RulesEngineFactory
    from cep.spark.pipeline import plan_for
    from jobs.session import get_spark

    cloudpickle.register_pickle_by_value(noop_ops)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # _identity, on the workers
    settings = Settings(shards=SHARDS, shuffle_partitions=4, spark_master="local[2]",
                        checkpoint_dir=str(work / "checkpoints"))
    factory = RulesEngineFactory.from_path(rules_file)
    plan = plan_for(factory.ruleset(), settings.shards)
    t0 = time.perf_counter()
    spark = get_spark(settings, "cep-bench", kafka="ours_kafka" in only)
    spark.conf.set("spark.sql.shuffle.partitions", str(settings.shuffle_partitions))
    out: dict[str, Any] = {"session_start_s": time.perf_counter() - t0, "shards": SHARDS,
                           "shuffle_partitions": settings.shuffle_partitions,
                           "master": settings.spark_master, "rules_file": str(rules_file),
                           "spark_version": spark.version, "variants": {}}
    staged = work / "spark-input"
    _stage(input_dir, staged)
    try:
        for variant in only:
            if variant == "ours_kafka":
                with KafkaInput(work) as kafka:
                    t1 = time.perf_counter()
                    loaded = kafka.load(staged)
                    out["kafka_load"] = {"events": loaded, "seconds": time.perf_counter() - t1,
                                         "partitions": KAFKA_PARTITIONS,
                                         "max_offsets_per_trigger": kafka.per_batch}
                    _variant(spark, variant, staged, plan, factory, work, warmup, out, kafka)
            elif variant not in BATCH_VARIANTS:
                _variant(spark, variant, staged, plan, factory, work, warmup, out, None)
        # The batch variants last, alternated with each other (`_batch_variants`).
        if batch := [v for v in only if v in BATCH_VARIANTS]:
            _batch_variants(spark, batch, input_dir, plan, factory, settings, out)
    finally:
        spark.stop()
    return out


def _variant(spark: Any, variant: str, staged: Path, plan: Any, factory: Any, work: Path,
             warmup: int, out: dict[str, Any], kafka: KafkaInput | None) -> None:
    checkpoint = work / "checkpoints" / variant
    shutil.rmtree(checkpoint, ignore_errors=True)
    collector = Collector()
    started = time.perf_counter()
    with WorkerMemory() as mem:
        q = _query(spark, variant, staged, plan, factory, checkpoint, collector, kafka)
        q.awaitTermination()
    wall = time.perf_counter() - started
    if q.exception() is not None:
        out["variants"][variant] = {"error": str(q.exception())[:2000]}
        return
    res = _steady([dict(p) for p in q.recentProgress], warmup)
    res.update(wall_seconds=wall, operator_events=collector.events,
               operator_stats=dict(collector.stats),
               output_rows=dict(collector.kinds), alerts=sorted(collector.alerts),
               worker_pss_max_bytes=mem.max_pss_total,
               worker_rss_max_bytes=mem.max_rss_single, workers_max=mem.max_workers)
    out["variants"][variant] = res


def _identity(batches: Any) -> Any:
    yield from batches


def _batch_variants(spark: Any, variants: list[str], input_dir: Path, plan: Any, factory: Any,
                    settings: Settings, out: dict[str, Any]) -> None:
    """The batch variants on the same files, alternated: `BATCH_ROUNDS` rounds of one run each,
    the order reversed every round; each variant's figure is the median of its runs after the
    first round (its events/s: events / that median wall time)."""
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    with WorkerMemory() as mem:
        for r in range(BATCH_ROUNDS):
            for variant in (variants if r % 2 == 0 else variants[::-1]):
                runs[variant].append(_batch_run(spark, variant, input_dir, plan, factory,
                                                settings))
    for variant, done in runs.items():
        counted = done[1:] or done
        median = statistics.median(r["wall_seconds"] for r in counted)
        last = done[-1]
        # Beside the streaming variants (whose report reads per-batch progress): out["batch"].
        out.setdefault("batch", {})[variant] = {
            **last, "wall_seconds": median, "events_per_s": last["events"] / median,
            "all_runs_seconds": [r["wall_seconds"] for r in done],
            "counted_runs": len(counted), "rounds": BATCH_ROUNDS,
            "worker_pss_max_bytes": mem.max_pss_total, "workers_max": mem.max_workers}


def _batch_run(spark: Any, variant: str, input_dir: Path, plan: Any, factory: Any,
               settings: Settings) -> dict[str, Any]:
    """One timed run of a batch variant."""
    from pyspark.sql import functions as F

    from cep.runtime.alerts import AlertRow, StatsRow, decode_rows
    from cep.spark.batch import match_bounded, read_files

    files = sorted(p for p in input_dir.iterdir() if p.is_file())
    stream = plan.streams[0].name
    started = time.perf_counter()
    if variant == "replay_batch":
        raw = read_files(spark, stream, files)
        rows = match_bounded(raw, plan, factory, settings.shuffle_partitions).collect()
        wall = time.perf_counter() - started
        events, alerts, tasks = 0, [], 0
        for r in decode_rows(x for x in rows if x.kind != "dead"):
            if isinstance(r, StatsRow):
                events += r.info["events"]
                tasks += 1
            elif isinstance(r, AlertRow):
                rec = r.record()
                alerts.append((r.rule_id, r.key, rec["first_ts"], rec["last_ts"]))
        return {"wall_seconds": wall, "events": events, "tasks": tasks,
                "alerts": sorted(alerts),
                "dead_letters": sum(1 for x in rows if x.kind == "dead")}
    text = spark.read.option("lineSep", "\n").text([str(p) for p in files])
    card = F.get_json_object("value", "$.card")
    shard = F.pmod(F.xxhash64(card), F.lit(SHARDS)).cast("int")
    ts = F.get_json_object("value", "$.ts").cast("long")
    (text.select(shard.alias("shard"), ts.alias("ts"), "value")
     .repartition(settings.shuffle_partitions, "shard").sortWithinPartitions("ts")
     .mapInArrow(_identity, "shard int, ts bigint, value string")
     .write.format("noop").mode("overwrite").save())
    wall = time.perf_counter() - started
    return {"wall_seconds": wall, "events": text.count()}
