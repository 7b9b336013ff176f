"""The parsed-statement cache (cep.grammar.parse_statement): a statement parsed again at the same
place gives the tree a fresh parse gives, spans included; at another place (offset, line,
column, path), its own spans; a statement that fails fails again."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from cep import grammar
from cep.compile import CompileErrors, compile_rules
from cep.compile.parse import parse_text
from cep.errors import Span

HEADER = "STREAM s (x INT, y FLOAT) TIME BY ts LATENESS 5s;\n"
RULE = ("RULE r FROM s PARTITION BY x\n  PATTERN (a b+) DEFINE a AS x = 1, b AS y > 2.5\n"
        "  WITHIN 10s EMIT 'm';")
OTHER = "RULE q FROM s PATTERN (c) DEFINE c AS x IN (1, 2) EMIT 'n';"


def spans(node: Any) -> list[Span]:
    """Every span in a tree, in field order (spans are not part of a node's equality)."""
    if isinstance(node, Span):
        return [node]
    if dataclasses.is_dataclass(node):
        return [s for f in dataclasses.fields(node) for s in spans(getattr(node, f.name))]
    if isinstance(node, tuple):
        return [s for x in node for s in spans(x)]
    return []


def fresh(text: str, path: str) -> Any:
    grammar._parse_statement.cache_clear()
    return parse_text(text, path)[0]


@pytest.mark.parametrize("text", [
    HEADER + RULE,
    HEADER + RULE + "\n" + OTHER,                  # the same statements, more after them
    HEADER + OTHER + "\n" + RULE,                  # RULE on later lines
    HEADER + OTHER + " " + RULE,                   # ... and not at a line's start
    "-- a comment\n\n" + HEADER + "  " + RULE,     # every statement moved
])
def test_a_cached_tree_is_the_fresh_parse_spans_included(text: str) -> None:
    grammar._parse_statement.cache_clear()
    for other in (HEADER + RULE, HEADER + OTHER + "\n" + RULE, text):
        parse_text(other, "p.cep")  # fills the cache with the statements at other places
    cached, errors = parse_text(text, "p.cep")
    assert not errors
    assert grammar._parse_statement.cache_info().hits > 0
    want = fresh(text, "p.cep")
    assert cached == want
    assert spans(cached) == spans(want) and spans(cached)
    assert parse_text(text, "other.cep")[0].rules[0].span.path == "other.cep"


def test_spans_follow_the_statement_to_its_place() -> None:
    grammar._parse_statement.cache_clear()
    alone = parse_text(HEADER + RULE, "p.cep")[0].rules[0]
    moved = parse_text(HEADER + OTHER + "\n\n  " + RULE, "p.cep")[0].rules[1]
    assert (alone.span.line, alone.span.col) == (2, 6)
    assert (moved.span.line, moved.span.col) == (4, 8)
    # Two lines down; on the statement's first line also two columns right.
    def back(s: Span) -> Span:
        if s.path != "p.cep":  # a node's placeholder span (no place in the text)
            return s
        col = s.col - 2 * (s.line == 4)
        end = None if s.end_col is None else s.end_col - 2 * (s.line == 4)
        return Span(s.path, s.line - 2, col, None if s.end_line is None else s.end_line - 2, end)

    assert [back(s) for s in spans(moved)] == spans(alone)


def test_a_statement_that_fails_fails_every_time() -> None:
    bad = HEADER + "RULE r FROM s PATTERN (a b DEFINE a AS x = 1 EMIT 'm';"
    for _ in range(2):
        with pytest.raises(CompileErrors) as err:
            compile_rules(bad, "p.cep")
        assert "p.cep:2:" in str(err.value)
