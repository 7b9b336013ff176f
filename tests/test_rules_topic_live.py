"""`cep run --rules kafka:TOPIC` (issue 15, part 3) with real parts: rules deployed with `cep
rules deploy` to a compacted topic, a changed rule deployed while the job runs, a broken deploy
refused; alerts before and after carry the right versions, none lost or duplicated, and the
checkpoint says which version of each rule was in force from which batch."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from cep.cli import main
from cep.datagen import fraud
from cep.delivery.kafka_sink import ensure_topics
from cep.rules_topic import RulesTopic
from tests.test_live import (
    _key,
    _lines,
    _metrics,
    _route_alerts_to,
    _shifted,
    _wait_for,
    cep_run,
    kcat_produce,
    kcat_read,
)

pytestmark = [pytest.mark.services, pytest.mark.spark]
ROOT = Path(__file__).resolve().parent.parent


def test_a_rule_deployed_to_the_topic_while_running(kafka_bootstrap, redis_url, tmp_path, topic,
                                                    capsys):
    rules = tmp_path / "rules"
    rules.mkdir()
    shutil.copy(ROOT / "rules" / "fraud.cep", rules / "fraud.cep")
    _route_alerts_to(rules, f"{topic}.alerts")
    rules_topic = f"{topic}-rules"
    deploy = ["rules", "deploy", str(rules), "--bootstrap", kafka_bootstrap, "--topic",
              rules_topic]
    assert main(deploy) == 0

    first, exp1 = _shifted(fraud(n_events=1500, n_keys=15, inject=1, seed=21), "a-", 0)
    day = 24 * 3600 * 1000
    second, exp2 = _shifted(fraud(n_events=1500, n_keys=15, inject=1, seed=22), "b-", 3 * day)
    assert any(k[0] == "velocity" for k in exp1) and any(k[0] == "velocity" for k in exp2)
    ensure_topics(kafka_bootstrap, [f"{topic}-in"], partitions=1)
    kcat_produce(kafka_bootstrap, f"{topic}-in", _lines(first))
    ck = tmp_path / "ck"
    log = tmp_path / "run.log"
    env = {"CEP_KAFKA_BOOTSTRAP": kafka_bootstrap, "CEP_REDIS_URL": redis_url,
           "CEP_SHARDS": "8", "CEP_SHUFFLE_PARTITIONS": "2",
           "CEP_DEAD_LETTER_TOPIC": f"{topic}-dlq", "CEP_LATE_TOPIC": f"{topic}-late"}
    proc = cep_run(env, ["--rules", f"kafka:{rules_topic}", "--checkpoint", str(ck),
                         "--topic", f"transactions={topic}-in", "--trigger", "0.5"], log)
    try:
        _wait_for(lambda: len(kcat_read(kafka_bootstrap, f"{topic}.alerts")) >= len(exp1),
                  "the first part's alerts", log, timeout=400)
        v1 = _metrics(ck)["rules"]

        # A broken file is refused by the deploy: it never reaches the job.
        (rules / "broken.cep").write_text("RULE oops FROM transactions PATTERN (a b\n")
        assert main(deploy) == 1
        (rules / "broken.cep").unlink()
        # velocity's version 2, deployed while the job runs.
        text = (rules / "fraud.cep").read_text()
        at = text.index("RULE velocity")
        (rules / "fraud.cep").write_text(text[:at] + text[at:].replace("VERSION 1", "VERSION 2", 1))
        assert main(deploy) == 0
        capsys.readouterr()
        _wait_for(lambda: _metrics(ck).get("rules", {}).get("velocity", v1["velocity"])
                  != v1["velocity"], "velocity's version 2 to be in force", log, timeout=120)
        v2 = _metrics(ck)["rules"]
        assert v2["card_testing"] == v1["card_testing"] and set(v2) == set(v1)
        assert all(f["status"] == "accepted" for f in _metrics(ck)["rules_files"].values())

        kcat_produce(kafka_bootstrap, f"{topic}-in", _lines(second))
        _wait_for(lambda: len(kcat_read(kafka_bootstrap, f"{topic}.alerts"))
                  >= len(exp1) + len(exp2), "the second part's alerts", log, timeout=400)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)

    alerts = kcat_read(kafka_bootstrap, f"{topic}.alerts")
    ids = [a["alert_id"] for a in alerts]
    assert len(ids) == len(set(ids))  # nothing duplicated
    assert sorted(_key(a) for a in alerts) == sorted(exp1 + exp2)  # nothing lost

    # Each alert's rule_hash is the one published for the version in force when it was made.
    state = RulesTopic(kafka_bootstrap, rules_topic).state()
    published = {(rid, n): rec["rule_hash"] for rid, vs in state.versions.items()
                 for n, rec in vs.items()}
    assert sorted(published) == [("card_testing", 1), ("impossible_travel", 1),
                                 ("velocity", 1), ("velocity", 2)]
    for a in alerts:
        n = 2 if a["rule_id"] == "velocity" and a["key"].startswith("b-") else 1
        assert (a["rule_version"], a["rule_hash"]) == (n, published[(a["rule_id"], n)]), a

    # The checkpoint: every version that ran, by the hash the alerts carry, and from which
    # batch each set of rules was in force.
    archive = {p.name: json.loads(p.read_text()) for p in (ck / "rules-archive").glob("*.json")}
    for (rid, n), h in published.items():
        rec = archive[f"{rid}-{h}.json"]
        assert (rec["rule"], rec["version"], rec["source"]) == (
            rid, n, f"kafka:{rules_topic}/{rid}")
        assert rec["text"] == state.versions[rid][n]["source"]
    entries = [json.loads(x) for x in (ck / "rules-log.jsonl").read_text().splitlines()]
    in_force = [e["rules"]["velocity"]["version"] for e in entries]
    assert in_force[0] == 1 and in_force[-1] == 2
    batches = [e["batch_id"] for e in entries]
    assert batches == sorted(batches)
