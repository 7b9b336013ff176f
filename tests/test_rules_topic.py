"""Rules in a compacted Kafka topic (issue 15, part 3), on the real broker: `cep rules deploy`
checks and publishes, `ls`/`history`/`rollback`/`disable`/`enable` round trip, and the live
job's watcher follows the topic (`TopicSource`) with the directory's semantics: a record that
does not compile never replaces the running version."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from cep.cli import main
from cep.engines import RulesWatcher, SnapshotEngineFactory
from cep.rules_topic import RulesTopic, TopicSource

pytestmark = pytest.mark.services
ROOT = Path(__file__).resolve().parent.parent
FRAUD = ("card_testing", "impossible_travel", "velocity")


def _bump_velocity(path: Path, version: int) -> None:
    text = path.read_text()
    at = text.index("RULE velocity")
    path.write_text(text[:at] + text[at:].replace("VERSION 1", f"VERSION {version}", 1))


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_deploy_ls_history_rollback_disable_round_trip(fraud_rules_dir, kafka_bootstrap, topic,
                                                        capsys):
    k = ("--bootstrap", kafka_bootstrap, "--topic", topic)
    code, out, _ = _cli(capsys, "rules", "deploy", str(fraud_rules_dir), *k, "--json")
    assert code == 0
    published = json.loads(out)["published"]
    assert sorted((p["rule"], p["version"], p["status"]) for p in published) == [
        (r, 1, "new") for r in FRAUD]

    # The topic was created compacted, with one partition.
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    meta = admin.list_topics(topic, timeout=10).topics[topic]
    assert len(meta.partitions) == 1
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    conf = admin.describe_configs([res])[res].result(timeout=10)
    assert conf["cleanup.policy"].value == "compact"

    # The same files again: nothing new.
    code, out, _ = _cli(capsys, "rules", "deploy", str(fraud_rules_dir), *k, "--json")
    assert code == 0 and {p["status"] for p in json.loads(out)["published"]} == {"unchanged"}

    # velocity changes: version 2 of velocity only.
    _bump_velocity(fraud_rules_dir / "fraud.cep", 2)
    code, out, _ = _cli(capsys, "rules", "deploy", str(fraud_rules_dir), *k)
    assert code == 0 and "changed   velocity v2" in out and "1 of 3 rules published" in out

    code, out, _ = _cli(capsys, "rules", "ls", *k, "--json")
    rows = {r["rule"]: r for r in json.loads(out)["rules"]}
    assert sorted(rows) == list(FRAUD)
    assert (rows["velocity"]["version"], rows["velocity"]["declared_version"]) == (2, 2)
    assert rows["card_testing"]["version"] == 1 and all(r["enabled"] for r in rows.values())
    assert rows["velocity"]["by"]["user"] and rows["velocity"]["by"]["host"]

    # Rollback to version 1: version 1's record back in force; the history keeps both.
    code, out, _ = _cli(capsys, "rules", "rollback", "velocity", "1", *k)
    assert code == 0 and "velocity: version 1 in force" in out
    code, out, _ = _cli(capsys, "rules", "history", "velocity", *k, "--json")
    h = json.loads(out)
    assert h["current"] == {"version": 1, "enabled": True}
    assert [v["version"] for v in h["versions"]] == [1, 2]
    assert [v["declared_version"] for v in h["versions"]] == [1, 2]
    assert h["versions"][0]["content_hash"] != h["versions"][1]["content_hash"]
    assert all(len(v["sha256"]) == 64 and v["deployed_at"] > 0 for v in h["versions"])
    assert [(e["action"], e["version"]) for e in h["events"]] == [
        ("deploy", 1), ("deploy", 2), ("rollback", 1)]

    # Disable, then enable: the version in force is kept.
    assert _cli(capsys, "rules", "disable", "velocity", *k)[0] == 0
    code, out, _ = _cli(capsys, "rules", "ls", *k)
    line = next(x for x in out.splitlines() if x.startswith("velocity"))
    assert line.split()[1:3] == ["1", "disabled"]
    code, out, _ = _cli(capsys, "rules", "history", "velocity", *k)
    assert "velocity: version 1 in force, disabled" in out and "disable" in out
    assert _cli(capsys, "rules", "enable", "velocity", *k)[0] == 0
    state = RulesTopic(kafka_bootstrap, topic).state()
    assert state.current["velocity"]["enabled"] and state.current["velocity"]["version"] == 1
    assert [e["action"] for e in state.events["velocity"]] == [
        "deploy", "deploy", "rollback", "disable", "enable"]

    # rm: a tombstone; the rule leaves `ls`, its history stays.
    assert _cli(capsys, "rules", "rm", "impossible_travel", *k)[0] == 0
    code, out, _ = _cli(capsys, "rules", "ls", *k, "--json")
    assert sorted(r["rule"] for r in json.loads(out)["rules"]) == ["card_testing", "velocity"]
    code, out, _ = _cli(capsys, "rules", "history", "impossible_travel", *k, "--json")
    h = json.loads(out)
    assert h["current"] is None and [v["version"] for v in h["versions"]] == [1]
    assert [e["action"] for e in h["events"]] == ["deploy", "remove"]

    # Errors are one line, exit 2.
    code, _, err = _cli(capsys, "rules", "rollback", "velocity", "7", *k)
    assert code == 2 and "has no version 7 (versions: 1, 2)" in err
    code, _, err = _cli(capsys, "rules", "disable", "nope", *k)
    assert code == 2 and "no rule 'nope'" in err


def test_a_rejected_file_publishes_nothing(fraud_rules_dir, kafka_bootstrap, topic, capsys):
    k = ("--bootstrap", kafka_bootstrap, "--topic", topic)
    assert _cli(capsys, "rules", "deploy", str(fraud_rules_dir), *k)[0] == 0
    before = RulesTopic(kafka_bootstrap, topic).state()
    # A valid change beside a broken file: neither is published.
    _bump_velocity(fraud_rules_dir / "fraud.cep", 2)
    (fraud_rules_dir / "broken.cep").write_text("RULE oops FROM transactions PATTERN (a b\n")
    code, _, err = _cli(capsys, "rules", "deploy", str(fraud_rules_dir), *k)
    assert code == 1
    assert f"{fraud_rules_dir / 'broken.cep'}:2:1: syntax error" in err
    assert f"nothing published to {topic}" in err
    code, out, _ = _cli(capsys, "rules", "deploy", str(fraud_rules_dir), *k, "--json")
    doc = json.loads(out)
    assert code == 1 and doc["published"] == []
    assert (doc["errors"][0]["file"], doc["errors"][0]["line"], doc["errors"][0]["col"]) == (
        str(fraud_rules_dir / "broken.cep"), 2, 1)
    after = RulesTopic(kafka_bootstrap, topic).state()
    assert after.current == before.current and after.versions == before.versions
    assert after.events == before.events


def test_the_job_watcher_follows_the_topic(fraud_rules_dir, kafka_bootstrap, topic, tmp_path):
    """`cep run --rules kafka:TOPIC`'s watcher: one unit per enabled rule, the snapshot the
    workers load runs exactly those rules, a new version is the next poll's change, a record
    that does not compile (written past `cep rules deploy`) is rejected and the previous
    version keeps running, a disabled rule is removed."""
    deployer = RulesTopic(kafka_bootstrap, topic)
    deployer.deploy([fraud_rules_dir])
    snapshot = tmp_path / "snapshot.json"
    source = TopicSource(kafka_bootstrap, topic)
    try:
        watcher = RulesWatcher(source, str(snapshot))
        start = watcher.poll()
        assert start is not None and start.accepted and sorted(start.versions) == list(FRAUD)
        assert start.provenance["velocity"]["version"] == 1
        assert start.provenance["velocity"]["source"] == f"kafka:{topic}/velocity"
        _, build = SnapshotEngineFactory(str(snapshot)).load()
        assert sorted(r.id for r in build.ruleset().rules) == list(FRAUD)  # type: ignore
        assert watcher.poll() is None  # nothing new

        _bump_velocity(fraud_rules_dir / "fraud.cep", 2)
        deployer.deploy([fraud_rules_dir])
        change = watcher.poll()
        assert change is not None and change.accepted and change.changed == ["velocity"]
        assert change.provenance["velocity"]["version"] == 2
        assert change.provenance["card_testing"]["version"] == 1
        v2 = dict(change.versions)
        assert json.loads(snapshot.read_text())["versions"] == v2

        # A foreign producer writes a broken current record: rejected, version 2 keeps running.
        bad = {**deployer.state().current["velocity"], "version": 3,
               "source": "RULE velocity FROM transactions PATTERN (a b\n"}
        p = Producer({"bootstrap.servers": kafka_bootstrap})
        p.produce(topic, key=b"rule/velocity", value=json.dumps(bad).encode())
        assert p.flush(30) == 0
        change = watcher.poll()
        assert change is not None and not change.accepted and change.versions == v2
        unit = change.files[f"kafka:{topic}/velocity"]
        assert unit["status"] == "rejected" and unit["running"] == "previous"
        assert json.loads(snapshot.read_text())["versions"] == v2

        deployer.rollback("velocity", 1)
        change = watcher.poll()
        assert change is not None and change.accepted and change.changed == ["velocity"]
        assert change.provenance["velocity"]["version"] == 1
        deployer.set_enabled("velocity", False)
        change = watcher.poll()
        assert change is not None and change.removed == ["velocity"]
        _, build = SnapshotEngineFactory(str(snapshot)).load()
        assert sorted(r.id for r in build.ruleset().rules) == [  # type: ignore
            "card_testing", "impossible_travel"]
        deployer.remove("impossible_travel")
        change = watcher.poll()
        assert change is not None and change.removed == ["impossible_travel"]
        assert sorted(change.versions) == ["card_testing"]
    finally:
        source.close()


class _RacingWatermark:
    """The reader's consumer, whose high watermark runs `ahead` offsets past the stable end: the
    state between a producer's `commit_transaction` returning and the commit markers reaching
    the partition (the broker answers a read_committed watermark query with the last stable
    offset, so an open transaction alone does not show it: checked below)."""

    def __init__(self, consumer, ahead: int) -> None:
        self.consumer, self.ahead = consumer, ahead

    def get_watermark_offsets(self, tp, timeout):
        lo, hi = self.consumer.get_watermark_offsets(tp, timeout=timeout)
        return lo, hi + self.ahead

    def __getattr__(self, name: str):
        return getattr(self.consumer, name)


class _CommitsOnEarlyEnd(_RacingWatermark):
    """A `_RacingWatermark` whose `consume` runs `then` (once) after the first batch holding an
    end-of-partition event: the commit the reader's settle time waits for, landing meanwhile."""

    def __init__(self, consumer, ahead: int, then) -> None:
        super().__init__(consumer, ahead)
        self.then = then
        self.polls_after = -1  # consume calls after the first end event (-1: none yet)

    def consume(self, *args, **kwargs):
        from confluent_kafka import KafkaError

        msgs = self.consumer.consume(*args, **kwargs)
        if self.polls_after >= 0:
            self.polls_after += 1
        elif any(m.error() is not None and m.error().code() == KafkaError._PARTITION_EOF
                 for m in msgs):
            self.polls_after = 0
            self.then()
        return msgs


