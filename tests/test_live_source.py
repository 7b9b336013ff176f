"""The Python Kafka source of the live job (`live_source` "python", cep/spark/kafka_source.py),
against a real broker: its packs over topic ranges with gaps (transaction markers, an aborted
transaction) are the packs Spark's Kafka source + the one pass give over the same ranges, for
both isolation levels, and over several streams and tables (tombstones as delete records); a
start below the log start fails; the driver's offset fetches and a read task ride out a broker
restart, and the driver fails clearly once its retries run out. `cep run` with it end to end
(the alerts exactly once, the dead letters at their positions, records counted) is
tests/test_live.py's kcat test, run with either source; through a broker restart,
tests/chaos/test_chaos.py's; several streams, tests/test_windows_live.py's."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from pyspark.sql import functions as F
from pyspark.sql.streaming.datasource import ReadMaxRows

from cep.config import Settings
from cep.delivery.kafka_sink import ensure_topics
from cep.spark import kafka_source
from cep.spark.kafka import kafka_reader
from cep.spark.kafka_source import (
    KafkaRange,
    KafkaSourceError,
    PackReader,
    _split,
    client_conf,
    close_consumers,
    read_range,
)
from cep.spark.live_pass import KAFKA_POSITION, ValidatePack, kafka_seq, live_packed
from cep.spark.pipeline import DEAD_STREAM, plan_for, unpack
from tests.test_bad_input import FRAUD, MIXED, T

pytestmark = [pytest.mark.services, pytest.mark.spark]


@pytest.fixture(autouse=True)
def _closed_consumers() -> Any:
    """The source's consumers are cached per process: closed after each test, before the
    session's broker stops (they would keep reconnecting to it, flooding the log)."""
    yield
    close_consumers()


def _transactions(bootstrap: str, topic: str, records: list[bytes | None]) -> None:
    """`records` over two partitions in transactions of 7 (the third aborted): a commit or
    abort marker takes an offset after each."""
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-tx"})
    p.init_transactions(60)
    for start in range(0, len(records), 7):
        p.begin_transaction()
        for i, r in enumerate(records[start:start + 7], start):
            p.produce(topic, r, f"k{i}".encode(), partition=i % 2)
        if start // 7 == 2:
            p.abort_transaction(60)
        else:
            p.commit_transaction(60)


def _rows(packs: Any) -> list[str]:
    """The packs' rows (shard, watermark and each packed row), sorted: where a pack boundary
    falls is not compared, only what the operator gets."""
    return sorted(repr((p["shard"], r)) for batch in packs for p in batch.to_pylist()
                  for r in unpack([p["pack"]]).to_pylist())


def _options(bootstrap: str, topic: str, conf: dict[str, str], **more: Any) -> dict[str, str]:
    return {"topic": topic, "bootstrap": bootstrap, "kafka_conf": json.dumps(conf),
            **{k: str(v) for k, v in more.items()}}


def test_packs_over_ranges_with_gaps_are_sparks(spark: Any, kafka_bootstrap: str,
                                                topic: str) -> None:
    plan = plan_for(FRAUD, 8)
    stream = plan.streams[0].name
    records: list[bytes | None] = [r for r in MIXED if len(r) < 1 << 20] + [None, b""]
    records += [json.dumps({"ts": T + i, "card": f"card-{i % 7}", "amount": i}).encode()
                for i in range(60)]
    ensure_topics(kafka_bootstrap, [topic], partitions=2)
    _transactions(kafka_bootstrap, topic, records)
    ends = {}
    probe = client_conf(_options(kafka_bootstrap, topic, {}))
    from cep.spark.kafka_source import _consumer

    for p in (0, 1):
        ends[p] = _consumer(probe).get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
    # Cuts that end on a marker, just before one, inside a transaction and at the end (a
    # marker): each range is read alone.
    cuts = {p: sorted({0, 3, 4, 9, ends[p] - 1, ends[p]}) for p in ends}
    vp = ValidatePack(plan, KAFKA_POSITION, 1 << 20, (stream, topic))
    for conf in ({}, {"isolation.level": "read_committed"}):
        settings = Settings(kafka_bootstrap=kafka_bootstrap, kafka_options=tuple(conf.items()))
        reader = PackReader(_options(kafka_bootstrap, topic, conf, read_tasks=4), vp)
        pieces: list[str] = []
        for i in range(len(cuts[0]) - 1):
            start = {topic: {str(p): cuts[p][i] for p in cuts}}
            end = {topic: {str(p): cuts[p][i + 1] for p in cuts}}
            got = _rows(b for part in reader.partitions(start, end) for b in reader.read(part))
            raw = kafka_reader(spark.read, settings, [topic], starting=json.dumps(start),
                               ending=json.dumps(end)).load()
            raw = raw.select("value", kafka_seq(F.col("partition"), F.col("offset")).alias("seq"),
                             *KAFKA_POSITION)
            packs = live_packed(raw, plan, KAFKA_POSITION, 1 << 20, {stream: topic})
            wanted = sorted(repr((r["shard"], x)) for r in packs.collect()
                            for x in unpack([r["pack"]]).to_pylist())
            assert got == wanted, (conf, start, end)
            pieces += got
        # The whole topic once more through the driver's side: the initial offsets, and the
        # read split of four tasks (Spark's cut: in proportion to each partition's records).
        first = reader.initialOffset()
        assert first == {topic: {"0": 0, "1": 0}}
        last = reader.latestOffset(first, reader.getDefaultReadLimit())
        parts = reader.partitions(first, last)
        if not conf:
            assert last == {topic: {str(p): e for p, e in ends.items()}}
        assert len(parts) == 4
        whole = _rows(b for part in parts for b in reader.read(part))
        assert whole == sorted(pieces)
        assert sum(DEAD_STREAM in r for r in whole) >= 5


