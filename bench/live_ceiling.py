"""The live job's throughput against a bare streaming stateful no-op, over the same input.

One Kafka topic (one partition, like bench/latency.py) is loaded before either job runs with
`events` bench-like records (bench/latency.py's background: cards each seen every 20 s of event
time, which no rule matches, event time advancing `rate` events per second). Then, alternated
in the same minutes, each as its own process on Spark local[2] reading the topic from the start
in micro-batches of `--batch` records (`maxOffsetsPerTrigger`), until the topic is read:

- `ours`: `cep run --once --max-offsets-per-trigger B` (jobs/live.py: validation, fan-out,
  packing, the operator with the rules' engine over S shards, delivery to Kafka and Redis);
- `noop`: the same Kafka source and batch size, `shard = pmod(xxhash64('card', Kafka key), S)`
  with S the live job's shards for a new checkpoint (`Settings.live_shards`, `--shards`),
  `groupBy(shard).transformWithStateInPandas` with a processor that reads its rows and keeps
  no state (bench/noop_ops.py `NoopProcessor`), `live_partitions` stateful tasks (the live
  job's setting, read from the same CEP_* environment; one until session 15; not its read
  split, `live_read_task_rows`, which changes nothing at `--batch` up to 25,000, nor its Arrow
  batch size: the no-op's operator reads rows, in Spark's 10,000-row batches), output
  collected by foreachBatch. Its Spark session is the live job's (`jobs.live.live_jvm`: the
  quick JIT, C1, unless `java_options` is set); until session 13 the no-op ran the JVM's
  default JIT while `cep run` ran C1, so the two did not run the same JVM.

Throughput = input rows / the batches' `triggerExecution` time, over the batches after the first
`--skip` (start-up: Python workers, first state stores) and before the last (since session 16:
the batch that reads the topic's last records was ~0.5 s longer than its neighbours in both
jobs, an end of input that a 10-batch run counted as an eighth of its steady time; the figure
with it, as until session 15, is `rows_per_s_with_end`). Every figure is a wall-clock one on a
shared machine; the ratio is what the issue asks (ours ≥ 0.8× the no-op), from the same run.
A 200k-event run has 7 steady batches, and ours' were still falling (C1 compiling, the operator
workers' first calls): `--events 400000` or more for a steady figure.

`python -m bench.live_ceiling --events 200000 --batch 20000 --rounds 2 --json out.json`
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import string
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.latency import BENCH_RULES, COUNTRIES, ROOT, Services, _tree_cpu_s, progress_reports
from cep.config import Settings

CARD_GAP_S = 20.0
_OP_US = ("python_us", "engine_us", "store_us", "timer_us", "encode_us", "write_us", "init_us",
          "prepare_us", "load_us", "read_us", "unzip_us", "import_us", "reload_us")

# The no-op's job, a template (string.Template) so that bench.live_spark_costs runs the same
# job with its own processor, an event-time watermark and timers: `STATEFUL_JOB.substitute`.
STATEFUL_JOB = string.Template(r'''
import json, sys, time
from pathlib import Path
from cep.config import load_settings
from jobs.live import LOCAL_CHECKPOINT_CONF, live_jvm
from jobs.session import get_spark
from pyspark.sql import functions as F
from pyspark import cloudpickle
import $module as ops
cloudpickle.register_pickle_by_value(ops)
bootstrap, topic, batch, shards, ck, out = sys.argv[1:7]
# The live job's JVM options (`live_jvm`: the quick JIT unless java_options is set), as the
# live job's settings are read (CEP_* environment), and its checkpoint file manager.
settings = live_jvm(load_settings(overrides={"kafka_bootstrap": bootstrap}))
spark = get_spark(settings, "$app", kafka=True, extra_conf=LOCAL_CHECKPOINT_CONF)
# The live job's stateful tasks (`live_partitions`, as `cep run` reads it): the same stage.
spark.conf.set("spark.sql.shuffle.partitions", str(settings.live_partitions))
src = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
       .option("subscribe", topic).option("startingOffsets", "earliest")
       .option("maxOffsetsPerTrigger", int(batch)).load())
rows = src.select(F.pmod(F.xxhash64(F.lit("card"), F.col("key").cast("string")),
                         F.lit(int(shards))).cast("int").alias("shard"),
                  F.col("value").cast("string").alias("data"), F.lit(True).alias("primary")$columns)
${watermark}schema = "kind string, rule_id string, key string, id string, payload string"
events = [0]
def sink(df, batch_id):
    for r in df.collect():
        events[0] += json.loads(r.payload)["events"]
q = (rows.groupBy("shard").transformWithStateInPandas(
        statefulProcessor=ops.$processor(), outputStructType=schema,
        outputMode="Append", timeMode="$time_mode")
     .writeStream.foreachBatch(sink).option("checkpointLocation", ck)
     .trigger(availableNow=True).start())
q.awaitTermination()
progress = [json.loads(p.json) for p in q.recentProgress]
Path(out).write_text(json.dumps({"events": events[0], "progress": progress}))
''')
NOOP_JOB = STATEFUL_JOB.substitute(module="bench.noop_ops", app="cep-noop", columns="",
                                   watermark="", processor="NoopProcessor", time_mode="None")


def card_event(i: int, t0: int, rate: int) -> tuple[str, int, str]:
    """The input's event `i` (from event time `t0`, `rate` a second): its card, event time
    and JSON text. Each card is seen every `CARD_GAP_S` of event time (bench/state_moves.py
    reads the same input without Kafka)."""
    n_cards = max(1000, int(rate * CARD_GAP_S))
    card, ts = f"b-{i % n_cards}", t0 + i * 1000 // rate
    return card, ts, (f'{{"ts":{ts},"card":"{card}","amount":'
                      f'{5 + (i * 7919) % 29500 / 100:.2f},"merchant":"m-{i % 500:03d}",'
                      f'"country":"{COUNTRIES[(i % n_cards) % 10]}"}}')


def load_topic(bootstrap: str, topic: str, events: int, rate: int) -> None:
    """`events` records in one partition, event time advancing `rate` per second."""
    from confluent_kafka import Producer

    from cep.delivery.kafka_sink import ensure_topics

    ensure_topics(bootstrap, [topic], partitions=1)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "1",
                  "enable.idempotence": False, "queue.buffering.max.messages": 2_000_000,
                  "queue.buffering.max.kbytes": 1_048_576, "batch.num.messages": 10_000})
    t0 = int(time.time() * 1000) - int(1000 * events / rate) - 60_000
    for i in range(events):
        card, _, body = card_event(i, t0, rate)
        while True:
            try:
                p.produce(topic, body.encode(), card.encode())
                break
            except BufferError:
                p.poll(0.05)
        if i % 10_000 == 0:
            p.poll(0)
    p.flush(120)


def _steady(progress: list[dict[str, Any]], skip: int) -> dict[str, Any]:
    """Rows per second over the batches after the first `skip`, two ways: `rows_per_s` leaves
    out the last batch too (the one that reads the topic's last records, ~0.5 s longer than
    its neighbours in both jobs: an end of input, not a steady batch; session 16), and
    `rows_per_s_with_end` keeps it (the figure until session 15)."""
    batches = [p for p in progress if p.get("numInputRows")]

    def rate(steady: list[dict[str, Any]]) -> tuple[int, int, int | None]:
        rows = sum(int(p["numInputRows"]) for p in steady)
        ms = sum(int(p["durationMs"]["triggerExecution"]) for p in steady)
        return rows, ms, round(1000 * rows / ms) if ms else None

    rows, ms, per_s = rate(batches[skip:-1])
    return {"batches": len(batches), "steady_batches": len(batches[skip:-1]), "rows": rows,
            "ms": ms, "rows_per_s": per_s, "rows_per_s_with_end": rate(batches[skip:])[2],
            "first_batch_ms": batches[0]["durationMs"]["triggerExecution"] if batches else None,
            "batch_ms": [int(p["durationMs"]["triggerExecution"]) for p in batches]}


def _fresh(d: Path) -> Path:
    """A run's directory, emptied: a checkpoint or result left by an earlier run (of another
    broker, another session) must neither be resumed nor read as this run's figures."""
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return d


