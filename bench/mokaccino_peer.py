"""The mokaccino peer: our percolator vs mokaccino (PyPI, Rust core) on the structured workload.

mokaccino's query model: exact `field=value` (`Query.from_kv`), value prefix (`from_kprefix`),
i64 comparisons (`from_klt/kle/keq/kge/kgt`), AND/OR/NOT, geo (H3, lat/lng radius). Documents
are flat multi-valued string fields; it does no analysis ("not full-text search": no
tokenising), so it has no phrase and no fuzzy query (its parser reads `title:"a b"` as the
exact value `a b` and `city:x~1` as the literal value `x~1`: accepted, but not the same query).

Each stored query of `percolation.structured` is parsed with our own Lucene parser and its AST is
translated node by node (`translate`); a node mokaccino cannot express raises `Unsupported` and
the query leaves the compared subset — nothing is approximated. Both engines then run on exactly
that subset, with the same protocol as `percolation.run_one`: build the index (timed), warm up
on the first 10 % of the events, time all events (fastest of REPEATS passes, for both: the
machine may be shared). The event → document conversion mirrors our
analysis (keyword: the value; text: each token of `analysis.tokenise`; integral numbers as
decimal strings) and is inside mokaccino's timed loop, as our analysis is inside match_batch.
Both run pinned to one core; after both are built and warmed up, their timed passes alternate
(ours, mokaccino, ours, ...: a change of the machine's load falls on both; runs before
2026-11-25 timed all of ours' passes, then all of mokaccino's), each timed by wall clock and by
the process's CPU time. Notifications are compared as sets of (event index, query id).
Ours runs with highlighting off (mokaccino reports query ids only; runs before 2026-11-23 02:40
UTC had it on, e.g. bench/results/percolator_mokaccino_1m.json's 0.66x).
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from importlib import metadata
from typing import Any

from bench.percolation import structured
from bench.report import _n, _table
from percolator import FieldType, Percolator, SavedSearch, Schema
from percolator import ast as qast
from percolator.analysis import normalise, parse_number, tokenise
from percolator.syntax import parse

WARMUP_SHARE = 0.10  # as percolation.run_one
REPEATS = 5  # timed passes over all events after the warm-up; the fastest counts (both engines)


class Unsupported(Exception):
    """A query construct mokaccino has no equivalent for."""


def available() -> str | None:
    """mokaccino's installed version, or None if it cannot be imported."""
    try:
        import mokaccino  # noqa: F401
    except ImportError:
        return None
    return metadata.version("mokaccino")


# -- translation ---------------------------------------------------------------------------------
def _int_bound(text: str, field: str) -> int:
    n = parse_number(text)
    if n is None or not n.is_integer():
        raise Unsupported(f"non-integer bound {text!r} on {field!r} (mokaccino compares i64)")
    return int(n)


