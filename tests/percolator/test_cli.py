"""`cep search test` exits like grep and explains itself."""

from __future__ import annotations

import json

from cep.cli import main


def test_search_test_exit_codes(capsys) -> None:
    ev = json.dumps({"city": "Amstredam", "price": 350000})
    assert main(["search", "test", "city:amsterdam~1 AND price:<400000", "--event", ev]) == 0
    out = capsys.readouterr().out
    assert out.startswith("MATCH") and "✓ city:amsterdam~1" in out
    assert main(["search", "test", "city:amsterdam~1", "--event", '{"city": "Amstrdm"}']) == 1
    out = capsys.readouterr().out
    assert out.startswith("NO MATCH") and "✗ city:amsterdam~1" in out
    assert main(["search", "test", "city:(amsterdam", "--event", "{}"]) == 2
    err = capsys.readouterr().err
    assert "1:16" in err and "hint" in err
    assert main(["search", "test", "x:1", "--event", "not json"]) == 2


def test_search_test_with_schema_and_json(tmp_path, capsys) -> None:
    schema = tmp_path / "schema.yaml"
    schema.write_text("fields:\n  status: keyword\n")
    args = ["search", "test", "status:Open", "--schema", str(schema), "--json", "--event"]
    assert main(args + ['{"status": "open"}']) == 1
    assert json.loads(capsys.readouterr().out)["matched"] is False
    assert main(args + ['{"status": "Open"}']) == 0
