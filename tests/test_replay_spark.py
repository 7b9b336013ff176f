"""`cep replay` on Spark local mode: generated data with injected patterns → exactly the injected
alerts, per domain; and the same alert file whatever the batch size, shard count, shuffle
partitions and file split — identical to the embedded engine."""

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
                         max_files_per_trigger=1, show_progress=False)
    assert _got(out) == _expected(ds)
    assert summary.events_read == summary.events_processed == len(ds.events)
    assert summary.late == summary.dead_letters == 0


def test_same_alerts_whatever_the_batching_and_identical_to_embedded(spark, settings, tmp_path):
    ds = GENERATORS["fraud"](n_events=4000, n_keys=40, inject=3)
    rules = RULES / "fraud.cep"
    runs = [  # (files, max files per trigger, shards, shuffle partitions)
        (1, None, 8, 2),
        (6, 1, 3, 3),
    ]
    outputs = []
    for i, (files, per_trigger, shards, partitions) in enumerate(runs):
        write_jsonl(ds.events, tmp_path / f"in{i}", files=files)
        out = tmp_path / f"alerts{i}.jsonl"
        run_replay(settings.with_overrides({"shards": shards, "shuffle_partitions": partitions}),
                   str(rules), [InputSpec(ds.stream, str(tmp_path / f"in{i}"))], str(out),
                   max_files_per_trigger=per_trigger, show_progress=False)
        outputs.append(out.read_bytes())
    engine = build_engine(compile_rules(rules.read_text(), str(rules)))
    embedded = "".join(line + "\n" for line in
                       canonical_lines(alerts_for(engine, {ds.stream: ds.events})))
    assert outputs[0] == outputs[1] == embedded.encode()
    assert len(embedded.splitlines()) == len(ds.expected) == 9
