"""Rules for Spark's Python workers: shipped as source text, compiled once per worker, and
replaceable while the job runs.

The processor object is pickled to every task, so it carries rule *text* (small, always
picklable), never compiled closures. Two factories:
- `RulesEngineFactory`: a fixed set of sources (replay);
- `SnapshotEngineFactory`: reads the accepted snapshot file that the live job's driver writes
  when the rules directory changes (`RulesWatcher`); every task loads the current snapshot when
  the operator starts it, so a change takes effect at the next micro-batch.
Engines are cached per worker under a hash of the sources.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cep.compile import check_paths, compile_rules, rule_files
from cep.errors import SourceError
from cep.nfa import CompiledRule, RuleSet, StreamSpec
from cep.runtime.bind import build_engine, rule_hash
from cep.runtime.engine import Engine

log = logging.getLogger(__name__)


def _digest(sources: dict[str, str], extra: str = "") -> int:
    h = hashlib.sha256()
    for path, text in sorted(sources.items()):
        h.update(path.encode() + b"\0" + text.encode() + b"\0")
    h.update(extra.encode())
    return int.from_bytes(h.digest()[:8], "big")


def ruleset_from_sources(sources: dict[str, str]) -> RuleSet:
    rules: list[CompiledRule] = []
    streams: dict[str, StreamSpec] = {}
    for path, text in sorted(sources.items()):
        rs = compile_rules(text, path)
        rules.extend(rs.rules)
        for s in rs.streams:
            streams.setdefault(s.name, s)
    return RuleSet(tuple(rules), tuple(streams.values()))


class RulesEngineFactory:
    def __init__(self, sources: dict[str, str], max_partial_matches: int | None = None) -> None:
        self.sources = dict(sorted(sources.items()))
        self.max_partial_matches = max_partial_matches
        self.cache_key = _digest(self.sources, str(max_partial_matches))

    @classmethod
    def from_path(cls, path: str | Path, max_partial_matches: int | None = None,
                  ) -> RulesEngineFactory:
        files = rule_files([path])
        return cls({str(p): p.read_text() for p in files}, max_partial_matches)

    def ruleset(self) -> RuleSet:
        return ruleset_from_sources(self.sources)

    def load(self) -> tuple[int, Callable[[], Engine]]:
        return self.cache_key, self

    def __call__(self) -> Engine:
        return build_engine(self.ruleset(), max_partial_matches=self.max_partial_matches)


class SnapshotEngineFactory:
    def __init__(self, snapshot: str, max_partial_matches: int | None = None) -> None:
        self.snapshot = snapshot
        self.max_partial_matches = max_partial_matches

    def load(self) -> tuple[int, Callable[[], Engine]]:
        data = json.loads(Path(self.snapshot).read_text())
        inner = RulesEngineFactory(data["sources"], self.max_partial_matches)
        return inner.cache_key, inner


@dataclass
class RulesChange:
    accepted: bool
    versions: dict[str, str] = field(default_factory=dict)  # rule id -> hash (enabled rules)
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    errors: list[SourceError] = field(default_factory=list)
    ruleset: RuleSet | None = None


class RulesWatcher:
    """Polls a rules directory; a change that passes `cep check` becomes the new snapshot,
    one that fails is rejected with the errors logged, and the previous rules keep running."""

    def __init__(self, rules_dir: str, snapshot: str) -> None:
        self.rules_dir = rules_dir
        self.snapshot = snapshot
        self._seen: int | None = None
        self.versions: dict[str, str] = {}
        self.ruleset: RuleSet | None = None

    def _read(self) -> dict[str, str]:
        return {str(p): p.read_text() for p in rule_files([self.rules_dir])}

    def poll(self) -> RulesChange | None:
        sources = self._read()
        key = _digest(sources)
        if key == self._seen:
            return None
        self._seen = key
        _, errors = check_paths([self.rules_dir])
        if errors:
            for err in errors:
                log.error("rules change rejected; the previous rules keep running:\n%s", err)
            return RulesChange(False, errors=list(errors))
        ruleset = ruleset_from_sources(sources)
        versions = {r.id: rule_hash(r) for r in ruleset.rules if r.enabled}
        change = RulesChange(
            True, versions,
            added=sorted(set(versions) - set(self.versions)),
            changed=sorted(r for r in versions if r in self.versions
                           and versions[r] != self.versions[r]),
            removed=sorted(set(self.versions) - set(versions)),
            ruleset=ruleset,
        )
        tmp = f"{self.snapshot}.tmp"
        Path(tmp).parent.mkdir(parents=True, exist_ok=True)
        Path(tmp).write_text(json.dumps({"sources": sources, "versions": versions}))
        os.replace(tmp, self.snapshot)
        self.versions = versions
        self.ruleset = ruleset
        log.info("rules accepted: added %s, changed %s, removed or disabled %s",
                 change.added, change.changed, change.removed)
        return change
