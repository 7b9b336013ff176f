"""String and time functions through the whole engine (compile → bind → match → measures):
results, NULL in → NULL out, a value that does not fit → NULL (never an error), time zones
across a daylight-saving change, and SUBSTR against SQL's definition written out separately."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cep.compile import compile_rules
from cep.runtime.bind import build_engine
from cep.runtime.embedded import alerts_for

STREAM = ("STREAM s (ts INT, name STRING, path STRING, when STRING, n INT) "
          "TIME BY ts LATENESS 0s;\n")
TS = 1767225600000  # 2026-01-01T00:00:00Z, a Thursday


def measure(expr: str, **fields: object) -> object:
    rules = compile_rules(STREAM + f"RULE r FROM s PATTERN (a) MEASURES {expr} AS out "
                                   "EMIT 'm';", "f.cep")
    event = {"ts": fields.pop("ts", TS), **fields}
    [alert] = alerts_for(build_engine(rules), {"s": [event]})
    return alert["measures"]["out"]


@pytest.mark.parametrize(("expr", "fields", "want"), [
    ("SUBSTR(name, 2, 3)", {"name": "abcdef"}, "bcd"),
    ("SUBSTR(name, 4)", {"name": "abcdef"}, "def"),
    ("SUBSTR(name, 0, 2)", {"name": "abcdef"}, "a"),
    ("SUBSTR(name, 2, n)", {"name": "abcdef"}, None),          # n missing: NULL
    ("SUBSTR(name, 2, n)", {"name": "abcdef", "n": -1}, ""),
    ("REPLACE(name, 'a', 'xy')", {"name": "banana"}, "bxynxynxy"),
    ("TRIM(name)", {"name": "  x y \t"}, "x y"),
    ("LTRIM(name)", {"name": "  x "}, "x "),
    ("RTRIM(name)", {"name": "  x "}, "  x"),
    ("CONCAT(name, '/', path)", {"name": "a", "path": "b"}, "a/b"),
    ("CONCAT(name, path)", {"name": "a"}, None),               # NULL in, NULL out
    ("SPLIT_PART(path, '/', 2)", {"path": "/usr/lib"}, "usr"),
    ("SPLIT_PART(path, '/', 5)", {"path": "/usr/lib"}, ""),
    ("SPLIT_PART(path, '', 1)", {"path": "/usr/lib"}, None),   # empty delimiter: NULL
    ("HOUR(ts)", {}, 0),
    ("HOUR(ts, 'Europe/Paris')", {}, 1),
    ("DAY_OF_WEEK(ts)", {}, 4),
    ("DAY_OF_WEEK(ts, 'America/Los_Angeles')", {}, 3),         # still Wednesday there
    ("YEAR(ts, 'America/Los_Angeles')", {}, 2025),
    ("MONTH(when)", {"when": "2026-03-29T01:30:00Z"}, 3),
    # Paris moves to summer time at 01:00 UTC on 2026-03-29: 00:30 UTC is 01:30, 01:30 is 03:30
    ("HOUR(when, 'Europe/Paris')", {"when": "2026-03-29T00:30:00Z"}, 1),
    ("HOUR(when, 'Europe/Paris')", {"when": "2026-03-29T01:30:00Z"}, 3),
    ("HOUR(when)", {"when": "2026-03-29T01:30:00+02:00"}, 23),  # an offset is honoured
    ("MINUTE(when)", {"when": "not a time"}, None),            # does not parse: NULL
    ("DAY_OF_MONTH(when)", {}, None),                          # missing: NULL
])
def test_function_results(expr: str, fields: dict, want: object) -> None:
    assert measure(expr, **fields) == want


def sql_substring(s: str, start: int, length: int | None) -> str:
    """SQL:2016 <character substring function>, written from the standard's wording: the
    result is the characters at positions p with start <= p < start + length and 1 <= p."""
    end = len(s) + 1 if length is None else start + length
    return "".join(ch for p, ch in enumerate(s, start=1) if start <= p < end)


@given(st.text(max_size=8), st.integers(-4, 10), st.one_of(st.none(), st.integers(0, 10)))
def test_substr_is_sqls(s: str, start: int, length: int | None) -> None:
    from cep.expr import _substr

    assert _substr(s, start, length) == sql_substring(s, start, length)


def test_a_long_in_list_of_literals_and_a_mixed_one() -> None:
    # 5,000 literals take the grammar's literal-list path (no timing asserted here).
    names = ", ".join(f"'m{i}'" for i in range(5_000))
    assert measure(f"name IN ({names})", name="m4321") is True
    assert measure(f"name NOT IN ({names})", name="zz") is True
    # Not only literals: the general list, with SQL's NULL rules.
    assert measure("n IN (1, 2 + 1, -4, LENGTH(name))", n=3, name="abcd") is True
    assert measure("n IN (1, NULL)", n=2) is None
