"""The engine's `KeyStore` over a shard's state in a stateful stream operator.

Plain logic: the two state handles it is given need only the calls of Spark's MapState
(`getValue`, `updateValue`, `removeKey`) and ValueState (`get`, `update`, `exists`, `clear`),
so it is tested with dicts (tests/runtime/test_bucket_store.py) and the Spark operator
(`cep.spark.operator`) hands it the real ones.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import time
import zlib
from dataclasses import dataclass
from typing import Any

from cep.runtime.engine import KeyState, StateKey, Wake


class MapStateKeyStore:
    """The engine's `KeyStore` over a shard's state: key states in buckets, one MapState entry
    per bucket, plus one `ValueState` with the shard's layout and wake index.

    Each state-server call costs ~0.1 ms (bench: `state_only`), far more than the engine spends
    on a key, so a call reads and writes buckets, not keys: a bucket is read at most once per
    call and written once if it changed (`flush`). The number of buckets doubles when they
    average more than `MAX_PER_BUCKET` keys, so a bucket stays small while a call that touches
    every key of the shard costs a few dozen state calls instead of thousands. Bucket of a key:
    crc32 of (group, key), stable across processes.
    """

    MIN_BUCKETS = 8
    MAX_PER_BUCKET = 32

    def __init__(self, buckets: Any, meta: Any) -> None:
        self._buckets = buckets
        self._meta = meta
        self.writes = 0  # bucket writes
        self.reads = 0   # bucket reads
        # Read lazily: the handles serve whichever shard the current call is for.
        self._loaded = False
        self._cache: dict[int, dict[StateKey, KeyState]] = {}
        self._dirty: set[int] = set()

    def _begin(self) -> None:
        # `exists` first: Spark's state server logs a WARN for every `get` of an empty value
        # (a shard's first call), which flooded a new job's log (issue 14).
        row = self._meta.get() if self._meta.exists() else None
        if row is None:
            self.n_buckets, self.n_keys, self._wake = self.MIN_BUCKETS, 0, Wake()
        else:
            self.n_buckets, self.n_keys, self._wake = pickle.loads(row[0])  # noqa: S301
        self._cache, self._dirty = {}, set()
        self._loaded = True

    def _bucket(self, sk: StateKey) -> tuple[int, dict[StateKey, KeyState]]:
        """The key's bucket number and contents (read at most once per call)."""
        if not self._loaded:
            self._begin()
        b = self._index(sk)
        found = self._cache.get(b)
        if found is None:
            found = self._read(b)
            self._cache[b] = found
        return b, found

    def _index(self, sk: StateKey) -> int:
        return zlib.crc32(f"{sk[0]}\x00{sk[1]}".encode()) % self.n_buckets

    def _read(self, b: int) -> dict[StateKey, KeyState]:
        self.reads += 1
        row = self._buckets.getValue((b,))
        return {} if row is None else pickle.loads(row[0])  # noqa: S301 - our own state

    def get(self, sk: StateKey) -> KeyState | None:
        return self._bucket(sk)[1].get(sk)

    def put(self, sk: StateKey, state: KeyState) -> None:
        b, bucket = self._bucket(sk)
        if sk not in bucket:
            self.n_keys += 1
        bucket[sk] = state
        self._dirty.add(b)

    def delete(self, sk: StateKey) -> None:
        b, bucket = self._bucket(sk)
        if bucket.pop(sk, None) is not None:
            self.n_keys -= 1
            self._dirty.add(b)

    def load_wake(self) -> Wake:
        if not self._loaded:
            self._begin()
        return self._wake

    def save_wake(self, wake: Wake) -> None:
        self._wake = wake

    def flush(self) -> None:
        """Write what changed in this call; grow the buckets if they got too full."""
        if not self._loaded:
            return
        if self.n_keys > self.MAX_PER_BUCKET * self.n_buckets:
            self._grow()
        for b in sorted(self._dirty):
            self._write(b, self._cache[b])
        if len(self._wake) or self.n_keys or self.n_buckets != self.MIN_BUCKETS:
            self._meta.update((pickle.dumps((self.n_buckets, self.n_keys, self._wake),
                                            protocol=5),))
        elif self._meta.exists():
            self._meta.clear()
        self._cache, self._dirty = {}, set()
        self._loaded = False  # the next call re-reads: Spark may hand the shard elsewhere

    def _write(self, b: int, bucket: dict[StateKey, KeyState]) -> None:
        self.writes += 1
        if bucket:
            self._buckets.updateValue((b,), (pickle.dumps(bucket, protocol=5),))
        else:
            self._buckets.removeKey((b,))

    def _grow(self) -> None:
        old = self.n_buckets
        every: dict[StateKey, KeyState] = {}
        for b in range(old):
            every.update(self._cache[b] if b in self._cache else self._read(b))
        new = old
        while len(every) > self.MAX_PER_BUCKET * new:
            new *= 2
        self.n_buckets, self.n_keys = new, len(every)
        self._cache = {b: {} for b in range(new)}
        for sk, st in every.items():
            self._cache[self._index(sk)][sk] = st
        # Every old bucket is rewritten or removed; new ones are written when not empty.
        self._dirty = {b for b in range(new) if b < old or self._cache[b]}


