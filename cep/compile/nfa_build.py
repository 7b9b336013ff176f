"""PATTERN → `cep.nfa.Nfa` states (a Thompson construction with ordered epsilon moves).

The pattern is built backwards: each element is compiled knowing the node that follows it.
Quantifiers are expanded into copies (`B{2,}` is `B B B*`) so that every consuming state has one
connector: the first repetition is entered with the element's connector, later repetitions with
strict contiguity unless the group starts with its own connector (`(-> B)+`). Epsilon moves are
then resolved: every consuming state lists, in preference order (greedy: repeat first; reluctant:
leave first; `|`: left first), the consuming states reachable after it, or ACCEPT.

Negations become guards on the state of the variable that follows them (`A -> NOT X -> B`: the
first copy of B skips no X), or, at the end of the pattern, an ABSENCE state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cep import ast
from cep.nfa import ACCEPT, Conn, Nfa, State, StateKind

MAX_STATES = 2000


class TooManyStates(Exception):
    pass


@dataclass(slots=True)
class _Node:
    kind: str  # "consume" | "split" | "accept" | "absence"
    var: int = -1
    conn: Conn = Conn.STRICT
    outs: list[_Node] = field(default_factory=list)
    not_next: tuple[int, ...] = ()
    not_followed: tuple[int, ...] = ()


class _Builder:
    def __init__(self, var_index: dict[str, int]) -> None:
        self.var_index = var_index
        self.consumers = 0

    def consume(
        self,
        name: str,
        conn: Conn,
        nxt: _Node,
        guards: tuple[tuple[int, ...], tuple[int, ...]] = ((), ()),
    ) -> _Node:
        self.consumers += 1
        if self.consumers > MAX_STATES:
            raise TooManyStates
        return _Node("consume", self.var_index[name], conn, [nxt], guards[0], guards[1])

    def element(
        self,
        el: ast.PVar | ast.PAlt,
        conn: Conn,
        nxt: _Node,
        guards: tuple[tuple[int, ...], tuple[int, ...]] = ((), ()),
    ) -> _Node:
        if isinstance(el, ast.PVar):
            return self.consume(el.name, conn, nxt, guards)
        branches = [self.sequence(b, conn, nxt) for b in el.branches]
        return branches[0] if len(branches) == 1 else _Node("split", outs=branches)

    def sequence(self, seq: ast.PSeq, inherit: Conn, nxt: _Node) -> _Node:
        node = nxt
        for pos in range(len(seq.items) - 1, -1, -1):
            item = seq.items[pos]
            conn = item.conn if item.conn is not None else inherit
            node = self.item(item, conn, node)
        return node

    def item(
        self,
        item: ast.PItem,
        conn: Conn,
        nxt: _Node,
        guards: tuple[tuple[int, ...], tuple[int, ...]] = ((), ()),
    ) -> _Node:
        el = item.element
        assert not isinstance(el, ast.PNot)
        q = item.quant
        if q is None:
            return self.element(el, conn, nxt, guards)
        again = Conn.STRICT  # connector into repetitions 2..n (inner connectors still win)
        # optional / looping tail after the mandatory copies
        if q.max is None:
            loop = _Node("split")
            body = self.element(el, again, loop)
            loop.outs = [body, nxt] if q.greedy else [nxt, body]
            if q.min == 0:
                first = self.element(el, conn, loop, guards)
                return _Node("split", outs=[first, nxt] if q.greedy else [nxt, first])
            tail = loop
        else:
            tail = nxt
            for k in range(q.max - q.min, 0, -1):
                is_first = q.min == 0 and k == 1
                body = self.element(
                    el, conn if is_first else again, tail, guards if is_first else ((), ())
                )
                tail = _Node("split", outs=[body, nxt] if q.greedy else [nxt, body])
            if q.min == 0:
                return tail
        node = tail
        for k in range(q.min, 0, -1):
            node = self.element(el, conn if k == 1 else again, node, guards if k == 1 else ((), ()))
        return node


def build_nfa(
    pattern: ast.PAlt,
    var_index: dict[str, int],
    conditions: tuple[object, ...],
    within_ms: int | None,
    step_ms: int | None,
) -> Nfa:
    b = _Builder(var_index)
    vars_ = tuple(sorted(var_index, key=var_index.__getitem__))
    top = pattern.branches[0].items if len(pattern.branches) == 1 else ()
    has_not = any(isinstance(i.element, ast.PNot) for i in top)
    end = _Node("accept")
    if not has_not:
        entry = (
            b.sequence(pattern.branches[0], Conn.STRICT, end)
            if len(pattern.branches) == 1
            else b.element(pattern, Conn.STRICT, end)
        )
    else:
        pending: list[ast.PItem] = []
        node = end
        items = list(top)
        while items and isinstance(items[-1].element, ast.PNot):
            pending.insert(0, items.pop())
        if pending:
            node = _Node(
                "absence",
                not_next=_guards(pending, var_index, Conn.STRICT),
                not_followed=_guards(pending, var_index, Conn.RELAXED),
            )
        nots: list[ast.PItem] = []
        for pos in range(len(items) - 1, -1, -1):
            item = items[pos]
            if isinstance(item.element, ast.PNot):
                continue
            nots = []
            j = pos - 1
            while j >= 0 and isinstance(items[j].element, ast.PNot):
                nots.insert(0, items[j])
                j -= 1
            guards = (_guards(nots, var_index, Conn.STRICT), _guards(nots, var_index, Conn.RELAXED))
            conn = item.conn if item.conn is not None else Conn.STRICT
            node = b.item(item, conn, node, guards)
        entry = node
    return _finish(entry, vars_, conditions, within_ms, step_ms, _render(pattern))


def _guards(items: list[ast.PItem], var_index: dict[str, int], conn: Conn) -> tuple[int, ...]:
    out: list[int] = []
    for i in items:
        if isinstance(i.element, ast.PNot) and (i.conn or Conn.STRICT) is conn:
            v = var_index[i.element.name]
            if v not in out:
                out.append(v)
    return tuple(out)


def _closure(node: _Node) -> list[_Node]:
    """Consuming/accept/absence nodes reachable through splits, in preference order, deduped."""
    out: list[_Node] = []
    seen: set[int] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if n.kind == "split":
            stack.extend(reversed(n.outs))
        else:
            out.append(n)
    return out


def _finish(
    entry: _Node,
    vars_: tuple[str, ...],
    conditions: tuple[object, ...],
    within_ms: int | None,
    step_ms: int | None,
    text: str,
) -> Nfa:
    order: dict[int, int] = {}
    nodes: list[_Node] = []

    def number(n: _Node) -> int:
        if n.kind == "accept":
            return ACCEPT
        if id(n) not in order:
            order[id(n)] = len(nodes)
            nodes.append(n)
        return order[id(n)]

    initial = tuple(number(n) for n in _closure(entry))
    states: list[State] = []
    disarmed: list[_Node] = []
    i = 0
    while i < len(nodes):
        n = nodes[i]
        nxt = tuple(number(t) for t in _closure(n.outs[0])) if n.kind == "consume" else ()
        after = -1
        if n.not_next:
            if (n.conn is Conn.STRICT and n.kind == "consume") or (
                n.kind == "absence" and not n.not_followed
            ):
                after = i
            else:
                copy = _Node(n.kind, n.var, n.conn, n.outs, (), n.not_followed)
                disarmed.append(copy)
                after = number(copy)
        kind = StateKind.STEP if n.kind == "consume" else StateKind.ABSENCE
        conn = n.conn if kind is StateKind.STEP else Conn.RELAXED
        states.append(State(i, kind, n.var, conn, nxt, n.not_next, n.not_followed, after))
        i += 1
    return Nfa(vars_, conditions, tuple(states), initial, within_ms, step_ms, text)  # type: ignore[arg-type]


def _render(pattern: ast.PAlt) -> str:
    def alt(a: ast.PAlt) -> str:
        return " | ".join(seq(b) for b in a.branches)

    def seq(s: ast.PSeq) -> str:
        parts = []
        for pos, item in enumerate(s.items):
            el = item.element
            text = (
                el.name
                if isinstance(el, ast.PVar)
                else f"NOT {el.name}"
                if isinstance(el, ast.PNot)
                else f"({alt(el)})"
            )
            if item.quant is not None:
                text += str(item.quant)
            if item.conn is not None and (item.conn is not Conn.STRICT or pos == 0):
                text = f"{item.conn.symbol} {text}" if item.conn.symbol else text
            parts.append(text)
        return " ".join(parts)

    return alt(pattern)
