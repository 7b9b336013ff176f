"""One configuration object for every job and command.

Precedence (later wins): built-in defaults < TOML file (``--config`` or ``./cep.toml``) <
environment variables ``CEP_<FIELD>`` < explicit CLI flags. The same keys are used by
`docker-compose.yml` (as environment variables) and documented in README.md.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from cep.errors import ConfigError

ENV_PREFIX = "CEP_"

# The JVM's quick JIT only (C1): a job of a minute or two spends most of its time starting up and
# planning its first batch, which the full JIT slows down. `cep demo` and the tests use it.
QUICK_JIT = "-XX:TieredStopAtLevel=1"



@dataclass(frozen=True, slots=True)
class Settings:
    kafka_bootstrap: str = "127.0.0.1:9092"
    redis_url: str = "redis://127.0.0.1:6379/0"
    spark_master: str = "local[2]"
    checkpoint_dir: str = ".run/checkpoints"
    shuffle_partitions: int = 4
    # Replay and `detect` group by hash(key) % shards (FACTS.md: per-group cost dominates);
    # the live job: `live_shards`.
    shards: int = 64
    # The live job's stateful tasks per micro-batch (its shuffle partitions; a checkpoint keeps
    # the number it started with). 2: the stateful stage on both cores of local[2]. Spark hands
    # a partition to whichever Python worker is free, so a shard moves between processes; the
    # one that gets it back catches its copy up from the log rows appended since (since
    # session 15; until then it reloaded the whole log and the default was 1): see
    # docs/spark-runtime.md, "Stateful partitions of the live job".
    live_partitions: int = 2
    # The live job's shards (`cep run --shards`) for a new checkpoint; a checkpoint keeps the
    # count it was started with (`jobs.live.checkpoint_shards`). However many stateful tasks,
    # every shard is a Python call per micro-batch, each with a fixed cost (state-server round
    # trips, a timer, an output frame), so the live job uses fewer shards than replay's `shards`
    # (bench/results/latency_live.md). Checkpoints from before the count was recorded: 64.
    # 6 since session 15 (8 before): the stateful tasks get the shards by Spark's hash of the
    # shard id (Murmur3, seed 42), which puts 8 shards on 2 tasks as 3 and 5 and 6 as 3 and 3.
    live_shards: int = 6
    # The live job's stateful operators for a new checkpoint (a checkpoint keeps the plan it
    # was started with: `jobs.live.checkpoint_pools`). 1: one operator over `live_partitions`
    # tasks, whose shards move between the pool's Python workers (above). P > 1 (at most one
    # per shard): the shards split over P operators at one shuffle partition, each a task per
    # batch in a Python worker pool of its own, so a shard always runs in the same process:
    # no catch-ups, no reloads, P concurrent tasks (`cep.spark.query.pooled`;
    # docs/spark-runtime.md, "One Python worker pool per stateful operator", session 27). 1 by
    # default: at 2 the job's CPU per row was higher (the driver plans two operators a batch).
    live_pools: int = 1
    # The live job's Kafka read tasks per micro-batch (Spark's `minPartitions`: a topic
    # partition's offset range is split into this many tasks of equal size; more topic
    # partitions than this: one task each). 0 (default since session 16): the session's cores
    # (`defaultParallelism`), so the map stage (read, validate, fan out, pack: one Python pass)
    # of every batch runs as one task per core with no core idle at its end: with at most
    # `live_read_task_rows` records per task (25,000, session 15) a batch of 50k-75k records
    # was three tasks on two cores, the third alone (docs/spark-runtime.md, "The live job's
    # map stage", session 16).
    live_read_tasks: int = 0
    # ... and at most this many records per read task (Spark's `maxRecordsPerPartition`; 0, the
    # default since session 16: no limit). Spark splits a range into ceil(records / this)
    # tasks, whatever the cores: an odd count leaves a core idle for the last one. A job with
    # more cores than its batches need can set it (25,000 in session 15).
    live_read_task_rows: int = 0
    # Where the live job's map stage reads Kafka: "python" (`cep.spark.kafka_source`: a Python
    # streaming source whose read tasks consume their offset ranges with confluent-kafka and run
    # the one Python pass, so the events never enter the JVM; streams, not yet a table), "spark"
    # (Spark's Kafka source, then the same pass over its rows), or "auto" (the default since
    # session 28): "python" unless the rules read a table, then "spark"; the job logs which and
    # why. A checkpoint can be continued with either (both keep Spark's offset JSON). Measured in
    # docs/spark-runtime.md, "A Python Kafka source that yields the packs (session 27, src27)"
    # and "(session 28, the lead)".
    live_source: str = "auto"
    # Kafka topics the job uses besides per-rule alert topics.
    dead_letter_topic: str = "cep.dead-letter"
    late_topic: str = "cep.late-events"
    # Extra Kafka client settings (SASL/TLS ...) passed through as `kafka.<key>` options.
    kafka_options: tuple[tuple[str, str], ...] = ()
    # Micro-batch trigger of the live job: "default" (`cep run --trigger` seconds if given, else
    # each micro-batch starts when the previous one is done: `jobs.live.live_trigger`),
    # "processingTime:500ms", or "realTime:5s" (Spark's real-time mode; Spark rejects it for
    # this job's stateful Python operator: docs/spark-runtime.md).
    trigger: str = "default"
    # Options for Spark's JVMs (driver and executors), e.g. "-XX:TieredStopAtLevel=1": the
    # quick JIT only, which roughly halves the start-up and first micro-batch of a short job
    # (tests, `cep demo`, a small replay) and the live job's CPU per micro-batch; `cep demo`
    # and `cep run` use it when this is empty (`jobs.live.live_jvm`).
    java_options: str = ""

    def with_overrides(self, values: Mapping[str, Any]) -> Settings:
        """A copy with the given fields replaced; unknown keys and bad types are errors."""
        known = {f.name: f for f in fields(self)}
        changes: dict[str, Any] = {}
        for key, raw in values.items():
            if raw is None:
                continue
            if key not in known:
                raise ConfigError(f"unknown setting {key!r}; known: {', '.join(sorted(known))}")
            changes[key] = _coerce(key, raw, getattr(self, key))
        if "trigger" in changes:
            parse_trigger(changes["trigger"])  # fail at load time, not when the query starts
        if changes.get("live_source", "spark") not in LIVE_SOURCES:
            raise ConfigError(f"setting 'live_source' must be one of {', '.join(LIVE_SOURCES)}, "
                              f"got {changes['live_source']!r}")
        return replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _coerce(key: str, raw: Any, current: Any) -> Any:
    if isinstance(current, bool):
        if isinstance(raw, bool):
            return raw
        return str(raw).lower() in {"1", "true", "yes", "on"}
    if isinstance(current, int):
        try:
            return int(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"setting {key!r} must be an integer, got {raw!r}") from None
    if isinstance(current, tuple):
        items = raw.items() if isinstance(raw, Mapping) else (
            part.split("=", 1) for part in str(raw).split(",") if part
        )
        return tuple((str(k), str(v)) for k, v in items)
    return str(raw)


LIVE_SOURCES = ("auto", "spark", "python")


_TRIGGER_KINDS = {"processingtime": "processingTime", "realtime": "realTime"}
_UNITS = {"ms": "milliseconds", "millisecond": "milliseconds", "milliseconds": "milliseconds",
          "s": "seconds", "second": "seconds", "seconds": "seconds",
          "m": "minutes", "minute": "minutes", "minutes": "minutes"}


def parse_trigger(text: str) -> dict[str, str] | None:
    """The `trigger` setting as keyword arguments of `DataStreamWriter.trigger`, or None for
    "default" (the job's own processingTime interval). "processingTime:500ms" →
    {"processingTime": "500 milliseconds"}; "realTime:5s" → {"realTime": "5 seconds"}."""
    if text.strip().lower() == "default":
        return None
    kind, sep, duration = text.partition(":")
    name = _TRIGGER_KINDS.get(kind.strip().lower())
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*", duration.lower())
    if not sep or name is None or m is None or m.group(2) not in _UNITS:
        raise ConfigError(
            f"setting 'trigger' must be 'default', 'processingTime:<duration>' or "
            f"'realTime:<duration>' (duration like 500ms, 2s, 1m), got {text!r}")
    return {name: f"{m.group(1)} {_UNITS[m.group(2)]}"}


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Defaults < TOML file < CEP_* environment < overrides (CLI flags)."""
    settings = Settings()
    path = Path(config_file) if config_file else Path("cep.toml")
    if config_file and not path.is_file():
        raise ConfigError(f"config file {path} not found")
    if path.is_file():
        with path.open("rb") as fh:
            try:
                data = tomllib.load(fh)
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"{path}: {exc}") from None
        settings = settings.with_overrides(data)
    env = os.environ if env is None else env
    from_env = {
        f.name: env[ENV_PREFIX + f.name.upper()]
        for f in fields(Settings)
        if ENV_PREFIX + f.name.upper() in env
    }
    settings = settings.with_overrides(from_env)
    return settings.with_overrides(overrides or {})


def quick_jit_unless_set(settings: Settings, options: str = QUICK_JIT) -> Settings:
    """`settings` with `java_options` = `options` (the quick JIT, and for the live job G1
    regions of 16 MB too: `jobs.live.live_jvm`) when none are set (`cep demo`, the live job;
    docs/spark-runtime.md says why)."""
    return settings if settings.java_options else replace(settings, java_options=options)
