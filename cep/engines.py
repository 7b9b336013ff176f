"""Rule files → engines: the rules as jobs ship them (source text), compiled once per worker,
and replaceable while the job runs. Plain Python: no Spark here (the Spark operator,
`cep.spark.operator`, takes any `EngineFactory`).

The processor object is pickled to every task, so it carries rule *text* (small, always
picklable), never compiled closures. Two factories:
- `RulesEngineFactory`: a fixed set of sources (replay);
- `SnapshotEngineFactory`: reads the accepted snapshot file that the live job's driver writes
  when the rules change (`RulesWatcher`); every task loads the current snapshot when the
  operator starts it, so a change takes effect at the next micro-batch.
Engines are cached per worker under a hash of the sources.

Where the rules come from is a `RulesSource`: a directory (`DirectorySource`, one unit per
file) or a compacted Kafka topic (`cep.rules_topic.TopicSource`, one unit per rule: the text of
the file it was deployed from, of which the unit runs that one rule). The watcher judges units
the same way whatever the source.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from cep.compile import (
    compile_file,
    compile_rules,
    merge_rulesets,
    read_sources,
    ruleset_from_sources,
)
from cep.errors import RuleSemanticError, SourceError, Span
from cep.fingerprint import claim_fingerprints
from cep.nfa import CompiledRule, RuleSet
from cep.runtime.bind import build_embedded_engine, rule_hash
from cep.runtime.engine import Engine

log = logging.getLogger(__name__)


def _digest(sources: dict[str, str], extra: str = "") -> int:
    h = hashlib.sha256()
    for path, text in sorted(sources.items()):
        h.update(path.encode() + b"\0" + text.encode() + b"\0")
    h.update(extra.encode())
    return int.from_bytes(h.digest()[:8], "big")


def select_rule(rules: RuleSet, rule_id: str) -> RuleSet:
    """The one rule `rule_id` of a compiled file, with the stream it reads."""
    chosen = tuple(r for r in rules.rules if r.id == rule_id)
    names = {r.stream.name for r in chosen}
    used = {table for r in chosen for table, _ in r.lookups}
    return RuleSet(chosen, tuple(s for s in rules.streams if s.name in names),
                   tuple(t for t in rules.tables if t.name in used))


def sources_ruleset(sources: dict[str, str], select: dict[str, str] | None = None) -> RuleSet:
    """Units' texts → one `RuleSet`; a unit named in `select` runs only that rule of its text.

    Compiled once per process for the same texts: a `RuleSet` is immutable, and parsing is
    the costly part (`cep demo` compiled rules/ once per stream in the driver, ~1 s each)."""
    key = _digest(sources, json.dumps(sorted((select or {}).items())))
    cached = _RULESETS.get(key)
    if cached is not None:
        return cached
    if not select:
        ruleset = ruleset_from_sources(sources)
    else:
        ruleset = merge_rulesets(
            select_rule(compile_rules(text, name), select[name]) if name in select
            else compile_rules(text, name) for name, text in sorted(sources.items()))
    if len(_RULESETS) >= 16:
        _RULESETS.pop(next(iter(_RULESETS)))
    _RULESETS[key] = ruleset
    return ruleset


_RULESETS: dict[int, RuleSet] = {}  # sources_ruleset's compilations, oldest first


class EngineFactory(Protocol):
    """What the Spark operator is given: `load()` → (cache key, a builder of the engine)."""

    def load(self) -> tuple[int, Callable[[], Engine]]: ...


class RulesEngineFactory:
    def __init__(self, sources: dict[str, str], max_partial_matches: int | None = None,
                 select: dict[str, str] | None = None) -> None:
        self.sources = dict(sorted(sources.items()))
        self.max_partial_matches = max_partial_matches
        self.select = dict(sorted((select or {}).items()))
        self.cache_key = _digest(self.sources, f"{max_partial_matches}|{json.dumps(self.select)}")

    @classmethod
    def from_path(cls, path: str | Path, max_partial_matches: int | None = None,
                  ) -> RulesEngineFactory:
        return cls(read_sources([path]), max_partial_matches)

    def ruleset(self) -> RuleSet:
        return sources_ruleset(self.sources, self.select)

    def load(self) -> tuple[int, Callable[[], Engine]]:
        return self.cache_key, self

    def __call__(self) -> Engine:
        # The engine loop in the native core when every rule runs there (as embedded runs
        # and `cep test`), else the Python loop: the operator picks its key store to match.
        return build_embedded_engine(  # type: ignore[no-any-return]
            self.ruleset(), max_partial_matches=self.max_partial_matches)


class SnapshotEngineFactory:
    def __init__(self, snapshot: str, max_partial_matches: int | None = None) -> None:
        self.snapshot = snapshot
        self.max_partial_matches = max_partial_matches

    def load(self) -> tuple[int, Callable[[], Engine]]:
        data = json.loads(Path(self.snapshot).read_text())
        inner = RulesEngineFactory(data["sources"], self.max_partial_matches,
                                   data.get("select"))
        return inner.cache_key, inner


@dataclass
class RulesChange:
    accepted: bool  # the running rules change (some file's new text was accepted)
    versions: dict[str, str] = field(default_factory=dict)  # rule id -> hash (enabled rules)
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    errors: list[SourceError] = field(default_factory=list)
    ruleset: RuleSet | None = None
    # Per rules file: {"status": "accepted" | "rejected", "errors": [...], "running": which
    # text runs ("current", "previous" or "none")}.
    files: dict[str, dict[str, object]] = field(default_factory=dict)
    # Per running rule id: where its text came from (`RulesSource.meta`: the file, or the
    # topic's version number, content hash, who deployed it and when).
    provenance: dict[str, dict[str, object]] = field(default_factory=dict)


class RulesSource(Protocol):
    """Where the rules come from: units of rule text by name (a file, or a rule deployed to a
    topic). `settle`: a new text is judged only once a second read gives it unchanged (files
    can be caught mid-write; topic records cannot)."""

    settle: bool

    def read(self) -> dict[str, str]:
        """Every unit's current text, by unit name."""
        ...

    def compile(self, name: str, text: str) -> tuple[RuleSet | None, list[SourceError]]:
        """A unit's text compiled to the rules it runs (errors name the unit)."""
        ...

    def selected(self, name: str) -> str | None:
        """The one rule of its text a unit runs (None: all of them)."""
        ...

    def meta(self, name: str) -> dict[str, object]:
        """What the last `read` knows about a unit's text beyond it (version, deployer)."""
        ...


