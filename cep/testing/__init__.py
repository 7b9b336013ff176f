"""Rule tests: hand-written YAML cases (events + expected alerts) run on the embedded engine,
with a readable diff on failure. No Spark here: `cep test` starts in a second.

`source` (YAML with line numbers) → `spec` (checked test files) → `runner` (engine + pairing
of expected and raised alerts) → `diff` (what a failure prints) → `suite` (files, totals).
"""

from cep.testing.diff import render_failure
from cep.testing.runner import CaseResult, GotAlert, run_case
from cep.testing.source import TestFileError
from cep.testing.spec import Case, ExpectedAlert, TestFile, load_test_file
from cep.testing.suite import SuiteResult, run_suite

__all__ = [
    "Case",
    "CaseResult",
    "ExpectedAlert",
    "GotAlert",
    "SuiteResult",
    "TestFile",
    "TestFileError",
    "load_test_file",
    "render_failure",
    "run_case",
    "run_suite",
]
