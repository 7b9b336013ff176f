"""The HTTP API with an in-memory registry: owner isolation, auth, errors, body limit,
pagination, the per-owner limit, and /docs served offline (fetched from the local server, and
opened in a real headless Chromium that may reach nothing else)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urljoin, urlparse

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
    assert [s["id"] for s in client.get("/v1/searches", headers=bob).json()["searches"]] == ["b1"]
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


def test_a_taken_id_answers_the_same_whoever_holds_it(env) -> None:
    """Creating an id that another owner holds answers exactly what creating one's own taken id
    answers: nothing says whose it is, what it holds, or to update it."""
    client, alice, bob, log = env
    assert client.post("/v1/searches", headers=alice, json={"id": "dup", "query": "a:1",
                                                             "metadata": {"secret": "s3"}}
                       ).status_code == 201
    own = client.post("/v1/searches", headers=alice, json={"id": "dup", "query": "b:2"})
    foreign = client.post("/v1/searches", headers=bob, json={"id": "dup", "query": "b:2"})
    assert own.status_code == foreign.status_code == 409
    assert own.json() == foreign.json()
    assert own.headers.get("content-length") == foreign.headers.get("content-length")
    text = foreign.text.lower()
    assert "alice" not in text and "update" not in text and "a:1" not in text and "s3" not in text
    assert foreign.json()["error"] == "id_not_available"
    assert [c.search_id for c in log.changes] == ["dup"]  # neither attempt wrote anything


def test_listing_is_paginated_by_an_id_cursor(env) -> None:
    client, alice, bob, _ = env
    ids = [f"s{i:03d}" for i in range(250)]
    for sid in ids:
        assert client.post("/v1/searches", headers=alice, json={"id": sid, "query": "x:1"}
                           ).status_code == 201
    client.post("/v1/searches", headers=bob, json={"id": "zzz-bob", "query": "x:1"})
    first = client.get("/v1/searches", headers=alice).json()
    assert (len(first["searches"]), first["limit"], first["total"]) == (100, 100, 250)
    seen, cursor, pages = [], None, 0
    while True:
        params = {"limit": 60} | ({"after": cursor} if cursor else {})
        page = client.get("/v1/searches", headers=alice, params=params).json()
        seen += [s["id"] for s in page["searches"]]
        pages += 1
        cursor = page["next"]
        if cursor is None:
            break
        # a search added or deleted between pages does not shift the rest
        if pages == 1:
            client.delete("/v1/searches/s000", headers=alice)
    assert seen == ids and pages == 5  # 60, 60, 60, 60, 10
    assert client.get("/v1/searches", headers=alice, params={"limit": 1000}
                      ).json()["next"] is None
    for bad in (0, 1001, -1):
        assert client.get("/v1/searches", headers=alice, params={"limit": bad}
                          ).status_code == 422


def test_the_per_owner_limit_is_a_clear_403() -> None:
    keys = InMemoryApiKeys()
    app = create_app(SearchRegistry(InMemorySearchStore(), InMemoryChangelog(),
                                    max_per_owner=3), keys)
    client, alice = TestClient(app), {"X-API-Key": keys.create("alice")}
    for i in range(3):
        assert client.post("/v1/searches", headers=alice, json={"query": f"x:{i}"}
                           ).status_code == 201
    r = client.post("/v1/searches", headers=alice, json={"query": "x:4"})
    assert r.status_code == 403
    assert r.json()["error"] == "owner_limit" and r.json()["limit"] == 3
    assert "3 saved searches" in r.json()["detail"] and "delete" in r.json()["detail"]
    assert SearchRegistry(InMemorySearchStore()).max_per_owner == 10_000  # as docs/api.md says


CDN = re.compile(r"cdn|jsdelivr|unpkg|cdnjs|googleapis|fastapi\.tiangolo", re.I)


def test_docs_and_every_asset_it_references_come_from_the_server(env) -> None:
    client, _, _, _ = env
    page = client.get("/docs")
    assert page.status_code == 200
    refs = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    refs += re.findall(r"url:\s*'([^']+)'", page.text)  # the OpenAPI document
    assert len(refs) >= 4, refs
    base = "http://testserver/docs"
    for ref in refs:
        url = urljoin(base, ref)
        assert urlparse(url).netloc == "testserver" and not CDN.search(ref), ref
        r = client.get(urlparse(url).path)
        assert r.status_code == 200 and len(r.content) > 0, ref
        if ref.endswith(".css"):  # and what the stylesheet loads
            for inner in re.findall(r"url\(([^)]+)\)", r.text):
                inner = inner.strip("'\"")
                assert inner.startswith("data:") or urlparse(inner).netloc == "", inner
    assert not CDN.search(page.text)
    spec = client.get("/openapi.json").json()
    schemes = spec["components"]["securitySchemes"]
    assert {s["type"] for s in schemes.values()} == {"apiKey", "http"}
    assert spec["paths"]["/v1/searches"]["get"]["security"]
    assert client.get("/docs-assets/../store.py").status_code == 404
    assert client.get("/docs-assets/index.html").status_code == 404


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture
def api_server(env) -> Iterator[str]:
    from tests.services import serve_in_thread

    client, _, _, _ = env
    with serve_in_thread(client.app) as url:
        yield url


@pytest.mark.slow  # starts Chromium: ~7 s, the slowest case of `make test-fast`
def test_docs_render_in_chromium_with_no_other_host_and_an_authorize_button(api_server) -> None:
    """Every request the page makes goes to the API server; any other is refused (as it would be
    offline) and recorded. The page renders the operations and its Authorize dialog takes an
    API key."""
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "chromium is not installed (make setup-all installs it)"
    host = urlparse(api_server).netloc
    elsewhere: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        try:
            page = browser.new_page()
            page.set_default_timeout(60_000)

            def route(r) -> None:  # type: ignore[no-untyped-def]
                if urlparse(r.request.url).netloc == host or r.request.url.startswith("data:"):
                    r.continue_()
                else:
                    elsewhere.append(r.request.url)
                    r.abort()

            page.route("**/*", route)
            page.goto(f"{api_server}/docs")
            page.wait_for_selector(".opblock-summary-path[data-path='/v1/searches']")
            page.click("button.authorize")
            page.wait_for_selector("text=X-API-Key")
            assert page.locator(".auth-container input").count() >= 1
        finally:
            browser.close()
    assert elsewhere == []


def test_docs_work_under_a_mount_point(env) -> None:
    """The console mounts the API at /search-api: /docs there loads its own OpenAPI document and
    assets from under the mount point."""
    from fastapi import FastAPI

    client, _, _, _ = env
    parent = FastAPI()
    parent.mount("/search-api", client.app)
    http = TestClient(parent)
    page = http.get("/search-api/docs").text
    assert "url: '/search-api/openapi.json'" in page
    assert http.get("/search-api/openapi.json").json()["components"]["securitySchemes"]
    for ref in re.findall(r'(?:src|href)="([^"]+)"', page):
        assert http.get(urlparse(urljoin("http://testserver/search-api/docs", ref)).path
                        ).status_code == 200, ref
