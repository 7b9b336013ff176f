"""The engine loop in the native core (`cep._core.Engine`) behind `cep.runtime.engine.Engine`'s API.

Stage 2 of issue 13 (docs/native-core.md): for a rule set whose rules all run on the native
matcher, routing events to their key's state, the per-key buffer and its (ts, seq) order,
release at the safe time, deadlines and the wake index (AT_END included), the end of input, late
events, the partial-match cap and state release run in Rust, with exactly the semantics of
`Engine.ingest` (cep/runtime/engine.py is the specification; tests/core/
test_native_engine_differential.py compares the two).

Events enter as `Event` objects (`ingest`, what `run_embedded` passes) or as pyarrow record
batches (`ingest_batch`, read by the core through the Arrow C data interface).

The keys' states live in a native `cep._core.EngineState`, kept on the `MemoryKeyStore` the
caller passes (so `run_embedded` drives this engine unchanged); `store.states` and `store.wake`
stay empty: ask `live_keys(store)` / `wake_keys(store)`. A key's state serialises as versioned
bytes (`key_bytes` / `load_key`), for the Spark operator's key store (not wired yet).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

from cep.runtime.engine import (
    Event,
    KeyStore,
    LateEvent,
    MemoryKeyStore,
    Output,
    RuleGroup,
    RuleRuntime,
    group_rules,
)

try:
    from cep import _core  # type: ignore[attr-defined]
except ImportError:  # not built
    _core = None  # type: ignore[assignment]

_ATTR = "_cep_native_engine_state"


class NativeEngine:
    """`Engine` with its loop in the native core. `runtimes` and `programs` are parallel: each
    rule's runtime (id, stream, key field, lateness, matcher, meta, version) and its exported
    program (`cep.program.export_program`)."""

    def __init__(self, runtimes: Sequence[RuleRuntime], programs: Sequence[dict[str, Any]],
                 *, max_partial_matches: int | None = None, families: bool | None = None) -> None:
        """`families`: run rules that differ only in constants together (docs/rule-families.md);
        default on unless the environment sets `CEP_RULE_FAMILIES=0` (for A/B runs)."""
        if _core is None:
            raise RuntimeError("the native core (cep._core) is not built")
        if families is None:
            families = os.environ.get("CEP_RULE_FAMILIES", "1") != "0"
        self.rules = {r.rule_id: r for r in runtimes}
        self.groups: dict[str, RuleGroup] = {g.gid: g for g in group_rules(runtimes)}
        self.core = _core.Engine([
            (program, max_partial_matches, r.stream, r.key_field, r.lateness_ms, r.content_hash)
            for r, program in zip(runtimes, programs, strict=True)],
            _declared_fields(runtimes), families)

    @property
    def families(self) -> list[list[str]]:
        """The rule families the core runs together: per family, its rules' ids."""
        return [list(f) for f in self.core.families()]

    @property
    def track_partials(self) -> bool:
        """Count per-rule changes in live partial matches (`Output.partial_matches`), as
        `Engine.track_partials`; off by default."""
        return bool(self.core.track_partials)

    @track_partials.setter
    def track_partials(self, on: bool) -> None:
        self.core.track_partials = on

    # -- the store -------------------------------------------------------------------------
    def state_of(self, store: KeyStore) -> Any:
        """The native key states kept on `store` (created on first use), or those a store
        of its own gives (`native_state(engine)`: `cep.runtime.state_store.NativeShardStore`)."""
        own = getattr(store, "native_state", None)
        if own is not None:
            return own(self)
        if not isinstance(store, MemoryKeyStore):
            raise TypeError("the native engine keeps its key states in a MemoryKeyStore "
                            f"(got {type(store).__name__}); use cep.runtime.engine.Engine")
        held = getattr(store, _ATTR, None)
        if held is None:
            if store.states or len(store.wake):
                raise ValueError("this store holds the Python engine's key states")
            held = (self, _core.EngineState())
            setattr(store, _ATTR, held)
        elif held[0] is not self:
            raise ValueError("this store holds the key states of another native engine")
        return held[1]

    def live_keys(self, store: KeyStore) -> int:
        """How many keys have state (buffered events or partial matches)."""
        return len(self.state_of(store))

    def wake_keys(self, store: KeyStore) -> int:
        return int(self.state_of(store).wake_len())

    def keys(self, store: KeyStore) -> list[tuple[str, str]]:
        return list(self.core.keys(self.state_of(store)))

    def key_bytes(self, store: KeyStore, gid: str, key: str) -> bytes | None:
        """A key's state as versioned bytes (`CEPNK`, docs/native-core.md), None if it has none."""
        return self.core.key_bytes(self.state_of(store), gid, key)  # type: ignore[no-any-return]

    def load_key(self, store: KeyStore, gid: str, key: str, data: bytes) -> None:
        self.core.load_key(self.state_of(store), gid, key, data)

    def delete_key(self, store: KeyStore, gid: str, key: str) -> None:
        self.core.delete_key(self.state_of(store), gid, key)

    # -- Engine's entry points -------------------------------------------------------------
    def ingest(self, store: KeyStore, events: Iterable[Event], max_ts: int,
               *, end_of_input: int | None = None) -> Output:
        """`Engine.ingest`, same arguments and results."""
        events = events if isinstance(events, list) else list(events)
        matches, late, touched, released, reset = self.core.ingest(
            self.state_of(store), events, max_ts, end_of_input)
        return Output(matches=matches,
                      late=[LateEvent(ids, key, events[i], wm) for ids, key, i, wm in late],
                      keys_touched=touched, keys_released=released, keys_reset=reset,
                      partial_matches=self._partials())

    def advance(self, store: KeyStore, max_ts: int, *, end_of_input: int | None = None) -> Output:
        return self.ingest(store, [], max_ts, end_of_input=end_of_input)

    def next_wake(self, store: KeyStore) -> int | None:
        return self.core.next_wake(self.state_of(store))  # type: ignore[no-any-return]

    def ingest_batch(self, store: KeyStore, batch: Any, max_ts: int,
                     *, end_of_input: int | None = None) -> Output:
        """`ingest` from a pyarrow RecordBatch: columns `ts` and `seq` (integers), `stream`
        (optional when the engine reads one stream) and the event's fields; the event's data is
        every column but `stream` and `seq` (so the time field stays in it, as
        `events_from_dicts` keeps it) — or, when there is a `data` column, the JSON object in
        it (parsed by the core; the other columns are then not part of the event, and a `route`
        column says which key field a copy was routed by, as `Event.route`).

        The core reads the batch through the Arrow C data interface (no Python object per
        event; a row becomes a dict only for a result, a late report or serialised state).
        A batch the core does not read (another column type) is converted to events here
        (`events_from_batch`) and ingested as such: same results, slower."""
        st = self.state_of(store)
        stream = self._only_stream()
        json_col = "data" if "data" in batch.schema.names else None
        try:
            matches, late, touched, released, reset = self.core.ingest_arrow(
                st, batch, max_ts, end_of_input, stream, json_col)
        except _core.Unsupported:
            return self.ingest(store, events_from_batch(batch, stream), max_ts,
                               end_of_input=end_of_input)
        return Output(matches=matches,
                      late=[LateEvent(ids, key, events_from_batch(batch.slice(i, 1), stream)[0],
                                      wm) for ids, key, i, wm in late],
                      keys_touched=touched, keys_released=released, keys_reset=reset,
                      partial_matches=self._partials())

    def _partials(self) -> dict[str, int]:
        return dict(self.core.take_partials()) if self.core.track_partials else {}

    def _only_stream(self) -> str | None:
        streams = {g.stream for g in self.groups.values()}
        return next(iter(streams)) if len(streams) == 1 else None


