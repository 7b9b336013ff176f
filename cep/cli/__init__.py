"""The `cep` command line: the top layer of the tree (docs/architecture.md).

This package is the only one that imports the jobs (`jobs/`), and it imports them downward,
by name, one module per area:

- `cep.cli.rules`     check, explain               (the rule language)
- `cep.cli.rules_topic` rules deploy|ls|history|rollback|disable|enable|rm  (the rules topic)
- `cep.cli.testing`   test, report                 (the embedded engine)
- `cep.cli.spark`     demo, replay, run, status, tail   (the CEP Spark jobs)
- `cep.cli.percolate` percolate                    (the percolator's Spark job)
- `cep.cli.search`    search add|ls|show|rm|test|key|serve   (the percolator)
- `cep.cli.console`   console                      (the web console)

Each module defines ``register(subparsers)`` and sets ``func=handler`` on its parsers; a
handler takes the parsed args and returns an exit code. Heavy imports (Spark, Kafka) happen
inside the handlers so that `cep check` starts fast and never needs the JVM.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from cep.cli import console, percolate, rules, rules_topic, search, spark, testing
from cep.errors import CepError

# The areas, in the order their subcommands are listed by `cep --help`.
COMMAND_MODULES = (spark, percolate, search, rules, rules_topic, testing, console)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cep",
        description="Complex-event processing and stream search on Apache Spark.",
    )
    parser.add_argument("--config", help="TOML config file (default: ./cep.toml if present)")
    parser.add_argument("--version", action="version", version=f"cep {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in COMMAND_MODULES:
        module.register(sub)
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
