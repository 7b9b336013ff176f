"""Matcher closures. Each factory is called once, when a query is registered, and returns a
function of an `AnalysedEvent`; nothing here is re-parsed or re-interpreted per event."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rapidfuzz import process
from rapidfuzz.distance import OSA

from percolator.analysis import AnalysedEvent
from percolator.terms import SCORERS, compile_regex

Matcher = Callable[[AnalysedEvent], bool]


def never(ev: AnalysedEvent) -> bool:
    return False


def always(ev: AnalysedEvent) -> bool:
    return True


class TermIn:
    """`term in the field's terms`: a slotted callable rather than a closure (about 100 bytes
    instead of 270 with its memo wrapper; most leaves of most saved searches are plain terms).
    `term` is (field, term), read by engine._closure and percolator.batch."""

    __slots__ = ("term",)

    def __init__(self, field: str, term: str) -> None:
        self.term = (field, term)

    def __call__(self, ev: AnalysedEvent) -> bool:
        field, term = self.term
        return term in ev.terms(field)


def term_in(field: str, term: str) -> Matcher:
    return TermIn(field, term)


def term_of(fn: Matcher) -> tuple[str, str] | None:
    """(field, term) when `fn` is exactly "term in the field's terms" (term_in, memoised)."""
    t: tuple[str, str] | None = getattr(fn, "term", None)
    return t


def number_eq(field: str, value: float) -> Matcher:
    def match(ev: AnalysedEvent) -> bool:
        return value in ev.numbers(field)
    return match


def bool_eq(field: str, value: bool) -> Matcher:
    def match(ev: AnalysedEvent) -> bool:
        return value in ev.bools(field)
    return match


def any_of(matchers: Sequence[Matcher]) -> Matcher:
    ms = tuple(matchers)
    if not ms:
        return never
    if len(ms) == 1:
        return ms[0]

    def match(ev: AnalysedEvent) -> bool:
        return any(m(ev) for m in ms)
    return match


def all_of(matchers: Sequence[Matcher]) -> Matcher:
    ms = tuple(matchers)
    if len(ms) == 1:
        return ms[0]
    if len(ms) == 2:
        a, b = ms

        def match2(ev: AnalysedEvent) -> bool:
            return a(ev) and b(ev)
        return match2

    def match(ev: AnalysedEvent) -> bool:
        return all(m(ev) for m in ms)
    return match


def negate(m: Matcher) -> Matcher:
    def match(ev: AnalysedEvent) -> bool:
        return not m(ev)
    return match


def memoised(leaf_id: int, m: Matcher) -> Matcher:
    """Share one leaf's result between every query that contains it, for one event."""
    if type(m) is TermIn:
        return m  # a set lookup is cheaper than the memo
    def match(ev: AnalysedEvent) -> bool:
        memo = ev.memo
        r = memo.get(leaf_id)
        if r is None:
            r = memo[leaf_id] = m(ev)
        return r
    if hasattr(m, "term"):
        match.term = m.term  # type: ignore[attr-defined]
    columnar = getattr(m, "columnar", None)
    if columnar is not None:
        match.columnar = columnar  # type: ignore[attr-defined]
    return match


def term_sets(required: dict[str, set[str]], forbidden: dict[str, set[str]],
              rest: Sequence[Matcher]) -> Matcher:
    """A conjunction whose plain-term children are set tests on the field's terms (one C-level
    subset / disjointness test per field instead of a closure call per term)."""
    req = tuple((f, frozenset(ts)) for f, ts in required.items())
    forb = tuple((f, frozenset(ts)) for f, ts in forbidden.items())
    others = tuple(rest)
    if len(req) == 1 and not forb and not others:
        (f, ts), = req

        def match1(ev: AnalysedEvent) -> bool:
            return ts <= ev.terms(f)
        return match1

    def match(ev: AnalysedEvent) -> bool:
        for f, ts in req:
            if not ts <= ev.terms(f):
                return False
        for f, ts in forb:
            if not ts.isdisjoint(ev.terms(f)):
                return False
        return all(r(ev) for r in others)
    return match


