"""The spark engine's schema commits with Delta Lake's own operations (real Spark, real Delta tables).

Column mapping lets DROP / RENAME COLUMN change only the table's metadata: the commit adds and removes no
file. Type widening (opt-in) does the same for a wider DECIMAL. delta-rs still reads the default tables.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from ticdc_delta.config import config_from_mapping
from ticdc_delta.core.records import DDLRecord
from ticdc_delta.delta.applier import DeltaApplier, TableOptions
from ticdc_delta.delta.arrow_types import TypeParams
from ticdc_delta.delta.ddl_replay import DDLReplayer
from ticdc_delta.delta.sink import DeltaRsSink, TableIdent, Txn, moved_from
from ticdc_delta.errors import ConfigError, SinkError
from ticdc_delta.spark.delta_sink import TYPE_WIDENING_PROPERTY, SparkDeltaSink, delta_widens_in_place

integration = pytest.mark.integration

T = TableIdent("s", "t")
SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("a", pa.string()), pa.field("v", pa.string()),
                    pa.field("d", pa.decimal128(6, 2))])


def _table(spark: Any, root: Path, *, type_widening: bool = False, column_mapping: bool = True) -> SparkDeltaSink:
    sink = SparkDeltaSink(DeltaRsSink(str(root)), spark, type_widening=type_widening, column_mapping=column_mapping)
    assert sink.ensure_table(T, SCHEMA, None, Txn("cf", 0))
    assert not sink.ensure_table(T, SCHEMA, None, Txn("cf", 0))
    path = sink.table_path(*T)
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'x', 'gone1', 1.50), (2, 'y', 'gone2', -3.25)")
    return sink


def _commits(sink: SparkDeltaSink) -> list[list[dict]]:
    logs = sorted((Path(sink.table_path(*T)) / "_delta_log").glob("*.json"))
    return [[json.loads(line) for line in log.read_text().splitlines()] for log in logs]


def _last_commit(sink: SparkDeltaSink) -> list[dict]:
    """The last commit that is not only an app transaction (the one after an ALTER TABLE)."""
    return next(c for c in reversed(_commits(sink)) if not _txn_only(c))


def _txn_only(commit: list[dict]) -> bool:
    return {next(iter(a)) for a in commit} == {"commitInfo", "txn"}


def _files_touched(commit: list[dict]) -> int:
    return sum(1 for a in commit if "add" in a or "remove" in a)


def _rows_by_delta_rs(sink: SparkDeltaSink) -> list[dict]:
    """The rows as delta-rs reads them (QueryBuilder: to_pyarrow_table can abort at exit, delta-rs 2184)."""
    from deltalake import DeltaTable, QueryBuilder

    got = QueryBuilder().register("t", DeltaTable(sink.table_path(*T))).execute("SELECT * FROM t ORDER BY id")
    return pa.table(got.read_all()).to_pylist()


@integration
def test_drop_and_rename_column_change_metadata_only_and_delta_rs_reads_the_table(spark: Any, tmp_path: Path) -> None:
    sink = _table(spark, tmp_path)
    assert sink.add_columns(T, [pa.field("c", pa.int64())], Txn("cf", 1)) == ["c"]
    assert sink.add_columns(T, [pa.field("c", pa.int64())], Txn("cf", 1)) == []  # a replay adds nothing
    assert _files_touched(_last_commit(sink)) == 0

    assert sink.rename_column(T, "a", "b", Txn("cf", 2))
    assert _files_touched(_last_commit(sink)) == 0
    assert sink.base.snapshot(T).transaction_version("cf") == 2  # an append of no rows after the ALTER
    assert sink.drop_column(T, "v", Txn("cf", 3))
    assert _files_touched(_last_commit(sink)) == 0
    # replays after a crash: the table no longer needs them
    assert not sink.rename_column(T, "a", "b", Txn("cf", 2))
    assert not sink.drop_column(T, "v", Txn("cf", 3))

    assert sink.table_schema(T).names == ["id", "b", "d", "c"]
    assert _rows_by_delta_rs(sink) == [{"id": 1, "b": "x", "d": Decimal("1.50"), "c": None},
                                       {"id": 2, "b": "y", "d": Decimal("-3.25"), "c": None}]
    with pytest.raises(SinkError, match="cannot add column 'c' string: the table has 'c' int64"):
        sink.add_columns(T, [pa.field("c", pa.string())], Txn("cf", 4))


@integration
def test_a_column_change_is_skipped_once_a_later_step_of_the_changefeed_committed(spark: Any, tmp_path: Path) -> None:
    """ALTER TABLE records no app transaction: a replayed DROP COLUMN whose later step is committed must not
    drop the column a later DDL of the same batch added again."""
    sink = _table(spark, tmp_path)
    path = sink.table_path(*T)
    spark.conf.set("spark.databricks.delta.write.txnAppId", "cf")
    spark.conf.set("spark.databricks.delta.write.txnVersion", "6")
    try:
        spark.sql(f"INSERT INTO delta.`{path}` VALUES (3, 'z', 'again', 0)")
    finally:
        spark.conf.unset("spark.databricks.delta.write.txnAppId")
        spark.conf.unset("spark.databricks.delta.write.txnVersion")
    assert not sink.drop_column(T, "v", Txn("cf", 5))
    assert "v" in sink.table_schema(T).names
    assert sink.drop_column(T, "v", Txn("cf", 7))
    assert "v" not in sink.table_schema(T).names


REPLAYED_DDL = {
    "add then drop": ["ADD COLUMN `c` INT", "DROP COLUMN `c`"],
    "add then rename": ["ADD COLUMN `c` INT", "RENAME COLUMN `c` TO `e`"],
    "add, drop, add as another type": ["ADD COLUMN `c` INT", "DROP COLUMN `c`", "ADD COLUMN `c` VARCHAR(5)"],
    "rename then add the old name": ["RENAME COLUMN `a` TO `b`", "ADD COLUMN `a` INT"],
}


@integration
@pytest.mark.parametrize("name", list(REPLAYED_DDL))
def test_a_batch_of_ddl_run_again_after_a_crash_leaves_the_schema_of_one_run(spark: Any, tmp_path: Path,
                                                                             name: str) -> None:
    """The DDL steps of one batch, all applied, then the batch again (a crash before the job state was
    saved): the ALTERs record the batch's steps, so the re-run neither adds back a dropped or renamed column
    nor fails on one."""
    sink = _table(spark, tmp_path)
    applier = DeltaApplier(sink, "cf", ddl_handler=DDLReplayer(SimpleNamespace()))
    steps = [DDLRecord((2000 + i) << 18, "x", 0, i, 0, "s", "t", f"ALTER TABLE `s`.`t` {ddl}", None)
             for i, ddl in enumerate(REPLAYED_DDL[name])]
    applier.apply(steps, 5)
    once = sink.table_schema(T)
    commits = len(_commits(sink))
    applier.apply(steps, 5)
    assert sink.table_schema(T) == once
    assert len(_commits(sink)) == commits  # nothing committed again


@integration
def test_a_wider_decimal_is_a_rewrite_by_default(spark: Any, tmp_path: Path) -> None:
    sink = _table(spark, tmp_path)
    assert sink.change_column_type(T, "d", pa.decimal128(12, 4), Txn("cf", 1))
    assert _files_touched(_last_commit(sink)) > 0
    assert not sink.change_column_type(T, "d", pa.decimal128(12, 4), Txn("cf", 1))
    assert sink.table_schema(T).field("d").type == pa.decimal128(12, 4)
    assert [r["d"] for r in _rows_by_delta_rs(sink)] == [Decimal("1.5000"), Decimal("-3.2500")]


@integration
def test_type_widening_widens_a_decimal_in_place(spark: Any, tmp_path: Path) -> None:
    sink = _table(spark, tmp_path, type_widening=True)
    assert sink.change_column_type(T, "d", pa.decimal128(12, 4), Txn("cf", 1))
    assert _files_touched(_last_commit(sink)) == 0
    assert not sink.change_column_type(T, "d", pa.decimal128(12, 4), Txn("cf", 2))
    rows = spark.read.format("delta").load(sink.table_path(*T)).orderBy("id").collect()
    assert [r["d"] for r in rows] == [Decimal("1.5000"), Decimal("-3.2500")]
    assert "typeWidening" in (sink.base.snapshot(T).protocol().reader_features or [])
    # a change Delta cannot make in place (number → text) is still a rewrite
    assert sink.change_column_type(T, "id", pa.string(), Txn("cf", 3))
    assert _files_touched(_last_commit(sink)) > 0


@integration
@pytest.mark.parametrize("type_widening", [True, False])
def test_a_type_grown_without_ddl_is_widened_in_place_with_type_widening(spark: Any, tmp_path: Path,
                                                                          type_widening: bool) -> None:
    """Row images whose DECIMALs grew without a DDL (an Avro schema version): the applier widens the table's
    columns through the sink, in place (no data file added or removed) when type widening allows it."""
    sink = SparkDeltaSink(DeltaRsSink(str(tmp_path)), spark, type_widening=type_widening)
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("d", pa.decimal128(6, 2)),
                        pa.field("e", pa.decimal128(8, 3))])
    assert sink.ensure_table(T, schema, None, Txn("cf", 0))
    spark.sql(f"INSERT INTO delta.`{sink.table_path(*T)}` VALUES (1, 1.50, -2.125)")
    before = len(_commits(sink))
    applier = DeltaApplier(sink, "cf")
    applier.catalog.set_params("s", "t", "d", TypeParams(12, 2))
    applier.catalog.set_params("s", "t", "e", TypeParams(10, 3))
    col_types = {"id": (8, 0), "d": (246, 0), "e": (246, 0)}  # LONGLONG, NEWDECIMAL
    assert applier.prepare_table(T, col_types, True, TableOptions(), 3) == {"id": "id", "d": "d", "e": "e"}

    got = sink.table_schema(T)
    assert (got.field("d").type, got.field("e").type) == (pa.decimal128(12, 2), pa.decimal128(10, 3))
    touched = sum(_files_touched(c) for c in _commits(sink)[before:])
    assert (touched == 0) == type_widening
    assert sink.base.snapshot(T).transaction_version("cf") == 3 * 1024  # the schema step of batch 3
    rows = spark.read.format("delta").load(sink.table_path(*T)).collect()
    assert [(r["d"], r["e"]) for r in rows] == [(Decimal("1.50"), Decimal("-2.125"))]
    commits = len(_commits(sink))
    DeltaApplier(sink, "cf", catalog=applier.catalog).prepare_table(T, col_types, True, TableOptions(), 3)
    assert len(_commits(sink)) == commits  # the batch again: nothing to do


@integration
def test_the_spark_copy_of_a_table_keeps_its_features_and_marks_the_move(spark: Any, tmp_path: Path) -> None:
    """RENAME TABLE on an object store copies the table: with Spark, a type-widened column-mapping table
    (which delta-rs cannot scan, so cannot copy) arrives whole, with its properties, in one commit that
    records the move's app transaction; stray files of a copy that died before its commit do not matter."""
    sink = _table(spark, tmp_path, type_widening=True)
    assert sink.change_column_type(T, "d", pa.decimal128(12, 4), Txn("cf", 1))
    assert sink.rename_column(T, "a", "b", Txn("cf", 2))
    src = sink.table_path(*T)
    spark.sql(f"INSERT INTO delta.`{src}` VALUES (3, 'z', 'v3', 12345678.1234)")
    dst = str(tmp_path / "copy")
    os.makedirs(os.path.join(dst, "stray"))
    Path(dst, "stray", "part-00000-dead.parquet").write_bytes(b"not parquet")

    sink.copy_table(src, dst, moved_from(src))

    copied = DeltaTable(dst)
    assert copied.version() == 0  # one commit
    assert copied.transaction_version(moved_from(src)) == 0
    config = copied.metadata().configuration
    assert config["delta.columnMapping.mode"] == "name"
    assert config[TYPE_WIDENING_PROPERTY] == "true"
    assert spark.read.format("delta").load(dst).schema == spark.read.format("delta").load(src).schema
    assert _rows_by_spark(spark, dst) == _rows_by_spark(spark, src)
    assert [r["d"] for r in _rows_by_spark(spark, dst)] == [Decimal("1.5000"), Decimal("-3.2500"),
                                                            Decimal("12345678.1234")]
    # the copy keeps column mapping: a later DROP COLUMN rewrites no file
    spark.sql(f"ALTER TABLE delta.`{dst}` DROP COLUMN v")
    assert _files_touched(_last_commit_at(dst)) == 0


