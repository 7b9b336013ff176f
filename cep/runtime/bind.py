"""Bind a compiled `RuleSet` to the engine: one `RuleRuntime` per enabled rule."""

from __future__ import annotations

import hashlib

from cep.nfa import CompiledRule, RuleSet
from cep.runtime.engine import Engine, RuleRuntime
from cep.runtime.matcher import Matcher


def rule_hash(rule: CompiledRule) -> str:
    """A short hash of what the rule compiles to (its NFA and skip strategy), not its text."""
    text = f"{rule.version}|{rule.stream}|{rule.key_field}|{rule.skip}|{rule.nfa}|{rule.measures}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_engine(ruleset: RuleSet, *, max_partial_matches: int | None = None) -> Engine:
    runtimes = [
        RuleRuntime(rule.id, rule.stream.name, rule.key_field or "", rule.stream.lateness_ms,
                    Matcher(rule, max_partial_matches=max_partial_matches), meta=rule,
                    version=rule_hash(rule))
        for rule in ruleset.rules if rule.enabled
    ]
    return Engine(runtimes)