class NativeShardStore:
    """The native engine's (`cep.runtime.native_engine.NativeEngine`) key states over a shard's
    state in a stateful stream operator, as a log: each shard's native `EngineState` is kept in
    the worker process between calls, and the state store is its durable copy.

    Layout (3, since session 16; 2 since session 15): a MapState of rows by number, each a blob
    the core writes (`Engine.export_blobs`: records of group, key, wake time and versioned
    `CEPNK` bytes, or none for a key whose state is gone), stored compressed since layout 3
    (`zip_row`), and the token of the log it was appended onto, applied in row order; and a
    record (`_Meta`: `META_MAGIC`, the layout, then the token,
    log rows, log bytes, calls deferred and the registered timer) in a ValueState, or since
    session 18 (a query started so) in the log's reserved row `RECORD_ROW`.
    - A call starts with one state read, the record. When its token is the one this process
      wrote last (the store is exactly as this process left it), the held `EngineState` is used
      as it is. When another process appended rows since (Spark gave the shard's last calls to
      another Python worker: with several stateful tasks per batch, most batches) and the first
      of them was appended onto this process's token, the held copy catches up by importing
      those rows only (`_catch_up`: one state read per row, usually one or two). Otherwise (no
      copy held, a compaction or a rollback since, more than `CATCH_UP_ROWS` rows behind, the
      rules changed) the whole log is read back
      into a new `EngineState` (`Engine.import_blob`: keys stay raw bytes until an event or a
      deadline reaches them: a reload copies, it does not decode). Layout 1 (until session 14:
      a ListState log and a bare pickled record) is read from `old_log` and rewritten as
      layout 2 at the call's flush; another layout is refused with a message.
    - A call ends by appending one blob with the records of the keys it changed (one state call,
      bytes in proportion to the change) and a new token. When most of the log's records are
      superseded (more than twice as many records as keys, plus `COMPACT_SLACK` records), or its
      bytes pass four full snapshots plus `COMPACT_SLACK_BYTES` (a snapshot estimated as the
      log's mean record size times the keys: the backstop for few keys with large states,
      which the records bound lets grow to tens of MB), or it has 64 rows and more than twice
      as many records as keys (no slack: a small shard of hot keys), or 1,024 rows whatever its
      records, it is rewritten as the current keys (a compaction: the rows cleared and written
      again from 0, one state call per 4 MB blob). A shard of mostly
      new keys, each written once, has nothing to drop: it is rewritten every 1,024 writes,
      not every 64 as until session 12 (the row bound keeps a reload to at most 1,024 state
      rows of one call's changes each). (Until session
      12 the trigger was the log's bytes, twice the compacted size plus 1 MiB: a shard whose keys
      are mostly new, each written once, was rewritten whole with nothing to drop, every time
      its key count doubled; the records count that: a blob's header holds its record count.)

    So a call costs two state round trips and writes what changed; a key no event touched
    costs nothing. (`MapStateKeyStore`, the Python loop's store, reads, unpickles, pickles and
    writes whole buckets: at the latency benchmark's load that re-serialised every key of the
    shard on every call, issue 14. A first native version wrote changed buckets: at that load
    every bucket changes, so each call rewrote the shard in 5-8 round trips.)
    """

    COMPACT_ROWS = 64  # past this, half the records superseded is enough (no slack)
    MAX_ROWS = 1024  # past this, compact whatever the records
    COMPACT_SLACK = 16_384  # records
    COMPACT_SLACK_BYTES = 16 << 20
    # Compactions are spread over micro-batches: a worker process compacts one shard in a task
    # at most (the operator makes one store per Spark task: one task per micro-batch in the live
    # job), and none in the `COMPACT_GAP` - 1 tasks after it (an alert's latency spans two
    # batches, the one running when the alert is released and the one that emits it: two long
    # batches in a row are the tail). A shard whose log is due waits for a later task, at most
    # `COMPACT_DEFER` of its calls. A job's shards grow alike (keys are hashed over them), so
    # they passed the bounds in the same call: all 8 shards were rewritten in one micro-batch
    # (docs/spark-runtime.md, "Long micro-batches"). The gap holds within one worker process
    # only (`_TURNS` counts that process's tasks): when Spark gives a batch's stateful tasks, or
    # successive batches, to different Python workers of its pool, each compacts on its own
    # count and compactions can land in back-to-back batches (or two in one batch). The live
    # job runs two stateful tasks per batch since session 15 (`live_partitions`): up to two
    # compactions per batch, one per task, on the two cores (docs/spark-runtime.md, "Stateful
    # partitions of the live job"; not yet seen in a live run: the benchmarks' runs were too
    # short to make a shard due).
    COMPACT_GAP = 2  # tasks
    COMPACT_DEFER = 64
    # A held copy more than this many rows behind is not caught up (one state read per row)
    # but reloaded (one read of the whole log, `_reload`): a process that held the shard long
    # ago would otherwise make up to `MAX_ROWS` round trips. 64: the usual lag of two stateful
    # tasks is one or two rows, and a log is at most `MAX_ROWS` rows; not measured (session 15).
    CATCH_UP_ROWS = 64
    # A shard's keys stay decoded between calls while their bytes total at most this
    # (`EngineState.keep_decoded`): a call then neither decodes the keys it reaches nor
    # re-encodes keys it did not change; the rest are held as bytes. A decoded fraud key
    # takes ~1.6 KB against its ~100 B of bytes: at most ~35 MB per 2 MB of budget held by a
    # worker (20k fraud cards take ~2 MB of bytes in all). The budget is per shard: at least
    # `KEEP_DECODED`, and `DECODED_PER_JOB` split over the job's shards when the operator knows
    # them (`for_shards`): 8 shards 2 MB each, 2 shards 8 MB each (session 12: with 2 MB, a
    # 2-shard job evicted and re-decoded keys an 8-shard one kept, `python -m bench.operator
    # --rate 20000 --batch-s 1 --batches 10 --shards 2 --native-only`: engine + flush CPU
    # 1.76 s at 2 MB, 1.34 s at 8 MB; 8 shards at 2 MB: 1.28 s).
    KEEP_DECODED = 2 << 20
    DECODED_PER_JOB = 16 << 20
    # Each shard's state keeps that budget or none decoded, whichever the keys' returns seen
    # so far favour (`EngineState(adaptive=True)`, core/src/budget.rs): a shard whose keys come
    # back only after the budget has evicted them keeps none (docs/spark-runtime.md, "An
    # adaptive decoded-keys budget (session 24, live24)").
    ADAPTIVE = True

    @classmethod
    def for_shards(cls, shards: int | None) -> int:
        """The decoded-keys budget of each of a job's `shards` shards (None: unknown)."""
        return max(cls.KEEP_DECODED, cls.DECODED_PER_JOB // shards if shards else 0)

    def __init__(self, log: Any, meta: Any, held: dict[Any, Any],
                 keep_decoded: int | None = None, old_log: Any = None,
                 shared: SharedRows | None = None) -> None:
        """`meta`: the shard's record (a ValueState), or None: kept in the log's reserved row
        (`RECORD_ROW`, since session 18: one state variable to declare per task, not two).
        `shared`: this process's `SharedRows` (the rows it appends, handed to the other worker
        processes of its host for their catch-ups), or None."""
        self._shared = shared
        self.shared_rows = 0  # log rows a catch-up took from `shared`, not the state server
        self.keep_decoded = self.KEEP_DECODED if keep_decoded is None else keep_decoded
        self._log = log  # MapState: row number -> (blob, token it was appended onto)
        self._meta = _RecordRow(log) if meta is None else meta
        self._old_log = old_log  # layout 1's ListState of blobs (read once, then cleared)
        self._held = held  # shard -> _Held, shared by the stores of one worker process
        self.writes = 0  # state calls that wrote the log
        self.reads = 0  # log rows read from the state server on reloads and catch-ups
        self.reloads = 0  # calls that had to read the whole shard (no usable held copy)
        self.catchups = 0  # calls whose held copy was behind and read only the rows since
        self.load_us = 0  # µs in `begin`: the record read, and any catch-up or reload
        self.read_us = 0  # µs of it in the state server's reads of log rows
        self.unzip_us = 0  # µs of it expanding the rows read (`unzip_row`)
        self.import_us = 0  # µs of it in the core's `import_blob` of the rows read
        self.reload_us = 0  # µs of it in reloads (their reads, unzip and import included)
        self.compactions = 0
        self.budget_none = 0  # flushes after which the shard kept no keys decoded
        self.task = _TURNS.new_task()
        self.dropped = 0  # keys of rule groups that no longer exist, dropped on a reload
        # Where `flush` spends its time, in µs since the operator last reset them: the core
        # encoding the changed keys (`encode_us`), the state server's writes (`write_us`).
        self.encode_us = 0
        self.write_us = 0
        self._cur: _Held | None = None
        self._shard: Any = None
        self._engine: Any = None

    # The per-call counters (attribute -> the operator's stats name), handed over and reset
    # once per call by `take_stats`.
    _STATS = (("reloads", "state_reloads"), ("catchups", "state_catchups"),
              ("compactions", "state_compactions"), ("load_us", "load_us"),
              ("read_us", "read_us"), ("unzip_us", "unzip_us"), ("import_us", "import_us"),
              ("reload_us", "reload_us"), ("encode_us", "encode_us"), ("write_us", "write_us"),
              ("shared_rows", "state_shared_rows"), ("budget_none", "state_budget_none"))

    def take_stats(self) -> dict[str, int]:
        """The counters since the last call, under the operator's stats names, reset to 0."""
        out = {name: getattr(self, attr) for attr, name in self._STATS}
        for attr, _ in self._STATS:
            setattr(self, attr, 0)
        return out

    def begin(self, shard: Any, engine: Any) -> None:
        """Start a call for `shard` run by `engine`: use the held copy when it is current,
        catch it up when it is behind by appended rows, else read the whole log."""
        held = self._held.get(shard)
        t0 = time.perf_counter()
        # Spark's state server logs a WARN for every `get` of an empty value (each shard's
        # first call: 64 lines on a new job's first batch, issue 14), so a shard this process
        # holds no copy of asks `exists` first; one it holds was written, so `get` alone (one
        # round trip, as before, in the steady state).
        row = self._meta.get() if held is not None or self._meta.exists() else None
        meta = _Meta.read(None if row is None else row[0])
        self._shard, self._engine = shard, engine
        try:
            if held is not None and held.engine is engine and meta.layout in ROW_LAYOUTS and (
                    held.token == meta.token or self._catch_up(held, meta)):
                # The registered timer is the store's (another process may have moved it
                # without appending a row: the token alone does not say).
                held.timer, held.stored_timer = meta.timer, meta.timer
                self._cur = held
                return
            self._held.pop(shard, None)
            self._cur = self._reload(engine, meta)
        except BaseException:
            self._held.pop(shard, None)
            raise
        finally:
            self.load_us += int(1e6 * (time.perf_counter() - t0))

    def _catch_up(self, held: _Held, meta: _Meta) -> bool:
        """Bring a held copy that is behind to the store's: when the row after its last one
        was appended onto its token (the log grew from exactly what this process left, with no
        compaction or rollback between), import the rows appended since; else, or when more
        than `CATCH_UP_ROWS` rows behind, False (reload)."""
        if not 0 < meta.rows - held.rows <= self.CATCH_UP_ROWS:
            return False
        t0 = time.perf_counter()
        try:
            # The rows as their writer handed them over on this host, when it did (the same
            # bytes: `SharedRows.take` checks the chain of tokens); else the state server's.
            shared = (None if self._shared is None
                      else self._shared.take(held.token, meta.token, meta.rows - held.rows))
            self.shared_rows += len(shared or ())
            blobs = shared if shared is not None else self._rows_since(held, meta)
        finally:
            self.read_us += int(1e6 * (time.perf_counter() - t0))
        if blobs is None:
            return False
        try:
            dropped, records = self._import(held.engine, held.state, blobs)
        except Exception:
            if shared is None:
                raise
            # A hand-over file that chains but does not import (its bytes damaged on this
            # host's disk): the copy may be half caught up, so the shard is reloaded from the
            # state server, which holds the same rows, instead of failing the task.
            return False
        self.catchups += 1
        held.token, held.rows, held.size, held.due = meta.token, meta.rows, meta.size, meta.due
        held.records += records
        held.compact = held.compact or dropped > 0
        return True

    def _rows_since(self, held: _Held, meta: _Meta) -> list[bytes] | None:
        """The log rows appended since `held`, read from the state server, or None when the
        first was not appended onto its token or one is missing (the reload names it)."""
        first = self._log.getValue((held.rows,))
        if first is None or first[1] != held.token:
            return None
        blobs = [first[0]]
        for i in range(held.rows + 1, meta.rows):
            got = self._log.getValue((i,))
            if got is None:
                return None
            blobs.append(got[0])
        self.reads += len(blobs)
        return blobs

    def _reload(self, engine: Any, meta: _Meta) -> _Held:
        """A new `EngineState` from the whole log (rows in order)."""
        from cep import _core  # type: ignore[attr-defined]

        self.reloads += 1
        t0 = time.perf_counter()
        state = _core.EngineState(track_dirty=True, keep_decoded=self.keep_decoded,
                                  adaptive=self.ADAPTIVE)
        blobs = self._log_blobs(meta)
        self.reads += len(blobs)
        dropped, records = self._import(engine, state, blobs)
        self.reload_us += int(1e6 * (time.perf_counter() - t0))
        # Records of dropped groups leave the store at the next write (a compaction), and so
        # does a layout 1 log (rewritten as rows: `migrate`).
        cur = _Held(meta.token, engine, state, meta.rows, meta.size, records,
                    dropped > 0 or meta.layout == 1, meta.timer, meta.due)
        cur.stored_timer = meta.timer
        cur.migrate = meta.layout == 1
        return cur

    def _import(self, engine: Any, state: Any, blobs: list[bytes]) -> tuple[int, int]:
        """Apply `blobs` in order to `state` (a reload's or a catch-up's rows): the keys of
        dropped rule groups and the records read."""
        dropped = records = 0
        unzip = imported = 0.0
        for stored in blobs:
            t0 = time.perf_counter()
            blob = unzip_row(stored)
            t1 = time.perf_counter()
            # The core first: it checks the header and gives the clearer error (a blob of
            # another format version, a corrupt one).
            dropped += engine.core.import_blob(state, blob)
            unzip, imported = unzip + t1 - t0, imported + time.perf_counter() - t1
            records += blob_records(blob)
        self.unzip_us += int(1e6 * unzip)
        self.import_us += int(1e6 * imported)
        self.dropped += dropped
        return dropped, records

    def _log_blobs(self, meta: _Meta) -> list[bytes]:
        if meta.layout == 0:
            return []
        if meta.layout == 1:  # a ListState, until session 14
            if self._old_log is None:
                raise ValueError(_LAYOUT_1_MESSAGE)
            return [blob for (blob,) in self._old_log.get()]
        t0 = time.perf_counter()
        got = sorted((k[0], v[0]) for k, v in self._log.iterator() if k[0] != RECORD_ROW)
        self.read_us += int(1e6 * (time.perf_counter() - t0))
        if [i for i, _ in got] != list(range(meta.rows)):
            raise ValueError(f"native key-state log: the store holds rows "
                             f"{[i for i, _ in got][:8]}... but its record says 0..{meta.rows - 1}:"
                             " the checkpoint's state is corrupt; reset it or replay the input")
        return [b for _, b in got]

    @property
    def timer(self) -> Any:
        """The event-time timer the operator last registered for this shard, as far as this
        process knows it: `UNKNOWN` after a reload (the operator then lists Spark's timers)."""
        return UNKNOWN if self._cur is None else self._cur.timer

    @timer.setter
    def timer(self, value: Any) -> None:
        if self._cur is not None:
            self._cur.timer = value

    def native_state(self, engine: Any) -> Any:
        if self._cur is None or engine is not self._engine:
            raise RuntimeError("NativeShardStore: begin(shard, engine) first")
        return self._cur.state

    def flush(self) -> None:
        """Append the records of the keys this call changed, or compact the log."""
        cur, self._cur = self._cur, None
        if cur is None:
            return
        cur.flushed = self.task
        try:
            core = self._engine.core
            t0 = time.perf_counter()
            prev = cur.token
            if self._compact_turn(cur):
                blobs = core.export_blobs(cur.state, True)
                t1 = time.perf_counter()
                # (A record in the log's reserved row goes too: `_write_meta` below rewrites it.)
                self._log.clear()
                if cur.migrate and self._old_log is not None:
                    self._old_log.clear()
                    cur.migrate = False
                self.compactions += 1
                _TURNS.compacted = self.task
                cur.due = 0
                cur.compact = False
                # Rows restart at 0, appended onto no token: a copy held at an earlier row
                # of the old log is never caught up from these (`_catch_up`).
                prev, cur.rows, cur.size, cur.records = b"", 0, 0, 0
            else:
                blobs = core.export_blobs(cur.state)
                t1 = time.perf_counter()
                self.budget_none += cur.state.decoded_budget == 0
                if not blobs:
                    self.encode_us += int(1e6 * (t1 - t0))
                    if cur.timer != cur.stored_timer:
                        self._write_meta(cur)  # the same token: only the timer moved
                    self.write_us += int(1e6 * (time.perf_counter() - t1))
                    self._held[self._shard] = cur  # nothing changed: the token stays valid
                    return
            # Each row names the token it was appended onto (`_catch_up`); stored compressed
            # (`zip_row`). The log's size counts the rows' bytes before compression, as the
            # compaction's bounds always have.
            tz = time.perf_counter()
            rows = [zip_row(b) for b in blobs]
            zipped = time.perf_counter() - tz  # (encoding, not writing)
            token = os.urandom(8)
            if self._shared is not None and prev:  # (a compaction's rows: no catch-up reads them)
                self._shared.put(self._shard, prev, token, rows)
            for i, row in enumerate(rows):
                self._log.updateValue((cur.rows + i,), (row, prev))
            cur.rows += len(blobs)
            cur.size += sum(len(b) for b in blobs)
            cur.records += sum(map(blob_records, blobs))
            self.writes += 1
            cur.token = token
            self._write_meta(cur)
            self.encode_us += int(1e6 * (t1 - t0 + zipped))
            self.write_us += int(1e6 * (time.perf_counter() - t1 - zipped))
            self._held[self._shard] = cur
        except BaseException:
            self._held.pop(self._shard, None)
            raise

    def _write_meta(self, cur: _Held) -> None:
        self._meta.update((_Meta(LOG_LAYOUT, cur.token, cur.rows, cur.size, cur.due,
                                 cur.timer).bytes(),))
        cur.stored_timer = cur.timer

    def _compact_turn(self, cur: _Held) -> bool:
        """Whether this flush compacts: the log is due (`_compact_now`), this process has not
        compacted in this task or the `COMPACT_GAP` - 1 before it, and no shard it flushed in
        this task or the one before has waited longer for its turn (so a shard due again soon
        cannot keep the others waiting; a held copy of a shard last flushed earlier, which
        Spark may since have handed to another process, has a stale count and is ignored);
        or the shard has waited `COMPACT_DEFER` calls (a log stays within its bounds plus that
        many calls' records); or its records of dropped rule groups must go."""
        if not self._compact_now(cur):
            cur.due = 0  # (new keys can bring a log back within its bounds): not waiting
            return False
        if cur.compact or cur.due >= self.COMPACT_DEFER or (
                self.task - _TURNS.compacted >= self.COMPACT_GAP
                and not any(h.due > cur.due for h in self._held.values()
                            if h is not cur and h.flushed >= self.task - 1)):
            return True
        cur.due += 1
        return False

    def _compact_now(self, cur: _Held) -> bool:
        """Whether this flush rewrites the log as the current keys (the class docstring)."""
        if cur.compact or cur.rows >= self.MAX_ROWS:
            return True
        keys = len(cur.state)  # O(1): the core's two key maps' sizes
        if cur.records > 2 * keys + (0 if cur.rows >= self.COMPACT_ROWS else self.COMPACT_SLACK):
            return True
        # The byte backstop: few keys with large states, rewritten every call, pass the
        # records bound only after many megabytes. One full snapshot's bytes are estimated
        # as the log's mean record size times the keys.
        snapshot = cur.size * keys // max(cur.records, 1)
        return cur.size > 4 * snapshot + self.COMPACT_SLACK_BYTES

    def abandon(self) -> None:
        """The call failed: forget the held copy (the store is re-read next time)."""
        self._cur = None
        self._held.pop(self._shard, None)


@dataclass(slots=True)
class _Held:
    """A shard's native state as this process last wrote it."""

    token: bytes
    engine: Any
    state: Any
    rows: int  # log rows
    size: int  # log bytes
    records: int  # key records in the log (a key's latest supersedes its earlier ones)
    compact: bool  # compact at the next flush
    timer: Any  # the registered timer (None: none), or UNKNOWN
    due: int  # flushes since the log was first due for a compaction that another shard had
    # (kept in the store's ValueState too: a reload by another process keeps the count)
    flushed: int = 0  # the task (`_TURNS`) of this process that last flushed the shard
    stored_timer: Any = None  # the timer the store's record names (`timer` as last written)
    migrate: bool = False  # a layout 1 log: its ListState is cleared at the compaction


UNKNOWN = object()  # NativeShardStore.timer when this process does not know it


class SharedRows:
    """The log rows a worker process appends, also handed to the other worker processes of its
    host as files (one per flush, named by the token the flush wrote), so that their catch-ups
    read them there instead of from the state server (docs/spark-runtime.md, "A catch-up's rows
    from the other worker's hand (session 20, live20i)"). A cache, never the state: a catch-up
    takes the files only when they chain from its held token to the record's (each file names
    the token its rows were appended onto; tokens are random and written once), and the right
    number of rows; anything else (a file missing, unreadable, another host) reads the state
    server as before. A file is written whole under another name and renamed, so a reader sees
    all of it or none; the writer deletes its own past its last `KEEP` flushes of the shard,
    not the reader (with three or more workers, a third may be behind by the same rows), and
    any writer deletes every file older than `STALE_S` (`_sweep`).

    A file: `MAGIC`, the format's version (1 byte), the CRC-32 of the rest (4 bytes, little
    endian), the length of the token the rows were appended onto (1 byte) and that token, then
    each row as its length (4 bytes) and its bytes. A file whose checksum or version does not
    match is not taken (a damaged disk, or another build's file): the catch-up reads the state
    server."""

    MAGIC = b"CEPNS"
    VERSION = 2  # version 1 (session 20) had neither version byte nor checksum: its files fail both
    KEEP = 4
    # A writer deletes the directory's files older than this, at its first flush and then at
    # most once per this period: those of a worker process that exited would otherwise stay
    # until the executor ends, up to `KEEP` per shard for each such process (Spark stops the
    # Python workers after a minute idle, e.g. a live job without input; a query stopped; a
    # crash mid-write leaves a temporary file). A catch-up's files are a batch or a few old;
    # without them it reads the state server.
    STALE_S = 600

    def __init__(self, path: str) -> None:
        self.path = path
        self._mine: dict[Any, list[str]] = {}  # shard -> the files this process wrote, oldest first
        self._swept = float("-inf")  # when this process last swept (`time.time()`)

    @classmethod
    def for_worker(cls) -> SharedRows | None:
        """The process's `SharedRows` under Spark's local directory for its Python workers
        (`SPARK_LOCAL_DIRS`, deleted when the executor stops, or with an external shuffle
        service when the application ends), or None outside Spark."""
        local = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0]
        if not local:
            return None
        path = os.path.join(local, "cep-shared-rows")
        try:
            os.makedirs(path, exist_ok=True)
        except OSError:
            return None
        return cls(path)

    def _file(self, token: bytes) -> str:
        return os.path.join(self.path, token.hex())

    def put(self, shard: Any, prev: bytes, token: bytes, rows: list[bytes]) -> None:
        """Hand over the `rows` appended onto `prev` as `token` (best effort)."""
        data = self._pack(prev, rows)
        name = self._file(token)
        tmp = f"{name}.{os.getpid()}.tmp"
        mine = self._mine.setdefault(shard, [])
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, name)
            mine.append(name)
        except OSError:
            _unlink(tmp)
        while len(mine) > self.KEEP:
            _unlink(mine.pop(0))
        now = time.time()
        if now >= self._swept + self.STALE_S:
            self._swept = now
            self._sweep(now - self.STALE_S)

    def _sweep(self, before: float) -> None:
        """Delete the directory's files (any process's) last written before `before`."""
        with contextlib.suppress(OSError), os.scandir(self.path) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.stat().st_mtime < before:
                        os.unlink(entry.path)

    def take(self, held: bytes, token: bytes, rows: int) -> list[bytes] | None:
        """The `rows` rows appended from token `held` up to `token`, in order, when every
        flush between left its file; else None."""
        got: list[list[bytes]] = []
        while rows > 0 and token != held:
            name = self._file(token)
            try:
                with open(name, "rb") as f:
                    data = f.read()
            except OSError:
                return None
            parsed = self._parse(data)
            if parsed is None:
                return None
            token, blobs = parsed
            got.append(blobs)
            rows -= len(blobs)
        if rows != 0 or token != held:
            return None
        return [b for blobs in reversed(got) for b in blobs]

    @classmethod
    def _pack(cls, prev: bytes, rows: list[bytes]) -> bytes:
        """A file's bytes (the class docstring): `rows` appended onto token `prev`."""
        head = len(cls.MAGIC) + 5
        data = bytearray(head)
        data[:head - 4] = cls.MAGIC + bytes([cls.VERSION])
        data += len(prev).to_bytes(1, "little") + prev
        for r in rows:
            data += len(r).to_bytes(4, "little") + r
        data[head - 4:head] = zlib.crc32(memoryview(data)[head:]).to_bytes(4, "little")
        return bytes(data)

    @classmethod
    def _parse(cls, data: bytes) -> tuple[bytes, list[bytes]] | None:
        """(the token the rows were appended onto, the rows) of a file `_pack` wrote, or None
        when it is not one (another version, a checksum that does not match, cut short)."""
        head = len(cls.MAGIC) + 5
        if (len(data) <= head or not data.startswith(cls.MAGIC)
                or data[head - 5] != cls.VERSION
                or int.from_bytes(data[head - 4:head], "little")
                != zlib.crc32(memoryview(data)[head:])):
            return None
        at = head + 1 + data[head]
        prev, blobs = data[head + 1:at], []
        while at < len(data):
            n = int.from_bytes(data[at:at + 4], "little")
            if n == 0 or at + 4 + n > len(data):
                return None
            blobs.append(data[at + 4:at + 4 + n])
            at += 4 + n
        return (prev, blobs) if blobs and at == len(data) else None


