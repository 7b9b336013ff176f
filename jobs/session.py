"""The one place every job gets its SparkSession.

- Python workers run the driver's interpreter (`spark.pyspark.python = sys.executable`): with a
  venv, workers otherwise start the system python and fail with ``No module named 'pandas'``.
- Spark's Kafka connector comes from `.cache/jars/spark` (fetched by scripts/fetch-jars.sh with
  mvn) and is put on `spark.jars`; Spark's own `--packages` resolver is not used.
- RocksDB state store, as the stateful operators keep per-shard state.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

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
        .master(settings.spark_master)
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.sql.shuffle.partitions", str(settings.shuffle_partitions))
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.memory", os.environ.get("CEP_DRIVER_MEMORY", "2g"))
    )
    if kafka:
        builder = builder.config("spark.jars", ",".join(kafka_jars()))
    if not settings.spark_master.startswith("local"):
        builder = builder.config("spark.submit.pyFiles", package_zip())
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("CEP_SPARK_LOG_LEVEL", "WARN"))
    return spark
