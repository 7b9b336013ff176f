"""Differential test: the native engine loop (`cep._core.Engine` behind
`cep.runtime.native_engine.NativeEngine`) against the Python engine (`cep.runtime.engine.Engine`
on the Python matcher), which is the specification.

Random rule sets (1-3 rules from tests/rules/strategies.py, on one or two schema-less streams with
their own LATENESS, partitioned or not, with measures, ON TIMEOUT and MAX PARTIAL MATCHES) and
random multi-key streams (keys of mixed types, events without a key, int, big-int or string
sequence numbers, some events routed to one key field as Spark sends them) that arrive out of order
within the lateness, and in some streams beyond it (late events), go through both engines call by
call as `run_embedded` drives them, at batch sizes 1, 2, 3, 7 and all, ending with the end of
input. After every call everything observable must be identical: the results in order (matches,
timeouts, dropped counts, with events, times, keys, measures and their types, deadlines), the late
reports (rule ids, key, event, watermark), the keys touched / released / reset, the next wake time
and the set of keys holding state (so state is released exactly when the Python engine releases
it). In some streams the native engine's key states go through their serialised bytes (`key_bytes`
/ `load_key`) after every call. When a stream's fields have one Arrow type each and its seq numbers
are 64-bit ints, the same batches also go as Arrow record batches through
`NativeEngine.ingest_batch` (read by the core) and, converted to events by `events_from_batch`,
through the Python engine.

Each example is one rule set and STREAMS_PER_RULESET (20) streams (compiling costs far more than
running): 100 examples = 2,000 (rule set, stream) cases, each at 5 batch sizes, by default;
HYPOTHESIS_PROFILE=dev 10 examples, HYPOTHESIS_PROFILE=deep 1,000 (20,000 cases);
`CEP_ENGINE_DIFF_EXAMPLES` sets the number of examples.
"""

from __future__ import annotations

import math
import os
import random
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cep.compile import CompileErrors, compile_rules
from cep.runtime.bind import build_embedded_engine, build_engine, engine_kind
from cep.runtime.engine import NEG_INF, Event, MemoryKeyStore
from cep.runtime.native import why_not_native
from cep.runtime.native_engine import events_from_batch
from cep.runtime.state_store import NativeShardStore
from tests.core.test_native_differential import DEFINES, MEASURES
from tests.hyp import profile
from tests.rules.strategies import rule_statement

# Nested JSON fields (`p:v`, `p:q:s`) beside the flat ones: read from the tested event, from
# matched events (`a.p:v`), through PREV/FIRST/aggregates, in measures, and `p`/`p:q` whole.
NESTED_DEFINES = {
    var: (*conds, *{
        "a": ("p:v >= 2", "p:q:s CONTAINS 'b'", "p:v IS NULL", "SUM(a.p:v) <= 3",
              "p:q IS NOT NULL AND t = 'a'"),
        "b": ("p:v > a.p:v", "p:v > PREV(p:v)", "p:q:s IS NOT NULL", "p:v = v"),
        "c": ("p:q:s = FIRST(a.p:q:s)", "AVG(p:v) > v", "MAX(c.p:q:s) >= 'a'"),
        "x": ("p:v = 0", "p:q:s = s"),
        "y": ("p:q:s MATCHES 'y'", "p:v > 1"),
    }.get(var, ()))
    for var, conds in DEFINES.items()
}
NESTED_MEASURES = (*MEASURES, "a.p:v AS apv", "SUM(b.p:v) AS spv", "LAST(p:q:s) AS pqs",
                   "p:q AS pq", "p AS whole", "MIN(a.p:q:s) AS mins")

EXAMPLES = int(os.environ.get("CEP_ENGINE_DIFF_EXAMPLES")
               or {"dev": 10, "ci": 100, "deep": 1_000}[profile()])
STREAMS_PER_RULESET = 20
BATCHES = (1, 2, 3, 7, 10_000)


@st.composite
def stream_header(draw: st.DrawFn) -> tuple[bool, str]:
    """One or two streams (s, s2), each with its own lateness: (two?, declarations)."""
    two = draw(st.booleans())
    lat = [draw(st.sampled_from((0, 2, 5))) for _ in range(2)]
    text = f"STREAM s TIME BY ts LATENESS {lat[0]}ms;\n"
    if two:
        text += f"STREAM s2 TIME BY ts LATENESS {lat[1]}ms;\n"
    return two, text


