"""The shared event validator (`cep.events`): the one definition of a valid event.

Table tests for each kind of bad input named in issue 18, and Hypothesis throwing random bytes
and random JSON at it: it never raises; a valid verdict is an event that conforms to the schema
and re-validates to itself from its canonical text; an invalid verdict is a one-line reason.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cep.events import (
    MAX_BYTES,
    MAX_DEPTH,
    MAX_TS,
    EventSchema,
    dumps,
    parse_object,
    validate,
    validate_text,
)
from cep.runtime.engine import EOF_TS
from tests.hyp import examples

SCHEMA = EventSchema("transactions", "ts", ("card",),
                     (("ts", "INT"), ("card", "STRING"), ("amount", "FLOAT"), ("n", "INT"),
                      ("ok", "BOOL")))
T = 1767225600000

BAD = [  # (raw input, a word the reason must contain)
    (b'{"ts": 1767225600000, "card": "c1", "amount": 5} trailing', "trailing"),
    (b"{'ts': 1767225600000, 'card': 'c1', 'amount': 5}", "double quotes"),
    (b'[{"ts": 1767225600000, "card": "c1"}]', "array"),
    (b'"just a string"', "string"),
    (b"42", "number"),
    (b"null", "null"),
    (b'{"ts": 1767225600000, "card": "c1", "amount": "5000"}', "FLOAT"),
    (b'{"ts": 1767225600000, "card": "c1", "amount": NaN}', "NaN"),
    (b'{"ts": 1767225600000, "card": "c1", "amount": Infinity}', "Infinity"),
    (b'{"ts": 1767225600000, "card": "c1", "amount": -Infinity}', "Infinity"),
    (b'{"ts": 1767225600000, "card": "c1", "amount": 1e400}', "overflows"),
    (b'{"ts": 1767225600000, "card": "c1", "n": 9223372036854775808}', "INT"),
    (b'{"ts": 1767225600000, "card": "c1", "n": 1.5}', "INT"),
    (b'{"ts": 1767225600000, "card": "c1", "ok": 1}', "BOOL"),
    (b'{"ts": 1767225600000, "card": "c1", "amount": true}', "FLOAT"),
    (b'{"ts": 1767225600000, "card": 7, "amount": 1}', "STRING"),
    (b'{"ts": 1767225600000, "card": "c1", "amount": ' + b"9" * 5000 + b"}", "digits"),
    (b'{"ts": 1767225600000, "card": "c1", "x": ' + b"[" * 50 + b"]" * 50 + b"}", "nested"),
    (b"[" * 100_000 + b"]" * 100_000, "nested"),
    (b'{"ts": 1767225600000, "card": "\xff\xfe"}', "UTF-8"),
    (b'{"ts": 1767225600000, "card": "\\ud800"}', "surrogate"),
    (b"", "empty"),
    (None, "empty"),
    (b"   ", "malformed"),
    (b"\xef\xbb\xbf{}", "byte order mark"),
    (b'{"card": "c1", "amount": 1}', "missing time field"),
    (b'{"ts": null, "card": "c1"}', "missing time field"),
    (b'{"ts": "1767225600000", "card": "c1"}', "ISO-8601"),
    (b'{"ts": true, "card": "c1"}', "boolean"),
    (b'{"ts": 1e30, "card": "c1"}', "outside"),
    (b'{"ts": 253402300799000, "card": "c1"}', "outside"),
    (b'{"ts": 1767225600000, "amount": 1}', "missing key field 'card'"),
    (b'{"ts": 1767225600000, "card": null}', "missing key field 'card'"),
    (b'{"ts": 1767225600000, "card": "c1", "pad": "' + b"x" * MAX_BYTES + b'"}', "too large"),
]


@pytest.mark.parametrize(("raw", "word"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_is_a_reason_not_an_exception(raw, word):
    event, ts, reason = validate(raw, SCHEMA)
    assert event is None and ts is None
    assert word in reason and "\n" not in reason and len(reason) < 300


GOOD = [  # (raw, the event the engine sees)
    (b'{"ts": 1767225600000, "card": "c1", "amount": 5}',
     {"ts": T, "card": "c1", "amount": 5}),
    (b' {"ts": "2026-01-01T00:00:00Z", "card": "c1", "amount": 5.5}\r\n',
     {"ts": T, "card": "c1", "amount": 5.5}),
    (b'{"ts": "2026-01-01T01:00:00+01:00", "card": "c1"}', {"ts": T, "card": "c1"}),
    (b'{"ts": "2026-01-01 00:00:00.250", "card": "c1"}', {"ts": T + 250, "card": "c1"}),
    (b'{"ts": 1767225600000, "card": "c1", "n": 5.0, "amount": null, "extra": [1, {"a": 2}]}',
     {"ts": T, "card": "c1", "n": 5, "amount": None, "extra": [1, {"a": 2}]}),
    (b'{"ts": 1767225600000, "card": "\xc3\xa9\xe2\x82\xac", "amount": 12345678901234567890}',
     {"ts": T, "card": "é€", "amount": 12345678901234567890}),
]


@pytest.mark.parametrize(("raw", "expected"), GOOD, ids=[str(i) for i in range(len(GOOD))])
def test_good_input_conforms(raw, expected):
    event, ts, reason = validate(raw, SCHEMA)
    assert reason is None
    assert event == expected and ts == expected["ts"]
    assert type(event["n"]) is int if "n" in event else True


def test_limits_are_the_engine_limits():
    assert MAX_TS == EOF_TS  # the end-of-input marker is never a valid event time
    assert MAX_DEPTH >= 8 and MAX_BYTES == 1 << 20


def test_without_a_schema_only_time_and_keys_are_checked():
    free = EventSchema("s", "t")
    assert validate(b'{"t": 1, "amount": "5000"}', free)[0] == {"t": 1, "amount": "5000"}
    assert validate(b'{"amount": 1}', free)[2] == "missing time field 't'"


# ------------------------------------------------------------------------------ Hypothesis

_scalars = (st.none() | st.booleans() | st.integers()
            | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8))
_json = st.recursive(_scalars, lambda c: st.lists(c, max_size=3)
                     | st.dictionaries(st.text(max_size=4), c, max_size=3), max_leaves=12)
_events = st.fixed_dictionaries(
    {}, optional={"ts": st.integers(-10, 2**64) | st.text(max_size=25) | _scalars,
                  "card": _scalars, "amount": _scalars | st.floats(), "n": _scalars, "ok": _scalars,
                  "x": _json})


def _check_invariant(raw: bytes | str) -> None:
    event, ts, reason = validate(raw, SCHEMA)
    if event is None:
        assert ts is None and isinstance(reason, str) and reason and "\n" not in reason
        return
    assert reason is None and isinstance(ts, int) and event["ts"] == ts
    assert -(2**62) < ts < EOF_TS
    assert isinstance(event["card"], str)
    for name, ok in (("amount", lambda v: isinstance(v, int | float) and not isinstance(v, bool)
                      and math.isfinite(float(v))),
                     ("n", lambda v: type(v) is int and -(2**63) <= v < 2**63),
                     ("ok", lambda v: isinstance(v, bool))):
        assert event.get(name) is None or ok(event[name]), (name, event)
    # The canonical text re-validates to the same event: replay stages it, Spark hands it on.
    again, ts2, reason2 = validate(dumps(event).encode(), SCHEMA)
    assert reason2 is None and again == event and ts2 == ts
    # The text handed to the engine (the input itself, or canonical) reads back as the event.
    text, event3, ts3, reason3 = validate_text(raw, SCHEMA)
    assert reason3 is None and event3 == event and ts3 == ts and json.loads(text) == event


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200))
def test_random_bytes_never_raise(raw):
    _check_invariant(raw)


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_events, st.sampled_from(["", " ", "x", "}", "\n", "\x00", "]"]))
def test_random_json_events_never_raise(obj, tail):
    text = json.dumps(obj, allow_nan=True)
    _check_invariant(text.encode() + tail.encode())
    _check_invariant(text.replace('"', "'"))


@settings(max_examples=examples(200), deadline=None)
@given(_json)
def test_parse_object_agrees_with_the_standard_for_standard_json(value):
    text = json.dumps(value)  # finite floats only: standard JSON
    obj, reason = parse_object(text.encode())
    if isinstance(value, dict):
        assert reason is None and obj == value
    else:
        assert obj is None and "not an object" in reason


def test_the_embedded_mode_reads_raw_records_through_the_validator():
    from cep.runtime.embedded import validate_records

    records = [b'{"ts": 1767225600000, "card": "c1", "amount": 5}', "{'ts': 1}",
               {"ts": "2026-01-01T00:00:00Z", "card": "c2"}, {"ts": 1, "card": "c3", "n": "5"}]
    events, dead = validate_records(records, SCHEMA)
    assert events == [{"ts": T, "card": "c1", "amount": 5}, {"ts": T, "card": "c2"}]
    assert [i for i, _ in dead] == [1, 3] and "INT" in dead[1][1]
