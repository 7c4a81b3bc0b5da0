"""DeltaRsSink against real Delta tables under tmp_path (read back with the safe reader)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from tests.codec.cases import ALL_TYPES, DELETE, INSERT, UPDATE
from tests.delta import ALL_TYPES_PARAMS
from ticdc_delta.cli import EXIT_TERMINAL, exit_code_for
from ticdc_delta.codec.model import RowChange
from ticdc_delta.delta.arrow_types import arrow_field_for, canonical_from_delta, convert_value
from ticdc_delta.delta.sink import (
    OP_COLUMN,
    SCHEMA_TXN_SUFFIX,
    STEPS_PER_BATCH,
    DeltaRsSink,
    TableIdent,
    TableSink,
    Txn,
    batch_txn,
    path_component,
    moved_from,
    quote_identifier,
    read_table,
    rows_outside,
    storage_unreachable,
)
from ticdc_delta.errors import ConcurrentCommitError, SinkError

pytestmark = pytest.mark.integration

APP = "ticdc-delta-test"
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("v", pa.float64())])
T1 = TableIdent("shop", "items")


def txn(version: int) -> Txn:
    return Txn(APP, version)


def changes(rows: list[dict[str, Any]], schema: pa.Schema = SCHEMA) -> pa.Table:
    """A change table: ``schema``'s columns (only those the rows use) plus :data:`OP_COLUMN`."""
    names = [f.name for f in schema if any(f.name in r for r in rows)] or schema.names
    fields = [schema.field(n) for n in names] + [pa.field(OP_COLUMN, pa.string())]
    return pa.Table.from_pylist(rows, schema=pa.schema(fields))


def rows_of(sink: DeltaRsSink, ident: TableIdent, *order: str) -> list[dict[str, Any]]:
    table = sink.read(ident)
    key = list(order or table.column_names)
    return sorted(table.to_pylist(), key=lambda r: tuple((r[k] is None, r[k] or 0) for k in key))


@pytest.fixture
def sink(tmp_path: Path) -> DeltaRsSink:
    return DeltaRsSink(str(tmp_path / "lake"))


@pytest.fixture
def items(sink: DeltaRsSink) -> DeltaRsSink:
    """A sink whose table shop.items holds ids 1..3."""
    sink.ensure_table(T1, SCHEMA, None, txn(0))
    sink.merge(
        T1,
        changes([{"id": i, "name": f"n{i}", "v": float(i), OP_COLUMN: "u"} for i in (1, 2, 3)]),
        ["id"],
        txn(0),
    )
    return sink


def version(sink: DeltaRsSink, ident: TableIdent) -> int:
    return DeltaTable(sink.table_path(*ident)).version()


# --- paths and identifiers ---------------------------------------------------------------------------


def test_delta_rs_sink_is_a_table_sink(sink: DeltaRsSink) -> None:
    assert isinstance(sink, TableSink)


def test_default_and_explicit_table_paths(tmp_path: Path) -> None:
    sink = DeltaRsSink(str(tmp_path) + "/", paths={("a", "special"): "/elsewhere/x"})
    assert sink.table_path("shop", "items") == f"{tmp_path}/shop/items"
    assert sink.table_path("my db", "t`1 表") == f"{tmp_path}/my@0020db/t@00601@0020@8868"
    assert sink.table_path("a", "special") == "/elsewhere/x"
    assert sink.table_path("a/b", "..") == f"{tmp_path}/a@002fb/@002e."


def test_path_component_refuses_empty_names() -> None:
    assert path_component("100%") == "100@0025"
    with pytest.raises(SinkError, match="empty"):
        path_component("")


def test_quote_identifier_doubles_backticks() -> None:
    assert quote_identifier("x`y") == "`x``y`"


def test_awkward_identifiers_in_paths_and_predicates(sink: DeltaRsSink) -> None:
    ident = TableIdent("my db 库", "t`1 表")
    schema = pa.schema([("k`ey", pa.int64()), ("名 字", pa.string()), ("a b", pa.int64())])
    assert sink.ensure_table(ident, schema, None, txn(1))
    rows = [{"k`ey": 1, "名 字": "一", "a b": 1, OP_COLUMN: "u"},
            {"k`ey": 2, "名 字": "二", "a b": 2, OP_COLUMN: "u"}]
    sink.merge(ident, changes(rows, schema), ["k`ey", "名 字"], txn(1))
    stats = sink.merge(
        ident,
        changes(
            [{"k`ey": 1, "名 字": "一", "a b": 10, OP_COLUMN: "u"}, {"k`ey": 2, "名 字": "二", OP_COLUMN: "d"}],
            schema,
        ),
        ["k`ey", "名 字"],
        txn(2),
    )
    assert (stats.inserted, stats.updated, stats.deleted) == (0, 1, 1)
    assert rows_of(sink, ident, "k`ey") == [{"k`ey": 1, "名 字": "一", "a b": 10}]
    assert os.path.isdir(os.path.join(sink.root, path_component("my db 库"), path_component("t`1 表"), "_delta_log"))


# --- ensure_table / add_columns ----------------------------------------------------------------------


