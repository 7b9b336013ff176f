"""Query semantics, one behaviour per test: fuzzy, phrases, analysis, ranges, booleans."""

from __future__ import annotations

from typing import Any

import pytest

from percolator import ast
from percolator.analysis import AnalysedEvent, FieldType, Schema, tokenise
from percolator.engine import compile_query
from percolator.syntax import parse


def matches(query: str, event: dict[str, Any], schema: Schema | None = None) -> bool:
    schema = schema or Schema()
    return compile_query(query, schema).matches(AnalysedEvent(event, schema))


@pytest.mark.parametrize(("query", "city", "expected"), [
    ("city:amsterdam~1", "Amsterdm", True),     # one deletion
    ("city:amsterdam~1", "Amstredam", True),    # one transposition (Damerau)
    ("city:amsterdam~1", "Amstrdm", False),     # two edits
    ("city:amsterdam~2", "Amstrdm", True),
    ("city:amsterdam~", "Amstrdm", True),       # default distance 2
    ("city:amsterdam~0", "Amsterdm", False),
    ("city:amsterdam~0", "AMSTERDAM", True),
])
def test_fuzzy_is_damerau_levenshtein(query: str, city: str, expected: bool) -> None:
    assert matches(query, {"city": city}) is expected


def test_phrase_is_positional_on_analysed_tokens() -> None:
    ev = {"title": "The quick, brown fox"}
    assert matches('title:"quick brown"', ev)
    assert not matches('title:"brown quick"', ev)
    assert matches('title:"brown quick"~2', ev)      # a swap costs 2, as Lucene
    assert not matches('title:"brown quick"~1', ev)
    assert matches('title:"quick fox"~1', ev)
    assert not matches('title:"quick fox"', ev)


def test_phrase_does_not_span_values_of_a_list() -> None:
    assert not matches('tags:"red bike"', {"tags": ["red", "bike"]})
    assert matches('tags:"red bike"', {"tags": ["blue", "red bike"]})


def test_text_analysis_normalises_unicode_and_case() -> None:
    assert tokenise("Ｓｔｒａßｅ İstanbul 3.5 don't e-mail") == [
        "strasse", "i̇stanbul", "3.5", "don't", "e", "mail"]
    assert matches("street:STRASSE", {"street": "Straße"})
    assert matches("name:ﬁle", {"name": "FILE"})  # NFKC ligature


def test_keyword_fields_are_exact() -> None:
    schema = Schema({"status": FieldType.KEYWORD})
    assert matches("status:Open", {"status": "Open"}, schema)
    assert not matches("status:open", {"status": "Open"}, schema)
    assert matches('status:"In Progress"', {"status": "In Progress"}, schema)
    assert matches("status:In*", {"status": "In Progress"}, schema)
    assert not matches("status:in*", {"status": "In Progress"}, schema)


def test_prefix_wildcard_regex_on_terms() -> None:
    ev = {"msg": "Connection REFUSED by host"}
    assert matches("msg:refu*", ev)
    assert matches("msg:c?nnect*", ev)
    assert matches("msg:/ref(used|reshed)/", ev)
    assert not matches("msg:/efused/", ev)          # anchored to the whole term
    assert matches("msg:/.*efused/", ev)
    assert matches(r"msg:ho\*st OR msg:h?st", ev)


def test_numeric_and_inferred_types() -> None:
    assert matches("beds:3", {"beds": 3})
    assert matches("beds:3", {"beds": "3"})
    assert matches("beds:3.0", {"beds": 3})
    assert matches("price:[100 TO 400]", {"price": "250"})
    assert matches("price:[-5 TO 5]", {"price": -2.5})
    assert not matches("price:{100 TO 400}", {"price": 400})
    assert matches("active:true", {"active": True})
    assert not matches("active:true", {"active": False})


def test_date_ranges_and_terms() -> None:
    schema = Schema({"at": FieldType.DATE})
    ev = {"at": "2024-03-10T12:00:00+01:00"}
    assert matches("at:[2024-03-01 TO 2024-03-10]", ev, schema)
    assert matches("at:2024-03-10", ev, schema)
    assert matches("at:>=2024-03-10T11:00:00Z", ev, schema)
    assert not matches("at:>2024-03-10T11:00:00Z", ev, schema)
    assert matches("at:[2024-03 TO 2024-03]", ev, schema)
    assert matches("at:<2024-03-11", {"at": 1_710_000_000_000}, schema)  # epoch millis
    # inferred from the bounds on an undeclared field
    assert matches("seen:[2024-01-01 TO 2024-12-31]", {"seen": "2024-06-01"})


