"""A brute-force reference matcher, independent of the NFA and of the matcher core.

It reads the pattern's *syntax tree* and the whole (finite) list of events, and enumerates, for
each start row, every labelled subsequence that satisfies the pattern's definition, in
MATCH_RECOGNIZE's preference order (a backtracking interpreter: greedy tries more repetitions
first, reluctant fewer, `|` tries the left branch first, `->>` tries the earliest event first).
The definition it checks directly:
- a step entered strictly takes the next row; `->` takes the first later row whose condition
  holds; `->>` any later row whose condition holds;
- `NOT X` (not next): the row right after the previous matched row is not an X;
  `-> NOT X` (not followed by): no X strictly between the previous matched row and the next
  matched row, or, at the end, no X up to the deadline;
- time limits: every row within WITHIN of the first row and STEP WITHIN of the previous one.
Selection: earliest start first, its first candidate, then the skip strategy; ALL MATCHES:
every distinct candidate. Only the condition closures are shared with the compiler.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from cep import ast
from cep.ast import Conn
from cep.nfa import CompiledRule, Skip

Caps = tuple[tuple[int, int, Any, int, Any], ...]
Guards = tuple[tuple[Conn, int], ...]
K = Callable[[Caps, Guards], Iterator[Caps]]


class Reference:
    def __init__(
        self,
        rule: CompiledRule,
        pattern: ast.PAlt,
        events: list[tuple[dict[str, Any], int]],
        end_ts: int | None = None,
    ):
        """`end_ts`: None - time runs to infinity after the last event (`Matcher.flush`);
        else input ends with event time stopped at `end_ts` (`Matcher.on_end`)."""
        self.end_ts = end_ts
        self.rule = rule
        self.pattern = pattern
        self.events = events
        self.index = {name: i for i, name in enumerate(rule.nfa.vars)}
        self.conds = [c.bind() if c is not None else None for c in rule.nfa.conditions]
        self.within = rule.nfa.within_ms
        self.step = rule.nfa.step_ms
        self.waiting: list[Caps] | None = None  # set by `timeouts`


    # -- conditions and time ---------------------------------------------------------------

    def holds(self, var: int, j: int, caps: Caps) -> bool:
        fn = self.conds[var]
        return fn is None or fn(self.events[j][0], caps) is True

    def ts(self, j: int) -> int:
        return self.events[j][1]

    def deadline(self, caps: Caps) -> int | None:
        limits = []
        if self.within is not None:
            limits.append(caps[0][3] + self.within)
        if self.step is not None:
            limits.append(caps[-1][3] + self.step)
        return min(limits) if limits else None

    def entry(self, var: int, j: int) -> tuple[int, int, Any, int, Any]:
        return (var, j, self.events[j][0], self.ts(j), j)

    # -- enumeration -----------------------------------------------------------------------

    def consume(
        self, name: str, conn: Conn, caps: Caps, guards: Guards, k: K, start: int
    ) -> Iterator[Caps]:
        var = self.index[name]
        n = len(self.events)
        if not caps:
            if self.holds(var, start, caps):
                yield from k((self.entry(var, start),), ())
            return
        p = caps[-1][1]
        if conn is Conn.STRICT:
            options = [p + 1] if p + 1 < n and self.holds(var, p + 1, caps) else []
        elif conn is Conn.RELAXED:
            first = next((j for j in range(p + 1, n) if self.holds(var, j, caps)), None)
            options = [first] if first is not None else []
        else:
            options = [j for j in range(p + 1, n) if self.holds(var, j, caps)]
        d = self.deadline(caps)
        if self.waiting is not None and self.times_out(var, conn, caps, guards, p, d):
            self.waiting.append(caps)
        for j in options:
            if d is not None and self.ts(j) > d:
                continue
            if not self.guards_ok(guards, caps, p, j):
                continue
            yield from k(caps + (self.entry(var, j),), ())

    def times_out(self, var: int, conn: Conn, caps: Caps, guards: Guards, p: int,
                  d: int | None) -> bool:
        """Whether the partial match `caps`, waiting for `var` after row `p`, is still waiting
        when its deadline `d` passes: no row up to `d` decided it (took it further, or killed
        it by strict contiguity or a NOT guard), and time reaches `d` before the input ends
        (`end_ts`; None: time runs to infinity)."""
        if d is None or (self.end_ts is not None and d > self.end_ts):
            return False
        rows = [m for m in range(p + 1, len(self.events)) if self.ts(m) <= d]
        for kind, x in guards:
            # NOT x (not next) is decided by the next row; -> NOT x by any row while waiting
            # (a row both x and the awaited variable is taken, but then it is not waiting).
            if any(self.holds(x, m, caps) for m in (rows[:1] if kind is Conn.STRICT else rows)):
                return False
        if conn is Conn.STRICT:
            return not rows  # the next row, if it came in time, decided it
        if conn is Conn.RELAXED:
            return not any(self.holds(var, m, caps) for m in rows)
        return True  # ->> keeps waiting beside every row it takes

    def guards_ok(self, guards: Guards, caps: Caps, p: int, j: int) -> bool:
        for kind, x in guards:
            if kind is Conn.STRICT:
                if self.holds(x, p + 1, caps):
                    return False
            elif any(self.holds(x, m, caps) for m in range(p + 1, j)):
                return False
        return True

    def trailing_ok(self, guards: Guards, caps: Caps) -> bool:
        p, d, n = caps[-1][1], self.deadline(caps), len(self.events)
        only_strict = all(kind is Conn.STRICT for kind, _ in guards)
        by_event = only_strict and p + 1 < n and (d is None or self.ts(p + 1) <= d)
        if not by_event and self.end_ts is not None and d is not None and d > self.end_ts:
            return False  # input ended before the deadline: absence not established
        for kind, x in guards:
            later = range(p + 1, min(p + 2, n)) if kind is Conn.STRICT else range(p + 1, n)
            for m in later:
                if d is not None and self.ts(m) > d:
                    break
                if self.holds(x, m, caps):
                    return False
        return True

    def element(
        self,
        el: ast.PVar | ast.PNot | ast.PAlt,
        conn: Conn,
        caps: Caps,
        guards: Guards,
        k: K,
        start: int,
    ) -> Iterator[Caps]:
        if isinstance(el, ast.PVar):
            yield from self.consume(el.name, conn, caps, guards, k, start)
        elif isinstance(el, ast.PNot):
            g = guards + ((conn, self.index[el.name]),)
            yield from k(caps, g)
        else:
            for branch in el.branches:
                yield from self.sequence(branch.items, 0, conn, caps, guards, k, start)

    def sequence(
        self,
        items: tuple[ast.PItem, ...],
        i: int,
        inherit: Conn,
        caps: Caps,
        guards: Guards,
        k: K,
        start: int,
    ) -> Iterator[Caps]:
        if i == len(items):
            yield from k(caps, guards)
            return
        item = items[i]
        conn = item.conn if item.conn is not None else inherit

        def rest(c: Caps, g: Guards) -> Iterator[Caps]:
            return self.sequence(items, i + 1, inherit, c, g, k, start)

        q = item.quant
        if q is None:
            yield from self.element(item.element, conn, caps, guards, rest, start)
            return

        def rep(count: int, c: Caps, g: Guards) -> Iterator[Caps]:
            more = q.max is None or count < q.max
            stop = count >= q.min

            def again(c2: Caps, g2: Guards) -> Iterator[Caps]:
                return rep(count + 1, c2, g2)

            order = ("more", "stop") if q.greedy else ("stop", "more")
            for choice in order:
                if choice == "more" and more:
                    yield from self.element(
                        item.element, conn if count == 0 else Conn.STRICT, c, g, again, start
                    )
                elif choice == "stop" and stop:
                    yield from rest(c, g)

        yield from rep(0, caps, guards)

    def candidates(self, start: int) -> Iterator[Caps]:
        def done(caps: Caps, guards: Guards) -> Iterator[Caps]:
            if caps and (not guards or self.trailing_ok(guards, caps)):
                yield caps

        for branch in self.pattern.branches:
            yield from self.sequence(branch.items, 0, Conn.STRICT, (), (), done, start)

    # -- selection -------------------------------------------------------------------------

    def matches(self) -> list[Caps]:
        n = len(self.events)
        skip = self.rule.skip
        if skip.kind is Skip.ALL_MATCHES:
            seen: dict[tuple[Any, ...], Caps] = {}
            for s in range(n):
                for c in self.candidates(s):
                    seen.setdefault(tuple((v, j) for v, j, *_ in c), c)
            return list(seen.values())
        out: list[Caps] = []
        pos = 0
        while pos < n:
            first = next(self.candidates(pos), None)
            if first is None:
                pos += 1
                continue
            out.append(first)
            pos = self.resume(first)
        return out

    def timeouts(self) -> list[Caps]:
        """ON TIMEOUT results: for each start row that is reached by the selection (not skipped
        over by a match; ALL MATCHES: every row) and has no candidate, the longest partial
        match from it that was still waiting when its deadline passed (if any). Timeouts do not
        move the skip position."""
        n = len(self.events)
        out: list[Caps] = []
        pos = 0
        every = self.rule.skip.kind is Skip.ALL_MATCHES
        while pos < n:
            if next(self.candidates(pos), None) is not None:
                pos = pos + 1 if every else self.resume(next(self.candidates(pos)))
                continue
            self.waiting = []
            for _ in self.candidates(pos):
                pass
            if self.waiting:
                out.append(max(self.waiting, key=len))
            self.waiting = None
            pos += 1
        return out

    def resume(self, caps: Caps) -> int:
        kind, start = self.rule.skip.kind, caps[0][1]
        if kind is Skip.PAST_LAST_ROW:
            return caps[-1][1] + 1
        if kind is Skip.TO_NEXT_ROW:
            return start + 1
        rows = [c[1] for c in caps if c[0] == self.rule.skip.var]
        if not rows:
            return start + 1
        target = rows[0] if kind is Skip.TO_FIRST else rows[-1]
        return target if target > start else start + 1
