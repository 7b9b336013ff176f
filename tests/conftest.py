"""Session fixtures: a real Kafka broker, a real Redis server, one Spark session.

Services start lazily, the first time a test asks for them, and stop at the end of the session.
A service that cannot start fails the tests that need it with the reason; nothing skips.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import settings as hypothesis_settings

from tests.hyp import profile
from tests.services import Kafka, Redis, free_port

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

from cep.config import QUICK_JIT, Settings

# Spark's JVMs in tests (ours and every `cep run` a test starts, which inherit the environment)
# use the quick JIT only: a test's job lives a minute, and start-up plus the first micro-batch
# are most of it (tests/test_live.py's exactly-once case, three runs each on a loaded machine:
# 141-179 s -> 88-98 s).
# `make bench` does not set it: long runs measure the JVM's default JIT.
JAVA_OPTIONS = os.environ.setdefault("CEP_JAVA_OPTIONS", QUICK_JIT)

# Profiles (tests/hyp.py scales each test's example count by the same name): `dev` for the inner
# loop, `ci` for `make test`, `deep` for long runs. No example database in CI: a clean clone.
hypothesis_settings.register_profile("dev", deadline=None)
hypothesis_settings.register_profile("ci", deadline=None, database=None)
hypothesis_settings.register_profile("deep", deadline=None)
hypothesis_settings.load_profile(profile())


@pytest.fixture(scope="session")
def kafka_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kafka]:
    port = int(os.environ.get("CEP_TEST_KAFKA_PORT") or free_port())
    kafka = Kafka(port, free_port(), tmp_path_factory.mktemp("kafka"))
    kafka.start()
    yield kafka
    kafka.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_service: Kafka) -> str:
    return kafka_service.bootstrap


@pytest.fixture(scope="session")
def redis_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Redis]:
    port = int(os.environ.get("CEP_TEST_REDIS_PORT") or free_port())
    redis = Redis(port, tmp_path_factory.mktemp("redis"))
    redis.start()
    yield redis
    redis.stop()


@pytest.fixture(scope="session")
def redis_url(redis_service: Redis) -> str:
    return redis_service.url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[Any]:
    import redis

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name unique to this test."""
    name = request.node.name.replace("[", "-").replace("]", "").replace("/", "-")
    return f"t-{name[:60]}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(
        spark_master="local[2]",
        shuffle_partitions=2,
        shards=8,
        java_options=JAVA_OPTIONS,
        checkpoint_dir=str(tmp_path_factory.mktemp("checkpoints")),
    )


@pytest.fixture(scope="session")
def spark(settings: Settings) -> Iterator[SparkSession]:
    """One local-mode session for the whole run (with the Kafka connector on spark.jars)."""
    from jobs.session import get_spark

    session = get_spark(settings, "cep-tests", kafka=True)
    yield session
    session.stop()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def fraud_rules_dir(tmp_path: Path) -> Path:
    """A rules directory of its own holding a copy of the bundled rules/fraud.cep."""
    d = tmp_path / "rules"
    d.mkdir()
    shutil.copy(Path(__file__).resolve().parent.parent / "rules" / "fraud.cep", d / "fraud.cep")
    return d


# Each test's last measured seconds (set-up, call and tear-down), written by
# `make test-durations` (`--record-durations`), read by the order below.
DURATIONS = Path(__file__).with_name("durations.json")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-durations", metavar="PATH", default=None,
                     help="write each test's seconds (set-up + call + tear-down) to PATH as JSON")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that start Spark or services first, and in each of the two groups the longest first
    (by tests/durations.json; a test not in it counts as its group's median). `make test` runs on
    both cores (pytest-xdist, `--dist worksteal`): each worker is handed one contiguous half of
    this order and a worker that runs out takes the back half of the other's queue, so the run
    ends early only if no minutes-long case starts last. Order does not change a result."""
    def heavy(item: pytest.Item) -> bool:
        return any(item.get_closest_marker(m) for m in ("services", "spark", "chaos"))

    known: dict[str, float] = (json.loads(DURATIONS.read_text())["seconds"]
                               if DURATIONS.exists() else {})
    groups: dict[bool, list[float]] = {True: [], False: []}
    for item in items:
        if item.nodeid in known:
            groups[heavy(item)].append(known[item.nodeid])
    median = {g: statistics.median(v) if v else 0.0 for g, v in groups.items()}
    items.sort(key=lambda item: (not heavy(item),
                                 -known.get(item.nodeid, median[heavy(item)])))


class _Durations:
    """`--record-durations PATH`: each test's seconds summed over its reports (with xdist the
    controller gets every worker's), written at the end of the session (not by the workers)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        self.path.write_text(json.dumps(
            {"about": "seconds per test of one `make test-durations` run (set-up + call + "
                      "tear-down); tests/conftest.py orders the suite by them",
             "seconds": {k: round(v, 2) for k, v in sorted(self.seconds.items())}},
            indent=0) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--record-durations")
    if path and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Durations(path), "cep-durations")
