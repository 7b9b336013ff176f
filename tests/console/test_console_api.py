"""The console's playground API without a browser: a saved case is a `cep test` file that passes,
the size limits answer 413, a costly rule stops at the time budget, bad events are reported with
the validator's reason."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from cep.testing.runner import run_case
from cep.testing.spec import load_test_file
from jobs.console import playground
from jobs.console.app import Console, create_console

RULES = """STREAM tx (ts INT, card STRING, amount FLOAT) TIME BY ts LATENESS 0s;
RULE small_then_big FROM tx PARTITION BY card PATTERN (small -> big)
  DEFINE small AS amount < 5, big AS amount >= 500 WITHIN 10m EMIT 'small then big';
"""
EVENTS = "\n".join(json.dumps(e) for e in [
    {"ts": 1767225600000, "card": "c1", "amount": 1.0},
    {"ts": 1767225660000, "card": "c1", "amount": 900},
    {"ts": 1767225600000, "card": "c2", "amount": 2.0},
    {"ts": 1767229600000, "card": "c2", "amount": 800},
    {"ts": 1767229600001, "card": "c3", "amount": "800"},
])


def client(tmp_path: Path) -> TestClient:
    return TestClient(create_console(Console(tmp_path, redis_url=None)))


def test_a_saved_playground_case_passes_cep_test(tmp_path: Path) -> None:
    (tmp_path / "rules.cep").write_text(RULES)
    r = client(tmp_path).post("/api/playground/save", json={
        "rules": RULES, "events": EVENTS, "name": "small then big", "rules_file": "rules.cep"})
    assert r.status_code == 200, r.text
    (tmp_path / "case.yaml").write_text(r.text)
    test = load_test_file(tmp_path / "case.yaml")
    [case] = test.cases
    result = run_case(test, case)
    assert result.passed and len(result.got) == 1 and result.got[0].key == "c1"


def test_run_reports_alerts_near_misses_and_bad_events(tmp_path: Path) -> None:
    r = client(tmp_path).post("/api/playground/run", json={"rules": RULES, "events": EVENTS})
    body = r.json()
    assert [a["key"] for a in body["alerts"]] == ["c1"]
    assert [(a["key"], a["alert"]) for a in body["near_misses"]] == [("c2", "near miss")]
    assert body["dead_letters"] == [{"line": 5, "raw": json.dumps(
        {"ts": 1767229600001, "card": "c3", "amount": "800"}),
        "reason": "field 'amount' is FLOAT, got a string \"800\""}]


def test_limits_answer_413_and_a_costly_rule_stops_at_the_budget(tmp_path: Path) -> None:
    big = "x" * (playground.MAX_EVENTS_BYTES + 1)
    r = client(tmp_path).post("/api/playground/run", json={"rules": RULES, "events": big})
    assert r.status_code in (413, 422)
    costly = """STREAM s (ts INT, k STRING, v INT) TIME BY ts LATENESS 0s;
