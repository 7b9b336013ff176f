"""The presearcher: which stored queries could match an event, without running them.

Each query is reduced to a disjunction of keys (`anchor_of`): a leaf's keys (see
`percolator.compile`), a conjunction's cheapest child (the "rarest term per conjunction", as
Lucene Monitor), a disjunction's union. A query whose keys cannot be found (a pure negation,
`*:*`) goes to the always-run list. An event produces its keys (`QueryIndex.candidates`) by
dictionary lookups per term, per prefix length in use, per deletion variant, and by stabbing
the range trees; only the union of the hit postings, plus the always-run list, is verified.
"""

from __future__ import annotations

import sys
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

from percolator.analysis import AnalysedEvent, canonical_number
from percolator.batch import BatchTerms
from percolator.compile import Key, PLeaf, PNode, PNot, POr
from percolator.geo import cell
from percolator.ranges import RangeIndex
from percolator.terms import deletion_variants

Weigher = Callable[[Key], float]
intern = sys.intern
_GONE: tuple[Key, ...] = (("gone",),)
_TALLIED = frozenset({"p", "g", "f"})  # compared by identity: a slot not in the index


def default_cost(key: Key) -> float:
    """Estimated chance an event produces `key` (lower is rarer). Longer terms are assumed
    rarer; a presence key is the weakest anchor. Pass your own (e.g. from observed term
    frequencies) to `Percolator(cost=...)`."""
    kind = key[0]
    if kind == "t":
        return 1.0 + 4.0 / (len(key[2]) + 1)
    if kind == "n":
        return 1.5
    if kind == "f":
        return 0.15
    if kind == "p":
        return 2.0 + 8.0 / (len(key[2]) + 1)
    if kind == "r":
        return 6.0
    if kind == "g":
        return 2.5
    if kind == "b":
        return 25.0
    if kind == "c":
        return 0.5
    return 40.0  # "e": field present


def anchor_of(node: PNode, cost: Weigher = default_cost,
              memo: dict[PLeaf, tuple[float, Key | None]] | None = None,
              pairs: frozenset[str] | None = None) -> tuple[Key, ...] | None:
    """Keys one of which every event matching `node` produces; None if there are none.
    `memo` keeps, per leaf (a leaf is shared by many searches), its anchor's cost and its
    pairable term key (below) or None: pass the same dict only with the same `cost` and
    `pairs`. `pairs`: fields (keyword ones: a value or a few per event) whose term keys may be
    paired: a conjunction anchored on such a term that also requires a second one is anchored
    on the pair, `("c", (f1, f2), (v1, v2))`, which an event produces when it has both
    (`city:x AND kind:flat` is then a candidate only for events in city x that are flats, not
    for every event in city x)."""
    cls = node.__class__
    if cls is PLeaf:
        return node.anchor  # type: ignore[union-attr]
    if cls is PNot:
        return None
    if cls is POr:
        keys: dict[Key, None] = {}
        for child in node.children:  # type: ignore[union-attr]
            a = anchor_of(child, cost, memo, pairs)
            if a is None:
                return None
            keys.update(dict.fromkeys(a))
        return tuple(keys)
    best: tuple[Key, ...] | None = None
    best_cost = float("inf")
    terms: list[tuple[float, Key]] | None = None  # pairable single-term anchors of children
    get = memo.get if memo is not None else None
    for child in node.children:  # type: ignore[union-attr]
        if child.__class__ is PLeaf:
            a = child.anchor  # type: ignore[union-attr]
            if a is None:
                continue
            info = get(child) if get is not None else None  # type: ignore[arg-type]
            if info is None:
                info = (sum(cost(k) for k in a),
                        a[0] if pairs and len(a) == 1 and a[0][0] == "t" and a[0][1] in pairs
                        else None)
                if memo is not None:
                    memo[child] = info  # type: ignore[index]
            c, pk = info
            if pk is not None:
                if terms is None:
                    terms = [(c, pk)]
                else:
                    terms.append((c, pk))
        else:
            a = anchor_of(child, cost, memo, pairs)
            if a is None:
                continue
            c = sum(cost(k) for k in a)
        if c < best_cost:
            best, best_cost = a, c
    if terms is not None and len(terms) > 1 and best is not None and len(best) == 1 \
            and best[0][0] == "t" and best[0][1] in pairs:  # type: ignore[operator]
        first = best[0]
        others = [(c, k) for c, k in terms if k != first]
        if others:
            second = min(others, key=lambda ck: ck[0])[1]
            a1, a2 = sorted(((first[1], first[2]), (second[1], second[2])))
            return (("c", (a1[0], a2[0]), (a1[1], a2[1])),)
    return best


