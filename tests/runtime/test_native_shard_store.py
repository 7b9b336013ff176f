"""The Spark operator's native key store (`NativeShardStore`) and the core's JSON reading.

- The core parses each event's JSON text (`ingest_batch` with a `data` column) into exactly the
  values `json.loads` gives, edge cases included (integers past 64 bits, nested objects, repeated
  fields, escapes, NaN), and an event held in a key's state keeps them through its bytes.
- The store holds each shard's native state between calls and reads the stored copy again when
  it is stale: a batch re-run after a failure (the state store rolled back) gives the same output
  as the first run, and so does a shard run by another worker process.

The differential test (tests/core/test_native_engine_differential.py) drives the same store
through random rule sets and streams against the Python engine."""

from __future__ import annotations

import copy
import json
import math
import os
import pickle
import time
import zlib
from typing import Any

import pyarrow as pa
import pytest

from cep.compile import compile_rules
from cep.runtime.alerts import alert_record
from cep.runtime.bind import build_embedded_engine, build_engine, engine_kind
from cep.runtime.engine import NEG_INF, Event, MemoryKeyStore
from cep.runtime.state_store import NativeShardStore, SharedRows, _Meta, unzip_row
from tests.runtime.test_bucket_store import DictValueState


class DictLogState:
    """Spark's MapState calls over a dict of the native store's log rows (row number ->
    (blob, token it was appended onto)), each call counted: a state-server round trip."""

    def __init__(self) -> None:
        self.map: dict[int, Any] = {}
        self.calls = 0

    @property
    def rows(self) -> list[Any]:
        """The rows' values in row order (settable: a rollback)."""
        return [self.map[i] for i in sorted(self.map)]

    @rows.setter
    def rows(self, values: list[Any]) -> None:
        self.map = dict(enumerate(values))

    @property
    def blobs(self) -> list[bytes]:
        """The rows' blobs as the core wrote them (stored compressed since layout 3)."""
        return [unzip_row(v[0]) for v in self.rows]

    def getValue(self, k: tuple[int]) -> Any:  # noqa: N802 - Spark's names
        self.calls += 1
        return self.map.get(k[0])

    def updateValue(self, k: tuple[int], v: Any) -> None:  # noqa: N802
        self.calls += 1
        self.map[k[0]] = v

    def iterator(self) -> Any:
        self.calls += 1
        return iter([((k,), v) for k, v in self.map.items()])

    def clear(self) -> None:
        self.calls += 1
        self.map = {}


class DictListState:
    """Spark's ListState calls over a list (each call counted: a state-server round trip): the
    native store's log until session 15 (layout 1)."""

    def __init__(self) -> None:
        self.rows: list[Any] = []
        self.calls = 0

    def get(self) -> Any:
        self.calls += 1
        return iter(list(self.rows))

    def put(self, rows: list[Any]) -> None:
        self.calls += 1
        self.rows = list(rows)

    def appendList(self, rows: list[Any]) -> None:  # noqa: N802 - Spark's name
        self.calls += 1
        self.rows += rows

    def clear(self) -> None:
        self.calls += 1
        self.rows = []

RULES = compile_rules("""
STREAM s TIME BY ts LATENESS 5ms;
RULE pair FROM s PARTITION BY k PATTERN (a b) DEFINE b AS b.v > a.v WITHIN 1h EMIT 'up';
RULE many FROM s PARTITION BY k PATTERN (x{3}) WITHIN 1h EMIT 'three';
""", "t.cep")

EDGE_VALUES = [
    2**63 - 1, -2**63, 2**63, 2**70, -(2**80), 0.1, 1e-300, 1e300, -0.0, 5, 5.0, "é\u2028\"\\",
    "\ud83d\ude00", True, False, None, [1, [2.5, "x"]], {"n": {"m": None}}, 12345678901234567890,
]


def _texts() -> list[tuple[str, str]]:
    """(key, JSON text) per event: the edge values, a repeated field, NaN and Infinity."""
    out = [(f"k{i % 3}", json.dumps({"ts": 10 * i, "k": f"k{i % 3}", "v": i, "p": v}))
           for i, v in enumerate(EDGE_VALUES)]
    n = len(out)
    out.append(("k0", f'{{"ts": {10 * n}, "k": "k0", "v": 1, "v": {n}, "p": NaN}}'))
    out.append(("k1", f'{{"ts": {10 * n + 10}, "k": "k1", "v": {n + 1}, "p": -Infinity}}'))
    return out


def _batch(texts: list[tuple[str, str]], start: int) -> pa.RecordBatch:
    ts = [json.loads(t)["ts"] for _, t in texts]
    return pa.RecordBatch.from_pydict({
        "stream": ["s"] * len(texts), "ts": pa.array(ts, pa.int64()),
        "seq": pa.array(range(start, start + len(texts)), pa.int64()),
        "data": [t for _, t in texts], "route": ["k"] * len(texts)})


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and (a == b if not isinstance(a, dict | list) else
                                   json.dumps(a) == json.dumps(b))


def _records(engine: Any, out: Any) -> list[dict[str, Any]]:
    return [alert_record(engine, r) for r in out.matches]


