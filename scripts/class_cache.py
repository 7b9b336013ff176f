"""Writes the Spark driver JVM's class-data-sharing archive (jobs/session.py, `ClassCache`) at
set-up, so that every later local session maps it from its first start.

Without it the first JVM that asks becomes the writer and the archive exists only once that JVM
exits normally: in `make test` the first ones are live jobs that the tests stop with kill -9,
so a run's early sessions (and those started while a writer lives) load every class from the
jars again (docs/testing.md, session 27). Here one session runs a small batch and a small
stateful streaming query (RocksDB), exits, and the archive it writes at exit is checked by a
JVM and promoted by `ClassCache` as usual. No native core needed: it runs while it builds.

`scripts/setup.sh --all` runs it; it never fails the set-up (the cache is an optimisation), it
says so instead.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cep.config import Settings  # noqa: E402
from jobs.session import ClassCache, get_spark  # noqa: E402


def main() -> int:
    cache = ClassCache.for_this_jvm()
    if cache is None:
        print("class-cache: no JDK 13+ found, or turned off: not written", file=sys.stderr)
        return 0
    cache.promote()  # one a JVM wrote earlier: checked and promoted, or deleted
    if cache.final.exists():
        return 0
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cep-class-cache-") as tmp:
        spark = get_spark(Settings(spark_master="local[2]", shuffle_partitions=2,
                                   checkpoint_dir=tmp), "cep-class-cache")
        proc = spark.sparkContext._gateway.proc  # type: ignore[union-attr]
        options = spark.sparkContext.getConf().get("spark.driver.extraJavaOptions") or ""
        if "ArchiveClassesAtExit" not in options:
            spark.stop()
            print("class-cache: already there, or another JVM writes it", file=sys.stderr)
            return 0
        src = Path(tmp) / "in"
        src.mkdir()
        (src / "a.json").write_text("".join(f'{{"k": {i % 7}, "v": {i}}}\n' for i in range(500)))
        df = spark.read.json(str(src))
        df.groupBy("k").sum("v").orderBy("k").collect()
        query = (spark.readStream.schema(df.schema).json(str(src)).groupBy("k").count()
                 .writeStream.format("memory").queryName("cep_class_cache")
                 .outputMode("complete").option("checkpointLocation", str(Path(tmp) / "ck"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(300)
        spark.stop()
        proc.stdin.close()  # the gateway JVM exits and writes the archive as it does
        proc.wait(600)
    cache.promote()  # a JVM checks the archive; it is promoted or deleted
    if not cache.final.exists():
        print("class-cache: the archive was not written (see above)", file=sys.stderr)
        return 0
    print(f"class-cache: {cache.final.name}, {cache.final.stat().st_size >> 20} MB, "
          f"{time.monotonic() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
