"""The percolator: saved searches compiled once, indexed, and matched against events.

    perc = Percolator.from_searches(searches, schema=schema)
    perc.apply(change)                       # changelog entries, between batches
    notes = perc.match_batch(events)         # list[Notification]
    perc.last_stats                          # BatchStats: candidates vs matched
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any, cast

from percolator import ast
from percolator.analysis import AnalysedEvent, FieldType, Schema
from percolator.batch import BatchTerms
from percolator.compile import LeafTable, PAnd, PLeaf, PNode, PNot, plan
from percolator.highlight import Highlight, hits
from percolator.index import QueryIndex, Weigher, anchor_of, default_cost
from percolator.match import Matcher, all_of, any_of, negate, term_of, term_sets
from percolator.model import Change, SavedSearch, Target
from percolator.shapes import ShapeCache
from percolator.syntax import parse

FREEZE_AT = 50_000  # searches loaded at once from which from_searches calls gc.freeze()


class CompiledQuery:
    """A compiled query: its text and plan. The plan is what the index and the batch matcher
    use; the closure (`fn`), the positive leaves and the AST are derived on first use and
    cached, so a stored search that never matches costs only its plan (issue 17: ≤ 1 KB per
    search)."""

    __slots__ = ("text", "plan", "default_operator", "_fn", "_positive")

    def __init__(self, text: str, plan: PNode, default_operator: str = "OR") -> None:
        self.text = text
        self.plan = plan
        self.default_operator = default_operator
        self._fn: Matcher | None = None
        self._positive: _Positive | None = None

    @property
    def fn(self) -> Matcher:
        fn = self._fn
        if fn is None:
            fn = self._fn = _closure(self.plan)
        return fn

    @property
    def positive(self) -> tuple[PLeaf, ...]:
        """Leaves under an even number of NOTs: reported when true."""
        pos = self._positive
        if pos is None:
            pos = self._positive = _Positive(self.plan)
        return pos.leaves

    @property
    def query(self) -> ast.Query:
        return parse(self.text, default_operator=self.default_operator)

    def matches(self, ev: AnalysedEvent) -> bool:
        return self.fn(ev)

    def matched(self, ev: AnalysedEvent) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(labels, fields) of the positive clauses that are true for `ev`."""
        labels: dict[str, None] = {}
        fields: dict[str, None] = {}
        for leaf in self.positive:
            if leaf.fn(ev):
                labels[leaf.label] = None
                for f in leaf.fields:
                    if f != "*":
                        fields[f] = None
        return tuple(labels), tuple(fields)

    def matched_if_true(self, ev: AnalysedEvent) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """`matched(ev)` for an event the query is known to match: a positive leaf reached from
        the root through conjunctions only is then true without being run (for a query made of
        such leaves alone, e.g. `a AND b AND c`, the answer is fixed and kept)."""
        pos = self._positive
        if pos is None:
            pos = self._positive = _Positive(self.plan)
        fixed = pos.fixed
        if fixed is not None:
            return fixed
        labels: dict[str, None] = {}
        fields: dict[str, None] = {}
        for leaf, certain in pos.order:
            if certain or leaf.fn(ev):
                labels[leaf.label] = None
                for f in leaf.fields:
                    if f != "*":
                        fields[f] = None
        return tuple(labels), tuple(fields)

    def matched_clauses(self, ev: AnalysedEvent) -> tuple[str, ...]:
        return self.matched(ev)[0]

    def highlights(self, ev: AnalysedEvent) -> tuple[Highlight, ...]:
        """Every hit (field, value, offsets, text) of the positive clauses true for `ev`."""
        out: list[Highlight] = []
        seen: set[Highlight] = set()
        for leaf in self.positive:
            if leaf.source is None or not leaf.fn(ev):
                continue
            for f, ffn in zip(leaf.fields, leaf.per_field(), strict=True):
                if ffn(ev):
                    for h in hits(leaf.source, ffn, f, ev):
                        if h not in seen:
                            seen.add(h)
                            out.append(h)
        return tuple(out)


