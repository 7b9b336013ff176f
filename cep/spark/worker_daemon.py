"""Spark's Python worker daemon (`pyspark.daemon`), started so that workers start fast.

Spark runs `python -m <spark.python.daemon.module>` once per executor and the daemon forks a
worker per task slot. Two costs of the stock daemon, measured here (`cep run` on local[2]):

- The JVM puts `pyspark/python/lib/pyspark.zip` first on the workers' PYTHONPATH, so PySpark is
  imported from a zip, and zipimport never caches bytecode: every new worker compiles PySpark's
  sources again (~1.1 s of CPU to import `pyspark.worker`, against ~0.3 s from site-packages).
  In the first micro-batch of a live job half of the Python workers' CPU went to imports.
- `pyspark.worker` is imported after each fork, by every worker.

This daemon drops Spark's own zips from `sys.path` (the same PySpark release is installed in
site-packages, with its bytecode cached) and imports, once, before forking: `pyspark.worker`
and the rule compiler (`cep.engines`: pyparsing builds the grammar at import). All of them are
plain Python that starts no thread. Nothing else is preloaded: pandas and pyarrow may start
native threads, and a process must not fork with threads running (the stock daemon imports
them after the fork for that reason).

Each forked worker also freezes its objects once its first task is done (`gc.freeze`, after a
collection): PySpark's daemon runs a full collection (`gc.collect()`) after every task of a
reused worker, each walking every object the worker holds: PySpark, pandas, pyarrow, the rules
(~92k objects), on the cores the next stage needs. Measured in the live job
(session 14, `bench.latency` at 1,000 and 5,000 events/s, a gc callback timing each collection
with the thread's CPU clock, load 11-17): one full collection per task in both the map-pass
worker and the operator worker, medians of 32-41 ms of CPU each, 0.0-0.1 ms once frozen
(bench/results/latency_live.md, session 14). The cycle collector skips a frozen object (its
reference count still frees it): a reference cycle of the first task's objects that becomes
garbage later stays, once per worker.

Used on local masters only (`jobs.session.get_spark`), where the driver's venv is the workers'
venv. On a cluster the executors' interpreter may not have this package installed when the
daemon starts (pyFiles arrive with the first task), so the stock daemon is kept there.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable
from typing import Any


def _drop_spark_zips(path: list[str]) -> list[str]:
    """`sys.path` without the zips Spark prepends (pyspark.zip, py4j-*-src.zip) when PySpark
    itself is importable from an installed location."""
    return [p for p in path
            if not (p.endswith("pyspark.zip") or (p.rsplit("/", 1)[-1].startswith("py4j-")
                                                  and p.endswith("-src.zip")))]


def reuses_workers() -> bool:
    """Whether Spark reuses this Python worker process for further tasks
    (`spark.python.worker.reuse`, on by default): Spark then sets `SPARK_REUSE_WORKER` for its
    workers, and `pyspark.daemon.manager` takes any non-empty value as reuse, so this does."""
    return bool(os.environ.get("SPARK_REUSE_WORKER"))


def freeze_after_first_task(worker: Callable[..., int]) -> Callable[..., int]:
    """`pyspark.daemon.worker` (one task of a forked worker) that, after the worker's first
    task, collects once and freezes what is left (the module docstring). The flag is copied
    into each forked worker, so each freezes once. Only when the task succeeded (code 0) and
    workers are reused (`reuses_workers`): else
    the worker exits after this task, and the collection would be spent for nothing."""
    frozen = False

    def run(*args: Any) -> int:
        nonlocal frozen
        code = worker(*args)
        if not frozen and code == 0 and reuses_workers():
            frozen = True
            gc.collect()
            gc.freeze()
        return code

    return run


def main() -> None:
    sys.path[:] = _drop_spark_zips(sys.path)
    # Their importers too: a worker's first task adds Spark's files folder to sys.path and calls
    # importlib.invalidate_caches(), which re-reads the directory of every cached zip importer
    # (pyspark.zip: ~0.2 s of CPU per worker, seen with py-spy in `cep replay`'s workers).
    for entry in [p for p in sys.path_importer_cache if p not in sys.path and p.endswith(".zip")]:
        del sys.path_importer_cache[entry]
    for name in [m for m in sys.modules if m == "pyspark" or m.startswith("pyspark.")
                 or m == "py4j" or m.startswith("py4j.")]:
        # Loaded from the zip before the path changed (nothing should be): load them again.
        del sys.modules[name]
    import pyspark.worker  # noqa: F401  (once, in the daemon: inherited by every fork)
    from pyspark import daemon

    import cep.engines  # noqa: F401

    daemon.worker = freeze_after_first_task(daemon.worker)  # the name manager() calls
    daemon.manager()


if __name__ == "__main__":
    main()
