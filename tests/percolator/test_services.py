"""The registry against real Redis and Kafka (fixtures from tests/conftest.py; nothing skips)."""

from __future__ import annotations

import json
import uuid

import pytest
import redis

from percolator.changelog import KafkaChangelog, KafkaChangeReader
from percolator.engine import Percolator
from percolator.model import Target
from percolator.registry import ChangelogFollower, SearchRegistry
from percolator.store import RedisApiKeys, RedisSearchStore
from tests.kafka_util import read_topic

pytestmark = pytest.mark.services


@pytest.fixture
def prefix() -> str:
    return f"test:{uuid.uuid4().hex[:8]}:"


def test_redis_store_and_api_keys(redis_url: str, prefix: str) -> None:
    client = redis.Redis.from_url(redis_url)
    store = RedisSearchStore(client, prefix)
    reg = SearchRegistry(store)
    s = reg.add("alice", "title:bike", search_id="s1", metadata={"n": 1},
                targets=[Target("kafka", "alerts"), Target("redis", "alice")])
    reg.add("bob", "title:car", search_id="s2")
    assert store.get("s1") == s
    assert [x.id for x in store.list("alice")] == ["s1"]
    assert [x.id for x in store.list()] == ["s1", "s2"]
    assert json.loads(client.get(f"{prefix}search:s1"))["owner"] == "alice"
    reg.remove("alice", "s1")
    assert store.get("s1") is None and store.count("alice") == 0

    keys = RedisApiKeys(client, prefix)
    key = keys.create("alice")
    assert keys.owner_of(key) == "alice"
    stored = [client.get(k) for k in client.keys(f"{prefix}apikey:*")]
    assert len(stored) == 1 and key.encode() not in stored[0]
    assert keys.owner_of(key + "x") is None


def test_changelog_drives_a_running_percolator(kafka_bootstrap: str, redis_url: str,
                                               topic: str, prefix: str) -> None:
    store = RedisSearchStore(redis.Redis.from_url(redis_url), prefix)
    reg = SearchRegistry(store, KafkaChangelog(kafka_bootstrap, topic))
    perc = Percolator()
    follower = ChangelogFollower(KafkaChangeReader(kafka_bootstrap, topic), perc)
    event = {"title": "Blue bike", "price": 120}

    reg.add("alice", "title:bike AND price:<200", search_id="s1")
    reg.add("bob", "title:car", search_id="s2")
    assert follower.sync(timeout=10).applied == 2
    assert [n.search_id for n in perc.match_batch([event])] == ["s1"]

    reg.update("bob", "s2", query="title:blue")          # changed while running
    reg.remove("alice", "s1")                            # removed while running
    result = follower.sync(timeout=10)
    assert (result.applied, result.deleted) == (1, 1)
    notes = perc.match_batch([event])
    assert [(n.search_id, n.owner, n.matched) for n in notes] == [("s2", "bob", ("title:blue",))]

    # The topic is the changelog: keys are ids, deletes are tombstones.
    msgs = read_topic(kafka_bootstrap, topic)
    assert [(k, v is None) for k, v, _ in msgs] == [
        (b"s1", False), (b"s2", False), (b"s2", False), (b"s1", True)]
    assert json.loads(msgs[2][1])["query"] == "title:blue"

    # A new executor rebuilds the same index from the topic.
    fresh = Percolator()
    ChangelogFollower(KafkaChangeReader(kafka_bootstrap, topic), fresh).sync(timeout=10)
    assert [n.search_id for n in fresh.match_batch([event])] == ["s2"]
    assert len(fresh) == 1
