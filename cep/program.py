"""A compiled rule as a plain, versioned program for the native core (`cep._core`).

It sits beside `cep.nfa` and `cep.expr` (not in `cep.compile`) because the runtime exports
programs when it binds rules, and the runtime does not import the compiler.

`export_program(rule)` turns a `CompiledRule` (its `Nfa`, skip strategy, time limits, conditions
and measures) into plain data: dicts, lists, strings, numbers, booleans and None. It is JSON
serialisable (`json.dumps(program)`), carries `format`/`version` so the core can refuse a
program it does not understand, and holds no Python objects: the core never calls back into
the compiler.

Expressions become a small typed tree of instructions over a field table (`fields`; an
expression reads field `i` of an event as `["field", i]`):

    ["const", value]                    NULL, bool, int (64-bit), float, str
    ["field", i]                        field i of the current event
    ["path", i, [key, ...]]             a nested JSON field: field i, then each key in turn
                                        (NULL when a level is missing or not an object)
    ["var_row", var, "LAST"|"FIRST", row, include_current]
    ["prev", row, n, offset]
    ["agg", "SUM"|"AVG"|"COUNT"|"MIN"|"MAX", var|-1, row|None, include_current]
    ["neg", e]  ["not", e]  ["and", l, r]  ["or", l, r]  ["is_null", e, negated]
    ["arith", "+"|"-"|"*"|"/"|"%", l, r]  ["cmp", "="|"!="|"<"|"<="|">"|">=", l, r]
    ["in", e, [items], negated, all_const]
    ["str", "CONTAINS"|"STARTS WITH"|"ENDS WITH"|"MATCHES", e, arg, negated]
    ["func", "ABS"|"LOWER"|"UPPER"|"LENGTH"|"COALESCE", [args]]

`row` is an expression evaluated on another matched event (its `field`s read that event).
Semantics are those of `cep.expr` (three-valued logic, NULL on runtime type errors).

What the core cannot reproduce exactly raises `Unsupported` with the reason; the caller then
runs that rule on the Python matcher, so the core never changes an answer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from cep import expr as X
from cep.nfa import CompiledRule, Conn, Nfa, SkipStrategy, State, StateKind

FORMAT = "cep-program"
VERSION = 1
INT64 = (-(2**63), 2**63 - 1)

_CONN = {Conn.STRICT: "strict", Conn.RELAXED: "relaxed", Conn.ANY: "any"}
_FUNCS = ("ABS", "LOWER", "UPPER", "LENGTH", "COALESCE")
_STROPS = ("CONTAINS", "STARTS WITH", "ENDS WITH", "MATCHES")
# Regex syntax whose meaning is the same in RE2 (google-re2) and Rust's `regex` crate: literal
# characters, `.`, anchors, groups, alternation, repetition, bracket classes without POSIX
# names, and escapes of punctuation or of n t r f v. Left out: Perl classes (\d \w \s \b are
# ASCII in RE2, Unicode in Rust), \< and \> (word boundaries in Rust), flags, named classes.
_RE_ESCAPE_OK = set("\\.+*?()|[]{}^$-/#&~nrtfv'\"!%,:;=@")


# The fields this exporter translates, per class. A class that gains a field (a new option the
# core would silently ignore) makes every rule fall back to Python until the core learns it.
_KNOWN_FIELDS: dict[type, tuple[str, ...]] = {
    X.Const: ("value",),
    X.Field: ("name",),
    X.Path: ("name", "keys"),
    X.VarRow: ("var", "var_name", "which", "row", "include_current"),
    X.Prev: ("row", "n", "offset"),
    X.Agg: ("func", "var", "var_name", "row", "include_current"),
    X.Neg: ("operand",),
    X.Arith: ("op", "left", "right"),
    X.Compare: ("op", "left", "right"),
    X.And: ("left", "right"),
    X.Or: ("left", "right"),
    X.Not: ("operand",),
    X.IsNull: ("operand", "negated"),
    X.InList: ("operand", "items", "negated"),
    X.StrOp: ("op", "operand", "arg", "negated", "regex"),
    X.Func: ("name", "args"),
    State: ("id", "kind", "var", "conn", "next", "not_next", "not_followed", "after_first",
            "label"),
    Nfa: ("vars", "conditions", "states", "initial", "within_ms", "step_ms", "pattern"),
    SkipStrategy: ("kind", "var", "var_name"),
}


def _check_shape(obj: Any) -> None:
    cls = type(obj)
    known = _KNOWN_FIELDS.get(cls)
    if known is None:
        raise Unsupported(f"{cls.__name__} is not known to the native core")
    if tuple(f.name for f in dataclasses.fields(cls)) != known:
        raise Unsupported(f"{cls.__name__} has fields the native core does not know")


class Unsupported(Exception):  # noqa: N818 - a reason, not a failure
    """The rule uses something the native core does not reproduce exactly."""


def _regex_ok(pattern: str) -> str | None:
    """None if `pattern` means the same in RE2 and Rust's regex crate, else the reason."""
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            nxt = pattern[i + 1 : i + 2]
            if not nxt or nxt not in _RE_ESCAPE_OK:
                return f"regex escape \\{nxt} may differ between RE2 and Rust"
            i += 2
            continue
        if ch == "(" and pattern[i + 1 : i + 2] == "?" and pattern[i + 2 : i + 3] != ":":
            return "regex flags or named groups"
        if ch == "[" and pattern[i + 1 : i + 2] == ":":
            return "POSIX class in regex"
        if pattern[i : i + 2] == "[[":
            return "nested bracket class in regex"
        i += 1
    return None


