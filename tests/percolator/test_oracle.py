"""The main correctness net: the index returns exactly what a naive scan of every query returns.

Queries are generated as *text* (so the parser is exercised too) over a small vocabulary, with
misspellings for fuzzy terms; events draw from the same vocabulary, mixed in case, as lists,
nested objects, numbers as strings, and so on.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from percolator.analysis import FieldType, Schema, flatten
from percolator.engine import Percolator
from percolator.model import SavedSearch
from tests.hyp import examples

WORDS = ["amsterdam", "blue", "bike", "house", "error", "berlin", "red", "car", "ams", "bl"]
TEXT_FIELDS = ["title", "x", "addr.city"]
SCHEMA = Schema({
    "title": FieldType.TEXT, "tag": FieldType.KEYWORD, "price": FieldType.NUMBER,
    "when": FieldType.DATE, "flag": FieldType.BOOLEAN,
})
DATES = ["2024-01-01", "2024-01-15T10:00:00Z", "2024-01-31", "2024-02-01T00:00:00Z", "2023-12-31"]
TAGS = ["a-1", "B-2", "c 3"]

words = st.sampled_from(WORDS)


@st.composite
def misspelt(draw: st.DrawFn) -> str:
    w = list(draw(words))
    for _ in range(draw(st.integers(0, 2))):
        op = draw(st.sampled_from(["del", "ins", "sub", "swap"]))
        i = draw(st.integers(0, max(0, len(w) - 1)))
        if op == "del" and len(w) > 1:
            del w[i]
        elif op == "ins":
            w.insert(i, draw(st.sampled_from("aeixz")))
        elif op == "sub" and w:
            w[i] = draw(st.sampled_from("aeixz"))
        elif op == "swap" and i + 1 < len(w):
            w[i], w[i + 1] = w[i + 1], w[i]
    return "".join(w)


@st.composite
def leaf(draw: st.DrawFn) -> str:
    f = draw(st.sampled_from(TEXT_FIELDS))
    w = draw(words)
    kind = draw(st.integers(0, 15))
    if kind == 0:
        return f"{f}:{w}"
    if kind == 1:
        return w
    if kind == 2:
        slop = draw(st.sampled_from(["", "~1", "~2"]))
        return f'{f}:"{w} {draw(words)}"{slop}'
    if kind == 3:
        return f"{f}:{w[:draw(st.integers(1, 4))]}*"
    if kind == 4:
        return f"{f}:{w[0]}?{w[2:]}*" if len(w) > 2 else f"{f}:*{w}"
    if kind == 5:
        return f"{f}:/{w[:2]}.*/"
    if kind == 6:
        return f"{f}:{draw(misspelt())}~{draw(st.sampled_from(['', '0', '1', '2']))}"
    if kind == 7:
        a, b = sorted(draw(st.lists(st.integers(0, 20), min_size=2, max_size=2)))
        lo, hi = draw(st.sampled_from(["[]", "{}", "[}", "{]"]))
        fld = draw(st.sampled_from(["price", "x"]))
        return f"{fld}:{lo}{draw(st.sampled_from([str(a), '*']))} TO {b}{hi}"
    if kind == 8:
        op = draw(st.sampled_from([">", ">=", "<", "<="]))
        return f"{draw(st.sampled_from(['price', 'x']))}:{op}{draw(st.integers(0, 20))}"
    if kind == 9:
        a, b = sorted(draw(st.lists(st.sampled_from(DATES), min_size=2, max_size=2)))
        return f"when:[{a} TO {b}]" if draw(st.booleans()) else f"when:{{{a} TO {b}}}"
    if kind == 10:
        return f'tag:"{draw(st.sampled_from(TAGS))}"'
    if kind == 11:
        return f"_exists_:{draw(st.sampled_from(TEXT_FIELDS + ['price', 'addr', 'tag']))}"
    if kind == 12:
        return f"flag:{draw(st.sampled_from(['true', 'false']))}"
    if kind == 13:
        return f'title:~"{w} {draw(words)}"@{draw(st.sampled_from([60, 80, 95]))}'
    if kind == 14:
        return f"{draw(st.sampled_from(['price', 'x']))}:{draw(st.integers(0, 20))}"
    return f"{f}:[{w[:2]} TO {draw(words)}]" if w[:2] <= "c" else f"{f}:{{b TO {w}}}"


def query(depth: int = 2) -> st.SearchStrategy[str]:
    if depth == 0:
        return leaf()
    sub = query(depth - 1)
    return st.one_of(
        leaf(),
        st.tuples(sub, sub).map(lambda t: f"({t[0]} AND {t[1]})"),
        st.tuples(sub, sub).map(lambda t: f"({t[0]} OR {t[1]})"),
        sub.map(lambda q: f"NOT {q}"),
        st.tuples(sub, sub).map(lambda t: f"(+{t[0]} -{t[1]})"),
        st.tuples(sub, sub).map(lambda t: f"({t[0]} {t[1]})"),
    )


@st.composite
def text(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.one_of(words, misspelt()), min_size=0, max_size=5))
    if draw(st.booleans()):
        parts = [p.upper() if i % 2 else p.capitalize() for i, p in enumerate(parts)]
    return " ".join(parts)


@st.composite
def event(draw: st.DrawFn) -> dict:
    ev: dict = {}
    if draw(st.booleans()):
        ev["title"] = draw(text()) if draw(st.booleans()) else [draw(text()), draw(text())]
    if draw(st.booleans()):
        ev["x"] = draw(st.one_of(text(), st.integers(0, 20), st.integers(0, 20).map(str)))
    if draw(st.booleans()):
        ev["addr"] = {"city": draw(text())} if draw(st.booleans()) else [
            {"city": draw(text())}, {"zip": "1011"}]
    if draw(st.booleans()):
        ev["tag"] = draw(st.sampled_from(TAGS + ["a"]))
    if draw(st.booleans()):
        ev["price"] = draw(st.one_of(st.integers(0, 20), st.floats(0, 20, allow_nan=False)))
    if draw(st.booleans()):
        ev["when"] = draw(st.sampled_from(DATES))
    if draw(st.booleans()):
        ev["flag"] = draw(st.booleans())
    return ev


def _percolator(queries: list[str]) -> Percolator:
    return Percolator.from_searches(
        (SavedSearch(f"q{i}", "o", q) for i, q in enumerate(queries)), SCHEMA)


def _check(perc: Percolator, events: list[dict]) -> None:
    notes = perc.match_batch(events)
    for i, ev in enumerate(events):
        expected = perc.scan(ev)
        got = sorted(n.search_id for n in notes if n.position == i)
        assert got == expected, (ev, got, expected)
        assert set(expected) <= set(perc.candidates(ev))
    for n in notes:  # highlights point into the event at text the matched clauses name
        flat = flatten(n.event)
        for h in n.highlights:
            assert h.clause in n.matched, (h, n.matched)
            if h.start is not None:
                value = flat[h.field][h.value_index]
                shown = value if isinstance(value, str) else (
                    ("true" if value else "false") if isinstance(value, bool) else str(value))
                assert shown[h.start:h.end] == h.text, (h, value)


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(query(), min_size=1, max_size=25), st.lists(event(), min_size=1, max_size=8))
def test_index_equals_naive_scan(queries: list[str], events: list[dict]) -> None:
    _check(_percolator(queries), events)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(query(1), min_size=1, max_size=40), st.lists(event(), min_size=1, max_size=5),
       st.data())
def test_index_equals_scan_after_updates_and_deletes(queries: list[str], events: list[dict],
                                                     data: st.DataObject) -> None:
    perc = _percolator(queries)
    for i in range(len(queries)):
        action = data.draw(st.sampled_from(["keep", "delete", "replace"]))
        if action == "delete":
            perc.remove(f"q{i}")
        elif action == "replace":
            perc.add(SavedSearch(f"q{i}", "o", data.draw(query(1))))
    _check(perc, events)