def test_the_core_reads_json_as_json_loads_does_through_state_bytes() -> None:
    native = build_embedded_engine(RULES)
    assert engine_kind(native) == "native"
    python = build_engine(RULES, use_native=False)
    texts = _texts()
    buckets, meta, held = DictLogState(), DictValueState(), {}
    py_store, got, want, max_ts = MemoryKeyStore(), [], [], NEG_INF
    for i in range(0, len(texts), 4):  # every call reloads the shard from its bytes
        chunk = texts[i:i + 4]
        store = NativeShardStore(buckets, meta, held)
        store.begin(("s",), native)
        got += native.ingest_batch(store, _batch(chunk, i), max_ts).matches
        store.flush()
        held.clear()
        events = [Event("s", json.loads(t)["ts"], i + j, json.loads(t), "k")
                  for j, (_, t) in enumerate(chunk)]
        want += python.ingest(py_store, events, max_ts).matches
        max_ts = max(max_ts, *(e.ts for e in events))
    store = NativeShardStore(buckets, meta, held)
    store.begin(("s",), native)
    got += native.advance(store, max_ts, end_of_input=max_ts).matches
    store.flush()
    want += python.advance(py_store, max_ts, end_of_input=max_ts).matches
    assert len(got) == len(want) > 5
    for g, w in zip(got, want, strict=True):
        assert (g.rule_id, g.key, g.first_ts, g.last_ts) == (w.rule_id, w.key, w.first_ts,
                                                            w.last_ts)
        for ge, we in zip(g.events, w.events, strict=True):
            assert ge.event.keys() == we.event.keys()
            assert all(_same(ge.event[f], we.event[f]) for f in we.event), (ge.event, we.event)
    assert stored_keys(native, buckets) == 0  # the log, replayed, holds no key


def stored_keys(engine: Any, log: DictLogState) -> int:
    """How many keys the stored log holds once replayed (it keeps tombstones until compacted)."""
    from cep import _core

    replayed = _core.EngineState()
    for blob in log.blobs:
        engine.core.import_blob(replayed, blob)
    return len(replayed)


def _call(engine: Any, buckets: Any, meta: Any, held: dict[Any, Any], rb: Any, max_ts: int,
          shared: SharedRows | None = None) -> tuple[Any, NativeShardStore]:
    """One call of a worker process (its held copies `held`, its `shared` hand-over): the
    call's (records, wake), and the store (its counters)."""
    store = NativeShardStore(buckets, meta, held, shared=shared)
    store.begin(("s",), engine)
    out = engine.ingest_batch(store, rb, max_ts)
    wake = engine.next_wake(store)
    store.flush()
    return (_records(engine, out), wake), store


def _run(engine: Any, buckets: Any, meta: Any, held: dict[Any, Any], rb: Any, max_ts: int,
         ) -> tuple[list[dict[str, Any]], int | None]:
    return _call(engine, buckets, meta, held, rb, max_ts)[0]


def _calls(n: int) -> list[tuple[Any, int]]:
    """`_stream(n)` as calls of 20 events, each with the watermark before it."""
    texts = _stream(n)
    return [(_batch(texts[i:i + 20], i), 3 * i - 10 if i else NEG_INF) for i in range(0, n, 20)]


def _one_process(engine: Any, calls: list[tuple[Any, int]]) -> list[Any]:
    """What one process that always holds the shard gives for each of `calls`."""
    log, meta, held = DictLogState(), DictValueState(), {}
    return [_run(engine, log, meta, held, rb, m) for rb, m in calls]


def _stream(n: int) -> list[tuple[str, str]]:
    return [(f"k{i % 7}", json.dumps({"ts": 3 * i, "k": f"k{i % 7}", "v": (i * 37) % 11}))
            for i in range(n)]


@pytest.mark.parametrize("how", ["rolled back", "another worker"])
def test_a_stale_held_copy_is_never_used(how: str) -> None:
    """Batch 2 runs, then (rolled back) the state store goes back to before it and the batch
    runs again in the same process — or (another worker) a second process, holding its own
    copy from batch 1, runs batch 3 after this one ran batch 2. Both see what the store holds."""
    engine = build_embedded_engine(RULES)
    texts = _stream(60)
    b1, b2, b3 = _batch(texts[:20], 0), _batch(texts[20:40], 20), _batch(texts[40:], 40)
    buckets, meta, held = DictLogState(), DictValueState(), {}
    _run(engine, buckets, meta, held, b1, NEG_INF)
    if how == "rolled back":
        saved = copy.deepcopy((buckets.rows, meta.v))
        first = _run(engine, buckets, meta, held, b2, 57)
        buckets.rows, meta.v = copy.deepcopy(saved)  # the batch failed after the operator ran
        again = _run(engine, buckets, meta, held, b2, 57)
        assert again == first and first[0]
    else:
        other: dict[Any, Any] = {}
        _run(engine, buckets, meta, other, _batch([], 0), NEG_INF)  # `other` holds batch 1
        _run(engine, buckets, meta, held, b2, 57)
        got = _run(engine, buckets, meta, other, b3, 117)
        # The reference: one process, its copy always current.
        ref_b, ref_m, ref_h = DictLogState(), DictValueState(), {}
        for rb, m in ((b1, NEG_INF), (b2, 57)):
            _run(engine, ref_b, ref_m, ref_h, rb, m)
        assert got == _run(engine, ref_b, ref_m, ref_h, b3, 117) and got[0]


@pytest.mark.parametrize("how", ["ahead after a rollback", "compacted by another",
                                 "held long ago", "rules changed"])
