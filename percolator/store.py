"""Where saved searches and API keys live: small interfaces, an in-memory version for tests, and
the Redis version for production.

Redis layout (prefix `cep:percolator:` by default):
  {prefix}search:{id}        STRING  the search as JSON (`SavedSearch.to_json`)
  {prefix}searches           SET     every search id
  {prefix}owner:{owner}      SET     the owner's search ids
  {prefix}apikey:{key_id}    STRING  JSON {"owner", "sha256", "created_at"} — never the key itself
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from typing import Any, Protocol

from percolator.model import SavedSearch, now_iso

DEFAULT_PREFIX = "cep:percolator:"


class SearchStore(Protocol):
    def get(self, search_id: str) -> SavedSearch | None: ...
    def put(self, search: SavedSearch) -> None: ...
    def delete(self, search_id: str) -> bool: ...
    def list(self, owner: str | None = None) -> list[SavedSearch]: ...
    def count(self, owner: str) -> int: ...


class InMemorySearchStore:
    def __init__(self) -> None:
        self._searches: dict[str, SavedSearch] = {}

    def get(self, search_id: str) -> SavedSearch | None:
        return self._searches.get(search_id)

    def put(self, search: SavedSearch) -> None:
        self._searches[search.id] = search

    def delete(self, search_id: str) -> bool:
        return self._searches.pop(search_id, None) is not None

    def list(self, owner: str | None = None) -> list[SavedSearch]:
        return sorted((s for s in self._searches.values() if owner is None or s.owner == owner),
                      key=lambda s: s.id)

    def count(self, owner: str) -> int:
        return sum(1 for s in self._searches.values() if s.owner == owner)


class RedisSearchStore:
    def __init__(self, client: Any, prefix: str = DEFAULT_PREFIX) -> None:
        self.r = client
        self.prefix = prefix

    @classmethod
    def from_url(cls, url: str, prefix: str = DEFAULT_PREFIX) -> RedisSearchStore:
        import redis

        return cls(redis.Redis.from_url(url), prefix)

    def _k(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    def get(self, search_id: str) -> SavedSearch | None:
        raw = self.r.get(self._k("search", search_id))
        return None if raw is None else SavedSearch.from_json(raw)

    def put(self, search: SavedSearch) -> None:
        pipe = self.r.pipeline(transaction=True)
        pipe.set(self._k("search", search.id), search.to_json())
        pipe.sadd(self._k("searches"), search.id)
        pipe.sadd(self._k("owner", search.owner), search.id)
        pipe.execute()

    def delete(self, search_id: str) -> bool:
        current = self.get(search_id)
        if current is None:
            return False
        pipe = self.r.pipeline(transaction=True)
        pipe.delete(self._k("search", search_id))
        pipe.srem(self._k("searches"), search_id)
        pipe.srem(self._k("owner", current.owner), search_id)
        pipe.execute()
        return True

    def list(self, owner: str | None = None) -> list[SavedSearch]:
        key = self._k("searches") if owner is None else self._k("owner", owner)
        ids = sorted(i.decode() if isinstance(i, bytes) else i for i in self.r.smembers(key))
        if not ids:
            return []
        raws = self.r.mget([self._k("search", i) for i in ids])
        return [SavedSearch.from_json(raw) for raw in raws if raw is not None]

    def count(self, owner: str) -> int:
        return int(self.r.scard(self._k("owner", owner)))


# -- API keys ------------------------------------------------------------------------------------
# A key is "cep_<key id>_<secret>". Only sha256(secret) is stored: the secret is 256 random bits,
# so a fast hash is enough (a slow KDF guards low-entropy passwords, which these are not).
# Verification looks the record up by key id and compares digests with hmac.compare_digest.

def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _split(api_key: str) -> tuple[str, str] | None:
    parts = api_key.split("_", 2)
    if len(parts) != 3 or parts[0] != "cep" or not parts[1] or not parts[2]:
        return None
    return parts[1], parts[2]


class ApiKeyStore(Protocol):
    def create(self, owner: str) -> str: ...
    def owner_of(self, api_key: str) -> str | None: ...
    def revoke(self, api_key: str) -> bool: ...


class _KeysBase:
    def _load(self, key_id: str) -> dict[str, str] | None:
        raise NotImplementedError

    def _save(self, key_id: str, record: dict[str, str]) -> None:
        raise NotImplementedError

    def _drop(self, key_id: str) -> bool:
        raise NotImplementedError

    def create(self, owner: str) -> str:
        key_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
        self._save(key_id, {"owner": owner, "sha256": _digest(secret), "created_at": now_iso()})
        return f"cep_{key_id}_{secret}"

    def owner_of(self, api_key: str) -> str | None:
        parts = _split(api_key)
        if parts is None:
            return None
        record = self._load(parts[0])
        given = _digest(parts[1])
        if record is None:
            hmac.compare_digest(given, given)  # same work whether or not the id exists
            return None
        return record["owner"] if hmac.compare_digest(given, record["sha256"]) else None

    def revoke(self, api_key: str) -> bool:
        if self.owner_of(api_key) is None:
            return False
        parts = _split(api_key)
        return parts is not None and self._drop(parts[0])


class InMemoryApiKeys(_KeysBase):
    def __init__(self) -> None:
        self._records: dict[str, dict[str, str]] = {}

    def _load(self, key_id: str) -> dict[str, str] | None:
        return self._records.get(key_id)

    def _save(self, key_id: str, record: dict[str, str]) -> None:
        self._records[key_id] = record

    def _drop(self, key_id: str) -> bool:
        return self._records.pop(key_id, None) is not None


class RedisApiKeys(_KeysBase):
    def __init__(self, client: Any, prefix: str = DEFAULT_PREFIX) -> None:
        self.r = client
        self.prefix = prefix

    def _load(self, key_id: str) -> dict[str, str] | None:
        raw = self.r.get(f"{self.prefix}apikey:{key_id}")
        return None if raw is None else dict(json.loads(raw))

    def _save(self, key_id: str, record: dict[str, str]) -> None:
        self.r.set(f"{self.prefix}apikey:{key_id}", json.dumps(record))

    def _drop(self, key_id: str) -> bool:
        return bool(self.r.delete(f"{self.prefix}apikey:{key_id}"))