def _run(cmd: list[str], env: dict[str, str], log: Path,
         cwd: Path = ROOT) -> tuple[int, float, float]:
    """Runs a job in a session of its own; its exit code, wall seconds, CPU seconds."""
    t0 = time.monotonic()
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        cpu = 0.0
        while proc.poll() is None:
            cpu = max(cpu, _tree_cpu_s(proc.pid))
            time.sleep(0.5)
    return proc.returncode, time.monotonic() - t0, cpu


def run_ours(services: Services, work: Path, topic: str, batch: int, skip: int,
             tag: str, shards: int, code: Path | None = None) -> dict[str, Any]:
    """`code`: another checkout to run `cep run` from (`--baseline`: old vs new, alternated in
    the same harness); None: this one."""
    name = "ours" if code is None else "base"
    d = _fresh(work / f"{name}-{tag}")
    (d / "rules").mkdir(parents=True, exist_ok=True)
    (d / "rules" / "fraud.cep").write_text(BENCH_RULES.read_text())
    env = {**os.environ, "CEP_KAFKA_BOOTSTRAP": services.bootstrap,
           "CEP_REDIS_URL": services.redis_url, "CEP_SPARK_MASTER": "local[2]",
           "CEP_DEAD_LETTER_TOPIC": f"{topic}-dlq", "CEP_LATE_TOPIC": f"{topic}-late",
           "PYTHONUNBUFFERED": "1"}
    if code is not None:
        env["PYTHONPATH"] = str(code)
    cmd = [sys.executable, "-m", "cep.cli", "run", "--rules", str(d / "rules"),
           "--checkpoint", str(d / "ck"), "--topic", f"transactions={topic}",
           "--starting-offsets", "earliest", "--once", "--max-offsets-per-trigger", str(batch),
           "--shards", str(shards)]
    rc, wall, cpu = _run(cmd, env, d / "run.log", ROOT if code is None else code)
    progress = [{"numInputRows": q.get("input_rows"), "durationMs": q.get("durations_ms") or {}}
                for q in progress_reports((d / "run.log").read_text(errors="replace"))]
    counters = (json.loads((d / "ck" / "metrics.json").read_text()).get("counters") or {}) \
        if (d / "ck" / "metrics.json").exists() else {}
    # The operator's own time over the whole run, in ms (jobs/metrics.py's counters; a
    # baseline without a counter reports none).
    operator = {k.removesuffix("_us") + "_ms": counters[k] // 1000 for k in _OP_US
                if k in counters}
    operator.update({k: counters[k] for k in ("state_compactions", "state_reloads",
                                              "state_catchups", "state_reads",
                                              "state_shared_rows", "state_budget_none")
                     if k in counters})
    return {"variant": name, "shards": shards, "exit": rc, "wall_s": round(wall, 1),
            "cpu_s": round(cpu, 1), "events": counters.get("events"), **_steady(progress, skip),
            "operator": operator}