def test_the_read_split_is_sparks() -> None:
    """`live_read_tasks` and `live_read_task_rows` cut a batch as Spark's Kafka source does
    (`minPartitions`, `maxRecordsPerPartition`)."""
    assert _split([("t", 0, 0, 100), ("t", 1, 0, 0)], 2, 0) == [("t", 0, 0, 50),
                                                                 ("t", 0, 50, 100)]
    assert _split([("t", 0, 0, 100)], 1, 30) == [("t", 0, 0, 25), ("t", 0, 25, 50),
                                                 ("t", 0, 50, 75), ("t", 0, 75, 100)]
    assert _split([("t", 0, 10, 40), ("u", 0, 0, 10)], 4, 0) == [
        ("t", 0, 10, 20), ("t", 0, 20, 30), ("t", 0, 30, 40), ("u", 0, 0, 10)]


def test_a_start_below_the_log_start_fails(kafka_bootstrap: str, topic: str) -> None:
    ensure_topics(kafka_bootstrap, [topic], partitions=1)
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(20):
        p.produce(topic, json.dumps({"ts": T + i, "card": "c", "amount": 1}).encode())
    p.flush(30)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for f in admin.delete_records([TopicPartition(topic, 0, 10)]).values():
        f.result(30)
    conf = client_conf(_options(kafka_bootstrap, topic, {}))
    with pytest.raises(KafkaSourceError, match="failOnDataLoss"):
        list(read_range(conf, KafkaRange(topic, 0, 5, 20)))
    assert sum(len(v) for v, _ in read_range(conf, KafkaRange(topic, 0, 10, 20))) == 10


def test_live_source_is_auto_spark_or_python() -> None:
    from cep.config import ConfigError, load_settings

    assert load_settings(env={}).live_source == "auto"
    assert load_settings(env={"CEP_LIVE_SOURCE": "python"}).live_source == "python"
    assert load_settings(env={"CEP_LIVE_SOURCE": "spark"}).live_source == "spark"
    with pytest.raises(ConfigError, match="live_source"):
        load_settings(env={"CEP_LIVE_SOURCE": "jvm"})


def test_auto_reads_streams_with_the_python_source_and_a_table_with_sparks() -> None:
    from cep.compile import compile_rules
    from jobs.live import kafka_source_for
    from tests.test_live_pass import RULES as WITH_TABLE

    streams = plan_for(FRAUD, 4)
    table = plan_for(compile_rules(WITH_TABLE, "with_table.cep"), 4)
    assert not any(s.is_table for s in streams.streams)
    assert any(s.is_table for s in table.streams)
    assert kafka_source_for("auto", streams)[0] == "python"
    source, why = kafka_source_for("auto", table)
    assert source == "spark" and "table" in why
    for setting in ("spark", "python"):
        assert kafka_source_for(setting, streams)[0] == setting
        assert kafka_source_for(setting, table)[0] == setting


