"""`cep demo`, `cep replay`, `cep run`, `cep status`, `cep tail`: the CEP jobs (jobs/)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cep.cli.common import settings as _settings
from cep.cli.common import verbose
from cep.errors import CepError


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="replay the bundled sample streams through the bundled rules")
    p.add_argument("--out", default="out/demo", help="output directory (default: out/demo)")
    p.add_argument("--verbose", action="store_true",
                   help="Spark's own console output too (by default it goes to a log file)")
    p.set_defaults(func=verbose(_demo))

    p = sub.add_parser(
        "replay", help="run the rules over historical events (files or a Kafka range) on Spark",
        description="Replay history through every rule and write every alert (JSON lines, "
        "sorted). Inputs are STREAM=PATH (a file or folder of JSON lines, CSV or Parquet) or "
        "STREAM=kafka:TOPIC. Several streams in one replay share one watermark, as in the live "
        "job: give them together only when they cover the same span of time; otherwise replay "
        "them one by one.")
    p.add_argument("--rules", default="rules", help="rules file or folder (default: rules/)")
    p.add_argument("--input", action="append", required=True, metavar="[STREAM=]PATH",
                   help="input; repeat for several. The stream may be left out when the rules "
                   "read only one")
    p.add_argument("--out", default="out/alerts.jsonl", help="alerts file (JSON lines)")
    p.add_argument("--from", dest="kafka_from", help="Kafka start: startingOffsets JSON or "
                   "'earliest' (default)")
    p.add_argument("--to", dest="kafka_to", help="Kafka end: endingOffsets JSON or 'latest'")
    p.add_argument("--max-files-per-trigger", type=int,
                   help="ignored: replay is one batch job (kept so that scripts keep working)")
    p.add_argument("--shards", type=int, help="shards of the partition key (default 64)")
    p.add_argument("--shuffle-partitions", type=int)
    p.add_argument("--master", dest="spark_master", help="Spark master (default local[2])")
    p.add_argument("--bootstrap", dest="kafka_bootstrap", help="Kafka bootstrap servers")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--json", action="store_true",
                   help="print the summary as one JSON document (no progress bar)")
    p.add_argument("--verbose", action="store_true", help="full traces and client logs on error")
    p.set_defaults(func=verbose(_replay))

    p = sub.add_parser("run", help="the live job: Kafka in, alerts to Kafka and Redis",
                       description="Run every rule of a rules directory over Kafka topics, "
                       "continuously. Rules may be added, changed, disabled and removed while it "
                       "runs. Metrics: CHECKPOINT/metrics.json and metrics.prom.")
    p.add_argument("--rules", default="rules", help="rules directory (default: rules/), or "
                   "kafka:TOPIC to follow a rules topic (`cep rules deploy`)")
    p.add_argument("--bootstrap", dest="kafka_bootstrap", help="Kafka bootstrap servers")
    p.add_argument("--redis", dest="redis_url", help="Redis URL")
    p.add_argument("--checkpoint", dest="checkpoint_dir", help="checkpoint directory")
    p.add_argument("--topic", action="append", default=[], metavar="STREAM=TOPIC",
                   help="the topic a stream is read from (default: the stream's name)")
    p.add_argument("--trigger", type=float, help="seconds between micro-batch starts (default: "
                   "each starts when the previous one is done)")
    p.add_argument("--max-offsets-per-trigger", type=int)
    p.add_argument("--starting-offsets", default="earliest")
    p.add_argument("--once", action="store_true",
                   help="process what is in the topics now, then stop")
    p.add_argument("--max-seconds", type=float, help="stop after this long")
    p.add_argument("--shards", type=int, help="shards of the partition key for a new "
                   "checkpoint (default 6); a checkpoint keeps the count it started with")
    p.add_argument("--master", dest="spark_master")
    p.add_argument("--verbose", action="store_true", help="full traces and client logs on error")
    p.set_defaults(func=verbose(_run))

    p = sub.add_parser("status", help="a running (or stopped) `cep run`: its rules files, "
                       "accepted or rejected with their errors, and its counts",
                       description="Reads CHECKPOINT/metrics.json, which `cep run` rewrites "
                       "after every micro-batch and every rules change. Exit 1 when a rules "
                       "file is rejected.")
    p.add_argument("--checkpoint", dest="checkpoint_dir", help="checkpoint directory")
    p.set_defaults(func=_status)

    p = sub.add_parser("tail", help="print live alerts from a Kafka topic or Redis")
    p.add_argument("topic", nargs="?", help="alert topic, e.g. alerts.card_testing")
    p.add_argument("--bootstrap", dest="kafka_bootstrap")
    p.add_argument("--redis", metavar="CHANNEL", help="subscribe to a Redis pub/sub channel "
                   "(e.g. cep:alerts:card_testing) instead of Kafka")
    p.add_argument("--redis-url")
    p.add_argument("--from-beginning", action="store_true")
    p.add_argument("--max", type=int, help="stop after N alerts")
    p.add_argument("--timeout", type=float, help="stop after N seconds without an alert")
    p.add_argument("--json", action="store_true", help="print raw JSON")
    p.set_defaults(func=_tail)


def _demo(args: argparse.Namespace) -> int:
    from cep.cli.demo import run_demo

    return run_demo(_settings(args), args.out)


def _replay(args: argparse.Namespace) -> int:
    from cep.engines import RulesEngineFactory
    from jobs.replay import parse_input, run_replay

    settings = _settings(args, shards=args.shards, shuffle_partitions=args.shuffle_partitions,
                         spark_master=args.spark_master, kafka_bootstrap=args.kafka_bootstrap)
    streams = sorted({r.stream.name for r in RulesEngineFactory.from_path(args.rules)
                      .ruleset().rules if r.enabled})
    default = streams[0] if len(streams) == 1 else None
    inputs = [parse_input(text, default) for text in args.input]
    summary = run_replay(settings, args.rules, inputs, args.out,
                         max_files_per_trigger=args.max_files_per_trigger,
                         kafka_from=args.kafka_from, kafka_to=args.kafka_to,
                         show_progress=False if (args.no_progress or args.json) else None)
    if args.json:
        print(json.dumps(summary.to_json(), indent=2))
        return 0 if summary.balanced else 1
    print(summary.table())
    print(f"alerts written to {args.out}")
    if not summary.balanced:  # a record neither processed nor a dead letter: a bug, say so
        print("error: the counts do not balance (read != processed + dead letters)",
              file=sys.stderr)
        return 1
    return 0


def _run(args: argparse.Namespace) -> int:
    import logging

    from jobs.live import LiveJob, LiveOptions

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = _settings(args, kafka_bootstrap=args.kafka_bootstrap, redis_url=args.redis_url,
                         checkpoint_dir=args.checkpoint_dir, live_shards=args.shards,
                         spark_master=args.spark_master)
    from cep.spark.kafka import check_topic

    topics = dict(t.split("=", 1) for t in args.topic)
    for stream, topic in topics.items():
        check_topic(topic, f"--topic {stream}={topic}")
    opts = LiveOptions(rules=args.rules, checkpoint=settings.checkpoint_dir, topics=topics,
                       trigger_seconds=args.trigger, once=args.once,
                       max_offsets_per_trigger=args.max_offsets_per_trigger,
                       starting_offsets=args.starting_offsets)
    return LiveJob(settings, opts).run(max_seconds=args.max_seconds)


def _status(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    settings = _settings(args, checkpoint_dir=args.checkpoint_dir)
    path = Path(settings.checkpoint_dir) / "metrics.json"
    try:
        snap = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CepError(f"no metrics at {path} ({exc}): is this the checkpoint of a `cep run`?"
                       ) from exc
    files = snap.get("rules_files") or {}
    for name, f in sorted(files.items()):
        running = {"current": "", "previous": " (its previous version runs)",
                   "none": " (none of it runs)"}.get(str(f.get("running")), "")
        print(f"{f.get('status', '?'):<9} {name}{running}")
        for err in f.get("errors") or []:
            print(f"          {err}")
    print(f"rules running: {', '.join(sorted(snap.get('rules') or {})) or 'none'}")
    c = snap.get("counters") or {}
    read, done, dead = c.get("events_read", 0), c.get("events", 0), c.get("dead_letters", 0)
    print(f"events read {read} = processed {done} + dead letters {dead}"
          f"{'' if read == done + dead else ' (not balanced yet: a query is behind)'}; "
          f"late {c.get('late', 0)}, alerts {c.get('alerts', 0)}")
    return 1 if any(f.get("status") != "accepted" for f in files.values()) else 0


def _tail(args: argparse.Namespace) -> int:
    from jobs.tail import tail

    settings = _settings(args, kafka_bootstrap=args.kafka_bootstrap, redis_url=args.redis_url)
    return tail(settings, args.topic, redis_channel=args.redis, from_beginning=args.from_beginning,
                max_alerts=args.max, timeout=args.timeout, raw=args.json)