class _Exporter:
    def __init__(self) -> None:
        self.fields: list[str] = []
        self.index: dict[str, int] = {}

    def field(self, name: str) -> int:
        i = self.index.get(name)
        if i is None:
            i = self.index[name] = len(self.fields)
            self.fields.append(name)
        return i

    def const(self, value: Any) -> list[Any]:
        if value is None or isinstance(value, bool | str):
            return ["const", value]
        if isinstance(value, int):
            if not INT64[0] <= value <= INT64[1]:
                raise Unsupported(f"integer literal {value} does not fit 64 bits")
            return ["const", value]
        if isinstance(value, float):
            return ["const", value]
        raise Unsupported(f"literal of type {type(value).__name__}")

    def expr(self, e: X.Expr) -> list[Any]:  # noqa: C901 - one branch per node type
        _check_shape(e)
        if isinstance(e, X.Const):
            return self.const(e.value)
        if isinstance(e, X.Field):
            return ["field", self.field(e.name)]
        if isinstance(e, X.Path):
            if not e.keys or not all(isinstance(k, str) for k in e.keys):
                raise Unsupported("nested field without keys")
            return ["path", self.field(e.name), list(e.keys)]
        if isinstance(e, X.VarRow):
            if e.which not in ("LAST", "FIRST"):
                raise Unsupported(f"navigation {e.which}")
            return ["var_row", e.var, e.which, self.expr(e.row), bool(e.include_current)]
        if isinstance(e, X.Prev):
            if e.n + e.offset < 1:
                raise Unsupported("PREV offset below 1")
            return ["prev", self.expr(e.row), e.n, e.offset]
        if isinstance(e, X.Agg):
            if e.func not in ("SUM", "AVG", "COUNT", "MIN", "MAX"):
                raise Unsupported(f"aggregate {e.func}")
            if e.row is None and e.func != "COUNT":
                raise Unsupported(f"{e.func} over whole events")
            row = self.expr(e.row) if e.row is not None else None
            var = -1 if e.var is None else e.var
            return ["agg", e.func, var, row, bool(e.include_current)]
        if isinstance(e, X.Neg):
            return ["neg", self.expr(e.operand)]
        if isinstance(e, X.Arith):
            if e.op not in ("+", "-", "*", "/", "%"):
                raise Unsupported(f"operator {e.op}")
            return ["arith", e.op, self.expr(e.left), self.expr(e.right)]
        if isinstance(e, X.Compare):
            if e.op not in ("=", "!=", "<", "<=", ">", ">="):
                raise Unsupported(f"comparison {e.op}")
            return ["cmp", e.op, self.expr(e.left), self.expr(e.right)]
        if isinstance(e, X.And):
            return ["and", self.expr(e.left), self.expr(e.right)]
        if isinstance(e, X.Or):
            return ["or", self.expr(e.left), self.expr(e.right)]
        if isinstance(e, X.Not):
            return ["not", self.expr(e.operand)]
        if isinstance(e, X.IsNull):
            return ["is_null", self.expr(e.operand), bool(e.negated)]
        if isinstance(e, X.InList):
            all_const = all(isinstance(i, X.Const) and i.value is not None for i in e.items)
            items = [self.expr(i) for i in e.items]
            return ["in", self.expr(e.operand), items, bool(e.negated), all_const]
        if isinstance(e, X.StrOp):
            if e.op not in _STROPS:
                raise Unsupported(f"string operator {e.op}")
            if e.op == "MATCHES":
                if not isinstance(e.arg, X.Const) or not isinstance(e.arg.value, str):
                    raise Unsupported("MATCHES with a pattern that is not a literal")
                if e.regex is None:
                    raise Unsupported("MATCHES without a compiled pattern")
                reason = _regex_ok(e.arg.value)
                if reason:
                    raise Unsupported(reason)
            return ["str", e.op, self.expr(e.operand), self.expr(e.arg), bool(e.negated)]
        if isinstance(e, X.Func):
            if e.name not in _FUNCS:
                raise Unsupported(f"function {e.name}")
            if e.name != "COALESCE" and len(e.args) != 1:
                raise Unsupported(f"{e.name} with {len(e.args)} arguments")
            return ["func", e.name, [self.expr(a) for a in e.args]]
        raise Unsupported(f"expression {type(e).__name__}")


