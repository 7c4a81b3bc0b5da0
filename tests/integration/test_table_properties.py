"""``sink.table_properties`` / ``tables[].table_properties``: the Delta table properties of the target tables,
set when the job creates a table and on an existing one before its next write when a listed value differs —
on both engines, on real Delta tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from ticdc_delta.delta.applier import DeltaApplier, TableOptions
from ticdc_delta.delta.sink import DeltaRsSink, TableIdent
from ticdc_delta.errors import SinkError
from ticdc_delta.spark.delta_sink import SparkDeltaSink
from ticdc_delta.spark.job import run_job

from .test_end_to_end import _assert_matches, _stream
from .test_spark_engine import _config

pytestmark = pytest.mark.integration

T = TableIdent("s", "t")
COLUMNS = {"id": (8, 0), "v": (15, 0)}  # LONGLONG, VARCHAR


def _sink(engine: str, root: Path, spark: Any) -> Any:
    base = DeltaRsSink(str(root))
    return base if engine == "delta-rs" else SparkDeltaSink(base, spark)


def _configuration(sink: Any) -> dict[str, str]:
    return dict(DeltaTable(sink.table_path(*T)).metadata().configuration)


def _commits(sink: Any) -> list[list[dict]]:
    logs = sorted((Path(sink.table_path(*T)) / "_delta_log").glob("*.json"))
    return [[json.loads(line) for line in log.read_text().splitlines()] for log in logs]


@pytest.mark.parametrize("engine", ["delta-rs", "spark"])
def test_properties_are_set_at_creation_and_on_an_existing_table_when_they_differ(engine: str, spark: Any,
                                                                                   tmp_path: Path) -> None:
    sink = _sink(engine, tmp_path, spark)
    first = TableOptions(properties=(("delta.logRetentionDuration", "interval 2 days"),
                                     ("delta.checkpointInterval", "7")))
    assert DeltaApplier(sink, "cf").prepare_table(T, COLUMNS, True, first, 0) is not None
    created = _configuration(sink)
    assert created["delta.logRetentionDuration"] == "interval 2 days" and created["delta.checkpointInterval"] == "7"
    assert len(_commits(sink)) == 1  # in the creating commit

    # the same properties again (in another spelling of the name): nothing to do, no commit
    same = TableOptions(properties=(("delta.CheckpointInterval", "7"),))
    assert DeltaApplier(sink, "cf").reconcile_properties(T, same) == []
    assert DeltaApplier(sink, "cf").prepare_table(T, COLUMNS, True, same, 1) is not None
    assert len(_commits(sink)) == 1

    # a changed value and a new property: one commit, which adds and removes no file; the rest stays
    changed = TableOptions(properties=(("delta.checkpointInterval", "9"), ("delta.enableChangeDataFeed", "true")))
    assert DeltaApplier(sink, "cf").prepare_table(T, COLUMNS, True, changed, 2) is not None
    now = _configuration(sink)
    assert now["delta.checkpointInterval"] == "9" and now["delta.enableChangeDataFeed"] == "true"
    assert now["delta.logRetentionDuration"] == "interval 2 days"
    commits = _commits(sink)
    assert len(commits) == 2
    assert not any("add" in action or "remove" in action for action in commits[-1])
    DeltaApplier(sink, "cf").prepare_table(T, COLUMNS, True, changed, 3)
    assert len(_commits(sink)) == 2


def test_a_property_delta_lake_does_not_know_fails_the_write_naming_it(spark: Any, tmp_path: Path) -> None:
    """A terminal error (the job stops, exit 1) that names the property; no table is made."""
    for engine in ("delta-rs", "spark"):
        sink = _sink(engine, tmp_path / engine, spark)
        wrong = TableOptions(properties=(("delta.checkpointIntervall", "7"),))
        with pytest.raises(SinkError, match=r"checkpointIntervall"):
            DeltaApplier(sink, "cf").prepare_table(T, COLUMNS, True, wrong, 0)
        assert sink.table_schema(T) is None, engine  # no table was made


@pytest.mark.parametrize("engine", ["delta-rs", "spark"])
def test_the_job_lands_the_stream_into_tables_with_the_configured_properties(engine: str, broker: Any, spark: Any,
                                                                             tmp_path: Path, unique_name: Any) -> None:
    topic = unique_name(f"props-{engine}")
    oracle, source = _stream(broker, topic, "open-protocol", tmp_path, events=300, seed=5)
    cfg = _config(tmp_path, "job", source, engine, sink={"table_properties": {"delta.logRetentionDuration":
                                                                              "interval 3 days"}},
                  tables=[{"source": "s2.t2", "table_properties": {"delta.logRetentionDuration": "interval 5 days",
                                                                   "delta.enableChangeDataFeed": True}}])
    assert run_job(cfg, once=True, spark=spark) >= 1
    _assert_matches(cfg, oracle)
    for name in oracle.tables:
        schema, table = name.split(".", 1)
        found = DeltaTable(cfg.table_path(schema, table)).metadata().configuration
        if name == "s2.t2":
            assert found["delta.logRetentionDuration"] == "interval 5 days", found
            assert found["delta.enableChangeDataFeed"] == "true", found
        else:
            assert found["delta.logRetentionDuration"] == "interval 3 days", (name, found)
            assert "delta.enableChangeDataFeed" not in found, (name, found)
