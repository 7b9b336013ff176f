"""The embedded engine on one core: throughput per domain, vs keys, vs rules, vs batch size;
state size per key; and a cProfile of the fraud run.

Throughput is events / wall seconds of `run_embedded` (the engine, single-threaded) over events
already converted to `Event`s; the conversion (`events_from_dicts`: the content hash used as the
tie-break for file sources) is timed on its own and reported beside it, since the Spark operator
pays it too.
"""

from __future__ import annotations

import cProfile
import io
import pickle
import pstats
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.workloads import (
    KEYS,
    Sizes,
    dataset,
    expected_alerts,
    load_rules,
    rules_path,
    scaled_rules,
    stream_of,
)
from cep.nfa import RuleSet
from cep.runtime.bind import build_engine
from cep.runtime.engine import Event, MemoryKeyStore, events_from_dicts, run_embedded
from cep.runtime.matcher import Match, Timeout

BATCH = 10_000  # events per engine call, about what one shard sees in one micro-batch


def _events(stream: str, dicts: list[dict[str, Any]]) -> tuple[list[Event], float]:
    t0 = time.perf_counter()
    evs = events_from_dicts(stream, dicts)
    evs.sort(key=lambda e: (e.ts, e.seq))
    return evs, time.perf_counter() - t0


def throughput(ruleset: RuleSet, events: list[Event], batch_size: int = BATCH,
               ) -> dict[str, Any]:
    engine = build_engine(ruleset)
    alerts: Counter[str] = Counter()
    found: list[tuple[str, str, int, int]] = []
    t0, c0 = time.perf_counter(), time.process_time()
    for r in run_embedded(engine, events, batch_size=batch_size):
        if isinstance(r, Match | Timeout):
            alerts[r.rule_id] += 1
            found.append((r.rule_id, str(r.key), r.first_ts, r.last_ts))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"events": len(events), "rules": len(ruleset.rules), "batch_size": batch_size,
            "seconds": wall, "cpu_seconds": cpu, "events_per_s": len(events) / wall,
            "alerts": dict(alerts), "found": sorted(found)}


def domain_run(domain: str, n_events: int, n_keys: int, inject: int,
               rules_dir: Path) -> dict[str, Any]:
    ds = dataset(domain, n_events, n_keys, inject)
    rules = load_rules(rules_path(rules_dir, domain))
    events, convert_s = _events(stream_of(rules), ds.events)
    res = throughput(rules, events)
    found = res.pop("found")
    res.update(domain=domain, keys=n_keys, convert_seconds=convert_s, found=found,
               events_per_s_incl_convert=len(events) / (res["seconds"] + convert_s),
               **alert_check(found, expected_alerts(ds)))
    return res


def alert_check(found: list[tuple[str, str, int, int]],
                expected: list[tuple[str, str, int, int]]) -> dict[str, Any]:
    """Found vs the generator's injected alerts, as (rule, key, first ts, last ts)."""
    f, e = set(found), set(expected)
    return {"alerts_found": len(found), "alerts_expected": len(expected),
            "alerts_ok": sorted(found) == sorted(expected),
            "alerts_missing": len(e - f), "alerts_unexpected": len(f - e)}


