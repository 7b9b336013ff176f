"""What the `cep` subcommands share: settings from `--config` and flags, `--verbose`."""

from __future__ import annotations

import argparse
import functools
import traceback
from collections.abc import Callable
from typing import Any

from cep.config import load_settings
from cep.errors import CepError


def settings(args: argparse.Namespace, **overrides: Any) -> Any:
    """The settings: `--config` (or ./cep.toml), CEP_* variables, then the given flags (a flag
    left out is None and overrides nothing)."""
    return load_settings(getattr(args, "config", None), overrides=overrides)


def verbose(handler: Callable[[argparse.Namespace], int],
            ) -> Callable[[argparse.Namespace], int]:
    """Errors are one line (`cep` prints a `CepError`'s message); with `--verbose` the full
    trace (with its cause: the JVM's or the client's) comes first, and Kafka clients log."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        from cep.delivery.preflight import set_verbose
        from jobs.session import set_quiet

        loud = bool(getattr(args, "verbose", False))
        set_verbose(loud)
        set_quiet(not loud)  # Spark's console output to a log file unless --verbose
        try:
            return handler(args)
        except CepError:
            if loud:
                traceback.print_exc()
            raise
    return run
