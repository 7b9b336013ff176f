"""Memory growth: the CEP engine's key state vs keys and vs rules, the percolator vs stored queries.

CEP (fraud workload, bench/rules/fraud.cep): events are fed to `Engine.ingest` in batches of
10,000 with the watermark from before each batch, as `run_embedded` does, and the feed stops
half-way through the generated stream (every card is then mid-stream: its partial matches are
alive), before any end-of-input flush. 10 events per key are generated (5 ingested), fewer at
100,000 keys to stay under `EVENTS_CAP`. Measured on the `MemoryKeyStore` at that point:
- key states: `len(store.states)` (one entry per (rule group, key));
- pickled bytes: every state pickled on its own with protocol 5, as the Spark store writes them,
  plus the wake index;
- heap bytes: tracemalloc's count of what unpickling the states (a sample of at most
  `HEAP_SAMPLE`, scaled to all of them) and the wake index allocates, i.e. the Python heap a
  worker holds for that state once loaded. Deterministic, unlike an RSS delta, and unlike tracing
  the whole run it counts the event dicts the buffers and partial matches hold (the embedded run
  shares those with its input list) and none of the engine's transient garbage.

Percolator (bench/percolation.py workloads): `Percolator.from_searches` on n queries, one fresh
subprocess per point (the quick mode stays in-process, tracemalloc only). Measured: the RSS delta
over an untraced build and its peak (VmHWM, reset just before the build) above the pre-build
baseline; then, up to `TRACE_MAX` queries (tracing slows the build 2-4x), tracemalloc's current
(after the build, after gc) and peak over a second build. The queries themselves are generated
before the baseline: figures are the index's own memory beyond the caller's `SavedSearch` list.

`python -m bench.growth [--quick] [--out DIR]` runs it alone and writes growth.json, growth.md and
the plots into DIR (default bench/results/tmp/growth).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.workloads import DEFAULT_RULES, ROOT, dataset, rules_path, scaled_rules, stream_of
from cep.runtime.bind import build_engine
from cep.runtime.engine import MemoryKeyStore, events_from_dicts

BATCH = 10_000        # events per Engine.ingest call, as in bench/embedded.py
EVENTS_CAP = 400_000  # events generated per CEP point at most (half of them are ingested)
HEAP_SAMPLE = 10_000  # states unpickled under tracemalloc per point at most
TRACE_MAX = 10_000    # percolator points above this many queries: RSS only
RULES_KEYS = 10_000   # keys of the vs-rules curve
NEG_INF = -(2**62)    # "no event yet" for the watermark (the engine's own sentinel value)

FULL = {"keys": (1_000, 10_000, 100_000), "rules": (3, 6, 12, 24),
        "queries": (1_000, 10_000, 100_000), "rules_keys": RULES_KEYS, "isolate": True}
QUICK = {"keys": (200, 1_000), "rules": (3, 6), "queries": (100, 1_000), "rules_keys": 1_000,
         "isolate": False}


# -- measuring ----------------------------------------------------------------------------------

@contextmanager
def _traced() -> Iterator[Callable[[], tuple[int, int]]]:
    """tracemalloc while the block runs; the callable gives (current, peak) bytes allocated
    since the block began (relative, so it also works when tracing was already on)."""
    was = tracemalloc.is_tracing()
    if not was:
        tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()

    def now() -> tuple[int, int]:
        cur, peak = tracemalloc.get_traced_memory()
        return cur - base, peak - base

    try:
        yield now
    finally:
        if not was:
            tracemalloc.stop()


def _status_bytes(field: str) -> int:
    """A size line of /proc/self/status (VmRSS: now, VmHWM: the high-water mark), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _rss() -> int:
    return _status_bytes("VmRSS")


