"""TABLE declarations and `table[field].column` lookups: parsing, `cep check` errors (each at
file:line:col with a hint), static FILE tables, and the `tables:` rows of `cep test`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cep.compile import check_text, compile_rules
from cep.runtime.bind import build_engine
from cep.runtime.embedded import alerts_for
from cep.testing.runner import run_case
from cep.testing.source import TestFileError
from cep.testing.spec import load_test_file

HEAD = """STREAM tx (ts INT, card STRING, n INT, amount FLOAT, country STRING) TIME BY ts;
TABLE customers (card STRING, home STRING, lim FLOAT, t INT) KEY card TIME BY t
  FROM KAFKA 'customers';
"""


def errors(body: str) -> list[tuple[int, int, str, str | None]]:
    return [(e.span.line, e.span.col, e.message, e.hint)
            for e in check_text(HEAD + body, "t.cep")]


RULE_HEAD = "RULE r FROM tx PARTITION BY card PATTERN (a) DEFINE a AS "


def rule(cond: str) -> str:
    return f"{RULE_HEAD}{cond} EMIT 'x';\n"


def test_a_lookup_compiles_and_explains() -> None:
    rs = compile_rules(HEAD + rule("customers[card].lim < amount"), "t.cep")
    (r,) = rs.rules
    assert r.lookups == (("customers", "card"),)
    assert "customers[card].lim" in r.explain()
    assert [t.name for t in rs.tables] == ["customers"]


@pytest.mark.parametrize("cond, col, message, hint", [
    ("customer[card].lim > 1", 0, "unknown table 'customer'", "did you mean 'customers'?"),
    ("customers[card].limit > 1", 0, "table 'customers' has no column 'limit'",
     "did you mean 'lim'?"),
    ("customers[n].lim > 1", 10, "the key of table 'customers' (card) is a STRING; n is a number",
     "look the table up by a field of the key's type"),
    ("customers[cart].lim > 1", 10, "unknown field 'cart'", "did you mean 'card'?"),
    ("customers[b.card].lim > 1", 10, "unknown pattern variable 'b'", None),
    ("customers[card].home > 1", 0, "cannot compare a string with a number", None),
])
def test_check_errors_name_the_place_with_a_hint(cond: str, col: int, message: str,
                                                 hint: str | None) -> None:
    got = errors(rule(cond))
    assert len(got) == 1
    line, c, msg, h = got[0]
    assert (line, c, msg) == (4, len(RULE_HEAD) + 1 + col, message)
    if hint is not None:
        assert h is not None and hint in h


@pytest.mark.parametrize("decl, message", [
    ("TABLE t (id STRING) KEY id FROM KAFKA 'x';", "needs TIME BY"),
    ("TABLE t (id STRING, u INT) KEY id TIME BY u FROM FILE 'x.jsonl';", "is static"),
    ("TABLE t (id STRING) KEY key TIME BY id FROM KAFKA 'x';", "key 'key' is not a column"),
    ("TABLE t (id FLOAT, u INT) KEY id TIME BY u FROM KAFKA 'x';", "must be STRING or INT"),
    ("TABLE customers (id STRING, u INT) KEY id TIME BY u FROM KAFKA 'x';", "declared twice"),
    ("TABLE tx (id STRING, u INT) KEY id TIME BY u FROM KAFKA 'x';", "both a stream and a table"),
    ("TABLE t (id STRING) KEY id FROM FILE 'no-such-file.jsonl';", "cannot read"),
])
def test_table_declaration_errors(decl: str, message: str) -> None:
    got = errors(decl + "\n")
    assert len(got) == 1 and got[0][0] == 4 and message in got[0][2], got


def test_a_static_file_table(tmp_path: Path) -> None:
    (tmp_path / "limits.jsonl").write_text(
        json.dumps({"machine": "m1", "max_t": 70.0}) + "\n\n"
        + json.dumps({"machine": "m2", "max_t": 90.0}) + "\n")
    text = """STREAM r (ts INT, machine STRING, t FLOAT) TIME BY ts;
TABLE limits (machine STRING, max_t FLOAT) KEY machine FROM FILE 'limits.jsonl';
RULE over FROM r PARTITION BY machine PATTERN (x) DEFINE x AS t > limits[machine].max_t
  MEASURES limits[machine].max_t AS limit EMIT 'over';
