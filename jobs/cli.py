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


def _demo(args: argparse.Namespace) -> int:
    from jobs.demo import run_demo

    return run_demo(_settings(args), args.out)
