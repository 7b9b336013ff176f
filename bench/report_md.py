"""Assemble latest.md: summary, details per benchmark, profile, what was not measured."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.report import (
    _n,
    _table,
    alert_rows,
    headline,
    other_target_rows,
    summary_rows,
    target_table,
)


def render(res: dict[str, Any], plots: list[str]) -> str:
    meta = res["meta"]
    h = headline(res)
    out = ["# Benchmarks: CEP engine and percolator vs ceiling and peers", "",
           f"Command: `{meta['command']}`  ", f"Started {meta['started_utc']} UTC, "
           f"took {meta['seconds']:.0f} s. Every figure below was measured in this run; "
           "ratios compare figures of this run only (the machine is shared and noisy: see the "
           "load averages).", "", "## Machine", ""]
    m = meta["machine"]
    out += _table(["item", "value"], [[k, str(v)] for k, v in m.items()])
    out += ["", "## Summary", "", "### Targets of the open issues", "",
            "Issues 13 (the native core) and 14 (Spark at its ceiling), each from figures of "
            "this run only; \"not run\": a figure it needs was not measured in this run (left "
            "out by `--only`, or its step failed: see the end)." + (
                " **`--quick`: the sizes are far below the issues' workloads**, so these "
                "verdicts are of a smoke run, not of the targets." if meta["sizes"].get(
                    "events", 0) < 1_000_000 else ""), ""]
    out += target_table(res)
    out += ["", "### Other figures (fraud rules)", "",
            "The Python specification engine is the executable specification of the native "
            "core (docs/native-core.md), not its target; the streaming files path is measured "
            "against its no-op ceilings and Flink for reference (issue 14's targets are the "
            "batch replay's and the live job's, above).", ""]
    out += summary_rows(res, h)
    if "summary.png" in plots:
        out += ["", "![summary](summary.png)"]
    out += ["", "### Percolator (a closed issue's targets: issue 17's)", ""]
    out += other_target_rows(h)
    out += ["", "Issue 17 set these at 100k and 1M searches; `make bench` runs up to 100k (1M: "
            "`python -m bench.percolator_scale`, docs/percolator.md)."]
    out += ["", "Alerts found on the same fraud data (checked against the generator's injected "
            "patterns, as (rule, card, first ts, last ts)):", ""]
    out += alert_rows(res)
    out += _embedded(res, plots) + _spark(res, plots) + _flink(res) + _state(res, plots)
    out += _section(res, "tables", _tables_md) + _section(res, "windows", _windows_md)
    out += _percolator(res, plots) + _section(res, "mokaccino", _mokaccino_md)
    out += _section(res, "lucene", _lucene_md) + _section(res, "corpus", _corpus_md)
    out += _section(res, "native", _native_md) + _section(res, "live", _live_md)
    out += _section(res, "latency", _latency_md)
    out += _growth_md(res, plots) + _profile(res) + _missing(res)
    return "\n".join(out) + "\n"


def _embedded(res: dict[str, Any], plots: list[str]) -> list[str]:
    emb = res.get("embedded") or {}
    out = ["", "## Python specification engine, embedded (one core)", ""]
    if emb:
        rows = [[d, f"{r['events']:,}", f"{r['keys']:,}", str(r["rules"]),
                 _n(r["events_per_s"]), _n(r["events_per_s_incl_convert"]),
                 f"{r['cpu_seconds'] / r['seconds']:.2f}",
                 f"{r['alerts_found']}/{r['alerts_expected']}"
                 + ("" if r["alerts_ok"] else f" (≠: {r['alerts_missing']} missing, "
                    f"{r['alerts_unexpected']} extra)")]
                for d, r in emb.items() if isinstance(r, dict) and "events" in r]
        out += _table(["domain", "events", "keys", "rules", "events/s (engine)",
                       "events/s incl. dict→Event", "cpu/wall", "alerts found/injected"], rows)
        out += ["", f"Batch: {next(iter(emb.values()))['batch_size']:,} events per "
                "`Engine.ingest` call. A mismatch on trading/machines means the generator and "
                "the rule file given by `--rules` disagree (they are edited separately), not a "
                "timing problem."]
    sc = res.get("scaling") or {}
    for key, label, col in (("by_keys", "keys", "keys"), ("by_rules", "rules", "n_rules"),
                            ("by_batch", "events per call", "batch_size")):
        rows = [[f"{r[col]:,}", f"{r['events']:,}", _n(r["events_per_s"])]
                for r in sc.get(key) or []]
        if rows:
            out += ["", f"Throughput vs {label}:", ""]
            out += _table([label, "events", "events/s"], rows)
    out += ["", *[f"![{p}]({p})" for p in plots if p.startswith("embedded_")]]
    return out


def _spark(res: dict[str, Any], plots: list[str]) -> list[str]:
    sp = res.get("spark") or {}
    if not sp:
        return []
    out = ["", "## Spark path, local[2], from files and from Kafka", "",
           f"Spark {sp.get('spark_version')}, {sp.get('shards')} shards, "
           f"shuffle partitions {sp.get('shuffle_partitions')}, maxFilesPerTrigger=1, "
           f"RocksDB state store; session start {sp.get('session_start_s', 0):.1f} s. Steady "
           "state = batches after the first warm-up ones (sum of rows / sum of "
           "triggerExecution).", ""]
    rows = []
    for name, v in (sp.get("variants") or {}).items():
        if "error" in v:
            rows.append([name, "failed: " + v["error"][:200], "", "", "", "", ""])
            continue
        rows.append([name, _n(v["events_per_s"]), _n(v["all_events_per_s"]),
                     f"{v['steady_batches']}/{v['batches']}",
                     ", ".join(str(x) for x in v["batch_ms"]),
                     _n(v["worker_pss_max_bytes"] / 2**20) if v["workers_max"] else "—",
                     str(v["workers_max"])])
    out += _table(["variant", "steady events/s", "all batches events/s", "steady/all batches",
                   "batch ms", "Python workers PSS max (MiB)", "workers"], rows)
    ours = (sp.get("variants") or {}).get("ours") or {}
    st = ours.get("operator_stats") or {}
    if st.get("rows"):
        out += ["", f"Our operator over the whole run: {st['calls']:,} shard calls, "
                f"{st['rows']:,} rows, {st['keys_touched']:,} key states advanced (one per "
                "key for all rules of a stream and key field), "
                f"{st.get('state_reads', 0):,} bucket reads and {st['state_writes']:,} bucket "
                f"writes ({(st.get('state_reads', 0) + st['state_writes']) / st['calls']:.1f} "
                f"state-server round trips per call), {st['keys_released']:,} released."]
    kl = sp.get("kafka_load")
    if kl:
        out += ["", f"`ours_kafka` read the same {kl['events']:,} events from a topic with "
                f"{kl['partitions']} partitions on our own broker (loaded in "
                f"{kl['seconds']:.0f} s before the query started), `maxOffsetsPerTrigger` "
                f"{kl['max_offsets_per_trigger']:,}."]
    out += ["", *[f"![{p}]({p})" for p in plots if p == "spark_batches.png"]]
    return out


def _flink(res: dict[str, Any]) -> list[str]:
    fl = res.get("flink") or {}
    if not fl:
        return []
    return ["", "## Flink CEP peer", "",
            f"`{fl['command']}` — Flink {fl['flink_version']}, Java {fl['java_version']}, "
            f"parallelism {fl['parallelism']}; {fl['runs']} jobs in one JVM, figures from the "
            f"last. events/s per run: {', '.join(_n(x) for x in fl['all_runs_events_per_s'])}. "
            f"Measured from the first event read to the job's end; job net runtime "
            f"{fl['job_net_runtime_s']:.1f} s; late events {fl['late']}. Jar build this run: "
            f"{fl['build']['seconds']:.0f} s" + (" (cached)" if not fl["build"]["built"] else "")
            + ".", "",
            "The patterns (bench/flink/.../FraudPatterns.java) mirror bench/rules/"
            "fraud.cep: strict contiguity (`next`, `consecutive`), greedy `{3,}`, "
            "`skipPastLastEvent` (= AFTER MATCH SKIP PAST LAST ROW), WITHIN as `within`, keyed "
            "by card, event time with a 5 s bounded-out-of-orderness watermark (the stream's "
            "LATENESS). One shuffle by card; the three CEP operators are chained behind it "
            "(`reinterpretAsKeyedStream`), as our engine runs all rules of a shard in one call. "
            "Known semantic difference: at the end of a bounded input Flink moves the watermark "
            "to +inf and fires every pending timeout, we stop at the last event time "
            "(docs/spark-runtime.md); none of these three rules has a timeout output or an "
            "absence, so the alert sets must be, and are checked to be, identical. If `--rules` "
            "points elsewhere the Flink patterns do not follow it."]


def _state(res: dict[str, Any], plots: list[str]) -> list[str]:
    st = res.get("state") or {}
    if not st:
        return []
    rows = [[f"{p['events']:,}", f"{p['keys_with_state']:,}", f"{p['state_entries']:,}",
             _n(p["state_bytes"] / 2**20, 2), _n(p["bytes_per_key"]), _n(p["bytes_per_entry"]),
             _n(p["max_entry_bytes"]), _n(p["wake_index_bytes"] / 1024, 1)]
            for p in st["points"]]
    out = ["", "## State size (fraud, embedded engine, before end of input)", "",
           "Pickled bytes of the key states (one per key for all rules of a stream and key "
           "field; the Spark store writes them in buckets of ≤ 32) plus the shards' wake "
           "index.", ""]
    out += _table(["events", "keys with state", "key-state entries", "total MiB",
                   "bytes/key", "bytes/entry", "max entry", "wake index KiB"], rows)
    out += ["", *[f"![{p}]({p})" for p in plots if p == "state_vs_events.png"]]
    return out


def _percolator(res: dict[str, Any], plots: list[str]) -> list[str]:
    pc = res.get("percolator") or {}
    if not pc:
        return []
    rows = [[r["workload"], f"{r['queries']:,}", f"{r['events']:,}", _n(r["events_per_s"]),
             f"{100 * r['verified_fraction']:.3f} %",
             f"{r['build_seconds']:.1f}", f"{r['notifications']:,}",
             {True: "ok", False: "DIFFERS"}.get(r.get("scan_check_ok"), "")]
            for r in pc["rows"]]
    out = ["", "## Percolator (one core)", ""]
    out += _table(["workload", "stored queries", "events", "events/s", "verified/event",
                   "index build s", "notifications", "vs scan"], rows)
    out += ["", "Peers in this run: mokaccino on the structured workload and Lucene Monitor on "
            "the text workload, in the next sections.", "",
            *[f"![{p}]({p})" for p in plots if p == "percolator.png"]]
    return out


def _section(res: dict[str, Any], name: str, md: Callable[[dict[str, Any]], str]) -> list[str]:
    section = res.get(name)
    return ["", md(section).rstrip()] if section else []


def _tables_md(section: dict[str, Any]) -> str:
    from bench import tables
    return "## Reference table (issue 15)\n\n" + tables.render_md(section).split("\n", 2)[2]


def _windows_md(section: dict[str, Any]) -> str:
    from bench import windows
    return windows.render_md(section)


def _mokaccino_md(section: dict[str, Any]) -> str:
    from bench import mokaccino_peer
    return str(mokaccino_peer.render_md(section))


def _corpus_md(section: dict[str, Any]) -> str:
    from bench import corpus_peer
    return str(corpus_peer.render_md(section))


def _lucene_md(section: dict[str, Any]) -> str:
    from bench import lucene_peer
    return str(lucene_peer.render_md(section))


def _native_md(nat: dict[str, Any]) -> str:
    """The native step's runs behind the targets table's issue-13 rows."""
    out = ["## Native core (issue 13): the runs", ""]
    fr = nat.get("fraud")
    if fr:
        out.append(f"- fraud, {fr['events']:,} events in Arrow batches of {fr['batch']:,}, one "
                   "core, engine only (bench.native_flink): " + ", ".join(
                       f"{fr['events'] / w:,.0f} ev/s wall ({fr['events'] / c:,.0f} CPU)"
                       for w, c in fr["runs"]) + f"; {fr['match_alerts']} alerts, as injected: "
                   f"{fr['alerts_as_injected']}")
    ru = nat.get("rules")
    if ru:
        out.append(f"- {ru['rules']} vs 3 rules, {ru['events']:,} events (bench.native_rules): "
                   "pair ratios " + ", ".join(f"{x['ratio']:.3f}" for x in ru["pairs"]))
    ke = nat.get("keys")
    if ke:
        out.append(f"- {ke['many'][1]:,} cards ({ke['many'][0]:,} events) vs {ke['few'][1]:,} "
                   f"({ke['few'][0]:,}) (bench.native_keys), ev/s CPU per run: "
                   + ", ".join(f"{c:,.0f}" for c, _ in ke["many_runs"]) + " vs "
                   + ", ".join(f"{c:,.0f}" for c, _ in ke["few_runs"]))
    tr = nat.get("trading")
    if tr:
        out.append(f"- trading, {tr['events']:,} events, {tr['keys']:,} symbols (bench.native, "
                   f"the core's median of {tr['repeat']} runs spread over the Python run): "
                   f"Python engine "
                   f"{tr['python_cpu_eps']:,.0f} ev/s CPU, the core {tr['core_cpu_eps']:,.0f}; "
                   f"{tr['alerts']} alerts, identical: {tr['identical']}")
    st = nat.get("state")
    if st:
        out.append(f"- state (bench.native_state, {st['keys']:,} cards, "
                   f"{st['events_ingested']:,} events in): {st['native_bytes']:,} B over "
                   f"{st['native_keys']:,} keys")
    return "\n".join(out)


def _live_md(live: dict[str, Any]) -> str:
    """bench.live_ceiling's jobs, behind the targets table's live / no-op row."""
    rows = [[str(i), r["variant"], f"{r['rows_per_s'] or 0:,}", f"{r['steady_batches']}",
             f"{r['wall_s']}", str(r["exit"])]
            for i, r in enumerate(live.get("runs", []))]
    out = ["## The live job against a bare streaming stateful no-op (issue 14)", "",
           f"{live['events']:,} events loaded into one Kafka partition first, then each job "
           f"reads them in batches of {live['batch']:,} (bench.live_ceiling: steady rows/s = "
           "input rows / triggerExecution over the batches between the start-up ones and the "
           "last).", ""]
    out += _table(["job", "variant", "steady rows/s", "steady batches", "wall s", "exit"], rows)
    return "\n".join(out)


def _latency_md(section: dict[str, Any]) -> str:
    from bench import latency
    text = str(latency.render_md(section))
    plan = section.get("plan")
    if not plan:
        return text
    rates = ", ".join(f"{r:,}" for r in plan["rates"])
    how = (f"from this run's Flink figure F = {plan['flink_eps']:,.0f} ev/s: min(20,000, 0.4 F) "
           "for the latency target and multiples of F for the throughput target, rounded up to "
           "500/s (bench.run's `latency_step`)" if plan.get("flink_eps") else
           "fixed (`Sizes.latency`): no Flink figure was measured in this run")
    head, _, rest = text.partition("\n\n")
    return f"{head}\n\nRates {rates} ev/s, {how}.\n\n{rest}"


def _growth_md(res: dict[str, Any], plots: list[str]) -> list[str]:
    section = res.get("growth")
    if not section:
        return []
    from bench import growth
    return ["", str(growth.render_md(section, plots)).rstrip()]


def _profile(res: dict[str, Any]) -> list[str]:
    pr = res.get("profile") or {}
    if not pr:
        return []
    total = pr["total_seconds"] or 1.0
    out = ["", "## Profile", "",
           f"cProfile of `events_from_dicts` + `run_embedded` on the first {pr['events']:,} "
           f"fraud events (batch 10,000): {total:.2f} s under the profiler. By file (own time):",
           ""]
    out += _table(["file", "own s", "share"], [[r["file"], f"{r['tottime']:.2f}",
                                                f"{100 * r['tottime'] / total:.0f} %"]
                                               for r in pr["by_file"]])
    out += ["", "Top functions by own time:", ""]
    out += _table(["function", "calls", "own s", "cum s", "share"],
                  [[f"`{r['function']}`", f"{r['calls']:,}", f"{r['tottime']:.3f}",
                    f"{r['cumtime']:.3f}", f"{100 * r['tottime'] / total:.0f} %"]
                   for r in pr["top"]])
    if pr.get("pyinstrument"):
        out += ["", "Sampling profile (pyinstrument, same events; wall time, so a loaded machine "
                "stretches it evenly):", "", "```", *pr["pyinstrument"].strip().splitlines()[:70],
                "```"]
    else:
        out += ["", "(pyinstrument is not installed: no sampling profile. "
                "`.venv/bin/pip install pyinstrument` adds one.)"]
    return out


def _missing(res: dict[str, Any]) -> list[str]:
    out = ["", "## Not measured in this run", ""]
    skipped = [name for name in ("embedded", "scaling", "state", "growth", "profile",
                                 "tables", "windows", "percolator", "mokaccino", "lucene",
                                 "corpus", "spark", "flink", "native", "live", "latency")
               if name not in res]
    if skipped:
        out.append(f"- Not run (left out by `--only` or failed): {', '.join(skipped)}.")
    for name, msg in (res.get("errors") or {}).items():
        out.append(f"- **{name} failed in this run**: {msg}")
    if len(out) == 3:
        out.append("- Nothing: every benchmark ran.")
    return out
