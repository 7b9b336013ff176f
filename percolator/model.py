"""Saved searches, notification targets and changelog entries, with their JSON forms.

A changelog entry is keyed by search id; its value is the search's JSON (an upsert) or null (a
delete, i.e. a Kafka tombstone), so a compacted topic keeps exactly the live searches.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

from cep.errors import CepError

TargetKind = Literal["kafka", "redis"]
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
_OWNER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}")


class InvalidSearch(CepError):
    """A saved search with a bad id, owner, target or metadata."""


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class Target:
    """Where a match is sent: a Kafka topic or a Redis channel (plus its stream)."""

    kind: TargetKind
    name: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "name": self.name}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Target:
        kind = data.get("kind")
        name = data.get("name")
        if kind not in ("kafka", "redis"):
            raise InvalidSearch(f"target kind must be 'kafka' or 'redis', not {kind!r}")
        if not isinstance(name, str) or not name or len(name) > 249:
            raise InvalidSearch("target name must be a non-empty string (at most 249 chars)")
        return cls(kind, name)


@dataclass(frozen=True, slots=True)
class SavedSearch:
    id: str
    owner: str
    query: str
    metadata: Mapping[str, Any] = field(default_factory=dict)
    targets: tuple[Target, ...] = ()
    created_at: str = ""
    updated_at: str = ""
    version: int = 1

    def __post_init__(self) -> None:
        if not _ID_RE.fullmatch(self.id):
            raise InvalidSearch(f"bad search id {self.id!r}: letters, digits, _ . : - "
                                "(at most 128)")
        if not _OWNER_RE.fullmatch(self.owner):
            raise InvalidSearch(f"bad owner {self.owner!r}")
        if not isinstance(self.metadata, Mapping):
            raise InvalidSearch("metadata must be a JSON object")

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "owner": self.owner, "query": self.query,
            "metadata": dict(self.metadata), "targets": [t.to_dict() for t in self.targets],
            "created_at": self.created_at, "updated_at": self.updated_at,
            "version": self.version,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SavedSearch:
        try:
            return cls(
                id=str(data["id"]), owner=str(data["owner"]), query=str(data["query"]),
                metadata=dict(data.get("metadata") or {}),
                targets=tuple(Target.from_dict(t) for t in data.get("targets") or ()),
                created_at=str(data.get("created_at", "")),
                updated_at=str(data.get("updated_at", "")),
                version=int(data.get("version", 1)),
            )
        except KeyError as exc:
            raise InvalidSearch(f"saved search is missing {exc.args[0]!r}") from None

    @classmethod
    def from_json(cls, text: str | bytes) -> SavedSearch:
        return cls.from_dict(json.loads(text))

    def evolve(self, **changes: Any) -> SavedSearch:
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class Change:
    """One changelog entry: `search` is None for a delete."""

    search_id: str
    search: SavedSearch | None

    @property
    def is_delete(self) -> bool:
        return self.search is None

    def key(self) -> bytes:
        return self.search_id.encode()

    def value(self) -> bytes | None:
        return None if self.search is None else self.search.to_json().encode()

    @classmethod
    def decode(cls, key: bytes | str, value: bytes | str | None) -> Change:
        sid = key.decode() if isinstance(key, bytes) else key
        if value is None:
            return cls(sid, None)
        return cls(sid, SavedSearch.from_json(value))