RULE any FROM s PARTITION BY k PATTERN (a ->> b ->> c ->> d) WITHIN 1d EMIT 'x';"""
    events = "\n".join(json.dumps({"ts": i, "k": "k", "v": i}) for i in range(400))
    out = playground.run(costly, events, budget_s=0.0)
    assert out.stopped is not None and "stopped after" in out.stopped


def test_compile_errors_come_back_with_line_column_and_caret(tmp_path: Path) -> None:
    r = client(tmp_path).post("/api/playground/run", json={
        "rules": RULES.replace("amount < 5", "amont < 5"), "events": EVENTS})
    [err] = r.json()["errors"]
    assert err["line"] == 3 and err["col"] > 1 and "^" in err["rendered"]


# -- per-rule figures from the live job's metrics -------------------------------------------------

class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_metrics_count_alerts_per_rule_and_apply_partial_match_deltas_once_per_batch(
        tmp_path: Path) -> None:
    from jobs.metrics import Metrics

    clock = Clock(1_800_000_000.0)
    m = Metrics(tmp_path / "metrics.json", clock=clock)
    m.set_rules({"card_testing": "v1", "velocity": "v1"})
    for _ in range(10):
        m.count_alert("card_testing")
    clock.t += 600  # ten minutes later: out of the 5-minute rate, still in the hour
    for _ in range(5):
        m.count_alert("card_testing")
    m.count_alert("velocity")
    # No stats row has carried partial matches: the figure is absent, not 0.
    assert "partial_matches" not in m.rules_live()["card_testing"]
    # Batch 3: two operator calls' deltas, applied when the batch is delivered.
    m.add_stats({"events": 4, "partial_matches": {"card_testing": 7, "velocity": 2}})
    m.add_stats({"events": 1, "partial_matches": {"card_testing": -2}})
    assert m.rules_live()["card_testing"]["partial_matches"] == 0  # not delivered yet
    m.on_batch("alerts")(3, {"records": 0})
    live = m.rules_live()
    assert live["card_testing"] == {"alerts": 15, "alerts_last_hour": 15, "alerts_per_min": 1.0,
                                    "partial_matches": 5}
    assert live["velocity"]["partial_matches"] == 2 and m.counters["alerts"] == 16
    # The job restarts on the same checkpoint; Spark runs batch 3 again (its deltas again),
    # then batch 4.
    m2 = Metrics(tmp_path / "metrics.json", clock=clock)
    m2.set_rules({"card_testing": "v1", "velocity": "v1"})
    m2.add_stats({"partial_matches": {"card_testing": 5}})
    m2.on_batch("alerts")(3, {"records": 0})
    assert m2.rules_live()["card_testing"]["partial_matches"] == 5  # not counted twice
    m2.add_stats({"partial_matches": {"card_testing": -1, "velocity": -2}})
    m2.on_batch("alerts")(4, {"records": 0})
    assert (m2.rules_live()["card_testing"]["partial_matches"],
            m2.rules_live()["velocity"]["partial_matches"]) == (4, 0)
    # velocity removed from the rules: its partial matches go with it.
    m2.set_rules({"card_testing": "v2"})
    assert "velocity" not in json.loads((tmp_path / "metrics.json").read_text())[
        "partial_matches"]["by_rule"]
    prom = (tmp_path / "metrics.prom").read_text()
    assert 'cep_rule_partial_matches{rule="card_testing"} 4' in prom


def test_the_rules_view_reads_per_rule_figures_from_the_metrics_file(tmp_path: Path) -> None:
    from jobs.metrics import Metrics

    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "rules.cep").write_text(RULES)
    metrics = Metrics(tmp_path / "metrics.json")
    metrics.set_rules({"small_then_big": "v1"})
    for _ in range(3):
        metrics.count_alert("small_then_big")
    metrics.on_batch("alerts")(0, {})  # the file is written when a batch is delivered
    http = TestClient(create_console(Console(rules, metrics=tmp_path / "metrics.json")))
    live = http.get("/api/rules").json()["live"]
    assert live["available"] and not live["partial_matches"]
    assert live["by_rule"]["small_then_big"]["alerts_last_hour"] == 3
    metrics.add_stats({"partial_matches": {"small_then_big": 12}})
    metrics.on_batch("alerts")(1, {})
    live = http.get("/api/rules").json()["live"]
    assert live["partial_matches"] and live["by_rule"]["small_then_big"]["partial_matches"] == 12
    # Without a metrics file, or with one of a job that has no per-rule figures: unavailable.
    assert not client(tmp_path).get("/api/rules").json()["live"]["available"]
    (tmp_path / "old.json").write_text(json.dumps({"time": 0, "counters": {}}))
    old = TestClient(create_console(Console(rules, metrics=tmp_path / "old.json")))
    assert "no per-rule" in old.get("/api/rules").json()["live"]["why"]


# -- the playground's inputs ---------------------------------------------------------------------

def test_the_playground_lists_and_reads_replay_inputs_and_nothing_else(tmp_path: Path) -> None:
    replay_in = tmp_path / "replay-in"
    (replay_in / "transactions").mkdir(parents=True)
    lines = [json.dumps({"ts": 1767225600000 + i, "card": "c1", "amount": 1.0})
             for i in range(10)]
    (replay_in / "transactions" / "part-0.jsonl").write_text("\n".join(lines) + "\n")
    (replay_in / "notes.txt").write_text("not an input")
    (tmp_path / "secret.jsonl").write_text('{"secret": 1}\n')
    root = Path(__file__).resolve().parents[2]
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "fraud.cep").write_text((root / "rules" / "fraud.cep").read_text())
    console = Console(rules, inputs=[root / "examples", replay_in])
    http = TestClient(create_console(console))
    listed = {i["id"]: i for i in http.get("/api/playground/inputs").json()}
    assert set(listed) == {"examples/transactions.jsonl", "examples/ticks.jsonl",
                           "examples/machine_events.jsonl", "replay-in/transactions/part-0.jsonl"}
    assert listed["examples/transactions.jsonl"]["rules_files"] == ["fraud.cep"]
    assert listed["replay-in/transactions/part-0.jsonl"]["stream"] == "transactions"
    got = http.get("/api/playground/inputs/replay-in/transactions/part-0.jsonl",
                   params={"limit": 4}).json()
    assert (got["stream"], got["events"], got["truncated"]) == ("transactions", 4, True)
    assert got["text"].splitlines() == lines[:4]
    for bad in ("replay-in/notes.txt", "replay-in/../secret.jsonl", "../secret.jsonl",
                str(tmp_path / "secret.jsonl"), "examples/transactions.expected.json"):
        assert http.get(f"/api/playground/inputs/{bad}").status_code == 404, bad
    assert http.get("/api/rules-files/fraud.cep").text.startswith(
        (root / "rules" / "fraud.cep").read_text()[:40])
    assert http.get("/api/rules-files/../secret.jsonl").status_code == 404


def test_a_sample_stream_picked_in_the_playground_raises_the_demos_expected_alerts(
        tmp_path: Path) -> None:
    """What `cep demo` checks on Spark, the playground finds on the embedded engine: the
    sample's injected patterns, exactly."""
    root = Path(__file__).resolve().parents[2]
    http = TestClient(create_console(Console(root / "rules")))
    got = http.get("/api/playground/inputs/examples/transactions.jsonl").json()
    assert not got["truncated"]
    rules = http.get("/api/rules-files/fraud.cep").text
    r = http.post("/api/playground/run", json={"rules": rules, "events": got["text"],
                                              "stream": got["stream"]}).json()
    assert r["errors"] == [] and r["dead_letters"] == [] and r["stopped"] is None
    expected = json.loads((root / "examples" / "transactions.expected.json").read_text())
    assert sorted((a["rule_id"], a["key"], a["first_ts"], a["last_ts"]) for a in r["alerts"]) \
        == sorted((e["rule"], e["key"], e["first_ts"], e["last_ts"]) for e in expected)


