"""The real-corpus workload (bench/apt_corpus.py) on the committed sample of apt descriptions:
the loader's events, the generated searches, and the index against a naive scan on real text."""

from __future__ import annotations

from collections import Counter

import pytest

from bench import apt_corpus
from percolator import Percolator


@pytest.fixture(scope="module")
def sample() -> list[dict]:
    events, where = apt_corpus.load("sample")
    assert where.endswith("apt_sample.txt.gz")
    return events


def test_sample_events_have_the_fields_of_the_workload(sample: list[dict]) -> None:
    assert len(sample) > 1000
    assert len({e["package"] for e in sample}) == len(sample)
    with_body = [e for e in sample if len(e["body"].split()) > 20]
    assert len(with_body) > len(sample) // 2  # long descriptions were merged in
    assert all(isinstance(e["installed_size"], int) for e in sample)
    assert all("\t" not in e["body"] and "\n" not in e["body"] for e in sample)


def test_stanzas_join_continuation_lines_and_translations() -> None:
    pkgs = "Package: a\nDescription: short\nDescription-md5: 11\nSection: libs\n\n"
    trans = "Package: a\nDescription-md5: 11\nDescription-en: short\n long one\n .\n two\n"
    (ev,) = apt_corpus.events_from(apt_corpus.merge_translations(pkgs, trans))
    assert (ev["title"], ev["body"], ev["section"]) == ("short", "long one two", "libs")


def test_generated_searches_cover_every_shape_and_are_selective(sample: list[dict]) -> None:
    searches = apt_corpus.queries(sample, 2000)
    kinds = Counter(s.metadata["kind"] for s in searches)
    assert set(kinds) >= {"and2", "phrase", "title", "not", "prefix", "fuzzy", "or_section",
                          "range", "and3"}
    perc = Percolator.from_searches(searches, schema=apt_corpus.SCHEMA, highlight=False)
    events = apt_corpus.shuffled(sample, 300)
    notes = perc.match_batch(events)
    # A typical document matches a few searches, not hundreds.
    assert len(notes) / len(events) < 20
    assert perc.last_stats.verified_fraction < 0.02


def test_index_equals_naive_scan_on_real_text(sample: list[dict]) -> None:
    searches = apt_corpus.queries(sample, 1500, seed=5)
    perc = Percolator.from_searches(searches, schema=apt_corpus.SCHEMA)
    events = apt_corpus.shuffled(sample, 150, seed=5)
    notes = perc.match_batch(events)
    got = sorted((n.position, n.search_id) for n in notes)
    want = sorted((i, sid) for i, ev in enumerate(events) for sid in perc.scan(ev))
    assert got == want
    assert want  # the sample does produce matches
