"""`pack_rows` and `packed_batch` (cep/spark/pipeline.py): the map pass's packs, one Arrow IPC
stream per shard. `packed_batch` writes them one after the other into one buffer and makes the
`pack` column of it (no copy per pack): its rows must be `pack_rows`' packs, each a stream of
that shard's rows, with the largest `wm` of them. No Spark."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from cep.spark.pipeline import pack_rows, packed_batch, unpack

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
def test_packed_batch_holds_pack_rows_packs_each_a_shards_rows(n: int, shards: int) -> None:
    rows = fan_out_rows(n, shards, random.Random(n * 100 + shards))
    packs = list(pack_rows(rows))
    out = packed_batch(rows)
    assert out is not None and out.schema.names == ["shard", "wm", "pack"]
    assert list(zip(*(out.column(c).to_pylist() for c in ("shard", "wm", "pack")),
                    strict=True)) == packs
    listed = rows.to_pylist()
    assert sorted(s for s, _, _ in packs) == sorted({r["shard"] for r in listed})
    for shard, wm, pack in packs:
        mine = [r for r in listed if r["shard"] == shard]
        assert wm == max(r["wm"] for r in mine)
        got = unpack([pack]).to_pylist()
        assert sorted(map(repr, got)) == sorted(repr({c: r[c] for c in COLS}) for r in mine)


def test_no_rows_no_packs() -> None:
    rows = fan_out_rows(0, 4, random.Random(0))
    assert list(pack_rows(rows)) == []
    assert packed_batch(rows) is None
