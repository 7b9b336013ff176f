"""Ship rules to Spark's Python workers as source text; compile once per worker.

The processor object is pickled to every task, so it carries the rule files' text (small and
always picklable) rather than compiled closures; each worker compiles them once and caches the
engine under a hash of the text (`cep.spark.operator._cached_engine`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from cep.compile import compile_rules, rule_files
from cep.nfa import RuleSet, StreamSpec
from cep.runtime.bind import build_engine
from cep.runtime.engine import Engine


class RulesEngineFactory:
    def __init__(self, sources: dict[str, str], max_partial_matches: int | None = None) -> None:
        self.sources = dict(sorted(sources.items()))
        self.max_partial_matches = max_partial_matches
        digest = hashlib.sha256()
        for path, text in self.sources.items():
            digest.update(path.encode() + b"\0" + text.encode() + b"\0")
        digest.update(str(max_partial_matches).encode())
        self.cache_key = int.from_bytes(digest.digest()[:8], "big")

    @classmethod
    def from_path(cls, path: str | Path, max_partial_matches: int | None = None,
                  ) -> RulesEngineFactory:
        files = rule_files([path])
        return cls({str(p): p.read_text() for p in files}, max_partial_matches)

    def ruleset(self) -> RuleSet:
        rules = []
        streams: dict[str, StreamSpec] = {}
        for path, text in self.sources.items():
            rs = compile_rules(text, path)
            rules.extend(rs.rules)
            for s in rs.streams:
                streams.setdefault(s.name, s)
        return RuleSet(tuple(rules), tuple(streams.values()))

    def __call__(self) -> Engine:
        return build_engine(self.ruleset(), max_partial_matches=self.max_partial_matches)
