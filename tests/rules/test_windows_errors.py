"""Errors of the window syntax (docs/windows.md) name file:line:col, show the line and a hint,
as the other rule errors do (tests/rules/test_errors.py)."""

from __future__ import annotations

import pytest

from cep.compile import check_text
from cep.errors import RuleSemanticError, RuleSyntaxError

HEAD = "STREAM s (ts INT, k STRING, t STRING, v INT, name STRING) TIME BY ts;\n"
WIN = "RULE r FROM s PARTITION BY k WINDOW TUMBLING (SIZE 5m) "

# (id, rule text on line 2, the text the error points at (its first occurrence), message
# fragment, hint fragment or None, error class)
CASES = [
    ("OVER on a pattern variable",
     "RULE r FROM s PATTERN (a b) DEFINE b AS v > AVG(a.v) OVER 1h EMIT 'x';",
     "a.v", "reads the key's events, not a pattern variable's", "without OVER",
     RuleSemanticError),
    ("OVER on a non-aggregate",
     "RULE r FROM s PATTERN (a) DEFINE a AS ABS(v) OVER 1h > 1 EMIT 'x';",
     "ABS", "ABS is not an aggregate", None, RuleSemanticError),
    ("OVER of a string",
     "RULE r FROM s PATTERN (a) DEFINE a AS SUM(name) OVER 1h > 1 EMIT 'x';",
     "name)", "needs a number, got a string", "COUNT(x) counts any value", RuleSemanticError),
    ("OVER of zero length",
     "RULE r FROM s PATTERN (a) DEFINE a AS COUNT(*) OVER 0s > 1 EMIT 'x';",
     "0s", "longer than 0 and at most 366d", None, RuleSemanticError),
    ("OVER without a duration",
     "RULE r FROM s PATTERN (a) DEFINE a AS COUNT(*) OVER > 1 EMIT 'x';",
     "> 1", "duration", None, RuleSyntaxError),
    ("OVER nested",
     "RULE r FROM s PATTERN (a) DEFINE a AS SUM(v + COUNT(*) OVER 1h) OVER 1h > 1 EMIT 'x';",
     "COUNT", "cannot be nested", None, RuleSemanticError),
    ("window rule with a PATTERN",
     WIN + "PATTERN (a) EMIT 'x';",
     "PATTERN", "PATTERN belongs to pattern rules", "WHERE", RuleSemanticError),
    ("WHERE in a pattern rule",
     "RULE r FROM s PATTERN (a) WHERE v > 1 EMIT 'x';",
     "WHERE", "WHERE belongs to window rules", "DEFINE", RuleSemanticError),
    ("bare field in HAVING",
     WIN + "HAVING v > 3 EMIT 'x';",
     "v > 3", "v alone has no single value", "SUM(v)", RuleSemanticError),
    ("bare field in a window MEASURE",
     WIN + "MEASURES name AS who EMIT 'x';",
     "name AS", "name alone has no single value", "COUNT(name)", RuleSemanticError),
    ("aggregate in WHERE",
     WIN + "WHERE COUNT(*) > 3 EMIT 'x';",
     "COUNT", "COUNT is not allowed in WHERE", "go in HAVING", RuleSemanticError),
    ("OVER in a window rule",
     WIN + "HAVING COUNT(*) OVER 1h > 3 EMIT 'x';",
     "COUNT", "OVER is for pattern rules", "without OVER", RuleSemanticError),
    ("HAVING not a condition",
     WIN + "HAVING COUNT(*) EMIT 'x';",
     "COUNT", "HAVING must be a condition", None, RuleSemanticError),
    ("advance longer than size",
     "RULE r FROM s WINDOW HOPPING (SIZE 5m, ADVANCE BY 10m) EMIT 'x';",
     "10m", "ADVANCE BY is longer than SIZE", "at most the size", RuleSemanticError),
    ("too many hops",
     "RULE r FROM s WINDOW HOPPING (SIZE 1h, ADVANCE BY 1s) EMIT 'x';",
     "1s", "more than 100 windows", "larger ADVANCE BY", RuleSemanticError),
    ("window size zero",
     "RULE r FROM s WINDOW TUMBLING (SIZE 0m) EMIT 'x';",
     "0m", "window size must be positive", None, RuleSemanticError),
    ("unknown window kind",
     "RULE r FROM s WINDOW SLIDING (SIZE 5m) EMIT 'x';",
     "SLIDING", "TUMBLING", None, RuleSyntaxError),
    ("HOPPING without ADVANCE BY",
     "RULE r FROM s WINDOW HOPPING (SIZE 5m) EMIT 'x';",
     ") EMIT", "expected ','", None, RuleSyntaxError),
    ("reserved measure name",
     WIN + "MEASURES COUNT(*) AS window_end EMIT 'x';",
     "window_end EMIT", "measure 'window_end' is already in every window alert",
     "the window's bounds",
     RuleSemanticError),
    ("neither PATTERN nor WINDOW",
     "RULE r FROM s EMIT 'x';",
     "r FROM", "has no PATTERN clause", "WINDOW TUMBLING", RuleSemanticError),
    ("navigation in a window rule",
     WIN + "MEASURES LAST(v) AS last_v EMIT 'x';",
     "LAST", "a window rule has none", "MIN, MAX", RuleSemanticError),
]


@pytest.mark.parametrize("text,anchor,fragment,hint,cls", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_window_error_position_message_and_hint(text, anchor, fragment, hint, cls):
    errors = check_text(HEAD + text, "w.cep")
    assert errors, "expected an error"
    first = errors[0]
    rendered = first.render()
    col = text.index(anchor) + 1
    assert isinstance(first, cls), rendered
    assert (first.span.line, first.span.col) == (2, col), rendered
    assert fragment in rendered, rendered
    if hint is not None:
        assert "hint:" in rendered and hint in rendered, rendered
    lines = rendered.splitlines()
    assert lines[0].startswith(f"w.cep:2:{col}: ")
    assert lines[2].index("^") == 4 + col - 1


def test_valid_window_syntax_compiles():
    text = HEAD + (
        "RULE o FROM s PARTITION BY k PATTERN (a) "
        "DEFINE a AS v > 3 * AVG(v) OVER 30d EXCLUDE CURRENT ROW AND COUNT(*) OVER 1h >= 2 "
        "MEASURES SUM(v) OVER 24h AS day, COUNT(name) OVER 1h AS named EMIT 'x';\n"
        "RULE t FROM s PARTITION BY k WINDOW TUMBLING (SIZE 5m) WHERE t = 'fail' "
        "HAVING COUNT(*) > 100 MEASURES COUNT(*) AS n, AVG(v) AS mean EMIT 'y';\n"
        "RULE h FROM s PARTITION BY k WINDOW HOPPING (SIZE 10m, ADVANCE BY 5m) EMIT 'z';\n"
        "RULE g FROM s PARTITION BY k WINDOW SESSION (30m) HAVING MAX(v) - MIN(v) > 5 "
        "EMIT 'w';\n"
    )
    assert check_text(text, "w.cep") == []
