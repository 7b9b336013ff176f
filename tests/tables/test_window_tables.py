"""Window rules that read tables (docs/windows.md, "Tables in window rules"), through the
engine, against a reference written from the document: WHERE reads each event's rows as of
the event's time; HAVING and MEASURES read the window key's row as of the window's last event.

The windows come from `tests/rules/window_reference.py` (a rescan); the table rows from the
brute-force temporal lookup of `tests/tables/test_tables_engine.py`. Random histories, random
allowances and exemptions (updates, deletes, NULL columns), every window kind, any batch size,
table records interleaved with the events as a live job reads them, or all in one call in any
order as a replay reads them.
"""

from __future__ import annotations

import functools
import pickle
import random
from typing import Any

import pytest

from cep.compile import compile_rules
from cep.compile.diagnostics import CompileErrors
from cep.runtime.bind import build_engine
from cep.runtime.engine import Event, MemoryKeyStore, run_embedded
from cep.runtime.matcher import Match
from tests.rules import window_reference as ref
from tests.tables.test_tables_engine import ref_row

LATENESS_MS = 3000
MINUTE = 60_000
HEAD = """
STREAM logins (ts INT, ip STRING, user STRING, outcome STRING) TIME BY ts LATENESS 3s;
TABLE allow (ip STRING, max_failures INT, t INT) KEY ip TIME BY t FROM KAFKA 'allow';
TABLE accounts (user STRING, service BOOL, t INT) KEY user TIME BY t FROM KAFKA 'accounts';
"""
WINDOWS = {"TUMBLING (SIZE 1m)": ("TUMBLING", MINUTE, MINUTE),
           "HOPPING (SIZE 1m, ADVANCE BY 20s)": ("HOPPING", MINUTE, 20_000),
           "SESSION (15s)": ("SESSION", 15_000, 15_000)}


@functools.cache
def ruleset(window: str) -> Any:
    return compile_rules(rules(window), "window_tables.cep")


def rules(window: str) -> str:
    return HEAD + f"""
RULE over_allowance FROM logins PARTITION BY ip
  WINDOW {window}
  WHERE outcome = 'failure' AND COALESCE(accounts[user].service, FALSE) = FALSE
  HAVING COUNT(*) > allow[ip].max_failures
  MEASURES COUNT(*) AS failures, allow[ip].max_failures AS allowance
  EMIT 'over-allowance';
"""


# ------------------------------------------------------------------------ the reference


def row_as_of(records: list[dict[str, Any]], key_field: str, key: str, ts: int,
              ) -> dict[str, Any]:
    """The table row of `key` as of `ts` ({} if none or deleted)."""
    return ref_row(records, key, ts, key_field) or {}


def reference(window: str, events: list[dict[str, Any]], allow: list[dict[str, Any]],
              accounts: list[dict[str, Any]]) -> list[tuple]:
    kind, size, advance = WINDOWS[window]
    end = max((e["ts"] for e in events), default=0)

    def where(e: dict[str, Any]) -> bool:
        service = row_as_of(accounts, "user", e["user"], e["ts"]).get("service")
        return e["outcome"] == "failure" and (service is None or service is False)

    out = []
    for ip in sorted({e["ip"] for e in events}):
        evs = sorted((e for e in events if e["ip"] == ip), key=lambda e: (e["ts"], e["seq"]))
        for start, stop, inside in ref.windows(evs, kind, size, advance, where, end):
            allowance = row_as_of(allow, "ip", ip, inside[-1]["ts"]).get("max_failures")
            if allowance is None or not len(inside) > allowance:
                continue
            out.append((ip, inside[0]["ts"], inside[-1]["ts"],
                        (("allowance", allowance), ("failures", len(inside)),
                         ("window_end", stop), ("window_start", start))))
    return sorted(out)


# ------------------------------------------------------------------------ random histories


def history(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                         list[dict[str, Any]]]:
    ips = [f"10.0.0.{i}" for i in range(rng.randint(1, 3))]
    users = ["alice", "bob", "svc"]
    events = [{"ts": rng.randrange(0, 4 * MINUTE, 1000), "ip": rng.choice(ips),
               "user": rng.choice(users),
               "outcome": "failure" if rng.random() < 0.8 else "success", "seq": i}
              for i in range(rng.randint(1, 60))]
    allow: list[dict[str, Any]] = []
    for i in range(rng.randint(0, 8)):
        rec: dict[str, Any] = {"ip": rng.choice(ips), "t": rng.randrange(-MINUTE, 4 * MINUTE,
                                                                        5000),
                               "seq": 1000 + i}
        if rng.random() < 0.1:
            rec["_deleted"] = True
        else:
            rec["max_failures"] = None if rng.random() < 0.1 else rng.choice([0, 2, 5, 10])
        allow.append(rec)
    accounts: list[dict[str, Any]] = []
    for i in range(rng.randint(0, 4)):
        rec = {"user": rng.choice(users), "t": rng.randrange(-MINUTE, 4 * MINUTE, 5000),
               "seq": 2000 + i}
        if rng.random() < 0.1:
            rec["_deleted"] = True
        else:
            rec["service"] = None if rng.random() < 0.1 else rng.random() < 0.6
        accounts.append(rec)
    return events, allow, accounts


def as_items(events: list[dict[str, Any]], allow: list[dict[str, Any]],
             accounts: list[dict[str, Any]]) -> tuple[list[Event], list[tuple[int, Event]]]:
    """The events (in time order) and the table records, each with its time."""
    evs = [Event("logins", e["ts"], e["seq"], {k: v for k, v in e.items() if k != "seq"})
           for e in sorted(events, key=lambda e: (e["ts"], e["seq"]))]
    recs = [(r["t"], Event(table, r["t"], r["seq"], {k: v for k, v in r.items() if k != "seq"}))
            for table, rows in (("allow", allow), ("accounts", accounts)) for r in rows]
    return evs, recs


