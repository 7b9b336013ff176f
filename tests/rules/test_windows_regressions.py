"""Defects found by review in the windows and tables work (session 7), each with the input
that showed it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cep.compile import compile_rules
from cep.compile.diagnostics import CompileErrors
from cep.runtime.bind import build_engine
from cep.runtime.embedded import alerts_for

ROOT = Path(__file__).resolve().parents[2]
HEAD = """
STREAM s (ts INT, k STRING, amount FLOAT, outcome STRING) TIME BY ts LATENESS 0s;
TABLE t (k STRING, x FLOAT, at INT) KEY k TIME BY at FROM KAFKA 't';
"""
BURST = HEAD + """
RULE burst VERSION 1 FROM s PARTITION BY k
  WINDOW TUMBLING (SIZE 5m) WHERE outcome MATCHES '^fail' HAVING COUNT(*) >= 3
  MEASURES COUNT(*) AS n EMIT 'burst' TO KAFKA 'a';
"""


def test_a_rule_hash_is_the_same_in_every_process() -> None:
    """A MATCHES regex is out of the rule's repr: its hash (the version stamp of checkpointed
    state) was different in each process, so a Spark worker or a restart reset open windows."""
    code = ("import sys; from cep.compile import compile_rules; "
            "from cep.runtime.bind import rule_hash; "
            "print(rule_hash(compile_rules(sys.stdin.read(), 'r.cep').rules[0]))")
    hashes = {subprocess.run([sys.executable, "-c", code], input=BURST, text=True, cwd=ROOT,
                             capture_output=True, check=True).stdout.strip() for _ in range(2)}
    assert len(hashes) == 1 and "" not in hashes, hashes


def test_over_sum_does_not_keep_an_evicted_values_rounding() -> None:
    rules = compile_rules(HEAD + """
RULE small VERSION 1 FROM s PARTITION BY k PATTERN (x) DEFINE x AS amount < 10
  MEASURES SUM(amount) OVER 1h AS total, AVG(amount) OVER 1h AS mean
  EMIT 'small' TO KAFKA 'a';
""", "r.cep")
    hour, minute = 3_600_000, 60_000
    events = [{"ts": 1, "k": "a", "amount": 1e17}]
    events += [{"ts": hour - 1000 + i, "k": "a", "amount": 1.5} for i in range(3)]
    events += [{"ts": hour + 2 * minute, "k": "a", "amount": 1.5}]
    for batch in (1, 100):
        alerts = alerts_for(build_engine(rules), {"s": events}, batch_size=batch)
        last = max(alerts, key=lambda a: a["last_ts"])
        assert (last["measures"]["total"], last["measures"]["mean"]) == (6.0, 1.5)


@pytest.mark.parametrize("agg", ["AVG(t[k].x) OVER 1h > 1", "SUM(amount * t[k].x) OVER 1h > 1"])
def test_a_table_lookup_inside_a_window_aggregate_is_an_error(agg: str) -> None:
    text = HEAD + f"""
RULE r VERSION 1 FROM s PARTITION BY k PATTERN (x) DEFINE x AS {agg}
  EMIT 'r' TO KAFKA 'a';
"""
    with pytest.raises(CompileErrors) as info:
        compile_rules(text, "r.cep")
    message = str(info.value)
    assert "a table lookup cannot be inside" in message and "r.cep:" in message


def test_file_level_table_rows_are_relative_to_the_files_base(tmp_path: Path) -> None:
    (tmp_path / "r.cep").write_text(HEAD + """
RULE far VERSION 1 FROM s PARTITION BY k PATTERN (x) DEFINE x AS amount > t[k].x
  EMIT 'far' TO KAFKA 'a';
""")
    (tmp_path / "r.yaml").write_text("""rules: r.cep
base: 2020-01-01T00:00:00Z
tables:
  t:
    - {k: a, x: 10, at: -1d}
cases:
  - name: the row of a day before the base governs an event at +5m
    events:
      - {ts: +5m, k: a, amount: 50, outcome: ok}
    expect:
      - {rule: far, key: a, events: [0]}
""")
    proc = subprocess.run([sys.executable, "-m", "cep.cli", "test", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_whole_float_looks_up_an_int_key() -> None:
    rules = compile_rules("""
