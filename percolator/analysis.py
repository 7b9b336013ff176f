"""Analysis: field types, the text analyser, value parsing, and the per-event analysed view.

Field types come from a declared `Schema`; a field the schema does not name is *inferred* from
each event value's JSON type (string → text, number → number, true/false → boolean), and query
terms on such a field are read every way they can be (`beds:3` matches the number 3 and the text
token "3"). docs/percolator.md, "Analysis", has the full rules.

The text analyser: NFKC-normalise, casefold, NFKC again (casefolding can denormalise), then split
into word tokens the way Unicode word segmentation (UAX #29) mostly does — letters/digits/`_`
runs, joined across a MidNumLet (`.`, `'`, `‘`, `’`) between two letters or two digits, a
MidLetter (`:`, `·`, `‧`) between two letters and a MidNum (`,`, `;`, `٬`) between two digits:
"3.5", "don't", "1,000", "a.b", "v1.2.3" are one token; "e-mail", "alpha.3", "science.1136800",
"x.1a" and "1.a" are two (the characters either side of the separator decide, as UAX #29's
WB6/7/11/12 and Lucene's StandardTokenizer do).
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import Any

from cep.errors import ConfigError

# Word characters: \w plus the BMP's combining marks (Unicode categories Mn, Mc, Me; UAX #29
# `Extend`: they belong to the word they follow, but \w does not include them) and ZWJ. Written
# out as a literal (tests/test_architecture.py: stdlib `re` only gets literal patterns);
# tests/percolator/test_match.py checks it against `unicodedata`. The class appears twice.
_WORD_PATTERN = (
    r"[\w\u0300-\u036f\u0483-\u0489\u0591-\u05bd\u05bf\u05c1-\u05c2\u05c4-\u05c5\u05c7\u0610"
    r"-\u061a\u064b-\u065f\u0670\u06d6-\u06dc\u06df-\u06e4\u06e7-\u06e8\u06ea-\u06ed\u0711"
    r"\u0730-\u074a\u07a6-\u07b0\u07eb-\u07f3\u07fd\u0816-\u0819\u081b-\u0823\u0825-\u0827"
    r"\u0829-\u082d\u0859-\u085b\u0898-\u089f\u08ca-\u08e1\u08e3-\u0903\u093a-\u093c\u093e-"
    r"\u094f\u0951-\u0957\u0962-\u0963\u0981-\u0983\u09bc\u09be-\u09c4\u09c7-\u09c8\u09cb-"
    r"\u09cd\u09d7\u09e2-\u09e3\u09fe\u0a01-\u0a03\u0a3c\u0a3e-\u0a42\u0a47-\u0a48\u0a4b-"
    r"\u0a4d\u0a51\u0a70-\u0a71\u0a75\u0a81-\u0a83\u0abc\u0abe-\u0ac5\u0ac7-\u0ac9\u0acb-"
    r"\u0acd\u0ae2-\u0ae3\u0afa-\u0aff\u0b01-\u0b03\u0b3c\u0b3e-\u0b44\u0b47-\u0b48\u0b4b-"
    r"\u0b4d\u0b55-\u0b57\u0b62-\u0b63\u0b82\u0bbe-\u0bc2\u0bc6-\u0bc8\u0bca-\u0bcd\u0bd7"
    r"\u0c00-\u0c04\u0c3c\u0c3e-\u0c44\u0c46-\u0c48\u0c4a-\u0c4d\u0c55-\u0c56\u0c62-\u0c63"
    r"\u0c81-\u0c83\u0cbc\u0cbe-\u0cc4\u0cc6-\u0cc8\u0cca-\u0ccd\u0cd5-\u0cd6\u0ce2-\u0ce3"
    r"\u0d00-\u0d03\u0d3b-\u0d3c\u0d3e-\u0d44\u0d46-\u0d48\u0d4a-\u0d4d\u0d57\u0d62-\u0d63"
    r"\u0d81-\u0d83\u0dca\u0dcf-\u0dd4\u0dd6\u0dd8-\u0ddf\u0df2-\u0df3\u0e31\u0e34-\u0e3a"
    r"\u0e47-\u0e4e\u0eb1\u0eb4-\u0ebc\u0ec8-\u0ecd\u0f18-\u0f19\u0f35\u0f37\u0f39\u0f3e-"
    r"\u0f3f\u0f71-\u0f84\u0f86-\u0f87\u0f8d-\u0f97\u0f99-\u0fbc\u0fc6\u102b-\u103e\u1056-"
    r"\u1059\u105e-\u1060\u1062-\u1064\u1067-\u106d\u1071-\u1074\u1082-\u108d\u108f\u109a-"
    r"\u109d\u135d-\u135f\u1712-\u1715\u1732-\u1734\u1752-\u1753\u1772-\u1773\u17b4-\u17d3"
    r"\u17dd\u180b-\u180d\u180f\u1885-\u1886\u18a9\u1920-\u192b\u1930-\u193b\u1a17-\u1a1b"
    r"\u1a55-\u1a5e\u1a60-\u1a7c\u1a7f\u1ab0-\u1ace\u1b00-\u1b04\u1b34-\u1b44\u1b6b-\u1b73"
    r"\u1b80-\u1b82\u1ba1-\u1bad\u1be6-\u1bf3\u1c24-\u1c37\u1cd0-\u1cd2\u1cd4-\u1ce8\u1ced"
    r"\u1cf4\u1cf7-\u1cf9\u1dc0-\u1dff\u20d0-\u20f0\u2cef-\u2cf1\u2d7f\u2de0-\u2dff\u302a-"
    r"\u302f\u3099-\u309a\ua66f-\ua672\ua674-\ua67d\ua69e-\ua69f\ua6f0-\ua6f1\ua802\ua806"
    r"\ua80b\ua823-\ua827\ua82c\ua880-\ua881\ua8b4-\ua8c5\ua8e0-\ua8f1\ua8ff\ua926-\ua92d"
    r"\ua947-\ua953\ua980-\ua983\ua9b3-\ua9c0\ua9e5\uaa29-\uaa36\uaa43\uaa4c-\uaa4d\uaa7b-"
    r"\uaa7d\uaab0\uaab2-\uaab4\uaab7-\uaab8\uaabe-\uaabf\uaac1\uaaeb-\uaaef\uaaf5-\uaaf6"
    r"\uabe3-\uabea\uabec-\uabed\ufb1e\ufe00-\ufe0f\ufe20-\ufe2f\u200d]+(?:(?:(?<=[^\W\d_])[.'‘’:"
    r"·‧](?=[^\W\d_])|(?<=\d)[.'‘’,;٬](?=\d))[\w\u0300-\u036f\u0483-\u0489\u0591-\u05bd\u05bf\u05c1-"
    r"\u05c2\u05c4-\u05c5"
    r"\u05c7\u0610-\u061a\u064b-\u065f\u0670\u06d6-\u06dc\u06df-\u06e4\u06e7-\u06e8\u06ea-"
    r"\u06ed\u0711\u0730-\u074a\u07a6-\u07b0\u07eb-\u07f3\u07fd\u0816-\u0819\u081b-\u0823"
    r"\u0825-\u0827\u0829-\u082d\u0859-\u085b\u0898-\u089f\u08ca-\u08e1\u08e3-\u0903\u093a-"
    r"\u093c\u093e-\u094f\u0951-\u0957\u0962-\u0963\u0981-\u0983\u09bc\u09be-\u09c4\u09c7-"
    r"\u09c8\u09cb-\u09cd\u09d7\u09e2-\u09e3\u09fe\u0a01-\u0a03\u0a3c\u0a3e-\u0a42\u0a47-"
    r"\u0a48\u0a4b-\u0a4d\u0a51\u0a70-\u0a71\u0a75\u0a81-\u0a83\u0abc\u0abe-\u0ac5\u0ac7-"
    r"\u0ac9\u0acb-\u0acd\u0ae2-\u0ae3\u0afa-\u0aff\u0b01-\u0b03\u0b3c\u0b3e-\u0b44\u0b47-"
    r"\u0b48\u0b4b-\u0b4d\u0b55-\u0b57\u0b62-\u0b63\u0b82\u0bbe-\u0bc2\u0bc6-\u0bc8\u0bca-"
    r"\u0bcd\u0bd7\u0c00-\u0c04\u0c3c\u0c3e-\u0c44\u0c46-\u0c48\u0c4a-\u0c4d\u0c55-\u0c56"
    r"\u0c62-\u0c63\u0c81-\u0c83\u0cbc\u0cbe-\u0cc4\u0cc6-\u0cc8\u0cca-\u0ccd\u0cd5-\u0cd6"
    r"\u0ce2-\u0ce3\u0d00-\u0d03\u0d3b-\u0d3c\u0d3e-\u0d44\u0d46-\u0d48\u0d4a-\u0d4d\u0d57"
    r"\u0d62-\u0d63\u0d81-\u0d83\u0dca\u0dcf-\u0dd4\u0dd6\u0dd8-\u0ddf\u0df2-\u0df3\u0e31"
    r"\u0e34-\u0e3a\u0e47-\u0e4e\u0eb1\u0eb4-\u0ebc\u0ec8-\u0ecd\u0f18-\u0f19\u0f35\u0f37"
    r"\u0f39\u0f3e-\u0f3f\u0f71-\u0f84\u0f86-\u0f87\u0f8d-\u0f97\u0f99-\u0fbc\u0fc6\u102b-"
    r"\u103e\u1056-\u1059\u105e-\u1060\u1062-\u1064\u1067-\u106d\u1071-\u1074\u1082-\u108d"
    r"\u108f\u109a-\u109d\u135d-\u135f\u1712-\u1715\u1732-\u1734\u1752-\u1753\u1772-\u1773"
    r"\u17b4-\u17d3\u17dd\u180b-\u180d\u180f\u1885-\u1886\u18a9\u1920-\u192b\u1930-\u193b"
    r"\u1a17-\u1a1b\u1a55-\u1a5e\u1a60-\u1a7c\u1a7f\u1ab0-\u1ace\u1b00-\u1b04\u1b34-\u1b44"
    r"\u1b6b-\u1b73\u1b80-\u1b82\u1ba1-\u1bad\u1be6-\u1bf3\u1c24-\u1c37\u1cd0-\u1cd2\u1cd4-"
    r"\u1ce8\u1ced\u1cf4\u1cf7-\u1cf9\u1dc0-\u1dff\u20d0-\u20f0\u2cef-\u2cf1\u2d7f\u2de0-"
    r"\u2dff\u302a-\u302f\u3099-\u309a\ua66f-\ua672\ua674-\ua67d\ua69e-\ua69f\ua6f0-\ua6f1"
    r"\ua802\ua806\ua80b\ua823-\ua827\ua82c\ua880-\ua881\ua8b4-\ua8c5\ua8e0-\ua8f1\ua8ff"
    r"\ua926-\ua92d\ua947-\ua953\ua980-\ua983\ua9b3-\ua9c0\ua9e5\uaa29-\uaa36\uaa43\uaa4c-"
    r"\uaa4d\uaa7b-\uaa7d\uaab0\uaab2-\uaab4\uaab7-\uaab8\uaabe-\uaabf\uaac1\uaaeb-\uaaef"
    r"\uaaf5-\uaaf6\uabe3-\uabea\uabec-\uabed\ufb1e\ufe00-\ufe0f\ufe20-\ufe2f\u200d]+)*"
)
_TOKEN_RE = re.compile(_WORD_PATTERN)
# Pictographic symbols (Unicode Extended_Pictographic, as emoji-data.txt lists it; BMP ranges
# and the emoji planes): each is a token of its own, before normalisation (NFKC would turn ™
# into "tm"), as Lucene's StandardTokenizer emits them. Literal pattern (see above).
_PICTO_RE = re.compile(
    "[\u00a9\u00ae\u203c\u2049\u2122\u2139\u2194-\u2199\u21a9-\u21aa\u231a-\u231b"
    "\u2328\u2388\u23cf\u23e9-\u23f3\u23f8-\u23fa\u25aa-\u25ab\u25b6\u25c0"
    "\u25fb-\u25fe\u2600-\u2605\u2607-\u2612\u2614-\u2685\u2690-\u2705\u2708-\u2712"
    "\u2714\u2716\u271d\u2721\u2728\u2733-\u2734\u2744\u2747\u274c\u274e\u2753-\u2755"
    "\u2757\u2763-\u2767\u2795-\u2797\u27a1\u27b0\u27bf\u2934-\u2935\u2b05-\u2b07"
    "\u2b1b-\u2b1c\u2b50\u2b55\u3030\u303d\u3297\u3299\U0001f000-\U0001f0ff"
    "\U0001f10d-\U0001f10f\U0001f12f\U0001f16c-\U0001f171\U0001f17e-\U0001f17f"
    "\U0001f18e\U0001f191-\U0001f19a\U0001f1ad-\U0001f1e5\U0001f201-\U0001f20f"
    "\U0001f21a\U0001f22f\U0001f232-\U0001f23a\U0001f23c-\U0001f23f\U0001f249-\U0001f3fa"
    "\U0001f400-\U0001f53d\U0001f546-\U0001f64f\U0001f680-\U0001f6ff\U0001f774-\U0001f77f"
    "\U0001f7d5-\U0001f7ff\U0001f80c-\U0001f80f\U0001f848-\U0001f84f\U0001f85a-\U0001f85f"
    "\U0001f888-\U0001f88f\U0001f8ae-\U0001f8ff\U0001f90c-\U0001f93a\U0001f93c-\U0001f945"
    "\U0001f947-\U0001faff\U0001fc00-\U0001fffd]")
_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_DATE_RE = re.compile(r"\d{4}-\d{2}(?:-\d{2})?(?:[T ]\d{2}(?::\d{2}(?::\d{2}(?:\.\d+)?)?)?)?"
                      r"(?:Z|[+-]\d{2}:?\d{2})?")
MAX_EXACT_INT = 2**53


class FieldType(StrEnum):
    TEXT = "text"
    KEYWORD = "keyword"
    NUMBER = "number"
    DATE = "date"
    BOOLEAN = "boolean"
    GEO_POINT = "geo_point"


@dataclass(frozen=True)
class Schema:
    """Declared field types (dotted paths) and the default fields for unqualified terms.

    `default_fields=None` means every text field of the event (declared text, or any string
    value of an undeclared field), like Elasticsearch's `index.query.default_field: *`.
    """

    fields: Mapping[str, FieldType] = field(default_factory=dict)
    default_fields: tuple[str, ...] | None = None

    def type_of(self, path: str) -> FieldType | None:
        return self.fields.get(path)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Schema:
        raw = data.get("fields", {})
        if not isinstance(raw, Mapping):
            raise ConfigError("schema 'fields' must map field names to types")
        fields: dict[str, FieldType] = {}
        for name, kind in raw.items():
            try:
                fields[str(name)] = FieldType(str(kind))
            except ValueError:
                allowed = ", ".join(t.value for t in FieldType)
                raise ConfigError(f"field {name!r}: unknown type {kind!r} ({allowed})") from None
        defaults = data.get("default_fields")
        return cls(fields, tuple(str(f) for f in defaults) if defaults is not None else None)

    @classmethod
    def load(cls, path: str | Path) -> Schema:
        text = Path(path).read_text(encoding="utf-8")
        if str(path).endswith((".yaml", ".yml")):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
        return cls.from_dict(data or {})

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"fields": {k: v.value for k, v in self.fields.items()}}
        if self.default_fields is not None:
            out["default_fields"] = list(self.default_fields)
        return out


def normalise(text: str) -> str:
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())


def tokenise(text: str) -> list[str]:
    if _PICTO_RE.search(text) is None:
        return _TOKEN_RE.findall(normalise(text))
    out: list[str] = []
    pos = 0
    for m in _PICTO_RE.finditer(text):
        out += _TOKEN_RE.findall(normalise(text[pos:m.start()]))
        out.append(m.group())
        pos = m.end()
    out += _TOKEN_RE.findall(normalise(text[pos:]))
    return out


def segments(text: str) -> list[tuple[int, str, bool]]:
    """(offset, piece, is a pictograph) of `text`, split at pictographic symbols."""
    out: list[tuple[int, str, bool]] = []
    pos = 0
    for m in _PICTO_RE.finditer(text):
        if m.start() > pos:
            out.append((pos, text[pos:m.start()], False))
        out.append((m.start(), m.group(), True))
        pos = m.end()
    if pos < len(text):
        out.append((pos, text[pos:], False))
    return out


@lru_cache(maxsize=65_536)
def parse_number(text: str) -> float | None:
    text = text.strip()
    if not _NUMBER_RE.fullmatch(text):
        return None
    return float(text)


def canonical_number(x: float) -> str:
    if x.is_integer() and abs(x) < MAX_EXACT_INT:
        return str(int(x))
    return repr(float(x))


@lru_cache(maxsize=65_536)
def parse_date(text: str) -> tuple[int, int] | None:
    """(start, end) epoch milliseconds, end exclusive: a day for a date, a month for YYYY-MM,
    one millisecond for a date-time. Naive times are UTC. None if `text` is not ISO 8601."""
    text = text.strip()
    if not _DATE_RE.fullmatch(text):
        return None
    try:
        if len(text) == 7:
            start = datetime.fromisoformat(text + "-01").replace(tzinfo=UTC)
            month = start.replace(day=28) + timedelta(days=4)
            end = month.replace(day=1)
        else:
            start = datetime.fromisoformat(text)
            if start.tzinfo is None:
                start = start.replace(tzinfo=UTC)
            end = start + (timedelta(days=1) if len(text) == 10 else timedelta(milliseconds=1))
    except ValueError:
        return None
    return _ms(start), _ms(end)


def _ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def flatten(event: Mapping[str, Any]) -> dict[str, list[Any]]:
    """Dotted path → scalar values. Lists are multi-valued fields; objects in lists merge by path
    (as Elasticsearch's object fields); nulls are absent."""
    out: dict[str, list[Any]] = {}
    stack: list[tuple[str, Any]] = [(k, v) for k, v in reversed(list(event.items()))]
    while stack:
        path, value = stack.pop()
        if isinstance(value, Mapping):
            stack.extend((f"{path}.{k}", v) for k, v in reversed(list(value.items())))
        elif isinstance(value, (list, tuple)):
            stack.extend((path, v) for v in reversed(value))
        elif value is not None:
            out.setdefault(path, []).append(value)
    return out


_EMPTY: tuple[Any, ...] = ()


class AnalysedEvent:
    """One event seen through the schema; every view is computed once, on first use."""

    __slots__ = ("event", "schema", "flat", "memo", "_cache", "_present")

    def __init__(self, event: Mapping[str, Any], schema: Schema) -> None:
        self.event = event
        self.schema = schema
        self.flat = flatten(event)
        self.memo: dict[int, bool] = {}
        self._cache: dict[tuple[str, str], Any] = {}
        self._present: frozenset[str] | None = None

    def values(self, path: str) -> list[Any]:
        return self.flat.get(path, [])

    def present(self, path: str) -> bool:
        if self._present is None:
            paths: set[str] = set()
            for p in self.flat:
                paths.add(p)
                i = p.find(".")
                while i != -1:
                    paths.add(p[:i])
                    i = p.find(".", i + 1)
            self._present = frozenset(paths)
        return path in self._present

    def _get(self, kind: str, path: str) -> Any:
        key = (kind, path)
        try:
            return self._cache[key]
        except KeyError:
            value = self._cache[key] = getattr(self, "_compute_" + kind)(path)
            return value

    def text_fields(self) -> list[str]:
        """Paths searched by unqualified terms when the schema names no default fields."""
        out = []
        for path, vals in self.flat.items():
            kind = self.schema.type_of(path)
            if kind is FieldType.TEXT or (kind is None and any(isinstance(v, str) for v in vals)):
                out.append(path)
        return out

    # -- views ---------------------------------------------------------------------------------
    def token_lists(self, path: str) -> list[list[str]]:
        """One token list per text value (for phrases)."""
        result: list[list[str]] = self._get("token_lists", path)
        return result

    def terms(self, path: str) -> frozenset[str]:
        """The field's terms: analysed tokens for text fields, whole values for keyword ones."""
        result: frozenset[str] = self._get("terms", path)
        return result

    def texts(self, path: str) -> list[str]:
        """Each string value as its analysed tokens joined by spaces (for similarity)."""
        result: list[str] = self._get("texts", path)
        return result

    def numbers(self, path: str) -> list[float]:
        result: list[float] = self._get("numbers", path)
        return result

    def dates(self, path: str) -> list[int]:
        result: list[int] = self._get("dates", path)
        return result

    def points(self, path: str) -> list[tuple[float, float]]:
        """(lat, lon) of the field's geo_point values (declared geo_point fields only)."""
        result: list[tuple[float, float]] = self._get("points", path)
        return result

    def _compute_points(self, path: str) -> list[tuple[float, float]]:
        if self.schema.type_of(path) is not FieldType.GEO_POINT:
            return []
        from percolator.geo import points

        return points(self.event, path)

    def bools(self, path: str) -> list[bool]:
        result: list[bool] = self._get("bools", path)
        return result

    def _strings(self, path: str) -> list[str]:
        kind = self.schema.type_of(path)
        if path == "*":
            return [v for p in self.text_fields() for v in self.values(p) if isinstance(v, str)]
        if kind is None:
            return [v for v in self.values(path) if isinstance(v, str)]
        if kind in (FieldType.TEXT, FieldType.KEYWORD):
            return [_as_string(v) for v in self.values(path)]
        return []

    def _compute_token_lists(self, path: str) -> list[list[str]]:
        if path != "*" and self.schema.type_of(path) is FieldType.KEYWORD:
            return []
        return [tokenise(s) for s in self._strings(path)]

    def _compute_terms(self, path: str) -> frozenset[str]:
        if path != "*" and self.schema.type_of(path) is FieldType.KEYWORD:
            return frozenset(self._strings(path))
        return frozenset(t for toks in self.token_lists(path) for t in toks)

    def _compute_texts(self, path: str) -> list[str]:
        return [" ".join(tokenise(s)) for s in self._strings(path)]

    def _compute_numbers(self, path: str) -> list[float]:
        kind = self.schema.type_of(path)
        if kind not in (None, FieldType.NUMBER) or path == "*":
            return []
        out: list[float] = []
        for v in self.values(path):
            if isinstance(v, bool):
                continue
            if isinstance(v, (int, float)):
                out.append(float(v))
            elif isinstance(v, str):
                n = parse_number(v)
                if n is not None:
                    out.append(n)
        return out

    def _compute_dates(self, path: str) -> list[int]:
        kind = self.schema.type_of(path)
        if kind not in (None, FieldType.DATE) or path == "*":
            return []
        out: list[int] = []
        for v in self.values(path):
            if isinstance(v, str):
                d = parse_date(v)
                if d is not None:
                    out.append(d[0])
            elif kind is FieldType.DATE and isinstance(v, (int, float)) and not isinstance(
                    v, bool):
                out.append(int(v))
        return out

    def _compute_bools(self, path: str) -> list[bool]:
        kind = self.schema.type_of(path)
        if kind not in (None, FieldType.BOOLEAN) or path == "*":
            return []
        out: list[bool] = []
        for v in self.values(path):
            if isinstance(v, bool):
                out.append(v)
            elif kind is FieldType.BOOLEAN and isinstance(v, str) and v in ("true", "false"):
                out.append(v == "true")
        return out


def _as_string(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return canonical_number(value)
    return str(value)