@integration
def test_the_spark_copy_keeps_partition_columns_and_fails_clearly(spark: Any, tmp_path: Path) -> None:
    sink = SparkDeltaSink(DeltaRsSink(str(tmp_path / "lake")), spark)
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    spark.sql(f"CREATE TABLE delta.`{src}` (id BIGINT, p STRING) USING delta PARTITIONED BY (p)")
    spark.sql(f"INSERT INTO delta.`{src}` VALUES (1, 'x'), (2, 'y'), (3, 'x')")
    sink.copy_table(src, dst, "app")
    assert DeltaTable(dst).metadata().partition_columns == ["p"]
    assert DeltaTable(dst).transaction_version("app") == 0
    assert _rows_by_spark(spark, dst) == _rows_by_spark(spark, src)
    with pytest.raises(SinkError, match="cannot copy Delta table .*/nothing"):
        sink.copy_table(str(tmp_path / "nothing"), str(tmp_path / "dst2"), "app")


def _rows_by_spark(spark: Any, path: str) -> list[dict]:
    return [r.asDict() for r in spark.read.format("delta").load(path).orderBy("id").collect()]


def _last_commit_at(path: str) -> list[dict]:
    last = sorted((Path(path) / "_delta_log").glob("*.json"))[-1]
    return [json.loads(line) for line in last.read_text().splitlines()]