STREAM s (ts INT, acct FLOAT, amount FLOAT) TIME BY ts LATENESS 0s;
TABLE t (id INT, x FLOAT, at INT) KEY id TIME BY at FROM KAFKA 't';
RULE r VERSION 1 FROM s PARTITION BY acct PATTERN (x) DEFINE x AS amount > t[acct].x
  EMIT 'r' TO KAFKA 'a';
""", "r.cep")
    from cep.runtime.engine import Event, MemoryKeyStore

    engine = build_engine(rules)
    store = MemoryKeyStore()
    events = [Event("t", 1, 0, {"id": 5, "x": 10.0, "at": 1}, None),
              Event("s", 2, 1, {"ts": 2, "acct": 5.0, "amount": 50.0}, None)]
    out = engine.ingest(store, events, 2, end_of_input=2)
    assert len(out.matches) == 1


def test_a_window_rule_reads_tables_in_where_and_by_its_key_in_having() -> None:
    """Supported since session 8 (docs/windows.md, "Tables in window rules"; the semantics
    are checked in tests/tables/test_window_tables.py): the rule records its lookups, so the
    engine looks the rows up for its events and the rule stays off the native core."""
    from cep.program import Unsupported, export_program

    text = HEAD + """
RULE w VERSION 1 FROM s PARTITION BY k WINDOW TUMBLING (SIZE 5m)
  WHERE amount > t[k].x HAVING COUNT(*) > t[k].x EMIT 'w' TO KAFKA 'a';
"""
    (rule,) = compile_rules(text, "r.cep").rules
    assert rule.lookups == (("t", "k"),)
    with pytest.raises(Unsupported, match="reads table t"):
        export_program(rule)


def test_a_tables_versions_go_once_no_enabled_rule_reads_it() -> None:
    from cep.runtime.engine import Event, MemoryKeyStore

    rule = """
RULE far VERSION 1 {state} FROM s PARTITION BY k PATTERN (x) DEFINE x AS amount > t[k].x
  EMIT 'far' TO KAFKA 'a';
"""
    enabled = build_engine(compile_rules(HEAD + rule.format(state=""), "r.cep"))
    disabled = build_engine(compile_rules(HEAD + rule.format(state="DISABLED"), "r.cep"))
    store = MemoryKeyStore()
    records = [Event("t", 10 * v + i, 3 * v + i, {"k": f"k{i}", "x": 1.0, "at": 10 * v + i}, None)
               for v in range(3) for i in range(3)]
    enabled.ingest(store, records, 0)
    assert len(store.states) == 3
    for t in range(100, 2000, 100):
        disabled.ingest(store, [Event("s", t, 100 + t, {"ts": t, "k": "z", "amount": 1.0,
                                                         "outcome": "ok"}, None)], t)
    assert store.states == {}
    assert len(store.wake) == 0


def test_a_table_records_delete_marker_is_checked_the_same_on_spark() -> None:
    """Spark's plan validates table records with the table's schema, `_deleted` (BOOL)
    included, as the embedded engine does: `"_deleted": "yes"` is a dead letter on both."""
    from cep.events import EventSchema, validate_text
    from cep.spark.pipeline import table_plans
    from cep.tables import conform_row

    rules = compile_rules(HEAD + """
RULE far VERSION 1 FROM s PARTITION BY k PATTERN (x) DEFINE x AS amount > t[k].x
  EMIT 'far' TO KAFKA 'a';
""", "r.cep")
    (plan,) = table_plans(rules)
    schema = EventSchema(plan.name, plan.time_field, (plan.table_key,), plan.schema)
    bad = {"k": "a", "x": 1.0, "at": 5, "_deleted": "yes"}
    spark_reason = validate_text(json.dumps(bad), schema)[3]
    embedded_reason = conform_row(bad, rules.tables[0])[3]
    assert spark_reason is not None and spark_reason == embedded_reason
    good = {"k": "a", "at": 5, "_deleted": True}
    assert validate_text(json.dumps(good), schema)[3] is None
    assert conform_row(good, rules.tables[0])[2] is None  # a delete
