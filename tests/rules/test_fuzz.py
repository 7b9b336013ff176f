"""Parser fuzzing: any input gives a rule set or our own errors, never another exception, and
large inputs give errors, not crashes (speed belongs to benchmarks: no wall-clock window)."""

from __future__ import annotations

import random
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cep.compile import compile_file
from cep.errors import RuleSemanticError, RuleSyntaxError
from tests.hyp import examples

RULES = Path(__file__).parents[2] / "rules"
SAMPLE = (RULES / "fraud.cep").read_text()
TOKENS = (
    "RULE",
    "STREAM",
    "FROM",
    "PARTITION BY",
    "PATTERN",
    "DEFINE",
    "AS",
    "WITHIN",
    "STEP WITHIN",
    "MEASURES",
    "AFTER MATCH SKIP",
    "PAST LAST ROW",
    "TO FIRST",
    "TO LAST",
    "TO NEXT ROW",
    "ALL MATCHES",
    "EMIT",
    "ON TIMEOUT EMIT",
    "TO",
    "KAFKA",
    "REDIS",
    "TIME BY",
    "LATENESS",
    "VERSION",
    "TAGS",
    "SEVERITY",
    "HIGH",
    "ENABLED",
    "TRUE",
    "FALSE",
    "NULL",
    "ALLOW UNBOUNDED",
    "MAX PARTIAL MATCHES",
    "NOT",
    "AND",
    "OR",
    "IN",
    "IS",
    "BETWEEN",
    "CONTAINS",
    "STARTS WITH",
    "MATCHES",
    "PREV",
    "FIRST",
    "LAST",
    "SUM",
    "COUNT",
    "AVG",
    "(",
    ")",
    "{",
    "}",
    ",",
    ";",
    ".",
    "*",
    "+",
    "?",
    "|",
    "->",
    "->>",
    "=",
    "<>",
    "<",
    ">=",
    "-",
    "/",
    "%",
    "a",
    "b",
    "c",
    "ts",
    "amount",
    "s",
    "5m",
    "500ms",
    "2",
    "3.5",
    "'x'",
    '"y"',
    "`z`",
    "--c\n",
    "/* c */",
    "\n",
)


def check(text: str) -> None:
    rules, errors = compile_file(text, "fuzz.cep")
    for e in errors:
        assert isinstance(e, RuleSyntaxError | RuleSemanticError)
        e.render()
    assert (rules is None) == bool(errors)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300))
def test_arbitrary_text(text: str) -> None:
    check(text)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(TOKENS), max_size=60))
def test_token_soup(tokens: list[str]) -> None:
    check(" ".join(tokens))


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_real_rules(data: st.DataObject) -> None:
    text = SAMPLE
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(text)))
        j = data.draw(st.integers(i, min(len(text), i + 20)))
        text = text[:i] + data.draw(st.sampled_from(("", *TOKENS))) + text[j:]
    check(text)


@settings(max_examples=examples(10), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32))
def test_10kb_inputs_give_errors_not_crashes(seed: int) -> None:
    # (How fast is for a benchmark, not a test: no wall-clock window is asserted.)
    rnd = random.Random(seed)
    text = " ".join(rnd.choice(TOKENS) for _ in range(3000))[:10_000]
    check(text)


def test_10kb_of_valid_rules_compiles() -> None:
    body = SAMPLE.split("RULE", 1)[1]
    text = SAMPLE
    i = 0
    while len(text) < 10_000:
        i += 1
        text += "\nRULE" + body.replace("card_testing", f"card_testing_{i}", 1).replace(
            "velocity", f"velocity_{i}", 1
        ).replace("impossible_travel", f"travel_{i}", 1)
    rules, errors = compile_file(text, "big.cep")
    assert not errors and rules is not None and len(rules) > 3


def test_pathological_nesting_is_an_error_not_a_crash() -> None:
    for text in (
        "(" * 5000,
        "RULE r FROM s PATTERN " + "(" * 2000 + "a" + ")" * 2000 + ";",
        "RULE r FROM s PATTERN (a) DEFINE a AS " + "-" * 5000 + "1;",
        "RULE r FROM s PATTERN (a) DEFINE a AS " + "NOT " * 3000 + "TRUE;",
        "RULE r FROM s PATTERN (a) DEFINE a AS 1" + " + 1" * 3000 + " > 2;",
    ):
        check(text)
