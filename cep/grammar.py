"""The rule-file grammar (pyparsing). Declares elements and builds `cep.ast` nodes; nothing else.

The BNF lives in docs/rule-language.md beside this module. Conventions (pyparsing's
best_practices): `CaselessKeyword` for words, `set_name` on each major element, results names
where a parse action reads them, `parse_all=True` (no packrat: see below; comments are
blanked out before parsing, see `blank_comments`). Parse actions only construct
AST nodes; every check is a pass in `cep.compile`.

`parse_statement` parses one `STREAM ...;` or `RULE ...;` statement; `cep.compile.parse` splits a
file into statements so that one syntax error does not hide the errors in later statements.
"""

from __future__ import annotations

import bisect
import contextvars
import functools
import re
from dataclasses import dataclass
from typing import Any

import pyparsing as pp

from cep import ast
from cep.errors import Span

# No packrat cache: this grammar does not re-parse the same text through different alternatives
# (calls are told from fields by a lookahead, IN's literal-only list fails at its first
# non-literal), so packrat's memo was pure overhead: 3x the CPU of parsing without it on rules/,
# and deep nesting parses with fewer stack frames. Measured in the commit that removed it.

# Words that cannot be identifiers (quote a field of that name: `from`). Expression operators,
# plus the clause keywords that most often follow an unfinished clause.
RESERVED = frozenset(
    "AND OR NOT IN IS NULL TRUE FALSE BETWEEN CONTAINS STARTS ENDS MATCHES AS "
    "RULE STREAM FROM PARTITION PATTERN DEFINE MEASURES WITHIN EMIT AFTER".split()
)
DURATION_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


@dataclass(frozen=True, slots=True)
class _Where:
    path: str
    base: int  # offset of the parsed statement inside the whole file
    line_starts: tuple[int, ...]  # the file's line starts from `line0`'s on (all of them: 0)
    line0: int = 0  # the number of line starts before line_starts[0]


_WHERE: contextvars.ContextVar[_Where] = contextvars.ContextVar("cep_grammar_where")


def line_starts(text: str) -> tuple[int, ...]:
    starts = [0]
    starts.extend(i + 1 for i, ch in enumerate(text) if ch == "\n")
    return tuple(starts)


def span_at(loc: int, length: int = 0) -> Span:
    """The span of `loc` (an offset in the statement being parsed)."""
    where = _WHERE.get()
    offset = where.base + loc
    i = bisect.bisect_right(where.line_starts, offset)
    line = where.line0 + i
    col = offset - where.line_starts[i - 1] + 1
    if length > 0:
        return Span(where.path, line, col, line, col + length)
    return Span(where.path, line, col)


def K(words: str) -> pp.ParserElement:
    """A (possibly multi-word) caseless keyword, e.g. K("PARTITION BY")."""
    parts = [pp.CaselessKeyword(w) for w in words.split()]
    element = parts[0] if len(parts) == 1 else pp.And(parts)
    return element.set_name(words)


def _build(factory: Any) -> Any:
    def action(s: str, loc: int, toks: pp.ParseResults) -> Any:
        return factory(s, loc, toks)

    return action


# ------------------------------------------------------------------------------------ lexemes

LPAR, RPAR, COMMA, SEMI = (pp.Suppress(c) for c in "(),;")
DOT = pp.Suppress(".")
COLON = pp.Suppress(":")

_plain_ident = pp.Regex(r"[A-Za-z_][A-Za-z0-9_]*")
_plain_ident.add_condition(lambda t: t[0].upper() not in RESERVED)
_quoted_ident = pp.QuotedString("`", esc_quote="``")
IDENT = (_plain_ident | _quoted_ident).set_name("identifier")
NAME = pp.Located(IDENT).set_name("name")  # [start, [value], end]

