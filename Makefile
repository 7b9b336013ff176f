# Every target CI runs is here. `make demo` and `make test` are the README's two set-up commands.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
export PYSPARK_PYTHON := $(abspath $(PY))

# The native core's cargo checks use the venv's Python (pyo3 links it for `cargo test`).
CORE_ENV = PYO3_PYTHON=$(abspath $(PY)) \
  LD_LIBRARY_PATH="$$($(abspath $(PY)) -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR") or "")')"

.PHONY: setup setup-all demo test test-durations test-fast core-check core-lints lint bench bench-quick chaos cluster-test clean

setup:            ## venv + the package (enough for the demo)
	bash scripts/setup.sh

setup-all: $(PY) ## + redis-server, kcat, graphviz (apt) and the Kafka/Spark jars (mvn)
	bash scripts/setup.sh --all

demo: setup       ## replay the bundled sample streams through the bundled rules on Spark local mode
	$(VENV)/bin/cep demo

# The crate's checks (core/target/debug) build beside setup's release build of it (pip -> maturin,
# core/target/release): on a fresh machine that fat-LTO build holds one core for minutes, mostly
# alone (docs/testing.md, session 24). --output-sync keeps each target's log in one piece.
test:             ## the whole suite, with a real Kafka broker, Redis server and Spark, on both cores
	$(MAKE) --no-print-directory -j2 --output-sync=target setup-all core-lints
	$(PY) -m pytest -q -m "not bench and not compat" -n 2 --dist worksteal --durations=30

test-durations: setup-all ## the suite as `make test` runs it, each test's seconds into tests/durations.json (its order)
	$(PY) -m pytest -q -m "not bench and not compat" -n 2 --dist worksteal --record-durations tests/durations.json

core-lints: $(PY) ## the crate's clippy (warnings are errors) and cargo test
	cd core && $(CORE_ENV) cargo clippy --locked --all-targets -- -D warnings
	cd core && $(CORE_ENV) cargo test --locked

$(PY):            # the venv alone (scripts/setup.sh fills it): `make -j2 test` creates it once
	$${PYTHON:-python3} -m venv $(VENV)

OLD_REV ?= 672ddfc
test-compat: setup-all  ## a checkpoint of an older version (OLD_REV: the last with state layout 1) continued by this one
	rm -rf .run/old-tree && git worktree prune && git worktree add --detach .run/old-tree $(OLD_REV)
	ln -s $(CURDIR)/.cache .run/old-tree/.cache  # Spark's jars, the JVM's class cache
	cd .run/old-tree/core && $(CORE_ENV) cargo build --release --locked --features pyo3/extension-module
	cp .run/old-tree/core/target/release/lib_core.so .run/old-tree/cep/_core.abi3.so
	CEP_OLD_TREE=$(CURDIR)/.run/old-tree $(PY) -m pytest -q -m compat tests/test_live.py

core-check: setup core-lints ## the native core alone: clippy, cargo test, differential test
	$(PY) -m pytest -q tests/core

test-fast: setup  ## the inner loop: no services, no Spark, nothing slow; few examples, both cores
	HYPOTHESIS_PROFILE=dev $(PY) -m pytest -q -n 2 --dist worksteal -m "not services and not spark and not slow and not bench"

chaos: setup-all  ## fault injection: kill -9, Kafka restart, Redis down 30 s, bad/late input
	$(PY) -m pytest -q -s -m chaos tests/chaos \
	  "tests/test_live.py::test_kill_9_mid_stream_and_restart_loses_nothing_duplicates_nothing"

cluster-test: setup-all  ## the live job on a standalone master + 2 workers
	$(PY) -m pytest -q tests/test_cluster.py

lint: setup
	$(VENV)/bin/ruff check cep percolator jobs tests bench
	$(VENV)/bin/mypy

bench: setup-all
	bash scripts/apt_corpus.sh  # the percolator's real-text corpus (apt lists with English descriptions)
	$(PY) -m bench.run

bench-quick: setup-all
	$(PY) -m bench.run --quick

clean:
	rm -rf .run out spark-warehouse metastore_db derby.log core/target
