"""docker-compose.yml is for users (no Docker engine here): check its structure against the job's
configuration keys, so that it does not drift from what `cep` reads."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import yaml

from cep.config import ENV_PREFIX, Settings, load_settings

ROOT = Path(__file__).resolve().parent.parent


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_services_present():
    services = _compose()["services"]
    assert {"kafka", "redis", "spark-master", "spark-worker", "cep"} <= set(services)
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert "KAFKA_PROCESS_ROLES" in services["kafka"]["environment"]  # KRaft, no ZooKeeper


def test_job_environment_uses_config_keys_and_points_at_services():
    services = _compose()["services"]
    env = services["cep"]["environment"]
    known = {ENV_PREFIX + f.name.upper() for f in fields(Settings)}
    assert set(env) <= known, f"unknown config keys: {set(env) - known}"
    settings = load_settings(env={k: str(v) for k, v in env.items()})
    host, port = settings.kafka_bootstrap.split(":")
    assert host == "kafka" and port in [p.split(":")[-1] for p in services["kafka"]["ports"]]
    assert settings.redis_url.startswith("redis://redis:6379")
    assert settings.spark_master == "spark://spark-master:7077"
    assert "7077:7077" in services["spark-master"]["ports"]


def test_worker_points_at_master():
    worker = _compose()["services"]["spark-worker"]
    assert "spark://spark-master:7077" in worker["command"]
