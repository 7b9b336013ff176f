"""The README's first command: replay the bundled sample streams through the bundled rules on
Spark local mode (files in, files out; no Kafka or Redis), and print what was found.

The samples in examples/ were made by cep.datagen with known injected patterns; each has an
`.expected.json` beside it, and the demo says whether the alerts are exactly those.

Not a job of its own: a few replays (jobs/replay.py) and their alerts printed as `cep tail`
prints them (jobs/tail.py), so it lives with the commands, the one layer that uses several jobs.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from cep.config import Settings, quick_jit_unless_set
from jobs.replay import InputSpec, run_replay
from jobs.session import ROOT
from jobs.tail import format_alert

EXAMPLES = ROOT / "examples"
STREAMS = ("transactions", "ticks", "machine_events")


def run_demo(settings: Settings, out: str) -> int:
    settings = quick_jit_unless_set(settings)  # a short job: the quick JIT halves it
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
    # The samples were made for some of the bundled rules (those in the .expected.json files):
    # theirs must be exactly the injected patterns. Other bundled rules (a 30-day spend
    # history, a table of customers) may also fire on them; they are listed, not judged here
    # (their own cases are in rules/tests/).
    injected = {e[0] for e in expected}
    got = sorted((a["rule_id"], a["key"], a["first_ts"], a["last_ts"]) for a in alerts
                 if a["rule_id"] in injected)
    others = Counter(a["rule_id"] for a in alerts if a["rule_id"] not in injected)
    print()
    print(f"demo: {len(alerts)} alerts written to {out}/; the samples' injected "
          f"patterns were {len(expected)}: "
          + ("found exactly." if got == expected else "MISMATCH (see the alerts file)."))
    if others:
        print("demo: the samples were not made for " + ", ".join(
            f"{rule} ({n} alert{'s' if n > 1 else ''})" for rule, n in sorted(others.items())))
    return 0 if got == expected else 1
