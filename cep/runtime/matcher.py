"""The matcher core: one compiled rule over one key's events, in event-time order.

`Matcher(rule)` precomputes per-state transition tables and binds every condition into a closure
once. It then advances a key's *state* one event at a time (`on_event`) and as event time passes
(`on_time`); both return the new state and the results that became final. The engine owns
event time: it delivers each key's events sorted by `(ts, seq)` and calls `on_time(state, t)`
once every event with `ts <= t` has been delivered (the watermark).

Semantics (docs/semantics.md has the long form):
- Matches are chosen as MATCH_RECOGNIZE chooses them: the earliest start wins; among the matches
  from one start, the preferred one (greedy: longer, reluctant: shorter, `|`: left first) wins;
  the AFTER MATCH SKIP strategy decides where the next match may start. ALL MATCHES reports
  every distinct match instead. A result is emitted as soon as it is final, so a greedy
  quantifier at the end of a pattern waits for the event that ends it or for its time limit.
- A partial match dies when event time reaches its deadline: first event + WITHIN, previous
  event + STEP WITHIN. A pattern ending in `-> NOT X` completes when that deadline passes
  without an X. A limit is inclusive: with WITHIN 10s an event 10 s after the first still counts.
- `flush(state)` ends the stream: it is `on_time(state, +infinity)` — every deadline passes,
  pending absences complete, waiting greedy matches are emitted, partial matches without any time
  limit are discarded.

State is plain data — `None` when no partial match is alive, else a tuple
`(next_row, runs, next_deadline)` with `runs = ((start_row, entries, timed_out, matched), ...)`,
`entries = ((state_id | -1, caps), ...)` in preference order (-1: a complete match waiting for
earlier or preferred alternatives to be decided) and `caps = ((var, row, event, ts, seq), ...)`.
It is picklable, holds only what can still complete, and is `None` again as soon as nothing can.
`on_event` consumes its input state: do not reuse a state after passing it in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from cep.nfa import ACCEPT, CompiledRule, Conn, Nfa, Skip, SkipStrategy, StateKind

DONE = -1  # entry position of a complete match
DEFAULT_MAX_PARTIAL_MATCHES = 10_000
FOREVER = math.inf

Caps = tuple[tuple[int, int, Any, int, Any], ...]
Entry = tuple[int, Caps]
Run = tuple[int, tuple[Entry, ...], Caps | None, bool]
State = tuple[int, tuple[Run, ...], float | None] | None


@dataclass(frozen=True, slots=True)
class MatchedEvent:
    var: str
    ts: int
    seq: Any
    event: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Match:
    """A complete match. `events` are in match order; `measures` are the rule's MEASURES."""

    rule_id: str
    version: int
    alert: str
    key: Any
    events: tuple[MatchedEvent, ...]
    first_ts: int
    last_ts: int
    measures: dict[str, Any] = field(default_factory=dict)
    kind = "match"

    def by_var(self) -> dict[str, list[MatchedEvent]]:
        out: dict[str, list[MatchedEvent]] = {}
        for e in self.events:
            out.setdefault(e.var, []).append(e)
        return out


@dataclass(frozen=True, slots=True)
class Timeout:
    """A partial match cut off by its time limit (only for rules with ON TIMEOUT EMIT)."""

    rule_id: str
    version: int
    alert: str
    key: Any
    events: tuple[MatchedEvent, ...]
    first_ts: int
    last_ts: int
    deadline_ts: int
    measures: dict[str, Any] = field(default_factory=dict)
    kind = "timeout"


@dataclass(frozen=True, slots=True)
class Dropped:
    """Partial matches dropped because the per-key cap was reached (oldest first)."""

    rule_id: str
    version: int
    key: Any
    count: int
    ts: int
    kind = "dropped"


Result = Match | Timeout | Dropped


