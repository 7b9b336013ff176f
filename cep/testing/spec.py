"""Rule test files → checked `TestFile`s.

A test file is YAML (format in docs/rule-testing.md):

    rules: ../fraud.cep            # the rules under test, relative to this file
    defaults: {card: c1}           # merged into every event
    cases:
      - name: three probes, then a big charge
        events:
          - {ts: +0s,  amount: 1.00}
          - {ts: +30s, amount: 1.50}
          - {ts: +1m,  amount: 0.99}
          - {ts: +2m,  amount: 900}
        expect:
          - {rule: card_testing, key: c1, events: [0, 1, 2, 3], measures: {probes: 3}}

Everything is checked before anything runs: unknown keys, times, rule ids, measure and
variable names, event indexes and (when the stream declares a schema) event field names and
types. Each error names the file and line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cep.compile import check_paths, merge_rulesets
from cep.errors import SourceError, Span
from cep.events import EventSchema, conform, validate
from cep.nfa import CompiledRule, RuleSet, StreamSpec, TableSpec
from cep.tables import conform_row
from cep.testing.source import TestFileError, YList, YMap, line_of, load_yaml
from cep.testing.times import DEFAULT_BASE_MS, parse_time

FILE_KEYS = {"rules", "rule", "stream", "base", "defaults", "cases", "description", "tables"}
CASE_KEYS = {"name", "description", "rule", "stream", "base", "defaults", "events", "expect",
             "expect_none", "no_other_alerts", "events_file", "dead_letters", "tables"}
EXPECT_KEYS = {"rule", "key", "kind", "alert", "first", "last", "events", "measures"}
STREAM_KEY = "_stream"  # an event's own stream, when a case reads several


@dataclass(frozen=True, slots=True)
class ExpectedAlert:
    line: int
    rule: str
    key: str | None = None
    kind: str = "match"
    alert: str | None = None
    first_ts: int | None = None
    last_ts: int | None = None
    events: tuple[int, ...] | None = None  # indexes into the case's events, in match order
    vars: tuple[tuple[str, tuple[int, ...]], ...] | None = None  # variable → event indexes
    measures: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class CaseEvent:
    stream: str
    data: dict[str, Any]  # with the time field as epoch milliseconds
    line: int
    # Why `cep.events` rejects it (a dead letter in replay and live, too), or None.
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    line: int
    base_ms: int
    scope: tuple[str, ...]  # rule ids whose alerts the case checks
    events: tuple[CaseEvent, ...]
    expect: tuple[ExpectedAlert, ...]
    forbidden: tuple[str, ...]  # expect_none: rules that must raise no alert
    exact: bool  # no_other_alerts
    dead_letters: tuple[int, ...] = ()  # indexes of the events the case expects rejected
    # Table records (docs/tables.md): the file's `tables:`, then the case's; `stream` is the
    # table's name. Not events: they take no index.
    tables: tuple[CaseEvent, ...] = ()


@dataclass(frozen=True, slots=True)
class TestFile:
    __test__ = False

    path: Path
    rules_path: Path
    ruleset: RuleSet
    cases: tuple[Case, ...]


class RulesError(Exception):
    """The rules a test file points at do not compile; carries every compile error."""

    def __init__(self, errors: list[SourceError]) -> None:
        super().__init__("\n".join(e.render() for e in errors))
        self.errors = errors


RuleLoader = Callable[[Path], RuleSet]


def compile_rules_path(path: Path) -> RuleSet:
    """The rules a test file names, loaded as `cep check` and `load_rules_dir` load them."""
    sets, errors = check_paths([path])
    if errors:
        raise RulesError(errors)
    return merge_rulesets(sets.values())


def load_test_file(path: Path, load_rules: RuleLoader = compile_rules_path) -> TestFile:
    """Read, parse and check one test file. Raises `TestFileError` (or `RulesError`)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TestFileError(f"cannot read test file: {exc}", Span(str(path), 1, 1)) from None
    return _Parser(path, text, load_rules).parse()