def _unlink(name: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name)

# The row of the log's MapState that holds the shard's record instead of a ValueState (a query
# whose checkpoint says so: `jobs.live.checkpoint_record_row`): no log row takes it (rows are
# numbered from 0), a reload skips it and a compaction's `clear` drops it before the flush
# writes the record again.
RECORD_ROW = -1


class _RecordRow:
    """A shard's record as the log's row `RECORD_ROW`, behind the ValueState calls the store
    makes (`exists`, `get`, `update`): `containsKey` first, as a ValueState's `exists`, because
    Spark's state server logs a WARN for a `getValue` of a missing key too."""

    __slots__ = ("_log",)
    _KEY = (RECORD_ROW,)

    def __init__(self, log: Any) -> None:
        self._log = log

    def exists(self) -> bool:
        return bool(self._log.containsKey(self._KEY))

    def get(self) -> tuple[bytes] | None:
        got = self._log.getValue(self._KEY)
        return None if got is None else (got[0],)

    def update(self, value: tuple[bytes]) -> None:
        self._log.updateValue(self._KEY, (value[0], b""))

# The native store's layout (`_Meta`): 3 since session 16 (layout 2's, the rows compressed);
# 2 since session 15 (the log a MapState of rows by number, the record prefixed with `META_MAGIC`
# and this number); 1 until then (a ListState, the record a bare pickle), read once and
# rewritten.
LOG_LAYOUT = 3
# Layouts whose rows this build reads as they are: 3 (since session 16) stores rows compressed
# (`zip_row`), 2 (session 15) stored them raw; `unzip_row` tells them apart by their magic, so a
# layout 2 log goes on as layout 3 (its old rows stay raw until a compaction rewrites them).
ROW_LAYOUTS = (2, 3)
META_MAGIC = b"CEPNL"
_LAYOUT_1_MESSAGE = ("native key-state store: this shard's state is in layout 1 (a ListState "
                     "log, written before session 15) and no handle to it was given; "
                     "reset the checkpoint or replay the input")
