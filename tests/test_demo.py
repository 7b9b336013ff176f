"""The README's first command: `cep demo` replays the bundled samples through the bundled rules on
Spark local mode and exits 0 only when the rules the samples were made for raise exactly the
injected patterns."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parent.parent


def test_demo_finds_exactly_the_injected_patterns(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "cep.cli", "demo", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "found exactly." in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    expected = sum(len(json.loads(p.read_text()))
                   for p in (ROOT / "examples").glob("*.expected.json"))
    alerts = [json.loads(line) for p in out.glob("*.alerts.jsonl")
              for line in p.read_text().splitlines()]
    assert len(alerts) >= expected > 0