INTEGER = pp.Regex(r"\d+").set_name("integer").set_parse_action(lambda t: int(t[0]))
NUMBER = pp.Regex(r"(\d+\.\d*|\.\d+)([eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+").set_name("number")
STRING = (
    pp.QuotedString("'", esc_quote="''", multiline=False)
    | pp.QuotedString('"', esc_quote='""', multiline=False)
).set_name("string")
DURATION = pp.Regex(r"(\d+)\s*(ms|s|m|h|d)\b").set_name("duration (e.g. 500ms, 5s, 2m, 1h, 1d)")


def _name_value(located: pp.ParseResults) -> tuple[str, int, int]:
    return str(located[1][0]), int(located[0]), int(located[2])


@DURATION.set_parse_action
def _duration(s: str, loc: int, toks: pp.ParseResults) -> ast.Duration:
    text = toks[0]
    amount, unit = pp.Regex(r"(\d+)\s*(ms|s|m|h|d)").re.match(text).groups()  # type: ignore[union-attr]
    return ast.Duration(
        int(amount) * DURATION_UNITS[unit], text.replace(" ", ""), span_at(loc, len(text))
    )


# -------------------------------------------------------------------------------- expressions

expr = pp.Forward()
expr.set_name("expression")


def _literal(s: str, loc: int, toks: pp.ParseResults) -> ast.Literal:
    value = toks[0]
    if isinstance(value, str) and toks.get_name() == "number":
        value = float(value) if any(c in value for c in ".eE") else int(value)
    return ast.Literal(value, span_at(loc))


number_lit = (
    NUMBER("number")
    .copy()
    .set_parse_action(
        lambda s, loc, t: ast.Literal(
            float(t[0]) if any(c in t[0] for c in ".eE") else int(t[0]), span_at(loc, len(t[0]))
        )
    )
)
string_lit = STRING.copy().add_parse_action(lambda s, loc, t: ast.Literal(t[0], span_at(loc)))
const_lit = (K("TRUE") | K("FALSE") | K("NULL")).set_parse_action(
    lambda s, loc, t: ast.Literal(
        {"TRUE": True, "FALSE": False, "NULL": None}[t[0].upper()], span_at(loc, len(t[0]))
    )
)

star = (pp.Optional(IDENT + DOT) + pp.Suppress("*")).set_parse_action(
    lambda s, loc, t: ast.Star(t[0] if t else None, span_at(loc))
)
func_name = pp.Regex(r"[A-Za-z_][A-Za-z0-9_]*(?=\s*\()").set_name("function name")
# `AGG(x) OVER 30d [EXCLUDE CURRENT ROW]`: a sliding window over the key's history.
over = (pp.Suppress(K("OVER")) - DURATION + pp.Optional(K("EXCLUDE CURRENT ROW"))).set_name(
    "OVER duration [EXCLUDE CURRENT ROW]"
).set_parse_action(lambda s, loc, t: ast.Over(t[0], len(t) > 1, span_at(loc, 4)))
call = (func_name("func") + LPAR + pp.Optional(pp.DelimitedList(star | expr))("args") + RPAR
        + pp.Optional(over)("over"))
call.set_name("function call").set_parse_action(
    lambda s, loc, t: ast.Call(
        t.func.upper(), tuple(a for a in t.args), span_at(loc, len(t.func)),
        next((o for o in t if isinstance(o, ast.Over)), None),
    )
)
# `field`, `VAR.field`, then the keys of a nested JSON field: `payload:amount`,
# `b.device:geo:country` (the colon cannot be read as a variable reference).
ref = pp.Located(
    pp.Group(IDENT + pp.Optional(DOT + IDENT)) + pp.Group(pp.ZeroOrMore(COLON + IDENT))
).set_name("field reference")
ref.set_parse_action(
    lambda s, loc, t: ast.Name(tuple(t[1][0]), tuple(t[1][1]), _located_span(s, t))
)
# `table[key].column`: a table lookup (docs/tables.md); `key` is `field` or `VAR.field`.
_key_ref = pp.Located(pp.Group(IDENT + pp.Optional(DOT + IDENT))).set_name("lookup key")
_key_ref.set_parse_action(
    lambda s, loc, t: ast.Name(tuple(str(p) for p in t[1][0]), (), _located_span(s, t))
)
lookup = pp.Located(
    IDENT + pp.Suppress("[") - _key_ref + pp.Suppress("]") + DOT + IDENT
).set_name("table lookup (table[field].column)")
lookup.set_parse_action(
    lambda s, loc, t: ast.Lookup(str(t[1][0]), t[1][1], str(t[1][2]), _located_span(s, t))
)
_lookup_start = pp.FollowedBy(IDENT + pp.Literal("["))
paren = LPAR + expr + RPAR
primary = (number_lit | string_lit | const_lit | call | (_lookup_start + lookup) | ref
           | paren).set_name("operand")

