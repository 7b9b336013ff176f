"""A rule's version hash and key-state fingerprint, and the check that no two rules share one.

A native key state (core/src/keycodec.rs) names each rule's part by a 32-bit FNV-1a hash of
the rule's id and version (`rule_hash`): two rules of one engine with the same fingerprint
would read each other's state, so the core refuses to build an engine with both. The hash is
computed here too, in the language layer, so the pair is refused before any engine is built,
with one error naming both rules' files and lines, on every path: `check_paths` (`cep check`,
`cep explain`, `cep rules deploy`, `load_rules_dir`), the rules watcher (`RulesWatcher`, per
file) and the embedded engine's build (`build_embedded_engine`). It sits beside `cep.nfa`,
not in `cep.compile`, because the runtime binds rules with it and does not import the compiler.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from cep.errors import RuleSemanticError, Span
from cep.nfa import CompiledRule


def rule_hash(rule: CompiledRule) -> str:
    """A short hash of what the rule compiles to (its NFA and skip strategy), not its text."""
    text = f"{rule.version}|{rule.stream}|{rule.key_field}|{rule.skip}|{rule.nfa}|{rule.measures}"
    if rule.lookups:  # (kept out of the text otherwise: existing rules keep their hashes)
        text += f"|{rule.lookups}"
    if rule.over:
        text += f"|{rule.over}"
    if rule.window is not None:
        text += f"|{rule.window!r}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fingerprint(rule_id: str, version: str) -> int:
    """FNV-1a (32 bits) of the id, a 0xff byte and the version: `keycodec::fingerprint`."""
    h = 0x811C9DC5
    for b in rule_id.encode() + b"\xff" + version.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def rule_fingerprint(rule: CompiledRule) -> int:
    """The fingerprint naming the rule's part of a native key state."""
    return fingerprint(rule.id, rule_hash(rule))


def fingerprint_clash(rules: Iterable[CompiledRule]) -> RuleSemanticError | None:
    """An error naming two of `rules` whose key-state fingerprints are equal (their state
    would mix); None without a clash."""
    return claim_fingerprints(rules, {})


def claim_fingerprints(rules: Iterable[CompiledRule], taken: dict[int, CompiledRule],
                       source: str | None = None) -> RuleSemanticError | None:
    """An error naming two rules (of `taken`, or earlier in `rules`, and one of `rules`) whose
    key-state fingerprints are equal; without a clash the rules' fingerprints join `taken`
    (each fingerprint computed once)."""
    seen = dict(taken)
    for rule in rules:
        fp = rule_fingerprint(rule)
        other = seen.setdefault(fp, rule)
        if other is not rule and other.id != rule.id:  # one id twice has its own error
            return RuleSemanticError(
                f"rules {other.id!r} ({other.source}) and {rule.id!r} ({rule.source}) have the "
                f"same key-state fingerprint ({fp:08x}): their state would mix",
                Span.parse(rule.source),  # path:line:col of its RULE keyword
                source=source, hint="rename one of them")
    taken.update(seen)
    return None
