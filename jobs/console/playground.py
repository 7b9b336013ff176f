"""The console's playground: a pasted rules text over pasted events, on the embedded engine.

Limits keep a pasted rule from hanging the server: the text and the events have size caps, the
engine keeps its per-key partial-match cap, and the run stops at a time budget (checked between
small batches, so one batch is the most it can overrun). Events go through the one validator
(`cep.events`) like every other mode: an event the live job would dead-letter is reported here
with the same reason. Near misses are partial matches cut off by their time limit, reported for
every rule (as if it said ON TIMEOUT) and kept apart from the alerts.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import yaml

from cep.compile import compile_file
from cep.events import EventSchema, validate
from cep.nfa import RuleSet
from cep.runtime.alerts import alert_record
from cep.runtime.bind import build_engine
from cep.runtime.engine import Engine, Event, content_seq, run_embedded
from cep.runtime.matcher import Match, Timeout

MAX_RULES_BYTES = 64 * 1024
MAX_EVENTS_BYTES = 1024 * 1024
MAX_EVENTS = 5_000
MAX_PARTIAL_MATCHES = 1_000
TIME_BUDGET_S = 5.0
BATCH = 64


class PlaygroundError(ValueError):
    pass


@dataclass
class PlaygroundResult:
    errors: list[dict[str, Any]] = field(default_factory=list)  # compile errors
    dead: list[dict[str, Any]] = field(default_factory=list)  # events that are not valid
    alerts: list[dict[str, Any]] = field(default_factory=list)
    near_misses: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)  # the valid events, in order
    stopped: str | None = None  # why the run stopped early, if it did

    def to_dict(self) -> dict[str, Any]:
        return {"errors": self.errors, "dead_letters": self.dead, "alerts": self.alerts,
                "near_misses": self.near_misses, "events": self.events, "stopped": self.stopped}


def _error(e: Any) -> dict[str, Any]:
    span = getattr(e, "span", None)
    return {"message": getattr(e, "message", str(e)), "hint": getattr(e, "hint", None),
            "line": span.line if span else None, "col": span.col if span else None,
            "rendered": e.render() if hasattr(e, "render") else str(e)}


def engine_for(ruleset: RuleSet) -> Engine:
    """Every enabled rule, with near misses on and the playground's partial-match cap."""
    return build_engine(ruleset, max_partial_matches=MAX_PARTIAL_MATCHES, near_misses=True)


def run(rules_text: str, events_text: str, *, stream: str | None = None,
        budget_s: float = TIME_BUDGET_S) -> PlaygroundResult:
    """Compile `rules_text`, read `events_text` (JSON lines, or one JSON array), run."""
    if len(rules_text.encode()) > MAX_RULES_BYTES:
        raise PlaygroundError(f"rules text is larger than {MAX_RULES_BYTES // 1024} KiB")
    if len(events_text.encode()) > MAX_EVENTS_BYTES:
        raise PlaygroundError(f"events are larger than {MAX_EVENTS_BYTES // 1024} KiB")
    out = PlaygroundResult()
    ruleset, errors = compile_file(rules_text, "playground.cep")
    if errors or ruleset is None:
        out.errors = [_error(e) for e in errors]
        return out
    streams = {s.name: s for s in ruleset.streams}
    read = [r for r in ruleset.rules if r.enabled]
    if not read:
        out.errors = [{"message": "no enabled rule", "hint": None, "line": None, "col": None,
                       "rendered": "playground.cep: error: no enabled rule to run"}]
        return out
    name = stream or read[0].stream.name
    if name not in streams:
        raise PlaygroundError(f"no stream {name!r} in the rules (streams: "
                              f"{', '.join(sorted(streams))})")
    spec = streams[name]
    schema = EventSchema.of(spec, [r.key_field for r in read if r.stream.name == name])
    events: list[Event] = []
    for i, line in enumerate(_lines(events_text), start=1):
        if len(events) >= MAX_EVENTS:
            raise PlaygroundError(f"more than {MAX_EVENTS} events")
        data, ts, reason = validate(line.encode("utf-8", "surrogatepass"), schema)
        if data is None or ts is None:
            out.dead.append({"line": i, "reason": reason, "raw": line[:500]})
            continue
        events.append(Event(name, ts, content_seq(data), data))
    events.sort(key=lambda e: (e.ts, e.seq))
    out.events = [dict(e.data) for e in events]
    engine = engine_for(ruleset)
    started = time.monotonic()
    results: list[Any] = []
    it = run_embedded(engine, events, batch_size=BATCH)
    for r in it:
        results.append(r)
        if time.monotonic() - started > budget_s:
            out.stopped = f"stopped after {budget_s:.0f} s: the rules are too costly on this input"
            break
    for r in results:
        if isinstance(r, Match):
            out.alerts.append(alert_record(engine, r))
        elif isinstance(r, Timeout):
            record = alert_record(engine, r)
            rule = engine.rules[r.rule_id].meta
            if rule.on_timeout is not None:
                out.alerts.append(record)  # a timeout the rule asks for is an alert
            else:
                out.near_misses.append(record)
    return out


def _lines(text: str) -> list[str]:
    stripped = text.strip()
    if stripped.startswith("["):  # one JSON array of events
        try:
            items = json.loads(stripped)
        except json.JSONDecodeError:
            items = None
        if isinstance(items, list):
            return [json.dumps(x) for x in items]
    return [line for line in text.splitlines() if line.strip()]


def as_test_case(rules_file: str, name: str, result: PlaygroundResult) -> str:
    """The run as a `cep test` file (docs/rule-testing.md): its events, and the alerts it
    raised as the expectation (by rule, key and event indexes), or `expect_none`."""
    index = {json.dumps(e, sort_keys=True): i for i, e in enumerate(result.events)}
    expect = []
    for a in result.alerts:
        item: dict[str, Any] = {"rule": a["rule_id"], "key": a["key"]}
        if a["kind"] != "match":
            item["kind"] = a["kind"]
        item["events"] = [index[json.dumps(e["event"], sort_keys=True)] for e in a["events"]]
        expect.append(item)
    case: dict[str, Any] = {"name": name, "events": result.events}
    if expect:
        case["expect"] = expect
    else:
        case["expect_none"] = True
    doc = {"rules": rules_file, "cases": [case]}
    return "# Saved from the console's playground.\n" + yaml.safe_dump(
        doc, sort_keys=False, allow_unicode=True, default_flow_style=None, width=100)