"""
    path = tmp_path / "m.cep"
    path.write_text(text)
    rs = compile_rules(text, str(path))
    events = [{"ts": 1, "machine": "m1", "t": 80.0}, {"ts": 2, "machine": "m2", "t": 80.0},
              {"ts": 3, "machine": "m3", "t": 999.0}, {"ts": 4, "machine": "m2", "t": 95.0}]
    got = alerts_for(build_engine(rs), {"r": events})
    assert [(a["key"], a["measures"]["limit"]) for a in got] == [("m1", 70.0), ("m2", 90.0)]


def test_a_malformed_file_row_is_a_check_error(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"machine": "m1", "max_t": "hot"}\n')
    text = "TABLE limits (machine STRING, max_t FLOAT) KEY machine FROM FILE 'bad.jsonl';\n"
    (err,) = check_text(text, str(tmp_path / "m.cep"))
    assert "bad.jsonl:1" in err.message and "max_t" in err.message


def _test_file(tmp_path: Path, body: str) -> Path:
    rules = tmp_path / "r.cep"
    rules.write_text(HEAD + "RULE far FROM tx PARTITION BY card PATTERN (a) DEFINE a AS "
                     "country <> customers[card].home MEASURES customers[card].home AS home "
                     "EMIT 'x';\n")
    path = tmp_path / "r.yaml"
    path.write_text("rules: r.cep\ndefaults: {card: c1, n: 1, amount: 1.0}\n" + body)
    return path


def test_test_file_rows_take_effect_at_their_time(tmp_path: Path) -> None:
    path = _test_file(tmp_path, """tables:
  customers:
    - {card: c1, t: +0s, home: NL}
cases:
  - name: moved
    tables:
      customers:
        - {card: c1, t: +1m, home: FR}
    events:
      - {ts: +30s, country: FR}
      - {ts: +90s, country: FR}
    expect:
      - {events: [0], measures: {home: NL}}
""")
    test = load_test_file(path)
    (case,) = test.cases
    assert [r.data["home"] for r in case.tables] == ["NL", "FR"]
    assert run_case(test, case).passed


@pytest.mark.parametrize("rows, message", [
    ("    - {card: c1, home: NL}", "has no `t`"),
    ("    - {card: c1, t: +0s, homme: NL}", "has no column 'homme'"),
    ("    - {t: +0s, home: NL}", "missing key field 'card'"),
    ("    - {card: c1, t: +0s, lim: high}", "lim"),
])
def test_test_file_table_rows_are_checked(tmp_path: Path, rows: str, message: str) -> None:
    path = _test_file(tmp_path, "tables:\n  customers:\n" + rows + "\ncases:\n  - name: x\n"
                      "    events: [{ts: +0s, country: FR}]\n    expect_none: true\n")
    with pytest.raises(TestFileError) as exc:
        load_test_file(path)
    assert message in str(exc.value) and exc.value.span.line == 5


@pytest.mark.parametrize("topic", ["a,b", "", "with space", ".", "..", "x" * 250, "café"])
def test_a_table_topic_kafka_does_not_allow_is_a_check_error_at_the_string(
        topic: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A table's Kafka topic is checked by `cep check` (it was only refused when the live job
    started): the error points at the quoted topic, line and column, with Kafka's rule."""
    from cep.cli import main

    decl = f"TABLE t (id STRING, u INT) KEY id TIME BY u\n  FROM KAFKA '{topic}';\n"
    got = errors(decl)
    assert got == [(5, 14, f"table 't': not a Kafka topic name: {topic!r}",
                    "a topic name is 1-249 of A-Z a-z 0-9 . _ - (not '.' or '..')")]
    path = tmp_path / "t.cep"
    path.write_text(HEAD + decl)
    assert main(["check", str(path)]) == 1
    assert f"{path}:5:14: error: table 't': not a Kafka topic name" in capsys.readouterr().err
    ok = HEAD + "TABLE t (id STRING, u INT) KEY id TIME BY u FROM KAFKA 'a.b_c-9';\n"
    assert check_text(ok, "t.cep") == []
