"""YAML with line numbers: test files are written by hand, so errors must point into them.

`load_yaml` builds plain Python values, except that mappings are `YMap` and sequences `YList`:
`dict`/`list` subclasses that remember the line of the node and of each key or item. Duplicate
keys are an error (PyYAML silently keeps the last one, which hides typos in hand-written files).
"""

from __future__ import annotations

from typing import Any

import yaml

from cep.errors import SourceError, Span


class TestFileError(SourceError):
    """An error in a rule test file: bad YAML, a missing or unknown key, a value of the wrong
    shape, a rule or measure that does not exist."""

    __test__ = False  # not a pytest test class, despite the name
    kind = "test file error"


class YMap(dict[str, Any]):
    line: int
    key_lines: dict[str, int]


class YList(list[Any]):
    line: int
    item_lines: list[int]


class _Loader(yaml.SafeLoader):
    """SafeLoader that records lines and rejects duplicate keys."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> YMap:
    out = YMap()
    out.line = node.start_mark.line + 1
    out.key_lines = {}
    loader.flatten_mapping(node)
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str | int | float | bool) or key is None:
            raise yaml.constructor.ConstructorError(
                None, None, "mapping keys must be plain words or numbers", key_node.start_mark)
        skey = str(key)
        if skey in out:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {skey!r} (first at line {out.key_lines[skey]})",
                key_node.start_mark)
        out[skey] = loader.construct_object(value_node, deep=True)
        out.key_lines[skey] = key_node.start_mark.line + 1
    return out


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> YList:
    out = YList(loader.construct_object(child, deep=True) for child in node.value)
    out.line = node.start_mark.line + 1
    out.item_lines = [child.start_mark.line + 1 for child in node.value]
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def load_yaml(text: str, path: str) -> Any:
    """Parse one YAML document; syntax errors become `TestFileError`s with the file position."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        span = Span(path, mark.line + 1, mark.column + 1) if mark else Span(path, 1, 1)
        problem = exc.problem or exc.context or "invalid YAML"
        raise TestFileError(f"invalid YAML: {problem}", span, source=text) from None
    except yaml.YAMLError as exc:
        raise TestFileError(f"invalid YAML: {exc}", Span(path, 1, 1), source=text) from None


def line_of(value: Any, key: str | int | None = None, default: int = 1) -> int:
    """The line of `value` (a YMap/YList), or of its key / item `key` when given."""
    if isinstance(value, YMap):
        if isinstance(key, str) and key in value.key_lines:
            return value.key_lines[key]
        return value.line
    if isinstance(value, YList):
        if isinstance(key, int) and 0 <= key < len(value.item_lines):
            return value.item_lines[key]
        return value.line
    return default
