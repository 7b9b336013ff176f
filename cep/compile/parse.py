"""Text → `cep.ast.RuleFile`, collecting syntax errors statement by statement.

The file is split into statements at `;` (outside strings and comments) before parsing, so a
mistake in one rule does not hide the mistakes in the next ones (the linter reports them all).
Limits keep hostile or accidental input cheap: the text size, the nesting depth of parentheses,
and the length of a statement; each gives a `RuleSyntaxError`, never another exception.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

import pyparsing as pp

from cep import ast, grammar
from cep.errors import RuleSyntaxError, SourceError, Span

MAX_TEXT_BYTES = 1_000_000
MAX_NESTING = 32
MAX_STATEMENT_CHARS = 200_000

CLAUSE_WORDS = (
    "RULE",
    "STREAM",
    "VERSION",
    "DESCRIPTION",
    "TAGS",
    "SEVERITY",
    "ENABLED",
    "DISABLED",
    "FROM",
    "PARTITION",
    "PATTERN",
    "DEFINE",
    "WITHIN",
    "STEP",
    "MEASURES",
    "AFTER",
    "ALL",
    "EMIT",
    "ON",
    "ALLOW",
    "MAX",
    "TIME",
    "LATENESS",
    "TABLE",
    "KEY",
)


@dataclass(frozen=True, slots=True)
class Chunk:
    start: int
    text: str


def split_statements(text: str, path: str) -> tuple[list[Chunk], list[SourceError]]:
    """Cut `text` at top-level `;`; also enforce the nesting limit. Comments stay in chunks."""
    chunks: list[Chunk] = []
    errors: list[SourceError] = []
    i, n, start, depth = 0, len(text), 0, 0
    too_deep_reported = False
    while i < n:
        ch = text[i]
        if ch in "'\"`":
            end = i + 1
            while end < n:
                if text[end] == ch:
                    if end + 1 < n and text[end + 1] == ch:  # doubled quote escapes itself
                        end += 2
                        continue
                    break
                if text[end] == "\n" and ch != "`":
                    break
                end += 1
            i = end + 1
            continue
        if text.startswith("--", i):
            nl = text.find("\n", i)
            i = n if nl < 0 else nl
            continue
        if text.startswith("/*", i):
            close = text.find("*/", i + 2)
            i = n if close < 0 else close + 2
            continue
        if ch == "(":
            depth += 1
            if depth > MAX_NESTING and not too_deep_reported:
                too_deep_reported = True
                errors.append(
                    RuleSyntaxError(
                        f"parentheses nested more than {MAX_NESTING} deep",
                        Span.from_offset(text, i, path),
                        source=text,
                        hint="split the condition into simpler parts",
                    )
                )
        elif ch == ")":
            depth = max(0, depth - 1)
        elif ch == ";":
            chunks.append(Chunk(start, text[start : i + 1]))
            start, depth, too_deep_reported = i + 1, 0, False
        i += 1
    rest = text[start:]
    if _has_code(rest):
        chunks.append(Chunk(start, rest))
    return chunks, errors


_COMMENTS = re.compile(r"--[^\n]*|/\*.*?(\*/|$)", re.S)


def _has_code(text: str) -> bool:
    return bool(_COMMENTS.sub("", text).strip())


def parse_text(text: str, path: str) -> tuple[ast.RuleFile, list[SourceError]]:
    """Parse a whole rules file; returns the statements that parsed and every syntax error."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES:
        err = RuleSyntaxError(
            f"rules file is larger than {MAX_TEXT_BYTES // 1_000_000} MB",
            Span(path, 1, 1),
            source=text,
            hint="split it into several files",
        )
        return ast.RuleFile(path, (), ()), [err]
    chunks, errors = split_statements(text, path)
    if errors:
        return ast.RuleFile(path, (), ()), errors
    starts = grammar.line_starts(text)
    streams: list[ast.StreamDecl] = []
    rules: list[ast.RuleDecl] = []
    tables: list[ast.TableDecl] = []
    for chunk in chunks:
        if not _has_code(chunk.text):
            continue
        if len(chunk.text) > MAX_STATEMENT_CHARS:
            errors.append(
                RuleSyntaxError(
                    f"statement longer than {MAX_STATEMENT_CHARS} characters",
                    _span(text, chunk.start + _lead(chunk.text), path),
                    source=text,
                )
            )
            continue
        try:
            node = grammar.parse_statement(chunk.text, path=path, base=chunk.start, starts=starts)
        except pp.ParseBaseException as exc:
            errors.append(_syntax_error(exc, chunk, text, path))
            continue
        except RecursionError:
            errors.append(
                RuleSyntaxError(
                    "statement is nested too deeply to parse",
                    _span(text, chunk.start + _lead(chunk.text), path),
                    source=text,
                )
            )
            continue
        if isinstance(node, ast.StreamDecl):
            streams.append(node)
        elif isinstance(node, ast.TableDecl):
            tables.append(node)
        else:
            rules.append(node)
    return ast.RuleFile(path, tuple(streams), tuple(rules), tables=tuple(tables)), errors


