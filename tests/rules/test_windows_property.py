"""Sliding OVER aggregates and window rules, through the engine (event time, batching, end of
input), against the brute-force reference in tests/rules/window_reference.py."""

from __future__ import annotations

import pickle
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from cep.compile import compile_rules
from cep.runtime.bind import build_embedded_engine, engine_kind
from cep.runtime.engine import Event, MemoryKeyStore, run_embedded
from cep.runtime.matcher import Match
from tests.hyp import examples
from tests.rules import window_reference as ref

HEAD = "STREAM s (ts INT, k STRING, t STRING, v INT, i INT) TIME BY ts LATENESS 100ms;\n"
WIDTHS = {"1s": 1000, "90s": 90_000, "10m": 600_000, "1h": 3_600_000, "7ms": 7}
FUNCS = ("COUNT", "SUM", "AVG", "MIN", "MAX")


@st.composite
def histories(draw: st.DrawFn) -> list[dict]:
    """Events of up to three keys; times spread over about an hour, with bursts and ties."""
    n = draw(st.integers(0, 40))
    ts = 1_767_225_600_000 + draw(st.integers(0, 10**6))
    out = []
    for i in range(n):
        ts += draw(st.sampled_from((0, 1, 5, 999, 1000, 30_000, 60_000, 600_000)))
        v = draw(st.one_of(st.none(), st.integers(-5, 20)))
        ev = {"ts": ts, "k": draw(st.sampled_from("xyz")), "t": draw(st.sampled_from("ab")),
              "i": i}
        if v is not None:
            ev["v"] = v
        out.append(ev)
    return out


def arrival(events: list[dict], seed: int) -> list[Event]:
    """The events as a source delivers them: a little out of order (never more than the
    stream's LATENESS, so none is late), each with its source position as seq."""
    rnd = random.Random(seed)
    keyed = sorted(events, key=lambda e: e["ts"] + rnd.randint(0, 80))
    return [Event("s", e["ts"], e["i"], e) for e in keyed]


def run(text: str, events: list[dict], batch: int, seed: int, roundtrip: bool = False):
    rules = compile_rules(HEAD + text, "w.cep")
    engine = build_embedded_engine(rules)
    assert engine_kind(engine) == "python"  # docs/windows.md: the core does not run windows
    late: list = []
    store = MemoryKeyStore()
    if roundtrip:  # the Spark store pickles each key's state between batches
        class Pickling(MemoryKeyStore):
            def put(self, sk, state):  # type: ignore[no-untyped-def]
                super().put(sk, pickle.loads(pickle.dumps(state)))
        store = Pickling()
    out = [r for r in run_embedded(engine, arrival(events, seed), batch_size=batch, store=store,
                                   late=late) if isinstance(r, Match)]
    assert late == []
    return out