def run_noop(services: Services, work: Path, topic: str, batch: int, skip: int,
             tag: str, shards: int, *, job: str = NOOP_JOB, variant: str = "noop",
             ) -> dict[str, Any]:
    """The no-op job (or another rendering of `STATEFUL_JOB`, named `variant`)."""
    d = _fresh(work / f"{variant}-{tag}")
    out = d / "out.json"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-c", job, services.bootstrap, topic, str(batch), str(shards),
           str(d / "ck"), str(out)]
    rc, wall, cpu = _run(cmd, env, d / "run.log")
    res = json.loads(out.read_text()) if out.exists() else {"progress": [], "events": None}
    return {"variant": variant, "shards": shards, "exit": rc, "wall_s": round(wall, 1),
            "cpu_s": round(cpu, 1), "events": res["events"], **_steady(res["progress"], skip)}


def measure(events: int, batch: int, rate: int, rounds: int, skip: int, work: Path,
            shards: int, *, baseline: Path | None = None, base_shards: int | None = None,
            noop: bool = True) -> dict[str, Any]:
    """The runs above, in turn per round, and each round's ratios: `ratios[r]` maps "noop" (and
    "base" with a `baseline`) to ours' steady rows/s over that job's, and "<other>_with_end" to
    the same with the last batch kept."""
    work.mkdir(parents=True, exist_ok=True)
    services = Services(work / "services")
    out: dict[str, Any] = {"events": events, "batch": batch, "rate": rate,
                           "load_start": os.getloadavg(), "runs": [], "ratios": []}
    try:
        services.start()
        topic = f"ceiling-{os.getpid()}"
        load_topic(services.bootstrap, topic, events, rate)
        for r in range(rounds):
            ours = functools.partial(run_ours, shards=shards)
            jobs: list[Any] = [functools.partial(run_noop, shards=shards)] if noop else []
            if baseline is not None:  # old and new in turn: which goes first alternates
                base = functools.partial(run_ours, code=baseline, shards=base_shards or shards)
                jobs += [base, ours] if r % 2 == 0 else [ours, base]
            else:
                jobs.append(ours)
            for fn in jobs:
                res = fn(services, work, topic, batch, skip, str(r))
                res["load"] = os.getloadavg()
                out["runs"].append(res)
                print(json.dumps({k: v for k, v in res.items() if k != "batch_ms"}), flush=True)
    finally:
        services.stop()
    out["load_end"] = os.getloadavg()
    per = len(out["runs"]) // max(1, rounds)
    for r in range(rounds):
        pair = {x["variant"]: x for x in out["runs"][per * r:per * r + per]}
        ratios: dict[str, float] = {}
        for other in ("base", "noop"):
            if pair.get(other, {}).get("rows_per_s") and pair["ours"].get("rows_per_s"):
                o, b = pair["ours"], pair[other]
                ratios[other] = o["rows_per_s"] / b["rows_per_s"]
                ratios[f"{other}_with_end"] = o["rows_per_s_with_end"] / b["rows_per_s_with_end"]
                print(f"round {r}: ours {o['rows_per_s']:,} rows/s, {other} "
                      f"{b['rows_per_s']:,} rows/s: ratio {ratios[other]:.2f} (with the last "
                      f"batch, as until session 15: {ratios[other + '_with_end']:.2f})")
        out["ratios"].append(ratios)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.live_ceiling")
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=20_000)
    ap.add_argument("--rate", type=int, default=20_000, help="event-time rate of the input")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--skip", type=int, default=2, help="start-up batches left out")
    ap.add_argument("--work", type=Path, default=Path("/tmp/cep-live-ceiling"))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--baseline", type=Path,
                    help="also run `cep run` from this checkout each round (old vs new)")
    ap.add_argument("--no-noop", action="store_true", help="leave the no-op out (A/B only)")
    ap.add_argument("--shards", type=int, default=Settings().live_shards,
                    help="the live job's shards (and the no-op's); default: the setting's")
    ap.add_argument("--base-shards", type=int, help="the baseline's shards (default: --shards)")
    a = ap.parse_args(argv)
    out = measure(a.events, a.batch, a.rate, a.rounds, a.skip, a.work, a.shards,
                  baseline=a.baseline, base_shards=a.base_shards, noop=not a.no_noop)
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
