"""Spark local mode gives a task one attempt unless the master says otherwise; the project's
sessions ask for Spark's cluster default (4), so one Python worker that misses the fixed 10 s
connect-back window on a loaded machine does not fail a whole query (jobs/session.py)."""

from __future__ import annotations

from jobs.session import with_task_retries


def test_local_masters_get_task_retries_and_others_are_left_alone():
    assert with_task_retries("local[2]") == "local[2,4]"
    assert with_task_retries("local[*]") == "local[*,4]"
    assert with_task_retries("local[2,1]") == "local[2,1]"  # an explicit choice stands
    assert with_task_retries("spark://127.0.0.1:7077") == "spark://127.0.0.1:7077"