@integration
def test_rewrite_and_truncate_carry_the_batch_transaction(spark: Any, tmp_path: Path) -> None:
    sink = _table(spark, tmp_path)

    at = datetime(2024, 1, 2, 3, 4, 5, 123000)

    def fill(table: pa.Table) -> pa.Table:  # ADD COLUMN `at` DATETIME(3) DEFAULT ...: a timestamp_ntz column
        values = pa.array([at] * table.num_rows, pa.timestamp("us"))
        return table.append_column(pa.field("at", pa.timestamp("us")), values)

    assert sink.rewrite(T, fill, Txn("cf", 1))
    assert not sink.rewrite(T, fill, Txn("cf", 1))  # committed: a replay is skipped
    assert [r["at"] for r in _rows_by_delta_rs(sink)] == [at, at]
    assert sink.overwrite_empty(T, Txn("cf", 2))
    assert not sink.overwrite_empty(T, Txn("cf", 2))
    assert _rows_by_delta_rs(sink) == []
    assert sink.table_schema(T).names == ["id", "a", "v", "d", "at"]


@integration
def test_without_column_mapping_a_rename_is_a_rewrite_and_delta_rs_can_compact(spark: Any, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    sink = _table(spark, tmp_path, column_mapping=False)
    assert sink.rename_column(T, "a", "b", Txn("cf", 1))
    assert _files_touched(_last_commit(sink)) > 0
    assert [r["b"] for r in _rows_by_delta_rs(sink)] == ["x", "y"]
    spark.sql(f"INSERT INTO delta.`{sink.table_path(*T)}` VALUES (3, 'z', NULL, NULL)")  # two files at least
    DeltaTable(sink.table_path(*T)).optimize.compact()  # delta-rs 1.6 refuses this on column-mapping tables
    assert _last_commit(sink)[0]["commitInfo"]["operation"] == "OPTIMIZE"


def test_delta_widens_in_place_follows_delta_type_widening() -> None:
    assert delta_widens_in_place(pa.decimal128(6, 2), pa.decimal128(12, 4))
    assert not delta_widens_in_place(pa.decimal128(6, 2), pa.decimal128(6, 3))  # fewer integer digits
    assert delta_widens_in_place(pa.int64(), pa.decimal128(20, 0))
    assert not delta_widens_in_place(pa.int64(), pa.decimal128(19, 0))  # Delta asks 20 digits of a long
    assert delta_widens_in_place(pa.int32(), pa.int64())
    assert not delta_widens_in_place(pa.int64(), pa.string())


def test_type_widening_needs_the_spark_engine(tmp_path: Path) -> None:
    def cfg(engine: str) -> Any:
        return config_from_mapping({
            "changefeed": "cf", "source": {"bootstrap_servers": "127.0.0.1:1", "topic": "t", "protocol": "craft"},
            "sink": {"path": str(tmp_path / "lake"), "engine": engine, "type_widening": True},
            "checkpoint": str(tmp_path / "ckpt"),
        })

    assert cfg("spark").sink.type_widening
    with pytest.raises(ConfigError, match="sink.type_widening: needs engine: spark"):
        cfg("delta-rs")


@integration
def test_drop_and_rename_table_leave_nothing_in_delta_lakes_log_cache(spark: Any, tmp_path: Path) -> None:
    """DROP / RENAME TABLE move files outside Delta Lake: the JVM's cached logs of both paths go with them
    (else the old snapshot stays for an hour, and a table made again at the path is first read against it)."""
    delta_log = getattr(getattr(spark._jvm.org.apache.spark.sql.delta, "DeltaLog$"), "MODULE$")  # the object
    delta_log.clearCache()
    sink = _table(spark, tmp_path)
    assert delta_log.cacheSize() == 1
    moved = TableIdent("s", "u")
    assert sink.move(T, moved)
    assert delta_log.cacheSize() == 0
    assert spark.read.format("delta").load(sink.table_path(*moved)).count() == 2
    assert delta_log.cacheSize() == 1
    assert sink.drop(moved)
    assert delta_log.cacheSize() == 0
    # a table made again at the old path, outside Spark, is what Spark reads there
    from deltalake import write_deltalake

    write_deltalake(sink.table_path(*T), pa.table({"x": [7]}))
    assert [r.asDict() for r in spark.read.format("delta").load(sink.table_path(*T)).collect()] == [{"x": 7}]


def _debris_of_a_killed_create(path: str) -> None:
    """What a process killed while it committed a table's first version leaves (as a SIGKILL left it in
    the soak): the log directory with the commit's temporary file and its checksum, no commit."""
    log_dir = Path(path) / "_delta_log"
    (log_dir / "_staged_commits").mkdir(parents=True)
    (log_dir / ".00000000000000000000.json.94239e4a-4811-4fbd-8066-871300aebf42.tmp").write_text('{"commitInfo":')
    (log_dir / "..00000000000000000000.json.94239e4a-4811-4fbd-8066-871300aebf42.tmp.crc").write_bytes(b"crc")


@pytest.mark.parametrize("engine", ["spark", "delta-rs"])
def test_a_table_whose_creation_was_killed_before_its_commit_is_created_on_restart(spark: Any, tmp_path: Path,
                                                                                   engine: str) -> None:
    """A table directory with a log but no commit is no table: creating it again succeeds (Delta Lake's
    builder took the log directory for a table and failed with DELTA_TABLE_NOT_FOUND on every restart),
    and the schema's tables do not include it meanwhile."""
    base = DeltaRsSink(str(tmp_path))
    sink = SparkDeltaSink(base, spark) if engine == "spark" else base
    path = sink.table_path(*T)
    _debris_of_a_killed_create(path)
    assert base.snapshot(T) is None
    assert sink.tables_in_schema("s") == []
    assert sink.ensure_table(T, SCHEMA, None, Txn("cf", 0))
    assert sink.tables_in_schema("s") == [T]
    assert DeltaTable(path).version() == 0
    assert pa.schema(DeltaTable(path).schema().to_arrow()).names == SCHEMA.names
    assert not sink.ensure_table(T, SCHEMA, None, Txn("cf", 0))
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'x', 'y', 1.50)")
    assert spark.read.format("delta").load(path).count() == 1


