"""Semantic checks on a PATTERN: where negation may go, empty and unbounded patterns, bounds.

Rules enforced here (each an error with the pattern element's position):
- `NOT X` only in the pattern's top-level sequence, never first, never quantified, written
  after juxtaposition ("not next") or `->` ("not followed by"), and followed by the end of the
  pattern, another `NOT`, or a single (possibly quantified, at least once) variable;
- a trailing `-> NOT X` needs WITHIN or STEP WITHIN: the deadline is when absence is decided;
- the pattern cannot match zero events; a quantified group that can match nothing cannot repeat
  without bound; `{n,m}` needs n <= m, m >= 1 and m <= MAX_REPEAT;
- state must be bounded: `->`, `->>`, `*`, `+` or `{n,}` need WITHIN or STEP WITHIN unless the
  rule says ALLOW UNBOUNDED.
"""

from __future__ import annotations

from dataclasses import dataclass

from cep import ast
from cep.compile.diagnostics import Diagnostics
from cep.nfa import Conn

MAX_REPEAT = 200


@dataclass(frozen=True, slots=True)
class PatternInfo:
    positive: tuple[str, ...]  # variables that can be part of a match, in first-seen order
    negated: tuple[str, ...]
    first_vars: frozenset[str]  # variables a match can start with
    single: frozenset[str]  # variables that label at most one event of any match
    unbounded: bool  # some construct can keep a partial match alive without limit
    trailing_relaxed_not: bool
    trailing_not: bool


def walk_items(alt: ast.PAlt) -> list[ast.PItem]:
    out: list[ast.PItem] = []
    for branch in alt.branches:
        for item in branch.items:
            out.append(item)
            if isinstance(item.element, ast.PAlt):
                out.extend(walk_items(item.element))
    return out


def nullable(element: ast.PVar | ast.PNot | ast.PAlt, quant: ast.Quantifier | None) -> bool:
    if quant is not None and quant.min == 0:
        return True
    if isinstance(element, ast.PVar):
        return False
    if isinstance(element, ast.PNot):
        return True
    return any(all(nullable(i.element, i.quant) for i in b.items) for b in element.branches)


def first_vars(alt: ast.PAlt) -> set[str]:
    out: set[str] = set()
    for branch in alt.branches:
        for item in branch.items:
            el = item.element
            if isinstance(el, ast.PVar):
                out.add(el.name)
            elif isinstance(el, ast.PAlt):
                out |= first_vars(el)
            if not nullable(el, item.quant):
                break
    return out


def max_count(alt: ast.PAlt, name: str) -> float:
    """How many events a match can label `name` at most (inf when unbounded)."""
    best = 0.0
    for branch in alt.branches:
        total = 0.0
        for item in branch.items:
            el = item.element
            if isinstance(el, ast.PVar):
                n = 1.0 if el.name == name else 0.0
            elif isinstance(el, ast.PAlt):
                n = max_count(el, name)
            else:
                n = 0.0
            if n and item.quant is not None:
                n *= float("inf") if item.quant.max is None else item.quant.max
            total += n
        best = max(best, total)
    return best


