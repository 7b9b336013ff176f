"""`detected_at` is the event time at which an alert became final (docs/alerts.md): the last
matched event for an ordinary match, the deadline for an absence (issue 18: it was the last
event's time)."""

from __future__ import annotations

from pathlib import Path

from cep.compile import compile_rules
from cep.runtime.bind import build_engine
from cep.runtime.embedded import alerts_for

RULES = Path(__file__).resolve().parent.parent / "rules" / "machines.cep"
T = 1767225600000
MIN = 60_000


def test_absence_alerts_are_detected_at_their_deadline_matches_at_their_last_event():
    engine = build_engine(compile_rules(RULES.read_text(), str(RULES)))
    beat = {"machine": "m1", "kind": "heartbeat", "temperature": None}
    events = [
        {**beat, "ts": T},                       # a heartbeat, then silence for 2m: absence
        *({"machine": "m2", "kind": "reading", "temperature": 70.0 + 10 * i, "ts": T + i * 1000}
          for i in range(4)),                    # rising temperature: a match at its 4th event
        {"machine": "m3", "kind": "reading", "temperature": 20.0, "ts": T + 10 * MIN},
    ]
    alerts = {(a["rule_id"], a["key"]): a for a in
              alerts_for(engine, {"machine_events": events})}
    silent = alerts[("missing_heartbeat", "m1")]
    assert silent["last_ts"] == T and silent["detected_at"] == T + 2 * MIN
    rising = alerts[("rising_temperature", "m2")]
    assert rising["detected_at"] == rising["last_ts"] == T + 3000