def test_a_held_copy_catches_up_only_from_its_own_token(how: str) -> None:
    """Process A holds the shard; the store then changes behind its back: a failed batch A
    wrote is rolled back and re-run by B with other input (A's copy is ahead: its token is in
    no store), or B compacts the log (rows renumbered from 0) and appends after it so the log
    has more rows than A's copy, or B runs it for many batches (compactions, appends), or the
    rules change. A's next call must give what one process that always held the store's state
    gives (a catch-up that only compared row counts would import B's last rows onto the wrong
    base)."""
    engine = build_embedded_engine(RULES)
    texts = _stream(200)
    other = [(k, json.dumps({**json.loads(t), "v": 10 - json.loads(t)["v"]}))
             for k, t in texts[20:40]]
    b1, b2, b2x = _batch(texts[:20], 0), _batch(texts[20:40], 20), _batch(other, 20)
    # Later batches touch keys k0-k2 only: the others' records stay those of b1 / b2.
    few = [t for t in texts if json.loads(t[1])["k"] in ("k0", "k1", "k2")]
    later = [(_batch(few[i:i + 6], i), json.loads(few[i][1])["ts"] - 10)
             for i in range(20, 62, 6)]
    last = (_batch(texts[180:], 180), 3 * 180 - 10)
    log, meta, a, b = DictLogState(), DictValueState(), {}, {}
    _run(engine, log, meta, a, b1, NEG_INF)
    plan: list[tuple[Any, int]] = [(b2, 57)] + later[:1]
    if how == "ahead after a rollback":
        saved = copy.deepcopy((log.map, meta.v))
        _run(engine, log, meta, a, b2x, 57)  # A's attempt: its copy now holds b2x
        log.map, meta.v = copy.deepcopy(saved)  # the batch failed: the store goes back
        _run(engine, log, meta, b, b2, 57)  # B runs the batch again (from the store)
        _run(engine, log, meta, b, *later[0])
        assert len(log.rows) > a[("s",)].rows  # the log grew past A's rows
    elif how == "compacted by another":
        _run(engine, log, meta, b, b2, 57)
        b[("s",)].compact = True  # B's next flush rewrites the log from row 0
        _run(engine, log, meta, b, *later[0])
        _run(engine, log, meta, b, *later[1])
        _run(engine, log, meta, b, *later[2])
        plan += later[1:3]
        assert len(log.rows) > a[("s",)].rows and log.rows[0][1] == b""
    elif how == "held long ago":
        for i, (rb, m) in enumerate([(b2, 57), *later]):
            if i % 3 == 2:
                b[("s",)].compact = True
            _run(engine, log, meta, b, rb, m)
        plan += later[1:]
    else:
        _run(engine, log, meta, a, b2, 57)
        _run(engine, log, meta, a, *later[0])
        engine = build_embedded_engine(compile_rules(
            "STREAM s TIME BY ts LATENESS 5ms;\nRULE pair FROM s PARTITION BY k "
            "PATTERN (a b) DEFINE b AS b.v > a.v WITHIN 1h EMIT 'up';", "t.cep"))
    got = _run(engine, log, meta, a, *last)
    ref_log, ref_meta, ref = DictLogState(), DictValueState(), {}
    for rb, m in [(b1, NEG_INF), *plan]:
        _run(engine, ref_log, ref_meta, ref, rb, m)
    want = _run(engine, ref_log, ref_meta, ref, *last)
    assert got == want and want[0], how
    # What the copies hold: each key's pending matches, completed by one more event each.
    probe = _batch([(f"k{j}", json.dumps({"ts": 700, "k": f"k{j}", "v": 99}))
                    for j in range(7)], 200)
    assert _run(engine, log, meta, a, probe, 600) == _run(engine, ref_log, ref_meta, ref,
                                                          probe, 600)


