"""`cep percolate` with real parts: searches registered through the registry (Redis + the Kafka
changelog), events produced by kcat (not our code), the job run as its own process, notifications
read back with kcat (read_committed) and redis-py.

- end to end: every notification the naive scan expects arrives exactly once in Kafka (the
  notifications topic and the searches' target topics), in the owners' Redis streams and on their
  pub/sub channels; malformed events land in the dead-letter topic with a reason;
- a search added, changed and removed while the job runs takes effect at the next batch;
- a delivered batch forced to re-run (its commit removed) after its search changed gives the same
  notification ids (the batch's pinned index version) and no duplicate anywhere.
And, without Spark: the pinned changelog read, event parsing and notification routing.
"""

from __future__ import annotations

import gc
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import redis

from cep.delivery.kafka_sink import ensure_topics
from percolator.analysis import Schema
from percolator.changelog import KafkaChangelog
from percolator.engine import Percolator
from percolator.model import Target
from percolator.registry import SearchRegistry
from percolator.store import RedisSearchStore
from tests.kafka_util import read_topic

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ("fields: {title: text, city: text, status: keyword, price: number, beds: number, "
          "listed: date}\n")


def kcat_produce(bootstrap: str, topic: str, lines: list[bytes]) -> None:
    proc = subprocess.run(["kcat", "-P", "-b", bootstrap, "-t", topic],
                          input=b"".join(lines), capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def kcat_read(bootstrap: str, topic: str) -> list[dict]:
    proc = subprocess.run(["kcat", "-C", "-b", bootstrap, "-t", topic, "-e", "-q",
                           "-X", "isolation.level=read_committed"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


class Job:
    """`cep percolate` as a subprocess, with its own topics, checkpoint and log."""

    def __init__(self, bootstrap: str, redis_url: str, tmp: Path, topic: str) -> None:
        self.bootstrap = bootstrap
        self.input = f"{topic}-in"
        self.changelog = f"{topic}-searches"
        self.notes = f"{topic}-notes"
        self.dlq = f"{topic}-dlq"
        self.ck = tmp / "ck"
        self.log = tmp / "percolate.log"
        (tmp / "schema.yaml").write_text(SCHEMA)
        self.schema = Schema.load(tmp / "schema.yaml")
        self.args = ["--topic", self.input, "--checkpoint", str(self.ck),
                     "--changelog-topic", self.changelog, "--notification-topic", self.notes,
                     "--dead-letter-topic", self.dlq, "--schema", str(tmp / "schema.yaml")]
        self.env = {**os.environ, "CEP_KAFKA_BOOTSTRAP": bootstrap, "CEP_REDIS_URL": redis_url,
                    "CEP_SPARK_MASTER": "local[2]", "PYTHONUNBUFFERED": "1"}
        self.registry = SearchRegistry(
            RedisSearchStore(redis.Redis.from_url(redis_url), f"test:{uuid.uuid4().hex[:8]}:"),
            KafkaChangelog(bootstrap, self.changelog), self.schema)

    def start(self, *extra: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "cep.cli", "percolate", *self.args,
                                 *extra], cwd=ROOT, env=self.env, stdout=self.log.open("a"),
                                stderr=subprocess.STDOUT, start_new_session=True)

    def run_once(self, *extra: str, timeout: float = 400) -> None:
        proc = self.start("--once", *extra)
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"cep percolate took over {timeout} s:\n{self.tail()}")
        assert rc == 0, f"cep percolate exited {rc}:\n{self.tail()}"

    def tail(self, n: int = 4000) -> str:
        return self.log.read_text()[-n:] if self.log.exists() else ""

    def metrics(self) -> dict:
        try:
            return json.loads((self.ck / "metrics.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def wait_for(self, cond, what: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            time.sleep(0.5)
        raise AssertionError(f"timed out waiting for {what}:\n{self.tail()}")


def events_lines(events: list[dict]) -> list[bytes]:
    return [json.dumps(e).encode() + b"\n" for e in events]


def pairs(notes: list[dict]) -> list[tuple]:
    return sorted((n["search_id"], n["event"]["n"]) for n in notes)


class Subscriber(threading.Thread):
    """Collects Redis pub/sub messages on some channels (subscribed before the job starts)."""

    def __init__(self, url: str, channels: list[str]) -> None:
        super().__init__(daemon=True)
        self.pubsub = redis.Redis.from_url(url, decode_responses=True).pubsub()
        self.pubsub.subscribe(*channels)
        self.messages: dict[str, list[dict]] = {c: [] for c in channels}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            m = self.pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
            if m and m["type"] == "message":
                self.messages[m["channel"]].append(json.loads(m["data"]))

    def stop(self) -> None:
        self.done.set()
        self.join(5)
        self.pubsub.close()


@pytest.fixture
def job(kafka_bootstrap, redis_url, tmp_path, topic):
    j = Job(kafka_bootstrap, redis_url, tmp_path, topic)
    yield j
    j.registry.changelog.close()
    del j.registry  # the producer's threads stop with its last reference
    gc.collect()


def _random_events(n: int, seed: int) -> list[dict]:
    rnd = random.Random(seed)
    words = ["blue", "red", "bike", "bikes", "scooter", "mountain", "city", "car", "old"]
    cities = ["Amsterdam", "Amsterdm", "Amstredam", "Amstrdm", "Rotterdam", "Utrecht"]
    out = []
    for i in range(n):
        ev: dict = {"n": i, "title": " ".join(rnd.sample(words, rnd.randint(1, 3))),
                    "city": rnd.choice(cities), "price": rnd.randint(50, 600),
                    "beds": rnd.randint(1, 5)}
        if rnd.random() < 0.7:
            ev["status"] = rnd.choice(["active", "sold", "pending"])
        if rnd.random() < 0.5:
            ev["listed"] = f"2024-0{rnd.randint(1, 2)}-{rnd.randint(10, 28)}"
        out.append(ev)
    return out


@pytest.mark.services
@pytest.mark.spark
def test_events_in_notifications_out_exactly_once_as_the_naive_scan(job, redis_url,
                                                                    redis_client):
    alice, bob = f"alice-{uuid.uuid4().hex[:6]}", f"bob-{uuid.uuid4().hex[:6]}"
    fuzzy_topic, channel = f"{job.notes}-fuzzy", f"{bob}-houses"
    reg = job.registry
    specs = [
        (alice, "bike", "title:bike", ()),
        (alice, "phrase", 'title:"blue bike"', ()),
        (alice, "prefix", "title:moun*", ()),
        (alice, "fuzzy", "city:amsterdam~1", (Target("kafka", fuzzy_topic),)),
        (bob, "range", "price:[100 TO 400] AND beds:>=3", (Target("redis", channel),)),
        (bob, "not-sold", "-status:sold", ()),          # no anchor: the always-run list
        (bob, "similar", 'title:~"red scooter"@85', ()),
        (bob, "wild", "status:ac?ive", ()),
        (bob, "january", "listed:[2024-01-01 TO 2024-01-31] AND title:(car OR bike)", ()),
        (bob, "bad-target", "title:scooter", (Target("kafka", "__consumer_offsets"),)),
    ]
    searches = [reg.add(o, q, search_id=sid, targets=t, metadata={"label": sid})
                for o, sid, q, t in specs]
    events = _random_events(150, seed=7)
    oracle = Percolator.from_searches(searches, schema=job.schema)
    expected = sorted((sid, e["n"]) for e in events for sid in oracle.scan(e))
    owner_of = {s.id: s.owner for s in searches}
    assert 50 < len(expected) < 150 * len(searches) // 2  # neither trivial nor everything

    bad = [b"this is not json\n", b"[1, 2, 3]\n", b'{"n": NaN}\n', b'{"title": "\xff"}\n']
    ensure_topics(job.bootstrap, [job.input], partitions=2)
    lines = events_lines(events)
    kcat_produce(job.bootstrap, job.input, lines[:70] + bad + lines[70:])
    sub = Subscriber(redis_url, [f"cep:notify:{alice}", f"cep:notify:{bob}", channel])
    sub.start()
    try:
        job.run_once("--max-offsets-per-trigger", "60")
        time.sleep(0.5)
    finally:
        sub.stop()

    notes = kcat_read(job.bootstrap, job.notes)
    assert pairs(notes) == expected                      # each exactly once, nothing else
    ids = [n["notification_id"] for n in notes]
    assert len(set(ids)) == len(ids)
    for n in notes:
        assert n["owner"] == owner_of[n["search_id"]] and n["search_version"] == 1
        assert n["metadata"] == {"label": n["search_id"]}
        assert bool(n["matched"]) == (n["search_id"] != "not-sold")  # negations report nothing
        assert set(n["position"]) == {"topic", "partition", "offset"}
    by_id = {n["notification_id"]: n for n in notes}
    assert pairs(kcat_read(job.bootstrap, fuzzy_topic)) == [p for p in expected
                                                            if p[0] == "fuzzy"]

    for owner in (alice, bob):
        stream = [(f["id"], json.loads(f["data"]))
                  for _, f in redis_client.xrange(f"cep:notifications:{owner}")]
        want = sorted(i for i, n in by_id.items() if n["owner"] == owner)
        assert sorted(i for i, _ in stream) == want
        assert sorted(m["notification_id"] for m in sub.messages[f"cep:notify:{owner}"]) == want
    in_channel = [p for p in expected if p[0] == "range"]
    assert pairs(sub.messages[channel]) == in_channel
    target_stream = redis_client.xrange(f"cep:notifications:{bob}:{channel}")
    assert len(target_stream) == len(in_channel)

    dlq = kcat_read(job.bootstrap, job.dlq)
    reasons = sorted(d["reason"] for d in dlq)
    assert len(reasons) == 4
    assert reasons.count("malformed JSON: the top level is an array, not an object") == 1
    assert sum(r.startswith("not UTF-8: invalid byte at offset") for r in reasons) == 1
    assert sum(r.startswith("malformed JSON: Expecting value") for r in reasons) == 1
    assert "malformed JSON: NaN is not JSON" in reasons
    assert all({"topic", "partition", "offset"} <= set(d) for d in dlq)

    m = job.metrics()
    assert m["counters"]["events"] == 150 and m["counters"]["dead_letters"] == 4
    assert m["counters"]["notifications"] == len(expected)
    assert m["counters"]["targets_refused"] == sum(1 for p in expected if p[0] == "bad-target")
    stats = m["queries"]["notifications"]["last_delivery"]["percolator"]
    assert stats["queries"] == len(searches) and stats["always_run"] == 1
    assert stats["matched"] <= stats["candidates"] <= stats["events"] * stats["queries"]
    assert 0 < stats["verified_fraction"] < 1
    print(f"e2e: {len(events)} events, {len(searches)} searches, {len(expected)} notifications, "
          f"last batch verified fraction {stats['verified_fraction']:.2f}")


@pytest.mark.services
@pytest.mark.spark
def test_search_added_changed_and_removed_while_running(job):
    alice, bob = f"alice-{uuid.uuid4().hex[:6]}", f"bob-{uuid.uuid4().hex[:6]}"
    reg = job.registry
    reg.add(alice, "title:bike", search_id="bike")
    ensure_topics(job.bootstrap, [job.input], partitions=1)

    def produce(*events):
        kcat_produce(job.bootstrap, job.input, events_lines(list(events)))

    def delivered():
        return [(json.loads(v)["search_id"], json.loads(v)["event"]["n"],
                 json.loads(v)["search_version"]) for _, v, _ in read_topic(
                     job.bootstrap, job.notes, timeout_s=5)]

    def expect(want, timeout=120):
        job.wait_for(lambda: sorted(delivered()) == sorted(want), f"notifications {want}",
                     timeout)

    proc = job.start("--trigger", "0.5")
    try:
        produce({"n": 1, "title": "blue bike"})
        want = [("bike", 1, 1)]
        expect(want, timeout=400)                                  # includes Spark's start
        reg.add(bob, "title:blue", search_id="blue")               # added
        produce({"n": 2, "title": "blue car"})
        want += [("blue", 2, 1)]
        expect(want)
        reg.update(bob, "blue", query="title:red")                 # changed
        produce({"n": 3, "title": "blue bike"}, {"n": 4, "title": "red car"})
        want += [("bike", 3, 1), ("blue", 4, 2)]
        expect(want)
        reg.remove(alice, "bike")                                  # removed
        produce({"n": 5, "title": "red bike"})
        want += [("blue", 5, 2)]
        expect(want)
        stats = job.metrics()["queries"]["notifications"]["last_delivery"]["percolator"]
        assert stats["queries"] == 1 and stats["rebuilt"] == 0
        os.kill(proc.pid, signal.SIGTERM)                          # graceful stop
        assert proc.wait(60) == 0, job.tail()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert sorted(delivered()) == sorted(want)   # nothing else came after all
    notes = kcat_read(job.bootstrap, job.notes)
    assert len({n["notification_id"] for n in notes}) == len(notes) == len(want)


@pytest.mark.services
@pytest.mark.spark
def test_forced_rerun_of_a_delivered_batch_keeps_its_index_and_duplicates_nothing(
        job, redis_client):
    owner = f"carol-{uuid.uuid4().hex[:6]}"
    reg = job.registry
    reg.add(owner, "title:bike", search_id="s")
    rnd = random.Random(3)
    titles = ["bike", "car", "red bike", "red car", "boat"]
    first = [{"n": i, "title": rnd.choice(titles)} for i in range(30)]
    ensure_topics(job.bootstrap, [job.input], partitions=1)
    kcat_produce(job.bootstrap, job.input, events_lines(first))
    job.run_once("--max-offsets-per-trigger", "10")
    before = kcat_read(job.bootstrap, job.notes)
    assert pairs(before) == sorted(("s", e["n"]) for e in first if "bike" in e["title"])

    # Forget that the last batch was committed: Spark re-runs it from its offset log. Meanwhile
    # the search changed and more events came in.
    commits = job.ck / "notifications" / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    for p in (commits / str(last), commits / f".{last}.crc"):
        p.unlink(missing_ok=True)
    reg.update(owner, "s", query="title:bike OR title:car")
    second = [{"n": 30 + i, "title": rnd.choice(titles)} for i in range(10)]
    kcat_produce(job.bootstrap, job.input, events_lines(second))
    job.run_once("--max-offsets-per-trigger", "10")

    assert f"batch {last} re-runs at its pinned changelog offsets" in job.tail(100_000)
    notes = kcat_read(job.bootstrap, job.notes)
    want = sorted([("s", e["n"], 1) for e in first if "bike" in e["title"]]
                  + [("s", e["n"], 2) for e in second if {"bike", "car"} & set(e["title"].split())])
    assert sorted((n["search_id"], n["event"]["n"], n["search_version"]) for n in notes) == want
    ids = [n["notification_id"] for n in notes]
    assert len(set(ids)) == len(ids)
    stream = [f["id"] for _, f in redis_client.xrange(f"cep:notifications:{owner}")]
    assert sorted(stream) == sorted(ids)
    replayed = [line for line in job.tail(100_000).splitlines()
                if f"'batch_id': {last}," in line and "delivered" in line]
    assert len(replayed) == 2, replayed            # the first run and the forced re-run
    rerun = replayed[-1]
    assert "'kafka_skipped_replayed_batch': True" in rerun and "'redis_applied': 0" in rerun


@pytest.mark.services
def test_read_to_applies_exactly_the_pinned_prefix_of_the_changelog(kafka_bootstrap, topic):
    from percolator.changelog import ChangelogEnds, ChangelogError, KafkaChangeReader
    from percolator.model import Change, SavedSearch

    log = KafkaChangelog(kafka_bootstrap, topic)
    for i in range(3):
        log.publish(Change(f"s{i}", SavedSearch(f"s{i}", "o", f"title:w{i}")))
    ends = ChangelogEnds(kafka_bootstrap, topic)
    pin1 = ends()
    log.publish(Change("s0", None))
    pin2 = ends()
    assert pin1 == {0: 3} and pin2 == {0: 4}
    reader = KafkaChangeReader(kafka_bootstrap, topic)
    assert [c.search_id for c in reader.read_to(pin1, timeout=20)] == ["s0", "s1", "s2"]
    assert reader.read_to(pin1) == []                        # a re-run of the same batch
    assert [(c.search_id, c.is_delete) for c in reader.read_to(pin2)] == [("s0", True)]
    assert reader.position == {0: 4}
    with pytest.raises(ChangelogError, match="past the requested end"):
        reader.read_to(pin1)
    with pytest.raises(ChangelogError, match="not reached"):
        reader.read_to({0: 9}, timeout=1)
    log.publish(Change("s3", SavedSearch("s3", "o", "title:w3")))
    assert [c.search_id for c in reader.poll(timeout=3)] == ["s3"]  # (waits all 3 s)
    reader.close()
    ends.close()
    log.close()


def test_parse_event_reasons():
    from percolator.worker import parse_event

    assert parse_event(b'{"a": [1, {"b": null}]}') == ({"a": [1, {"b": None}]}, None)
    assert parse_event(None)[1] == "empty message"
    assert parse_event(b"\xff")[1] == "not UTF-8: invalid byte at offset 0"
    assert parse_event(b"[1]")[1] == "malformed JSON: the top level is an array, not an object"
    assert parse_event(b'{"a": 1} x')[1].startswith("malformed JSON: trailing data")
    assert parse_event(b'{"x": Infinity}')[1] == "malformed JSON: Infinity is not JSON"
    assert parse_event(b"{")[1].startswith("malformed JSON: Expecting")
    assert parse_event(b"[" * 100_000 + b"]" * 100_000)[1].startswith("malformed JSON")


@pytest.mark.services
def test_router_sends_defaults_and_targets_and_refuses_foreign_topics(kafka_bootstrap, tmp_path,
                                                                      topic):
    from types import SimpleNamespace

    from cep.config import Settings
    from jobs.metrics import Metrics
    from jobs.percolate import NotificationRouter, PercolateOptions
    from percolator.worker import notification_id

    settings = Settings(kafka_bootstrap=kafka_bootstrap, dead_letter_topic=f"{topic}-dlq")
    opts = PercolateOptions(checkpoint=str(tmp_path), topics=(f"{topic}-in",),
                            changelog_topic=f"{topic}-log", notification_topic=f"{topic}-notes")
    metrics = Metrics(tmp_path / "metrics.json")
    router = NotificationRouter(settings, opts, metrics)
    nid = notification_id("s1", 2, "in", 0, 7)
    assert nid == notification_id("s1", 2, "in", 0, 7) != notification_id("s1", 3, "in", 0, 7)
    targets = [{"kind": "kafka", "name": f"{topic}-t"}, {"kind": "redis", "name": "chan"},
               {"kind": "kafka", "name": f"{topic}-log"}, {"kind": "kafka", "name": "a b"}]
    note = SimpleNamespace(kind="note", id=nid, owner="alice", search_id="s1",
                           payload=json.dumps({"notification_id": nid, "targets": targets}))
    stats = SimpleNamespace(kind="stats", payload=json.dumps(
        {"events": 10, "candidates": 4, "matched": 1, "queries": 5, "always_run": 0,
         "changelog_end": {"0": 3}}))
    dead = SimpleNamespace(kind="dead", raw=b"x", reason="r", topic="in", partition=0, offset=8,
                           stream=None)
    records = router([note, stats, dead])
    where = [(r.id, r.kafka_topic, r.redis_stream, r.redis_channel) for r in records]
    assert where == [
        (nid, f"{topic}-notes", "cep:notifications:alice", "cep:notify:alice"),
        (f"{nid}:kafka:{topic}-t", f"{topic}-t", "", ""),
        (f"{nid}:redis:chan", "", "cep:notifications:alice:chan", "chan"),
        ("dlq-in-0-8", f"{topic}-dlq", "", ""),
    ]
    assert router.batch["verified_fraction"] == 4 / 50
    assert metrics.counters["targets_refused"] == 2 and metrics.counters["dead_letters"] == 1
