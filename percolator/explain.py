"""Why an event matches a query or not: the clause tree with each clause's result and the event
values it looked at, plus the presearcher keys the index would file the query under."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from percolator.analysis import AnalysedEvent, Schema
from percolator.compile import LeafTable, PAnd, PLeaf, PNode, PNot
from percolator.engine import compile_query
from percolator.index import anchor_of

MAX_VALUE_CHARS = 60


@dataclass(frozen=True)
class Explanation:
    matched: bool
    clauses: tuple[str, ...]       # matched clauses (as a notification would report them)
    tree: tuple[tuple[int, bool, str], ...]   # (depth, result, text) per node, pre-order
    anchor: tuple[Any, ...] | None
    candidate: bool                # the index would have verified this query for this event

    def render(self) -> str:
        lines = [f"{'MATCH' if self.matched else 'NO MATCH'}"]
        for depth, ok, text in self.tree:
            lines.append(f"{'  ' * (depth + 1)}{'✓' if ok else '✗'} {text}")
        if self.anchor is None:
            lines.append("index: always run (nothing to anchor on)")
        else:
            keys = ", ".join(_key_text(k) for k in self.anchor[:8])
            more = f" (+{len(self.anchor) - 8} more)" if len(self.anchor) > 8 else ""
            state = "candidate" if self.candidate else "not a candidate"
            lines.append(f"index keys: {keys}{more} → {state}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"matched": self.matched, "clauses": list(self.clauses),
                "tree": [{"depth": d, "matched": ok, "clause": t} for d, ok, t in self.tree],
                "always_run": self.anchor is None, "candidate": self.candidate}


def explain(query: str, event: Mapping[str, Any], schema: Schema | None = None,
            default_operator: str = "OR") -> Explanation:
    """Raises QueryError if `query` is not valid."""
    schema = schema or Schema()
    compiled = compile_query(query, schema, default_operator=default_operator,
                             table=LeafTable())
    ev = AnalysedEvent(event, schema)
    tree: list[tuple[int, bool, str]] = []
    _walk(compiled.plan, ev, 0, tree)
    anchor = anchor_of(compiled.plan)
    candidate = anchor is None or _produces(anchor, ev)
    matched = compiled.matches(ev)
    return Explanation(matched, compiled.matched_clauses(ev) if matched else (), tuple(tree),
                       anchor, candidate)


def _walk(node: PNode, ev: AnalysedEvent, depth: int, out: list[tuple[int, bool, str]]) -> bool:
    if isinstance(node, PLeaf):
        ok = node.fn(ev)
        out.append((depth, ok, f"{node.label}    [{_values(node, ev)}]"))
        return ok
    if isinstance(node, PNot):
        i = len(out)
        out.append((depth, False, "NOT"))
        ok = not _walk(node.child, ev, depth + 1, out)
        out[i] = (depth, ok, "NOT")
        return ok
    i = len(out)
    name = "AND" if isinstance(node, PAnd) else "OR"
    out.append((depth, False, name))
    results = [_walk(c, ev, depth + 1, out) for c in node.children]
    ok = all(results) if isinstance(node, PAnd) else any(results)
    out[i] = (depth, ok, name)
    return ok


def _values(leaf: PLeaf, ev: AnalysedEvent) -> str:
    parts = []
    for f in leaf.fields:
        if f == "*":
            vals: list[Any] = [v for p in ev.text_fields() for v in ev.values(p)]
            name = "text fields"
        else:
            vals = ev.values(f)
            name = f
            if not vals and ev.present(f):
                vals = ["{…}"]
        text = json.dumps(vals[0] if len(vals) == 1 else vals, ensure_ascii=False, default=str)
        if not vals:
            text = "absent"
        if len(text) > MAX_VALUE_CHARS:
            text = text[:MAX_VALUE_CHARS - 1] + "…"
        parts.append(f"{name} = {text}")
    return "; ".join(parts)


def _produces(anchor: tuple[Any, ...], ev: AnalysedEvent) -> bool:
    from percolator.index import QueryIndex

    index = QueryIndex()
    index.add(0, anchor)
    return bool(index.candidates(ev))


def _key_text(key: tuple[Any, ...]) -> str:
    kind, field = key[0], key[1]
    names = {"t": "term", "n": "number", "b": "bool", "p": "prefix", "f": "fuzzy-variant",
             "e": "exists", "r": "range"}
    rest = ",".join(str(k) for k in key[2:])
    return f"{names.get(kind, kind)}({field}{',' + rest if rest else ''})"
