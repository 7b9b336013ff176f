"""Hypothesis strategies for random rules, shared by the property tests: the matcher against the
reference (tests/rules/test_matcher_property.py), the engine against the reference
(tests/runtime/test_engine_property.py) and the native core against the Python matcher
(tests/core/test_native_differential.py). Each test brings its own DEFINE conditions (what its
stream carries and what it means to exercise); the patterns and clauses are built here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hypothesis import strategies as st

VARS = ("a", "b", "c")
QUANTS = ("", "", "", "?", "*", "+", "{2}", "{1,}", "{,2}", "{1,2}", "{0,2}", "{2,3}")
CONNS = ("", "", "-> ", "->> ")
SKIPS = ("PAST LAST ROW", "TO NEXT ROW", "TO FIRST {v}", "TO LAST {v}", "ALL MATCHES")


@st.composite
def element(draw: st.DrawFn, depth: int) -> str:
    if depth <= 0 or draw(st.integers(0, 3)) > 0:
        text = draw(st.sampled_from(VARS))
    else:
        lead = draw(st.sampled_from(("", "", "", "-> ", "->> ")))
        text = f"({lead}{draw(alternation(depth - 1))})"
    q = draw(st.sampled_from(QUANTS))
    if q and draw(st.integers(0, 2)) == 0:
        q += "?"
    return text + q


@st.composite
def sequence(draw: st.DrawFn, depth: int) -> str:
    items = [draw(element(depth))]
    for _ in range(draw(st.integers(0, 2))):
        items.append(draw(st.sampled_from(CONNS)) + draw(element(depth)))
    return " ".join(items)


@st.composite
def alternation(draw: st.DrawFn, depth: int) -> str:
    return " | ".join(draw(sequence(depth)) for _ in range(draw(st.integers(1, 2))))


@st.composite
def top_pattern(draw: st.DrawFn) -> str:
    """Nested alternations and quantifiers, or a top-level sequence with negations:
    A [NOT x | -> NOT x] [-> B] ..."""
    if draw(st.integers(0, 2)) > 0:
        return draw(alternation(2))
    items = [draw(element(1))]
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            items.append(draw(st.sampled_from(("", "-> "))) + "NOT " + draw(st.sampled_from("xy")))
        else:
            q = draw(st.sampled_from(("", "", "+", "{2}", "{1,2}")))
            items.append(draw(st.sampled_from(CONNS)) + draw(st.sampled_from(VARS)) + q)
    return " ".join(items)


def used_vars(pattern: str) -> list[str]:
    words = pattern.replace("(", " ").replace(")", " ").replace("|", " ").split()
    return [v for v in (*VARS, "x", "y") if any(w.rstrip("?*+{},0123456789") == v
                                                for w in words)]


@st.composite
def rule_statement(draw: st.DrawFn, defines: Mapping[str, Sequence[str | None]], *,
                   rule_id: str = "r", emit: str = "m", partition: bool = False,
                   timeouts: bool = False, measures: Sequence[str] = (),
                   max_partial: bool = False) -> str:
    """One `RULE ... ;` over stream `s`: a random pattern, conditions drawn from `defines`
    (None: no condition), WITHIN / STEP WITHIN or ALLOW UNBOUNDED, a skip strategy, and, when
    asked, PARTITION BY k, MEASURES, MAX PARTIAL MATCHES and ON TIMEOUT (each drawn)."""
    pattern = draw(top_pattern())
    conds = [f"{v} AS {c}" for v in used_vars(pattern)
             if (c := draw(st.sampled_from(defines[v]))) is not None]
    within = draw(st.sampled_from((None, 3, 6)))
    step = draw(st.sampled_from((None, None, 2)))
    skip = draw(st.sampled_from(SKIPS)).format(v=draw(st.sampled_from(VARS)))
    parts = [f"RULE {rule_id} FROM s"]
    if partition and draw(st.booleans()):
        parts.append("PARTITION BY k")
    parts.append(f"PATTERN ({pattern})")
    if conds:
        parts.append("DEFINE " + ", ".join(conds))
    if within:
        parts.append(f"WITHIN {within}ms")
    if step:
        parts.append(f"STEP WITHIN {step}ms")
    if within is None and step is None:
        parts.append("ALLOW UNBOUNDED")
    chosen = draw(st.lists(st.sampled_from(measures), max_size=3, unique=True)) if measures else []
    if chosen:
        parts.append("MEASURES " + ", ".join(chosen))
    if max_partial and draw(st.integers(0, 4)) == 0:
        parts.append(f"MAX PARTIAL MATCHES {draw(st.integers(1, 4))}")
    parts.append("ALL MATCHES" if skip == "ALL MATCHES" else f"AFTER MATCH SKIP {skip}")
    parts.append(f"EMIT '{emit}'")
    if timeouts and (within or step) and draw(st.booleans()):
        parts.append("ON TIMEOUT EMIT 'to'")
    return " ".join(parts) + ";"
