"""Rule files → checked, compiled `RuleSet`s.

Pipeline (one pass per module): `parse` (text → `cep.ast`, syntax errors per statement),
`rules` (clauses, streams, DEFINE/MEASURES via `expressions`, PATTERN checks via `patterns`),
`nfa_build` (pattern → immutable `cep.nfa.Nfa`). Errors are collected, not raised one by one:
`check_text` returns all of them, `compile_rules` raises `CompileErrors` holding all of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from cep import ast
from cep.compile.diagnostics import CompileErrors, Diagnostics
from cep.compile.parse import parse_text
from cep.compile.rules import compile_rule, compile_streams, compile_tables
from cep.errors import RuleSemanticError, SourceError, Span
from cep.fingerprint import claim_fingerprints, rule_fingerprint
from cep.nfa import CompiledRule, RuleSet, StreamSpec, TableSpec

RULE_SUFFIXES = (".cep",)

__all__ = [
    "CompileErrors",
    "RULE_SUFFIXES",
    "check_paths",
    "check_text",
    "compile_file",
    "compile_rules",
    "load_rules_dir",
    "merge_rulesets",
    "parse_text",
    "read_sources",
    "ruleset_from_sources",
]


def compile_file(text: str, path: str = "<string>") -> tuple[RuleSet | None, list[SourceError]]:
    """Compile one file's text; returns the rule set (None on errors) and every error found."""
    tree, errors = parse_text(text, path)
    diag = Diagnostics(text)
    diag.errors.extend(errors)
    streams = compile_streams(tree.streams, diag)
    tables, table_view = compile_tables(tree.tables, streams, diag, path)
    compiled: list[CompiledRule] = []
    first_span: dict[str, Span] = {}
    for rule in tree.rules:
        if rule.id in first_span:
            diag.error(
                f"rule {rule.id!r} is defined twice",
                rule.span,
                f"the first definition is at line {first_span[rule.id].line}",
            )
            continue
        first_span[rule.id] = rule.span
        result = compile_rule(rule, streams, diag, table_view)
        if result is not None:
            compiled.append(result)
    errors = sorted(diag.errors, key=_order)
    if errors:
        return None, errors
    return RuleSet(tuple(compiled), tuple(spec for spec, _ in streams.values()),
                   tuple(tables.values())), []


def _order(e: SourceError) -> tuple[int, int]:
    return (e.span.line, e.span.col) if e.span else (0, 0)


def check_text(text: str, path: str = "<string>") -> list[SourceError]:
    return compile_file(text, path)[1]


def compile_rules(text: str, path: str = "<string>") -> RuleSet:
    rules, errors = compile_file(text, path)
    if errors or rules is None:
        raise CompileErrors(errors)
    return rules


def parse_file(text: str, path: str = "<string>") -> ast.RuleFile:
    """Just the syntax tree; raises `CompileErrors` on syntax errors."""
    tree, errors = parse_text(text, path)
    if errors:
        raise CompileErrors(errors)
    return tree


def rule_files(paths: Iterable[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(f for f in p.rglob("*") if f.suffix in RULE_SUFFIXES and f.is_file()))
        else:
            out.append(p)
    return out


def _read(path: Path) -> tuple[str | None, SourceError | None]:
    try:
        return path.read_text(encoding="utf-8"), None
    except (OSError, UnicodeDecodeError) as exc:
        return None, RuleSemanticError(f"cannot read rules file: {exc}", Span(str(path), 1, 1))


def check_paths(paths: Iterable[str | Path]) -> tuple[dict[Path, RuleSet], list[SourceError]]:
    """Compile every rules file under `paths` (linter mode): all rule sets and all errors,
    among them two rules with one key-state fingerprint (`cep.fingerprint`: a native
    engine refuses them)."""
    sets: dict[Path, RuleSet] = {}
    errors: list[SourceError] = []
    owner: dict[str, Path] = {}
    taken: dict[int, CompiledRule] = {}
    for path in rule_files(paths):
        text, err = _read(path)
        if err is not None or text is None:
            errors.append(err)  # type: ignore[arg-type]
            continue
        rules, errs = compile_file(text, str(path))
        errors.extend(errs)
        if rules is None:
            continue
        for r in rules:
            if r.id in owner:
                where = Span.parse(r.source)
                line = where.line if where is not None else 1
                errors.append(
                    RuleSemanticError(
                        f"rule id {r.id!r} is also defined in {owner[r.id]}",
                        Span(str(path), line, 1),
                        source=text,
                        hint="rule ids must be unique across the rules directory",
                    )
                )
            owner.setdefault(r.id, path)
        clash = claim_fingerprints(rules, taken, text)
        if clash is not None:
            errors.append(clash)
            # Claimed all the same: a later file clashing with them is reported too.
            for r in rules:
                taken.setdefault(rule_fingerprint(r), r)
        sets[path] = rules
    return sets, errors


def merge_rulesets(sets: Iterable[RuleSet]) -> RuleSet:
    """Several files' rule sets as one: every rule, in order; a stream declared by several
    files is the first file's declaration."""
    rules: list[CompiledRule] = []
    streams: dict[str, StreamSpec] = {}
    tables: dict[str, TableSpec] = {}
    for rs in sets:
        rules.extend(rs.rules)
        for s in rs.streams:
            streams.setdefault(s.name, s)
        for t in rs.tables:
            tables.setdefault(t.name, t)
    return RuleSet(tuple(rules), tuple(streams.values()), tuple(tables.values()))


def load_rules_dir(path: str | Path) -> RuleSet:
    """Every rule of every `*.cep` file under `path`, as one `RuleSet`; raises on any error."""
    sets, errors = check_paths([path])
    if errors:
        raise CompileErrors(errors)
    return merge_rulesets(sets.values())


def read_sources(paths: Iterable[str | Path]) -> dict[str, str]:
    """The text of every rules file under `paths`, by path: what Spark jobs ship to their
    workers (text is small and picklable; compiled closures are not)."""
    return {str(p): p.read_text(encoding="utf-8") for p in rule_files(paths)}


def ruleset_from_sources(sources: Mapping[str, str]) -> RuleSet:
    """Rule texts by path → one `RuleSet` (files in path order); raises `CompileErrors` on the
    first file with errors. A rule id defined in two files is not checked here: the live job's
    `RulesWatcher` and `cep check` do."""
    return merge_rulesets(compile_rules(text, path) for path, text in sorted(sources.items()))
