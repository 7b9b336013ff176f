"""The event-time engine: per (rule, key) buffering, ordering, deadlines, state release.

No Spark here. The same `Engine` runs embedded (`run_embedded`, over an iterator of events) and
inside the Spark operator (`cep.spark.operator`), each with its own `KeyStore`. See
docs/spark-runtime.md for the design and the watermark arithmetic.

Rules that read the same stream and partition by the same key field form a *group*; a key of a
group has one state: one event buffer and each rule's partial matches. So a key costs one state
read and write per call however many rules read it (docs/spark-runtime.md, "State layout").

Per call with a watermark W (per stream: max event time - allowed lateness):
1. new events go to their key's buffer; events older than W are returned as late;
2. buffered events with ts < W leave in (ts, seq) order through each rule's matcher, with the
   matcher's deadlines that fall before each event fired first;
3. deadlines < W fire; 4. a key with nothing buffered and no partial match is deleted.
An event at exactly W is on time (only ts < W is late), so time up to W - 1 is final, not W:
that is the *safe time* up to which events are released and deadlines fire. A limit is
inclusive (docs/semantics.md), so an event exactly at a deadline can still arrive in a later
batch and must be able to cancel an absence or extend a match. At the end of input every event
has arrived, and the safe time is the last event time itself.
The order of events into a matcher does not depend on how the stream was cut into batches.

Every key with state is in the wake index: at the max event time at which it next has work, or
at `AT_END` when only the end of input can decide it (a greedy tail with no time limit, an
unbounded rule): so the end of input reaches every such key without a per-rule special case.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cep.expr import EventWithRows
from cep.tables import DELETED

# The end of input: 9999-12-31T23:59:59Z in ms. Far beyond any real event, yet a valid Spark
# timestamp, so the replay job can send it through Spark as an end-of-input marker.
EOF_TS = 253_402_300_799_000
NEG_INF = -(2**62)
# The wake time of a key that only the end of input can decide: beyond any real max event time,
# below EOF_TS so that the end-of-input marker's watermark passes the Spark timer set for it.
AT_END = EOF_TS - 1


class RuleMatcher(Protocol):
    """What the engine drives for one rule: `cep.runtime.matcher.Matcher` (Python) or
    `cep._core.Matcher` (native) implement it."""

    def initial(self) -> Any: ...
    def on_event(self, state: Any, event: Mapping[str, Any], ts: int, seq: Any,
                 key: str) -> tuple[Any, list[Any]]: ...
    def on_time(self, state: Any, now: int, key: str) -> tuple[Any, list[Any]]: ...
    def next_deadline(self, state: Any) -> int | None: ...
    def is_empty(self, state: Any) -> bool: ...
    def partial_count(self, state: Any) -> int: ...
    def on_end(self, state: Any, key: str) -> tuple[Any, list[Any]]:
        """End of input: emit what is complete (e.g. a greedy tail), drop the rest."""
        ...

    # Optional: `on_events(state, items, key, out) -> state` feeds several (ts, seq, data) in
    # order, firing deadlines before each as above and appending results to `out`.


@dataclass(frozen=True, slots=True)
class RuleRuntime:
    """What the engine needs of a compiled rule."""

    rule_id: str
    stream: str
    key_field: str
    lateness_ms: int
    matcher: RuleMatcher
    meta: Any = None  # what output formatting needs (the compiled rule)
    # Identifies the compiled rule's content: state built by another version is discarded.
    content_hash: str = ""
    # (table, event field) lookups its expressions make (docs/tables.md).
    lookups: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class TableRuntime:
    """What the engine needs of a declared table (`cep.nfa.TableSpec`): its records arrive as
    `Event`s of the stream named like the table; a static table's rows are given here."""

    name: str
    key: str
    static_rows: tuple[Mapping[str, Any], ...] | None = None  # None: versioned (records)


TABLE_PREFIX = "\x00table:"  # a table's state key is (TABLE_PREFIX + name, table key)
Version = tuple[int, Any, Mapping[str, Any] | None]  # (time, seq, row; None: deleted)