def translate(node: qast.Query, schema: Schema) -> Any:
    """Our query AST → a `mokaccino.Query` with the same meaning, or raise Unsupported."""
    from mokaccino import Query

    if isinstance(node, qast.And):
        return Query.from_and([translate(c, schema) for c in node.children])
    if isinstance(node, qast.Or):
        return Query.from_or([translate(c, schema) for c in node.children])
    if isinstance(node, qast.Not):
        return ~translate(node.child, schema)
    field = getattr(node, "field", None)
    if field is None:
        raise Unsupported(f"{type(node).__name__} without a field (default fields)")
    kind = schema.type_of(field)
    if isinstance(node, qast.Term):
        if kind is FieldType.KEYWORD:
            return Query.from_kv(field, node.value)
        if kind is FieldType.TEXT:
            toks = tokenise(node.value)
            if len(toks) != 1:  # several tokens are a phrase to us
                raise Unsupported(f"text term {node.value!r} is {len(toks)} tokens")
            return Query.from_kv(field, toks[0])
        if kind is FieldType.NUMBER:
            return Query.from_keq(field, _int_bound(node.value, field))
        raise Unsupported(f"term on {kind} field {field!r}")
    if isinstance(node, qast.Prefix):
        if kind not in (FieldType.KEYWORD, FieldType.TEXT):
            raise Unsupported(f"prefix on {kind} field {field!r}")
        p = node.prefix if kind is FieldType.KEYWORD else normalise(node.prefix)
        if not p:
            raise Unsupported("empty prefix (an exists query)")
        return Query.from_kprefix(field, p)
    if isinstance(node, qast.Range):
        if kind is not FieldType.NUMBER:
            raise Unsupported(f"range on {kind} field {field!r} (mokaccino: integers only)")
        parts = []
        if node.low is not None:
            lo = _int_bound(node.low, field)
            parts.append(Query.from_kge(field, lo) if node.include_low
                         else Query.from_kgt(field, lo))
        if node.high is not None:
            hi = _int_bound(node.high, field)
            parts.append(Query.from_kle(field, hi) if node.include_high
                         else Query.from_klt(field, hi))
        if not parts:
            raise Unsupported("open range (an exists query)")
        return parts[0] if len(parts) == 1 else Query.from_and(parts)
    # Phrase, Fuzzy, Wildcard, Regexp, Exists, Similar, MatchAll.
    raise Unsupported(f"{type(node).__name__} query")


def split_supported(searches: Sequence[SavedSearch], schema: Schema
                    ) -> tuple[list[tuple[SavedSearch, Any]], dict[str, int]]:
    """(search, mokaccino query) for the searches mokaccino can express; and the others counted
    by the reason they were left out."""
    kept: list[tuple[SavedSearch, Any]] = []
    left_out: dict[str, int] = {}
    for s in searches:
        try:
            kept.append((s, translate(parse(s.query), schema)))
        except Unsupported as exc:
            reason = str(exc)
            left_out[reason] = left_out.get(reason, 0) + 1
    return kept, left_out


def to_document(event: Mapping[str, Any], schema: Schema) -> Any:
    """One event as a mokaccino Document, analysed as our percolator analyses it."""
    from mokaccino import Document

    doc = Document()
    for field, value in event.items():
        kind = schema.type_of(field)
        if value is None:
            continue
        if kind is FieldType.TEXT:
            for tok in dict.fromkeys(tokenise(str(value))):
                doc.add_value(field, tok)
        elif kind is FieldType.NUMBER:
            if isinstance(value, (int, float)) and not isinstance(value, bool) \
                    and float(value).is_integer():
                doc.add_value(field, str(int(value)))
        else:
            doc.add_value(field, str(value))
    return doc


def _qid(search_id: str) -> int:
    return int(search_id.lstrip("q"))


# -- measuring -----------------------------------------------------------------------------------
def _idlest_cpu(cpus: set[int], window: float = 0.3) -> int:
    """The allowed CPU with the most idle time over `window` seconds (/proc/stat), else the
    lowest-numbered one."""
    def idle() -> dict[int, int]:
        out = {}
        with open("/proc/stat") as f:
            for line in f:
                name, *vals = line.split()
                if name.startswith("cpu") and name[3:].isdigit():
                    out[int(name[3:])] = int(vals[3]) + int(vals[4])  # idle + iowait
        return out

    try:
        a = idle()
        time.sleep(window)
        b = idle()
        return max(sorted(cpus), key=lambda c: b.get(c, 0) - a.get(c, 0))
    except (OSError, ValueError, IndexError):
        return min(cpus)


@contextmanager
def one_core() -> Iterator[int | None]:
    """Pin this process to one CPU (the idlest it may use) for the block, where the OS allows.
    Both engines are single-threaded anyway (mokaccino's binding runs `percolate` on the
    calling thread); pinning makes it explicit."""
    if not hasattr(os, "sched_setaffinity"):
        yield None
        return
    before = os.sched_getaffinity(0)
    cpu = _idlest_cpu(before)
    os.sched_setaffinity(0, {cpu})
    try:
        yield cpu
    finally:
        os.sched_setaffinity(0, before)


