"""End-to-end latency of the live job: an event produced to Kafka → its alert readable in Redis.

`cep run` (jobs/live.py) runs as its own process on Spark local[2] against a real Kafka broker
and Redis server (started here with scripts/kafka.sh and scripts/redis.sh, stopped after). In
this process:

- a producer thread (confluent-kafka) paces events into the input topic at a fixed rate, in
  bursts every 10 ms, with event time = the wall clock at the burst, so the watermark advances in
  real time and nothing is late. Background: cards visited round-robin, each card every 20 s
  (5 charges then span 80 s: `velocity`'s 1 minute never fits), amounts 5-300, one country per
  card, so no rule ever matches the background. Injected: ~30 patterns a second, each on a card
  of its own, cycling through card_testing (3 charges < 2.00 then one of 800, 0.5 s apart),
  velocity (5 charges 1 s apart) and impossible_travel (two countries 1 s apart). The wall time
  at which the pattern's *completing* event is handed to the producer is recorded under the
  alert's identity (rule, card, last ts);
- a reader thread blocks on XREAD over the rules' Redis streams and records when each alert
  becomes readable; latency = that time − the completing event's produce time;
- a monitor thread polls the job's metrics.json (jobs/metrics.py) for every micro-batch of the
  `alerts` query: duration, input rows, offsets (for the consumer lag).

One job runs all rates in a row (warm-up first, a short settle between rates). Alerts whose
completing event was produced in a rate's measuring window are that rate's sample; an alert not
in Redis by the end of the drain counts as "more than" its wait so far (a censored sample), so a
percentile that falls on one is shown as "> x s" rather than dropped.

`python -m bench.latency [--quick]` runs it on its own and prints the Markdown section.
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import itertools
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cep.grammar import DURATION_UNITS

ROOT = Path(__file__).resolve().parent.parent
BENCH_RULES = ROOT / "bench" / "rules" / "fraud.cep"
RULE_IDS = ("card_testing", "velocity", "impossible_travel")
COUNTRIES = ("NL", "DE", "FR", "BE", "ES", "IT", "GB", "US", "BR", "JP")
TICK_S = 0.010            # the producer's burst interval
CARD_GAP_S = 20.0         # a background card is seen every 20 s (velocity: 5 within 1 min)
INJECT_PER_S = 30.0       # injected patterns (= expected alerts) per second
SETTLE_S = 5.0            # between two rates: the previous rate's backlog is not measured
WARMUP_EXTRA_S = 30.0     # the longest the warm-up waits, past `warmup`, for the job to catch up
DRAIN_S = 15.0            # after the last rate, the longest wait for the measured alerts
PREWARM_RATE = 500        # events/s until the job's first (slow) micro-batch is done
PREWARM_MAX_S = 180.0     # the longest the first micro-batch may take
PERCENTILES = (50, 95, 99)
COMPARE_RATE = 1000       # lateness / trigger variants run here, where the job keeps up
OVERLOAD_S = 10.0         # once a rate was not kept up with, the higher ones are measured this long
OVERLOAD_LAG_S = 10.0     # ... that is, once its lag was over this many seconds of input
# The no-progress guard (`LiveJob.check_progress`): a job that is alive but has neither started
# its query nor finished a micro-batch that read new input for this long is stuck, whatever
# the machine's load (its slowest first batch seen here: ~150 s at load 28). Not a latency
# bound: any progress, however slow, resets it. `CEP_LATENCY_STALL_S` overrides it.
STALL_S = float(os.environ.get("CEP_LATENCY_STALL_S", "900"))


class LatencyBenchError(RuntimeError):
    pass


# -- services -------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _script(args: list[str], what: str, timeout: float = 180) -> None:
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise LatencyBenchError(f"{what} failed to start (exit {proc.returncode}): "
                                f"{' '.join(args)}\n{proc.stdout}{proc.stderr}")


@dataclass
class Services:
    """A Kafka broker and a Redis server of our own, on free loopback ports."""

    work: Path
    kafka_port: int = field(default_factory=_free_port)
    redis_port: int = field(default_factory=_free_port)
    started: list[str] = field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def start(self) -> None:
        # Fresh services: an earlier run's folder holds its topics and keys (the spark step's
        # create_topics failed on TOPIC_ALREADY_EXISTS in a second make bench, 2026-11-27).
        shutil.rmtree(self.work, ignore_errors=True)
        _script(["bash", "scripts/kafka.sh", "start", "--port", str(self.kafka_port),
                 "--controller-port", str(_free_port()), "--dir", str(self.work / "kafka")],
                "Kafka broker (scripts/kafka.sh)")
        self.started.append("kafka")
        _script(["bash", "scripts/redis.sh", "start", "--port", str(self.redis_port),
                 "--dir", str(self.work / "redis")], "Redis server (scripts/redis.sh)")
        self.started.append("redis")
        # A fresh broker creates its transaction-state topic at the first transaction, which
        # would otherwise land in the first job's first micro-batch.
        from confluent_kafka import Producer

        p = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": "latency-warm"})
        p.init_transactions(60)
        p.begin_transaction()
        p.produce("latency-warm", b"x")
        p.commit_transaction(60)

    def stop(self) -> None:
        if "redis" in self.started:
            subprocess.run(["bash", "scripts/redis.sh", "stop", "--dir", str(self.work / "redis")],
                           cwd=ROOT, capture_output=True, timeout=30)
        if "kafka" in self.started:
            subprocess.run(["bash", "scripts/kafka.sh", "stop", "--dir", str(self.work / "kafka")],
                           cwd=ROOT, capture_output=True, timeout=60)
        self.started.clear()


# -- the job ----------------------------------------------------------------------------------
LATENESS_CLAUSE = re.compile(r"LATENESS\s+(\d+\s*(?:ms|s|m|h|d))\b")


def rules_lateness(text: str) -> str:
    """The rule file's one LATENESS (e.g. "5s")."""
    found = LATENESS_CLAUSE.findall(text)
    if len(found) != 1:
        raise LatencyBenchError(f"expected one LATENESS clause in the rules, found {len(found)}")
    return found[0]


def rules_with_lateness(text: str, lateness: str | None) -> str:
    """The rule file with the stream's LATENESS replaced (None: unchanged)."""
    if lateness is None:
        return text
    rules_lateness(text)  # exactly one
    return LATENESS_CLAUSE.sub(f"LATENESS {lateness}", text)


BENCH_LATENESS = rules_lateness(BENCH_RULES.read_text())


@dataclass
class Variant:
    """One `cep run` process: a rule file's lateness, a trigger, the rates it is driven at."""

    name: str
    lateness: str | None       # None: the bench rules' own (BENCH_LATENESS)
    trigger: str               # the `trigger` setting (cep/config.py): default = every 1 s
    rates: tuple[int, ...]
    seconds: float
    warmup: float


