"""The console's playground API without a browser: a saved case is a `cep test` file that passes,
the size limits answer 413, a costly rule stops at the time budget, bad events are reported with
the validator's reason."""

from __future__ import annotations

import json
from pathlib import Path

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
