"""The one place every job gets its SparkSession.

- Python workers run the driver's interpreter (`spark.pyspark.python = sys.executable`): with a
  venv, workers otherwise start the system python and fail with ``No module named 'pandas'``.
- Spark's Kafka connector comes from `.cache/jars/spark` (fetched by scripts/fetch-jars.sh with
  mvn) and is put on `spark.jars`; Spark's own `--packages` resolver is not used.
- RocksDB state store, as the stateful operators keep per-shard state.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cep.config import Settings
from cep.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parent.parent
SPARK_JARS_DIR = Path(os.environ.get("CEP_SPARK_JARS_DIR", ROOT / ".cache" / "jars" / "spark"))


def kafka_jars() -> list[str]:
    jars = sorted(str(p) for p in SPARK_JARS_DIR.glob("*.jar"))
    if not any("spark-sql-kafka" in j for j in jars):
        raise ConfigError(
            f"Spark's Kafka connector is not in {SPARK_JARS_DIR}; run `bash scripts/fetch-jars.sh`"
        )
    return jars


def package_zip() -> str:
    """Our packages as a zip for executors (spark.submit.pyFiles), rebuilt when sources change.

    Third-party dependencies must already be on the executors (the same venv on a local cluster;
    on a real one, a venv packed with venv-pack shipped with spark.archives: see README)."""
    import hashlib
    import zipfile

    files = sorted(p for pkg in ("cep", "percolator", "jobs") for p in (ROOT / pkg).rglob("*.py"))
    digest = hashlib.sha256()
    for f in files:
        digest.update(str(f.relative_to(ROOT)).encode() + f.read_bytes())
    out = ROOT / ".run" / "pyfiles" / f"sparkcep-{digest.hexdigest()[:12]}.zip"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
            for f in files:
                zf.write(f, f.relative_to(ROOT).as_posix())
        tmp.replace(out)
    return str(out)


def get_spark(
    settings: Settings, app_name: str = "cep", *, kafka: bool = False,
    extra_conf: dict[str, str] | None = None,
) -> SparkSession:
    """A SparkSession configured for this project. `kafka=True` adds the connector jars."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.appName(app_name)
        .master(with_task_retries(settings.spark_master))
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.sql.shuffle.partitions", str(settings.shuffle_partitions))
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        # A commit writes the changed keys (a changelog), not a snapshot of RocksDB's files;
        # snapshots are taken in the background. Spark's guide recommends it for latency, and an
        # existing checkpoint can turn it on or off.
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        # Counting the store's rows makes RocksDB read a key's whole value before every write
        # of it (`RocksDB.handleMetricsUpdate`: a `get` per put/merge). The live operator's
        # state is a log (a ListState appended to each batch, docs/native-core.md "Stage 3"),
        # so each append read the whole log back: bytes read per batch grew with the state
        # (4 → 24 MB per batch over a two-minute run, bench/results/live_profile.md). The
        # count is only a metric (a handful of rows per shard here): not kept.
        .config("spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.memory", os.environ.get("CEP_DRIVER_MEMORY", "2g"))
    )
    if settings.java_options:
        builder = (builder.config("spark.driver.extraJavaOptions", settings.java_options)
                   .config("spark.executor.extraJavaOptions", settings.java_options))
    if kafka:
        builder = builder.config("spark.jars", ",".join(kafka_jars()))
    if settings.spark_master.startswith("local"):
        # Workers import PySpark from site-packages (bytecode cached) and start with
        # pyspark.worker loaded: see cep/spark/worker_daemon.py.
        builder = builder.config("spark.python.daemon.module", "cep.spark.worker_daemon")
    else:
        builder = builder.config("spark.submit.pyFiles", package_zip())
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    spark = _start(builder)
    spark.sparkContext.setLogLevel(os.environ.get("CEP_SPARK_LOG_LEVEL", "WARN"))
    return spark


TASK_ATTEMPTS = 4  # Spark's default on a cluster (spark.task.maxFailures)


def with_task_retries(master: str) -> str:
    """`local[N]` → `local[N,4]`. Local mode ignores spark.task.maxFailures and gives a task
    one attempt, so one Python worker that misses Spark's fixed 10 s connect-back window on a
    loaded machine ('Python worker failed to connect back', seen here at load 10) fails the
    whole query; a cluster would retry the task. A retried task re-reads the same input and
    state version, so alerts are unchanged. `local[N,F]` and cluster masters pass as given."""
    m = re.fullmatch(r"local\[(\d+|\*)\]", master.strip())
    return f"local[{m.group(1)},{TASK_ATTEMPTS}]" if m else master


_QUIET = True


def set_quiet(quiet: bool) -> None:
    """Quiet (the default): the JVM's console output (log4j, Spark's warnings, the Python
    workers' chatter) goes to `spark_log_path()` instead of the terminal. `--verbose` turns it
    off, so everything shows as Spark prints it."""
    global _QUIET
    _QUIET = quiet


def spark_log_path() -> Path:
    return Path(os.environ.get("CEP_SPARK_LOG")
                or Path(tempfile.gettempdir()) / f"cep-spark-{os.getpid()}.log")


def _start(builder: Any) -> SparkSession:
    """getOrCreate; when it starts the JVM and we are quiet, the JVM (and the Python workers it
    starts) inherit a standard error that is the log file, while this process keeps its own."""
    from pyspark import SparkContext

    if not _QUIET or SparkContext._active_spark_context is not None:
        return builder.getOrCreate()
    path = spark_log_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    saved = os.dup(2)
    try:
        sys.stderr.flush()
        os.dup2(log_fd, 2)
        return builder.getOrCreate()
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(log_fd)