class LiveJob:
    def __init__(self, services: Services, work: Path, variant: Variant) -> None:
        self.services = services
        self.variant = variant
        self.dir = work / variant.name
        shutil.rmtree(self.dir, ignore_errors=True)
        (self.dir / "rules").mkdir(parents=True)
        text = rules_with_lateness(BENCH_RULES.read_text(), variant.lateness)
        (self.dir / "rules" / "fraud.cep").write_text(text)
        self.ck = self.dir / "ck"
        self.log = self.dir / "run.log"
        self.topic = f"lat-{variant.name}-{os.getpid()}"
        self.proc: subprocess.Popen[bytes] | None = None
        # The last sign of progress (wall clock): the start, the query started, a finished
        # micro-batch that read new input (`MetricsMonitor`); `check_progress` fails past it.
        self.progress_at = time.time()
        self.progress_what = "the job was started"
        self.stall_s = STALL_S
        self.args = ["--rules", str(self.dir / "rules"), "--checkpoint", str(self.ck),
                     "--topic", f"transactions={self.topic}", "--starting-offsets", "earliest"]
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1",
                    "CEP_KAFKA_BOOTSTRAP": services.bootstrap, "CEP_REDIS_URL": services.redis_url,
                    "CEP_SPARK_MASTER": "local[2]", "CEP_TRIGGER": variant.trigger,
                    "CEP_DEAD_LETTER_TOPIC": f"{self.topic}-dlq",
                    "CEP_LATE_TOPIC": f"{self.topic}-late"}

    @property
    def command(self) -> str:
        return (f"CEP_TRIGGER={self.variant.trigger} cep run " + " ".join(self.args))

    def start(self) -> None:
        from cep.delivery.kafka_sink import ensure_topics

        # One partition: the event times in it only grow, so even LATENESS 0s sees no late
        # event (Spark keeps one watermark over all partitions: docs/spark-runtime.md).
        ensure_topics(self.services.bootstrap, [self.topic], partitions=1)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cep.cli", "run", *self.args], cwd=ROOT, env=self.env,
            stdout=self.log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
        self.progressed("the job was started")

    def progressed(self, what: str) -> None:
        self.progress_at, self.progress_what = time.time(), what

    def check_progress(self) -> None:
        """Raise if the job has exited, or if it is alive and has made no progress (see
        `progress_at`) for `stall_s` seconds: a stuck job fails the run with a clear message
        instead of hanging it (the patient mode has no other bound)."""
        if self.proc is not None and self.proc.poll() is not None:
            raise LatencyBenchError(f"`cep run` exited {self.proc.returncode} mid-run:\n"
                                    f"{self.log_tail()}")
        idle = time.time() - self.progress_at
        if idle > self.stall_s:
            raise LatencyBenchError(
                f"`cep run` is alive but made no progress for {idle:.0f} s (the limit, "
                f"CEP_LATENCY_STALL_S, is {self.stall_s:.0f} s): the last progress was "
                f"{self.progress_what!r}; no micro-batch has read new input since. "
                f"Its log ({self.log}) ends:\n{self.log_tail()}")

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except FileNotFoundError:
            return ""

    def wait_started(self, timeout: float | None = 180) -> float:
        """Seconds until the `alerts` query reported itself started (`timeout` None: for as
        long as the job runs)."""
        t0 = time.monotonic()
        while timeout is None or time.monotonic() - t0 < timeout:
            if self.proc is not None and self.proc.poll() is not None:
                raise LatencyBenchError(
                    f"`cep run` exited {self.proc.returncode} before its query started:\n"
                    f"{self.log_tail()}")
            if "query started: alerts" in self.log_tail(10**7):
                self.progressed("its query started")
                return time.monotonic() - t0
            self.check_progress()
            time.sleep(0.2)
        raise LatencyBenchError(f"`cep run` did not start its query in {timeout} s:\n"
                                f"{self.log_tail()}")

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        os.killpg(self.proc.pid, signal.SIGINT)  # the job stops its queries on the way out
        try:
            return self.proc.wait(40)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(20)

    def metrics(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads((self.ck / "metrics.json").read_text())
            return data
        except (FileNotFoundError, json.JSONDecodeError):
            return {}


# -- load generation ------------------------------------------------------------------------
@dataclass
class Phase:
    rate: int
    start: float        # wall clock (time.time())
    measure_from: float
    end: float


class Producer(threading.Thread):
    """Paces background and injected events into the topic at `rate` (changed by `set_rate`)."""

    def __init__(self, bootstrap: str, topic: str, tag: str) -> None:
        super().__init__(name="latency-producer", daemon=True)
        from confluent_kafka import Producer as KafkaProducer

        self.producer = KafkaProducer({
            "bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "1",
            "enable.idempotence": False, "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 1_048_576, "batch.num.messages": 10_000})
        self.topic = topic
        self.tag = tag
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._rate = 0
        self._since = time.time()
        self._segment = 0
        self._tie = itertools.count()
        # (rule, card, last ts) -> produce wall time of the completing event
        self.completing: dict[tuple[str, str, int], float] = {}
        self.produced: list[tuple[float, int]] = []  # (wall time, events so far), per tick
        self.total = 0

    def set_rate(self, rate: int) -> None:
        with self._lock:
            self._rate, self._since, self._segment = rate, time.time(), self._segment + 1

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            self.error = exc

    def _send(self, card: str, body: str) -> None:
        try:
            self.producer.produce(self.topic, body.encode(), card.encode())
        except BufferError:
            self.producer.poll(0.05)
            self.producer.produce(self.topic, body.encode(), card.encode())
        self.total += 1

    def _run(self) -> None:
        amounts = [f"{5 + (i * 7919) % 29500 / 100:.2f}" for i in range(1000)]
        pending: list[tuple[float, int, str | None, str, str, float]] = []  # injected, by due
        inject_seq = itertools.count()
        kinds = itertools.cycle(RULE_IDS)
        segment, sent, injected = -1, 0, 0
        inject_since = time.time()
        while not self.stop_flag.is_set():
            now = time.time()
            with self._lock:
                rate, since, seg = self._rate, self._since, self._segment
            if seg != segment:  # a new rate: new cards, so no card is seen sooner than 20 s
                segment, sent = seg, 0
                n_cards = max(1000, int(rate * CARD_GAP_S))
                prefix = f"b{self.tag}{seg}-"
            ts = int(now * 1000)
            target = int((now - since) * rate)
            while sent < target:
                i = sent % n_cards
                card = f"{prefix}{i}"
                self._send(card, f'{{"ts":{ts},"card":"{card}","amount":'
                           f'{amounts[sent % 1000]},"merchant":"m-{sent % 500:03d}",'
                           f'"country":"{COUNTRIES[i % 10]}"}}')
                sent += 1
            while injected < int((now - inject_since) * INJECT_PER_S):
                self._schedule(pending, next(kinds), f"i{self.tag}-{next(inject_seq)}", now)
                injected += 1
            while pending and pending[0][0] <= now:
                _, _, rule, card, country, amount = heapq.heappop(pending)
                self._send(card, f'{{"ts":{ts},"card":"{card}","amount":{amount:.2f},'
                           f'"merchant":"m-inj","country":"{country}"}}')
                if rule:  # the completing event
                    self.completing[(rule, card, ts)] = time.time()
            self.producer.poll(0)
            self.produced.append((now, self.total))
            time.sleep(max(0.0, TICK_S - (time.time() - now)))
        self.producer.flush(30)

    def _schedule(self, pending: list[Any], kind: str, card: str, now: float) -> None:
        # (due, tiebreak, rule-if-completing, card, country, amount)
        steps: list[tuple[float, str | None, str, float]]
        if kind == "card_testing":
            steps = [(0.5 * j, None, "NL", 0.5 + 0.4 * j) for j in range(3)]
            steps.append((1.5, kind, "NL", 800.0))
        elif kind == "velocity":
            steps = [(1.0 * j, kind if j == 4 else None, "DE", 20.0 + j) for j in range(5)]
        else:
            steps = [(0.0, None, "FR", 50.0), (1.0, kind, "US", 60.0)]
        for dt, rule, country, amount in steps:
            heapq.heappush(pending, (now + dt, next(self._tie), rule, card, country, amount))


class RedisReader(threading.Thread):
    """XREAD BLOCK over the rules' alert streams; records when each alert became readable."""

    def __init__(self, url: str) -> None:
        super().__init__(name="latency-reader", daemon=True)
        import redis

        self.client = redis.Redis.from_url(url, decode_responses=True, socket_timeout=10)
        # From the start: the variant flushed the database before its job started ('$' would
        # miss entries added to a stream between two calls while it has none of ours yet).
        self.last = {f"cep:alerts:{r}": "0-0" for r in RULE_IDS}
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None
        # (rule, card, last ts) -> (read wall time, XADD ms from the entry id, emitted_at ms)
        self.arrived: dict[tuple[str, str, int], tuple[float, int, int]] = {}
        self.entries = 0
        self.reads = 0  # XREAD calls done

    def run(self) -> None:
        try:
            while not self.stop_flag.is_set():
                got: Any = self.client.xread(self.last, count=5000,  # type: ignore[arg-type]
                                             block=100)
                now = time.time()
                for stream, entries in got or []:
                    for entry_id, fields in entries:
                        self.last[stream] = entry_id
                        self.entries += 1
                        a = json.loads(fields["data"])
                        key = (a["rule_id"], a["key"], int(a["last_ts"]))
                        self.arrived.setdefault(
                            key, (now, int(entry_id.split("-")[0]), int(a.get("emitted_at", 0))))
                self.reads += 1  # after its entries are recorded
        except BaseException as exc:  # noqa: BLE001
            self.error = exc


class MetricsMonitor(threading.Thread):
    """Every micro-batch of the `alerts` query, from the job's metrics.json."""

    def __init__(self, job: LiveJob) -> None:
        super().__init__(name="latency-metrics", daemon=True)
        self.job = job
        self.stop_flag = threading.Event()
        self.batches: dict[int, dict[str, Any]] = {}
        self.last: dict[str, Any] = {}
        # (wall time, CPU seconds of the job's process tree so far), every ~0.5 s
        self.cpu: list[tuple[float, float]] = []
        # ... and of what shares the machine with it: this process (the producer, the Redis
        # reader, this monitor) and the Kafka broker and Redis server (`_service_cpu_s`)
        self.bench_cpu: list[tuple[float, float]] = []
        self.services_cpu: list[tuple[float, float]] = []
        self.consumed = -1  # the most input a finished micro-batch has read

    def run(self) -> None:
        tick = 0
        while not self.stop_flag.is_set():
            if tick % 5 == 0 and self.job.proc is not None:
                now = time.time()
                self.cpu.append((now, _tree_cpu_s(self.job.proc.pid)))
                self.bench_cpu.append((now, time.process_time()))
                self.services_cpu.append((now, _service_cpu_s(self.job.services.work)))
            tick += 1
            m = self.job.metrics()
            q = (m.get("queries") or {}).get("alerts") or {}
            b = q.get("batch")
            if isinstance(b, int) and b not in self.batches:
                consumed = _consumed(q.get("sources"))
                self.batches[b] = {**q, "seen": time.time(), "consumed": consumed,
                                   # cumulative: the operator's stats summed up to this batch
                                   "counters": dict(m.get("counters") or {}),
                                   # ... and the job's CPU seconds when the batch was seen
                                   "cpu_s": (None if self.job.proc is None else
                                             _tree_cpu_s(self.job.proc.pid))}
                if consumed is not None and consumed > self.consumed:
                    self.consumed = consumed
                    self.job.progressed(f"micro-batch {b} read input up to offset {consumed}")
            if m:
                self.last = m
            time.sleep(0.1)


def _tree_cpu_s(session: int) -> float:
    """CPU seconds (user + system) used so far by the processes of session `session` (the job
    runs in a session of its own: its JVM, the Python workers), counting their reaped children;
    a load-robust measure of the work, where wall-clock durations are not on a shared machine."""
    ticks = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                rest = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        if int(rest[3]) == session:
            ticks += sum(int(x) for x in rest[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def _service_cpu_s(work: Path) -> float:
    """CPU seconds used so far by the Kafka broker and the Redis server under `work` (their
    pid files: scripts/kafka.sh, scripts/redis.sh): the load that shares the job's cores."""
    ticks = 0
    for pidfile in (work / "kafka" / "kafka.pid", work / "redis" / "redis.pid"):
        try:
            with open(f"/proc/{int(pidfile.read_text().split()[0])}/stat") as f:
                ticks += sum(int(x) for x in f.read().rpartition(")")[2].split()[11:13])
        except (OSError, ValueError, IndexError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


def _cpu_between(samples: list[tuple[float, float]], t0: float, t1: float) -> float | None:
    """CPU seconds the job used between wall times t0 and t1 (nearest samples)."""
    before = [c for t, c in samples if t <= t0]
    after = [c for t, c in samples if t >= t1]
    if not before or not after:
        return None
    return after[0] - before[-1]


def _consumed(sources: Any) -> int | None:
    """Input offsets a batch has read up to, summed over partitions (topics start at 0)."""
    from jobs.metrics import kafka_offsets

    total = 0
    for s in sources or []:
        end = kafka_offsets(s.get("end"))
        if end is None:
            return None
        total += sum(end.values())
    return total


# -- statistics -----------------------------------------------------------------------------
def percentile(values: list[tuple[float, bool]], p: float) -> tuple[float, bool] | None:
    """Nearest-rank percentile of (latency s, censored) samples; censored = lower bound."""
    if not values:
        return None
    ordered = sorted(values)
    idx = max(0, min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1))
    return ordered[idx]


def _produced_at(producer: Producer, t: float) -> int:
    best = 0
    for when, total in producer.produced:
        if when > t:
            break
        best = total
    return best


def phase_stats(ph: Phase, producer: Producer, reader: RedisReader,
                batches: dict[int, dict[str, Any]], drained_at: float,
                cpu: list[tuple[float, float]] | None = None,
                others: dict[str, list[tuple[float, float]]] | None = None) -> dict[str, Any]:
    samples: list[tuple[float, bool]] = []
    to_xadd: list[float] = []
    spark_part: list[float] = []
    delivery_part: list[float] = []
    expected = 0
    for key, sent in producer.completing.items():
        if not ph.measure_from <= sent < ph.end:
            continue
        expected += 1
        got = reader.arrived.get(key)
        if got is None:
            samples.append((drained_at - sent, True))
            continue
        read_at, xadd_ms, emitted_ms = got
        samples.append((read_at - sent, False))
        to_xadd.append(xadd_ms / 1000 - sent)
        if emitted_ms:
            spark_part.append(emitted_ms / 1000 - sent)
            delivery_part.append(read_at - emitted_ms / 1000)
    arrived = [v for v, c in samples if not c]
    window = ph.end - ph.measure_from
    produced = _produced_at(producer, ph.end) - _produced_at(producer, ph.measure_from)
    in_phase = [b for b in batches.values() if ph.measure_from <= b["seen"] < ph.end]
    durations = [b["batch_ms"] for b in in_phase if isinstance(b.get("batch_ms"), int | float)]
    rows = sum(int(b.get("input_rows") or 0) for b in in_phase)
    lag_end, lag_start = _lag(producer, batches, ph.end), _lag(producer, batches, ph.measure_from)
    rate = produced / window if window > 0 else 0.0
    out: dict[str, Any] = {
        "rate_target": ph.rate, "window_s": round(window, 1),
        "achieved_rate": round(rate), "alerts_expected": expected,
        "alerts_arrived": len(arrived),
        "latency_s": {f"p{p}": _pct(samples, p) for p in PERCENTILES},
        "max_s": (round(max(arrived), 3) if arrived and len(arrived) == len(samples) else
                  _pct(samples, 100)),
        "min_s": round(min(arrived), 3) if arrived else None,
        "arrived_max_s": round(max(arrived), 3) if arrived else None,
        "to_xadd_p50_s": _pct([(v, False) for v in to_xadd], 50),
        "to_emitted_p50_s": _pct([(v, False) for v in spark_part], 50),
        "emitted_to_read_p50_s": _pct([(v, False) for v in delivery_part], 50),
        "batches": len(in_phase),
        "batch_ms": sorted(durations),
        "batch_ms_p50": _med(durations),
        "batch_ms_max": max(durations) if durations else None,
        "input_rows": rows,
        "processed_rows_per_s": (round(rows / sum(durations) * 1000) if durations and
                                 sum(durations) > 0 else None),
        "lag_events_start": lag_start, "lag_events_end": lag_end,
        "batch_detail": _batch_detail(batches, in_phase),
    }
    # Keys the engine ran per event (each event's key twice, buffered then released, unless
    # one call does both; more while an earlier rate's cards wake at their deadlines).
    ops = [b["operator"] for b in out["batch_detail"] if b["operator"]]
    events = sum(o["events"] for o in ops)
    out["keys_touched_per_event"] = (round(sum(o["keys_touched"] for o in ops) / events, 2)
                                     if events else None)
    # The job's CPU over the window, per input row of the batches that ended in it.
    used = _cpu_between(cpu or [], ph.measure_from, ph.end)
    out["job_cpu_s"] = None if used is None else round(used, 2)
    out["job_cpu_cores"] = None if used is None or window <= 0 else round(used / window, 2)
    # What else ran on the machine's cores meanwhile (`bench_cpu_cores`: this process, i.e.
    # the producer; `services_cpu_cores`: the Kafka broker and Redis).
    for name, used_by in (others or {}).items():
        spent = _cpu_between(used_by, ph.measure_from, ph.end)
        out[f"{name}_cpu_cores"] = (None if spent is None or window <= 0
                                    else round(spent / window, 2))
    out["job_cpu_us_per_row"] = (None if used is None or not rows
                                 else round(1e6 * used / rows, 1))
    med = (out["batch_ms_p50"] or 0) / 1000
    lag_s = None if lag_end is None or rate <= 0 else lag_end / rate
    out["lag_s_end"] = None if lag_s is None else round(lag_s, 1)
    growing = (lag_end is not None and lag_start is not None
               and lag_end - lag_start > 2 * max(rate, 1))
    out["kept_up"] = (lag_s is not None and lag_s <= max(3.0, 2 * med + 1.5)
                      and not growing and len(arrived) == expected)
    return out


# The operator's per-call stats (summed over a batch's calls, from the job's counters).
_OP_COUNTERS = ("events", "python_us", "rows_in_us", "prepare_us", "engine_us", "store_us",
                "timer_us", "encode_us", "write_us", "state_writes", "state_reads",
                "state_reloads", "state_compactions", "keys_touched", "load_us", "read_us",
                "state_catchups", "init_us", "unzip_us", "import_us", "reload_us")


def _batch_detail(batches: dict[int, dict[str, Any]],
                  in_phase: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per batch of the phase: rows, Spark's durationMs, the operator's time (the change of
    the job's counters since the previous batch seen) and the job's CPU seconds meanwhile
    (`job_cpu_s`: its process tree's, between the monitor's sightings of the previous batch and
    this one; None when the monitor missed the previous batch)."""
    out = []
    for b in sorted(in_phase, key=lambda x: x["batch"]):
        prev = batches.get(b["batch"] - 1)
        now_c, prev_c = b.get("counters") or {}, (prev or {}).get("counters")
        op = ({k: int(now_c.get(k, 0)) - int(prev_c.get(k, 0)) for k in _OP_COUNTERS}
              if prev_c is not None else None)
        cpu0, cpu1 = (prev or {}).get("cpu_s"), b.get("cpu_s")
        out.append({"batch": b["batch"], "input_rows": b.get("input_rows"),
                    "job_cpu_s": (None if cpu0 is None or cpu1 is None
                                  else round(cpu1 - cpu0, 2)),
                    "durations_ms": b.get("durations_ms"), "operator": op,
                    "state_ms": b.get("state_ms"), "state_custom": b.get("state_custom"),
                    "delivery": {k: v for k, v in (b.get("last_delivery") or {}).items()
                                 if k in ("batch_id", "records", "collect_ms", "route_ms",
                                          "sinks_ms")}})
    return out


def _pct(samples: list[tuple[float, bool]], p: float) -> dict[str, Any] | None:
    r = percentile(samples, p)
    return None if r is None else {"s": round(r[0], 3), "lower_bound": r[1]}


def _med(xs: list[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return float(s[len(s) // 2])


def _lag(producer: Producer, batches: dict[int, dict[str, Any]], t: float) -> int | None:
    """Events produced by `t` that no batch finished by `t` had read."""
    done = [b["consumed"] for b in batches.values()
            if b["seen"] <= t and b.get("consumed") is not None]
    if not done:
        return None
    return max(0, _produced_at(producer, t) - max(done))


# -- where an alert's latency went ----------------------------------------------------------
def lateness_ms(lateness: str | None) -> int:
    """A variant's LATENESS in ms (None: the bench rules' own, BENCH_LATENESS)."""
    text = lateness or BENCH_LATENESS
    m = re.fullmatch(r"(\d+)\s*(ms|s|m|h|d)", text.strip())
    if m is None:
        raise LatencyBenchError(f"unreadable LATENESS {text!r}")
    return int(m.group(1)) * DURATION_UNITS[m.group(2)]


def progress_reports(log_text: str) -> list[dict[str, Any]]:
    """The progress reports jobs/metrics.py logged in a job's log, in order (a line cut short
    is skipped)."""
    out = []
    for line in log_text.splitlines():
        _, sep, rest = line.partition(" cep.metrics progress ")
        if sep:
            try:
                out.append(json.loads(rest))
            except json.JSONDecodeError:
                continue
    return out


def logged_batches(log_text: str) -> list[dict[str, Any]]:
    """Every micro-batch from the job's log (jobs/metrics.py logs each progress report; the live
    job runs one query, `alerts`, and the logged report has no query name): batch id, start
    (epoch s, Spark's trigger timestamp), end (start + its triggerExecution) and durationMs.
    The metrics file holds only the last batch; its poller can miss one."""
    out: dict[int, dict[str, Any]] = {}
    for q in progress_reports(log_text):
        start = _iso_s(q.get("started"))
        dur = q.get("durations_ms") or {}
        if not isinstance(q.get("batch"), int) or start is None:
            continue
        total = dur.get("triggerExecution")
        out[q["batch"]] = {"batch": q["batch"], "start": start,
                           "end": None if total is None else start + total / 1000,
                           "input_rows": q.get("input_rows"), "durations_ms": dur,
                           "counters": q.get("counters"), "state_ms": q.get("state_ms"),
                           "state_custom": q.get("state_custom"),
                           "delivery": q.get("last_delivery")}
    return [out[b] for b in sorted(out)]


def _iso_s(text: Any) -> float | None:
    ms = _watermark_ms(text)
    return None if ms is None else ms / 1000


def alert_breakdown(producer: Producer, reader: RedisReader, batches: list[dict[str, Any]],
                    lateness: int, t0: float, t1: float) -> list[dict[str, Any]]:
    """Per alert whose completing event was produced in [t0, t1): its latency − LATENESS cut
    into links, in seconds:
    - `release`: from the completing event + LATENESS to the producer's first tick whose event
      time is LATENESS past it (the event that lets the engine release the match; ~0);
    - `wait`: from that tick to the start of the micro-batch that emitted the alert;
    - `skipped`: batches that started in between (0: the emitting batch was the first to start
      after the releasing event was produced; 1: the event missed a batch's offsets, e.g. it
      was still in the producer's or the broker's buffers when that batch looked);
    - `run`: from the emitting batch's start to `emitted_at` (its Spark job, before the sinks);
    - `deliver`: `emitted_at` → readable in Redis (the Kafka transaction, the Redis write, the
      reader's XREAD)."""
    ticks = [t for t, _ in producer.produced]
    starts = [b["start"] for b in batches]
    rows: list[dict[str, Any]] = []
    for key, sent in _items(producer.completing):
        got = reader.arrived.get(key)
        if not t0 <= sent < t1 or got is None or not got[2]:
            continue
        read_at, _, emitted_ms = got
        emitted = emitted_ms / 1000
        due = (key[2] + lateness) / 1000  # event time at which the match can be released
        i = bisect.bisect_left(ticks, due)
        release_at = ticks[i] if i < len(ticks) else None
        j = bisect.bisect_right(starts, emitted) - 1  # the batch running at emitted_at
        row: dict[str, Any] = {"rule": key[0], "latency": round(read_at - sent - lateness / 1000,
                                                                 3),
                               "deliver": round(read_at - emitted, 3)}
        if j >= 0 and release_at is not None:
            b = batches[j]
            prev_end = None if j == 0 else batches[j - 1]["end"]
            row.update(batch=b["batch"], release=round(release_at - sent - lateness / 1000, 3),
                       wait=round(b["start"] - release_at, 3), run=round(emitted - b["start"], 3),
                       skipped=max(0, j - bisect.bisect_left(starts, release_at)),
                       batch_s=(None if b["end"] is None else round(b["end"] - b["start"], 3)),
                       prev_batch_s=(None if prev_end is None else
                                     round(prev_end - batches[j - 1]["start"], 3)),
                       gap_s=None if prev_end is None else round(b["start"] - prev_end, 3))
        rows.append(row)
    return rows


_ROCKSDB_KEYS = ("rocksdbCommitFlushLatency", "rocksdbCommitCheckpointLatency",
                 "rocksdbTotalBytesWritten", "rocksdbPutLatency", "rocksdbWriterStallLatencyMs",
                 "rocksdbTotalCompactionLatencyMs", "SnapshotLastUploaded.partition_0_default")


def emitting_batches(batches: list[dict[str, Any]],
                     rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Every batch from the first to the last one that emitted an alert of `rows` (a phase's
    sample, `alert_breakdown`), each with its phases (Spark's durationMs, the collect and the
    sinks of our delivery, the state store's update and commit times and RocksDB's flush) and
    the operator's time in it (the change of the job's counters, logged with each progress
    report, since the previous batch): where a long batch's time went. `long`: the batches over
    twice the span's median duration."""
    ids = [r["batch"] for r in rows if "batch" in r]
    if not ids:
        return {"batches": [], "median_ms": None, "long": []}
    by_id = {b["batch"]: b for b in batches}
    out = []
    for i in range(min(ids), max(ids) + 1):
        b = by_id.get(i)
        if b is None:
            continue
        dur = b.get("durations_ms") or {}
        prev = (by_id.get(i - 1) or {}).get("counters")
        now = b.get("counters")
        op = ({k: int(now.get(k, 0)) - int(prev.get(k, 0)) for k in _OP_COUNTERS}
              if now and prev else None)
        custom = b.get("state_custom") or {}
        delivery = b.get("delivery") or {}
        out.append({"batch": i, "start": b["start"], "ms": dur.get("triggerExecution"),
                    "input_rows": b.get("input_rows"), "durations_ms": dur,
                    "collect_ms": delivery.get("collect_ms"), "sinks_ms": delivery.get("sinks_ms"),
                    "operator": op, "state_ms": b.get("state_ms"),
                    "rocksdb": {k: custom[k] for k in _ROCKSDB_KEYS if k in custom}})
    durations = [b["ms"] for b in out if isinstance(b["ms"], int | float)]
    med = _med(durations)
    return {"batches": out, "median_ms": med,
            "long": [b["batch"] for b in out if med and (b["ms"] or 0) > 2 * med]}


def breakdown_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of each link over all alerts and over the slowest 5% (the p95-p100 tail), and
    how often the emitting batch was not the first after the releasing event."""
    full = [r for r in rows if "wait" in r]
    if not full:
        return {"alerts": len(rows)}
    ordered = sorted(full, key=lambda r: r["latency"])
    tail = ordered[int(0.95 * len(ordered)):]
    links = ("latency", "release", "wait", "run", "deliver", "batch_s", "prev_batch_s", "gap_s")

    def med(rs: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in links:
            out[k] = _med([r[k] for r in rs if r.get(k) is not None])
        out["skipped_batches"] = sum(r["skipped"] for r in rs)
        out["alerts"] = len(rs)
        return out

    by_rule = {}
    for rule in sorted({r["rule"] for r in full}):
        lat = sorted(r["latency"] for r in full if r["rule"] == rule)
        by_rule[rule] = {"p50": _med(lat), "p99": lat[min(len(lat) - 1,
                                                                   int(0.99 * len(lat)))]}
    return {"all": med(full), "slowest_5pct": med(tail), "by_rule": by_rule,
            "tail_batches": sorted({r["batch"] for r in tail})}


# -- one variant ----------------------------------------------------------------------------
def _sleep(seconds: float, job: LiveJob, producer: Producer) -> None:
    until = time.time() + seconds
    while time.time() < until:
        job.check_progress()
        if producer.error is not None:
            raise LatencyBenchError(f"producer failed: {producer.error!r}")
        time.sleep(min(0.2, max(0.0, until - time.time())))


def _warm_up(job: LiveJob, producer: Producer, monitor: MetricsMonitor, variant: Variant,
             log: Callable[[str], None], patient: bool = False) -> dict[str, Any]:
    """PREWARM_RATE until the job's first micro-batch is done (at most PREWARM_MAX_S; `patient`:
    as long as it takes); then the first rate for `warmup` s, and on until the job has finished
    two micro-batches of that input and caught up (lag under max(3 s, 2 batches + 1.5 s) of
    input, as `kept_up`), at most WARMUP_EXTRA_S more."""
    rate = variant.rates[0]
    # The first micro-batch takes tens of seconds (Python workers, rules, 64 state stores): at
    # a low rate until it is done, so that the job does not start with a minute of backlog.
    p0 = time.time()
    producer.set_rate(min(PREWARM_RATE, rate))
    while not any(b.get("input_rows") for b in monitor.batches.values()):
        if not patient and time.time() - p0 > PREWARM_MAX_S:
            raise LatencyBenchError(f"the job's first micro-batch did not finish within "
                                    f"{PREWARM_MAX_S:.0f} s:\n{job.log_tail()}")
        _sleep(0.5, job, producer)
    prewarm = time.time() - p0
    producer.set_rate(rate)
    t0 = time.time()
    _sleep(variant.warmup, job, producer)
    while True:
        done = [b for b in monitor.batches.values() if b["seen"] >= t0 and b.get("input_rows")]
        lag = _lag(producer, monitor.batches, time.time())
        med = (_med([b["batch_ms"] for b in done if b.get("batch_ms")]) or 0) / 1000
        if len(done) >= 2 and lag is not None and lag <= max(3.0, 2 * med + 1.5) * rate:
            caught_up = True
            break
        if time.time() - t0 > variant.warmup + WARMUP_EXTRA_S:
            caught_up = False
            break
        _sleep(0.5, job, producer)
    out = {"first_batch_s": round(prewarm, 1), "rate_set_at": t0, "s": round(time.time() - t0, 1),
           "batches": len(done), "caught_up": caught_up,
           "lag_events": lag}
    log(f"[latency] {job.variant.name}: warm-up {out}")
    return out


def run_variant(services: Services, work: Path, variant: Variant,
                log: Callable[[str], None] = print, drain_s: float | None = None,
                patient: bool = False) -> dict[str, Any]:
    """`drain_s`: after the last rate, wait up to this long for every measured alert whether the
    job kept up or not; None: the benchmark's short drain. `patient` (the test's completeness
    check): no wall-clock bound anywhere (start, first batch, drain); the drain lasts until a
    finished micro-batch's watermark has passed every measured completing event, i.e. until
    the job has released them (or the job exits)."""
    import redis

    redis.Redis.from_url(services.redis_url).flushdb()
    job = LiveJob(services, work, variant)
    t0 = time.monotonic()
    job.start()
    monitor = MetricsMonitor(job)
    reader = RedisReader(services.redis_url)
    producer: Producer | None = None
    phases: list[Phase] = []
    warm: dict[str, Any] = {}
    try:
        startup = job.wait_started(None if patient else 180)
        log(f"[latency] {variant.name}: query started after {startup:.1f} s")
        monitor.start()
        reader.start()
        producer = Producer(services.bootstrap, job.topic, variant.name[:3])
        producer.set_rate(variant.rates[0])
        producer.start()
        warm = _warm_up(job, producer, monitor, variant, log, patient)
        behind = False
        for i, rate in enumerate(variant.rates):
            start = time.time()
            if i > 0:
                producer.set_rate(rate)
                _sleep(SETTLE_S, job, producer)
            measure_from = time.time()
            # A job already behind falls further behind at a higher rate: measure it briefly.
            _sleep(min(variant.seconds, OVERLOAD_S) if behind else variant.seconds, job, producer)
            phases.append(Phase(rate, start, measure_from, time.time()))
            lag = _lag(producer, monitor.batches, time.time())
            behind = behind or lag is None or lag > OVERLOAD_LAG_S * rate
        # Drain: wait for the measured alerts (bounded; a job that fell behind will not catch up).
        # The stream keeps flowing meanwhile, as a live one does: the last patterns are matched
        # once later events move the watermark past them (LATENESS), never without them.
        wanted = {k for k, sent in _items(producer.completing)  # it keeps producing
                  if any(ph.measure_from <= sent < ph.end for ph in phases)}
        # (A job that is behind will not deliver them in seconds: a short look only.)
        drain_until = time.time() + (drain_s if drain_s is not None
                                     else 5.0 if behind else DRAIN_S)
        if patient:
            _drain_released(job, producer, reader, monitor, {k[2] for k in wanted})
        while (not patient and time.time() < drain_until
               and not wanted <= set(reader.arrived)):
            if reader.error is not None:
                raise LatencyBenchError(f"Redis reader failed: {reader.error!r}")
            time.sleep(0.2)
        drained_at = time.time()
        producer.stop_flag.set()
        producer.join(40)
        if producer.error is not None:
            raise LatencyBenchError(f"producer failed: {producer.error!r}")
        time.sleep(0.5)
        final = monitor.last
    finally:
        if producer is not None:
            producer.stop_flag.set()
        reader.stop_flag.set()
        monitor.stop_flag.set()
        rc = job.stop()
    others = {"bench": monitor.bench_cpu, "services": monitor.services_cpu}
    stats = [phase_stats(ph, producer, reader, monitor.batches, drained_at, monitor.cpu, others)
             for ph in phases]
    logged = logged_batches(job.log_tail(10**8))
    for i, (ph, st) in enumerate(zip(phases, stats, strict=True)):
        # When this rate's cards were first sent (each rate has cards of its own) and its
        # window, wall clock: a rate's cards stop when the next rate starts, and their partial
        # matches' deadlines then wake each key once more about a minute later, with no event
        # (docs/spark-runtime.md, "Falling behind at 64,000 events/s").
        st["cards_from"] = warm.get("rate_set_at") if i == 0 else ph.start
        st["window"] = [ph.measure_from, ph.end]
        rows = alert_breakdown(producer, reader, logged, lateness_ms(variant.lateness),
                               ph.measure_from, ph.end)
        st["breakdown"] = breakdown_summary(rows)
        st["alerts_detail"] = rows
        st["emitting_batches"] = emitting_batches(logged, rows)
        st["batch_times"] = [{k: b[k] for k in ("batch", "start", "end", "input_rows")}
                             for b in logged if ph.measure_from - 5 <= b["start"] < ph.end + 5]
    expected_keys = set(producer.completing)
    unexpected = [k for k in reader.arrived if k not in expected_keys]
    counters = final.get("counters") or {}
    for s in stats:
        log(f"[latency] {variant.name} @ {s['rate_target']}/s: achieved {s['achieved_rate']}/s, "
            f"{s['alerts_arrived']}/{s['alerts_expected']} alerts, "
            f"p50 {s['latency_s']['p50']}, p99 {s['latency_s']['p99']}, "
            f"batch p50 {s['batch_ms_p50']} ms, lag {s['lag_s_end']} s, kept up {s['kept_up']}, "
            f"keys touched per event {s['keys_touched_per_event']}, "
            f"job CPU {s['job_cpu_cores']} cores = {s['job_cpu_us_per_row']} us/row, "
            f"beside it the producer's process {s.get('bench_cpu_cores')} and Kafka + Redis "
            f"{s.get('services_cpu_cores')} cores")
        log(f"[latency] {variant.name} @ {s['rate_target']}/s: where latency - LATENESS went "
            f"(medians, s): {json.dumps(s['breakdown'])}")
        span = s["emitting_batches"]
        log(f"[latency] {variant.name} @ {s['rate_target']}/s: the batches that emitted its "
            f"alerts: {len(span['batches'])}, median {span['median_ms']} ms, over twice that: "
            f"{[(b['batch'], b['ms']) for b in span['batches'] if b['batch'] in span['long']]}")
    return {
        "name": variant.name, "lateness": variant.lateness or f"{BENCH_LATENESS} (bench rules)",
        "trigger": variant.trigger, "command": job.command, "startup_s": round(startup, 1),
        "warmup_s": variant.warmup, "warm": warm, "seconds": variant.seconds, "rates": stats,
        "events_produced": producer.total, "alerts_in_redis": reader.entries,
        "unexpected_alerts": len(unexpected), "late_events": counters.get("late"),
        "job_alerts": counters.get("alerts"), "job_exit": rc,
        "wall_s": round(time.monotonic() - t0, 1),
    }


def _items(d: dict[Any, Any]) -> list[tuple[Any, Any]]:
    """`d`'s items while another thread adds to it (a copy can meet a resize: try again)."""
    while True:
        try:
            return list(d.items())
        except RuntimeError:  # "dictionary changed size during iteration"
            continue


def _watermark_ms(text: Any) -> int | None:
    """A progress report's watermark (`2026-11-25T18:39:14.893Z`) in epoch ms."""
    from datetime import datetime

    if not isinstance(text, str) or not text:
        return None
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def _drain_released(job: LiveJob, producer: Producer, reader: RedisReader,
                    monitor: MetricsMonitor, completing_ts: set[int]) -> None:
    """Until the job has released every measured pattern: a micro-batch ran with a watermark
    past the newest completing event (the engine releases an event once the watermark has
    passed it, and a batch's alerts are in Redis before Spark reports the batch), then until
    the Redis reader has read once more. No wall-clock bound: a slow job is waited for; one
    that exits fails. The input slows to a trickle meanwhile (it must keep flowing: the
    watermark only moves with new events), so that a job that fell behind catches up."""
    newest = max(completing_ts, default=0)
    producer.set_rate(min(PREWARM_RATE, 200))
    while not any((_watermark_ms(b.get("watermark")) or 0) > newest
                  for b in list(monitor.batches.values())):
        _sleep(0.5, job, producer)
        if reader.error is not None:
            raise LatencyBenchError(f"Redis reader failed: {reader.error!r}")
    reads = reader.reads
    while reader.reads < reads + 2:  # an XREAD that started after the batch was reported
        _sleep(0.1, job, producer)
        if reader.error is not None:
            raise LatencyBenchError(f"Redis reader failed: {reader.error!r}")


def probe_trigger(services: Services, work: Path, name: str, trigger: str,
                  timeout: float = 120) -> dict[str, Any]:
    """Start `cep run` with this trigger and report what happens: the error text if Spark
    refuses the query, else that the query started (and its first batches' figures)."""
    variant = Variant(name, "0s", trigger, (), 0, 0)
    job = LiveJob(services, work, variant)
    t0 = time.monotonic()
    job.start()
    try:
        try:
            startup = job.wait_started(timeout)
        except LatencyBenchError:
            if job.proc is not None and job.proc.poll() is None:
                raise
            text = job.log_tail(10**6)
            return {"trigger": trigger, "command": job.command, "started": False,
                    "exit": job.proc.returncode if job.proc else None,
                    "error": _error_lines(text), "seconds": round(time.monotonic() - t0, 1)}
        # Started: is the query still alive a few seconds later (a refusal may come at run time)?
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and job.proc is not None and job.proc.poll() is None:
            time.sleep(0.5)
        alive = job.proc is not None and job.proc.poll() is None
        text = job.log_tail(10**6)
        return {"trigger": trigger, "command": job.command, "started": True, "alive": alive,
                "startup_s": round(startup, 1),
                "exit": None if alive or job.proc is None else job.proc.returncode,
                "error": None if alive else _error_lines(text),
                "seconds": round(time.monotonic() - t0, 1)}
    finally:
        job.stop()


def _error_lines(log_text: str) -> str:
    """The job's own error message: the line the CLI printed, else the last exception lines."""
    lines = [ln for ln in log_text.splitlines() if ln.strip()]
    keep = [ln for ln in lines if re.search(
        r"(Exception|Error|error|UNSUPPORTED|not supported|failed)", ln)
        and not ln.lstrip().startswith("at ")]
    picked = keep[-6:] if keep else lines[-6:]
    return "\n".join(ln[:600] for ln in picked)


# -- entry points ---------------------------------------------------------------------------
def plan(rates: tuple[int, ...], seconds: float, warmup: float, quick: bool,
         compare_triggers: bool = False, default_only: bool = False,
         trigger: str = "default") -> tuple[list[Variant], list[tuple[str, str]]]:
    """The variants measured and the triggers only probed (started, to record what Spark says).
    `default_only`: the live job as shipped at the given rates, nothing else (A/B runs);
    `trigger`: its `trigger` setting there ("default": the job's own)."""
    if quick:
        return [Variant("default", None, trigger, rates[:1], seconds, warmup)], []
    if default_only:
        return [Variant("default", None, trigger, rates, seconds, warmup)], []
    short = max(10.0, seconds / 2)
    low = (min(COMPARE_RATE, rates[0]),)
    # The live job as shipped: the bench rules (LATENESS 5s), the default 1 s trigger; first at
    # the comparison rate (the same as the variants below), then at the given rates.
    main = (low[0], *rates) if low[0] < rates[0] else rates
    variants = [
        Variant("default", None, "default", main, seconds, warmup),
        # No allowed lateness: what the watermark wait costs (at a rate the job keeps up with).
        Variant("lateness0", "0s", "default", low, short, min(warmup, 10.0)),
    ]
    if compare_triggers:  # a short processingTime interval on top of that (+~1.5 min)
        variants.append(Variant("lateness0-pt200ms", "0s", "processingTime:200ms", low, short,
                                min(warmup, 10.0)))
    return variants, [("realtime", "realTime:5s")]


def run(rates: tuple[int, ...] = (5000, 20000, 50000), seconds: float = 30,
        warmup: float = 20, work: Path | None = None, *, quick: bool = False,
        compare_triggers: bool = False, log: Callable[[str], None] = print,
        drain_s: float | None = None, default_only: bool = False,
        patient: bool = False, trigger: str = "default") -> dict[str, Any]:
    """`patient`: no wall-clock bound on the job (start, first batch, drain: `run_variant`)."""
    work = Path(work) if work is not None else Path(tempfile.mkdtemp(prefix="cep-latency-"))
    work.mkdir(parents=True, exist_ok=True)
    variants, probes = plan(tuple(rates), seconds, warmup, quick, compare_triggers,
                            default_only, trigger)
    services = Services(work / "services")
    t0 = time.monotonic()
    out: dict[str, Any] = {"rates": list(rates), "seconds": seconds, "warmup": warmup,
                           "quick": quick, "variants": [], "probes": [],
                           "code": _code_version(),
                           "load_start": os.getloadavg()}
    try:
        services.start()
        for v in variants:
            out["variants"].append(run_variant(services, work, v, log, drain_s, patient))
        for name, trig in probes:
            out["probes"].append(probe_trigger(services, work, name, trig))
            log(f"[latency] probe {trig}: {out['probes'][-1]}")
    finally:
        services.stop()
    out["load_end"] = os.getloadavg()
    out["total_s"] = round(time.monotonic() - t0, 1)
    return out


def _code_version() -> str:
    """The commit, and a hash of the engine/operator/job sources as measured (the tree may
    hold uncommitted changes)."""
    import hashlib

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head = "?"
    digest = hashlib.sha256()
    for f in sorted([*(ROOT / "cep" / "runtime").glob("*.py"), ROOT / "cep" / "spark" /
                     "operator.py", ROOT / "jobs" / "live.py"]):
        digest.update(f.read_bytes())
    return f"{head or '?'} + sources {digest.hexdigest()[:10]}"


# -- Markdown -------------------------------------------------------------------------------
def _fmt(v: dict[str, Any] | None) -> str:
    if v is None:
        return "—"
    return f"> {v['s']:.2f}" if v["lower_bound"] else f"{v['s']:.2f}"


def render_md(section: dict[str, Any]) -> str:
    out = ["### End-to-end latency of the live job (Kafka → `cep run` → Redis)", ""]
    rows = []
    for v in section.get("variants", []):
        for r in v["rates"]:
            lat = r["latency_s"]
            rows.append([
                v["name"], v["lateness"], v["trigger"], f"{r['rate_target']:,}",
                f"{r['achieved_rate']:,}", f"{r['window_s']:.0f}",
                f"{r['alerts_arrived']}/{r['alerts_expected']}",
                _fmt(lat["p50"]), _fmt(lat["p95"]), _fmt(lat["p99"]),
                _fmt(r["max_s"]) if isinstance(r["max_s"], dict) else
                ("—" if r["max_s"] is None else f"{r['max_s']:.2f}"),
                _fmt(r["to_emitted_p50_s"]),
                f"{r['batch_ms_p50']:.0f} / {r['batch_ms_max']:.0f}" if r["batch_ms_p50"] else "—",
                "—" if r["processed_rows_per_s"] is None else f"{r['processed_rows_per_s']:,}",
                "—" if r["lag_s_end"] is None else f"{r['lag_s_end']:.1f}",
                "yes" if r["kept_up"] else "**no**"])
    header = ["variant", "lateness", "trigger", "target ev/s", "achieved ev/s", "window s",
              "alerts in Redis",
              "p50 s", "p95 s", "p99 s", "max s", "→ emitted p50 s", "batch ms p50 / max",
              "processed rows/s", "lag at end s", "kept up"]
    out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    vs = section.get("variants", [])
    if vs:
        v0 = vs[0]
        out += ["", f"Latency = the wall time an alert became readable in Redis (XREAD BLOCK) − "
                "the wall time its completing event was handed to the Kafka producer. "
                f"Each `cep run` (e.g. `{v0['command']}`) runs on Spark local[2] with the "
                "`live_shards` shards (default 6) and `live_partitions` stateful tasks (2); "
                "one input partition. Rates run in "
                f"a row in one job: {v0['warmup_s']:.0f} s warm-up before the first (not "
                f"measured), {SETTLE_S:.0f} s settle before each next one, then "
                f"{v0['seconds']:.0f} s measured per rate ({OVERLOAD_S:.0f} s once the job has "
                f"fallen more than {OVERLOAD_LAG_S:.0f} s behind; the comparison variants "
                "shorter: see the window column). Event time = wall clock at produce; "
                f"background cards each seen every {CARD_GAP_S:.0f} s (no rule matches them), "
                f"{INJECT_PER_S:.0f} injected patterns/s each completing one alert (card_testing, "
                "velocity, impossible_travel in turn). \"> x\": that percentile falls on alerts "
                "not in Redis when the run ended (x = their wait so far). \"→ emitted\": produce "
                "→ the job's `emitted_at` (micro-batch done, before the Kafka transaction and "
                "the Redis write). Batch ms / processed rows/s: the `alerts` query's progress "
                "(triggerExecution, input rows / batch time) for batches ending in the window. "
                "Lag: events produced but not yet read by a finished batch, in seconds of input."]
        for v in vs:
            extra = []
            if v.get("unexpected_alerts"):
                extra.append(f"{v['unexpected_alerts']} alerts not injected")
            if v.get("late_events"):
                extra.append(f"{v['late_events']} late events")
            out += ["", f"- `{v['name']}`: {v['events_produced']:,} events produced, "
                    f"{v['alerts_in_redis']:,} Redis entries, query up {v['startup_s']} s after "
                    f"start, {v['wall_s']} s in all" + ("; " + ", ".join(extra) if extra else "")]
    out += ["", "Why the default is seconds, not milliseconds: the engine releases an event to "
            "the matcher only once the watermark (max event time − LATENESS) has passed it "
            "(docs/spark-runtime.md), so a completing event waits for events ≥ LATENESS newer "
            "to reach its shard, then for the micro-batch that carries them: about LATENESS + "
            "one trigger interval + one batch. With LATENESS 0s an event is released in the "
            "batch that brings it."]
    for p in section.get("probes", []):
        out += ["", f"**`trigger(realTime=…)`** (`{p['command']}`): "]
        if not p["started"]:
            out += [f"Spark refuses the query (exit {p['exit']}):", "", "```",
                    p["error"] or "(no error text)", "```"]
        elif not p.get("alive"):
            out += [f"the query started, then failed (exit {p['exit']}):", "", "```",
                    p["error"] or "(no error text)", "```"]
        else:
            out += ["the query started and ran (latency not measured with it here)."]
    load = [" ".join(f"{x:.1f}" for x in section[k]) if section.get(k) else "?"
            for k in ("load_start", "load_end")]
    out += ["", f"Code: {section.get('code', '?')}. Load average at start {load[0]}, at end "
            f"{load[1]}; {section.get('total_s')} s in all (services, {len(vs)} jobs, "
            f"{len(section.get('probes', []))} probe)."]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.latency")
    ap.add_argument("--quick", action="store_true", help="one rate, 10 s, one variant")
    ap.add_argument("--rates", default="5000,20000,50000")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--warmup", type=float, default=20)
    ap.add_argument("--work", type=Path)
    ap.add_argument("--json", type=Path, help="write the raw section here")
    ap.add_argument("--compare-triggers", action="store_true",
                    help="also LATENESS 0s with processingTime:200ms")
    ap.add_argument("--default-only", action="store_true",
                    help="only the live job as shipped at --rates (no LATENESS 0s variant, no "
                         "real-time probe): for A/B runs")
    ap.add_argument("--trigger", default="default",
                    help="the job's `trigger` setting with --default-only or --quick (e.g. "
                         "processingTime:0ms); default: the job's own")
    a = ap.parse_args(argv)
    rates = tuple(int(r) for r in a.rates.split(","))
    if a.quick:
        res = run(rates[:1], 10, 10, a.work, quick=True, trigger=a.trigger)
    else:
        res = run(rates, a.seconds, a.warmup, a.work, compare_triggers=a.compare_triggers,
                  default_only=a.default_only, trigger=a.trigger)
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    print(render_md(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
