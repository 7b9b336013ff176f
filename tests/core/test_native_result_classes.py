"""How the native core makes its results (docs/native-core.md, "Many rules: the results'
Python objects (session 21, gc21)"): a `Match`, `Timeout` or `MatchedEvent` whose class only
sets its fields from its arguments (`plain_fields`) is made and its fields set without running
the dataclass's generated `__init__`; any other class is called. Either way a result must be
the Python engine's: same class, equal, frozen.

Rules here: a family (three copies differing in a threshold and a window), a rule with
MEASURES, and one with ON TIMEOUT (so `Timeout`s with measures and events come out too);
native from Event lists and from one Arrow batch, against the Python engine, result by result.
"""

from __future__ import annotations

import abc
import dataclasses
import sys
from typing import Any

import pytest

import cep.runtime.matcher as matcher
from cep.compile import compile_rules
from cep.runtime.bind import build_embedded_engine, build_engine, engine_kind
from cep.runtime.engine import NEG_INF, Event, MemoryKeyStore
from cep.runtime.matcher import Match, MatchedEvent, Timeout, plain_fields
from tests.core.test_native_engine_differential import arrow_table

RULES = """STREAM tx (ts INT, card STRING, amount FLOAT, country STRING) TIME BY ts LATENESS 0s;
RULE big_0 FROM tx PARTITION BY card PATTERN (A B) DEFINE B AS B.amount > 10 WITHIN 30s EMIT 'big';
RULE big_1 FROM tx PARTITION BY card PATTERN (A B) DEFINE B AS B.amount > 20 WITHIN 40s EMIT 'big';
RULE big_2 FROM tx PARTITION BY card PATTERN (A B) DEFINE B AS B.amount > 30 WITHIN 50s EMIT 'big';
RULE sums FROM tx PARTITION BY card PATTERN (A{2} B) DEFINE B AS B.amount > 20 WITHIN 60s
  MEASURES SUM(A.amount) AS total, B.country AS country EMIT 'sums';
RULE late FROM tx PARTITION BY card PATTERN (A B C) DEFINE C AS C.amount > 45 WITHIN 5s
  MEASURES A.amount AS first EMIT 'late' ON TIMEOUT EMIT 'late-to';
"""


def events() -> list[Event]:
    amounts = [5, 15, 25, 35, 12, 40, 8, 33, 22, 50]
    return [Event("tx", 1_000 * (k + 1), k,
                  {"ts": 1_000 * (k + 1), "card": "c1" if k % 3 else "c2",
                   "amount": float(a), "country": "FR" if k % 4 else "IT"})
            for k, a in enumerate(amounts * 2)]


def run(engine: Any, evs: list[Event], arrow: bool) -> list[Any]:
    store, top = MemoryKeyStore(), evs[-1].ts
    if arrow:
        out = engine.ingest_batch(store, arrow_table(evs).to_batches()[0], NEG_INF).matches
    else:
        out = engine.ingest(store, evs, NEG_INF).matches
    return out + engine.advance(store, top, end_of_input=top).matches


def check(results: list[Any], want: list[Any]) -> None:
    assert results == want
    assert [type(r) for r in results] == [type(w) for w in want]
    assert {Match, Timeout} <= {type(r) for r in results}
    assert any(r.measures for r in results)
    for r, w in zip(results, want, strict=True):
        assert repr(r) == repr(w)
        assert [type(e) for e in r.events] == [MatchedEvent] * len(w.events)
        assert dataclasses.asdict(r) == dataclasses.asdict(w)
        with pytest.raises(dataclasses.FrozenInstanceError):
            r.alert = "x"  # type: ignore[misc]
        with pytest.raises(dataclasses.FrozenInstanceError):
            r.events[0].ts = 0  # type: ignore[misc]