def test_boolean_operators() -> None:
    ev = {"a": "x", "b": "y"}
    assert matches("a:x AND b:y", ev)
    assert not matches("a:x AND NOT b:y", ev)
    assert matches("a:x OR b:z", ev)
    assert matches("a:z OR NOT b:z", ev)            # logical OR NOT
    assert matches("+a:x b:z", ev)                  # should clause optional with a must
    assert not matches("+a:x -b:y", ev)
    assert matches("-c:q", ev)                      # pure negative matches everything else
    assert matches("a:z OR b:z OR (a:x AND b:y)", ev)
    assert matches("a:(z OR x) AND b:y", ev)


def test_default_operator_and_default_fields() -> None:
    ev = {"title": "blue bike", "body": "for sale", "sku": "blue"}
    assert matches("blue sale", ev)
    assert matches("red OR sale", ev)
    schema = Schema({"sku": FieldType.KEYWORD}, default_fields=("title",))
    assert not matches("sale", ev, schema)
    assert matches("bike", ev, schema)
    assert compile_query("a b", default_operator="AND").matches(
        AnalysedEvent({"t": "a"}, Schema())) is False


def test_exists_and_nested() -> None:
    ev = {"address": {"city": "Amsterdam", "geo": None}, "tags": []}
    assert matches("_exists_:address", ev)
    assert matches("_exists_:address.city", ev)
    assert not matches("_exists_:address.geo", ev)   # null is absent
    assert not matches("_exists_:tags", ev)          # empty list is absent
    assert matches("address.city:amsterdam", ev)
    assert matches("items.name:bike", {"items": [{"name": "car"}, {"name": "bike"}]})
    assert matches("*:*", {})


def test_similarity_extension() -> None:
    ev = {"title": "Blue bicycle, barely used"}
    assert matches('title:~partial"blue bicycle"@90', ev)
    assert matches('title:~token_set"bicycle blue"@90', ev)
    assert not matches('title:~ratio"red car"@80', ev)
    assert matches('~"blue bicycle"@80', ev)     # default fields
    q = parse('title:~"blue bike"@85 AND price:<100')
    assert isinstance(q, ast.And)
    sim = q.children[0]
    assert sim == ast.Similar("title", "blue bike", 85.0, "wratio")
    assert sim.label == 'title:~"blue bike"@85'


def test_parse_tree_shapes() -> None:
    assert parse("title:bike*") == ast.Prefix("title", "bike")
    assert parse("title:b?ke") == ast.Wildcard("title", "b?ke")
    assert parse(r"title:bike\*") == ast.Term("title", "bike*")
    assert parse("x:[1 TO *}") == ast.Range("x", "1", None, True, False)
    assert parse("x:>=1") == ast.Range("x", "1", None, True, False)
    assert parse("x:*") == ast.Exists("x")
    assert parse("a -b") == ast.And((ast.Term(None, "a"), ast.Not(ast.Term(None, "b"))))
    assert parse("a:1^2") == ast.Term("a", "1")
    assert parse('"a b"~3') == ast.Phrase(None, "a b", 3)


def test_token_pattern_covers_every_combining_mark() -> None:
    import unicodedata

    from percolator.analysis import _TOKEN_RE

    marks = [chr(cp) for cp in range(0x300, 0x10000)
             if unicodedata.category(chr(cp)).startswith("M")]
    assert [m for m in marks if not _TOKEN_RE.fullmatch("a" + m)] == []
    assert _TOKEN_RE.fullmatch("a\u0301b") and not _TOKEN_RE.fullmatch("a-b")


def test_tokens_follow_lucene_standard_tokenizer_on_colons_and_pictographs() -> None:
    # UAX #29: a colon between letters joins (MidLetter), not between digits; Extended_
    # Pictographic symbols are tokens of their own, before NFKC (which would make ™ "tm").
    assert tokenise("the micro:bit at 10:30") == ["the", "micro:bit", "at", "10", "30"]
    assert tokenise("Enforcement®, Role a™ b x😀y") == [
        "enforcement", "®", "role", "a", "™", "b", "x", "😀", "y"]
