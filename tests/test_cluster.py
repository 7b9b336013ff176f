"""The live job on a Spark standalone cluster — a master and two workers started from PySpark's
own spark-class — with our package shipped to the executors: kcat in, alerts out exactly once."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from cep.datagen import fraud
from cep.delivery.kafka_sink import ensure_topics
from tests.services import ROOT, ServiceError, free_port
from tests.test_live import (
    FRAUD_RULES,
    _expected,
    _key,
    _lines,
    _route_alerts_to,
    cep_run,
    kcat_produce,
    kcat_read,
    redis_alert_ids,
    wait,
)

pytestmark = [pytest.mark.services, pytest.mark.spark]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("spark-cluster")
    port = free_port()
    proc = subprocess.run(["bash", "scripts/spark-cluster.sh", "start", "--port", str(port),
                           "--workers", "2", "--dir", str(workdir)],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    if proc.returncode != 0:
        raise ServiceError(f"Spark standalone cluster failed to start:\n{proc.stderr}")
    yield f"spark://127.0.0.1:{port}", workdir
    subprocess.run(["bash", "scripts/spark-cluster.sh", "stop", "--dir", str(workdir)],
                   cwd=ROOT, capture_output=True, timeout=60)


def test_live_job_on_master_and_two_workers(cluster, kafka_bootstrap, redis_url, redis_client,
                                            tmp_path, topic):
    master, workdir = cluster
    rules = tmp_path / "rules"
    rules.mkdir()
    shutil.copy(FRAUD_RULES, rules / "fraud.cep")
    _route_alerts_to(rules, f"{topic}.alerts")
    ds = fraud(n_events=3000, n_keys=30, inject=2, seed=51)
    ensure_topics(kafka_bootstrap, [f"{topic}-in"], partitions=2)
    kcat_produce(kafka_bootstrap, f"{topic}-in", _lines(ds.events))
    env = {"CEP_KAFKA_BOOTSTRAP": kafka_bootstrap, "CEP_REDIS_URL": redis_url,
           "CEP_SHARDS": "8", "CEP_SHUFFLE_PARTITIONS": "4", "CEP_SPARK_MASTER": master,
           "CEP_DEAD_LETTER_TOPIC": f"{topic}-dlq", "CEP_LATE_TOPIC": f"{topic}-late"}
    log = tmp_path / "run.log"
    proc = cep_run(env, ["--rules", str(rules), "--checkpoint", str(tmp_path / "ck"),
                         "--topic", f"transactions={topic}-in", "--once"], log)
    wait(proc, log)

    alerts = kcat_read(kafka_bootstrap, f"{topic}.alerts")
    assert sorted(_key(a) for a in alerts) == _expected(ds)
    ids = [a["alert_id"] for a in alerts]
    assert len(ids) == len(set(ids))
    in_redis = redis_alert_ids(redis_client, ids)
    assert sorted(in_redis) == sorted(ids)
    # Both workers ran executors for the job, and each fetched our package.
    apps = [sorted((workdir / f"worker{i}").glob("app-*")) for i in (1, 2)]
    assert all(apps), f"a worker ran no executor: {apps}"
    fetched = [p for i in (1, 2) for p in (workdir / f"worker{i}").rglob("sparkcep-*.zip")]
    assert len({p.parents[1].parent.name for p in fetched}) >= 1 and fetched
    assert all(Path(p).stat().st_size > 0 for p in fetched)
