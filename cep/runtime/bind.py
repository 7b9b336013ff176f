"""Bind a compiled `RuleSet` to the engine: one `RuleRuntime` per enabled rule.

Each rule runs on the native matcher core (`cep._core`, see `cep.runtime.native`) when the
extension is built and the rule uses nothing the core does not reproduce exactly; otherwise on
the Python matcher (`cep.runtime.matcher`). `CEP_ENGINE=python` forces the Python matcher.
Both give the same results (tests/core/test_native_differential.py).

`build_embedded_engine` goes one step further for the embedded mode (`run_embedded`,
`alerts_for`, `cep test`): when every enabled rule runs on the native matcher, the engine loop
runs in the core too (`cep.runtime.native_engine.NativeEngine`, stage 2 of issue 13); when only
some do, those run on the core's loop and the others on the Python loop, side by side
(`cep.runtime.mixed.MixedEngine`); else it is `build_engine`'s. The live Spark operator runs
whichever it returns, with a key store to match (docs/native-core.md).
"""

from __future__ import annotations

from typing import Any

from cep.fingerprint import fingerprint_clash, rule_hash
from cep.nfa import CompiledRule, RuleSet
from cep.runtime import native
from cep.runtime.engine import Engine, RuleRuntime, TableRuntime
from cep.runtime.matcher import Matcher
from cep.runtime.windows import OverMatcher, WindowRuleMatcher, python_matcher


def make_matcher(rule: CompiledRule, *, max_partial_matches: int | None = None,
                 use_native: bool | None = None) -> Any:
    """The native matcher for `rule` when possible (and wanted), else the Python one."""
    if use_native is None:
        use_native = native.wanted()
    if use_native:
        m = native.native_matcher(rule, max_partial_matches=max_partial_matches)
        if m is not None:
            return m
    return python_matcher(rule, max_partial_matches=max_partial_matches)


def matcher_kind(matcher: Any) -> str:
    return "python" if isinstance(matcher, Matcher | OverMatcher | WindowRuleMatcher) else "native"


def build_engine(ruleset: RuleSet, *, max_partial_matches: int | None = None,
                 use_native: bool | None = None, near_misses: bool = False) -> Engine:
    """`near_misses`: report timed-out partial matches of every rule (the console's playground);
    the Python matcher does that, so those rules run on it."""
    runtimes = [
        RuleRuntime(rule.id, rule.stream.name, rule.key_field or "", rule.stream.lateness_ms,
                    python_matcher(rule, max_partial_matches=max_partial_matches,
                                   near_misses=True)
                    if near_misses else
                    make_matcher(rule, max_partial_matches=max_partial_matches,
                                 use_native=use_native),
                    meta=rule, content_hash=rule_hash(rule), lookups=rule.lookups)
        for rule in ruleset.rules if rule.enabled
    ]
    return Engine(runtimes, table_runtimes(ruleset))


def table_runtimes(ruleset: RuleSet) -> list[TableRuntime]:
    """The engine's view of the rule set's tables: a FILE table's rows, a KAFKA table's key."""
    return [TableRuntime(t.name, t.key, t.rows if t.source_kind == "FILE" else None)
            for t in ruleset.tables]


def build_embedded_engine(ruleset: RuleSet, *, max_partial_matches: int | None = None,
                          use_native: bool | None = None, mixed: bool = True,
                          families: bool | None = None) -> Any:
    """The native engine (`NativeEngine`) when the core is built, wanted (`CEP_ENGINE` is not
    `python`) and runs every enabled rule; when it runs some of them (and `mixed`), a
    `cep.runtime.mixed.MixedEngine` (those rules on the native loop, the others on the Python
    one); else `build_engine(...)`. All have `ingest`, `advance`, `next_wake` and `rules`, and
    work with `run_embedded` and a `MemoryKeyStore`. `families`: the native loop runs rules
    that differ only in constants together (docs/rule-families.md); None: on unless the
    environment sets `CEP_RULE_FAMILIES=0`."""
    if use_native is None:
        use_native = native.wanted()
    if use_native and native.available():
        rules = [rule for rule in ruleset.rules if rule.enabled]
        clash = fingerprint_clash(rules)
        if clash is not None:  # (the core refuses it too, without files and lines)
            raise clash
        programs = [native.native_program(rule) for rule in rules]
        if rules and any(p is not None for p in programs):
            runtimes = [
                RuleRuntime(rule.id, rule.stream.name, rule.key_field or "",
                            rule.stream.lateness_ms,
                            make_matcher(rule, max_partial_matches=max_partial_matches,
                                         use_native=True),
                            meta=rule, content_hash=rule_hash(rule), lookups=rule.lookups)
                for rule in rules
            ]
            if all(p is not None for p in programs):
                from cep.runtime.native_engine import NativeEngine

                return NativeEngine(runtimes, programs,  # type: ignore[arg-type]
                                    max_partial_matches=max_partial_matches, families=families)
            if mixed:
                from cep.runtime.mixed import MixedEngine

                return MixedEngine(runtimes,
                                   {r.rule_id: p for r, p in zip(runtimes, programs, strict=True)
                                    if p is not None},
                                   table_runtimes(ruleset),
                                   max_partial_matches=max_partial_matches, families=families)
    return build_engine(ruleset, max_partial_matches=max_partial_matches, use_native=use_native)


def engine_kind(engine: Any) -> str:
    """"native" for the engine loop in the core, "python" for `cep.runtime.engine.Engine`,
    "mixed" for `cep.runtime.mixed.MixedEngine` (both loops, each with its rules)."""
    if isinstance(engine, Engine):
        return "python"
    from cep.runtime.mixed import MixedEngine

    return "mixed" if isinstance(engine, MixedEngine) else "native"


def matcher_report(ruleset: RuleSet) -> list[tuple[str, str, str | None]]:
    """Per enabled rule: (rule id, "native" | "python", why not native)."""
    out = []
    for rule in ruleset.rules:
        if not rule.enabled:
            continue
        why = native.why_not_native(rule) if native.wanted() else "CEP_ENGINE=python"
        out.append((rule.id, "python" if why else "native", why))
    return out


def engine_plan(ruleset: RuleSet) -> tuple[str, list[tuple[str, str, str | None]]]:
    """Which engine loop `build_embedded_engine` runs these rules on ("native", "mixed" or
    "python", as `engine_kind` names it, without building it) and `matcher_report`'s lines."""
    report = matcher_report(ruleset)
    kinds = {kind for _, kind, _ in report}
    if not report or not native.available() or not native.wanted() or kinds == {"python"}:
        return "python", report
    return ("native" if kinds == {"native"} else "mixed"), report


def engine_summary(ruleset: RuleSet) -> list[str]:
    """`cep explain`'s lines on the engine loop: which rules run where, and why not native."""
    kind, report = engine_plan(ruleset)
    n_native = sum(1 for _, k, _ in report if k == "native")
    head = {"native": f"engine: native — all {len(report)} rules on the native engine loop",
            "mixed": f"engine: mixed — {n_native} rules on the native engine loop, "
                     f"{len(report) - n_native} on the Python loop beside it",
            "python": f"engine: python — all {len(report)} rules on the Python engine loop"}[kind]
    lines = [head]
    for rule_id, k, why in report:
        lines.append(f"  {rule_id}: {k}" + (f" ({why})" if why else ""))
    return lines