def compile_query(text: str, schema: Schema | None = None, *, default_operator: str = "OR",
                  table: LeafTable | None = None) -> CompiledQuery:
    """Parse and compile `text`; raises QueryError (with position and hint)."""
    query = parse(text, default_operator=default_operator)
    p = plan(query, schema or Schema(), text, table)
    return CompiledQuery(text, p, default_operator)


def _closure(node: PNode) -> Matcher:
    if isinstance(node, PLeaf):
        return node.fn
    if isinstance(node, PNot):
        return negate(_closure(node.child))
    if isinstance(node, PAnd):
        # Plain-term children (and negated plain terms) become set tests per field.
        required: dict[str, set[str]] = {}
        forbidden: dict[str, set[str]] = {}
        rest: list[Matcher] = []
        for c in node.children:
            t = term_of(c.fn) if isinstance(c, PLeaf) else None
            nt = (term_of(c.child.fn) if isinstance(c, PNot) and isinstance(c.child, PLeaf)
                  else None)
            if t is not None:
                required.setdefault(t[0], set()).add(t[1])
            elif nt is not None:
                forbidden.setdefault(nt[0], set()).add(nt[1])
            else:
                rest.append(_closure(c))
        if required:
            return term_sets(required, forbidden, rest)
    kids = [_closure(c) for c in node.children]
    return all_of(kids) if isinstance(node, PAnd) else any_of(kids)


def _positive(node: PNode, positive: bool, certain: bool = True
              ) -> Iterable[tuple[PLeaf, bool]]:
    """(leaf, certain) for the leaves under an even number of NOTs, in plan order; `certain`:
    reached from the root through conjunctions only, so true whenever the query matches."""
    if isinstance(node, PLeaf):
        if positive:
            yield node, certain
    elif isinstance(node, PNot):
        yield from _positive(node.child, not positive, False)
    else:
        certain = certain and isinstance(node, PAnd)
        for c in node.children:
            yield from _positive(c, positive, certain)


class _Positive:
    """A query's positive leaves (`leaves`), each with whether it is certain (`order`, see
    `_positive`), and when all are certain the (labels, fields) of a match (`fixed`). Made on a
    search's first match only."""

    __slots__ = ("leaves", "order", "fixed")

    def __init__(self, plan: PNode) -> None:
        self.order = tuple(_positive(plan, True))
        self.leaves = tuple(leaf for leaf, _ in self.order)
        self.fixed: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        if all(certain for _, certain in self.order):
            labels: dict[str, None] = {}
            fields: dict[str, None] = {}
            for leaf in self.leaves:
                labels[leaf.label] = None
                for f in leaf.fields:
                    if f != "*":
                        fields[f] = None
            self.fixed = (tuple(labels), tuple(fields))


@dataclass(frozen=True, slots=True)
class Notification:
    search_id: str
    owner: str
    event: Mapping[str, Any]
    matched: tuple[str, ...]          # clause labels (source text), like ES named queries
    fields: tuple[str, ...]           # fields of the matched clauses
    targets: tuple[Target, ...]
    metadata: Mapping[str, Any]
    position: Any = None              # the event's source position (or index in the batch)
    search_version: int = 1
    highlights: tuple[Highlight, ...] = ()  # terms/fields that matched, with offsets

    def to_dict(self) -> dict[str, Any]:
        return {
            "search_id": self.search_id, "owner": self.owner, "event": dict(self.event),
            "matched": list(self.matched), "fields": list(self.fields),
            "targets": [t.to_dict() for t in self.targets], "metadata": dict(self.metadata),
            "position": self.position, "search_version": self.search_version,
            "highlights": [h.to_dict() for h in self.highlights],
        }