def plain_fields(cls: type) -> tuple[str, ...] | None:
    """The field names of result class `cls`, in order, when calling it only sets its fields
    from its arguments (`object.__setattr__` per field: a frozen dataclass's generated
    `__init__`); else None. The native core then makes its `Match`es so, without running that
    `__init__`'s Python code (docs/native-core.md, session 21, gc21); a class that does more (a
    `__post_init__`, an `__init__` of its own, an `InitVar`, a field without `init`, a `__new__`,
    a metaclass, e.g. `ABCMeta`, whose call refuses abstract classes) gives None and is called."""
    init = cls.__dict__.get("__init__")
    code = getattr(init, "__code__", None)
    if (type(cls) is not type or not is_dataclass(cls) or code is None
            or hasattr(cls, "__post_init__") or cls.__new__ is not object.__new__
            # the generated frozen __init__ (3.11) sets fields through this closure variable;
            # an __init__ written in the class body has no such variable
            or "__dataclass_builtins_object__" not in code.co_freevars):
        return None
    fs = fields(cls)
    if any(not f.init for f in fs) or code.co_argcount != len(fs) + 1:
        return None
    return tuple(f.name for f in fs)


@dataclass(slots=True)
class MatcherStats:
    events: int = 0
    matches: int = 0
    timeouts: int = 0
    dropped: int = 0
    max_partial_matches_seen: int = 0


