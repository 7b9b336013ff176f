"""Sliding-window aggregates (docs/windows.md): throughput of a rule reading a 30-day window
(`AVG(amount) OVER 30d`, `COUNT(*) OVER 30d`) as a ratio to the same rule without it, same
events, same run, embedded engine (`run_embedded`).

The windowed rule runs on the Python engine (the core does not run windows), so the main ratio
is against the same rule without the window on the Python engine too; the rule without the
window on the native engine (its default) is reported beside it.

    python -m bench.windows [--events 200000] [--keys 2000] [--days 60] [--repeat 3]
        [--out bench/results/windows.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

from cep.compile import compile_rules
from cep.runtime.bind import build_embedded_engine, engine_kind
from cep.runtime.engine import Event, run_embedded

HEAD = ("STREAM transactions (ts INT, card STRING, amount FLOAT) TIME BY ts LATENESS 5s;\n"
        "RULE r FROM transactions PARTITION BY card PATTERN (big) ")
PLAIN = HEAD + "DEFINE big AS amount >= 200 AND amount > 1000 MEASURES amount AS amount EMIT 'x';"
WINDOWED = HEAD + ("DEFINE big AS amount >= 200 AND COUNT(*) OVER 30d EXCLUDE CURRENT ROW >= 5 "
                   "AND amount > 5 * AVG(amount) OVER 30d EXCLUDE CURRENT ROW "
                   "MEASURES amount AS amount, AVG(amount) OVER 30d EXCLUDE CURRENT ROW AS usual "
                   "EMIT 'x';")
T0 = 1_767_225_600_000


def events(n: int, keys: int, days: int, seed: int = 1) -> list[Event]:
    rnd = random.Random(seed)
    span = days * 86_400_000
    times = sorted(rnd.randrange(span) for _ in range(n))
    out = []
    for i, t in enumerate(times):
        amount = round(rnd.uniform(5, 80), 2) if rnd.random() > 0.002 else 1500.0
        data = {"ts": T0 + t, "card": f"card-{rnd.randrange(keys):05d}", "amount": amount}
        out.append(Event("transactions", T0 + t, i, data))
    return out


def run_once(text: str, evs: list[Event], use_native: bool) -> tuple[float, int, str]:
    engine = build_embedded_engine(compile_rules(text, "bench.cep"), use_native=use_native)
    start = time.perf_counter()
    alerts = sum(1 for _ in run_embedded(engine, evs, batch_size=10_000))
    return time.perf_counter() - start, alerts, engine_kind(engine)


def measure(n_events: int, keys: int, days: int, repeat: int) -> dict[str, Any]:
    """Best of `repeat` interleaved runs per variant, over the same events."""
    evs = events(n_events, keys, days)
    variants = {"plain_python": (PLAIN, False), "windowed_python": (WINDOWED, False),
                "plain_native": (PLAIN, True)}
    best: dict[str, float] = {}
    info: dict[str, Any] = {}
    for _ in range(repeat):  # interleaved, best of `repeat` per variant
        for name, (text, native) in variants.items():
            secs, alerts, kind = run_once(text, evs, native)
            best[name] = min(best.get(name, secs), secs)
            info[name] = {"engine": kind, "alerts": alerts}
    rows = {name: {**info[name], "seconds": round(best[name], 3),
                   "events_per_s": round(n_events / best[name])} for name in variants}
    return {
        "bench": "windows", "events": n_events, "keys": keys, "days": days, "repeat": repeat,
        "python": platform.python_version(), "machine": platform.machine(),
        "rows": rows,
        "ratio_windowed_vs_plain_python": round(
            rows["windowed_python"]["events_per_s"] / rows["plain_python"]["events_per_s"], 3),
        "ratio_windowed_vs_plain_native": round(
            rows["windowed_python"]["events_per_s"] / rows["plain_native"]["events_per_s"], 3),
    }


def render_md(res: dict[str, Any]) -> str:
    lines = [f"## A 30-day sliding window vs the same rule without it ({res['events']:,} events, "
             f"{res['keys']:,} cards over {res['days']} days, best of {res['repeat']})", "",
             "| variant | engine | events/s | alerts |", "|---|---|---|---|"]
    for name, row in res["rows"].items():
        lines.append(f"| {name} | {row['engine']} | {row['events_per_s']:,} | {row['alerts']:,} |")
    lines += ["", "Windowed / plain, same Python engine: "
              f"**{res['ratio_windowed_vs_plain_python']}x**; windowed (Python) / plain on the "
              f"native engine: {res['ratio_windowed_vs_plain_native']}x."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--keys", type=int, default=2_000)
    p.add_argument("--days", type=int, default=60)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    result = {**measure(a.events, a.keys, a.days, a.repeat),
              "command": "PYTHONPATH=. python -m bench.windows "
                         + " ".join(sys.argv[1:] if argv is None else argv)}
    print(json.dumps(result, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    return result