def test_ensure_table_creates_once(sink: DeltaRsSink) -> None:
    assert sink.table_schema(T1) is None
    assert sink.ensure_table(T1, SCHEMA, None, txn(1)) is True
    assert sink.ensure_table(T1, SCHEMA, None, txn(1)) is False
    assert sink.table_schema(T1) == SCHEMA
    assert sink.read(T1).num_rows == 0
    dt = DeltaTable(sink.table_path(*T1))
    assert dt.version() == 0
    assert dt.transaction_version(APP + SCHEMA_TXN_SUFFIX) == 1
    assert dt.transaction_version(APP) is None  # schema commits leave the data txn alone


def test_ensure_table_with_partitions(sink: DeltaRsSink) -> None:
    sink.ensure_table(T1, SCHEMA, ["name"], txn(1))
    assert DeltaTable(sink.table_path(*T1)).metadata().partition_columns == ["name"]
    with pytest.raises(ValueError, match="partition column 'nope'"):
        sink.ensure_table(TableIdent("shop", "other"), SCHEMA, ["nope"], txn(1))
    # bytes: delta-rs stored b"\x00\xff" as the text "\u0000\u00FF" and escaped it again at each compaction
    blob = pa.schema([pa.field("id", pa.int64()), pa.field("b", pa.binary())])
    with pytest.raises(ValueError, match=r"partition column 'b' holds bytes \(binary\).*partition by another column"):
        sink.ensure_table(TableIdent("shop", "blobs"), blob, ["b"], txn(1))
    assert sink.table_schema(TableIdent("shop", "blobs")) is None


def test_a_table_with_a_column_named_op_is_created_and_merged(sink: DeltaRsSink) -> None:
    """Regression: the MERGE's op column was ``_op``, reserved, so an upstream table with a column ``_op``
    stopped the job at CREATE TABLE. The op column's name is longer than any TiDB identifier now."""
    assert len(OP_COLUMN) > 64  # (TiDB's limit for an identifier)
    schema = pa.schema([("id", pa.int64()), ("_op", pa.string())])
    assert sink.ensure_table(T1, schema, None, txn(0))
    sink.merge(T1, changes([{"id": 1, "_op": "d", OP_COLUMN: "u"}, {"id": 2, "_op": "u", OP_COLUMN: "u"}], schema),
               ["id"], txn(1))
    stats = sink.merge(T1, changes([{"id": 1, "_op": "x", OP_COLUMN: "u"}, {"id": 2, OP_COLUMN: "d"}], schema),
                       ["id"], txn(2))
    assert (stats.updated, stats.deleted) == (1, 1)
    assert rows_of(sink, T1, "id") == [{"id": 1, "_op": "x"}]
    assert sink.table_schema(T1) == schema


def test_the_op_columns_name_stays_reserved(sink: DeltaRsSink) -> None:
    """Only a configured metadata column could take the op column's name: a table cannot have it."""
    with pytest.raises(ValueError, match=f"{re.escape(repr(OP_COLUMN))} is reserved .* sink.metadata_columns"):
        sink.ensure_table(T1, pa.schema([("id", pa.int64()), (OP_COLUMN, pa.string())]), None, txn(0))
    sink.ensure_table(T1, SCHEMA, None, txn(0))
    with pytest.raises(ValueError, match="is reserved"):
        sink.add_columns(T1, [pa.field(OP_COLUMN, pa.string())], txn(1))


@pytest.mark.parametrize("meta", [None, ("_commit_ts", "_op")], ids=["column", "metadata_columns"])
def test_the_applier_writes_an_op_column_of_the_upstream_or_the_metadata_columns(
    tmp_path: Path, meta: tuple[str, str] | None
) -> None:
    """An upstream column ``_op``, or the metadata columns ``{commit_ts: _commit_ts, op: _op}`` (the shipped
    conf/open-protocol-tables.yaml's): the table is created and its rows merged."""
    from ticdc_delta.codec.model import ColumnFlag, Op, TypeCode
    from ticdc_delta.core.batch_planner import RowsStep
    from ticdc_delta.core.merge import KeyResolver, collapse
    from ticdc_delta.core.records import ChangeRecord
    from ticdc_delta.delta.applier import DeltaApplier

    sink = DeltaRsSink(str(tmp_path))
    pk = int(ColumnFlag.HANDLE_KEY | ColumnFlag.PRIMARY_KEY)
    upstream = "v" if meta else "_op"

    def image(key: int, value: str) -> tuple:
        return (("id", int(TypeCode.BIGINT), pk, key), (upstream, int(TypeCode.VARCHAR), 0, value))

    def apply(batch_id: int, *events: tuple[int, str, tuple | None, tuple | None]) -> None:
        records = [ChangeRecord(ts, "cdc", 0, ts, 0, T1.schema, T1.table, op, new, old) for ts, op, new, old in events]
        DeltaApplier(sink, "cf", metadata_columns=meta).apply([RowsStep(collapse(records, KeyResolver()))], batch_id)

    apply(1, (1, Op.INSERT, image(1, "a"), None), (1, Op.INSERT, image(2, "b"), None))
    apply(2, (2, Op.UPDATE, image(1, "c"), image(1, "a")), (2, Op.DELETE, None, image(2, "b")))
    expected = {"id": 1, upstream: "c", **({"_commit_ts": 2, "_op": Op.UPDATE} if meta else {})}
    assert rows_of(sink, T1, "id") == [expected]
    assert sink.table_schema(T1).names == list(expected)


