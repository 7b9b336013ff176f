"""The local Python worker daemon (cep/spark/worker_daemon.py): a forked worker freezes its
objects after its first task, once, so that the full collections PySpark's daemon runs after
every task walk only what later tasks made."""

from __future__ import annotations

import gc

from cep.spark import worker_daemon


def test_a_worker_freezes_once_after_its_first_task() -> None:
    calls: list[tuple[object, ...]] = []
    frozen_during: list[int] = []

    def worker(*args: object) -> int:
        calls.append(args)
        frozen_during.append(gc.get_freeze_count())
        return len(calls) - 1

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


def test_the_daemon_runs_the_freezing_worker() -> None:
    """manager() calls the module-level name `pyspark.daemon.worker`: the one main() replaces."""
    import inspect

    from pyspark import daemon

    assert "worker(sock, authenticated)" in inspect.getsource(daemon.manager)
    assert "daemon.worker = freeze_after_first_task(daemon.worker)" in inspect.getsource(
        worker_daemon.main)
