"""The Spark operator (`cep.spark.operator.CepProcessor`) without Spark: its state handles are
dicts with Spark's method names and timers fire as Spark fires them (a shard is called when its
timer is at or below the watermark: Spark 4.3's `TimerStateImpl.getExpiredTimers`), so every
path of the operator — input rows, expired timers, the end-of-input marker, dead-letter rows,
both engine loops and their key stores — runs in seconds. Its alerts must equal the embedded
engine's on the same events, whatever the batch size.
(The Spark tests run the same operator on Spark's real state: test_engine_cases_spark,
test_live, test_bad_input.)"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any
from unittest import mock

import pandas as pd
import pytest

from bench.operator import Handle, ShardState, Watermark, pack_frame
from cep.compile import load_rules_dir
from cep.datagen import GENERATORS
from cep.engines import RulesEngineFactory
from cep.runtime.alerts import decode_rows, output_rows
from cep.runtime.bind import build_engine
from cep.runtime.embedded import alerts_for
from cep.runtime.engine import EOF_TS
from cep.runtime.state_store import SharedRows
from cep.spark import operator as op
from cep.spark.pipeline import DEAD_STREAM, EOF_STREAM

RULES = "rules/fraud.cep"  # the fraud rules the events are for (all run on the native core)
SHARDS = 16
DELAY = 5_000  # the bundled fraud rules' LATENESS (the watermark delay)


def run_operator(events: list[dict[str, Any]], batch: int, dead: int = 0, rules: str = RULES,
                 stream: str = "transactions", key_field: str = "card",
                 processes: int = 1, fail: float = 0.0, record_row: bool = False,
                 trace: list[tuple[int, bool, int, list[Any]]] | None = None,
                 shared: Path | None = None) -> list[Any]:
    """The events (in time order) through the operator as a replay runs it: micro-batches of
    `batch` rows grouped by shard, the watermark trailing each batch's max event time by the
    delay, expired timers after the input, then the end-of-input marker. `dead`: bad rows mixed
    in (their dead-letter data must come out as `dead` rows). `processes` > 1: that many Python
    worker processes (each its own held shards), each call made by one of them at random, as
    Spark gives several stateful tasks per batch to whichever workers are free. `fail`: the
    share of micro-batches that fail after some of their calls ran: the state (timers too) goes
    back to the batch's start, its output is dropped and the batch runs again, as Spark re-runs
    a batch from the checkpoint (the processes keep what they held: copies may be ahead).
    `record_row`: the native store's shard records in its log's reserved row (a live query
    started since session 18). `trace`: each call's (shard, by a timer, watermark, rows).
    `shared`: the processes hand their log rows over in this directory (`SharedRows`, one per
    process), as the workers of one Spark executor do; else none (no `SPARK_LOCAL_DIRS`)."""
    import copy
    import random

    state = ShardState()
    procs = []
    for _ in range(processes):
        if processes > 1:
            op._HELD = {}  # the process's own (the operator's store takes it at `init`)
        proc = op.CepProcessor(RulesEngineFactory.from_path(rules), output_rows, DELAY,
                               end_of_input=max(e["ts"] for e in events),
                               record_row=record_row)
        mine = None if shared is None else SharedRows(str(shared))
        with mock.patch.object(op, "_shared_rows", lambda mine=mine: mine):
            proc.init(Handle(state))  # type: ignore[arg-type]
        procs.append(proc)
    rnd = random.Random(processes)
    wm, top, rows = 0, None, []

    def call(shard: int, frame: pd.DataFrame | None) -> None:
        state.at = (shard,)
        proc = rnd.choice(procs)
        out = (proc.handleInputRows((shard,), iter([frame]), Watermark(wm)) if frame is not None
               else proc.handleExpiredTimer((shard,), Watermark(wm), None))
        for pdf in out:
            rows.extend(pdf.itertuples(index=False))
            if trace is not None:
                trace.append((shard, frame is None, wm, list(pdf.itertuples(index=False))))

    def fire_timers() -> None:
        for (shard,), ts in sorted(state.timers.items()):
            expired = {t for t in ts if t <= wm}
            if expired:
                ts -= expired  # Spark removes a timer once it has fired
                call(shard, None)

    # Files have no source position: seq is left to the operator (a content hash, as embedded).
    rows_in = [(stream, e["ts"], None, json.dumps(e), e[key_field]) for e in events]
    for i in range(dead):  # bad input travelling with the events
        at = (i * 7919) % len(rows_in)
        rows_in.insert(at, (DEAD_STREAM, 0, None, json.dumps({"reason": f"bad {i}"}), ""))
    rows_in.append((EOF_STREAM, EOF_TS, None, "{}", ""))

    def run_batch(i: int, stop: int | None = None) -> None:
        """The micro-batch from row `i`: its calls (only the first `stop`: a failed attempt)."""
        nonlocal top
        by_shard: dict[int, list[tuple[Any, ...]]] = {}
        for name, ts, seq, data, key in rows_in[i:i + batch]:
            shard = zlib.crc32(key.encode()) % SHARDS
            by_shard.setdefault(shard, []).append(
                (shard, name, ts, seq, data, key_field, name == stream))
            if name != DEAD_STREAM:
                top = ts if top is None else max(top, ts)
        for n, (shard, items) in enumerate(sorted(by_shard.items())):
            if stop is not None and n >= stop:
                return
            call(shard, pack_frame(items))  # as Spark hands them over (packed per shard)
        fire_timers()

    for i in range(0, len(rows_in), batch):
        if fail and rnd.random() < fail:
            saved, out_at, top_at = copy.deepcopy(vars(state)), len(rows), top
            run_batch(i, stop=rnd.randrange(1, SHARDS + 2))
            vars(state).update(saved)
            del rows[out_at:]
            top = top_at
        run_batch(i)
        wm = max(wm, (top or 0) - DELAY)  # Spark's watermark for the next batch
    fire_timers()
    return list(decode_rows(rows))


@pytest.fixture(params=["native", "python"])
def engine_loop(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("CEP_ENGINE", request.param)
    op._ENGINES.clear()
    op._HELD.clear()
    return str(request.param)


@pytest.mark.parametrize("batch", [37, 10_000])
def test_operator_alerts_equal_embedded_whatever_the_batching(engine_loop: str, batch: int,
                                                             ) -> None:
    from cep.runtime.alerts import AlertRow, DeadRow, StatsRow

    ds = GENERATORS["fraud"](n_events=600, n_keys=20, seed=11, inject=3)
    events = sorted(ds.events, key=lambda e: e["ts"])
    want = sorted(a["alert_id"] for a in alerts_for(build_engine(load_rules_dir(RULES)),
                                                    {"transactions": events}))
    got = run_operator(events, batch, dead=3)
    assert want
    assert sorted(r.id for r in got if isinstance(r, AlertRow)) == want
    assert sum(r.info["events"] for r in got if isinstance(r, StatsRow)) == len(events)
    assert sorted(r.info["reason"] for r in got if isinstance(r, DeadRow)) == [
        "bad 0", "bad 1", "bad 2"]
    # One processor (one Spark task): its `init` (the state variables' declarations) is
    # reported once, with its first call.
    inits = [r.info["init_us"] for r in got if isinstance(r, StatsRow) and "init_us" in r.info]
    assert len(inits) == 1 and inits[0] > 0
    if engine_loop == "native":
        assert op._HELD  # the native loop held its shards' state between calls
        # Every call, an expired timer's too (no rows), reports its flush's split; the encode
        # and the writes run inside the span `store_us` times, after the timer's (each figure
        # truncated to a µs: the sum may pass it by one per term).
        stats = [r.info for r in got if isinstance(r, StatsRow)]
        assert any(s["rows"] == 0 for s in stats)
        for s in stats:
            assert s["timer_us"] + s["encode_us"] + s["write_us"] <= s["store_us"] + 3


@pytest.mark.parametrize(("batch", "record_row", "shared"),
                         [(37, False, False), (37, True, False), (100, False, False),
                          (100, True, False), (37, True, True), (100, False, True)])
def test_shards_moving_between_worker_processes_give_the_embedded_alerts(
        batch: int, record_row: bool, shared: bool, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """Each call made by one of three worker processes at random (Spark's pool with several
    stateful tasks per batch): a process whose copy of the shard is behind catches it up from
    the rows appended since, or reloads it after a compaction, and takes the registered timer
    from the store; the alerts are the embedded engine's, on the native loop and the mixed one
    (the fraud rules with table and window rules: both stores); with the shards' records in
    a ValueState or in their logs' reserved row (which a reload skips and a compaction keeps);
    with the rows handed over between the processes (`shared`: most catch-ups take them
    there) or not."""
    from cep.runtime.alerts import AlertRow, StatsRow
    from cep.runtime.bind import build_embedded_engine
    from cep.runtime.state_store import NativeShardStore
    from jobs.metrics import Metrics

    monkeypatch.setattr(op, "_HELD", {})
    monkeypatch.setattr(NativeShardStore, "COMPACT_ROWS", 4)  # compactions between moves
    monkeypatch.setattr(NativeShardStore, "COMPACT_SLACK", 50)
    op._ENGINES.clear()
    ds = GENERATORS["fraud"](n_events=600, n_keys=20, seed=11, inject=3)
    events = sorted(ds.events, key=lambda e: e["ts"])
    for rules in (RULES, "rules"):
        want = sorted(a["alert_id"] for a in alerts_for(build_embedded_engine(
            load_rules_dir(rules)), {"transactions": events}))
        hand = tmp_path / f"shared-{rules.replace('/', '-')}" if shared else None
        if hand is not None:
            hand.mkdir()
        got = run_operator(events, batch, rules=rules, processes=3, record_row=record_row,
                           shared=hand)
        assert want and sorted(r.id for r in got if isinstance(r, AlertRow)) == want
        stats = [r.info for r in got if isinstance(r, StatsRow)]
        assert sum(s["state_catchups"] for s in stats) > 5
        taken = sum(s["state_shared_rows"] for s in stats)
        assert (taken > sum(s["state_catchups"] for s in stats) // 2) if shared else taken == 0
        assert sum(s["state_compactions"] for s in stats) > 0
        # `load_us` (the store's `begin`) holds the rows' reads, unzip and import and the
        # reloads' part (each summed from µs-truncated spans inside it: the slack); a call
        # without a reload reports no reload time. Reloads after compactions import rows.
        for s in stats:
            assert s["read_us"] + s["unzip_us"] + s["import_us"] <= s["load_us"] + 3
            assert s["reload_us"] <= s["load_us"] + 3
            assert s["state_reloads"] or not s["reload_us"]
        assert all(sum(s[k] for s in stats) > 0
                   for k in ("read_us", "unzip_us", "import_us", "reload_us"))
        # The live job's metrics sum every timer and state counter of the operator's rows.
        metrics = Metrics(tmp_path / "metrics.json")
        for s in stats:
            metrics.add_stats(s)
        counted = {k for s in stats for k in s if k.endswith("_us") or k.startswith("state_")}
        assert {"unzip_us", "import_us", "reload_us"} <= counted
        assert {k: metrics.counters[k] for k in counted} == {
            k: sum(s.get(k, 0) for s in stats) for k in counted}


@pytest.mark.parametrize("record_row", [False, True])
@pytest.mark.parametrize(("batch", "processes", "shared"),
                         [(37, 1, False), (37, 3, False), (100, 2, False), (37, 3, True),
                          (100, 2, True)])
def test_failed_and_rerun_micro_batches_give_the_embedded_alerts(
        batch: int, processes: int, shared: bool, record_row: bool,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Micro-batches that fail after some of their calls (or all, timers too) and run again
    from the state as it was, as Spark re-runs a batch from the checkpoint: the processes'
    held copies are then AHEAD of the store (their token and rows are the failed attempt's),
    and the re-run may go to another process, compact, or move only the timer. Each alert
    comes out once, as the embedded engine's; no timer is lost. With the rows handed over
    (`shared`), a failed attempt's file is never taken (its token is in no record)."""
    from cep.runtime import state_store
    from cep.runtime.alerts import AlertRow, StatsRow
    from cep.runtime.bind import build_embedded_engine
    from cep.runtime.state_store import NativeShardStore

    monkeypatch.setenv("CEP_ENGINE", "native")
    monkeypatch.setattr(op, "_HELD", {})
    monkeypatch.setattr(NativeShardStore, "COMPACT_ROWS", 4)
    monkeypatch.setattr(NativeShardStore, "COMPACT_SLACK", 50)
    # A process's tasks count from its first: another test's compaction in this process would
    # hold this run's one task (one per process here) to its `COMPACT_GAP`.
    monkeypatch.setattr(state_store, "_TURNS", state_store._Turns())
    op._ENGINES.clear()
    ds = GENERATORS["fraud"](n_events=600, n_keys=20, seed=11, inject=3)
    events = sorted(ds.events, key=lambda e: e["ts"])
    want = sorted(a["alert_id"] for a in alerts_for(build_embedded_engine(
        load_rules_dir(RULES)), {"transactions": events}))
    got = run_operator(events, batch, processes=processes, fail=0.4, record_row=record_row,
                       shared=tmp_path if shared else None)
    assert want and sorted(r.id for r in got if isinstance(r, AlertRow)) == want
    stats = [r.info for r in got if isinstance(r, StatsRow)]
    assert sum(s["state_reloads"] for s in stats) > 3  # the copies ahead were not used
    assert (sum(s["state_shared_rows"] for s in stats) > 0) == (shared and processes > 1)
    assert sum(s["state_compactions"] for s in stats) > 0 or batch > 37


