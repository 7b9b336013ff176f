"""The engine's hard cases through `cep replay` on Spark, held to the embedded engine's answer.

Each case is a stream of its own with its rules, so one replay runs them all: end of input for
rules without a time limit, a rule without PARTITION BY, events exactly at a deadline (WITHIN,
STEP WITHIN, absence) next to another key's event at the same time, and a timeout decided at the
end of input. The replay splits the input over several files and micro-batches; the alerts must
equal the embedded engine's, line for line, and the expected alerts of each case.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cep.compile import compile_rules
from cep.runtime.bind import build_engine
from cep.runtime.embedded import alerts_for, canonical_lines
from jobs.replay import InputSpec, run_replay

pytestmark = pytest.mark.spark

RULES = """
STREAM tail (ts INT, k STRING, t STRING) TIME BY ts LATENESS 0s;
RULE optional_tail FROM tail PARTITION BY k PATTERN (A B?)
  DEFINE A AS t = 'a', B AS t = 'b' EMIT 'optional tail';
RULE unbounded_tail FROM tail PARTITION BY k PATTERN (A B+)
  DEFINE A AS t = 'a', B AS t = 'b' ALLOW UNBOUNDED EMIT 'unbounded tail';

STREAM whole (ts INT, k STRING, t STRING) TIME BY ts LATENESS 0s;
RULE unpartitioned FROM whole PATTERN (A B)
  DEFINE A AS t = 'a', B AS t = 'b' WITHIN 1m EMIT 'whole stream';

STREAM edge (ts INT, k STRING, t STRING) TIME BY ts LATENESS 0s;
RULE absence FROM edge PARTITION BY k PATTERN (a -> NOT x)
  DEFINE a AS t = 'a', x AS t = 'x' WITHIN 10s EMIT 'no x';
RULE step FROM edge PARTITION BY k PATTERN (a -> b -> c)
  DEFINE a AS t = 'a', b AS t = 'b', c AS t = 'c' STEP WITHIN 5s
  ON TIMEOUT EMIT 'step timed out' EMIT 'abc';
"""


def ev(ts: int, k: str, t: str) -> dict:
    return {"ts": ts, "k": k, "t": t}


INPUT = {
    "tail": [ev(0, "k1", "a"), ev(10, "k2", "a"), ev(20, "k2", "b"), ev(30, "k2", "b")],
    "whole": [ev(0, "k1", "a"), ev(1, "k2", "b"), ev(2, "k3", "z")],
    "edge": [
        # k1: x exactly at the absence deadline cancels it; k2: 1 ms later it does not.
        ev(0, "k1", "a"), ev(0, "k2", "a"), ev(10_000, "k9", "y"), ev(10_000, "k1", "x"),
        ev(10_001, "k2", "x"),
        # k3: each step exactly 5 s after the previous completes; k4: 5,001 ms times out.
        ev(20_000, "k3", "a"), ev(25_000, "k3", "b"), ev(25_000, "k9", "y"),
        ev(30_000, "k3", "c"), ev(20_000, "k4", "a"), ev(25_001, "k4", "b"),
    ],
}

EXPECTED = sorted([
    ("match", "optional_tail", "k1", 0, 0), ("match", "optional_tail", "k2", 10, 20),
    ("match", "unbounded_tail", "k2", 10, 30),
    ("match", "unpartitioned", "", 0, 1),
    # absence: not k1 (x exactly at the deadline); k3 and k4 are proven by the input's end at
    # 30 s, exactly their deadline.
    ("match", "absence", "k2", 0, 0), ("match", "absence", "k3", 20_000, 20_000),
    ("match", "absence", "k4", 20_000, 20_000),
    ("match", "step", "k3", 20_000, 30_000), ("timeout", "step", "k4", 20_000, 20_000),
    ("timeout", "step", "k1", 0, 0), ("timeout", "step", "k2", 0, 0),
])


def test_hard_cases_on_spark_equal_the_embedded_engine(spark, settings, tmp_path: Path) -> None:
    rules = tmp_path / "cases.cep"
    rules.write_text(RULES)
    inputs = []
    for stream, events in INPUT.items():
        folder = tmp_path / stream
        folder.mkdir()
        # Two files per stream, in an order unrelated to event time.
        for i, part in enumerate((events[1::2], events[::2])):
            (folder / f"part-{i}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in part))
        inputs.append(InputSpec(stream, str(folder)))
    out = tmp_path / "alerts.jsonl"
    run_replay(settings, str(rules), inputs, str(out), max_files_per_trigger=2,
               show_progress=False)
    got = out.read_text().splitlines()
    embedded = canonical_lines(alerts_for(build_engine(compile_rules(RULES, str(rules))), INPUT))
    assert got == embedded
    records = [json.loads(line) for line in got]
    assert sorted((r["kind"], r["rule_id"], r["key"], r["first_ts"], r["last_ts"])
                  for r in records) == EXPECTED
