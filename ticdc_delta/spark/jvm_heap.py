"""The driver JVM's live heap, read from inside: its class histogram (what ``jcmd <pid> GC.class_histogram``
prints), through the JVM's diagnostic-command MBean over the py4j gateway.

For benchmarks and tests that watch the driver's memory (``bench heap``); the job itself never calls it.
Taking the histogram runs a full garbage collection first, so the figures are live objects only (and the
call takes a fraction of a second on a small heap).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

__all__ = ["BatchHeapSampler", "LiveHeap", "live_heap", "SESSION_CLASS"]

SESSION_CLASS = "org.apache.spark.sql.classic.SparkSession"
"""The JVM class of a (classic) Spark session."""


@dataclass(frozen=True)
class LiveHeap:
    """Live objects of the JVM after a full GC: ``total`` bytes, and per class name (instances, bytes)."""

    total: int
    classes: dict[str, tuple[int, int]]

    def instances(self, class_name: str) -> int:
        """Live instances of ``class_name`` (0 when none)."""
        return self.classes.get(class_name, (0, 0))[0]


def parse_histogram(text: str) -> LiveHeap:
    """A :class:`LiveHeap` from the text of a class histogram (``num: #instances #bytes class name``
    rows, then a ``Total`` row).

    Raises:
        ValueError: the text has no ``Total`` row (not a class histogram).
    """
    classes: dict[str, tuple[int, int]] = {}
    total = None
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[0].endswith(":") and fields[0][:-1].isdigit():
            classes[fields[3]] = (int(fields[1]), int(fields[2]))
        elif len(fields) == 3 and fields[0] == "Total":
            total = int(fields[2])
    if total is None:
        raise ValueError(f"not a class histogram: {text[:200]!r}")
    return LiveHeap(total, classes)


def live_heap(spark: Any) -> LiveHeap:
    """The live heap of the JVM behind ``spark`` (a local session's driver)."""
    gateway, jvm = spark.sparkContext._gateway, spark.sparkContext._jvm  # noqa: SLF001 - py4j's own handles

    def array(of: Any, *items: Any) -> Any:
        out = gateway.new_array(of, len(items))
        for i, item in enumerate(items):
            out[i] = item
        return out

    def cls(name: str) -> Any:
        return jvm.java.lang.Class.forName(name)

    # called through the MBeanServer interface's Method: py4j looks a method up on the object's class,
    # and the platform server's class is in a package the java.management module does not export
    invoke = cls("javax.management.MBeanServer").getMethod("invoke", array(
        jvm.java.lang.Class, cls("javax.management.ObjectName"), cls("java.lang.String"),
        cls("[Ljava.lang.Object;"), cls("[Ljava.lang.String;")))
    server = jvm.java.lang.management.ManagementFactory.getPlatformMBeanServer()
    command = jvm.javax.management.ObjectName("com.sun.management:type=DiagnosticCommand")
    text = invoke.invoke(server, array(
        jvm.java.lang.Object, command, "gcClassHistogram",
        array(jvm.java.lang.Object, gateway.new_array(jvm.java.lang.String, 0)),
        array(jvm.java.lang.String, "[Ljava.lang.String;")))
    return parse_histogram(str(text))


class BatchHeapSampler(logging.Handler):
    """A handler for the job's progress logger (``ticdc_delta.progress``, one line per micro-batch): after
    every ``every``-th batch, :meth:`sample` is appended to ``samples``."""

    def __init__(self, spark: Any, every: int) -> None:
        super().__init__(logging.INFO)
        self.spark, self.every, self.batches = spark, every, 0
        self.samples: list[dict[str, int]] = []

    def sample(self) -> dict[str, int]:
        """The batch number, the JVM's live heap (bytes) and its live Spark sessions."""
        heap = live_heap(self.spark)
        return {"batch": self.batches, "heap": heap.total, "sessions": heap.instances(SESSION_CLASS)}

    def emit(self, record: logging.LogRecord) -> None:
        self.batches += 1
        if self.batches % self.every == 0:
            self.samples.append(self.sample())
