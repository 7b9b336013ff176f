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


def test_only_a_query_started_here_leaves_nlog_and_nshard_undeclared(tmp_path: Path) -> None:
    """The operator declares the native store's layout 1 log (`nlog`) in every task unless the
    checkpoint's record says its state cannot hold it, and keeps each shard's record in its
    log's reserved row instead of `nshard` only when the record says so: a query this build
    started. That record's shards are an object, so an older build (which reads `shards` as an
    integer) stops on it, naming the file, instead of finding no record in `nshard`."""
    new = tmp_path / "new"
    checkpoint_shards(new, 6)
    assert checkpoint_layout1_log(new) is False and checkpoint_record_row(new) is True
    assert checkpoint_shards(new, 8) == 6
    assert type(json.loads((new / SHARDS_FILE).read_text())["shards"]) is not int
    old = tmp_path / "old"  # offsets committed before the record existed (any older build)
    (old / "alerts" / "offsets").mkdir(parents=True)
    (old / "alerts" / "offsets" / "0").write_text("v1\n")
    checkpoint_shards(old, 6)
    assert checkpoint_layout1_log(old) is True and checkpoint_record_row(old) is False
    for text, layout1 in (('{"shards": 6}', True), ('{"shards": 6, "layout1_log": false}', False)):
        older = tmp_path / "older"  # the record as sessions 15-16 and 17 wrote it
        older.mkdir(exist_ok=True)
        (older / SHARDS_FILE).write_text(text)
        assert checkpoint_shards(older, 6) == 6
        assert checkpoint_layout1_log(older) is layout1
        assert checkpoint_record_row(older) is False
    assert checkpoint_layout1_log(tmp_path / "none") is True
    assert checkpoint_record_row(tmp_path / "none") is False


def test_a_query_dir_without_offsets_is_new(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    (ck / "alerts" / "offsets").mkdir(parents=True)   # started, nothing committed
    assert checkpoint_shards(ck, 8) == 8


@pytest.mark.parametrize("text", ["not json", "{}", '{"shards": 0}', '{"shards": "8"}',
                                  '{"shards": 2.5}', "[8]", '{"shards": {}}',
                                  '{"shards": {"count": "6"}}',
                                  '{"shards": {"count": 6}}',
                                  '{"shards": {"count": 6, "record_in_log": false}}'])
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