def test_schema_commit_then_data_commit_in_one_batch(sink: DeltaRsSink) -> None:
    sink.ensure_table(T1, SCHEMA, None, txn(5))
    stats = sink.merge(T1, changes([{"id": 1, "name": "a", "v": 1.0, OP_COLUMN: "u"}]), ["id"], txn(5))
    assert not stats.skipped and stats.inserted == 1


def test_add_columns_is_idempotent(items: DeltaRsSink) -> None:
    new = [pa.field("ts", pa.timestamp("us")), pa.field("price", pa.decimal128(20, 0), nullable=False)]
    assert items.add_columns(T1, new, txn(1)) == ["ts", "price"]
    assert items.add_columns(T1, new, txn(1)) == []
    schema = items.table_schema(T1)
    assert schema is not None
    assert schema.field("ts").type == pa.timestamp("us") and schema.field("price").nullable
    assert [r["ts"] for r in rows_of(items, T1, "id")] == [None, None, None]
    schema_ext = pa.schema([*SCHEMA, pa.field("price", pa.decimal128(20, 0))])
    items.merge(T1, changes([{"id": 4, "price": 7, OP_COLUMN: "u"}], schema_ext), ["id"], txn(1))
    assert rows_of(items, T1, "id")[-1] == {"id": 4, "name": None, "v": None, "ts": None, "price": 7}


def test_add_columns_refuses_a_type_change(items: DeltaRsSink) -> None:
    with pytest.raises(SinkError, match=r"cannot add column 'v' int64: the table has 'v' double"):
        items.add_columns(T1, [pa.field("v", pa.int64())], txn(1))
    with pytest.raises(SinkError, match="the table has 'name'"):
        items.add_columns(T1, [pa.field("NAME", pa.string())], txn(1))


def test_add_columns_to_a_missing_table(sink: DeltaRsSink) -> None:
    with pytest.raises(SinkError, match=r"no Delta table at .*shop/items"):
        sink.add_columns(T1, [pa.field("x", pa.int64())], txn(1))


# --- merge -------------------------------------------------------------------------------------------


def test_merge_upserts_and_deletes(items: DeltaRsSink) -> None:
    stats = items.merge(
        T1,
        changes(
            [
                {"id": 1, "name": "one", "v": 1.5, OP_COLUMN: "u"},  # matched + upsert → update
                {"id": 2, OP_COLUMN: "d"},  # matched + delete → delete
                {"id": 4, "name": "four", "v": 4.0, OP_COLUMN: "u"},  # not matched + upsert → insert
                {"id": 5, OP_COLUMN: "d"},  # not matched + delete → nothing
            ]
        ),
        ["id"],
        txn(1),
    )
    assert (stats.inserted, stats.updated, stats.deleted, stats.skipped) == (1, 1, 1, False)
    assert stats.version == version(items, T1)
    assert rows_of(items, T1, "id") == [
        {"id": 1, "name": "one", "v": 1.5},
        {"id": 3, "name": "n3", "v": 3.0},
        {"id": 4, "name": "four", "v": 4.0},
    ]


def test_second_merge_with_the_same_txn_does_nothing(items: DeltaRsSink) -> None:
    batch = changes([{"id": 1, "name": "x", "v": 9.0, OP_COLUMN: "u"},
                     {"id": 7, "name": "y", "v": 7.0, OP_COLUMN: "u"}])
    first = items.merge(T1, batch, ["id"], txn(1))
    before, v = rows_of(items, T1, "id"), version(items, T1)
    again = items.merge(T1, batch, ["id"], txn(1))
    assert again.skipped and (again.inserted, again.updated) == (0, 0)
    assert version(items, T1) == v == first.version
    assert rows_of(items, T1, "id") == before
    # an older batch is also already done; a newer one applies
    assert items.merge(T1, changes([{"id": 1, OP_COLUMN: "d"}]), ["id"], txn(0)).skipped
    assert items.merge(T1, changes([{"id": 1, OP_COLUMN: "d"}]), ["id"], txn(2)).deleted == 1
    assert DeltaTable(items.table_path(*T1)).transaction_version(APP) == 2


def test_composite_key_with_a_null_part(sink: DeltaRsSink) -> None:
    schema = pa.schema([("a", pa.int64()), ("b", pa.string()), ("v", pa.int64())])
    sink.ensure_table(T1, schema, None, txn(0))
    sink.merge(
        T1,
        changes(
            [
                {"a": 1, "b": None, "v": 1, OP_COLUMN: "u"},
                {"a": 1, "b": "x", "v": 2, OP_COLUMN: "u"},
                {"a": None, "b": None, "v": 3, OP_COLUMN: "u"},
            ],
            schema,
        ),
        ["a", "b"],
        txn(0),
    )
    stats = sink.merge(
        T1,
        changes(
            [
                {"a": 1, "b": None, "v": 10, OP_COLUMN: "u"},  # matches (1, NULL) only, not (1, 'x')
                {"a": None, "b": None, OP_COLUMN: "d"},  # matches (NULL, NULL)
                {"a": None, "b": "x", "v": 5, OP_COLUMN: "u"},  # matches nothing: a new row
            ],
            schema,
        ),
        ["a", "b"],
        txn(1),
    )
    assert (stats.inserted, stats.updated, stats.deleted) == (1, 1, 1)
    assert rows_of(sink, T1, "v") == [
        {"a": 1, "b": "x", "v": 2},
        {"a": None, "b": "x", "v": 5},
        {"a": 1, "b": None, "v": 10},
    ]
    # changes without NULL key parts (compared with plain `=`) still never match a NULL target part
    stats = sink.merge(T1, changes([{"a": 1, "b": "x", "v": 20, OP_COLUMN: "u"}], schema), ["a", "b"], txn(2))
    assert (stats.inserted, stats.updated, stats.deleted) == (0, 1, 0)
    assert rows_of(sink, T1, "v") == [
        {"a": None, "b": "x", "v": 5},
        {"a": 1, "b": None, "v": 10},
        {"a": 1, "b": "x", "v": 20},
    ]


