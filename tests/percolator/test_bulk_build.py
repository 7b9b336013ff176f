"""The bulk build (`Percolator.from_searches`: each distinct text planned once, the index built
by `QueryIndex.add_many`) gives the same index as adding the searches one by one with `add`:
the same postings, always-run set, tallies (prefix lengths, fuzzy bounds, geo levels), stored
keys and range hits, and then the same notifications, also after updates and deletes. The
matching itself stays checked against the naive scan (test_oracle.py, test_batch.py)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench import apt_corpus
from percolator import Percolator
from percolator.model import SavedSearch
from percolator.ranges import RangeIndex
from tests.hyp import examples
from tests.percolator.test_oracle import SCHEMA, event, query


def _one_by_one(searches: list[SavedSearch], schema) -> Percolator:
    perc = Percolator(schema)
    for s in searches:
        perc.add(s)
    return perc


def _ranges(r: RangeIndex) -> list[tuple]:
    return sorted((iv.lo, iv.hi, iv.include_lo, iv.include_hi, iv.slot)
                  for ivs in r._all.values() for iv in ivs)


def _same_index(a: Percolator, b: Percolator) -> None:
    ia, ib = a._index, b._index
    assert len(ia) == len(ib)
    assert ia.always == ib.always
    assert ia._keys == ib._keys
    assert ia.postings.keys() == ib.postings.keys()
    for gk, group in ia.postings.items():
        other = ib.postings[gk]
        assert group.keys() == other.keys(), gk
        for v, posting in group.items():
            p, q = other[v], posting
            assert type(p) is type(q) and (p == q if isinstance(p, int) else list(p) == list(q)), \
                (gk, v, p, q)
    assert ia._prefix_lengths == ib._prefix_lengths
    assert ia._geo_levels == ib._geo_levels
    assert ia._fuzzy == ib._fuzzy
    assert ia._fuzzy_spec == ib._fuzzy_spec
    assert ia.ranges.keys() == ib.ranges.keys()
    for rk, r in ia.ranges.items():
        assert _ranges(r) == _ranges(ib.ranges[rk]), rk


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(query(), min_size=1, max_size=30), st.lists(st.integers(0, 40), max_size=40),
       st.lists(event(), min_size=1, max_size=8), st.data())
def test_bulk_build_equals_one_by_one(queries: list[str], ids: list[int], events: list[dict],
                                      data: st.DataObject) -> None:
    # Repeated texts (shared plans and anchors) and repeated ids (replacements in the load).
    texts = queries + [queries[i % len(queries)] for i in ids]
    searches = [SavedSearch(f"q{(ids[i] if i < len(ids) and i % 3 == 0 else i)}", "o", t)
                for i, t in enumerate(texts)]
    bulk = Percolator.from_searches(searches, SCHEMA)
    single = _one_by_one(searches, SCHEMA)
    _same_index(bulk, single)
    assert bulk.match_batch(events) == single.match_batch(events)
    for sid in list(bulk._by_id)[::2]:  # deletes and replacements work on the bulk index
        new = data.draw(query(1))
        for perc in (bulk, single):
            perc.remove(sid)
            perc.add(SavedSearch(sid + "r", "o", new))
    _same_index(bulk, single)
    assert bulk.match_batch(events) == single.match_batch(events)


def test_bulk_build_on_the_real_corpus_sample() -> None:
    sample, _ = apt_corpus.load("sample")
    searches = apt_corpus.queries(sample, 3000, seed=5)
    searches += [SavedSearch(f"dup{i}", "o", s.query) for i, s in enumerate(searches[:500])]
    bulk = Percolator.from_searches(searches, apt_corpus.SCHEMA)
    _same_index(bulk, _one_by_one(searches, apt_corpus.SCHEMA))
    # Searches with the same text share one plan.
    assert bulk._by_id["dup0"].plan is bulk._by_id[searches[0].id].plan
