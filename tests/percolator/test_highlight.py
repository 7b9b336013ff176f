"""Highlights: which clause matched which field, at which character offsets."""

from __future__ import annotations

from percolator import FieldType, Percolator, SavedSearch, Schema
from percolator.highlight import token_spans

SCHEMA = Schema({"title": FieldType.TEXT, "body": FieldType.TEXT, "section": FieldType.KEYWORD,
                 "size": FieldType.NUMBER}, default_fields=("title", "body"))


def _hl(query: str, event: dict) -> list[tuple[str, int, int | None, int | None, str | None]]:
    perc = Percolator.from_searches([SavedSearch("s", "o", query)], schema=SCHEMA)
    (note,) = perc.match(event)
    return [(h.field, h.value_index, h.start, h.end, h.text) for h in note.highlights]


def test_term_offsets_are_into_the_original_value() -> None:
    assert _hl("body:bike", {"body": "A Bike, a BIKE"}) == [
        ("body", 0, 2, 6, "Bike"), ("body", 0, 10, 14, "BIKE")]


def test_phrase_spans_its_tokens_and_default_fields_name_the_field() -> None:
    assert _hl('"blue bike"', {"title": "x", "body": "my blue  bike"}) == [
        ("body", 0, 3, 13, "blue  bike")]


def test_prefix_fuzzy_keyword_and_range() -> None:
    ev = {"title": "Strasse", "body": "bikes", "section": "libs", "size": 7}
    got = _hl("bik* AND title:straße~1 AND section:libs AND size:[5 TO 9]", ev)
    assert sorted(got) == [("body", 0, 0, 5, "bikes"), ("section", 0, 0, 4, "libs"),
                           ("size", 0, 0, 1, "7"), ("title", 0, 0, 7, "Strasse")]


def test_multi_valued_field_names_the_value_and_negations_are_not_highlighted() -> None:
    got = _hl("body:red AND NOT body:blue", {"body": ["green", "a red car"]})
    assert got == [("body", 1, 2, 5, "red")]


def test_offsets_survive_normalisation_that_changes_length() -> None:
    # "ß" casefolds to "ss": the token "strasse" still maps back to "Straße" in the value.
    assert token_spans("Große Straße") == [("grosse", 0, 5), ("strasse", 6, 12)]
    assert _hl("body:strasse", {"body": "Große Straße"}) == [("body", 0, 6, 12, "Straße")]


def test_to_dict_carries_highlights() -> None:
    perc = Percolator.from_searches([SavedSearch("s", "o", "body:bike")], schema=SCHEMA)
    (note,) = perc.match({"body": "bike"})
    assert note.to_dict()["highlights"] == [
        {"field": "body", "value_index": 0, "start": 0, "end": 4, "text": "bike",
         "clause": "body:bike"}]
    off = Percolator.from_searches([SavedSearch("s", "o", "body:bike")], schema=SCHEMA,
                                   highlight=False)
    assert off.match({"body": "bike"})[0].highlights == ()
