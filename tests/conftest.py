"""Shared fixtures: one local Kafka broker and one SparkSession for the whole test run.

Both start lazily, on the first test that asks for them, so unit tests that need neither stay fast.
"""

from __future__ import annotations

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