unary = pp.Forward()
unary.set_name("unary")
unary <<= (pp.Literal("-") + unary).set_parse_action(
    lambda s, loc, t: ast.Unary("-", t[1], span_at(loc))
) | primary


def _left_assoc(operand: pp.ParserElement, ops: pp.ParserElement, name: str) -> pp.ParserElement:
    def fold(s: str, loc: int, t: pp.ParseResults) -> ast.Expr:
        node: ast.Expr = t[0]
        for i in range(1, len(t), 2):
            op = str(t[i]).upper()
            node = ast.Binary("!=" if op == "<>" else op, node, t[i + 1], node.span)
        return node

    return (operand + pp.ZeroOrMore(ops + operand)).set_name(name).set_parse_action(fold)


mult = _left_assoc(unary, pp.one_of("* / %"), "term")
additive = _left_assoc(mult, pp.one_of("+ -"), "sum")

comp_op = pp.one_of("= == != <> <= >= < >").set_name("comparison")
NOT_ = pp.Optional(K("NOT"))


def _tag(kind: str) -> Any:
    """Parse action: pack a predicate suffix into one token `(kind, negated, *operands)`."""

    def action(s: str, loc: int, t: pp.ParseResults) -> list[tuple[Any, ...]]:
        toks = list(t)
        neg = bool(toks) and isinstance(toks[0], str) and toks[0].upper() == "NOT" and kind != "cmp"
        if neg:
            toks = toks[1:]
        return [(kind, neg, *toks)]

    return action


suffix = (
    (comp_op + additive).set_parse_action(_tag("cmp"))
    | (pp.Suppress(K("IS")) + NOT_ + pp.Suppress(K("NULL"))).set_parse_action(_tag("isnull"))
    | (
        # A list of plain literals (the common case, often long) is read without going through
        # the whole expression grammar per item; anything else falls back to the general list.
        NOT_ + pp.Suppress(K("IN")) + LPAR
        + (pp.Group(pp.DelimitedList(string_lit | number_lit | const_lit)) + RPAR
           | pp.Group(pp.DelimitedList(expr)) + RPAR)
    ).set_parse_action(_tag("in"))
    | (
        NOT_ + pp.Suppress(K("BETWEEN")) + additive + pp.Suppress(K("AND")) + additive
    ).set_parse_action(_tag("between"))
    | (
        NOT_
        + (K("CONTAINS") | K("STARTS WITH") | K("ENDS WITH") | K("MATCHES")).set_parse_action(
            lambda t: " ".join(w.upper() for w in t)
        )
        + additive
    ).set_parse_action(_tag("str"))
)


def _predicate(s: str, loc: int, t: pp.ParseResults) -> ast.Expr:
    left: ast.Expr = t[0]
    if len(t) == 1:
        return left
    kind, neg, *ops = t[1]
    sp = left.span
    if kind == "cmp":
        op = "=" if ops[0] == "==" else ("!=" if ops[0] == "<>" else ops[0])
        return ast.Binary(op, left, ops[1], sp)
    if kind == "isnull":
        return ast.IsNull(left, neg, sp)
    if kind == "in":
        return ast.InList(left, tuple(ops[0]), neg, sp)
    if kind == "between":
        return ast.Between(left, ops[0], ops[1], neg, sp)
    return ast.StrPredicate(ops[0], left, ops[1], neg, sp)


