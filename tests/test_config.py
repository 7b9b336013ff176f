from __future__ import annotations

import pytest

from cep.config import Settings, load_settings
from cep.errors import ConfigError


def test_precedence_file_env_flags(tmp_path):
    cfg = tmp_path / "cep.toml"
    cfg.write_text('kafka_bootstrap = "file:1"\nshards = 16\nredis_url = "redis://file"\n')
    s = load_settings(cfg, env={"CEP_SHARDS": "32", "CEP_REDIS_URL": "redis://env"},
                      overrides={"redis_url": "redis://flag", "spark_master": None})
    assert s.kafka_bootstrap == "file:1"      # file beats default
    assert s.shards == 32                     # env beats file, coerced to int
    assert s.redis_url == "redis://flag"      # flag beats env
    assert s.spark_master == Settings().spark_master  # None flag = not given


def test_kafka_options_pass_through():
    s = load_settings(env={"CEP_KAFKA_OPTIONS": "security.protocol=SASL_SSL,sasl.mechanism=PLAIN"})
    assert dict(s.kafka_options) == {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}


def test_errors_name_the_setting(tmp_path):
    with pytest.raises(ConfigError, match="unknown setting 'kafka'"):
        load_settings(env={}, overrides={"kafka": "x"})
    with pytest.raises(ConfigError, match="'shards' must be an integer"):
        load_settings(env={"CEP_SHARDS": "many"})
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "missing.toml", env={})
