"""Replay's first step (`cep.spark.batch.Prepare`) with the native fast path equals the same
step with the Python validator alone: the same event rows (time, seq, text, key field, key,
shard-bound columns), the same dead letters with the same positions, the same end markers.
Run on Arrow batches directly, as Spark's mapInArrow would hand them over (no Spark here; the
Spark replay tests run the whole plan)."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from cep.spark.batch import Prepare
from cep.spark.pipeline import plan_for
from tests.test_bad_input import FRAUD, MIXED, T


def _raw(values: list[bytes], seq: list[int | None] | None = None) -> Any:
    n = len(values)
    return pa.RecordBatch.from_arrays(
        [pa.array(["transactions"] * n), pa.array(values, pa.binary()),
         pa.array(seq or [None] * n, pa.int64()), pa.array(["file:/x.jsonl"] * n),
         pa.array([0] * n, pa.int64()), pa.array([None] * n, pa.int64()),
         pa.array(["line"] * n)],
        names=["stream", "value", "seq", "src", "part", "off", "form"])


def _rows(prepare: Prepare, batches: list[Any]) -> list[tuple]:
    out = []
    for b in prepare(iter(batches)):
        out += [tuple(r.values()) for r in b.to_pylist()]
    return sorted(out, key=repr)


def _both(batches: list[Any]) -> tuple[list[tuple], list[tuple], Prepare]:
    plan = plan_for(FRAUD, 8)
    fast = Prepare(plan)
    assert fast.fast is not None
    slow = Prepare(plan)
    slow.fast = None
    return _rows(fast, batches), _rows(slow, batches), fast


def test_the_fast_path_gives_the_python_paths_rows_for_mixed_input() -> None:
    records = [r for r in MIXED if len(r) < 1 << 20] + [
        b"", b"   ", json.dumps({"ts": T, "card": "u\u00e9", "amount": 1}).encode(),
        json.dumps({"ts": T + 1, "card": 7, "amount": 2.5, "merchant": "m"}).encode()]
    fast, slow, prepare = _both([_raw(records[:9]), _raw(records[9:])])
    assert fast == slow
    from cep import _core  # type: ignore[attr-defined]

    _, tf, keys, fields, max_bytes = prepare.fast  # type: ignore[misc]
    ok = _core.validate_fast(records, tf, keys, fields, max_bytes)[0]
    assert 10 <= sum(ok) < len(records)  # both paths ran
    assert sum(r[1] == "d" for r in fast) >= 10 and sum(r[1] == "e" for r in fast) >= 10


def test_source_positions_are_the_seq_when_there_are_some() -> None:
    records = [json.dumps({"ts": T + i, "card": f"c{i % 3}", "amount": i}).encode()
               for i in range(20)]
    seq: list[int | None] = [None if i % 4 == 0 else (1 << 40) + i for i in range(20)]
    fast, slow, _ = _both([_raw(records, seq)])
    assert fast == slow and len(fast) > 20