predicate = (additive + pp.Optional(suffix)).set_name("predicate").set_parse_action(_predicate)
not_expr = pp.Forward()
not_expr.set_name("NOT expression")
not_expr <<= (K("NOT") + not_expr).set_parse_action(
    lambda s, loc, t: ast.Unary("NOT", t[1], span_at(loc, 3))
) | predicate
and_expr = _left_assoc(not_expr, K("AND"), "AND expression")
or_expr = _left_assoc(and_expr, K("OR"), "OR expression")
expr <<= or_expr

# ----------------------------------------------------------------------------------- patterns

alternation = pp.Forward()
alternation.set_name("pattern")
conn = (pp.Literal("->>") | pp.Literal("->")).set_name("connector (-> or ->>)")
QUANT_RE = r"(\?|\*|\+|\{\s*(\d*)\s*(,?)\s*(\d*)\s*\})(\?)?"
quant = pp.Regex(QUANT_RE).set_name("quantifier (?, *, +, {n}, {n,}, {,m}, {n,m})")
quant.add_condition(lambda t: t[0].replace(" ", "") not in ("{}", "{,}", "{}?", "{,}?"))


@quant.add_parse_action
def _quant(s: str, loc: int, t: pp.ParseResults) -> ast.Quantifier:
    m = re.fullmatch(QUANT_RE, t[0])
    assert m is not None
    body, lo, comma, hi, reluctant = m.groups()
    if body in ("?", "*", "+"):
        low, high = {"?": (0, 1), "*": (0, None), "+": (1, None)}[body]
    else:
        low = int(lo) if lo else 0
        high = (int(hi) if hi else None) if comma else low
    return ast.Quantifier(low, high, not reluctant, span_at(loc, len(t[0])))


def _located(s: str, t: pp.ParseResults) -> tuple[int, int]:
    """Start and end of a `Located` match; pyparsing's start is before leading blanks."""
    start, end = int(t[0]), int(t[2])
    while start < end and s[start].isspace():
        start += 1
    return start, end


def _located_span(s: str, t: pp.ParseResults) -> Span:
    start, end = _located(s, t)
    return span_at(start, end - start)


def _name_node(s: str, t: pp.ParseResults) -> tuple[str, Span]:
    start, end = _located(s, t)
    return str(t[1][0]), span_at(start, end - start)


located_name = NAME.copy().set_parse_action(lambda s, loc, t: [_name_node(s, t)])


# PARTITION BY's and TIME BY's field, as (name, span, nested keys): a nested key parses so that
# the compiler can say it is not supported (rather than a syntax error at the ':').
partition_key = pp.Located(IDENT + pp.Group(pp.ZeroOrMore(COLON + IDENT))).set_parse_action(
    lambda s, loc, t: [(str(t[1][0]), _located_span(s, t), tuple(t[1][1]))]
).set_name("field")

pvar = NAME.copy().set_parse_action(lambda s, loc, t: ast.PVar(*_name_node(s, t)))
pnot = (K("NOT") + located_name).set_parse_action(lambda s, loc, t: ast.PNot(t[1][0], t[1][1]))
group = (LPAR + alternation + RPAR).set_name("group")
item = pp.Optional(conn) + (pnot | pvar | group) + pp.Optional(quant)
item.set_name("pattern element")


@item.set_parse_action
def _item(s: str, loc: int, t: pp.ParseResults) -> ast.PItem:
    toks = list(t)
    c = (
        {"->": ast.Conn.RELAXED, "->>": ast.Conn.ANY}.get(toks[0])
        if isinstance(toks[0], str)
        else None
    )
    element = next(x for x in toks if isinstance(x, ast.PVar | ast.PNot | ast.PAlt))
    q = next((x for x in toks if isinstance(x, ast.Quantifier)), None)
    return ast.PItem(c, element, q, span_at(loc))


