"""The live job's shard count is kept in its checkpoint (issue 14): a key's shard is part of its
state's key, so a restart must route keys as the checkpoint's state was written, whatever the
setting says now. No Spark here: the count is decided before the query starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cep.config import Settings
from jobs.live import (
    LEGACY_SHARDS,
    SHARDS_FILE,
    LiveJob,
    LiveJobError,
    LiveOptions,
    checkpoint_layout1_log,
    checkpoint_record_row,
    checkpoint_shards,
)

ROOT = Path(__file__).resolve().parent.parent


def test_new_checkpoint_records_the_setting(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    assert checkpoint_shards(ck, 8) == 8
    assert json.loads((ck / SHARDS_FILE).read_text()) == {
        "shards": {"count": 8, "record_in_log": True}, "layout1_log": False}


def test_restart_keeps_the_recorded_count(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    assert checkpoint_shards(ck, 16) == 16
    assert checkpoint_shards(ck, 8) == 16       # the setting changed: the checkpoint wins
    assert checkpoint_shards(ck, 64) == 16
    assert json.loads((ck / SHARDS_FILE).read_text()) == {
        "shards": {"count": 16, "record_in_log": True}, "layout1_log": False}


def test_state_from_before_the_record_uses_the_old_default(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    (ck / "alerts" / "offsets").mkdir(parents=True)
    (ck / "alerts" / "offsets" / "0").write_text("v1\n")
    assert checkpoint_shards(ck, 8) == LEGACY_SHARDS == 64
    assert checkpoint_shards(ck, 8) == 64       # and it is recorded
    assert json.loads((ck / SHARDS_FILE).read_text()) == {"shards": 64}


def test_only_a_query_started_here_leaves_layout_1s_log_undeclared(tmp_path: Path) -> None:
    """The operator declares the native store's layout 1 log (`nlog`) in every task unless the
    checkpoint's record says its state cannot hold it: a query this build started."""
    new = tmp_path / "new"
    checkpoint_shards(new, 6)
    assert checkpoint_layout1_log(new) is False
    old = tmp_path / "old"  # offsets committed before the record existed (any older build)
    (old / "alerts" / "offsets").mkdir(parents=True)
    (old / "alerts" / "offsets" / "0").write_text("v1\n")
    checkpoint_shards(old, 6)
    assert checkpoint_layout1_log(old) is True
    older = tmp_path / "older"  # the record as sessions 15-16 wrote it
    older.mkdir()
    (older / SHARDS_FILE).write_text('{"shards": 6}')
    assert checkpoint_shards(older, 6) == 6
    assert checkpoint_layout1_log(older) is True
    assert checkpoint_layout1_log(tmp_path / "none") is True


def test_only_a_query_started_here_keeps_the_shard_records_in_the_log(tmp_path: Path) -> None:
    """A query this build starts keeps each shard's record in its log's reserved row (one state
    variable per task); one started before (sessions 15-17's record, or none) keeps `nshard`.
    The new record's shards are an object, so an older build stops on it with a message naming
    the file (it reads `shards` as an integer) instead of finding no record in `nshard`."""
    new = tmp_path / "new"
    checkpoint_shards(new, 6)
    assert checkpoint_record_row(new) is True
    assert checkpoint_shards(new, 8) == 6
    older = tmp_path / "older"  # the record as sessions 15-17 wrote it
    older.mkdir()
    (older / SHARDS_FILE).write_text('{"shards": 6, "layout1_log": false}')
    assert checkpoint_shards(older, 6) == 6
    assert checkpoint_record_row(older) is False
    assert checkpoint_record_row(tmp_path / "none") is False
    record = json.loads((new / SHARDS_FILE).read_text())["shards"]
    assert type(record) is not int  # (what an older build's check refuses)


def test_a_query_dir_without_offsets_is_new(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    (ck / "alerts" / "offsets").mkdir(parents=True)   # started, nothing committed
    assert checkpoint_shards(ck, 8) == 8


@pytest.mark.parametrize("text", ["not json", "{}", '{"shards": 0}', '{"shards": "8"}',
                                  '{"shards": 2.5}', "[8]", '{"shards": {}}',
                                  '{"shards": {"count": "6"}}'])
def test_an_unreadable_record_is_an_error(tmp_path: Path, text: str) -> None:
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / SHARDS_FILE).write_text(text)
    with pytest.raises(LiveJobError, match=SHARDS_FILE):
        checkpoint_shards(ck, 8)


def test_live_job_plans_with_the_checkpoints_count(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    rules = str(ROOT / "rules" / "fraud.cep")
    job = LiveJob(Settings(live_shards=16), LiveOptions(rules=rules, checkpoint=str(ck)))
    assert job.shards == 16
    again = LiveJob(Settings(live_shards=8), LiveOptions(rules=rules, checkpoint=str(ck)))
    assert again.shards == 16
