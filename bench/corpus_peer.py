"""The real-corpus percolator workload (issue 17): ours vs Lucene Monitor, same events, same
saved searches, (event, search) pairs compared one by one.

Events are Debian package descriptions (bench/apt_corpus.py: title, body, section, priority,
installed_size); searches come from the corpus vocabulary at realistic frequencies (terms,
phrases, AND/OR/NOT, prefixes, fuzzy, numeric ranges). Protocol as bench/lucene_peer.py: both
engines build their index (timed), warm up on the first 10% of the events, then match all events
in one batch (ours: `match_batch`; Lucene: one `Monitor.match(Document[])` call), one thread,
`--runs` passes each, the last counting for both.
Lucene runs with each presearcher given (TermFiltered and Multipass(2) by default) and the
ratio is taken against the faster one.

    python -m bench.corpus_peer --sizes 10000,100000 --events 5000 [--source apt|sample]
"""

from __future__ import annotations

import json
import os
import time
import tracemalloc
from pathlib import Path
from typing import Any

from bench import apt_corpus
from bench.lucene_peer import build, compare, java_version, read_matches, run_jar, run_ours
from bench.percolator_scale import cached_queries

FIELDS_ARG = ("--fields", "title,body,section:keyword,priority:keyword,installed_size:long")
PRESEARCHERS = ("term", "multipass")


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover
        return "?"


def index_bytes(queries: list[Any], schema: Any) -> dict[str, float]:
    """Python heap allocated while building the index (tracemalloc), per search."""
    from percolator import Percolator

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    perc = Percolator.from_searches(queries, schema=schema)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del perc
    return {"bytes": after - before, "bytes_per_search": (after - before) / len(queries)}


def run(sizes: tuple[int, ...], n_events: int, work: Path, *, source: str = "auto",
        presearchers: tuple[str, ...] = PRESEARCHERS, runs: int = 1, memory: bool = False,
        batches: tuple[int, ...] = (0, 1), timeout: int = 1800, cache: str | None = None,
        xmx: str | None = None) -> dict[str, Any]:
    """`batches`: Lucene events per Monitor.match call, 0 = all in one call (a batch index,
    every query whose terms occur anywhere in the batch runs), 1 = one document per call (a
    MemoryIndex per event); every (presearcher, batch) runs, the fastest is the yardstick and
    every one's pairs are compared with ours. `cache`: a folder keeping the generated searches
    (bench.percolator_scale.cached_queries); `xmx`: the JVM's maximum heap."""
    info = build()
    work.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    events_all, where = apt_corpus.load(source)
    rows = []
    for n in sizes:
        t_size = time.perf_counter()
        load_before = _load()
        queries, _ = cached_queries(events_all, n, cache)
        events = apt_corpus.shuffled(events_all, n_events)
        qpath, epath = work / f"corpus_q{n}.tsv", work / f"corpus_q{n}_events.tsv"
        with qpath.open("w", encoding="utf-8") as f:
            for q in queries:
                f.write(f"{q.id}\t{q.query}\n")
        apt_corpus.write_tsv(events, epath)
        # As many timed passes as Lucene's runs, the last counting for both (runs before
        # 2026-11-25 20:00 UTC timed ours' first full pass only, which is the slowest).
        ours, ours_pairs = run_ours(queries, events, apt_corpus.SCHEMA, runs=runs)
        by_ps: dict[str, dict[str, Any]] = {}
        cmps: dict[str, dict[str, Any]] = {}
        commands: dict[str, str] = {}
        for batch in batches:
            tag = "all" if batch == 0 else str(batch)
            mpath = work / f"corpus_q{n}_lucene_b{tag}_matches.tsv"
            luc = run_jar(qpath, epath, presearchers=presearchers, runs=runs, batch=batch,
                          matches_out=mpath, timeout=timeout, extra_args=FIELDS_ARG, xmx=xmx)
            for p, r in luc["by_presearcher"].items():
                by_ps[f"{p}/batch={tag}"] = r
                commands[f"{p}/batch={tag}"] = luc["command"]
            # The jar writes the first presearcher's pairs; the others' counts are compared.
            cmps[f"batch={tag}"] = compare(ours_pairs, read_matches(mpath), queries, events)
        best_name = max(by_ps, key=lambda p: by_ps[p]["events_per_s"])
        best = by_ps[best_name]
        cmp = {"agree": all(c["agree"] for c in cmps.values()),
               "only_ours": sum(c["only_ours"] for c in cmps.values()),
               "only_lucene": sum(c["only_lucene"] for c in cmps.values()),
               "only_ours_by_kind": {k: c["only_ours_by_kind"] for k, c in cmps.items()},
               "only_lucene_by_kind": {k: c["only_lucene_by_kind"] for k, c in cmps.items()},
               "by_batch": cmps}
        row: dict[str, Any] = {
            "queries": n, "events": len(events), "ours": ours, "lucene": by_ps,
            "lucene_best": best_name, "lucene_best_events_per_s": best["events_per_s"],
            "ours_over_lucene": ours["events_per_s"] / best["events_per_s"],
            "notifications_ours": ours["notifications"],
            "matches_lucene": {p: r["matches"] for p, r in by_ps.items()},
            "compare": cmp,
            "agree": cmp["agree"] and all(r["matches"] == ours["notifications"]
                                          for r in by_ps.values()),
            "matches_per_event": ours["notifications"] / len(events),
            "build_rate_ours": n / ours["build_seconds"],
            "command": commands[best_name], "commands": commands,
            "lucene_events_per_s": {k: r["events_per_s"] for k, r in by_ps.items()},
            "load_before": load_before, "load_after": _load(),
        }
        if memory:
            row["memory"] = index_bytes(queries, apt_corpus.SCHEMA)
        row["wall_seconds"] = time.perf_counter() - t_size
        rows.append(row)
    return {"rows": rows, "corpus": where, "corpus_events": len(events_all), "build": info,
            "java_version": java_version(), "n_events": n_events,
            "wall_seconds": time.perf_counter() - t_all}