class QueryIndex:
    """Posting lists from presearcher keys to query slots (ints), plus the always-run set.

    Postings are grouped per (key kind, field) so that an event's keys for a field are matched
    against the stored ones with one set intersection (in C) instead of a lookup per key.
    """

    def __init__(self) -> None:
        self.postings: dict[tuple[str, str], dict[Any, int | array[int]]] = {}
        self.always: set[int] = set()
        self.ranges: dict[tuple[str, str], RangeIndex] = {}
        # Slot → its keys (to remove them), _GONE for a slot not in the index: a list, as
        # slots are small increasing ints (8 bytes a slot instead of a dict entry's ~50).
        self._keys: list[tuple[Key, ...] | None] = []
        self._count = 0
        self._prefix_lengths: dict[str, Counter[int]] = {}
        self._geo_levels: dict[str, Counter[int]] = {}
        self._fuzzy: dict[str, Counter[tuple[int, int]]] = {}  # field → (k, variant length)
        self._fuzzy_spec: dict[str, tuple[int, int, int]] = {}  # field → (max k, min, max len)

    def __len__(self) -> int:
        return self._count

    def add(self, slot: int, keys: tuple[Key, ...] | None) -> None:
        """Index `keys` for `slot` (None: always run), replacing the slot's previous keys."""
        stored = self._keys
        if slot == len(stored):
            stored.append(keys)
        else:
            if slot > len(stored):
                stored.extend([_GONE] * (slot - len(stored)))
                stored.append(keys)
            else:
                if stored[slot] is not _GONE:
                    self.remove(slot)
                stored[slot] = keys
        self._count += 1
        if keys is None:
            self.always.add(slot)
            return
        postings, fuzzy = self.postings, self._fuzzy
        for key in keys:
            # The same as _index(slot, key, +1), inline but for range keys.
            kind = key[0]
            if kind == "r":
                self._index(slot, key, +1)
                continue
            group = postings.get((kind, key[1]))
            if group is None:
                group = postings[(kind, key[1])] = {}
            value = key[2] if len(key) > 2 else None
            posting = group.get(value)
            if posting is None:
                group[intern(value) if type(value) is str else value] = slot
            elif type(posting) is int:
                if posting != slot:
                    group[value] = array("q", (posting, slot))
            elif posting[-1] != slot:  # type: ignore[index]
                posting.append(slot)  # type: ignore[union-attr]
            if kind == "f":  # inline: the fuzzy keys of one leaf are many (its variants)
                spec = fuzzy.get(key[1])
                if spec is not None:
                    key_k = (key[3], len(key[2]))
                    count = spec.get(key_k)
                    if count is not None:
                        spec[key_k] = count + 1
                        continue
                self._tally(kind, key[1], key, value, +1)
            elif kind in _TALLIED:
                self._tally(kind, key[1], key, value, +1)

    def add_many(self, first: int, anchors: Sequence[tuple[Key, ...] | None]) -> None:
        """Index `anchors[i]` for slot `first + i` (a bulk load; the slots come after every
        stored one): the index `add` would build slot by slot, built per distinct anchor
        *object* instead of per search. Searches with the same text, or whose conjunction is
        keyed on the same clause, share their anchor tuple (a leaf's), so each posting grows by
        a run of slots at once."""
        stored = self._keys
        if first < len(stored):
            raise ValueError(f"slot {first} is not past the stored ones ({len(stored)})")
        if first > len(stored):
            stored.extend([_GONE] * (first - len(stored)))
        stored.extend(anchors)
        self._count += len(anchors)
        # id(anchor) → [anchor, slot, slot, ...] (`anchors` keeps every anchor alive here).
        groups: dict[int, list[Any]] = {}
        get = groups.get
        always = self.always
        for slot, a in enumerate(anchors, first):
            if a is None:
                always.add(slot)
                continue
            g = get(id(a))
            if g is None:
                groups[id(a)] = [a, slot]
            else:
                g.append(slot)
        # key → the groups holding it (a key twice in one anchor: that group twice, as `add`
        # tallies it twice but posts the slot once).
        per_key: dict[Key, list[list[Any]]] = {}
        for g in groups.values():
            for key in g[0]:
                if key[0] == "r":
                    for slot in g[1:]:
                        self._index(slot, key, +1)
                    continue
                lists = per_key.get(key)
                if lists is None:
                    per_key[key] = [g]
                else:
                    lists.append(g)
        postings = self.postings
        for key, lists in per_key.items():
            kind, field = key[0], key[1]
            value = key[2] if len(key) > 2 else None
            if type(value) is str:
                value = intern(value)
            if len(lists) == 1:
                new = lists[0][1:]
                count = len(new)
            else:
                count = sum(len(g) - 1 for g in lists)
                if len({id(g) for g in lists}) < len(lists):
                    lists = list({id(g): g for g in lists}.values())
                new = [s for g in lists for s in g[1:]]
                new.sort()
            group = postings.get((kind, field))
            if group is None:
                group = postings[(kind, field)] = {}
            posting = group.get(value)
            if posting is None:
                group[value] = new[0] if len(new) == 1 else array("q", new)
            elif type(posting) is int:
                group[value] = array("q", [posting, *new])
            else:
                posting.extend(new)  # type: ignore[union-attr]
            if kind in _TALLIED:
                self._tally(kind, field, key, value, count)

    def remove(self, slot: int) -> None:
        stored = self._keys
        if slot >= len(stored) or stored[slot] is _GONE:
            return
        keys = stored[slot]
        stored[slot] = _GONE
        self._count -= 1
        if keys is None:
            self.always.discard(slot)
            return
        for key in keys:
            self._index(slot, key, -1)

    def _index(self, slot: int, key: Key, delta: int) -> None:
        kind, field = key[0], key[1]
        if kind == "r":
            rkey = (field, key[2])
            if delta > 0:
                self.ranges.setdefault(rkey, RangeIndex(key[2])).add(slot, *key[3:])
            elif rkey in self.ranges:
                self.ranges[rkey].remove(slot)
                if not len(self.ranges[rkey]):
                    del self.ranges[rkey]
            return
        value: Any = key[2] if len(key) > 2 else None
        if type(value) is str:
            value = intern(value)
        group = self.postings.get((kind, field))
        if group is None:
            group = self.postings[(kind, field)] = {}
        # A posting is the slot itself while it has one (most keys), then an array of slots:
        # 8 bytes a slot instead of a set's ~30-60 (issue 17: ≤ 1 KB per search).
        if delta > 0:
            posting = group.get(value)
            if posting is None:
                group[value] = slot
            elif isinstance(posting, int):
                if posting != slot:
                    group[value] = array("q", (posting, slot))
            elif posting[-1] != slot:  # slots only grow: a new one goes at the end
                posting.append(slot)
        else:
            posting = group.get(value)
            if posting is not None:
                if isinstance(posting, int):
                    if posting == slot:
                        del group[value]
                elif slot in posting:
                    posting.remove(slot)
                    if len(posting) == 1:
                        group[value] = posting[0]
            if not group:
                del self.postings[(kind, field)]
        self._tally(kind, field, key, value, delta)

    def _tally(self, kind: str, field: str, key: Key, value: Any, delta: int) -> None:
        """Keep the prefix lengths, geo levels and fuzzy bounds in use per field."""
        if kind in ("p", "g"):
            per = self._prefix_lengths if kind == "p" else self._geo_levels
            lengths = per.get(field)
            if lengths is None:
                lengths = per[field] = Counter()
            size = len(value) if kind == "p" else value[0]
            lengths[size] += delta
            if lengths[size] <= 0:
                del lengths[size]
                if not lengths:
                    del per[field]
        elif kind == "f":
            spec = self._fuzzy.get(field)
            if spec is None:
                spec = self._fuzzy[field] = Counter()
            key_k = (key[3], len(value))
            count = spec[key_k] = spec[key_k] + delta
            if count > 0:
                if count == delta:  # a new (k, length): widen the bounds, no rescan
                    k, n = key_k
                    old = self._fuzzy_spec.get(field)
                    self._fuzzy_spec[field] = (k, n, n) if old is None else (
                        max(old[0], k), min(old[1], n), max(old[2], n))
                return
            del spec[key_k]
            if spec:
                self._fuzzy_spec[field] = (max(kk for kk, _ in spec),
                                           min(n for _, n in spec), max(n for _, n in spec))
            else:
                del self._fuzzy[field]
                self._fuzzy_spec.pop(field, None)

    def fields(self) -> set[str]:
        out = {f for _, f in self.ranges}
        for kind, f in self.postings:
            out.update(f if kind == "c" else (f,))
        return out

    def candidates(self, ev: AnalysedEvent) -> set[int]:
        """Slots of every query the event could match (always-run ones included)."""
        out = set(self.always)
        for (kind, field), group in self.postings.items():
            found: Iterable[Any]
            if kind == "t":
                found = group.keys() & ev.terms(field)
            elif kind == "n":
                found = group.keys() & {canonical_number(x) for x in ev.numbers(field)}
            elif kind == "b":
                found = group.keys() & {"true" if b else "false" for b in ev.bools(field)}
            elif kind == "e":
                found = (None,) if ev.present(field) else ()
            elif kind == "c":
                f1, f2 = cast("tuple[str, str]", field)  # kind "c": a pair of fields
                found = group.keys() & {(a, b) for a in ev.terms(f1) for b in ev.terms(f2)}
            elif kind == "g":
                levels = self._geo_levels[field]
                found = group.keys() & {cell(lat, lon, k) for lat, lon in ev.points(field)
                                        for k in levels}
            elif kind == "p":
                lengths = self._prefix_lengths[field]
                found = group.keys() & {t[:n] for t in ev.terms(field) for n in lengths
                                        if len(t) >= n}
            else:  # "f"
                kmax, lo, hi = self._fuzzy_spec[field]
                variants: set[str] = set()
                for t in ev.terms(field):
                    if lo <= len(t) <= hi + kmax:
                        variants |= deletion_variants(t, kmax)
                found = group.keys() & variants
            for value in found:
                posting = group[value]
                if isinstance(posting, int):
                    out.add(posting)
                else:
                    out.update(posting)
        for (field, rkind), rindex in self.ranges.items():
            _stab(rindex, rkind, ev, field, out)
        return out

    def select_batch(self, bt: BatchTerms) -> dict[int, int]:
        """Candidates for a whole micro-batch, selected once: slot → bitmask of the batch's
        events (bit i = event i) that produce one of the slot's keys. Term keys are looked up
        per event with one C-level intersection; prefix and fuzzy keys are derived once per
        distinct term of the batch (not once per event that carries it); always-run slots get
        every event. A slot is in the result at most once per batch."""
        evs, full = bt.events, bt.all
        out: dict[int, int] = dict.fromkeys(self.always, full) if self.always else {}
        get = out.get
        for (kind, field), group in self.postings.items():
            km: dict[Any, int] = {}
            if kind == "t":
                keys = group.keys()
                for i, ev in enumerate(evs):
                    hit_terms = keys & ev.terms(field)
                    if hit_terms:
                        bit = 1 << i
                        for v in hit_terms:
                            km[v] = km.get(v, 0) | bit
            elif kind == "p":
                lengths = tuple(self._prefix_lengths[field])
                for t, tm in bt.inverted(field).items():
                    lt = len(t)
                    for n in lengths:
                        if lt >= n:
                            p = t[:n]
                            if p in group:
                                km[p] = km.get(p, 0) | tm
            elif kind == "f":
                kmax, lo, hi = self._fuzzy_spec[field]
                keys = group.keys()
                for t, tm in bt.inverted(field).items():
                    if lo <= len(t) <= hi + kmax:
                        for v in keys & deletion_variants(t, kmax):
                            km[v] = km.get(v, 0) | tm
            else:
                for i, ev in enumerate(evs):
                    found: Iterable[Any]
                    if kind == "n":
                        found = group.keys() & {canonical_number(x) for x in ev.numbers(field)}
                    elif kind == "b":
                        found = group.keys() & {"true" if b else "false" for b in ev.bools(field)}
                    elif kind == "e":
                        found = (None,) if ev.present(field) else ()
                    elif kind == "c":
                        f1, f2 = cast("tuple[str, str]", field)  # kind "c": a pair of fields
                        found = group.keys() & {(a, b) for a in ev.terms(f1)
                                                for b in ev.terms(f2)}
                    else:  # "g"
                        levels = self._geo_levels[field]
                        found = group.keys() & {cell(lat, lon, k) for lat, lon in ev.points(field)
                                                for k in levels}
                    bit = 1 << i
                    for v in found:
                        km[v] = km.get(v, 0) | bit
            for v, mask in km.items():
                posting = group[v]
                if isinstance(posting, int):
                    out[posting] = get(posting, 0) | mask
                else:
                    for s in posting:
                        out[s] = get(s, 0) | mask
        for (field, rkind), rindex in self.ranges.items():
            for i, ev in enumerate(evs):
                hit: set[int] = set()
                _stab(rindex, rkind, ev, field, hit)
                bit = 1 << i
                for s in hit:
                    out[s] = get(s, 0) | bit
        return out


def _stab(rindex: Any, rkind: str, ev: AnalysedEvent, field: str, out: set[int]) -> None:
    """Add to `out` the slots of the range searches on `field` that one of the event's values
    (numbers, dates or terms, by the range index's kind) falls in."""
    values = (ev.numbers(field) if rkind == "num" else ev.dates(field) if rkind == "date"
              else ev.terms(field))
    for v in values:
        rindex.stab(v, out)
