"""The text of the rows the engine's hosts emit (`cep.runtime.alerts.output_rows`): an alert's
id and payload are what `json.dumps` with its default separators gives, so that an alert
delivered before an upgrade and again after it (a batch re-run across a restart on a new build)
keeps its id and its bytes. Checked against a formula written here, not the module's code."""

from __future__ import annotations

import hashlib
import json

from cep.compile import load_rules_dir
from cep.datagen import GENERATORS
from cep.runtime.alerts import alert_id, output_rows
from cep.runtime.bind import build_embedded_engine, build_engine
from cep.runtime.engine import NEG_INF, Event, MemoryKeyStore, content_seq

RULES = "rules/fraud.cep"


def test_an_alert_id_is_pinned() -> None:
    """The sha256 of the JSON list (rule, version, key, kind, positions), its first 32 hex
    digits: a literal, so a change of the JSON's form shows here."""
    assert (alert_id("big_spend", 3, "card-7", "match", [(1000, 1), (2500, "x")])
            == "b6969e5c076747ad0e01e9b03eda1a03")


def _rows(engine: object) -> list[tuple[str, str, str, str, str]]:
    ds = GENERATORS["fraud"](n_events=600, n_keys=20, seed=11, inject=3)
    dicts = [dict(d, note="café №7") for d in sorted(ds.events, key=lambda d: d["ts"])]
    events = [Event("transactions", int(d["ts"]), content_seq(d), d) for d in dicts]
    old = dict(events[0].data, amount=1.5)
    events.append(Event("transactions", events[0].ts, content_seq(old), old))  # late
    store, max_ts, rows = MemoryKeyStore(), NEG_INF, []
    for i in range(0, len(events), 100):
        chunk = events[i:i + 100]
        rows += output_rows(engine, engine.ingest(store, chunk, max_ts))  # type: ignore[attr-defined]
        max_ts = max(max_ts, *(e.ts for e in chunk))
    return rows + output_rows(engine, engine.ingest(store, [], max_ts,  # type: ignore[attr-defined]
                                                    end_of_input=max_ts))


def test_payloads_and_ids_are_json_dumps_defaults() -> None:
    rules = load_rules_dir(RULES)
    for engine in (build_engine(rules), build_embedded_engine(rules)):
        rows = _rows(engine)
        kinds = {r[0] for r in rows}
        assert "late" in kinds and kinds & {"match", "timeout"}
        for kind, rule_id, key, aid, payload in rows:
            rec = json.loads(payload)
            if kind == "late":
                assert payload == json.dumps(rec)
                continue
            assert payload == json.dumps(rec, sort_keys=True) and "\\u00e9" in payload
            assert (rec["kind"], rec["rule_id"], rec["key"], rec["alert_id"]) == (kind, rule_id,
                                                                                  key, aid)
            positions = [[e["ts"], e["seq"]] for e in rec["events"]]
            text = json.dumps([rule_id, rec["rule_version"], key, kind, positions])
            assert aid == hashlib.sha256(text.encode()).hexdigest()[:32]
