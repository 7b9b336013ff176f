#!/usr/bin/env bash
# Fetch JVM artifacts from Maven Central with the ordinary mvn client into .cache/jars/ (git-ignored).
#   .cache/jars/spark  Spark's Kafka connector + the deps PySpark does not already ship (spark.jars)
#   .cache/jars/kafka  the Apache Kafka broker (KRaft) and its runtime classpath
# Idempotent: a marker file per set records the pom it was fetched from.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cache="$root/.cache/jars"
mkdir -p "$cache"

fetch() {  # fetch NAME POMDIR [extra mvn args...]
  local name=$1 pomdir=$2; shift 2
  local out="$cache/$name" marker="$cache/$name/.pom.sha"
  local sum; sum=$(sha256sum "$pomdir/pom.xml" | cut -d' ' -f1)
  if [[ -f "$marker" && "$(cat "$marker")" == "$sum" ]]; then
    return 0
  fi
  echo "fetch-jars: resolving $name from Maven Central ..." >&2
  rm -rf "$out"; mkdir -p "$out"
  if ! mvn -q -B -f "$pomdir/pom.xml" dependency:copy-dependencies \
        -DoutputDirectory="$out" -DincludeScope=runtime "$@" >&2; then
    echo "fetch-jars: FAILED to resolve $name (see mvn output above)" >&2
    exit 1
  fi
  echo "$sum" > "$marker"
}

# Only the connector's own pieces: everything else it pulls (scala, hadoop, slf4j ...) is in pyspark/jars.
fetch spark "$here/maven/spark-kafka" \
  -DincludeArtifactIds=spark-sql-kafka-0-10_2.13,spark-token-provider-kafka-0-10_2.13,kafka-clients,commons-pool2
fetch kafka "$here/maven/kafka-broker"
echo "fetch-jars: ok ($(ls "$cache/spark" | wc -l) spark jars, $(ls "$cache/kafka" | wc -l) kafka jars)" >&2