@pytest.mark.parametrize("arrow", [False, True])
def test_results_equal_the_python_engine(arrow: bool) -> None:
    ruleset = compile_rules(RULES, "classes")
    native = build_embedded_engine(ruleset, use_native=True, families=True)
    assert engine_kind(native) == "native"
    assert [sorted(f) for f in native.families] == [["big_0", "big_1", "big_2"]]
    want = run(build_engine(ruleset, use_native=False), events(), False)
    check(run(native, events(), arrow), want)


def test_plain_classes_are_not_called() -> None:
    """The point of the change: no `__init__` runs for the core's results (the Python engine,
    the control, runs one per result)."""
    inits = {Match.__init__.__code__, Timeout.__init__.__code__, MatchedEvent.__init__.__code__}
    ruleset = compile_rules(RULES, "classes")
    engines = {"native": build_embedded_engine(ruleset, use_native=True, families=True),
               "python": build_engine(ruleset, use_native=False)}
    calls = dict.fromkeys(engines, 0)
    for name, engine in engines.items():
        def prof(frame: Any, event: str, arg: Any, name: str = name) -> None:
            if event == "call" and frame.f_code in inits:
                calls[name] += 1
        sys.setprofile(prof)
        try:
            results = run(engine, events(), False)
        finally:
            sys.setprofile(None)
    assert calls["native"] == 0
    assert calls["python"] >= len(results) > 0


def test_plain_fields() -> None:
    assert plain_fields(Match) == tuple(f.name for f in dataclasses.fields(Match))
    assert plain_fields(MatchedEvent) == ("var", "ts", "seq", "event")
    assert plain_fields(Timeout) is not None

    @dataclasses.dataclass(frozen=True, slots=True)
    class Post:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclasses.dataclass(frozen=True, slots=True)
    class Own:
        a: int

        def __init__(self, a: int) -> None:
            object.__setattr__(self, "a", a + 1)

    @dataclasses.dataclass(frozen=True)
    class NoInit:
        a: int
        b: int = dataclasses.field(init=False, default=0)

    @dataclasses.dataclass(frozen=True)
    class WithInitVar:
        a: int
        b: dataclasses.InitVar[int]

    @dataclasses.dataclass(frozen=True)
    class NoInitOnly:  # caught only by its field's `init=False` (its argument count matches)
        a: int
        b: int = dataclasses.field(init=False, default=0)
        c: dataclasses.InitVar[int] = 0

    @dataclasses.dataclass(frozen=True)
    class New:
        a: int

        def __new__(cls, *args: object) -> New:
            return super().__new__(cls)

    class Meta(abc.ABCMeta):
        pass

    @dataclasses.dataclass(frozen=True)
    class WithMeta(metaclass=Meta):
        a: int

    @dataclasses.dataclass(frozen=True)
    class Abstract(abc.ABC):
        a: int

        @abc.abstractmethod
        def f(self) -> None: ...

    class NotDataclass:
        def __init__(self, a: int) -> None:
            self.a = a

    for cls in (Post, Own, NoInit, WithInitVar, NoInitOnly, New, WithMeta, Abstract,
                NotDataclass):
        assert plain_fields(cls) is None, cls.__name__


def test_a_class_that_does_more_is_called(monkeypatch: pytest.MonkeyPatch) -> None:
    """The core reads the classes when it builds an engine: a `Match` with a `__post_init__`
    (not plain) must be called once per match, and the results still equal."""
    made: list[int] = []

    @dataclasses.dataclass(frozen=True, slots=True)
    class Counted(Match):
        def __post_init__(self) -> None:
            made.append(1)

    ruleset = compile_rules(RULES, "classes")
    monkeypatch.setattr(matcher, "Match", Counted)
    native = build_embedded_engine(ruleset, use_native=True, families=True)
    results = run(native, events(), True)
    monkeypatch.undo()
    want = run(build_engine(ruleset, use_native=False), events(), False)
    assert [type(r) for r in results if type(r) is not Timeout] == [Counted] * len(made)
    assert len(made) == sum(type(w) is Match for w in want) > 0
    assert [(r.rule_id, r.key, r.events, r.measures) for r in results] == \
        [(w.rule_id, w.key, w.events, w.measures) for w in want]