_NO_TIMER_KNOWN = -1  # the record's timer field for UNKNOWN


@dataclass(frozen=True, slots=True)
class _Meta:
    """A shard's record (the store's ValueState): its log's layout, token, rows, bytes, calls
    waited for a compaction and the registered timer (None: none; UNKNOWN)."""

    layout: int  # 0: no record (a new shard)
    token: bytes
    rows: int
    size: int
    due: int
    timer: Any

    @classmethod
    def read(cls, raw: bytes | None) -> _Meta:
        if raw is None:
            return cls(0, b"", 0, 0, 0, None)  # nothing stored: no timer either
        if not raw.startswith(META_MAGIC):
            # Layout 1: a pickled (token, rows, size, due); its fourth field was the bytes
            # at the last compaction until session 12 (a large count: compacted at once).
            token, rows, size, due = pickle.loads(raw)[:4]  # noqa: S301 - our own state
            return cls(1, token, rows, size, due, UNKNOWN)
        layout = int.from_bytes(raw[5:7], "little")
        if layout not in ROW_LAYOUTS:
            raise ValueError(f"native key-state store layout {layout}, but this build reads "
                             f"layouts {', '.join(map(str, ROW_LAYOUTS))} (and 1): discard the "
                             "state (reset the checkpoint) or replay the input")
        token, rows, size, due, timer = pickle.loads(raw[7:])  # noqa: S301 - our own state
        return cls(layout, token, rows, size, due, UNKNOWN if timer == _NO_TIMER_KNOWN else timer)

    def bytes(self) -> bytes:
        timer = _NO_TIMER_KNOWN if self.timer is UNKNOWN else self.timer
        return (META_MAGIC + self.layout.to_bytes(2, "little")
                + pickle.dumps((self.token, self.rows, self.size, self.due, timer), protocol=5))


