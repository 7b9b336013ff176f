"""`cep replay` from a Kafka range and from CSV and Parquet files gives the same alerts as from
JSON lines (the injected ones), through the CLI a user would call."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cep.datagen import fraud
from cep.delivery.kafka_sink import ensure_topics
from tests.kafka_util import produce_json

pytestmark = [pytest.mark.spark]
ROOT = Path(__file__).resolve().parent.parent


def _replay(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    spark_log = Path(args[args.index("--out") + 1]).with_suffix(".spark.log")
    proc = subprocess.run([sys.executable, "-m", "cep.cli", "replay", "--rules", "rules/fraud.cep",
                           "--no-progress", "--shards", "8", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "CEP_SPARK_LOG": str(spark_log),
                               **(env or {})})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # Quiet by default: Spark's console output (log4j, warnings, the Python workers' chatter)
    # is in the log file, not on the terminal.
    assert " WARN " not in proc.stderr and "Python worker" not in proc.stdout + proc.stderr
    assert "log4j" in spark_log.read_text()
    return proc


def _alerts(path: Path):
    return sorted((a["rule_id"], a["key"], a["first_ts"], a["last_ts"])
                  for a in map(json.loads, path.read_text().splitlines()))


def _expected(ds):
    return sorted((e.rule, e.key, e.first_ts, e.last_ts) for e in ds.expected)


@pytest.mark.services
def test_replay_a_kafka_range(kafka_bootstrap, topic, tmp_path):
    ds = fraud(n_events=2000, n_keys=20, inject=1, seed=41)
    ensure_topics(kafka_bootstrap, [topic], partitions=1)
    noise = [{"ts": ds.events[0]["ts"], "card": "zz", "amount": 1.0}] * 3
    produce_json(kafka_bootstrap, topic, noise + ds.events + noise)
    n = len(ds.events)
    out = tmp_path / "alerts.jsonl"
    proc = _replay(["--input", f"transactions=kafka:{topic}", "--out", str(out),
                    "--bootstrap", kafka_bootstrap,
                    "--from", json.dumps({topic: {"0": 3}}),
                    "--to", json.dumps({topic: {"0": 3 + n}})])
    assert _alerts(out) == _expected(ds)
    assert f"events read {n}," in proc.stdout
    assert "card_testing" in proc.stdout  # the summary table


def test_replay_csv_and_parquet(tmp_path):
    ds = fraud(n_events=2000, n_keys=20, inject=1, seed=42)
    df = pd.DataFrame(ds.events)
    half = len(df) // 2
    (tmp_path / "csv").mkdir()
    df.iloc[:half].to_csv(tmp_path / "csv" / "a.csv", index=False)
    (tmp_path / "pq").mkdir()
    df.iloc[half:].to_parquet(tmp_path / "pq" / "b.parquet", index=False)
    out = tmp_path / "alerts.jsonl"
    proc = _replay(["--input", f"transactions={tmp_path / 'csv'}",
                    "--input", f"transactions={tmp_path / 'pq'}", "--out", str(out), "--json"])
    assert _alerts(out) == _expected(ds)
    summary = json.loads(proc.stdout)  # --json: the summary alone, as one document
    assert summary["events_read"] == summary["events_processed"] == len(ds.events)
    assert summary["balanced"] and summary["alerts_total"] == len(ds.expected)