def _declared_fields(runtimes: Sequence[RuleRuntime]) -> list[list[str]]:
    """The field names of the rules' declared streams, in order: the core stores an event
    with exactly these fields without their names (docs/native-core.md, key state v4)."""
    tables: dict[str, list[str]] = {}
    for r in runtimes:
        fields = getattr(getattr(r.meta, "stream", None), "fields", None)
        if fields:
            tables[r.stream] = [f.name for f in fields]
    return list(tables.values())


def events_from_batch(batch: Any, stream: str | None = None) -> list[Event]:
    names = list(batch.schema.names)
    ts = batch.column(names.index("ts")).to_pylist()
    seq = batch.column(names.index("seq")).to_pylist()
    if "stream" in names:
        streams = batch.column(names.index("stream")).to_pylist()
    elif stream is not None:
        streams = [stream] * batch.num_rows
    else:
        raise ValueError("a batch without a 'stream' column for an engine reading several streams")
    routes: list[Any] = [None] * batch.num_rows
    if "data" in names:
        datas = [json.loads(d) for d in batch.column(names.index("data")).to_pylist()]
        if "route" in names:
            routes = batch.column(names.index("route")).to_pylist()
    else:
        keep = [n for n in names if n not in ("stream", "seq")]
        datas = batch.select(keep).to_pylist()
    return [Event(s, t, q, d, r)
            for s, t, q, d, r in zip(streams, ts, seq, datas, routes, strict=True)]


__all__ = ["NativeEngine", "events_from_batch"]
