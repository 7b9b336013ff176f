"""Start and stop the real services the tests use: Apache Kafka (KRaft) and Redis.

Both are started by the project's own scripts (scripts/kafka.sh, scripts/redis.sh) as processes on
loopback, on free ports (or the ports in CEP_TEST_KAFKA_PORT / CEP_TEST_REDIS_PORT). If one cannot
start, `ServiceError` says why, and the test session fails: nothing is skipped.
"""

from __future__ import annotations

import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class ServiceError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(args: list[str], what: str) -> None:
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=180)
    if proc.returncode != 0:
        raise ServiceError(
            f"{what} failed to start (exit {proc.returncode}).\n"
            f"command: {' '.join(args)}\n--- output ---\n{proc.stdout}{proc.stderr}"
        )


@dataclass
class Kafka:
    port: int
    controller_port: int
    workdir: Path

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        _run(["bash", "scripts/kafka.sh", "start", "--port", str(self.port),
              "--controller-port", str(self.controller_port), "--dir", str(self.workdir)],
             "Kafka broker")

    def stop(self) -> None:
        subprocess.run(["bash", "scripts/kafka.sh", "stop", "--dir", str(self.workdir)],
                       cwd=ROOT, capture_output=True, timeout=60)


@dataclass
class Redis:
    port: int
    workdir: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        _run(["bash", "scripts/redis.sh", "start", "--port", str(self.port),
              "--dir", str(self.workdir)], "Redis server")

    def stop(self) -> None:
        subprocess.run(["bash", "scripts/redis.sh", "stop", "--dir", str(self.workdir)],
                       cwd=ROOT, capture_output=True, timeout=30)
