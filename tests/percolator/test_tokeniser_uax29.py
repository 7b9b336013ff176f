"""The word pattern against Lucene's StandardAnalyzer on tokens joined by `.`, `'`, `:`, `,`.

UAX #29 joins across a separator only when the characters either side are of the right kind
(WB6/7: letter MidLetter|MidNumLet letter; WB11/12: digit MidNum|MidNumLet digit), so
"alpha.3" and "science.1136800" are two tokens. The 1M Lucene Monitor comparison found 7
Lucene-only pairs from these (bench/results/percolator_corpus_1m.json). The expected lists
were printed by Lucene 9.11.1's `StandardAnalyzer(CharArraySet.EMPTY_SET)` (the analyser of
bench/lucene's MonitorBench), one line per input.
"""

from __future__ import annotations

import pytest

from percolator.analysis import tokenise

LUCENE_9_11 = [
    ("alpha.3", ["alpha", "3"]),
    ("science.1136800", ["science", "1136800"]),
    ("3.5", ["3.5"]),
    ("a.b", ["a.b"]),
    ("1.a", ["1", "a"]),
    ("a1.2", ["a1.2"]),
    ("x.1a", ["x", "1a"]),
    ("v1.2.3", ["v1.2.3"]),
    ("don't", ["don't"]),
    ("1'000", ["1'000"]),
    ("rock'n'roll", ["rock'n'roll"]),
    ("a'1", ["a", "1"]),
    ("1,000", ["1,000"]),
    ("a,b", ["a", "b"]),
    ("a:b", ["a:b"]),
    ("1:2", ["1", "2"]),
    ("foo_.bar", ["foo_", "bar"]),
    ("a_1.2", ["a_1.2"]),
    ("3.x", ["3", "x"]),
    ("e.g.", ["e.g"]),
    ("libfoo2.0", ["libfoo2.0"]),
    ("U.S.A.", ["u.s.a"]),
    ("python3.11", ["python3.11"]),
    ("www.debian.org", ["www.debian.org"]),
    ("1.2.a", ["1.2", "a"]),
    ("a.1.b", ["a", "1", "b"]),
    ("x\u2019s", ["x\u2019s"]),
    ("3\u20194", ["3\u20194"]),
    ("a;b", ["a", "b"]),
    ("1;2", ["1;2"]),
    ("1.2.3.4", ["1.2.3.4"]),
    ("gcc-4.9", ["gcc", "4.9"]),
    ("\u00e9.1", ["\u00e9", "1"]),
    ("q.\u00e9", ["q.\u00e9"]),
    ("a\u00b7b", ["a\u00b7b"]),
    ("1\u00b72", ["1", "2"]),
    ("a\u2018b", ["a\u2018b"]),
    ("1\u20182", ["1\u20182"]),
    ("1\u066c2", ["1\u066c2"]),
    ("a\u2027b", ["a\u2027b"]),
    ("ab.3c", ["ab", "3c"]),
    ("3c.ab", ["3c.ab"]),
    ("3.a5", ["3", "a5"]),
    ("a_.1", ["a_", "1"]),
    ("1_.2", ["1_", "2"]),
]


@pytest.mark.parametrize(("text", "tokens"), LUCENE_9_11)
def test_separator_joins_like_lucene(text: str, tokens: list[str]) -> None:
    assert tokenise(text) == tokens


def test_the_corpus_sentences_of_the_1m_difference() -> None:
    # The shape of the two events that differed at 1M: a version or a DOI after a word.
    assert tokenise("this is alpha.3 of the upload tool") == [
        "this", "is", "alpha", "3", "of", "the", "upload", "tool"]
    assert tokenise("doi:10.1126/science.1136800") == [
        "doi", "10.1126", "science", "1136800"]
