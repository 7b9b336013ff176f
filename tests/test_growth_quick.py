"""The memory-growth benchmark in its quick mode, so that it does not rot: it must run, measure
positive sizes, and the sizes must grow from the smallest to the largest point (keys, rules,
stored queries). Nothing is timed against a target (issue 7)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import growth

# A benchmark's quick run: seconds, not the inner loop.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def section() -> dict[str, Any]:
    return growth.run(quick=True)


def test_cep_state_is_positive_and_grows_with_keys(section: dict[str, Any]) -> None:
    rows = section["state_vs_keys"]
    assert len(rows) >= 2
    for r in rows:
        assert r["states"] > 0
        for k in ("pickled_bytes", "wake_pickled_bytes", "pickled_per_key", "heap_bytes",
                  "heap_per_key"):
            assert r[k] > 0, (k, r)
        assert r["events_ingested"] >= r["keys"]  # each key has seen events
    small, large = rows[0], rows[-1]
    assert large["keys"] > small["keys"]
    for k in ("states", "pickled_bytes", "heap_bytes"):
        assert large[k] > small[k], k
    # Mid-stream every card has a live state: one store entry per key.
    assert all(r["states"] == r["keys"] for r in rows)


def test_cep_state_per_key_grows_with_rules(section: dict[str, Any]) -> None:
    rows = section["state_vs_rules"]
    assert len(rows) >= 2
    small, large = rows[0], rows[-1]
    assert large["rules"] > small["rules"]
    assert small["states"] > 0 and small["states"] == large["states"]  # one entry per key
    for k in ("pickled_bytes", "heap_bytes", "pickled_per_key", "heap_per_key"):
        assert 0 < small[k] < large[k], k


def test_percolator_memory_grows_with_queries(section: dict[str, Any]) -> None:
    rows = section["percolator"]
    for kind in ("structured", "text"):
        rs = sorted((r for r in rows if r["workload"] == kind), key=lambda r: r["queries"])
        assert len(rs) >= 2, kind
        for r in rs:
            assert r["tracemalloc_current_bytes"] > 0
            assert r["tracemalloc_peak_bytes"] >= r["tracemalloc_current_bytes"]
            assert r["bytes_per_query"] > 0
        assert rs[-1]["queries"] > rs[0]["queries"]
        assert rs[-1]["tracemalloc_current_bytes"] > rs[0]["tracemalloc_current_bytes"], kind


def test_plots_and_markdown(section: dict[str, Any], tmp_path: Path) -> None:
    names = growth.plots(tmp_path, section)
    assert set(names) == {"growth_state_keys.png", "growth_state_rules.png",
                          "growth_percolator.png"}
    for n in names:
        assert (tmp_path / n).stat().st_size > 0
    md = growth.render_md(section, names)
    assert md.startswith("## Memory growth")
    for n in names:
        assert f"]({n})" in md