class _Turns:
    """A worker process's tasks (one `NativeShardStore` each), numbered, and the last one that
    compacted a shard (`NativeShardStore.COMPACT_GAP`)."""

    def __init__(self) -> None:
        self.tasks = 0
        self.compacted = -(2**62)

    def new_task(self) -> int:
        self.tasks += 1
        return self.tasks


_TURNS = _Turns()


def blob_records(blob: bytes) -> int:
    """The number of key records in an `Engine.export_blobs` blob: its header is the magic
    `CEPNB`, a u16 version and a u32 record count, little-endian (docs/native-core.md). Another
    version may lay its header out otherwise: it is refused, as `Engine.import_blob` refuses
    every version but its own (the store calls this after the core read the blob)."""
    from cep._core import BLOB_VERSION  # type: ignore[attr-defined]  # the only one it reads

    if len(blob) < 11 or blob[:5] != b"CEPNB":
        raise ValueError("not a native key-state blob (CEPNB): wrong header")
    version = int.from_bytes(blob[5:7], "little")
    if version != BLOB_VERSION:
        raise ValueError(f"native key-state blob format version {version}, but this build reads "
                         f"version {BLOB_VERSION}: discard the state (reset the checkpoint) or "
                         "replay the input")
    return int.from_bytes(blob[7:11], "little")


