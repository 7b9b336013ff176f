"""Our side of a finished Lucene Monitor comparison, rerun against Lucene's stored pairs.

bench.corpus_peer writes the queries, the events and Lucene's (event, query) pairs to its work
folder. After a change on our side only (e.g. the tokeniser), this reruns our percolator on the
same queries and events and compares pair by pair with the pairs Lucene wrote then, without
rerunning Lucene (60 minutes at 1M searches). The events are regenerated as corpus_peer does and
checked byte for byte against the stored events file.

    python -m bench.percolator_lucene_recheck --size 1000000 --events 3000 \\
        --cache /tmp/perc_queries --work /tmp/corpus_1m [--json out.json]
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import apt_corpus
from bench.lucene_peer import compare, read_matches, run_ours
from bench.percolator_scale import cached_queries


def run(size: int, n_events: int, work: Path, cache: str | None) -> dict[str, Any]:
    load_before = os.getloadavg()
    events_all, where = apt_corpus.load("auto")
    queries, _ = cached_queries(events_all, size, cache)
    events = apt_corpus.shuffled(events_all, n_events)
    epath = work / f"corpus_q{size}_events.tsv"
    with tempfile.TemporaryDirectory() as tmp:
        mine = Path(tmp) / "events.tsv"
        apt_corpus.write_tsv(events, mine)
        same_events = mine.read_bytes() == epath.read_bytes()
    qpath = work / f"corpus_q{size}.tsv"
    stored = dict(line.rstrip("\n").split("\t", 1)
                  for line in qpath.open(encoding="utf-8"))
    same_queries = len(stored) == len(queries) and all(stored.get(q.id) == q.query
                                                       for q in queries)
    t0 = time.perf_counter()
    ours, pairs = run_ours(queries, events, apt_corpus.SCHEMA)
    lucene = read_matches(work / f"corpus_q{size}_lucene_ball_matches.tsv")
    cmp = compare(pairs, lucene, queries, events)
    return {"queries": size, "events": len(events), "corpus": where,
            "same_events_as_stored": same_events, "same_queries_as_stored": same_queries,
            "ours": ours, "lucene_pairs": sum(len(v) for v in lucene.values()),
            "compare": cmp, "seconds": time.perf_counter() - t0,
            "load_average_before": load_before, "load_average_after": os.getloadavg()}


def main() -> None:  # pragma: no cover - manual runs
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1_000_000)
    ap.add_argument("--events", type=int, default=3000)
    ap.add_argument("--cache", default=None)
    ap.add_argument("--work", default="/tmp/corpus_1m")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    res = run(a.size, a.events, Path(a.work), a.cache)
    text = json.dumps(res, indent=1, default=str)
    if a.json:
        Path(a.json).write_text(text)
    print(text)


if __name__ == "__main__":  # pragma: no cover
    main()