def _seq(s: str, loc: int, t: pp.ParseResults) -> ast.PSeq:
    items = list(t)
    for i in range(1, len(items)):
        if items[i].conn is None:
            it = items[i]
            items[i] = ast.PItem(ast.Conn.STRICT, it.element, it.quant, it.span)
    return ast.PSeq(tuple(items), span_at(loc))


seq = pp.OneOrMore(item).set_name("sequence").set_parse_action(_seq)
alternation <<= (seq + pp.ZeroOrMore(pp.Suppress("|") + seq)).set_parse_action(
    lambda s, loc, t: ast.PAlt(tuple(t), span_at(loc))
)

# ------------------------------------------------------------------------------------ clauses


def clause(keyword: str, body: pp.ParserElement, build: Any = None) -> pp.ParserElement:
    """`KEYWORD body`; after the keyword a failure is a syntax error, not backtracking."""

    def action(s: str, loc: int, t: pp.ParseResults) -> ast.Clause:
        value = build(t) if build else t[0]
        return ast.Clause(keyword, value, span_at(loc, len(keyword)))

    kw = K(keyword)
    return (pp.Suppress(kw) - body).set_name(keyword + " clause").set_parse_action(action)


define = (
    (located_name + pp.Suppress(K("AS")) - expr)
    .set_name("definition")
    .set_parse_action(lambda s, loc, t: ast.Define(t[0][0], t[1], t[0][1]))
)
measure = (
    (expr + pp.Suppress(K("AS")) - located_name)
    .set_name("measure")
    .set_parse_action(lambda s, loc, t: ast.Measure(t[0], t[1][0], t[1][1]))
)
skip_target = (
    K("PAST LAST ROW") | K("TO NEXT ROW") | ((K("TO FIRST") | K("TO LAST")) + located_name)
).set_name("skip target (PAST LAST ROW, TO NEXT ROW, TO FIRST v, TO LAST v)")


def _skip(t: pp.ParseResults) -> ast.Skip:
    words = [w.upper() for w in t if isinstance(w, str)]
    names = [w for w in t if isinstance(w, tuple)]
    if names:
        return ast.Skip(" ".join(words), names[0][0], names[0][1])
    return ast.Skip(" ".join(words))


destination = (
    ((K("KAFKA") | K("REDIS"))("kind") + STRING("target"))
    .set_parse_action(lambda s, loc, t: ast.Destination(t.kind.upper(), t.target, span_at(loc)))
    .set_name("destination (KAFKA 'topic' or REDIS 'channel')")
)
emit_body = STRING("alert") + pp.Optional(K("TO") - pp.DelimitedList(destination))("dests")


def _emit(t: pp.ParseResults) -> ast.Emit:
    dests = tuple(d for d in t if isinstance(d, ast.Destination))
    return ast.Emit(t[0], dests)


window_spec = (
    (K("TUMBLING") + LPAR - pp.Suppress(K("SIZE")) - DURATION + RPAR)
    | (K("HOPPING") + LPAR - pp.Suppress(K("SIZE")) - DURATION + COMMA
       - pp.Suppress(K("ADVANCE BY")) - DURATION + RPAR)
    | (K("SESSION") + LPAR - DURATION + RPAR)
).set_name("window (TUMBLING (SIZE 5m), HOPPING (SIZE 10m, ADVANCE BY 5m), SESSION (30m))")
window_spec.set_parse_action(
    lambda s, loc, t: ast.Window(str(t[0]).upper(), t[1], t[2] if len(t) > 2 else None,
                                 span_at(loc, len(t[0])))
)

severity = pp.MatchFirst([K(w) for w in ("INFO", "LOW", "MEDIUM", "HIGH", "CRITICAL")])
severity.set_name("severity (INFO, LOW, MEDIUM, HIGH, CRITICAL)")

