"""The `cep` command line.

Each area of the project registers its own subcommands through a module with a
``register(subparsers)`` function; heavy imports (Spark, Kafka) happen inside the command
handlers so that `cep check` starts fast and never needs the JVM.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from cep.errors import CepError

# Modules that add subcommands. Each defines `register(subparsers) -> None` and sets
# `func=handler` on its parsers; a handler takes the parsed args and returns an exit code.
COMMAND_MODULES: tuple[str, ...] = (
    "jobs.cli",
    "jobs.cli_percolate",
    "percolator.cli",
    "cep.cli_rules",
    "cep.cli_test",
    "jobs.cli_console",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cep",
        description="Complex-event processing and stream search on Apache Spark.",
    )
    parser.add_argument("--config", help="TOML config file (default: ./cep.toml if present)")
    parser.add_argument("--version", action="version", version=f"cep {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sparkcep")
    except PackageNotFoundError:  # run from a source tree without installing
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except CepError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `cep ... | head`: the reader left; nothing to report
        sys.stderr.close()
        return 141
    return code


if __name__ == "__main__":
    sys.exit(main())
