"""bench.live_spark_costs' processor (the no-op plus our operator's state and timer calls), run
on bench.operator's in-memory handle: each call reads the shard's record, appends one row,
rewrites the record and keeps exactly one timer, as the live operator does."""

from __future__ import annotations

import json

import pandas as pd

from bench.live_spark_costs import ROW_BYTES, SparkCostsProcessor
from bench.operator import Handle, ShardState, Watermark


def _rows(n: int) -> list[pd.DataFrame]:
    return [pd.DataFrame({"shard": [0] * n, "data": ["{}"] * n, "primary": [True] * n})]


def test_each_call_appends_a_row_rewrites_the_record_and_replaces_the_timer() -> None:
    state = ShardState()
    state.at = (0,)
    handle = Handle(state)
    proc = SparkCostsProcessor()
    proc.init(handle)  # type: ignore[arg-type]
    outs = []
    for call, wm in enumerate([0, 2_000, 5_000]):
        outs += list(proc.handleInputRows((0,), iter(_rows(3 + call)), Watermark(wm)))
        log = state.maps[("nrows", (0,))]
        assert json.loads(log[(-1,)][0]) == [call + 1, wm + 1000]
        assert sorted(k for k in log if k != (-1,)) == [(i,) for i in range(call + 1)]
        assert all(len(log[(i,)][0]) == ROW_BYTES for i in range(call + 1))
        assert handle.listTimers() == [wm + 1000]
    assert [json.loads(o["payload"][0])["events"] for o in outs] == [3, 4, 5]
    # A fired timer (Spark removed it) is forgotten, so the next call only registers one.
    state.timers[(0,)].clear()
    list(proc.handleExpiredTimer((0,), Watermark(7_000), None))
    assert json.loads(state.maps[("nrows", (0,))][(-1,)][0]) == [3, None]
    list(proc.handleInputRows((0,), iter(_rows(1)), Watermark(8_000)))
    assert handle.listTimers() == [9_000]
