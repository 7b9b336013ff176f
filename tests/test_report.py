"""`cep report`: a self-contained HTML page with PNG timelines and the alerts of one rule."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest

from cep.cli import main
from cep.compile import load_rules_dir
from cep.datagen import fraud, machines, write_jsonl
from cep.report import deadline, load_rule
from cep.runtime.bind import build_engine
from cep.runtime.embedded import alerts_for, canonical_lines

# Renders PNG timelines with matplotlib: seconds per case, not the inner loop.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
RULES = str(ROOT / "rules")


def replay(tmp_path: Path, name: str, stream: str, events: list[dict]) -> tuple[Path, Path]:
    """Events as JSON-lines parts, and the alerts file `cep replay` would write for them."""
    folder = tmp_path / f"{name}-events"
    write_jsonl(events, folder, files=3)
    records = alerts_for(build_engine(load_rules_dir(RULES)), {stream: events})
    alerts = tmp_path / f"{name}-alerts.jsonl"
    alerts.write_text("\n".join(canonical_lines(records)) + "\n")
    return folder, alerts


def images(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)",
                                                     page)]


@pytest.mark.parametrize("rule_id", ["card_testing", "velocity", "impossible_travel"])
def test_report_embeds_png_timelines_and_lists_the_alerts(tmp_path, capsys, rule_id):
    ds = fraud(n_events=2000, n_keys=40, seed=3)
    events, alerts = replay(tmp_path, "fraud", "transactions", ds.events)
    out = tmp_path / "report.html"
    code = main(["report", "--alerts", str(alerts), "--input", str(events), "--rule", rule_id,
                 "--rules", RULES, "--out", str(out), "--png", str(tmp_path / "png")])
    assert code == 0
    assert f"wrote {out}" in capsys.readouterr().out
    page = out.read_text()
    assert "<img" in page and "src='http" not in page  # self-contained
    pngs = images(page)
    wanted = [json.loads(line) for line in alerts.read_text().splitlines()]
    wanted = [a for a in wanted if a["rule_id"] == rule_id]
    assert wanted and len(pngs) == len({a["key"] for a in wanted})
    assert all(p.startswith(b"\x89PNG\r\n\x1a\n") for p in pngs)
    for a in wanted:
        assert a["alert_id"] in page
        assert f"= {a['key']}</h2>" in page
    files = sorted((tmp_path / "png").iterdir())
    assert len(files) == len(pngs) and all(f.name.startswith(f"{rule_id}-") for f in files)


def test_report_for_an_absence_rule_and_chosen_keys(tmp_path):
    ds = machines(n_events=3000, n_keys=30, seed=2)
    events, alerts = replay(tmp_path, "machines", "machine_events", ds.events)
    wanted = [json.loads(x) for x in alerts.read_text().splitlines()]
    wanted = [a for a in wanted if a["rule_id"] == "missing_heartbeat"]
    assert wanted
    key = wanted[0]["key"]
    out = tmp_path / "mh.html"
    assert main(["report", "--alerts", str(alerts), "--input", str(events), "--rule",
                 "missing_heartbeat", "--rules", RULES, "--key", key, "--value", "none",
                 "--out", str(out)]) == 0
    page = out.read_text()
    assert len(images(page)) == 1 and wanted[0]["alert_id"] in page
    rule = load_rule(RULES, "missing_heartbeat")
    assert deadline(rule, wanted[0]) == wanted[0]["first_ts"] + 2 * 60_000
    assert deadline(load_rule(RULES, "velocity"), wanted[0]) is None


def test_report_with_no_alerts_says_so(tmp_path):
    ds = fraud(n_events=200, n_keys=20, seed=5, inject=0)
    events, alerts = replay(tmp_path, "quiet", "transactions", ds.events)
    out = tmp_path / "quiet.html"
    assert main(["report", "--alerts", str(alerts), "--input", str(events), "--rule",
                 "velocity", "--rules", RULES, "--out", str(out)]) == 0
    assert "No alerts for rule velocity" in out.read_text()


def test_report_unknown_rule_is_an_error(tmp_path, capsys):
    events, alerts = replay(tmp_path, "x", "transactions", fraud(200, 20, 1, 0).events)
    code = main(["report", "--alerts", str(alerts), "--input", str(events), "--rule", "nope",
                 "--rules", RULES, "--out", str(tmp_path / "r.html")])
    assert code == 2
    assert "no rule 'nope'" in capsys.readouterr().err


def test_report_reads_a_folder_with_malformed_lines_as_replay_does(tmp_path, capsys):
    ds = fraud(n_events=1500, n_keys=20, seed=5, inject=1)
    events, alerts = replay(tmp_path, "fraud", "transactions", ds.events)
    part = sorted(events.iterdir())[0]
    part.write_text(part.read_text() + "{'ts': 1, 'card': 'c1'}\nnot json at all\n")
    out = tmp_path / "report.html"
    assert main(["report", "--alerts", str(alerts), "--input", str(events), "--rule",
                 "card_testing", "--rules", RULES, "--out", str(out)]) == 0
    page = out.read_text()
    assert "2 lines that are not valid events skipped" in page and images(page)