def test_an_empty_text_partition_value_of_the_key_still_matches_after_compaction(sink: DeltaRsSink) -> None:
    """A text partition column that is part of the key (TiDB requires the partition column in every unique key
    of a partitioned table) holding '': Delta's partition values cannot hold '' — delta-rs reads it back as ''
    until a rewrite (the job's compaction) makes it null, as Spark writes it. An update of that key inserted a
    second row after the rewrite, and a delete removed nothing."""
    from ticdc_delta.delta.compaction import CompactionPolicy, delta_rs_compaction

    schema = pa.schema([("region", pa.string()), ("id", pa.int64()), ("v", pa.string())])
    sink.ensure_table(T1, schema, ["region"], txn(0))
    assert sink.partition_columns(T1) == ("region",)
    keys = ["region", "id"]
    for i in range(4):  # small files in the '' partition
        sink.merge(T1, changes([{"region": "", "id": i, "v": f"v{i}", OP_COLUMN: "u"}], schema), keys, txn(i))
    sink.merge(T1, changes([{"region": "x", "id": 0, "v": "x0", OP_COLUMN: "u"}], schema), keys, txn(4))
    delta_rs_compaction(sink.table_path(*T1), sink.snapshot(T1), CompactionPolicy(min_files=2, target_file_size=1 << 20))
    assert {r["region"] for r in sink.read(T1).to_pylist()} == {None, "x"}  # '' is null once rewritten
    stats = sink.merge(T1, changes([{"region": "", "id": 0, "v": "new", OP_COLUMN: "u"},
                                    {"region": "", "id": 1, OP_COLUMN: "d"}], schema), keys, txn(5))
    assert (stats.inserted, stats.updated, stats.deleted) == (0, 1, 1)
    assert sorted((r["region"] or "", r["id"], r["v"]) for r in sink.read(T1).to_pylist()) == [
        ("", 0, "new"), ("", 2, "v2"), ("", 3, "v3"), ("x", 0, "x0")]
    # before any rewrite ('' read back as ''), and a NULL in the changes, match alike
    stats = sink.merge(T1, changes([{"region": None, "id": 2, "v": "n2", OP_COLUMN: "u"}], schema), keys, txn(6))
    assert (stats.inserted, stats.updated) == (0, 1)


def test_merge_casts_source_columns_to_the_table_types(items: DeltaRsSink) -> None:
    batch = pa.table(
        {"id": pa.array([9], pa.int32()), "v": pa.array([2], pa.int8()), OP_COLUMN: ["u"]}
    )
    items.merge(T1, batch, ["id"], txn(1))
    assert rows_of(items, T1, "id")[-1] == {"id": 9, "name": None, "v": 2.0}


def test_all_types_insert_update_delete(sink: DeltaRsSink) -> None:
    """The shared all-types events land and read back as the model values (Asia/Shanghai source zone)."""
    tz = "Asia/Shanghai"
    spec = {name: (tp, flags, ALL_TYPES_PARAMS.get(name)) for name, tp, flags, *_ in ALL_TYPES}
    schema = pa.schema([arrow_field_for(n, tp, f, p) for n, (tp, f, p) in spec.items()])
    ident = TableIdent(INSERT.schema, INSERT.table)
    sink.ensure_table(ident, schema, None, txn(0))

    def image_row(image: Any, op: str) -> dict[str, Any]:
        row = {c.name: convert_value(c.value, c.type, c.flags, spec[c.name][2], tz) for c in image}
        row[OP_COLUMN] = op
        return row

    def apply(event: RowChange, version: int) -> None:
        # What the caller's collapse does: an UPDATE that moves the key deletes the old key.
        rows = []
        if event.old is not None and (event.columns is None or event.old_values()["id"] != event.new_values()["id"]):
            rows.append(image_row(event.old, "d"))
        if event.columns is not None:
            rows.append(image_row(event.columns, "u"))
        sink.merge(ident, changes(rows, schema), ["id"], txn(version))

    def contents() -> list[dict[str, Any]]:
        return [
            {k: canonical_from_delta(v, *spec[k], tz=tz) for k, v in r.items()} for r in sink.read(ident).to_pylist()
        ]

    apply(INSERT, 1)
    assert contents() == [INSERT.new_values()]
    apply(UPDATE, 2)
    assert contents() == [UPDATE.new_values()]
    apply(DELETE, 3)
    assert contents() == []


def test_empty_changes_commit_nothing(items: DeltaRsSink) -> None:
    v = version(items, T1)
    assert items.merge(T1, changes([]), ["id"], txn(1)).version is None
    assert version(items, T1) == v


