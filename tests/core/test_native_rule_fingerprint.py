"""A native key state names each rule's part by a 32-bit fingerprint of the rule's id and version
(`keycodec::fingerprint`, FNV-1a): two rules of one engine with the same fingerprint would read
each other's state (one rule took the other's partial match and its match was lost), so the
engine refuses to be built, naming both rules.

The colliding pair is found here by a birthday search over generated rule ids with the core's
own fingerprint (`_core.rule_fingerprint`). The same clash is refused before an engine is built,
with one error naming both rules' files and lines (`cep.fingerprint`, the same hash in
Python): by `check_paths` (`cep check`, `cep explain`, `cep rules deploy`), by the live rules
watcher, which rejects the file bringing the second rule and keeps the rules it ran (else every
worker's engine build would fail), and by `build_embedded_engine`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from cep.cli import rules as cli_rules
from cep.compile import compile_rules
from cep.engines import RulesWatcher
from cep.errors import RuleSemanticError
from cep.fingerprint import fingerprint, rule_fingerprint
from cep.runtime.bind import build_embedded_engine, rule_hash
from cep.runtime.engine import RuleRuntime
from cep.runtime.native import _core, native_program
from cep.runtime.native_engine import NativeEngine

pytestmark = pytest.mark.skipif(_core is None, reason="the native core is not built")

STREAM = "STREAM s TIME BY ts LATENESS 0ms;\n"
AB = """RULE {} FROM s PARTITION BY k PATTERN (a -> b) DEFINE a AS t = 'a', b AS t = 'b'
  WITHIN 100ms EMIT 'ab';
"""
XY = """RULE {} FROM s PARTITION BY k PATTERN (x -> y) DEFINE x AS t = 'x', y AS t = 'y'
  WITHIN 100ms EMIT 'xy';
"""
TEXT = STREAM + AB + XY


def colliding_ids() -> tuple[str, str]:
    """Ids `p<n>` for the first rule and `q<m>` for the second whose fingerprints (with each
    rule's version: its content hash, which does not depend on its id) are equal."""
    rules = compile_rules(TEXT.format("p", "q"), "fp.cep").rules
    v1, v2 = rule_hash(rules[0]), rule_hash(rules[1])
    firsts = {_core.rule_fingerprint(f"p{n}", v1): f"p{n}" for n in range(100_000)}
    for m in range(10_000_000):  # ~43k tries expected (2**32 / 100k)
        hit = firsts.get(_core.rule_fingerprint(f"q{m}", v2))
        if hit is not None:
            return hit, f"q{m}"
    raise AssertionError("no colliding pair found")


@pytest.fixture(scope="module")
def pair() -> tuple[str, str]:
    return colliding_ids()


def test_the_python_fingerprint_is_the_cores() -> None:
    rules = compile_rules(TEXT.format("p", "q"), "fp.cep").rules
    for rule_id in ("p", "q", "card_testing", "é" * 40, ""):
        for rule in rules:
            assert fingerprint(rule_id, rule_hash(rule)) == _core.rule_fingerprint(
                rule_id, rule_hash(rule))
            assert rule_fingerprint(rule) == _core.rule_fingerprint(rule.id, rule_hash(rule))


def test_rules_with_colliding_fingerprints_are_refused(pair: tuple[str, str]) -> None:
    a, b = pair
    ruleset = compile_rules(TEXT.format(a, b), "fp.cep")
    assert [rule_hash(r) for r in ruleset.rules] == [
        rule_hash(r) for r in compile_rules(TEXT.format("p", "q"), "fp.cep").rules]
    for families in (True, False):
        with pytest.raises(RuleSemanticError, match=rf"rules '{a}' \(fp.cep:2:6\) and '{b}' "
                                                    r"\(fp.cep:4:6\) have the same key-state "
                                                    "fingerprint"):
            build_embedded_engine(ruleset, use_native=True, families=families)
        # The core refuses the pair itself (an engine built past the check).
        runtimes = [RuleRuntime(r.id, r.stream.name, r.key_field or "", 0, None, meta=r,
                                content_hash=rule_hash(r)) for r in ruleset.rules]
        programs = [native_program(r) for r in ruleset.rules]
        with pytest.raises(ValueError, match=rf"rules '{a}' and '{b}' have the same key-state "
                                             "fingerprint"):
            NativeEngine(runtimes, programs, families=families)  # type: ignore[arg-type]
    # Without the collision (one id changed) the same rules build.
    assert build_embedded_engine(compile_rules(TEXT.format(a, b + "x"), "fp.cep"),
                                 use_native=True) is not None


def rules_dir(tmp_path: Path, a: str, b: str) -> Path:
    rules = tmp_path / "rules"
    rules.mkdir(exist_ok=True)
    (rules / "ab.cep").write_text(STREAM + AB.format(a))
    (rules / "xy.cep").write_text(STREAM + XY.format(b))
    return rules


def test_cep_check_and_explain_refuse_the_pair(pair: tuple[str, str], tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    a, b = pair
    rules = rules_dir(tmp_path, a, b)
    parser = argparse.ArgumentParser(prog="cep")
    cli_rules.register(parser.add_subparsers(dest="command"))
    for argv in (["check", str(rules)], ["explain", str(rules)]):
        args = parser.parse_args(argv)
        assert args.func(args) == 1
        err = capsys.readouterr().err
        assert (f"rules '{a}' ({rules / 'ab.cep'}:2:6) and '{b}' ({rules / 'xy.cep'}:2:6) "
                "have the same key-state fingerprint") in err, err
    (rules / "xy.cep").write_text(STREAM + XY.format(b + "x"))
    args = parser.parse_args(["check", str(rules)])
    assert args.func(args) == 0


def test_cep_rules_deploy_refuses_the_pair_before_kafka(pair: tuple[str, str], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """`cep rules deploy` checks as `cep check` does (`check_paths`), before it reaches the
    broker: nothing listens at the bootstrap address given, and the refusal names the files."""
    from cep.cli import main

    a, b = pair
    rules = rules_dir(tmp_path, a, b)
    argv = ["rules", "deploy", str(rules), "--bootstrap", "127.0.0.1:9", "--topic", "t"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert (f"rules '{a}' ({rules / 'ab.cep'}:2:6) and '{b}' ({rules / 'xy.cep'}:2:6) "
            "have the same key-state fingerprint") in err, err
    assert "nothing published to t" in err


def test_the_rules_watcher_rejects_the_file_and_keeps_the_old_rules(
        pair: tuple[str, str], tmp_path: Path) -> None:
    a, b = pair
    rules = rules_dir(tmp_path, a, b + "x")
    watcher = RulesWatcher(str(rules), str(tmp_path / "snapshot.json"), settle=False)
    start = watcher.poll()
    assert start is not None and start.accepted and sorted(start.versions) == [a, b + "x"]
    (rules / "xy.cep").write_text(STREAM + XY.format(b))  # a hot reload bringing the clash
    change = watcher.poll()
    assert change is not None and not change.accepted
    assert change.versions == start.versions and change.ruleset is not None
    xy = change.files[str(rules / "xy.cep")]
    assert xy["status"] == "rejected" and xy["running"] == "previous"
    assert f"rules '{a}' ({rules / 'ab.cep'}:2:6) and '{b}' ({rules / 'xy.cep'}:2:6)" in str(
        xy["errors"][0])
    assert change.files[str(rules / "ab.cep")]["status"] == "accepted"
    # What keeps running still builds a native engine.
    assert build_embedded_engine(change.ruleset, use_native=True) is not None
