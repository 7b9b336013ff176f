"""The native core against the Python engine, embedded, one core, same events, same run.

    .venv/bin/python -m bench.native [--events N] [--keys K] [--domain fraud|trading|machines]
                                     [--batch B] [--repeat R] [--out bench/results/native.md]

Four configurations run the bundled bench rules over the same generated stream (sorted by
(ts, seq), batches of B events, the watermark from before each batch, end of input at the last
event time), and their alerts must be identical:

- `python`: the Python engine loop on the Python matcher (the specification);
- `stage 1`: the Python engine loop on the native matcher (`build_engine`);
- `stage 2, events`: the engine loop in the core (`build_embedded_engine` -> NativeEngine),
  fed `Event` objects through `run_embedded`;
- `stage 2, arrow`: the same engine fed pyarrow RecordBatches (columns stream, ts, seq and the
  event fields) through `NativeEngine.ingest_batch`; building the batches is not timed.

Prints events/s (wall and CPU time of the process) of each and the ratios to `python`; with
`--out` also writes them as a Markdown table with the command and the machine's load.

`--repeat R` runs each native configuration R times, each on a fresh engine, and takes the run
of median CPU time (every run's figure is printed). The Python engine runs once: at 1-2k
events/s its one run lasts tens of seconds, while a native run lasts a fraction of a second,
short enough to fall whole into one of the slow or fast spells a shared machine's speed goes
through (single native runs of the same build were seen 2x apart within a minute here, session
21; spells of minutes, session 25). So with `ends_only` (make bench's trading step) the R runs of
the core from Arrow are spread over the Python run's span: one before it, one after it, and the
others between its batches (the Python engine then runs in R - 1 batches; batch size changes no
alert, and the core's runs inside it are left out of its CPU time). Until session 26 all R ran
after the Python run, within ~1.5 s, so the median fell into whichever spell followed it.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from bench.workloads import dataset, load_rules, rules_path, stream_of
from cep.runtime.bind import build_embedded_engine, build_engine, engine_kind, matcher_kind
from cep.runtime.engine import NEG_INF, Event, MemoryKeyStore, events_from_dicts, run_embedded

RULES = Path(__file__).resolve().parent / "rules"


def _alert(r: Any) -> tuple:
    return (r.kind, r.rule_id, str(r.key), r.first_ts, r.last_ts,
            tuple(sorted((k, repr(v)) for k, v in getattr(r, "measures", {}).items())))


def _timed(fn: Any) -> tuple[list[tuple], float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    alerts = fn()
    return alerts, time.perf_counter() - t0, time.process_time() - c0


def _events_run(engine: Any, events: list[Event], batch: int) -> list[tuple]:
    return [_alert(r) for r in run_embedded(engine, events, batch_size=batch)]


def arrow_batches(events: list[Event], batch: int) -> list[tuple[Any, int]]:
    """Events as Arrow record batches of `batch` rows, each with its highest event time."""
    import pyarrow as pa

    out = []
    for i in range(0, len(events), batch):
        chunk = events[i:i + batch]
        cols: dict[str, list[Any]] = {"stream": [e.stream for e in chunk],
                                      "seq": [e.seq for e in chunk]}
        for name in chunk[0].data:
            cols[name] = [e.data.get(name) for e in chunk]
        out.append((pa.RecordBatch.from_pydict(cols), max(e.ts for e in chunk)))
    return out


def _arrow_run(engine: Any, batches: list[tuple[Any, int]]) -> list[tuple]:
    store, max_ts = MemoryKeyStore(), NEG_INF
    alerts: list[tuple] = []
    for rb, top in batches:
        alerts.extend(_alert(r) for r in engine.ingest_batch(store, rb, max_ts).matches)
        max_ts = max(max_ts, top)
    if max_ts != NEG_INF:
        alerts.extend(_alert(r) for r in
                      engine.advance(store, max_ts, end_of_input=max_ts).matches)
    return alerts


def measure(domain: str, n_events: int, keys: int, batch: int, repeat: int,
            ends_only: bool = False) -> list[tuple[str, list[tuple], float, float, int]]:
    """The four configurations above on the same events: (name, alerts, wall s, CPU s, events)
    each, the Python engine's first; `ends_only`: the Python engine and the core from Arrow
    batches only."""
    ruleset = load_rules(rules_path(RULES, domain))
    ds = dataset(domain, n_events, keys, 10)
    events = sorted(events_from_dicts(stream_of(ruleset), ds.events), key=lambda e: (e.ts, e.seq))
    batches = arrow_batches(events, batch)
    n = len(events)

    python = build_engine(ruleset, use_native=False)

    def stage1() -> Any:
        return build_engine(ruleset, use_native=True)

    def embedded() -> Any:
        return build_embedded_engine(ruleset, use_native=True)

    assert {matcher_kind(r.matcher) for r in stage1().rules.values()} == {"native"}
    assert engine_kind(embedded()) == "native", "a bench rule does not run on the native engine"
    # (name, runs, a fresh engine (built before the clock starts), the timed run on it)
    runs: list[tuple[str, int, Any, Any]] = [
        ("python engine, python matcher", 1, lambda: python,
         lambda e: _events_run(e, events, batch)),
        ("stage 1: python engine, native matcher", repeat, stage1,
         lambda e: _events_run(e, events, batch)),
        ("stage 2: native engine, Event objects", repeat, embedded,
         lambda e: _events_run(e, events, batch)),
        ("stage 2: native engine, Arrow batches", repeat, embedded,
         lambda e: _arrow_run(e, batches)),
    ]
    if ends_only:
        return _spread(events, batches, python, embedded, repeat)
    results = []
    for name, times, make, run in runs:
        timed = []
        for _ in range(times):
            engine = make()
            timed.append(_timed(functools.partial(run, engine)))
        if times > 1:
            print(f"  {name}: " + ", ".join(f"{n / cpu:,.0f}" for _, _, cpu in timed)
                  + " ev/s cpu per run; the median run below", flush=True)
        alerts, wall, cpu = sorted(timed, key=lambda t: t[2])[(times - 1) // 2]
        if any(t[0] != alerts for t in timed):
            raise RuntimeError(f"{name}: runs gave different alerts")
        results.append((name, alerts, wall, cpu, n))
    return results


def _spread(events: list[Event], batches: list[tuple[Any, int]], python: Any, make: Any,
            repeat: int) -> list[tuple[str, list[tuple], float, float, int]]:
    """The Python engine once, in `repeat - 1` batches, and `repeat` core runs from Arrow spread
    over its span (the module's docstring): the Python run's times exclude the core runs'."""
    n = len(events)
    core: list[tuple[list[tuple], float, float]] = []

    def core_run() -> None:
        engine = make()
        core.append(_timed(functools.partial(_arrow_run, engine, batches)))

    per = -(-n // max(repeat - 1, 1))

    def fed() -> Any:  # the events, with a core run at each of the Python batches' boundaries
        for i, ev in enumerate(events):
            if i and i % per == 0 and len(core) < repeat - 1:
                core_run()
            yield ev

    core_run()
    py_alerts, py_wall, py_cpu = _timed(lambda: [_alert(r) for r in run_embedded(
        python, fed(), batch_size=per)])
    inside = core[1:]
    py_wall -= sum(t[1] for t in inside)
    py_cpu -= sum(t[2] for t in inside)
    while len(core) < repeat:
        core_run()
    print("  stage 2: native engine, Arrow batches (spread over the Python run): "
          + ", ".join(f"{n / cpu:,.0f}" for _, _, cpu in core)
          + " ev/s cpu per run; the median run below", flush=True)
    if any(t[0] != core[0][0] for t in core):
        raise RuntimeError("the core's runs gave different alerts")
    alerts, wall, cpu = sorted(core, key=lambda t: t[2])[(repeat - 1) // 2]
    # sorted: the order alerts leave in follows the batches (the Python engine's are smaller)
    return [("python engine, python matcher", sorted(py_alerts), py_wall, py_cpu, n),
            ("stage 2: native engine, Arrow batches", sorted(alerts), wall, cpu, n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--domain", default="fraud")
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each native configuration, "
                    "each on a fresh engine; the median by CPU time is reported")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    results = measure(args.domain, args.events, args.keys, args.batch, args.repeat)
    ruleset = load_rules(rules_path(RULES, args.domain))
    n = results[0][4]
    load = os.getloadavg()
    ref_alerts, ref_wall, ref_cpu = results[0][1], results[0][2], results[0][3]
    lines = [f"{args.domain}: {n:,} events, {args.keys:,} keys, {len(ruleset.rules)} rules, "
             f"batches of {args.batch:,}, native runs {args.repeat} (median), "
             f"load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"]
    rows = []
    same = True
    for name, alerts, wall, cpu, _ in results:
        ok = alerts == ref_alerts
        same &= ok
        lines.append(f"  {name:<42} {n / wall:>10,.0f} ev/s wall {n / cpu:>10,.0f} ev/s cpu  "
                     f"{ref_wall / wall:5.2f}x wall {ref_cpu / cpu:5.2f}x cpu  "
                     f"{len(alerts)} alerts{'' if ok else '  DIFFERENT'}")
        rows.append(f"| {name} | {n / wall:,.0f} | {n / cpu:,.0f} | {ref_wall / wall:.2f}x | "
                    f"{ref_cpu / cpu:.2f}x | {len(alerts)} | {'yes' if ok else 'NO'} |")
    lines.append(f"  identical alerts: {same}")
    print("\n".join(lines))
    if args.out is not None:
        cmd = "python -m bench.native " + " ".join(sys.argv[1:])
        text = (f"\n## {args.domain}, {n:,} events, {args.keys:,} keys, "
                f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n"
                f"`{cmd}` on {platform.machine()} ({os.cpu_count()} cores, shared), load "
                f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}, batches of {args.batch:,}, "
                f"one process (one core).\n\n"
                "| configuration | ev/s wall | ev/s CPU | vs python (wall) | vs python (CPU) | "
                "alerts | identical |\n|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
        if not args.out.exists():
            text = ("# Native core vs Python engine (bench/native.py)\n\n"
                    "Embedded, one process, same events and same run for every configuration; "
                    "docs/native-core.md explains the stages.\n" + text)
        with args.out.open("a") as f:
            f.write(text)
    if not same:
        raise SystemExit("native and Python alerts differ")


if __name__ == "__main__":
    main()
