"""Throughput of a rule that reads a 1M-row table, as a ratio to the same rule without it
(issue 15 part 1; docs/tables.md). Embedded, one process, same events, same run.

- `with table`: `amount > 5 * customers[card].avg_amount AND country <> customers[card].
  home_country`, the table loaded first as 1M changelog records (one per card) through
  `Engine.ingest` (the load is timed on its own), then the events.
- `without table`: the same rule with the row's values as constants (`amount > 5 * 40.0 AND
  country <> 'NL'`), on the same engine loop and matcher (the Python ones: a rule with a table
  lookup runs there, docs/tables.md), and, for what the rule costs without the table where it
  could run, on the native engine loop.

Events: `--events` charges on cards drawn uniformly from the table's `--rows` keys, in time
order, in batches of `--batch` with the watermark from before each batch (as bench/native.py).

    python -m bench.tables [--rows 1000000] [--events 200000] [--out bench/results/tables.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import resource
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cep.compile import compile_rules
from cep.runtime.bind import build_embedded_engine, build_engine, engine_kind
from cep.runtime.engine import NEG_INF, Event, MemoryKeyStore
from cep.runtime.matcher import Match

HEAD = """STREAM tx (ts INT, card STRING, amount FLOAT, country STRING) TIME BY ts LATENESS 5s;
TABLE customers (card STRING, home_country STRING, avg_amount FLOAT, updated INT)
  KEY card TIME BY updated FROM KAFKA 'customers';
"""
WITH = """RULE far FROM tx PARTITION BY card PATTERN (big)
  DEFINE big AS amount > 5 * customers[card].avg_amount AND country <> customers[card].home_country
  MEASURES customers[card].home_country AS home EMIT 'far';
"""
WITHOUT = """RULE far FROM tx PARTITION BY card PATTERN (big)
  DEFINE big AS amount > 5 * 40.0 AND country <> 'NL'
  MEASURES 'NL' AS home EMIT 'far';
"""
T0 = 1767225600000


def table_records(rows: int) -> list[Event]:
    return [Event("customers", T0 - 86_400_000, i,
                  {"card": f"c{i}", "home_country": "NL", "avg_amount": 40.0,
                   "updated": T0 - 86_400_000}) for i in range(rows)]


def events(n: int, rows: int, seed: int = 7) -> list[Event]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        card = f"c{rng.randrange(rows)}"
        data = {"ts": T0 + i * 10, "card": card, "amount": rng.choice([5.0, 50.0, 500.0]),
                "country": rng.choice(["NL", "NL", "NL", "FR"])}
        out.append(Event("tx", data["ts"], i, data))
    return out


def run(engine: Any, store: MemoryKeyStore, evs: list[Event], batch: int) -> tuple[float, float,
                                                                                    int]:
    max_ts = NEG_INF
    alerts = 0
    w0, c0 = time.perf_counter(), time.process_time()
    for i in range(0, len(evs), batch):
        chunk = evs[i:i + batch]
        out = engine.ingest(store, chunk, max_ts)
        alerts += sum(isinstance(m, Match) for m in out.matches)
        max_ts = max(max_ts, chunk[-1].ts)
    out = engine.advance(store, max_ts, end_of_input=max_ts)
    alerts += sum(isinstance(m, Match) for m in out.matches)
    return time.perf_counter() - w0, time.process_time() - c0, alerts


def measure(rows: int, n_events: int, batch: int = 10_000) -> dict[str, Any]:
    """The figures of one run: the table's load, then each configuration over the same events
    (`configs`: label, wall s, CPU s, alerts; the second is the baseline)."""
    with_rules = compile_rules(HEAD + WITH, "with.cep")
    without_rules = compile_rules(HEAD + WITHOUT, "without.cep")
    evs = events(n_events, rows)
    configs = []

    # with the table: load it, then the events (the same engine and store)
    engine = build_engine(with_rules)
    assert engine_kind(engine) == "python"
    store = MemoryKeyStore()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    records = table_records(rows)
    w0 = time.perf_counter()
    for i in range(0, len(records), 100_000):
        engine.ingest(store, records[i:i + 100_000], NEG_INF)
    load_wall = time.perf_counter() - w0
    del records
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    keys = sum(1 for k in store.states if k[0].startswith("\x00table:"))
    assert keys == rows
    wall, cpu, alerts = run(engine, store, evs, batch)
    configs.append((f"with {rows:,}-row table: python engine, python matcher", wall, cpu,
                    alerts))
    del engine, store
    for label, eng in [
        ("without table: python engine, python matcher", build_engine(without_rules,
                                                                      use_native=False)),
        ("without table: native engine loop", build_embedded_engine(without_rules)),
    ]:
        wall, cpu, alerts = run(eng, MemoryKeyStore(), evs, batch)
        configs.append((label, wall, cpu, alerts))
    base = configs[1]
    load = os.getloadavg()
    return {"rows": rows, "events": n_events, "batch": batch, "load_wall": load_wall,
            "load_rss_mb": (rss1 - rss0) / 1024, "table_keys": keys,
            "configs": [list(c) for c in configs],
            "ratio_with_vs_without_cpu": base[2] / configs[0][2],
            "ratio_with_vs_without_wall": base[1] / configs[0][1],
            "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "load": f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}"}


def render_md(res: dict[str, Any], command: str | None = None) -> str:
    rows, n = res["rows"], res["events"]
    base = res["configs"][1]
    command = command or f"python -m bench.tables --rows {rows} --events {n}"
    lines = [f"## {rows:,}-row table, {n:,} events, {res['when']}", "",
             f"`{command}` on {platform.machine()} ({os.cpu_count()} cores, shared), load "
             f"{res['load']}, batches of {res['batch']:,}, one process (one core).", "",
             f"Table load: {rows:,} changelog records through `Engine.ingest` in "
             f"{res['load_wall']:.1f} s wall ({rows / res['load_wall']:,.0f} records/s), max RSS "
             f"+{res['load_rss_mb']:,.0f} MB ({res['table_keys']:,} table keys in the store).",
             "",
             "| configuration | ev/s wall | ev/s CPU | vs without table, same engine (wall) "
             "| (CPU) | alerts |", "|---|---|---|---|---|---|"]
    for label, wall, cpu, alerts in res["configs"]:
        lines.append(f"| {label} | {n / wall:,.0f} | {n / cpu:,.0f} | "
                     f"{base[1] / wall:.2f}x | {base[2] / cpu:.2f}x | {alerts:,} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    res = measure(args.rows, args.events, args.batch)
    text = render_md(res, f"python -m bench.tables --rows {args.rows} --events {args.events}"
                     + (f" --out {args.out}" if args.out else ""))
    print(text)
    if args.out:
        out = Path(args.out)
        head = ("# Table lookups vs the same rule without the table (bench/tables.py)\n\n"
                "Embedded, one process, same events and same run; docs/tables.md.\n\n")
        prev = out.read_text() if out.exists() else head
        out.write_text(prev + ("\n" if not prev.endswith("\n\n") else "") + text)


if __name__ == "__main__":
    main()
