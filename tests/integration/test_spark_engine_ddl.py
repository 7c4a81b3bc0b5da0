"""DDL on the ``spark`` engine with Delta Lake's own operations, against the oracle and the ``delta-rs`` engine.

A compact part of the DDL matrix (:mod:`tests.integration.test_ddl_matrix`: CREATE TABLE with every type,
ADD COLUMN, DROP / RENAME COLUMN, a wider DECIMAL) runs in one micro-batch through both engines — the
``spark`` one with ``sink.type_widening: true``. Every table equals the oracle on both, both engines' tables
are equal (schema and rows; delta-rs reads the ``spark`` engine's column-mapping tables, Spark the
type-widened one), and the ``spark`` engine's DROP / RENAME COLUMN and the DECIMAL widening were
metadata-only commits: Delta's log shows those operations adding and removing no data file.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ticdc_delta.config import config_from_mapping
from ticdc_delta.delta.sink import TableIdent
from ticdc_delta.simulator.oracle import TableOracle

from .test_ddl_matrix import CASES, Built, Run, _assert_table, _build, _check_case, _produce

# ~1 minute on 2 cores (a table's rows are split only by its own DDL, each segment with its MERGE and ALTERs):
# part of `make test` (it was ~4 minutes and soak-only before that); the Delta operations themselves are in
# tests/spark/test_delta_sink.py
pytestmark = [pytest.mark.integration]

# ADD COLUMN with a DEFAULT (a rewrite on both engines) is left to tests/spark/test_delta_sink.py: each DDL is a
# segment of its own on the spark engine, and this test must stay small
NAMES = ["create_table", "add_column", "drop_column", "rename_column", "modify_decimal"]
WIDENED = "mx_modify_decimal"  # its table has the typeWidening feature on the spark engine: delta-rs cannot scan it


def _run(built: Built, broker: Any, spark: Any, tmp: Path, topic: str, engine: str) -> Run:
    from ticdc_delta.spark.batch_handler import _ConfiguredSink
    from ticdc_delta.spark.job import run_job

    sink: dict[str, Any] = {"path": str(tmp / engine / "lake"), "engine": engine}
    if engine == "spark":
        sink["type_widening"] = True
    cfg = config_from_mapping({
        "changefeed": "ddl-spark",
        "source": {"bootstrap_servers": broker.bootstrap_servers, "topic": topic, "protocol": "open-protocol"},
        "sink": sink,
        "checkpoint": str(tmp / engine / "ckpt"),
    })
    batches = run_job(cfg, once=True, spark=spark)
    return Run(built, cfg, _ConfiguredSink(cfg), batches, None, [], None)


class _SparkReads:
    """The run's sink with rows read by Spark (a type-widened table is beyond delta-rs 1.x)."""

    def __init__(self, run: Run, spark: Any) -> None:
        self.run, self.spark = run, spark

    def table_schema(self, ident: TableIdent) -> pa.Schema | None:
        return self.run.sink.table_schema(ident)

    def read(self, ident: TableIdent) -> pa.Table:
        return self.spark.read.format("delta").load(self.run.cfg.table_path(*ident)).toArrow()


def _operations(path: str) -> dict[str, int]:
    """Delta operation → data files its commits added or removed, over the table's log."""
    out: dict[str, int] = {}
    for commit in sorted((Path(path) / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in commit.read_text().splitlines()]
        op = next(a["commitInfo"]["operation"] for a in actions if "commitInfo" in a)
        out[op] = out.get(op, 0) + sum(1 for a in actions if "add" in a or "remove" in a)
    return out


@pytest.fixture(scope="module")
def runs(broker: Any, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    topic = f"ddl-spark-{uuid.uuid4().hex[:8]}"
    built = _build([CASES[n] for n in NAMES], "open-protocol", {}, topic)
    _produce(broker, topic, built.scenario.partitions, built.scenario.messages())
    tmp = tmp_path_factory.mktemp("ddl-spark")
    return {engine: _run(built, broker, spark, tmp, topic, engine) for engine in ("delta-rs", "spark")}


@pytest.mark.parametrize("engine", ["delta-rs", "spark"])
def test_every_table_equals_the_oracle(runs: dict[str, Run], spark: Any, engine: str) -> None:
    run = runs[engine]
    assert run.batches == 1
    for name in NAMES:
        case = CASES[name]
        if engine == "spark" and case.schema == WIDENED:
            t: TableOracle = next(t for t in run.scenario.oracle().tables.values() if t.schema == WIDENED)
            _assert_table(Run(run.built, run.cfg, _SparkReads(run, spark), 1, None, [], None), t)
        else:
            _check_case(run, case)  # rows read by delta-rs: it reads the spark engine's column-mapping tables


def test_both_engines_land_the_same_tables(runs: dict[str, Run], spark: Any) -> None:
    oracle = runs["spark"].scenario.oracle()
    assert {t.schema for t in oracle.tables.values()} == {CASES[n].schema for n in NAMES}
    for t in oracle.tables.values():
        ident = TableIdent(t.schema, t.table)
        schemas, rows = [], []
        for run in (runs["delta-rs"], runs["spark"]):
            schemas.append(sorted((f.name, str(f.type)) for f in run.sink.table_schema(ident)))
            reader = _SparkReads(run, spark) if t.schema == WIDENED else run.sink
            rows.append(sorted(repr(sorted(r.items())) for r in reader.read(ident).to_pylist()))
        assert schemas[0] == schemas[1], t.qualified
        assert rows[0] == rows[1], t.qualified


def test_spark_engine_changes_columns_without_rewriting_files(runs: dict[str, Run]) -> None:
    cfg = runs["spark"].cfg
    dropped = _operations(cfg.table_path("mx_drop_column", "t"))
    renamed = _operations(cfg.table_path("mx_rename_column", "t"))
    widened = _operations(cfg.table_path(WIDENED, "t"))
    assert dropped["DROP COLUMNS"] == 0, dropped
    assert renamed["RENAME COLUMN"] == 0, renamed
    assert widened["CHANGE COLUMN"] == 0, widened
    for ops in (dropped, renamed, widened):
        # no rewrite (a WRITE of no file is the step marker recorded after an ALTER)
        assert ops.get("WRITE", 0) == 0 and "CREATE OR REPLACE TABLE" not in ops, ops
    # the delta-rs engine rewrote the same tables
    assert _operations(runs["delta-rs"].cfg.table_path("mx_drop_column", "t")).get("WRITE", 0) > 0