@pytest.mark.parametrize(
    "batch,keys,error,match",
    [
        (pa.table({"id": [1]}), ["id"], ValueError, f"{re.escape(repr(OP_COLUMN))} column"),
        (pa.table({"id": [1], OP_COLUMN: ["x"]}), ["id"], ValueError, "must be 'u' or 'd'"),
        (pa.table({"id": [1], OP_COLUMN: [None]}), ["id"], ValueError, "must be 'u' or 'd'"),
        (pa.table({"id": [1, 1], OP_COLUMN: ["u", "d"]}), ["id"], ValueError, "more than one row"),
        (pa.table({"id": [1], OP_COLUMN: ["u"]}), ["nope"], ValueError, "key column 'nope'"),
        (pa.table({"id": [1], OP_COLUMN: ["u"]}), [], ValueError, "at least one"),
        ([{"id": 1}], ["id"], TypeError, "pyarrow.Table"),
    ],
)
def test_merge_argument_checks(items: DeltaRsSink, batch: Any, keys: list[str], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        items.merge(T1, batch, keys, txn(1))


@pytest.mark.parametrize("bad", [("", 1), (APP, -1), (APP, "1")])
def test_txn_is_checked(items: DeltaRsSink, bad: tuple) -> None:
    with pytest.raises(ValueError, match="txn"):
        items.merge(T1, changes([{"id": 1, OP_COLUMN: "d"}]), ["id"], bad)  # type: ignore[arg-type]


def test_merge_into_a_missing_table_names_the_path(sink: DeltaRsSink) -> None:
    with pytest.raises(SinkError, match=r"no Delta table at .*/lake/shop/items"):
        sink.merge(T1, changes([{"id": 1, OP_COLUMN: "d"}]), ["id"], txn(1))


def test_table_facts_give_the_rows_and_each_files_key_statistics(sink: DeltaRsSink) -> None:
    """``table_facts``: the schema alone, or with the row count and a row per data file (its rows and its
    columns' least and greatest values, a partition column's value as both); :func:`rows_outside` counts the
    rows of the files a range misses."""
    from decimal import Decimal

    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("u", pa.decimal128(20, 0))])
    assert sink.table_facts(T1) is None
    sink.ensure_table(T1, schema, None, txn(0))
    for step, first in enumerate((1, 101, 201)):  # a file each: ids 1-100, 101-200, 201-250
        last = first + (49 if first == 201 else 99)
        sink.append(T1, pa.table({"id": list(range(first, last + 1)),
                                  "name": [f"k{i:03}" for i in range(first, last + 1)],
                                  "u": [Decimal(i) for i in range(first, last + 1)]}, schema=schema),
                    Txn(APP, step + 1))
    assert sink.table_facts(T1, stats=False) == (sink.table_schema(T1), None, None)
    facts = sink.table_facts(T1)
    assert facts.schema == sink.table_schema(T1) and facts.rows == sink.table_rows(T1) == 250
    files = sorted(zip(facts.files.column("num_records").to_pylist(), facts.files.column("min").to_pylist(),
                       facts.files.column("max").to_pylist()), key=lambda f: f[1]["id"])
    assert [(n, lo["id"], hi["id"], lo["name"], hi["u"]) for n, lo, hi in files] == [
        (100, 1, 100, "k001", Decimal(100)), (100, 101, 200, "k101", Decimal(200)), (50, 201, 250, "k201", Decimal(250))]

    assert rows_outside(facts.files, {"id": (150, 160)}) == 150
    assert rows_outside(facts.files, {"id": (100, 201)}) == 0  # every file holds a key of the range
    assert rows_outside(facts.files, {"u": (Decimal(1), Decimal(99))}) == 150
    assert rows_outside(facts.files, {"name": ("k150", "k160"), "id": (150, 250)}) == 150  # either range misses
    assert rows_outside(facts.files, {"id": (2**70, 2**71)}) == 0  # no int64: not comparable, kept inside
    assert rows_outside(facts.files, {"missing": (1, 2)}) == rows_outside(facts.files, {}) == 0
    no_stats = pa.table({"num_records": pa.array([7, None], pa.int64()),
                         "min": pa.array([None, None], pa.struct([("id", pa.int64())])),
                         "max": pa.array([None, None], pa.struct([("id", pa.int64())]))})
    assert rows_outside(no_stats, {"id": (1, 2)}) == 0  # files without statistics lie inside

    parted, by_region = TableIdent("shop", "regions"), pa.schema([("region", pa.string()), ("id", pa.int64())])
    sink.ensure_table(parted, by_region, ["region"], txn(0))
    sink.append(parted, pa.table({"region": ["eu", "eu", "us"], "id": [1, 2, 3]}, schema=by_region), txn(1))
    files = sink.table_facts(parted).files  # a partition's value is its files' least and greatest
    assert rows_outside(files, {"region": ("us", "us")}) == 2 and rows_outside(files, {"region": ("a", "z")}) == 0


def test_merge_of_an_unknown_column(items: DeltaRsSink) -> None:
    batch = pa.table({"id": [1], "extra": [1], OP_COLUMN: ["u"]})
    with pytest.raises(SinkError, match="column 'extra' is not in the table .*add_columns"):
        items.merge(T1, batch, ["id"], txn(1))


