"""Find test files under paths, run every case, and keep what the command line prints."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cep.errors import SourceError, Span
from cep.nfa import RuleSet
from cep.testing.runner import CaseResult, run_case
from cep.testing.source import TestFileError
from cep.testing.spec import RulesError, TestFile, compile_rules_path, load_test_file

TEST_SUFFIXES = (".yaml", ".yml")


@dataclass
class SuiteResult:
    files: list[TestFile] = field(default_factory=list)
    results: list[tuple[TestFile, CaseResult]] = field(default_factory=list)
    errors: list[SourceError] = field(default_factory=list)  # test files or rules that are wrong
    uncovered: list[tuple[Path, str]] = field(default_factory=list)  # rules no case expects

    @property
    def failed(self) -> list[tuple[TestFile, CaseResult]]:
        return [(t, r) for t, r in self.results if not r.passed]

    @property
    def exit_code(self) -> int:
        if self.errors:
            return 2
        return 1 if self.failed else 0


def test_files(paths: Iterable[str | Path]) -> tuple[list[Path], list[SourceError]]:
    """Every `*.yaml`/`*.yml` under folders (recursively) and every file named directly."""
    found: list[Path] = []
    errors: list[SourceError] = []
    for p in map(Path, paths):
        if p.is_dir():
            found.extend(sorted(f for f in p.rglob("*") if f.suffix in TEST_SUFFIXES
                                and f.is_file()))
        elif p.is_file():
            found.append(p)
        else:
            errors.append(TestFileError("no such file or directory", Span(str(p), 1, 1)))
    return found, errors


def run_suite(paths: Iterable[str | Path], *, select: str | None = None) -> SuiteResult:
    """Run every case of every test file; `select` keeps cases whose name contains it."""
    out = SuiteResult()
    files, out.errors = test_files(paths)
    cache: dict[Path, RuleSet | RulesError] = {}

    def load_rules(path: Path) -> RuleSet:
        if path not in cache:
            try:
                cache[path] = compile_rules_path(path)
            except RulesError as exc:
                cache[path] = exc
                out.errors.extend(exc.errors)  # once per rules file, however many tests use it
        found = cache[path]
        if isinstance(found, RulesError):
            raise found
        return found

    for path in files:
        try:
            test = load_test_file(path, load_rules)
        except TestFileError as exc:
            out.errors.append(exc)
            continue
        except RulesError:
            out.errors.append(TestFileError("the rules under test do not compile (errors "
                                            "above)", Span(str(path), 1, 1)))
            continue
        out.files.append(test)
        for case in test.cases:
            if select is not None and select not in case.name:
                continue
            out.results.append((test, run_case(test, case)))
    out.uncovered = _uncovered(out.files)
    return out


def _uncovered(files: list[TestFile]) -> list[tuple[Path, str]]:
    """Enabled rules of the tested rule files that no case expects to alert."""
    expected = {(t.rules_path, e.rule) for t in files for c in t.cases for e in c.expect}
    seen: set[tuple[Path, str]] = set()
    out = []
    for t in files:
        for r in t.ruleset.rules:
            item = (t.rules_path, r.id)
            if r.enabled and item not in expected and item not in seen:
                seen.add(item)
                out.append(item)
    return out
