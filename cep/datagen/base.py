from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# 2026-01-01T00:00:00Z: sample data starts here (never 0: Spark treats ts 0 as late).
T0 = 1_767_225_600_000
SECOND = 1000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE


@dataclass(frozen=True, slots=True, order=True)
class Expected:
    """An alert a rule must raise: which rule, for which key, and its first and last event time."""

    rule: str
    key: str
    first_ts: int
    last_ts: int


@dataclass
class Dataset:
    stream: str
    events: list[dict[str, Any]]
    expected: list[Expected] = field(default_factory=list)

    def finish(self) -> Dataset:
        """Sort by event time (stable), number the source positions, sort expectations."""
        self.events.sort(key=lambda e: e["ts"])
        self.expected.sort()
        return self


def write_jsonl(events: list[dict[str, Any]], path: str | Path, *, files: int = 1) -> list[Path]:
    """Write events as JSON lines, split in time order over `files` files."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    per = max(1, -(-len(events) // files))
    out = []
    for i in range(files):
        chunk = events[i * per:(i + 1) * per]
        if not chunk and i:
            break
        p = path / f"part-{i:05d}.jsonl"
        with p.open("w") as fh:
            for ev in chunk:
                fh.write(json.dumps(ev, separators=(",", ":")) + "\n")
        out.append(p)
    return out
