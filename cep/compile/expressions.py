"""Condition and measure expressions: syntax tree → typed, resolved `cep.expr` tree.

Resolution decides, once, what every name means: a field of the current event, a field of the
last (or first) event matched to a variable, `PREV`, or a running aggregate. Types are checked
against the stream's declared schema when there is one (`NUM`, `STR`, `BOOL`; `ANY` when the
schema does not say); a mismatch is an error pointing at the operator or operand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

import re2

from cep import ast
from cep import expr as X
from cep import nfa as N
from cep.compile.diagnostics import Diagnostics, did_you_mean

NUM, STR, BOOL, NULL, ANY = "number", "string", "boolean", "null", "any"
SCHEMA_TYPES = {
    "INT": NUM,
    "INTEGER": NUM,
    "LONG": NUM,
    "BIGINT": NUM,
    "FLOAT": NUM,
    "DOUBLE": NUM,
    "DECIMAL": NUM,
    "NUMBER": NUM,
    "STRING": STR,
    "TEXT": STR,
    "VARCHAR": STR,
    "BOOL": BOOL,
    "BOOLEAN": BOOL,
}
AGGREGATES = ("SUM", "AVG", "COUNT", "MIN", "MAX")
# Argument types of the string functions that take more than a string (CONCAT: all strings).
STRING_SIGNATURES = {
    "SUBSTR": ("string", "number", "number"),
    "REPLACE": ("string", "string", "string"),
    "SPLIT_PART": ("string", "string", "number"),
    "CONCAT": (),
}
NAVIGATION = ("PREV", "FIRST", "LAST")

# RE2 would log a rejected pattern to stderr (through absl); the error says it already.
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False


class _Bad(Exception):
    """Raised inside resolution after an error was reported, to abandon the expression."""


# A stream's declared fields: field -> NUM/STR/BOOL, or a STRUCT's own fields (a nested dict).
Schema: TypeAlias = "dict[str, str | Schema]"


MAX_OVER_MS = 366 * 86_400_000  # the longest sliding window (a year and a day)


@dataclass(frozen=True, slots=True)
class Scope:
    vars: Mapping[str, int]  # every pattern variable (positive and negated)
    schema: Schema | None  # None when undeclared
    current: str | None  # variable whose DEFINE this is (None in MEASURES)
    measure: bool = False
    # Declared tables: name -> (key column, the table's columns' types); None: none declared.
    tables: Mapping[str, tuple[str, dict[str, str]]] | None = None
    # Filled in: the (table, event field) lookups the expression makes.
    used: set[tuple[str, str]] | None = None
    # Sliding aggregates (`AVG(x) OVER 30d`) found so far in the rule, by slot (a list shared
    # by the rule's DEFINE and MEASURES); None: OVER is not allowed here.
    over: list[N.OverSpec] | None = None
    # A window rule's HAVING/MEASURES: its aggregates, by slot; bare fields are errors.
    window_aggs: list[N.AggSpec] | None = None
    # Set in a window rule's WHERE: aggregates are not allowed (this says where they go).
    no_aggs: str | None = None
    # A window rule's partition key field, in its HAVING/MEASURES: the one field a table
    # lookup may be keyed by there (the window's key; its row as of the window's last event).
    window_key: str | None = None


def _type_name(typ: object) -> str:
    return {NUM: "a number", STR: "a STRING", BOOL: "a BOOL"}.get(str(typ), str(typ))


def compatible(a: str, b: str) -> bool:
    return a == b or ANY in (a, b) or NULL in (a, b)


def resolve(node: ast.Expr, scope: Scope, diag: Diagnostics) -> tuple[X.Expr, str] | None:
    """The compiled tree and its type, or None after reporting errors."""
    try:
        return _Resolver(scope, diag).expr(node)
    except _Bad:
        return None


class _Resolver:
    def __init__(self, scope: Scope, diag: Diagnostics) -> None:
        self.scope, self.diag = scope, diag

    def fail(self, message: str, node: ast.Expr, hint: str | None = None) -> _Bad:
        self.diag.error(message, node.span, hint)
        return _Bad()

    def want(self, typ: str, expected: str, node: ast.Expr, what: str) -> None:
        if not compatible(typ, expected):
            raise self.fail(f"{what} needs a {expected}, got a {typ}", node)

    # -- names ------------------------------------------------------------------------------

    def field(
        self, name: str, node: ast.Expr, path: tuple[str, ...] = ()
    ) -> tuple[X.Expr, str]:
        """Field `name` of an event, or the nested field `name:path[0]:path[1]...`."""
        built: X.Expr = X.Path(name, path) if path else X.Field(name)
        schema = self.scope.schema
        if schema is None:
            return built, ANY
        if name not in schema:
            hint = did_you_mean(name, schema, "fields")
            if name in self.scope.vars:
                hint = f"{name} is a pattern variable; write {name}.<field>"
            raise self.fail(f"unknown field {name!r}", node, hint)
        typ = schema[name]
        where = name
        for key in path:
            if not isinstance(typ, dict):
                raise self.fail(
                    f"{where} is not a STRUCT: it has no field {key!r}",
                    node,
                    f"{where} holds {_type_name(typ)}",
                )
            if key not in typ:
                hint = did_you_mean(key, typ, f"fields of {where}")
                raise self.fail(f"unknown field {key!r} in {where}", node, hint)
            typ = typ[key]
            where = f"{where}:{key}"
        if isinstance(typ, dict):
            first = next(iter(typ), "field")
            raise self.fail(
                f"{where} is a STRUCT: read one of its fields",
                node,
                f"e.g. {where}:{first} (fields: {', '.join(typ)})",
            )
        return built, typ

    def var_index(self, name: str, node: ast.Expr) -> int:
        if name not in self.scope.vars:
            raise self.fail(
                f"unknown pattern variable {name!r}",
                node,
                did_you_mean(name, self.scope.vars, "variables"),
            )
        return self.scope.vars[name]

    def name(self, node: ast.Name) -> tuple[X.Expr, str]:
        if self.scope.window_aggs is not None:
            text = ":".join((*node.parts, *node.path))
            raise self.fail(
                f"a window rule reads aggregates of its window: {text} alone has no single value",
                node,
                f"e.g. COUNT(*), SUM({text}), MAX({text}), COUNT({text})",
            )
        if len(node.parts) == 1:
            return self.field(node.parts[0], node, node.path)
        var, fname = node.parts
        if var not in self.scope.vars:
            schema = self.scope.schema
            nested = ":".join((var, fname, *node.path))
            typo = did_you_mean(var, self.scope.vars, "variables")
            if isinstance(schema.get(var) if schema else None, dict) or (
                schema is None and not typo
            ):
                raise self.fail(
                    f"unknown pattern variable {var!r}",
                    node,
                    f"a nested JSON field is written with ':', e.g. {nested}",
                )
        index = self.var_index(var, node)
        row, typ = self.field(fname, node, node.path)
        if var == self.scope.current:
            return row, typ  # the event being tested is the last event of its own variable
        return X.VarRow(index, var, "LAST", row, False), typ

    def row_of(self, node: ast.Expr, func: str) -> tuple[str | None, X.Expr, str]:
        """The argument of FIRST/LAST/aggregates: an expression over one variable's fields."""
        seen: set[str] = set()

        def walk(n: ast.Expr) -> tuple[X.Expr, str]:
            if isinstance(n, ast.Name):
                if len(n.parts) == 2:
                    self.var_index(n.parts[0], n)
                    seen.add(n.parts[0])
                return self.field(n.parts[-1], n, n.path)
            if isinstance(n, ast.Lookup):
                if len(n.key.parts) == 2:
                    self.var_index(n.key.parts[0], n.key)
                    seen.add(n.key.parts[0])
                return self.lookup(n, row_only=True)
            if isinstance(n, ast.Call) and (n.func in AGGREGATES or n.func in NAVIGATION):
                raise self.fail(f"{n.func} cannot be nested inside {func}", n)
            return self.expr(n, walk)

        row, typ = walk(node)
        if len(seen) > 1:
            raise self.fail(
                f"{func} reads one variable; this reads {', '.join(sorted(seen))}", node
            )
        return (seen.pop() if seen else None), row, typ

    def lookup(self, node: ast.Lookup, row_only: bool = False) -> tuple[X.Expr, str]:
        """`table[field].column` / `table[v.field].column` (docs/tables.md)."""
        if self.scope.window_aggs is not None and (
                len(node.key.parts) != 1 or node.key.parts[0] != self.scope.window_key
                or node.key.path):
            key = self.scope.window_key
            raise self.fail(
                "in HAVING and MEASURES a table is read by the window's key"
                + (f" ({key})" if key else " (the rule has no PARTITION BY)"), node.key,
                f"write {node.table}[{key}].{node.column}, or read other rows in WHERE"
                if key else "read the table in WHERE (per event)")
        tables = self.scope.tables or {}
        if node.table not in tables:
            raise self.fail(
                f"unknown table {node.table!r}", node,
                did_you_mean(node.table, tables, "tables")
                or f"declare it: TABLE {node.table} (id STRING, ...) KEY id FROM FILE '...';",
            )
        key_column, columns = tables[node.table]
        if node.column not in columns:
            raise self.fail(
                f"table {node.table!r} has no column {node.column!r}", node,
                did_you_mean(node.column, columns, "columns")
                or f"its columns are {', '.join(columns)}",
            )
        parts = node.key.parts
        fname = parts[-1]
        if len(parts) == 2:
            self.var_index(parts[0], node.key)
        _, ftype = self.field(fname, node.key)
        ktype = columns[key_column]
        if not compatible(ftype, ktype):
            raise self.fail(
                f"the key of table {node.table!r} ({key_column}) is {_type_name(ktype)}; "
                f"{fname} is {_type_name(ftype)}", node.key,
                "look the table up by a field of the key's type",
            )
        if self.scope.used is not None:
            self.scope.used.add((node.table, fname))
        row: X.Expr = X.Lookup(node.table, fname, node.column)
        typ = columns[node.column]
        if row_only or len(parts) == 1 or parts[0] == self.scope.current:
            return row, typ
        var = parts[0]
        return X.VarRow(self.scope.vars[var], var, "LAST", row, False), typ

    # -- expressions ------------------------------------------------------------------------

    def expr(self, node: ast.Expr, sub: object = None) -> tuple[X.Expr, str]:  # noqa: C901
        rec = sub if callable(sub) else self.expr
        if isinstance(node, ast.Literal):
            v = node.value
            typ = (
                NULL
                if v is None
                else BOOL
                if isinstance(v, bool)
                else STR
                if isinstance(v, str)
                else NUM
            )
            return X.Const(v), typ
        if isinstance(node, ast.Name):
            return self.name(node) if rec == self.expr else rec(node)
        if isinstance(node, ast.Lookup):
            return self.lookup(node) if rec == self.expr else rec(node)
        if isinstance(node, ast.Star):
            raise self.fail("'*' is only allowed in COUNT(*) or COUNT(A.*)", node)
        if isinstance(node, ast.Call):
            return self.call(node, rec)
        if isinstance(node, ast.Unary):
            operand, typ = rec(node.operand)
            if node.op == "-":
                self.want(typ, NUM, node.operand, "unary '-'")
                if isinstance(operand, X.Const) and isinstance(operand.value, int | float):
                    return X.Const(-operand.value), NUM
                return X.Neg(operand), NUM
            self.want(typ, BOOL, node.operand, "NOT")
            return X.Not(operand), BOOL
        if isinstance(node, ast.Binary):
            left, lt = rec(node.left)
            right, rt = rec(node.right)
            if node.op in ("AND", "OR"):
                self.want(lt, BOOL, node.left, node.op)
                self.want(rt, BOOL, node.right, node.op)
                return (X.And(left, right) if node.op == "AND" else X.Or(left, right)), BOOL
            if node.op in X.ARITH:
                self.want(lt, NUM, node.left, f"'{node.op}'")
                self.want(rt, NUM, node.right, f"'{node.op}'")
                return X.Arith(node.op, left, right), NUM
            if not compatible(lt, rt):
                raise self.fail(f"cannot compare a {lt} with a {rt}", node)
            if node.op not in ("=", "!=") and BOOL in (lt, rt):
                raise self.fail(f"'{node.op}' does not order booleans", node)
            return X.Compare(node.op, left, right), BOOL
        if isinstance(node, ast.IsNull):
            operand, _ = rec(node.operand)
            return X.IsNull(operand, node.negated), BOOL
        if isinstance(node, ast.InList):
            operand, typ = rec(node.operand)
            items = []
            for item in node.items:
                value, it = rec(item)
                if not compatible(typ, it):
                    raise self.fail(f"IN list mixes a {typ} with a {it}", item)
                items.append(value)
            return X.InList(operand, tuple(items), node.negated), BOOL
        if isinstance(node, ast.Between):
            operand, typ = rec(node.operand)
            low, lt = rec(node.low)
            high, ht = rec(node.high)
            for bound, bt in ((node.low, lt), (node.high, ht)):
                if not compatible(typ, bt):
                    raise self.fail(f"cannot compare a {typ} with a {bt}", bound)
            between = X.And(X.Compare(">=", operand, low), X.Compare("<=", operand, high))
            return (X.Not(between) if node.negated else between), BOOL
        if isinstance(node, ast.StrPredicate):
            operand, typ = rec(node.operand)
            arg, at = rec(node.arg)
            self.want(typ, STR, node.operand, node.op)
            self.want(at, STR, node.arg, node.op)
            regex = None
            if node.op == "MATCHES":
                if not isinstance(arg, X.Const) or not isinstance(arg.value, str):
                    raise self.fail("MATCHES needs a literal regular expression", node.arg)
                try:
                    regex = re2.compile(arg.value, options=_RE2_OPTIONS)
                except re2.error as exc:
                    reason = exc.args[0] if exc.args else str(exc)
                    if isinstance(reason, bytes):
                        reason = reason.decode("utf-8", "replace")
                    raise self.fail(
                        f"invalid regular expression: {reason}",
                        node.arg,
                        "the syntax is RE2's (no backreferences or lookaround)",
                    ) from None
            return X.StrOp(node.op, operand, arg, node.negated, regex), BOOL
        raise self.fail(f"unsupported expression {type(node).__name__}", node)

    def event_row(self, node: ast.Expr, func: str) -> tuple[X.Expr, str]:
        """The argument of a window aggregate: an expression over one event's own fields."""

        def walk(n: ast.Expr) -> tuple[X.Expr, str]:
            if isinstance(n, ast.Name):
                if len(n.parts) == 2:
                    raise self.fail(
                        f"{func} over a window reads the key's events, not a pattern variable's",
                        n,
                        f"write {func}({':'.join((n.parts[1], *n.path))}); "
                        f"{func}({n.parts[0]}.{n.parts[1]}) without OVER is over the match",
                    )
                return self.field(n.parts[0], n, n.path)
            if isinstance(n, ast.Call) and (
                n.func in AGGREGATES or n.func in NAVIGATION or n.over is not None
            ):
                raise self.fail(f"{n.func} cannot be nested inside {func}", n)
            if isinstance(n, ast.Lookup):
                raise self.fail(
                    f"a table lookup cannot be inside {func} over a window", n,
                    f"compare outside it, e.g. {func}(amount) OVER 30d > "
                    f"{n.table}[{'.'.join(n.key.parts)}].{n.column}")
            return self.expr(n, walk)

        return walk(node)

    def window_agg(self, node: ast.Call) -> tuple[N.AggSpec, str]:
        """`COUNT(*)`, `COUNT(x)`, `SUM/AVG/MIN/MAX(x)` over a window: its spec and type."""
        func, args = node.func, node.args
        if func not in AGGREGATES:
            raise self.fail(
                f"{func} is not an aggregate: a window has COUNT, SUM, AVG, MIN and MAX", node
            )
        if len(args) != 1:
            raise self.fail(f"{func} takes one argument", node)
        (arg,) = args
        if isinstance(arg, ast.Star):
            if func != "COUNT" or arg.var is not None:
                raise self.fail("'*' is only allowed in COUNT(*)", arg)
            return N.AggSpec("COUNT", None), NUM
        row, typ = self.event_row(arg, func)
        if func != "COUNT" and not compatible(typ, NUM):
            raise self.fail(
                f"{func} over a window needs a number, got a {typ}", arg,
                "window SUM, AVG, MIN and MAX read numbers; COUNT(x) counts any value",
            )
        return N.AggSpec(func, row), NUM

    @staticmethod
    def _slot(found: list[Any], spec: Any) -> int:
        if spec in found:
            return found.index(spec)
        found.append(spec)
        return len(found) - 1

    def over_call(self, node: ast.Call) -> tuple[X.Expr, str]:
        over = node.over
        assert over is not None
        if self.scope.window_aggs is not None:
            raise self.fail(
                "OVER is for pattern rules: a window rule aggregates its own window", node,
                f"write {node.func}(...) without OVER",
            )
        if self.scope.over is None:
            raise self.fail(f"{node.func}(...) OVER is not allowed here", node,
                            self.scope.no_aggs)
        width = over.width.ms
        if not 0 < width <= MAX_OVER_MS:
            self.diag.error("an OVER window must be longer than 0 and at most 366d",
                            over.width.span)
            raise _Bad()
        agg, typ = self.window_agg(node)
        spec = N.OverSpec(agg, width, over.exclude_current)
        slot = self._slot(self.scope.over, spec)
        return X.WindowAgg(slot, str(spec)), typ

    def call(self, node: ast.Call, rec: object) -> tuple[X.Expr, str]:  # noqa: C901
        func, args = node.func, node.args
        in_define = not self.scope.measure
        if node.over is not None:
            return self.over_call(node)
        if self.scope.no_aggs is not None and (func in AGGREGATES or func in NAVIGATION):
            raise self.fail(f"{func} is not allowed in WHERE", node, self.scope.no_aggs)
        if self.scope.window_aggs is not None and func in AGGREGATES:
            spec, typ = self.window_agg(node)
            return X.WindowAgg(self._slot(self.scope.window_aggs, spec), str(spec)), typ
        if self.scope.window_aggs is not None and func in NAVIGATION:
            raise self.fail(f"{func} reads a match's events: a window rule has none", node,
                            "use MIN, MAX, COUNT, SUM or AVG over the window")
        if func == "COUNT":
            if len(args) != 1:
                raise self.fail("COUNT takes one argument: *, A, A.* or A.field", node)
            (arg,) = args
            if isinstance(arg, ast.Star) or (
                isinstance(arg, ast.Name)
                and len(arg.parts) == 1
                and not arg.path
                and arg.parts[0] in self.scope.vars
            ):
                var = arg.var if isinstance(arg, ast.Star) else arg.parts[0]
                index = self.var_index(var, arg) if var is not None else None
                current = in_define and (var is None or var == self.scope.current)
                return X.Agg("COUNT", index, var, None, current), NUM
        if func in AGGREGATES:
            if len(args) != 1:
                raise self.fail(f"{func} takes one argument", node)
            var, row, typ = self.row_of(args[0], func)
            if func in ("SUM", "AVG"):
                self.want(typ, NUM, args[0], func)
            index = self.scope.vars[var] if var is not None else None
            current = in_define and (var is None or var == self.scope.current)
            return X.Agg(func, index, var, row, current), (
                NUM if func != "MIN" and func != "MAX" else typ
            )
        if func in ("FIRST", "LAST"):
            if len(args) != 1:
                raise self.fail(f"{func} takes one argument, e.g. {func}(A.price)", node)
            var, row, typ = self.row_of(args[0], func)
            if var is None:
                raise self.fail(f"{func} needs a variable, e.g. {func}(A.price)", args[0])
            current = in_define and var == self.scope.current
            if func == "LAST" and current:
                return row, typ
            return X.VarRow(self.scope.vars[var], var, func, row, current), typ
        if func == "PREV":
            if not 1 <= len(args) <= 2:
                raise self.fail(
                    "PREV takes a field and an optional count, e.g. PREV(price, 2)", node
                )
            var, row, typ = self.row_of(args[0], func)
            if var is not None:
                raise self.fail("PREV reads the previous matched event: write PREV(field)", args[0])
            n = 1
            if len(args) == 2:
                count = args[1]
                if not (
                    isinstance(count, ast.Literal)
                    and isinstance(count.value, int)
                    and not isinstance(count.value, bool)
                    and 1 <= count.value <= 1000
                ):
                    raise self.fail("PREV's count must be an integer from 1 to 1000", count)
                n = count.value
            return X.Prev(row, n, 1 if self.scope.measure else 0), typ
        if func in X.FUNCS:
            lo, hi, _ = X.FUNCS[func]
            if not lo <= len(args) <= hi:
                raise self.fail(
                    f"{func} takes {lo if lo == hi else f'{lo} to {hi}'} argument(s)", node
                )
            resolved = [rec(a) for a in args]  # type: ignore[operator]
            types = [t for _, t in resolved]
            exprs = tuple(e for e, _ in resolved)
            if func == "ABS":
                self.want(types[0], NUM, args[0], func)
                return X.Func(func, exprs), NUM
            if func in ("LOWER", "UPPER", "LENGTH", "TRIM", "LTRIM", "RTRIM"):
                self.want(types[0], STR, args[0], func)
                return X.Func(func, exprs), (NUM if func == "LENGTH" else STR)
            if func in STRING_SIGNATURES:
                for arg, typ, expected in zip(args, types, STRING_SIGNATURES[func],
                                              strict=False):
                    self.want(typ, expected, arg, func)
                if func == "CONCAT":
                    for arg, typ in zip(args, types, strict=True):
                        self.want(typ, STR, arg, func)
                return X.Func(func, exprs), STR
            if func in X.DATE_PARTS:
                if types[0] not in (NUM, STR, ANY, NULL):
                    raise self.fail(f"{func} needs an event time (epoch milliseconds) or an "
                                    f"ISO-8601 string, got a {types[0]}", args[0])
                if len(args) == 2:
                    tz = exprs[1]
                    if not isinstance(tz, X.Const) or not isinstance(tz.value, str):
                        raise self.fail(f"{func}'s time zone must be a literal, e.g. "
                                        "'Europe/Paris'", args[1])
                    try:
                        X.zone(tz.value)
                    except ValueError as exc:
                        raise self.fail(str(exc), args[1],
                                        "an IANA zone name such as 'UTC' or "
                                        "'America/New_York'") from None
                return X.Func(func, exprs), NUM
            known = [t for t in types if t not in (ANY, NULL)]
            if any(t != known[0] for t in known):
                raise self.fail("COALESCE mixes types: " + ", ".join(types), node)
            return X.Func(func, exprs), (known[0] if known else ANY)
        choices = (*AGGREGATES, *NAVIGATION, *X.FUNCS)
        raise self.fail(f"unknown function {func}", node, did_you_mean(func, choices, "functions"))