def _lead(chunk: str) -> int:
    """Offset of the first character of code in a chunk (after blanks and comments)."""
    i = 0
    while i < len(chunk):
        if chunk[i].isspace():
            i += 1
        elif chunk.startswith("--", i):
            nl = chunk.find("\n", i)
            i = len(chunk) if nl < 0 else nl
        elif chunk.startswith("/*", i):
            close = chunk.find("*/", i + 2)
            i = len(chunk) if close < 0 else close + 2
        else:
            break
    return min(i, max(0, len(chunk) - 1))


def _span(text: str, offset: int, path: str, length: int = 0) -> Span:
    s = Span.from_offset(text, offset, path)
    if length > 0:
        return Span(path, s.line, s.col, s.line, s.col + length)
    return s


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|->>|->|\S")


def _word_at(text: str, loc: int) -> str:
    """The whole (possibly non-ASCII) word around `loc`, for a hint."""
    start, end = loc, loc
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
        start -= 1
    while end < len(text) and (text[end].isalnum() or text[end] == "_"):
        end += 1
    return text[start:end] or text[loc:loc + 1]


def _syntax_error(exc: pp.ParseBaseException, chunk: Chunk, text: str, path: str) -> SourceError:
    loc = min(max(exc.loc, 0), len(chunk.text))
    # pyparsing reports the position before skipping blanks; point at the offending token.
    while loc < len(chunk.text) and chunk.text[loc].isspace():
        loc += 1
    m = _WORD.match(chunk.text, loc)
    found = m.group(0) if m else ""
    expected = exc.msg
    if expected.startswith("Expected "):
        expected = expected[len("Expected ") :]
    if not found:
        message = f"expected {expected}, found end of text"
        if not chunk.text.rstrip().endswith(";"):
            message = "statement is not finished (missing ';'?)"
    else:
        message = f"expected {expected}, found {found!r}"
    hint = None
    word = found.upper()
    if found and not found.isascii():
        hint = (f"names are ASCII letters, digits and '_'; quote any other name in backticks, "
                f"e.g. `{_word_at(chunk.text, loc)}`")
    elif word in ("RULE", "STREAM") and "';'" in expected:
        hint = "the statement before it is missing its ';'"
    elif "')'" in expected and word in CLAUSE_WORDS:
        hint = f"a '(' is not closed before {word}"
    elif found and found[0].isalpha():
        close = difflib.get_close_matches(word, CLAUSE_WORDS, n=1, cutoff=0.75)
        if close and close[0] != word:
            hint = f"did you mean {close[0]}?"
        elif word in grammar.RESERVED:
            hint = f"{word} is a reserved word; quote a field of that name as `{found}`"
    if hint is None and found == ";":
        hint = "a clause is incomplete before the ';'"
    return RuleSyntaxError(
        message, _span(text, chunk.start + loc, path, len(found)), source=text, hint=hint
    )
