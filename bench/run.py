"""`make bench` / `python -m bench.run [--quick] [--only a,b] [--events N] [--keys N]`.

Runs every benchmark it can in one process, on data generated in this run, and writes
bench/results/latest.md (tables, ratios, machine, command), latest.json (raw figures) and PNG
plots. A benchmark that fails is reported as failed, with its error; nothing is filled in.
latest.md opens with the open issues' targets (13, 14: bench.report.targets), each from figures
of this run only, "not run" where one is missing.

Benchmarks (names for --only), in the order they run, with the full run's duration on this
2-core machine (measured: the 2026-11-21 full run's step times; estimated: steps added since,
from the hand runs of the same modules in bench/results; the machine's load stretches them):

- embedded (~5 min, measured; the Python specification engine), scaling (~1 min), state
  (20 s), profile (15 s), growth (1 min), tables (~1-2 min, estimated), windows (~1 min,
  estimated), percolator (1 min), mokaccino (2 min), lucene (1.5 min), corpus (~3-5 min,
  estimated);
- spark (3 min measured before replay_batch/ceiling_batch joined it, ~5 min now, estimated):
  the Spark path from files and Kafka against its no-op ceilings, and `cep replay`'s batch plan
  (`replay_batch`) against its bare Spark batch ceiling (`ceiling_batch`): their figures and
  ratios (to the ceiling, and to Flink when the flink step ran in the same invocation) go to
  OUT/replay_batch.md, e.g. `python -m bench.run --only spark,flink --spark-variants
  replay_batch,ceiling_batch`;
- flink (1 min): Flink CEP on the same files, two slots, its warm run;
- native (4.3 min, measured alone at load 4-7, 2026-11-27: `--only native`; issue 13, on the
  native core): `native.fraud` (this run's fraud data, engine only from Arrow batches, best of
  3: bench.native_flink; the ratio to the flink step's figure; 22 s), `native.rules` (96 vs 3
  rules, alternated pairs: bench.native_rules, 11 s), `native.keys` (1M vs 1k cards, 4
  alternated rounds of fresh processes, medians: bench.native_keys, 160 s with its data sets'
  generation), `native.trading` (the core against the Python engine on the trading rules,
  median of 5 core runs spread over the Python run: bench.native, 52 s), `native.state`
  (bytes per fraud key: bench.native_state's growth point, 5 s);
- live (~3-4 min, estimated from the lead's session-22 run of the same sizes; issue 14):
  `cep run` against a bare streaming stateful no-op over the same Kafka input, 2 alternated
  rounds (bench.live_ceiling);
- latency (~6-7 min, estimated likewise: the lead's 240 s warm-up run took 6 min; issue 14):
  the live job's end-to-end latency at rates derived from the flink step's figure F of this
  run: min(20k, 0.4 F) (the latency target) and 1.0 F, 1.1 F (the throughput target), each
  rounded up to 500/s, after a 240 s warm-up at the first rate (Sizes.latency: a live job in
  production is warm, and Flink's figure is its warm run's; docs/spark-runtime.md, lat22's
  section), 20 s measured per rate, the job as shipped only (`--default-only`;
  `python -m bench.latency` runs the LATENESS 0s variant and the real-time probe).

In all ~40 minutes (the 2026-11-21 run took 18.5 minutes for the steps it had then). `--quick`
runs all but live and latency at small sizes (6 minutes at load 5-8, the native step 18 s of
it); `--quick --only flink,native,live,latency` runs the issue-13/14 steps end to end (3.5
minutes): their sizes are far below the issues' workloads, and latest.md says so.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import embedded, flink_peer, percolation, plots, spark_path
from bench.report import headline, targets
from bench.report_md import render
from bench.workloads import (
    DEFAULT_RULES,
    ROOT,
    Sizes,
    dataset,
    expected_alerts,
    files_for,
    load_rules,
    rules_path,
    stream_of,
)

ALL = ("embedded", "scaling", "state", "growth", "profile", "tables", "windows", "percolator",
       "mokaccino", "lucene", "corpus", "spark", "flink", "native", "live", "latency")
NOT_QUICK = ("live", "latency")  # live Spark jobs with Kafka: `--quick --only live,latency`


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="small sizes, a few Spark variants, no live or latency (3-4 minutes)")
    ap.add_argument("--events", type=int, help="fraud events (default 1,000,000; quick 60,000)")
    ap.add_argument("--keys", type=int, help="fraud cards (default 10,000; quick 1,000)")
    ap.add_argument("--only",
                    help=f"comma-separated subset of: {', '.join(ALL)} (default: all; with "
                         "--quick all but live and latency (tests/test_latency_quick.py runs "
                         "the latter))")
    ap.add_argument("--spark-variants",
                    help="comma-separated subset of: " + ", ".join(spark_path.VARIANTS)
                    + " (default: all but state_only; quick: ceiling_aipws, ours, "
                    "ours_kafka)")
    ap.add_argument("--rules", type=Path, default=DEFAULT_RULES,
                    help="folder with fraud.cep, trading.cep, machines.cep "
                         "(default bench/rules: fraud as in the Flink harness, "
                         "trading and machines as bundled)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results",
                    help="where latest.md, latest.json and the plots go")
    ap.add_argument("--work", type=Path, help="scratch folder (default OUT/tmp)")
    args = ap.parse_args(argv)
    if args.only is None:
        args.only = ",".join(b for b in ALL if not (args.quick and b in NOT_QUICK))
    unknown = set(args.only.split(",")) - set(ALL)
    if unknown:
        ap.error(f"unknown benchmark(s) {', '.join(sorted(unknown))}; known: {', '.join(ALL)}")
    if args.spark_variants and set(args.spark_variants.split(",")) - set(spark_path.VARIANTS):
        ap.error(f"--spark-variants: known: {', '.join(spark_path.VARIANTS)}")
    return args


def _cmd_out(cmd: list[str]) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({exc})"
    text = (p.stdout + p.stderr).strip().splitlines()
    return text[0].strip() if text else "unavailable"


def machine() -> dict[str, Any]:
    import pyspark

    mem = next((ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines()
                if ln.startswith("MemTotal")), "0")
    cpu = next((ln.split(":", 1)[1].strip() for ln in
                Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name")),
               platform.processor())
    pom = (Path(flink_peer.FLINK_DIR) / "pom.xml").read_text()
    flink = pom.split("<flink.version>", 1)[1].split("<", 1)[0] if "<flink.version>" in pom \
        else "?"
    return {
        "nproc": _cmd_out(["nproc"]), "cpu": cpu, "memory": f"{int(mem) / 2**20:.1f} GiB",
        "os": platform.platform(), "python": sys.version.split()[0],
        "java": _cmd_out(["java", "-version"]), "maven": _cmd_out(["mvn", "-v"]).replace(
            "\x1b[1m", "").replace("\x1b[m", ""),
        "pyspark": pyspark.__version__, "flink (bench/flink/pom.xml)": flink,
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


# Peers and services are imported when their step runs: a missing piece fails its step only.
def _growth() -> Any:
    from bench import growth
    return growth


def _tables() -> Any:
    from bench import tables
    return tables


def _windows() -> Any:
    from bench import windows
    return windows


def _mokaccino() -> Any:
    from bench import mokaccino_peer
    return mokaccino_peer


def _lucene() -> Any:
    from bench import lucene_peer
    return lucene_peer


def _corpus() -> Any:
    from bench import corpus_peer
    return corpus_peer


def _latency() -> Any:
    from bench import latency
    return latency


def _live_ceiling() -> Any:
    from bench import live_ceiling
    return live_ceiling


def _live_shards() -> int:
    from cep.config import Settings
    return Settings().live_shards


def native_parts(sizes: Sizes, ds: Any, fraud_rules: Path,
                 work: Path) -> dict[str, Callable[[], Any]]:
    """Issue 13's targets on the native core, each part measured by its own module's functions
    (bench.native_flink, .native_rules, .native_keys, .native, .native_state; their docstrings
    give the methods). `fraud` runs on this run's fraud data set, the one the flink step reads."""
    from bench import native, native_flink, native_keys, native_rules, native_state

    cfg = sizes.native
    expected = set(map(tuple, expected_alerts(ds)))

    def fraud() -> dict[str, Any]:
        m = native_flink.native_runs(load_rules(fraud_rules), ds, cfg["batch"], cfg["fraud_runs"])
        found = {a[1:] for a in m.pop("alerts")}
        return {**m, "match_alerts": len(found), "alerts_as_injected": found == expected}

    def trading() -> dict[str, Any]:
        (_, py_alerts, py_wall, py_cpu, n), (_, alerts, wall, cpu, _) = native.measure(
            "trading", **cfg["trading"], ends_only=True)
        return {"events": n, "keys": cfg["trading"]["keys"], "repeat": cfg["trading"]["repeat"],
                "python_cpu_eps": n / py_cpu, "core_cpu_eps": n / cpu,
                "python_wall_eps": n / py_wall, "core_wall_eps": n / wall,
                "ratio_cpu": py_cpu / cpu, "alerts": len(alerts),
                "identical": alerts == py_alerts}

    def keys() -> dict[str, Any]:
        cache = work / "native-ab"  # bench.native_ab's batches, generated again in every run
        shutil.rmtree(cache, ignore_errors=True)
        return native_keys.measure(**cfg["keys"], cache=cache)

    return {
        "fraud": fraud,
        "rules": lambda: native_rules.measure(**cfg["rules"]),
        "keys": keys,
        "trading": trading,
        "state": lambda: native_state.growth_point(cfg["state_keys"]),
    }


