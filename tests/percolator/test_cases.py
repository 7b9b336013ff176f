"""Data-file cases: ES-percolator-style matched clauses, Monitor-style counts, errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from cep.errors import QueryError
from percolator.analysis import Schema
from percolator.engine import Percolator, compile_query
from percolator.model import SavedSearch

CASES = Path(__file__).parent / "cases"


def _load(name: str) -> tuple[Schema, list[dict[str, Any]]]:
    data = yaml.safe_load((CASES / name).read_text(encoding="utf-8"))
    return Schema.from_dict(data.get("schema") or {}), data["cases"]


def _params(name: str) -> list[Any]:
    schema, cases = _load(name)
    return [pytest.param(schema, c, id=c.get("name", c.get("query"))) for c in cases]


def _build(schema: Schema, queries: dict[str, str]) -> Percolator:
    return Percolator.from_searches(
        [SavedSearch(qid, "owner", q) for qid, q in queries.items()], schema)


@pytest.mark.parametrize(("schema", "case"), _params("percolate_matched.yaml"))
def test_matched_clauses(schema: Schema, case: dict[str, Any]) -> None:
    perc = _build(schema, case["queries"])
    notes = perc.match(case["event"])
    got = {n.search_id: list(n.matched) for n in notes}
    assert got == case["expect"]
    assert sorted(got) == perc.scan(case["event"])


@pytest.mark.parametrize(("schema", "case"), _params("presearcher.yaml"))
def test_presearcher_queries_run(schema: Schema, case: dict[str, Any]) -> None:
    perc = _build(schema, case["queries"])
    notes = perc.match_batch([case["event"]])
    assert sorted(n.search_id for n in notes) == sorted(case["matches"])
    assert perc.last_stats.candidates == case["queries_run"]
    if "always_run" in case:
        assert perc.last_stats.always_run == case["always_run"]


@pytest.mark.parametrize(("schema", "case"), _params("errors.yaml"))
def test_query_errors(schema: Schema, case: dict[str, Any]) -> None:
    with pytest.raises(QueryError) as info:
        compile_query(case["query"], schema)
    err = info.value
    assert err.span is not None
    assert (err.span.line, err.span.col) == (case.get("line", 1), case["col"])
    assert case["message"] in err.message
    if "hint" in case:
        assert err.hint and case["hint"] in err.hint
    rendered = err.render()
    assert "^" in rendered and "query error" in rendered
