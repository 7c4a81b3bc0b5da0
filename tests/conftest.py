"""Shared fixtures: one local Kafka broker and one SparkSession for the whole test run.

Both start lazily, on the first test that asks for them, so unit tests that need neither stay fast.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from ticdc_delta.local_broker import LocalBroker


@pytest.fixture(scope="session")
def broker() -> Iterator["LocalBroker"]:
    """A single-node Kafka broker (KRaft) on a free 127.0.0.1 port, stopped at the end of the run."""
    from ticdc_delta.local_broker import LocalBroker

    with LocalBroker() as running:
        yield running
    running.cleanup_logs()


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator["SparkSession"]:
    """The one SparkSession of the test run (local[2], small-machine settings, sources registered)."""
    from ticdc_delta.spark.session import get_or_create_spark

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = get_or_create_spark(
        "ticdc-delta-tests",
        confs={
            "spark.sql.warehouse.dir": str(warehouse),
            "spark.driver.extraJavaOptions": f"-Dderby.system.home={warehouse}",
        },
    )
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _forget_delta_logs() -> Iterator[None]:
    """After each test, Delta Lake's cache of table logs in the shared session's JVM is emptied.

    Delta keeps every table a JVM has touched in a process-wide cache (up to 10,000 tables, for an hour),
    each with its latest snapshot: the snapshot's state cached by Spark and the query plans of its
    datasets, ~2 MiB per table here. A deployed job keeps its own tables' entries, which it needs (see the
    README's memory sizing); this one JVM sees the thousands of tables of every test of the run, which are
    never read again once the test is over. Without this, ``make test-spark``'s 1 GiB driver runs out of
    heap two thirds of the way through the suite."""
    yield
    pyspark = sys.modules.get("pyspark")
    context = pyspark.SparkContext._active_spark_context if pyspark is not None else None  # noqa: SLF001
    if context is not None:
        context._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()  # noqa: SLF001


@pytest.fixture
def unique_name() -> Callable[[str], str]:
    """Make names (topics, groups, query names) unique per test: ``unique_name("orders")``."""
    suffix = uuid.uuid4().hex[:8]
    return lambda prefix: f"{prefix}-{suffix}"


@pytest.fixture
def checkpoint_dir(tmp_path: Path) -> Path:
    """A fresh directory for a streaming query's checkpoint."""
    path = tmp_path / "checkpoint"
    path.mkdir()
    return path
