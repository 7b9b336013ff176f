"""Checks a job makes before it starts Spark, so that a missing service or topic is one line
naming what is missing — not, 18 s later, 500 lines of JVM stack trace (issue 18).

librdkafka logs every failed connection attempt to stderr; the clients made here log through
the `cep.kafka.client` logger instead, which is silent unless the command runs with
`--verbose` (`set_verbose`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from cep.errors import CepError

CLIENT_LOG = logging.getLogger("cep.kafka.client")
CLIENT_LOG.setLevel(logging.CRITICAL)


class ServiceError(CepError):
    """A service or resource the job needs is not there."""


# Kafka's legal topic names (its `Topic.validate`): a name outside them, e.g. "a,b", would be
# read by the Spark source's comma-separated `subscribe` as two topics.
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
TOPIC_NAME_RULE = "a topic name is 1-249 of A-Z a-z 0-9 . _ - (not '.' or '..')"


def is_topic_name(topic: str) -> bool:
    """Whether Kafka allows `topic` as a topic name (`TOPIC_NAME_RULE`). Used by `cep check`
    for a table's topic and by the jobs for every topic they read."""
    return bool(_TOPIC_NAME.fullmatch(topic)) and topic not in (".", "..")


def set_verbose(verbose: bool) -> None:
    CLIENT_LOG.setLevel(logging.DEBUG if verbose else logging.CRITICAL)


def quiet_kafka_conf(conf: Mapping[str, Any]) -> dict[str, Any]:
    """A confluent-kafka client config that logs through `cep.kafka.client`."""
    return {**conf, "logger": CLIENT_LOG}


def kafka_topics(bootstrap: str, options: Mapping[str, str] | None = None,
                 timeout: float = 10.0) -> set[str]:
    """The broker's topics; `ServiceError` when it cannot be reached."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(quiet_kafka_conf({"bootstrap.servers": bootstrap, **(options or {})}))
    try:
        meta = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else exc
        reason = err.str() if hasattr(err, "str") else str(err)
        raise ServiceError(f"cannot reach Kafka at {bootstrap}: {reason} (is the broker "
                           "running? set --bootstrap or CEP_KAFKA_BOOTSTRAP)") from exc
    return set(meta.topics)


def require_topics(bootstrap: str, wanted: Mapping[str, str],
                   options: Mapping[str, str] | None = None) -> None:
    """`wanted`: what reads it (e.g. 'stream transactions') → topic. Every topic must exist."""
    have = kafka_topics(bootstrap, options)
    missing = [(who, t) for who, t in wanted.items() if t not in have]
    if missing:
        what = "; ".join(f"topic {t!r} ({who})" for who, t in missing)
        raise ServiceError(f"missing input on Kafka at {bootstrap}: {what} does not exist. "
                           "Create it, or map the stream to another topic with "
                           "--topic STREAM=TOPIC")


def require_redis(url: str, timeout: float = 5.0) -> None:
    import redis

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout,
                                      socket_timeout=timeout)
    except ValueError as exc:
        raise ServiceError(f"Redis URL {url!r} is not valid: {exc}") from exc
    try:
        client.ping()
    except (redis.exceptions.RedisError, OSError) as exc:
        raise ServiceError(f"cannot reach Redis at {url}: {exc} (is it running? set --redis "
                           "or CEP_REDIS_URL)") from exc
    finally:
        client.close()


MARKER = "cep-job.json"


def claim_checkpoint(path: str | Path, job: str, identity: Mapping[str, Any]) -> None:
    """A checkpoint directory belongs to one kind of job: refuse another job's (or a
    non-checkpoint folder), which Spark would otherwise fail on with an obscure trace."""
    import json

    ck = Path(path)
    if ck.exists() and not ck.is_dir():
        raise ServiceError(f"checkpoint {ck} is a file, not a directory")
    marker = ck / MARKER
    if marker.exists():
        try:
            found = json.loads(marker.read_text())
        except (OSError, ValueError) as exc:
            raise ServiceError(f"checkpoint {ck}: unreadable {MARKER}: {exc}") from exc
        if found.get("job") != job:
            raise ServiceError(f"checkpoint {ck} belongs to `{found.get('job')}`, not `{job}`: "
                               "give this job its own --checkpoint")
        return
    if ck.exists() and any(p.name in ("offsets", "commits", "metadata", "sources")
                           for p in _children(ck)):
        raise ServiceError(f"checkpoint {ck} holds a Spark query checkpoint that `{job}` did "
                           "not write: give this job its own --checkpoint")
    try:
        ck.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"job": job, **identity}, sort_keys=True))
    except OSError as exc:
        raise ServiceError(f"cannot write checkpoint {ck}: {exc.strerror}") from exc


def _children(path: Path) -> Iterable[Path]:
    try:
        return list(path.iterdir())
    except OSError:
        return []


def one_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of an exception's message (a Spark error's message is its whole JVM
    trace), cut at `limit` characters."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    return first if len(first) <= limit else first[: limit - 3] + "..."
