"""Saved searches (Lucene query syntax) matched against every event through an index.

See docs/percolator.md. The public API:
"""

from percolator.analysis import FieldType, Schema
from percolator.engine import BatchStats, CompiledQuery, Notification, Percolator, compile_query
from percolator.explain import Explanation, explain
from percolator.model import Change, SavedSearch, Target

__all__ = [
    "BatchStats", "Change", "CompiledQuery", "Explanation", "FieldType", "Notification",
    "Percolator", "SavedSearch", "Schema", "Target", "compile_query", "explain",
]
