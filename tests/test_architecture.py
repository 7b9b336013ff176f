"""The layers and import directions in docs/architecture.md, and no eval/exec anywhere."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cep", "percolator", "jobs")


def _modules(pkg: str):
    yield from _parsed(pkg)


@functools.cache
def _parsed(pkg: str) -> tuple[tuple[Path, ast.Module], ...]:
    # Parsed once per run: 14 tests walk the same trees (the trees are only read).
    return tuple((path, ast.parse(path.read_text(), str(path)))
                 for path in sorted((ROOT / pkg).rglob("*.py")))


@functools.cache
def _imports(tree: ast.AST) -> frozenset[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return frozenset(names)


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _ours(tree: ast.AST) -> set[str]:
    """The project's modules a module imports (absolute imports; `from cep import x` counts as
    `cep.x`)."""
    names = set(_imports(tree))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return {n for n in names if n.split(".")[0] in PACKAGES}


def _layer_of(module: str) -> str | None:
    for layer, prefixes in LAYERS.items():
        if _under(module, prefixes):
            return layer
    return None


# The layers, bottom to top (docs/architecture.md). A module may import its own layer and the
# layers listed under ALLOWED for it; never one above.
LAYERS: dict[str, tuple[str, ...]] = {
    "base": ("cep.errors", "cep.config", "cep.events", "cep.tables", "cep.delivery", "cep.colour",
             "cep.datagen"),
    "language": ("cep.grammar", "cep.ast", "cep.expr", "cep.expr_columns", "cep.compile",
                 "cep.nfa", "cep.program", "cep.fingerprint"),
    "runtime": ("cep.runtime",),
    "host": ("cep.engines", "cep.rules_topic", "cep.testing", "cep.report"),
    "percolator": ("percolator",),
    "spark": ("cep.spark",),
    "jobs": ("jobs",),
    "cli": ("cep.cli",),
}
ALLOWED: dict[str, set[str]] = {
    "base": set(),
    "language": {"base"},
    "runtime": {"base", "language"},  # only the compiled forms: see the test below
    "host": {"base", "language", "runtime"},
    "percolator": {"base"},
    "spark": {"base", "language", "runtime", "host"},
    "jobs": {"base", "language", "runtime", "host", "percolator", "spark"},
    "cli": {"base", "language", "runtime", "host", "percolator", "spark", "jobs"},
}
# Shared by the jobs, not jobs themselves: the Spark session and the metrics file.
JOB_SHARED = ("jobs.session", "jobs.metrics")


def _all_modules():
    for pkg in PACKAGES:
        for path, tree in _modules(pkg):
            yield _module(path), path, tree


def test_every_module_has_a_layer():
    """A new module must be placed: add it to LAYERS (and docs/architecture.md)."""
    missing = [_rel(p) for name, p, _ in _all_modules()
               if name not in ("cep", "cep._core") and _layer_of(name) is None]
    assert missing == []


def test_layers_import_only_downward():
    offenders = []
    for name, path, tree in _all_modules():
        layer = _layer_of(name)
        if layer is None:
            continue
        for dep in sorted(_ours(tree)):
            target = _layer_of(dep)
            if target is None or target == layer:
                continue
            if target not in ALLOWED[layer]:
                offenders.append(f"{_rel(path)} ({layer}) imports {dep} ({target})")
    assert offenders == [], "imports against the layers:\n" + "\n".join(offenders)


def test_runtime_imports_only_the_compiled_forms():
    """The runtime gets `cep.nfa` objects (and their `cep.expr` trees): not the parser, not the
    syntax tree, not the compiler, not Spark."""
    offenders = []
    for name, path, tree in _all_modules():
        if not _under(name, ("cep.runtime",)):
            continue
        bad = {n for n in _imports(tree) | _ours(tree)
               if _under(n, ("pyparsing", "pyspark", "cep.grammar", "cep.ast", "cep.compile"))}
        if bad:
            offenders.append((_rel(path), sorted(bad)))
    assert offenders == []


def test_percolator_and_cep_share_only_the_base():
    offenders = []
    for name, path, tree in _all_modules():
        if _under(name, ("percolator",)):
            bad = {d for d in _ours(tree) if _under(d, ("cep",)) and _layer_of(d) != "base"}
        elif _under(name, ("cep",)) and _layer_of(name) not in ("cli", "jobs"):
            bad = {d for d in _ours(tree) if _under(d, ("percolator",))}
        else:
            continue
        if bad:
            offenders.append((_rel(path), sorted(bad)))
    assert offenders == []


def _job(module: str) -> str | None:
    """jobs.live → 'live'; jobs.console.app → 'console'; shared modules → None."""
    if not _under(module, ("jobs",)) or _under(module, JOB_SHARED) or module == "jobs":
        return None
    return module.split(".")[1]


def test_no_job_imports_another_job():
    offenders = []
    for name, path, tree in _all_modules():
        mine = _job(name)
        if mine is None:
            continue
        for dep in _ours(tree):
            other = _job(dep)
            if other is not None and other != mine:
                offenders.append(f"{_rel(path)} imports {dep}")
    assert offenders == []


def test_only_the_cli_imports_the_jobs():
    offenders = [f"{_rel(path)} imports {dep}"
                 for name, path, tree in _all_modules()
                 if not _under(name, ("jobs", "cep.cli"))
                 for dep in sorted(_ours(tree)) if _under(dep, ("jobs",))]
    assert offenders == []


def test_the_cli_is_one_package():
    """Every subcommand is registered by a module of cep/cli/, imported by name (never
    `importlib.import_module` of a string, which hides the dependency from these tests), and no
    other package defines `register(subparsers)`."""
    strays = []
    for name, path, tree in _all_modules():
        if any(isinstance(n, ast.Attribute) and n.attr == "import_module" for n in ast.walk(tree)):
            strays.append(f"{_rel(path)}: import_module")
        if not _under(name, ("cep.cli",)) and any(
                isinstance(n, ast.FunctionDef) and n.name == "register" for n in tree.body):
            strays.append(f"{_rel(path)}: register")
    assert strays == []


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
