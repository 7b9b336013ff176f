"""The one place every job gets its SparkSession.

- Python workers run the driver's interpreter (`spark.pyspark.python = sys.executable`): with a
  venv, workers otherwise start the system python and fail with ``No module named 'pandas'``.
- Spark's Kafka connector comes from `.cache/jars/spark` (fetched by scripts/fetch-jars.sh with
  mvn) and is put on `spark.jars`; Spark's own `--packages` resolver is not used.
- RocksDB state store, as the stateful operators keep per-shard state.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cep.config import Settings
from cep.errors import ConfigError

log = logging.getLogger(__name__)

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
    local = settings.spark_master.startswith("local")
    cache = ClassCache.for_this_jvm() if local else None
    # The cache's options first: its -Xlog settings must not cancel the user's own.
    driver_options = " ".join(o for o in (cache.options() if cache else "",
                                          settings.java_options) if o)
    if driver_options:
        builder = builder.config("spark.driver.extraJavaOptions", driver_options)
    if settings.java_options:
        builder = builder.config("spark.executor.extraJavaOptions", settings.java_options)
    if kafka:
        builder = builder.config("spark.jars", ",".join(kafka_jars()))
    if local:
        # Workers import PySpark from site-packages (bytecode cached) and start with
        # pyspark.worker loaded: see cep/spark/worker_daemon.py.
        builder = builder.config("spark.python.daemon.module", "cep.spark.worker_daemon")
    else:
        builder = builder.config("spark.submit.pyFiles", package_zip())
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    spark = _start(builder)
    if cache is not None:
        cache.started(spark)
    spark.sparkContext.setLogLevel(os.environ.get("CEP_SPARK_LOG_LEVEL", "WARN"))
    return spark


class ClassCache:
    """The driver JVM's class-data-sharing archive (JDK 13+ dynamic CDS): the classes a Spark
    session loads (~20k, from ~250 jars), stored once as the JVM laid them out, and mapped by
    every later JVM instead of being found, read, verified and parsed again. Measured on this
    2-core machine at load 12: session start 12-16 → 6 s, the first small job 8-12 → 3 s
    (bench/results/replay_batch.md, "cep demo").

    - A session with no archive yet has its JVM write one when it exits
      (`-XX:ArchiveClassesAtExit`), to a temporary file named after this process, beside a note
      of the JVM's pid and class path. Only one JVM writes at a time (a note with a live pid
      stops the others). Writing takes the exiting JVM ~1 min of CPU after this process is gone.
    - A later session promotes it once that JVM has exited, only if a JVM accepts it: a quick
      `java -Xshare:on -version` on the same class path (a JVM killed while writing leaves a
      file that would crash the next JVM, not one that is ignored). Else it is deleted.
    - One archive per JDK build and PySpark (the key of its name); the JVM itself checks that
      the class path and jars are unchanged and otherwise runs without it. Its messages go to
      the JVM's standard error (the Spark log file), never the terminal.
    - `CEP_JVM_CLASS_CACHE=0` turns it off; local masters only (the driver is the executor).
    """

    def __init__(self, java: Path, key: str, folder: Path) -> None:
        self.java = java
        self.final = folder / f"spark-{key}.jsa"
        self.writing: Path | None = None

    @classmethod
    def for_this_jvm(cls) -> ClassCache | None:
        import hashlib
        import shutil

        if os.environ.get("CEP_JVM_CLASS_CACHE", "1") == "0":
            return None
        home = os.environ.get("JAVA_HOME")
        found = Path(home) / "bin" / "java" if home else shutil.which("java")
        if not found or not Path(found).exists():
            return None
        java = Path(found).resolve()
        release = java.parent.parent / "release"
        try:
            text = release.read_text()
        except OSError:
            return None
        m = re.search(r'JAVA_VERSION="(\d+)', text)
        if not m or int(m.group(1)) < 13:
            return None
        import pyspark

        key = hashlib.sha256(f"{java}\n{text}\n{pyspark.__version__}\n{pyspark.__file__}"
                             .encode()).hexdigest()[:16]
        folder = Path(os.environ.get("CEP_JVM_CACHE_DIR", ROOT / ".cache" / "jvm"))
        return cls(java, key, folder)

    def options(self) -> str:
        """The driver JVM's options: use the archive, or write one at exit."""
        quiet = "-Xlog:disable -Xlog:all=warning:stderr"  # CDS warnings: not on stdout
        try:
            self.promote()
            if self.final.exists():
                return f"{quiet} -XX:SharedArchiveFile={self.final}"
            if any(self._alive(n) for n in self.final.parent.glob(self.final.name + ".*.note")):
                return ""
            self.final.parent.mkdir(parents=True, exist_ok=True)
            self.writing = self.final.with_name(f"{self.final.name}.{os.getpid()}.tmp")
            self.writing.unlink(missing_ok=True)
            # Until started() names the JVM, this process's pid stands for it.
            self._note(self.writing, os.getpid(), "")
        except OSError:
            return ""
        return f"{quiet} -XX:ArchiveClassesAtExit={self.writing}"

    def started(self, spark: Any) -> None:
        """The session is up: note the JVM that will write the archive, and its class path."""
        if self.writing is None:
            return
        try:
            pid = int(spark.sparkContext._gateway.proc.pid)
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            cp = args[args.index(b"-cp") + 1].decode() if b"-cp" in args else ""
            self._note(self.writing, pid, cp)
        except (AttributeError, OSError, ValueError):
            pass

    @staticmethod
    def _note(tmp: Path, pid: int, cp: str) -> None:
        """Written whole or not at all (a reader never sees a half-written note)."""
        note = tmp.with_name(tmp.name[: -len(".tmp")] + ".note")
        part = note.with_name(note.name + ".part")
        part.write_text(json.dumps({"pid": pid, "cp": cp}))
        os.replace(part, note)

    @staticmethod
    def _alive(note: Path) -> bool:
        try:
            pid = int(json.loads(note.read_text())["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            # Unreadable: being replaced, or left broken; broken once it is old.
            return _age_s(note) < ORPHAN_S
        return Path(f"/proc/{pid}").exists() if Path("/proc").is_dir() else _pid_alive(pid)

    def promote(self) -> None:
        import subprocess

        # An archive its writer's note no longer names (the note's process died before its JVM
        # wrote the file): removed once nothing has written to it for a while.
        for tmp in self.final.parent.glob(self.final.name + ".*.tmp"):
            note = tmp.with_name(tmp.name[: -len(".tmp")] + ".note")
            if not note.exists() and _age_s(tmp) > ORPHAN_S:
                tmp.unlink(missing_ok=True)
        for note in self.final.parent.glob(self.final.name + ".*.note"):
            if self._alive(note):
                continue
            tmp = note.with_name(note.name[: -len(".note")] + ".tmp")
            try:
                cp = json.loads(note.read_text()).get("cp") or ""
            except (OSError, ValueError, AttributeError):
                cp = ""
            ok = False
            if cp and tmp.exists() and tmp.stat().st_size and not self.final.exists():
                try:
                    ok = subprocess.run(
                        [str(self.java), f"-XX:SharedArchiveFile={tmp}", "-Xshare:on",
                         "-cp", cp, "-version"], stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL, timeout=60).returncode == 0
                except (OSError, subprocess.TimeoutExpired):
                    ok = False
            if ok:
                os.replace(tmp, self.final)
            else:
                tmp.unlink(missing_ok=True)
            note.unlink(missing_ok=True)


ORPHAN_S = 600  # a class-cache file untouched this long has no writer any more


def _age_s(path: Path) -> float:
    import time

    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
        session = builder.getOrCreate()
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(log_fd)
    # Where to look when Spark misbehaves: the JVM's log4j output and everything its Python
    # processes write to stderr (e.g. the Python Kafka source's retry warnings from its
    # offset fetches and read tasks) are in this file, not on the terminal.
    log.info("Spark's own log (the JVM and its Python workers; --verbose shows it here): %s",
             path)
    return session