def latency_step(sizes: Sizes, res: dict[str, Any], work: Path) -> dict[str, Any]:
    """bench.latency at rates from this run's Flink figure F (Sizes.latency says which), or at
    the fixed `rates` when the flink step did not run; the plan is kept with the results."""
    from bench.latency import lateness_ms

    cfg = dict(sizes.latency)
    multiples, fixed = cfg.pop("flink_multiples"), cfg.pop("rates")
    flink = (res.get("flink") or {}).get("events_per_s")
    p99_rate, rates = latency_rates(flink, multiples, fixed)
    out = dict(_latency().run(rates=rates, **cfg, work=work))
    out["plan"] = {"flink_eps": flink, "p99_rate": p99_rate, "rates": list(rates),
                   "lateness_s": lateness_ms(None) / 1000}
    return out


def latency_rates(flink: float | None, multiples: tuple[float, ...],
                  fixed: tuple[int, ...]) -> tuple[int | None, tuple[int, ...]]:
    """(the rate of issue 14's latency target, every rate to measure): min(20k, 0.4 F) and each
    multiple of F, rounded up to 500/s (a target met at the rate is met at the exact multiple),
    or (None, `fixed`) without a Flink figure F."""
    if not flink:
        return None, tuple(fixed)
    p99_rate = min(20_000, _up500(0.4 * flink))
    return p99_rate, tuple(sorted({p99_rate, *(_up500(m * flink) for m in multiples)}))


