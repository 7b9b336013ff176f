"""The native validator's fast path (`_core.validate_fast`, replay's first step) against the one
definition of a valid event, `cep.events.validate_text`, and `content_seq`: whatever the fast
path accepts, Python accepts too, with the same time, keys, text and content seq. What it does
not accept goes to the Python validator, so rejecting is always safe; the tests also check that
it does accept the plain records replay is made of (else it would be a slow no-op)."""

from __future__ import annotations

import json
import math
import struct
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cep import _core  # type: ignore[attr-defined]
from cep.events import MAX_BYTES, EventSchema, validate_text
from cep.runtime.engine import content_seq
from tests.hyp import examples

FIELDS = (("card", "STRING"), ("amount", "FLOAT"), ("n", "INT"), ("ok", "BOOL"),
          ("where", (("country", "STRING"), ("lat", "FLOAT"))))

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8) | \
    st.sampled_from(["", "a", "é", "😀", "\x7f", '"', "\\", "\n", "\x01", "/"])
floats = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(
    [0.0, -0.0, 1e16, 1e15, 1e-5, 1e-4, 5e-324, 1.7976931348623157e308, 0.1, 2.5])
ints = st.integers(-(2**63), 2**63 - 1) | st.integers(-(2**70), 2**70) | \
    st.sampled_from([0, -1, 2**63 - 1, -(2**63), 2**63])
scalars = st.none() | st.booleans() | ints | floats | text
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(text, inner, max_size=3), max_leaves=8)
times = ints | floats | st.sampled_from(["2024-01-02T03:04:05", "2024-01-02", "x", 1.5, True])


plain = st.text(st.characters(codec="utf-8", min_codepoint=0x20,
                               exclude_categories=("Cs",)), max_size=8)


@st.composite
def records(draw: Any) -> bytes:
    """Mostly valid records (so the fast path has something to accept), some of every kind it
    must leave to Python."""
    wild = draw(st.integers(0, 4)) == 0  # any value, any type: mostly left to Python
    event: dict[str, Any] = draw(st.dictionaries(text if wild else plain,
                                                 values if wild else scalars, max_size=4))
    if draw(st.integers(0, 4)):
        event["ts"] = draw(st.integers(0, 2**45))
    elif draw(st.booleans()):
        event["ts"] = draw(times)
    good = {"card": plain, "amount": floats | st.integers(-(2**60), 2**60),
            "n": st.integers(-(2**63), 2**63 - 1), "ok": st.booleans(),
            "where": st.fixed_dictionaries({}, optional={"country": plain, "lat": floats})}
    bad = {"card": text | ints | floats | st.booleans() | st.none() | st.lists(ints, max_size=1),
           "amount": ints | floats | text | st.none(), "n": ints | floats | text,
           "ok": st.booleans() | ints,
           "where": st.fixed_dictionaries({}, optional={"country": text | ints,
                                                        "lat": floats | text}) | ints}
    for name in good:
        if draw(st.integers(0, 7)):
            event[name] = draw(bad[name] if wild or not draw(st.integers(0, 9)) else good[name])
    out = json.dumps(event, ensure_ascii=not draw(st.integers(0, 4)), separators=draw(
        st.sampled_from([(",", ":"), (", ", ": ")])))
    how = draw(st.sampled_from(["as is"] * 6 + ["space", "cut", "insert", "dup"]))
    if how == "space":
        out = draw(st.sampled_from([" ", "\t", "\r", "\n"])) + out + \
            draw(st.sampled_from(["", " ", "\r", "\n \t"]))
    elif how == "cut" and out:
        out = out[: draw(st.integers(0, len(out) - 1))]
    elif how == "insert":
        i = draw(st.integers(0, len(out)))
        out = out[:i] + draw(st.sampled_from(["x", ",", "}", "{", "]", "NaN", "1e999", "\\",
                                              "'", "01", "-", ".5", "1.", "\x00"])) + out[i:]
    elif how == "dup" and out.startswith("{") and len(out) > 2:
        out = '{"ts":1,' + out[1:]
    raw = out.encode("utf-8")
    if draw(st.integers(0, 20)) == 0:
        raw = raw[:1] + b"\xff" + raw[1:]
    return raw


def python_side(raw: bytes, schema: EventSchema, key_order: list[str]) -> Any:
    text_, event, ts, reason = validate_text(raw, schema, MAX_BYTES)
    if event is None:
        return None
    keys = [(v if isinstance(v := event.get(k), str) else str(v)) if k else ""
            for k in key_order]
    return ts, keys, content_seq(event), text_


