"""A rule set split over two engine loops: the rules the native core runs on `NativeEngine`, the
others (table lookups, OVER, window rules: docs/tables.md, docs/windows.md) on the Python
`Engine`, side by side, with the results of the Python engine over the whole rule set
(cep/runtime/engine.py is the specification; tests/core/test_mixed_engine_differential.py).

How the two parts are kept equal to one engine:
- Every event goes to both parts (a part ignores the streams it does not read), so each computes
  the same max event time, watermarks and safe times as the single engine would; table records
  go to the Python part only (the native core has no tables, and they must not move its time).
- A (stream, key field) group may be split: its native rules on one part, its Python-only rules
  on the other; each part buffers the key's events for its own rules. A stream's rules share
  its LATENESS, so a split group has the same watermark on both sides.
- Late reports: the single engine reports a late event once per event (per key field), naming
  every rule it was late for, in group order then rule order, with the key and watermark of
  the first late group. Each part's rules are ordered by that (group, rule) rank, so each part
  reports its first late group first; the two reports of one event are merged into one.
- Matches: the same multiset; within one call the native part's come first (the single engine
  orders them by state key). Nothing downstream depends on that order: `cep test` and replay
  sort the alerts, the live operator's output is a set of rows per call.
- `keys_touched` / `keys_released` / `keys_reset` are the sums of the parts: a key of a split
  group counts once per part. `live_keys` / `keys` count a key once.
- `next_wake`: the earlier of the parts'.

Key states: the Python part's in the caller's `MemoryKeyStore` (`store.states`, `store.wake`),
the native part's in a `MemoryKeyStore` of its own kept on the caller's; in the live Spark
operator, a `MixedShardStore` (a `NativeShardStore` and a `MapStateKeyStore`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from cep.runtime.engine import (
    Engine,
    Event,
    KeyStore,
    LateEvent,
    MemoryKeyStore,
    Output,
    RuleRuntime,
    TableRuntime,
    group_rules,
)
from cep.runtime.native_engine import NativeEngine

_ATTR = "_cep_mixed_native_store"


def rule_rank(runtimes: Sequence[RuleRuntime]) -> dict[str, tuple[int, int]]:
    """Per rule id, (its group's index, its index in the group), in the single engine's order."""
    rank: dict[str, tuple[int, int]] = {}
    for gi, group in enumerate(group_rules(runtimes)):
        for ri, rid in enumerate(group.rule_ids):
            rank[rid] = (gi, ri)
    return rank


class MixedEngine:
    """`Engine`'s API over a `NativeEngine` (the rules in `native_programs`) and a Python
    `Engine` (the others). `runtimes` are every enabled rule in rule-set order;
    `native_programs` maps the native rules' ids to their exported programs."""

    def __init__(self, runtimes: Sequence[RuleRuntime], native_programs: dict[str, Any],
                 tables: Sequence[TableRuntime] = (), *,
                 max_partial_matches: int | None = None, families: bool | None = None) -> None:
        if not native_programs or len(native_programs) == len(runtimes):
            raise ValueError("a mixed engine needs native rules and Python-only rules")
        self.rules = {r.rule_id: r for r in runtimes}
        self.rank = rule_rank(runtimes)
        ordered = sorted(runtimes, key=lambda r: self.rank[r.rule_id])
        native = [r for r in ordered if r.rule_id in native_programs]
        self.native = NativeEngine(native, [native_programs[r.rule_id] for r in native],
                                   max_partial_matches=max_partial_matches, families=families)
        self.python = Engine([r for r in ordered if r.rule_id not in native_programs], tables)
        self.tables = self.python.tables  # versioned tables: run_embedded keeps them out of time

    @property
    def track_partials(self) -> bool:
        return self.python.track_partials

    @track_partials.setter
    def track_partials(self, on: bool) -> None:
        self.python.track_partials = on
        self.native.track_partials = on

    # -- the stores ------------------------------------------------------------------------
    def _parts(self, store: KeyStore) -> tuple[Any, KeyStore]:
        """(the native part's store, the Python part's store)."""
        if isinstance(store, MixedShardStore):
            return store.native, store.python
        return self.native_store(store), store

    def native_store(self, store: KeyStore) -> MemoryKeyStore:
        if not isinstance(store, MemoryKeyStore):
            raise TypeError("the mixed engine keeps its key states in a MemoryKeyStore "
                            f"(got {type(store).__name__}); use cep.runtime.engine.Engine")
        held = getattr(store, _ATTR, None)
        if held is None:
            held = (self, MemoryKeyStore())
            setattr(store, _ATTR, held)
        elif held[0] is not self:
            raise ValueError("this store holds the key states of another mixed engine")
        return held[1]  # type: ignore[no-any-return]

    def keys(self, store: KeyStore) -> list[tuple[str, str]]:
        """The state keys (group id, key) with state in either part (table keys included),
        each once."""
        assert isinstance(store, MemoryKeyStore)
        own = {tuple(k) for k in self.native.keys(self.native_store(store))}
        return sorted(own | set(store.states))  # type: ignore[arg-type]

    def live_keys(self, store: KeyStore) -> int:
        return len(self.keys(store))

    # -- Engine's entry points -------------------------------------------------------------
    def ingest(self, store: KeyStore, events: Iterable[Event], max_ts: int,
               *, end_of_input: int | None = None) -> Output:
        events = events if isinstance(events, list) else list(events)
        tables = self.tables
        plain = [ev for ev in events if ev.stream not in tables] if tables and events \
            else events
        nstore, pstore = self._parts(store)
        a = self.native.ingest(nstore, plain, max_ts, end_of_input=end_of_input)
        b = self.python.ingest(pstore, events, max_ts, end_of_input=end_of_input)
        a.matches.extend(b.matches)
        if b.partial_matches:
            a.partial_matches.update(b.partial_matches)
        return Output(matches=a.matches, late=self._merge_late(plain, a.late, b.late),
                      keys_touched=a.keys_touched + b.keys_touched,
                      keys_released=a.keys_released + b.keys_released,
                      keys_reset=a.keys_reset + b.keys_reset,
                      partial_matches=a.partial_matches)

    def advance(self, store: KeyStore, max_ts: int, *, end_of_input: int | None = None) -> Output:
        return self.ingest(store, [], max_ts, end_of_input=end_of_input)

    def next_wake(self, store: KeyStore) -> int | None:
        nstore, pstore = self._parts(store)
        a = self.native.next_wake(nstore)
        b = self.python.next_wake(pstore)
        return b if a is None else a if b is None else min(a, b)

    def _merge_late(self, events: list[Event], a: list[LateEvent], b: list[LateEvent],
                    ) -> list[LateEvent]:
        """One report per late event (in event order) from the parts' reports."""
        if not a or not b:
            return a or b
        pending: dict[int, list[list[LateEvent]]] = {}
        for side, reports in enumerate((a, b)):
            for rep in reports:
                slot = pending.setdefault(id(rep.event), [[], []])
                slot[side].append(rep)
        out: list[LateEvent] = []
        rank = self.rank
        for ev in events:
            found = pending.get(id(ev))
            if found is None:
                continue
            got = [side.pop(0) for side in found if side]
            if not got:
                continue
            if len(got) == 1:
                out.append(got[0])
                continue
            first = min(got, key=lambda r: rank[r.rule_ids[0]])
            ids = tuple(sorted((*got[0].rule_ids, *got[1].rule_ids), key=rank.__getitem__))
            out.append(LateEvent(ids, first.key, first.event, first.watermark))
        return out


class MixedShardStore:
    """The live Spark operator's key store for a mixed rule set: the native loop's key states
    in a `cep.runtime.state_store.NativeShardStore` (`native`), the Python loop's in a
    `MapStateKeyStore` (`python`), each under its own state names, as the operator keeps them
    for an all-native or an all-Python rule set."""

    def __init__(self, native: Any, python: Any) -> None:
        self.native = native
        self.python = python

    def flush(self) -> None:
        self.native.flush()
        self.python.flush()

    @property
    def writes(self) -> int:
        return int(self.native.writes + self.python.writes)

    @writes.setter
    def writes(self, value: int) -> None:  # the operator resets the counts after each call
        self.native.writes = self.python.writes = value

    @property
    def reads(self) -> int:
        return int(self.native.reads + self.python.reads)

    @reads.setter
    def reads(self, value: int) -> None:
        self.native.reads = self.python.reads = value


__all__ = ["MixedEngine", "MixedShardStore", "rule_rank"]
