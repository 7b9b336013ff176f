"""The web console in a real headless Chromium (Debian's, driven by Playwright), against the real
console server and Redis: the playground raises the expected alert and shows near misses, a
broken rule shows its error with the caret, a live alert delivered to Redis appears in the
alerts view, and markup in a rule or an event is shown as text, never run.

Screenshots of each view go to $CONSOLE_SCREENSHOTS when set (docs/console/ holds the committed
ones).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cep.delivery.record import OutRecord
from cep.delivery.redis_sink import RedisSink
from jobs.console.app import Console, create_console
from jobs.metrics import Metrics
from tests.services import serve_in_thread

pytestmark = pytest.mark.services
ROOT = Path(__file__).resolve().parent.parent.parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
XSS = "<img src=x onerror=\"window.__xss=1\"><script>window.__xss=1</script>"


@pytest.fixture
def console_url(tmp_path: Path, redis_url: str) -> Iterator[str]:

    rules = tmp_path / "rules"
    rules.mkdir()
    shutil.copy(ROOT / "rules" / "fraud.cep", rules / "fraud.cep")
    (rules / "broken.cep").write_text("STREAM s (ts INT, v INT) TIME BY ts;\n"
                                      "RULE r FROM s PATTERN (a b) DEFINE a AS vv > 1;\n")
    # The job's metrics file, written by the job's own Metrics: alerts routed per rule, and
    # the operator's per-call partial-match deltas (the stats field the operator is to carry).
    metrics = tmp_path / "metrics.json"
    job = Metrics(metrics)
    job.set_rules({"card_testing": "abc", "velocity": "abc", "impossible_travel": "abc"})
    job.count("events_read", 12)
    job.count("dead_letters", 2)
    job.add_stats({"events": 10, "late": 1,
                   "partial_matches": {"card_testing": 40, "velocity": 3}})
    job.add_stats({"events": 0, "partial_matches": {"card_testing": -2}})
    for _ in range(9):
        job.count_alert("card_testing")
    job.on_batch("alerts")(7, {"records": 9})
    job.on_progress({"name": "alerts", "batchId": 7, "processedRowsPerSecond": 1234.5,
                     "durationMs": {"triggerExecution": 850}})
    app = create_console(Console(rules, metrics=metrics, redis_url=redis_url))
    with serve_in_thread(app) as url:
        yield url


@pytest.fixture
def page() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "chromium is not installed (make setup-all installs it)"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        pg = browser.new_page(viewport={"width": 1400, "height": 900})
        pg.set_default_timeout(30_000)
        yield pg
        browser.close()


def _shot(page, name: str) -> None:  # type: ignore[no-untyped-def]
    folder = os.environ.get("CONSOLE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=False)


def test_rules_view_shows_status_errors_with_caret_and_the_automaton(console_url, page):
    page.goto(f"{console_url}/rules")
    page.wait_for_selector(".rule[data-rule=card_testing]")
    broken = page.locator(".file[data-file='broken.cep']")
    assert "rejected" in broken.inner_text()
    error = broken.locator("pre.error").first.inner_text()
    assert "broken.cep:" in error and "^" in error
    assert "accepted" in page.locator(".file[data-file='fraud.cep']").inner_text()
    card = page.locator(".rule[data-rule=card_testing]")
    # Per rule, from the live job's metrics: alert rate, last hour, live partial matches.
    assert "live job's metrics" in page.locator("#live-source").inner_text()
    assert card.locator(".pill.partials").inner_text() == "38 partial matches"
    assert card.locator(".pill.alerts-hour").inner_text() == "9 alerts in the last hour"
    assert card.locator(".pill.alert-rate").inner_text() == "1.8 alerts/min"
    assert page.locator(".rule[data-rule=velocity] .pill.partials").inner_text() == \
        "3 partial matches"
    card.get_by_text("automaton").click()
    img = card.locator("img.nfa")
    img.wait_for(state="visible")
    page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=img.element_handle())
    _shot(page, "rules")


def test_playground_edit_raises_the_expected_alert_and_shows_near_misses(console_url, page):
    page.goto(f"{console_url}/playground")
    page.wait_for_selector("#pg-rules")
    rules = page.locator("#pg-rules").input_value().replace("amount >= 500", "amount >= 850")
    page.fill("#pg-rules", rules)
    page.click("#pg-run")
    page.wait_for_selector("#pg-out h3")
    results = page.locator("#pg-out table").nth(0).locator("tr.result")
    near = page.locator("#pg-out table").nth(1).locator("tr.result")
    # c1: 1.0 then 900 within 10 min (900 >= 850); c2: 2.0 then 800 an hour later: a near miss.
    assert results.count() == 1 and "c1" in results.first.inner_text()
    assert near.count() == 1 and "c2" in near.first.inner_text()
    results.first.click()
    page.wait_for_selector("#pg-detail table.events")
    assert "900" in page.locator("#pg-detail").inner_text()
    _shot(page, "playground")


def test_playground_runs_a_picked_replay_input_and_finds_the_samples_patterns(console_url,
                                                                              page):
    """Pick the sample stream `cep demo` replays: its events and the rules that read its stream
    are loaded, and the run raises exactly the alerts the sample was made with."""
    page.goto(f"{console_url}/playground")
    page.wait_for_selector("#pg-input option[value='examples/transactions.jsonl']",
                           state="attached")
    page.select_option("#pg-input", "examples/transactions.jsonl")
    page.wait_for_selector("#pg-input-note:has-text('rules loaded from fraud.cep')")
    assert page.locator("#pg-stream").input_value() == "transactions"
    assert "RULE card_testing" in page.locator("#pg-rules").input_value()
    page.click("#pg-run")
    page.wait_for_selector("#pg-out h3")
    expected = json.loads((ROOT / "examples" / "transactions.expected.json").read_text())
    results = page.locator("#pg-out table").nth(0).locator("tr.result")
    assert results.count() == len(expected)
    shown = sorted(tuple(results.nth(i).locator("td").all_inner_texts()[:2])
                   for i in range(results.count()))
    assert shown == sorted((e["rule"], e["key"]) for e in expected)
    _shot(page, "playground-input")


def test_playground_shows_a_broken_rule_with_its_caret(console_url, page):
    page.goto(f"{console_url}/playground")
    page.wait_for_selector("#pg-rules")
    page.fill("#pg-rules", "STREAM tx (ts INT, card STRING) TIME BY ts;\n"
                           "RULE r FROM tx PARTITION BY card PATTERN (a b) DEFINE a AS amont > 1;")
    page.click("#pg-run")
    error = page.wait_for_selector("pre.compile-error").inner_text()
    assert "playground.cep:2:" in error and "^" in error and "amont" in error


def test_markup_in_a_rule_and_in_an_event_is_text(console_url, page):
    page.goto(f"{console_url}/playground")
    page.wait_for_selector("#pg-rules")
    rules = ('STREAM tx (ts INT, card STRING, amount FLOAT) TIME BY ts LATENESS 0s;\n'
             f'RULE x FROM tx PARTITION BY card PATTERN (a) DEFINE a AS amount > 1 '
             f'EMIT \'{XSS}\';')
    page.fill("#pg-rules", rules)
    page.fill("#pg-events", json.dumps({"ts": 1767225600000, "card": XSS, "amount": 5}))
    page.click("#pg-run")
    row = page.wait_for_selector("#pg-out tr.result")
    assert XSS in row.inner_text()  # the alert name and the key, as text
    row.click()
    page.wait_for_selector("#pg-detail table.events")
    assert XSS in page.locator("#pg-detail").inner_text()
    page.fill("#pg-rules", rules.replace("DEFINE a AS", f"DEFINE a AS {XSS} AND"))
    page.click("#pg-run")
    assert "<script>" in page.wait_for_selector("pre.compile-error").inner_text()
    assert page.evaluate("window.__xss") is None
    assert page.locator("#pg-out img").count() == 0 and page.locator("#pg-out script").count() == 0


def test_a_live_alert_appears_in_the_alerts_view(console_url, page, redis_url):
    key = f"card-{uuid.uuid4().hex[:8]}"  # the Redis server is shared with other tests
    page.goto(f"{console_url}/alerts")
    page.wait_for_selector("#alerts-status:text('following')")
    alert = {"alert_id": f"console-{key}", "kind": "match", "alert": "card-testing",
             "rule_id": "card_testing", "severity": "HIGH", "key": f"{key}-{XSS}",
             "first_ts": 1767225600000, "last_ts": 1767225720000, "detected_at": 1767225720000,
             "measures": {"probes": 3, "amount": 900},
             "events": [{"var": "probe", "ts": 1767225600000 + i * 30_000, "seq": i,
                         "event": {"ts": 1767225600000 + i * 30_000, "card": "c1",
                                   "amount": 1.0}} for i in range(3)]
             + [{"var": "big", "ts": 1767225720000, "seq": 3,
                 "event": {"ts": 1767225720000, "card": "c1", "amount": 900.0}}]}
    # Delivered the way the live job delivers it: the Redis sink, to the rule's stream.
    RedisSink(redis_url).deliver([OutRecord(f"console-{key}", alert, key=key,
                                            redis_stream="cep:alerts:card_testing")])
    row = page.wait_for_selector(f"#alerts tr.alert[data-rule=card_testing]:has-text('{key}')")
    assert f"{key}-{XSS}" in row.inner_text()
    row.click()
    page.wait_for_selector("#alert-detail table.events")
    assert "probes" in page.locator("#alert-detail pre.measures").inner_text()
    img = page.locator("#alert-detail img")
    page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=img.element_handle())
    assert page.evaluate("window.__xss") is None
    _shot(page, "alerts")


def test_health_view_reads_the_jobs_metrics(console_url, page):
    page.goto(f"{console_url}/health")
    table = page.wait_for_selector("#health").inner_text()
    assert "1234.5" in table and "dead letters\t2" in table
    _shot(page, "health")


@pytest.mark.spark
def test_an_alert_of_a_running_job_appears_in_the_alerts_view(console_url, page, kafka_bootstrap,
                                                               redis_url, topic, tmp_path):
    """The whole path: kcat → Kafka → `cep run` (its own process) → Redis → the console's
    server-sent events → the page, while the job runs."""
    from cep.datagen import fraud
    from cep.delivery.kafka_sink import ensure_topics
    from tests.test_live import cep_run, kcat_produce

    page.goto(f"{console_url}/alerts")
    page.wait_for_selector("#alerts-status:text('following')")
    rules = tmp_path / "job-rules"
    rules.mkdir()
    shutil.copy(ROOT / "rules" / "fraud.cep", rules / "fraud.cep")
    ds = fraud(n_events=600, n_keys=6, inject=1, seed=7)
    # This test's own cards: the Redis server and its alert streams are shared with others.
    tag = uuid.uuid4().hex[:6]
    events = [{**e, "card": f"{e['card']}-{tag}"} for e in ds.events]
    ensure_topics(kafka_bootstrap, [f"{topic}-in"], partitions=1)
    kcat_produce(kafka_bootstrap, f"{topic}-in", [f"{e['card']}\t{json.dumps(e)}\n"
                                                   for e in events])
    env = {"CEP_KAFKA_BOOTSTRAP": kafka_bootstrap, "CEP_REDIS_URL": redis_url,
           "CEP_SHARDS": "4", "CEP_SHUFFLE_PARTITIONS": "2",
           "CEP_DEAD_LETTER_TOPIC": f"{topic}-dlq", "CEP_LATE_TOPIC": f"{topic}-late"}
    log = tmp_path / "run.log"
    proc = cep_run(env, ["--rules", str(rules), "--checkpoint", str(tmp_path / "ck"),
                         "--topic", f"transactions={topic}-in"], log)
    try:
        expected = {(e.rule, f"{e.key}-{tag}") for e in ds.expected}
        first_rule, first_key = sorted(expected)[0]
        row = page.wait_for_selector(
            f"#alerts tr.alert[data-rule={first_rule}]:has-text('{first_key}')", timeout=300_000)
        assert first_key in row.inner_text()
        assert proc.poll() is None, log.read_text()[-3000:]  # seen while the job runs
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


def test_saved_searches_list_add_test_edit_delete(page, redis_url, kafka_bootstrap, topic,
                                                  tmp_path):
    """The searches view on the real registry (Redis store, Kafka changelog) and its API keys:
    an owner adds a search, tests it against an event (the explanation shows which clause
    matched), edits it and deletes it."""
    import redis
    from playwright.sync_api import expect

    from percolator.api import create_app
    from percolator.changelog import KafkaChangelog
    from percolator.registry import SearchRegistry
    from percolator.store import RedisApiKeys, RedisSearchStore

    keys = RedisApiKeys(redis.Redis.from_url(redis_url))
    owner = f"owner-{uuid.uuid4().hex[:8]}"
    key = keys.create(owner)
    changelog = KafkaChangelog(kafka_bootstrap, topic=f"{topic}-searches")
    registry = SearchRegistry(RedisSearchStore.from_url(redis_url), changelog)
    app = create_console(Console(tmp_path, redis_url=None),
                         search_app=create_app(registry, keys))
    stack = contextlib.ExitStack()
    try:
        url = stack.enter_context(serve_in_thread(app))
        page.goto(f"{url}/searches")
        page.fill("#api-key", key)
        page.click("#load-searches")
        page.fill("#new-query", "title:kafka AND price:[10 TO 100]")
        page.click("#add-search")
        row = page.wait_for_selector("tr.search:has-text('title:kafka')")
        page.fill("#test-event", json.dumps({"title": "kafka streams", "price": 42}))
        row.query_selector("button.test").click()
        # (string predicates would be refused by the page's CSP: no eval; expect() needs none)
        expect(page.locator("#search-msg")).to_contain_text("kafka")
        explanation = page.locator("#search-msg").inner_text()
        assert "title" in explanation and "kafka" in explanation
        _shot(page, "searches")
        row.query_selector("button.edit").click()
        page.fill("#new-query", "title:spark")
        page.click("#add-search")
        page.wait_for_selector("tr.search:has-text('title:spark')")
        assert page.locator("tr.search").count() == 1  # changed, not added
        page.locator("tr.search button", has_text="delete").click()
        expect(page.locator("tr.search")).to_have_count(0)
        assert [s.query for s in registry.owned(owner)] == []
    finally:
        stack.close()
        changelog.close()
