"""Rules deployed through a compacted Kafka topic (docs/rules-topic.md).

`cep rules deploy|ls|history|rollback|disable|enable` write and read the topic; `cep run --rules
kafka:TOPIC` follows it through `TopicSource`, a `cep.engines.RulesSource` (the same watcher,
snapshot and per-batch semantics as a rules directory).

One partition, JSON values, three kinds of key:

- `rule/<id>`: the rule's current record (the version in force, whether it is enabled, the text
  of the file it was deployed from). Compaction keeps the latest: what a job reads.
- `version/<id>/<n>`: version n of the rule, immutable (text, content hash, who deployed it,
  when). One key per version, so compaction never removes one: rollback can always find it.
- `event/<id>/<seq>`: one record per action (deploy, rollback, disable, enable, remove) with
  who and when: the audit trail `cep rules history` prints, also one key each.

`cep rules rm` writes a tombstone for `rule/<id>`: jobs drop the rule, compaction deletes the
record; its versions and actions stay.

Every command reads the topic and writes its records in one Kafka transaction under one
transactional id per topic: two deploys at once cannot both allocate version n (the second
fences the first, whose commit fails; run it again), and a deploy of several files is published
whole or not at all. Readers use read_committed.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import socket
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cep.compile import check_paths, compile_file
from cep.delivery.kafka_sink import ensure_topics
from cep.delivery.preflight import ServiceError, kafka_topics, quiet_kafka_conf
from cep.engines import select_rule
from cep.errors import CepError, RuleSemanticError, SourceError, Span
from cep.nfa import CompiledRule, RuleSet
from cep.runtime.bind import rule_hash

TOPIC_CONFIG = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"}
SCHEMA = 1


class RulesTopicError(CepError):
    pass


class DeployRejected(RulesTopicError):
    """A file did not pass the checks: nothing was published."""

    def __init__(self, errors: list[SourceError]) -> None:
        self.errors = errors
        super().__init__("\n".join(e.render() for e in errors))


def who() -> dict[str, str]:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = os.environ.get("USER") or "unknown"
    return {"user": user, "host": socket.gethostname()}


def content_hash(rule: CompiledRule, streams: Iterable[Any]) -> str:
    """What decides a new version: the rule's compiled form (`rule_hash`, which every alert
    carries) and the declaration of the stream it reads (its fields are what events are
    validated against). Comments, layout and the file's other rules do not count."""
    spec = next((repr(s) for s in streams if s.name == rule.stream.name), "")
    return hashlib.sha256(f"{rule_hash(rule)}|{spec}".encode()).hexdigest()[:16]


@dataclass
class TopicState:
    """The topic read to its end: current records, versions and events per rule."""

    current: dict[str, dict[str, Any]] = field(default_factory=dict)
    versions: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def apply(self, key: str, value: dict[str, Any] | None) -> None:
        kind, _, rest = key.partition("/")
        if kind == "rule":
            if value is None:
                self.current.pop(rest, None)
            else:
                self.current[rest] = value
        elif kind == "version" and value is not None:
            self.versions.setdefault(value["rule"], {})[int(value["version"])] = value
        elif kind == "event" and value is not None:
            self.events.setdefault(value["rule"], []).append(value)

    def next_version(self, rule: str) -> int:
        return max(self.versions.get(rule, {0: {}}), default=0) + 1

    def next_event(self, rule: str) -> int:
        return len(self.events.get(rule, ())) + 1