def fast_side(raws: list[bytes | None], schema: EventSchema, key_order: list[str]) -> list[Any]:
    ok, ts, seq, koff, kdata = _core.validate_fast(raws, schema.time_field, key_order,
                                                   schema.fields, MAX_BYTES)
    n, k = len(raws), len(key_order)
    tss = struct.unpack(f"={n}q", ts)
    seqs = struct.unpack(f"={n}q", seq)
    offs = struct.unpack(f"={n * k + 1}i", koff)
    out = []
    for j in range(n):
        if not ok[j]:
            out.append(None)
            continue
        keys = [kdata[offs[j * k + p]:offs[j * k + p + 1]].decode() for p in range(k)]
        out.append((tss[j], keys, seqs[j], raws[j].decode()))  # type: ignore[union-attr]
    return out


SCHEMAS = [(EventSchema("s", "ts", ("card",), FIELDS), ["card"]),
           (EventSchema("s", "ts", ("card", "n"), None), ["card", "n", ""])]


@settings(max_examples=examples(600), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.lists(records(), min_size=1, max_size=12), st.sampled_from(SCHEMAS))
def test_whatever_the_fast_path_accepts_python_accepts_the_same_way(
        raws: list[bytes], which: Any) -> None:
    schema, key_order = which
    got = fast_side([*raws, None], schema, key_order)
    assert got[-1] is None
    for raw, fast in zip(raws, got, strict=False):
        if fast is not None:
            assert fast == python_side(raw, schema, key_order), raw


@settings(max_examples=examples(300), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.lists(records(), min_size=1, max_size=12), st.sampled_from(SCHEMAS))
def test_without_content_seqs_it_accepts_the_same_records_with_the_same_times_and_keys(
        raws: list[bytes], which: Any) -> None:
    """`content_seq=False` (the live pass, whose seq is the Kafka position) skips only the
    canonical text and its hash: the same records accepted, the same times and keys, no seqs."""
    schema, key_order = which
    full = _core.validate_fast([*raws, None], schema.time_field, key_order, schema.fields,
                               MAX_BYTES)
    lean = _core.validate_fast([*raws, None], schema.time_field, key_order, schema.fields,
                               MAX_BYTES, False)
    n = len(raws) + 1
    assert lean[0] == full[0] and lean[1] == full[1] and lean[3:] == full[3:]
    assert lean[2] is None and len(full[2]) == 8 * n


@settings(max_examples=examples(300), deadline=None)
@given(st.dictionaries(text, values, max_size=6))
def test_content_seq_of_any_object_equals_pythons(obj: dict[str, Any]) -> None:
    raw = json.dumps(obj, ensure_ascii=False).encode()
    got = _core.content_seq_of(raw)  # None: left to Python (an integer beyond 64 bits)
    if got is not None:
        assert got == content_seq(json.loads(raw)), raw


@settings(max_examples=examples(300), deadline=None)
@given(floats)
@example(1e16)  # the edges of the positional range, both sides
@example(9999999999999998.0)
@example(1e-4)
@example(9.999999999999999e-05)
@example(-0.0)
@example(0.0)
@example(-232.59)
@example(764461555359037.25)  # a tie between two shortest forms: even, as Python
@example(2.5e20)
def test_floats_are_written_as_python_writes_them(f: float) -> None:
    assert math.isfinite(f)
    raw = json.dumps({"x": f}).encode()
    assert _core.content_seq_of(raw) == content_seq({"x": f})


def test_the_plain_records_of_a_replay_take_the_fast_path() -> None:
    schema, key_order = SCHEMAS[0]
    raws = [json.dumps({"ts": 1_700_000_000_000 + i, "card": f"c{i % 7}", "amount": i * 1.5,
                        "n": i, "ok": i % 2 == 0, "where": {"country": "NL", "lat": 52.1},
                        "note": "zürich 😀"}, ensure_ascii=False).encode() for i in range(50)]
    raws += [b'{"ts": 5, "card": "42", "n": -0}', b' {"card":"x","ts":0}\r']
    got = fast_side(raws, schema, key_order)
    assert all(g is not None for g in got)
    assert got == [python_side(r, schema, key_order) for r in raws]


def test_what_it_leaves_to_python() -> None:
    schema, key_order = SCHEMAS[0]
    left = [b"", b"{}", b'{"ts":"2024-01-01","card":"a"}', b'{"ts":1.0,"card":"a"}',
            b'{"ts":1,"card":"a","n":5.0}', b'{"ts":1,"card":"\\u00e9"}', b'{"ts":1,"card":1.5}',
            b'{"ts":1,"card":"a","ts":2}', b'{"ts":1,"card":"a"} x',
            b'{"ts":1,"card":"a","n":1e999}',
            b'{"ts":1,"card":"a","n":99999999999999999999}', b"\xff", b"[1]", b"{'ts':1}",
            b'{"ts":1,"card":"a","amount":"5"}', b'{"ts":1,"card":true}', b'{"ts":1}',
            b"\xef\xbb\xbf" + b'{"ts":1,"card":"a"}', b'{"ts":1,"card":"a","x":NaN}']
    assert fast_side(left, schema, key_order) == [None] * len(left)
