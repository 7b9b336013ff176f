#!/usr/bin/env bash
# One-time (idempotent) setup on a fresh machine: OS packages, Python venv with the package, JVM jars.
#   scripts/setup.sh          everything the demo needs (venv + package)
#   scripts/setup.sh --all    plus Debian services/tools (redis-server, kcat, graphviz) and Maven jars
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
all=0; [[ "${1:-}" == "--all" ]] && all=1
PY=${PYTHON:-python3}

need_java() {
  command -v java >/dev/null || { echo "setup: java (JDK 17) is required by Spark and Kafka" >&2; exit 1; }
}

if (( all )); then
  missing=()
  command -v redis-server >/dev/null || missing+=(redis-server)
  command -v kcat >/dev/null || missing+=(kcat)
  command -v dot >/dev/null || missing+=(graphviz)
  command -v mvn >/dev/null || missing+=(maven)
  command -v chromium >/dev/null || missing+=(chromium)  # the console's browser tests
  if (( ${#missing[@]} )); then
    echo "setup: installing Debian packages: ${missing[*]}" >&2
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
    $SUDO apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}" >&2
  fi
fi

need_java
# The Maven jars download while pip and cargo work (network and CPU overlap); waited for below.
jars_pid=""
if (( all )); then
  bash scripts/fetch-jars.sh &
  jars_pid=$!
fi
command -v cargo >/dev/null || {
  echo "setup: cargo (Rust) is required to build the native core (core/): https://rustup.rs" >&2; exit 1; }
stamp=.venv/.installed
if [[ ! -x .venv/bin/python ]]; then
  echo "setup: creating .venv" >&2
  "$PY" -m venv .venv
fi
cache_pid=""
if [[ ! -f $stamp || pyproject.toml -nt $stamp ]]; then
  echo "setup: installing the package and dev tools into .venv (first run downloads PySpark, ~5 min)" >&2
  .venv/bin/pip install -q --upgrade pip >&2
  # The dependencies first (pip would build the native core before installing them), so that
  # with --all the Spark JVM's class cache is written while the core builds, on the CPU the
  # build leaves (its fat-LTO link runs on one core).
  .venv/bin/python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(p["dependencies"] + p["optional-dependencies"]["dev"]))' \
    | .venv/bin/pip install -q -r /dev/stdin >&2
  if (( all )); then
    nice -n 5 .venv/bin/python scripts/class_cache.py &  # the core's build comes first
    cache_pid=$!
  fi
  .venv/bin/pip install -q -e '.[dev]' >&2
  touch "$stamp"
fi
# An editable install does not rebuild the native core when its sources change: rebuild it here
# (cargo reuses core/target, so this is quick after a small change).
if [[ -z $(compgen -G 'cep/_core*.so') || -n $(find core/src core/Cargo.toml core/Cargo.lock -newer "$stamp" 2>/dev/null | head -1) ]]; then
  echo "setup: building the native core (core/)" >&2
  .venv/bin/pip install -q --no-deps -e . >&2
  touch "$stamp"
fi
# Byte-compile our own sources once (compileall writes the .pyc files even when the environment
# sets PYTHONDONTWRITEBYTECODE): every process the tests start (`cep run`, `cep replay`, Spark's
# Python workers, the pytest-xdist workers) then loads them instead of compiling them again.
.venv/bin/python -m compileall -q -j 0 cep jobs percolator bench tests >/dev/null
if (( all )) && [[ -z $cache_pid ]]; then
  .venv/bin/python scripts/class_cache.py || true  # quick when the archive is there; never fails
elif [[ -n $cache_pid ]]; then
  wait "$cache_pid" || true  # never fails the set-up: it says why instead
fi
if [[ -n $jars_pid ]] && ! wait "$jars_pid"; then
  echo "setup: fetching the Maven jars failed (see above)" >&2
  exit 1
fi
