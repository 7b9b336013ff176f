"""Nested JSON fields (`payload:amount`, `b.device:geo:country`; docs/rule-language.md, "Nested
fields"): the syntax, `cep check`'s errors (file, line, column, hint), the validator's verdicts
(a wrong type is a dead letter naming the path; a missing level is NULL), the Python engine and
the native core on the same events, and `cep test` on tests/rules/nested/."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from cep import ast
from cep import expr as X
from cep.cli import main
from cep.cli import rules as cli_rules
from cep.compile import check_text, compile_rules
from cep.events import EventSchema, validate, validate_text
from cep.grammar import parse_expression
from cep.program import export_program
from cep.runtime.bind import build_embedded_engine, build_engine, engine_kind
from cep.runtime.embedded import alerts_for, canonical_lines
from cep.runtime.native import available, why_not_native

NESTED = Path(__file__).parent / "nested"
HEAD = ("STREAM s (ts STRING, card STRING, v INT,\n"
        "  payload STRUCT(amount FLOAT, currency STRING, n INT),\n"
        "  device STRUCT(id STRING, geo STRUCT(country STRING))) TIME BY ts;\n")


def test_colon_steps_into_objects_and_dot_stays_the_variable_reference() -> None:
    e = parse_expression("payload:amount > b.device:geo:country AND a.v = `odd`:`k k`")
    assert isinstance(e, ast.Binary) and isinstance(e.left, ast.Binary)
    left, right = e.left.left, e.left.right
    assert (left.parts, left.path) == (("payload",), ("amount",))  # type: ignore[union-attr]
    assert (right.parts, right.path) == (("b", "device"), ("geo", "country"))  # type: ignore[union-attr]
    flat = e.right.left  # type: ignore[union-attr]
    assert (flat.parts, flat.path) == (("a", "v"), ())
    assert (e.right.right.parts, e.right.right.path) == (("odd",), ("k k",))  # type: ignore[union-attr]


def test_a_nested_field_compiles_to_a_path_read_on_the_right_event() -> None:
    rs = compile_rules(HEAD + "RULE r FROM s PATTERN (a b) DEFINE a AS payload:amount > 1, "
                       "b AS device:geo:country <> a.device:geo:country "
                       "MEASURES SUM(b.payload:n) AS total EMIT 'x';", "r.cep")
    rule = rs.rules[0]
    a, b = rule.nfa.conditions
    assert a == X.Compare(">", X.Path("payload", ("amount",)), X.Const(1))
    assert b == X.Compare("!=", X.Path("device", ("geo", "country")),
                          X.VarRow(0, "a", "LAST", X.Path("device", ("geo", "country")), False))
    assert str(b) == "device:geo:country != a.device:geo:country"
    spec = rs.streams[0]
    assert [(f.name, f.type) for f in spec.fields] == [  # type: ignore[union-attr]
        ("ts", "STRING"), ("card", "STRING"), ("v", "INT"), ("payload", "STRUCT"),
        ("device", "STRUCT")]
    program = export_program(rule)
    assert program["fields"] == ["payload", "device"]
    assert program["conditions"][0][2] == ["path", 0, ["amount"]]


def test_path_values() -> None:
    get = X.Path("d", ("g", "c")).bind()
    assert get({"d": {"g": {"c": "FR"}}}, ()) == "FR"
    assert get({"d": {"g": {"c": 0}}}, ()) == 0
    for missing in ({}, {"d": None}, {"d": {}}, {"d": {"g": None}}, {"d": "FR"},
                    {"d": {"g": [1]}}, {"d": [{"g": {"c": 1}}]}):
        assert get(missing, ()) is None
    assert X.Path("d", ("g",)).bind()({"d": {"g": {"c": 1}}}, ()) == {"c": 1}


# (rule text after HEAD, line, col, message, hint fragment)
ERRORS = [
    ("RULE r FROM s PATTERN (a) DEFINE a AS payload:amout > 1 EMIT 'x';",
     4, 39, "unknown field 'amout' in payload", "did you mean 'amount'?"),
    ("RULE r FROM s PATTERN (a) DEFINE a AS device:geo:contry = 'FR' EMIT 'x';",
     4, 39, "unknown field 'contry' in device:geo", "did you mean 'country'?"),
    ("RULE r FROM s PATTERN (a) DEFINE a AS payload > 1 EMIT 'x';",
     4, 39, "payload is a STRUCT: read one of its fields", "e.g. payload:amount"),
    ("RULE r FROM s PATTERN (a) DEFINE a AS device:geo = 'FR' EMIT 'x';",
     4, 39, "device:geo is a STRUCT: read one of its fields", "device:geo:country"),
    ("RULE r FROM s PATTERN (a) DEFINE a AS card:id = 'x' EMIT 'x';",
     4, 39, "card is not a STRUCT: it has no field 'id'", "card holds a STRING"),
    ("RULE r FROM s PATTERN (a) DEFINE a AS payload:currency > 1 EMIT 'x';",
     4, 39, "cannot compare a string with a number", None),
    ("RULE r FROM s PATTERN (a) DEFINE a AS payload.amount > 1 EMIT 'x';",
     4, 39, "unknown pattern variable 'payload'", "written with ':', e.g. payload:amount"),
    ("RULE r FROM s PATTERN (a b) DEFINE b AS a.payload:amont > 1 EMIT 'x';",
     4, 41, "unknown field 'amont' in payload", "did you mean 'amount'?"),
    ("RULE r FROM s PATTERN (a) MEASURES SUM(a.device:geo:country) AS s EMIT 'x';",
     4, 40, "SUM needs a number, got a string", None),
    ("RULE r FROM s PARTITION BY device:id PATTERN (a) EMIT 'x';",
     4, 28, "PARTITION BY a nested field (device:id) is not supported", "top-level field"),
    ("RULE r FROM s PARTITION BY device PATTERN (a) EMIT 'x';",
     4, 28, "PARTITION BY device: a STRUCT is not a key", "top-level field"),
]


@pytest.mark.parametrize(("rule", "line", "col", "message", "hint"), ERRORS,
                         ids=[e[3][:40] for e in ERRORS])
def test_check_errors(rule: str, line: int, col: int, message: str, hint: str | None) -> None:
    errors = check_text(HEAD + rule, "r.cep")
    assert len(errors) == 1, errors
    (err,) = errors
    assert (err.span.path, err.span.line, err.span.col) == ("r.cep", line, col), err
    assert message in err.message
    if hint is not None:
        assert err.hint is not None and hint in err.hint


def test_time_by_a_nested_field_is_reported() -> None:
    errors = check_text("STREAM s (ts INT, d STRUCT(t INT)) TIME BY d:t;", "r.cep")
    assert [(e.span.line, e.span.col, e.message) for e in errors] == [
        (1, 44, "TIME BY a nested field (d:t) is not supported")]


def test_schema_errors_inside_a_struct() -> None:
    errors = check_text("STREAM s (ts INT, p STRUCT(a WIDGET, b INT, b FLOAT)) TIME BY ts;",
                        "r.cep")
    assert [(e.span.line, e.span.col, e.message) for e in errors] == [
        (1, 28, "unknown type WIDGET"), (1, 45, "field 'b' is declared twice")]
    time_struct = check_text("STREAM s (ts STRUCT(x INT)) TIME BY ts;", "r.cep")
    assert "must be INT (epoch milliseconds) or STRING" in time_struct[0].message


def test_cep_check_names_file_line_column_and_hint(tmp_path: Path, capsys) -> None:
    path = tmp_path / "bad.cep"
    path.write_text(HEAD + "RULE r FROM s PATTERN (a) DEFINE a AS payload:amout > 1 EMIT 'x';\n")
    parser = argparse.ArgumentParser(prog="cep")
    cli_rules.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["check", str(path)])
    assert args.func(args) == 1
    err = capsys.readouterr().err
    assert f"{path}:4:39: error: unknown field 'amout' in payload" in err
    assert "hint: did you mean 'amount'?" in err


SCHEMA = EventSchema("s", "ts", ("card",), (
    ("ts", "STRING"), ("card", "STRING"),
    ("payload", (("amount", "FLOAT"), ("n", "INT"))),
    ("device", (("geo", (("country", "STRING"),)),)),
))


@pytest.mark.parametrize(("event", "reason"), [
    ({"payload": {"amount": "5"}}, "field 'payload:amount' is FLOAT, got a string \"5\""),
    ({"payload": 5}, "field 'payload' is STRUCT, got a number 5"),
    ({"payload": [1]}, "field 'payload' is STRUCT, got an array"),
    ({"device": {"geo": {"country": 3}}}, "field 'device:geo:country' is STRING, got a number 3"),
    ({"device": {"geo": "FR"}}, "field 'device:geo' is STRUCT, got a string \"FR\""),
    ({"payload": {"n": 1.5}}, "field 'payload:n' is INT, got a number 1.5"),
])
def test_a_nested_value_of_the_wrong_type_is_a_dead_letter(event: dict, reason: str) -> None:
    raw = json.dumps({"ts": 5, "card": "c", **event})
    assert validate(raw, SCHEMA) == (None, None, reason)


def test_missing_or_null_levels_and_undeclared_keys_pass() -> None:
    for extra in ({}, {"payload": None}, {"payload": {}}, {"device": {"geo": None}},
                  {"device": {"geo": {}, "other": [1]}}, {"payload": {"x": "undeclared"}}):
        raw = json.dumps({"ts": "2026-01-01T00:00:01Z", "card": "c", **extra})
        event, ts, reason = validate(raw, SCHEMA)
        assert reason is None and ts == 1_767_225_601_000
        assert event == {"ts": ts, "card": "c", **extra}


def test_an_integral_float_in_a_nested_int_is_converted_in_the_text_too() -> None:
    raw = '{"ts": 1, "card": "c", "payload": {"n": 2.0, "amount": 1}}'
    text, event, _, reason = validate_text(raw, SCHEMA)
    assert reason is None and event is not None
    assert event["payload"] == {"n": 2, "amount": 1} and type(event["payload"]["n"]) is int
    assert json.loads(text) == event  # type: ignore[arg-type]


def _payments() -> list[dict]:
    """Events for tests/rules/nested/payments.cep: three cards, some countries changing, some
    nested levels missing or null, ISO-8601 times."""
    out = []
    countries = ("FR", "FR", "US", None, "DE")
    for i in range(60):
        card = f"c{i % 3}"
        device: dict | None = {"id": f"d{(i // 9) % 2}",
                               "geo": {"country": countries[i % 5], "city": "Paris"}}
        if i % 11 == 0:
            device = None
        elif i % 7 == 0:
            device = {"id": f"d{i % 2}", "geo": None}
        out.append({"ts": f"2026-01-01T00:{i // 2:02d}:{(i * 7) % 60:02d}Z", "card": card,
                    "payload": {"amount": float(1 + (i // 3) % 5 * 10 + i % 3),
                                "currency": "EUR"},
                    "device": device})
    return out


@pytest.mark.skipif(not available(), reason="native core not built")
def test_python_engine_and_native_core_agree_on_nested_fields() -> None:
    rules = compile_rules((NESTED / "payments.cep").read_text(), "payments.cep")
    assert all(why_not_native(r) is None for r in rules.rules)
    schema = EventSchema.of(rules.streams[0], ["card"])
    events = [validate(json.dumps(e), schema)[0] for e in _payments()]
    assert all(e is not None for e in events)
    python = build_engine(rules, use_native=False)
    native = build_embedded_engine(rules, use_native=True)
    assert engine_kind(python) == "python" and engine_kind(native) == "native"
    got = {}
    for name, engine in (("python", python), ("native", native)):
        got[name] = canonical_lines(alerts_for(engine, {"payments": events}))  # type: ignore[dict-item]
    assert got["python"] == got["native"]
    rules_hit = {json.loads(line)["rule_id"] for line in got["python"]}
    assert rules_hit == {"new_country", "device_burst"}, got["python"]


def test_cep_test_runs_the_nested_example(capsys) -> None:
    assert main(["test", str(NESTED / "payments.yaml")]) == 0
    assert "4 passed, 0 failed" in capsys.readouterr().out


def test_the_documented_example_compiles() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "rule-language.md").read_text()
    section = doc[doc.index("### Nested fields"):]
    example = section[section.index("```sql") + 6:section.index("```\n")]
    rules = compile_rules(example, "rule-language.md")
    assert [r.id for r in rules.rules] == ["new_country"]
    assert why_not_native(rules.rules[0]) is None or not available()
