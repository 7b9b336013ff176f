"""Events given as JSON text (a `data` column: the live job and replay) are read by the core
(core/src/json.rs) into the values Python's `json.loads` gives: field order, a repeated field's
first place and last value, escaped names, integers past 64 bits, floats, nested values, and a
field list that changes from row to row (the core reuses the previous row's names while they
match). Checked end to end: every event completes a one-variable rule, and the alert's event
must equal `json.loads` of its text, field order included."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cep.compile import compile_rules
from cep.runtime.alerts import alert_record
from cep.runtime.bind import build_embedded_engine, engine_kind
from cep.runtime.engine import NEG_INF, MemoryKeyStore
from tests.hyp import examples

RULES = compile_rules("STREAM s TIME BY ts;\nRULE every FROM s PATTERN (A) EMIT 'x';\n", "j.cep")

NAMES = st.sampled_from(["card", "amount", "a", "b", "é", "a\"b", "x\\y", "line\nbreak"])
SCALARS = st.one_of(
    st.none(), st.booleans(), st.text(max_size=6),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, -0.0, 1e300, 5e-324, 2**63, -(2**63), 2**64]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)),
    max_leaves=5)


def _object_text(fields: list[tuple[str, object]], spaced: bool) -> str:
    """An object's text with the fields in this order; a name may repeat (json.dumps of a dict
    cannot say that)."""
    sep = ", " if spaced else ","
    body = sep.join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in fields)
    return "{" + body + "}"


ROWS = st.lists(st.tuples(st.lists(st.tuples(NAMES, VALUES), max_size=5), st.booleans()),
                min_size=1, max_size=12)


# Wide rows (the core merges repeated names after the object from 16 fields on): up to 40
# fields from 24 names (escaped and non-ASCII among them), so most rows repeat some.
WIDE_NAMES = [f"f{i}" for i in range(21)] + ["é", "a\"b", "x\\y"]
WIDE_ROWS = st.lists(st.tuples(st.lists(st.tuples(st.sampled_from(WIDE_NAMES), SCALARS),
                                        min_size=10, max_size=40),
                               st.booleans()), min_size=1, max_size=6)


@settings(max_examples=examples(150), deadline=None)
@given(rows=ROWS, shared=st.booleans(), batch=st.sampled_from([1, 3, 100]))
def test_json_column_reads_as_json_loads(rows: list[tuple[list[tuple[str, object]], bool]],
                                         shared: bool, batch: int) -> None:
    same_as_json_loads(rows, shared, batch)


@settings(max_examples=examples(100), deadline=None)
@given(rows=WIDE_ROWS, shared=st.booleans(), batch=st.sampled_from([1, 3, 100]))
def test_wide_json_rows_read_as_json_loads(rows: list[tuple[list[tuple[str, object]], bool]],
                                           shared: bool, batch: int) -> None:
    same_as_json_loads(rows, shared, batch)


@pytest.mark.parametrize("width", [5, 20])
def test_more_field_lists_than_the_cache_holds(width: int) -> None:
    """The core keeps the 8 most recently used field lists of one ingest call (json.rs
    `ColsCache`): 12 lists here, the first every other row (stays cached), the 11 others in turn
    (each evicted before it comes back); every third row repeats its first field at the end."""
    lists = [(WIDE_NAMES[k:] + WIDE_NAMES[:k])[:width] for k in range(12)]
    rows = []
    for i in range(60):
        names = lists[0 if i % 2 == 0 else (i // 2) % 11 + 1]
        fields: list[tuple[str, object]] = [(n, i * 100 + j) for j, n in enumerate(names)]
        if i % 3 == 0:
            fields.append((names[0], f"again {i}"))
        rows.append((fields, i % 5 == 0))
    for batch in (1, 7, 100):
        same_as_json_loads(rows, False, batch)


def same_as_json_loads(rows: list[tuple[list[tuple[str, object]], bool]], shared: bool,
                       batch: int) -> None:
    if shared:  # most streams: every row has the first row's names (the reuse path)
        names = [k for k, _ in rows[0][0]]
        rows = [(list(zip(names, [v for _, v in fields] + [None] * len(names), strict=False)),
                 spaced) for fields, spaced in rows]
    texts = [_object_text([("ts", i), *fields], spaced) for i, (fields, spaced) in enumerate(rows)]
    engine = build_embedded_engine(RULES)
    assert engine_kind(engine) == "native"
    store, max_ts, got = MemoryKeyStore(), NEG_INF, []
    for lo in range(0, len(texts), batch):
        part = texts[lo:lo + batch]
        rb = pa.RecordBatch.from_pydict({"ts": list(range(lo, lo + len(part))),
                                         "seq": list(range(lo, lo + len(part))), "data": part})
        got += engine.ingest_batch(store, rb, max_ts).matches
        max_ts = lo + len(part) - 1
    got += engine.advance(store, max_ts, end_of_input=max_ts).matches
    events = [alert_record(engine, r)["events"][0] for r in got]
    assert [e["seq"] for e in events] == list(range(len(texts)))
    for e, text in zip(events, texts, strict=True):
        want = json.loads(text)
        assert list(e["event"].items()) == list(want.items()), text
        # True/1 and 1.0/1 compare equal in Python: the types must match too.
        assert [type(v) for v in e["event"].values()] == [type(v) for v in want.values()], text


def test_json_text_that_is_not_an_object_is_an_error() -> None:
    engine = build_embedded_engine(RULES)
    rb = pa.RecordBatch.from_pydict({"ts": [1], "seq": [1], "data": ["[1, 2]"]})
    with pytest.raises(ValueError, match="not an object"):
        engine.ingest_batch(MemoryKeyStore(), rb, NEG_INF)


@pytest.mark.parametrize("text", [
    '{"a": -0}', '{"a": [-0, -0.0]}', '{"a": -0.0, "b": -0e0}', '{"a": -9223372036854775808}',
    '{"a": -9223372036854775809}', '{"a": 18446744073709551615}', '{"a": 1E400}',
    '{"a": 1, "a": 2, "b": 3}', '{"a\\u00e9": "x\\ud83d\\ude00"}'])
def test_json_numbers_and_names_serde_json_reads_differently(text: str) -> None:
    """Text json.dumps never writes (so the random test never makes it): `-0` is the int 0 and
    a 19-digit negative below the 64-bit range an exact int in Python."""
    engine = build_embedded_engine(RULES)
    rb = pa.RecordBatch.from_pydict({"ts": [1], "seq": [1], "data": [text]})
    store = MemoryKeyStore()
    got = engine.ingest_batch(store, rb, NEG_INF).matches
    got += engine.advance(store, 1, end_of_input=1).matches
    event = alert_record(engine, got[0])["events"][0]["event"]
    want = json.loads(text)
    assert list(event.items()) == list(want.items())
    assert [type(v) for v in event.values()] == [type(v) for v in want.values()]
