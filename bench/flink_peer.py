"""The Flink CEP peer: build bench/flink (Maven, shaded jar) and run it on the same files.

The jar runs the fraud patterns of bench/rules/fraud.cep, written in Flink's Pattern API
(bench/flink/src/main/java/bench/flink/FraudPatterns.java), on a local MiniCluster with
parallelism 2, keyed by card, in event time with a 5 s bounded-out-of-orderness watermark. It
runs the job `runs` times in one JVM and prints one JSON line per run; the last (warm) run is
the figure, the first is kept as the cold one.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.javabuild import build_jar

FLINK_DIR = Path(__file__).resolve().parent / "flink"
JAR = FLINK_DIR / "target" / "flink-cep-bench.jar"


class FlinkUnavailable(RuntimeError):
    pass


def build(timeout: int = 900) -> dict[str, Any]:
    return build_jar(FLINK_DIR, JAR, FlinkUnavailable, timeout)


def run(input_dir: Path, *, parallelism: int = 2, lateness_ms: int = 5_000, runs: int = 2,
        timeout: int = 900) -> dict[str, Any]:
    info = build()
    cmd = ["java", "-Xmx2g", "-jar", str(JAR), "--input", str(input_dir),
           "--parallelism", str(parallelism), "--lateness-ms", str(lateness_ms),
           "--runs", str(runs)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not results:
        causes = [ln for ln in proc.stderr.splitlines() if "Caused by" in ln or "Exception" in ln]
        raise FlinkUnavailable(f"flink job failed (exit {proc.returncode}): "
                               + " | ".join(causes[:6]))
    last = results[-1]
    alerts = sorted(tuple(a) for a in last.pop("alerts"))
    cold = results[0]
    return {
        **last, "alerts": alerts, "runs": len(results), "build": info,
        "cold_events_per_s": cold["events_per_s"],
        "all_runs_events_per_s": [r["events_per_s"] for r in results],
        "jvm_wall_seconds": wall, "command": " ".join(cmd),
    }
