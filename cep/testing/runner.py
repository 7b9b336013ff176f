"""Run test cases on the embedded engine and compare the alerts with the expectations.

Expected and raised alerts are paired by a maximum bipartite matching (an expectation may be
partial — only a rule and a key — so a greedy pairing could pair it with the alert another,
more specific expectation needs). What is left over is the diff: expectations no alert meets
(each shown beside the closest alert of its rule and key, field by field) and alerts nobody
expected.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from cep.runtime.bind import build_embedded_engine
from cep.runtime.embedded import alerts_for
from cep.runtime.engine import content_seq
from cep.testing.spec import Case, CaseEvent, ExpectedAlert, TestFile


@dataclass(frozen=True, slots=True)
class GotAlert:
    """A raised alert, with its events as indexes into the case's event list."""

    rule: str
    key: str
    kind: str
    alert: str
    first_ts: int
    last_ts: int
    events: tuple[int, ...]
    vars: tuple[tuple[str, tuple[int, ...]], ...]
    measures: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Mismatch:
    field: str
    expected: Any
    got: Any


@dataclass
class CaseResult:
    case: Case
    got: list[GotAlert]  # alerts of the rules in scope, in (first, last, rule, key) order
    missing: list[tuple[ExpectedAlert, GotAlert | None, list[Mismatch]]] = field(
        default_factory=list)  # expectation, the closest alert (if any) and how it differs
    unexpected: list[GotAlert] = field(default_factory=list)
    forbidden: list[GotAlert] = field(default_factory=list)  # alerts of expect_none rules
    dead: list[tuple[int, str]] = field(default_factory=list)  # rejected events: index, reason

    @property
    def dead_unexpected(self) -> list[tuple[int, str]]:
        return [(i, r) for i, r in self.dead if i not in self.case.dead_letters]

    @property
    def dead_missing(self) -> list[int]:
        rejected = {i for i, _ in self.dead}
        return [i for i in self.case.dead_letters if i not in rejected]

    @property
    def passed(self) -> bool:
        return not (self.missing or self.unexpected or self.forbidden or self.dead_unexpected
                    or self.dead_missing)


def run_case(test: TestFile, case: Case) -> CaseResult:
    engine = build_embedded_engine(test.ruleset)
    streams: dict[str, list[dict[str, Any]]] = {}
    for ev in case.events:
        if ev.reason is None:  # a dead letter never reaches the engine, as in replay and live
            streams.setdefault(ev.stream, []).append(ev.data)
    time_fields = {s.name: s.time_field for s in test.ruleset.streams}
    for row in case.tables:
        streams.setdefault(row.stream, []).append(row.data)
    table_times = {t.name: t.time_field for t in test.ruleset.tables if t.time_field}
    records = alerts_for(engine, streams, time_fields={**time_fields, **table_times})
    index = _event_index(case, time_fields)
    got = sorted((_got(r, index) for r in records),
                 key=lambda g: (g.first_ts, g.last_ts, g.rule, g.key, g.events))
    in_scope = [g for g in got if g.rule in case.scope or g.rule in case.forbidden]
    rep = {i: index[_position(ev, time_fields)] if ev.reason is None else i
           for i, ev in enumerate(case.events)}
    result = compare(_canonical(case, rep), in_scope)
    result.dead = [(i, ev.reason) for i, ev in enumerate(case.events) if ev.reason is not None]
    return result


def compare(case: Case, got: list[GotAlert]) -> CaseResult:
    result = CaseResult(case, [g for g in got if g.rule in case.scope])
    result.forbidden = [g for g in got if g.rule in case.forbidden]
    candidates = [[j for j, g in enumerate(result.got) if not differences(e, g)]
                  for e in case.expect]
    pair = _max_matching(candidates, len(result.got))
    taken = set(pair.values())
    left = [j for j in range(len(result.got)) if j not in taken]
    for i, e in enumerate(case.expect):
        if i in pair:
            continue
        j = _closest(e, result.got, left)
        if j is not None:
            left.remove(j)
            result.missing.append((e, result.got[j], differences(e, result.got[j])))
        else:
            result.missing.append((e, None, []))
    if case.exact:
        result.unexpected = [result.got[j] for j in left]
    return result