@pytest.mark.parametrize("batch", [50, 5_000])
def test_window_rules_through_the_operator_equal_embedded(batch: int) -> None:
    """rules/history.cep's tumbling and hopping window rules (docs/windows.md) through the
    operator: windows close on Spark's timers as the watermark passes their ends, and the end
    of input drops the windows it did not close, as in the embedded engine."""
    from cep.runtime.alerts import AlertRow
    from tests.windows_data import history

    rules = "rules/history.cep"
    events = sorted(history()["logins"], key=lambda e: e["ts"])
    want = sorted(a["alert_id"] for a in alerts_for(build_engine(load_rules_dir(rules)),
                                                    {"logins": events}))
    got = run_operator(events, batch, rules=rules, stream="logins", key_field="ip")
    assert len(want) > 10
    assert sorted(r.id for r in got if isinstance(r, AlertRow)) == want


@pytest.mark.parametrize("batch", [37, 10_000])
def test_mixed_rule_set_through_the_operator_equals_embedded(batch: int) -> None:
    """All of rules/ (native fraud rules beside table and window rules on the same cards: a
    mixed rule set, `cep.runtime.mixed.MixedEngine`) through the operator, which keeps the
    native loop's key states in a `NativeShardStore` and the Python loop's in a
    `MapStateKeyStore` (`MixedShardStore`), one timer per shard at the earlier wake: the same
    alerts as the embedded engine, whatever the batching."""
    from cep.runtime.alerts import AlertRow
    from cep.runtime.bind import build_embedded_engine, engine_kind
    from cep.runtime.mixed import MixedShardStore

    op._ENGINES.clear()
    op._HELD.clear()
    ds = GENERATORS["fraud"](n_events=600, n_keys=20, seed=11, inject=3)
    events = sorted(ds.events, key=lambda e: e["ts"])
    embedded = build_embedded_engine(load_rules_dir("rules"))
    assert engine_kind(embedded) == "mixed"
    want = sorted(a["alert_id"] for a in alerts_for(embedded, {"transactions": events}))
    assert want == sorted(a["alert_id"] for a in alerts_for(build_engine(load_rules_dir("rules")),
                                                            {"transactions": events}))
    got = run_operator(events, batch, rules="rules")
    assert want
    assert sorted(r.id for r in got if isinstance(r, AlertRow)) == want
    engine = op._cached_engine(RulesEngineFactory.from_path("rules"))
    assert engine_kind(engine) == "mixed" and op._HELD  # the native part's shards were held
    proc = op.CepProcessor(RulesEngineFactory.from_path("rules"), output_rows, DELAY)
    proc.init(Handle(ShardState()))  # type: ignore[arg-type]
    assert isinstance(proc.store, MixedShardStore)


