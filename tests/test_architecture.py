"""The import directions in docs/architecture.md, and no eval/exec anywhere in the engine."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cep", "percolator", "jobs")


def _modules(pkg: str):
    for path in sorted((ROOT / pkg).rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def _imports(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_pyspark_only_in_adapter_and_jobs():
    offenders = []
    for pkg in ("cep", "percolator"):
        for path, tree in _modules(pkg):
            if _rel(path).startswith("cep/spark/"):
                continue
            if any(n == "pyspark" or n.startswith("pyspark.") for n in _imports(tree)):
                offenders.append(_rel(path))
    assert offenders == [], f"pyspark imported outside cep/spark and jobs/: {offenders}"


def test_runtime_does_not_need_the_parser():
    offenders = []
    for path, tree in _modules("cep"):
        if not _rel(path).startswith("cep/runtime/"):
            continue
        bad = {n for n in _imports(tree)
               if n.startswith("pyparsing") or n in {"cep.grammar", "cep.compile"}
               or n.startswith("cep.compile.")}
        if bad:
            offenders.append((_rel(path), sorted(bad)))
    assert offenders == []


@pytest.mark.parametrize("pkg", PACKAGES)
def test_no_eval_or_exec(pkg):
    calls = []
    for path, tree in _modules(pkg):
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in {"eval", "exec", "compile"}):
                calls.append(f"{_rel(path)}:{node.lineno}")
    assert calls == []


def _literal_pattern(arg: ast.expr, tree: ast.Module) -> bool:
    """A string literal, or a module-level constant assigned one."""
    if isinstance(arg, ast.Constant):
        return True
    if isinstance(arg, ast.Name):
        for node in tree.body:
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                    and any(isinstance(t, ast.Name) and t.id == arg.id for t in node.targets)):
                return True
    return False


def test_dynamic_regexes_use_re2():
    """Stdlib `re` only ever gets a literal pattern (our own); any pattern built at run time — a
    user's regex — must go through google-re2, which runs in linear time."""
    fns = {"compile", "match", "fullmatch", "search", "findall", "finditer", "sub", "split"}
    offenders = []
    for pkg in PACKAGES:
        for path, tree in _modules(pkg):
            for node in ast.walk(tree):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "re"
                        and node.func.attr in fns and node.args
                        and not _literal_pattern(node.args[0], tree)):
                    offenders.append(f"{_rel(path)}:{node.lineno}")
    assert offenders == [], f"stdlib re called with a non-literal pattern: {offenders}"