def _timed(fn: Any) -> tuple[float, float, Any]:
    """(wall seconds, CPU seconds of this process, result) of one call, after a collection."""
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, time.process_time() - c0, out


def _ours(searches: list[SavedSearch], events: list[dict[str, Any]], schema: Schema
          ) -> tuple[Any, dict[str, Any]]:
    """Our percolator built (timed) and warmed up; returns it with the build figures."""
    gc.collect()
    t0 = time.perf_counter()
    # Highlighting off: mokaccino returns query ids only (as bench.corpus_peer against Lucene
    # Monitor's SIMPLE_MATCHER); notifications still carry the matched labels and fields.
    perc = Percolator.from_searches(searches, schema=schema, highlight=False)
    build = time.perf_counter() - t0
    perc.match_batch(events[: max(1, int(len(events) * WARMUP_SHARE))])
    return perc, {"build_seconds": build}


def _mokaccino(kept: list[tuple[SavedSearch, Any]], events: list[dict[str, Any]],
               schema: Schema) -> tuple[Any, dict[str, Any]]:
    """mokaccino's percolator built (timed) and warmed up: (its batch function, build
    figures)."""
    from mokaccino import Percolator as MPercolator

    gc.collect()
    t0 = time.perf_counter()
    perc = MPercolator()
    for s, q in kept:
        perc.add_query_id(q, _qid(s.id))
    perc = perc.optimized()
    build = time.perf_counter() - t0

    def batch(evs: Sequence[Mapping[str, Any]]) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for i, ev in enumerate(evs):
            for qid in perc.percolate_list(to_document(ev, schema)):
                out.append((i, qid))
        return out

    batch(events[: max(1, int(len(events) * WARMUP_SHARE))])
    t0 = time.perf_counter()
    for ev in events:  # the conversion alone, for the record (it is inside the passes)
        to_document(ev, schema)
    return batch, {"build_seconds": build, "convert_seconds": time.perf_counter() - t0}


def _compare(kept: list[tuple[SavedSearch, Any]], events: list[dict[str, Any]],
             schema: Schema) -> dict[str, Any]:
    """Both engines built and warmed up, then REPEATS timed passes over all events each,
    alternated (ours, mokaccino, ours, ...) so that a change of the machine's load falls on
    both; the fastest pass of each counts, by wall clock (`events_per_s`) and by this
    process's CPU time (`cpu_events_per_s`: both engines run on the calling thread)."""
    perc, ours = _ours([s for s, _ in kept], events, schema)
    moka_batch, moka = _mokaccino(kept, events, schema)
    passes: dict[str, list[tuple[float, float]]] = {"ours": [], "mokaccino": []}
    loads: list[float] = []
    notes: Any = None
    hits: Any = None
    for _ in range(REPEATS):
        loads.append(os.getloadavg()[0])
        wall, cpu, notes = _timed(lambda: perc.match_batch(events))
        passes["ours"].append((wall, cpu))
        wall, cpu, hits = _timed(lambda: moka_batch(events))
        passes["mokaccino"].append((wall, cpu))
    ours_pairs = {(n.position, n.search_id) for n in notes}
    moka_pairs = {(i, f"q{qid}") for i, qid in hits}
    only_ours, only_moka = sorted(ours_pairs - moka_pairs), sorted(moka_pairs - ours_pairs)
    n = len(events)
    best = {k: (min(w for w, _ in v), min(c for _, c in v)) for k, v in passes.items()}
    return {
        "ours_events_per_s": n / best["ours"][0],
        "mokaccino_events_per_s": n / best["mokaccino"][0],
        "ratio": best["mokaccino"][0] / best["ours"][0],
        "ours_cpu_events_per_s": n / best["ours"][1],
        "mokaccino_cpu_events_per_s": n / best["mokaccino"][1],
        "cpu_ratio": best["mokaccino"][1] / best["ours"][1],
        "pass_ratios": [m[0] / o[0] for o, m in zip(passes["ours"], passes["mokaccino"],
                                                     strict=True)],
        "ours_build_seconds": ours["build_seconds"],
        "mokaccino_build_seconds": moka["build_seconds"],
        "ours_seconds": best["ours"][0], "mokaccino_seconds": best["mokaccino"][0],
        "ours_passes_seconds": [w for w, _ in passes["ours"]],
        "mokaccino_passes_seconds": [w for w, _ in passes["mokaccino"]],
        "ours_passes_cpu_seconds": [c for _, c in passes["ours"]],
        "mokaccino_passes_cpu_seconds": [c for _, c in passes["mokaccino"]],
        "load_before_passes": loads,
        "mokaccino_convert_seconds": moka["convert_seconds"],
        "ours_notifications": len(notes),
        "mokaccino_notifications": len(hits),
        "ours_verified_fraction": perc.last_stats.verified_fraction,
        "agree": not only_ours and not only_moka,
        "only_ours": len(only_ours), "only_mokaccino": len(only_moka),
        "disagreement_examples": [list(p) for p in (only_ours[:3] + only_moka[:3])],
    }


