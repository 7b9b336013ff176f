"""The local Python worker daemon (cep/spark/worker_daemon.py): a forked worker freezes its
objects after its first task, once, so that the full collections PySpark's daemon runs after
every task walk only what later tasks made."""

from __future__ import annotations

import gc
import sys

import pytest

from cep.spark import worker_daemon


def test_a_worker_freezes_once_after_its_first_task(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[object, ...]] = []
    frozen_during: list[int] = []

    def worker(*args: object) -> int:
        calls.append(args)
        frozen_during.append(gc.get_freeze_count())
        return len(calls) - 1

    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    run = worker_daemon.freeze_after_first_task(worker)
    gc.unfreeze()
    try:
        assert run("sock", False) == 0  # the task's exit code is passed on
        after_first = gc.get_freeze_count()
        kept = [[] for _ in range(1000)]  # tracked objects made after the first task
        assert run("sock", True) == 1
        assert calls == [("sock", False), ("sock", True)]
        assert frozen_during[0] == 0 and after_first > 0
        # (a frozen object that is freed leaves the count: it can only go down)
        assert gc.get_freeze_count() <= after_first and len(kept) == 1000
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("reuse, code", [(None, 0), ("1", 1)])
def test_a_worker_does_not_freeze_when_it_exits_after_the_task(
        monkeypatch: pytest.MonkeyPatch, reuse: str | None, code: int) -> None:
    """Workers not reused, or a failed first task (the worker then exits): no collection."""
    if reuse is None:
        monkeypatch.delenv("SPARK_REUSE_WORKER", raising=False)
    else:
        monkeypatch.setenv("SPARK_REUSE_WORKER", reuse)
    run = worker_daemon.freeze_after_first_task(lambda *_: code)
    gc.unfreeze()
    try:
        assert run("sock", False) == code
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()


_MAIN = """
import importlib.machinery, sys

class Hook:
    # main() imports pyspark again (it drops Spark's zips first): patch the new daemon module.
    def find_spec(self, name, path, target=None):
        if name != "pyspark.daemon":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            stock = module.worker
            module.manager = lambda: print(module.worker is not stock,
                                           module.worker.__qualname__)
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, Hook())
from cep.spark import worker_daemon
worker_daemon.main()
"""


def test_the_daemon_runs_the_freezing_worker() -> None:
    """main() replaces the module-level name `pyspark.daemon.worker` (the one manager() calls)
    with the freezing wrapper before it runs manager() (run in a child process: main() imports
    PySpark again)."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", _MAIN], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.split() == ["True", "freeze_after_first_task.<locals>.run"]
