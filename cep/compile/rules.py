"""Checked syntax tree → `CompiledRule`s: clause checks, streams, DEFINE/MEASURES, skip, NFA."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cep import ast
from cep import nfa as N
from cep.compile.diagnostics import Diagnostics, did_you_mean
from cep.compile.expressions import (
    ANY,
    BOOL,
    NUM,
    SCHEMA_TYPES,
    STR,
    Schema,
    Scope,
    resolve,
)
from cep.compile.nfa_build import MAX_STATES, TooManyStates, build_nfa
from cep.compile.patterns import PatternInfo, check_pattern
from cep.delivery.preflight import TOPIC_NAME_RULE, is_topic_name
from cep.errors import Span
from cep.expr import Expr
from cep.tables import load_file_rows


def _fields(
    decls: tuple[ast.FieldDecl, ...], diag: Diagnostics
) -> tuple[Schema, tuple[N.FieldSpec, ...]]:
    """Declared fields → the checker's schema and the runtime's field specs (recursive:
    a STRUCT holds its own fields)."""
    schema: Schema = {}
    specs: list[N.FieldSpec] = []
    names: set[str] = set()
    for f in decls:
        if f.name in names:
            diag.error(f"field {f.name!r} is declared twice", f.span)
        names.add(f.name)
        if f.fields is not None:
            sub_schema, sub_specs = _fields(f.fields, diag)
            schema[f.name] = sub_schema
            specs.append(N.FieldSpec(f.name, "STRUCT", sub_specs))
            continue
        if f.type not in SCHEMA_TYPES:
            diag.error(
                f"unknown type {f.type}", f.span,
                "types are STRING, INT, FLOAT, BOOL and STRUCT(name TYPE, ...)",
            )
            continue
        schema[f.name] = SCHEMA_TYPES[f.type]
        canonical = {"number": "FLOAT", "string": "STRING", "boolean": "BOOL"}[
            SCHEMA_TYPES[f.type]
        ]
        if f.type in ("INT", "INTEGER", "LONG", "BIGINT"):
            canonical = "INT"
        specs.append(N.FieldSpec(f.name, canonical))
    return schema, tuple(specs)


def compile_streams(
    streams: tuple[ast.StreamDecl, ...], diag: Diagnostics
) -> dict[str, tuple[N.StreamSpec, Schema | None]]:
    out: dict[str, tuple[N.StreamSpec, Schema | None]] = {}
    for s in streams:
        if s.name in out:
            diag.error(f"stream {s.name!r} is declared twice", s.span)
            continue
        schema: Schema | None = None
        fields: tuple[N.FieldSpec, ...] | None = None
        if s.time_keys:
            diag.error(
                f"TIME BY a nested field ({':'.join((s.time_field, *s.time_keys))}) is not "
                "supported",
                s.time_span,
                "the event time is a top-level field (epoch milliseconds or ISO-8601)",
            )
        if s.fields is not None:
            schema, fields = _fields(s.fields, diag)
            if s.time_keys:
                pass  # reported above
            elif s.time_field not in schema:
                diag.error(
                    f"time field {s.time_field!r} is not a field of stream {s.name!r}",
                    s.span,
                    did_you_mean(s.time_field, schema, "fields"),
                )
            elif schema[s.time_field] not in (NUM, STR):
                diag.error(
                    f"time field {s.time_field!r} must be INT (epoch milliseconds) or STRING "
                    "(ISO-8601)",
                    s.span,
                )
            else:
                # Events carry their time as epoch milliseconds once validated (cep.events),
                # whatever the field held: an ISO-8601 STRING reads as a number in rules.
                schema[s.time_field] = NUM
        lateness = s.lateness.ms if s.lateness else 0
        out[s.name] = (N.StreamSpec(s.name, s.time_field, lateness, fields), schema)
    return out


Tables = Mapping[str, tuple[str, dict[str, str]]]  # name -> (key column, column types)


def compile_tables(
    tables: tuple[ast.TableDecl, ...],
    streams: Mapping[str, object],
    diag: Diagnostics,
    path: str,
) -> tuple[dict[str, N.TableSpec], dict[str, tuple[str, dict[str, str]]]]:
    """TABLE declarations → `TableSpec`s (a FILE table's rows read and checked here) and the
    resolver's view of them (docs/tables.md)."""
    specs: dict[str, N.TableSpec] = {}
    view: dict[str, tuple[str, dict[str, str]]] = {}
    for t in tables:
        if t.name in specs:
            diag.error(f"table {t.name!r} is declared twice", t.span)
            continue
        if t.name in streams:
            diag.error(f"{t.name!r} is both a stream and a table", t.span,
                       "give the table another name")
            continue
        before = len(diag.errors)
        schema, fields = _fields(t.fields, diag)
        columns: dict[str, str] = {}
        for name, typ in schema.items():
            if isinstance(typ, dict):
                diag.error(f"table {t.name!r}: column {name!r} is a STRUCT; table columns are "
                           "STRING, INT, FLOAT or BOOL", t.span)
            else:
                columns[name] = typ
        if t.key not in columns:
            diag.error(f"key {t.key!r} is not a column of table {t.name!r}", t.key_span,
                       did_you_mean(t.key, columns, "columns"))
        elif columns[t.key] not in (NUM, STR) or next(
                f.type for f in t.fields if f.name == t.key) in ("FLOAT", "DOUBLE", "DECIMAL",
                                                                 "NUMBER"):
            diag.error(f"the key of table {t.name!r} must be STRING or INT", t.key_span,
                       "a key is compared as text: 5 and 5.0 would be different keys")
        if t.source_kind == "KAFKA" and not is_topic_name(t.source):
            diag.error(f"table {t.name!r}: not a Kafka topic name: {t.source!r}", t.source_span,
                       TOPIC_NAME_RULE)
        if t.source_kind == "KAFKA" and t.time_field is None:
            diag.error(f"table {t.name!r} reads a Kafka changelog: it needs TIME BY (the "
                       "column holding when each version takes effect)", t.span,
                       f"e.g. TABLE {t.name} (..., updated INT) KEY {t.key} TIME BY updated "
                       f"FROM KAFKA '{t.source}'")
        if t.source_kind == "FILE" and t.time_field is not None:
            diag.error(f"table {t.name!r} is static (FROM FILE): it has no TIME BY", t.time_span,
                       "a FILE table's rows hold from the beginning of time; a versioned "
                       "table comes FROM KAFKA")
        if t.time_field is not None:
            if t.time_field not in columns:
                diag.error(f"time column {t.time_field!r} is not a column of table {t.name!r}",
                           t.time_span, did_you_mean(t.time_field, columns, "columns"))
            elif columns[t.time_field] not in (NUM, STR):
                diag.error(f"time column {t.time_field!r} must be INT (epoch milliseconds) or "
                           "STRING (ISO-8601)", t.time_span)
            else:
                columns[t.time_field] = NUM
        if len(diag.errors) > before:
            continue
        spec = N.TableSpec(t.name, t.key, t.time_field, fields, t.source_kind, t.source)
        if t.source_kind == "FILE":
            rows, problem = load_file_rows(spec, path)
            if problem is not None:
                diag.error(f"table {t.name!r}: {problem}", t.span)
                continue
            spec = N.TableSpec(t.name, t.key, None, fields, "FILE", t.source, rows)
        specs[t.name] = spec
        view[t.name] = (t.key, columns)
    return specs, view


def compile_rule(
    rule: ast.RuleDecl,
    streams: Mapping[str, tuple[N.StreamSpec, Schema | None]],
    diag: Diagnostics,
    tables: Tables | None = None,
) -> N.CompiledRule | None:
    """One rule, in small passes over its typed clauses; every error goes to `diag` and the
    rule is None when there was any."""
    before = len(diag.errors)
    clauses = _clauses(rule, diag)
    if clauses.stream is None or (clauses.pattern is None and clauses.window is None):
        return None
    source = _source(clauses.stream, clauses.partition_by, streams, diag)
    if source is None:
        return None
    stream, schema, key_field = source
    if clauses.window is not None:
        return _window_rule(rule, clauses, stream, schema, key_field, before, diag, tables)
    for name in ("where", "having"):
        if getattr(clauses, name) is not None:
            diag.error(
                f"{name.upper()} belongs to window rules (WINDOW ...)",
                clauses.span(name),
                "a pattern rule's conditions go in DEFINE"
                if name == "where" else "a pattern rule's thresholds go in DEFINE",
            )
    pattern = clauses.pattern
    assert pattern is not None
    within_ms, step_ms = _time_limits(clauses, diag)
    timed = within_ms is not None or step_ms is not None
    info = check_pattern(pattern, timed=timed, allow_unbounded=clauses.allow_unbounded, diag=diag)
    var_index = {
        name: i
        for i, name in enumerate(
            (*info.positive, *(v for v in info.negated if v not in info.positive))
        )
    }
    used: set[tuple[str, str]] = set()
    over: list[N.OverSpec] = []
    conditions = _conditions(clauses.define, var_index, schema, diag, over, tables, used)
    measures = _measures(clauses.measures, var_index, schema, diag, over, tables, used)
    skip = _skip(clauses.skip or ast.Skip("PAST LAST ROW"), info, var_index, diag)
    _check_limits(clauses, timed, diag)
    if len(diag.errors) > before or clauses.emit is None:
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
    return _compiled(
        rule, clauses, stream, key_field,
        nfa=automaton,
        skip=skip,
        measures=tuple(measures),
        on_timeout=_output(clauses.on_timeout) if clauses.on_timeout is not None else None,
        max_partial_matches=clauses.max_partial_matches,
        allow_unbounded=clauses.allow_unbounded,
        lookups=tuple(sorted(used)),
        over=tuple(over),
    )


def _compiled(rule: ast.RuleDecl, clauses: ast.RuleClauses, stream: N.StreamSpec,
              key_field: str | None, **kind: Any) -> N.CompiledRule:
    """A compiled rule: what every rule has (metadata, source, key, EMIT) and `kind`, what its
    kind of rule adds (a pattern's automaton and skip; a window's spec)."""
    assert clauses.emit is not None
    return N.CompiledRule(
        id=rule.id,
        version=1 if clauses.version is None else clauses.version,
        title=rule.title,
        description=clauses.description or "",
        tags=clauses.tags,
        severity=clauses.severity or "MEDIUM",
        enabled=True if clauses.enabled is None else clauses.enabled,
        stream=stream,
        key_field=key_field,
        emit=_output(clauses.emit),
        source=str(rule.span),
        **kind,
    )


# Clauses of pattern rules, by field: a window rule giving one is an error (docs/windows.md).
_PATTERN_ONLY = {
    "pattern": "PATTERN", "define": "DEFINE", "within": "WITHIN", "step_within": "STEP WITHIN",
    "skip": "AFTER MATCH SKIP", "on_timeout": "ON TIMEOUT EMIT",
    "allow_unbounded": "ALLOW UNBOUNDED", "max_partial_matches": "MAX PARTIAL MATCHES",
}
MAX_HOPS = 100  # windows an event of a HOPPING rule belongs to
WINDOW_MEASURES = ("window_start", "window_end")


def _window_rule(
    rule: ast.RuleDecl,
    clauses: ast.RuleClauses,
    stream: N.StreamSpec,
    schema: Schema | None,
    key_field: str | None,
    before: int,
    diag: Diagnostics,
    tables: Tables | None = None,
) -> N.CompiledRule | None:
    """A window rule (WINDOW, WHERE, HAVING, MEASURES over aggregates; docs/windows.md).
    WHERE reads tables as of each event; HAVING and MEASURES by the window's key, as of the
    window's last event (docs/windows.md, "Tables in window rules")."""
    window = clauses.window
    assert window is not None
    given = dict(clauses.spans)
    for name, keyword in _PATTERN_ONLY.items():
        if name in given:
            diag.error(
                f"{keyword} belongs to pattern rules; this rule has a WINDOW",
                given[name],
                "a window rule filters with WHERE and alerts with HAVING"
                if name in ("pattern", "define") else "remove it",
            )
    size = window.size.ms
    advance = window.advance.ms if window.advance is not None else size
    if size <= 0:
        diag.error("a window size must be positive", window.size.span)
    if window.advance is not None:
        if advance <= 0:
            diag.error("ADVANCE BY must be positive", window.advance.span)
        elif advance > size:
            diag.error("ADVANCE BY is longer than SIZE: some events would be in no window",
                       window.advance.span, "advance by at most the size (equal: TUMBLING)")
        elif size > 0 and -(-size // advance) > MAX_HOPS:
            diag.error(f"each event would be in more than {MAX_HOPS} windows",
                       window.advance.span, "use a larger ADVANCE BY")
    used: set[tuple[str, str]] = set()
    where = None
    if clauses.where is not None:
        hint = "WHERE filters single events; thresholds over the window go in HAVING"
        resolved = resolve(clauses.where, Scope({}, schema, None, no_aggs=hint, tables=tables,
                                                used=used), diag)
        if resolved is not None and resolved[1] not in (BOOL, ANY):
            diag.error(f"WHERE must be a condition, not a {resolved[1]}", clauses.where.span)
        where = resolved[0] if resolved else None
    aggs: list[N.AggSpec] = []
    having = None
    if clauses.having is not None:
        resolved = resolve(clauses.having, Scope({}, schema, None, measure=True, tables=tables,
                                                 used=used, window_aggs=aggs,
                                                 window_key=key_field), diag)
        if resolved is not None and resolved[1] not in (BOOL, ANY):
            diag.error(f"HAVING must be a condition, not a {resolved[1]}", clauses.having.span)
        having = resolved[0] if resolved else None
    measures: list[tuple[str, Expr]] = []
    for m in clauses.measures:
        if m.name in WINDOW_MEASURES:
            diag.error(f"measure {m.name!r} is already in every window alert", m.span,
                       "window_start and window_end are the window's bounds; use another name")
            continue
        if any(name == m.name for name, _ in measures):
            diag.error(f"measure {m.name!r} is defined twice", m.span)
            continue
        resolved = resolve(m.expr, Scope({}, schema, None, measure=True, tables=tables,
                                         used=used, window_aggs=aggs, window_key=key_field),
                           diag)
        if resolved is not None:
            measures.append((m.name, resolved[0]))
    if len(diag.errors) > before or clauses.emit is None:
        return None
    spec = N.WindowSpec(window.kind, size, advance, where, having, tuple(aggs))
    # A one-state automaton stands in for the pattern (tools that show a rule's NFA): it tests
    # WHERE; the runtime runs `spec` (cep.runtime.windows), never this.
    stand_in = N.Nfa(("row",), (where,), (N.State(0, N.StateKind.STEP, 0, N.Conn.STRICT,
                                                   (N.ACCEPT,)),), (0,),
                     pattern=str(spec).splitlines()[0])
    return _compiled(
        rule, clauses, stream, key_field,
        nfa=stand_in,
        skip=N.SkipStrategy(N.Skip.PAST_LAST_ROW),
        measures=tuple(measures),
        on_timeout=None,
        max_partial_matches=None,
        allow_unbounded=False,
        window=spec,
        lookups=tuple(sorted(used)),
    )


_REQUIRED = {
    "stream": ("FROM", "FROM transactions"),
    "pattern": ("PATTERN", "PATTERN (a b), or WINDOW TUMBLING (SIZE 5m) for a window rule"),
    "emit": ("EMIT", "EMIT 'alert-name' TO KAFKA 'alerts'"),
}


def _clauses(rule: ast.RuleDecl, diag: Diagnostics) -> ast.RuleClauses:
    """Pass 1: the typed clauses; each clause given twice and each required one missing is an
    error."""
    clauses, duplicates = ast.RuleClauses.build(rule)
    for again, first in duplicates:
        diag.error(
            f"{again.name} is given more than once in rule {rule.id!r}",
            again.span,
            f"the first one is at line {first.span.line}",
        )
    for name, (keyword, example) in _REQUIRED.items():
        if name == "pattern" and clauses.window is not None:
            continue
        if getattr(clauses, name) is None:
            diag.error(f"rule {rule.id!r} has no {keyword} clause", rule.span, f"add {example}")
    return clauses


def _source(
    stream_ref: tuple[str, Span],
    partition_by: tuple[str, Span, tuple[str, ...]] | None,
    streams: Mapping[str, tuple[N.StreamSpec, Schema | None]],
    diag: Diagnostics,
) -> tuple[N.StreamSpec, Schema | None, str | None] | None:
    """Pass 2: the stream read (FROM) and the partition key (PARTITION BY) against its
    schema."""
    stream_name, stream_span = stream_ref
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
    if partition_by is not None:
        key_field, key_span, keys = str(partition_by[0]), partition_by[1], partition_by[2]
        if keys:
            diag.error(
                f"PARTITION BY a nested field ({':'.join((key_field, *keys))}) is not supported",
                key_span,
                "partition by a top-level field; have the producer copy the key to the top level",
            )
        elif schema is not None and key_field not in schema:
            diag.error(
                f"unknown field {key_field!r}", key_span, did_you_mean(key_field, schema, "fields")
            )
        elif schema is not None and isinstance(schema[key_field], dict):
            diag.error(
                f"PARTITION BY {key_field}: a STRUCT is not a key",
                key_span,
                "partition by a top-level field holding a value (STRING, INT, BOOL)",
            )
    return stream, schema, key_field


def _time_limits(clauses: ast.RuleClauses, diag: Diagnostics) -> tuple[int | None, int | None]:
    """Pass 3: WITHIN and STEP WITHIN, in ms (None: no limit)."""
    for d in (clauses.within, clauses.step_within):
        if d is not None and d.ms <= 0:
            diag.error("a time limit must be positive", d.span)

    def ms(d: ast.Duration | None) -> int | None:
        return d.ms if d is not None and d.ms > 0 else None

    return ms(clauses.within), ms(clauses.step_within)


def _conditions(
    defines: tuple[ast.Define, ...],
    var_index: Mapping[str, int],
    schema: Schema | None,
    diag: Diagnostics,
    over: list[N.OverSpec],
    tables: Tables | None = None,
    used: set[tuple[str, str]] | None = None,
) -> list[Expr | None]:
    """Pass 4: DEFINE, one condition (or None: always true) per pattern variable."""
    by_var: dict[str, ast.Define] = {}
    for d in defines:
        if d.var in by_var:
            diag.error(f"{d.var} is defined twice", d.span)
        elif d.var not in var_index:
            diag.error(
                f"DEFINE {d.var}: {d.var} does not appear in PATTERN",
                d.span,
                did_you_mean(d.var, var_index, "pattern variables"),
            )
        else:
            by_var[d.var] = d
    conditions: list[Expr | None] = []
    for name in var_index:
        found = by_var.get(name)
        if found is None:
            conditions.append(None)
            continue
        resolved = resolve(found.condition,
                           Scope(var_index, schema, name, tables=tables, used=used,
                                 over=over), diag)
        if resolved is not None and resolved[1] not in (BOOL, ANY):
            diag.error(f"DEFINE {name} must be a condition, not a {resolved[1]}",
                       found.condition.span)
        conditions.append(resolved[0] if resolved else None)
    return conditions


def _measures(
    given: tuple[ast.Measure, ...],
    var_index: Mapping[str, int],
    schema: Schema | None,
    diag: Diagnostics,
    over: list[N.OverSpec],
    tables: Tables | None = None,
    used: set[tuple[str, str]] | None = None,
) -> list[tuple[str, Expr]]:
    """Pass 5: MEASURES, resolved in the scope of the whole match."""
    measures: list[tuple[str, Expr]] = []
    for m in given:
        if any(name == m.name for name, _ in measures):
            diag.error(f"measure {m.name!r} is defined twice", m.span)
            continue
        resolved = resolve(m.expr, Scope(var_index, schema, None, measure=True, tables=tables,
                                         used=used, over=over), diag)
        if resolved is not None:
            measures.append((m.name, resolved[0]))
    return measures


def _check_limits(clauses: ast.RuleClauses, timed: bool, diag: Diagnostics) -> None:
    """Pass 7: ON TIMEOUT EMIT needs a time limit; MAX PARTIAL MATCHES is at least 1."""
    if clauses.on_timeout is not None and not timed:
        diag.error(
            "ON TIMEOUT EMIT needs WITHIN or STEP WITHIN",
            clauses.span("on_timeout"),
            "without a time limit nothing ever times out",
        )
    cap = clauses.max_partial_matches
    if cap is not None and cap < 1:
        diag.error("MAX PARTIAL MATCHES must be at least 1", clauses.span("max_partial_matches"))


def _output(emit: ast.Emit) -> N.EmitSpec:
    return N.EmitSpec(emit.alert, tuple(N.Destination(d.kind, d.target) for d in emit.destinations))


def _skip(
    skip: ast.Skip, info: PatternInfo, var_index: Mapping[str, int], diag: Diagnostics
) -> N.SkipStrategy:
    """Pass 6: AFTER MATCH SKIP against the pattern's variables."""
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