def _up500(x: float) -> int:
    return math.ceil(x / 500) * 500


def _step(res: dict[str, Any], name: str, fn: Callable[[], Any]) -> None:
    """Runs one step; its result goes to res[name], or to res[group][part] for "group.part"."""
    print(f"bench: {name} ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    group, _, part = name.rpartition(".")
    try:
        (res.setdefault(group, {}) if group else res)[part] = fn()
    except Exception as exc:  # a failed benchmark is reported, the others still run
        res.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"[:1500]
        traceback.print_exc()
    res.setdefault("step_seconds", {})[name] = time.perf_counter() - t0
    print(f"bench: {name} done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)


def run(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    sizes = (Sizes.quick() if args.quick else Sizes.full()).override(args.events, args.keys)
    only = args.only.split(",")
    out: Path = args.out
    work: Path = args.work or out / "tmp"
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    res: dict[str, Any] = {"meta": {
        "command": " ".join(["python -m bench.run", *map(shlex.quote, argv)]),
        "started_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine(), "sizes": sizes.__dict__, "rules_dir": str(args.rules)}}
    fraud_rules = rules_path(args.rules, "fraud")
    ds = dataset("fraud", sizes.events, sizes.keys, sizes.inject)
    res["expected_fraud"] = expected_alerts(ds)

    steps: dict[str, Callable[[], Any]] = {
        "embedded": lambda: embedded.run_domains(sizes, args.rules),
        "scaling": lambda: embedded.run_scaling(sizes, args.rules),
        "state": lambda: embedded.run_state(sizes, args.rules),
        "profile": lambda: embedded.run_profile(sizes, args.rules),
        "growth": lambda: _growth().run(quick=args.quick),
        # Issue 15: a rule reading a 1M-row table, and a 30-day sliding window, each as a ratio
        # to the same rule without it (bench/tables.py, bench/windows.py).
        "tables": lambda: _tables().measure(*((20_000, 20_000) if args.quick
                                              else (1_000_000, 200_000))),
        "windows": lambda: _windows().measure(*((20_000, 500, 60, 1) if args.quick
                                                else (200_000, 2_000, 60, 3))),
        "percolator": lambda: percolation.run_percolator(sizes.perc_queries, sizes.perc_events),
        "mokaccino": lambda: _mokaccino().run(sizes.perc_queries, sizes.perc_events,
                                              breakdown=not args.quick),
        "lucene": lambda: _lucene().run(sizes.perc_queries, sizes.perc_events, work),
        # Real corpus vs Lucene Monitor (bench/corpus_peer.py): 10k and 100k searches (quick:
        # 1k on the committed sample). Lucene in its batch mode only (all events in one
        # Monitor.match call), its fastest here: one document per call ran under 16 events/s at
        # 10k searches (bench/results/corpus_peer.md) and took the full run past an hour.
        "corpus": lambda: _corpus().run((1_000,) if args.quick else (10_000, 100_000),
                                        300 if args.quick else 3_000, work / "corpus",
                                        source="sample" if args.quick else "auto",
                                        batches=(0,)),
    }
    for name, fn in steps.items():
        if name in only:
            _step(res, name, fn)
    if "spark" in only or "flink" in only:
        data = files_for(ds, stream_of(load_rules(fraud_rules)), work, sizes.spark_files)
        if "spark" in only:
            variants = (tuple(args.spark_variants.split(",")) if args.spark_variants
                        else spark_path.QUICK_VARIANTS if args.quick
                        else spark_path.DEFAULT_VARIANTS)
            _step(res, "spark", lambda: spark_path.run_spark(fraud_rules, data, work,
                                                             sizes.spark_warmup, variants))
        if "flink" in only:
            _step(res, "flink", lambda: flink_peer.run(data, runs=sizes.flink_runs))
    if "native" in only:
        for part, fn in native_parts(sizes, ds, fraud_rules, work).items():
            _step(res, f"native.{part}", fn)
    if "live" in only:
        _step(res, "live", lambda: _live_ceiling().measure(
            **sizes.live, work=work / "live-ceiling", shards=_live_shards()))
    if "latency" in only:
        _step(res, "latency", lambda: latency_step(sizes, res, work / "latency"))
    res["meta"]["seconds"] = time.perf_counter() - started
    res["meta"]["machine"]["load average at end"] = " ".join(
        f"{x:.2f}" for x in os.getloadavg())
    res["headline"] = headline(res)
    if ((res.get("spark") or {}).get("batch") or {}).get("replay_batch"):
        res["replay_batch"] = batch_ratios(res)
    return res


def batch_ratios(res: dict[str, Any]) -> dict[str, Any]:
    """Issue 14's replay targets, from this run only: the batch replay against Flink CEP (same
    files) and against the bare Spark batch ceiling (same files, same session)."""
    variants = res["spark"]["batch"]
    ours = variants["replay_batch"].get("events_per_s")
    ceiling = (variants.get("ceiling_batch") or {}).get("events_per_s")
    flink = (res.get("flink") or {}).get("events_per_s")
    expected = sorted(map(tuple, res.get("expected_fraud") or []))
    alerts = sorted(map(tuple, variants["replay_batch"].get("alerts") or []))
    return {"replay_batch_eps": ours, "ceiling_batch_eps": ceiling, "flink_eps": flink,
            "over_flink": ours / flink if ours and flink else None,
            "over_ceiling": ours / ceiling if ours and ceiling else None,
            "alerts_as_injected": alerts == expected}


def write_batch(res: dict[str, Any], path: Path) -> None:
    """bench/results/replay_batch.md: the batch replay's figures of this run, as a section put
    above the file's earlier ones (the sessions' runs and their notes stay below it)."""
    r, m = res["replay_batch"], res["meta"]
    v = res["spark"]["batch"]

    def secs(variant: str) -> str:
        return ", ".join(f"{x:.1f}" for x in (v.get(variant) or {}).get("all_runs_seconds", []))

    def n(x: float | None, d: int = 0) -> str:
        return "not measured" if x is None else f"{x:,.{d}f}"

    lines = [
        f"# Replay as a batch job (issue 14): `{m['command']}`, {m['started_utc']} UTC", "",
        f"Command: `{m['command']}` (started {m['started_utc']} UTC, {m['seconds']:.0f} s).",
        f"Machine: {m['machine']['nproc']} cores, {m['machine']['cpu']}; load average "
        f"(1, 5, 15 min) at start {m['machine']['load average at start']}, at end "
        f"{m['machine'].get('load average at end')}.",
        f"Input: {m['sizes']['events']:,} fraud events, {m['sizes']['keys']:,} cards, "
        f"{m['sizes']['spark_files']} JSON-lines files; Spark {res['spark'].get('master')}, "
        f"{res['spark'].get('shards')} shards, {res['spark'].get('shuffle_partitions')} "
        "shuffle partitions.", "",
        "| what | events/s | wall s (runs) |", "|---|---|---|",
        f"| `cep replay` batch plan (`match_bounded`, rows collected) | {n(r['replay_batch_eps'])}"
        f" | {secs('replay_batch')} |",
        f"| ceiling: read → shard → sort → mapInArrow identity → noop | "
        f"{n(r['ceiling_batch_eps'])} | {secs('ceiling_batch')} |",
        f"| Flink CEP, same files (warm run) | {n(r['flink_eps'])} | |", "",
        f"- batch replay / Flink CEP: **{n(r['over_flink'], 3)}** (target ≥ 2)",
        f"- batch replay / ceiling: **{n(r['over_ceiling'], 3)}** (target ≥ 0.7)",
        f"- batch replay's alerts equal the injected ones: {r['alerts_as_injected']}", "",
        "The two Spark plans run alternated in one session (one run each per round, the "
        "order reversed every round); each figure is the median wall time of its runs after "
        "the first round (the runs column lists them all, in order); events/s = input events "
        "/ that wall time.",
    ]
    earlier = path.read_text() if path.exists() else ""
    path.write_text("\n".join(lines) + "\n" + (f"\n{earlier}" if earlier else ""))


def write(res: dict[str, Any], out: Path) -> Path:
    h = res["headline"]
    bars = [(name, h[key]) for name, key in (
        ("Python spec engine (1 core)", "embedded"), ("Spark path, ours", "spark_ours"),
        ("ceiling: TWS no-op", "ceiling_tws"), ("ceiling: AIPWS no-op", "ceiling_aipws"),
        ("JVM only", "jvm_only"), ("Flink CEP (warm)", "flink")) if h.get(key)]
    made = [plots.summary(out, bars), *plots.scaling(out, res.get("scaling") or {}),
            plots.state(out, res.get("state") or {}),
            plots.spark_batches(out, res.get("spark") or {}),
            plots.percolator(out, res.get("percolator") or {})]
    if res.get("growth"):
        made += _growth().plots(out, res["growth"])
    names = [m for m in made if m]
    (out / "latest.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    md = out / "latest.md"
    md.write_text(render(res, names))
    if res.get("replay_batch"):
        write_batch(res, out / "replay_batch.md")
    return md


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    res = run(args, argv)
    md = write(res, args.out)
    print(f"bench: wrote {md} ({res['meta']['seconds']:.0f} s)", file=sys.stderr)
    h = res["headline"]
    for key in ("embedded", "spark_ours", "ceiling", "flink", "ours_over_ceiling",
                "ours_over_flink"):
        if h.get(key) is not None:
            print(f"  {key}: {h[key]:,.3f}", file=sys.stderr)
    for key, value in (res.get("replay_batch") or {}).items():
        print(f"  replay batch {key}: {value}", file=sys.stderr)
    for t in targets(res):
        if t["status"] != "not run":
            print(f"  issue {t['issue']}: {t['what']}: {t['figure']}, target {t['target']}: "
                  f"{t['status']}", file=sys.stderr)
    return 1 if res.get("errors") else 0


if __name__ == "__main__":
    raise SystemExit(main())