class Matcher:
    """Runs one compiled rule. Stateless between calls except for `stats` (counters)."""

    def __init__(self, rule: CompiledRule, *, max_partial_matches: int | None = None,
                 near_misses: bool = False) -> None:
        """`near_misses`: report timed-out partial matches as `Timeout`s (alert "near miss") even
        for a rule without ON TIMEOUT, as the console's playground shows them."""
        self.rule = rule
        nfa: Nfa = rule.nfa
        self.nfa = nfa
        self.cap = max_partial_matches or rule.max_partial_matches or DEFAULT_MAX_PARTIAL_MATCHES
        self.stats = MatcherStats()
        self.key_field = rule.key_field
        self.vars = nfa.vars
        self.within = nfa.within_ms
        self.step = nfa.step_ms
        self.skip: SkipStrategy = rule.skip
        self.all_matches = rule.skip.kind is Skip.ALL_MATCHES
        self.want_timeouts = rule.on_timeout is not None or near_misses
        self.timeout_alert = rule.on_timeout.alert if rule.on_timeout else "near miss"
        conds = [c.bind() if c is not None else None for c in nfa.conditions]
        self.cond: list[Callable[[Any, Caps], Any] | None] = conds
        self.local = [c is None or c.is_local for c in nfa.conditions]
        self.history_free = nfa.history_free and not self.all_matches
        # per state: (is_absence, var, conn, next (ACCEPT -> DONE), not_next, not_followed, after)
        self.table: list[
            tuple[bool, int, Conn, tuple[int, ...], tuple[int, ...], tuple[int, ...], int]
        ] = []
        for st in nfa.states:
            nxt = tuple(DONE if t == ACCEPT else t for t in st.next)
            after = st.after_first if st.after_first >= 0 else st.id
            self.table.append(
                (
                    st.kind is StateKind.ABSENCE,
                    st.var,
                    st.conn,
                    nxt,
                    st.not_next,
                    st.not_followed,
                    after,
                )
            )
        self.starts = tuple(
            (nfa.states[s].var, tuple(DONE if t == ACCEPT else t for t in nfa.states[s].next))
            for s in nfa.initial
        )
        self.measures = tuple((name, e.bind()) for name, e in rule.measures)
        self._key_given: Any = None

    # ------------------------------------------------------------------------------ public API

    def initial(self) -> State:
        return None

    @staticmethod
    def is_empty(state: State) -> bool:
        return state is None

    def on_event(
        self,
        state: State,
        event: Mapping[str, Any],
        ts: int,
        seq: Any = 0,
        key: Any = None,
        pre: Sequence[bool | None] | None = None,
    ) -> tuple[State, list[Result]]:
        """Feed the next event of this key (`ts` in epoch ms, never decreasing).

        `key` is the partition key reported in results (default: the key field of the match's
        first event). `pre`, if given, holds precomputed results of local conditions per
        variable (`None` where not precomputed), e.g. from `cep.expr_columns.condition_mask`
        over a batch; no engine passes it today (None).
        """
        self._key_given = key
        out: list[Result] = []
        return self._feed(state, event, ts, seq, pre, out), out

    def on_events(self, state: State, items: Sequence[tuple[int, Any, Mapping[str, Any]]],
                  key: Any, out: list[Result]) -> State:
        """`on_event` for each `(ts, seq, event)` in order, results appended to `out`: the
        engine's hot path (one call per key and rule, not per event)."""
        self._key_given = key
        feed = self._feed
        for ts, seq, event in items:
            state = feed(state, event, ts, seq, None, out)
        return state

    def _feed(self, state: State, event: Mapping[str, Any], ts: int, seq: Any,
              pre: Sequence[bool | None] | None, out: list[Result]) -> State:
        self.stats.events += 1
        if state is not None and state[2] is not None and state[2] <= ts - 1:
            state = self._advance(state, ts - 1, out)
        local: list[Any] = [None] * len(self.vars) if pre is None else list(pre)
        if state is None:
            spawned = self._spawn(event, ts, seq, 0, local)
            if not spawned:
                return None
            runs: list[Run] = [(0, spawned, None, False)]
            row = 0
        else:
            row = state[0]
            runs = []
            for start, entries, tpart, matched in state[1]:
                stepped = self._step(entries, event, ts, seq, row, local)
                runs.append((start, stepped, tpart, matched))
            spawned = self._spawn(event, ts, seq, row, local)
            if spawned:
                runs.append((row, spawned, None, False))
        return self._settle(row + 1, runs, out, ts)

    def on_time(self, state: State, now: float, key: Any = None) -> tuple[State, list[Result]]:
        """Event time has reached `now`: every event with `ts <= now` has been delivered."""
        self._key_given = key
        out: list[Result] = []
        if state is None or state[2] is None or state[2] > now:
            return state, out
        return self._advance(state, now, out), out

    def flush(self, state: State, key: Any = None) -> tuple[State, list[Result]]:
        """Time runs out: `on_time(state, +inf)`. Every deadline passes: absences complete,
        partial matches time out, waiting greedy matches are emitted. Returns an empty state."""
        self._key_given = key
        out: list[Result] = []
        if state is None:
            return None, out
        self._advance(state, FOREVER, out)
        return None, out

    def on_end(self, state: State, key: Any = None) -> tuple[State, list[Result]]:
        """End of input (a replay reached its last event): no more events will come, but event
        time stops where it is. What needs no more time is emitted (a greedy tail waiting for
        the event that ends it; a trailing "not next" with no deadline); what needs time to pass
        is dropped (absences whose deadline has not passed, partial matches that would time
        out). Call `on_time(state, last_ts)` first so deadlines up to the last event fire."""
        self._key_given = key
        out: list[Result] = []
        if state is None:
            return None, out
        row, old_runs, _ = state
        runs: list[Run] = []
        for start, entries, tpart, matched in old_runs:
            # A partial match already cut off by time (tpart) stays a timeout of its start row
            # unless that row completes a match here: its other partial matches end with the
            # input, so they no longer stand in the way.
            kept = tuple(
                (DONE, caps)
                if pos != DONE and self.table[pos][0] and self._deadline(caps) is None
                else (pos, caps)
                for pos, caps in entries
                if pos == DONE or (self.table[pos][0] and self._deadline(caps) is None)
            )
            runs.append((start, kept, tpart, matched))
        self._settle(row, runs, out, None)
        return None, out

    @staticmethod
    def next_deadline(state: State) -> int | None:
        """The earliest event time at which `on_time` can change this state (for timers).
        Deadlines are event times plus WITHIN / STEP WITHIN: whole milliseconds."""
        return None if state is None else state[2]  # type: ignore[return-value]

    @staticmethod
    def partial_count(state: State) -> int:
        return 0 if state is None else sum(len(r[1]) for r in state[1])

    # ------------------------------------------------------------------------------ stepping

    def _test(self, var: int, event: Mapping[str, Any], caps: Caps, local: list[Any]) -> bool:
        fn = self.cond[var]
        if fn is None:
            return True
        if self.local[var]:
            v = local[var]
            if v is None:
                v = local[var] = fn(event, caps) is True
            return bool(v)
        return fn(event, caps) is True

    def _spawn(
        self, event: Mapping[str, Any], ts: int, seq: Any, row: int, local: list[Any]
    ) -> tuple[Entry, ...]:
        out: list[Entry] = []
        for var, nxt in self.starts:
            if self._test(var, event, (), local):
                caps: Caps = ((var, row, event, ts, seq),)
                out.extend((t, caps) for t in nxt)
        return tuple(out)

    def _step(
        self,
        entries: tuple[Entry, ...],
        event: Mapping[str, Any],
        ts: int,
        seq: Any,
        row: int,
        local: list[Any],
    ) -> tuple[Entry, ...]:
        out: list[Entry] = []
        test = self._test
        for entry in entries:
            pos, caps = entry
            if pos == DONE:
                out.append(entry)
                continue
            absence, var, conn, nxt, not_next, not_followed, after = self.table[pos]
            if not_next and any(test(g, event, caps, local) for g in not_next):
                continue
            if absence:
                if not_followed:
                    if not any(test(g, event, caps, local) for g in not_followed):
                        out.append((after, caps))
                else:
                    out.append((DONE, caps))
                continue
            taken = test(var, event, caps, local)
            if taken:
                grown = caps + ((var, row, event, ts, seq),)
                out.extend((t, grown) for t in nxt)
                if conn is not Conn.ANY:
                    continue
            elif conn is Conn.STRICT:
                continue
            if not_followed and any(test(g, event, caps, local) for g in not_followed):
                continue
            out.append((after, caps))
        return tuple(out)

    # -------------------------------------------------------------------------------- time

    def _deadline(self, caps: Caps) -> float | None:
        d: float | None = None
        if self.within is not None:
            d = caps[0][3] + self.within
        if self.step is not None:
            s = caps[-1][3] + self.step
            d = s if d is None or s < d else d
        return d

    def _advance(self, state: State, now: float, out: list[Result]) -> State:
        assert state is not None
        row, old_runs, _ = state
        runs: list[Run] = []
        flushing = now == FOREVER
        for start, entries, tpart, matched in old_runs:
            kept: list[Entry] = []
            for entry in entries:
                pos, caps = entry
                if pos == DONE:
                    kept.append(entry)
                    continue
                d = self._deadline(caps)
                if d is None:
                    if flushing:
                        if self.table[pos][0]:
                            kept.append((DONE, caps))  # an absence with no deadline: complete
                        continue
                    kept.append(entry)
                elif d <= now:
                    if self.table[pos][0]:
                        kept.append((DONE, caps))
                    elif self.want_timeouts and (tpart is None or len(caps) > len(tpart)):
                        tpart = caps
                else:
                    kept.append(entry)
            runs.append((start, tuple(kept), tpart, matched))
        return self._settle(row, runs, out, None)

    # --------------------------------------------------------------------------- deciding

    def _settle(self, row: int, runs: list[Run], out: list[Result], ts: int | None) -> State:
        runs = [self._prune(r) for r in runs]
        runs = self._decide(runs, out)
        total = sum(len(r[1]) for r in runs)
        if total > self.stats.max_partial_matches_seen:
            self.stats.max_partial_matches_seen = total
        if total > self.cap:
            runs = self._drop(runs, total, out, ts)
            runs = self._decide(runs, out)
        if not runs:
            return None
        deadline: float | None = None
        for _, entries, _, _ in runs:
            for pos, caps in entries:
                if pos != DONE:
                    d = self._deadline(caps)
                    if d is not None and (deadline is None or d < deadline):
                        deadline = d
        return (row, tuple(runs), deadline)

    def _prune(self, run: Run) -> Run:
        start, entries, tpart, matched = run
        if len(entries) < 2:
            return run
        kept: list[Entry] = []
        seen: set[Any] = set()
        for entry in entries:
            pos, caps = entry
            if pos == DONE:
                if self.all_matches:
                    key: Any = (DONE, tuple(c[1] for c in caps), tuple(c[0] for c in caps))
                    if key in seen:
                        continue
                    seen.add(key)
                    kept.append(entry)
                    continue
                kept.append(entry)
                break  # everything after a complete match is less preferred
            if self.history_free:
                key = (pos, caps[-1][1]) if self.step is not None else pos
            else:
                key = (pos, tuple(c[1] for c in caps), tuple(c[0] for c in caps))
            if key in seen:
                continue
            seen.add(key)
            kept.append(entry)
        return (start, tuple(kept), tpart, matched)

    def _decide(self, runs: list[Run], out: list[Result]) -> list[Run]:
        if self.all_matches:
            return self._decide_all(runs, out)
        kept: list[Run] = []
        floor = -1
        head = True
        for run in runs:
            start, entries, tpart, matched = run
            if start < floor:
                continue
            if head:
                if not entries:
                    if tpart is not None:
                        out.append(self._timeout(tpart))
                    continue
                if entries[0][0] == DONE:
                    caps = entries[0][1]
                    out.append(self._match(caps))
                    floor = self._resume(caps)
                    continue
                head = False
                kept.append(run)
            elif entries or tpart is not None:
                kept.append(run)
        return kept

    def _decide_all(self, runs: list[Run], out: list[Result]) -> list[Run]:
        kept: list[Run] = []
        for start, entries, tpart, matched in runs:
            live: list[Entry] = []
            for entry in entries:
                if entry[0] == DONE:
                    out.append(self._match(entry[1]))
                    matched = True
                else:
                    live.append(entry)
            if live:
                kept.append((start, tuple(live), tpart, matched))
            elif tpart is not None and not matched:
                out.append(self._timeout(tpart))
        return kept

    def _resume(self, caps: Caps) -> int:
        kind, start = self.skip.kind, caps[0][1]
        if kind is Skip.PAST_LAST_ROW:
            return caps[-1][1] + 1
        if kind is Skip.TO_NEXT_ROW:
            return start + 1
        rows = [c[1] for c in caps if c[0] == self.skip.var]
        if not rows:
            return start + 1  # the variable is not in this match: behave like TO NEXT ROW
        target = rows[0] if kind is Skip.TO_FIRST else rows[-1]
        return target if target > start else start + 1

    def _drop(self, runs: list[Run], total: int, out: list[Result], ts: int | None) -> list[Run]:
        dropped = 0
        while total > self.cap and len(runs) > 1:
            n = len(runs[0][1])
            runs = runs[1:]
            total -= n
            dropped += n
        if total > self.cap:
            start, entries, tpart, matched = runs[0]
            dropped += len(entries) - self.cap
            runs = [(start, entries[: self.cap], tpart, matched)]
        self.stats.dropped += dropped
        key = None
        for _, entries, _, _ in runs:
            if entries:
                key = self._key(entries[0][1])
                break
        out.append(Dropped(self.rule.id, self.rule.version, key, dropped, int(ts or 0)))
        return runs

    # ----------------------------------------------------------------------------- results

    def _key(self, caps: Caps) -> Any:
        if self._key_given is not None:
            return self._key_given
        return caps[0][2].get(self.key_field) if self.key_field else None

    def _events(self, caps: Caps) -> tuple[MatchedEvent, ...]:
        names = self.vars
        return tuple(MatchedEvent(names[v], ts, seq, ev) for v, _, ev, ts, seq in caps)

    def _measures(self, caps: Caps) -> dict[str, Any]:
        last = caps[-1][2]
        return {name: fn(last, caps) for name, fn in self.measures}

    def _match(self, caps: Caps) -> Match:
        self.stats.matches += 1
        return Match(
            self.rule.id,
            self.rule.version,
            self.rule.emit.alert,
            self._key(caps),
            self._events(caps),
            caps[0][3],
            caps[-1][3],
            self._measures(caps),
        )

    def _timeout(self, caps: Caps) -> Timeout:
        self.stats.timeouts += 1
        deadline = self._deadline(caps)
        return Timeout(
            self.rule.id,
            self.rule.version,
            self.timeout_alert,
            self._key(caps),
            self._events(caps),
            caps[0][3],
            caps[-1][3],
            int(deadline) if deadline is not None else caps[-1][3],
            self._measures(caps),
        )
