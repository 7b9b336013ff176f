"""Differential test for rule sets whose rules share conditions: the native engine evaluates each
distinct local condition once per event for all the rules of a group (`Core::cids`,
docs/native-core.md "Many rules") and puts a group's rules on one field table, so rules that are
copies of each other (the same conditions, renamed) or differ only in constants must still give
exactly the Python engine's results.

Random rule sets of 1-2 rules (tests/core/test_native_engine_differential.py's strategy), each
copied 2-4 times under new ids, some copies with their integer constants shifted by one (so some
conditions are shared and some are not), and in some sets with the copies' variables listed in
another order of fields; random streams as in that test, through both engines at batch sizes
1, 3, 7 and all (Event objects, and Arrow batches where the stream allows), ending with the end of
input: results, late reports, counters, next wake and the keys holding state after every call.
"""

from __future__ import annotations

import os
import re

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cep.runtime.bind import build_embedded_engine, engine_kind
from tests.core.test_native_engine_differential import (
    arrow_table,
    both_engines,
    compile_valid,
    make_events,
    ruleset_text,
    same_results,
    streams,
)
from tests.hyp import profile

EXAMPLES = int(os.environ.get("CEP_SHARED_DIFF_EXAMPLES")
               or {"dev": 5, "ci": 40, "deep": 400}[profile()])
STREAMS_PER_RULESET = 8
BATCHES = (1, 3, 7, 10_000)


def _copy(rule: str, base: int, n: int, shift: int) -> str:
    out = re.sub(rf"^RULE r{base}\b", f"RULE r{base}_{n}", rule, count=1)
    if shift:
        out = re.sub(r"(?<![\w.])(\d+)(?![\w.])", lambda m: str(int(m.group(1)) + shift), out)
    return out


def _copies(draw: st.DrawFn, rule: str, i: int) -> list[str]:
    """1-3 copies of rule `r{i}` under new names, some with every constant shifted by one."""
    return [_copy(rule, i, n, draw(st.sampled_from((0, 0, 1))))
            for n in range(draw(st.integers(1, 3)))]


def shared_ruleset_text() -> st.SearchStrategy[tuple[str, list[str]]]:
    return ruleset_text(max_rules=2, copies=_copies)


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(text=shared_ruleset_text(),
       cases=st.lists(streams, min_size=STREAMS_PER_RULESET, max_size=STREAMS_PER_RULESET))
def test_rules_sharing_conditions_equal_python_engine(text: tuple[str, list[str]],
                                                      cases: list) -> None:
    ruleset = compile_valid(*text)
    assume(ruleset is not None and len(ruleset.rules) >= 2)
    python, native, lateness = both_engines(ruleset, text)
    for raw, seed, extra_late, seq_kind, roundtrip in cases:
        events = make_events(raw, seed, extra_late, seq_kind, lateness)
        table = arrow_table(events)
        for batch in BATCHES:
            same_results(python, native, events, table, batch, roundtrip, text)
            if batch >= len(events):
                break


def test_copies_share_condition_ids() -> None:
    """Copies of a rule get the same condition ids; a shifted constant gets its own."""
    from cep.compile import compile_rules

    text = ("STREAM s TIME BY ts LATENESS 0ms;\n"
            "RULE a FROM s PARTITION BY k PATTERN (x y) DEFINE x AS v > 1, y AS w = 'q' "
            "EMIT 'a';\n"
            "RULE b FROM s PARTITION BY k PATTERN (x y) DEFINE x AS v > 1, y AS w = 'q' "
            "EMIT 'b';\n"
            "RULE c FROM s PARTITION BY k PATTERN (y x) DEFINE x AS v > 2, y AS w = 'q' "
            "EMIT 'c';\n")
    native = build_embedded_engine(compile_rules(text, "p.cep"), use_native=True)
    assert engine_kind(native) == "native"
    cids = [set(c) - {None} for c in native.core.condition_ids()]
    assert cids[0] == cids[1] and len(cids[0]) == 2
    assert len(cids[2] & cids[0]) == 1 and len(cids[0] | cids[2]) == 3