def phrase(field: str, tokens: Sequence[str], slop: int) -> Matcher:
    """Tokens at positions whose offsets (position - index in phrase) spread at most `slop`,
    with distinct positions: Lucene's sloppy phrase, where a swap of two terms costs 2."""
    toks = tuple(tokens)
    first = toks[0]

    def match(ev: AnalysedEvent) -> bool:
        terms = ev.terms(field)
        if any(t not in terms for t in toks):
            return False
        for value in ev.token_lists(field):
            if slop == 0:
                n = len(toks)
                for i, t in enumerate(value):
                    if t == first and tuple(value[i:i + n]) == toks:
                        return True
            elif _sloppy(value, toks, slop):
                return True
        return False
    return match


def _sloppy(value: Sequence[str], toks: Sequence[str], slop: int) -> bool:
    positions: list[list[int]] = []
    for t in toks:
        ps = [i for i, v in enumerate(value) if v == t]
        if not ps:
            return False
        positions.append(ps)

    def search(k: int, lo: int, hi: int, used: frozenset[int]) -> bool:
        if k == len(toks):
            return True
        for p in positions[k]:
            if p in used:
                continue
            off = p - k
            nlo, nhi = min(lo, off), max(hi, off)
            if nhi - nlo <= slop and search(k + 1, nlo, nhi, used | {p}):
                return True
        return False

    return any(search(1, p, p, frozenset({p})) for p in positions[0])


def prefix(field: str, text: str) -> Matcher:
    def match(ev: AnalysedEvent) -> bool:
        return any(t.startswith(text) for t in ev.terms(field))
    match.columnar = ("p", field, text)  # type: ignore[attr-defined]  # percolator.batch
    return match


def regex(field: str, pattern: str) -> Matcher:
    rx = compile_regex(pattern)

    def match(ev: AnalysedEvent) -> bool:
        return any(rx.fullmatch(t) is not None for t in ev.terms(field))
    return match


def fuzzy(field: str, term: str, distance: int) -> Matcher:
    def match(ev: AnalysedEvent) -> bool:
        terms = ev.terms(field)
        if term in terms:
            return True
        return process.extractOne(term, terms, scorer=OSA.distance,
                                  score_cutoff=distance) is not None
    return match


def in_range(lo: Any, hi: Any, include_lo: bool, include_hi: bool) -> Callable[[Any], bool]:
    def ok(x: Any) -> bool:
        if lo is not None and (x < lo or (x == lo and not include_lo)):
            return False
        return not (hi is not None and (x > hi or (x == hi and not include_hi)))
    return ok


def range_of(values: Callable[[AnalysedEvent, str], Sequence[Any]], field: str,
             lo: Any, hi: Any, include_lo: bool, include_hi: bool) -> Matcher:
    ok = in_range(lo, hi, include_lo, include_hi)

    def match(ev: AnalysedEvent) -> bool:
        return any(ok(x) for x in values(ev, field))
    # percolator.batch evaluates it over a whole batch by bisection of the batch's values.
    match.columnar = ("r", values, field, lo, hi, include_lo, include_hi)  # type: ignore[attr-defined]
    return match


def exists(field: str) -> Matcher:
    def match(ev: AnalysedEvent) -> bool:
        return ev.present(field)
    return match


def geo_distance(field: str, lat: float, lon: float, meters: float) -> Matcher:
    from percolator.geo import haversine_m

    def match(ev: AnalysedEvent) -> bool:
        return any(haversine_m(lat, lon, a, b) <= meters for a, b in ev.points(field))
    return match


def geo_box(field: str, box: tuple[float, float, float, float]) -> Matcher:
    from percolator.geo import in_box

    def match(ev: AnalysedEvent) -> bool:
        return any(in_box(a, b, box) for a, b in ev.points(field))
    return match


def similar(field: str, text: str, scorer: str, threshold: float) -> Matcher:
    fn = SCORERS[scorer]

    def match(ev: AnalysedEvent) -> bool:
        return any(fn(text, v, score_cutoff=threshold) >= threshold for v in ev.texts(field))
    return match