rule_clause = pp.MatchFirst(
    [
        clause("VERSION", INTEGER),
        clause("DESCRIPTION", STRING),
        clause("TAGS", pp.DelimitedList(STRING), lambda t: tuple(t)),
        clause("SEVERITY", severity, lambda t: t[0].upper()),
        clause("ENABLED", K("TRUE") | K("FALSE"), lambda t: t[0].upper() == "TRUE"),
        clause("DISABLED", pp.Empty(), lambda t: False),
        clause("FROM", located_name),
        clause("PARTITION BY", partition_key),
        clause("PATTERN", LPAR + alternation + RPAR),
        clause("DEFINE", pp.DelimitedList(define), lambda t: tuple(t)),
        clause("STEP WITHIN", DURATION),
        clause("WITHIN", DURATION),
        clause("MEASURES", pp.DelimitedList(measure), lambda t: tuple(t)),
        clause("AFTER MATCH SKIP", skip_target, _skip),
        clause("ALL MATCHES", pp.Empty(), lambda t: ast.Skip("ALL MATCHES")),
        clause("EMIT", emit_body, _emit),
        clause("ON TIMEOUT EMIT", emit_body, _emit),
        clause("ALLOW UNBOUNDED", pp.Empty(), lambda t: True),
        clause("MAX PARTIAL MATCHES", INTEGER),
        clause("WINDOW", window_spec),
        clause("WHERE", expr),
        clause("HAVING", expr),
    ]
).set_name("rule clause")

rule_decl = (
    pp.Suppress(K("RULE"))
    - located_name
    + pp.Optional(STRING)("title")
    + pp.ZeroOrMore(rule_clause)("clauses")
    + SEMI
).set_name("RULE statement")


@rule_decl.set_parse_action
def _rule(s: str, loc: int, t: pp.ParseResults) -> ast.RuleDecl:
    name, sp = t[0]
    title = t[1] if len(t) > 1 and isinstance(t[1], str) else None
    clauses = tuple(c for c in t if isinstance(c, ast.Clause))
    return ast.RuleDecl(name, title, clauses, sp)


field_decl = pp.Forward()
field_decl.set_name("field declaration (name TYPE)")
struct_type = (pp.Suppress(K("STRUCT")) + LPAR - pp.Group(pp.DelimitedList(field_decl)) + RPAR)
struct_type.set_name("STRUCT(name TYPE, ...)")
field_decl <<= (located_name + (struct_type | IDENT)).set_parse_action(
    lambda s, loc, t: ast.FieldDecl(t[0][0], "STRUCT", t[0][1], tuple(t[1]))
    if isinstance(t[1], pp.ParseResults)
    else ast.FieldDecl(t[0][0], str(t[1]).upper(), t[0][1])
)
stream_decl = (
    pp.Suppress(K("STREAM"))
    - located_name
    + pp.Optional(LPAR - pp.DelimitedList(field_decl) + RPAR)("fields")
    + pp.Suppress(K("TIME BY"))
    + partition_key
    + pp.Optional(pp.Suppress(K("LATENESS")) - DURATION)("lateness")
    + SEMI
).set_name("STREAM statement")


@stream_decl.set_parse_action
def _stream(s: str, loc: int, t: pp.ParseResults) -> ast.StreamDecl:
    name, sp = t[0]
    fields = tuple(f for f in t if isinstance(f, ast.FieldDecl))
    names = [x for x in t if isinstance(x, tuple)]
    lateness = next((d for d in t if isinstance(d, ast.Duration)), None)
    time_field, time_span, time_keys = names[1]
    return ast.StreamDecl(name, fields if "fields" in t else None, time_field, lateness, sp,
                          time_keys, time_span)


table_decl = (
    pp.Suppress(K("TABLE"))
    - located_name
    + LPAR - pp.Group(pp.DelimitedList(field_decl)) + RPAR
    + pp.Suppress(K("KEY")) - located_name
    + pp.Optional(pp.Suppress(K("TIME BY")) - located_name)("time")
    + pp.Suppress(K("FROM"))
    - (K("KAFKA") | K("FILE")).set_name("KAFKA 'topic' or FILE 'path'")
    + pp.Located(STRING).set_name("string").set_parse_action(lambda s, loc, t: [_name_node(s, t)])
    + SEMI
).set_name("TABLE statement")


