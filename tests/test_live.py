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
import time
from pathlib import Path

import pytest

from bench.latency import progress_reports
from cep.datagen import fraud
from cep.delivery.kafka_sink import ensure_topics
from jobs.live import LOCAL_CHECKPOINT_CONF

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
    if "Unknown topic or partition" in proc.stderr:
        return []  # not created yet
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def cep_run(settings_env: dict, args: list[str], log: Path,
            tree: Path = ROOT) -> subprocess.Popen:
    env = {**os.environ, **settings_env, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "cep.cli", "run", *args],
                            cwd=tree, env=env, stdout=log.open("a"), stderr=subprocess.STDOUT,
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


def redis_alert_ids(client, ids) -> list[str]:
    """The alert ids found in the rules' Redis streams, restricted to `ids` (this test's alerts;
    tests share the Redis server), once per stream entry so that duplicates show."""
    wanted = set(ids)
    return [f["id"] for r in RULES for _, f in client.xrange(f"cep:alerts:{r}")
            if f["id"] in wanted]


def _key(a):
    return (a["rule_id"], a["key"], a["first_ts"], a["last_ts"])


@pytest.mark.parametrize("source", ["spark", "python"])
def test_kcat_in_cep_run_out_to_kafka_and_redis_exactly_once(live, kafka_bootstrap, redis_client,
                                                            source):
    """`cep run --once` in micro-batches of at most 1,000 records, with Spark's Kafka source and
    with the Python one (`live_source`, cep/spark/kafka_source.py): the same alerts exactly once
    in Kafka and Redis, dead letters at their offsets, late events, every record counted."""
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
    proc = cep_run({**live["env"], "CEP_LIVE_SOURCE": source},
                   ["--rules", str(live["rules"]), "--checkpoint", str(live["ck"]),
                    "--topic", f"transactions={topic}-in", "--once",
                    "--max-offsets-per-trigger", "1000"], live["log"])
    wait(proc, live["log"])

    alerts = kcat_read(kafka_bootstrap, f"{topic}.alerts")
    assert sorted(_key(a) for a in alerts) == _expected(ds)
    ids = [a["alert_id"] for a in alerts]
    assert len(ids) == len(set(ids))
    in_redis = redis_alert_ids(redis_client, ids)
    assert sorted(in_redis) == sorted(ids)
    card = next(a["key"] for a in alerts if a["rule_id"] == "velocity")
    assert json.loads(redis_client.hget("cep:latest:velocity", card))["key"] == card

    dlq = kcat_read(kafka_bootstrap, f"{topic}-dlq")
    assert sorted(d["reason"] for d in dlq) == sorted([
        "malformed JSON: Expecting value at line 1 column 1", "missing time field 'ts'",
        "time field 'ts' is 'yesterday': neither epoch milliseconds (a JSON integer) nor an "
        "ISO-8601 timestamp",
        "field 'amount' is FLOAT, got a string \"lots\""])
    assert sorted((d["topic"], d["partition"], d["offset"]) for d in dlq) == [
        (f"{topic}-in", 0, o) for o in range(len(lines) - 4, len(lines))]
    assert any(d.get("value") == "this is not json" for d in dlq)
    late_events = kcat_read(kafka_bootstrap, f"{topic}-late")
    assert late_events and all(e["event"].get("late") for e in late_events)
    metrics = json.loads((live["ck"] / "metrics.json").read_text())
    counters = metrics["counters"]
    assert counters["dead_letters"] == 4
    assert counters["late"] == len(late_events)
    # The accounting invariant: read = processed + dead letters, late among the processed.
    assert counters["events_read"] == len(lines) == counters["events"] + counters["dead_letters"]
    assert 0 < counters["late"] <= counters["events"]
    # Batches of at most 1,000 records (admission control), the offset log in Spark's Kafka
    # JSON, and each batch's input rows its records (the Python source's Spark rows are packs:
    # `jobs.metrics.offset_records`), where the job knows where the batch started.
    ends = [json.loads(f.read_text().splitlines()[-1])[f"{topic}-in"]["0"]
            for f in sorted((live["ck"] / "alerts" / "offsets").glob("[0-9]*"),
                            key=lambda f: int(f.name))]
    assert ends[:4] == [1000, 2000, 3000, len(lines)] and set(ends[4:]) <= {len(lines)}
    reports = [q for q in progress_reports(live["log"].read_text(errors="replace"))
               if q.get("batch") is not None]
    rows = [q.get("input_rows") for q in reports]
    assert rows[1:4] == [1000, 1000, len(lines) - 3000] and rows[0] in (1000, None), rows
    # The running job's session has the checkpoint manager LOCAL_CHECKPOINT_CONF sets.
    manager = LOCAL_CHECKPOINT_CONF["spark.sql.streaming.checkpointFileManagerClass"]
    assert f"checkpoint file manager: {manager}" in live["log"].read_text()
    prom = (live["ck"] / "metrics.prom").read_text()
    # Dead letters travel in the one query with the alerts (jobs/live.py): counted apart.
    assert "cep_dead_letters_total 4" in prom
    assert all(re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line.split()[0].split("{")[0])
               for line in prom.splitlines() if line and not line.startswith("#"))


