"""`jobs.session.ClassCache`: the driver JVM's class-data-sharing archive is written by one JVM at
a time, promoted only once a JVM has accepted it, and a file that a JVM rejects (a truncated or
foreign archive: one would crash the next JVM) is deleted, never used."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from jobs.session import ClassCache


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ClassCache:
    monkeypatch.setenv("CEP_JVM_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CEP_JVM_CLASS_CACHE", raising=False)
    found = ClassCache.for_this_jvm()
    if found is None:
        pytest.skip("no JDK 13+ on this machine")
    return found


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_the_first_session_writes_the_archive_and_is_the_only_writer(cache: ClassCache) -> None:
    first = cache.options()
    assert f"-XX:ArchiveClassesAtExit={cache.writing}" in first
    assert "-Xlog:disable" in first  # the JVM's CDS messages stay off the terminal
    note = json.loads(Path(str(cache.writing)[: -len(".tmp")] + ".note").read_text())
    assert note["pid"] == os.getpid()  # until the JVM is up, this process stands for it
    # Another session while that writer lives: neither writes nor uses an archive.
    other = ClassCache(cache.java, cache.final.name[len("spark-"):-len(".jsa")],
                       cache.final.parent)
    assert other.options() == ""
    assert other.writing is None


def test_an_archive_a_jvm_rejects_is_deleted_not_promoted(cache: ClassCache) -> None:
    cache.final.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.final.with_name(cache.final.name + ".123.tmp")
    tmp.write_bytes(os.urandom(1 << 16))  # not an archive
    cache.final.with_name(cache.final.name + ".123.note").write_text(
        json.dumps({"pid": _dead_pid(), "cp": "/nonexistent.jar"}))
    options = cache.options()
    assert not cache.final.exists()
    assert not tmp.exists()
    notes = [n.name for n in cache.final.parent.glob("*.note")]
    assert notes == [f"{cache.final.name}.{os.getpid()}.note"]  # only this session's own
    assert "-XX:ArchiveClassesAtExit=" in options  # so this session writes a new one


def test_a_promoted_archive_is_mapped(cache: ClassCache) -> None:
    cache.final.parent.mkdir(parents=True, exist_ok=True)
    cache.final.write_bytes(b"")  # options() only names it; the JVM checks it
    assert cache.options().endswith(f"-XX:SharedArchiveFile={cache.final}")
    assert cache.writing is None


def test_off_by_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CEP_JVM_CLASS_CACHE", "0")
    assert ClassCache.for_this_jvm() is None