def as_of(versions: Sequence[Version], ts: int) -> Mapping[str, Any] | None:
    """The row in force at `ts`: the last version whose time is <= ts (None if none/deleted)."""
    i = bisect.bisect_right(versions, ts, key=_ts) - 1
    return versions[i][2] if i >= 0 else None


def insert_version(versions: list[Version], version: Version, keep_from: int) -> list[Version]:
    """`versions` with `version` in its (time, seq) place (replacing an equal one: a record
    delivered twice), without the versions no event after `keep_from` can read."""
    order = (version[0], version[1])
    i = bisect.bisect_left(versions, order, key=_order)
    if i < len(versions) and _order(versions[i]) == order:
        versions[i] = version
    else:
        versions.insert(i, version)
    # Keep the last version at or before keep_from (it governs the events after it) and all
    # later ones.
    j = bisect.bisect_right(versions, keep_from, key=_ts) - 1
    if j > 0:
        del versions[:j]
    return versions


def content_seq(data: Mapping[str, Any]) -> int:
    """A source-independent tie-break for events without a source position (files): a hash of
    the event's canonical JSON. Equal events get equal values, which orders them the same way
    in every mode; distinct events at the same time are ordered by content."""
    raw = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str).encode()
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "big", signed=True)


def events_from_dicts(stream: str, dicts: Iterable[Mapping[str, Any]], time_field: str = "ts",
                      ) -> list[Event]:
    return [Event(stream, int(d[time_field]), content_seq(d), d) for d in dicts]


@dataclass(frozen=True, slots=True)
class Event:
    stream: str
    ts: int
    seq: Any  # a totally ordered tie-break: source position
    data: Mapping[str, Any]
    # The key field this copy of the event was routed by (Spark sends an event once per key
    # field of its stream, each copy to the shard of that key): only that field's rules see it.
    # None: every rule of the stream (the embedded mode).
    route: str | None = None


@dataclass(frozen=True, slots=True)
class LateEvent:
    """An event older than the watermark of the rules that read it: reported once per event
    (per key field), naming every rule it was late for."""

    rule_ids: tuple[str, ...]
    key: str
    event: Event
    watermark: int


@dataclass
class Output:
    matches: list[Any] = field(default_factory=list)
    late: list[LateEvent] = field(default_factory=list)
    keys_touched: int = 0
    keys_released: int = 0
    # Keys whose state belonged to a rule that was removed or changed since it was written.
    keys_reset: int = 0
    # Per rule, the change in live partial matches over the call (only when the engine's
    # `track_partials` is on: the live job's metrics; not worth its cost elsewhere).
    partial_matches: dict[str, int] = field(default_factory=dict)


# A key's state: (buffer, parts). The buffer is a sorted list of (ts, seq, data) not yet passed
# by the watermark; parts maps a rule id to (the rule's content hash, matcher state) for the
# rules of the key's group with a partial match alive.
Buffered = tuple[int, Any, Mapping[str, Any]]
KeyState = tuple[list[Buffered], dict[str, tuple[str, Any]]]
StateKey = tuple[str, str]  # (group id, key)


@dataclass(frozen=True, slots=True)
class RuleGroup:
    """The rules that read one stream and partition by one key field: they share each key's
    state (one buffer, one store entry) and its place in the wake index."""

    gid: str
    stream: str
    key_field: str
    lateness_ms: int
    rules: tuple[RuleRuntime, ...]
    rule_ids: tuple[str, ...]
    lookups: tuple[tuple[str, str], ...] = ()  # every lookup of its rules


def group_rules(rules: Sequence[RuleRuntime]) -> list[RuleGroup]:
    members: dict[tuple[str, str], list[RuleRuntime]] = {}
    for r in rules:
        members.setdefault((r.stream, r.key_field), []).append(r)
    return [RuleGroup(f"{stream}:{kf}", stream, kf, max(r.lateness_ms for r in rs), tuple(rs),
                      tuple(r.rule_id for r in rs),
                      tuple(sorted({lk for r in rs for lk in r.lookups})))
            for (stream, kf), rs in members.items()]


