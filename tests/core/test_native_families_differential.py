"""Differential test for rule families (docs/rule-families.md): rules of a group that differ only
in their constants, WITHIN / STEP WITHIN and MAX PARTIAL MATCHES share one set of NFA runs per key
in the native engine, each entry carrying the mask of the rules for which it is alive.

Random rules (tests/core/test_native_engine_differential.py's strategy: patterns with
quantifiers, alternations, absences, every skip strategy, ALL MATCHES, measures, MAX PARTIAL
MATCHES, ON TIMEOUT) each followed by 2-5 copies with their integer and decimal constants and
their time limits shifted per copy (so some conditions are the same in every member and some
differ, and members expire at different times); random streams at batch sizes 1, 2, 3, 7 and all,
ending with the end of input. Three comparisons, everything observable after every call
(results in order, late reports, counters, next wake, keys holding state):
- families on vs the Python engine (key states through bytes between calls at batches 1 and 3,
  and from Arrow batches);
- families on vs families off (`families=False`), same calls;
- an engine that switches between families on and off at every call, its key states carried as
  bytes from one to the other (the family state written as per-rule parts and regrouped from the
  other engine's parts), vs the Python engine;
- as the Spark operator runs the core (JSON batches, key states as blobs in a shard store,
  dropped and reloaded at random): families on vs off.
"""

from __future__ import annotations

import os
import re

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cep.runtime.bind import build_embedded_engine, engine_kind
from cep.runtime.engine import NEG_INF, Event, MemoryKeyStore
from tests.core.test_native_engine_differential import (
    _keys,
    _result,
    _value,
    arrow_table,
    both_engines,
    compile_valid,
    drive,
    drive_operator_store,
    json_batches,
    make_events,
    ruleset_text,
    same_results,
    streams,
)
from tests.hyp import profile

EXAMPLES = int(os.environ.get("CEP_FAMILY_DIFF_EXAMPLES")
               or {"dev": 8, "ci": 60, "deep": 600}[profile()])
STREAMS_PER_RULESET = 8
BATCHES = (1, 2, 3, 7, 10_000)


def varied_copy(rule: str, base: int, n: int, shift: int, window: int, keep_timeout: bool) -> str:
    """Rule `r{base}` renamed, its integer constants moved by `shift`, its decimals by
    shift/2, its WITHIN / STEP WITHIN by `window` ms (never below 1)."""
    out = re.sub(rf"^RULE r{base}\b", f"RULE r{base}_{n}", rule, count=1)
    head, sep, tail = out.partition(" DEFINE ")
    if sep:  # constants of the conditions only: quantifier bounds and PREV offsets stay
        define, _, rest = tail.partition(" WITHIN ")
        rest = " WITHIN " + rest if _ else ""
        if not _:
            define, _, rest = tail.partition(" ALLOW UNBOUNDED")
            rest = " ALLOW UNBOUNDED" + rest if _ else ""
        define = re.sub(r"(?<![\w.])(\d+\.\d+)(?![\w.])",
                        lambda m: str(float(m.group(1)) + shift / 2), define)
        define = re.sub(r"(?<![\w.,])(\d+)(?![\w.])(?!\))",
                        lambda m: str(max(0, int(m.group(1)) + shift)), define)
        out = head + sep + define + rest
    out = re.sub(r"(WITHIN) (\d+)ms",
                 lambda m: f"{m.group(1)} {max(1, int(m.group(2)) + window)}ms", out)
    out = re.sub(r"MAX PARTIAL MATCHES (\d+)",
                 lambda m: f"MAX PARTIAL MATCHES {max(1, int(m.group(1)) + shift % 2)}", out)
    if not keep_timeout:
        out = out.replace(" ON TIMEOUT EMIT 'to'", "")
    return out


def _copies(draw: st.DrawFn, rule: str, i: int) -> list[str]:
    return [varied_copy(rule, i, n, draw(st.sampled_from((0, 1, 2, -1))),
                        draw(st.sampled_from((0, 0, 1, 2, 4))), draw(st.integers(0, 4)) == 0)
            for n in range(draw(st.integers(2, 5)))]


def drive_switching(engines: tuple, events: list[Event], batch: int) -> list:  # type: ignore[type-arg]
    """`drive` alternating between two native engines of one rule set at every call, the key
    states moved from one to the other as bytes."""
    store, max_ts, trace, turn = MemoryKeyStore(), NEG_INF, [], 0

    def note(engine, out) -> None:  # type: ignore[no-untyped-def]
        trace.append(([_result(r) for r in out.matches],
                      [(lt.rule_ids, lt.key, lt.event.ts, _value(lt.event.seq), lt.watermark)
                       for lt in out.late],
                      out.keys_touched, out.keys_released, out.keys_reset,
                      engine.next_wake(store), _keys(engine, store)))

    def move(store):  # type: ignore[no-untyped-def]
        src, dst = engines[turn % 2], engines[(turn + 1) % 2]
        fresh = MemoryKeyStore()
        for gid, key in src.keys(store):
            dst.load_key(fresh, gid, key, src.key_bytes(store, gid, key))
        return fresh

    for i in range(0, len(events), batch):
        chunk = events[i:i + batch]
        engine = engines[turn % 2]
        note(engine, engine.ingest(store, chunk, max_ts))
        max_ts = max(max_ts, max(e.ts for e in chunk))
        store = move(store)
        turn += 1
    if max_ts != NEG_INF:
        engine = engines[turn % 2]
        note(engine, engine.advance(store, max_ts, end_of_input=max_ts))
    return trace


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(text=ruleset_text(max_rules=1, copies=_copies),
       cases=st.lists(streams, min_size=STREAMS_PER_RULESET, max_size=STREAMS_PER_RULESET))
