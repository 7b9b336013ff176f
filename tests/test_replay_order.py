"""File replay is independent of how the input was split (issue 18): the same events, split so
that a later file holds older events, give the same alerts with `--max-files-per-trigger 1` as
without it — the embedded engine's alerts — and no event becomes late, because replay stages
bounded input in event-time order (docs/spark-runtime.md, "Replay order")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cep.compile import compile_rules
from cep.datagen import GENERATORS
from cep.runtime.bind import build_engine
from cep.runtime.embedded import alerts_for, canonical_lines
from jobs.replay import InputSpec, run_replay

pytestmark = pytest.mark.spark
RULES = Path(__file__).resolve().parent.parent / "rules" / "fraud.cep"


def test_files_out_of_event_time_order_give_the_same_alerts_however_batched(
        spark, settings, tmp_path):
    ds = GENERATORS["fraud"](n_events=3000, n_keys=30, inject=2, seed=5)
    events = sorted(ds.events, key=lambda e: e["ts"])
    third = len(events) // 3
    # File names sort newest-first: arrival order by file is the reverse of event time.
    parts = {"a.jsonl": events[2 * third:], "b.jsonl": events[third:2 * third],
             "c.jsonl": events[:third]}
    (tmp_path / "in").mkdir()
    for name, part in parts.items():
        (tmp_path / "in" / name).write_text("".join(json.dumps(e) + "\n" for e in part))
    outputs, summaries = [], []
    for per_trigger in (1, None):
        out = tmp_path / f"alerts-{per_trigger}.jsonl"
        summaries.append(run_replay(settings, str(RULES),
                                    [InputSpec(ds.stream, str(tmp_path / "in"))], str(out),
                                    max_files_per_trigger=per_trigger, show_progress=False))
        outputs.append(out.read_bytes())
    engine = build_engine(compile_rules(RULES.read_text(), str(RULES)))
    embedded = "".join(line + "\n" for line in
                       canonical_lines(alerts_for(engine, {ds.stream: ds.events})))
    assert outputs[0] == outputs[1] == embedded.encode()
    assert len(embedded.splitlines()) == len(ds.expected) > 0
    assert summaries[0].batches > summaries[1].batches  # the batching did differ
    for s in summaries:
        assert s.late == 0 and s.balanced and s.events_read == len(events)
