"""The live job's rules reload is per file (issue 18): a broken file is rejected with its
errors and its previous text keeps running, while valid edits in other files are accepted;
a duplicate rule id is the newcomer's error; at start-up any broken file is an error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cep.engines import RulesWatcher

# Waits for the rules watcher's polls: seconds per case, not the inner loop.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
BIG = ("STREAM transactions (ts INT, card STRING, amount FLOAT) TIME BY ts LATENESS 5s;\n"
       "RULE big_charge VERSION 1 FROM transactions PARTITION BY card\n"
       "  PATTERN (b) DEFINE b AS amount >= 800 WITHIN 1s EMIT 'big-charge';\n")


def test_reload_per_file(tmp_path):
    rules = tmp_path / "rules"
    rules.mkdir()
    fraud = rules / "fraud.cep"
    shutil.copy(ROOT / "rules" / "fraud.cep", fraud)
    (rules / "broken.cep").write_text("RULE oops FROM transactions PATTERN (a b\n")
    snapshot = tmp_path / "snapshot.json"
    watcher = RulesWatcher(str(rules), str(snapshot), settle=False)

    first = watcher.poll()  # start-up: strict
    assert first is not None and not first.accepted and first.errors
    assert first.files[str(rules / "broken.cep")]["status"] == "rejected"
    (rules / "broken.cep").unlink()
    start = watcher.poll()
    assert start is not None and start.accepted and snapshot.exists()
    v1 = dict(start.versions)

    # A broken file beside valid edits: the edits go through, the broken file is reported.
    text = fraud.read_text()
    at = text.index("RULE velocity")
    fraud.write_text(text[:at] + text[at:].replace("VERSION 1", "VERSION 2", 1))
    (rules / "big.cep").write_text(BIG)
    (rules / "broken.cep").write_text("RULE oops FROM transactions PATTERN (a b\n")
    change = watcher.poll()
    assert change is not None and change.accepted
    assert change.added == ["big_charge"] and change.changed == ["velocity"]
    broken = change.files[str(rules / "broken.cep")]
    assert broken["status"] == "rejected" and broken["running"] == "none"
    assert str(broken["errors"][0]).startswith(f"{rules / 'broken.cep'}:2:1: syntax error")
    assert json.loads(snapshot.read_text())["versions"] == change.versions

    # Breaking an accepted file: its previous text keeps running, nothing else changes.
    v2 = dict(change.versions)
    fraud.write_text(fraud.read_text().replace("PATTERN (charge{5})", "PATTERN (charge{5}"))
    change = watcher.poll()
    assert change is not None and not change.accepted and change.versions == v2
    assert change.files[str(fraud)] == {**change.files[str(fraud)], "status": "rejected",
                                        "running": "previous"}

    # A rule id defined twice: the file that had it keeps it, the newcomer is rejected.
    (rules / "copy.cep").write_text(BIG)
    change = watcher.poll()
    assert change is not None and not change.accepted
    assert "also defined in" in str(change.files[str(rules / "copy.cep")]["errors"][0])
    assert change.files[str(rules / "big.cep")]["status"] == "accepted"
    assert v1 != v2


def test_cep_status_shows_each_file_and_the_counts(tmp_path, capsys):
    from cep.cli import main
    from jobs.metrics import Metrics

    rules = tmp_path / "rules"
    rules.mkdir()
    shutil.copy(ROOT / "rules" / "fraud.cep", rules / "fraud.cep")
    ck = tmp_path / "ck"
    ck.mkdir()
    watcher = RulesWatcher(str(rules), str(ck / "snapshot.json"), settle=False)
    metrics = Metrics(ck / "metrics.json")
    change = watcher.poll()
    metrics.set_rules(change.versions)
    metrics.set_rule_files(change.files)
    (rules / "broken.cep").write_text("RULE oops FROM transactions PATTERN (a b\n")
    metrics.set_rule_files(watcher.poll().files)
    metrics.count("events_read", 10)
    metrics.count("events", 7)
    metrics.count("dead_letters", 3)
    metrics.write()

    assert main(["status", "--checkpoint", str(ck)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"rejected  {rules / 'broken.cep'} (none of it runs)"
    assert "broken.cep:2:1: syntax error" in out[1]
    assert out[2] == f"accepted  {rules / 'fraud.cep'}"
    assert out[3] == "rules running: card_testing, impossible_travel, velocity"
    assert out[4].startswith("events read 10 = processed 7 + dead letters 3; late 0")


def test_each_poll_reads_once_and_compiles_only_new_text(tmp_path, monkeypatch):
    """The rule set that runs is built from the compilations that were checked: a poll compiles
    each new text once, never an accepted one again, and reads each file once."""
    import cep.engines as engines

    rules = tmp_path / "rules"
    rules.mkdir()
    shutil.copy(ROOT / "rules" / "fraud.cep", rules / "fraud.cep")
    (rules / "big.cep").write_text(BIG)
    compiled: list[str] = []
    real = engines.compile_file

    def counting(text: str, path: str = "<string>"):
        compiled.append(Path(path).name)
        return real(text, path)

    monkeypatch.setattr(engines, "compile_file", counting)
    watcher = RulesWatcher(str(rules), str(tmp_path / "snapshot.json"), settle=False)
    start = watcher.poll()
    assert start is not None and start.accepted and sorted(compiled) == ["big.cep", "fraud.cep"]
    assert start.ruleset is not None and {r.id for r in start.ruleset.rules} >= {"big_charge"}

    compiled.clear()
    (rules / "big.cep").write_text(BIG.replace("VERSION 1", "VERSION 2"))
    change = watcher.poll()
    assert change is not None and change.accepted and change.changed == ["big_charge"]
    assert compiled == ["big.cep"]  # fraud.cep was accepted before: not compiled again

    compiled.clear()
    (rules / "big.cep").write_text("RULE oops FROM transactions PATTERN (a b\n")
    change = watcher.poll()  # rejected: its previous text runs, from its earlier compilation
    assert change is not None and not change.accepted and compiled == ["big.cep"]
    assert change.files[str(rules / "big.cep")]["running"] == "previous"


def test_a_file_caught_mid_write_is_judged_once_its_text_settles(tmp_path):
    """An editor (or `>`) truncates a rules file, then writes it: a poll in between reads an
    empty file, which compiles to no rules. The watcher judges a new text only when the next
    poll reads it unchanged, so the rules are never removed by a half-written file."""
    rules = tmp_path / "rules"
    rules.mkdir()
    fraud = rules / "fraud.cep"
    shutil.copy(ROOT / "rules" / "fraud.cep", fraud)
    watcher = RulesWatcher(str(rules), str(tmp_path / "snapshot.json"))
    start = watcher.poll()
    assert start is not None and start.accepted
    text = fraud.read_text()
    fraud.write_text("")  # mid-write
    assert watcher.poll() is None  # seen once: not judged yet
    fraud.write_text(text.replace("VERSION 1", "VERSION 2", 1))
    assert watcher.poll() is None  # another new text: not judged yet either
    change = watcher.poll()  # the same text again: judged
    assert change is not None and change.accepted and not change.removed
    assert change.changed and watcher.poll() is None