def test_merge_of_a_value_that_does_not_fit(items: DeltaRsSink) -> None:
    batch = pa.table({"id": ["not a number"], OP_COLUMN: ["u"]})
    with pytest.raises(SinkError, match=r"items: column 'id' \(string\) does not fit int64"):
        items.merge(T1, batch, ["id"], txn(1))


# --- concurrent commits ------------------------------------------------------------------------------


class RacingSink(DeltaRsSink):
    """Lets another (real) writer append row id 2 right after each snapshot is loaded, ``races`` times.

    A merge whose keys span id 2 has read the data the other writer adds, so delta-rs refuses its commit.
    """

    races = 0

    def _load(self, path: str) -> DeltaTable | None:
        dt = super()._load(path)
        if dt is not None and self.races:
            self.races -= 1
            write_deltalake(path, pa.table({"id": [2], "name": ["racer"], "v": [0.0]}, schema=SCHEMA), mode="append")
        return dt


def test_a_lost_commit_race_is_retried(tmp_path: Path) -> None:
    sink = RacingSink(str(tmp_path), retry_backoff_s=0.001)
    sink.ensure_table(T1, SCHEMA, None, txn(0))
    sink.merge(T1, changes([{"id": 1, "name": "a", "v": 1.0, OP_COLUMN: "u"}]), ["id"], txn(0))
    sink.races = 1
    batch = changes([{"id": 1, "name": "b", "v": 2.0, OP_COLUMN: "u"},
                     {"id": 3, "name": "c", "v": 3.0, OP_COLUMN: "u"}])
    stats = sink.merge(T1, batch, ["id"], txn(1))
    assert (stats.updated, stats.inserted, sink.races) == (1, 1, 0)
    assert rows_of(sink, T1, "id") == [
        {"id": 1, "name": "b", "v": 2.0},
        {"id": 2, "name": "racer", "v": 0.0},
        {"id": 3, "name": "c", "v": 3.0},
    ]


def test_losing_every_race_raises_concurrent_commit_error(tmp_path: Path) -> None:
    sink = RacingSink(str(tmp_path), max_retries=2, retry_backoff_s=0.001)
    sink.ensure_table(T1, SCHEMA, None, txn(0))
    sink.merge(T1, changes([{"id": 1, "name": "a", "v": 1.0, OP_COLUMN: "u"}]), ["id"], txn(0))
    sink.races = 100
    with pytest.raises(ConcurrentCommitError, match=r"merge into .*shop/items: lost to concurrent commits 3 times"):
        sink.merge(T1, changes([{"id": 1, OP_COLUMN: "d"}, {"id": 3, OP_COLUMN: "d"}]), ["id"], txn(1))
    assert sink.races == 97
    assert ConcurrentCommitError.retryable


# --- a table's own constraints -----------------------------------------------------------------------


@pytest.mark.parametrize("value", ["bad", "bad: 503 Service Unavailable", "bad, connection reset by peer"])
def test_a_check_constraint_refusing_a_row_is_terminal_whatever_the_row_says(items: DeltaRsSink, value: str) -> None:
    """Regression: delta-rs's refusal quotes the row's values, and a value that reads like a storage outage made
    it a StorageUnavailableError (exit 75: retried for ever)."""
    DeltaTable(items.table_path(*T1)).alter.add_constraint({"name_ok": "name NOT LIKE 'bad%'"})
    with pytest.raises(SinkError) as info:
        items.merge(T1, changes([{"id": 9, "name": value, "v": 0.0, OP_COLUMN: "u"}]), ["id"], txn(1))
    assert type(info.value) is SinkError and exit_code_for(info.value) == EXIT_TERMINAL
    assert f"merge into {items.table_path(*T1)} failed: a table constraint (a user's CHECK constraint, NOT NULL " \
           "column or generated column) refused a row" in str(info.value)
    assert "1 rows failed validation check" in str(info.value)
    assert not storage_unreachable(info.value.__cause__)  # type: ignore[arg-type]


def test_a_not_null_column_refusing_a_row_is_terminal(sink: DeltaRsSink) -> None:
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("region", pa.string(), nullable=False)])
    DeltaTable.create(sink.table_path(*T1), schema)
    with pytest.raises(SinkError, match=r"items failed: a table constraint .* refused a row") as info:
        sink.merge(T1, pa.table({"id": [1], OP_COLUMN: ["u"]}), ["id"], txn(1))
    assert type(info.value) is SinkError


# --- truncate / drop / append ------------------------------------------------------------------------


def test_overwrite_empty_truncates_once(items: DeltaRsSink) -> None:
    v = version(items, T1)
    assert items.overwrite_empty(T1, txn(1)) is True
    assert items.read(T1).num_rows == 0 and version(items, T1) == v + 1
    assert items.table_schema(T1) == SCHEMA
    assert items.overwrite_empty(T1, txn(1)) is False
    assert version(items, T1) == v + 1
    # a truncated (empty) table still gets a version for the next truncate
    assert items.overwrite_empty(T1, txn(2)) is True and version(items, T1) == v + 2


