"""Collecting errors instead of stopping at the first: every pass reports into a `Diagnostics`."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from cep.errors import CepError, RuleSemanticError, SourceError, Span


class Diagnostics:
    def __init__(self, source: str) -> None:
        self.source = source
        self.errors: list[SourceError] = []

    def error(self, message: str, span: Span | None, hint: str | None = None) -> None:
        self.errors.append(RuleSemanticError(message, span, source=self.source, hint=hint))

    def __bool__(self) -> bool:
        return bool(self.errors)


def did_you_mean(word: str, choices: Iterable[str], what: str = "") -> str | None:
    options = list(choices)
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    if not close:
        close = [c for c in options if c.lower() == word.lower()]
    if close:
        return f"did you mean {close[0]!r}?"
    if what and options:
        names = sorted(options)
        shown = ", ".join(names[:40])
        more = f" and {len(names) - 40} more" if len(names) > 40 else ""
        return f"known {what}: {shown}{more}"
    return None


class CompileErrors(CepError):
    """One or more errors in rule files; `str()` renders all of them."""

    def __init__(self, errors: Iterable[SourceError]) -> None:
        self.errors = tuple(errors)
        super().__init__(self.render())

    def render(self) -> str:
        parts = [e.render() for e in self.errors]
        n = len(self.errors)
        parts.append(f"{n} error{'s' if n != 1 else ''}")
        return "\n".join(parts)

    def __str__(self) -> str:
        return self.render()
