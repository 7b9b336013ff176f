"""`cep rules deploy|ls|history|rollback|disable|enable`: rules in a compacted Kafka topic
(docs/rules-topic.md), which `cep run --rules kafka:TOPIC` follows.

    cep rules deploy rules/ --bootstrap HOST:9092     # check (as `cep check`), then publish
    cep rules ls [--json]                             # each rule's version in force, enabled
    cep rules history velocity [--json]               # its versions and who did what, when
    cep rules rollback velocity 1                     # version 1's text in force again
    cep rules disable velocity / cep rules enable velocity
    cep rules rm velocity                             # out of the topic; its history stays

`--topic` defaults to `cep.rules`; `--bootstrap` to the configuration (CEP_KAFKA_BOOTSTRAP).
A file that fails the checks is never published: nothing of that deploy is (exit 1, the errors
with file:line:col on stderr as `cep check` prints them).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from cep.cli.common import settings as _settings
from cep.colour import diagnostic

DEFAULT_TOPIC = "cep.rules"


def register(sub: Any) -> None:
    p = sub.add_parser("rules", help="rules in a compacted Kafka topic: deploy, ls, history, "
                       "rollback, disable, enable, rm (`cep run --rules kafka:TOPIC` follows it)")
    rs = p.add_subparsers(dest="rules_command", metavar="ACTION")
    rs.required = True

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--bootstrap", dest="kafka_bootstrap",
                       help="Kafka bootstrap servers (default: CEP_KAFKA_BOOTSTRAP)")
        q.add_argument("--topic", default=DEFAULT_TOPIC,
                       help=f"the rules topic (default: {DEFAULT_TOPIC})")

    d = rs.add_parser("deploy", help="check rule files and publish each changed rule",
                      description="Check every *.cep file under the paths as `cep check` does; "
                      "if any has an error, print them all and publish nothing (exit 1). Else "
                      "publish a new version of each rule whose compiled form or stream changed "
                      "(text, version number, content hash, who, when), in one transaction. "
                      "The topic is created (compacted) if missing.")
    d.add_argument("paths", nargs="+", help="rule files or directories")
    d.add_argument("--json", action="store_true", help="print one JSON document")
    common(d)
    d.set_defaults(func=_deploy)

    ls = rs.add_parser("ls", help="the rules in the topic: version in force, enabled")
    ls.add_argument("--json", action="store_true")
    common(ls)
    ls.set_defaults(func=_ls)

    h = rs.add_parser("history", help="a rule's versions and actions (who, when)")
    h.add_argument("rule")
    h.add_argument("--json", action="store_true")
    common(h)
    h.set_defaults(func=_history)

    r = rs.add_parser("rollback", help="put an earlier version of a rule back in force")
    r.add_argument("rule")
    r.add_argument("version", type=int)
    common(r)
    r.set_defaults(func=_rollback)

    rm = rs.add_parser("rm", help="take a rule out of the topic (its history stays)")
    rm.add_argument("rule")
    common(rm)
    rm.set_defaults(func=_rm)

    for name, on in (("disable", False), ("enable", True)):
        q = rs.add_parser(name, help=f"{name} a rule (its version in force is kept)")
        q.add_argument("rule")
        common(q)
        q.set_defaults(func=_switch, enabled=on)


def _topic(args: argparse.Namespace) -> Any:
    from cep.rules_topic import RulesTopic

    s = _settings(args, kafka_bootstrap=args.kafka_bootstrap)
    return RulesTopic(s.kafka_bootstrap, args.topic, dict(s.kafka_options))


def _who(rec: dict[str, Any] | None) -> str:
    rec = rec or {}
    return f"{rec.get('user', '?')}@{rec.get('host', '?')}"


def _when(ms: Any) -> str:
    if ms is None:
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(int(ms) / 1000)) + "Z"


def _deploy(args: argparse.Namespace) -> int:
    from cep.rules_topic import DeployRejected

    topic = _topic(args)
    try:
        report = topic.deploy(args.paths)
    except DeployRejected as exc:
        if args.json:
            print(json.dumps({"exit_code": 1, "published": [], "errors": [
                {"file": e.span.path if e.span else None, "line": e.span.line if e.span else None,
                 "col": e.span.col if e.span else None, "message": e.message,
                 "rendered": e.render()} for e in exc.errors]}, indent=2))
            return 1
        for e in exc.errors:
            print(diagnostic(e.render(), sys.stderr), file=sys.stderr)
        print(f"{len(exc.errors)} error{'s' if len(exc.errors) != 1 else ''}: nothing "
              f"published to {args.topic}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"exit_code": 0, "topic": args.topic, "published": report}, indent=2))
        return 0
    for row in report:
        off = "" if row["enabled"] else " (disabled: `cep rules enable` to run it)"
        print(f"{row['status']:<9} {row['rule']} v{row['version']}  {row['file']}{off}")
    changed = sum(r["status"] != "unchanged" for r in report)
    print(f"{changed} of {len(report)} rule{'s' if len(report) != 1 else ''} published to "
          f"{args.topic}")
    return 0


def _ls(args: argparse.Namespace) -> int:
    from cep.rules_topic import listing

    rows = listing(_topic(args).state())
    if args.json:
        print(json.dumps({"topic": args.topic, "rules": rows}, indent=2))
        return 0
    if not rows:
        print(f"no rules in {args.topic}")
        return 0
    print(f"{'RULE':<24} {'VERSION':>7}  {'STATE':<8} {'LAST':<9} {'BY':<24} WHEN")
    for r in rows:
        print(f"{r['rule']:<24} {r['version']:>7}  {'enabled' if r['enabled'] else 'disabled':<8}"
              f" {r['action'] or '':<9} {_who(r['by']):<24} {_when(r['at'])}")
    return 0


def _history(args: argparse.Namespace) -> int:
    from cep.rules_topic import RulesTopicError, history

    h = history(_topic(args).state(), args.rule)
    if h["current"] is None and not h["versions"]:
        raise RulesTopicError(f"no rule {args.rule!r} in {args.topic}")
    if args.json:
        print(json.dumps({"topic": args.topic, **h}, indent=2))
        return 0
    cur = h["current"]
    print(f"{args.rule}: version {cur['version']} in force, "
          f"{'enabled' if cur['enabled'] else 'disabled'}" if cur else f"{args.rule}: removed")
    print("versions:")
    for v in h["versions"]:
        mark = "*" if cur and v["version"] == cur["version"] else " "
        print(f" {mark} v{v['version']:<4} {v['content_hash']}  {v['file']}  "
              f"{_who(v['deployed_by'])}  {_when(v['deployed_at'])}")
    print("actions:")
    for e in h["events"]:
        print(f"   {e['seq']:>4} {e['action']:<9} v{e['version']:<4} {_who(e['by'])}  "
              f"{_when(e['at'])}")
    return 0


def _rollback(args: argparse.Namespace) -> int:
    res = _topic(args).rollback(args.rule, args.version)
    print(f"{args.rule}: version {res['version']} in force"
          + (" (it already was)" if res["status"] == "unchanged" else ""))
    return 0


def _switch(args: argparse.Namespace) -> int:
    res = _topic(args).set_enabled(args.rule, args.enabled)
    state = "enabled" if res["enabled"] else "disabled"
    print(f"{args.rule}: {state}" + (" (it already was)" if res["status"] == "unchanged" else ""))
    return 0


def _rm(args: argparse.Namespace) -> int:
    res = _topic(args).remove(args.rule)
    print(f"{args.rule}: removed (version {res['version']} was in force; "
          "`cep rules history` keeps its versions)")
    return 0
