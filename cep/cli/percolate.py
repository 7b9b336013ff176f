"""`cep percolate`: the percolator's streaming job (jobs/percolate.py)."""

from __future__ import annotations

import argparse
from typing import Any

from cep.cli.common import settings as _settings
from cep.cli.common import verbose


def register(sub: Any) -> None:
    p = sub.add_parser(
        "percolate", help="match every event from Kafka against the saved searches",
        description="Read events (JSON objects) from Kafka topics, match each micro-batch "
        "against every saved search and send notifications to Kafka and Redis, effectively "
        "once. Searches added, changed or removed through the registry take effect at the next "
        "micro-batch. Metrics: CHECKPOINT/metrics.json and metrics.prom.")
    p.add_argument("--bootstrap", dest="kafka_bootstrap", help="Kafka bootstrap servers")
    p.add_argument("--redis", dest="redis_url", help="Redis URL")
    p.add_argument("--checkpoint", dest="checkpoint_dir", help="checkpoint directory "
                   "(default: <checkpoint_dir setting>/percolate)")
    p.add_argument("--topic", action="append", required=True, metavar="TOPIC",
                   help="a topic to read events from; repeat for several")
    p.add_argument("--schema", metavar="FILE", help="field types (YAML, see docs/percolator.md)")
    p.add_argument("--changelog-topic", help="the saved-search changelog "
                   "(default: cep.percolator.searches)")
    p.add_argument("--notification-topic", help="where every notification goes "
                   "(default: notifications)")
    p.add_argument("--dead-letter-topic", help="where malformed events go "
                   "(default: the dead_letter_topic setting)")
    p.add_argument("--trigger", type=float, default=1.0, help="seconds between micro-batches")
    p.add_argument("--max-offsets-per-trigger", type=int, metavar="N")
    p.add_argument("--min-partitions", type=int, metavar="N",
                   help="split the input into at least N tasks per micro-batch")
    p.add_argument("--starting-offsets", default="earliest")
    p.add_argument("--once", action="store_true",
                   help="process what is in the topics now, then stop")
    p.add_argument("--max-seconds", type=float, help="stop after this long")
    p.add_argument("--master", dest="spark_master")
    p.add_argument("--verbose", action="store_true", help="full traces and client logs on error")
    p.set_defaults(func=verbose(_percolate))


def _percolate(args: argparse.Namespace) -> int:
    import logging
    from pathlib import Path

    from jobs.percolate import DEFAULT_NOTIFICATION_TOPIC, PercolateJob, PercolateOptions
    from percolator.analysis import Schema
    from percolator.changelog import DEFAULT_TOPIC

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = _settings(args, kafka_bootstrap=args.kafka_bootstrap, redis_url=args.redis_url,
                         spark_master=args.spark_master, dead_letter_topic=args.dead_letter_topic)
    checkpoint = args.checkpoint_dir or str(Path(settings.checkpoint_dir) / "percolate")
    opts = PercolateOptions(
        checkpoint=checkpoint, topics=tuple(args.topic),
        changelog_topic=args.changelog_topic or DEFAULT_TOPIC,
        notification_topic=args.notification_topic or DEFAULT_NOTIFICATION_TOPIC,
        schema=Schema.load(args.schema) if args.schema else Schema(),
        trigger_seconds=args.trigger, once=args.once,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        min_partitions=args.min_partitions, starting_offsets=args.starting_offsets)
    return PercolateJob(settings, opts).run(max_seconds=args.max_seconds, stop_session=True)