@st.composite
def ruleset_text(draw: st.DrawFn, max_rules: int = 3,
                 copies: Any = None) -> tuple[str, list[str]]:
    """The stream declarations and 1-`max_rules` rules; `copies(draw, rule, i)`, when given,
    adds variants of each rule after it."""
    two, text = draw(stream_header())
    rules = []
    for i in range(draw(st.integers(1, max_rules))):
        rule = draw(rule_statement(NESTED_DEFINES, rule_id=f"r{i}", emit=f"m{i}",
                                   partition=True, timeouts=True, measures=NESTED_MEASURES,
                                   max_partial=True))
        if two and draw(st.booleans()):
            rule = rule.replace(" FROM s ", " FROM s2 ", 1)
        rules.append(rule)
        if copies is not None:
            rules.extend(copies(draw, rule, i))
    return text, rules


def compile_valid(header: str, rules: list[str]):  # type: ignore[no-untyped-def]
    """The rule set of the rules that compile on their own (None if none does)."""
    valid = []
    for rule in rules:
        try:
            compile_rules(header + rule, "p.cep")
        except CompileErrors:
            continue
        valid.append(rule)
    return compile_rules(header + "\n".join(valid), "p.cep") if valid else None


values = st.one_of(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3),
                   st.sampled_from((1.5, 0.0, -2.5, 2**62, "2", None, True, math.nan)))
event = st.fixed_dictionaries(
    {"t": st.sampled_from("abc")},
    optional={"k": st.sampled_from(("K", "K", "J", 7, None)), "v": values,
              "f": st.sampled_from((0.5, 2.0, -1.0, 3, None)),
              "s": st.sampled_from(("ab", "a_b", "Ab", "Äbß", "xyz", "", "y", 5)),
              "n": st.sampled_from((None, 1, 0)),
              # a nested object (or, sometimes, a value where an object is expected)
              "p": st.one_of(
                  st.fixed_dictionaries({}, optional={
                      "v": values,
                      "q": st.one_of(st.fixed_dictionaries({}, optional={
                          "s": st.sampled_from(("ab", "y", "Ab", "", 5, None))}),
                          st.sampled_from((None, 3, "q")))}),
                  st.sampled_from((None, 5, "p", (1, 2))))},
)
# (events with their time gaps and stream, arrival shuffle seed, how late some may be, seq kind,
# serialise the native key states after every call)
streams = st.tuples(
    st.lists(st.tuples(event, st.integers(0, 3), st.sampled_from(("s", "s", "s2"))),
             min_size=1, max_size=12),
    st.integers(0, 2**32), st.sampled_from((0, 0, 6, 12)),
    st.sampled_from(("int", "int", "big", "str")), st.booleans())


def make_events(raw: list, seed: int, extra_late: int, seq_kind: str, lateness: int) -> list[Event]:
    events, ts = [], 0
    for i, (data, gap, stream) in enumerate(raw):
        ts += gap
        seq: object = {"int": (i * 7919) % 101, "big": 2**70 - i * 3, "str": f"q{(i * 37) % 11}"}[
            seq_kind]
        # Spark sends a copy of an event per key field with `route` set: only that field's rules
        # see it; embedded events have route None (every rule of the stream).
        route = (None, None, None, "k", "")[i % 5] if seq_kind == "int" and seed % 3 == 0 else None
        events.append(Event(stream, ts, seq, {**data, "ts": ts}, route))
    rnd = random.Random(seed)
    # Out of order within the lateness; with extra_late > 0 some events come later than that.
    return sorted(events, key=lambda e: e.ts + rnd.randint(0, lateness)
                  + (rnd.randint(0, extra_late) if rnd.random() < 0.3 else 0))


def _value(v):  # type-sensitive, NaN-safe
    return (type(v).__name__, repr(v))


def _result(r):  # type: ignore[no-untyped-def]
    if r.kind == "dropped":
        return ("dropped", r.rule_id, r.version, _value(r.key), r.count, r.ts)
    events = tuple((e.var, e.ts, _value(e.seq), repr(sorted(e.event.items()))) for e in r.events)
    measures = tuple((k, _value(v)) for k, v in r.measures.items())
    extra = (r.deadline_ts,) if r.kind == "timeout" else ()
    return (r.kind, r.rule_id, r.version, r.alert, _value(r.key), events, r.first_ts, r.last_ts,
            measures, *extra)


def _keys(engine, store) -> list:  # type: ignore[no-untyped-def]
    if engine_kind(engine) == "native":
        return [tuple(k) for k in engine.keys(store)] + [("wake", engine.wake_keys(store))]
    return sorted(store.states) + [("wake", len(store.wake))]


