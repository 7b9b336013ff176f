"""The README's first command: replay the bundled sample streams through the bundled rules on
Spark local mode (files in, files out; no Kafka or Redis), and print what was found.

The samples in examples/ were made by cep.datagen with known injected patterns; each has an
`.expected.json` beside it, and the demo says whether the alerts are exactly those.

Not a job of its own: a few replays (jobs/replay.py) and their alerts printed as `cep tail`
prints them (jobs/tail.py), so it lives with the commands, the one layer that uses several jobs.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from cep.config import QUICK_JIT, Settings
from jobs.replay import InputSpec, run_replay
from jobs.session import ROOT
from jobs.tail import format_alert

EXAMPLES = ROOT / "examples"
STREAMS = ("transactions", "ticks", "machine_events")


def run_demo(settings: Settings, out: str) -> int:
    if not settings.java_options:  # a short job: the quick JIT halves it (docs/spark-runtime.md)
        settings = replace(settings, java_options=QUICK_JIT)
    # One replay per stream: the samples cover different spans of time, and one replay shares
    # one watermark across its streams (see `cep replay --help`).
    alerts: list[dict] = []
    tables = []
    for stream in STREAMS:
        path = Path(out) / f"{stream}.alerts.jsonl"
        summary = run_replay(settings, str(ROOT / "rules"),
                             [InputSpec(stream, str(EXAMPLES / f"{stream}.jsonl"))], str(path),
                             show_progress=False)
        alerts += [json.loads(line) for line in path.read_text().splitlines()]
        tables.append((stream, summary))
    print()
    for stream, summary in tables:
        print(f"demo: {stream}: {summary.events_read} events from examples/{stream}.jsonl "
              f"through rules/ on Spark {settings.spark_master}")
        print(summary.table())
        print()
    for a in sorted(alerts, key=lambda a: (a["detected_at"], a["rule_id"], a["key"])):
        print("  " + format_alert(a))
    expected = sorted(
        (e["rule"], e["key"], e["first_ts"], e["last_ts"])
        for s in STREAMS for e in json.loads((EXAMPLES / f"{s}.expected.json").read_text()))
    got = sorted((a["rule_id"], a["key"], a["first_ts"], a["last_ts"]) for a in alerts)
    print()
    print(f"demo: {len(alerts)} alerts written to {out}/; the samples' injected "
          f"patterns were {len(expected)}: "
          + ("found exactly." if got == expected else "MISMATCH (see the alerts file)."))
    return 0 if got == expected else 1
