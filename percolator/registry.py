"""The registry: the one place saved searches are created, changed and removed.

Every write validates the query (it must compile against the schema), enforces the owner (one
owner never sees or changes another's searches: a foreign id reads as "not found"), writes the
store (Redis), then publishes the change to the changelog (Kafka). If publishing fails the store
write is rolled back, so the two do not drift; `republish()` re-sends every stored search (e.g.
to seed a new changelog topic).

`ChangelogFollower` is the other end: it applies changelog entries to a running `Percolator`
at batch boundaries, so searches take effect without a restart.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cep.errors import CepError, QueryError
from percolator.analysis import Schema
from percolator.changelog import Changelog, ChangeSource
from percolator.engine import Percolator, compile_query
from percolator.model import Change, InvalidSearch, SavedSearch, Target, now_iso
from percolator.store import SearchStore

MAX_METADATA_BYTES = 16_384


class SearchNotFound(CepError):
    pass


class SearchExists(CepError):
    pass


class LimitExceeded(CepError):
    pass


class SearchRegistry:
    def __init__(self, store: SearchStore, changelog: Changelog | None = None,
                 schema: Schema | None = None, *, max_per_owner: int = 10_000,
                 clock: Callable[[], str] = now_iso) -> None:
        self.store = store
        self.changelog = changelog
        self.schema = schema or Schema()
        self.max_per_owner = max_per_owner
        self.clock = clock

    def validate(self, query: str) -> None:
        """Raise QueryError if `query` does not compile against the schema."""
        compile_query(query, self.schema)

    def add(self, owner: str, query: str, *, search_id: str | None = None,
            metadata: Mapping[str, Any] | None = None, targets: Iterable[Target] = ()
            ) -> SavedSearch:
        self.validate(query)
        sid = search_id or uuid.uuid4().hex
        if self.store.get(sid) is not None:
            raise SearchExists(f"search {sid!r} already exists; update it instead")
        if self.store.count(owner) >= self.max_per_owner:
            raise LimitExceeded(f"owner {owner!r} has {self.max_per_owner} searches, the limit")
        ts = self.clock()
        search = SavedSearch(sid, owner, query, _metadata(metadata), tuple(targets), ts, ts, 1)
        self._write(search, previous=None)
        return search

    def update(self, owner: str, search_id: str, *, query: str | None = None,
               metadata: Mapping[str, Any] | None = None,
               targets: Iterable[Target] | None = None) -> SavedSearch:
        current = self.get(owner, search_id)
        if query is not None:
            self.validate(query)
        search = current.evolve(
            query=current.query if query is None else query,
            metadata=current.metadata if metadata is None else _metadata(metadata),
            targets=current.targets if targets is None else tuple(targets),
            updated_at=self.clock(), version=current.version + 1,
        )
        self._write(search, previous=current)
        return search

    def remove(self, owner: str, search_id: str) -> SavedSearch:
        current = self.get(owner, search_id)
        self.store.delete(search_id)
        try:
            self._publish(Change(search_id, None))
        except Exception:
            self.store.put(current)
            raise
        return current

    def get(self, owner: str, search_id: str) -> SavedSearch:
        search = self.store.get(search_id)
        if search is None or search.owner != owner:
            raise SearchNotFound(f"no search {search_id!r}")
        return search

    def owned(self, owner: str) -> list[SavedSearch]:
        return self.store.list(owner)

    def all(self) -> list[SavedSearch]:
        return self.store.list(None)

    def republish(self) -> int:
        searches = self.store.list(None)
        for s in searches:
            self._publish(Change(s.id, s))
        return len(searches)

    def _write(self, search: SavedSearch, previous: SavedSearch | None) -> None:
        self.store.put(search)
        try:
            self._publish(Change(search.id, search))
        except Exception:
            if previous is None:
                self.store.delete(search.id)
            else:
                self.store.put(previous)
            raise

    def _publish(self, change: Change) -> None:
        if self.changelog is not None:
            self.changelog.publish(change)


def _metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    import json

    data = dict(metadata or {})
    try:
        size = len(json.dumps(data))
    except (TypeError, ValueError):
        raise InvalidSearch("metadata must be JSON-serialisable") from None
    if size > MAX_METADATA_BYTES:
        raise InvalidSearch(f"metadata is {size} bytes; the limit is {MAX_METADATA_BYTES}")
    return data


@dataclass
class SyncResult:
    applied: int = 0
    deleted: int = 0
    rejected: int = 0


class ChangelogFollower:
    """Keeps a Percolator in step with the changelog. Call `sync()` between batches."""

    def __init__(self, source: ChangeSource, percolator: Percolator,
                 on_reject: Callable[[Change, Exception], None] | None = None) -> None:
        self.source = source
        self.percolator = percolator
        self.on_reject = on_reject

    def sync(self, timeout: float = 0.0) -> SyncResult:
        return self.apply_all(self.source.poll(timeout))

    def apply_all(self, changes: Iterable[Change]) -> SyncResult:
        """Apply changes read elsewhere (e.g. `KafkaChangeReader.read_to`, which pins an index
        version per micro-batch)."""
        result = SyncResult()
        for change in changes:
            try:
                self.percolator.apply(change)
            except (QueryError, InvalidSearch) as exc:
                # A search that does not compile here (e.g. schema drift) is dropped, not fatal.
                result.rejected += 1
                if self.on_reject is not None:
                    self.on_reject(change, exc)
                continue
            if change.is_delete:
                result.deleted += 1
            else:
                result.applied += 1
        return result
