"""The HTTP API with an in-memory registry: owner isolation, auth, errors, body limit."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from percolator.api import create_app
from percolator.changelog import InMemoryChangelog
from percolator.registry import SearchRegistry
from percolator.store import InMemoryApiKeys, InMemorySearchStore


@pytest.fixture
def env() -> tuple[TestClient, dict[str, str], dict[str, str], InMemoryChangelog]:
    keys = InMemoryApiKeys()
    log = InMemoryChangelog()
    app = create_app(SearchRegistry(InMemorySearchStore(), log), keys, max_body=4096)
    alice = {"Authorization": f"Bearer {keys.create('alice')}"}
    bob = {"X-API-Key": keys.create("bob")}
    return TestClient(app), alice, bob, log


def test_owner_isolation(env) -> None:
    client, alice, bob, log = env
    r = client.post("/v1/searches", headers=alice, json={
        "id": "a1", "query": "bedrooms:3 AND price:<400000",
        "metadata": {"name": "house"}, "targets": [{"kind": "kafka", "name": "alerts"}]})
    assert r.status_code == 201, r.text
    assert r.json()["owner"] == "alice"
    assert client.post("/v1/searches", headers=bob, json={"id": "b1", "query": "x:1"}
                       ).status_code == 201
    # bob cannot list, read, change or delete alice's search; it looks like it does not exist
    assert [s["id"] for s in client.get("/v1/searches", headers=bob).json()] == ["b1"]
    assert client.get("/v1/searches/a1", headers=bob).status_code == 404
    assert client.put("/v1/searches/a1", headers=bob, json={"query": "x:2"}).status_code == 404
    assert client.delete("/v1/searches/a1", headers=bob).status_code == 404
    assert client.get("/v1/searches/a1", headers=alice).json()["query"].startswith("bedrooms")
    # nor create one with the same id
    assert client.post("/v1/searches", headers=bob, json={"id": "a1", "query": "x"}
                       ).status_code == 409
    # alice changes and deletes her own
    r = client.put("/v1/searches/a1", headers=alice, json={"query": "bedrooms:4"})
    assert r.status_code == 200 and r.json()["version"] == 2
    assert client.delete("/v1/searches/a1", headers=alice).status_code == 204
    assert client.get("/v1/searches/a1", headers=alice).status_code == 404
    assert [(c.search_id, c.is_delete) for c in log.changes] == [
        ("a1", False), ("b1", False), ("a1", False), ("a1", True)]


def test_authentication_required(env) -> None:
    client, alice, _, _ = env
    assert client.get("/v1/searches").status_code == 401
    assert client.get("/v1/searches", headers={"X-API-Key": "cep_nope_nope"}).status_code == 401
    token = alice["Authorization"].split()[1]
    forged = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    assert client.get("/v1/searches", headers={"X-API-Key": forged}).status_code == 401
    assert client.get("/healthz").status_code == 200


def test_query_errors_have_position_and_hint(env) -> None:
    client, alice, _, log = env
    r = client.post("/v1/searches", headers=alice, json={"query": "title:(bike OR car"})
    assert r.status_code == 400
    body = r.json()
    assert (body["line"], body["col"]) == (1, 19)
    assert "not closed" in body["hint"]
    assert log.changes == []


def test_body_size_limit(env) -> None:
    client, alice, _, _ = env
    r = client.post("/v1/searches", headers=alice,
                    json={"query": "x:1", "metadata": {"pad": "x" * 5000}})
    assert r.status_code == 413


def test_test_endpoint_explains(env) -> None:
    client, alice, _, _ = env
    r = client.post("/v1/test", headers=alice,
                    json={"query": "city:amsterdam~1", "event": {"city": "Amstredam"}})
    assert r.status_code == 200
    assert r.json()["matched"] is True
    assert r.json()["clauses"] == ["city:amsterdam~1"]


def test_api_keys_are_stored_hashed() -> None:
    keys = InMemoryApiKeys()
    key = keys.create("carol")
    assert keys.owner_of(key) == "carol"
    stored = list(keys._records.values())[0]
    assert key not in str(stored) and key.split("_", 2)[2] not in str(stored)
    assert keys.revoke(key) and keys.owner_of(key) is None
