"""`cep test`: the bundled rule tests pass, wrong expectations fail with a readable diff, and
malformed test files are errors that name the file and line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from cep.cli import main
from cep.testing import run_suite

ROOT = Path(__file__).resolve().parent.parent
FRAUD = (ROOT / "rules" / "fraud.cep").as_posix()
BUNDLED = {"card_testing", "velocity", "impossible_travel", "rise_then_drop", "spread_spike",
           "rising_temperature", "missing_heartbeat", "hot_and_silent", "far_above_usual_abroad",
           "spend_far_above_usual", "failed_login_burst", "failed_login_spray",
           "cnp_session_spree", "over_own_limit", "failures_over_allowance"}


def write(tmp_path: Path, body: str, name: str = "case.yaml") -> Path:
    path = tmp_path / name
    path.write_text(f"rules: {FRAUD}\ndefaults: {{card: c1, merchant: shop, country: NL}}\n"
                    + textwrap.dedent(body))
    return path


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["test", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


PROBES = """\
    cases:
      - name: probes then big
        events:
          - {ts: +0s,  amount: 1.00}
          - {ts: +30s, amount: 1.50}
          - {ts: +1m,  amount: 0.99}
          - {ts: +2m,  amount: 900}
        expect:
    """


def test_bundled_rule_tests_pass(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code, out, err = run(capsys)  # default path: rules/
    assert code == 0, out + err
    assert "0 failed" in out and "error" not in out
    assert "note: no case expects" not in out


def test_bundled_tests_cover_every_bundled_rule_with_alerts_and_near_misses():
    suite = run_suite([ROOT / "rules"])
    assert suite.exit_code == 0 and not suite.uncovered
    alerted = {e.rule for t in suite.files for c in t.cases for e in c.expect}
    assert alerted == BUNDLED
    quiet = {r for t in suite.files for c in t.cases if not c.expect for r in c.scope}
    assert BUNDLED <= quiet  # every rule has a case where it must stay silent


def test_wrong_measure_fails_with_a_field_by_field_diff(capsys, tmp_path):
    path = write(tmp_path, PROBES + "      - {rule: card_testing, key: c1, first: +0s, last: +2m,"
                 " measures: {probes: 4, amount: 900}}\n")
    code, out, _ = run(capsys, str(path))
    assert code == 1
    assert f"FAIL {path}:4: probes then big" in out
    assert "expected alert (line 11) not raised; the closest alert differs:" in out
    assert ("    - {rule: card_testing, key: c1, first: +0s, last: +2m, "
            "measures: {probes: 4, amount: 900}}") in out
    assert "    + {rule: card_testing, key: c1, first: +0s, last: +2m, events: [0, 1, 2, 3]" in out
    assert "        measures.probes: expected 4, got 3" in out
    assert "measures.amount" not in out  # only what differs
    assert "1 case in 1 file: 0 passed, 1 failed" in out


def test_wrong_time_and_events_show_the_offset(capsys, tmp_path):
    path = write(tmp_path,
                 PROBES + "      - {rule: card_testing, last: +1m59s, events: [0, 1, 3]}\n")
    code, out, _ = run(capsys, str(path))
    assert code == 1
    assert "last: expected +1m59s, got +2m (+1s off)" in out
    assert "events: expected [0, 1, 3], got [0, 1, 2, 3]" in out


def test_unexpected_and_missing_alerts(capsys, tmp_path):
    path = write(tmp_path, PROBES + "      - {rule: velocity, key: c1}\n")
    code, out, _ = run(capsys, str(path))
    assert code == 1
    assert "expected alert (line 11) not raised: no velocity alert for key c1" in out
    assert "unexpected alert (no expectation covers it):" in out
    assert "+ {rule: card_testing, key: c1, first: +0s, last: +2m, events: [0, 1, 2, 3]" in out


def test_expect_none_that_alerts_fails(capsys, tmp_path):
    path = write(tmp_path, PROBES.replace("expect:", "expect_none: [card_testing]"))
    code, out, _ = run(capsys, str(path))
    assert code == 1
    assert "alert of card_testing, which `expect_none` says must not alert" in out


TEN_CHARGES = "".join(f"      - {{ts: +{5 * i}s, amount: {10 + i}}}\n" for i in range(10))


def test_partial_expectations_are_paired_so_that_all_can_hold(capsys, tmp_path):
    # Greedy pairing would give the first alert to the vague expectation and fail the second.
    path = write(tmp_path, "cases:\n- name: two velocity alerts\n  rule: velocity\n"
                 "  events:\n" + TEN_CHARGES
                 + "  expect:\n  - {rule: velocity}\n"
                 "  - {rule: velocity, events: [0, 1, 2, 3, 4]}\n")
    code, out, _ = run(capsys, str(path))
    assert code == 0, out


def test_no_other_alerts_false_allows_extra_alerts(capsys, tmp_path):
    path = write(tmp_path, "cases:\n- name: at least one\n  events:\n" + TEN_CHARGES
                 + "  expect: [{rule: velocity, events: [5, 6, 7, 8, 9]}]\n"
                 "  no_other_alerts: false\n")
    assert run(capsys, str(path))[0] == 0


@pytest.mark.parametrize(("body", "line", "message"), [
    ("cases:\n  - name: x\n    events: [{ts: +0s, amount: 1\n    expect_none: true\n", 6,
     "invalid YAML"),
    ("cases:\n  - name: x\n    events: [{ts: +0s, amout: 1}]\n    expect_none: true\n", 5,
     "stream 'transactions' has no field 'amout'"),
    ("cases:\n  - name: x\n    events: [{ts: soon, amount: 1}]\n    expect_none: true\n", 5,
     "'soon' is not a time"),
    ("cases:\n  - name: x\n    events: [{ts: +0s, amount: 1}]\n    expect: [{rule: velo}]\n", 6,
     "no enabled rule 'velo'"),
    ("cases:\n  - name: x\n    events: [{ts: +0s, amount: 1}]\n"
     "    expect: [{rule: velocity, measures: {count: 1}}]\n", 6,
     "rule 'velocity' has no measure 'count'"),
    ("cases:\n  - name: x\n    events: [{ts: +0s, amount: 1}]\n"
     "    expect: [{rule: velocity, events: [1]}]\n", 6, "1 is not an event index"),
    ("cases:\n  - name: x\n    events: [{ts: +0s, amount: 1}]\n    expect: []\n    expect: []\n",
     7, "duplicate key 'expect'"),
    ("cases:\n  - name: x\n    events: [{ts: +0s, amount: 1}]\n    expected: []\n", 6,
     "unknown key 'expected' in case"),
    ("cases:\n  - name: x\n    events: [{ts: +0s, amount: 1}]\n", 4,
     "says nothing about its alerts"),
])
def test_malformed_test_files_exit_2_naming_file_and_line(capsys, tmp_path, body, line, message):
    path = write(tmp_path, body, "broken.yaml")
    code, out, err = run(capsys, str(path))
    assert code == 2
    assert f"{path}:{line}:" in err
    assert message in err
    assert "1 error" in out


def test_rules_that_do_not_compile_exit_2(capsys, tmp_path):
    (tmp_path / "bad.cep").write_text("RULE r FROM s PATTERN (a) EMIT x;\n")
    (tmp_path / "t.yaml").write_text("rules: bad.cep\ncases: []\n")
    code, _, err = run(capsys, str(tmp_path / "t.yaml"))
    assert code == 2
    assert "bad.cep:1:" in err and "t.yaml:1:1" in err


def test_missing_path_exits_2(capsys, tmp_path):
    code, _, err = run(capsys, str(tmp_path / "nope.yaml"))
    assert code == 2 and "nope.yaml" in err


def test_errors_win_over_failures(capsys, tmp_path):
    write(tmp_path, PROBES + "      - {rule: card_testing, measures: {probes: 4}}\n", "a.yaml")
    write(tmp_path, "cases: 3\n", "b.yaml")
    code, out, err = run(capsys, str(tmp_path))
    assert code == 2
    assert "FAIL" in out and "b.yaml:3:" in err