def render_md(section: dict[str, Any]) -> str:
    rows = section.get("rows") or []
    if not rows:
        return ""
    out = ["### Percolator vs Lucene Monitor (real corpus: Debian package descriptions)", "",
           "| stored searches | ours events/s | Lucene best events/s (presearcher/batch) | "
           "ours / Lucene | matches / event | ours verified / event | build searches/s ours "
           "| same pairs |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        o = r["ours"]
        agree = "yes" if r["agree"] else (
            f"no: {r['compare']['only_ours']} ours only {r['compare']['only_ours_by_kind']}, "
            f"{r['compare']['only_lucene']} Lucene only {r['compare']['only_lucene_by_kind']}")
        out.append(f"| {r['queries']:,} | {o['events_per_s']:,.0f} | "
                   f"{r['lucene_best_events_per_s']:,.0f} ({r['lucene_best']}) | "
                   f"{r['ours_over_lucene']:.2f} | {r['matches_per_event']:.1f} | "
                   f"{o['verified_fraction']:.3%} | {r['build_rate_ours']:,.0f} | {agree} |")
    out += ["", "Lucene events/s per configuration: " + "; ".join(
        f"{r['queries']:,}: " + ", ".join(f"{k} {v:,.0f}"
                                           for k, v in r["lucene_events_per_s"].items())
        for r in rows) + "."]
    out += ["", f"Corpus: {section['corpus']} ({section['corpus_events']:,} packages), "
            f"{section['n_events']:,} events per run; Java {section['java_version']}; "
            f"e.g. `{rows[-1]['command']}`; load average before/after each size: "
            + "; ".join(f"{r['queries']:,}: {r['load_before']} / {r['load_after']}"
                        for r in rows) + "."]
    return "\n".join(out) + "\n"


def main() -> None:  # pragma: no cover - manual runs
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--events", type=int, default=5000)
    ap.add_argument("--source", default="auto")
    ap.add_argument("--presearchers", default=",".join(PRESEARCHERS))
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--memory", action="store_true")
    ap.add_argument("--batches", default="0,1", help="Lucene events per match call (0: all)")
    ap.add_argument("--work", default="/tmp/corpus_peer")
    ap.add_argument("--json", default=None)
    ap.add_argument("--cache", default=None, help="folder keeping the generated searches")
    ap.add_argument("--xmx", default=None, help="JVM maximum heap, e.g. 8g (default 4g)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per Lucene run")
    a = ap.parse_args()
    sec = run(tuple(int(s) for s in a.sizes.split(",")), a.events, Path(a.work),
              source=a.source, presearchers=tuple(a.presearchers.split(",")), runs=a.runs,
              memory=a.memory, batches=tuple(int(b) for b in a.batches.split(",")),
              timeout=a.timeout, cache=a.cache, xmx=a.xmx)
    if a.json:
        Path(a.json).write_text(json.dumps(sec, indent=1, default=str))
    print(render_md(sec))


if __name__ == "__main__":  # pragma: no cover
    main()
