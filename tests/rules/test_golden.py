"""Golden tests: rule text → compiled NFA dump (`CompiledRule.explain()`, which includes
`str(nfa)`), one file per feature area under tests/rules/golden/.

Regenerate after an intended change with: UPDATE_GOLDEN=1 pytest tests/rules/test_golden.py
and review the diff."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cep.compile import compile_rules

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(GOLDEN.glob("*.cep"))


def render(path: Path) -> str:
    rules = compile_rules(path.read_text(), path.name)
    return "\n\n".join(r.explain() for r in rules) + "\n"


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_golden(case: Path) -> None:
    expected_path = case.with_suffix(".nfa.txt")
    got = render(case)
    if os.environ.get("UPDATE_GOLDEN"):
        expected_path.write_text(got)
    assert expected_path.exists(), f"no golden file; run UPDATE_GOLDEN=1 pytest {__file__}"
    assert got == expected_path.read_text()


def test_every_golden_rule_also_renders_dot() -> None:
    for case in CASES:
        for rule in compile_rules(case.read_text(), case.name):
            dot = rule.nfa.to_dot(rule.id)
            assert dot.startswith("digraph") and dot.rstrip().endswith("}")
