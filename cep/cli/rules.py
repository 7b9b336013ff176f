"""`cep check PATH...` (lint rule files) and `cep explain FILE` (show each rule's NFA)."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from cep.colour import diagnostic
from cep.compile import check_paths, rule_files


def register(subparsers: Any) -> None:
    check = subparsers.add_parser(
        "check",
        help="check rule files and report every error",
        description="Compile every *.cep file under the given paths; print all errors with "
        "file:line:col, the source line and a hint. Exit 1 if there is any error.",
    )
    check.add_argument("paths", nargs="+", help="rule files or directories")
    check.add_argument("-q", "--quiet", action="store_true", help="print errors only")
    check.add_argument("--json", action="store_true",
                       help="print one JSON document: files, rules and every error with its "
                       "file, line and column (same exit code)")
    check.set_defaults(func=cmd_check)

    explain = subparsers.add_parser(
        "explain",
        help="print each rule's compiled NFA",
        description="Print each rule of a rules file as a state table, or as Graphviz DOT.",
    )
    explain.add_argument("file", help="a rules file, or a folder of them")
    explain.add_argument("--rule", help="only this rule id")
    explain.add_argument("--format", choices=("table", "dot"), default="table")
    explain.add_argument(
        "--svg", metavar="OUT", help="render the DOT to this SVG file (needs Graphviz's `dot`)"
    )
    explain.set_defaults(func=cmd_explain)


def cmd_check(args: argparse.Namespace) -> int:
    files = [f for f in rule_files(args.paths) if f.exists()]
    missing = [p for p in map(Path, args.paths) if not p.exists()]
    sets, errors = check_paths([p for p in args.paths if Path(p).exists()])
    rules = sum(len(rs) for rs in sets.values())
    n_errors = len(errors) + len(missing)
    code = 1 if n_errors else 0
    if args.json:
        print(json.dumps({
            "exit_code": code, "files": [str(f) for f in files], "rules": rules,
            "missing": [str(p) for p in missing],
            "errors": [{"file": e.span.path if e.span else None,
                        "line": e.span.line if e.span else None,
                        "col": e.span.col if e.span else None, "kind": e.kind,
                        "message": e.message, "hint": e.hint, "rendered": e.render()}
                       for e in errors]}, indent=2))
        return code
    for p in missing:
        print(f"{p}: error: no such file or directory", file=sys.stderr)
    for e in errors:
        print(diagnostic(e.render(), sys.stderr), file=sys.stderr)
    if not args.quiet:
        status = f"{n_errors} error{'s' if n_errors != 1 else ''}" if n_errors else "ok"
        print(
            f"checked {len(files)} file{'s' if len(files) != 1 else ''}, "
            f"{rules} rule{'s' if rules != 1 else ''}: {status}"
        )
    return code


def cmd_explain(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if not path.exists():
        print(f"{path}: error: no such file or directory", file=sys.stderr)
        return 1
    sets, errors = check_paths([path])
    if errors:
        for e in errors:
            print(diagnostic(e.render(), sys.stderr), file=sys.stderr)
        return 1
    rules = [r for rs in sets.values() for r in rs if args.rule in (None, r.id)]
    if not rules:
        print(f"{path}: error: no rule {args.rule!r}", file=sys.stderr)
        return 1
    if args.format == "table" and not args.svg:
        from cep.compile import merge_rulesets
        from cep.runtime.bind import engine_summary

        print("\n\n".join(r.explain() for r in rules))
        chosen = merge_rulesets(sets.values())
        if args.rule is not None:
            chosen = type(chosen)(tuple(r for r in chosen.rules if r.id == args.rule),
                                  chosen.streams, chosen.tables)
        # The embedded engine (run, cep test, replay): native, mixed or Python loop.
        print("\n" + "\n".join(engine_summary(chosen)))
        return 0
    dot = "\n".join(r.nfa.to_dot(r.id) for r in rules)
    if args.svg:
        exe = shutil.which("dot")
        if exe is None:
            print(
                "error: Graphviz `dot` is not installed (apt-get install graphviz)", file=sys.stderr
            )
            return 1
        # One graph per file: several rules go to OUT, OUT-2, ... in rule order.
        for i, r in enumerate(rules):
            out = (
                Path(args.svg)
                if i == 0
                else Path(args.svg).with_stem(f"{Path(args.svg).stem}-{i + 1}")
            )
            done = subprocess.run(
                [exe, "-Tsvg", "-o", str(out)], input=r.nfa.to_dot(r.id), text=True,
                capture_output=True,
            )
            if done.returncode != 0:
                why = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
                print(f"{out}: error: cannot write the SVG: {why[0]}", file=sys.stderr)
                return 1
            print(f"wrote {out}")
        if args.format == "table":
            return 0
    print(dot)
    return 0