class TopicReader:
    """A read_committed consumer of the topic's one partition that remembers its position:
    `read_new()` returns the records committed since the last call (from the beginning the
    first time)."""

    def __init__(self, bootstrap: str, topic: str, client_conf: Mapping[str, str] | None = None,
                 ) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        self.topic = topic
        self.consumer = Consumer(quiet_kafka_conf({
            "bootstrap.servers": bootstrap, **(client_conf or {}),
            "group.id": f"cep-rules-reader-{uuid.uuid4().hex}",
            "enable.auto.commit": False, "isolation.level": "read_committed",
            "auto.offset.reset": "earliest", "enable.partition.eof": True}))
        self._end: int | None = None  # the offset of the last end-of-partition event
        self.tp = TopicPartition(topic, 0)
        self.consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])

    SETTLE_S = 5.0  # how long an early end (an open transaction) is waited on

    def read_new(self, timeout: float = 30.0) -> list[tuple[str, dict[str, Any] | None]]:
        """Up to the partition's end (librdkafka's end-of-partition event, which counts the
        transaction markers and stops at the last stable offset); at once when the end has not
        moved since the last call."""
        from confluent_kafka import KafkaError

        lo, hi = self.consumer.get_watermark_offsets(self.tp, timeout=10)
        if hi <= lo or hi == self._end:
            return []
        out: list[tuple[str, dict[str, Any] | None]] = []
        now = time.monotonic()
        deadline, settle = now + timeout, now + min(timeout, self.SETTLE_S)
        last_eof: int | None = None
        while time.monotonic() < deadline:
            eof = False
            for m in self.consumer.consume(500, timeout=0.2):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        last_eof = m.offset()
                        # A committed transaction's markers reach the partition after the
                        # producer's commit returns: until then the stable end is short of the
                        # high watermark read above and the end event comes early.
                        eof = last_eof is not None and last_eof >= hi
                    continue
                key = m.key()
                if key is None:
                    continue
                raw = m.value()
                out.append((key.decode(), None if raw is None else json.loads(raw)))
            if eof or (last_eof is not None and time.monotonic() >= settle):
                break  # at the end, or a transaction still open: the next call reads on
        if last_eof is not None:
            self._end = last_eof
        return out

    def close(self) -> None:
        self.consumer.close()