def _metrics(ck: Path) -> dict:
    try:
        return json.loads((ck / "metrics.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _wait_for(cond, what: str, log: Path, timeout: float = 240, describe=None) -> None:
    """Poll `cond` each second; on time-out fail with the job log's tail and, when given,
    `describe()` (e.g. what the output topics hold), so that a failure can be diagnosed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(1)
    try:
        seen = f"\nseen: {describe()}" if describe is not None else ""
    except Exception as e:  # the description must not hide the time-out
        seen = f"\nseen: (could not describe: {e!r})"
    raise AssertionError(f"timed out waiting for {what}:{seen}\n{log.read_text()[-3000:]}")


@pytest.mark.chaos
# The killed run reads each batch of 400 in one task (`live_read_tasks` 1), or in three
# (`live_read_task_rows` 150); the restart in one per core (the default): the batch it plans
# again from the checkpoint is split differently, and what counts (seq, alert ids, the offsets
# committed) does not depend on the split. The second starts the checkpoint with two stateful
# operators (`live_pools` 2), which the restart keeps (`jobs.live.checkpoint_pools`).
@pytest.mark.parametrize("first_read_split", [{"CEP_LIVE_READ_TASKS": "1"},
                                              {"CEP_LIVE_READ_TASK_ROWS": "150",
                                               "CEP_LIVE_POOLS": "2"}])
def test_kill_9_mid_stream_and_restart_loses_nothing_duplicates_nothing(
        live, kafka_bootstrap, redis_client, first_read_split):
    topic = live["topic"]
    _route_alerts_to(live["rules"], f"{topic}.alerts")
    # Three datasets one after the other in event time, so alerts come out over the run.
    day = 24 * 3600 * 1000
    events, expected = [], []
    for i, prefix in enumerate("abc"):
        ev, ex = _shifted(fraud(n_events=1500, n_keys=15, inject=1, seed=30 + i),
                          f"{prefix}-", 3 * day * i)
        events += ev
        expected += ex
    ensure_topics(kafka_bootstrap, [f"{topic}-in"], partitions=1)
    kcat_produce(kafka_bootstrap, f"{topic}-in", _lines(events))
    args = ["--rules", str(live["rules"]), "--checkpoint", str(live["ck"]),
            "--topic", f"transactions={topic}-in", "--max-offsets-per-trigger", "400",
            "--trigger", "0.5"]
    proc = cep_run({**live["env"], **first_read_split}, args, live["log"])
    # kill -9 the whole process group (driver and JVM) once some alerts are out.
    _wait_for(lambda: len(kcat_read(kafka_bootstrap, f"{topic}.alerts")) >= 1,
              "the first delivered alert", live["log"])
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    before = kcat_read(kafka_bootstrap, f"{topic}.alerts")
    assert 0 < len(before) < len(expected), "the crash did not come mid-stream"

    proc = cep_run(live["env"], [*args, "--once"], live["log"])
    wait(proc, live["log"])
    alerts = kcat_read(kafka_bootstrap, f"{topic}.alerts")
    ids = [a["alert_id"] for a in alerts]
    in_redis = redis_alert_ids(redis_client, ids)
    got = sorted(_key(a) for a in alerts)
    print(f"crash test: {len(events)} events sent, {len(expected)} alerts expected, "
          f"{len(before)} delivered before kill -9, {len(alerts)} after restart, "
          f"{len(ids) - len(set(ids))} duplicates, {len(set(expected) - set(got))} lost; "
          f"redis {len(in_redis)} entries, {len(in_redis) - len(set(in_redis))} duplicates")
    assert got == sorted(expected)
    assert len(ids) == len(set(ids))
    assert sorted(in_redis) == sorted(ids)
    # The restart's counters: each row read once (the pooled plan's operators share one read
    # and pass: `cep.spark.query.pooled`), and with pools each shard's calls in one process:
    # a reload at its first call at most, never a catch-up.
    counters = _metrics(live["ck"])["counters"]
    assert counters["events_read"] == counters["events"] > 0
    if "CEP_LIVE_POOLS" in first_read_split:
        shards = json.loads((live["ck"] / "shards.json").read_text())["shards"]
        assert shards["pools"] == 2
        assert counters["state_catchups"] == 0
        assert 0 < counters["state_reloads"] <= shards["count"]


def _shifted(ds, prefix: str, offset_ms: int):
    """The dataset's events and expectations moved in time and onto other cards."""
    events = [{**e, "card": prefix + e["card"], "ts": e["ts"] + offset_ms} for e in ds.events]
    expected = sorted((e.rule, prefix + e.key, e.first_ts + offset_ms, e.last_ts + offset_ms)
                      for e in ds.expected)
    return events, expected


def test_rules_added_changed_and_rejected_while_running(live, kafka_bootstrap):
    topic = live["topic"]
    rules = live["rules"]
    _route_alerts_to(rules, f"{topic}.alerts")
    first, exp1 = _shifted(fraud(n_events=1500, n_keys=15, inject=1, seed=21), "a-", 0)
    day = 24 * 3600 * 1000
    second, exp2 = _shifted(fraud(n_events=1500, n_keys=15, inject=1, seed=22), "b-", 3 * day)
    ensure_topics(kafka_bootstrap, [f"{topic}-in"], partitions=1)
    kcat_produce(kafka_bootstrap, f"{topic}-in", _lines(first))
    proc = cep_run(live["env"], ["--rules", str(rules), "--checkpoint", str(live["ck"]),
                                 "--topic", f"transactions={topic}-in", "--trigger", "0.5"],
                   live["log"])
    try:
        _wait_for(lambda: len(kcat_read(kafka_bootstrap, f"{topic}.alerts")) >= len(exp1),
                  "the first part's alerts", live["log"])
        v1 = _metrics(live["ck"])["rules"]
        # Change velocity (new version), add a rule, and drop in a broken file.
        fraud_cep = rules / "fraud.cep"
        text = fraud_cep.read_text()
        start = text.index("RULE velocity")
        changed = text[start:].replace("VERSION 1", "VERSION 2", 1)
        fraud_cep.write_text(text[:start] + changed)
        (rules / "big.cep").write_text(
            "STREAM transactions (ts INT, card STRING, amount FLOAT) TIME BY ts LATENESS 5s;\n"
            "RULE big_charge VERSION 1 FROM transactions PARTITION BY card\n"
            "  PATTERN (b) DEFINE b AS amount >= 800 WITHIN 1s\n"
            f"  EMIT 'big-charge' TO KAFKA '{topic}.alerts';\n")
        (rules / "broken.cep").write_text("RULE oops FROM transactions PATTERN (a b\n")
        # Reload is per file: the broken file is rejected, the valid edits go through.
        _wait_for(lambda: "big_charge" in _metrics(live["ck"]).get("rules", {}),
                  "the valid files to be accepted beside a broken one", live["log"], timeout=60)
        files = _metrics(live["ck"])["rules_files"]
        broken = files[str(rules / "broken.cep")]
        assert broken["status"] == "rejected" and broken["running"] == "none"
        assert broken["errors"] and "broken.cep:2:1: syntax error" in broken["errors"][0]
        assert files[str(rules / "big.cep")]["status"] == "accepted"
        prom = (live["ck"] / "metrics.prom").read_text()
        assert f'cep_rules_file_accepted{{file="{rules / "broken.cep"}"}} 0' in prom
        assert "cep_rules_files_rejected 1" in prom
        (rules / "broken.cep").unlink()
        _wait_for(lambda: str(rules / "broken.cep") not in _metrics(live["ck"])["rules_files"],
                  "the broken file's removal", live["log"], timeout=60)
        v2 = _metrics(live["ck"])["rules"]
        assert v2["velocity"] != v1["velocity"] and v2["card_testing"] == v1["card_testing"]

        kcat_produce(kafka_bootstrap, f"{topic}-in", _lines(second))
        big_expected = [k for k in exp2 if k[0] == "card_testing"]
        _wait_for(lambda: len(kcat_read(kafka_bootstrap, f"{topic}.alerts"))
                  >= len(exp1) + len(exp2) + len(big_expected), "the second part's alerts",
                  live["log"])
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    alerts = kcat_read(kafka_bootstrap, f"{topic}.alerts")
    fraud_alerts = [a for a in alerts if a["rule_id"] != "big_charge"]
    assert sorted(_key(a) for a in fraud_alerts) == sorted(exp1 + exp2)  # nothing lost
    for a in fraud_alerts:
        if a["rule_id"] == "velocity":
            assert a["rule_version"] == (1 if a["key"].startswith("a-") else 2), a
    big = [a for a in alerts if a["rule_id"] == "big_charge"]
    assert {a["key"] for a in big} == {k[1] for k in big_expected}
    assert all(a["key"].startswith("b-") for a in big)


def test_the_default_shards_split_evenly_over_the_stateful_tasks(spark) -> None:
    """The live job's stateful stage is `groupBy(shard)` over `live_partitions` shuffle
    partitions: Spark gives a task the shards whose Murmur3 hash (seed 42) falls in it. 8 shards
    over 2 tasks fall 3 and 5 (one task does 5/8 of the work); the defaults must split evenly."""
    from collections import Counter

    from pyspark.sql import functions as F

    from cep.config import Settings

    s = Settings()
    shards = spark.range(s.live_shards).select(F.col("id").cast("int").alias("shard"))
    tasks = Counter(r.t for r in shards.repartition(s.live_partitions, "shard")
                    .select(F.spark_partition_id().alias("t")).collect())
    assert len(tasks) == s.live_partitions and max(tasks.values()) - min(tasks.values()) <= 1
    eight = Counter(r.t for r in spark.range(8).select(F.col("id").cast("int").alias("shard"))
                    .repartition(2, "shard").select(F.spark_partition_id().alias("t")).collect())
    assert sorted(eight.values()) == [3, 5]  # why the default is not 8


def _compat_input(live, kafka_bootstrap):
    """The compat tests' input (produced in parts by the caller) and `cep run`'s arguments."""
    topic = live["topic"]
    _route_alerts_to(live["rules"], f"{topic}.alerts")
    ds = fraud(n_events=3000, n_keys=30, inject=2, seed=11)
    ensure_topics(kafka_bootstrap, [f"{topic}-in"], partitions=1)
    args = ["--rules", str(live["rules"]), "--checkpoint", str(live["ck"]),
            "--topic", f"transactions={topic}-in", "--once", "--max-offsets-per-trigger", "500"]
    return ds, _lines(ds.events), args


@pytest.mark.compat
def test_a_checkpoint_written_by_an_older_version_restarts_here(live, kafka_bootstrap):
    """`cep run` of the tree in CEP_OLD_TREE (e.g. one from before the native log's layout 2)
    writes a checkpoint over the first half of the input; this tree's `cep run` continues it
    over the second half (reading the old layout, rewriting it at each shard's first flush).
    Together they give the clean run's alerts, each once. `make test-compat` (OLD_REV 672ddfc,
    the last layout 1 version: passed in session 15, 8 of 8 shards migrated); left out of
    `make test` (it builds a second core). With CEP_OLD_TREE a tree of session 15 (layout 2,
    raw log rows) it checks the continuation as layout 3 (session 16)."""
    old = Path(os.environ["CEP_OLD_TREE"])  # `make test-compat` sets it (a KeyError otherwise)
    topic = live["topic"]
    ds, lines, args = _compat_input(live, kafka_bootstrap)
    kcat_produce(kafka_bootstrap, f"{topic}-in", lines[:len(lines) // 2])
    wait(cep_run({**live["env"], "PYTHONPATH": str(old)}, args, live["log"], old), live["log"])
    assert _metrics(live["ck"])["counters"]["events"] > 0  # the old build ran, kept state
    kcat_produce(kafka_bootstrap, f"{topic}-in", lines[len(lines) // 2:])
    wait(cep_run({**live["env"], "PYTHONPATH": str(ROOT)}, args, live["log"]), live["log"])
    alerts = kcat_read(kafka_bootstrap, f"{topic}.alerts")
    assert sorted(_key(a) for a in alerts) == _expected(ds)
    assert len({a["alert_id"] for a in alerts}) == len(alerts)
    # This run's counters: a layout 1 log (no `LOG_LAYOUT` in the old tree) is read once and
    # rewritten (a compaction) in each shard; a layout 2 log (session 15's raw rows) is read as
    # it is and appended to (layout 3).
    if "LOG_LAYOUT" not in (old / "cep" / "runtime" / "state_store.py").read_text():
        shards = json.loads((live["ck"] / "shards.json").read_text())["shards"]
        assert _metrics(live["ck"])["counters"]["state_compactions"] >= shards


@pytest.mark.compat
def test_a_checkpoint_started_here_is_refused_by_an_older_version_and_goes_on_here(
        live, kafka_bootstrap):
    """A query this tree starts keeps each shard's record in its log's reserved row (one state
    variable per task) and records that in `shards.json` as `"shards": {"count": n, ...}`: the
    tree in CEP_OLD_TREE (which would find no record in `nshard` and start every shard afresh
    over its log's rows) stops on the record, naming it, before it writes anything; this tree
    then goes on. Together the runs give the clean run's alerts, each once."""
    old = Path(os.environ["CEP_OLD_TREE"])
    topic = live["topic"]
    ds, lines, args = _compat_input(live, kafka_bootstrap)
    third = len(lines) // 3
    kcat_produce(kafka_bootstrap, f"{topic}-in", lines[:third])
    wait(cep_run({**live["env"], "PYTHONPATH": str(ROOT)}, args, live["log"]), live["log"])
    record = (live["ck"] / "shards.json").read_text()
    commits = sorted(p.name for p in (live["ck"] / "alerts" / "commits").iterdir())
    assert json.loads(record)["shards"]["record_in_log"] is True and commits
    kcat_produce(kafka_bootstrap, f"{topic}-in", lines[third:2 * third])
    old_log = live["log"].with_name("old.log")
    proc = cep_run({**live["env"], "PYTHONPATH": str(old)}, args, old_log, old)
    assert proc.wait(400) != 0, old_log.read_text()[-3000:]
    assert "shards.json" in old_log.read_text()
    assert (live["ck"] / "shards.json").read_text() == record  # left as it was
    assert sorted(p.name for p in (live["ck"] / "alerts" / "commits").iterdir()) == commits
    kcat_produce(kafka_bootstrap, f"{topic}-in", lines[2 * third:])
    wait(cep_run({**live["env"], "PYTHONPATH": str(ROOT)}, args, live["log"]), live["log"])
    alerts = kcat_read(kafka_bootstrap, f"{topic}.alerts")
    assert sorted(_key(a) for a in alerts) == _expected(ds)
    assert len({a["alert_id"] for a in alerts}) == len(alerts)


@pytest.mark.compat
def test_a_checkpoint_started_by_an_older_version_goes_on_here_and_back(live, kafka_bootstrap):
    """A query the tree in CEP_OLD_TREE (session 15 or later: rows, not layout 1) starts keeps
    its records in `nshard`: this tree continues it so (it declares `nshard` for a record
    without the object), the old tree continues that, and this tree again. Together the runs
    give the clean run's alerts, each once, and the record stays the old tree's."""
    old = Path(os.environ["CEP_OLD_TREE"])
    if "LOG_LAYOUT" not in (old / "cep" / "runtime" / "state_store.py").read_text():
        pytest.skip("a layout 1 tree cannot read a newer checkpoint (it fails to unpickle it)")
    topic = live["topic"]
    ds, lines, args = _compat_input(live, kafka_bootstrap)
    quarter = len(lines) // 4
    for n, tree in enumerate((old, ROOT, old, ROOT)):
        part = lines[n * quarter:(n + 1) * quarter] if n < 3 else lines[3 * quarter:]
        kcat_produce(kafka_bootstrap, f"{topic}-in", part)
        env = {**live["env"], "PYTHONPATH": str(tree)}
        wait(cep_run(env, args, live["log"], tree), live["log"])
        record = json.loads((live["ck"] / "shards.json").read_text())
        assert type(record["shards"]) is int  # an older build's record, kept as it is
    alerts = kcat_read(kafka_bootstrap, f"{topic}.alerts")
    assert sorted(_key(a) for a in alerts) == _expected(ds)
    assert len({a["alert_id"] for a in alerts}) == len(alerts)
