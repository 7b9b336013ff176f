"""Bind a compiled `RuleSet` to the engine: one `RuleRuntime` per enabled rule."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Any

from cep.nfa import CompiledRule, RuleSet
from cep.runtime.engine import Engine, RuleRuntime
from cep.runtime.matcher import Matcher, Result, State


class RuleMatcher:
    """Adapts `cep.runtime.matcher.Matcher` to the engine's matcher protocol."""

    def __init__(self, rule: CompiledRule, max_partial_matches: int | None = None) -> None:
        self.core = Matcher(rule, max_partial_matches=max_partial_matches)

    def initial(self) -> State:
        return None

    def on_event(self, state: State, event: Mapping[str, Any], ts: int, seq: Any,
                 key: str) -> tuple[State, list[Result]]:
        return self.core.on_event(state, event, ts, seq, key)

    def on_time(self, state: State, now: int, key: str) -> tuple[State, list[Result]]:
        return self.core.on_time(state, now, key)

    def next_deadline(self, state: State) -> int | None:
        d = self.core.next_deadline(state)
        if d is None or math.isinf(d):
            return None
        return math.ceil(d)

    def is_empty(self, state: State) -> bool:
        return state is None

    def on_end(self, state: State, key: str) -> tuple[State, list[Result]]:
        # End of input, after on_time(last event time): a greedy tail waiting for the event that
        # ends it is emitted; what would need more time to pass is dropped.
        return self.core.on_end(state, key)


def rule_hash(rule: CompiledRule) -> str:
    """A short hash of what the rule compiles to (its NFA and skip strategy), not its text."""
    text = f"{rule.version}|{rule.stream}|{rule.key_field}|{rule.skip}|{rule.nfa}|{rule.measures}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_engine(ruleset: RuleSet, *, max_partial_matches: int | None = None) -> Engine:
    runtimes = [
        RuleRuntime(rule.id, rule.stream.name, rule.key_field or "", rule.stream.lateness_ms,
                    RuleMatcher(rule, max_partial_matches), meta=rule, version=rule_hash(rule))
        for rule in ruleset.rules if rule.enabled
    ]
    return Engine(runtimes)
