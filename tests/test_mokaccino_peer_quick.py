"""The mokaccino peer in a tiny mode, so that it does not rot: ~300 stored queries, 100 events.
It must run, translate the supported part of the structured mix, and both engines must notify
exactly the same (event, query) pairs on it. Nothing is timed against a target (issue 7).
mokaccino is a dev dependency: if it is missing this fails, it does not skip."""

from __future__ import annotations

import pytest

from bench import mokaccino_peer
from bench.percolation import structured
from percolator.syntax import parse

# A peer benchmark's quick run: seconds, not the inner loop.
pytestmark = pytest.mark.slow


def test_mokaccino_is_installed() -> None:
    assert mokaccino_peer.available(), (
        "mokaccino is not importable; it is in the dev extra: .venv/bin/pip install -e '.[dev]'")


def test_translation_keeps_what_mokaccino_can_express_and_nothing_else() -> None:
    searches, _, schema = structured(300, 1)
    kept, left_out = mokaccino_peer.split_supported(searches, schema)
    assert set(left_out) == {"Phrase query", "Fuzzy query"}
    assert len(kept) + sum(left_out.values()) == len(searches)
    for s, q in kept:
        assert mokaccino_peer.shape(s.query) in ("Term", "Range+Term", "Prefix+Term")
        assert "~" not in s.query and '"' not in s.query
        assert str(q)  # a real mokaccino Query
    q = "city:x AND price:[100000 TO 300000] AND beds:>=2"
    assert str(mokaccino_peer.translate(parse(q), schema)) == (
        "(AND (OR city=x) (OR price>=100000) (OR price<=300000) (OR beds>=2))")
    assert str(mokaccino_peer.translate(parse("title:AbCdE* AND city:x"), schema)) == (
        "(AND (OR title=abcde*) (OR city=x))")


def test_quick_peer_run_agrees_and_reports_positive_figures() -> None:
    res = mokaccino_peer.run((300,), 100)
    assert res["mokaccino_version"]
    (row,) = res["rows"]
    assert row["queries"] == 300 and row["events"] == 100
    assert 0.7 < row["subset_share"] < 0.9
    assert row["agree"], (row["only_ours"], row["only_mokaccino"], row["disagreement_examples"])
    assert row["ours_notifications"] == row["mokaccino_notifications"] > 0
    for key in ("ours_events_per_s", "mokaccino_events_per_s", "ratio",
                "ours_build_seconds", "mokaccino_build_seconds"):
        assert row[key] > 0, key
    for g in row["by_shape"].values():
        assert g["agree"]
    md = mokaccino_peer.render_md(res)
    assert md.startswith("### mokaccino peer")
    assert "| 300 |" in md and "Notifications are identical" in md
