"""Registry semantics and the changelog follower, in memory."""

from __future__ import annotations

import pytest

from cep.errors import QueryError
from percolator.changelog import InMemoryChangelog
from percolator.engine import Percolator
from percolator.model import Change, InvalidSearch, SavedSearch, Target
from percolator.registry import (
    ChangelogFollower,
    LimitExceeded,
    SearchNotFound,
    SearchRegistry,
)
from percolator.store import InMemorySearchStore


def test_add_change_remove_take_effect_in_a_running_percolator() -> None:
    log = InMemoryChangelog()
    reg = SearchRegistry(InMemorySearchStore(), log)
    perc = Percolator()
    follower = ChangelogFollower(log.reader(), perc)
    event = {"title": "blue bike", "price": 120}

    reg.add("alice", "title:bike", search_id="s1", targets=[Target("redis", "alice")])
    assert perc.match(event) == []          # not applied until the batch boundary
    assert follower.sync().applied == 1
    assert [n.search_id for n in perc.match(event)] == ["s1"]

    reg.update("alice", "s1", query="title:car")
    follower.sync()
    assert perc.match(event) == []

    reg.update("alice", "s1", query="price:<200")
    follower.sync()
    (note,) = perc.match(event)
    assert (note.search_id, note.owner, note.matched, note.search_version) == (
        "s1", "alice", ("price:<200",), 3)
    assert note.targets == (Target("redis", "alice"),)

    reg.remove("alice", "s1")
    assert follower.sync().deleted == 1
    assert perc.match(event) == [] and len(perc) == 0


def test_invalid_queries_are_rejected_before_anything_is_written() -> None:
    log = InMemoryChangelog()
    store = InMemorySearchStore()
    reg = SearchRegistry(store, log)
    with pytest.raises(QueryError):
        reg.add("alice", "title:(bike")
    with pytest.raises(InvalidSearch):
        reg.add("alice", "x", search_id="bad id with spaces")
    assert store.list() == [] and log.changes == []


def test_owner_isolation_and_limits() -> None:
    reg = SearchRegistry(InMemorySearchStore(), max_per_owner=2)
    reg.add("alice", "a", search_id="a1")
    reg.add("alice", "b", search_id="a2")
    with pytest.raises(LimitExceeded):
        reg.add("alice", "c")
    with pytest.raises(SearchNotFound):
        reg.get("bob", "a1")
    with pytest.raises(SearchNotFound):
        reg.remove("bob", "a1")
    assert [s.id for s in reg.owned("alice")] == ["a1", "a2"]


def test_failed_publish_rolls_back_the_store() -> None:
    class Broken:
        def publish(self, change: Change) -> None:
            raise RuntimeError("broker down")

    store = InMemorySearchStore()
    reg = SearchRegistry(store, Broken())
    with pytest.raises(RuntimeError):
        reg.add("alice", "x:1", search_id="s")
    assert store.get("s") is None


def test_changelog_message_format_round_trips() -> None:
    s = SavedSearch("s1", "alice", "x:1", {"k": [1, 2]}, (Target("kafka", "t"),),
                    "2024-01-01T00:00:00.000Z", "2024-01-01T00:00:00.000Z", 1)
    c = Change(s.id, s)
    assert Change.decode(c.key(), c.value()) == c
    assert Change.decode(b"s1", None).is_delete


def test_follower_drops_searches_that_no_longer_compile() -> None:
    log = InMemoryChangelog()
    perc = Percolator()
    rejected: list[str] = []
    follower = ChangelogFollower(log.reader(), perc, lambda c, e: rejected.append(c.search_id))
    log.publish(Change("ok", SavedSearch("ok", "o", "x:1")))
    log.publish(Change("bad", SavedSearch("bad", "o", "x:(1")))
    result = follower.sync()
    assert (result.applied, result.rejected, rejected) == (1, 1, ["bad"])
    assert "ok" in perc and "bad" not in perc