def test_cep_run_refuses_the_python_source_for_a_table() -> None:
    from cep.compile import compile_rules
    from jobs.live import LiveJob, LiveJobError, LiveOptions
    from tests.test_live_pass import RULES as SEVERAL

    job = LiveJob.__new__(LiveJob)  # what `_packed` reads, before any Spark call
    job.settings = Settings(live_source="python")
    job.opts = LiveOptions(rules="r", checkpoint="ck")
    job.plan = plan_for(compile_rules(SEVERAL, "several.cep"), 4)
    with pytest.raises(LiveJobError, match="live_source 'python' reads streams, not yet a table"):
        job._packed()


def test_offset_records_are_the_batch_offset_ranges() -> None:
    from jobs.metrics import offset_records

    src = [{"startOffset": '{"t": {"0": 10, "1": 5}}', "endOffset": '{"t": {"0": 25, "1": 5}}'}]
    assert offset_records(src, None) == 15
    # No start in the report (a first batch): the previous report's end, else unknown.
    first = [{"startOffset": None, "endOffset": {"t": {"0": 7}}}]
    assert offset_records(first, None) is None
    assert offset_records(first, {("t", "0"): 3}) == 4
    # A partition that appeared since: its start from the previous end is unknown.
    assert offset_records([{"startOffset": {"t": {"0": 1}}, "endOffset": {"t": {"0": 2, "1": 9}}}],
                          None) is None