def test_a_job_counting_alerts_only_in_all_has_no_per_rule_alert_figures(tmp_path: Path) -> None:
    """The router of today calls count("alerts"): no per-rule zeros that would read as 'no
    alerts' in the Rules view (it falls back to Redis)."""
    from jobs.metrics import Metrics

    m = Metrics(tmp_path / "metrics.json")
    m.set_rules({"r": "v1"})
    m.count("alerts", 5)
    assert m.rules_live() == {"r": {}}
    m.count_alert("r")
    assert m.rules_live()["r"]["alerts"] == 1


def test_cep_console_inputs_flag_adds_a_replay_folder_to_the_playground(tmp_path: Path) -> None:
    """`cep console --inputs DIR` lists DIR's files beside the bundled samples."""
    from cep.cli import build_parser
    from cep.cli.console import build_app

    root = Path(__file__).resolve().parents[2]
    folder = tmp_path / "history" / "transactions"
    folder.mkdir(parents=True)
    (folder / "day-1.jsonl").write_text(
        (root / "examples" / "transactions.jsonl").read_text().splitlines()[0] + "\n")
    args = build_parser().parse_args(["console", "--rules", str(root / "rules"), "--no-redis",
                                      "--inputs", str(tmp_path / "history")])
    listed = {i["id"]: i for i in TestClient(build_app(args)).get(
        "/api/playground/inputs").json()}
    assert "examples/transactions.jsonl" in listed
    assert listed["history/transactions/day-1.jsonl"]["stream"] == "transactions"


@pytest.mark.services
def test_following_sends_ready_once_its_start_is_taken_and_then_every_new_alert(
        tmp_path: Path, redis_url: str) -> None:
    # The page says "following" on `ready`: an alert written after it must come through, even
    # one written before the generator reads on (the race a browser test hit under load).
    from cep.delivery.record import OutRecord
    from cep.delivery.redis_sink import RedisSink

    key = f"card-{uuid.uuid4().hex[:8]}"  # the Redis server is shared with other tests
    sink = RedisSink(redis_url)
    alert = {"alert_id": f"follow-{key}", "kind": "match", "alert": "a", "rule_id": "follow_r",
             "key": key, "first_ts": 1, "last_ts": 2, "detected_at": 2}
    sink.deliver([OutRecord(f"old-{key}", dict(alert, alert_id=f"old-{key}"), key=key,
                            redis_stream="cep:alerts:follow_r")])
    events = Console(tmp_path, redis_url=redis_url).follow(key=key, seconds=60)
    first = next(events)
    assert "event: ready" in first
    sink.deliver([OutRecord(f"follow-{key}", alert, key=key, redis_stream="cep:alerts:follow_r")])
    data = next(e for e in events if e.startswith("data: "))
    assert json.loads(data[len("data: "):])["alert_id"] == f"follow-{key}"  # not the old one
