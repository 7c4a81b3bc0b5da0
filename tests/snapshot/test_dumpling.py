"""Dumpling export format: the simulator writes it (CSV dialects, SQL, gzip), the reader reads back exactly
the values the stream would write; truncated and malformed files are typed errors naming the file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ticdc_delta.errors import SnapshotFormatError
from ticdc_delta.simulator.dumpling_export import write_dumpling_export
from ticdc_delta.simulator.scenario import Scenario
from ticdc_delta.snapshot.dumpling import (
    CsvDialect, data_file_batches, parse_csv, parse_metadata, parse_sql, read_export,
)
from ticdc_delta.verify import _expected

NASTY = 'q"uo\\te,\r\n\x00 \\N end'


def _scenario() -> Scenario:
    sc = Scenario("open-protocol", {}, partitions=1)
    sc.ddl("CREATE TABLE `s`.`w` (`id` BIGINT NOT NULL, `u` BIGINT UNSIGNED, `f` FLOAT, `dbl` DOUBLE, "
           "`d` DECIMAL(10,3), `dt` DATE, `tm` DATETIME(6), `ts` TIMESTAMP NULL, `ti` TIME, `y` YEAR, "
           "`e` ENUM('a','b'), `st` SET('x','y'), `j` JSON, `b` BLOB, `vb` VARBINARY(4), `bt` BIT(3), "
           "`c` CHAR(3), `tx` TEXT, PRIMARY KEY (`id`))")
    sc.insert("s", "w", id=1, u=18446744073709551615, f=0.1, dbl=-1e300, d="-1.5", dt="2024-02-29",
              tm="2024-01-01 00:00:00.000001", ts="2038-01-19 03:14:07", ti="-838:59:59", y=1901, e="b",
              st="x,y", j='{"k": [1, 2]}', b=b"\x00\x01\\\"\n,", vb=b"\xff", bt=5, c="ab", tx=NASTY)
    sc.insert("s", "w", id=2)
    sc.insert("s", "w", id=3, tx="\\N", b=b"\\N", dt="0000-00-00", e="a", st="")
    sc.ddl("CREATE TABLE `s`.`empty` (`id` INT NOT NULL, PRIMARY KEY (`id`))")
    sc.ddl("CREATE TABLE `s.x`.`t.y` (`id` INT NOT NULL, `v` VARCHAR(5), PRIMARY KEY (`id`))")
    sc.insert("s.x", "t.y", id=1, v="dot")
    return sc


def _load(path: Path, dialect: CsvDialect = CsvDialect()) -> dict[str, list[dict]]:
    export = read_export(str(path))
    out = {}
    for t in export.tables:
        rows = []
        for f in t.files:
            for batch in data_file_batches(f, t.columns, dialect=dialect, tz="UTC"):
                rows += batch.to_pylist()
        out[f"{t.schema}.{t.table}"] = sorted(rows, key=lambda r: r["id"])
    return out


@pytest.mark.parametrize("filetype,dialect,compress", [
    ("csv", CsvDialect(), False),
    ("csv", CsvDialect(binary_format="hex"), True),
    ("csv", CsvDialect(binary_format="base64", separator="|+"), False),
    ("csv", CsvDialect(escape_backslash=False, header=False), False),
    ("sql", CsvDialect(), False),
    ("sql", CsvDialect(), True),
])
def test_export_round_trip_gives_the_values_the_stream_writes(tmp_path: Path, filetype: str, dialect: CsvDialect,
                                                             compress: bool) -> None:
    sc = _scenario()
    tso = write_dumpling_export(sc, tmp_path, filetype=filetype, dialect=dialect, rows_per_file=2, compress=compress)
    assert read_export(str(tmp_path)).tso == tso == sc.last_ts
    got = _load(tmp_path, dialect)
    oracle = sc.oracle()
    assert sorted(got) == ["s.empty", "s.w", "s.x.t.y"]
    for name, table in oracle.tables.items():
        want = sorted(_expected(table, "UTC").values(), key=lambda r: r["id"])
        assert got[name] == want, name
    assert got["s.w"][0]["tx"] == NASTY and got["s.w"][2]["tx"] == "\\N" and got["s.w"][1]["tx"] is None


def test_metadata_positions() -> None:
    text = ("Started dump at: 2020-11-10 10:40:19\nSHOW MASTER STATUS:\n\tLog: tidb-binlog\n\tPos: 420747102018863124\n"
            "\tGTID:\n\nSHOW MASTER STATUS: /* AFTER CONNECTION POOL ESTABLISHED */\n\tLog: tidb-binlog\n"
            "\tPos: 420747102018863124\n\tGTID:\n\nFinished dump at: 2020-11-10 10:40:20\n")
    assert parse_metadata(text, "m") == 420747102018863124
    with pytest.raises(SnapshotFormatError, match="m: the snapshot positions disagree"):
        parse_metadata(text.replace("863124\n\tGTID:\n\nFinished", "863125\n\tGTID:\n\nFinished"), "m")
    with pytest.raises(SnapshotFormatError, match="exp/metadata: expected a 'SHOW MASTER STATUS:'"):
        parse_metadata("Started dump at: x\n", "exp/metadata")
    with pytest.raises(SnapshotFormatError, match="is this an export of TiDB"):
        parse_metadata("SHOW MASTER STATUS:\n\tLog: ON.000001\n\tPos: 7502x\n", "m")


def test_bad_files_are_typed_errors_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(SnapshotFormatError, match="f.csv: line 2: a value opened with '\"' at byte 12 is never closed"):
        parse_csv(b'"id","v"\r\n1,"abc', CsvDialect(), "f.csv")
    with pytest.raises(SnapshotFormatError, match="f.csv: line 2: the last row does not end with a line terminator"):
        parse_csv(b'"id","v"\r\n1,"abc"', CsvDialect(), "f.csv")
    with pytest.raises(SnapshotFormatError, match="f.csv: line 2: expected 2 fields, found 1"):
        parse_csv(b'"id","v"\r\n1\r\n', CsvDialect(), "f.csv")
    with pytest.raises(SnapshotFormatError, match="f.sql: .*truncated"):
        parse_sql(b"INSERT INTO `t` VALUES\n(1,'a'),\n(2,'b", "f.sql")
    assert parse_sql(b"/*!40101 SET NAMES binary*/;\nINSERT INTO `t` (`a`,`b`) VALUES\n(1,x''),\n(NULL,'it''s\\n');\n",
                     "f.sql") == (["a", "b"], [[b"1", b""], [None, b"it's\n"]])
    # --escape-backslash=false: a backslash is itself (a Windows path), a quote is doubled
    plain = b"INSERT INTO `t` VALUES\n(1,'C:\\new\\temp'),\n(2,'a\\tb''\\');\n"
    assert parse_sql(plain, "f.sql", escape_backslash=False) == (None, [[b"1", b"C:\\new\\temp"],
                                                                        [b"2", b"a\\tb'\\"]])

    sc = _scenario()
    write_dumpling_export(sc, tmp_path / "ok")
    (tmp_path / "ok" / "metadata").unlink()
    with pytest.raises(SnapshotFormatError, match=r"ok/metadata: missing"):
        read_export(str(tmp_path / "ok"))
    write_dumpling_export(sc, tmp_path / "bad")
    (tmp_path / "bad" / "s.w-schema.sql").write_text("CREATE TABLE `w` (`id` INT NOT NULL,")
    with pytest.raises(SnapshotFormatError, match=r"bad/s.w-schema.sql: expected one CREATE TABLE"):
        read_export(str(tmp_path / "bad"))


def test_metadata_columns_are_constant_per_snapshot_row(tmp_path: Path) -> None:
    import pyarrow as pa

    write_dumpling_export(_scenario(), tmp_path, filetype="sql")
    t = next(t for t in read_export(str(tmp_path)).tables if t.table == "w")
    extra = [(pa.field("_tidb_commit_ts", pa.int64()), 77), (pa.field("_tidb_op", pa.string()), "insert")]
    batches = [b for f in t.files for b in data_file_batches(f, t.columns, dialect=CsvDialect(), tz="UTC", extra=extra)]
    rows = [r for b in batches for r in b.to_pylist()]
    assert len(rows) == 3 and {(r["_tidb_commit_ts"], r["_tidb_op"]) for r in rows} == {(77, "insert")}
    assert batches[0].schema.names[-2:] == ["_tidb_commit_ts", "_tidb_op"]


def test_a_column_the_file_leaves_out_is_an_error_unless_generated(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """A column of the schema file without values in the data file was loaded as NULL; Dumpling leaves out
    only generated columns (those load as NULL, with a warning: TiCDC sends the STORED ones)."""
    from ticdc_delta.delta.arrow_types import TypeParams
    from ticdc_delta.snapshot.dumpling import DataFile, SnapshotColumn

    cols = [SnapshotColumn("id", 8, 0, TypeParams()), SnapshotColumn("a", 3, 0, TypeParams()),
            SnapshotColumn("g", 3, 0, TypeParams(), generated=True)]
    data = tmp_path / "s.t.000000000.csv"
    data.write_bytes(b'"id","g"\r\n1,2\r\n')
    with pytest.raises(SnapshotFormatError, match=r"no values for columns \['a'\] of the table's schema file"):
        list(data_file_batches(DataFile(str(data), data.stat().st_size, "csv"), cols, dialect=CsvDialect(), tz="UTC"))
    data.write_bytes(b'"id","a"\r\n1,2\r\n')
    (batch,) = data_file_batches(DataFile(str(data), data.stat().st_size, "csv"), cols, dialect=CsvDialect(), tz="UTC")
    assert batch.to_pylist() == [{"id": 1, "a": 2, "g": None}]
    assert "generated column(s) ['g'] are not in the export" in caplog.text


def test_a_virtual_generated_column_gets_no_column(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """TiCDC never sends a VIRTUAL generated column, so the stream's DDL gives it no Delta column: nor does
    the snapshot, and a unique key over one is no handle key (Dumpling's files leave out every generated
    column; a STORED one loads as NULL until its row changes)."""
    (tmp_path / "metadata").write_text("SHOW MASTER STATUS:\n\tLog: tidb-binlog\n\tPos: 446000000000000000\n")
    (tmp_path / "s.t-schema.sql").write_text(
        "CREATE TABLE `t` (\n  `id` int NOT NULL,\n  `a` int DEFAULT NULL,\n"
        "  `v` int GENERATED ALWAYS AS ((`a` * 2)) VIRTUAL NOT NULL,\n"
        "  `g` int GENERATED ALWAYS AS ((`a` + 1)) STORED,\n  UNIQUE KEY `uv` (`v`),\n  UNIQUE KEY `ui` (`id`)\n)")
    (tmp_path / "s.t.000000000.csv").write_bytes(b'"id","a"\r\n1,2\r\n')
    (t,) = read_export(str(tmp_path)).tables
    assert [c.name for c in t.columns] == ["id", "a", "g"] and t.key == ("id",)
    (batch,) = data_file_batches(t.files[0], t.columns, dialect=CsvDialect(), tz="UTC")
    assert batch.to_pylist() == [{"id": 1, "a": 2, "g": None}]
    assert "generated column(s) ['g'] are not in the export" in caplog.text


def _dumpling_file_name(name: str) -> str:
    """``name`` as Dumpling's output file name template writes it (its ``fn``, ``filenameEscapeRegexp``:
    ``[\\x00-\\x1f%"*./:<>?\\\\|]|-(?i:schema)`` → ``%XX`` of the match's first byte, then the rest)."""
    return re.sub(r'[\x00-\x1f%"*./:<>?\\|]|-(?i:schema)', lambda m: f"%{ord(m[0][0]):02X}{m[0][1:]}", name)


ESCAPED_NAMES = [
    ("my.db", "t"), ("100%", "a.b"), ("x-schema", "t-Schema"), ("X-SCHEMA.v2", "100%"), ("数据.库", "é"),
    ("a%2E", "t"), ('q"*:<>?|\\/\t', "t"), ("plain", "t.2"),
]


def test_escaped_file_names_give_the_names_back(tmp_path: Path) -> None:
    """Dumpling escapes ``.``, ``%``, ``-schema``... in the names of its files: the database is the unescaped
    name (``my%2Edb`` is database ``my.db``; read raw, the rows and the snapshot TSO went to a table the
    stream never writes), each table gets its own files, and a ``%2E`` that is part of a name stays."""
    assert _dumpling_file_name("my.db") == "my%2Edb" and _dumpling_file_name("x-schema") == "x%2Dschema"
    assert _dumpling_file_name("数据.库") == "数据%2E库" and _dumpling_file_name("a%2E") == "a%252E"
    (tmp_path / "metadata").write_text("SHOW MASTER STATUS:\n\tLog: tidb-binlog\n\tPos: 446000000000000000\n")
    for i, (db, table) in enumerate(ESCAPED_NAMES):
        stem = f"{_dumpling_file_name(db)}.{_dumpling_file_name(table)}"
        (tmp_path / f"{_dumpling_file_name(db)}-schema-create.sql").write_text(f"CREATE DATABASE `{db}`;\n")
        (tmp_path / f"{stem}-schema.sql").write_text(f"CREATE TABLE `{table}` (`id` int NOT NULL, PRIMARY KEY (`id`));\n")
        (tmp_path / f"{stem}.000000000.csv").write_bytes(f'"id"\r\n{i}\r\n'.encode())
    got = {(t.schema, t.table): [r["id"] for r in batch.to_pylist()]
           for t in read_export(str(tmp_path)).tables for f in t.files
           for batch in data_file_batches(f, t.columns, dialect=CsvDialect(), tz="UTC")}
    assert got == {names: [i] for i, names in enumerate(ESCAPED_NAMES)}


def test_columns_tidb_keeps_apart_get_their_own_values(tmp_path: Path) -> None:
    """A data file's columns are matched to the schema file's in TiDB's case (Go's ``strings.ToLower``):
    ``ΟΔΟΣ`` and ``οδος`` are two columns of one TiDB table (Python's lower() takes both for ``οδος``)."""
    (tmp_path / "metadata").write_text("SHOW MASTER STATUS:\n\tLog: tidb-binlog\n\tPos: 446000000000000000\n")
    (tmp_path / "s.t-schema.sql").write_text(
        "CREATE TABLE `t` (`id` int NOT NULL, `ΟΔΟΣ` int NOT NULL, `οδος` int, UNIQUE KEY `u` (`οδος`), "
        "UNIQUE KEY `i` (`id`))")
    (tmp_path / "s.t.000000000.csv").write_bytes('"οδος","id","ΟΔΟΣ"\r\n3,1,2\r\n'.encode())
    (t,) = read_export(str(tmp_path)).tables
    assert t.key == ("id",)  # (`οδος` may be NULL: no handle key)
    (batch,) = data_file_batches(t.files[0], t.columns, dialect=CsvDialect(), tz="UTC")
    assert batch.to_pylist() == [{"id": 1, "ΟΔΟΣ": 2, "οδος": 3}]
