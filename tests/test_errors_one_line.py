"""A missing topic, an unreachable broker or Redis and a wrong checkpoint are one line naming
what is missing, before Spark starts; `--verbose` adds the full trace (issue 18: a missing topic
killed `cep run` after 18 s with ~500 lines that never named it; `cep search` with Kafka down
printed ~200 librdkafka lines and a traceback). Real broker and Redis; dead ports for "down"."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from cep.cli import main

pytestmark = pytest.mark.services
ROOT = Path(__file__).resolve().parent.parent
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (INFO|WARNING|DEBUG) ")


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: nothing listens there


def _errors(err: str) -> list[str]:
    """stderr without the job's own INFO log lines."""
    return [line for line in err.splitlines() if line.strip() and not LOG_LINE.match(line)]


def _run(capfd, *args: str) -> tuple[int, list[str]]:
    code = main(["run", *args])
    return code, _errors(capfd.readouterr().err)


def test_missing_input_topic(capfd, fraud_rules_dir, tmp_path, kafka_bootstrap, redis_url, topic):
    code, err = _run(capfd, "--rules", str(fraud_rules_dir), "--checkpoint", str(tmp_path / "ck"),
                     "--bootstrap", kafka_bootstrap, "--redis", redis_url,
                     "--topic", f"transactions={topic}-nowhere", "--once")
    assert code == 2 and len(err) == 1, err
    assert f"topic '{topic}-nowhere' (stream transactions) does not exist" in err[0]


def test_unreachable_broker(capfd, fraud_rules_dir, tmp_path, redis_url):
    port = _dead_port()
    code, err = _run(capfd, "--rules", str(fraud_rules_dir), "--checkpoint", str(tmp_path / "ck"),
                     "--bootstrap", f"127.0.0.1:{port}", "--redis", redis_url, "--once")
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"cannot reach Kafka at 127.0.0.1:{port}")


def test_unreachable_redis(capfd, fraud_rules_dir, tmp_path, kafka_bootstrap, topic):
    from cep.delivery.kafka_sink import ensure_topics

    ensure_topics(kafka_bootstrap, [f"{topic}-in"])
    port = _dead_port()
    code, err = _run(capfd, "--rules", str(fraud_rules_dir), "--checkpoint", str(tmp_path / "ck"),
                     "--bootstrap", kafka_bootstrap, "--redis", f"redis://127.0.0.1:{port}/0",
                     "--topic", f"transactions={topic}-in", "--once")
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"cannot reach Redis at redis://127.0.0.1:{port}/0")


def test_wrong_checkpoint_and_verbose_trace(capfd, fraud_rules_dir, tmp_path, kafka_bootstrap,
                                            redis_url):
    ck = tmp_path / "ck"
    (ck / "offsets").mkdir(parents=True)  # another Spark query's checkpoint
    args = ["--rules", str(fraud_rules_dir), "--checkpoint", str(ck),
            "--bootstrap", kafka_bootstrap, "--redis", redis_url, "--once"]
    code, err = _run(capfd, *args)
    assert code == 2 and len(err) == 1, err
    assert f"checkpoint {ck} holds a Spark query checkpoint" in err[0]
    code, err = _run(capfd, *args, "--verbose")
    assert code == 2 and err[0] == "Traceback (most recent call last):"
    assert f"checkpoint {ck} holds a Spark query checkpoint" in err[-1]


def test_search_with_kafka_or_redis_down_is_one_line(capfd, monkeypatch, redis_url):
    port = _dead_port()
    monkeypatch.setenv("CEP_KAFKA_BOOTSTRAP", f"127.0.0.1:{port}")
    monkeypatch.setenv("CEP_REDIS_URL", redis_url)
    code = main(["search", "add", "city:amsterdam", "--owner", "t"])
    err = _errors(capfd.readouterr().err)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"cannot reach Kafka at 127.0.0.1:{port}")

    monkeypatch.setenv("CEP_REDIS_URL", f"redis://127.0.0.1:{port}/0")
    code = main(["search", "ls"])
    err = _errors(capfd.readouterr().err)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"cannot reach Redis at redis://127.0.0.1:{port}/0")


def test_every_rule_disabled_is_nothing_to_run(capfd, fraud_rules_dir, tmp_path):
    """A rules directory whose rules are all disabled gives no stream to read: one line and
    exit 2 (like the other start-up errors) before any service or Spark is asked, not a
    query started with no source."""
    for path in fraud_rules_dir.glob("*.cep"):
        text = path.read_text()
        path.write_text(text.replace("SEVERITY", "DISABLED SEVERITY"))
    code, err = _run(capfd, "--rules", str(fraud_rules_dir), "--checkpoint", str(tmp_path / "ck"),
                     "--bootstrap", "127.0.0.1:1", "--redis", "redis://127.0.0.1:1", "--once")
    message = f"no enabled rule in {fraud_rules_dir} reads a stream: nothing to run"
    assert (code, err) == (2, [message])


def test_a_topic_that_kafka_cannot_name_is_one_line(capfd, fraud_rules_dir, tmp_path):
    """`--topic transactions=a,b`: Spark's Kafka source would subscribe to "a" and "b" (its
    `subscribe` is comma-separated) and the stream of every row be unknown; Kafka allows no
    comma in a topic name, so `cep run` refuses it before it reaches Kafka or Spark."""
    for bad in ("a,b", "", "..", "t" * 250, "tx topic"):
        code, err = _run(capfd, "--rules", str(fraud_rules_dir), "--checkpoint",
                         str(tmp_path / "ck"), "--topic", f"transactions={bad}", "--once")
        assert code == 2 and len(err) == 1, err
        assert err[0].startswith(f"not a Kafka topic name: {bad!r} (--topic transactions={bad})")


def test_the_kafka_reader_takes_only_kafka_topic_names():
    """Every job's Kafka read (`kafka_reader`: `cep run`, `cep replay`, `cep percolate`) checks
    its topics, whatever named them (a `--topic`, a stream's name, a table's declared topic)."""
    from cep.config import Settings
    from cep.errors import CepError
    from cep.spark.kafka import check_topic, kafka_reader

    class Reader:  # records the options a job sets
        def __init__(self) -> None:
            self.options: dict[str, object] = {}

        def format(self, _: str) -> Reader:
            return self

        def option(self, k: str, v: object) -> Reader:
            self.options[k] = v
            return self

    good = ["tx", "a.b_c-9", "t" * 249]
    assert [check_topic(t) for t in good] == good
    r = kafka_reader(Reader(), Settings(), ["tx", "a.b_c-9", "tx"], starting="earliest")
    assert r.options["subscribe"] == "a.b_c-9,tx"
    with pytest.raises(CepError, match=r"not a Kafka topic name: 'a,b'"):
        kafka_reader(Reader(), Settings(), ["tx", "a,b"], starting="earliest")
