"""Window rules in `cep run` with real Kafka (docs/windows.md): rules/history.cep (a 30-day OVER
rule and tumbling, hopping and session window rules) beside rules/fraud.cep over three topics
gives the alerts of the Python engine, each exactly once (with either Kafka source); a window is
emitted once the watermark passes its end. The two files make a mixed rule set (the fraud rules
on the native loop, the window rules on the Python loop, both on `transactions`:
cep/runtime/mixed.py), so this is also the live operator's mixed store in a real job."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cep.compile import compile_rules, merge_rulesets
from cep.delivery.kafka_sink import ensure_topics
from cep.runtime.bind import build_embedded_engine, build_engine, engine_kind
from cep.runtime.embedded import alerts_for
from tests.test_live import cep_run, kcat_produce, kcat_read, wait
from tests.windows_data import history

pytestmark = [pytest.mark.services, pytest.mark.spark]
RULES = Path(__file__).resolve().parent.parent / "rules" / "history.cep"
FRAUD = RULES.parent / "fraud.cep"
DAY = 86_400_000
KEY_FIELD = {"transactions": "card", "logins": "ip", "payments": "card"}


def _movers(streams: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """One harmless event a day after each stream's last, on a key of its own, so that the
    watermark passes every window of the history (a live job has no end of input)."""
    end = max(e["ts"] for events in streams.values() for e in events) + DAY
    mover = {"transactions": {"ts": end, "card": "mover", "amount": 1.0, "merchant": "m",
                              "country": "NL"},
             "logins": {"ts": end, "ip": "mover", "user": "u", "outcome": "success"},
             "payments": {"ts": end, "card": "mover", "amount": 1.0, "channel": "pos"}}
    return {s: [*events, mover[s]] for s, events in streams.items()}


def _view(a: dict) -> tuple:
    return (a["rule_id"], a["key"], a["first_ts"], a["last_ts"],
            json.dumps(a["measures"], sort_keys=True))


# A batch read by one task per topic (`live_read_tasks` 1), and by many
# (`live_read_task_rows` 100: each topic's records over several read tasks, so a key's events
# reach the operator from several map tasks and Arrow batches of 100; the operator orders them
# by (ts, seq) whatever task they came from); and so by the Python Kafka source (`live_source`
# "python": three streams from three topics, each record's stream and position in the pass).
@pytest.mark.parametrize("read_split", [{"CEP_LIVE_READ_TASKS": "1"},
                                        {"CEP_LIVE_READ_TASK_ROWS": "100"},
                                        {"CEP_LIVE_READ_TASK_ROWS": "100",
                                         "CEP_LIVE_SOURCE": "python"}],
                         ids=["one_task", "100_rows", "100_rows_python_source"])
def test_window_rules_in_cep_run_equal_the_embedded_engine(kafka_bootstrap, redis_url,
                                                             tmp_path, topic, read_split):
    rules = tmp_path / "rules"
    rules.mkdir()
    for path in (RULES, FRAUD):
        (rules / path.name).write_text(
            re.sub(r"TO KAFKA '[^']*'", f"TO KAFKA '{topic}.alerts'", path.read_text()))
    ruleset = merge_rulesets(compile_rules(p.read_text(), str(p)) for p in (RULES, FRAUD))
    assert engine_kind(build_embedded_engine(ruleset)) == "mixed"
    streams = history()
    start = min(e["ts"] for e in streams["transactions"]) + 10 * DAY
    # Five charges within a minute on one card: fraud.cep's velocity rule, on the native loop.
    streams["transactions"] = sorted(
        [*streams["transactions"], *({"ts": start + i * 5_000 + 1, "card": "fast", "amount": 20.0,
                                      "merchant": "m", "country": "NL"} for i in range(5))],
        key=lambda e: e["ts"])
    streams = _movers(streams)
    expected = sorted(_view(a) for a in alerts_for(build_engine(ruleset), streams,
                                                   batch_size=500))
    assert {e[0] for e in expected} == {"spend_far_above_usual", "failed_login_burst",
                                        "failed_login_spray", "cnp_session_spree", "velocity"}
    args = ["--rules", str(rules), "--checkpoint", str(tmp_path / "ck"), "--once"]
    for stream, events in streams.items():
        # One partition per topic, everything in one batch: Spark keeps one watermark for all
        # the job's partitions (docs/spark-runtime.md), and the streams interleave in time.
        ensure_topics(kafka_bootstrap, [f"{topic}-{stream}"], partitions=1)
        kcat_produce(kafka_bootstrap, f"{topic}-{stream}",
                     [f"{e[KEY_FIELD[stream]]}\t{json.dumps(e)}\n" for e in events])
        args += ["--topic", f"{stream}={topic}-{stream}"]
    env = {"CEP_KAFKA_BOOTSTRAP": kafka_bootstrap, "CEP_REDIS_URL": redis_url,
           "CEP_SHARDS": "8", "CEP_SHUFFLE_PARTITIONS": "2",
           "CEP_DEAD_LETTER_TOPIC": f"{topic}-dlq", "CEP_LATE_TOPIC": f"{topic}-late",
           **read_split}
    log = tmp_path / "run.log"
    wait(cep_run(env, args, log), log)

    alerts = kcat_read(kafka_bootstrap, f"{topic}.alerts")
    assert sorted(_view(a) for a in alerts) == expected
    ids = [a["alert_id"] for a in alerts]
    assert len(ids) == len(set(ids))
    burst = [a for a in alerts if a["rule_id"] == "failed_login_burst"]
    for a in burst:  # a window rule's alert carries its bounds: a 5-minute tumbling window
        m = a["measures"]
        assert m["window_end"] - m["window_start"] == 5 * 60_000
        assert m["failures"] > 100
    assert kcat_read(kafka_bootstrap, f"{topic}-dlq") == []
