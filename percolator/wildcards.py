"""The one reader of wildcard syntax: `*` and `?` are wildcards unless backslash-escaped.

Every function that looks at a wildcard term (parsing it, writing its canonical form, turning it
into a regex, finding its literal prefix, normalising its literal runs) walks it with
`tokens`, so they cannot disagree about escapes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

WILD = "*?"


def tokens(value: str) -> Iterator[tuple[int, str, bool]]:
    """(offset in `value`, character, is an unescaped wildcard). An escaped character is yielded
    once, unescaped, at the backslash's offset; a trailing lone backslash is a literal."""
    i, n = 0, len(value)
    while i < n:
        c = value[i]
        if c == "\\" and i + 1 < n:
            yield i, value[i + 1], False
            i += 2
            continue
        yield i, c, c in WILD
        i += 1


def escape_literal(c: str) -> str:
    return "\\" + c if c in "*?\\" else c


def canonical(value: str) -> str:
    """Wildcards bare, every literal `*`, `?` and `\\` backslash-escaped."""
    return "".join(c if wild else escape_literal(c) for _, c, wild in tokens(value))


def split(value: str) -> tuple[str, list[int]]:
    """(the literal text without wildcards, offsets of the wildcards in `value`)."""
    literal: list[str] = []
    wild_at: list[int] = []
    for i, c, wild in tokens(value):
        if wild:
            wild_at.append(i)
        else:
            literal.append(c)
    return "".join(literal), wild_at


def literal_prefix(pattern: str) -> str:
    """The literal text before the first wildcard."""
    out: list[str] = []
    for _, c, wild in tokens(pattern):
        if wild:
            break
        out.append(c)
    return "".join(out)


def map_literals(pattern: str, fn: Callable[[str], str]) -> str:
    """Apply `fn` (e.g. normalisation) to each literal run; the result is canonical."""
    out: list[str] = []
    run: list[str] = []
    for _, c, wild in tokens(pattern):
        if wild:
            out.append("".join(escape_literal(ch) for ch in fn("".join(run))) if run else "")
            run.clear()
            out.append(c)
        else:
            run.append(c)
    if run:
        out.append("".join(escape_literal(ch) for ch in fn("".join(run))))
    return "".join(out)


def to_regex(pattern: str, escape: Callable[[str], str]) -> str:
    """An RE2 pattern for the whole term: `*` any run, `?` any one character."""
    return "".join(("(?s:.*)" if c == "*" else "(?s:.)") if wild else escape(c)
                   for _, c, wild in tokens(pattern))