def run_domains(sizes: Sizes, rules_dir: Path) -> dict[str, Any]:
    out = {"fraud": domain_run("fraud", sizes.events, sizes.keys, sizes.inject, rules_dir)}
    for domain in ("trading", "machines"):
        keys = min(KEYS[domain], max(10, sizes.domain_events // 20))
        out[domain] = domain_run(domain, sizes.domain_events, keys, sizes.inject, rules_dir)
    return out


def run_scaling(sizes: Sizes, rules_dir: Path) -> dict[str, Any]:
    fraud_rules = rules_path(rules_dir, "fraud")
    base = load_rules(fraud_rules)
    by_keys = []
    for keys in sizes.scale_keys:
        ds = dataset("fraud", sizes.scale_events, keys, 1)
        events, _ = _events(stream_of(base), ds.events)
        res = throughput(base, events)
        res.pop("found")
        by_keys.append({"keys": keys, **res})
    ds = dataset("fraud", sizes.scale_events, min(sizes.keys, 10_000), 1)
    events, _ = _events(stream_of(base), ds.events)
    by_rules = []
    for n in sizes.scale_rules:
        res = throughput(scaled_rules(fraud_rules, n), events)
        res.pop("found")
        by_rules.append({"n_rules": n, **res})
    # Batch size: how many events one engine call gets (1 = a live per-event consumer). Few
    # events: every call scans the whole wake index, so batch 1 costs O(events x keys).
    head = events[: min(5_000, max(1_000, sizes.scale_events // 4))]
    by_batch = []
    for bs in (1, 100, 1_000, BATCH):
        res = throughput(base, head, batch_size=bs)
        res.pop("found")
        by_batch.append(res)
    return {"by_keys": by_keys, "by_rules": by_rules, "by_batch": by_batch,
            "rules_file": str(fraud_rules)}


def _state_bytes(store: MemoryKeyStore) -> dict[str, Any]:
    # As the Spark store writes them: one pickled blob per (rule, key), plus the wake index.
    sizes = [len(pickle.dumps(s, protocol=5)) for s in store.states.values()]
    keys = {k for _, k in store.states}
    total = sum(sizes)
    return {"state_entries": len(sizes), "keys_with_state": len(keys), "state_bytes": total,
            "bytes_per_entry": total / len(sizes) if sizes else 0.0,
            "bytes_per_key": total / len(keys) if keys else 0.0,
            "max_entry_bytes": max(sizes, default=0),
            "wake_index_bytes": len(pickle.dumps(store.wake, protocol=5))}


def run_state(sizes: Sizes, rules_dir: Path) -> dict[str, Any]:
    """Pickled engine state after N events (fraud, full key count), before end of input."""
    points = sorted(p for p in sizes.state_points if p <= sizes.events) or [sizes.events]
    ds = dataset("fraud", sizes.events, sizes.keys, sizes.inject)
    rules = load_rules(rules_path(rules_dir, "fraud"))
    events, _ = _events(stream_of(rules), ds.events[: points[-1]])
    engine = build_engine(rules)
    store = MemoryKeyStore()
    rows: list[dict[str, Any]] = []

    def feed() -> Iterator[Event]:
        for i, ev in enumerate(events):
            if i in points:  # state as of the batches before this event
                rows.append({"events": i, **_state_bytes(store)})
            yield ev
        # Every point is a multiple of BATCH: the last batch has been ingested by now, and the
        # end-of-input flush (which empties the state) has not run yet.
        rows.append({"events": len(events), **_state_bytes(store)})

    for _ in run_embedded(engine, feed(), batch_size=BATCH, store=store):
        pass
    return {"keys": sizes.keys, "points": rows, "batch_size": BATCH}


def run_profile(sizes: Sizes, rules_dir: Path, top: int = 18) -> dict[str, Any]:
    ds = dataset("fraud", sizes.events, sizes.keys, sizes.inject)
    dicts = ds.events[: sizes.profile_events]
    rules = load_rules(rules_path(rules_dir, "fraud"))
    engine = build_engine(rules)
    prof = cProfile.Profile()
    prof.enable()
    events = events_from_dicts(stream_of(rules), dicts)
    for _ in run_embedded(engine, events, batch_size=BATCH):
        pass
    prof.disable()
    st = pstats.Stats(prof, stream=io.StringIO())
    total = sum(v[2] for v in st.stats.values())  # type: ignore[attr-defined]
    rows = []
    by_file: Counter[str] = Counter()
    for (file, line, func), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        short = _short(file)
        by_file[short] += tt
        rows.append({"function": f"{short}:{line}({func})", "calls": nc, "tottime": tt,
                     "cumtime": ct})
    rows.sort(key=lambda r: -r["tottime"])
    return {"events": len(dicts), "total_seconds": total, "top": rows[:top],
            "by_file": [{"file": f, "tottime": t} for f, t in by_file.most_common(10)],
            "pyinstrument": _pyinstrument(ds.events[: sizes.profile_events], rules)}


def _pyinstrument(dicts: list[dict[str, Any]], rules: RuleSet) -> str | None:
    """A sampling profile (less distorted than cProfile's per-call overhead), when the optional
    pyinstrument package is installed; None otherwise."""
    try:
        from pyinstrument import Profiler
    except ImportError:
        return None
    engine = build_engine(rules)
    prof = Profiler(interval=0.001)
    prof.start()
    events = events_from_dicts(stream_of(rules), dicts)
    for _ in run_embedded(engine, events, batch_size=BATCH):
        pass
    prof.stop()
    text: str = prof.output_text(unicode=False, color=False)
    return text


def _short(file: str) -> str:
    """cep/runtime/engine.py, json/encoder.py, or ~ for builtins."""
    m = re.search(r"/(cep|percolator)/.*$", file) or re.search(
        r"(?:site-packages|lib/python3\.\d+)/(.*)$", file)
    if m is None:
        return file
    return m.group(0)[1:] if m.group(0).startswith("/") else m.group(1)
