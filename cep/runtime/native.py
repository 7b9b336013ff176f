"""The native matcher core (`cep._core`, a Rust extension) behind the Python matcher's API.

`native_matcher(rule)` returns a `cep._core.Matcher` running the rule's exported program
(`cep.program`) with exactly the semantics of `cep.runtime.matcher.Matcher`, or None
when the extension is not built or the rule uses something the core does not reproduce exactly
(`why_not_native` says what). `CEP_ENGINE=python` forces the Python matcher everywhere.
docs/native-core.md describes the split, the program format and the state format.
"""

from __future__ import annotations

import os
from typing import Any

from cep.nfa import CompiledRule
from cep.program import Unsupported, export_program

try:
    from cep import _core  # type: ignore[attr-defined]
except ImportError as e:  # not built (e.g. a source checkout without cargo)
    _core = None  # type: ignore[assignment]
    IMPORT_ERROR: str | None = str(e)
else:
    IMPORT_ERROR = None


def available() -> bool:
    return _core is not None


def wanted() -> bool:
    """False when the environment asks for the Python matcher (`CEP_ENGINE=python`)."""
    return os.environ.get("CEP_ENGINE", "").strip().lower() not in ("python", "py")


def why_not_native(rule: CompiledRule) -> str | None:
    """None if `rule` runs on the native core, else the reason it runs on the Python matcher."""
    if _core is None:
        return f"native core not built ({IMPORT_ERROR})"
    try:
        program = export_program(rule)
        _core.Matcher(program, rule)
    except Unsupported as e:
        return str(e)
    except _core.Unsupported as e:
        return str(e)
    return None


def native_matcher(rule: CompiledRule, *, max_partial_matches: int | None = None) -> Any | None:
    """A native matcher for `rule`, or None when it must run on the Python matcher."""
    if _core is None:
        return None
    try:
        program = export_program(rule)
        return _core.Matcher(program, rule, max_partial_matches)
    except (Unsupported, _core.Unsupported):
        return None


def native_program(rule: CompiledRule) -> dict[str, Any] | None:
    """The rule's exported program when the core runs it (checked by building its matcher),
    else None."""
    if _core is None:
        return None
    try:
        program = export_program(rule)
        _core.Matcher(program, rule)
    except (Unsupported, _core.Unsupported):
        return None
    return program


__all__ = ["available", "native_matcher", "native_program", "wanted", "why_not_native"]
