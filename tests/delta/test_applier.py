"""DeltaApplier on the delta-rs engine: the schema work before a table's rows are written (prepare_table)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

from ticdc_delta.codec.model import ColumnFlag, Op, TypeCode
from ticdc_delta.core.batch_planner import RowsStep
from ticdc_delta.core.merge import KeyResolver, collapse
from ticdc_delta.core.records import ChangeRecord
from ticdc_delta.delta.applier import DeltaApplier
from ticdc_delta.delta.sink import DeltaRsSink, TableIdent

pytestmark = pytest.mark.integration  # real Delta tables

T = TableIdent("db", "t")
PK = int(ColumnFlag.HANDLE_KEY | ColumnFlag.PRIMARY_KEY)
META = ("_tidb_commit_ts", "_tidb_op")


def _image(key: int, value: int) -> tuple:
    return (("id", int(TypeCode.BIGINT), PK, key), ("v", int(TypeCode.INT), 0, value))


def _change(ts: int, op: str, new: tuple | None, old: tuple | None = None) -> ChangeRecord:
    return ChangeRecord(ts, "cdc", 0, ts, 0, T.schema, T.table, op, new, old)


def _apply(sink: DeltaRsSink, batch_id: int, *records: ChangeRecord, meta: tuple[str, str] | None = None) -> None:
    DeltaApplier(sink, "cf", metadata_columns=meta).apply([RowsStep(collapse(list(records), KeyResolver()))], batch_id)


def _rows(sink: DeltaRsSink) -> list[dict]:
    return sorted(sink.read(T).to_pylist(), key=lambda r: r["id"])


def test_metadata_columns_turned_on_for_an_existing_table_are_added(tmp_path: Path) -> None:
    """Regression: a table made before ``sink.metadata_columns`` was turned on lacked the two columns, and every
    batch touching it failed ("column '_tidb_commit_ts' is not in the table"). They are added, null in the rows
    written before."""
    sink = DeltaRsSink(str(tmp_path))
    _apply(sink, 1, _change(1, Op.INSERT, _image(1, 1)), _change(1, Op.INSERT, _image(2, 1)))
    assert sink.table_schema(T).names == ["id", "v"]

    _apply(sink, 2, _change(2, Op.UPDATE, _image(1, 2), _image(1, 1)), meta=META)
    assert sink.table_schema(T).names == ["id", "v", *META]
    assert _rows(sink) == [{"id": 1, "v": 2, "_tidb_commit_ts": 2, "_tidb_op": Op.UPDATE},
                           {"id": 2, "v": 1, "_tidb_commit_ts": None, "_tidb_op": None}]
    # a delete-only batch finds them there, and a re-run of batch 2 adds nothing
    _apply(sink, 3, _change(3, Op.DELETE, None, _image(2, 1)), meta=META)
    _apply(sink, 2, _change(2, Op.UPDATE, _image(1, 2), _image(1, 1)), meta=META)
    assert [r["id"] for r in _rows(sink)] == [1] and sink.table_schema(T).names == ["id", "v", *META]


def test_metadata_columns_keep_the_tables_spelling(tmp_path: Path) -> None:
    """A table that has the metadata columns in another case (names compare as MySQL's do) gets no second
    column: the rows are written to the table's own."""
    sink = DeltaRsSink(str(tmp_path))
    spelled = pa.schema([("id", pa.int64()), ("v", pa.int32()), ("_TiDB_Commit_TS", pa.int64())])
    sink.ensure_table(T, spelled, None, ("other", 0))

    _apply(sink, 1, _change(5, Op.INSERT, _image(1, 1)), meta=META)
    assert sink.table_schema(T).names == ["id", "v", "_TiDB_Commit_TS", "_tidb_op"]
    assert _rows(sink) == [{"id": 1, "v": 1, "_TiDB_Commit_TS": 5, "_tidb_op": Op.INSERT}]


def test_a_table_written_before_is_not_made_anew_unless_a_ddl_removed_it(tmp_path: Path) -> None:
    """The state records where each table's rows went (``next_state_meta``): a later batch refuses to create
    such a table again when it is gone (deleted, moved, or the config now puts it elsewhere). A table a DDL
    dropped or renamed away leaves the record, and is made again by right."""
    import shutil
    from types import SimpleNamespace

    from ticdc_delta.core.records import DDLRecord
    from ticdc_delta.delta.ddl_replay import DDLReplayer
    from ticdc_delta.errors import TableMissingError
    from ticdc_delta.spark.batch_handler import next_state_meta, written_locations

    sink = DeltaRsSink(str(tmp_path / "lake"))
    evolve = SimpleNamespace(drop_table="evolve", drop_database="evolve", rename_table="evolve", unknown="fail")
    meta: dict = {}

    def run(batch_id: int, *steps: object) -> None:
        nonlocal meta
        applier = DeltaApplier(sink, "cf", ddl_handler=DDLReplayer(evolve), written=written_locations(meta))
        result = applier.apply(list(steps), batch_id)  # type: ignore[arg-type]
        plan = SimpleNamespace(state=SimpleNamespace(applied_ddl=[], released_low=None), topic_watermarks={})
        meta = next_state_meta(meta, plan, applier, result, {}, "q", engine="delta-rs", totals={})

    def rows(ts: int, key: int) -> RowsStep:
        return RowsStep(collapse([_change(ts, Op.INSERT, _image(key, key))], KeyResolver()))

    run(1, rows(1, 1))
    assert meta["tables"]["db.t"]["location"] == sink.table_path("db", "t")
    shutil.rmtree(sink.table_path("db", "t"))  # deleted behind the job's back
    with pytest.raises(TableMissingError, match=r"table db\.t has had changes applied .* \(it was deleted or moved"):
        run(2, rows(2, 2))
    # nor when a DDL of the batch drops another schema, or drops the table only after these rows
    with pytest.raises(TableMissingError):
        run(2, DDLRecord(2, "cdc", 0, 2, 0, "other", "", "DROP DATABASE other", None), rows(2, 2))
    with pytest.raises(TableMissingError):
        run(2, rows(2, 2), DDLRecord(3, "cdc", 0, 3, 0, "db", "t", "DROP TABLE t", None))

    run(2, DDLRecord(3, "cdc", 0, 3, 0, "db", "t", "DROP TABLE t", None))  # dropped upstream: forgotten
    assert "location" not in meta["tables"]["db.t"]  # (the entry stays: the snapshot guard reads its commit ts)
    run(3, rows(4, 3))  # made again by its next rows
    assert [r["id"] for r in _rows(sink)] == [3] and meta["tables"]["db.t"]["location"] == sink.table_path("db", "t")
    # dropped and its rows arriving again in one batch (also on a re-run that resumes past the DROP)
    run(4, DDLRecord(5, "cdc", 0, 5, 0, "db", "t", "DROP TABLE t", None), rows(6, 4))
    assert [r["id"] for r in _rows(sink)] == [4]


def test_shards_mapped_to_one_path_each_land_in_one_batch(tmp_path: Path) -> None:
    """Regression: two upstream tables the config maps to one location (shards merged into one table)
    numbered their commits of a batch apart, so both of the batch's first MERGEs carried the same app
    transaction, and Delta skipped the second as committed already: its rows were lost, while the batch
    counted them. Commits to one location take steps past each other's, and a re-run changes nothing."""
    shared = str(tmp_path / "merged")
    sink = DeltaRsSink(str(tmp_path / "lake"), paths={("db_1", "t"): shared, ("db_2", "t"): shared})

    def shard(schema: str, key: int, ts: int) -> ChangeRecord:
        return ChangeRecord(ts, "cdc", 0, ts, 0, schema, "t", Op.INSERT, _image(key, ts), None)

    def batch(batch_id: int, *records: ChangeRecord) -> None:
        result = DeltaApplier(sink, "cf").apply([RowsStep(collapse(list(records), KeyResolver()))], batch_id)
        assert set(result.rows) == {"db_1.t", "db_2.t"}

    batch(0, shard("db_1", 1, 10), shard("db_2", 1001, 11))
    batch(1, shard("db_2", 1002, 12), shard("db_1", 2, 13))
    batch(1, shard("db_2", 1002, 12), shard("db_1", 2, 13))
    assert sorted(r["id"] for r in sink.read(TableIdent("db_1", "t")).to_pylist()) == [1, 2, 1001, 1002]


def test_a_partition_column_is_named_in_any_case_and_a_missing_one_is_a_config_error(tmp_path: Path) -> None:
    """``tables[].partition_by`` matches the columns ignoring case, as ``key`` does (``Region`` stopped the job
    with a bare ValueError at the table's creation). One the table lacks — a wildcard entry's, matching a
    table without it — is a configuration error naming the table and the entry, before anything is written."""
    from ticdc_delta.delta.applier import TableOptions
    from ticdc_delta.errors import ConfigError

    sink = DeltaRsSink(str(tmp_path))
    parts = {"t": ("V",), "u": ("region",)}
    applier = DeltaApplier(sink, "cf", table_options=lambda s, t: TableOptions(partition_by=parts[t]))
    applier.apply([RowsStep(collapse([_change(1, Op.INSERT, _image(1, 7))], KeyResolver()))], 1)
    assert sink.partition_columns(T) == ("v",) and _rows(sink) == [{"id": 1, "v": 7}]
    other = ChangeRecord(2, "cdc", 0, 2, 0, "db", "u", Op.INSERT, _image(1, 1), None)
    with pytest.raises(ConfigError, match=r"tables\[\]\.partition_by of db\.u: \['region'\] not among its columns "
                                          r"\['id', 'v'\]"):
        applier.apply([RowsStep(collapse([other], KeyResolver()))], 2)
    assert sink.table_schema(TableIdent("db", "u")) is None


def test_an_upstream_column_named_as_a_metadata_column_is_a_config_error(tmp_path: Path) -> None:
    """An upstream column that takes a metadata column's name (any case) failed the batch on every re-run
    with delta-rs's "duplicate field" (or its values were replaced by the metadata's). Refused, naming the
    setting to change."""
    from ticdc_delta.errors import ConfigError

    sink = DeltaRsSink(str(tmp_path))
    image = (*_image(1, 1), ("_TiDB_Op", int(TypeCode.VARCHAR), 0, "mine"))
    with pytest.raises(ConfigError, match=r"table db\.t has a column '_TiDB_Op', and sink\.metadata_columns names "
                                          r"'_tidb_op' too"):
        _apply(sink, 1, _change(1, Op.INSERT, image), meta=META)
    _apply(sink, 1, _change(1, Op.INSERT, image), meta=("_cdc_ts", "_cdc_op"))
    assert _rows(sink) == [{"id": 1, "v": 1, "_TiDB_Op": "mine", "_cdc_ts": 1, "_cdc_op": Op.INSERT}]


def test_a_batch_that_could_need_more_steps_than_it_has_is_refused_before_its_first_commit(tmp_path: Path) -> None:
    """A batch of 400 × (a row; TRUNCATE TABLE) of one table — an ETL's minutely TRUNCATE + INSERT read after
    hours of backlog — needs ~1,200 commits to that table, and a batch numbers 1,024. Regression: a bare
    ValueError at the 1,025th step, after ~680 commits, on every re-run. Refused before the first commit,
    naming the way on; 400 DDL that each create another table are no reason to refuse."""
    from ticdc_delta.core.records import DDLRecord
    from ticdc_delta.delta.ddl_replay import DDLReplayer
    from ticdc_delta.errors import TerminalError

    sink = DeltaRsSink(str(tmp_path))
    steps: list[Any] = []
    for i in range(400):
        steps.append(RowsStep(collapse([_change(2 * i + 1, Op.INSERT, _image(i, i))], KeyResolver())))
        steps.append(DDLRecord(2 * i + 2, "cdc", 0, 2 * i + 2, 0, "db", "t", "TRUNCATE TABLE t", None))
    applier = DeltaApplier(sink, "cf", ddl_handler=DDLReplayer(SimpleNamespace(truncate_table="evolve")))
    with pytest.raises(TerminalError, match=r"micro-batch 3 could make up to 1200 commits to the Delta table at "
                                            r".*\(db\.t: .*more than the 1024 a micro-batch can number; nothing of "
                                            r"it was committed\. Lower source\.max_offsets_per_trigger, then run "
                                            r"`reset --from state --yes`"):
        applier.apply(steps, 3)
    assert sink.table_schema(T) is None

    creates = [DDLRecord(i, "cdc", 0, i, 0, "db", f"t{i}", f"CREATE TABLE t{i} (id INT PRIMARY KEY)", None)
               for i in range(400)]
    applier.check_steps(4, [[TableIdent("db", f"t{i}")] for i in range(401)], creates)
    # what commits nothing is not counted: a disabled table's rows and DDL, DDL its policy ignores
    from ticdc_delta.delta.applier import TableOptions

    segments = [[T] for _ in range(401)]
    truncates = [s for s in steps if isinstance(s, DDLRecord)]
    DeltaApplier(sink, "cf", ddl_handler=DDLReplayer(SimpleNamespace(truncate_table="evolve")),
                 table_options=lambda s, t: TableOptions(enabled=False)).check_steps(5, segments, truncates)
    DeltaApplier(sink, "cf", ddl_handler=DDLReplayer(SimpleNamespace(truncate_table="ignore"))).check_steps(
        5, segments[:400], truncates)