class RulesTopic:
    """The commands' side: read the whole topic, check, publish in one transaction."""

    def __init__(self, bootstrap: str, topic: str, client_conf: Mapping[str, str] | None = None,
                 ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.client_conf = dict(client_conf or {})

    def ensure(self) -> None:
        """Create the topic (compacted, one partition) if it is missing."""
        from confluent_kafka import KafkaException

        try:
            ensure_topics(self.bootstrap, [self.topic], partitions=1, config=TOPIC_CONFIG,
                          client_conf=self.client_conf)
        except KafkaException as exc:
            raise RulesTopicError(f"Kafka at {self.bootstrap} is not reachable: {exc}") from exc

    def exists(self) -> bool:
        try:
            return self.topic in kafka_topics(self.bootstrap, self.client_conf)
        except ServiceError as exc:
            raise RulesTopicError(str(exc)) from exc

    def state(self, *, known_to_exist: bool = False) -> TopicState:
        """The topic read to its end (empty when there is no topic). `known_to_exist`: the
        caller has just created or checked it, so the broker is not asked again."""
        state = TopicState()
        if not known_to_exist and not self.exists():
            return state
        reader = TopicReader(self.bootstrap, self.topic, self.client_conf)
        try:
            for key, value in reader.read_new():
                state.apply(key, value)
        finally:
            reader.close()
        return state

    # -- writing --------------------------------------------------------------------------
    def _transaction(self) -> Any:
        from confluent_kafka import KafkaException, Producer

        producer = Producer(quiet_kafka_conf({
            "bootstrap.servers": self.bootstrap, **self.client_conf,
            "transactional.id": f"cep-rules-{self.topic}", "enable.idempotence": True}))
        try:
            producer.init_transactions(30)
        except KafkaException as exc:
            raise RulesTopicError(f"cannot write to {self.topic} at {self.bootstrap}: {exc}"
                                  ) from exc
        return producer

    def _publish(self, producer: Any,
                 records: Sequence[tuple[str, dict[str, Any] | None]]) -> None:
        from confluent_kafka import KafkaException

        try:
            producer.begin_transaction()
            for key, value in records:
                producer.produce(self.topic, key=key.encode(), value=None if value is None
                                 else json.dumps(value, sort_keys=True).encode())
            producer.commit_transaction(30)
        except KafkaException as exc:
            try:
                producer.abort_transaction(10)
            except KafkaException:
                pass
            raise RulesTopicError(f"nothing published to {self.topic}: {exc} (another "
                                  "`cep rules` command may have run at the same time: run "
                                  "this one again)") from exc

    def deploy(self, paths: Iterable[str | Path], *, by: dict[str, str] | None = None,
               ) -> list[dict[str, Any]]:
        """Check every file (as `cep check`); on any error raise `DeployRejected` and publish
        nothing. Else publish a new version of each rule whose content changed. Returns one
        line per rule: {rule, file, version, status: new|changed|unchanged, enabled}."""
        paths = list(paths)
        missing = [p for p in paths if not Path(p).exists()]
        if missing:
            raise DeployRejected([RuleSemanticError("no such file or directory", Span(str(p), 1, 1))
                                  for p in missing])
        sets, errors = check_paths(paths)
        if errors:
            raise DeployRejected(errors)
        if not any(len(rs) for rs in sets.values()):
            raise RulesTopicError(f"no rules in {', '.join(map(str, paths))}: nothing to deploy")
        self.ensure()
        by = by or who()
        producer = self._transaction()
        try:
            state = self.state(known_to_exist=True)
            now = int(time.time() * 1000)
            records: list[tuple[str, dict[str, Any]]] = []
            report: list[dict[str, Any]] = []
            for path, rules in sorted(sets.items()):
                text = path.read_text(encoding="utf-8")
                sha = hashlib.sha256(text.encode()).hexdigest()
                for rule in rules.rules:
                    chash = content_hash(rule, rules.streams)
                    cur = state.current.get(rule.id)
                    enabled = True if cur is None else bool(cur.get("enabled", True))
                    if cur is not None and cur.get("content_hash") == chash:
                        report.append({"rule": rule.id, "file": str(path), "status": "unchanged",
                                       "version": cur["version"], "enabled": enabled})
                        continue
                    n = state.next_version(rule.id)
                    version = {"schema": SCHEMA, "rule": rule.id, "version": n,
                               "declared_version": rule.version, "file": str(path),
                               "source": text, "sha256": sha, "content_hash": chash,
                               "rule_hash": rule_hash(rule), "deployed_by": by,
                               "deployed_at": now}
                    records += self._move(state, rule.id, version, enabled, "deploy", by, now)
                    report.append({"rule": rule.id, "file": str(path), "version": n,
                                   "status": "new" if cur is None else "changed",
                                   "enabled": enabled})
            if records:
                self._publish(producer, records)
            return report
        finally:
            producer.flush(10)

    def _move(self, state: TopicState, rule: str, version: dict[str, Any], enabled: bool,
              action: str, by: dict[str, str], now: int) -> list[tuple[str, dict[str, Any]]]:
        """The records of one action: the version (if new), the event, the current record."""
        n = int(version["version"])
        out: list[tuple[str, dict[str, Any]]] = []
        if n not in state.versions.get(rule, {}):
            out.append((f"version/{rule}/{n:06d}", version))
            state.apply(f"version/{rule}/{n:06d}", version)
        seq = state.next_event(rule)
        event = {"schema": SCHEMA, "rule": rule, "seq": seq, "action": action, "version": n,
                 "enabled": enabled, "by": by, "at": now}
        out.append((f"event/{rule}/{seq:06d}", event))
        state.apply(f"event/{rule}/{seq:06d}", event)
        current = {**version, "enabled": enabled, "action": action, "by": by, "at": now}
        out.append((f"rule/{rule}", current))
        state.apply(f"rule/{rule}", current)
        return out

    def _current(self, state: TopicState, rule: str) -> dict[str, Any]:
        cur = state.current.get(rule)
        if cur is None:
            known = ", ".join(sorted(state.current)) or "none"
            raise RulesTopicError(f"no rule {rule!r} in {self.topic} (rules: {known})")
        return cur

    def rollback(self, rule: str, version: int, *, by: dict[str, str] | None = None,
                 ) -> dict[str, Any]:
        """Make version `version` the one in force again (its text, as deployed)."""
        return self._act(rule, "rollback", version=version, by=by)

    def set_enabled(self, rule: str, enabled: bool, *, by: dict[str, str] | None = None,
                    ) -> dict[str, Any]:
        return self._act(rule, "enable" if enabled else "disable", enabled=enabled, by=by)

    def remove(self, rule: str, *, by: dict[str, str] | None = None) -> dict[str, Any]:
        """Take a rule out: a tombstone for its current record (jobs drop it; compaction
        deletes the record), its versions and actions kept, with a `remove` action."""
        with self._action(rule) as (producer, state, cur):
            seq = state.next_event(rule)
            event = {"schema": SCHEMA, "rule": rule, "seq": seq, "action": "remove",
                     "version": cur["version"], "enabled": False, "by": by or who(),
                     "at": int(time.time() * 1000)}
            self._publish(producer, [(f"event/{rule}/{seq:06d}", event), (f"rule/{rule}", None)])
            return {"rule": rule, "version": cur["version"], "status": "remove"}

    def _act(self, rule: str, action: str, *, version: int | None = None,
             enabled: bool | None = None, by: dict[str, str] | None = None) -> dict[str, Any]:
        with self._action(rule) as (producer, state, cur):
            n = int(cur["version"]) if version is None else version
            target = state.versions.get(rule, {}).get(n)
            if target is None:
                have = ", ".join(map(str, sorted(state.versions.get(rule, {})))) or "none"
                raise RulesTopicError(f"rule {rule!r} has no version {n} (versions: {have})")
            on = bool(cur.get("enabled", True)) if enabled is None else enabled
            if n == int(cur["version"]) and on == bool(cur.get("enabled", True)):
                return {"rule": rule, "version": n, "enabled": on, "status": "unchanged"}
            self._publish(producer, self._move(state, rule, target, on, action, by or who(),
                                               int(time.time() * 1000)))
            return {"rule": rule, "version": n, "enabled": on, "status": action}

    @contextmanager
    def _action(self, rule: str) -> Iterator[tuple[Any, TopicState, dict[str, Any]]]:
        """An action on one existing rule: its transactional producer, the topic's state as
        read inside the transaction, and the rule's current record."""
        if not self.exists():
            raise RulesTopicError(f"no rules topic {self.topic}: deploy rules first")
        producer = self._transaction()
        try:
            state = self.state(known_to_exist=True)
            yield producer, state, self._current(state, rule)
        finally:
            producer.flush(10)


def listing(state: TopicState) -> list[dict[str, Any]]:
    """`cep rules ls`: one row per rule in the topic."""
    return [{"rule": rid, "version": cur["version"], "enabled": bool(cur.get("enabled", True)),
             "declared_version": cur.get("declared_version"), "file": cur.get("file"),
             "content_hash": cur.get("content_hash"), "rule_hash": cur.get("rule_hash"),
             "action": cur.get("action"), "by": cur.get("by"), "at": cur.get("at"),
             "versions": len(state.versions.get(rid, {}))}
            for rid, cur in sorted(state.current.items())]


def history(state: TopicState, rule: str) -> dict[str, Any]:
    """`cep rules history RULE`: every version (without its text) and every action."""
    versions = [{k: v for k, v in rec.items() if k != "source"}
                for _, rec in sorted(state.versions.get(rule, {}).items())]
    cur = state.current.get(rule)
    return {"rule": rule,
            "current": None if cur is None else {"version": cur["version"],
                                                 "enabled": bool(cur.get("enabled", True))},
            "versions": versions,
            "events": sorted(state.events.get(rule, []), key=lambda e: int(e["seq"]))}


class TopicSource:
    """`cep run --rules kafka:TOPIC`: a `cep.engines.RulesSource` with one unit per enabled
    rule, named `kafka:TOPIC/RULE`, whose text is the file the rule was deployed from; the unit
    runs that one rule. Each `read` takes the records committed since the last one."""

    settle = False  # a record is whole: nothing to wait for

    def __init__(self, bootstrap: str, topic: str, client_conf: Mapping[str, str] | None = None,
                 ) -> None:
        self.topic = topic
        self.prefix = f"kafka:{topic}/"
        RulesTopic(bootstrap, topic, client_conf).ensure()
        self.reader = TopicReader(bootstrap, topic, client_conf)
        self.state = TopicState()

    def read(self) -> dict[str, str]:
        for key, value in self.reader.read_new():
            self.state.apply(key, value)
        return {self.prefix + rid: str(cur["source"]) for rid, cur in self.state.current.items()
                if cur.get("enabled", True)}

    def selected(self, name: str) -> str | None:
        return name[len(self.prefix):] if name.startswith(self.prefix) else None

    def compile(self, name: str, text: str) -> tuple[RuleSet | None, list[SourceError]]:
        rules, errors = compile_file(text, name)
        if rules is None or errors:
            return None, errors
        rid = self.selected(name) or ""
        if not any(r.id == rid for r in rules.rules):
            return None, [RuleSemanticError(f"the text deployed as rule {rid!r} does not define "
                                            "it", Span(name, 1, 1), source=text)]
        return select_rule(rules, rid), []

    def meta(self, name: str) -> dict[str, object]:
        cur = self.state.current.get(self.selected(name) or "", {})
        return {"source": name, **{k: cur.get(k) for k in (
            "version", "declared_version", "file", "sha256", "content_hash", "deployed_by",
            "deployed_at")}}

    def close(self) -> None:
        self.reader.close()
