"""The Lucene Monitor peer for the percolator's text workload.

bench/lucene (Maven, shaded jar target/lucene-monitor-bench.jar) is our own harness around
`org.apache.lucene:lucene-monitor`: it parses each stored query with Lucene's classic QueryParser
(field "body", StandardAnalyzer without stop words: lowercasing UAX#29 words, like our analyser
on the workload's lowercase ASCII words), registers them in a Monitor, warms up on the first 10%
of the events, then times matching all events on one thread, and prints one JSON line per run.

For each size, `run` writes `bench.percolation.text(n, n_events)` (the same seed as our
percolator benchmark) to files under `work`, runs OUR percolator on exactly those queries and
events with `bench.percolation.run_one`'s protocol (from_searches, match_batch on the first 10%,
then time match_batch over all events), runs the jar on the files, and compares the
(event, query) match sets pair by pair.

Lucene is given the events the way we are given them: one `Monitor.match(Document[])` call per
batch (default: all events in one batch, as our one `match_batch` call); at the smallest size a
per-document run (`Monitor.match(Document)`, a MemoryIndex per event) on a prefix of the events
is added. The headline configuration is TermFilteredPresearcher with stock QueryParser output;
up to 10k stored queries MultipassTermFilteredPresearcher(2) and "fuzzy compiled once" (each
FuzzyQuery swapped for an AutomatonQuery over the same automaton, see MonitorBench.java) run too.

Manual run: `python -m bench.lucene_peer --sizes 1000,10000,100000 --events 1000`.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from bench.javabuild import build_jar
from bench.percolation import measure, text

LUCENE_DIR = Path(__file__).resolve().parent / "lucene"
JAR = LUCENE_DIR / "target" / "lucene-monitor-bench.jar"
JAVA_OPTS = ("-Xms1g", "-Xmx4g", "-XX:+ExitOnOutOfMemoryError")
UPDATE_BUFFER = 25_000  # queries per Monitor index commit while registering (Lucene: 5,000)


class LuceneUnavailable(RuntimeError):
    pass


def build(timeout: int = 900) -> dict[str, Any]:
    return build_jar(LUCENE_DIR, JAR, LuceneUnavailable, timeout)


def java_version() -> str:
    proc = subprocess.run(["java", "-version"], capture_output=True, text=True)
    m = re.search(r'version "([^"]+)"', proc.stderr)
    return m.group(1) if m else "?"


# --- one engine at a time -------------------------------------------------------------------

def write_workload(queries: list[Any], events: list[dict[str, Any]], qpath: Path,
                   epath: Path) -> None:
    """Queries as `id<TAB>query`, events as one body per line (bodies are plain words)."""
    with qpath.open("w", encoding="utf-8") as f:
        for q in queries:
            if "\t" in q.id or "\n" in q.query or "\t" in q.query:
                raise ValueError(f"query {q.id!r} does not fit the TSV format")
            f.write(f"{q.id}\t{q.query}\n")
    with epath.open("w", encoding="utf-8") as f:
        for ev in events:
            body = ev["body"]
            if "\n" in body or "\r" in body:
                raise ValueError("an event body holds a line break")
            f.write(body + "\n")


def run_ours(queries: list[Any], events: list[dict[str, Any]], schema: Any, runs: int = 1
             ) -> tuple[dict[str, Any], dict[int, list[str]]]:
    """bench.percolation's measurement (the last of `runs` passes), keeping the (event, query)
    pairs."""
    row, notes, _ = measure(queries, events, schema, runs=runs)
    pairs: dict[int, list[str]] = defaultdict(list)
    for n in notes:
        pairs[n.position].append(n.search_id)
    return row, pairs


def run_jar(qpath: Path, epath: Path, *, presearchers: tuple[str, ...] = ("term",),
            batch: int = 0, fuzzy: str = "stock", runs: int = 2,
            matches_out: Path | None = None, timeout: int = 900,
            extra_args: tuple[str, ...] = (), xmx: str | None = None) -> dict[str, Any]:
    """Run the jar; `batch` 0 = all events in one Monitor.match call. Returns the last run per
    presearcher (with the first run's events/s as `cold_events_per_s`). `xmx` replaces the
    JVM's maximum heap (-Xmx4g), e.g. "8g" for 1M searches."""
    n_events = sum(1 for _ in epath.open(encoding="utf-8"))
    opts = [o if xmx is None or not o.startswith("-Xmx") else f"-Xmx{xmx}" for o in JAVA_OPTS]
    cmd = ["java", *opts, "-jar", str(JAR), "--queries", str(qpath),
           "--events", str(epath), "--presearcher", ",".join(presearchers),
           "--batch", str(batch or max(1, n_events)), "--fuzzy", fuzzy, "--runs", str(runs),
           "--update-buffer", str(UPDATE_BUFFER), *extra_args]
    if matches_out is not None:
        cmd += ["--matches-out", str(matches_out)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise LuceneUnavailable(f"lucene monitor run timed out after {timeout} s") from e
    wall = time.perf_counter() - t0
    lines = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or len(lines) != runs * len(presearchers):
        raise LuceneUnavailable(f"lucene monitor run failed (exit {proc.returncode}): "
                                + proc.stderr[-2000:])
    by_ps: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(presearchers):
        mine = lines[i * runs:(i + 1) * runs]
        last = dict(mine[-1])
        last["cold_events_per_s"] = mine[0]["events_per_s"]
        last["all_runs_events_per_s"] = [r["events_per_s"] for r in mine]
        by_ps[name] = last
    return {"by_presearcher": by_ps, "jvm_wall_seconds": wall, "command": " ".join(cmd)}


def read_matches(path: Path) -> dict[int, list[str]]:
    out: dict[int, list[str]] = defaultdict(list)
    with path.open(encoding="utf-8") as f:
        for line in f:
            i, qid = line.rstrip("\n").split("\t", 1)
            out[int(i)].append(qid)
    return out


# --- comparing match sets ---------------------------------------------------------------------

def _kind(query: str) -> str:
    if "~" in query:
        return "fuzzy"
    if query.endswith("*"):
        return "prefix"
    if '"' in query:
        return "phrase"
    if " AND " in query:
        return "conjunction"
    return "other"


def _osa(a: str, b: str) -> int:
    """Optimal-string-alignment distance (Damerau-Levenshtein, adjacent swap = 1 edit)."""
    prev2: list[int] | None = None
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if (prev2 is not None and i > 1 and j > 1 and a[i - 1] == b[j - 2]
                    and a[i - 2] == b[j - 1]):
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[len(b)]


def _why(query: str, body: str) -> str:
    """A short account of one pair the engines disagree on, from the event's tokens."""
    tokens = body.split()
    kind = _kind(query)
    words = re.findall(r"body:\"?([a-z]+)", query)
    if kind == "fuzzy" and words:
        w = words[0]
        near = sorted({t for t in tokens if abs(len(t) - len(w)) <= 1 and _osa(w, t) <= 1})
        return f"tokens within 1 OSA edit of {w!r}: {near}"
    if kind == "prefix" and words:
        pre = sorted({t for t in tokens if t.startswith(words[0])})
        return f"tokens with prefix {words[0]!r}: {pre}"
    if kind == "phrase":
        phrase = re.findall(r'"([^"]+)"', query)[0].split()
        hits = [i for i in range(len(tokens) - len(phrase) + 1)
                if tokens[i:i + len(phrase)] == phrase]
        return f"phrase positions in the whitespace-split body: {hits}"
    return f"terms present: {[w for w in words if w in set(tokens)]}"


def compare(ours: dict[int, list[str]], lucene: dict[int, list[str]], queries: list[Any],
            events: list[dict[str, Any]], examples: int = 8) -> dict[str, Any]:
    """Every event's match set compared; the differing pairs counted by query kind, and the
    first `examples` of them explained from the event's tokens."""
    text_of = {q.id: q.query for q in queries}
    only_ours: Counter[str] = Counter()
    only_lucene: Counter[str] = Counter()
    shown: list[dict[str, Any]] = []
    events_differing = 0
    for i in range(len(events)):
        a, b = set(ours.get(i, ())), set(lucene.get(i, ()))
        if a == b:
            continue
        events_differing += 1
        for side, diff, counter in (("ours only", a - b, only_ours),
                                    ("lucene only", b - a, only_lucene)):
            for qid in sorted(diff):
                counter[_kind(text_of[qid])] += 1
                if len(shown) < examples:
                    shown.append({"event": i, "query_id": qid, "query": text_of[qid],
                                  "side": side, "why": _why(text_of[qid], events[i]["body"])})
    return {"agree": not only_ours and not only_lucene, "events_differing": events_differing,
            "only_ours": sum(only_ours.values()), "only_lucene": sum(only_lucene.values()),
            "only_ours_by_kind": dict(only_ours), "only_lucene_by_kind": dict(only_lucene),
            "examples": shown}


# --- the benchmark ------------------------------------------------------------------------------

HEADLINE = ("term", "stock")
EXTRAS = (("multipass", "stock"), ("term", "compiled"))


def _key(cfg: tuple[str, str]) -> str:
    return f"{cfg[0]}/{cfg[1]}"


def run(sizes: tuple[int, ...], n_events: int, work: Path, *,
        extras: tuple[tuple[str, str], ...] = EXTRAS, extras_max_queries: int = 10_000,
        batch: int = 0, runs: int = 2, per_doc_events: int = 100,
        timeout: int = 900) -> dict[str, Any]:
    """One row per size: ours vs Lucene Monitor on the same text workload files.

    The headline is (TermFilteredPresearcher, stock QueryParser queries). `extras` are other
    (presearcher, fuzzy) configurations, run only up to `extras_max_queries` stored queries;
    above that size the headline alone runs, with one timed run instead of `runs` (parsing and
    registering 100k queries takes ~30 s per configuration). `per_doc_events`: at the smallest
    size, also time Monitor.match(Document), one event per call, on the first that many events
    (0: skip). Every Lucene configuration's (event, query) pairs are compared with ours."""
    info = build()
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    t_all = time.perf_counter()
    for k, n in enumerate(sizes):
        t_size = time.perf_counter()
        queries, events, schema = text(n, n_events)
        qpath, epath = work / f"text_q{n}.tsv", work / f"text_q{n}_events.txt"
        write_workload(queries, events, qpath, epath)
        ours, ours_pairs = run_ours(queries, events, schema)
        small = n <= extras_max_queries
        cfgs = [HEADLINE, *(extras if small else ())]
        n_runs = runs if small else 1
        results: dict[str, dict[str, Any]] = {}
        compares: dict[str, dict[str, Any]] = {}
        commands: dict[str, str] = {}
        jvm_wall = 0.0
        for fuzzy in dict.fromkeys(f for _, f in cfgs):  # one JVM per fuzzy mode
            ps = tuple(p for p, f in cfgs if f == fuzzy)
            mpath = work / f"text_q{n}_lucene_{ps[0]}_{fuzzy}_matches.tsv"
            luc = run_jar(qpath, epath, presearchers=ps, batch=batch, fuzzy=fuzzy,
                          runs=n_runs, matches_out=mpath, timeout=timeout)
            jvm_wall += luc["jvm_wall_seconds"]
            for p in ps:
                results[_key((p, fuzzy))] = luc["by_presearcher"][p]
                commands[_key((p, fuzzy))] = luc["command"]
            # The jar writes the pairs of its first presearcher; the others' counts must agree.
            compares[_key((ps[0], fuzzy))] = compare(ours_pairs, read_matches(mpath), queries,
                                                     events)
        head = results[_key(HEADLINE)]
        cmp = compares[_key(HEADLINE)]
        row: dict[str, Any] = {
            "queries": n, "events": len(events), "runs": n_runs, "ours": ours, "lucene": head,
            "lucene_configs": results, "compare_by_config": compares,
            "command": commands[_key(HEADLINE)], "commands": commands,
            "jvm_wall_seconds": jvm_wall,
            "ours_events_per_s": ours["events_per_s"],
            "lucene_events_per_s": head["events_per_s"],
            "ours_over_lucene": ours["events_per_s"] / head["events_per_s"],
            "notifications_ours": ours["notifications"], "matches_lucene": head["matches"],
            "all_configs_agree": all(r["matches"] == ours["notifications"]
                                     for r in results.values())
            and all(c["agree"] for c in compares.values()),
            "compare": cmp, "agree": cmp["agree"] and ours["notifications"] == head["matches"],
        }
        if k == 0 and per_doc_events > 0:
            pe = work / f"text_q{n}_events_first{per_doc_events}.txt"
            pe.write_text("".join(ev["body"] + "\n" for ev in events[:per_doc_events]),
                          encoding="utf-8")
            one = run_jar(qpath, pe, presearchers=(HEADLINE[0],), batch=1, fuzzy=HEADLINE[1],
                          runs=runs, timeout=timeout)
            row["lucene_per_doc"] = {**one["by_presearcher"][HEADLINE[0]],
                                     "command": one["command"]}
        row["wall_seconds"] = time.perf_counter() - t_size
        rows.append(row)
    return {"rows": rows, "build": info, "java_version": java_version(),
            "lucene_version": rows[0]["lucene"]["lucene_version"] if rows else None,
            "headline": _key(HEADLINE), "extras": [_key(c) for c in extras],
            "extras_max_queries": extras_max_queries, "batch": batch, "runs": runs,
            "n_events": n_events, "wall_seconds": time.perf_counter() - t_all}


# --- Markdown --------------------------------------------------------------------------------

def _n(v: float | None, digits: int = 0) -> str:
    return "—" if v is None else f"{v:,.{digits}f}"


_CFG_NAMES = {"term/stock": "TermFiltered", "multipass/stock": "Multipass(2)",
              "term/compiled": "TermFiltered, fuzzy compiled once"}


def render_md(section: dict[str, Any]) -> str:
    """A Markdown subsection for latest.md: the table, then method, command and versions."""
    rows = section.get("rows") or []
    if not rows:
        return ""
    extras = list(section["extras"])
    header = ["stored queries", "ours events/s", "Lucene events/s", "ours / Lucene"]
    header += [f"Lucene {_CFG_NAMES.get(c, c)} events/s" for c in extras]
    header += ["ours verified / event", "Lucene queries run / batch", "build s ours / Lucene",
               "notifications ours / Lucene", "same pairs"]
    table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        luc, ours, cmp = r["lucene"], r["ours"], r["compare"]
        cells = [f"{r['queries']:,}", _n(ours["events_per_s"]), _n(luc["events_per_s"]),
                 f"{r['ours_over_lucene']:.2f}"]
        for c in extras:
            other = r["lucene_configs"].get(c)
            cells.append(_n(other["events_per_s"]) if other else "—")
        if r["agree"] and r["all_configs_agree"]:
            agree = "yes"
        elif r["agree"]:
            agree = "yes (headline); an extra configuration differs"
        else:
            agree = (f"no: {cmp['only_ours']:,} ours only {cmp['only_ours_by_kind']}, "
                     f"{cmp['only_lucene']:,} Lucene only {cmp['only_lucene_by_kind']}")
        cells += [f"{ours['verified_fraction']:.2%}",
                  f"{luc['queries_run_per_call_fraction']:.1%}",
                  f"{ours['build_seconds']:.1f} / {luc['build_seconds']:.1f}",
                  f"{ours['notifications']:,} / {luc['matches']:,}", agree]
        table.append("| " + " | ".join(cells) + " |")
    first, big = rows[0], rows[-1]
    batch = section["batch"] or section["n_events"]
    head = first["lucene"]
    text_ = [
        "", f"Lucene {section['lucene_version']} Monitor (`lucene-monitor`, Java "
        f"{section['java_version']}) in our own harness bench/lucene/.../MonitorBench.java, "
        f"e.g. `{big['command']}`. Headline: {head['presearcher']} (the default), queries as "
        "the classic QueryParser returns them (field `body`, StandardAnalyzer without stop "
        "words). Both engines get the same files of `bench.percolation.text` (seed 12, "
        f"{section['n_events']:,} events of ~100 tokens), warm up on the first 10% of the "
        "events, then are timed over all events on one thread (the JVM's JIT and GC threads "
        f"are not counted). Lucene gets {batch:,} events per `Monitor.match(Document[])` call "
        "(it indexes the batch in memory and runs each candidate query once against it), as we "
        f"get them in one `match_batch` call; figures are the last of {section['runs']} timed "
        f"runs in one JVM up to {section['extras_max_queries']:,} stored queries, of one run "
        "above, where the extra configurations are not run either. Jar build this run: "
        f"{section['build']['seconds']:.0f} s"
        + (" (cached)" if not section["build"]["built"] else "") + ".",
        "",
        "The presearcher indexes the terms of conjunctions and phrases but not prefix and fuzzy "
        "queries (\"any token\": 30% of this mix, run for every batch); with a whole batch "
        "of events the batch's vocabulary also lets most of the rest through (the queries-run "
        "column). A stock `FuzzyQuery` rebuilds its Levenshtein automaton every time it runs; "
        "\"fuzzy compiled once\" swaps it at parse time for an `AutomatonQuery` over the same "
        "automaton (`FuzzyQuery.getFuzzyAutomaton`), our tuning, same matches. Match sets are "
        "compared pair by pair (event, query) for every configuration: our fuzzy is OSA "
        "Damerau-Levenshtein and FuzzyQuery's default is transpositions=true, so `~1` means "
        "the same on both.",
    ]
    pd = first.get("lucene_per_doc")
    if pd:
        text_ += ["", "One event per `Monitor.match(Document)` call (a MemoryIndex per event), "
                  f"{first['queries']:,} stored queries, first {pd['events']:,} events, last "
                  f"of {section['runs']} runs: {_n(pd['events_per_s'])} events/s, "
                  f"{pd['queries_run_per_call']:,.0f} queries run per event "
                  f"({pd['queries_run_per_call_fraction']:.1%}), vs ours "
                  f"{_n(first['ours']['events_per_s'])} events/s."]
    title = "### Percolator vs Lucene Monitor (text workload)"
    return "\n".join([title, "", *table, *text_]) + "\n"


def main() -> None:  # pragma: no cover - manual runs
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--events", type=int, default=1000)
    ap.add_argument("--work", default="/tmp/lucene_peer")
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--json", default=None, help="also write the section here")
    a = ap.parse_args()
    sec = run(tuple(int(s) for s in a.sizes.split(",")), a.events, Path(a.work),
              batch=a.batch, runs=a.runs)
    if a.json:
        Path(a.json).write_text(json.dumps(sec, indent=1, default=str))
    print(render_md(sec))


if __name__ == "__main__":  # pragma: no cover
    main()
