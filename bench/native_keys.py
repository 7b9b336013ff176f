"""Issue 13's keys ratio: many cards against few, one fresh process per run, alternated.

    python -m bench.native_keys [--rounds R] [--many EVENTS KEYS] [--few EVENTS KEYS] [--json F]

Each round runs `bench.native_ab` once for the many-card set (default 2M events over 1M cards)
and once for the few-card set (1M events over 1k cards), each in its own process (a fresh heap:
the 1M-card run's memory is part of what it costs), the order swapped every round so that
neither side always runs in the same spell of a shared machine. The ratio is the median of the
many-card runs over the median of the few-card runs, by CPU and by user time: the same statistic
on both sides and the same number of runs (earlier sessions set one run against the best of
two, docs/native-core.md "Many keys: the measure (session 22, the lead)"). Each round's own
ratio is printed too, so the spread shows. Both data sets are cached (bench.native_ab with 0
runs) before the first timed run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

RUN = re.compile(r"ev/s wall ([\d,]+) ev/s CPU "
                 r"\(user [\d.]+ s, system [\d.]+ s: ([\d,]+) ev/s user\)")


def one_run(events: int, keys: int, env: dict[str, str] | None = None) -> tuple[float, float]:
    """(events/s by CPU, events/s by user time) of one `bench.native_ab` run in a new process."""
    out = subprocess.run([sys.executable, "-m", "bench.native_ab", str(events), str(keys), "1"],
                         check=True, capture_output=True, text=True, env=env).stdout
    m = RUN.search(out)
    if m is None:
        raise RuntimeError(f"bench.native_ab printed no run:\n{out}")
    cpu, user = (float(g.replace(",", "")) for g in m.groups())
    return cpu, user


def measure(rounds: int, many_set: tuple[int, int], few_set: tuple[int, int],
            cache: Path | None = None) -> dict[str, Any]:
    """The rounds above: each side's runs (events/s by CPU, by user time) and the ratio of the
    medians, by CPU and by user time. `cache`: bench.native_ab's batch cache ($CEP_AB_CACHE)."""
    env = None if cache is None else {**os.environ, "CEP_AB_CACHE": str(cache)}
    for events, keys in (many_set, few_set):  # the data sets cached before any timed run
        subprocess.run([sys.executable, "-m", "bench.native_ab", str(events), str(keys), "0"],
                       check=True, capture_output=True, env=env)
    many: list[tuple[float, float]] = []
    few: list[tuple[float, float]] = []
    for r in range(rounds):
        order = ((many, many_set), (few, few_set))
        for runs, (events, keys) in order if r % 2 == 0 else order[::-1]:
            runs.append(one_run(events, keys, env))
        load = os.getloadavg()[0]
        print(f"round {r}: {many_set[1]:,} keys {many[-1][0]:,.0f} ev/s CPU, {few_set[1]:,} keys "
              f"{few[-1][0]:,.0f}: {many[-1][0] / few[-1][0]:.2f} by CPU, "
              f"{many[-1][1] / few[-1][1]:.2f} by user time (load {load:.1f})", flush=True)
    ratio = {by: statistics.median(m[i] for m in many) / statistics.median(f[i] for f in few)
             for i, by in enumerate(("cpu", "user"))}
    print(f"median ratio over {rounds} rounds: {ratio['cpu']:.3f} by CPU, "
          f"{ratio['user']:.3f} by user time")
    return {"many": many_set, "few": few_set, "many_runs": many, "few_runs": few,
            "ratio": ratio}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6, help="even: each set first as often")
    ap.add_argument("--many", type=int, nargs=2, default=(2_000_000, 1_000_000),
                    metavar=("EVENTS", "KEYS"))
    ap.add_argument("--few", type=int, nargs=2, default=(1_000_000, 1_000),
                    metavar=("EVENTS", "KEYS"))
    ap.add_argument("--json", type=Path, help="write the runs and ratios here")
    a = ap.parse_args(argv)
    res = measure(a.rounds, a.many, a.few)
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
