"""Checked syntax tree → `CompiledRule`s: clause checks, streams, DEFINE/MEASURES, skip, NFA."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from cep import ast
from cep import nfa as N
from cep.compile.diagnostics import Diagnostics, did_you_mean
from cep.compile.expressions import ANY, BOOL, SCHEMA_TYPES, Scope, resolve
from cep.compile.nfa_build import MAX_STATES, TooManyStates, build_nfa
from cep.compile.patterns import check_pattern
from cep.expr import Expr

SINGLE = (
    "VERSION",
    "DESCRIPTION",
    "TAGS",
    "SEVERITY",
    "FROM",
    "PARTITION BY",
    "PATTERN",
    "DEFINE",
    "WITHIN",
    "STEP WITHIN",
    "MEASURES",
    "EMIT",
    "ON TIMEOUT EMIT",
    "ALLOW UNBOUNDED",
    "MAX PARTIAL MATCHES",
)


def compile_streams(
    streams: tuple[ast.StreamDecl, ...], diag: Diagnostics
) -> dict[str, tuple[N.StreamSpec, dict[str, str] | None]]:
    out: dict[str, tuple[N.StreamSpec, dict[str, str] | None]] = {}
    for s in streams:
        if s.name in out:
            diag.error(f"stream {s.name!r} is declared twice", s.span)
            continue
        schema: dict[str, str] | None = None
        fields: tuple[N.FieldSpec, ...] | None = None
        if s.fields is not None:
            schema, specs, names = {}, [], set()
            for f in s.fields:
                if f.name in names:
                    diag.error(f"field {f.name!r} is declared twice", f.span)
                names.add(f.name)
                if f.type not in SCHEMA_TYPES:
                    diag.error(
                        f"unknown type {f.type}", f.span, "types are STRING, INT, FLOAT and BOOL"
                    )
                    continue
                schema[f.name] = SCHEMA_TYPES[f.type]
                canonical = {"number": "FLOAT", "string": "STRING", "boolean": "BOOL"}[
                    SCHEMA_TYPES[f.type]
                ]
                if f.type in ("INT", "INTEGER", "LONG", "BIGINT"):
                    canonical = "INT"
                specs.append(N.FieldSpec(f.name, canonical))
            fields = tuple(specs)
            if s.time_field not in schema:
                diag.error(
                    f"time field {s.time_field!r} is not a field of stream {s.name!r}",
                    s.span,
                    did_you_mean(s.time_field, schema, "fields"),
                )
            elif schema[s.time_field] != "number":
                diag.error(f"time field {s.time_field!r} must be INT (epoch milliseconds)", s.span)
        lateness = s.lateness.ms if s.lateness else 0
        out[s.name] = (N.StreamSpec(s.name, s.time_field, lateness, fields), schema)
    return out


def compile_rule(
    rule: ast.RuleDecl,
    streams: Mapping[str, tuple[N.StreamSpec, dict[str, str] | None]],
    diag: Diagnostics,
) -> N.CompiledRule | None:
    before = len(diag.errors)
    clauses: dict[str, ast.Clause] = {}
    seen: dict[str, list[ast.Clause]] = defaultdict(list)
    for c in rule.clauses:
        key = (
            "SKIP"
            if c.name in ("AFTER MATCH SKIP", "ALL MATCHES")
            else "ENABLED"
            if c.name in ("ENABLED", "DISABLED")
            else c.name
        )
        seen[key].append(c)
        if len(seen[key]) > 1:
            diag.error(
                f"{c.name} is given more than once in rule {rule.id!r}",
                c.span,
                f"the first one is at line {seen[key][0].span.line}",
            )
        else:
            clauses[key] = c

    def value(name: str, default: object = None) -> object:
        return clauses[name].value if name in clauses else default

    for required in ("FROM", "PATTERN", "EMIT"):
        if required not in clauses:
            example = {
                "FROM": "FROM transactions",
                "PATTERN": "PATTERN (a b)",
                "EMIT": "EMIT 'alert-name' TO KAFKA 'alerts'",
            }[required]
            diag.error(f"rule {rule.id!r} has no {required} clause", rule.span, f"add {example}")
    if "FROM" not in clauses or "PATTERN" not in clauses:
        return None

    from_value = value("FROM")
    assert isinstance(from_value, tuple)
    stream_name: str = from_value[0]
    stream_span = from_value[1]
    if stream_name not in streams:
        diag.error(
            f"unknown stream {stream_name!r}",
            stream_span,
            did_you_mean(stream_name, streams, "streams")
            or f"declare it: STREAM {stream_name} (...) TIME BY ts;",
        )
        return None
    stream, schema = streams[stream_name]
    key_field = None
    if "PARTITION BY" in clauses:
        key_value = value("PARTITION BY")
        assert isinstance(key_value, tuple)
        key_field, key_span = str(key_value[0]), key_value[1]
        if schema is not None and key_field not in schema:
            diag.error(
                f"unknown field {key_field!r}", key_span, did_you_mean(key_field, schema, "fields")
            )

    within = value("WITHIN")
    step = value("STEP WITHIN")
    for d in (within, step):
        if isinstance(d, ast.Duration) and d.ms <= 0:
            diag.error("a time limit must be positive", d.span)
    within_ms = within.ms if isinstance(within, ast.Duration) and within.ms > 0 else None
    step_ms = step.ms if isinstance(step, ast.Duration) and step.ms > 0 else None
    timed = within_ms is not None or step_ms is not None

    pattern = value("PATTERN")
    assert isinstance(pattern, ast.PAlt)
    info = check_pattern(
        pattern, timed=timed, allow_unbounded=bool(value("ALLOW UNBOUNDED")), diag=diag
    )
    var_index = {
        name: i
        for i, name in enumerate(
            (*info.positive, *(v for v in info.negated if v not in info.positive))
        )
    }

    defines: dict[str, ast.Define] = {}
    for d in value("DEFINE", ()):  # type: ignore[attr-defined]
        if d.var in defines:
            diag.error(f"{d.var} is defined twice", d.span)
        elif d.var not in var_index:
            diag.error(
                f"DEFINE {d.var}: {d.var} does not appear in PATTERN",
                d.span,
                did_you_mean(d.var, var_index, "pattern variables"),
            )
        else:
            defines[d.var] = d
    conditions: list[Expr | None] = []
    for name in var_index:
        d = defines.get(name)
        if d is None:
            conditions.append(None)
            continue
        resolved = resolve(d.condition, Scope(var_index, schema, name), diag)
        if resolved is not None and resolved[1] not in (BOOL, ANY):
            diag.error(f"DEFINE {name} must be a condition, not a {resolved[1]}", d.condition.span)
        conditions.append(resolved[0] if resolved else None)

    measures: list[tuple[str, Expr]] = []
    for m in value("MEASURES", ()):  # type: ignore[attr-defined]
        if any(name == m.name for name, _ in measures):
            diag.error(f"measure {m.name!r} is defined twice", m.span)
            continue
        resolved = resolve(m.expr, Scope(var_index, schema, None, measure=True), diag)
        if resolved is not None:
            measures.append((m.name, resolved[0]))

    skip = _skip(value("SKIP", ast.Skip("PAST LAST ROW")), info, var_index, diag)  # type: ignore[arg-type]
    on_timeout = value("ON TIMEOUT EMIT")
    if on_timeout is not None and not timed:
        diag.error(
            "ON TIMEOUT EMIT needs WITHIN or STEP WITHIN",
            clauses["ON TIMEOUT EMIT"].span,
            "without a time limit nothing ever times out",
        )
    cap = value("MAX PARTIAL MATCHES")
    if cap is not None and int(cap) < 1:  # type: ignore[call-overload]
        diag.error("MAX PARTIAL MATCHES must be at least 1", clauses["MAX PARTIAL MATCHES"].span)
    if "ENABLED" in clauses and len(seen["ENABLED"]) > 1:
        pass  # reported above
    if len(diag.errors) > before:
        return None
    try:
        automaton = build_nfa(pattern, var_index, tuple(conditions), within_ms, step_ms)
    except TooManyStates:
        diag.error(
            f"the pattern expands to more than {MAX_STATES} states",
            pattern.span,
            "use smaller {n,m} bounds, or {n,} with a time limit",
        )
        return None
    emit = value("EMIT")
    assert isinstance(emit, ast.Emit)
    return N.CompiledRule(
        id=rule.id,
        version=int(value("VERSION", 1)),  # type: ignore[call-overload]
        title=rule.title,
        description=str(value("DESCRIPTION", "")),
        tags=tuple(value("TAGS", ())),  # type: ignore[arg-type]
        severity=str(value("SEVERITY", "MEDIUM")),
        enabled=bool(value("ENABLED", True)),
        stream=stream,
        key_field=key_field,
        nfa=automaton,
        skip=skip,
        measures=tuple(measures),
        emit=_output(emit),
        on_timeout=_output(on_timeout) if isinstance(on_timeout, ast.Emit) else None,
        max_partial_matches=int(cap) if cap is not None else None,  # type: ignore[call-overload]
        allow_unbounded=bool(value("ALLOW UNBOUNDED")),
        source=str(rule.span),
    )


def _output(emit: ast.Emit) -> N.EmitSpec:
    return N.EmitSpec(emit.alert, tuple(N.Destination(d.kind, d.target) for d in emit.destinations))


def _skip(
    skip: ast.Skip, info: object, var_index: Mapping[str, int], diag: Diagnostics
) -> N.SkipStrategy:
    from cep.compile.patterns import PatternInfo

    assert isinstance(info, PatternInfo)
    kinds = {
        "PAST LAST ROW": N.Skip.PAST_LAST_ROW,
        "TO NEXT ROW": N.Skip.TO_NEXT_ROW,
        "TO FIRST": N.Skip.TO_FIRST,
        "TO LAST": N.Skip.TO_LAST,
        "ALL MATCHES": N.Skip.ALL_MATCHES,
    }
    kind = kinds[skip.kind]
    if skip.var is None:
        return N.SkipStrategy(kind)
    if skip.var not in info.positive:
        hint = (
            f"{skip.var} is negated: it is never part of a match"
            if skip.var in info.negated
            else did_you_mean(skip.var, info.positive, "pattern variables")
        )
        diag.error(
            f"cannot skip to {skip.var}: it is not a variable of the pattern", skip.span, hint
        )
    elif info.first_vars == {skip.var} and kind is N.Skip.TO_FIRST:
        diag.error(
            f"SKIP TO FIRST {skip.var} would restart at the same event forever",
            skip.span,
            f"every match starts with {skip.var}; use TO NEXT ROW or another variable",
        )
    elif info.first_vars == {skip.var} and skip.var in info.single and kind is N.Skip.TO_LAST:
        diag.error(
            f"SKIP TO LAST {skip.var} would restart at the same event forever",
            skip.span,
            f"every match starts with its only {skip.var}; use TO NEXT ROW or another variable",
        )
    return N.SkipStrategy(kind, var_index.get(skip.var), skip.var)
