"""The live job with real parts: kcat (not our code) produces events to Kafka, `cep run` runs as
its own process, kcat and redis-py read the alerts back.

- every injected alert appears exactly once in Kafka (read_committed) and in Redis;
- malformed events land in the dead-letter topic with a reason, a day-late event in the late topic;
- kill -9 mid-stream and a restart from the checkpoint give the clean run's alert set;
- a rule changed and a rule added while the job runs take effect, with the new version.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cep.datagen import fraud
from cep.delivery.kafka_sink import ensure_topics

pytestmark = [pytest.mark.services, pytest.mark.spark]
ROOT = Path(__file__).resolve().parent.parent
FRAUD_RULES = ROOT / "rules" / "fraud.cep"
RULES = ("card_testing", "velocity", "impossible_travel")


def kcat_produce(bootstrap: str, topic: str, lines: list[str]) -> None:
    proc = subprocess.run(["kcat", "-P", "-b", bootstrap, "-t", topic, "-K", "\t"],
                          input="".join(lines), text=True, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def kcat_read(bootstrap: str, topic: str) -> list[dict]:
    proc = subprocess.run(["kcat", "-C", "-b", bootstrap, "-t", topic, "-e", "-q",
                           "-X", "isolation.level=read_committed"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def cep_run(settings_env: dict, args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, **settings_env, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "cep.cli", "run", *args],
                            cwd=ROOT, env=env, stdout=log.open("a"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def wait(proc: subprocess.Popen, log: Path, timeout: float = 400) -> None:
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"cep run did not finish in {timeout} s:\n{log.read_text()[-3000:]}")
    assert rc == 0, f"cep run exited {rc}:\n{log.read_text()[-5000:]}"


@pytest.fixture
def live(kafka_bootstrap, redis_url, tmp_path, topic):
    """A rules dir, a checkpoint dir, and the environment `cep run` needs for this test."""
    rules = tmp_path / "rules"
    rules.mkdir()
    shutil.copy(FRAUD_RULES, rules / "fraud.cep")
    env = {"CEP_KAFKA_BOOTSTRAP": kafka_bootstrap, "CEP_REDIS_URL": redis_url,
           "CEP_SHARDS": "8", "CEP_SHUFFLE_PARTITIONS": "2",
           "CEP_DEAD_LETTER_TOPIC": f"{topic}-dlq", "CEP_LATE_TOPIC": f"{topic}-late"}
    return {"rules": rules, "ck": tmp_path / "ck", "env": env, "log": tmp_path / "run.log",
            "topic": topic}


def _expected(ds):
    return sorted((e.rule, e.key, e.first_ts, e.last_ts) for e in ds.expected)


def _lines(events):
    return [f"{e['card']}\t{json.dumps(e)}\n" for e in events]


def _route_alerts_to(rules_dir: Path, topic: str) -> None:
    """Point every rule's Kafka destination at this test's topic (tests share the broker)."""
    for f in rules_dir.glob("*.cep"):
        f.write_text(re.sub(r"TO KAFKA '[^']*'", f"TO KAFKA '{topic}'", f.read_text()))


def _key(a):
    return (a["rule_id"], a["key"], a["first_ts"], a["last_ts"])


def test_kcat_in_cep_run_out_to_kafka_and_redis_exactly_once(live, kafka_bootstrap, redis_client):
    topic = live["topic"]
    _route_alerts_to(live["rules"], f"{topic}.alerts")
    ds = fraud(n_events=3000, n_keys=30, inject=2, seed=11)
    day = 24 * 3600 * 1000
    late = {**ds.events[len(ds.events) // 2], "ts": ds.events[-1]["ts"] - day, "late": True}
    lines = _lines(ds.events)
    lines.insert(len(lines) - 5, f"x\t{json.dumps(late)}\n")
    lines += ["bad\tthis is not json\n", f"bad\t{json.dumps({'card': 'c', 'amount': 1})}\n",
              f"bad\t{json.dumps({'ts': 'yesterday', 'card': 'c'})}\n",
              f"bad\t{json.dumps({'ts': 1767225600001, 'card': 'c', 'amount': 'lots'})}\n"]
    # One partition: Spark keeps one watermark for all partitions, so with several the allowed
    # lateness must also cover how far partitions drift apart (docs/spark-runtime.md).
    ensure_topics(kafka_bootstrap, [f"{topic}-in"], partitions=1)
    kcat_produce(kafka_bootstrap, f"{topic}-in", lines)
    proc = cep_run(live["env"], ["--rules", str(live["rules"]), "--checkpoint", str(live["ck"]),
                                 "--topic", f"transactions={topic}-in", "--once",
                                 "--max-offsets-per-trigger", "1000"], live["log"])
    wait(proc, live["log"])

    alerts = kcat_read(kafka_bootstrap, f"{topic}.alerts")
    assert sorted(_key(a) for a in alerts) == _expected(ds)
    ids = [a["alert_id"] for a in alerts]
    assert len(ids) == len(set(ids))
    in_redis = [f["id"] for r in RULES for _, f in redis_client.xrange(f"cep:alerts:{r}")
                if json.loads(f["data"])["alert_id"] in set(ids)]
    assert sorted(in_redis) == sorted(ids)
    card = next(a["key"] for a in alerts if a["rule_id"] == "velocity")
    assert json.loads(redis_client.hget("cep:latest:velocity", card))["key"] == card

    dlq = kcat_read(kafka_bootstrap, f"{topic}-dlq")
    assert sorted(d["reason"] for d in dlq) == sorted([
        "malformed JSON: not a JSON object", "missing time field 'ts'",
        "time field 'ts' is neither epoch milliseconds nor an ISO-8601 timestamp",
        "field 'amount' is not of type FLOAT"])
    assert all({"topic", "partition", "offset"} <= set(d) for d in dlq)
    assert any(d.get("value") == "this is not json" for d in dlq)
    late_events = kcat_read(kafka_bootstrap, f"{topic}-late")
    assert late_events and all(e["event"].get("late") for e in late_events)
    metrics = json.loads((live["ck"] / "metrics.json").read_text())
    assert metrics["counters"]["dead_letters"] == 4
    assert metrics["counters"]["late"] == len(late_events)