def shape(query: str) -> str:
    """A query's leaf kinds, e.g. 'Prefix+Term' (what the breakdown groups by)."""
    return "+".join(sorted({type(leaf).__name__ for leaf in qast.leaves(parse(query))}))


def run_size(n_queries: int, n_events: int, seed: int = 11, breakdown: bool = False
             ) -> dict[str, Any]:
    """One row: the structured workload at `n_queries`, both engines on the supported subset;
    with `breakdown`, also both engines on each query shape of that subset alone."""
    searches, events, schema = structured(n_queries, n_events, seed)
    t0 = time.perf_counter()
    kept, left_out = split_supported(searches, schema)
    translate_s = time.perf_counter() - t0
    row = {"queries": n_queries, "events": len(events), "subset_queries": len(kept),
           "subset_share": len(kept) / n_queries if n_queries else 0.0,
           "left_out": left_out, "translate_seconds": translate_s,
           **_compare(kept, events, schema)}
    if breakdown:
        groups: dict[str, list[tuple[SavedSearch, Any]]] = {}
        for s, q in kept:
            groups.setdefault(shape(s.query), []).append((s, q))
        row["by_shape"] = {name: {"queries": len(g), **_compare(g, events, schema)}
                           for name, g in sorted(groups.items(), key=lambda kv: -len(kv[1]))}
    return row


def run(sizes: tuple[int, ...] = (1_000, 10_000, 100_000), n_events: int = 1_000,
        breakdown: bool = True) -> dict[str, Any]:
    """Both engines at each number of stored queries, pinned to one core; at the largest size
    also per query shape (`breakdown`)."""
    version = available()
    if version is None:
        raise RuntimeError("mokaccino is not installed (it is in the project's dev extra: "
                           "pip install -e '.[dev]')")
    t0 = time.perf_counter()
    load_before = os.getloadavg()[0]
    with one_core() as cpu:
        rows = [run_size(n, n_events, breakdown=breakdown and n == max(sizes)) for n in sizes]
    return {"mokaccino_version": version, "workload": "structured", "events": n_events,
            "warmup_share": WARMUP_SHARE, "repeats": REPEATS, "cpu": cpu, "rows": rows,
            "wall_seconds": time.perf_counter() - t0, "cpus": os.cpu_count(),
            "load_average_1min": [load_before, os.getloadavg()[0]]}


