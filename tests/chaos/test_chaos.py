"""`make chaos`: faults the live job must survive, each printing its figures
(events sent, alerts expected/got, duplicates, lost). kill -9 mid-stream is in
tests/test_live.py (test_kill_9_mid_stream_...), which prints the same figures."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import time
from pathlib import Path

import pytest

from cep.datagen import fraud
from cep.delivery.kafka_sink import ensure_topics
from tests.services import Redis, free_port
from tests.test_live import (
    FRAUD_RULES,
    _expected,
    _key,
    _lines,
    _metrics,
    _route_alerts_to,
    _shifted,
    _wait_for,
    cep_run,
    kcat_produce,
    kcat_read,
    redis_alert_ids,
    wait,
)

pytestmark = [pytest.mark.services, pytest.mark.spark, pytest.mark.chaos]
DAY = 24 * 3600 * 1000


def _setup(tmp_path: Path, topic: str, kafka_bootstrap: str, redis_url: str):
    rules = tmp_path / "rules"
    rules.mkdir()
    shutil.copy(FRAUD_RULES, rules / "fraud.cep")
    _route_alerts_to(rules, f"{topic}.alerts")
    ensure_topics(kafka_bootstrap, [f"{topic}-in"], partitions=1)
    env = {"CEP_KAFKA_BOOTSTRAP": kafka_bootstrap, "CEP_REDIS_URL": redis_url,
           "CEP_SHARDS": "8", "CEP_SHUFFLE_PARTITIONS": "2",
           "CEP_DEAD_LETTER_TOPIC": f"{topic}-dlq", "CEP_LATE_TOPIC": f"{topic}-late"}
    args = ["--rules", str(rules), "--checkpoint", str(tmp_path / "ck"),
            "--topic", f"transactions={topic}-in"]
    return env, args, tmp_path / "run.log"


def _report(case: str, sent: int, expected: list, alerts: list, **extra) -> tuple[int, int]:
    got = [_key(a) for a in alerts]
    ids = [a["alert_id"] for a in alerts]
    dup = len(ids) - len(set(ids))
    lost = len(set(expected) - set(got))
    more = "".join(f", {k} {v}" for k, v in extra.items())
    print(f"\nchaos[{case}]: events sent {sent}, alerts expected {len(expected)}, "
          f"got {len(alerts)}, duplicates {dup}, lost {lost}{more}")
    return dup, lost



def test_redis_down_for_30_seconds(kafka_bootstrap, topic, tmp_path):
    import redis as redis_py

    server = Redis(free_port(), tmp_path / "redis")
    server.start()
    try:
        env, args, log = _setup(tmp_path, topic, kafka_bootstrap, server.url)
        part1, exp1 = _shifted(fraud(n_events=1500, n_keys=15, inject=1, seed=61), "a-", 0)
        part2, exp2 = _shifted(fraud(n_events=1500, n_keys=15, inject=1, seed=62), "b-", 3 * DAY)
        kcat_produce(kafka_bootstrap, f"{topic}-in", _lines(part1))
        proc = cep_run(env, [*args, "--trigger", "0.5"], log)
        try:
            _wait_for(lambda: len(kcat_read(kafka_bootstrap, f"{topic}.alerts")) >= len(exp1),
                      "the first part's alerts", log)
            server.stop()
            kcat_produce(kafka_bootstrap, f"{topic}-in", _lines(part2))
            time.sleep(30)
            assert proc.poll() is None, "the job must ride out a 30 s Redis outage"
            server.start()  # same data directory: Redis' append-only file brings its data back
            _wait_for(lambda: len(kcat_read(kafka_bootstrap, f"{topic}.alerts"))
                      >= len(exp1) + len(exp2), "the second part's alerts", log)
            client = redis_py.Redis.from_url(server.url, decode_responses=True)
            ids = {a["alert_id"] for a in kcat_read(kafka_bootstrap, f"{topic}.alerts")}
            _wait_for(lambda: len(redis_alert_ids(client, ids)) >= len(ids),
                      "every alert in Redis", log, timeout=120)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        alerts = kcat_read(kafka_bootstrap, f"{topic}.alerts")
        in_redis = redis_alert_ids(client, [a["alert_id"] for a in alerts])
        dup, lost = _report("redis down 30 s", len(part1) + len(part2), exp1 + exp2, alerts,
                            redis_entries=len(in_redis),
                            redis_duplicates=len(in_redis) - len(set(in_redis)))
        assert (dup, lost) == (0, 0)
        assert sorted(in_redis) == sorted(a["alert_id"] for a in alerts)
    finally:
        server.stop()


# Both Kafka sources ride a broker restart out in the running query, without a job restart
# (docs/spark-runtime.md, "A broker restart with the Python Kafka source (session 28, src28)"):
# Spark's source retries its offset fetches (`fetchOffset.numRetries` attempts, each its admin
# client's retries up to `default.api.timeout.ms`) and its tasks' consumers wait for the broker
# in their poll; the Python source (`live_source` "python") does the same (`kafka_source._fetch`,
# `read_range`). Before session 28 the Python source's driver raised at the restart when its
# offset call fell in the broker's stopping or starting (`_UNKNOWN_PARTITION`) and the query
# stopped; this test then passed only by restarting the job.
@pytest.mark.parametrize("source", ["spark", "python"])
def test_kafka_broker_restart_mid_stream(source, kafka_service, kafka_bootstrap, redis_url,
                                         topic, tmp_path):
    env, args, log = _setup(tmp_path, topic, kafka_bootstrap, redis_url)
    env["CEP_LIVE_SOURCE"] = source
    part1, exp1 = _shifted(fraud(n_events=1500, n_keys=15, inject=1, seed=63), "a-", 0)
    part2, exp2 = _shifted(fraud(n_events=1500, n_keys=15, inject=1, seed=64), "b-", 3 * DAY)
    kcat_produce(kafka_bootstrap, f"{topic}-in", _lines(part1))
    proc = cep_run(env, [*args, "--trigger", "0.5"], log)
    try:
        _wait_for(lambda: len(kcat_read(kafka_bootstrap, f"{topic}.alerts")) >= len(exp1),
                  "the first part's alerts", log)
        # The outage falls in the query's polling for offsets (`_idle`), not in a batch's
        # delivery, where the sink's transactional producer would wait for the broker and the
        # source not be asked (as in both sources' runs before this wait).
        _wait_for(lambda: _idle(tmp_path / "ck", f"{topic}-in", len(_lines(part1))),
                  "the job idle after the first part", log)
        kafka_service.stop()
        time.sleep(10)
        kafka_service.start()
        kcat_produce(kafka_bootstrap, f"{topic}-in", _lines(part2))

        def done() -> bool:
            assert proc.poll() is None, (f"the job stopped at the broker restart (exit "
                                         f"{proc.returncode}):\n{log.read_text()[-5000:]}")
            return len(kcat_read(kafka_bootstrap, f"{topic}.alerts")) >= len(exp1) + len(exp2)

        _wait_for(done, "the second part's alerts, in the same job", log)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    alerts = kcat_read(kafka_bootstrap, f"{topic}.alerts")
    dup, lost = _report(f"kafka broker restart, {source} source", len(part1) + len(part2),
                        exp1 + exp2, alerts, job_restarts=0)
    assert (dup, lost) == (0, 0)
    assert sorted(_key(a) for a in alerts) == sorted(exp1 + exp2)  # nothing extra either
    # Where a user finds what the outage looked like: the job's log names Spark's own log
    # (the JVM's and its Python processes' output), which holds the source's retries.
    named = re.search(r"Spark's own log \(.*?\): (\S+)", log.read_text(errors="replace"))
    assert named, log.read_text()[-3000:]
    spark_log = Path(named.group(1)).read_text(errors="replace")
    assert "log4j" in spark_log
    if source == "python":  # its offset fetches run in PySpark's source runner process
        assert re.search(rf"Kafka topic '{re.escape(topic)}-in': fetching the offsets.*"
                         r"(retrying|attempt)", spark_log), spark_log[-3000:]


def _idle(ck: Path, topic: str, end: int) -> bool:
    """The alerts query is idle at `end` of `topic`'s partition 0: its last batch is committed,
    nothing is planned after it, and it was the no-data batch that follows the batch that read up
    to `end` (Spark runs one when the watermark moved: an event-time operator's), i.e. both
    end there. Until new records come it only asks the source for offsets."""
    q = ck / "alerts"
    if not (q / "commits").is_dir():
        return False
    done = max((int(f.name) for f in (q / "commits").glob("[0-9]*")), default=-1)
    planned = max(int(f.name) for f in (q / "offsets").glob("[0-9]*"))
    if done < 1 or planned != done:
        return False
    ends = [json.loads((q / "offsets" / str(b)).read_text().splitlines()[-1]).get(topic, {})
            .get("0") for b in (done - 1, done)]
    return ends == [end, end]


def test_five_percent_malformed_and_out_of_order_and_late(kafka_bootstrap, redis_url, topic,
                                                          tmp_path):
    env, args, log = _setup(tmp_path, topic, kafka_bootstrap, redis_url)
    ds = fraud(n_events=4000, n_keys=40, inject=3, seed=65)
    rng = random.Random(65)
    in_alerts = {(e.key, ts) for e in ds.expected for ts in (e.first_ts, e.last_ts)}
    # Out of order within the allowed lateness (5 s): shuffle inside 2-second windows.
    events = sorted(ds.events, key=lambda e: (e["ts"] // 2000, rng.random()))
    # Late beyond it: background events (in no alert) moved 1000 positions later.
    late_idx = [i for i in range(500, len(events) - 1500, 400)
                if (events[i]["card"], events[i]["ts"]) not in in_alerts
                and all(e.key != events[i]["card"] for e in ds.expected)][:5]
    moved = [events[i] for i in late_idx]
    for i in sorted(late_idx, reverse=True):
        events.pop(i)
    for j, ev in enumerate(moved):
        events.insert(late_idx[j] + 1000, {**ev, "late": True})
    lines = _lines(events)
    bad = 0
    out = []
    for line in lines:
        out.append(line)
        if rng.random() < 0.05:
            out.append(rng.choice(["k\t{not json\n", 'k\t{"card": "c", "amount": 3}\n',
                                   'k\t{"ts": "noon", "card": "c"}\n']))
            bad += 1
    kcat_produce(kafka_bootstrap, f"{topic}-in", out)
    proc = cep_run(env, [*args, "--once", "--max-offsets-per-trigger", "400"], log)
    wait(proc, log)
    alerts = kcat_read(kafka_bootstrap, f"{topic}.alerts")
    dlq = kcat_read(kafka_bootstrap, f"{topic}-dlq")
    late = kcat_read(kafka_bootstrap, f"{topic}-late")
    counters = _metrics(tmp_path / "ck")["counters"]
    dup, lost = _report("5% malformed, out of order, late", len(out), _expected(ds), alerts,
                        malformed=bad, dead_letters=len(dlq), late_sent=len(moved),
                        late_topic=len(late))
    assert (dup, lost) == (0, 0)
    assert sorted(_key(a) for a in alerts) == _expected(ds)  # nothing extra either
    assert len(dlq) == bad == counters["dead_letters"] and all(d["reason"] for d in dlq)
    assert len(late) == len(moved) == counters["late"]
    assert all(e["event"].get("late") for e in late)
