"""Workloads: sizes per mode, seeded data sets, files on disk, and rule sets scaled up.

Every benchmark of one invocation reads the same generated events (per domain, per size), so the
engine, the Spark path, the ceiling and Flink see identical input. Data sets are cached in
memory for the run; files are written once per (domain, size) under the work folder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from cep.compile import compile_rules
from cep.datagen import GENERATORS, Dataset, write_jsonl
from cep.nfa import RuleSet

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RULES = ROOT / "bench" / "rules"
KEYS = {"fraud": 10_000, "trading": 500, "machines": 5_000}  # issue 7's workload sizes


@dataclass(frozen=True)
class Sizes:
    """How big each benchmark is. `full()` is `make bench`; `quick()` is the ~1-minute run."""

    events: int                   # fraud events for embedded, Spark and Flink
    keys: int                     # fraud cards
    domain_events: int            # trading/machines events for the embedded engine
    scale_events: int             # events per point of the keys/rules scaling curves
    scale_keys: tuple[int, ...]   # x axis of throughput vs keys
    scale_rules: tuple[int, ...]  # x axis of throughput vs rules (copies of the fraud rules)
    state_points: tuple[int, ...]  # events after which state size is measured
    profile_events: int
    spark_files: int              # files = micro-batches (maxFilesPerTrigger=1)
    spark_warmup: int             # first batches left out of the steady state
    flink_runs: int               # jobs in one JVM; the last (warm) one is reported
    perc_queries: tuple[int, ...]
    perc_events: int
    inject: int
    # bench.latency.run's sizes (seconds per rate, warm-up, ...). bench.run measures at rates
    # from the flink step's figure F of the same run: min(20,000, 0.4 F) (issue 14's latency
    # target) and `flink_multiples` x F (its throughput target), each rounded up to 500/s; `rates`
    # only when no Flink figure was measured. The full run warms the job for 240 s at the first
    # rate first, as the lead's session-22 runs (bench/results/latency_live.md): a live job in
    # production is warm, and Flink's figure is its warm run's.
    latency: dict[str, Any]
    native: dict[str, Any]        # issue 13's parts of bench.run's native step
    live: dict[str, Any]          # bench.live_ceiling.measure's sizes (ours vs the no-op)

    @classmethod
    def full(cls) -> Sizes:
        return cls(events=1_000_000, keys=10_000, domain_events=500_000,
                   scale_events=100_000, scale_keys=(100, 1_000, 10_000, 100_000),
                   scale_rules=(3, 6, 12, 24), state_points=(50_000, 100_000, 200_000, 400_000),
                   profile_events=100_000, spark_files=10, spark_warmup=2, flink_runs=2,
                   perc_queries=(1_000, 10_000, 100_000), perc_events=1_000, inject=100,
                   latency={"rates": (15_000, 38_000, 42_000), "flink_multiples": (1.0, 1.1),
                            "seconds": 20, "warmup": 240, "default_only": True},
                   native={"fraud_runs": 3, "batch": 100_000,
                           "rules": {"n_events": 100_000, "keys": 10_000, "copies": 32,
                                     "n_pairs": 6, "warmup": 2, "off_run": False},
                           "keys": {"rounds": 4, "many_set": (2_000_000, 1_000_000),
                                    "few_set": (1_000_000, 1_000)},
                           "trading": {"n_events": 60_000, "keys": 500, "batch": 100_000,
                                       "repeat": 5},
                           "state_keys": 10_000},
                   live={"events": 400_000, "batch": 20_000, "rate": 20_000, "rounds": 2,
                         "skip": 2})

    @classmethod
    def quick(cls) -> Sizes:
        return cls(events=60_000, keys=1_000, domain_events=30_000,
                   scale_events=20_000, scale_keys=(100, 1_000, 5_000),
                   scale_rules=(3, 6), state_points=(10_000, 20_000),
                   profile_events=10_000, spark_files=2, spark_warmup=1, flink_runs=2,
                   perc_queries=(1_000, 5_000), perc_events=300, inject=10,
                   latency={"rates": (5_000,), "flink_multiples": (), "seconds": 10,
                            "warmup": 10, "quick": True},
                   native={"fraud_runs": 1, "batch": 10_000,
                           "rules": {"n_events": 10_000, "keys": 1_000, "copies": 32,
                                     "n_pairs": 2, "warmup": 1, "off_run": False},
                           "keys": {"rounds": 2, "many_set": (100_000, 50_000),
                                    "few_set": (50_000, 100)},
                           "trading": {"n_events": 3_000, "keys": 50, "batch": 1_000,
                                       "repeat": 1},
                           "state_keys": 1_000},
                   live={"events": 40_000, "batch": 10_000, "rate": 20_000, "rounds": 1,
                         "skip": 1})

    def override(self, events: int | None, keys: int | None) -> Sizes:
        from dataclasses import replace

        return replace(self, events=events or self.events, keys=keys or self.keys)


@cache
def dataset(domain: str, n_events: int, n_keys: int, inject: int) -> Dataset:
    return GENERATORS[domain](n_events=n_events, n_keys=n_keys, seed=7, inject=inject)


def expected_alerts(ds: Dataset) -> list[tuple[str, str, int, int]]:
    return sorted((e.rule, e.key, e.first_ts, e.last_ts) for e in ds.expected)


def stream_of(ruleset: RuleSet) -> str:
    """The stream the rule file reads. Events are fed under this name whatever the generator
    calls its stream (generators and rule files are edited independently)."""
    names = sorted({r.stream.name for r in ruleset.rules if r.enabled})
    if len(names) != 1:
        raise ValueError(f"expected rules over one stream, got {names}")
    return names[0]


def files_for(ds: Dataset, stream: str, work: Path, files: int) -> Path:
    """The data set as JSON lines in `files` files, in a folder named by the stream (the Spark
    reader takes the stream from the folder name). Written once per run."""
    folder = work / f"data-{stream}-{len(ds.events)}-{files}" / stream
    if not folder.is_dir():
        write_jsonl(ds.events, folder, files=files)
    return folder


def rules_path(rules_dir: Path, domain: str) -> Path:
    return rules_dir / f"{domain}.cep"


def load_rules(path: Path) -> RuleSet:
    return compile_rules(path.read_text(), str(path))


def scaled_rules_text(text: str, copies: int) -> str:
    """The rule file with its RULE blocks repeated `copies` times under new names (the STREAM
    declaration once): a rule set `copies` times as large with the same selectivity."""
    blocks = re.split(r"(?m)^(?=RULE )", text)
    header, rules = blocks[0], blocks[1:]
    out = [header]
    for i in range(copies):
        for block in rules:
            out.append(re.sub(r"^RULE (\w+)", lambda m, i=i: f"RULE {m.group(1)}_{i}", block,
                              count=1))
    return "".join(out)


def scaled_rules(path: Path, total_rules: int) -> RuleSet:
    text = path.read_text()
    base = len(re.findall(r"(?m)^RULE ", text))
    copies = max(1, total_rules // base)
    return compile_rules(scaled_rules_text(text, copies), f"{path}x{copies}")
