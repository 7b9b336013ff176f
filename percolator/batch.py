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

from collections.abc import Sequence

from percolator.analysis import AnalysedEvent
from percolator.compile import PAnd, PLeaf, PNode, PNot, POr


class BatchTerms:
    __slots__ = ("events", "all", "_inv")

    def __init__(self, events: Sequence[AnalysedEvent]) -> None:
        self.events = events
        self.all = (1 << len(events)) - 1
        self._inv: dict[str, dict[str, int]] = {}

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

    def verify(self, node: PNode, cand: int) -> int:
        """Mask of the events in `cand` that match `node`."""
        if type(node) is PLeaf:
            t = getattr(node.fn, "term", None)
            if t is not None:
                return cand & self.inverted(t[0]).get(t[1], 0)
            fn, evs = node.fn, self.events
            out, m = 0, cand
            while m:
                low = m & -m
                if fn(evs[low.bit_length() - 1]):
                    out |= low
                m ^= low
            return out
        if type(node) is PAnd:
            # Plain terms first, inline (a mask lookup each, no call); the rest after, on the
            # events still in the mask.
            rest = None
            inv = self._inv
            for c in node.children:
                if type(c) is PLeaf:
                    t = getattr(c.fn, "term", None)
                    if t is not None:
                        col = inv.get(t[0])
                        if col is None:
                            col = self.inverted(t[0])
                        cand &= col.get(t[1], 0)
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


def bits(mask: int) -> list[int]:
    """Indexes of the set bits of `mask`, ascending."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out
