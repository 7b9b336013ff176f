"""Each class of mistake gives an error at the right line:column with an actionable message."""

from __future__ import annotations

import pytest

from cep.compile import CompileErrors, check_text, compile_rules
from cep.errors import RuleSemanticError, RuleSyntaxError

HEAD = "STREAM s (ts INT, k STRING, t STRING, v INT, name STRING) TIME BY ts;\n"

# (id, rule text on line 2, line, col, message fragment, error class)
CASES = [
    (
        "misspelled clause",
        "RULE r FROM s PATERN (a) EMIT 'x';",
        2,
        15,
        "did you mean PATTERN",
        RuleSyntaxError,
    ),
    (
        "missing paren",
        "RULE r FROM s PATTERN (a b EMIT 'x';",
        2,
        28,
        "expected ')', found 'EMIT'",
        RuleSyntaxError,
    ),
    (
        "unfinished statement",
        "RULE r FROM s PATTERN (a) EMIT 'x'",
        2,
        35,
        "missing ';'",
        RuleSyntaxError,
    ),
    (
        "reserved word",
        "RULE r FROM s PATTERN (a) DEFINE a AS in > 1 EMIT 'x';",
        2,
        39,
        "reserved word",
        RuleSyntaxError,
    ),
    ("bad quantifier", "RULE r FROM s PATTERN (a{}) EMIT 'x';", 2, 25, "expected", RuleSyntaxError),
    (
        "unknown field",
        "RULE r FROM s PATTERN (a) DEFINE a AS vv > 1 EMIT 'x';",
        2,
        39,
        "unknown field 'vv'",
        RuleSemanticError,
    ),
    (
        "unknown variable",
        "RULE r FROM s PATTERN (a b) DEFINE b AS v > c.v EMIT 'x';",
        2,
        45,
        "unknown pattern variable 'c'",
        RuleSemanticError,
    ),
    (
        "define not in pattern",
        "RULE r FROM s PATTERN (a) DEFINE z AS v > 1 EMIT 'x';",
        2,
        34,
        "does not appear in PATTERN",
        RuleSemanticError,
    ),
    (
        "type error compare",
        "RULE r FROM s PATTERN (a) DEFINE a AS name > 3 EMIT 'x';",
        2,
        39,
        "cannot compare a string with a number",
        RuleSemanticError,
    ),
    (
        "type error arithmetic",
        "RULE r FROM s PATTERN (a) DEFINE a AS t + 1 > 3 EMIT 'x';",
        2,
        39,
        "needs a number, got a string",
        RuleSemanticError,
    ),
    (
        "define not boolean",
        "RULE r FROM s PATTERN (a) DEFINE a AS v + 1 EMIT 'x';",
        2,
        39,
        "must be a condition",
        RuleSemanticError,
    ),
    (
        "bad regex",
        "RULE r FROM s PATTERN (a) DEFINE a AS name MATCHES '(' EMIT 'x';",
        2,
        52,
        "invalid regular expression",
        RuleSemanticError,
    ),
    (
        "unknown function",
        "RULE r FROM s PATTERN (a) DEFINE a AS SUMM(v) > 1 EMIT 'x';",
        2,
        39,
        "unknown function SUMM",
        RuleSemanticError,
    ),
    (
        "negation first",
        "RULE r FROM s PATTERN (NOT a b) EMIT 'x';",
        2,
        24,
        "cannot start with NOT",
        RuleSemanticError,
    ),
    (
        "negation in group",
        "RULE r FROM s PATTERN (a (b NOT c) d) EMIT 'x';",
        2,
        29,
        "top-level sequence",
        RuleSemanticError,
    ),
    (
        "negation quantified",
        "RULE r FROM s PATTERN (a NOT c{2} d) EMIT 'x';",
        2,
        31,
        "cannot be quantified",
        RuleSemanticError,
    ),
    (
        "negation before optional",
        "RULE r FROM s PATTERN (a -> NOT c -> d?) WITHIN 1m EMIT 'x';",
        2,
        35,
        "single variable that has to occur",
        RuleSemanticError,
    ),
    (
        "absence without time",
        "RULE r FROM s PATTERN (a -> NOT c) ALLOW UNBOUNDED EMIT 'x';",
        2,
        26,
        "needs WITHIN or STEP WITHIN",
        RuleSemanticError,
    ),
    (
        "unbounded",
        "RULE r FROM s PATTERN (a -> b) EMIT 'x';",
        2,
        24,
        "needs a time limit",
        RuleSemanticError,
    ),
    (
        "empty pattern",
        "RULE r FROM s PATTERN (a? b*) WITHIN 1m EMIT 'x';",
        2,
        24,
        "can match no events",
        RuleSemanticError,
    ),
    (
        "skip to first of first",
        "RULE r FROM s PATTERN (a b) AFTER MATCH SKIP TO FIRST a EMIT 'x';",
        2,
        55,
        "restart at the same event forever",
        RuleSemanticError,
    ),
    (
        "skip to unknown",
        "RULE r FROM s PATTERN (a b) AFTER MATCH SKIP TO LAST q EMIT 'x';",
        2,
        54,
        "not a variable of the pattern",
        RuleSemanticError,
    ),
    (
        "unknown stream",
        "RULE r FROM nope PATTERN (a) EMIT 'x';",
        2,
        13,
        "unknown stream 'nope'",
        RuleSemanticError,
    ),
    (
        "duplicate clause",
        "RULE r FROM s PATTERN (a) WITHIN 1m WITHIN 2m EMIT 'x';",
        2,
        37,
        "WITHIN is given more than once",
        RuleSemanticError,
    ),
    ("missing emit", "RULE r FROM s PATTERN (a);", 2, 6, "has no EMIT clause", RuleSemanticError),
    (
        "timeout without limit",
        "RULE r FROM s PATTERN (a b) EMIT 'x' ON TIMEOUT EMIT 'y';",
        2,
        38,
        "ON TIMEOUT EMIT needs WITHIN",
        RuleSemanticError,
    ),
    (
        "bad bounds",
        "RULE r FROM s PATTERN (a{3,1}) EMIT 'x';",
        2,
        25,
        "matches nothing",
        RuleSemanticError,
    ),
    (
        "repeat empty group",
        "RULE r FROM s PATTERN (a (b?)+ c) WITHIN 1m EMIT 'x';",
        2,
        30,
        "at least one event per repetition",
        RuleSemanticError,
    ),
    (
        "prev of a variable",
        "RULE r FROM s PATTERN (a b) DEFINE b AS v > PREV(a.v) EMIT 'x';",
        2,
        50,
        "PREV reads the previous matched event",
        RuleSemanticError,
    ),
    (
        "unknown partition field",
        "RULE r FROM s PARTITION BY card PATTERN (a) EMIT 'x';",
        2,
        28,
        "unknown field 'card'",
        RuleSemanticError,
    ),
]