def test_the_reader_settles_when_the_end_comes_short_of_the_high_watermark(
        kafka_bootstrap, topic):
    """`TopicReader.read_new` when the partition's end (librdkafka's end event, at the last
    stable offset) comes short of the high watermark it read: it waits its settle time
    (shortened here; no clock is asserted), returns what is committed and remembers that end;
    the next call reads on from there. It reads on after an early end: a transaction committed
    right after the first early end is returned by the same call (a reader that stopped at the
    first end event would miss it), which then ends at the true end, not at its settle time.
    A transaction left open is not returned, and does not move the read_committed watermark;
    once committed, the next call returns its record; an aborted one's record is never
    returned."""
    from cep.rules_topic import RulesTopic, TopicReader

    RulesTopic(kafka_bootstrap, topic).ensure()
    producer = Producer({"bootstrap.servers": kafka_bootstrap,
                         "transactional.id": f"test-{topic}", "enable.idempotence": True})
    producer.init_transactions(30)

    def write(key: str, value: dict, end: str | None) -> None:
        producer.begin_transaction()
        producer.produce(topic, key=key.encode(), value=json.dumps(value).encode())
        producer.flush(30)
        if end == "commit":
            producer.commit_transaction(30)
        elif end == "abort":
            producer.abort_transaction(30)

    reader = TopicReader(kafka_bootstrap, topic)
    reader.SETTLE_S = 0.5
    real = reader.consumer

    def markers_in(hi: int) -> None:
        """Wait until the read_committed watermark is `hi` (the commit or abort markers are in
        the partition: `commit_transaction` may return before), so that the only early end a
        read meets is the wrapper's, not a real one longer than the shortened settle time."""
        for _ in range(600):
            if real.get_watermark_offsets(reader.tp, timeout=10)[1] >= hi:
                return
            time.sleep(0.05)
        raise AssertionError(f"the watermark never reached {hi}")

    try:
        write("current/a", {"v": 1}, "commit")
        markers_in(2)
        # The watermark runs 2 ahead of the end (2); the commit after the first early end
        # brings the true end there (a0 a's marker, a1 a0's marker, then a1 and its marker). The
        # settle time is long for this call: it ends at that end, not at its settle time.
        reader.SETTLE_S = 30
        racing = _CommitsOnEarlyEnd(real, 2, lambda: write("current/a1", {"v": 0}, "commit"))
        reader.consumer = racing
        assert reader.read_new(timeout=30) == [("current/a", {"v": 1}),
                                               ("current/a1", {"v": 0})]
        assert racing.polls_after >= 1, "read on after the early end"
        assert reader._end == 4, "the true end: the watermark read at the start"
        reader.SETTLE_S = 0.5
        reader.consumer = _RacingWatermark(real, ahead=2)
        write("current/a2", {"v": 1}, "commit")
        markers_in(6)
        assert reader.read_new(timeout=30) == [("current/a2", {"v": 1})]
        assert reader._end == 6, "the end seen (record + marker), short of the watermark (8)"
        reader.consumer = real
        write("current/b", {"v": 2}, None)  # left open
        assert real.get_watermark_offsets(reader.tp, timeout=10)[1] == 6
        assert reader.read_new(timeout=30) == [], "open: not returned"
        producer.commit_transaction(30)
        markers_in(8)
        reader.consumer = _RacingWatermark(real, ahead=1)
        assert reader.read_new(timeout=30) == [("current/b", {"v": 2})]
        reader.consumer = real
        write("current/c", {"v": 3}, "abort")
        write("current/d", {"v": 4}, "commit")
        markers_in(12)  # c, its abort marker, d, its commit marker
        assert reader.read_new(timeout=30) == [("current/d", {"v": 4})]
        end = reader._end
        assert reader.read_new(timeout=30) == [] and reader._end == end, "at the end: at once"
    finally:
        real.close()