def test_truncate_then_rows_in_one_batch_use_steps(items: DeltaRsSink) -> None:
    items.overwrite_empty(T1, batch_txn(APP, 7, 0))
    items.merge(T1, changes([{"id": 9, "name": "after", "v": 0.0, OP_COLUMN: "u"}]), ["id"], batch_txn(APP, 7, 1))
    # the whole batch re-run: both steps are skipped
    assert items.overwrite_empty(T1, batch_txn(APP, 7, 0)) is False
    assert items.merge(T1, changes([{"id": 9, OP_COLUMN: "d"}]), ["id"], batch_txn(APP, 7, 1)).skipped
    assert rows_of(items, T1) == [{"id": 9, "name": "after", "v": 0.0}]


def test_batch_txn_packing() -> None:
    assert batch_txn(APP, 3, 2) == Txn(APP, 3 * STEPS_PER_BATCH + 2)
    assert batch_txn(APP, 3, STEPS_PER_BATCH - 1) < batch_txn(APP, 4, 0)
    with pytest.raises(ValueError, match="step"):
        batch_txn(APP, 1, STEPS_PER_BATCH)


def test_drop_and_recreate(items: DeltaRsSink) -> None:
    path = items.table_path(*T1)
    assert items.drop(T1) is True
    assert not os.path.exists(path) and items.table_schema(T1) is None
    assert items.drop(T1) is False
    assert items.ensure_table(T1, SCHEMA, None, txn(1)) is True
    assert items.read(T1).num_rows == 0


def test_overwrite_empty_of_a_missing_table(sink: DeltaRsSink) -> None:
    with pytest.raises(SinkError, match="no Delta table"):
        sink.overwrite_empty(T1, txn(1))


def test_append_creates_fills_and_is_idempotent(sink: DeltaRsSink) -> None:
    dead = TableIdent("_ticdc", "dead letters")
    first = pa.table({"topic": ["t"], "offset": pa.array([1], pa.int64()), "error": ["bad"]})
    assert sink.append(dead, first, txn(1)).inserted == 1
    assert sink.append(dead, first, txn(1)).skipped
    assert sink.append(dead, pa.table({"topic": ["t"], "offset": pa.array([2], pa.int32())}), txn(2)).inserted == 1
    assert rows_of(sink, dead, "offset") == [
        {"topic": "t", "offset": 1, "error": "bad"},
        {"topic": "t", "offset": 2, "error": None},
    ]


# --- the safe reader ---------------------------------------------------------------------------------


def test_read_table_gives_plain_types(items: DeltaRsSink) -> None:
    table = read_table(items.table_path(*T1))
    assert table.schema == SCHEMA  # string, not string_view
    assert read_table(items.table_path(*T1), columns=["id"]).column_names == ["id"]


def test_read_table_of_nothing(tmp_path: Path) -> None:
    with pytest.raises(SinkError, match="no Delta table at"):
        read_table(str(tmp_path / "nothing"))


def test_read_table_lets_the_process_exit_cleanly(items: DeltaRsSink) -> None:
    # delta-rs issue 2184: to_pyarrow_table() can abort the process at exit; read_table must not.
    code = (
        "import sys; from ticdc_delta.delta.sink import read_table; "
        "t = read_table(sys.argv[1]); print(t.num_rows)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, items.table_path(*T1)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(Path(__file__).resolve().parents[2]),
    )
    assert (done.returncode, done.stdout.strip()) == (0, "3"), done.stderr


@pytest.mark.integration
def test_merge_matches_bigint_unsigned_decimal_keys(tmp_path) -> None:
    """Regression: delta-rs 1.6.6 pruned away matching rows of decimal(20,0) keys near 2**64 with `=`."""
    from decimal import Decimal

    sink = DeltaRsSink(str(tmp_path))
    ident = TableIdent("s", "t")
    sink.ensure_table(ident, pa.schema([("id", pa.decimal128(20, 0)), ("v", pa.string())]), [], Txn("a", 1))
    keys = [Decimal(18446744073709523741 + 7 * i) for i in range(50)]
    typ = pa.decimal128(20, 0)
    sink.merge(ident, pa.table({"id": pa.array(keys, typ), "v": ["a"] * 50, OP_COLUMN: ["u"] * 50}), ["id"],
               Txn("a", 2))
    stats = sink.merge(
        ident,
        pa.table({"id": pa.array(keys[:10], typ), "v": ["c"] * 10, OP_COLUMN: ["u"] * 5 + ["d"] * 5}),
        ["id"],
        Txn("a", 3),
    )
    assert (stats.inserted, stats.updated, stats.deleted) == (0, 5, 5)
    rows = sink.read(ident).to_pylist()
    assert len(rows) == 45 and sorted(r["v"] for r in rows).count("c") == 5


def test_the_delta_rs_copy_streams_every_row_with_partitions_and_the_move_mark(tmp_path: Path) -> None:
    """RENAME TABLE on an object store (delta-rs engine) copies the table batch by batch: every row of
    every file arrives, in the source's partitioning, in one commit that records the move's mark."""
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    for part in range(3):  # several files, two partitions
        rows = pa.table({"id": pa.array(range(part * 1000, part * 1000 + 1000), pa.int64()),
                         "p": ["a" if part < 2 else "b"] * 1000, "v": [f"v{i}" for i in range(1000)]})
        write_deltalake(src, rows, mode="append", partition_by=["p"])
    DeltaRsSink(str(tmp_path)).copy_table(src, dst, moved_from(src))

    copied = DeltaTable(dst)
    assert copied.version() == 0 and copied.transaction_version(moved_from(src)) == 0
    assert copied.metadata().partition_columns == ["p"]
    got = sorted(read_table(dst).to_pylist(), key=lambda r: r["id"])
    assert got == sorted(read_table(src).to_pylist(), key=lambda r: r["id"]) and len(got) == 3000
    with pytest.raises(SinkError, match="no Delta table"):
        DeltaRsSink(str(tmp_path)).copy_table(str(tmp_path / "nothing"), str(tmp_path / "d2"), "app")