class DirectorySource:
    """A rules directory: one unit per `*.cep` file, every rule of it."""

    settle = True

    def __init__(self, path: str) -> None:
        self.path = path
        self._texts: dict[str, str] = {}

    def read(self) -> dict[str, str]:
        self._texts = read_sources([self.path])
        return self._texts

    def compile(self, name: str, text: str) -> tuple[RuleSet | None, list[SourceError]]:
        return compile_file(text, name)

    def selected(self, name: str) -> str | None:
        return None

    def meta(self, name: str) -> dict[str, object]:
        text = self._texts.get(name, "")
        return {"source": name, "sha256": hashlib.sha256(text.encode()).hexdigest()}


class RulesWatcher:
    """Polls a rules directory and reloads it **per file**: a file that compiles is accepted
    as it is now; a file that does not is rejected with its errors (logged, and in the metrics'
    `rules_files`), and its previously accepted text, if any, keeps running. So a broken file
    never blocks valid edits in the other files. A file whose rule id is already defined by
    another accepted file is rejected (the file that was there first keeps the id).

    Each poll reads every file once and compiles each new text once: the rule set that runs is
    built from the very compilations that were checked, and the snapshot the workers load holds
    the very texts that were read.

    `strict` (the first poll, at start-up): any rejected file is an error, as `cep check`
    would say; the job does not start with rules silently missing.

    `settle`: a changed text is judged only when the next poll reads it unchanged, so a file
    caught mid-write (an editor or `>` truncates, then writes) is never taken for the new rules:
    an empty `fraud.cep` read between the two would compile to no rules and remove them all (a
    live-job test saw exactly that). Costs one poll interval of reload delay."""

    def __init__(self, rules: str | RulesSource, snapshot: str, settle: bool | None = None,
                 ) -> None:
        self.source: RulesSource = DirectorySource(rules) if isinstance(rules, str) else rules
        self.snapshot = snapshot
        self.settle = self.source.settle if settle is None else settle
        self._pending: int | None = None  # a new text's digest, waiting for the next poll
        self._seen: int | None = None
        self.versions: dict[str, str] = {}
        self.ruleset: RuleSet | None = None
        self.accepted: dict[str, str] = {}  # path -> the accepted text of that file
        self._compiled: dict[str, RuleSet] = {}  # path -> the accepted text, compiled
        self._meta: dict[str, dict[str, object]] = {}  # path -> its accepted text's meta
        self.provenance: dict[str, dict[str, object]] = {}  # rule id -> meta (running rules)

    def _read(self) -> dict[str, str]:
        return self.source.read()

    def poll(self) -> RulesChange | None:
        sources = self._read()
        key = _digest(sources)
        if key == self._seen:
            self._pending = None
            return None
        if self.settle and self._seen is not None and key != self._pending:
            self._pending = key  # seen once: judged if the next poll reads the same
            return None
        self._pending = None
        strict = self._seen is None
        self._seen = key
        candidate, compiled, files, errors = self._judge(sources)
        if strict and errors:
            for err in errors:
                log.error("rules rejected:\n%s", err.render())
            return RulesChange(False, errors=errors, files=files)
        for err in errors:
            log.error("rules file rejected; its previous version (if any) keeps running:\n%s",
                      err.render())
        if candidate == self.accepted and self.ruleset is not None:
            return RulesChange(False, dict(self.versions), errors=errors, files=files,
                               ruleset=self.ruleset, provenance=dict(self.provenance))
        ruleset = merge_rulesets(compiled[path] for path in sorted(candidate))
        versions = {r.id: rule_hash(r) for r in ruleset.rules if r.enabled}
        metas = {path: (self._meta[path] if candidate[path] == self.accepted.get(path)
                        and path in self._meta else self.source.meta(path))
                 for path in candidate}
        provenance = {r.id: {**metas[path], "rule_hash": rule_hash(r)}
                      for path in sorted(candidate) for r in compiled[path].rules
                      if r.id in versions}
        select = {path: rid for path in candidate
                  if (rid := self.source.selected(path)) is not None}
        change = RulesChange(
            True, versions,
            added=sorted(set(versions) - set(self.versions)),
            changed=sorted(r for r in versions if r in self.versions
                           and versions[r] != self.versions[r]),
            removed=sorted(set(self.versions) - set(versions)),
            errors=errors, ruleset=ruleset, files=files, provenance=provenance,
        )
        tmp = f"{self.snapshot}.tmp"
        Path(tmp).parent.mkdir(parents=True, exist_ok=True)
        Path(tmp).write_text(json.dumps({"sources": candidate, "select": select,
                                         "versions": versions, "provenance": provenance}))
        os.replace(tmp, self.snapshot)
        self.versions = versions
        self.ruleset = ruleset
        self.accepted = candidate
        self._compiled = compiled
        self._meta = metas
        self.provenance = provenance
        log.info("rules accepted: added %s, changed %s, removed or disabled %s",
                 change.added, change.changed, change.removed)
        return change

    def _judge(self, sources: dict[str, str]) -> tuple[
            dict[str, str], dict[str, RuleSet], dict[str, dict[str, object]], list[SourceError]]:
        """Each file on its own: (the texts to run, those texts compiled, per-file status,
        every error)."""
        candidate: dict[str, str] = {}
        compiled: dict[str, RuleSet] = {}
        files: dict[str, dict[str, object]] = {}
        errors: list[SourceError] = []
        owner: dict[str, str] = {}
        taken: dict[int, CompiledRule] = {}  # accepted rules by key-state fingerprint
        # Unchanged files first: they keep the rule ids they own.
        for path in sorted(sources, key=lambda p: (sources[p] != self.accepted.get(p), p)):
            text = sources[path]
            if text == self.accepted.get(path):  # accepted before: compiled then
                rules: RuleSet | None = self._compiled[path]
                errs: list[SourceError] = []
            else:
                rules, errs = self.source.compile(path, text)
            if rules is not None and not errs:
                dup = next((r.id for r in rules if r.id in owner), None)
                if dup is not None:
                    errs = [RuleSemanticError(
                        f"rule id {dup!r} is also defined in {owner[dup]}", Span(path, 1, 1),
                        source=text, hint="rule ids must be unique across the rules directory")]
            if rules is not None and not errs:
                # Else every worker's native engine build would fail on the accepted set.
                clash = claim_fingerprints(rules, taken, text)
                errs = [clash] if clash is not None else []
            if rules is not None and not errs:
                candidate[path] = text
                compiled[path] = rules
                owner.update((r.id, path) for r in rules)
                files[path] = {"status": "accepted", "errors": [], "running": "current"}
                continue
            errors.extend(errs)
            previous = self.accepted.get(path)
            prev_rules = self._compiled.get(path) if previous is not None else None
            running = "none"
            if previous is not None and prev_rules is not None and not any(
                    r.id in owner for r in prev_rules) and claim_fingerprints(
                    prev_rules, taken) is None:
                candidate[path] = previous
                compiled[path] = prev_rules
                owner.update((r.id, path) for r in prev_rules)
                running = "previous"
            files[path] = {"status": "rejected", "running": running,
                           "errors": [e.render().splitlines()[0] for e in errs]}
        return candidate, compiled, files, errors