@pytest.mark.parametrize(
    "text,line,col,fragment,cls", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_error_position_and_message(text, line, col, fragment, cls):
    errors = check_text(HEAD + text, "r.cep")
    assert errors, "expected an error"
    first = errors[0]
    rendered = first.render()
    assert isinstance(first, cls), rendered
    assert (first.span.line, first.span.col) == (line, col), rendered
    assert fragment in rendered, rendered
    # path:line:col, the source line and a caret under the column
    lines = rendered.splitlines()
    assert lines[0].startswith(f"r.cep:{line}:{col}: ")
    assert lines[2].index("^") == 4 + col - 1


def test_all_errors_are_reported_not_just_the_first():
    text = HEAD + (
        "RULE r1 FROM s PATERN (a) EMIT 'x';\n"
        "RULE r2 FROM s PATTERN (a) DEFINE a AS vv > 1 EMIT 'x';\n"
        "RULE r3 FROM s PATTERN (a -> b) EMIT 'x';\n"
    )
    errors = check_text(text, "r.cep")
    assert [e.span.line for e in errors] == [2, 3, 4]
    with pytest.raises(CompileErrors) as info:
        compile_rules(text, "r.cep")
    assert len(info.value.errors) == 3 and "3 errors" in str(info.value)


def test_duplicate_rule_ids():
    errors = check_text(
        HEAD + "RULE r FROM s PATTERN (a) EMIT 'x';\nRULE r FROM s PATTERN (a) EMIT 'x';", "r.cep"
    )
    assert len(errors) == 1 and "defined twice" in errors[0].message and errors[0].span.line == 3


def test_size_and_nesting_limits():
    deep = (
        HEAD
        + "RULE r FROM s PATTERN (a) DEFINE a AS "
        + "(" * 40
        + "v > 1"
        + ")" * 40
        + " EMIT 'x';"
    )
    errors = check_text(deep, "r.cep")
    assert errors and "nested more than" in errors[0].message
    big = HEAD + "-- " + "x" * 1_000_001
    errors = check_text(big, "r.cep")
    assert errors and "larger than" in errors[0].message


def test_schema_errors():
    errors = check_text("STREAM s (ts BOOL, v WIDGET, v INT) TIME BY ts;", "r.cep")
    messages = [e.message for e in errors]
    assert any("unknown type WIDGET" in m for m in messages)
    assert any("declared twice" in m for m in messages)
    assert any("must be INT (epoch milliseconds) or STRING (ISO-8601)" in m for m in messages)
    # An ISO-8601 STRING time field is fine; rules read it as epoch milliseconds (a number).
    assert check_text("STREAM s (ts STRING) TIME BY ts;\nRULE r FROM s PATTERN (a) "
                      "DEFINE a AS ts > 0 EMIT 'x';", "r.cep") == []
