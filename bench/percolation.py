"""The percolator: events/s and fraction of stored queries verified per event, vs stored queries.

Two seeded workloads:
- structured listings {city, kind, beds, price, title} with a declared schema; query mix: term
  conjunctions, ranges with a term, prefix, phrase and fuzzy terms;
- text events of ~100 tokens drawn from a Zipf vocabulary; query mix: two-term conjunctions,
  phrases, prefixes and fuzzy terms over mid-frequency words.

Per size: index build time (compile + add), match_batch events/s, verified fraction
(`BatchStats.verified_fraction`), notifications; and at the smallest size the notifications are
checked against `Percolator.scan` (every query run on every event).
"""

from __future__ import annotations

import random
import time
from typing import Any

from percolator import FieldType, Percolator, SavedSearch, Schema

SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "te", "vi", "do", "pa", "zu", "ber", "lin",
             "dam", "ster", "ford", "ton", "ville", "burg", "port")
KINDS = ("house", "flat", "studio", "villa", "loft", "cabin", "farm", "boat")


def _words(rng: random.Random, n: int, parts: int = 3) -> list[str]:
    out: dict[str, None] = {}
    while len(out) < n:
        out["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, parts + 1)))] = None
    return list(out)


def structured(n_queries: int, n_events: int, seed: int = 11) -> tuple[list[SavedSearch],
                                                                        list[dict[str, Any]],
                                                                        Schema]:
    rng = random.Random(seed)
    cities = _words(rng, 5_000)
    vocab = _words(rng, 3_000)
    schema = Schema({"city": FieldType.KEYWORD, "kind": FieldType.KEYWORD,
                     "beds": FieldType.NUMBER, "price": FieldType.NUMBER,
                     "title": FieldType.TEXT})
    queries = []
    for i in range(n_queries):
        r = rng.random()
        city = rng.choice(cities)
        if r < 0.4:
            q = f"city:{city} AND kind:{rng.choice(KINDS)}"
        elif r < 0.65:
            lo = rng.randrange(50_000, 900_000, 10_000)
            q = f"city:{city} AND price:[{lo} TO {lo + 200_000}] AND beds:>={rng.randint(1, 4)}"
        elif r < 0.8:
            q = f"title:{rng.choice(vocab)[:5]}* AND city:{city}"
        elif r < 0.9:
            a, b = rng.sample(vocab, 2)
            q = f'title:"{a} {b}"'
        else:
            q = f"city:{city[:-1] + 'x'}~1"
        queries.append(SavedSearch(f"q{i}", "bench", q))
    events = [{"city": rng.choice(cities), "kind": rng.choice(KINDS),
               "beds": rng.randint(1, 6), "price": rng.randrange(50_000, 1_200_000),
               "title": " ".join(rng.choice(vocab) for _ in range(8))}
              for _ in range(n_events)]
    return queries, events, schema


def text(n_queries: int, n_events: int, seed: int = 12) -> tuple[list[SavedSearch],
                                                                  list[dict[str, Any]], Schema]:
    rng = random.Random(seed)
    vocab = _words(rng, 20_000, parts=4)
    weights = [1 / (i + 1) for i in range(len(vocab))]  # Zipf
    mid = vocab[500:15_000]  # query words: neither stop-word frequent nor unseen
    schema = Schema({"body": FieldType.TEXT}, default_fields=("body",))
    queries = []
    for i in range(n_queries):
        r = rng.random()
        if r < 0.4:
            a, b = rng.sample(mid, 2)
            q = f"body:{a} AND body:{b}"
        elif r < 0.7:
            a, b = rng.sample(mid, 2)
            q = f'body:"{a} {b}"'
        elif r < 0.85:
            q = f"body:{rng.choice(mid)[:6]}*"
        else:
            q = f"body:{rng.choice(mid)}~1"
        queries.append(SavedSearch(f"q{i}", "bench", q))
    events = [{"body": " ".join(rng.choices(vocab, weights, k=100))} for _ in range(n_events)]
    return queries, events, schema


WORKLOADS = {"structured": structured, "text": text}


def measure(queries: list[SavedSearch], events: list[dict[str, Any]], schema: Schema,
            highlight: bool = False, runs: int = 1) -> tuple[dict[str, Any], list[Any],
                                                            Percolator]:
    """Build the index (timed), warm up on the first 10 % of the events, then time `runs`
    `match_batch` passes over all of them; the last one counts (as the Lucene peer's last of
    its runs: the first full pass is slower than the next ones). Returns the figures, the
    notifications and the index.
    Highlighting is off by default, as the Lucene peer's SIMPLE_MATCHER. (Index memory per
    search: bench.corpus_peer.index_bytes, tracemalloc; RSS growth is not a measure of it, the
    allocator reuses what the workload generator freed.)"""
    t0 = time.perf_counter()
    perc = Percolator.from_searches(queries, schema=schema, highlight=highlight)
    build_s = time.perf_counter() - t0
    perc.match_batch(events[: max(1, len(events) // 10)])  # warm caches
    passes = []
    for _ in range(max(1, runs)):
        t0 = time.perf_counter()
        notes = perc.match_batch(events)
        passes.append(time.perf_counter() - t0)
    secs = passes[-1]
    st = perc.last_stats
    row = {"queries": len(queries), "events": len(events), "seconds": secs,
           "passes_seconds": passes,
           "events_per_s": len(events) / secs, "build_seconds": build_s,
           "verified_fraction": st.verified_fraction, "candidates": st.candidates,
           "always_run": st.always_run, "notifications": len(notes),
           "build_searches_per_s": len(queries) / build_s, "highlight": highlight}
    return row, notes, perc


def run_one(kind: str, n_queries: int, n_events: int, check: bool) -> dict[str, Any]:
    queries, events, schema = WORKLOADS[kind](n_queries, n_events)
    row, _, perc = measure(queries, events, schema)
    out = {"workload": kind, **row}
    if check:
        sample = events[:50]
        got = sorted((i, n.search_id) for i, ev in enumerate(sample)
                     for n in perc.match(ev))
        want = sorted((i, sid) for i, ev in enumerate(sample) for sid in perc.scan(ev))
        out["scan_check_events"] = len(sample)
        out["scan_check_ok"] = got == want
    return out


def run_percolator(sizes: tuple[int, ...], n_events: int) -> dict[str, Any]:
    rows = []
    for kind in WORKLOADS:
        for i, n in enumerate(sizes):
            rows.append(run_one(kind, n, n_events, check=i == 0))
    return {"rows": rows}
