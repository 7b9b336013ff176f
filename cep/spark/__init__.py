"""The thin Spark adapter: the only package under cep/ that imports pyspark.

The public DataFrame API is `detect` (and `detect_rows`), from `cep.spark.api`:
`from cep.spark import detect; alerts = detect(df, rules="rules/")`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["detect", "detect_rows"]


def __getattr__(name: str) -> Any:
    # Imported on first use: `import cep.spark.kafka` (say) need not load the whole adapter.
    if name in __all__:
        from cep.spark import api

        return getattr(api, name)
    raise AttributeError(f"module 'cep.spark' has no attribute {name!r}")
