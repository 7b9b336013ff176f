"""The live job's validation step (`cep.spark.pipeline.Validate`, a mapInArrow) with the core's
fast path equals the same step with the Python validator alone: the same rows in the same
order (stream, time, seq, text, keys, reason, raw bytes, Kafka position), for bad input, a
batch of several streams, a table's records and a batch with no good record. Run on Arrow
batches directly, as Spark's mapInArrow hands them over (the Spark tests run the whole query)."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from cep.compile import compile_rules
from cep.spark.pipeline import Validate, plan_for
from tests.test_bad_input import FRAUD, MIXED, T

POSITION = ("topic", "partition", "offset")


def _raw(streams: list[str | None], values: list[bytes | None]) -> Any:
    n = len(values)
    return pa.RecordBatch.from_arrays(
        [pa.array(streams, pa.string()), pa.array(values, pa.binary()),
         pa.array([(1 << 40) + i for i in range(n)], pa.int64()), pa.array(["t"] * n),
         pa.array([1] * n, pa.int32()), pa.array(list(range(n)), pa.int64())],
        names=["stream", "value", "seq", *POSITION])


def _both(plan: Any, batches: list[Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    fast = Validate(plan, POSITION, 1 << 20)
    slow = Validate(plan, POSITION, 1 << 20, fast=False)
    assert fast.fast and not slow.fast
    rows = []
    for v in (fast, slow):
        out = list(v(iter(batches)))
        assert len(out) == len(batches)
        for b, got in zip(batches, out, strict=True):
            assert got.num_rows == b.num_rows
            assert got.schema.names == ["stream", "ts", "seq", "data", "keys", "reason", "raw",
                                        *POSITION]
        rows.append([r for b in out for r in b.to_pylist()])
    return rows[0], rows[1]


def test_the_fast_path_gives_the_python_validators_rows_in_order() -> None:
    records: list[bytes | None] = [r for r in MIXED if len(r) < 1 << 20] + [
        b"", b"   ", None, json.dumps({"ts": T, "card": "u\u00e9", "amount": 1}).encode(),
        json.dumps({"ts": T + 1, "card": 7, "amount": 2.5, "merchant": "m"}).encode(),
        b'{"ts": "2026-01-01T00:00:00", "card": "iso", "amount": 3}']
    plan = plan_for(FRAUD, 8)
    stream = plan.streams[0].name
    n = len(records)
    batches = [_raw([stream] * 9, records[:9]), _raw([stream] * (n - 9), records[9:]),
               _raw([stream, "nope", None], records[-3:])]
    fast, slow = _both(plan, batches)
    assert fast == slow
    accepted, rest = Validate(plan, POSITION, 1 << 20)._fast(batches[1])
    assert sum(len(rows) for rows, _ in accepted) >= 3 and len(rest) >= 3  # both paths ran
    good = [r for r in fast if r["reason"] is None]
    assert len(good) >= 10 and len(fast) - len(good) >= 10
    assert {r["keys"][0] for r in good} >= {"u\u00e9", "iso"}  # card 7: not a STRING


def test_every_record_on_the_fast_path_and_none() -> None:
    plan = plan_for(FRAUD, 8)
    stream = plan.streams[0].name
    good = [json.dumps({"ts": T + i, "card": f"c{i}", "amount": i}).encode()
            for i in range(50)]
    fast, slow = _both(plan, [_raw([stream] * 50, good)])
    assert fast == slow and all(r["reason"] is None for r in fast)
    assert [r["data"] for r in fast] == [g.decode() for g in good]
    bad: list[bytes | None] = [b"{", b"[]", None, b'{"ts": 1}']
    fast, slow = _both(plan, [_raw([stream] * 4, bad)])
    assert fast == slow and all(r["reason"] for r in fast)


RULES = """
STREAM tx (ts INT, card STRING, amount FLOAT, country STRING) TIME BY ts LATENESS 3s;
STREAM logins (ts INT, user INT, ok BOOL) TIME BY ts LATENESS 3s;
TABLE customers (card STRING, home STRING, t INT) KEY card TIME BY t FROM KAFKA 'customers';

RULE away FROM tx PARTITION BY card
  PATTERN (x) DEFINE x AS country <> customers[card].home EMIT 'away';
RULE big FROM tx PATTERN (x) DEFINE x AS amount > 100 EMIT 'big';
RULE failed FROM logins PARTITION BY user
  PATTERN (a b) DEFINE a AS NOT ok, b AS NOT ok EMIT 'failed';
"""


def several_streams_rows(n: int, cards: int, country: Any,
                         bad_logins: bool) -> list[tuple[str | None, bytes | None]]:
    """Rows of RULES' three streams in one batch: transactions and logins, a table update every
    fifth, a transaction without its card every seventh (and, with `bad_logins`, a login whose
    `ok` is not a boolean). `country(i)`: the i-th transaction's country."""
    rows: list[tuple[str | None, bytes | None]] = []
    for i in range(n):
        rows.append(("tx", json.dumps({"ts": T + i, "card": f"c{i % cards}", "amount": 50 * i,
                                       "country": country(i)}).encode()))
        rows.append(("logins", json.dumps({"ts": T + i, "user": i, "ok": i % 2 == 0})
                     .encode()))
        if i % 5 == 0:
            rows.append(("customers", json.dumps({"t": T + i, "card": f"c{i % cards}",
                                                  "home": "DE"}).encode()))
        if i % 7 == 0:
            rows.append(("tx", b'{"ts": ' + str(T).encode() + b', "amount": 1}'))  # no card
            if bad_logins:
                rows.append(("logins", json.dumps({"ts": T, "user": 1, "ok": "yes"}).encode()))
    return rows


def test_several_streams_a_table_and_a_rule_with_no_key_in_one_batch() -> None:
    plan = plan_for(compile_rules(RULES, "several.cep"), 8)
    assert {s.name for s in plan.streams} == {"tx", "logins", "customers"}
    rows = several_streams_rows(30, 4, lambda i: "NL", bad_logins=True)
    streams = [s for s, _ in rows]
    values = [v for _, v in rows]
    fast, slow = _both(plan, [_raw(streams, values)])
    assert fast == slow
    accepted, rest = Validate(plan, POSITION, 1 << 20)._fast(_raw(streams, values))
    assert [len(rows) for rows, _ in accepted] == [30, 30]  # logins, tx; the table: Python
    assert len(rest) == 6 + 2 * 5
    assert sum(r["reason"] is None for r in fast) == 30 + 30 + 6
    assert sum(r["reason"] is not None for r in fast) == 2 * 5
    tx = [r for r in fast if r["stream"] == "tx" and r["reason"] is None]
    assert {len(r["keys"]) for r in tx} == {2} and {r["keys"][1] for r in tx} == {""}
    logins = [r for r in fast if r["stream"] == "logins" and r["reason"] is None]
    assert {r["keys"][0] for r in logins} == {str(i) for i in range(30)}


def test_a_null_stream_and_an_empty_batch_are_as_python_sees_them() -> None:
    """One stream declared: a batch of that stream's records and a null `stream` is not
    validated whole as that stream (the null row is a dead letter, as in Python); an empty
    batch gives an empty batch with the output's columns."""
    plan = plan_for(FRAUD, 8)
    stream = plan.streams[0].name
    good = json.dumps({"ts": T, "card": "c1", "amount": 1.0, "merchant": "m"}).encode()
    batches = [_raw([stream, None], [good, good]), _raw([], [])]
    fast, slow = _both(plan, batches)
    assert fast == slow
    assert [r["reason"] is None for r in fast] == [True, False]