def differences(e: ExpectedAlert, g: GotAlert) -> list[Mismatch]:
    out: list[Mismatch] = []

    def check(name: str, want: Any, have: Any) -> None:
        if want is not None and want != have:
            out.append(Mismatch(name, want, have))

    check("rule", e.rule, g.rule)
    check("key", e.key, g.key)
    check("kind", e.kind, g.kind)
    check("alert", e.alert, g.alert)
    check("first", e.first_ts, g.first_ts)
    check("last", e.last_ts, g.last_ts)
    check("events", e.events, g.events)
    if e.vars is not None:
        have = dict(g.vars)
        for var, idx in e.vars:
            check(f"events.{var}", idx, have.get(var, ()))
    for name, want in e.measures:
        if name not in g.measures or not _same(want, g.measures[name]):
            out.append(Mismatch(f"measures.{name}", want, g.measures.get(name)))
    return out


def _same(want: Any, have: Any) -> bool:
    """Equality for hand-written measure values: floats compare with a relative tolerance of
    1e-9 (3.49 is 1.0 + 1.5 + 0.99), ints exactly, an int equals the same float, lists and
    mappings element by element."""
    if isinstance(want, bool) or isinstance(have, bool):
        return want is have if isinstance(want, bool) and isinstance(have, bool) else False
    if isinstance(want, int) and isinstance(have, int):
        return want == have  # exact: epoch milliseconds differ in the 13th digit
    if isinstance(want, int | float) and isinstance(have, int | float):
        return math.isclose(want, have, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(want, list | tuple) and isinstance(have, list | tuple):
        return len(want) == len(have) and all(_same(a, b) for a, b in zip(want, have,
                                                                           strict=True))
    if isinstance(want, dict) and isinstance(have, dict):
        return want.keys() == have.keys() and all(_same(v, have[k]) for k, v in want.items())
    return bool(want == have)


def _closest(e: ExpectedAlert, got: list[GotAlert], left: list[int]) -> int | None:
    """Of the alerts not yet paired, the one of the same rule (and key, if given) that differs
    in the fewest fields."""
    same = [j for j in left if got[j].rule == e.rule and (e.key is None or got[j].key == e.key)]
    if not same:
        return None
    return min(same, key=lambda j: len(differences(e, got[j])))


def _max_matching(candidates: list[list[int]], n_right: int) -> dict[int, int]:
    """Kuhn's augmenting paths: expectation index → alert index, as many pairs as possible.
    Expectations are tried in order, so with unambiguous specs the pairing is the obvious one."""
    owner: list[int | None] = [None] * n_right

    def augment(i: int, seen: set[int]) -> bool:
        for j in candidates[i]:
            if j in seen:
                continue
            seen.add(j)
            current = owner[j]
            if current is None or augment(current, seen):
                owner[j] = i
                return True
        return False

    for i in range(len(candidates)):
        augment(i, set())
    return {i: j for j, i in enumerate(owner) if i is not None}


def _position(ev: CaseEvent, time_fields: Mapping[str, str]) -> tuple[int, int]:
    return int(ev.data[time_fields.get(ev.stream, "ts")]), content_seq(ev.data)


def _event_index(case: Case, time_fields: Mapping[str, str]) -> dict[tuple[int, int], int]:
    """(ts, seq) → the event's index in the case. Identical events share one (the first):
    the engine cannot tell them apart either."""
    index: dict[tuple[int, int], int] = {}
    for i, ev in enumerate(case.events):
        if ev.reason is None:
            index.setdefault(_position(ev, time_fields), i)
    return index


def _canonical(case: Case, rep: Mapping[int, int]) -> Case:
    """Expected event indexes with identical events replaced by the first of them."""
    if all(rep[i] == i for i in rep):
        return case

    def fix(ix: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(rep[i] for i in ix)

    expect = tuple(
        replace(e, events=None if e.events is None else fix(e.events),
                vars=None if e.vars is None else tuple((v, fix(ix)) for v, ix in e.vars))
        for e in case.expect)
    return replace(case, expect=expect)


def _got(record: Mapping[str, Any], index: Mapping[tuple[int, int], int]) -> GotAlert:
    events: list[int] = []
    by_var: dict[str, list[int]] = {}
    for ev in record["events"]:
        i = index.get((int(ev["ts"]), ev["seq"]), -1)
        events.append(i)
        by_var.setdefault(str(ev["var"]), []).append(i)
    return GotAlert(
        rule=str(record["rule_id"]), key=str(record["key"]), kind=str(record["kind"]),
        alert=str(record["alert"]), first_ts=int(record["first_ts"]),
        last_ts=int(record["last_ts"]), events=tuple(events),
        vars=tuple((v, tuple(ix)) for v, ix in by_var.items()),
        measures=dict(record["measures"]))
