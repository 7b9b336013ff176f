"""File replay is independent of how the input was split (issue 18) and of how the batch job
partitions it (issue 14): the same events, split so that a later file holds older events, give
the same alerts whatever the shuffle partition count — the embedded engine's alerts — and no
event becomes late, because each partition runs its events in event-time order and ends them
at the input's last event time (docs/spark-runtime.md, "Replay as a batch job")."""

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
ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "rules" / "fraud.cep"


def test_files_out_of_event_time_order_give_the_same_alerts_however_partitioned(
        spark, settings, tmp_path):
    ds = GENERATORS["fraud"](n_events=3000, n_keys=30, inject=2, seed=5)
    events = sorted(ds.events, key=lambda e: e["ts"])
    third = len(events) // 3
    # File names sort newest-first: the order files are read in is the reverse of event time.
    parts = {"a.jsonl": events[2 * third:], "b.jsonl": events[third:2 * third],
             "c.jsonl": events[:third]}
    (tmp_path / "in").mkdir()
    for name, part in parts.items():
        (tmp_path / "in" / name).write_text("".join(json.dumps(e) + "\n" for e in part))
    outputs, summaries = [], []
    for partitions in (1, 3, 7):
        out = tmp_path / f"alerts-{partitions}.jsonl"
        summaries.append(run_replay(settings.with_overrides({"shuffle_partitions": partitions}),
                                    str(RULES), [InputSpec(ds.stream, str(tmp_path / "in"))],
                                    str(out), show_progress=False))
        outputs.append(out.read_bytes())
    engine = build_engine(compile_rules(RULES.read_text(), str(RULES)))
    embedded = "".join(line + "\n" for line in
                       canonical_lines(alerts_for(engine, {ds.stream: ds.events})))
    assert outputs[0] == outputs[1] == outputs[2] == embedded.encode()
    assert len(embedded.splitlines()) == len(ds.expected) > 0
    assert summaries[0].batches == 1 < summaries[2].batches  # the partitioning did differ
    for s in summaries:
        assert s.late == 0 and s.balanced and s.events_read == len(events)


ABSENCE = """
STREAM pings (ts INT, k STRING, t STRING) TIME BY ts LATENESS 0s;
RULE silent FROM pings PARTITION BY k PATTERN (a -> NOT x)
  DEFINE a AS t = 'a', x AS t = 'x' WITHIN 10s EMIT 'no x';
RULE slow FROM pings PARTITION BY k PATTERN (a -> b) DEFINE a AS t = 'a', b AS t = 'b'
  WITHIN 20s ON TIMEOUT EMIT 'no b' EMIT 'a then b';
"""


def test_end_of_input_is_the_inputs_last_event_time_in_every_partition(spark, settings,
                                                                        tmp_path):
    """Keys whose only event is at 0 s, and one key ('clock') with events up to 60 s: the
    partitions without the clock end their own events at 0 s, yet their absences (10 s) and
    timeouts (20 s) are decided by the input's end at 60 s, as in the embedded engine."""
    rules = tmp_path / "pings.cep"
    rules.write_text(ABSENCE)
    events = [{"ts": 0, "k": f"k{i:02d}", "t": "a"} for i in range(24)]
    events += [{"ts": 5_000 * i, "k": "clock", "t": "tick"} for i in range(13)]
    events += [{"ts": 3_000, "k": "k03", "t": "x"}, {"ts": 15_000, "k": "k05", "t": "b"}]
    (tmp_path / "in").mkdir()
    for i in range(3):  # in an order unrelated to event time
        (tmp_path / "in" / f"{i}.jsonl").write_text(
            "".join(json.dumps(e) + "\n" for e in events[i::3]))
    engine = build_engine(compile_rules(ABSENCE, str(rules)))
    embedded = "".join(line + "\n" for line in
                       canonical_lines(alerts_for(engine, {"pings": events})))
    kinds = [json.loads(a)["kind"] for a in embedded.splitlines()]
    assert kinds.count("timeout") == 23 and len(kinds) == 23 + 23 + 1
    for shards, partitions in ((64, 8), (2, 2), (8, 1)):
        out = tmp_path / f"alerts-{shards}-{partitions}.jsonl"
        summary = run_replay(
            settings.with_overrides({"shards": shards, "shuffle_partitions": partitions}),
            str(rules), [InputSpec("pings", str(tmp_path / "in"))], str(out),
            show_progress=False)
        assert out.read_bytes() == embedded.encode()
        assert summary.max_ts == 60_000 and summary.balanced
