"""The spark engine computes the tables' new snapshots in the background after a batch (real Spark, real
Delta tables): the next MERGE finds the version's state computed instead of running that job first."""

from __future__ import annotations

import types
import uuid
from pathlib import Path
from typing import Any

import pytest

from ticdc_delta.config import config_from_mapping
from ticdc_delta.spark.engine import SparkEngine

integration = pytest.mark.integration


def _engine(tmp_path: Path) -> SparkEngine:
    cfg = config_from_mapping({
        "changefeed": "cf", "source": {"bootstrap_servers": "127.0.0.1:1", "topic": "t", "protocol": "craft"},
        "sink": {"path": str(tmp_path / "lake"), "engine": "spark"}, "checkpoint": str(tmp_path / "ckpt"),
    })
    return SparkEngine(types.SimpleNamespace(cfg=cfg))


def _jobs_to_list_files(spark: Any, path: str) -> int:
    """How many Spark jobs listing the table's files at its latest version takes (one more while the
    version's state is not computed yet)."""
    group = f"probe-{uuid.uuid4().hex}"
    spark.sparkContext.setJobGroup(group, "probe")
    try:
        spark.read.format("delta").load(path).inputFiles()
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


def _new_version(spark: Any, path: str, n: int) -> None:
    spark.range(n, n + 1).write.format("delta").mode("append").save(path)


@integration
def test_a_new_version_is_computed_in_the_background_and_failures_are_harmless(spark: Any, tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for path in (a, b):
        spark.range(3).write.format("delta").save(path)
        _new_version(spark, path, 10)

    # control: a version nobody has used costs one job more to list than a used one
    _new_version(spark, b, 11)
    cold = _jobs_to_list_files(spark, b)
    assert _jobs_to_list_files(spark, b) == cold - 1

    _new_version(spark, a, 11)
    engine._warm_snapshots(spark, [str(tmp_path / "missing"), a])  # a path without a table: logged, skipped
    engine.close()
    assert engine._warming is None
    assert _jobs_to_list_files(spark, a) == cold - 1  # warmed: the next reader starts from the computed state
    assert sorted(r.id for r in spark.read.format("delta").load(a).collect()) == [0, 1, 2, 10, 11]


@integration
def test_nothing_to_warm_starts_no_thread(spark: Any, tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    engine._warm_snapshots(spark, [])
    assert engine._warming is None
    engine.close()
