"""DeltaApplier on the delta-rs engine: the schema work before a table's rows are written (prepare_table)."""

from __future__ import annotations

from pathlib import Path

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