def check_pattern(
    pattern: ast.PAlt, *, timed: bool, allow_unbounded: bool, diag: Diagnostics
) -> PatternInfo:
    positive: list[str] = []
    negated: list[str] = []
    unbounded = False
    for item in walk_items(pattern):
        el, q = item.element, item.quant
        if isinstance(el, ast.PVar) and el.name not in positive:
            positive.append(el.name)
        if isinstance(el, ast.PNot) and el.name not in negated:
            negated.append(el.name)
        if item.conn in (Conn.RELAXED, Conn.ANY) and not isinstance(el, ast.PNot):
            unbounded = True
        if q is None:
            continue
        if q.max is None:
            unbounded = True
            if nullable(el, None) and isinstance(el, ast.PAlt):
                diag.error(
                    "a repeated group must match at least one event per repetition",
                    q.span,
                    "make something inside the group mandatory",
                )
        elif q.max < 1 or q.min > q.max:
            diag.error(
                f"quantifier {q} matches nothing", q.span, "use {n,m} with n <= m and m >= 1"
            )
        elif q.max > MAX_REPEAT:
            diag.error(
                f"quantifier bound {q.max} is larger than {MAX_REPEAT}",
                q.span,
                "use {n,} with a WITHIN limit, or an aggregate such as COUNT",
            )
        if q.min > MAX_REPEAT and (q.max is None or q.max < q.min):  # else reported above
            diag.error(f"quantifier bound {q.min} is larger than {MAX_REPEAT}", q.span)

    _check_negations(pattern, diag)
    top = pattern.branches[0].items if len(pattern.branches) == 1 else ()
    trailing = []
    for item in reversed(top):
        if not isinstance(item.element, ast.PNot):
            break
        trailing.append(item)
    trailing_relaxed = any(i.conn is Conn.RELAXED for i in trailing)
    if trailing_relaxed and not timed:
        item = next(i for i in trailing if i.conn is Conn.RELAXED)
        diag.error(
            "a pattern ending in '-> NOT ...' needs WITHIN or STEP WITHIN",
            item.span,
            "absence is decided when the time limit passes, e.g. WITHIN 5m",
        )
    if any(all(nullable(i.element, i.quant) for i in b.items) for b in pattern.branches):
        diag.error(
            "the pattern can match no events at all",
            pattern.span,
            "make at least one element mandatory (no ?, * or {0,m} on everything)",
        )
    if top and top[0].conn is not None and not isinstance(top[0].element, ast.PNot):
        diag.error(
            f"a pattern cannot start with '{top[0].conn.symbol}'",
            top[0].span,
            "a match starts at its first event; remove the connector",
        )
    if unbounded and not timed and not allow_unbounded:
        diag.error(
            "the pattern can keep partial matches forever: it needs a time limit",
            pattern.span,
            "add WITHIN <duration> (e.g. WITHIN 10m) or STEP WITHIN, "
            "or ALLOW UNBOUNDED if the state growth is acceptable",
        )
    return PatternInfo(
        tuple(positive),
        tuple(negated),
        frozenset(first_vars(pattern)),
        frozenset(v for v in positive if max_count(pattern, v) <= 1),
        unbounded,
        trailing_relaxed,
        bool(trailing),
    )


def _check_negations(pattern: ast.PAlt, diag: Diagnostics) -> None:
    top_level = len(pattern.branches) == 1
    top_items = pattern.branches[0].items if top_level else ()
    for item in walk_items(pattern):
        if isinstance(item.element, ast.PNot) and item not in top_items:
            diag.error(
                "NOT is only allowed in the pattern's top-level sequence",
                item.span,
                "not inside ( ), and not in a pattern with top-level '|'",
            )
    for pos, item in enumerate(top_items):
        if not isinstance(item.element, ast.PNot):
            continue
        if pos == 0:
            diag.error(
                "a pattern cannot start with NOT",
                item.span,
                "negation says what must not happen after an earlier event",
            )
            continue
        if item.quant is not None:
            diag.error("NOT cannot be quantified", item.quant.span)
        if item.conn is Conn.ANY:
            diag.error(
                "'->> NOT' has no meaning",
                item.span,
                "use 'NOT X' (not next) or '-> NOT X' (not followed by)",
            )
        rest = top_items[pos + 1 :]
        following = next((i for i in rest if not isinstance(i.element, ast.PNot)), None)
        if following is None:
            continue
        q = following.quant
        if not isinstance(following.element, ast.PVar) or (q is not None and q.min == 0):
            diag.error(
                "the element after NOT must be a single variable that has to occur",
                following.span,
                "e.g. 'A -> NOT X -> B' or 'A -> NOT X -> B+'",
            )
