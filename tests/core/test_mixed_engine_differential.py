"""Differential test: the mixed engine (`cep.runtime.mixed.MixedEngine`: the native rules on the
core's engine loop, the others on the Python loop, side by side) against the Python engine over
the whole rule set (`cep.runtime.engine.Engine` on the Python matcher: the specification).

Random rule sets: 0-3 native rules (tests/core/test_native_engine_differential.py's generator,
on one or two streams with their own LATENESS) plus 1-3 Python-only rules drawn from a pool
(OVER aggregates, TUMBLING / HOPPING / SESSION window rules, table lookups on a KAFKA table,
partitioned or not) on the same streams, so (stream, key) groups are split between the two
loops. Random multi-key streams (out of order within the lateness, some beyond it: late events,
some routed to one key field as Spark sends them) with table records interleaved go through both
engines call by call as `run_embedded` drives them, at batch sizes 1, 2, 3, 7 and all, ending
with the end of input. After every call: the results as a multiset (the mixed engine may order
one call's results differently), the late reports in order (one per event: rule ids in the
single engine's order, key, event, watermark), the next wake time and the set of keys with
state (so state is released when the Python engine releases it).
The keys touched / released are sums over the two loops (a key of a split group counts once
per loop): checked as at least the single engine's, and equal when no group is split.

Also: all of rules/ (mixed) over 40 days of generated history with table versions and late
events, embedded and through `cep replay`'s per-partition engine step (`RunEngine`, no Spark),
against the Python loop; and `cep explain`'s engine line.

Each example is one rule set and STREAMS_PER_RULESET streams; `examples(100)` examples (dev 16).
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from cep.runtime.bind import build_embedded_engine, build_engine, engine_kind
from cep.runtime.engine import NEG_INF, Event, MemoryKeyStore, group_rules, run_embedded
from cep.runtime.native import why_not_native
from tests.core.test_native_engine_differential import (
    NESTED_DEFINES,
    NESTED_MEASURES,
    _result,
    _value,
    compile_valid,
    make_events,
    stream_header,
    streams,
)
from tests.hyp import examples
from tests.rules.strategies import rule_statement

STREAMS_PER_RULESET = 6
BATCHES = (1, 2, 3, 7, 10_000)
TABLE = "TABLE tab (k STRING, lim INT, t INT) KEY k TIME BY t FROM KAFKA 'tab';\n"

PYTHON_ONLY = (
    "RULE o{i} FROM {s} PARTITION BY k PATTERN (a b) DEFINE a AS COUNT(*) OVER 5ms >= 2, "
    "b AS v > AVG(v) OVER 4ms EXCLUDE CURRENT ROW MEASURES SUM(v) OVER 3ms AS sv EMIT 'o{i}';",
    "RULE o{i} FROM {s} PATTERN (a) DEFINE a AS COUNT(*) OVER 3ms > 2 "
    "MEASURES MIN(f) OVER 6ms AS lo EMIT 'o{i}';",
    "RULE w{i} FROM {s} PARTITION BY k WINDOW TUMBLING (SIZE 4ms) HAVING COUNT(*) > 1 "
    "MEASURES COUNT(*) AS n, COUNT(v) AS nv EMIT 'w{i}';",
    "RULE h{i} FROM {s} PARTITION BY k WINDOW HOPPING (SIZE 6ms, ADVANCE BY 2ms) "
    "WHERE t = 'a' HAVING COUNT(*) > 0 MEASURES COUNT(*) AS n EMIT 'h{i}';",
    "RULE e{i} FROM {s} PARTITION BY k WINDOW SESSION (3ms) HAVING COUNT(*) > 1 "
    "MEASURES COUNT(*) AS n EMIT 'e{i}';",
    "RULE l{i} FROM {s} PARTITION BY k PATTERN (a b?) DEFINE a AS n < tab[k].lim, "
    "b AS t = 'b' MEASURES tab[k].lim AS lim EMIT 'l{i}';",
    "RULE l{i} FROM {s} PATTERN (a) DEFINE a AS tab[k].lim IS NULL AND t = 'c' EMIT 'l{i}';",
)


@st.composite
def mixed_ruleset(draw: st.DrawFn) -> tuple[str, list[str]]:
    two, text = draw(stream_header())
    text += TABLE
    rules: list[tuple[int, str]] = []  # (position, text): native and Python rules interleave
    for i in range(draw(st.integers(0, 3))):
        rule = draw(rule_statement(NESTED_DEFINES, rule_id=f"r{i}", emit=f"m{i}",
                                   partition=True, timeouts=True, measures=NESTED_MEASURES,
                                   max_partial=True))
        if two and draw(st.booleans()):
            rule = rule.replace(" FROM s ", " FROM s2 ", 1)
        rules.append((draw(st.integers(0, 9)), rule))
    for i in range(draw(st.integers(1, 3))):
        template = draw(st.sampled_from(PYTHON_ONLY))
        stream = "s2" if two and draw(st.booleans()) else "s"
        rules.append((draw(st.integers(0, 9)), template.format(i=i, s=stream)))
    rules.sort(key=lambda pr: pr[0])
    return text, [r for _, r in rules]


def with_table_records(events: list[Event], seed: int) -> list[Event]:
    """Table records (some deletes, some behind the events) interleaved with the events."""
    rnd = random.Random(seed ^ 0x5EED)
    out: list[Event] = []
    for i, ev in enumerate(events):
        if rnd.random() < 0.3:
            ts = max(0, ev.ts + rnd.randint(-3, 2))
            row = {"k": rnd.choice(("K", "J", "7")), "lim": rnd.randint(0, 2), "t": ts}
            if rnd.random() < 0.15:
                row["__deleted"] = True
            out.append(Event("tab", ts, 10_000 + i, row))
        out.append(ev)
    return out


def _keys(engine, store) -> list:  # type: ignore[no-untyped-def]
    if engine_kind(engine) == "mixed":
        return engine.keys(store)
    return sorted(store.states)


def drive(engine, events: list[Event], batch: int) -> tuple[list, list]:  # type: ignore[no-untyped-def]
    """`run_embedded`'s calls, with a trace of everything observable after each, and the
    (keys_touched, keys_released, keys_reset) of each call."""
    store, max_ts, trace, counts = MemoryKeyStore(), NEG_INF, [], []

    def note(out) -> None:  # type: ignore[no-untyped-def]
        trace.append((sorted(map(repr, (_result(r) for r in out.matches))),
                      [(lt.rule_ids, lt.key, lt.event.ts, _value(lt.event.seq), lt.watermark)
                       for lt in out.late],
                      engine.next_wake(store), _keys(engine, store)))
        counts.append((out.keys_touched, out.keys_released, out.keys_reset))

    for i in range(0, len(events), batch):
        chunk = events[i:i + batch]
        note(engine.ingest(store, chunk, max_ts))
        max_ts = max(max_ts, max((e.ts for e in chunk if e.stream != "tab"), default=max_ts))
    if max_ts != NEG_INF:
        note(engine.advance(store, max_ts, end_of_input=max_ts))
    return trace, counts


@settings(max_examples=examples(100), deadline=None, database=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(text=mixed_ruleset(),
       cases=st.lists(streams, min_size=STREAMS_PER_RULESET, max_size=STREAMS_PER_RULESET))
def test_mixed_engine_equals_python_engine(text: tuple[str, list[str]], cases: list) -> None:
    ruleset = compile_valid(*text)
    assume(ruleset is not None)
    native_ids = {r.id for r in ruleset.rules if why_not_native(r) is None}
    assume(native_ids and len(native_ids) < len(ruleset.rules))
    python = build_engine(ruleset, use_native=False)
    mixed = build_embedded_engine(ruleset, use_native=True)
    assert engine_kind(mixed) == "mixed"
    assert set(mixed.native.rules) == native_ids
    split = any(len({r.rule_id in native_ids for r in g.rules}) > 1
                for g in group_rules(list(python.rules.values())))
    event(f"a (stream, key) group split between the loops: {split}")
    lateness = max(r.stream.lateness_ms for r in ruleset.rules)
    merged = False
    for raw, seed, extra_late, seq_kind, _ in cases:
        events = with_table_records(make_events(raw, seed, extra_late, seq_kind, lateness), seed)
        for batch in BATCHES:
            expected, want = drive(python, events, batch)
            got, have = drive(mixed, events, batch)
            assert got == expected, (text, [(e.stream, e.ts, e.seq, e.data) for e in events],
                                     batch)
            merged = merged or any(
                {r in native_ids for r in late[0]} == {True, False}
                for call in got for late in call[1])
            if split:
                assert all(h[0] >= w[0] and h[1] >= w[1] for h, w in zip(have, want,
                                                                          strict=True))
            else:
                assert have == want
    event(f"a late report merged from both loops: {merged}")


def test_bundled_rules_run_mixed() -> None:
    """rules/ holds native rules and rules on tables and windows: the embedded engine is mixed,
    with fraud/trading/machines on the native loop."""
    from cep.engines import RulesEngineFactory

    engine = build_embedded_engine(RulesEngineFactory.from_path("rules").ruleset())
    assert engine_kind(engine) == "mixed"
    assert {"card_testing", "velocity", "rise_then_drop", "missing_heartbeat"} \
        <= set(engine.native.rules)
    assert {"far_above_usual_abroad", "spend_far_above_usual", "failed_login_burst"} \
        <= set(engine.python.rules)


def test_bundled_rules_mixed_equals_python() -> None:
    """All of rules/ (native fraud rules beside the table and window rules on the same cards)
    over 40 days of generated history (tests/windows_data.py) with versions of the customers
    table and some events displaced beyond the lateness (late reports for rules of both loops):
    the same results and late reports as the Python engine, at several batch sizes."""
    from cep.engines import RulesEngineFactory
    from tests.windows_data import history

    ruleset = RulesEngineFactory.from_path("rules").ruleset()
    mixed = build_embedded_engine(ruleset)
    assert engine_kind(mixed) == "mixed"
    python = build_engine(ruleset, use_native=False)
    rnd = random.Random(11)
    events: list[Event] = []
    for stream, dicts in history().items():
        events += [Event(stream, d["ts"], i, d) for i, d in enumerate(dicts)]
    start, end = min(e.ts for e in events), max(e.ts for e in events)
    for i in range(40):  # profiles: a usual spend and a home, changing over time
        t = rnd.randint(start, end)
        events.append(Event("customers", t, 100_000 + i, {
            "card": f"card-{rnd.randrange(12):02d}", "home_country": rnd.choice(("NL", "FR")),
            "avg_amount": rnd.choice((5.0, 20.0)), "updated": t}))
    # some events an hour late (LATENESS is seconds), a tenth of the charges
    events.sort(key=lambda e: e.ts + (3_600_000 if rnd.random() < (
        0.1 if e.stream == "transactions" else 0.03) else 0))

    def results(engine, batch):  # type: ignore[no-untyped-def]
        late: list = []
        got = sorted(repr(_result(r)) for r in run_embedded(engine, events, batch_size=batch,
                                                             late=late))
        return got, [(lt.rule_ids, lt.key, lt.event.ts, lt.event.seq, lt.watermark)
                     for lt in late]

    both = False
    for batch in (1, 50, 5_000):
        want = results(python, batch)
        assert want[0] and want[1], "alerts and late events"
        both = both or any({i in mixed.native.rules for i in ids} == {True, False}
                           for ids, *_ in want[1])
        assert results(mixed, batch) == want, batch
    assert both, "a late event for rules of both loops"


def test_explain_names_the_engine_loop(capsys) -> None:  # type: ignore[no-untyped-def]
    """`cep explain` says which loop runs the rules, as `build_embedded_engine` builds it."""
    from cep.cli import main
    from cep.engines import RulesEngineFactory
    from cep.runtime.bind import engine_plan

    for path, kind in (("rules", "mixed"), ("rules/fraud.cep", "native"),
                       ("rules/history.cep", "python")):
        ruleset = RulesEngineFactory.from_path(path).ruleset()
        assert engine_plan(ruleset)[0] == engine_kind(build_embedded_engine(ruleset)) == kind
        assert main(["explain", path]) == 0
        out = capsys.readouterr().out
        assert f"\nengine: {kind} — " in out
    assert "  spend_far_above_usual: python (OVER window aggregates" in out


def test_replay_partition_step_runs_the_mixed_engine(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`cep replay`'s engine step (`cep.spark.batch.RunEngine`, one partition, without Spark)
    on all of rules/: the mixed engine gives the rows (alerts, late reports) the Python loop
    gives, in chunks as Spark hands them over, table records included."""
    import json

    import pyarrow as pa

    from cep.engines import RulesEngineFactory
    from cep.spark import batch as replay
    from cep.spark.pipeline import BROADCAST
    from tests.windows_data import history

    factory = RulesEngineFactory.from_path("rules")
    rnd = random.Random(5)
    rows = []
    for stream, dicts in history().items():
        key_field = {"logins": "ip"}.get(stream, "card")
        for i, d in enumerate(dicts):
            ts = d["ts"] + (3_600_000 if rnd.random() < 0.05 else 0)  # some arrive late
            rows.append((ts, stream, d["ts"], i, json.dumps(d), key_field))
    start = min(r[0] for r in rows)
    for i in range(30):
        t = start + i * 86_400_000
        rec = {"card": f"card-{rnd.randrange(12):02d}", "home_country": "FR",
               "avg_amount": 5.0, "updated": t}
        rows.append((t, "customers", t, 50_000 + i, json.dumps(rec), BROADCAST))
    rows.sort()

    def run(engine) -> tuple[list, dict]:  # type: ignore[no-untyped-def]
        monkeypatch.setattr(replay, "embedded_engine", lambda _f: engine)
        got, stats = [], {}
        # one partition: every chunk through one RunEngine call, as its own engine call
        # (chunk_rows=1: the rows are not sorted by time, and some must come late)
        chunks = []
        for i in range(0, len(rows), 500):
            part = rows[i:i + 500]
            cols = list(zip(*part, strict=True))
            chunks.append(pa.RecordBatch.from_arrays(
                [pa.array(["e"] * len(part)), pa.array(cols[1]), pa.array(cols[2], pa.int64()),
                 pa.array(cols[3], pa.int64()), pa.array(cols[4]), pa.array(cols[5]),
                 pa.array([True] * len(part))],
                names=["kind", "stream", "ts", "seq", "data", "key_field", "primary"]))
        for out in replay.RunEngine(factory, chunk_rows=1)(iter(chunks)):
            for row in out.to_pylist():
                if row["kind"] == "stats":
                    stats = json.loads(row["payload"])
                else:
                    got.append(tuple(row.values()))
        return sorted(got), stats

    mixed = build_embedded_engine(factory.ruleset())
    assert engine_kind(mixed) == "mixed"
    got, got_stats = run(mixed)
    want, want_stats = run(build_engine(factory.ruleset(), use_native=False))
    kinds = {r[0] for r in want}
    assert "late" in kinds and len(want) > 20
    assert got == want and got_stats == want_stats