@pytest.mark.parametrize("behind", [3, 4])
def test_a_copy_too_far_behind_is_reloaded_in_one_read(behind: int,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Process A holds the shard; B then runs it `behind` calls, each appending a row. Up to
    `CATCH_UP_ROWS` rows behind (3 here), A's copy catches up with one state read per row; past
    it, A reloads the whole log with one read (the map's iterator), not a read per row. Either
    way A's next call gives what one process that always held the store's state gives."""
    monkeypatch.setattr(NativeShardStore, "CATCH_UP_ROWS", 3)
    engine = build_embedded_engine(RULES)
    batches = _calls(120)
    log, meta, a, b = DictLogState(), DictValueState(), {}, {}
    _run(engine, log, meta, a, *batches[0])
    for rb, m in batches[1:1 + behind]:
        _run(engine, log, meta, b, rb, m)
    assert len(log.rows) == 1 + behind and a[("s",)].rows == 1
    log.calls = 0
    store = NativeShardStore(log, meta, a)
    store.begin(("s",), engine)
    if behind <= 3:
        assert (store.catchups, store.reloads, store.reads, log.calls) == (1, 0, behind, behind)
    else:
        assert (store.catchups, store.reloads, store.reads, log.calls) == (0, 1, 1 + behind, 1)
    rb, m = batches[1 + behind]
    got = _records(engine, engine.ingest_batch(store, rb, m)), engine.next_wake(store)
    store.flush()
    ref_log, ref_meta, ref = DictLogState(), DictValueState(), {}
    for x in batches[:1 + behind]:
        _run(engine, ref_log, ref_meta, ref, *x)
    assert got == _run(engine, ref_log, ref_meta, ref, rb, m) and got[0]


def test_the_registered_timer_is_the_records_whoever_moved_it() -> None:
    """The store's record names the shard's registered timer, and a call takes it from there
    even when its held copy is current: another process may have moved the timer without
    appending a row (the token unchanged), and a failed batch rolls the record back with
    Spark's timers. A held copy's own idea of the timer would leave the operator thinking a
    timer is registered that is not (its alerts never released) or the reverse."""
    engine = build_embedded_engine(RULES)
    log, meta, a, b = DictLogState(), DictValueState(), {}, {}

    def call(held: dict[Any, Any], timer: Any = None, rb: Any = None) -> Any:
        store = NativeShardStore(log, meta, held)
        store.begin(("s",), engine)
        seen = store.timer
        if rb is not None:
            engine.ingest_batch(store, rb, NEG_INF)
        if timer is not None:
            store.timer = timer
        store.flush()
        return seen

    assert call(a, 100, _batch(_stream(20), 0)) is None  # a new shard: no timer
    assert call(b) == 100  # B reloads: the record's timer, no listing needed
    token = meta.v
    call(b, 250)  # B moves only the timer: no row, the same token
    assert _Meta.read(meta.v[0]).token == _Meta.read(token[0]).token
    saved = copy.deepcopy(meta.v)
    assert call(a) == 250  # A's copy is current (same token): the timer is the record's
    call(a, 400)
    meta.v = saved  # that batch failed: the record (and Spark's timers) go back
    assert call(a) == 250 and call(b) == 250


def test_an_unchanged_shard_costs_one_state_read() -> None:
    engine = build_embedded_engine(RULES)
    buckets, meta, held = DictLogState(), DictValueState(), {}
    _run(engine, buckets, meta, held, _batch(_stream(300), 0), NEG_INF)
    buckets.calls = 0
    store = NativeShardStore(buckets, meta, held)
    store.begin(("s",), engine)
    engine.ingest_batch(store, _batch([], 0), 10)  # nothing due yet
    store.flush()
    assert buckets.calls == 0 and store.reloads == 0
    assert buckets.rows  # the 7 keys' states are stored


def test_the_log_is_compacted_and_reloads_to_the_same_state() -> None:
    engine = build_embedded_engine(RULES)
    texts = _stream(3_000)
    log, meta, held = DictLogState(), DictValueState(), {}
    for i in range(0, 3_000, 30):  # 100 calls: the log passes 64 rows and is compacted
        _run(engine, log, meta, held, _batch(texts[i:i + 30], i), 3 * i - 10)
    assert len(log.rows) < 64
    want = _run(engine, log, meta, held, _batch(_stream(3_050)[3_000:], 3_000), 9_000)
    assert want[0]
    # The same call from the stored log alone (another process): the same alerts.
    log2, meta2 = DictLogState(), DictValueState()
    held.clear()
    for i in range(0, 3_000, 30):
        _run(engine, log2, meta2, held, _batch(texts[i:i + 30], i), 3 * i - 10)
    held.clear()
    assert _run(engine, log2, meta2, held, _batch(_stream(3_050)[3_000:], 3_000), 9_000) == want


def _keys_stream(n: int, keys: int, start: int) -> list[tuple[str, str]]:
    return [(f"k{i % keys}", json.dumps({"ts": 3 * i, "k": f"k{i % keys}", "v": (i * 37) % 11}))
            for i in range(start, start + n)]


@pytest.mark.parametrize(("keys", "compacted"), [(10**9, False), (50, True)])
def test_a_log_is_compacted_when_its_records_are_superseded(keys: int, compacted: bool) -> None:
    """New keys each call (`keys` past the events: nearly every record is a key's only one)
    leave nothing to compact; the same 50 keys rewritten every call supersede their records,
    and the log is rewritten as the current keys. Either way a reload gives the same state."""
    engine = build_embedded_engine(RULES)
    log, meta, held = DictLogState(), DictValueState(), {}
    calls, per, compactions = 12, 40, 0
    for c in range(calls):
        store = NativeShardStore(log, meta, held)
        store.COMPACT_SLACK = 100
        store.begin(("s",), engine)
        engine.ingest_batch(store, _batch(_keys_stream(per, keys, c * per), c * per), NEG_INF)
        store.flush()
        compactions += store.compactions
    assert (compactions > 0) == compacted
    live = len(held[("s",)].state)
    records = sum(int.from_bytes(b[7:11], "little") for b in log.blobs)
    if compacted:
        assert records <= 2 * live + 100 and len(log.rows) < calls
    else:
        # (a few keys of the previous call are written again: events held for LATENESS)
        assert live == calls * per <= records < live + 3 * calls and len(log.rows) == calls
    assert stored_keys(engine, log) == live  # the log replays to the held keys


class WatchedValueState(DictValueState):
    """A ValueState that counts its round trips and the `get`s of an empty value (Spark's state
    server logs a WARN for each: 64 lines on a new live job's first batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.empty_gets = 0

    def get(self) -> Any:
        self.calls += 1
        self.empty_gets += self.v is None
        return super().get()

    def exists(self) -> bool:
        self.calls += 1
        return super().exists()


def test_a_new_shard_never_gets_an_empty_value_and_a_held_one_reads_once() -> None:
    engine = build_embedded_engine(RULES)
    texts = _stream(90)
    log, meta, held, other = DictLogState(), WatchedValueState(), {}, {}
    _run(engine, log, meta, held, _batch(texts[:30], 0), NEG_INF)  # a new shard
    _run(engine, DictLogState(), meta2 := WatchedValueState(), {}, _batch([], 0), NEG_INF)
    assert meta.empty_gets == 0 and meta2.empty_gets == 0
    meta.calls = 0
    _run(engine, log, meta, held, _batch(texts[30:60], 30), 80)  # held: one get, no exists
    assert meta.calls == 1
    _run(engine, log, meta, other, _batch(texts[60:], 60), 170)  # another process: reloads
    assert meta.empty_gets == 0


def test_the_decoded_keys_budget_is_split_over_the_jobs_shards() -> None:
    """Fewer shards, more keys decoded each: a job holds as many decoded as at 8 shards."""
    per = NativeShardStore.KEEP_DECODED
    assert NativeShardStore.for_shards(8) == per == NativeShardStore.DECODED_PER_JOB // 8
    assert NativeShardStore.for_shards(2) == 4 * per
    assert NativeShardStore.for_shards(64) == NativeShardStore.for_shards(None) == per
    store = NativeShardStore(DictLogState(), DictValueState(), {}, NativeShardStore.for_shards(2))
    assert store.keep_decoded == 4 * per


def test_a_blob_of_another_version_fails_with_the_cores_message() -> None:
    """A log written by a build with another blob format: the core's message (the version,
    what to do), not a bare header error; `blob_records` alone refuses it too."""
    from cep._core import BLOB_VERSION  # type: ignore[attr-defined]

    from cep.runtime.state_store import blob_records

    engine = build_embedded_engine(RULES)
    log, meta, held = DictLogState(), DictValueState(), {}
    _run(engine, log, meta, held, _batch(_stream(30), 0), NEG_INF)
    blob = log.blobs[0]
    assert blob_records(blob) > 0 and int.from_bytes(blob[5:7], "little") == BLOB_VERSION
    log.rows = [(blob[:5] + (BLOB_VERSION + 1).to_bytes(2, "little") + blob[7:], b"")]
    held.clear()
    other = f"format version {BLOB_VERSION + 1}"
    with pytest.raises(ValueError, match=f"{other}.*reset the checkpoint"):
        NativeShardStore(log, meta, held).begin(("s",), engine)
    with pytest.raises(ValueError, match=other):
        blob_records(log.blobs[0])
    with pytest.raises(ValueError, match="wrong header"):
        blob_records(b"CEPNK" + blob[5:])


@pytest.mark.parametrize(("keys", "compacted"), [(10**9, False), (50, True)])
def test_the_logs_bytes_are_bounded_by_a_few_snapshots(keys: int, compacted: bool) -> None:
    """The byte backstop alone (the records and rows triggers off, no slack bytes): the same 50
    keys rewritten every call pass four snapshots' bytes and are compacted; new keys each call
    (each record a key's only one: the log is one snapshot) never are."""
    engine = build_embedded_engine(RULES)
    log, meta, held = DictLogState(), DictValueState(), {}
    calls, per, compactions = 12, 40, 0
    for c in range(calls):
        store = NativeShardStore(log, meta, held)
        store.COMPACT_SLACK = store.COMPACT_ROWS = 10**9
        store.COMPACT_SLACK_BYTES = 0
        store.begin(("s",), engine)
        engine.ingest_batch(store, _batch(_keys_stream(per, keys, c * per), c * per), NEG_INF)
        store.flush()
        compactions += store.compactions
        size = sum(len(b) for b in log.blobs)
        assert held[("s",)].size == size
    assert (compactions > 0) == compacted
    if compacted:  # the log is at most 4 snapshots and one call's records
        snapshot = sum(len(b) for b in engine.core.export_blobs(held[("s",)].state, True))
        assert size <= 5 * snapshot
    else:
        assert len(log.rows) == calls
    assert stored_keys(engine, log) == len(held[("s",)].state)


@pytest.mark.parametrize("due", [0, 12_345])
def test_a_layout_1_store_restarts_and_is_rewritten_as_rows(due: int) -> None:
    """Until session 15 the log was a ListState and the record a bare pickled (token, rows,
    bytes, due) (`due` the bytes at the last compaction until session 12): a store written so
    restarts (another process) to the alerts of one that never stopped, and its first flush
    rewrites it as layout 2 rows and clears the old list."""
    from cep.runtime.state_store import LOG_LAYOUT, META_MAGIC

    engine = build_embedded_engine(RULES)
    texts = _stream(60)
    log, meta, held = DictLogState(), DictValueState(), {}
    _run(engine, log, meta, held, _batch(texts[:20], 0), NEG_INF)
    _run(engine, log, meta, held, _batch(texts[20:40], 20), 57)
    old_log, old_meta = DictListState(), DictValueState()
    old_log.rows = [(b,) for b in log.blobs]
    old_meta.v = (pickle.dumps((b"t" * 8, len(log.blobs), sum(map(len, log.blobs)), due),
                               protocol=5),)
    b3 = _batch(texts[40:], 40)
    want = _run(engine, log, meta, held, b3, 117)[0]
    rows = DictLogState()
    store = NativeShardStore(rows, old_meta, {}, old_log=old_log)
    store.begin(("s",), engine)
    got = _records(engine, engine.ingest_batch(store, b3, 117))
    store.flush()
    assert got == want and want and store.reloads == 1 and store.compactions == 1
    assert old_log.rows == [] and rows.rows and all(prev == b"" for _, prev in rows.rows)
    assert old_meta.v[0].startswith(META_MAGIC + LOG_LAYOUT.to_bytes(2, "little"))
    assert stored_keys(engine, rows) == stored_keys(engine, log)
    # Without the old list's handle, a layout 1 store is refused with what to do.
    with pytest.raises(ValueError, match="layout 1.*reset the checkpoint"):
        NativeShardStore(DictLogState(), old_meta_again(log), {}).begin(("s",), engine)


def old_meta_again(log: DictLogState) -> DictValueState:
    meta = DictValueState()
    meta.v = (pickle.dumps((b"t" * 8, len(log.rows), 1, 0), protocol=5),)
    return meta


def test_a_store_of_another_layout_is_refused_with_what_to_do() -> None:
    from cep.runtime.state_store import LOG_LAYOUT, META_MAGIC

    engine = build_embedded_engine(RULES)
    log, meta, held = DictLogState(), DictValueState(), {}
    _run(engine, log, meta, held, _batch(_stream(30), 0), NEG_INF)
    meta.v = (META_MAGIC + (LOG_LAYOUT + 1).to_bytes(2, "little") + meta.v[0][7:],)
    with pytest.raises(ValueError, match=f"layout {LOG_LAYOUT + 1}.*reset the checkpoint"):
        NativeShardStore(log, meta, {}).begin(("s",), engine)


@pytest.mark.parametrize(("keys", "first_at"), [(10**9, 10), (50, 4)])
def test_the_row_bound_compacts_early_only_what_has_superseded_records(
        keys: int, first_at: int) -> None:
    """Past `COMPACT_ROWS` rows a log is compacted once more than half its records are
    superseded (the same 50 keys every call); a log of new keys only at `MAX_ROWS` rows, and
    a reload never reads more."""
    engine = build_embedded_engine(RULES)
    log, meta, held = DictLogState(), DictValueState(), {}
    at = []
    for c in range(24):
        store = NativeShardStore(log, meta, held)
        store.COMPACT_ROWS, store.MAX_ROWS = 4, 10
        rows = len(log.rows)
        store.begin(("s",), engine)
        engine.ingest_batch(store, _batch(_keys_stream(40, keys, c * 40), c * 40), NEG_INF)
        store.flush()
        if store.compactions:
            at.append(rows)
        assert len(log.rows) <= 10
    assert at and at[0] == first_at and all(r >= 4 for r in at)
    assert stored_keys(engine, log) == len(held[("s",)].state)


class TaskHandles:
    """One task's ListState and ValueState handles over several shards, as Spark gives them to
    the operator: each call reads and writes the state of the shard it is for (`at`)."""

    def __init__(self, shards: int) -> None:
        self.logs = [DictLogState() for _ in range(shards)]
        self.metas = [DictValueState() for _ in range(shards)]
        self.at = 0
        handles = self

        class Handle:
            def __init__(self, states: list[Any]) -> None:
                self.states = states

            def __getattr__(self, name: str) -> Any:
                return getattr(self.states[handles.at], name)

        self.log, self.meta = Handle(self.logs), Handle(self.metas)


def _tasks(engine: Any, shards: int, tasks: int, held: dict[Any, Any],
           **policy: int) -> tuple[TaskHandles, list[list[int]]]:
    """`tasks` micro-batches of one task each calling every shard in turn (the live job: one
    stateful task, one store per task), the same 50 keys per shard rewritten every call.
    Returns the handles and, per task, the shards it compacted."""
    h = TaskHandles(shards)
    compacted = []
    for t in range(tasks):
        store = NativeShardStore(h.log, h.meta, held)
        for name, value in policy.items():
            setattr(store, name, value)
        got = []
        for s in range(shards):
            h.at = s
            before = store.compactions
            store.begin((f"s{s}",), engine)
            engine.ingest_batch(store, _batch(_keys_stream(40, 50, t * 40), t * 40), NEG_INF)
            store.flush()
            if store.compactions > before:
                got.append(s)
        compacted.append(got)
    return h, compacted


def test_a_task_compacts_one_shard_and_the_others_follow_in_later_tasks() -> None:
    """Shards that grow alike pass the compaction bound in the same call; a task compacts one
    of them, every second task (`COMPACT_GAP`), the others in turn (the live job's 8 shards were
    all rewritten in one micro-batch). Each shard's log still replays to its held keys, and a
    process that reloads the shards gives the same alerts as the one holding them."""
    engine = build_embedded_engine(RULES)
    held: dict[Any, Any] = {}
    h, compacted = _tasks(engine, 8, 40, held, COMPACT_SLACK=100)
    assert all(len(c) <= 1 for c in compacted)
    assert not any(a and b for a, b in zip(compacted, compacted[1:]))  # never two in a row
    firsts = [next(t for t, c in enumerate(compacted) if s in c) for s in range(8)]
    assert firsts == list(range(firsts[0], firsts[0] + 16, 2))  # in turn
    _, every_task = _tasks(engine, 8, 24, {}, COMPACT_SLACK=100, COMPACT_GAP=1)
    assert [c for c in every_task if c][:8] == [[s] for s in range(8)]
    next_batch = _batch(_keys_stream(40, 50, 40 * 40), 40 * 40)
    for s in range(8):
        assert stored_keys(engine, h.logs[s]) == len(held[(f"s{s}",)].state)
        outs = []
        for handles, process in (((copy.deepcopy(h.logs[s]), copy.deepcopy(h.metas[s])), {}),
                                 ((h.logs[s], h.metas[s]), held)):
            store = NativeShardStore(*handles, process)
            store.begin((f"s{s}",), engine)
            outs.append(_records(engine, engine.ingest_batch(store, next_batch, 4_000)))
            assert store.reloads == (process is not held)
        assert outs[0] == outs[1] and outs[0]


def test_a_deferred_compaction_waits_at_most_compact_defer_calls() -> None:
    """With 8 shards due at once and `COMPACT_DEFER` 2, the shards that waited two calls are
    compacted whatever the process did just before: a log is never more than that many calls
    past its bound."""
    engine = build_embedded_engine(RULES)
    held: dict[Any, Any] = {}
    _, compacted = _tasks(engine, 8, 12, held, COMPACT_SLACK=100, COMPACT_DEFER=2)
    first = next(t for t, c in enumerate(compacted) if c)
    assert compacted[first] == [0] and compacted[first + 1] == []
    assert compacted[first + 2] == [1, 2, 3, 4, 5, 6, 7]  # 1: its turn; the others waited 2
    assert all(h.due <= 2 for h in held.values())


def test_a_deferred_compaction_is_bounded_when_tasks_alternate_between_processes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark may give a batch's task to another worker process: each call then reloads its
    shard. The calls a shard waited for its compaction are counted in the store, not only in the
    process, so every log is still compacted within `COMPACT_DEFER` calls of being due."""
    from cep.runtime import state_store

    engine = build_embedded_engine(RULES)
    h = TaskHandles(8)
    processes: list[tuple[dict[Any, Any], Any]] = [({}, state_store._Turns()) for _ in range(2)]
    compacted, longest, caught_up = [0] * 8, 0, 0
    for t in range(40):
        held, turns = processes[t % 2]
        monkeypatch.setattr(state_store, "_TURNS", turns)
        store = NativeShardStore(h.log, h.meta, held)
        store.COMPACT_SLACK, store.COMPACT_DEFER = 100, 4  # type: ignore[misc]
        for s in range(8):
            h.at = s
            before = store.compactions
            store.begin((f"s{s}",), engine)
            engine.ingest_batch(store, _batch(_keys_stream(40, 50, t * 40), t * 40), NEG_INF)
            store.flush()
            compacted[s] += store.compactions - before
            longest = max(longest, len(h.logs[s].rows))
        # Each call's held copy is behind: caught up (the other process appended), or reloaded
        # (first call, or the other process compacted since)
        assert store.reloads + store.catchups == 8
        caught_up += store.catchups
    assert min(compacted) >= 3 and longest <= 12 and caught_up > 8 * 40 // 2


def test_a_log_back_within_its_bounds_no_longer_waits() -> None:
    """A shard counted as waiting for its turn whose log is not due (new keys can bring a log
    back within its bounds) waits no more, in the process and in the store: it keeps no other
    shard waiting."""
    engine = build_embedded_engine(RULES)
    held: dict[Any, Any] = {}
    log, meta = DictLogState(), DictValueState()
    store = NativeShardStore(log, meta, held)
    store.begin(("s",), engine)
    engine.ingest_batch(store, _batch(_keys_stream(40, 50, 0), 0), NEG_INF)
    store.flush()
    held[("s",)].due = 5  # as if it had waited five calls
    store.begin(("s",), engine)
    engine.ingest_batch(store, _batch(_keys_stream(40, 50, 40), 40), NEG_INF)
    store.flush()
    assert store.compactions == 0 and held[("s",)].due == 0
    assert _Meta.read(meta.get()[0]).due == 0


def test_a_layout_2_log_of_raw_rows_goes_on_as_layout_3() -> None:
    """Layout 3 stores rows compressed; a layout 2 store (session 15: raw rows) is read as it is
    by another process and continued, its new rows compressed, and gives the alerts of one
    process that always held the shard. A compressed row that does not expand fails with what
    to do."""
    from cep.runtime.state_store import LOG_LAYOUT, META_MAGIC, ROW_ZIP_MAGIC

    engine = build_embedded_engine(RULES)
    batches = _calls(120)
    log, meta = DictLogState(), DictValueState()
    for rb, m in batches[:3]:
        _run(engine, log, meta, {}, rb, m)
    assert LOG_LAYOUT == 3 and all(v[0].startswith(ROW_ZIP_MAGIC) for v in log.rows)
    assert sum(len(v[0]) for v in log.rows) < sum(len(b) for b in log.blobs)
    # As session 15 wrote it: raw rows, a layout 2 record.
    log.map = {i: (unzip_row(v[0]), v[1]) for i, v in log.map.items()}
    meta.v = (META_MAGIC + (2).to_bytes(2, "little") + meta.v[0][7:],)
    got = [_run(engine, log, meta, {}, rb, m) for rb, m in batches[3:]]
    assert not log.rows[0][0].startswith(ROW_ZIP_MAGIC) and log.rows[-1][0].startswith(
        ROW_ZIP_MAGIC)
    want = _one_process(engine, batches)[3:]
    assert got == want and any(g[0] for g in got)
    log.map[0] = (ROW_ZIP_MAGIC + b"\x10\x00\x00\x00garbage", log.map[0][1])
    with pytest.raises(ValueError, match="does not expand.*reset it or replay"):
        _run(engine, log, meta, {}, *batches[0])


def _shared_call(engine: Any, log: Any, meta: Any, held: dict[Any, Any], shared: Any, rb: Any,
                 max_ts: int) -> tuple[Any, NativeShardStore]:
    return _call(engine, log, meta, held, rb, max_ts, shared)


Worker = tuple[dict[Any, Any], SharedRows]


def _two_workers(path: str) -> tuple[Worker, Worker, DictLogState, DictValueState]:
    """Two worker processes (each its held copies and its `SharedRows` over `path`) and the
    shard's state they take turns on."""
    return ({}, SharedRows(path)), ({}, SharedRows(path)), DictLogState(), DictValueState()


def _gives_what_one_process_gives(engine: Any, calls: list[tuple[Any, int]], k: int,
                                  got: Any) -> None:
    want = _one_process(engine, calls)
    assert got == want[k] and any(r for r, _ in want)


def test_a_catch_up_takes_the_other_workers_rows_from_its_hand(tmp_path: Any) -> None:
    """Two worker processes (each its held copies and `SharedRows` over one directory) take
    turns on a shard, 1 to 3 calls each: every catch-up takes the rows the other appended from
    its files (no state read of a row) and every call gives what one process that always held
    the shard gives. The files do not pile up: a writer keeps its last `KEEP` per shard."""
    engine = build_embedded_engine(RULES)
    calls = _calls(240)
    turns = [0, 1, 1, 0, 0, 0, 1, 0, 1, 1, 1, 0]  # catch-ups of 1, 2, 3 rows
    *procs, log, meta = _two_workers(str(tmp_path))
    ref_log, ref_meta, ref = DictLogState(), DictValueState(), {}
    behind = [0, 0]
    caught, alerts = [], 0
    for p, (rb, m) in zip(turns, calls, strict=True):
        got, store = _shared_call(engine, log, meta, *procs[p], rb, m)
        assert got == _run(engine, ref_log, ref_meta, ref, rb, m)
        alerts += len(got[0])
        if behind[p] and store.reloads == 0:
            assert (store.catchups, store.reads, store.shared_rows) == (1, 0, behind[p])
            caught.append(behind[p])
        behind[p], behind[1 - p] = 0, behind[1 - p] + 1
    assert sorted(set(caught)) == [1, 2, 3]
    assert alerts  # (a comparison of silent runs would pass)
    left = list(tmp_path.iterdir())
    assert len(left) == 2 * SharedRows.KEEP and not [f for f in left if f.suffix == ".tmp"]


@pytest.mark.parametrize("how", ["missing", "truncated", "rolled back", "damaged",
                                 "not importable"])
def test_a_catch_up_reads_the_state_server_when_the_hand_over_does_not_chain(
        tmp_path: Any, how: str) -> None:
    """B holds the shard at A's first row. A's next row is handed over, then its file is lost
    (missing), cut short (truncated), its bytes damaged (the same length: the checksum does not
    match), or its batch rolled back and run again by A (the file of the discarded row stays;
    the re-run writes its own). B's catch-up takes a file only where the chain of tokens from
    its copy to the record's holds and the checksum matches: else it reads the rows from the
    state server; its call gives what one process gives either way. A well-formed file whose
    row does not import (a writer's bug; `_pack` over a damaged row) makes B reload the shard
    from the state server instead of failing its call."""
    engine = build_embedded_engine(RULES)
    calls = _calls(80)
    a, b, log, meta = _two_workers(str(tmp_path))
    _shared_call(engine, log, meta, *a, *calls[0])
    _shared_call(engine, log, meta, *b, *calls[1])  # B reloads: it holds row 1's token
    saved = copy.deepcopy((log.map, meta.v))
    before = set(tmp_path.iterdir())
    _shared_call(engine, log, meta, *a, *calls[2])
    (written,) = set(tmp_path.iterdir()) - before
    if how == "missing":
        written.unlink()
    elif how == "truncated":
        written.write_bytes(written.read_bytes()[:-3])
    elif how == "damaged":
        data = written.read_bytes()
        written.write_bytes(data[:-24] + bytes(24))
    elif how == "not importable":
        parsed = SharedRows._parse(written.read_bytes())
        assert parsed is not None
        prev, (row,) = parsed
        written.write_bytes(SharedRows._pack(prev, [row[:-24] + bytes(24)]))
    else:
        log.map, meta.v = copy.deepcopy(saved)  # the batch failed: the store goes back
        a[0].clear()
        _shared_call(engine, log, meta, *a, *calls[2])  # A runs it again (a new token)
    got, store = _shared_call(engine, log, meta, *b, *calls[3])
    shared = how == "rolled back"  # the re-run's own file chains; the discarded one is not read
    if how == "not importable":
        assert (store.catchups, store.reloads, store.shared_rows) == (0, 1, 1)
    else:
        assert (store.catchups, store.reads, store.shared_rows) == (1, 0 if shared else 1,
                                                                    int(shared))
    _gives_what_one_process_gives(engine, calls, 3, got)


def test_a_copy_ahead_of_the_store_never_takes_a_hand_over(tmp_path: Any) -> None:
    """A's attempt at a batch failed after its flush: A's copy is a row ahead of the store,
    which went back. B runs that batch again and the next: the store is now one row past A's
    copy by count, and the last file chains to B's rows, not to A's token. A must not take it
    (its copy holds the failed attempt's row): it reloads, and gives what one process gives."""
    engine = build_embedded_engine(RULES)
    calls = _calls(100)
    a, b, log, meta = _two_workers(str(tmp_path))
    _shared_call(engine, log, meta, *a, *calls[0])
    _shared_call(engine, log, meta, *a, *calls[1])
    saved = copy.deepcopy((log.map, meta.v))
    # A runs batch 2 with other input (a failed attempt's: its row is not the re-run's).
    _shared_call(engine, log, meta, *a, _batch(_stream(60)[40:59], 40), 50)
    log.map, meta.v = copy.deepcopy(saved)  # the batch failed: the store goes back
    _shared_call(engine, log, meta, *b, *calls[2])
    _shared_call(engine, log, meta, *b, *calls[3])
    got, store = _shared_call(engine, log, meta, *a, *calls[4])
    assert (store.reloads, store.catchups, store.shared_rows) == (1, 0, 0)
    _gives_what_one_process_gives(engine, calls, 4, got)


def test_a_hand_over_without_its_directory_reads_the_state_server(tmp_path: Any) -> None:
    """The directory is gone (or was never made, or is not writable): the writes fail quietly,
    and the catch-up reads the rows from the state server and gives what one process gives."""
    engine = build_embedded_engine(RULES)
    calls = _calls(60)
    gone = str(tmp_path / "gone")
    a, b, log, meta = _two_workers(gone)
    _shared_call(engine, log, meta, *a, *calls[0])
    _shared_call(engine, log, meta, *b, *calls[1])
    got, store = _shared_call(engine, log, meta, *a, *calls[2])
    assert (store.catchups, store.reads, store.shared_rows) == (1, 1, 0)
    _gives_what_one_process_gives(engine, calls, 2, got)
    assert not tmp_path.joinpath("gone").exists()


def test_a_writer_sweeps_the_files_left_by_processes_gone(tmp_path: Any) -> None:
    """Files older than `STALE_S` (a worker process that exited left them: its own deletes
    never come) are deleted by the next process's first write, temporary ones too; newer
    files, any process's, stay."""
    old = time.time() - 2 * SharedRows.STALE_S
    stale = [tmp_path / ("ab" * 8), tmp_path / f"{'cd' * 8}.123.tmp"]
    fresh = tmp_path / ("ef" * 8)
    for f in [*stale, fresh]:
        f.write_bytes(b"x")
    for f in stale:
        os.utime(f, (old, old))
    SharedRows(str(tmp_path)).put(("s",), b"p" * 8, b"t" * 8, [b"row"])
    assert sorted(f.name for f in tmp_path.iterdir()) == sorted([fresh.name, (b"t" * 8).hex()])


def test_a_worker_hands_over_in_sparks_local_directory(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Any) -> None:
    """Under the first of `SPARK_LOCAL_DIRS` (set by Spark for its Python workers); none
    outside Spark, nor when the directory cannot be made."""
    monkeypatch.delenv("SPARK_LOCAL_DIRS", raising=False)
    assert SharedRows.for_worker() is None
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{tmp_path / 'one'},{tmp_path / 'two'}")
    shared = SharedRows.for_worker()
    assert shared is not None and shared.path == str(tmp_path / "one" / "cep-shared-rows")
    assert os.path.isdir(shared.path) and not tmp_path.joinpath("two").exists()
    (tmp_path / "file").write_bytes(b"")
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "file"))
    assert SharedRows.for_worker() is None


def test_a_hand_over_file_is_taken_only_whole_and_of_its_version() -> None:
    """`_parse` gives back what `_pack` wrote, and None for a file cut short anywhere, a byte
    changed anywhere (the CRC-32), or another format version even with its checksum right."""
    prev, rows = b"p" * 8, [b"row one", b"r2" * 40]
    data = SharedRows._pack(prev, rows)
    assert SharedRows._parse(data) == (prev, rows)
    assert all(SharedRows._parse(data[:n]) is None for n in range(len(data)))
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x10
        assert SharedRows._parse(bytes(bad)) is None, i
    head = len(SharedRows.MAGIC) + 5
    other = bytearray(data)
    other[head - 5] = SharedRows.VERSION + 1
    assert zlib.crc32(other[head:]) == int.from_bytes(other[head - 4:head], "little")
    assert SharedRows._parse(bytes(other)) is None
