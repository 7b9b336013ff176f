"""Batch-level matching (percolator/batch.py, `QueryIndex.select_batch`): `match_batch` over a
micro-batch gives exactly the notifications of matching each event on its own (`match_each`:
per-event candidates and verification) and of the naive scan, on generated queries and events,
after updates, and on the real corpus sample."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench import apt_corpus
from percolator.model import SavedSearch
from tests.hyp import examples
from tests.percolator.test_oracle import _percolator, event, query


def _pairs(notes: list) -> list[tuple]:
    return [(n.position, n.search_id, n.matched, n.fields, n.highlights) for n in notes]


def _check(perc, events: list[dict]) -> None:
    batch = perc.match_batch(events)
    stats = perc.last_stats
    each = perc.match_each(events)
    assert _pairs(batch) == _pairs(each)
    scan = sorted((i, sid) for i, ev in enumerate(events) for sid in perc.scan(ev))
    assert sorted((n.position, n.search_id) for n in batch) == scan
    # The batch verifies each event against exactly the per-event presearcher's candidates.
    assert stats.candidates == sum(len(perc.candidates(ev)) for ev in events)
    # Labels and fields as running every positive clause on the event (match_batch and
    # match_each take conjunctions' leaves as true without running them: matched_if_true).
    for n in batch:
        full = perc._by_id[n.search_id].matched(perc.analyse(events[n.position]))
        assert (n.matched, n.fields) == full


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(query(), min_size=1, max_size=25), st.lists(event(), min_size=1, max_size=12))
def test_batch_equals_each_equals_scan(queries: list[str], events: list[dict]) -> None:
    _check(_percolator(queries), events)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(query(1), min_size=1, max_size=30), st.lists(event(), min_size=1, max_size=8),
       st.data())
def test_batch_after_updates(queries: list[str], events: list[dict], data: st.DataObject) -> None:
    perc = _percolator(queries)
    perc.match_batch(events)
    for i in range(len(queries)):
        action = data.draw(st.sampled_from(["keep", "delete", "replace"]))
        if action == "delete":
            perc.remove(f"q{i}")
        elif action == "replace":
            perc.add(SavedSearch(f"q{i}", "o", data.draw(query(1))))
    _check(perc, events)


def test_empty_batch() -> None:
    perc = _percolator(["title:blue", "NOT title:red"])
    assert perc.match_batch([]) == []
    assert perc.last_stats.candidates == 0


def test_batch_on_the_real_corpus_sample() -> None:
    from percolator import Percolator

    sample, _ = apt_corpus.load("sample")
    searches = apt_corpus.queries(sample, 3000, seed=11)
    perc = Percolator.from_searches(searches, schema=apt_corpus.SCHEMA)
    events = apt_corpus.shuffled(sample, 200, seed=11)
    _check(perc, events)
    assert perc.last_stats.matched > 0


def test_prefix_and_range_leaves_over_the_batch_as_per_event() -> None:
    # percolator.batch evaluates prefix and range leaves over the whole batch by bisection;
    # multi-valued fields, open and exclusive bounds, values equal to the bounds, string and
    # date ranges and fields the schema does not declare (inferred per value).
    from percolator import FieldType, Percolator, Schema

    schema = Schema({"n": FieldType.NUMBER, "k": FieldType.KEYWORD, "t": FieldType.TEXT,
                     "d": FieldType.DATE})
    queries = ["n:[1 TO 3]", "n:{1 TO 3}", "n:>=3", "n:>3", "n:<1", "n:<=1", "n:[* TO *]",
               "k:[b TO d]", "k:{b TO d}", "k:ab*", "t:bl*", "t:[blue TO green]",
               "d:[2024-01-01 TO 2024-01-31]", "d:{2024-01-01 TO *]", "x:[2 TO 5]", "x:a*",
               "n:[1 TO 3] AND NOT t:bl*", "k:b* OR n:>2.5", "t:b*"]
    events = [{"n": 1, "k": "b", "t": "blue sky", "d": "2024-01-01"},
              {"n": [0, 3], "k": ["ab", "d"], "t": "green blues", "x": 3},
              {"n": 2.5, "k": "abc", "t": "bleak", "d": "2024-02-01T00:00:00Z", "x": "abc"},
              {"n": 3, "k": "e", "x": [5, "a"]},
              {"t": "", "n": [], "k": []},
              {"n": -1, "d": "2023-12-31T23:59:59Z", "t": "Blue"}]
    perc = Percolator.from_searches(
        [SavedSearch(f"q{i}", "o", q) for i, q in enumerate(queries)], schema=schema)
    _check(perc, events)
    _check(perc, events[::-1])
    _check(perc, events * 3)


_KW = ["city:x", "city:y", "kind:flat", "kind:loft", "tag:a", "tag:b", "city:x*", "n:>2",
       "t:blue", "NOT kind:flat", "tag:\"a\""]


@st.composite
def _kw_query(draw: st.DrawFn, depth: int = 0) -> str:
    if depth > 1 or draw(st.booleans()):
        return draw(st.sampled_from(_KW))
    parts = draw(st.lists(_kw_query(depth + 1), min_size=2, max_size=4))
    return "(" + draw(st.sampled_from([" AND ", " OR "])).join(parts) + ")"


_KW_EVENT = st.fixed_dictionaries({}, optional={
    "city": st.one_of(st.sampled_from(["x", "y", "xz"]), st.lists(st.sampled_from(["x", "y"]))),
    "kind": st.one_of(st.sampled_from(["flat", "loft"]), st.lists(st.sampled_from(["flat"]))),
    "tag": st.sampled_from(["a", "b"]), "n": st.integers(0, 5),
    "t": st.sampled_from(["blue sky", "red"])})


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_kw_query(), min_size=1, max_size=20), st.lists(_KW_EVENT, min_size=1,
                                                                 max_size=10))
def test_keyword_pairs_anchor_soundly(queries: list[str], events: list[dict]) -> None:
    # Conjunctions of keyword terms are anchored on the pair ("c" keys, index.anchor_of):
    # batch = each = scan, multi-valued and missing keyword fields included.
    from percolator import FieldType, Percolator, Schema

    schema = Schema({"city": FieldType.KEYWORD, "kind": FieldType.KEYWORD,
                     "tag": FieldType.KEYWORD, "n": FieldType.NUMBER, "t": FieldType.TEXT})
    perc = Percolator.from_searches(
        [SavedSearch(f"q{i}", "o", q) for i, q in enumerate(queries)], schema=schema)
    _check(perc, events)


def test_a_keyword_conjunction_is_anchored_on_the_pair() -> None:
    from percolator import FieldType, Percolator, Schema

    schema = Schema({"city": FieldType.KEYWORD, "kind": FieldType.KEYWORD})
    perc = Percolator.from_searches([SavedSearch("a", "o", "city:x AND kind:flat"),
                                     SavedSearch("b", "o", "city:x AND title:blue")],
                                    schema=schema)
    assert perc.anchor("a") == (("c", ("city", "kind"), ("x", "flat")),)
    assert perc.anchor("b") == (("t", "title", "blue"),)  # one keyword term: no pair
    perc.match_batch([{"city": "x", "kind": "loft"}, {"city": "x", "kind": "flat"}])
    assert perc.last_stats.candidates == 1  # "a" for the flat only; "b": no title


def test_labels_of_conjunctions_are_taken_only_where_certain() -> None:
    # A positive leaf under an OR or a NOT is run; one under conjunctions only is not.
    from percolator import Percolator, Schema

    perc = Percolator.from_searches(
        [SavedSearch("a", "o", "title:blue AND (title:red OR title:car) AND NOT title:house"),
         SavedSearch("b", "o", "title:blue AND title:car"),
         SavedSearch("c", "o", "NOT (NOT title:car OR title:house) AND title:blue")],
        schema=Schema(default_fields=("title",)))
    notes = {n.search_id: n for n in perc.match_batch([{"title": "Blue car"}])}
    assert notes["a"].matched == ("title:blue", "title:car")
    assert notes["b"].matched == ("title:blue", "title:car")
    assert notes["c"].matched == ("title:car", "title:blue")
    assert all(n.fields == ("title",) for n in notes.values())
    entry = perc._by_id["a"]
    assert entry.matched_if_true(perc.analyse({"title": "blue car"})) == entry.matched(
        perc.analyse({"title": "blue car"}))
