"""Build a peer's Java harness (a Maven project under bench/) into its shaded jar, once."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any


def build_jar(project: Path, jar: Path, error: type[Exception],
              timeout: int = 900) -> dict[str, Any]:
    """`mvn -q -B package` in `project` unless `jar` is newer than the pom and every Java
    source. Failures raise `error` with the end of Maven's output."""
    sources = [project / "pom.xml", *project.glob("src/**/*.java")]
    if jar.is_file() and jar.stat().st_mtime >= max(p.stat().st_mtime for p in sources):
        return {"built": False, "seconds": 0.0}
    for tool in ("mvn", "java"):
        if shutil.which(tool) is None:
            raise error(f"{tool} is not on PATH")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(["mvn", "-q", "-B", "package"], cwd=project, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise error(f"mvn -q package timed out after {timeout} s") from e
    if proc.returncode != 0 or not jar.is_file():
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise error(f"mvn -q package failed (exit {proc.returncode}):\n{tail}")
    return {"built": True, "seconds": time.perf_counter() - t0}
