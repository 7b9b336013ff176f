"""The batch replay's dead letters keep their source position however Spark splits a file:
a JSON-lines file cut into many input splits (each read by its own task, which counts lines
from its split's start) gives every bad line its line number in the file, as named on the
command line; blank lines count as lines but are not records; CRLF line ends are not part of
the record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.replay import InputSpec, run_replay

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "rules" / "fraud.cep"
T = 1767225600000


def _line(i: int) -> bytes:
    ev = {"ts": T + i * 1000, "card": f"c{i % 7}", "amount": 10.5, "merchant": "m",
          "country": "NL"}
    if i % 23 == 5:
        return b"{not json " + str(i).encode()
    if i % 31 == 7:
        return json.dumps({**ev, "amount": "cheap"}).encode()
    if i % 17 == 3:
        return b""  # a blank line
    if i % 13 == 2:
        return json.dumps(ev).encode() + b"\r"  # a CRLF line end
    return json.dumps(ev).encode()


def test_dead_letters_keep_file_and_line_across_input_splits(spark, settings, tmp_path,
                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("in").mkdir()
    lines = [_line(i) for i in range(600)]
    Path("in/events.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    spark.conf.set("spark.sql.files.maxPartitionBytes", "3000")  # about 30 splits
    try:
        summary = run_replay(settings, str(RULES), [InputSpec("transactions", "in")],
                             "out/alerts.jsonl", show_progress=False)
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
    dead = [json.loads(x) for x in Path("out/alerts.dead-letters.jsonl").read_text()
            .splitlines()]
    expected = [i + 1 for i, raw in enumerate(lines)
                if raw.startswith(b"{not") or b'"cheap"' in raw]
    assert [d["line"] for d in dead] == expected
    assert {d["file"] for d in dead} == {"in/events.jsonl"}
    assert all(not d["value"].endswith("\r") for d in dead)
    records = sum(1 for raw in lines if raw.strip())
    assert summary.events_read == records and summary.dead_letters == len(expected)
    assert summary.events_processed == records - len(expected) and summary.balanced