def _through_bytes(engine, store):  # type: ignore[no-untyped-def]
    fresh = MemoryKeyStore()
    for gid, key in engine.keys(store):
        data = engine.key_bytes(store, gid, key)
        assert data is not None and data[:5] == b"CEPNK"
        engine.load_key(fresh, gid, key, data)
    return fresh


def drive(engine, events: list[Event], batch: int, roundtrip: bool) -> list:  # type: ignore[no-untyped-def]
    """`run_embedded`'s calls, with a trace of everything observable after each."""
    store, max_ts, trace = MemoryKeyStore(), NEG_INF, []

    def note(out) -> None:  # type: ignore[no-untyped-def]
        trace.append(([_result(r) for r in out.matches],
                      [(lt.rule_ids, lt.key, lt.event.ts, _value(lt.event.seq), lt.watermark)
                       for lt in out.late],
                      out.keys_touched, out.keys_released, out.keys_reset,
                      engine.next_wake(store), _keys(engine, store)))

    for i in range(0, len(events), batch):
        chunk = events[i:i + batch]
        note(engine.ingest(store, chunk, max_ts))
        max_ts = max(max_ts, max(e.ts for e in chunk))
        if roundtrip:
            store = _through_bytes(engine, store)
    if max_ts != NEG_INF:
        note(engine.advance(store, max_ts, end_of_input=max_ts))
    assert not _keys(engine, store)[:-1], "state left after the end of input"
    return trace


def arrow_table(events: list[Event]):  # type: ignore[no-untyped-def]
    """The events as one Arrow table (columns stream, seq and every field), or None when a
    field's values have no common Arrow type (mixed types) or seq is not a 64-bit int."""
    import pyarrow as pa

    names: dict[str, None] = {}
    for e in events:
        names.update(dict.fromkeys(e.data))
    try:
        cols = {"stream": pa.array([e.stream for e in events], pa.string()),
                "seq": pa.array([e.seq for e in events], pa.int64())}
        for n in names:
            cols[n] = pa.array([e.data.get(n) for e in events])
        return pa.table(cols)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        return None


def drive_arrow(engine, table, batch: int) -> list:  # type: ignore[no-untyped-def]
    """`drive` over Arrow batches: the native engine reads them (`ingest_batch`), the Python
    engine gets the same batches as events (`events_from_batch`)."""
    store, max_ts, trace = MemoryKeyStore(), NEG_INF, []

    def note(out) -> None:  # type: ignore[no-untyped-def]
        trace.append(([_result(r) for r in out.matches],
                      [(lt.rule_ids, lt.key, lt.event.ts, _value(lt.event.seq), lt.watermark,
                        # NaN-safe: a late event's NaN field is a new float object on each side.
                        sorted((k, _value(v)) for k, v in lt.event.data.items()))
                       for lt in out.late],
                      out.keys_touched, out.keys_released, out.keys_reset,
                      engine.next_wake(store), _keys(engine, store)))

    for i in range(0, table.num_rows, batch):
        rb = table.slice(i, batch).combine_chunks().to_batches()[0]
        if engine_kind(engine) == "native":
            note(engine.ingest_batch(store, rb, max_ts))
        else:
            note(engine.ingest(store, events_from_batch(rb), max_ts))
        max_ts = max(max_ts, max(rb.column("ts").to_pylist()))
    if max_ts != NEG_INF:
        note(engine.advance(store, max_ts, end_of_input=max_ts))
    return trace


def both_engines(ruleset, text: object):  # type: ignore[no-untyped-def]
    """The Python engine, the native engine loop (every rule native) and the largest LATENESS
    of a rule set."""
    for rule in ruleset.rules:
        assert why_not_native(rule) is None, (why_not_native(rule), text)
    python = build_engine(ruleset, use_native=False)
    native = build_embedded_engine(ruleset, use_native=True)
    assert engine_kind(native) == "native"
    return python, native, max(r.stream.lateness_ms for r in ruleset.rules)


def same_results(python, native, events: list[Event], table, batch: int,  # type: ignore[no-untyped-def]
                 roundtrip: bool, text: object) -> None:
    """The native engine's results equal the Python engine's, from `Event`s (the key states
    through bytes between calls at batches 1 and 3 when `roundtrip`) and from Arrow."""
    expected = drive(python, events, batch, False)
    got = drive(native, events, batch, roundtrip and batch in (1, 3))
    assert got == expected, (text, [(e.stream, e.ts, e.seq, e.data) for e in events], batch)
    if table is not None:
        assert drive_arrow(native, table, batch) == drive_arrow(python, table, batch), (
            text, table.to_pylist(), batch)


