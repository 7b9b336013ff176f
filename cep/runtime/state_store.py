"""The engine's `KeyStore` over a shard's state in a stateful stream operator.

Plain logic: the two state handles it is given need only the calls of Spark's MapState
(`getValue`, `updateValue`, `removeKey`) and ValueState (`get`, `update`, `exists`, `clear`),
so it is tested with dicts (tests/runtime/test_bucket_store.py) and the Spark operator
(`cep.spark.operator`) hands it the real ones.
"""

from __future__ import annotations

import pickle
import zlib
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
        row = self._meta.get()
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
