"""Batch-level matching (issue 17): a micro-batch's events as bitmasks.

`BatchTerms` holds the batch's analysed events and, per field on first use, an inverted index
of the batch: term → bitmask of the events (bit i = event i) that carry it. The presearcher
(`QueryIndex.select_batch`) selects each candidate search once per batch with the mask of events
that could match it; `verify` then evaluates the search's plan over that mask in columnar form:
a plain term is one dictionary lookup (its mask), AND/OR/NOT are integer &, |, &~ over the whole
batch, and only other leaves (phrases, prefixes, ranges, ...) run per event, on the events still
in the mask. The result is exactly the per-event one (tests/percolator/test_batch.py checks it
against per-event matching and the naive scan).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from percolator.analysis import AnalysedEvent
from percolator.compile import PAnd, PLeaf, PNode, PNot, POr

_NONE = -1  # a leaf mask that has no columnar form: run the leaf per event


class BatchTerms:
    __slots__ = ("events", "all", "_inv", "_leaf", "_sorted", "_cols")

    def __init__(self, events: Sequence[AnalysedEvent]) -> None:
        self.events = events
        self.all = (1 << len(events)) - 1
        self._inv: dict[str, dict[str, int]] = {}
        self._leaf: dict[PLeaf, int] = {}  # leaf → mask over the whole batch, or _NONE
        self._sorted: dict[str, list[str]] = {}  # field → the batch's distinct terms, sorted
        # (values accessor, field) → (sorted values, their event bits, prefix ORs, one value
        # per event), or None when the values do not sort (mixed types, NaN).
        self._cols: dict[tuple[Any, str], tuple[list[Any], list[int], list[int], bool] | None] = {}

    def inverted(self, field: str) -> dict[str, int]:
        """term → mask of the events whose `field` carries it."""
        inv = self._inv.get(field)
        if inv is None:
            inv = self._inv[field] = {}
            get = inv.get
            for i, ev in enumerate(self.events):
                bit = 1 << i
                for t in ev.terms(field):
                    inv[t] = get(t, 0) | bit
        return inv

    def leaf_mask(self, leaf: PLeaf) -> int:
        """The mask of the batch's events matching `leaf` where it has a columnar form (a plain
        term: its inverted-index entry; a prefix or range: see `_columnar`), else _NONE;
        memoised per leaf for the batch (leaves are shared by the searches that use them)."""
        lm = self._leaf.get(leaf)
        if lm is None:
            t = leaf.term
            if t is not None:
                lm = self.inverted(t[0]).get(t[1], 0)
            elif leaf.columnar is not None:
                lm = self._columnar(leaf.columnar)
            else:
                lm = _NONE
            self._leaf[leaf] = lm
        return lm

    def verify(self, node: PNode, cand: int) -> int:
        """Mask of the events in `cand` that match `node`."""
        if type(node) is PLeaf:
            lm = self._leaf.get(node)
            if lm is None:
                lm = self.leaf_mask(node)
            if lm != _NONE:
                return cand & lm
            fn, evs = node.fn, self.events
            out, m = 0, cand
            while m:
                low = m & -m
                if fn(evs[low.bit_length() - 1]):
                    out |= low
                m ^= low
            return out
        if type(node) is PAnd:
            # Leaves with a mask over the batch first, inline (a lookup each, no call); the
            # rest after, on the events still in the mask.
            rest = None
            leaf_masks = self._leaf
            for c in node.children:
                if type(c) is PLeaf:
                    lm = leaf_masks.get(c)
                    if lm is None:
                        lm = self.leaf_mask(c)
                    if lm != _NONE:
                        cand &= lm
                        if not cand:
                            return 0
                        continue
                if rest is None:
                    rest = [c]
                else:
                    rest.append(c)
            if rest is not None:
                for c in rest:
                    cand = self.verify(c, cand)
                    if not cand:
                        return 0
            return cand
        if type(node) is POr:
            out = 0
            for c in node.children:
                left = cand & ~out
                if not left:
                    break
                out |= self.verify(c, left)
            return out
        assert type(node) is PNot
        return cand & ~self.verify(node.child, cand)

    def _columnar(self, col: tuple[Any, ...]) -> int:
        """The mask of the whole batch's events matching a prefix or range leaf (described by
        its matcher's `columnar`, see percolator.match), or _NONE. Exactly the per-event
        matcher's result: a prefix is the union of the masks of the batch's terms that start
        with it (found by bisection in the sorted terms); a range is the union of the bits of
        the batch's values within it (bisection in the sorted values, the same comparisons as
        `match.in_range`)."""
        if col[0] == "p":
            _, field, text = col
            inv = self.inverted(field)
            terms = self._sorted.get(field)
            if terms is None:
                terms = self._sorted[field] = sorted(inv)
            out = 0
            i, n = bisect_left(terms, text), len(terms)
            while i < n and terms[i].startswith(text):
                out |= inv[terms[i]]
                i += 1
            return out
        _, values, field, lo, hi, include_lo, include_hi = col
        key = (values, field)
        if key in self._cols:
            c = self._cols[key]
        else:
            c = self._cols[key] = self._column(values, field)
        if c is None:
            return _NONE
        keys, bits, prefix, unique = c
        try:
            i = 0 if lo is None else (bisect_left if include_lo else bisect_right)(keys, lo)
            j = len(keys) if hi is None else (bisect_right if include_hi else bisect_left)(
                keys, hi)
        except TypeError:  # a bound of another type than the values: per event decides
            return _NONE
        if i >= j:
            return 0
        if unique:  # disjoint bits: the OR of a slice is a difference of prefix ORs
            return prefix[j] ^ prefix[i]
        out = 0
        for b in bits[i:j]:
            out |= b
        return out

    def _column(self, values: Any, field: str
                ) -> tuple[list[Any], list[int], list[int], bool] | None:
        pairs: list[tuple[Any, int]] = []
        for i, ev in enumerate(self.events):
            bit = 1 << i
            for v in values(ev, field):
                if v != v:  # NaN does not sort
                    return None
                pairs.append((v, bit))
        try:
            pairs.sort(key=itemgetter(0))
        except TypeError:
            return None
        keys = [v for v, _ in pairs]
        bits = [b for _, b in pairs]
        prefix = [0]
        acc = 0
        for b in bits:
            acc |= b
            prefix.append(acc)
        return keys, bits, prefix, acc.bit_count() == len(bits)


def bits(mask: int) -> list[int]:
    """Indexes of the set bits of `mask`, ascending."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out