@table_decl.set_parse_action
def _table(s: str, loc: int, t: pp.ParseResults) -> ast.TableDecl:
    name, sp = t[0]
    fields = tuple(t[1])
    key, key_span = t[2]
    time = t[3] if "time" in t else None
    kind, (source, source_span) = str(t[-2]).upper(), t[-1]
    return ast.TableDecl(name, fields, key, time[0] if time else None, kind, str(source), sp,
                         key_span, time[1] if time else sp, source_span)


statement = (stream_decl | rule_decl | table_decl).set_name(
    "statement (STREAM ... ; TABLE ... ; or RULE ... ;)")

# Comments (`-- to end of line`, `/* ... */`) are blanked out before parsing rather than
# declared with `ignore`: pyparsing tries every ignore expression before every element, which
# was two thirds of the elements tried. Blanking keeps every offset (spans, error columns), and
# skips the same text pyparsing's `ignore` skipped: the lexer reads quoted strings and
# identifiers with the grammar's own patterns, so a `--` or `/*` inside quotes stays text.
_LEXEMES = re.compile(
    # STRING's two QuotedStrings and _quoted_ident's, as pyparsing compiles them; then comments.
    r"""'(?:(?:'')|(?:[^'\n\r]))*'|"(?:(?:"")|(?:[^"\n\r]))*"|`(?:(?:``)|(?:[^`\n\r]))*`"""
    r"|(?P<comment>--[^\n]*|/\*(?:[^*]|\*(?!/))*\*/)"
)


def _blank(m: re.Match[str]) -> str:
    text = m.group(0)
    if m.group("comment") is None:
        return text
    return re.sub(r"[^\n]", " ", text)


def blank_comments(text: str) -> str:
    """`text` with each comment replaced by blanks (newlines kept), offsets unchanged."""
    if "--" not in text and "/*" not in text:
        return text
    return _LEXEMES.sub(_blank, text)


def parse_statement(
    text: str, *, path: str, base: int, starts: tuple[int, ...]
) -> ast.StreamDecl | ast.RuleDecl | ast.TableDecl:
    """Parse one statement (a slice of a file starting at offset `base`; `starts`: the file's
    line starts).

    Raises pyparsing exceptions; `cep.compile.parse` turns them into `RuleSyntaxError`s.
    """
    # The tree (immutable) depends on the text, the path and the statement's place: its line
    # and the line starts from there to its end, not on the rest of the file.
    first = bisect.bisect_right(starts, base)
    last = bisect.bisect_right(starts, base + len(text), lo=first)
    return _parse_statement(text, path, base, starts[first - 1 : last], first - 1)


@functools.lru_cache(maxsize=2048)
def _parse_statement(
    text: str, path: str, base: int, starts: tuple[int, ...], line0: int
) -> ast.StreamDecl | ast.RuleDecl | ast.TableDecl:
    """`parse_statement`, cached: files are compiled again unchanged (a rules directory's
    reload, `cep check` then `cep run`, a rule compiled alone and then with its file), and
    pyparsing is most of a compile. A statement that fails raises each time (not cached)."""
    token = _WHERE.set(_Where(path, base, starts, line0))
    try:
        result = statement.parse_string(blank_comments(text), parse_all=True)
    finally:
        _WHERE.reset(token)
    node = result[0]
    assert isinstance(node, ast.StreamDecl | ast.RuleDecl | ast.TableDecl)
    return node


def parse_expression(text: str, path: str = "<expr>") -> ast.Expr:
    """Parse a lone condition expression (tests and tools)."""
    token = _WHERE.set(_Where(path, 0, line_starts(text)))
    try:
        result = expr.parse_string(blank_comments(text), parse_all=True)
    finally:
        _WHERE.reset(token)
    node = result[0]
    return node  # type: ignore[no-any-return]
