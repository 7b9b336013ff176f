"""`cep replay` on Spark local mode: generated data with injected patterns → exactly the injected
alerts, per domain; and the same alert file whatever the shard count, shuffle partitions, file
split and input split size — identical to the embedded engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cep.compile import compile_rules
from cep.datagen import GENERATORS, write_jsonl
from cep.runtime.bind import build_engine
from cep.runtime.embedded import alerts_for, canonical_lines
from jobs.replay import InputSpec, run_replay

pytestmark = pytest.mark.spark
RULES = Path(__file__).resolve().parent.parent / "rules"  # the bundled rules


def _expected(ds):
    return sorted((e.rule, e.key, e.first_ts, e.last_ts) for e in ds.expected)


def _got(path: Path):
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    return sorted((r["rule_id"], r["key"], r["first_ts"], r["last_ts"]) for r in recs)


@pytest.mark.parametrize("domain", ["fraud", "trading", "machines"])
def test_replay_finds_exactly_the_injected_alerts(spark, settings, tmp_path, domain):
    ds = GENERATORS[domain](n_events=3000, n_keys=30, inject=2)
    write_jsonl(ds.events, tmp_path / "in", files=3)
    out = tmp_path / "alerts.jsonl"
    summary = run_replay(settings, str(RULES / f"{domain}.cep"),
                         [InputSpec(ds.stream, str(tmp_path / "in"))], str(out),
                         show_progress=False)
    assert _got(out) == _expected(ds)
    assert summary.events_read == summary.events_processed == len(ds.events)
    assert summary.late == summary.dead_letters == 0


def test_same_alerts_whatever_the_batching_and_identical_to_embedded(spark, settings, tmp_path):
    ds = GENERATORS["fraud"](n_events=4000, n_keys=40, inject=3)
    rules = RULES / "fraud.cep"
    runs = [  # (files, shards, shuffle partitions, max bytes per input split)
        (1, 8, 2, None),
        (6, 3, 3, None),
        (3, 64, 1, None),
        (2, 5, 4, 20_000),  # every file cut into several splits (several map tasks per file)
    ]
    outputs, summaries = [], []
    for i, (files, shards, partitions, split_bytes) in enumerate(runs):
        write_jsonl(ds.events, tmp_path / f"in{i}", files=files)
        out = tmp_path / f"alerts{i}.jsonl"
        if split_bytes:
            spark.conf.set("spark.sql.files.maxPartitionBytes", str(split_bytes))
        try:
            summaries.append(run_replay(
                settings.with_overrides({"shards": shards, "shuffle_partitions": partitions}),
                str(rules), [InputSpec(ds.stream, str(tmp_path / f"in{i}"))], str(out),
                show_progress=False))
        finally:
            spark.conf.unset("spark.sql.files.maxPartitionBytes")
        outputs.append(out.read_bytes())
    engine = build_engine(compile_rules(rules.read_text(), str(rules)))
    embedded = "".join(line + "\n" for line in
                       canonical_lines(alerts_for(engine, {ds.stream: ds.events})))
    assert all(o == embedded.encode() for o in outputs)
    assert len(embedded.splitlines()) == len(ds.expected) == 9
    for s in summaries:
        assert s.balanced and s.events_read == s.events_processed == len(ds.events)
        assert s.late == 0
    # The engine ran in as many tasks as there were partitions with events.
    assert summaries[2].batches == 1 and summaries[0].batches <= 2