def export_program(rule: CompiledRule) -> dict[str, Any]:
    """The rule as a plain program; raises `Unsupported` when the core cannot run it exactly."""
    if rule.lookups:
        tables = ", ".join(sorted({t for t, _ in rule.lookups}))
        raise Unsupported(f"reads table {tables}: the native core has no table lookups "
                          "(docs/tables.md)")
    if rule.window is not None:
        raise Unsupported("window rules (WINDOW ...) run on the Python engine "
                          "(docs/windows.md)")
    if rule.over:
        raise Unsupported("OVER window aggregates run on the Python engine (docs/windows.md)")
    nfa = rule.nfa
    _check_shape(nfa)
    _check_shape(rule.skip)
    ex = _Exporter()
    conditions = [ex.expr(c) if c is not None else None for c in nfa.conditions]
    measures = [[name, ex.expr(e)] for name, e in rule.measures]
    states = []
    for st in nfa.states:
        _check_shape(st)
        if st.conn not in _CONN:
            raise Unsupported(f"connector {st.conn}")
        states.append({
            "absence": st.kind is StateKind.ABSENCE,
            "var": st.var,
            "conn": _CONN[st.conn],
            "next": list(st.next),
            "not_next": list(st.not_next),
            "not_followed": list(st.not_followed),
            "after_first": st.after_first,
        })
    return {
        "format": FORMAT,
        "version": VERSION,
        "rule_id": rule.id,
        "rule_version": rule.version,
        "vars": list(nfa.vars),
        "key_field": rule.key_field,
        "fields": ex.fields,
        "conditions": conditions,
        "local": [c is None or c.is_local for c in nfa.conditions],
        "history_free": nfa.history_free,
        "states": states,
        "initial": list(nfa.initial),
        "within_ms": nfa.within_ms,
        "step_ms": nfa.step_ms,
        "skip": {"kind": rule.skip.kind.name, "var": rule.skip.var},
        "measures": measures,
        "emit_alert": rule.emit.alert,
        "timeout_alert": rule.on_timeout.alert if rule.on_timeout else None,
        "max_partial_matches": rule.max_partial_matches,
    }


def unsupported_reason(rule: CompiledRule) -> str | None:
    """Why the native core cannot run `rule` (None: it can)."""
    try:
        export_program(rule)
    except Unsupported as e:
        return str(e)
    return None


__all__ = ["FORMAT", "VERSION", "Unsupported", "export_program", "unsupported_reason"]