def by_key(events: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for e in sorted(events, key=lambda e: (e["ts"], e["i"])):
        out.setdefault(e["k"], []).append(e)
    return out


@settings(max_examples=examples(200), deadline=None)
@given(histories(), st.sampled_from(FUNCS), st.booleans(), st.sampled_from(sorted(WIDTHS)),
       st.booleans(), st.sampled_from((1, 3, 1000)), st.integers(0, 99))
def test_over_measures_equal_a_rescan_of_history(events, func, star, width, exclude, batch,
                                                 seed):
    star = star and func == "COUNT"
    arg = "*" if star else "v"
    excl = " EXCLUDE CURRENT ROW" if exclude else ""
    text = (f"RULE r FROM s PARTITION BY k PATTERN (a) "
            f"MEASURES {func}({arg}) OVER {width}{excl} AS w, i AS i EMIT 'x';")
    got = {(m.key, m.measures["i"]): m.measures["w"]
           for m in run(text, events, batch, seed, roundtrip=batch == 3)}
    want = {}
    for key, evs in by_key(events).items():
        vals = ref.over_values(evs, func, None if star else "v", WIDTHS[width], exclude)
        want.update({(key, e["i"]): v for e, v in zip(evs, vals, strict=True)})
    assert got == want


@settings(max_examples=examples(150), deadline=None)
@given(histories(), st.integers(1, 4), st.sampled_from((1, 4, 1000)), st.integers(0, 99))
def test_over_in_a_condition_selects_the_events_the_reference_selects(events, n, batch, seed):
    text = ("RULE r FROM s PARTITION BY k PATTERN (a) "
            f"DEFINE a AS COUNT(*) OVER 90s >= {n} AND v > AVG(v) OVER 1h EXCLUDE CURRENT ROW "
            "MEASURES i AS i EMIT 'x';")
    got = sorted((m.key, m.measures["i"]) for m in run(text, events, batch, seed))
    want = []
    for key, evs in by_key(events).items():
        counts = ref.over_values(evs, "COUNT", None, 90_000, False)
        avgs = ref.over_values(evs, "AVG", "v", 3_600_000, True)
        want += [(key, e["i"]) for e, c, a in zip(evs, counts, avgs, strict=True)
                 if c >= n and e.get("v") is not None and a is not None and e["v"] > a]
    assert got == sorted(want)


WINDOWS = {
    "TUMBLING (SIZE 1m)": ("TUMBLING", 60_000, 60_000),
    "TUMBLING (SIZE 10m)": ("TUMBLING", 600_000, 600_000),
    "HOPPING (SIZE 10m, ADVANCE BY 1m)": ("HOPPING", 600_000, 60_000),
    "HOPPING (SIZE 5m, ADVANCE BY 2m)": ("HOPPING", 300_000, 120_000),
    "SESSION (1m)": ("SESSION", 60_000, 60_000),
    "SESSION (1s)": ("SESSION", 1000, 1000),
}


@settings(max_examples=examples(200), deadline=None)
@given(histories(), st.sampled_from(sorted(WINDOWS)), st.booleans(), st.integers(0, 3),
       st.sampled_from((1, 3, 1000)), st.integers(0, 99))
def test_window_rules_equal_the_reference(events, window, where, n, batch, seed):
    kind, size, advance = WINDOWS[window]
    text = (f"RULE r FROM s PARTITION BY k WINDOW {window} "
            + ("WHERE t = 'a' " if where else "")
            + f"HAVING COUNT(*) > {n} "
            "MEASURES COUNT(*) AS n, COUNT(v) AS nv, SUM(v) AS total, AVG(v) AS mean, "
            "MIN(v) AS lo, MAX(v) AS hi EMIT 'x';")
    got = sorted((m.key, m.first_ts, m.last_ts, tuple(sorted(m.measures.items())))
                 for m in run(text, events, batch, seed, roundtrip=batch == 3))
    end = max((e["ts"] for e in events), default=0)
    want = []
    for key, evs in by_key(events).items():
        for start, stop, inside in ref.windows(evs, kind, size, advance,
                                               (lambda e: e["t"] == "a") if where
                                               else (lambda e: True), end):
            if len(inside) <= n:
                continue
            vs = [e.get("v") for e in inside]
            measures = {"window_start": start, "window_end": stop, "n": len(inside),
                        "nv": ref.aggregate("COUNT", vs, False),
                        "total": ref.aggregate("SUM", vs, False),
                        "mean": ref.aggregate("AVG", vs, False),
                        "lo": ref.aggregate("MIN", vs, False),
                        "hi": ref.aggregate("MAX", vs, False)}
            want.append((key, inside[0]["ts"], inside[-1]["ts"],
                         tuple(sorted(measures.items()))))
    assert got == sorted(want)


def test_over_state_is_bounded_by_the_window_and_released_when_it_expires():
    """A key with events every second for two hours keeps at most 61 buckets (1h: 60 buckets
    of 1m, plus the current one), and its state is deleted once the window has passed."""
    rules = compile_rules(HEAD + "RULE r FROM s PARTITION BY k PATTERN (a) "
                          "DEFINE a AS COUNT(*) OVER 1h > 100000 EMIT 'x';", "w.cep")
    engine = build_embedded_engine(rules)
    store = MemoryKeyStore()
    t0 = 1_767_225_600_000
    events = [Event("s", t0 + i * 1000, i, {"ts": t0 + i * 1000, "k": "a", "i": i})
              for i in range(7200)]
    largest = 0
    for i in range(0, len(events), 500):
        engine.ingest(store, events[i:i + 500], t0 + i * 1000)
        for _buffer, parts in store.states.values():
            for _h, state in parts.values():
                largest = max(largest, max(len(w[0]) for w in state[1]))
    assert 55 <= largest <= 61
    assert store.states  # the key still has a window
    # Another key's event two hours later moves event time past the window: the key is freed.
    late_ts = t0 + 7200 * 1000 + 2 * 3_600_000
    engine.ingest(store, [Event("s", late_ts, 0, {"ts": late_ts, "k": "b", "i": 0})], late_ts)
    engine.advance(store, late_ts + 1000)
    assert ("s:k", "a") not in store.states


def test_over_and_a_table_lookup_in_one_rule(tmp_path):
    """A rule reading a window and a table (docs/tables.md): the event carries both its window
    values and its table rows, also after its state is pickled (the Spark store)."""
    (tmp_path / "customers.jsonl").write_text('{"id": "c1", "home": "NL"}\n')
    text = (
        "STREAM tx (ts INT, card STRING, amount INT, country STRING) TIME BY ts;\n"
        "TABLE customers (id STRING, home STRING) KEY id FROM FILE 'customers.jsonl';\n"
        "RULE r FROM tx PARTITION BY card PATTERN (a b) "
        "DEFINE b AS amount > 2 * AVG(amount) OVER 1h EXCLUDE CURRENT ROW "
        "AND country <> customers[card].home "
        "MEASURES customers[card].home AS home, AVG(amount) OVER 1h AS avg_incl, "
        "SUM(amount) OVER 1h EXCLUDE CURRENT ROW AS before EMIT 'x';\n")
    path = tmp_path / "r.cep"
    path.write_text(text)
    rules = compile_rules(text, str(path))
    t0 = 1_767_225_600_000
    rows = [(10, "NL"), (10, "NL"), (50, "NL"), (10, "NL"), (50, "FR"), (10, "FR")]
    events = [{"ts": t0 + i * 60_000, "card": "c1", "amount": a, "country": c}
              for i, (a, c) in enumerate(rows)]
    got = []
    for batch in (1, 4):
        class Pickling(MemoryKeyStore):
            def put(self, sk, state):  # type: ignore[no-untyped-def]
                super().put(sk, pickle.loads(pickle.dumps(state)))
        engine = build_embedded_engine(rules)
        got.append([(m.first_ts, m.last_ts, m.measures) for m in run_embedded(
            engine, [Event("tx", e["ts"], i, e) for i, e in enumerate(events)],
            batch_size=batch, store=Pickling()) if isinstance(m, Match)])
    # event 2 (50 > 2 x 10) is at home; event 4 (50 > 2 x 20 = the average of 10, 10, 50, 10)
    # is abroad: one match (3, 4), as of event 4: avg with it (10+10+50+10+50)/5, sum before 80
    assert got[0] == got[1] == [(t0 + 3 * 60_000, t0 + 4 * 60_000,
                                 {"home": "NL", "avg_incl": 26.0, "before": 80})]
