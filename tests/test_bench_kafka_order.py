"""The Spark bench's Kafka input is checked after loading (`bench.spark_path.KafkaInput.load`):
a partition holding the events in another order than they were sent fails the load, instead of
showing up as late events and missing alerts (docs/spark-runtime.md, "The bench's Kafka input
out of order (session 25, flake25)"). No broker here: the check itself, on given records."""

from __future__ import annotations

from bench.spark_path import first_out_of_order


def _sent() -> list[list[bytes]]:
    return [[f"p{p}-{i}".encode() for i in range(6)] for p in range(4)]


def test_the_topic_as_sent_passes() -> None:
    assert first_out_of_order(_sent(), _sent()) is None


def test_a_message_set_written_after_a_later_one_is_found_where_it_starts() -> None:
    # A retried set (records 1-2 of partition 2) lands behind the set sent after it (3-5).
    read = _sent()
    read[2] = read[2][:1] + read[2][3:] + read[2][1:3]
    assert first_out_of_order(_sent(), read) == (2, 1)


def test_a_missing_or_extra_record_is_found() -> None:
    read = _sent()
    read[3] = read[3][:-1]
    assert first_out_of_order(_sent(), read) == (3, 5)
    read = _sent()
    read[0] = [*read[0], read[0][-1]]  # a duplicate (a retry of a set that was written)
    assert first_out_of_order(_sent(), read) == (0, 6)
