"""The whole engine against the brute-force reference: random rules (contiguity, quantifiers,
alternation, PREV/FIRST/aggregates, every skip strategy, with and without WITHIN, STEP WITHIN,
PARTITION BY, absence, ON TIMEOUT), random multi-key streams that arrive out of order within the
allowed lateness, through `run_embedded` at batch sizes 1, 2, 3, 7 and all.

The reference (tests/rules/reference.py) reads the pattern's syntax tree and enumerates
candidates per key over the key's events in (ts, seq) order, with the input ending at the last
event time of the whole stream (docs/semantics.md, "End of input"). Every batch size must give
exactly its matches and timeouts, no event may be late, and no state may be left at the end.

A timeout is compared by rule, key and start row; its length (how far the partial match got) may
be shorter than the reference's longest: the engine keeps one partial match per automaton state
(the preferred one) and reports the longest of those, so a longer but less preferred partial
match in the same state is not seen (docs/semantics.md). The test checks it is never longer.

Examples: 300 by default (`make test`), HYPOTHESIS_PROFILE=dev 50, HYPOTHESIS_PROFILE=deep 3,000
(tests/hyp.py).
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from cep import ast
from cep.compile import compile_file, parse_file
from cep.nfa import RuleSet
from cep.runtime.bind import build_engine
from cep.runtime.engine import Event, MemoryKeyStore, run_embedded
from cep.runtime.matcher import Dropped, Match, Timeout
from tests.hyp import examples
from tests.rules.reference import Reference
from tests.rules.strategies import rule_statement
from tests.rules.test_matcher_property import DEFINES

EXAMPLES = examples(300)  # dev 50, deep 3,000 (tests/hyp.py)
KEYS = ("k1", "k1", "k2")
BATCHES = (1, 2, 3, 7, 10_000)


@st.composite
def case(draw: st.DrawFn) -> tuple[str, int, list[Event]]:
    lateness = draw(st.sampled_from((0, 2, 5)))
    rules = [draw(rule_statement(DEFINES, rule_id=f"r{i}", emit=f"r{i}", partition=True,
                                 timeouts=True)) for i in range(draw(st.integers(1, 2)))]
    text = (f"STREAM s (ts INT, k STRING, t STRING, v INT) TIME BY ts LATENESS {lateness}ms;\n"
            + "\n".join(rules))
    raw = draw(st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from("abc"),
                                  st.integers(0, 3), st.integers(0, 3)),
                        min_size=2, max_size=12))
    ts, events = 0, []
    for seq, (k, t, v, gap) in enumerate(raw):
        ts += gap
        events.append(Event("s", ts, seq, {"ts": ts, "k": k, "t": t, "v": v}))
    # Arrival order: shuffled within the lateness, so no event is late whatever the batching.
    rnd = random.Random(draw(st.integers(0, 2**32)))
    arrival = sorted(events, key=lambda e: e.ts + rnd.randint(0, lateness))
    return text, lateness, arrival


def expected(text: str, ruleset: RuleSet, events: list[Event]) -> list[tuple]:
    tree = parse_file(text, "p.cep")
    end = max((e.ts for e in events), default=None)
    out: list[tuple] = []
    for node in tree.rules:
        rule = ruleset.get(node.id)
        pattern = next(c.value for c in node.clauses if c.name == "PATTERN")
        assert isinstance(pattern, ast.PAlt)
        keys = sorted({e.data["k"] for e in events}) if rule.key_field else [""]
        for key in keys:
            mine = sorted((e for e in events if not rule.key_field or e.data["k"] == key),
                          key=lambda e: (e.ts, e.seq))
            ref = Reference(rule, pattern, [(dict(e.data), e.ts) for e in mine], end)
            seqs = [e.seq for e in mine]
            for caps in ref.matches():
                out.append((rule.id, key, "match",
                            tuple((rule.nfa.vars[v], seqs[j]) for v, j, *_ in caps)))
            if rule.on_timeout is not None:
                for caps in ref.timeouts():
                    out.append((rule.id, key, "timeout", (seqs[caps[0][1]], len(caps))))
    return sorted(out)


def _by_start(results: list[tuple]) -> tuple[list[tuple], dict[tuple, int]]:
    """Timeouts without their length, and the lengths by (rule, key, start)."""
    plain, lengths = [], {}
    for rule, key, kind, what in results:
        if kind == "timeout":
            lengths[(rule, key, what[0])] = what[1]
            what = what[0]
        plain.append((rule, key, kind, what))
    return sorted(plain), lengths


def engine_run(ruleset: RuleSet, events: list[Event], batch: int,
               ) -> tuple[list[tuple], int, int]:
    engine = build_engine(ruleset)
    store, late = MemoryKeyStore(), []  # type: ignore[var-annotated]
    out: list[tuple] = []
    for r in run_embedded(engine, events, batch_size=batch, store=store, late=late):
        if isinstance(r, Match):
            out.append((r.rule_id, str(r.key), "match",
                        tuple((e.var, e.seq) for e in r.events)))
        elif isinstance(r, Timeout):
            out.append((r.rule_id, str(r.key), "timeout", (r.events[0].seq, len(r.events))))
        elif isinstance(r, Dropped):
            out.append((r.rule_id, str(r.key), "dropped", r.count))
    left = len(store.states) + len(store.wake)
    return sorted(out), len(late), left


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(case())
def test_engine_equals_reference_at_every_batch_size(c: tuple[str, int, list[Event]]) -> None:
    text, _lateness, events = c
    ruleset, errors = compile_file(text, "p.cep")
    assume(not errors)
    assert ruleset is not None
    want = expected(text, ruleset, events)
    event(f"results: {min(len(want), 3)}{'+' if len(want) >= 3 else ''}")
    event("has timeouts" if any(w[2] == "timeout" for w in want) else "no timeouts")
    event("partitioned" if "PARTITION BY" in text else "unpartitioned")
    want_plain, want_len = _by_start(want)
    for batch in BATCHES:
        got, late, left = engine_run(ruleset, events, batch)
        assert late == 0, (text, batch)
        assert left == 0, ("state left after the end of input", text, batch)
        # The per-key cap on partial matches (MAX PARTIAL MATCHES, default 10,000) drops the
        # oldest when a pattern explodes (ALL MATCHES with ->>): the reference has no cap.
        assume(not any(g[2] == "dropped" for g in got))
        got_plain, got_len = _by_start(got)
        assert got_plain == want_plain, (text, [(e.ts, e.seq, e.data) for e in events], batch)
        assert all(1 <= n <= want_len[k] for k, n in got_len.items()), (text, batch)

