"""`cep check` and `cep explain`, and the bundled rules in rules/."""

from __future__ import annotations

import argparse
from pathlib import Path

from cep.cli import rules as cli_rules
from cep.compile import load_rules_dir

RULES = Path(__file__).parents[2] / "rules"


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="cep")
    cli_rules.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_bundled_rules_check_clean(capsys):
    assert run(["check", str(RULES)]) == 0
    assert "ok" in capsys.readouterr().out


def test_bundled_rules_cover_the_three_domains():
    rules = load_rules_dir(RULES)
    ids = {r.id for r in rules}
    assert {
        "card_testing",
        "velocity",
        "impossible_travel",
        "rise_then_drop",
        "spread_spike",
        "rising_temperature",
        "missing_heartbeat",
    } <= ids
    for r in rules:
        assert r.description and r.emit.destinations, r.id


def test_check_reports_every_error_in_every_file(tmp_path, capsys):
    (tmp_path / "a.cep").write_text("STREAM s TIME BY ts;\nRULE a FROM s PATERN (x) EMIT 'a';\n")
    (tmp_path / "b.cep").write_text(
        "STREAM s (ts INT, v INT) TIME BY ts;\n"
        "RULE b FROM s PATTERN (x) DEFINE x AS w > 1 EMIT 'b';\n"
        "RULE c FROM s PATTERN (x -> y) EMIT 'c';\n"
    )
    assert run(["check", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "a.cep:2:15: syntax error" in err
    assert "b.cep:2:39: error: unknown field 'w'" in err
    assert "b.cep:3:24: error: the pattern can keep partial matches forever" in err


def test_check_missing_path_fails(tmp_path, capsys):
    assert run(["check", str(tmp_path / "nope.cep")]) == 1


def test_explain_table_and_dot(capsys):
    assert run(["explain", str(RULES / "fraud.cep")]) == 0
    out = capsys.readouterr().out
    assert "rule card_testing v1" in out and "q0" in out and "ACCEPT" in out
    assert (
        run(
            [
                "explain",
                str(RULES / "machines.cep"),
                "--format",
                "dot",
                "--rule",
                "missing_heartbeat",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith('digraph "missing_heartbeat"') and "absence" in out


def test_explain_renders_svg(tmp_path, capsys):
    target = tmp_path / "trading.svg"
    assert run(["explain", str(RULES / "trading.cep"), "--svg", str(target)]) == 0
    assert target.read_text().lstrip().startswith(("<?xml", "<svg"))


def test_main_entry_point_knows_the_commands(capsys):
    from cep.cli import main

    assert main(["check", str(RULES)]) == 0
