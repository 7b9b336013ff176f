"""Our percolator alone at scale (issue 17): build, memory, updates and one batch on the real
corpus, without the Lucene side (bench/corpus_peer.py compares with Lucene Monitor).

    python -m bench.percolator_scale --size 1000000 --events 3000 [--source apt|sample]
        [--cache /tmp/perc_queries]   # keep the generated searches (1M: ~270 s to generate)
        [--build-only]                # time the build alone

Before/after a change of the library, the same script over the older code:
`git archive <commit> percolator cep bench | tar -x -C /tmp/base && cp bench/percolator_scale.py
/tmp/base/bench/ && cd /tmp/base && python -m bench.percolator_scale --build-only ...`.

Build rate is CPU seconds of `Percolator.from_searches` (process_time, so other load on the
machine counts less); memory is the growth of the process's resident set over the build (the
SavedSearch objects, made before, are not counted), and with --tracemalloc the Python heap
allocated by the build; updates replace and delete searches in place, timed per change; the
batch is one `match_batch` over the events after a 10% warm-up, with the verified fraction.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import resource
import time
import tracemalloc
from pathlib import Path
from typing import Any

from bench import apt_corpus
from percolator import Percolator, SavedSearch


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def cached_queries(events: list[dict[str, Any]], size: int, cache: str | None
                   ) -> tuple[list[SavedSearch], float | None]:
    """`apt_corpus.queries(events, size)`, kept in `cache`/q{size}.pickle when given (the
    generation time is None when read from the cache)."""
    path = Path(cache) / f"q{size}.pickle" if cache else None
    if path is not None and path.exists():
        with path.open("rb") as f:
            return pickle.load(f), None
    t = time.perf_counter()
    queries = apt_corpus.queries(events, size)
    gen_s = time.perf_counter() - t
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            pickle.dump(queries, f, protocol=pickle.HIGHEST_PROTOCOL)
    return queries, gen_s


def run(size: int, n_events: int, source: str = "auto", trace: bool = False,
        cache: str | None = None, build_only: bool = False) -> dict[str, Any]:
    events_all, where = apt_corpus.load(source)
    queries, gen_s = cached_queries(events_all, size, cache)
    events = apt_corpus.shuffled(events_all, n_events)
    gc.collect()
    if trace:
        tracemalloc.start()
    rss0, heap0 = _rss(), tracemalloc.get_traced_memory()[0] if trace else 0
    c0, w0 = time.process_time(), time.perf_counter()
    perc = Percolator.from_searches(queries, schema=apt_corpus.SCHEMA, highlight=False)
    build_cpu, build_wall = time.process_time() - c0, time.perf_counter() - w0
    rss1, heap1 = _rss(), tracemalloc.get_traced_memory()[0] if trace else 0
    if trace:
        tracemalloc.stop()
    if build_only:
        return {"size": size, "build_cpu_seconds": build_cpu, "build_wall_seconds": build_wall,
                "build_rate_cpu": size / build_cpu, "build_rate_wall": size / build_wall,
                "heap_bytes_per_search": (heap1 - heap0) / size if trace else None,
                "load": " ".join(f"{x:.2f}" for x in os.getloadavg())}
    # Updates without a rebuild: replace 1,000 searches by others' queries, delete 1,000.
    n_up = min(1000, size // 4)
    c0 = time.process_time()
    for i in range(n_up):
        q = queries[i]
        perc.add(SavedSearch(q.id, q.owner, queries[-1 - i].query))
    for i in range(n_up, 2 * n_up):
        perc.remove(queries[i].id)
    update_cpu = time.process_time() - c0
    warm = events[: max(1, n_events // 10)]
    perc.match_batch(warm)
    c0, w0 = time.process_time(), time.perf_counter()
    notes = perc.match_batch(events)
    match_cpu, match_wall = time.process_time() - c0, time.perf_counter() - w0
    st = perc.last_stats
    return {
        "size": size, "events": len(events), "corpus": where, "generate_seconds": gen_s,
        "build_cpu_seconds": build_cpu, "build_wall_seconds": build_wall,
        "build_rate_cpu": size / build_cpu, "build_rate_wall": size / build_wall,
        "rss_bytes_per_search": (rss1 - rss0) / size,
        "heap_bytes_per_search": (heap1 - heap0) / size if trace else None,
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "updates": 2 * n_up, "update_us_each_cpu": update_cpu / (2 * n_up) * 1e6,
        "match_events_per_s_cpu": len(events) / match_cpu,
        "match_events_per_s_wall": len(events) / match_wall,
        "notifications": len(notes), "matches_per_event": len(notes) / len(events),
        "verified_fraction": st.verified_fraction, "always_run": st.always_run,
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1_000_000)
    ap.add_argument("--events", type=int, default=3000)
    ap.add_argument("--source", default="auto")
    ap.add_argument("--tracemalloc", action="store_true")
    ap.add_argument("--cache", default=None, help="folder keeping the generated searches")
    ap.add_argument("--build-only", action="store_true", help="time the build alone")
    a = ap.parse_args()
    print(json.dumps(run(a.size, a.events, a.source, a.tracemalloc, a.cache, a.build_only),
                     indent=1))


if __name__ == "__main__":  # pragma: no cover
    main()