@pytest.mark.parametrize("layout1_log", [True, False])
def test_layout_1s_log_is_declared_only_when_the_state_may_hold_it(
        layout1_log: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """`nlog` (a ListState, the native store's log until session 14) is declared in each task
    only when the checkpoint may hold it (the native loop's store)."""
    from bench.operator import Handle, ShardState

    monkeypatch.setenv("CEP_ENGINE", "native")
    monkeypatch.setattr(op, "_ENGINES", {})  # (another test's engine loop is cached there)

    class Declared(Handle):
        def getListState(self, name: str = "", *args: Any) -> Any:  # noqa: N802
            names.append(name)
            return super().getListState(name, *args)

    names: list[str] = []
    proc = op.CepProcessor(RulesEngineFactory.from_path(RULES), output_rows, DELAY,
                           layout1_log=layout1_log)
    proc.init(Declared(ShardState()))  # type: ignore[arg-type]
    assert names == (["nlog"] if layout1_log else [])
    assert (proc.store._old_log is not None) is layout1_log


@pytest.mark.parametrize("record_row", [False, True])
def test_a_record_row_store_declares_one_state_variable(
        record_row: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the shards' records in their logs' reserved row (a live query started since session
    18) a task declares the log alone (`nrows`); otherwise the record's ValueState too."""
    monkeypatch.setenv("CEP_ENGINE", "native")
    monkeypatch.setattr(op, "_ENGINES", {})

    class Declared(Handle):
        def getMapState(self, name: str = "", *args: Any) -> Any:  # noqa: N802
            names.append(name)
            return super().getMapState(name, *args)

        def getValueState(self, name: str = "", *args: Any) -> Any:  # noqa: N802
            names.append(name)
            return super().getValueState(name, *args)

    names: list[str] = []
    proc = op.CepProcessor(RulesEngineFactory.from_path(RULES), output_rows, DELAY,
                           layout1_log=False, record_row=record_row)
    proc.init(Declared(ShardState()))  # type: ignore[arg-type]
    assert names == (["nrows"] if record_row else ["nrows", "nshard"])


@pytest.mark.parametrize("record_row", [False, True])
def test_a_shard_with_no_input_fires_its_deadlines_as_the_watermark_passes(
        record_row: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A card's five charges (a velocity alert, released once the watermark passes the fifth)
    and then no input for its shard while other shards' cards go on for minutes of event time:
    its alert comes out of an expired timer's call at a watermark before the end of input, not
    at the end, and at the first watermark past the alert's last event. (The shard's timers
    here are all at its wake: the test of the timer choice covers an early timer kept.)"""
    from cep.runtime.alerts import AlertRow

    monkeypatch.setenv("CEP_ENGINE", "native")
    monkeypatch.setattr(op, "_HELD", {})
    op._ENGINES.clear()
    t0 = 1_700_000_000_000

    def shard(card: str) -> int:
        return zlib.crc32(card.encode()) % SHARDS

    idle = "c-idle"
    others = [c for c in (f"c-{i}" for i in range(200))
              if shard(c) not in (shard(idle), shard(""))][:12]
    events = [{"ts": t0 + i * 1000, "card": idle, "amount": 10.0, "merchant": "m",
               "country": "FR"} for i in range(5)]
    events += [{"ts": t0 + 200 * i, "card": others[i % len(others)], "amount": 3.0,
                "merchant": "m", "country": "FR"} for i in range(1, 1500)]
    events.sort(key=lambda e: e["ts"])
    want = sorted(a["alert_id"] for a in alerts_for(build_engine(load_rules_dir(RULES)),
                                                    {"transactions": events}))
    trace: list[tuple[int, bool, int, list[Any]]] = []
    got = run_operator(events, 40, record_row=record_row, trace=trace)
    assert sorted(r.id for r in got if isinstance(r, AlertRow)) == want
    last = t0 + 4000  # the idle card's fifth charge
    fired = [(wm, call_rows) for s, by_timer, wm, call_rows in trace
             if s == shard(idle) and by_timer]
    alerts = [(wm, r) for wm, call_rows in fired for r in decode_rows(call_rows)
              if isinstance(r, AlertRow) and r.key == idle]
    assert len(alerts) == 1  # from a timer's call, not the end of input's
    wm = alerts[0][0]
    assert last <= wm < events[-1]["ts"] - DELAY  # (the engine's watermark is Spark's here)
    # The first watermark past the fifth charge released it.
    assert wm == min(w for _, _, w, _ in trace if w >= last)


def test_the_registered_timer_is_one_never_later_than_the_wake_and_never_lost() -> None:
    """`_reset_timer`'s choices (native loop) over random wakes and watermarks, Spark firing and
    removing a timer at or below the batch's watermark after its input: while the shard has a
    wake exactly one timer is registered, never later than the wake (so no alert comes later
    than at the wake's own timer), an earlier one only while it is above the watermark (not
    due: kept, it fires in no batch the wake's timer would not; else it is replaced); the
    store's record of it is always the registered one. Covers the wake moving earlier than
    a kept timer, and a kept timer firing before the wake (the shard run with no events)."""
    import random

    from bench.operator import Handle

    class Engine:
        wake: int | None = None

        def next_wake(self, store: Any) -> int | None:
            return None if self.wake is None else self.wake + DELAY

    class Store:
        timer: Any = None

    state = ShardState()
    state.at = (0,)
    proc = op.CepProcessor.__new__(op.CepProcessor)
    engine, store = Engine(), Store()
    proc.engine, proc.store, proc.handle = engine, store, Handle(state)  # type: ignore[assignment]
    proc.delay, proc.native = DELAY, True
    rnd = random.Random(7)
    wm, seen = 0, {"kept": 0, "moved earlier": 0, "fired early": 0}

    def check() -> None:
        registered = state.timers.get((0,), set())
        want = engine.wake
        assert registered == (set() if want is None else {store.timer})
        if want is not None:
            assert store.timer <= want and (store.timer == want or store.timer > wm)

    for _ in range(3000):
        wm += rnd.choice((0, 500, 1000, 1000, 3000))
        if rnd.random() < 0.6:  # the shard has input in this batch: its wake moves
            known = store.timer
            wake = None if rnd.random() < 0.1 else wm + rnd.choice(  # on a watermark too
                (rnd.randrange(-1500, 6000), 500 * rnd.randrange(-3, 12)))
            engine.wake = None if wake is None else max(1, wake)
            want = engine.wake
            proc._reset_timer(Watermark(wm))
            check()
            if known is not None and want is not None and wm < known < want:
                seen["kept"] += 1
            if known is not None and want is not None and want < known:
                seen["moved earlier"] += 1
        fired = {t for t in state.timers.get((0,), set()) if t <= wm}
        if fired:  # after the input: the fired timer removed, the shard run with no events
            state.timers[(0,)] -= fired
            seen["fired early"] += engine.wake is not None and engine.wake > wm
            if engine.wake is not None and engine.wake <= wm:
                # (the shard's due keys advanced: its next wake is later, or none is left)
                engine.wake = None if rnd.random() < 0.2 else wm + rnd.randrange(1, 6000)
            proc._reset_timer(Watermark(wm), expired=True)
            check()
        assert not {t for t in state.timers.get((0,), set()) if t <= wm}  # none left due
    assert all(seen.values()), seen


@pytest.mark.parametrize(("reuse", "hands_over"), [(None, False), ("", False), ("1", True)])
def test_a_worker_hands_rows_over_only_when_spark_reuses_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, reuse: str | None,
        hands_over: bool) -> None:
    """`_shared_rows` (uncached): a `SharedRows` under Spark's local directory when Spark reuses
    its Python workers (`SPARK_REUSE_WORKER` set, read as pyspark's daemon reads it); else
    none, since each task's process exits after it and no catch-up would read the files."""
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path))
    if reuse is None:
        monkeypatch.delenv("SPARK_REUSE_WORKER", raising=False)
    else:
        monkeypatch.setenv("SPARK_REUSE_WORKER", reuse)
    shared = op._shared_rows.__wrapped__()
    assert (shared is not None) == hands_over
    assert shared is None or shared.path == str(tmp_path / "cep-shared-rows")
