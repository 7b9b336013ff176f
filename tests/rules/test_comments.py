"""Comments are blanked out before parsing (cep.grammar.blank_comments): same offsets, and
`--` or `/*` inside quotes stays text."""

from __future__ import annotations

from cep import ast
from cep.compile.parse import parse_text
from cep.grammar import blank_comments, parse_expression

PLAIN = "RULE r FROM s PATTERN (a b) DEFINE a AS x = 'p', b AS y > 1 EMIT 'm';"
COMMENTED = (
    "-- header\nRULE r /* the name */ FROM s\n  PATTERN (a /* first */ b) -- two events\n"
    "  DEFINE a AS x = 'p', /* x\n spans lines */ b AS y > 1\n  EMIT 'm'; -- done\n"
)


def test_blanking_keeps_offsets_and_newlines() -> None:
    text = "a -- c\nb /* d\ne */ c"
    blanked = blank_comments(text)
    assert len(blanked) == len(text)
    assert blanked == "a     \nb     \n     c"


def test_comment_markers_inside_quotes_are_text() -> None:
    text = "x = '-- not a comment' AND `odd /* name` = \"a--b\" -- real"
    assert blank_comments(text) == text[: text.index("-- real")] + " " * len("-- real")
    node = parse_expression(text)
    assert isinstance(node, ast.Binary)
    assert node.left == ast.Binary("=", ast.Name(("x",)), ast.Literal("-- not a comment"))
    assert node.right == ast.Binary("=", ast.Name(("odd /* name",)), ast.Literal("a--b"))


def test_commented_rule_parses_like_the_plain_one_with_its_own_spans() -> None:
    plain, errors = parse_text(PLAIN, "p.cep")
    commented, errors2 = parse_text(COMMENTED, "c.cep")
    assert not errors and not errors2
    rule, plain_rule = commented.rules[0], plain.rules[0]
    assert [c.name for c in rule.clauses] == [c.name for c in plain_rule.clauses]
    assert [c.value for c in rule.clauses][1:] == [c.value for c in plain_rule.clauses][1:]
    assert (rule.span.line, rule.span.col) == (2, 6)
    define = next(c for c in rule.clauses if c.name == "DEFINE")
    b = define.value[1]
    assert (b.span.line, b.span.col) == (5, 17)


def test_error_after_a_comment_points_at_the_token() -> None:
    text = "RULE r FROM s PATTERN (a) DEFINE a AS x = 1 /* c */ -- d\n  y EMIT 'm';"
    _, errors = parse_text(text, "e.cep")
    assert len(errors) == 1
    assert errors[0].message == "expected ';', found 'y'"
    assert (errors[0].span.line, errors[0].span.col) == (2, 3)


def test_lexer_reads_quotes_with_the_grammars_own_patterns() -> None:
    # If a quoted element of the grammar changes, the comment lexer must change with it.
    from cep import grammar

    quoted = (*grammar.STRING.exprs, grammar._quoted_ident)
    assert all(q.re.pattern in grammar._LEXEMES.pattern for q in quoted)  # type: ignore[attr-defined]
