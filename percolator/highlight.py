"""Highlights: which terms of which fields made a search match, with offsets (issue 17).

Like Lucene Monitor's HighlightingMatcher: for each positive clause that is true for the event,
every hit in every field it searched — the field path, which value of the field (for
multi-valued fields), the character offsets [start, end) into that value as the event holds it,
and the text there. Text hits are tokens (or the token run of a phrase); keyword hits are whole
values; numbers, dates and booleans that satisfy a term or range are whole values too; presence
and similarity clauses name the field without offsets.

Computed only for notifications (after a search has matched), from the query's AST leaves, which
`percolator.engine.CompiledQuery` keeps aligned with its positive plan leaves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from rapidfuzz.distance import OSA

from percolator import ast
from percolator.analysis import (
    _TOKEN_RE,
    AnalysedEvent,
    FieldType,
    normalise,
    segments,
    tokenise,
)
from percolator.terms import compile_regex, map_wildcard_literals, wildcard_to_regex


@dataclass(frozen=True, slots=True)
class Highlight:
    field: str
    value_index: int          # which value of a multi-valued field (0 for a single value)
    start: int | None         # character offsets into the value's string form; None: whole
    end: int | None           # field (presence, similarity) or offsets not mappable
    text: str | None          # the value's text in [start, end)
    clause: str               # the clause's label

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "value_index": self.value_index, "start": self.start,
                "end": self.end, "text": self.text, "clause": self.clause}


def token_spans(value: str) -> list[tuple[str, int | None, int | None]]:
    """Analysed tokens of `value` with offsets into `value` (None when normalisation changed
    the text in a way that cannot be mapped back character by character)."""
    out: list[tuple[str, int | None, int | None]] = []
    for off, piece, picto in segments(value):
        if picto:
            out.append((piece, off, off + len(piece)))
            continue
        for t, a, b in _piece_spans(piece):
            out.append((t, None if a is None else a + off, None if b is None else b + off))
    return out


def _piece_spans(value: str) -> list[tuple[str, int | None, int | None]]:
    norm = normalise(value)
    if norm == value or (len(norm) == len(value) and norm == value.lower()):
        return [(m.group(), m.start(), m.end()) for m in _TOKEN_RE.finditer(norm)]
    pieces = [normalise(c) for c in value]
    if "".join(pieces) != norm:
        return [(t, None, None) for t in tokenise(value)]
    back: list[int] = []  # normalised index → original index
    for i, p in enumerate(pieces):
        back.extend([i] * len(p))
    back.append(len(value))
    out: list[tuple[str, int | None, int | None]] = []
    for m in _TOKEN_RE.finditer(norm):
        s, e = back[m.start()], back[m.end() - 1] + 1
        out.append((m.group(), s, e))
    return out


@lru_cache(maxsize=4096)
def _regex(pattern: str) -> Any:
    return compile_regex(pattern)


TokenPred = Callable[[str], bool]


def _token_pred(leaf: ast.Leaf, keyword: bool) -> TokenPred | None:
    norm: Callable[[str], str] = (lambda s: s) if keyword else normalise
    if isinstance(leaf, ast.Prefix):
        p = norm(leaf.prefix)
        return lambda t: t.startswith(p)
    if isinstance(leaf, ast.Wildcard):
        rx = _regex(wildcard_to_regex(map_wildcard_literals(leaf.pattern, norm)))
        return lambda t: rx.fullmatch(t) is not None
    if isinstance(leaf, ast.Regexp):
        rx = _regex(leaf.pattern)
        return lambda t: rx.fullmatch(t) is not None
    if isinstance(leaf, ast.Fuzzy):
        term, k = norm(leaf.value), leaf.distance
        return lambda t: OSA.distance(term, t, score_cutoff=k) <= k
    return None


def _strings(ev: AnalysedEvent, path: str) -> Iterator[tuple[str, int, Any]]:
    """(path, value index, value) of the field's values; `*` means every text field."""
    paths = ev.text_fields() if path == "*" else [path]
    for p in paths:
        for i, v in enumerate(ev.values(p)):
            yield p, i, v


