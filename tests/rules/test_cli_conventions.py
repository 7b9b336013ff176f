"""The CLI's conventions: every exit code of `cep check`, `cep test` and `cep explain`, their
`--json` outputs parsed back, `cep --version`, and hints that point at the real mistake."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cep.cli import main

ROOT = Path(__file__).resolve().parents[2]
STREAM = "STREAM s (ts INT, t STRING, v INT) TIME BY ts;\n"


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("cep ")


def test_check_exit_codes_and_json(tmp_path, capsys):
    good = write(tmp_path, "good.cep", STREAM + "RULE a FROM s PATTERN (x) EMIT 'a';\n")
    bad = write(tmp_path, "bad.cep", STREAM + "RULE a FROM s PATTERN (x) DEFINE x AS vv > 1 "
                                              "EMIT 'a';\n")
    assert main(["check", good]) == 0
    assert capsys.readouterr().out.strip().endswith("ok")
    assert main(["check", str(tmp_path / "nonexistent.cep")]) == 1
    out = capsys.readouterr()
    assert "ok" not in out.out and "1 error" in out.out and "no such file" in out.err
    assert main(["check", "--json", good, bad]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_code"] == 1 and doc["rules"] == 1 and len(doc["files"]) == 2
    [err] = doc["errors"]
    assert (Path(err["file"]).name, err["line"], err["col"]) == ("bad.cep", 2, 39)
    assert "vv" in err["message"] and "^" in err["rendered"]


def test_test_exit_codes_and_json(tmp_path, capsys):
    rules = ROOT / "rules"
    assert main(["test", "-q", "-k", "card testing - three probes", str(rules)]) == 0
    capsys.readouterr()
    assert main(["test", "-k", "no case has this name", str(rules)]) == 5
    assert "no case matching" in capsys.readouterr().err
    rules_file = write(tmp_path, "r.cep", STREAM + "RULE a FROM s PATTERN (x) "
                                                   "DEFINE x AS t = 'x' EMIT 'a';\n")
    failing = write(tmp_path, "f.yaml", f"rules: {rules_file}\ncases:\n"
                    "  - name: expects nothing but gets an alert\n"
                    "    events: [{ts: +0s, t: x, v: 1}]\n    expect_none: true\n")
    assert main(["test", "--json", failing]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert (doc["exit_code"], doc["passed"], doc["failed"]) == (1, 0, 1)
    assert doc["cases"][0]["unexpected"] == 1 and "FAIL" in doc["cases"][0]["failure"]
    broken = write(tmp_path, "b.yaml", "rules: nowhere.cep\ncases: []\n")
    assert main(["test", "--json", broken]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_code"] == 2 and doc["errors"] and doc["errors"][0]["file"]


def test_explain_a_folder_a_missing_file_and_an_unwritable_svg(tmp_path, capsys):
    assert main(["explain", str(ROOT / "rules")]) == 0
    out = capsys.readouterr().out
    assert "rule card_testing" in out and "rule missing_heartbeat" in out
    assert main(["explain", str(tmp_path / "nothing")]) == 1
    assert "no such file or directory" in capsys.readouterr().err
    code = main(["explain", "--svg", str(tmp_path / "no" / "dir" / "x.svg"),
                 str(ROOT / "rules" / "fraud.cep")])
    err = capsys.readouterr().err
    assert code == 1 and "cannot write the SVG" in err and "Traceback" not in err


def test_explain_dot_shows_the_not_guards(tmp_path, capsys):
    rule = write(tmp_path, "n.cep", STREAM + "RULE a FROM s PATTERN (x -> NOT y z) "
                 "DEFINE x AS t = 'x', y AS t = 'y', z AS t = 'z' WITHIN 1m EMIT 'a';\n")
    assert main(["explain", "--format", "dot", rule]) == 0
    assert "not followed by y" in capsys.readouterr().out


@pytest.mark.parametrize(("text", "hint"), [
    # a missing ';' is reported where the next statement starts
    ("RULE a FROM s PATTERN (x) EMIT 'a'\nRULE b FROM s PATTERN (x) EMIT 'b';",
     "the statement before it is missing its ';'"),
    ("RULE a FROM s PATTERN (x y DEFINE x AS v > 1 EMIT 'a';",
     "a '(' is not closed before DEFINE"),
    ("RULE a FROM s PARTITION BY cärd PATTERN (x) EMIT 'a';",
     "quote any other name in backticks, e.g. `cärd`"),
])
def test_syntax_hints_point_at_the_real_mistake(tmp_path, capsys, text, hint):
    assert main(["check", write(tmp_path, "h.cep", STREAM + text)]) == 1
    err = capsys.readouterr().err
    assert hint in err and "reserved word" not in err


def test_semantic_errors_once_each_with_every_function_and_no_re2_log(tmp_path, capfd):
    text = STREAM + ("RULE a FROM s PATTERN (x{100000} y) DEFINE x AS FOO(v) > 1, "
                     "y AS t MATCHES '(ab' EMIT 'a';\n")
    assert main(["check", write(tmp_path, "s.cep", text)]) == 1
    err = capfd.readouterr().err
    assert err.count("quantifier bound 100000") == 1
    assert "known functions:" in err and "UPPER" in err and "SUM" in err
    assert "invalid regular expression: missing ): (ab" in err
    assert "b'missing" not in err and "re2.cc" not in err and "absl" not in err


def test_colour_only_on_a_terminal_or_when_forced(tmp_path, capsys, monkeypatch):
    bad = write(tmp_path, "c.cep", STREAM + "RULE a FROM s PATTERN (x) DEFINE x AS vv > 1 "
                                            "EMIT 'a';\n")
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    assert main(["check", bad]) == 1
    assert "\x1b[" not in capsys.readouterr().err  # not a TTY: plain text
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert main(["check", bad]) == 1
    err = capsys.readouterr().err
    assert "\x1b[1m\x1b[31merror\x1b[0m:" in err and "\x1b[36m  hint:" in err
