"""`cep` subcommands that run Spark jobs: demo, replay, run, tail."""

from __future__ import annotations

import argparse
from typing import Any

from cep.config import load_settings


def _settings(args: argparse.Namespace, **overrides: Any) -> Any:
    return load_settings(getattr(args, "config", None), overrides=overrides)


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="replay the bundled sample streams on Spark local mode")
    p.add_argument("--out", default="out/demo", help="output directory (default: out/demo)")
    p.set_defaults(func=_demo)

    p = sub.add_parser(
        "replay", help="run the rules over historical events (files or a Kafka range) on Spark",
        description="Replay history through every rule and write every alert (JSON lines, "
        "sorted). Inputs are STREAM=PATH (a file or folder of JSON lines, CSV or Parquet) or "
        "STREAM=kafka:TOPIC.")
    p.add_argument("--rules", default="rules", help="rules file or folder (default: rules/)")
    p.add_argument("--input", action="append", required=True, metavar="[STREAM=]PATH",
                   help="input; repeat for several. The stream may be left out when the rules "
                   "read only one")
    p.add_argument("--out", default="out/alerts.jsonl", help="alerts file (JSON lines)")
    p.add_argument("--from", dest="kafka_from", help="Kafka start: startingOffsets JSON or "
                   "'earliest' (default)")
    p.add_argument("--to", dest="kafka_to", help="Kafka end: endingOffsets JSON or 'latest'")
    p.add_argument("--max-files-per-trigger", type=int, help="micro-batch size, in files")
    p.add_argument("--shards", type=int, help="shards of the partition key (default 64)")
    p.add_argument("--shuffle-partitions", type=int)
    p.add_argument("--master", dest="spark_master", help="Spark master (default local[2])")
    p.add_argument("--bootstrap", dest="kafka_bootstrap", help="Kafka bootstrap servers")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_replay)


def _demo(args: argparse.Namespace) -> int:
    from jobs.demo import run_demo

    return run_demo(_settings(args), args.out)


def _replay(args: argparse.Namespace) -> int:
    from cep.spark.rules import RulesEngineFactory
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
                         show_progress=False if args.no_progress else None)
    print(summary.table())
    print(f"alerts written to {args.out}")
    return 0