# A Notification without its generated __init__ (a frozen dataclass sets each of its ten fields
# through object.__setattr__, about twice this cost): `match_batch` makes one per (event,
# search) pair. The slot setters, in field order.
_SLOTS = tuple(f.name for f in dataclass_fields(Notification))
assert _SLOTS == Notification.__slots__
(_s_id, _s_owner, _s_event, _s_matched, _s_fields, _s_targets, _s_metadata, _s_position,
 _s_version, _s_highlights) = (getattr(Notification, f).__set__ for f in _SLOTS)
_new_object = object.__new__


def _notification(search_id: str, owner: str, event: Mapping[str, Any],
                  matched: tuple[str, ...], fields: tuple[str, ...],
                  targets: tuple[Target, ...], metadata: Mapping[str, Any], position: Any,
                  search_version: int, highlights: tuple[Highlight, ...]) -> Notification:
    """`Notification(...)` with every field given, made faster (the same object)."""
    n = _new_object(Notification)
    _s_id(n, search_id)
    _s_owner(n, owner)
    _s_event(n, event)
    _s_matched(n, matched)
    _s_fields(n, fields)
    _s_targets(n, targets)
    _s_metadata(n, metadata)
    _s_position(n, position)
    _s_version(n, search_version)
    _s_highlights(n, highlights)
    return n


@dataclass
class BatchStats:
    events: int = 0
    queries: int = 0           # stored queries when the batch ran
    always_run: int = 0        # of which unanchorable, run for every event
    candidates: int = 0        # queries verified, summed over events
    matched: int = 0           # notifications
    seconds: float = 0.0

    @property
    def verified_fraction(self) -> float:
        """Mean fraction of stored queries verified per event."""
        total = self.events * self.queries
        return self.candidates / total if total else 0.0

    def add(self, other: BatchStats) -> None:
        self.events += other.events
        self.queries = other.queries
        self.always_run = other.always_run
        self.candidates += other.candidates
        self.matched += other.matched
        self.seconds += other.seconds

    def to_dict(self) -> dict[str, float | int]:
        return {"events": self.events, "queries": self.queries, "always_run": self.always_run,
                "candidates": self.candidates, "matched": self.matched,
                "verified_fraction": self.verified_fraction, "seconds": self.seconds}


class _Entry(CompiledQuery):
    """A stored search: the search, its slot in the index and its compiled query (one object
    per search, not two: issue 17's ≤ 1 KB per search)."""

    __slots__ = ("search", "slot")

    def __init__(self, search: SavedSearch, plan: PNode, default_operator: str, slot: int
                 ) -> None:
        self.text = search.query
        self.plan = plan
        self.default_operator = default_operator
        self._fn = None
        self._positive = None
        self.search = search
        self.slot = slot

    @property
    def compiled(self) -> CompiledQuery:
        return self


