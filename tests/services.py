"""Start and stop the real services the tests use: Apache Kafka (KRaft) and Redis.

Both are started by the project's own scripts (scripts/kafka.sh, scripts/redis.sh) as processes on
loopback, on free ports (or the ports in CEP_TEST_KAFKA_PORT / CEP_TEST_REDIS_PORT). If one cannot
start, `ServiceError` says why, and the test session fails: nothing is skipped.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


class ServiceError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve_in_thread(app: Any) -> Iterator[str]:
    """An ASGI app on a real uvicorn server on a free loopback port, for the length of the
    block: yields its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(400):
        if server.started:
            break
        time.sleep(0.05)
    assert server.started, "the server did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


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