class Wake:
    """When each key next has work: `at[key]` is the max event time at which it is due; a heap
    of (time, key) finds the due keys without scanning every key (entries superseded in `at`
    are skipped and dropped lazily). Picklable: the Spark store keeps one per shard."""

    __slots__ = ("at", "heap")

    def __init__(self) -> None:
        self.at: dict[StateKey, int] = {}
        self.heap: list[tuple[int, StateKey]] = []

    def __getstate__(self) -> tuple[dict[StateKey, int], list[tuple[int, StateKey]]]:
        return self.at, self.heap

    def __setstate__(self, state: tuple[dict[StateKey, int], list[tuple[int, StateKey]]]) -> None:
        self.at, self.heap = state

    def set(self, sk: StateKey, when: int) -> None:
        if self.at.get(sk) != when:
            self.at[sk] = when
            heapq.heappush(self.heap, (when, sk))
            if len(self.heap) > 2 * len(self.at) + 64:  # too many superseded entries
                self.heap = [(t, k) for k, t in self.at.items()]
                heapq.heapify(self.heap)

    def discard(self, sk: StateKey) -> None:
        self.at.pop(sk, None)

    def pop_due(self, top: int) -> list[StateKey]:
        """Keys due at or before `top`; their entries are consumed (the caller re-sets them)."""
        due = []
        heap, at = self.heap, self.at
        while heap and heap[0][0] <= top:
            when, sk = heapq.heappop(heap)
            if at.get(sk) == when:
                del at[sk]
                due.append(sk)
        return due

    def pop_all(self) -> list[StateKey]:
        keys = list(self.at)
        self.at, self.heap = {}, []
        return keys

    def next(self) -> int | None:
        heap, at = self.heap, self.at
        while heap and at.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def __len__(self) -> int:
        return len(self.at)


class KeyStore(Protocol):
    def get(self, sk: StateKey) -> KeyState | None: ...
    def put(self, sk: StateKey, state: KeyState) -> None: ...
    def delete(self, sk: StateKey) -> None: ...
    def load_wake(self) -> Wake: ...
    def save_wake(self, wake: Wake) -> None: ...


class MemoryKeyStore:
    """In-process KeyStore for the embedded mode and tests."""

    def __init__(self) -> None:
        self.states: dict[StateKey, KeyState] = {}
        self.wake = Wake()

    def get(self, sk: StateKey) -> KeyState | None:
        return self.states.get(sk)

    def put(self, sk: StateKey, state: KeyState) -> None:
        self.states[sk] = state

    def delete(self, sk: StateKey) -> None:
        self.states.pop(sk, None)

    def load_wake(self) -> Wake:
        return self.wake

    def save_wake(self, wake: Wake) -> None:
        self.wake = wake