def test_rule_families_equal_python_engine(text: tuple[str, list[str]], cases: list) -> None:
    ruleset = compile_valid(*text)
    assume(ruleset is not None and len(ruleset.rules) >= 2)
    python, _, lateness = both_engines(ruleset, text)
    native = build_embedded_engine(ruleset, use_native=True, families=True)
    off = build_embedded_engine(ruleset, use_native=True, families=False)
    assert engine_kind(native) == "native"
    assert engine_kind(off) == "native" and not off.families
    for raw, seed, extra_late, seq_kind, roundtrip in cases:
        events = make_events(raw, seed, extra_late, seq_kind, lateness)
        table = arrow_table(events)
        for batch in BATCHES:
            same_results(python, native, events, table, batch, roundtrip, text)
            assert drive(native, events, batch, False) == drive(off, events, batch, False), text
            if batch in (1, 3):
                assert (drive_switching((native, off), events, batch)
                        == drive(python, events, batch, False)), (text, batch)
                jtable = json_batches(events)
                if jtable is not None:  # as the Spark operator runs it: blobs in a shard store
                    assert (drive_operator_store(native, jtable, batch, seed)
                            == drive_operator_store(off, jtable, batch, seed)), (text, batch)
            if batch >= len(events):
                break


@pytest.mark.parametrize("batch", [1, 500, 10_000])
def test_varied_fraud_rules_form_families(batch: int) -> None:
    """bench/native_rules.py's varied copies of the fraud rules: one family per rule (its copies
    differ in thresholds and windows only), and the same alerts as the Python engine and as
    families off, for many keys (a family's vectors are reused from key to key: nothing may
    pass from one to the next), three families per key (one results list for all), batches of
    one event, some and all, then the end of input."""
    from pathlib import Path

    from bench.native_rules import varied_rules_text
    from bench.workloads import dataset, stream_of
    from cep.compile import compile_rules
    from cep.runtime.bind import build_engine
    from cep.runtime.engine import events_from_dicts

    path = Path(__file__).resolve().parents[2] / "bench" / "rules" / "fraud.cep"
    ruleset = compile_rules(varied_rules_text(path.read_text(), 6), "varied")
    native = build_embedded_engine(ruleset, use_native=True, families=True)
    assert sorted(sorted(f) for f in native.families) == sorted(
        [f"{name}_{i}" for i in range(6)]
        for name in ("card_testing", "impossible_travel", "velocity"))
    python = build_engine(ruleset, use_native=False)
    off = build_embedded_engine(ruleset, use_native=True, families=False)
    ds = dataset("fraud", 3_000, 200, 20)
    events = sorted(events_from_dicts(stream_of(ruleset), ds.events), key=lambda e: (e.ts, e.seq))
    got = drive(native, events, batch, batch == 500)
    assert got == drive(python, events, batch, False)
    assert got == drive(off, events, batch, False)
    assert len({m[4] for t in got for m in t[0]}) > 1  # alerts on several keys


def test_families_keyword_and_environment_default(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`families=` decides whatever the environment says; None reads `CEP_RULE_FAMILIES`
    (default on), for the native loop and for a mixed engine's native part."""
    from pathlib import Path

    from bench.native_rules import varied_rules_text
    from cep.compile import compile_rules

    path = Path(__file__).resolve().parents[2] / "bench" / "rules" / "fraud.cep"
    text = varied_rules_text(path.read_text(), 2)
    ruleset = compile_rules(text, "varied")
    # One rule the core does not run (a window aggregate): the rest go to a mixed engine.
    mixed = compile_rules(text + "\nRULE slow FROM transactions PARTITION BY card PATTERN (a)"
                          " DEFINE a AS COUNT(*) OVER 1h > 5 EMIT 'slow';\n", "mixed")
    for env, keyword, on in (("0", None, False), ("1", None, True), ("0", True, True),
                             ("1", False, False)):
        monkeypatch.setenv("CEP_RULE_FAMILIES", env)
        engine = build_embedded_engine(ruleset, use_native=True, families=keyword)
        assert engine_kind(engine) == "native" and bool(engine.families) == on
        engine = build_embedded_engine(mixed, use_native=True, families=keyword)
        assert engine_kind(engine) == "mixed" and bool(engine.native.families) == on
    monkeypatch.delenv("CEP_RULE_FAMILIES")
    assert build_embedded_engine(ruleset, use_native=True).families
