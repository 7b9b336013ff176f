"""`MapStateKeyStore`'s bucket bookkeeping: reads and writes per call, growth, deletion.

The state handles here are dicts with Spark's MapState/ValueState method names, so the counts
of state-server calls can be checked exactly; the Spark tests (test_replay_spark, test_live)
run the same store on Spark's real state."""

from __future__ import annotations

from typing import Any

from cep.runtime.engine import Wake
from cep.runtime.state_store import MapStateKeyStore


class DictMapState:
    def __init__(self) -> None:
        self.d: dict[Any, Any] = {}
        self.calls = 0

    def getValue(self, k: Any) -> Any:  # noqa: N802 - Spark's names
        self.calls += 1
        return self.d.get(k)

    def updateValue(self, k: Any, v: Any) -> None:  # noqa: N802
        self.calls += 1
        self.d[k] = v

    def removeKey(self, k: Any) -> None:  # noqa: N802
        self.calls += 1
        self.d.pop(k, None)


class DictValueState:
    def __init__(self) -> None:
        self.v: Any = None

    def get(self) -> Any:
        return self.v

    def update(self, v: Any) -> None:
        self.v = v

    def exists(self) -> bool:
        return self.v is not None

    def clear(self) -> None:
        self.v = None


def state(i: int) -> Any:
    return ([(i, 0, {"n": i})], {})


def test_one_call_costs_at_most_two_round_trips_per_bucket():
    buckets, meta = DictMapState(), DictValueState()
    store = MapStateKeyStore(buckets, meta)
    for i in range(200):
        store.put(("g", f"k{i}"), state(i))
    store.flush()
    assert store.n_buckets == 8 and buckets.calls <= 2 * 8  # 200 keys, 8 buckets
    store = MapStateKeyStore(buckets, meta)
    buckets.calls = 0
    for i in range(200):
        assert store.get(("g", f"k{i}")) == state(i)
        store.put(("g", f"k{i}"), state(i + 1))
    store.flush()
    assert buckets.calls <= 2 * 8


def test_buckets_grow_and_every_key_survives():
    buckets, meta = DictMapState(), DictValueState()
    for start in range(0, 2_000, 500):  # four calls, 500 new keys each
        store = MapStateKeyStore(buckets, meta)
        for i in range(start, start + 500):
            store.put(("g", f"k{i}"), state(i))
        store.flush()
    assert store.n_keys == 2_000 and store.n_buckets * store.MAX_PER_BUCKET >= 2_000
    assert len(buckets.d) == store.n_buckets
    store = MapStateKeyStore(buckets, meta)
    assert all(store.get(("g", f"k{i}")) == state(i) for i in range(2_000))


def test_deleting_every_key_leaves_no_state():
    buckets, meta = DictMapState(), DictValueState()
    store = MapStateKeyStore(buckets, meta)
    for i in range(50):
        store.put(("g", f"k{i}"), state(i))
    store.flush()
    store = MapStateKeyStore(buckets, meta)
    for i in range(50):
        store.delete(("g", f"k{i}"))
    store.save_wake(Wake())
    store.flush()
    assert buckets.d == {} and meta.v is None


def test_a_new_shard_never_gets_an_empty_value():
    """Spark's state server logs a WARN for every `get` of an empty ValueState."""
    class Watched(DictValueState):
        empty_gets = 0

        def get(self) -> Any:
            Watched.empty_gets += self.v is None
            return super().get()

    buckets, meta = DictMapState(), Watched()
    store = MapStateKeyStore(buckets, meta)
    store.put(("g", "k"), state(1))
    store.flush()
    assert store.get(("g", "k")) == state(1)
    assert Watched.empty_gets == 0
