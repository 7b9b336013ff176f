"""The Lucene Monitor peer in a tiny mode, so that it does not rot: build the jar (Maven), run
it and our percolator on the same 200 text queries × 100 events, and require the same
(event, query) match sets and positive figures. A Maven or Java failure fails the test: it does
not skip. Nothing here is timed against a target (issue 7: tests do not time anything)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import lucene_peer

pytestmark = pytest.mark.spark  # like tests/test_bench_quick.py: left out of `make test-fast`


def test_lucene_monitor_peer_agrees_with_ours_on_the_text_workload(tmp_path: Path) -> None:
    sec = lucene_peer.run((200,), 100, tmp_path, runs=1, per_doc_events=20)
    (row,) = sec["rows"]
    assert row["queries"] == 200 and row["events"] == 100
    luc, ours = row["lucene"], row["ours"]
    assert luc["queries"] == 200 and luc["parse_errors"] == 0 and luc["match_errors"] == 0
    assert luc["events"] == 100
    assert set(row["lucene_configs"]) == {"term/stock", "multipass/stock", "term/compiled"}
    # Every configuration finds the same pairs as ours (the headline's listed below).
    assert row["all_configs_agree"], row["compare_by_config"]
    # Same pairs, not only the same count; every pair accounted for.
    assert row["compare"]["agree"], row["compare"]
    assert row["agree"]
    assert ours["notifications"] == luc["matches"] > 0
    for v in (ours["events_per_s"], luc["events_per_s"], row["ours_over_lucene"],
              luc["build_seconds"], row["lucene_per_doc"]["events_per_s"]):
        assert v > 0
    assert sec["lucene_version"].startswith("9.")
    md = lucene_peer.render_md(sec)
    assert md.startswith("### Percolator vs Lucene Monitor")
    assert "| 200 |" in md and "yes" in md
