"""The ceiling's stateful functions: they take the same rows as our operator and do nothing.

Pickled by value to the Python workers (`cloudpickle.register_pickle_by_value`), since `bench`
is not an installed package. Each consumes its input (Arrow batches → pandas, as ours) and emits
one stats row per call in our operator's output schema, so the sink side is the same too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

COLUMNS = ["kind", "rule_id", "key", "id", "payload"]


def _stats(events: int) -> pd.DataFrame:
    return pd.DataFrame([("stats", "", "", "", json.dumps({"events": events}))],
                        columns=COLUMNS)


class NoopProcessor(StatefulProcessor):
    """transformWithStateInPandas with no state access and no timers."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                        timerValues: Any) -> Iterator[pd.DataFrame]:
        events = 0
        for pdf in rows:
            events += int(pdf["primary"].sum())
        yield _stats(events)

    def close(self) -> None:
        pass


class StateOnlyProcessor(StatefulProcessor):
    """No engine, but our operator's state traffic: parse each row's JSON (as ours does), then
    read and rewrite each touched key's state through `cep.runtime.state_store.MapStateKeyStore`
    (buckets of key states + the shard's layout and wake index) with a fixed-size blob per key.
    Separates the cost of state access through the state server from the engine's own."""

    def __init__(self, groups: list[tuple[str, str]], blob_bytes: int) -> None:
        self.groups = groups  # (group id, key field), as cep.runtime.engine.group_rules makes
        self.blob = b"x" * blob_bytes

    def init(self, handle: StatefulProcessorHandle) -> None:
        from pyspark.sql.types import BinaryType, IntegerType, StructField, StructType

        from cep.runtime.state_store import MapStateKeyStore

        bucket = StructType([StructField("bucket", IntegerType())])
        blob = StructType([StructField("v", BinaryType())])
        self.store = MapStateKeyStore(handle.getMapState("buckets", bucket, blob),
                                      handle.getValueState("shard", blob))

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                        timerValues: Any) -> Iterator[pd.DataFrame]:
        events = 0
        touched: set[tuple[str, str]] = set()
        for pdf in rows:
            events += int(pdf["primary"].sum())
            for data in pdf["data"]:
                fields = json.loads(data)
                for gid, kf in self.groups:
                    touched.add((gid, str(fields.get(kf))))
        wake = self.store.load_wake()
        for sk in sorted(touched):
            self.store.get(sk)
            self.store.put(sk, ([], {"blob": ("v", self.blob)}))
        self.store.save_wake(wake)
        self.store.flush()
        yield _stats(events)

    def close(self) -> None:
        pass


def noop_apply(key: Any, pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    """applyInPandasWithState with the state left untouched (FACTS.md's ceiling)."""
    events = 0
    for pdf in pdfs:
        events += int(pdf["primary"].sum())
    yield _stats(events)