class _Parser:
    def __init__(self, path: Path, text: str, load_rules: RuleLoader) -> None:
        self.path, self.text, self.load_rules = path, text, load_rules

    def error(self, message: str, line: int, hint: str | None = None) -> TestFileError:
        # The caret goes under the first word of the line (past a list's `- `): lines are
        # what the YAML loader keeps, and a test file has one item or key per line.
        lines = self.text.splitlines()
        text = lines[line - 1] if 1 <= line <= len(lines) else ""
        col = len(text) - len(text.lstrip(" -")) + 1
        return TestFileError(message, Span(str(self.path), line, col), source=self.text,
                             hint=hint)

    # -- file ------------------------------------------------------------------------------
    def parse(self) -> TestFile:
        doc = load_yaml(self.text, str(self.path))
        if not isinstance(doc, YMap):
            raise self.error("a test file is a mapping with `rules:` and `cases:`", 1)
        self.check_keys(doc, FILE_KEYS, "test file")
        if "rules" not in doc or not isinstance(doc["rules"], str):
            raise self.error("missing `rules:` (the rules file or folder under test, relative "
                             "to this file)", doc.line)
        rules_path = (self.path.parent / doc["rules"]).resolve()
        if not rules_path.exists():
            raise self.error(f"rules {doc['rules']!r} not found (looked for {rules_path})",
                             line_of(doc, "rules"))
        ruleset = self.load_rules(rules_path)
        self.rules = {r.id: r for r in ruleset.rules if r.enabled}
        self.streams = {s.name: s for s in ruleset.streams}
        self.tables = {t.name: t for t in ruleset.tables}
        file_base = self.base(doc, DEFAULT_BASE_MS)
        self.file_tables = self.table_rows(doc, file_base)  # times relative to the file's base
        file_scope = self.rule_list(doc, "rule", tuple(self.rules))
        file_stream = self.stream_name(doc, None)
        file_defaults = self.mapping(doc, "defaults")
        cases = doc.get("cases")
        if not isinstance(cases, YList) or not cases:
            raise self.error("`cases:` must be a non-empty list of cases",
                             line_of(doc, "cases", doc.line))
        parsed = []
        names: dict[str, int] = {}
        for i, raw in enumerate(cases):
            if not isinstance(raw, YMap):
                raise self.error("a case is a mapping with `name:`, `events:` and `expect:`",
                                 line_of(cases, i))
            case = self.case(raw, file_scope, file_stream, file_base, file_defaults)
            if case.name in names:
                raise self.error(f"case name {case.name!r} is used twice (first at line "
                                 f"{names[case.name]})", case.line)
            names[case.name] = case.line
            parsed.append(case)
        return TestFile(self.path, rules_path, ruleset, tuple(parsed))

    # -- case ------------------------------------------------------------------------------
    def case(self, raw: YMap, file_scope: tuple[str, ...], file_stream: str | None,
             file_base: int, file_defaults: dict[str, Any]) -> Case:
        self.check_keys(raw, CASE_KEYS, "case")
        name = raw.get("name")
        if not isinstance(name, str) or not name.strip():
            raise self.error("every case needs a `name:`", raw.line)
        scope = self.rule_list(raw, "rule", file_scope)
        stream = self.stream_name(raw, file_stream)
        base = self.base(raw, file_base)
        defaults = {**file_defaults, **self.mapping(raw, "defaults")}
        events = self.events(raw, stream, base, defaults)
        expect: list[ExpectedAlert] = []
        raw_expect = raw.get("expect", YList())
        if raw_expect is None:
            raw_expect = YList()
        if not isinstance(raw_expect, list):
            raise self.error("`expect:` is a list of alerts", line_of(raw, "expect"))
        for i, item in enumerate(raw_expect):
            line = line_of(raw_expect, i, line_of(raw, "expect"))
            expect.append(self.expected(item, line, scope, len(events), base))
        forbidden: tuple[str, ...] = ()
        none = raw.get("expect_none")
        if none is True:
            if expect:
                raise self.error("`expect_none: true` and a non-empty `expect:` contradict "
                                 "each other", line_of(raw, "expect_none"))
        elif none is not None and none is not False:
            forbidden = self.rule_list(raw, "expect_none", ())
        elif "expect" not in raw:
            raise self.error(f"case {name!r} says nothing about its alerts",
                             raw.line, hint="add `expect:` (a list of alerts) or "
                             "`expect_none: true`")
        exact = raw.get("no_other_alerts", True)
        if not isinstance(exact, bool):
            raise self.error("`no_other_alerts:` is true or false",
                             line_of(raw, "no_other_alerts"))
        dead = raw.get("dead_letters", YList())
        if not isinstance(dead, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(events)
                for i in dead):
            raise self.error(f"`dead_letters:` is a list of event indexes (0 to "
                             f"{len(events) - 1})", line_of(raw, "dead_letters"))
        tables = self.file_tables + self.table_rows(raw, base)
        return Case(name.strip(), raw.line, base, scope, events, tuple(expect), forbidden, exact,
                    tuple(sorted(set(dead))), tables)

    def table_rows(self, raw: YMap, base: int) -> tuple[CaseEvent, ...]:
        """`tables: {customers: [{id: c1, updated: +0s, home_country: FR}, ...]}`: versions of
        KAFKA tables, checked by the one table-record validator (`cep.tables`)."""
        given = raw.get("tables")
        if given is None:
            return ()
        line = line_of(raw, "tables")
        if not isinstance(given, dict):
            raise self.error("`tables:` maps a table name to a list of rows", line)
        out: list[CaseEvent] = []
        for name, rows in given.items():
            where = line_of(given, name, line) if isinstance(given, YMap) else line
            spec = self.tables.get(name)
            if spec is None:
                raise self.error(f"unknown table {name!r}", where,
                                 hint=f"the rules declare {', '.join(self.tables) or 'no table'}")
            if spec.time_field is None:
                raise self.error(f"table {name!r} is static (FROM FILE {spec.source!r}): its "
                                 "rows come from the file", where)
            if not isinstance(rows, list):
                raise self.error(f"`{name}:` is a list of rows", where)
            for i, item in enumerate(rows):
                at = line_of(rows, i, where) if isinstance(rows, YList) else where
                out.append(self.table_row(spec, item, i, at, base))
        return tuple(out)

    def table_row(self, spec: TableSpec, item: Any, i: int, line: int, base: int) -> CaseEvent:
        if not isinstance(item, dict):
            raise self.error(f"row {i} of table {spec.name!r} is not a mapping", line)
        data = dict(item)
        tf = spec.time_field
        assert tf is not None
        if tf not in data:
            raise self.error(f"row {i} of table {spec.name!r} has no `{tf}` (when the version "
                             "takes effect)", line)
        try:
            data[tf] = parse_time(data[tf], base)
        except ValueError as exc:
            raise self.error(f"row {i} of table {spec.name!r}: {exc}", line) from None
        columns = {f.name for f in spec.fields} | {"_deleted"}
        for name in data:
            if name not in columns:
                raise self.error(f"row {i}: table {spec.name!r} has no column {name!r}", line,
                                 hint=f"its columns are {', '.join(sorted(columns))}")
        _, _, row, reason = conform_row(data, spec)
        if reason is not None:
            raise self.error(f"row {i} of table {spec.name!r}: {reason}", line)
        if row is None:
            row = data  # a delete: the engine reads its `_deleted`
        return CaseEvent(spec.name, row, line)

    def events(self, raw: YMap, stream: str | None, base: int,
               defaults: dict[str, Any]) -> tuple[CaseEvent, ...]:
        items = raw.get("events", YList() if "events_file" in raw else None)
        if not isinstance(items, YList) or (not items and "events_file" not in raw):
            raise self.error("`events:` must be a non-empty list of events",
                             line_of(raw, "events", raw.line))
        out = []
        for i, item in enumerate(items):
            line = line_of(items, i)
            if not isinstance(item, dict):
                raise self.error(f"event {i} is not a mapping of fields", line)
            data = {**defaults, **item}
            ev_stream = data.pop(STREAM_KEY, stream)
            if ev_stream is None:
                raise self.error(
                    "which stream is this event on? The rules read "
                    f"{', '.join(sorted(self.streams)) or 'no stream'}", line,
                    hint="add `stream: NAME` to the case or the file, or `_stream: NAME` to "
                    "the event")
            spec = self.streams.get(str(ev_stream))
            if spec is None:
                raise self.error(f"unknown stream {ev_stream!r}", line)
            tf = spec.time_field
            if tf not in data:
                raise self.error(f"event {i} has no `{tf}` (the stream's event time)", line)
            try:
                data[tf] = parse_time(data[tf], base)
            except ValueError as exc:
                raise self.error(f"event {i}: {exc}", line) from None
            self.check_fields(spec, data, i, line)
            # The one definition of a valid event (cep.events), as replay and live apply it.
            event, _, reason = conform(data, self.schema(spec))
            out.append(CaseEvent(spec.name, event if event is not None else data, line, reason))
        if "events_file" in raw:
            out.extend(self.events_file(raw, stream))
        return tuple(out)

    def events_file(self, raw: YMap, stream: str | None) -> list[CaseEvent]:
        """JSON lines read as bytes and judged by `cep.events.validate`, exactly as `cep replay`
        judges a line of an input file (blank lines are not records)."""
        line = line_of(raw, "events_file")
        name = raw["events_file"]
        if not isinstance(name, str):
            raise self.error("`events_file:` is a path to a JSON-lines file", line)
        spec = self.streams.get(stream or "")
        if spec is None:
            raise self.error("`events_file:` needs the case's or the file's `stream:`", line)
        path = self.path.parent / name
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise self.error(f"cannot read events file {name!r}: {exc.strerror}", line) from None
        out = []
        for raw_line in data.split(b"\n"):
            raw_line = raw_line.rstrip(b"\r")
            if not raw_line.strip():
                continue
            event, _, reason = validate(raw_line, self.schema(spec))
            out.append(CaseEvent(spec.name, event or {}, line, reason))
        return out

    def schema(self, spec: StreamSpec) -> EventSchema:
        keys = [r.key_field for r in self.rules.values() if r.stream.name == spec.name]
        return EventSchema.of(spec, keys)

    def check_fields(self, spec: StreamSpec, data: dict[str, Any], i: int, line: int) -> None:
        """A typo check for hand-written events: a field the stream does not declare. Types
        are `cep.events`' business: a wrong type makes the event a dead letter."""
        if spec.fields is None:
            return
        types = {f.name: f.type for f in spec.fields}
        for name in data:
            if name not in types:
                raise self.error(
                    f"event {i}: stream {spec.name!r} has no field {name!r}", line,
                    hint=f"its fields are {', '.join(types)}")

    def expected(self, item: Any, line: int, scope: tuple[str, ...], n_events: int,
                 base: int) -> ExpectedAlert:
        if not isinstance(item, YMap):
            raise self.error("an expected alert is a mapping (rule, key, events, measures...)",
                             line)
        self.check_keys(item, EXPECT_KEYS, "expected alert")
        rule_id = item.get("rule")
        if rule_id is None and len(scope) == 1:
            rule_id = scope[0]
        if not isinstance(rule_id, str):
            raise self.error("an expected alert needs `rule:`", line)
        rule = self.known_rule(rule_id, line_of(item, "rule", line))
        if rule_id not in scope:
            raise self.error(f"rule {rule_id!r} is outside this case's `rule:` scope "
                             f"({', '.join(scope)})", line_of(item, "rule", line))
        key = item.get("key")
        kind = item.get("kind", "match")
        if kind not in ("match", "timeout"):
            raise self.error("`kind:` is match or timeout", line_of(item, "kind", line))
        alert = item.get("alert")
        times: dict[str, int | None] = {}
        for name in ("first", "last"):
            if item.get(name) is None:
                times[name] = None
                continue
            try:
                times[name] = parse_time(item[name], base)
            except ValueError as exc:
                raise self.error(f"`{name}:` {exc}", line_of(item, name, line)) from None
        events, variables = self.indexes(item, rule, n_events, line)
        measures = {m: self.measure_value(v, base) for m, v in self.mapping(item,
                                                                            "measures").items()}
        names = [m for m, _ in rule.measures]
        if rule.window is not None:  # every window alert has its bounds (docs/windows.md)
            names = ["window_start", "window_end", *names]
        for m in measures:
            if m not in names:
                raise self.error(f"rule {rule_id!r} has no measure {m!r}",
                                 line_of(item["measures"], m, line),
                                 hint=f"its measures are {', '.join(names) or '(none)'}")
        return ExpectedAlert(line, rule_id, None if key is None else str(key), kind,
                             None if alert is None else str(alert), times["first"],
                             times["last"], events, variables, tuple(measures.items()))

    @staticmethod
    def measure_value(value: Any, base: int) -> Any:
        """Offsets (`+2m`) stand for event times in epoch ms, as in `ts`; other values as is."""
        if isinstance(value, str) and value[:1] in "+-" and value[1:2] != "":
            try:
                return parse_time(value, base)
            except ValueError:
                return value
        return value

    def indexes(self, item: YMap, rule: CompiledRule, n_events: int, line: int,
                ) -> tuple[tuple[int, ...] | None, tuple[tuple[str, tuple[int, ...]], ...] | None]:
        raw = item.get("events")
        if raw is None:
            return None, None
        where = line_of(item, "events", line)

        def ints(value: Any) -> tuple[int, ...]:
            values = value if isinstance(value, list) else [value]
            for v in values:
                if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < n_events:
                    raise self.error(f"{v!r} is not an event index: events are numbered "
                                     f"from 0 to {n_events - 1}", where)
            return tuple(values)

        if isinstance(raw, dict):
            pairs = []
            for var, value in raw.items():
                if var not in rule.nfa.vars:
                    raise self.error(f"rule {rule.id!r} has no pattern variable {var!r}",
                                     where, hint=f"its variables are {', '.join(rule.nfa.vars)}")
                pairs.append((var, ints(value)))
            return None, tuple(pairs)
        return ints(raw), None

    # -- small pieces ----------------------------------------------------------------------
    def check_keys(self, raw: YMap, allowed: set[str], what: str) -> None:
        for key in raw:
            if key not in allowed:
                raise self.error(f"unknown key {key!r} in {what}", line_of(raw, key),
                                 hint=f"allowed: {', '.join(sorted(allowed))}")

    def known_rule(self, rule_id: str, line: int) -> CompiledRule:
        rule = self.rules.get(rule_id)
        if rule is None:
            raise self.error(f"no enabled rule {rule_id!r} in the rules under test", line,
                             hint=f"rules: {', '.join(self.rules) or '(none)'}")
        return rule

    def rule_list(self, raw: YMap, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = raw.get(key)
        if value is None:
            return default
        values = value if isinstance(value, list) else [value]
        line = line_of(raw, key)
        for v in values:
            if not isinstance(v, str):
                raise self.error(f"`{key}:` is a rule id or a list of rule ids", line)
            self.known_rule(v, line)
        return tuple(values)

    def stream_name(self, raw: YMap, default: str | None) -> str | None:
        value = raw.get("stream", default)
        if value is None:
            return next(iter(self.streams)) if len(self.streams) == 1 else None
        if value not in self.streams:
            raise self.error(f"unknown stream {value!r}", line_of(raw, "stream"),
                             hint=f"streams: {', '.join(self.streams)}")
        return str(value)

    def base(self, raw: YMap, default: int) -> int:
        if raw.get("base") is None:
            return default
        try:
            return parse_time(raw["base"], default)
        except ValueError as exc:
            raise self.error(f"`base:` {exc}", line_of(raw, "base")) from None

    def mapping(self, raw: YMap, key: str) -> dict[str, Any]:
        value = raw.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.error(f"`{key}:` is a mapping", line_of(raw, key))
        return dict(value)
