"""Term-level primitives shared by the matchers and the presearcher.

- user regexes compile on google-re2 (linear time; no look-around/back-references), anchored to
  the whole term as Lucene does;
- wildcard patterns translate to RE2;
- fuzzy terms use the optimal-string-alignment distance (Damerau-Levenshtein where an adjacent
  transposition counts as one edit; Lucene's default `transpositions=true`), and the index keys a
  fuzzy term by its deletion variants (SymSpell): two strings within k OSA edits always share a
  string reachable from each by at most k deletions (a substitution or a transposition is one
  deletion on each side, an insertion one deletion on the other side).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any

import re2
from rapidfuzz import fuzz
from rapidfuzz.distance import OSA

from percolator import wildcards

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False
# A user pattern may not build a program larger than this (bytes); RE2 rejects bigger ones.
_OPTIONS.max_mem = 8 << 20


def compile_regex(pattern: str) -> Any:
    """A compiled RE2 pattern; raises ValueError with RE2's message if it is not valid."""
    try:
        return re2.compile(pattern, options=_OPTIONS)
    except re2.error as exc:
        msg = exc.args[0] if exc.args else str(exc)
        if isinstance(msg, bytes):
            msg = msg.decode("utf-8", "replace")
        raise ValueError(str(msg)) from None


def regex_matcher(pattern: str) -> Callable[[str], bool]:
    rx = compile_regex(pattern)

    def match(term: str) -> bool:
        return rx.fullmatch(term) is not None

    return match


def wildcard_to_regex(pattern: str) -> str:
    """Our canonical wildcard pattern (see `ast.Wildcard`) as an RE2 pattern (whole term)."""
    return wildcards.to_regex(pattern, re2.escape)


def wildcard_literal_prefix(pattern: str) -> str:
    """The literal text before the first wildcard of a canonical wildcard pattern."""
    return wildcards.literal_prefix(pattern)


def map_wildcard_literals(pattern: str, fn: Callable[[str], str]) -> str:
    """Apply `fn` (e.g. normalisation) to the literal runs of a wildcard pattern."""
    return wildcards.map_literals(pattern, fn)


def within_distance(a: str, b: str, k: int) -> bool:
    """OSA (restricted Damerau-Levenshtein) distance of a and b is at most k."""
    if abs(len(a) - len(b)) > k:
        return False
    return bool(OSA.distance(a, b, score_cutoff=k) <= k)


@lru_cache(maxsize=65_536)
def deletion_variants(term: str, k: int) -> frozenset[str]:
    """Every string obtained from `term` by deleting at most `k` characters (term included)."""
    out = {term}
    frontier = out
    for _ in range(min(k, len(term))):  # one more deletion from each string of the last round
        frontier = {t[:i] + t[i + 1:] for t in frontier for i in range(len(t))}
        out |= frontier
    return frozenset(out)


SCORERS: dict[str, Callable[..., float]] = {
    "wratio": fuzz.WRatio,
    "ratio": fuzz.ratio,
    "qratio": fuzz.QRatio,
    "partial": fuzz.partial_ratio,
    "token_sort": fuzz.token_sort_ratio,
    "token_set": fuzz.token_set_ratio,
}


def similarity(scorer: str, query: str, values: Iterable[str], threshold: float) -> float:
    """Best score of `query` against `values` (0 when none reaches `threshold`)."""
    fn = SCORERS[scorer]
    best = 0.0
    for v in values:
        s = float(fn(query, v, score_cutoff=threshold))
        if s > best:
            best = s
    return best