# A log row stored compressed (layout 3): this magic, a u32 of the blob's length, then the
# blob (`Engine.export_blobs`: `CEPNB` ...) as one zstd frame. Measured on the bench input's
# rows (~250-430 KB, session 16): ~5x smaller for ~0.6 ms to compress and ~0.3 ms to expand
# (pyarrow's zstd, level 1), where the state server and RocksDB move each row's bytes on every
# append, catch-up and reload.
ROW_ZIP_MAGIC = b"CEPNZ"
_ZSTD_LEVEL = 1


@functools.cache
def _zstd() -> Any:
    """The process's zstd codec (pyarrow's wheels are built with zstd; a pyarrow without it
    fails here, at the first row)."""
    import pyarrow as pa

    return pa.Codec("zstd", compression_level=_ZSTD_LEVEL)


def zip_row(blob: bytes) -> bytes:
    """A log row's stored bytes: `blob` compressed."""
    return (ROW_ZIP_MAGIC + len(blob).to_bytes(4, "little")
            + _zstd().compress(blob, asbytes=True))


def unzip_row(row: bytes) -> bytes:
    """The blob of a stored log row (compressed by `zip_row`, or raw: layouts 1 and 2)."""
    if not row.startswith(ROW_ZIP_MAGIC):
        return row
    size = int.from_bytes(row[5:9], "little")
    try:
        return _zstd().decompress(row[9:], decompressed_size=size, asbytes=True)
    except Exception as e:  # noqa: BLE001 - pyarrow raises its own errors
        raise ValueError(f"native key-state log row: a compressed row that does not expand "
                         f"({e}): the checkpoint's state is corrupt, or this build's pyarrow "
                         "has no zstd; reset it or replay the input") from e