def _reset_peak_rss() -> bool:
    """Reset the kernel's RSS high-water mark (VmHWM) of this process (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss() -> int:
    return _status_bytes("VmHWM")


def state_sizes(store: MemoryKeyStore) -> dict[str, Any]:
    """Pickled and heap bytes of a store's states and wake index (see the module doc)."""
    blobs = [pickle.dumps(s, protocol=5) for s in store.states.values()]
    wake = pickle.dumps(store.wake, protocol=5)
    n = len(blobs)
    step = max(1, -(-n // HEAP_SAMPLE))
    sample = blobs[::step]
    gc.collect()
    with _traced() as now:
        loaded = [pickle.loads(b) for b in sample]
        sample_heap = now()[0]
        loaded_wake = pickle.loads(wake)
        wake_heap = now()[0] - sample_heap
    del loaded, loaded_wake
    states_heap = sample_heap * n / len(sample) if sample else 0.0
    pickled = sum(map(len, blobs))
    return {"states": n, "pickled_bytes": pickled, "wake_pickled_bytes": len(wake),
            "pickled_per_key": (pickled + len(wake)) / n if n else 0.0,
            "heap_bytes": states_heap + wake_heap, "wake_heap_bytes": wake_heap,
            "heap_per_key": (states_heap + wake_heap) / n if n else 0.0,
            "heap_sample": len(sample)}


def cep_point(n_keys: int, n_rules: int, per_key: int) -> dict[str, Any]:
    """Ingest the first half (by event time) of `per_key * n_keys` fraud events; measure."""
    t0 = time.perf_counter()
    ds = dataset("fraud", per_key * n_keys, n_keys, 1)
    rules = scaled_rules(rules_path(DEFAULT_RULES, "fraud"), n_rules)
    half = len(ds.events) // 2
    n_in = half - half % BATCH if half >= BATCH else half
    dicts = sorted(ds.events, key=lambda d: d["ts"])[:n_in]
    events = events_from_dicts(stream_of(rules), dicts)
    events.sort(key=lambda e: (e.ts, e.seq))
    engine = build_engine(rules)
    store = MemoryKeyStore()
    max_ts = NEG_INF
    t1 = time.perf_counter()
    for i in range(0, len(events), BATCH):
        chunk = events[i:i + BATCH]
        engine.ingest(store, chunk, max_ts)  # the watermark from before the batch
        max_ts = max(max_ts, max(ev.ts for ev in chunk))
    ingest_s = time.perf_counter() - t1
    del events, dicts
    out = {"keys": n_keys, "rules": len(rules.rules), "events_generated": len(ds.events),
           "events_ingested": n_in, "events_per_key": n_in / n_keys,
           "ingest_seconds": ingest_s, **state_sizes(store)}
    out["seconds"] = time.perf_counter() - t0
    return out


def _per_key(n_keys: int) -> int:
    # 10 generated events per key (5 ingested), fewer when that would pass EVENTS_CAP, at least
    # 4 (2 ingested): a fraud key's state stops growing after its first event (see render_md).
    return max(4, min(10, EVENTS_CAP // n_keys))


def percolator_point(kind: str, n: int, trace: bool, isolated: bool = True) -> dict[str, Any]:
    """RSS over an untraced build when `isolated` (a fresh process: elsewhere the build reuses
    memory freed earlier and RSS hardly moves); then, when `trace`, tracemalloc over a second
    build (tracemalloc's own bookkeeping would inflate the RSS of a traced build 2x)."""
    from bench.percolation import WORKLOADS
    from percolator import Percolator

    queries, _events, schema = WORKLOADS[kind](n, 100)
    out: dict[str, Any] = {"workload": kind, "queries": n, "traced": trace,
                           "rss_delta_bytes": None, "rss_peak_delta_bytes": None,
                           "tracemalloc_current_bytes": None, "tracemalloc_peak_bytes": None}
    if isolated:
        gc.collect()
        rss0 = _rss()
        hwm_reset = _reset_peak_rss()
        t0 = time.perf_counter()
        perc = Percolator.from_searches(queries, schema=schema)
        out["build_seconds"] = time.perf_counter() - t0
        gc.collect()
        out["rss_delta_bytes"] = _rss() - rss0
        out["rss_peak_delta_bytes"] = _peak_rss() - rss0 if hwm_reset else None
        del perc
    if trace:
        gc.collect()
        t0 = time.perf_counter()
        with _traced() as now:
            perc = Percolator.from_searches(queries, schema=schema)
            out["tracemalloc_peak_bytes"] = now()[1]
            gc.collect()
            out["tracemalloc_current_bytes"] = now()[0]
        out.setdefault("build_seconds", time.perf_counter() - t0)  # traced: slower
        del perc
    cur = out["tracemalloc_current_bytes"]
    best = cur if cur is not None else out["rss_delta_bytes"]
    out["bytes"] = best
    out["bytes_per_query"] = best / n if best is not None else None
    out["measure"] = "tracemalloc" if cur is not None else "rss" if best is not None else None
    return out


def _percolator_subprocess(kind: str, n: int, trace: bool) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, "-m", "bench.growth", "--point", kind, str(n),
                           str(int(trace))], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"percolator point {kind} {n} failed: {proc.stderr[-2000:]}")
    res: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    res["subprocess"] = True
    return res


def run(quick: bool = False) -> dict[str, Any]:
    cfg = QUICK if quick else FULL
    t0 = time.perf_counter()
    perc_points = [(kind, n, n <= TRACE_MAX) for kind in ("structured", "text")
                   for n in cfg["queries"]]
    futures: list[Future[dict[str, Any]]] = []
    pool = None
    if cfg["isolate"]:
        # Fresh processes, two at a time, while this process does the CEP points: memory is
        # measured per process, so the overlap changes the seconds only.
        pool = ThreadPoolExecutor(max_workers=2)
        futures = [pool.submit(_percolator_subprocess, *p) for p in perc_points]
    try:
        done: dict[tuple[int, int, int], dict[str, Any]] = {}

        def point(keys: int, rules: int) -> dict[str, Any]:
            at = (keys, rules, _per_key(keys))  # the 10k keys x 3 rules point is on both curves
            if at not in done:
                done[at] = cep_point(*at)
            return dict(done[at])

        by_keys = [point(k, 3) for k in cfg["keys"]]
        by_rules = [point(cfg["rules_keys"], r) for r in cfg["rules"]]
        if pool is not None:
            perc = [f.result() for f in futures]
        else:
            perc = [percolator_point(*p, isolated=False) for p in perc_points]
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    return {"state_vs_keys": by_keys, "state_vs_rules": by_rules, "percolator": perc,
            "batch_size": BATCH, "heap_sample_max": HEAP_SAMPLE, "trace_max": TRACE_MAX,
            "quick": quick, "seconds": time.perf_counter() - t0}


# -- plots --------------------------------------------------------------------------------------

def _log_x(*axes: Any, xlabel: str, legend_size: int | None = None) -> None:
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=legend_size)


def plots(out: Path, section: dict[str, Any]) -> list[str]:
    from bench.plots import _save, plt

    names = []
    rows = section.get("state_vs_keys") or []
    if rows:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
        xs = [r["keys"] for r in rows]
        a1.plot(xs, [r["heap_bytes"] / 1e6 for r in rows], marker="o", label="heap (unpickled)")
        a1.plot(xs, [(r["pickled_bytes"] + r["wake_pickled_bytes"]) / 1e6 for r in rows],
                marker="s", label="pickled (protocol 5)")
        a1.set_yscale("log")
        a1.set_ylabel("engine state, MB")
        a2.plot(xs, [r["heap_per_key"] for r in rows], marker="o", label="heap")
        a2.plot(xs, [r["pickled_per_key"] for r in rows], marker="s", label="pickled")
        a2.set_ylabel("bytes per key state")
        a2.set_ylim(bottom=0)
        _log_x(a1, a2, xlabel="distinct keys (cards)")
        fig.suptitle(f"CEP engine state vs keys (fraud, {rows[0]['rules']} rules)")
        names.append(_save(fig, out, "growth_state_keys.png"))
    rows = section.get("state_vs_rules") or []
    if rows:
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = [r["rules"] for r in rows]
        ax.plot(xs, [r["heap_per_key"] for r in rows], marker="o", label="heap")
        ax.plot(xs, [r["pickled_per_key"] for r in rows], marker="s", label="pickled")
        ax.set_xlabel("rules (copies of fraud.cep)")
        ax.set_ylabel("bytes per key state")
        ax.set_ylim(bottom=0)
        ax.set_title(f"CEP engine state vs rules ({rows[0]['keys']:,} keys)")
        ax.grid(True, alpha=0.3)
        ax.legend()
        names.append(_save(fig, out, "growth_state_rules.png"))
    rows = section.get("percolator") or []
    if rows:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
        for i, kind in enumerate(sorted({r["workload"] for r in rows})):
            rs = [r for r in rows if r["workload"] == kind]
            for col, style, label in (("rss_delta_bytes", "o-", "RSS delta"),
                                      ("tracemalloc_current_bytes", "x--", "tracemalloc")):
                pts = [(r["queries"], r[col]) for r in rs if r[col] is not None]
                if pts:
                    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
                    a1.plot(xs, [y / 1e6 for y in ys], style, color=f"C{i}",
                            label=f"{kind}, {label}")
                    a2.plot(xs, [y / x for x, y in pts], style, color=f"C{i}",
                            label=f"{kind}, {label}")
        a1.set_yscale("log")
        a1.set_ylabel("index memory, MB")
        a2.set_ylabel("bytes per stored query")
        a2.set_ylim(bottom=0)
        _log_x(a1, a2, xlabel="stored queries", legend_size=8)
        fig.suptitle("Percolator index memory vs stored queries")
        names.append(_save(fig, out, "growth_percolator.png"))
    return names


# -- report -------------------------------------------------------------------------------------

def _mb(b: float | None) -> str:
    return "—" if b is None else f"{b / 1e6:,.2f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def _state_rows(rows: list[dict[str, Any]], first: str) -> list[list[str]]:
    return [[f"{r[first]:,}", f"{r['events_ingested']:,} ({r['events_per_key']:.0f}/key)",
             f"{r['states']:,}", _mb(r["pickled_bytes"] + r["wake_pickled_bytes"]),
             f"{r['pickled_per_key']:,.0f}", _mb(r["heap_bytes"]), f"{r['heap_per_key']:,.0f}"]
            for r in rows]


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares slope and intercept of ys over xs."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    return slope, my - slope * mx


def _perc_fit(rows: list[dict[str, Any]]) -> tuple[str, float, float] | None:
    """Bytes per stored query as the slope over all points, by one measure for all of them."""
    for col, name in (("rss_delta_bytes", "RSS"), ("tracemalloc_current_bytes", "tracemalloc")):
        rs = [r for r in rows if r[col] is not None]
        if len(rs) >= 2 and len(rs) == len(rows):
            return (name, *_fit([r["queries"] for r in rs], [r[col] for r in rs]))
    return None


def render_md(section: dict[str, Any], plots: list[str]) -> str:
    keys = section.get("state_vs_keys") or []
    rules = section.get("state_vs_rules") or []
    perc = section.get("percolator") or []
    hdr = ["events ingested", "key states", "pickled MB", "pickled B/key", "heap MB",
           "heap B/key"]
    out = ["## Memory growth", ""]
    batch = section.get("batch_size", BATCH)
    out += [f"CEP engine state on the fraud workload: batches of {batch:,} events into "
            "`Engine.ingest`, measured half-way through the stream, when every card has live "
            "partial matches (no end-of-input flush). *Pickled* is each key state "
            "pickled on its own with protocol 5, as the Spark store writes them, plus the wake "
            "index; *heap* is what tracemalloc counts when those pickles are loaded back (at most "
            f"{section.get('heap_sample_max', HEAP_SAMPLE):,} states, scaled to all), i.e. the "
            "Python heap that state takes once loaded, event dicts included (deterministic, "
            "unlike an RSS delta).", ""]
    if keys:
        out += [f"State vs keys ({keys[0]['rules']} rules):", ""]
        out += _table(["keys", *hdr], _state_rows(keys, "keys"))
        out += [""]
    if rules:
        out += [f"State vs rules ({rules[0]['keys']:,} keys):", ""]
        out += _table(["rules", *hdr], _state_rows(rules, "rules"))
        out += [""]
    out += [f"![{p}]({p})" for p in plots if p.startswith("growth_state")]
    if perc:
        isolated = any(r.get("subprocess") for r in perc)
        trace_max = section.get("trace_max", TRACE_MAX)
        out += ["", "Percolator index vs stored queries (`Percolator.from_searches`; the queries "
                "are generated before the baseline and not counted). "
                + ("Each point runs in a fresh subprocess: RSS delta and peak (VmHWM) over an "
                   "untraced build, then tracemalloc over a second build "
                   f"(up to {trace_max:,} queries: tracing slows the build 2-4x). RSS is coarse "
                   "for builds of a few MB, which partly reuse memory the query generation freed."
                   if isolated else "In-process (quick mode): tracemalloc only.")
                + " Bytes/query: tracemalloc where run, else RSS.", ""]
        rows = [[r["workload"], f"{r['queries']:,}", f"{r['build_seconds']:.1f}",
                 _mb(r["tracemalloc_current_bytes"]), _mb(r["tracemalloc_peak_bytes"]),
                 _mb(r["rss_delta_bytes"]), _mb(r["rss_peak_delta_bytes"]),
                 f"{r['bytes_per_query']:,.0f} ({r['measure']})"] for r in perc]
        out += _table(["workload", "queries", "build s", "tracemalloc MB (after)",
                       "tracemalloc MB (peak)", "RSS delta MB", "peak RSS delta MB",
                       "bytes/query"], rows)
        out += ["", *[f"![{p}]({p})" for p in plots if p == "growth_percolator.png"]]
    # What grows with what, from this run's figures.
    said = []
    if len(keys) >= 2:
        heap, _ = _fit([r["keys"] for r in keys], [r["heap_bytes"] for r in keys])
        pick, _ = _fit([r["keys"] for r in keys],
                       [r["pickled_bytes"] + r["wake_pickled_bytes"] for r in keys])
        said.append(f"Engine state is linear in keys: {heap:,.0f} B of heap and {pick:,.0f} B "
                    f"pickled per key (slopes over {keys[0]['keys']:,}–{keys[-1]['keys']:,} "
                    "keys), since a fraud key holds only its last event or two, in its buffer and "
                    "in the partial matches whose window is open, however many events it has "
                    "seen.")
    if len(rules) >= 2:
        xs = [r["rules"] for r in rules]
        heap, h0 = _fit(xs, [r["heap_per_key"] for r in rules])
        pick, p0 = _fit(xs, [r["pickled_per_key"] for r in rules])
        said.append(f"Per key it is linear in rules: about {h0:,.0f} + {heap:,.0f} × rules B of "
                    f"heap ({p0:,.0f} + {pick:,.0f} × rules pickled), as the rules of one stream "
                    "and key field share one store entry and buffer but each keeps its own "
                    "partial match.")
    if perc:
        parts = []
        for kind in sorted({r["workload"] for r in perc}):
            f = _perc_fit([r for r in perc if r["workload"] == kind])
            if f:
                parts.append(f"{kind} {f[1]:,.0f} B/query ({f[0]})")
        over = [r["tracemalloc_peak_bytes"] / r["tracemalloc_current_bytes"] - 1 for r in perc
                if r["tracemalloc_current_bytes"]]
        peak = (f"; tracemalloc's peak during a build is at most {100 * max(over):.1f} % above "
                "its final size (the build leaves little garbage)" if over else "")
        if parts:
            said.append("The percolator index is linear in stored queries, slope "
                        + ", ".join(parts) + peak + ".")
    if said:
        out += ["", " ".join(said)]
    return "\n".join(out) + "\n"


# -- command line -------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.growth", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "tmp" / "growth")
    ap.add_argument("--point", nargs=3, metavar=("KIND", "QUERIES", "TRACE"),
                    help=argparse.SUPPRESS)  # one percolator point, JSON on stdout
    args = ap.parse_args(argv)
    if args.point:
        kind, n, trace = args.point
        print(json.dumps(percolator_point(kind, int(n), trace == "1")))
        return
    section = run(quick=args.quick)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "growth.json").write_text(json.dumps(section, indent=1))
    made = plots(args.out, section)
    (args.out / "growth.md").write_text(render_md(section, made))
    print(f"{section['seconds']:.0f} s; wrote {args.out}")


if __name__ == "__main__":
    main()