def live_order(rng: random.Random, evs: list[Event], recs: list[tuple[int, Event]],
               ) -> list[Event]:
    """Each table record at a random place before the first event that could release an
    event at its time (the order in which no update reaches a live job later than LATENESS)."""
    slots: list[list[Event]] = [[] for _ in range(len(evs) + 1)]
    for t, rec in recs:
        limit = next((i for i, e in enumerate(evs) if e.ts >= t + LATENESS_MS + 1), len(evs))
        slots[rng.randint(0, limit)].append(rec)
    out: list[Event] = []
    for i, ev in enumerate(evs):
        out.extend(slots[i])
        out.append(ev)
    out.extend(slots[-1])
    return out


class PicklingStore(MemoryKeyStore):
    """The state as the Spark operator keeps it: every key's state pickled when stored."""

    def put(self, sk: Any, state: Any) -> None:
        super().put(sk, pickle.loads(pickle.dumps(state)))


def engine_alerts(window: str, items: list[Event], batch: int, roundtrip: bool = False,
                  ) -> list[tuple]:
    engine = build_engine(ruleset(window))
    store = PicklingStore() if roundtrip else MemoryKeyStore()
    return sorted((m.key, m.first_ts, m.last_ts, tuple(sorted(m.measures.items())))
                  for m in run_embedded(engine, items, batch_size=batch, store=store)
                  if isinstance(m, Match))


# ------------------------------------------------------------------------ the tests


@pytest.mark.parametrize("window", list(WINDOWS))
@pytest.mark.parametrize("seed", range(60))
def test_window_rules_reading_tables_equal_the_reference(window: str, seed: int) -> None:
    rng = random.Random(seed)
    events, allow, accounts = history(rng)
    evs, recs = as_items(events, allow, accounts)
    got = engine_alerts(window, live_order(rng, evs, recs), rng.choice([1, 3, 7, 1000]))
    assert got == reference(window, events, allow, accounts)


@pytest.mark.parametrize("window", list(WINDOWS))
@pytest.mark.parametrize("order", ["tables first", "tables last", "interleaved"])
def test_a_replay_gives_the_same_alerts_whatever_the_read_order(window: str, order: str) -> None:
    """A replay has all its input in one call: the order of the inputs does not matter."""
    total = 0
    for seed in range(20):
        rng = random.Random(1000 + seed)
        events, allow, accounts = history(rng)
        evs, recs = as_items(events, allow, accounts)
        records = [r for _, r in recs]
        items = {"tables first": records + evs, "tables last": evs + records,
                 "interleaved": rng.sample(evs + records, len(evs) + len(records))}[order]
        want = reference(window, events, allow, accounts)
        assert engine_alerts(window, items, len(items) or 1) == want
        total += len(want)
    assert total > 0  # the histories do raise alerts


def test_state_pickled_between_batches_gives_the_same_alerts() -> None:
    total = 0
    for seed in range(40):
        rng = random.Random(5000 + seed)
        window = rng.choice(list(WINDOWS))
        events, allow, accounts = history(rng)
        evs, recs = as_items(events, allow, accounts)
        items = live_order(rng, evs, recs)
        want = reference(window, events, allow, accounts)
        assert engine_alerts(window, items, 3, roundtrip=True) == want
        total += len(want)
    assert total > 0


def test_the_reference_histories_raise_alerts_for_many_seeds() -> None:
    """The property above is not vacuous: most seeds' histories raise an alert."""
    raised = sum(1 for seed in range(60) for window in WINDOWS
                 if reference(window, *history(random.Random(seed))))
    assert raised >= 60


def test_having_reads_the_row_as_of_the_windows_last_event() -> None:
    """The allowance changes inside the window: the window is judged by the allowance in
    force at its last counted event, not at its end or at its first event."""
    events = [{"ts": t, "ip": "10.0.0.1", "user": "alice", "outcome": "failure", "seq": i}
              for i, t in enumerate((0, 10_000, 20_000, 30_000))]
    events.append({"ts": 70_000, "ip": "10.0.0.9", "user": "bob", "outcome": "success",
                   "seq": 9})  # event time passes the first window's end
    allow = [{"ip": "10.0.0.1", "t": -MINUTE, "max_failures": 10, "seq": 100},
             {"ip": "10.0.0.1", "t": 25_000, "max_failures": 3, "seq": 101},
             {"ip": "10.0.0.1", "t": 45_000, "max_failures": 100, "seq": 102}]
    evs, recs = as_items(events, allow, [])
    got = engine_alerts("TUMBLING (SIZE 1m)", live_order(random.Random(0), evs, recs), 1)
    assert got == [("10.0.0.1", 0, 30_000, (("allowance", 3), ("failures", 4),
                                            ("window_end", MINUTE), ("window_start", 0)))]


@pytest.mark.parametrize("clause, message", [
    ("HAVING COUNT(*) > allow[user].max_failures",
     "in HAVING and MEASURES a table is read by the window's key (ip)"),
    ("HAVING SUM(allow[ip].max_failures) > 1",
     "a table lookup cannot be inside SUM over a window"),
])
def test_errors_name_the_place_and_the_fix(clause: str, message: str) -> None:
    text = HEAD + ("RULE r FROM logins PARTITION BY ip WINDOW TUMBLING (SIZE 1m)\n"
                   f"  {clause}\n  EMIT 'x';\n")
    with pytest.raises(CompileErrors) as err:
        compile_rules(text, "bad.cep")
    shown = str(err.value)
    assert message in shown
    assert "bad.cep:6:" in shown
