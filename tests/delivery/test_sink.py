"""The `Sink` interface: the live job's router and batch delivery, end to end in-process, with
an in-memory sink in place of Kafka and Redis (no services, no Spark session)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from cep.config import Settings
from cep.delivery.kafka_sink import TransactionalKafkaSink
from cep.delivery.redis_sink import RedisSink
from cep.delivery.sink import MemorySink, Sink
from cep.spark.delivery import BatchDelivery
from jobs.live import AlertRouter
from jobs.metrics import Metrics


class _Batch:
    """What foreachBatch hands over, as far as BatchDelivery looks: `collect()`."""

    def __init__(self, rows: list[SimpleNamespace]) -> None:
        self.rows = rows

    def collect(self) -> list[SimpleNamespace]:
        return self.rows


def _alert(rule: str, key: str, rid: str) -> SimpleNamespace:
    payload = json.dumps({"rule_id": rule, "key": key, "alert_id": rid})
    return SimpleNamespace(kind="match", rule_id=rule, key=key, id=rid, payload=payload)


def test_every_sink_implements_the_protocol():
    assert isinstance(MemorySink(), Sink)
    for cls in (TransactionalKafkaSink, RedisSink):
        assert callable(getattr(cls, "send", None)) and callable(getattr(cls, "close", None))


def test_alerts_reach_the_sink_once_even_when_a_batch_is_rerun(tmp_path):
    metrics = Metrics(tmp_path / "metrics.json")
    sink = MemorySink()
    seen: list[dict] = []
    deliver = BatchDelivery(Settings(), "alerts", str(tmp_path), AlertRouter(Settings(), metrics),
                            sinks=[sink], on_batch=lambda _b, info: seen.append(info))
    rows = [_alert("card_testing", "c1", "a1"), _alert("card_testing", "c2", "a2"),
            SimpleNamespace(kind="stats", rule_id="", key="", id="", payload="{}")]
    deliver(_Batch(rows), 0)
    deliver(_Batch(rows), 0)  # the batch again, as after a crash before the commit
    deliver.close()

    assert [r.id for r in sink.records] == ["a1", "a2"]
    assert {r.kafka_topic for r in sink.records} == {"alerts.card_testing"}
    assert sink.records[0].redis_channel == "cep:alerts:card_testing"
    assert [p["key"] for p in sink.payloads("alerts.card_testing")] == ["c1", "c2"]
    assert sink.batches == [0, 0] and sink.closed
    # Where the batch's delivery time went (collect, routing, sinks), in whole ms.
    timings = {k: seen[0].pop(k) for k in ("collect_ms", "route_ms", "sinks_ms")}
    assert all(isinstance(v, int) and v >= 0 for v in timings.values()), timings
    assert seen[0] == {"batch_id": 0, "records": 2, "memory_applied": 2, "memory_duplicates": 0}
    assert seen[1]["memory_duplicates"] == 2
