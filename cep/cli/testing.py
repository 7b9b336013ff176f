"""`cep test PATH...` (rule test files on the embedded engine) and `cep report` (an HTML
timeline of a replay's events and alerts for one rule)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def register(subparsers: Any) -> None:
    test = subparsers.add_parser(
        "test",
        help="run rule test files (events + expected alerts) on the embedded engine",
        description="Run every case of every test file (*.yaml, *.yml) under the given paths "
        "on the embedded engine and compare the alerts with the expected ones. Exit 0 if all "
        "pass, 1 if a case fails, 2 if a test file or the rules it tests have errors, 5 if "
        "no case was run (as pytest). "
        "Format: docs/rule-testing.md.",
    )
    test.add_argument("paths", nargs="*", default=["rules"],
                      help="test files or folders (default: rules/)")
    test.add_argument("-k", dest="select", metavar="TEXT",
                      help="only cases whose name contains TEXT")
    test.add_argument("-v", "--verbose", action="store_true", help="list every case")
    test.add_argument("-q", "--quiet", action="store_true", help="print failures and errors only")
    test.add_argument("--json", action="store_true",
                      help="print one JSON document: every case with its verdict, the errors "
                      "and the counts (same exit codes)")
    test.set_defaults(func=cmd_test)

    report = subparsers.add_parser(
        "report",
        help="an HTML timeline of events and alerts per key, for one rule",
        description="Render a self-contained HTML page (PNG timelines embedded) from the "
        "alerts file of `cep replay` and the events it read: one timeline per key, matched "
        "events highlighted and joined per alert, absence deadlines marked.",
    )
    report.add_argument("--alerts", required=True, help="alerts file (JSON lines)")
    report.add_argument("--input", required=True, action="append", metavar="PATH",
                        help="events: a JSON-lines file or a folder of them (repeatable)")
    report.add_argument("--rule", required=True, help="the rule id to show")
    report.add_argument("--rules", default="rules",
                        help="rules file or folder defining the rule (default: rules/)")
    report.add_argument("--keys", type=int, default=8,
                        help="how many keys to draw: those with the most alerts (default 8)")
    report.add_argument("--key", action="append", default=[], metavar="KEY",
                        help="draw this key (repeatable; overrides --keys)")
    report.add_argument("--value", metavar="FIELD",
                        help="numeric field for the y axis of the close-ups (default: the "
                        "stream's first FLOAT field; 'none' for none)")
    report.add_argument("--png", metavar="DIR",
                        help="also write each timeline as a PNG file into DIR")
    report.add_argument("--out", default="report.html", help="HTML file (default report.html)")
    report.set_defaults(func=cmd_report)


def cmd_test(args: argparse.Namespace) -> int:
    from cep.testing import render_failure, run_suite

    suite = run_suite(args.paths, select=args.select)
    code = suite.exit_code if suite.results or suite.errors else NO_CASES
    if args.json:
        print(json.dumps(_suite_json(suite, code), indent=2, default=str))
        return code
    for err in suite.errors:
        print(err.render(), file=sys.stderr)
    for test, result in suite.results:
        if not result.passed:
            print(render_failure(test, result))
            print()
        elif args.verbose:
            print(f"ok   {test.path}:{result.case.line}: {result.case.name}")
    if args.quiet:
        return code
    if suite.uncovered and args.select is None:
        for path, rule in suite.uncovered:
            print(f"note: no case expects an alert from rule {rule!r} ({path})")
    n = len(suite.results)
    failed = len(suite.failed)
    files = len(suite.files)
    summary = (f"{n} case{'s' if n != 1 else ''} in {files} file{'s' if files != 1 else ''}: "
               f"{n - failed} passed, {failed} failed")
    if suite.errors:
        summary += f"; {len(suite.errors)} error{'s' if len(suite.errors) != 1 else ''}"
    print(summary)
    if code == NO_CASES:
        what = f"matching -k {args.select!r}" if args.select else "in " + " ".join(args.paths)
        print(f"no case {what}", file=sys.stderr)
    return code


NO_CASES = 5  # pytest's exit code when no test was collected


def _suite_json(suite: Any, code: int) -> dict[str, Any]:
    from cep.testing import render_failure

    cases = []
    for test, r in suite.results:
        cases.append({
            "file": str(test.path), "line": r.case.line, "name": r.case.name,
            "passed": r.passed, "alerts": len(r.got),
            "missing": len(r.missing), "unexpected": len(r.unexpected),
            "forbidden": len(r.forbidden),
            "failure": None if r.passed else render_failure(test, r)})
    failed = sum(1 for c in cases if not c["passed"])
    return {"exit_code": code, "files": len(suite.files), "cases": cases,
            "passed": len(cases) - failed, "failed": failed,
            "errors": [{"message": getattr(e, "message", str(e)),
                        "file": e.span.path if e.span else None,
                        "line": e.span.line if e.span else None,
                        "col": e.span.col if e.span else None, "rendered": e.render()}
                       for e in suite.errors]}


def cmd_report(args: argparse.Namespace) -> int:
    from cep.report import build_report

    path = build_report(alerts=args.alerts, inputs=args.input, rule_id=args.rule,
                        rules=args.rules, keys=args.keys, only_keys=args.key,
                        value=args.value, out=args.out, png_dir=args.png)
    print(f"wrote {path}")
    return 0
