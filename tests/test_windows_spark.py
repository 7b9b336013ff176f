"""Windows over a key's history (docs/windows.md) on Spark: `cep replay` of rules/history.cep
(an OVER rule and tumbling, hopping and session window rules) over three streams gives the same
alert file whatever the shards, shuffle partitions, files and input splits, identical to the
embedded engine at every batch size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cep.compile import compile_rules
from cep.runtime.bind import build_engine, matcher_report
from cep.runtime.embedded import alerts_for, canonical_lines
from jobs.replay import InputSpec, run_replay
from tests.windows_data import history

pytestmark = pytest.mark.spark
RULES = Path(__file__).resolve().parent.parent / "rules" / "history.cep"
def write(events: list[dict], folder: Path, files: int) -> None:
    folder.mkdir(parents=True)
    for i in range(files):
        with open(folder / f"part-{i}.jsonl", "w") as f:
            for ev in events[i::files]:
                f.write(json.dumps(ev) + "\n")


def test_window_rules_replay_on_spark_equals_embedded_whatever_the_batching(
        spark, settings, tmp_path):
    rules = compile_rules(RULES.read_text(), str(RULES))
    assert {kind for _, kind, _ in matcher_report(rules)} == {"python"}  # docs/windows.md
    streams = history()
    engine = build_engine(rules)
    embedded = [canonical_lines(alerts_for(engine, streams, batch_size=b)) for b in (1, 1000)]
    assert embedded[0] == embedded[1]
    by_rule: dict[str, int] = {}
    for line in embedded[0]:
        rec = json.loads(line)
        by_rule[rec["rule_id"]] = by_rule.get(rec["rule_id"], 0) + 1
    # every rule alerts, none on every key (the data has both sides of each threshold)
    assert set(by_rule) == {"spend_far_above_usual", "failed_login_burst", "failed_login_spray",
                            "cnp_session_spree"}, by_rule
    want = "".join(line + "\n" for line in embedded[0]).encode()
    runs = [(1, 8, 2, None), (4, 3, 3, None), (2, 5, 4, 20_000)]
    for i, (files, shards, partitions, split_bytes) in enumerate(runs):
        inputs = []
        for stream, events in streams.items():
            write(events, tmp_path / f"in{i}" / stream, files)
            inputs.append(InputSpec(stream, str(tmp_path / f"in{i}" / stream)))
        out = tmp_path / f"alerts{i}.jsonl"
        if split_bytes:
            spark.conf.set("spark.sql.files.maxPartitionBytes", str(split_bytes))
        try:
            summary = run_replay(
                settings.with_overrides({"shards": shards, "shuffle_partitions": partitions}),
                str(RULES), inputs, str(out), show_progress=False)
        finally:
            spark.conf.unset("spark.sql.files.maxPartitionBytes")
        assert out.read_bytes() == want, f"run {i}"
        assert summary.late == summary.dead_letters == 0
        assert summary.events_read == sum(len(v) for v in streams.values())