def json_batches(events: list[Event]):  # type: ignore[no-untyped-def]
    """The events as the Spark operator hands them to the core: Arrow batches with the JSON text
    of each event (`data`, parsed by the core), its int seq and its route; None when a value has
    no JSON form (seq not an int, a value json cannot write)."""
    import json

    import pyarrow as pa

    try:
        if not all(type(e.seq) is int and -2**63 <= e.seq < 2**63 for e in events):
            return None
        texts = [json.dumps(e.data) for e in events]
    except (TypeError, ValueError):
        return None
    return pa.table({"stream": pa.array([e.stream for e in events], pa.string()),
                     "ts": pa.array([e.ts for e in events], pa.int64()),
                     "seq": pa.array([e.seq for e in events], pa.int64()),
                     "data": pa.array(texts, pa.string()),
                     "route": pa.array([e.route for e in events], pa.string())})


def drive_operator_store(engine, table, batch: int, seed: int) -> list:  # type: ignore[no-untyped-def]
    """`drive` as the Spark operator runs the native loop: JSON batches read by the core, the key
    states in a `NativeShardStore` over (dict) MapState/ValueState, the shard's native state
    held between calls by three worker processes, each call run by one of them at random (a
    process whose copy is behind catches up from the rows appended since, or reloads the log
    after a compaction), and at random a process's copies dropped (the next call it runs
    reloads the shard from the stored log)."""
    from tests.runtime.test_bucket_store import DictValueState
    from tests.runtime.test_native_shard_store import DictLogState

    buckets, meta = DictLogState(), DictValueState()
    processes: list[dict[Any, Any]] = [{}, {}, {}]
    rnd = random.Random(seed)
    max_ts, trace = NEG_INF, []
    shard = ("shard", 0)

    def call(rb, max_ts, eoi=None):  # type: ignore[no-untyped-def]
        held = rnd.choice(processes)
        store = NativeShardStore(buckets, meta, held)
        store.COMPACT_ROWS = 3  # compact often
        # Keys kept decoded between calls: none, some (the rest held as bytes), all.
        store.keep_decoded = rnd.choice((0, 200, 1 << 20))
        store.begin(shard, engine)
        if rb is None:
            out = engine.advance(store, max_ts, end_of_input=eoi)
        else:
            out = engine.ingest_batch(store, rb, max_ts)
        trace.append(([_result(r) for r in out.matches],
                      [(lt.rule_ids, lt.key, lt.event.ts, _value(lt.event.seq), lt.watermark)
                       for lt in out.late],
                      out.keys_touched, out.keys_released, out.keys_reset,
                      engine.next_wake(store), _keys(engine, store)))
        store.flush()
        if rnd.random() < 0.4:
            held.clear()

    for i in range(0, table.num_rows, batch):
        rb = table.slice(i, batch).combine_chunks().to_batches()[0]
        call(rb, max_ts)
        max_ts = max(max_ts, max(rb.column("ts").to_pylist()))
    if max_ts != NEG_INF:
        call(None, max_ts, max_ts)
    from cep import _core

    replayed = _core.EngineState()
    for blob in buckets.blobs:
        engine.core.import_blob(replayed, blob)
    assert len(replayed) == 0, "state left in the store after the end of input"
    return trace


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(text=ruleset_text(),
       cases=st.lists(streams, min_size=STREAMS_PER_RULESET, max_size=STREAMS_PER_RULESET))
def test_native_engine_equals_python_engine(text: tuple[str, list[str]], cases: list) -> None:
    ruleset = compile_valid(*text)
    assume(ruleset is not None)
    python, native, lateness = both_engines(ruleset, text)
    for raw, seed, extra_late, seq_kind, roundtrip in cases:
        events = make_events(raw, seed, extra_late, seq_kind, lateness)
        table = arrow_table(events)
        for batch in BATCHES:
            same_results(python, native, events, table, batch, roundtrip, text)
            jtable = json_batches(events)
            if jtable is not None and batch in (1, 3, 10_000):
                import json

                # The Python engine reads what json.loads makes of the text the core parsed.
                parsed = [Event(e.stream, e.ts, e.seq, json.loads(json.dumps(e.data)), e.route)
                          for e in events]
                assert (drive_operator_store(native, jtable, batch, seed)
                        == drive(python, parsed, batch, False)), (text, jtable.to_pylist(), batch)
            if batch >= len(events):
                break
