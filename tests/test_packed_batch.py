"""`packed_batch` (cep/spark/pipeline.py): the map pass's packs, one Arrow IPC stream per shard,
written one after the other into one buffer that is the `pack` column's data (no copy per
pack). Each row must be its shard's rows (in the input's order) as a stream of its own, with
the largest `wm` of them. No Spark."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from cep.spark.pipeline import _pack_schema, packed_batch, unpack

COLS = ("stream", "ts", "seq", "data", "key_field", "primary")


def fan_out_rows(n: int, shards: int, rnd: random.Random) -> Any:
    return pa.table({
        "shard": pa.array([rnd.randrange(shards) for _ in range(n)], pa.int32()),
        "wm": pa.array([rnd.randrange(-5, 10**6) for _ in range(n)], pa.int64()),
        "stream": ["tx"] * n,
        "ts": pa.array([rnd.randrange(10**6) for _ in range(n)], pa.int64()),
        "seq": pa.array(range(n), pa.int64()),
        "data": [f'{{"card":"c-{rnd.randrange(50)}","é":"{"x" * rnd.randrange(40)}"}}'
                 for _ in range(n)],
        "key_field": [rnd.choice(["card", "merchant"]) for _ in range(n)],
        "primary": [rnd.random() < 0.5 for _ in range(n)],
    })


@pytest.mark.parametrize(("n", "shards"), [(1, 1), (7, 1), (300, 3), (2000, 8), (50, 64)])
def test_each_pack_is_its_shards_rows_as_a_stream_of_their_own(n: int, shards: int) -> None:
    rows = fan_out_rows(n, shards, random.Random(n * 100 + shards))
    out = packed_batch(rows)
    assert out is not None and out.schema.names == ["shard", "wm", "pack"]
    listed = rows.to_pylist()
    assert out.column("shard").to_pylist() == sorted({r["shard"] for r in listed})
    schema = _pack_schema()
    for shard, wm, pack in zip(*(out.column(c).to_pylist() for c in ("shard", "wm", "pack")),
                               strict=True):
        mine = [r for r in listed if r["shard"] == shard]
        assert wm == max(r["wm"] for r in mine)
        alone = pa.ipc.open_stream(pack)  # a stream of its own: the schema, then the rows
        assert alone.schema == schema
        assert alone.read_all().to_pylist() == [{c: r[c] for c in COLS} for r in mine]
    every = unpack(out.column("pack").to_pylist())  # as the operator reads a call's packs
    assert sorted(map(repr, every.to_pylist())) == sorted(
        repr({c: r[c] for c in COLS}) for r in listed)


def test_no_rows_no_packs() -> None:
    assert packed_batch(fan_out_rows(0, 4, random.Random(0))) is None