@dataclass
class Percolator:
    schema: Schema = field(default_factory=Schema)
    default_operator: str = "OR"
    cost: Weigher = default_cost
    highlight: bool = True   # notifications carry Highlights (off: labels and fields only)

    def __post_init__(self) -> None:
        self._table = LeafTable()
        self._shapes = ShapeCache(self.schema, self._table)
        # Per plan leaf: its anchor's cost and pairable term key (see anchor_of).
        self._costs: dict[PLeaf, tuple[float, Any]] = {}
        # Declared keyword fields: their term keys pair up in conjunctions (see anchor_of).
        self._pairs = frozenset(f for f, t in self.schema.fields.items()
                                if t is FieldType.KEYWORD) or None
        self._index = QueryIndex()
        self._by_id: dict[str, _Entry] = {}
        # Slot → entry; slots are never reused (range trees filter removed ones), a removed
        # search leaves None (8 bytes) behind.
        self._by_slot: list[_Entry | None] = []
        self.last_stats = BatchStats()
        self.total_stats = BatchStats()

    @classmethod
    def from_searches(cls, searches: Iterable[SavedSearch], schema: Schema | None = None,
                      **kwargs: Any) -> Percolator:
        perc = cls(schema or Schema(), **kwargs)
        # A bulk load allocates millions of long-lived objects and no garbage cycles: the
        # cyclic collector would rescan them over and over (a third of the build time).
        enabled = gc.isenabled()
        gc.disable()
        try:
            # `add` with its lookups hoisted, each distinct text planned once (searches with
            # the same text share its plan and anchor), and the index built in bulk
            # (`QueryIndex.add_many`). A search not of a cached shape, a replacement or an
            # error goes through `add` itself, after the pending ones are indexed.
            plan_of, by_id, by_slot = perc._shapes.plan, perc._by_id, perc._by_slot
            cost, costs, pairs = perc.cost, perc._costs, perc._pairs
            op = perc.default_operator
            seen: dict[str, tuple[PNode, Any]] = {}
            anchors: list[Any] = []
            first = len(by_slot)
            for s in searches:
                sid, text = s.id, s.query
                hit = seen.get(text)
                if hit is None:
                    p = plan_of(text)
                    if p is not None:
                        hit = seen[text] = (p, p.anchor if p.__class__ is PLeaf else
                                            anchor_of(p, cost, costs, pairs))
                if hit is None or sid in by_id:
                    perc._index.add_many(first, anchors)
                    anchors = []
                    perc.add(s)
                    first = len(by_slot)
                    continue
                slot = len(by_slot)
                entry = _Entry(s, hit[0], op, slot)
                by_id[sid] = entry
                by_slot.append(entry)
                anchors.append(hit[1])
            perc._index.add_many(first, anchors)
            del seen, anchors
        finally:
            if enabled:
                if len(perc) >= FREEZE_AT:
                    # A big index lives as long as the percolator: in the collector's permanent
                    # generation, the first collections after the load do not rescan its
                    # millions of objects (seconds at 1M searches, paid by the first updates or
                    # batch otherwise). It holds no reference cycles: refcounting frees it.
                    gc.freeze()
                gc.enable()
        return perc

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, search_id: object) -> bool:
        return search_id in self._by_id

    @property
    def always_run(self) -> int:
        return len(self._index.always)

    def get(self, search_id: str) -> SavedSearch | None:
        entry = self._by_id.get(search_id)
        return entry.search if entry else None

    def add(self, search: SavedSearch) -> None:
        """Add or replace a search. Raises QueryError if its query does not compile (the index
        is unchanged then)."""
        # Most searches are a cached shape over cached clauses (percolator/shapes.py): no
        # parse; the others (and every error) take the full path.
        p = self._shapes.plan(search.query)
        if p is None:
            p = compile_query(search.query, self.schema, default_operator=self.default_operator,
                              table=self._table).plan
        if search.id in self._by_id:
            self.remove(search.id)
        slot = len(self._by_slot)  # slots are never reused
        entry = _Entry(search, p, self.default_operator, slot)
        self._by_id[search.id] = entry
        self._by_slot.append(entry)
        self._index.add(slot, p.anchor if isinstance(p, PLeaf) else
                        anchor_of(p, self.cost, self._costs, self._pairs))

    def remove(self, search_id: str) -> bool:
        entry = self._by_id.pop(search_id, None)
        if entry is None:
            return False
        self._by_slot[entry.slot] = None
        self._index.remove(entry.slot)
        return True

    def apply(self, change: Change) -> None:
        """Apply one changelog entry (upsert or delete). An upsert whose query no longer
        compiles (e.g. after a schema change) removes the old version and re-raises."""
        if change.search is None:
            self.remove(change.search_id)
            return
        try:
            self.add(change.search)
        except Exception:
            self.remove(change.search_id)
            raise

    def anchor(self, search_id: str) -> tuple[Any, ...] | None:
        """The presearcher keys of a stored search (None: always run)."""
        entry = self._by_id[search_id]
        return anchor_of(entry.compiled.plan, self.cost, None, self._pairs)

    def analyse(self, event: Mapping[str, Any]) -> AnalysedEvent:
        return AnalysedEvent(event, self.schema)

    def candidates(self, event: Mapping[str, Any] | AnalysedEvent) -> list[str]:
        ev = event if isinstance(event, AnalysedEvent) else self.analyse(event)
        by_slot = self._live()
        return sorted(by_slot[s].search.id for s in self._index.candidates(ev))

    def _live(self) -> list[_Entry]:
        """`_by_slot` for slots the index returns (live ones: never None)."""
        return cast("list[_Entry]", self._by_slot)

    def match(self, event: Mapping[str, Any], position: Any = None) -> list[Notification]:
        return self.match_batch([event], [position])

    def match_batch(self, events: Sequence[Mapping[str, Any]],
                    positions: Sequence[Any] | None = None) -> list[Notification]:
        """Notifications for every (event, matching search) pair, in event order then search
        id order. `positions` (e.g. Kafka partition/offset) default to indexes in the batch."""
        started = time.perf_counter()
        stats = BatchStats(events=len(events), queries=len(self._by_id),
                           always_run=len(self._index.always))
        out: list[Notification] = []
        by_slot, schema = self._live(), self.schema
        evs = [AnalysedEvent(event, schema) for event in events]
        # Candidates once per batch (slot → mask of the events that could match it), each
        # verified over its mask in columnar form (percolator/batch.py).
        bt = BatchTerms(evs)
        verify = bt.verify
        found: list[tuple[int, str, _Entry]] = []
        candidates = 0
        selected = self._index.select_batch(bt)
        # In slot order: entries and plans were allocated in slot order, so neighbouring
        # candidates are near in memory (at 1M searches about a third less verification time
        # than the presearcher's order).
        for slot in sorted(selected):
            cand = selected[slot]
            candidates += cand.bit_count()
            entry = by_slot[slot]
            m = verify(entry.plan, cand)
            if m:
                sid = entry.search.id
                while m:
                    low = m & -m
                    found.append((low.bit_length() - 1, sid, entry))
                    m ^= low
        stats.candidates = candidates
        found.sort()  # event, then search id: unique per pair, entries are never compared
        highlight = self.highlight
        for i, _, entry in found:
            ev = evs[i]
            s = entry.search
            labels, fields = entry.matched_if_true(ev)
            hl = entry.compiled.highlights(ev) if highlight else ()
            pos = positions[i] if positions is not None else i
            out.append(_notification(s.id, s.owner, events[i], labels, fields, s.targets,
                                     s.metadata, pos, s.version, hl))
        stats.matched = len(out)
        stats.seconds = time.perf_counter() - started
        self.last_stats = stats
        self.total_stats.add(stats)
        return out

    def match_each(self, events: Sequence[Mapping[str, Any]],
                   positions: Sequence[Any] | None = None) -> list[Notification]:
        """As `match_batch`, one event at a time (per-event candidates and verification): the
        reference the batch path is tested against."""
        out: list[Notification] = []
        by_slot, schema = self._live(), self.schema
        candidates = self._index.candidates
        for i, event in enumerate(events):
            ev = AnalysedEvent(event, schema)
            hits = sorted((by_slot[s] for s in candidates(ev) if by_slot[s].compiled.fn(ev)),
                          key=lambda e: e.search.id)
            pos = positions[i] if positions is not None else i
            for entry in hits:
                s = entry.search
                labels, fields = entry.matched_if_true(ev)
                hl = entry.compiled.highlights(ev) if self.highlight else ()
                out.append(Notification(s.id, s.owner, event, labels, fields, s.targets,
                                        s.metadata, pos, s.version, hl))
        return out

    def scan(self, event: Mapping[str, Any]) -> list[str]:
        """Ids of matching searches by running every query (no index): the test oracle."""
        ev = AnalysedEvent(event, self.schema)
        return sorted(e.search.id for e in self._by_id.values() if e.compiled.fn(ev))
