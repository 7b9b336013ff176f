"""The readable diff of a failed case: what was expected (`-`), what was raised (`+`), and
field by field how the closest alert differs. Alerts are printed in the test-file syntax, so a
raised alert can be pasted into `expect:`."""

from __future__ import annotations

import re
from typing import Any

from cep.testing.runner import CaseResult, GotAlert, Mismatch
from cep.testing.spec import ExpectedAlert, TestFile
from cep.testing.times import format_time

_PLAIN = re.compile(r"^[A-Za-z_][\w.\-]*$")
_TIME_FIELDS = {"first", "last"}


def value(v: Any) -> str:
    """A value as YAML flow syntax."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        if _PLAIN.match(v) and v.lower() not in {"true", "false", "null", "yes", "no", "on",
                                                   "off"}:
            return v
        return "'" + v.replace("'", "''") + "'"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {value(x)}" for k, x in v.items()) + "}"
    return value(str(v))


def expected_text(e: ExpectedAlert, base: int) -> str:
    parts = [f"rule: {value(e.rule)}"]
    if e.key is not None:
        parts.append(f"key: {value(e.key)}")
    if e.kind != "match":
        parts.append(f"kind: {e.kind}")
    if e.alert is not None:
        parts.append(f"alert: {value(e.alert)}")
    if e.first_ts is not None:
        parts.append(f"first: {format_time(e.first_ts, base)}")
    if e.last_ts is not None:
        parts.append(f"last: {format_time(e.last_ts, base)}")
    if e.events is not None:
        parts.append(f"events: {value(e.events)}")
    if e.vars is not None:
        parts.append(f"events: {value(dict(e.vars))}")
    if e.measures:
        parts.append(f"measures: {value(dict(e.measures))}")
    return "{" + ", ".join(parts) + "}"


def got_text(g: GotAlert, base: int, *, by_var: bool = False) -> str:
    parts = [f"rule: {value(g.rule)}", f"key: {value(g.key)}"]
    if g.kind != "match":
        parts.append(f"kind: {g.kind}")
    parts.append(f"first: {format_time(g.first_ts, base)}")
    parts.append(f"last: {format_time(g.last_ts, base)}")
    parts.append(f"events: {value(dict(g.vars) if by_var else g.events)}")
    if g.measures:
        parts.append(f"measures: {value(dict(g.measures))}")
    return "{" + ", ".join(parts) + "}"


def mismatch_text(m: Mismatch, base: int) -> str:
    if m.field in _TIME_FIELDS:
        want = format_time(m.expected, base)
        have = format_time(m.got, base)
        return f"{m.field}: expected {want}, got {have} ({_delta(m.got - m.expected)})"
    return f"{m.field}: expected {value(m.expected)}, got {value(m.got)}"


def _delta(ms: int) -> str:
    sign = "+" if ms >= 0 else "-"
    return f"{sign}{format_time(abs(ms), 0)[1:]} off"


def case_header(test: TestFile, result: CaseResult, status: str) -> str:
    return f"{status} {test.path}:{result.case.line}: {result.case.name}"


def render_failure(test: TestFile, result: CaseResult) -> str:
    case = result.case
    base = case.base_ms
    lines = [case_header(test, result, "FAIL")]
    for e, closest, diffs in result.missing:
        if closest is None:
            who = f"{e.rule} alert" + (f" for key {e.key}" if e.key is not None else "")
            lines.append(f"  expected alert (line {e.line}) not raised: no {who}")
            lines.append(f"    - {expected_text(e, base)}")
            continue
        lines.append(f"  expected alert (line {e.line}) not raised; the closest alert differs:")
        lines.append(f"    - {expected_text(e, base)}")
        lines.append(f"    + {got_text(closest, base, by_var=e.vars is not None)}")
        for m in diffs:
            lines.append(f"        {mismatch_text(m, base)}")
    for g in result.unexpected:
        lines.append("  unexpected alert (no expectation covers it):")
        lines.append(f"    + {got_text(g, base)}")
    for g in result.forbidden:
        lines.append(f"  alert of {g.rule}, which `expect_none` says must not alert:")
        lines.append(f"    + {got_text(g, base)}")
    for i, reason in result.dead_unexpected:
        lines.append(f"  event {i} (line {case.events[i].line}) is a dead letter: {reason}")
        lines.append("    (list it under `dead_letters:` if rejecting it is what the case tests)")
    for i in result.dead_missing:
        lines.append(f"  event {i} (line {case.events[i].line}) is valid, but `dead_letters:` "
                     "expects it rejected")
    scope = ", ".join(case.scope)
    if result.got:
        lines.append(f"  all {len(result.got)} alert(s) raised by {scope}, in time order:")
        lines.extend(f"    {i + 1}. {got_text(g, base)}" for i, g in enumerate(result.got))
    else:
        lines.append(f"  no alert was raised by {scope}")
    return "\n".join(lines)
