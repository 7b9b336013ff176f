"""The percolator on a stream's workers (executor side of `cep percolate`, jobs/percolate.py):
plain Python, no Spark. A task gets Arrow record batches of Kafka rows (value, topic,
partition, offset) and the changelog offsets its micro-batch is pinned at; each worker process
keeps a cached `Percolator`, brings it to exactly those offsets (`KafkaChangeReader.read_to`),
parses and matches its rows and returns notification rows, dead-letter rows and one stats row.

Notification ids are sha256(search id, search version, topic, partition, offset): a re-run
batch sees the same index version, so it produces the same records with the same ids.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from cep.events import parse_object
from percolator.analysis import Schema
from percolator.changelog import KafkaChangeReader
from percolator.engine import BatchStats, Percolator
from percolator.registry import ChangelogFollower

log = logging.getLogger("cep.percolate")

# The rows a task returns, as Spark DDL (for mapInArrow) and as Arrow (`_arrow_schema`).
OUTPUT_DDL = ("kind string, id string, owner string, search_id string, payload string, "
              "topic string, partition int, offset bigint, raw binary, reason string, "
              "stream string")


@dataclass(frozen=True)
class IndexSource:
    """What a Python worker needs to build and follow the index (pickled into each task)."""

    bootstrap: str
    topic: str
    options: tuple[tuple[str, str], ...]
    schema: Schema

    def key(self) -> tuple[Any, ...]:
        fields = tuple(sorted((k, v.value) for k, v in self.schema.fields.items()))
        return (self.bootstrap, self.topic, self.options, fields, self.schema.default_fields)


class WorkerIndex:
    """A Percolator kept at the changelog offsets each micro-batch asks for."""

    def __init__(self, source: IndexSource) -> None:
        self.source = source
        self.percolator, self.reader, self.follower = self._build()

    def _build(self) -> tuple[Percolator, KafkaChangeReader, ChangelogFollower]:
        perc = Percolator(schema=self.source.schema)
        reader = KafkaChangeReader(self.source.bootstrap, self.source.topic,
                                   dict(self.source.options))
        return perc, reader, ChangelogFollower(reader, perc, on_reject=_rejected)

    def at(self, ends: Mapping[int, int], timeout: float) -> dict[str, Any]:
        started = time.perf_counter()
        rebuilt = any(self.reader.position.get(p, 0) > end for p, end in ends.items())
        if rebuilt:  # asked for an older version than we hold (not in one job's normal run)
            self.reader.close()
            self.percolator, self.reader, self.follower = self._build()
        result = self.follower.apply_all(self.reader.read_to(ends, timeout))
        return {"applied": result.applied, "deleted": result.deleted,
                "rejected": result.rejected, "rebuilt": rebuilt,
                "undecodable": self.reader.undecodable,
                "sync_seconds": time.perf_counter() - started}


def _rejected(change: Any, exc: Exception) -> None:
    log.warning("search %s dropped from the index: %s", change.search_id, exc)


# Per Python worker process (Spark reuses workers between tasks): the index is built once and
# then only follows the changelog. A few entries at most (one per job configuration).
_INDEXES: OrderedDict[tuple[Any, ...], WorkerIndex] = OrderedDict()


def worker_index(source: IndexSource) -> WorkerIndex:
    key = source.key()
    index = _INDEXES.get(key)
    if index is None:
        index = _INDEXES[key] = WorkerIndex(source)
        while len(_INDEXES) > 4:
            _INDEXES.popitem(last=False)[1].reader.close()
    _INDEXES.move_to_end(key)
    return index


def parse_event(raw: bytes | None) -> tuple[dict[str, Any] | None, str | None]:
    """(event, None) or (None, reason): the strict JSON object every mode accepts
    (`cep.events.parse_object`: UTF-8, one object, no NaN, no trailing data, size and depth
    limits). The percolator's schema, not a stream's, types the fields afterwards."""
    return parse_object(raw)


def notification_id(search_id: str, version: int, topic: str, partition: int,
                    offset: int) -> str:
    h = hashlib.sha256(f"{search_id}\0{version}\0{topic}\0{partition}\0{offset}".encode())
    return f"n-{h.hexdigest()[:32]}"


class MatchTask:
    """The mapInArrow function: Kafka rows (value, topic, partition, offset) → output rows."""

    def __init__(self, source: IndexSource, ends: Mapping[int, int], timeout: float) -> None:
        self.source = source
        self.ends = dict(ends)
        self.timeout = timeout

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        schema = _arrow_schema()
        index = worker_index(self.source)
        sync = index.at(self.ends, self.timeout)
        perc = index.percolator
        stats = BatchStats(queries=len(perc), always_run=perc.always_run)
        for rb in batches:
            cols = rb.to_pydict()
            out: dict[str, list[Any]] = {name: [] for name in schema.names}
            events: list[dict[str, Any]] = []
            positions: list[dict[str, Any]] = []
            for raw, topic, part, off in zip(cols["value"], cols["topic"], cols["partition"],
                                             cols["offset"], strict=True):
                event, reason = parse_event(raw)
                if event is None:
                    _row(out, "dead", topic=topic, partition=part, offset=off, raw=raw,
                         reason=reason)
                else:
                    events.append(event)
                    positions.append({"topic": topic, "partition": part, "offset": off})
            for note in perc.match_batch(events, positions):
                pos = note.position
                nid = notification_id(note.search_id, note.search_version, pos["topic"],
                                      pos["partition"], pos["offset"])
                payload = {"notification_id": nid, **note.to_dict()}
                _row(out, "note", id=nid, owner=note.owner, search_id=note.search_id,
                     payload=json.dumps(payload, separators=(",", ":"), default=str),
                     topic=pos["topic"], partition=pos["partition"], offset=pos["offset"])
            stats.add(perc.last_stats)
            if out["kind"]:
                yield pa.RecordBatch.from_pydict(out, schema=schema)
        info = {**stats.to_dict(), **sync, "changelog_end": self.ends}
        done: dict[str, list[Any]] = {name: [None] for name in schema.names}
        done["kind"] = ["stats"]
        done["payload"] = [json.dumps(info)]
        yield pa.RecordBatch.from_pydict(done, schema=schema)


def _row(out: dict[str, list[Any]], kind: str, **values: Any) -> None:
    for name, column in out.items():
        column.append(kind if name == "kind" else values.get(name))


def _arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema([
        ("kind", pa.string()), ("id", pa.string()), ("owner", pa.string()),
        ("search_id", pa.string()), ("payload", pa.string()), ("topic", pa.string()),
        ("partition", pa.int32()), ("offset", pa.int64()), ("raw", pa.binary()),
        ("reason", pa.string()), ("stream", pa.string()),
    ])
