"""`cep search test` exits like grep and explains itself."""

from __future__ import annotations

import json

from cep.cli import main


def test_search_test_exit_codes(capsys) -> None:
    ev = json.dumps({"city": "Amstredam", "price": 350000})
    assert main(["search", "test", "city:amsterdam~1 AND price:<400000", "--event", ev]) == 0
    out = capsys.readouterr().out
    assert out.startswith("MATCH") and "✓ city:amsterdam~1" in out
    assert main(["search", "test", "city:amsterdam~1", "--event", '{"city": "Amstrdm"}']) == 1
    out = capsys.readouterr().out
    assert out.startswith("NO MATCH") and "✗ city:amsterdam~1" in out
    assert main(["search", "test", "city:(amsterdam", "--event", "{}"]) == 2
    err = capsys.readouterr().err
    assert "1:16" in err and "hint" in err
    assert main(["search", "test", "x:1", "--event", "not json"]) == 2


def test_search_test_with_schema_and_json(tmp_path, capsys) -> None:
    schema = tmp_path / "schema.yaml"
    schema.write_text("fields:\n  status: keyword\n")
    args = ["search", "test", "status:Open", "--schema", str(schema), "--json", "--event"]
    assert main(args + ['{"status": "open"}']) == 1
    assert json.loads(capsys.readouterr().out)["matched"] is False
    assert main(args + ['{"status": "Open"}']) == 0


def test_search_takes_redis_and_bootstrap_flags(monkeypatch, capsys) -> None:
    """`cep search` names its services with --redis and --bootstrap, as `cep run` and `cep
    percolate` do; a flag wins over the CEP_* variable."""
    from cep.delivery import preflight
    from cep.delivery.preflight import ServiceError

    monkeypatch.setenv("CEP_REDIS_URL", "redis://from-env:6379/0")
    monkeypatch.setenv("CEP_KAFKA_BOOTSTRAP", "from-env:9092")
    seen: dict[str, str] = {}

    def redis_up(url: str, timeout: float = 5.0) -> None:
        seen["redis"] = url

    def kafka_down(bootstrap: str, options=None, timeout: float = 10.0) -> set[str]:
        seen["kafka"] = bootstrap
        raise ServiceError(f"cannot reach Kafka at {bootstrap}")

    monkeypatch.setattr(preflight, "require_redis", redis_up)
    monkeypatch.setattr(preflight, "kafka_topics", kafka_down)
    assert main(["search", "add", "x:1", "--owner", "alice", "--redis", "redis://flag:1/0",
                 "--bootstrap", "flag:9092"]) == 2
    assert seen == {"redis": "redis://flag:1/0", "kafka": "flag:9092"}
    assert capsys.readouterr().err.strip() == "cannot reach Kafka at flag:9092"

    seen.clear()  # without the flags: the environment, as before
    assert main(["search", "add", "x:1", "--owner", "alice"]) == 2
    assert seen == {"redis": "redis://from-env:6379/0", "kafka": "from-env:9092"}


def test_search_redis_flag_reaches_the_client(capsys) -> None:
    """A Redis that is not there is one line naming the URL given with --redis."""
    assert main(["search", "ls", "--redis", "redis://127.0.0.1:1/0"]) == 2
    err = capsys.readouterr().err
    assert "redis://127.0.0.1:1/0" in err and len(err.strip().splitlines()) == 1
