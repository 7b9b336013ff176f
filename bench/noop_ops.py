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
    per (rule, key) of the batch read and rewrite one blob in a MapState and the shard's wake
    index, as `cep.spark.operator.MapStateKeyStore` does. Separates the cost of state access
    through the state server from the cost of the engine itself."""

    def __init__(self, rule_keys: list[tuple[str, str]], blob_bytes: int) -> None:
        self.rule_keys = rule_keys  # (rule id, key field)
        self.blob = b"x" * blob_bytes

    def init(self, handle: StatefulProcessorHandle) -> None:
        from pyspark.sql.types import BinaryType, StringType, StructField, StructType

        key = StructType([StructField("rule", StringType()), StructField("key", StringType())])
        blob = StructType([StructField("v", BinaryType())])
        self.states = handle.getMapState("keys", key, blob)
        self.wake = handle.getValueState("wake", blob)

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                        timerValues: Any) -> Iterator[pd.DataFrame]:
        events = 0
        touched: set[tuple[str, str]] = set()
        for pdf in rows:
            events += int(pdf["primary"].sum())
            for data in pdf["data"]:
                fields = json.loads(data)
                for rule, kf in self.rule_keys:
                    touched.add((rule, str(fields.get(kf))))
        if self.wake.exists():
            self.wake.get()
        for sk in sorted(touched):
            if self.states.containsKey(sk):
                self.states.getValue(sk)
            self.states.updateValue(sk, (self.blob,))
        self.wake.update((self.blob,))
        yield _stats(events)

    def close(self) -> None:
        pass


def noop_apply(key: Any, pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    """applyInPandasWithState with the state left untouched (FACTS.md's ceiling)."""
    events = 0
    for pdf in pdfs:
        events += int(pdf["primary"].sum())
    yield _stats(events)
