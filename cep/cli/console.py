"""`cep console`: the web console (jobs/console, docs/console.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "console", help="serve the web console (rules, live alerts, playground, searches)",
        description="Serve the web console on loopback: the rules in force, live alerts from "
        "Redis, a playground on the embedded engine, saved searches and the live job's health.")
    p.add_argument("--rules", default="rules", help="the rules directory (default: rules)")
    p.add_argument("--checkpoint", help="the live job's checkpoint directory (for its "
                   "metrics.json), or the metrics.json file itself")
    p.add_argument("--redis", help="Redis URL for live alerts (default: the settings' redis_url)")
    p.add_argument("--no-redis", action="store_true", help="no live alerts")
    p.add_argument("--searches", action="store_true",
                   help="mount the saved-search API (needs Kafka and Redis, as `cep search`)")
    p.add_argument("--inputs", action="append", metavar="PATH",
                   help="a replay input folder or file the playground may load (repeatable; "
                   "the bundled sample streams are always listed)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    p.add_argument("--port", type=int, default=8090)
    p.set_defaults(func=cmd_console)


def build_app(args: argparse.Namespace) -> Any:
    from cep.config import load_settings
    from jobs.console.app import DEFAULT_INPUTS, Console, create_console

    settings = load_settings(getattr(args, "config", None))
    metrics = None
    if args.checkpoint:
        metrics = Path(args.checkpoint)
        if metrics.is_dir():
            metrics = metrics / "metrics.json"
    redis_url = None if args.no_redis else (args.redis or settings.redis_url)
    search_app = None
    if args.searches:
        from cep.cli.search import redis_client, registry
        from percolator.api import create_app
        from percolator.store import RedisApiKeys

        search_app = create_app(registry(args), RedisApiKeys(redis_client(args)))
    inputs = [*DEFAULT_INPUTS, *(getattr(args, "inputs", None) or [])]
    return create_console(Console(args.rules, metrics=metrics, redis_url=redis_url,
                                  inputs=inputs), search_app=search_app)


def cmd_console(args: argparse.Namespace) -> int:  # pragma: no cover - runs a server
    import uvicorn

    app = build_app(args)
    print(f"cep console on http://{args.host}:{args.port}/")
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