class Engine:
    def __init__(self, rules: Sequence[RuleRuntime], tables: Sequence[TableRuntime] = ()) -> None:
        self._eof = False
        self.track_partials = False
        self.rules = {r.rule_id: r for r in rules}
        self.groups = {g.gid: g for g in group_rules(rules)}
        self.by_stream: dict[str, list[RuleGroup]] = {}
        for g in self.groups.values():
            self.by_stream.setdefault(g.stream, []).append(g)
        # Versioned tables (their records come as events of the stream named like the table)
        # and static ones (rows by key, held here). docs/tables.md.
        self.tables = {t.name: t for t in tables if t.static_rows is None}
        self.static: dict[str, dict[str, Mapping[str, Any]]] = {
            t.name: {_key(r.get(t.key)): r for r in t.static_rows}
            for t in tables if t.static_rows is not None}
        self.table_groups: dict[str, list[str]] = {}
        for g in self.groups.values():
            for table, _ in g.lookups:
                if g.gid not in self.table_groups.setdefault(table, []):
                    self.table_groups[table].append(g.gid)
        self.table_records = 0  # table records applied (for tests and metrics)

    # -- the two entry points -------------------------------------------------------------
    def ingest(self, store: KeyStore, events: Iterable[Event], max_ts: int,
               *, end_of_input: int | None = None) -> Output:
        """Add events and advance every key whose wake time the watermark has passed.

        `max_ts` is the highest event time seen so far, over all streams (Spark keeps one
        watermark per query; `run_embedded` does the same). Each rule's watermark is that minus
        its stream's allowed lateness, so a stream that lags the others by more than its
        lateness has its events reported late: interleave streams by event time (as
        `cep.runtime.embedded.alerts_for` does), or give lagging streams a larger LATENESS.

        `end_of_input`, when given, is the last event time of a finished input: every rule's
        watermark becomes that time (lateness no longer matters: nothing else will come),
        every key with state is advanced, and deadlines after it do not fire.

        A rule without PARTITION BY (key field "") sees the whole stream as one partition,
        under the key "" (as SQL's MATCH_RECOGNIZE without PARTITION BY).
        """
        eof = end_of_input is not None
        if end_of_input is not None:
            max_ts = end_of_input
        self._eof = eof
        events = events if isinstance(events, list) else list(events)
        if self.tables and events:
            records = [ev for ev in events if ev.stream in self.tables]
            if records:
                events = [ev for ev in events if ev.stream not in self.tables]
        else:
            records = []
        # Lateness is judged against the watermark from before this call (as Spark judges it).
        # Release goes up to the watermark *including* this call's events: Spark's own will be
        # at least that high at the next batch, so nothing released could still be preceded by
        # an on-time event, and each event is matched in the call that brings it (one state
        # read and write per key instead of two).
        late_wms = {gid: (max_ts if eof else max_ts - g.lateness_ms)
                    for gid, g in self.groups.items()}
        if events and not eof:
            max_ts = max(max_ts, max(ev.ts for ev in events))
        # The safe time per group: every event at or before it has arrived (see the module doc).
        safe = {gid: (max_ts if eof else max_ts - g.lateness_ms - 1)
                for gid, g in self.groups.items()}
        out = Output()
        wake = store.load_wake()
        # Table versions are pruned to what the events not yet released can read: every
        # on-time event, of this call too, is at or after the watermark from before it.
        keep = {g: NEG_INF if eof else wm - 1 for g, wm in late_wms.items()}
        if records:
            self._apply_records(store, wake, records, keep)
        pending: dict[StateKey, list[Buffered]] = {}
        by_stream = self.by_stream
        for ev in events:
            groups = by_stream.get(ev.stream)
            if not groups:
                continue
            data = ev.data
            late_for: tuple[str, ...] = ()
            late_key = ""
            late_wm = 0
            route = ev.route
            for g in groups:
                if route is not None and g.key_field != route:
                    continue
                key = data.get(g.key_field) if g.key_field else ""
                if key is None:
                    continue
                if ev.ts < late_wms[g.gid]:
                    if not late_for:
                        late_key, late_wm = str(key), late_wms[g.gid]
                    late_for += g.rule_ids
                    continue
                sk = (g.gid, key if isinstance(key, str) else str(key))
                bucket = pending.get(sk)
                if bucket is None:
                    pending[sk] = [(ev.ts, ev.seq, data)]
                else:
                    bucket.append((ev.ts, ev.seq, data))
            if late_for:
                out.late.append(LateEvent(late_for, late_key, ev, late_wm))
        due = set(pending)
        due.update(wake.pop_all() if eof else wake.pop_due(max_ts))
        order = sorted(due)
        for k, sk in enumerate(order):
            if sk[0].startswith(TABLE_PREFIX):
                self._compact(store, wake, sk, keep)
                continue
            group = self.groups.get(sk[0])
            if group is None:  # its rules were removed while the job ran: drop the state
                store.delete(sk)
                out.keys_reset += 1
                continue
            try:
                self._advance(store, wake, sk, group, pending.get(sk), safe[sk[0]], out)
            except BaseException:
                # The keys not advanced (this one too: `_advance` kept what it did not
                # consume) keep their state and come due again; their events of this call
                # are dropped. As the native core does (docs/native-core.md).
                for left in order[k:]:
                    self._wake_again(store, wake, left)
                store.save_wake(wake)
                raise
        store.save_wake(wake)
        return out

    def _wake_again(self, store: KeyStore, wake: Wake, sk: StateKey) -> None:
        """Set the wake of a key with state that a failed call did not advance (the time the
        end of `_advance` would set, or for a table key the one its versions set)."""
        if sk[0].startswith(TABLE_PREFIX):
            versions: Any = store.get(sk)
            if versions:
                self._wake_versions(wake, sk, versions)
            return
        group = self.groups.get(sk[0])
        state = None if group is None else store.get(sk)
        if group is not None and state is not None:
            wake.set(sk, _wake_time(group, *state))

    def _apply_records(self, store: KeyStore, wake: Wake, records: list[Event],
                       keep: Mapping[str, int]) -> None:
        """Table records into their key's versions (never into the watermark: only events
        move it). A record behind the safe time is still put in its place: it governs the
        events not yet released (docs/tables.md, "Temporal semantics"). A table no rule of
        this engine reads keeps nothing."""
        for ev in records:
            table = self.tables[ev.stream]
            key = ev.data.get(table.key)
            gids = self.table_groups.get(table.name)
            if key is None or not gids:
                continue
            row = None if ev.data.get(DELETED) is True else ev.data
            sk = (TABLE_PREFIX + table.name, _key(key))
            versions: Any = store.get(sk)
            versions = insert_version(list(versions) if versions else [], (ev.ts, ev.seq, row),
                                      self._keep_from(table.name, keep))
            self._store_versions(store, wake, sk, versions, keep)
            self.table_records += 1

    def _keep_from(self, table: str, keep: Mapping[str, int]) -> int:
        gids = self.table_groups.get(table) or ()
        return min((keep[g] for g in gids if g in keep), default=NEG_INF)

    def _store_versions(self, store: KeyStore, wake: Wake, sk: StateKey,
                        versions: list[Version], keep: Mapping[str, int]) -> None:
        """Put a key's versions back, or delete the key when only a delete behind the
        watermark is left; wake the key when its oldest version (or its delete) can go."""
        table = sk[0][len(TABLE_PREFIX):]
        if len(versions) == 1 and versions[0][2] is None \
                and versions[0][0] <= self._keep_from(table, keep):
            store.delete(sk)  # deleted, and nothing left to read an older version
            wake.discard(sk)
            return
        store.put(sk, versions)  # type: ignore[arg-type]  # a table key's state: its versions
        self._wake_versions(wake, sk, versions)

    def _wake_versions(self, wake: Wake, sk: StateKey, versions: list[Version]) -> None:
        """Wake a table key when its oldest version (or its delete) can go."""
        table = sk[0][len(TABLE_PREFIX):]
        lateness = max((self.groups[g].lateness_ms for g in self.table_groups.get(table, ())),
                       default=0)
        if len(versions) > 1:
            wake.set(sk, versions[1][0] + lateness + 1)
        elif versions[0][2] is None:
            wake.set(sk, versions[0][0] + lateness + 1)
        else:
            wake.discard(sk)

    def _compact(self, store: KeyStore, wake: Wake, sk: StateKey,
                 keep: Mapping[str, int]) -> None:
        """A table key's wake: drop the versions no event can read any more."""
        versions: Any = store.get(sk)
        if not versions:
            return
        table = sk[0][len(TABLE_PREFIX):]
        if table not in self.tables or not self.table_groups.get(table):
            # The table left the rules, or no enabled rule reads it: its versions go (else the
            # key would stay, woken again at every call, with nothing to prune them).
            store.delete(sk)
            return
        keep_from = self._keep_from(table, keep)
        versions = list(versions)
        j = bisect.bisect_right(versions, keep_from, key=_ts) - 1
        if j > 0:
            del versions[:j]
        self._store_versions(store, wake, sk, versions, keep)

    def _with_rows(self, store: KeyStore, group: RuleGroup,
                   items: list[Buffered]) -> list[Buffered]:
        """Each event with the table rows its group's rules read, as of the event's time."""
        out: list[Buffered] = []
        cache: dict[StateKey, Any] = {}
        static = self.static
        for ts, seq, data in items:
            rows: dict[tuple[str, str], Any] = {}
            for table, fname in group.lookups:
                value = data.get(fname)
                if value is None:
                    rows[(table, fname)] = None
                    continue
                if table in static:
                    rows[(table, fname)] = static[table].get(_key(value))
                    continue
                sk = (TABLE_PREFIX + table, _key(value))
                if sk in cache:
                    versions = cache[sk]
                else:
                    versions = cache[sk] = store.get(sk)
                rows[(table, fname)] = as_of(versions, ts) if versions else None
            out.append((ts, seq, EventWithRows(data, rows)))
        return out

    def advance(self, store: KeyStore, max_ts: int,
                *, end_of_input: int | None = None) -> Output:
        """Time passed with no new events (a timer fired, or the end of input)."""
        return self.ingest(store, (), max_ts, end_of_input=end_of_input)

    def next_wake(self, store: KeyStore) -> int | None:
        """The smallest max-event-time at which some key of this store has work to do."""
        return store.load_wake().next()

    def _advance(self, store: KeyStore, wake: Wake, sk: StateKey, group: RuleGroup,
                 new: list[Buffered] | None, safe: int, out: Output) -> None:
        """Add the key's new events, release what is safe, fire deadlines up to `safe`."""
        key = sk[1]
        loaded = store.get(sk)
        buffer, parts = loaded if loaded is not None else ([], {})
        if new:
            if buffer:
                buffer.extend(new)
            else:
                buffer = new
            if len(buffer) > 1:
                buffer.sort(key=_order)
        # Release buffered events up to the safe time, in (ts, seq) order.
        if not buffer:
            n = 0
        elif buffer[-1][0] <= safe:
            n = len(buffer)
        else:
            n = bisect.bisect_right(buffer, safe, key=_ts)
        released = buffer[:n]
        del buffer[:n]
        if released and group.lookups:
            released = self._with_rows(store, group, released)
        kept: dict[str, tuple[str, Any]] = {}
        try:
            self._run_rules(group, key, parts, released, safe, out, kept)
        except BaseException:
            # A rule raised: the key keeps what the call did not consume (its events not
            # released, the parts of the rules not run yet), whatever store holds it and
            # whether or not it had buffered events before (the native core's `keep_unconsumed`).
            if buffer or parts:
                store.put(sk, (buffer, parts))
            elif loaded is not None:
                store.delete(sk)
            raise
        out.keys_reset += len(parts)  # parts of rules that left the group
        out.keys_touched += 1
        if not buffer and not kept:
            if loaded is not None:
                store.delete(sk)
            wake.discard(sk)
            out.keys_released += 1
            return
        store.put(sk, (buffer, kept))
        wake.set(sk, _wake_time(group, buffer, kept))

    def _run_rules(self, group: RuleGroup, key: str, parts: dict[str, tuple[str, Any]],
                   released: list[Buffered], safe: int, out: Output,
                   kept: dict[str, tuple[str, Any]]) -> None:
        """The released events and deadlines through each rule of the key's group: each
        rule's part is taken from `parts`, and put in `kept` while it has partial matches."""
        eof = self._eof
        track = self.track_partials
        for rule in group.rules:
            matcher = rule.matcher
            part = parts.pop(rule.rule_id, None)
            if part is None:
                mstate = matcher.initial()
            elif part[0] != rule.content_hash:
                # Written by another version of the rule: its partial matches refer to another
                # NFA. Buffered events have not been matched yet; they go to the new version.
                mstate = matcher.initial()
                out.keys_reset += 1
            else:
                mstate = part[1]
            before = (matcher.partial_count(part[1])
                      if track and part is not None and part[0] == rule.content_hash else 0)
            if released:
                feed = getattr(matcher, "on_events", None)
                if feed is not None:
                    mstate = feed(mstate, released, key, out.matches)
                else:
                    mstate = _feed_each(matcher, mstate, released, key, out.matches)
            deadline = matcher.next_deadline(mstate)
            if deadline is not None and deadline <= safe:
                mstate, fired = matcher.on_time(mstate, safe, key)
                out.matches.extend(fired)
            if eof:
                mstate, final = matcher.on_end(mstate, key)
                out.matches.extend(final)
            if track:
                after = 0 if matcher.is_empty(mstate) else matcher.partial_count(mstate)
                if after != before:
                    pm = out.partial_matches
                    pm[rule.rule_id] = pm.get(rule.rule_id, 0) + after - before
            if not matcher.is_empty(mstate):
                kept[rule.rule_id] = (rule.content_hash, mstate)


