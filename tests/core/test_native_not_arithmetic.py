"""`*` and `%` are arithmetic only: Python's sequence repetition (`'ab' * 3`, `[1] * 3`) and
string formatting (`'%05d' % 1`) are NULL in both engines. On a schema-less stream an event's
values pick the operands, and repetition would let one event decide how much memory the engine
takes: `'2' * 9223372036854775807` raised MemoryError in the Python engine (found by the
numeric differential test's generator), which no operator catches, so one event stopped the job.
"""

from __future__ import annotations

from cep.compile import compile_rules
from cep.expr import ARITH
from cep.runtime.engine import Event
from tests.core.test_native_engine_differential import (
    arrow_table,
    both_engines,
    drive,
    same_results,
)

TEXT = """STREAM s TIME BY ts LATENESS 0ms;
RULE r FROM s PARTITION BY k PATTERN (a)
  DEFINE a AS (x * n) IS NULL AND (n * x) IS NULL AND (x % n) IS NULL
  MEASURES x + x AS cat, n * 2 AS twice, n % 7 AS rest
  EMIT 'r';"""

HUGE = 9223372036854775807


def test_repetition_and_formatting_are_null_in_python() -> None:
    mul, mod = ARITH["*"], ARITH["%"]
    for seq in ("ab", b"ab", bytearray(b"ab"), [1], (1,)):
        for a, b in ((seq, HUGE), (HUGE, seq), (seq, 3), (True, seq)):
            try:
                mul(a, b)
            except TypeError:
                continue
            raise AssertionError((a, b))
    for text in ("%0999999999d", b"%d", "%s"):
        try:
            mod(text, 1)
        except TypeError:
            continue
        raise AssertionError(text)
    assert mul(3, 2.5) == 7.5 and mod(-7, 3) == 2 and mod(7.5, 2) == 1.5


def test_repetition_and_formatting_are_null_in_both_engines() -> None:
    ruleset = compile_rules(TEXT, "arith.cep")
    python, native, _ = both_engines(ruleset, TEXT)
    rows = [{"x": "2", "n": HUGE}, {"x": "%0999999999d", "n": 1}, {"x": "ab", "n": 3},
            {"x": 4, "n": 3}, {"x": "%s", "n": "y"}]
    evs = [Event("s", i, i, {**row, "k": "K", "ts": i}) for i, row in enumerate(rows)]
    matches = [r for call in drive(python, evs, len(evs), False) for r in call[0]]
    # Every row but x=4, n=3 (12, 1 and 12: numbers) has NULL products and remainders.
    assert len(matches) == 4, matches
    for batch in (1, 2, len(evs)):
        same_results(python, native, evs, arrow_table(evs), batch, batch == 1, TEXT)