@integration
@pytest.mark.parametrize("column_mapping", [True, False], ids=["column-mapping", "plain"])
def test_a_partition_column_dropped_or_renamed_leaves_the_table_as_the_delta_rs_engine_does(
        spark: Any, tmp_path: Path, column_mapping: bool) -> None:
    """Regression: Delta drops no partition column in place (DELTA_UNSUPPORTED_DROP_PARTITION_COLUMN), so on a
    column-mapping table the DROP COLUMN of a ``tables[].partition_by`` column stopped the job at that DDL
    on every restart; and a rename by rewrite left the table unpartitioned. Both engines now end with the
    same table: dropped, partitioned by the other columns; renamed, still partitioned by it."""
    sink = SparkDeltaSink(DeltaRsSink(str(tmp_path)), spark, column_mapping=column_mapping)
    sink.ensure_table(T, SCHEMA, ["a", "v"], Txn("cf", 0))
    path = sink.table_path(*T)
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'x', 'p', 1.50), (2, 'y', 'q', -3.25)")
    assert sink.rename_column(T, "v", "w", Txn("cf", 1))
    assert DeltaTable(path).metadata().partition_columns == ["a", "w"]
    assert sink.drop_column(T, "a", Txn("cf", 2))
    assert DeltaTable(path).metadata().partition_columns == ["w"]
    assert not sink.drop_column(T, "a", Txn("cf", 2))  # a replay after a crash
    assert sink.table_schema(T).names == ["id", "w", "d"]
    assert [(r["id"], r["w"]) for r in _rows_by_delta_rs(sink)] == [(1, "p"), (2, "q")]