def _as_text(v: Any) -> str | None:
    if isinstance(v, str):
        return v
    return None


def hits(leaf: ast.Leaf, fn: Callable[[AnalysedEvent], bool], field: str,
         ev: AnalysedEvent) -> list[Highlight]:
    """The hits of one true leaf (`fn`: its matcher on that field) in one of its fields."""
    label = leaf.label or type(leaf).__name__
    kind = None if field == "*" else ev.schema.type_of(field)
    out: list[Highlight] = []
    if isinstance(leaf, (ast.Exists, ast.Similar, ast.MatchAll, ast.GeoDistance, ast.GeoBox)):
        if ev.present(field) or field == "*":
            return [Highlight(field, 0, None, None, None, label)]
        return []
    if isinstance(leaf, ast.Range) or (isinstance(leaf, (ast.Term, ast.Phrase))
                                       and kind in (FieldType.NUMBER, FieldType.DATE,
                                                    FieldType.BOOLEAN)):
        return _whole_values(fn, field, ev, label)
    keyword = kind is FieldType.KEYWORD
    if isinstance(leaf, (ast.Term, ast.Phrase)):
        text = leaf.value if isinstance(leaf, ast.Term) else leaf.text
        if keyword:
            for p, i, v in _strings(ev, field):
                s = _as_text(v)
                if s == text:
                    out.append(Highlight(p, i, 0, len(s), s, label))
            return out
        toks = tuple(tokenise(text))
        slop = leaf.slop if isinstance(leaf, ast.Phrase) else 0
        for p, i, v in _strings(ev, field):
            s = _as_text(v)
            if s is None:
                continue
            spans = token_spans(s)
            out.extend(_phrase_hits(spans, toks, slop, p, i, s, label))
        if kind is None and isinstance(leaf, ast.Term):
            out.extend(_whole_values(fn, field, ev, label, numbers_only=True))
        return out
    pred = _token_pred(leaf, keyword)
    if pred is None:
        return []
    for p, i, v in _strings(ev, field):
        s = _as_text(v)
        if s is None:
            continue
        if keyword:
            if pred(s):
                out.append(Highlight(p, i, 0, len(s), s, label))
            continue
        for t, a, b in token_spans(s):
            if pred(t):
                out.append(Highlight(p, i, a, b, s[a:b] if a is not None else t, label))
    return out


def _phrase_hits(spans: list[tuple[str, int | None, int | None]], toks: tuple[str, ...],
                 slop: int, path: str, i: int, s: str, label: str) -> Iterator[Highlight]:
    if not toks:
        return
    words = [t for t, _, _ in spans]
    n = len(toks)
    if n == 1 or slop == 0:
        for k in range(len(words) - n + 1):
            if tuple(words[k:k + n]) == toks:
                a, b = spans[k][1], spans[k + n - 1][2]
                yield Highlight(path, i, a, b, s[a:b] if a is not None and b is not None
                                else " ".join(toks), label)
        return
    wanted = set(toks)  # a sloppy phrase: every occurrence of its tokens
    for t, a, b in spans:
        if t in wanted:
            yield Highlight(path, i, a, b, s[a:b] if a is not None else t, label)


def _whole_values(fn: Callable[[AnalysedEvent], bool], field: str, ev: AnalysedEvent,
                  label: str, numbers_only: bool = False) -> list[Highlight]:
    """Values of the field for which the clause alone is true (each value tried as a one-field
    event with the clause's own matcher, so the semantics are the matcher's)."""
    out: list[Highlight] = []
    for p, i, v in _strings(ev, field):
        if numbers_only and (isinstance(v, (str, bool)) or not isinstance(v, (int, float))):
            continue
        one: Any = v
        for part in reversed(p.split(".")):
            one = {part: one}
        if fn(AnalysedEvent(one, ev.schema)):
            s = ("true" if v else "false") if isinstance(v, bool) else str(v)
            out.append(Highlight(p, i, 0, len(s), s, label))
    return out