def _wake_time(group: RuleGroup, buffer: list[Buffered],
               parts: Mapping[str, tuple[str, Any]]) -> int:
    """When a key is due: the safe time reaches its first buffered event or a matcher's next
    deadline (safe = max event time - lateness - 1), given as the max event time at which that
    happens; a key that only the end of input can decide waits for it (`AT_END`). Parts of
    another version of a rule are not read (they are reset when the key is advanced)."""
    due: int | None = buffer[0][0] if buffer else None
    for rule in group.rules:
        part = parts.get(rule.rule_id)
        if part is not None and part[0] == rule.content_hash:
            deadline = rule.matcher.next_deadline(part[1])
            if deadline is not None and (due is None or deadline < due):
                due = deadline
    return AT_END if due is None else due + group.lateness_ms + 1


def _feed_each(matcher: RuleMatcher, mstate: Any, items: list[Buffered], key: str,
               out: list[Any]) -> Any:
    """Events through a matcher without `on_events`: fire the deadlines that fall before each
    event (`on_time` at ts - 1), then the event."""
    for ts, seq, data in items:
        deadline = matcher.next_deadline(mstate)
        if deadline is not None and deadline < ts:
            mstate, fired = matcher.on_time(mstate, ts - 1, key)
            out.extend(fired)
        mstate, found = matcher.on_event(mstate, data, ts, seq, key)
        out.extend(found)
    return mstate


