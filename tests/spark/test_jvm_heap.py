"""The JVM class histogram reader (``ticdc_delta.spark.jvm_heap``)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from ticdc_delta.spark.jvm_heap import SESSION_CLASS, BatchHeapSampler, live_heap, parse_histogram

HISTOGRAM = """\
 num     #instances         #bytes  class name (module)
-------------------------------------------------------
   1:        120431       12345678  [B (java.base@17.0.13)
   2:            7            672  org.apache.spark.sql.classic.SparkSession
   3:         20011         640352  java.util.concurrent.ConcurrentHashMap$Node (java.base@17.0.13)
Total        140449       12986702
"""


def test_parse_histogram_rows_and_total() -> None:
    heap = parse_histogram(HISTOGRAM)
    assert heap.total == 12986702
    assert heap.instances(SESSION_CLASS) == 7
    assert heap.classes["java.util.concurrent.ConcurrentHashMap$Node"] == (20011, 640352)
    assert heap.instances("no.such.Class") == 0


def test_parse_histogram_refuses_other_text() -> None:
    with pytest.raises(ValueError, match="not a class histogram"):
        parse_histogram("Exception in thread main")


def test_live_heap_of_the_session_jvm(spark: Any) -> None:
    """The running JVM's own histogram: this session among its sessions, a heap of some MiB."""
    heap = live_heap(spark)
    assert heap.instances(SESSION_CLASS) >= 1
    assert heap.total > 2**20
    assert heap.total >= sum(b for _, b in heap.classes.values()) * 0.99


def test_batch_heap_sampler_samples_every_nth_progress_line(spark: Any) -> None:
    sampler = BatchHeapSampler(spark, 2)
    for _ in range(5):
        sampler.emit(logging.LogRecord("ticdc_delta.progress", logging.INFO, "", 0, "{}", None, None))
    assert [s["batch"] for s in sampler.samples] == [2, 4]
    assert all(s["sessions"] >= 1 and s["heap"] > 2**20 for s in sampler.samples)