def _in_thread(fn: Any) -> tuple[threading.Thread, list[BaseException]]:
    """`fn()` started in a thread; the list gets what it raised."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            failed.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, failed


def test_the_driver_and_a_read_task_ride_out_a_broker_restart(
        kafka_service: Any, kafka_bootstrap: str, topic: str, monkeypatch: Any,
        caplog: Any) -> None:
    """The broker stopped while a read task is in the middle of its range: with the broker down
    and two attempts of 1 s (`fetchOffset.numRetries` 2, `socket.timeout.ms` 1000) the driver's
    `latestOffset` fails naming the topic and its retries; with attempts of 4 s it fails some
    while the broker is down, and gets the topic's end once it is started again; the read task,
    reading on through the outage, yields each record of its range exactly once, in order."""
    n = 30_000
    ensure_topics(kafka_bootstrap, [topic], partitions=1)
    records = [json.dumps({"ts": T + i, "card": f"card-{i % 7}", "amount": i}).encode()
               for i in range(n)]
    p = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 20})
    for i, r in enumerate(records):
        p.produce(topic, r)
        if i % 5000 == 4999:
            p.flush(30)
    p.flush(30)
    plan = plan_for(FRAUD, 8)
    vp = ValidatePack(plan, KAFKA_POSITION, 1 << 20, (plan.streams[0].name, topic))
    reader = PackReader(_options(kafka_bootstrap, topic, {"socket.timeout.ms": "4000"},
                                 group_id="driver", **{"fetchOffset.numRetries": 40}), vp)
    first = reader.initialOffset()
    assert first == {topic: {"0": 0}}
    # The task's consumer holds ~64 KB ahead of what it handed on: most of its range is fetched
    # after the broker stopped. Batches of 1,000 records, so the range is read in steps.
    monkeypatch.setattr(kafka_source, "BATCH_ROWS", 1000)
    small = {"queued.min.messages": "500", "max.partition.fetch.bytes": "16384",
             "queued.max.messages.kbytes": "64"}
    task = read_range(client_conf(_options(kafka_bootstrap, topic, small, group_id="task")),
                      KafkaRange(topic, 0, 0, n))
    got = [next(task)]
    kafka_service.stop()
    starting = None
    try:
        short = PackReader(_options(kafka_bootstrap, topic, {"socket.timeout.ms": "1000"},
                                    group_id="short", **{"fetchOffset.numRetries": 2,
                                                         "fetchOffset.retryIntervalMs": 100}), vp)
        with pytest.raises(KafkaSourceError,
                           match=rf"Kafka topic '{topic}': fetching the offsets failed in 2 "
                                 r"attempts .*fetchOffset\.numRetries 2"):
            short.latestOffset(first, short.getDefaultReadLimit())
        reading, read_failed = _in_thread(lambda: got.extend(task))
        time.sleep(2)  # the task waits on the broker; the driver asks while it is down
        starting, start_failed = _in_thread(lambda: (time.sleep(3), kafka_service.start()))
        caplog.set_level("WARNING", logger=kafka_source.__name__)
        last = reader.latestOffset(first, reader.getDefaultReadLimit())
    finally:
        if starting is None:
            kafka_service.start()  # the session's broker, for the tests after this one
        else:
            starting.join(300)
    assert not start_failed, start_failed
    assert last == {topic: {"0": n}}
    # It took more than one attempt (the broker takes more than 3 + 4 s to be back).
    assert "fetching the offsets failed (attempt 1 of 40)" in caplog.text
    reading.join(300)
    assert not reading.is_alive() and not read_failed, read_failed
    assert [o for _, offs in got for o in offs.to_pylist()] == list(range(n))
    assert [v for vals, _ in got for v in vals.to_pylist()] == records


def test_a_topic_that_does_not_exist_fails_after_the_attempts(kafka_bootstrap: str,
                                                              topic: str) -> None:
    """Not a transient error: each attempt ends at once (no waiting out the attempt's deadline),
    and the error names the topic and what the broker said."""
    reader = PackReader(_options(kafka_bootstrap, f"{topic}-none", {},
                                 **{"fetchOffset.numRetries": 2,
                                    "fetchOffset.retryIntervalMs": 10}), None)  # type: ignore[arg-type]
    with pytest.raises(KafkaSourceError, match=rf"Kafka topic '{topic}-none': fetching the "
                                               r"offsets failed in 2 attempts .*does not exist"):
        reader.initialOffset()


TWO_STREAMS = """
STREAM tx (ts INT, card STRING, amount FLOAT, country STRING) TIME BY ts LATENESS 3s;
STREAM logins (ts INT, user INT, ok BOOL) TIME BY ts LATENESS 3s;
RULE big FROM tx PATTERN (x) DEFINE x AS amount > 100 EMIT 'big';
RULE failed FROM logins PARTITION BY user
  PATTERN (a b) DEFINE a AS NOT ok, b AS NOT ok EMIT 'failed';
"""


def test_two_streams_from_two_topics_are_sparks(spark: Any, kafka_bootstrap: str,
                                                topic: str) -> None:
    """Several streams, each from its topic (no table): the offsets per topic, the split and
    the admission control over all the topics' partitions, and each record's stream and Kafka
    position in the pass (dead letters carry them): the packs equal Spark's Kafka source +
    `live_packed` over the same offsets."""
    from cep.compile import compile_rules
    from tests.test_validate_live_fast import several_streams_rows

    plan = plan_for(compile_rules(TWO_STREAMS, "two.cep"), 8)
    tx, logins = f"{topic}-tx", f"{topic}-logins"
    ensure_topics(kafka_bootstrap, [tx], partitions=2)
    ensure_topics(kafka_bootstrap, [logins], partitions=1)
    of = {"tx": tx, "logins": logins}
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    rows = [r for r in several_streams_rows(200, 6, lambda i: "NL", bad_logins=True)
            if r[0] in of]
    for i, (stream, value) in enumerate(rows):
        p.produce(of[stream], value, partition=(i // 2) % 2 if stream == "tx" else 0)
    p.flush(30)
    reader = PackReader(_options(kafka_bootstrap, topic, {}, topics=json.dumps(of),
                                 read_tasks=4), ValidatePack(plan, KAFKA_POSITION, 1 << 20))
    first = reader.initialOffset()
    assert first == {tx: {"0": 0, "1": 0}, logins: {"0": 0}}
    last = reader.latestOffset(first, reader.getDefaultReadLimit())
    n_tx = sum(s == "tx" for s, _ in rows)
    assert sum(last[tx].values()) == n_tx and last[logins] == {"0": len(rows) - n_tx}
    parts = reader.partitions(first, last)
    assert len(parts) >= 4 and {pt.topic for pt in parts} == {tx, logins}  # type: ignore
    got = _rows(b for part in parts for b in reader.read(part))
    settings = Settings(kafka_bootstrap=kafka_bootstrap)
    raw = kafka_reader(spark.read, settings, [tx, logins], starting=json.dumps(first),
                       ending=json.dumps(last)).load()
    stream = F.when(F.col("topic") == tx, "tx").otherwise("logins")
    raw = raw.select(stream.alias("stream"), "value",
                     kafka_seq(F.col("partition"), F.col("offset")).alias("seq"), *KAFKA_POSITION)
    packs = live_packed(raw, plan, KAFKA_POSITION, 1 << 20, {"tx": tx, "logins": logins})
    wanted = sorted(repr((r["shard"], x)) for r in packs.collect()
                    for x in unpack([r["pack"]]).to_pylist())
    assert got == wanted
    assert sum(DEAD_STREAM in r and logins in r for r in got) >= 20  # bad logins, positioned
    # Admission control over the three partitions: in proportion to what each has (Spark's
    # `rateLimit`: int(limit * part / total), at least one).
    limited = reader.latestOffset(first, ReadMaxRows(90))
    total = sum(e for t in last for e in last[t].values())
    assert limited == {t: {p: max(1, int(90 * e / total)) if e else 0 for p, e in last[t].items()}
                       for t in last}
    assert 87 <= sum(e for t in limited for e in limited[t].values()) <= 90


TABLES = """
STREAM tx (ts INT, card STRING, user INT, amount FLOAT, country STRING) TIME BY ts LATENESS 3s;
TABLE customers (card STRING, home STRING, t INT) KEY card TIME BY t FROM KAFKA '{topic}-cu';
TABLE limits (user INT, cap FLOAT, t INT) KEY user TIME BY t FROM KAFKA '{topic}-li';
RULE away FROM tx PARTITION BY card
  PATTERN (x) DEFINE x AS country <> customers[card].home EMIT 'away';
RULE over FROM tx PARTITION BY user
  PATTERN (x) DEFINE x AS amount > limits[user].cap EMIT 'over';
"""


def test_tables_with_tombstones_are_sparks(spark: Any, kafka_bootstrap: str, topic: str) -> None:
    """A stream and two tables (a STRING and an INT key) from their topics: each table's
    tombstones (a key, no value) read as Spark's plan reads them (`tombstones_as_deletes`: the
    delete record of the key and the record's timestamp), a tombstone without a key as a null
    value (a dead letter), a bad table record a dead letter: the packs equal Spark's source +
    `live_packed` over the same offsets, as `cep run` builds the two (`LiveJob._source`)."""
    from cep.compile import compile_rules
    from cep.spark.kafka_source import table_deletes
    from cep.spark.pipeline import tombstones_as_deletes

    plan = plan_for(compile_rules(TABLES.format(topic=topic), "tables.cep"), 8)
    of = {"tx": f"{topic}-tx", "customers": f"{topic}-cu", "limits": f"{topic}-li"}
    ensure_topics(kafka_bootstrap, list(of.values()), partitions=1)
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(60):
        p.produce(of["tx"], json.dumps({"ts": T + i, "card": f"c{i % 5}", "user": i % 4,
                                        "amount": 10.0 * i, "country": "NL"}).encode())
        if i % 6 == 0:
            p.produce(of["customers"], json.dumps({"t": T + i, "card": f"c{i % 5}",
                                                   "home": "DE"}).encode(), f"c{i % 5}")
            p.produce(of["limits"], json.dumps({"t": T + i, "user": i % 4, "cap": 300.0})
                      .encode(), str(i % 4))
        if i % 10 == 5:  # tombstones: a key and no value
            p.produce(of["customers"], None, f"c{i % 5}é")
            p.produce(of["limits"], None, f" {i % 4}")
    p.produce(of["customers"], None)  # no key either: a null value, a dead letter
    p.produce(of["limits"], b'{"t": "soon", "user": 1}')  # a bad record: a dead letter
    p.flush(30)
    tables = [s for s in plan.streams if s.is_table]
    reader = PackReader(_options(kafka_bootstrap, topic, {}, topics=json.dumps(of), read_tasks=3),
                        ValidatePack(plan, KAFKA_POSITION, 1 << 20), tables)
    first = reader.initialOffset()
    last = reader.latestOffset(first, reader.getDefaultReadLimit())
    got = _rows(b for part in reader.partitions(first, last) for b in reader.read(part))
    raw = kafka_reader(spark.read, Settings(kafka_bootstrap=kafka_bootstrap), of.values(),
                       starting=json.dumps(first), ending=json.dumps(last)).load()
    stream = F.lit(None).cast("string")
    for name, t in of.items():
        stream = F.when(F.col("topic") == t, F.lit(name)).otherwise(stream)
    raw = raw.select(stream.alias("stream"),
                     tombstones_as_deletes(F.col("value"), stream, plan).alias("value"),
                     kafka_seq(F.col("partition"), F.col("offset")).alias("seq"), *KAFKA_POSITION)
    packs = live_packed(raw, plan, KAFKA_POSITION, 1 << 20, of)
    wanted = sorted(repr((r["shard"], x)) for r in packs.collect()
                    for x in unpack([r["pack"]]).to_pylist())
    assert got == wanted
    assert sum("_deleted" in r for r in got) >= 12  # both tables' tombstones, at every shard
    assert sum(DEAD_STREAM in r for r in got) == 2
    # An INT key that is not a long fails the task, as Spark's ANSI cast fails the query.
    with pytest.raises(KafkaSourceError, match="not an INT"):
        table_deletes(tables[1])(b"x1", T)