def _order(item: Buffered | Version | tuple[int, Any]) -> tuple[int, Any]:
    return item[0], item[1]


def _ts(item: Buffered | Version | int) -> int:
    return item if isinstance(item, int) else item[0]


def _key(value: Any) -> str:
    """A table key as text; a whole float is its integer (5.0 looks up the row of key 5)."""
    if isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def run_embedded(engine: Engine, events: Iterable[Event], *, batch_size: int = 1,
                 store: KeyStore | None = None, late: list[LateEvent] | None = None,
                 ) -> Iterator[Any]:
    """Run the engine in-process over an event iterator, then flush at end of input.

    As in Spark, one watermark follows the highest event time seen (over all streams), and a
    batch is processed with the watermark from before it. At the end of input the watermark
    moves to the last event time seen (`Engine.ingest`'s `end_of_input`). Late events are
    appended to `late` when given.
    """
    store = store if store is not None else MemoryKeyStore()
    max_ts = NEG_INF
    chunk: list[Event] = []

    def step() -> Iterator[Any]:
        nonlocal max_ts
        out = engine.ingest(store, chunk, max_ts)
        if late is not None:
            late.extend(out.late)
        # Table records do not move event time (docs/tables.md).
        max_ts = max(max_ts, max((ev.ts for ev in chunk if ev.stream not in tables),
                                 default=max_ts))
        yield from out.matches

    tables = getattr(engine, "tables", None) or {}
    for ev in events:
        chunk.append(ev)
        if len(chunk) >= batch_size:
            yield from step()
            chunk = []
    if chunk:
        yield from step()
    if max_ts != NEG_INF:
        yield from engine.advance(store, max_ts, end_of_input=max_ts).matches


__all__ = [
    "AT_END", "EOF_TS", "Engine", "Event", "KeyStore", "LateEvent", "MemoryKeyStore", "Output",
    "RuleGroup", "RuleRuntime", "TableRuntime", "as_of", "group_rules", "insert_version",
    "content_seq", "events_from_dicts", "run_embedded",
]
