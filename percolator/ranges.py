"""Stabbing index for ranges: which stored intervals contain a value.

A centered interval tree (each node holds the intervals that contain its centre, sorted by low
end ascending and by high end descending), so a lookup costs O(log n + hits). Updates go to a
small pending list (scanned linearly) and a removed set (filtered out); the tree is rebuilt when
either grows past a fraction of the tree, so a changelog that trickles in stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import total_ordering
from typing import Any


@total_ordering
class _Top:
    """Greater than every string: the open high end of a string range."""

    def __lt__(self, other: object) -> bool:
        return False

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Top)

    def __hash__(self) -> int:
        return 0


TOP = _Top()
NEG_INF = float("-inf")
POS_INF = float("inf")


@dataclass(frozen=True, slots=True)
class Interval:
    lo: Any
    hi: Any
    include_lo: bool
    include_hi: bool
    slot: int

    def contains(self, x: Any) -> bool:
        lo, hi = self.lo, self.hi
        if x < lo or (x == lo and not self.include_lo):
            return False
        return not (x > hi or (x == hi and not self.include_hi))


class _Node:
    __slots__ = ("center", "by_lo", "by_hi", "left", "right")

    def __init__(self, center: Any, mid: list[Interval], left: _Node | None,
                 right: _Node | None) -> None:
        self.center = center
        self.by_lo = sorted(mid, key=lambda iv: iv.lo)
        self.by_hi = sorted(mid, key=lambda iv: iv.hi, reverse=True)
        self.left = left
        self.right = right


def _build(items: list[Interval]) -> _Node | None:
    if not items:
        return None
    ends = sorted(e for iv in items for e in (iv.lo, iv.hi)
                  if e is not TOP and e != NEG_INF and e != POS_INF and e != "")
    if not ends:
        return _Node(items[0].lo, items, None, None)
    center = ends[len(ends) // 2]
    left = [iv for iv in items if iv.hi < center]
    right = [iv for iv in items if iv.lo > center]
    mid = [iv for iv in items if not (iv.hi < center or iv.lo > center)]
    return _Node(center, mid, _build(left), _build(right))


class RangeIndex:
    """Intervals over one ordered domain: "num"/"date" (numbers) or "str" (strings)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._all: dict[int, list[Interval]] = {}
        self._tree: _Node | None = None
        self._tree_size = 0
        self._pending: list[Interval] = []
        self._removed: set[int] = set()

    def __len__(self) -> int:
        return sum(len(v) for v in self._all.values())

    def add(self, slot: int, lo: Any, hi: Any, include_lo: bool, include_hi: bool) -> None:
        if lo is None:
            lo, include_lo = ("" if self.kind == "str" else NEG_INF), True
        if hi is None:
            hi, include_hi = (TOP if self.kind == "str" else POS_INF), True
        iv = Interval(lo, hi, include_lo, include_hi, slot)
        self._all.setdefault(slot, []).append(iv)
        self._pending.append(iv)
        self._maybe_rebuild()

    def remove(self, slot: int) -> None:
        if self._all.pop(slot, None) is None:
            return
        self._pending = [iv for iv in self._pending if iv.slot != slot]
        self._removed.add(slot)
        self._maybe_rebuild()

    def _maybe_rebuild(self) -> None:
        limit = 32 + self._tree_size // 8
        if len(self._pending) > limit or len(self._removed) > limit:
            items = [iv for ivs in self._all.values() for iv in ivs]
            self._tree = _build(items)
            self._tree_size = len(items)
            self._pending = []
            self._removed = set()

    def stab(self, x: Any, out: set[int]) -> None:
        """Add to `out` the slot of every interval containing `x`."""
        node = self._tree
        removed = self._removed
        while node is not None:
            c = node.center
            if x < c:
                for iv in node.by_lo:
                    if iv.lo > x:
                        break
                    if iv.contains(x) and iv.slot not in removed:
                        out.add(iv.slot)
                node = node.left
            elif x > c:
                for iv in node.by_hi:
                    if iv.hi < x:
                        break
                    if iv.contains(x) and iv.slot not in removed:
                        out.add(iv.slot)
                node = node.right
            else:
                for iv in node.by_lo:
                    if iv.contains(x) and iv.slot not in removed:
                        out.add(iv.slot)
                break
        for iv in self._pending:
            if iv.contains(x):
                out.add(iv.slot)