def test_clear_uncommitted_log_removes_only_a_killed_first_commits_temporary_files(tmp_path: Path) -> None:
    """What a process killed in a table's first commit leaves goes; a committed table, a missing log and a
    log holding anything but temporary files stay as they are (the latter with a clear error)."""
    sink = DeltaRsSink(str(tmp_path))
    ident = TableIdent("s", "t")
    log_dir = Path(sink.table_path(*ident)) / "_delta_log"
    assert not sink.clear_uncommitted_log(ident)  # no directory at all
    (log_dir / "_staged_commits").mkdir(parents=True)
    (log_dir / ".00000000000000000000.json.0b1c.tmp").write_text('{"commitInfo":')
    (log_dir / "..00000000000000000000.json.0b1c.tmp.crc").write_bytes(b"crc")
    assert sink.clear_uncommitted_log(ident)
    assert not log_dir.exists() and log_dir.parent.exists()

    (log_dir / "_staged_commits").mkdir(parents=True)
    (log_dir / ".00000000000000000000.json.0b1d.tmp").write_text("{")
    (log_dir / "_staged_commits" / "00000000000000000000.5e7f.json").write_text("{}")  # not ours to judge
    with pytest.raises(SinkError, match="cannot clear the uncommitted Delta log"):
        sink.clear_uncommitted_log(ident)
    assert (log_dir / "_staged_commits" / "00000000000000000000.5e7f.json").exists()

    committed = TableIdent("s", "u")
    assert sink.ensure_table(committed, pa.schema([pa.field("id", pa.int64())]), None, Txn("cf", 0))
    (Path(sink.table_path(*committed)) / "_delta_log" / ".00000000000000000001.json.0b1e.tmp").write_text("{")
    assert not sink.clear_uncommitted_log(committed)
    assert DeltaTable(sink.table_path(*committed)).version() == 0
    assert (Path(sink.table_path(*committed)) / "_delta_log" / ".00000000000000000001.json.0b1e.tmp").exists()


def test_renaming_or_dropping_a_partition_column_keeps_the_table_partitioned_by_what_is_left(sink: DeltaRsSink) -> None:
    """A rewrite kept the old partition columns by name: one renamed or dropped by the DDL made delta-rs
    refuse the write ("Partition column(s) not found in write schema") and stopped the job."""
    sink.ensure_table(T1, SCHEMA, ["name"], txn(0))
    sink.merge(T1, changes([{"id": i, "name": f"n{i % 2}", "v": float(i), OP_COLUMN: "u"} for i in (1, 2, 3)]),
               ["id"], txn(1))
    assert sink.rename_column(T1, "name", "label", txn(2))
    assert DeltaTable(sink.table_path(*T1)).metadata().partition_columns == ["label"]
    assert [r["label"] for r in rows_of(sink, T1, "id")] == ["n1", "n0", "n1"]
    assert sink.drop_column(T1, "label", txn(3))
    assert DeltaTable(sink.table_path(*T1)).metadata().partition_columns == []
    assert rows_of(sink, T1, "id") == [{"id": 1, "v": 1.0}, {"id": 2, "v": 2.0}, {"id": 3, "v": 3.0}]


def test_merge_keyed_by_a_vector_column(sink: DeltaRsSink) -> None:
    """Regression: a table without a key is keyed by all its columns, a VECTOR (``list<float32>``) one too;
    Arrow cannot group by a list (the duplicate-key check) and delta-rs 1.6.6 cannot prune by one (`=`)."""
    vec = pa.list_(pa.float32())
    ident = TableIdent("s", "keyless")
    sink.ensure_table(ident, pa.schema([("a", pa.int32()), ("emb", vec)]), None, txn(0))

    def rows(*items: tuple[int, list[float] | None, str]) -> pa.Table:
        a, emb, op = zip(*items)
        return pa.table({"a": pa.array(a, pa.int32()), "emb": pa.array(emb, vec), OP_COLUMN: list(op)})

    sink.merge(ident, rows((1, [1.0, 2.0], "u"), (1, [1.0, 3.0], "u"), (2, None, "u")), ["a", "emb"], txn(1))
    # the UPDATE of (1, [1, 2]) to (2, [1, 2]): delete the old row, insert the new one
    stats = sink.merge(ident, rows((1, [1.0, 2.0], "d"), (2, [1.0, 2.0], "u")), ["a", "emb"], txn(2))
    assert (stats.inserted, stats.deleted) == (1, 1)
    got = sorted(sink.read(ident).to_pylist(), key=lambda r: (r["a"], r["emb"] or []))
    assert got == [{"a": 1, "emb": [1.0, 3.0]}, {"a": 2, "emb": None}, {"a": 2, "emb": [1.0, 2.0]}]
    with pytest.raises(ValueError, match="more than one row for some key"):
        sink.merge(ident, rows((3, [1.0, 2.0], "u"), (3, [1.0, 2.0], "d")), ["a", "emb"], txn(3))
