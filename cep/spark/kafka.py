"""The one Kafka reader of the Spark jobs (`cep replay` from a topic range, `cep run`,
`cep percolate`): the source options every job sets the same way, from the settings."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cep.config import Settings
from cep.delivery.preflight import TOPIC_NAME_RULE, is_topic_name
from cep.errors import CepError


def check_topic(topic: str, what: str = "") -> str:
    """`topic` if Kafka allows it as a topic name (`is_topic_name`); else a `CepError` naming it
    (and `what`, e.g. its stream)."""
    if is_topic_name(topic):
        return topic
    of = f" ({what})" if what else ""
    raise CepError(f"not a Kafka topic name: {topic!r}{of}; {TOPIC_NAME_RULE}")


def kafka_reader(reader: Any, settings: Settings, topics: Iterable[str], *, starting: str,
                 ending: str | None = None, fail_on_data_loss: bool | None = None,
                 max_offsets_per_trigger: int | None = None,
                 min_partitions: int | None = None) -> Any:
    """`reader` (`spark.read` or `spark.readStream`) set up for Kafka: the settings' bootstrap
    servers and client options (`kafka.*`), the topics, the start (and, for a batch read, the
    end) offsets and the optional limits. Returns the reader; `.load()` gives key, value,
    topic, partition, offset, … as Spark's Kafka source does. A topic that is not a Kafka
    topic name fails (`check_topic`): the source would split a name with a comma in two."""
    names = [check_topic(t) for t in sorted(set(topics))]
    r = (reader.format("kafka")
         .option("kafka.bootstrap.servers", settings.kafka_bootstrap)
         .option("subscribe", ",".join(names))
         .option("startingOffsets", starting))
    if ending is not None:
        r = r.option("endingOffsets", ending)
    if fail_on_data_loss is not None:
        r = r.option("failOnDataLoss", "true" if fail_on_data_loss else "false")
    if max_offsets_per_trigger:
        r = r.option("maxOffsetsPerTrigger", max_offsets_per_trigger)
    if min_partitions:
        r = r.option("minPartitions", min_partitions)
    for k, v in settings.kafka_options:
        r = r.option(f"kafka.{k}", v)
    return r