def render_md(section: dict[str, Any]) -> str:
    """A Markdown subsection (### level) for bench/results/latest.md."""
    rows = section.get("rows") or []
    if not rows:
        return ""
    table = _table(
        ["stored queries", "compared (share)", "ours events/s", "mokaccino events/s",
         "ours / mokaccino", "ours / mokaccino (CPU time)", "build s ours",
         "build s mokaccino", "notifications ours", "notifications mokaccino",
         "same (event, query) pairs"],
        [[f"{r['queries']:,}", f"{r['subset_queries']:,} ({100 * r['subset_share']:.0f} %)",
          _n(r["ours_events_per_s"]), _n(r["mokaccino_events_per_s"]), f"{r['ratio']:.2f}",
          f"{r['cpu_ratio']:.2f}" if "cpu_ratio" in r else "",
          f"{r['ours_build_seconds']:.2f}", f"{r['mokaccino_build_seconds']:.2f}",
          f"{r['ours_notifications']:,}", f"{r['mokaccino_notifications']:,}",
          "yes" if r["agree"] else f"**no** ({r['only_ours']:,} only ours, "
                                   f"{r['only_mokaccino']:,} only mokaccino)"]
         for r in rows])
    reasons: dict[str, int] = {}
    for r in rows:
        for k, v in r["left_out"].items():
            reasons[k] = reasons.get(k, 0) + v
    left = ", ".join(k for k, _ in sorted(reasons.items(), key=lambda kv: -kv[1])) or "none"
    big = rows[-1]
    convert_us = 1e6 * big["mokaccino_convert_seconds"] / big["events"]
    out = ["### mokaccino peer (structured workload, one core)", "", *table, "",
           f"mokaccino {section['mokaccino_version']} (PyPI, Rust core) and our percolator run "
           f"on the same {section['events']:,} events and the same query subset, pinned to one "
           "core, with the protocol of the table above: index build timed (mokaccino: "
           "`add_query_id` per query, then `optimized()`), warm-up on the first "
           f"{100 * section['warmup_share']:.0f} % of the events, then all events timed, "
           f"fastest of {section['repeats']} passes, the two engines' passes alternated "
           "(for mokaccino including the event → Document conversion, "
           f"{convert_us:.0f} µs/event, as our analysis is inside `match_batch`). "
           "Each query is parsed by our Lucene parser and translated node by node (keyword "
           "term → `from_kv`, text prefix → `from_kprefix`, `[lo TO hi]` and `>=n` → "
           "`from_kge`/`from_kle` on i64, AND → `from_and`; the title goes in as one value per "
           "token of our tokeniser); mokaccino does no text analysis and has no phrase or fuzzy "
           f"query, so those are left out, not approximated ({left}), and our percolator runs "
           "on exactly the compared subset — its figures on the full mix are in the table "
           "above."]
    if section.get("load_average_1min"):
        a, b = section["load_average_1min"]
        out[-1] += (f" Load average (1 min) {a:.1f} before and {b:.1f} after, on "
                    f"{section['cpus']} CPUs" + (": other work on the machine shows in these "
                                                 "figures." if max(a, b) > 1.5 else "."))
    if big.get("by_shape"):
        parts = [f"{name} ({g['queries']:,} queries): ours {_n(g['ours_events_per_s'])}, "
                 f"mokaccino {_n(g['mokaccino_events_per_s'])} events/s"
                 for name, g in big["by_shape"].items()]
        out += ["", f"By query shape at {big['queries']:,} stored queries, each shape alone: "
                + "; ".join(parts) + "."]
    if all(r["agree"] for r in rows) and all(
            g["agree"] for r in rows for g in (r.get("by_shape") or {}).values()):
        out += ["", "Notifications are identical, as sets of (event, query) pairs, at every "
                "size."]
    else:
        out += ["", "Notifications differ (examples as [event index, query id]: "
                + "; ".join(f"{r['queries']:,} queries: {r['disagreement_examples']}"
                            for r in rows if not r["agree"]) + ")."]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    import json
    import sys

    sizes = tuple(int(x) for x in sys.argv[1].split(",")) if len(sys.argv) > 1 else (
        1_000, 10_000, 100_000)
    n_ev = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000
    res = run(sizes, n_ev, breakdown="--no-breakdown" not in sys.argv[3:])
    print(json.dumps(res, indent=1, default=str))
    print(render_md(res))
