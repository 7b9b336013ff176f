"""One root error class for the project, and source spans that errors point at.

Every error a user can cause (a rule file, a saved-search query, a config value) is a `CepError`.
Syntax and semantic errors carry a `Span` so they can print ``path:line:col``, the source line and
a caret under the offending column, plus a hint on how to fix it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Span:
    """A place in a source text. Lines and columns are 1-based, as editors show them."""

    path: str
    line: int
    col: int
    end_line: int | None = None
    end_col: int | None = None

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}"

    @classmethod
    def parse(cls, where: str) -> Span | None:
        """The span written as ``path:line:col`` (a compiled rule's `source`), or None."""
        parts = where.rsplit(":", 2)
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            return cls(parts[0], int(parts[1]), int(parts[2]))
        return None

    @classmethod
    def from_offset(cls, text: str, offset: int, path: str = "<string>") -> Span:
        """The span of character `offset` in `text` (clamped to the text)."""
        offset = max(0, min(offset, len(text)))
        line = text.count("\n", 0, offset) + 1
        col = offset - (text.rfind("\n", 0, offset) + 1) + 1
        return cls(path, line, col)


class CepError(Exception):
    """Root of every error this project raises on purpose."""


class SourceError(CepError):
    """An error in user-written text (a rule file, a query), pointing at where it is."""

    kind = "error"

    def __init__(
        self, message: str, span: Span | None = None, *, source: str | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.span = span
        self.source = source
        self.hint = hint

    def render(self) -> str:
        """``path:line:col: error: message``, the source line, a caret, and the hint."""
        where = f"{self.span}: " if self.span else ""
        head = f"{where}{self.kind}: {self.message}"
        parts = [head]
        if self.span is not None and self.source is not None:
            lines = self.source.splitlines()
            if 1 <= self.span.line <= len(lines):
                text = lines[self.span.line - 1].expandtabs(1)
                width = 1
                if self.span.end_line == self.span.line and self.span.end_col:
                    width = max(1, self.span.end_col - self.span.col)
                parts.append(f"    {text}")
                parts.append("    " + " " * (self.span.col - 1) + "^" * width)
        if self.hint:
            parts.append(f"  hint: {self.hint}")
        return "\n".join(parts)

    def __str__(self) -> str:
        return self.render()


class RuleSyntaxError(SourceError):
    kind = "syntax error"


class RuleSemanticError(SourceError):
    kind = "error"


class QueryError(SourceError):
    """A saved-search query that does not parse or cannot be compiled."""

    kind = "query error"


class ConfigError(CepError):
    """A configuration value that is missing or invalid."""
