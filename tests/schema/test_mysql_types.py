"""MySQL column type texts and sqlglot DataType nodes -> ColumnType (TiCDC type code, flags, parameters)."""

from __future__ import annotations

import pickle

import pytest
import sqlglot
from hypothesis import given, settings, strategies as st

from ticdc_delta.codec.model import ColumnFlag as F, TypeCode as T
from ticdc_delta.schema.mysql_types import (
    ColumnType,
    TiDBDialect,
    UnsupportedColumnTypeError,
    column_type_from_sqlglot,
    parse_column_type,
    quote_string,
)

U, B = F.UNSIGNED, F.BINARY

# (type text, expected ColumnType, canonical text from ColumnType.sql())
CASES: list[tuple[str, ColumnType, str]] = [
    # integers: display width is the length; UNSIGNED/ZEROFILL set the unsigned flag
    ("bigint(20) unsigned", ColumnType(T.BIGINT, "bigint", U, length=20), "bigint(20) unsigned"),
    ("BIGINT(20) UNSIGNED ZEROFILL", ColumnType(T.BIGINT, "bigint", U, length=20), "bigint(20) unsigned"),
    ("int(11) zerofill", ColumnType(T.INT, "int", U, length=11), "int(11) unsigned"),
    ("int", ColumnType(T.INT, "int"), "int"),
    ("integer", ColumnType(T.INT, "int"), "int"),
    ("int signed", ColumnType(T.INT, "int"), "int"),
    ("tinyint(1)", ColumnType(T.TINYINT, "tinyint", length=1), "tinyint(1)"),
    ("tinyint unsigned", ColumnType(T.TINYINT, "tinyint", U), "tinyint unsigned"),
    ("bool", ColumnType(T.TINYINT, "tinyint", length=1), "tinyint(1)"),
    ("boolean", ColumnType(T.TINYINT, "tinyint", length=1), "tinyint(1)"),
    ("smallint(6)", ColumnType(T.SMALLINT, "smallint", length=6), "smallint(6)"),
    ("mediumint(8) unsigned", ColumnType(T.MEDIUMINT, "mediumint", U, length=8), "mediumint(8) unsigned"),
    ("serial", ColumnType(T.BIGINT, "bigint", U), "bigint unsigned"),
    # sqlglot spellings TiDBDialect corrects: INT8 is BIGINT, INT3/MIDDLEINT MEDIUMINT, REAL DOUBLE
    ("int1", ColumnType(T.TINYINT, "tinyint"), "tinyint"),
    ("int2", ColumnType(T.SMALLINT, "smallint"), "smallint"),
    ("int3", ColumnType(T.MEDIUMINT, "mediumint"), "mediumint"),
    ("middleint", ColumnType(T.MEDIUMINT, "mediumint"), "mediumint"),
    ("int4", ColumnType(T.INT, "int"), "int"),
    ("int8", ColumnType(T.BIGINT, "bigint"), "bigint"),
    # fixed and floating point
    ("decimal(10,4)", ColumnType(T.DECIMAL, "decimal", precision=10, scale=4), "decimal(10,4)"),
    ("decimal", ColumnType(T.DECIMAL, "decimal", precision=10, scale=0), "decimal(10,0)"),
    ("decimal(5)", ColumnType(T.DECIMAL, "decimal", precision=5, scale=0), "decimal(5,0)"),
    # MySQL and TiDB make a zero precision (and scale) the default DECIMAL(10,0)
    ("decimal(0)", ColumnType(T.DECIMAL, "decimal", precision=10, scale=0), "decimal(10,0)"),
    # FLOAT UNSIGNED (deprecated in MySQL, kept by TiDB; sqlglot has no unsigned FLOAT): a FLOAT
    ("float unsigned", ColumnType(T.FLOAT, "float"), "float"),
    ("decimal(0,0)", ColumnType(T.DECIMAL, "decimal", precision=10, scale=0), "decimal(10,0)"),
    ("decimal(65,30) unsigned", ColumnType(T.DECIMAL, "decimal", U, precision=65, scale=30), "decimal(65,30) unsigned"),
    ("numeric(6,2)", ColumnType(T.DECIMAL, "decimal", precision=6, scale=2), "decimal(6,2)"),
    ("dec(3,1)", ColumnType(T.DECIMAL, "decimal", precision=3, scale=1), "decimal(3,1)"),
    ("fixed(3,1)", ColumnType(T.DECIMAL, "decimal", precision=3, scale=1), "decimal(3,1)"),
    ("float", ColumnType(T.FLOAT, "float"), "float"),
    ("float(7,3)", ColumnType(T.FLOAT, "float", precision=7, scale=3), "float(7,3)"),
    ("float(24)", ColumnType(T.FLOAT, "float"), "float"),
    ("float(25)", ColumnType(T.DOUBLE, "double"), "double"),
    ("double", ColumnType(T.DOUBLE, "double"), "double"),
    ("double precision", ColumnType(T.DOUBLE, "double"), "double"),
    ("real", ColumnType(T.DOUBLE, "double"), "double"),
    ("double(10,2) unsigned", ColumnType(T.DOUBLE, "double", U, precision=10, scale=2), "double(10,2) unsigned"),
    # dates and times: fsp defaults to 0
    ("date", ColumnType(T.DATE, "date"), "date"),
    ("datetime", ColumnType(T.DATETIME, "datetime", fsp=0), "datetime"),
    ("datetime(6)", ColumnType(T.DATETIME, "datetime", fsp=6), "datetime(6)"),
    ("timestamp", ColumnType(T.TIMESTAMP, "timestamp", fsp=0), "timestamp"),
    ("timestamp(3)", ColumnType(T.TIMESTAMP, "timestamp", fsp=3), "timestamp(3)"),
    ("time(2)", ColumnType(T.TIME, "time", fsp=2), "time(2)"),
    ("year", ColumnType(T.YEAR, "year", U), "year"),  # TiDB: YEAR is zerofill, hence unsigned
    ("year(4)", ColumnType(T.YEAR, "year", U, length=4), "year(4)"),
    # strings: CHAR is STRING (254), VARCHAR is VARCHAR (15); BINARY/VARBINARY add the binary flag
    ("varchar(16)", ColumnType(T.VARCHAR, "varchar", length=16), "varchar(16)"),
    ("character varying(4)", ColumnType(T.VARCHAR, "varchar", length=4), "varchar(4)"),
    ("char", ColumnType(T.STRING, "char", length=1), "char(1)"),
    ("char(3)", ColumnType(T.STRING, "char", length=3), "char(3)"),
    ("nchar(3)", ColumnType(T.STRING, "char", length=3), "char(3)"),
    ("national varchar(5)", ColumnType(T.VARCHAR, "varchar", length=5), "varchar(5)"),
    ("binary(4)", ColumnType(T.STRING, "binary", B, length=4, charset="binary"), "binary(4)"),
    ("binary", ColumnType(T.STRING, "binary", B, length=1, charset="binary"), "binary(1)"),
    ("varbinary(8)", ColumnType(T.VARCHAR, "varbinary", B, length=8, charset="binary"), "varbinary(8)"),
    # CHAR(n) BINARY is text with a binary collation, not a binary string
    ("char(3) binary", ColumnType(T.STRING, "char", length=3), "char(3)"),
    (
        "char(3) character set utf8mb4 binary",
        ColumnType(T.STRING, "char", length=3, charset="utf8mb4", collation="utf8mb4_bin"),
        "char(3) character set utf8mb4 collate utf8mb4_bin",
    ),
    # the binary charset makes a binary string
    ("varchar(10) charset binary", ColumnType(T.VARCHAR, "varbinary", B, length=10, charset="binary"), "varbinary(10)"),
    ("char(2) character set binary", ColumnType(T.STRING, "binary", B, length=2, charset="binary"), "binary(2)"),
    ("text charset binary", ColumnType(T.BLOB, "blob", B, charset="binary"), "blob"),
    (
        "varchar(10) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
        ColumnType(T.VARCHAR, "varchar", length=10, charset="utf8mb4", collation="utf8mb4_bin"),
        "varchar(10) character set utf8mb4 collate utf8mb4_bin",
    ),
    ("varchar(10) collate utf8mb4_general_ci", ColumnType(T.VARCHAR, "varchar", length=10, collation="utf8mb4_general_ci"), "varchar(10) collate utf8mb4_general_ci"),
    ("char(2) character set latin1", ColumnType(T.STRING, "char", length=2, charset="latin1"), "char(2) character set latin1"),
    # TEXT and BLOB share the four blob codes
    ("tinytext", ColumnType(T.TINYBLOB, "tinytext"), "tinytext"),
    ("text", ColumnType(T.BLOB, "text"), "text"),
    ("mediumtext", ColumnType(T.MEDIUMBLOB, "mediumtext"), "mediumtext"),
    ("longtext", ColumnType(T.LONGBLOB, "longtext"), "longtext"),
    ("long varchar", ColumnType(T.MEDIUMBLOB, "mediumtext"), "mediumtext"),
    ("long", ColumnType(T.MEDIUMBLOB, "mediumtext"), "mediumtext"),
    ("tinyblob", ColumnType(T.TINYBLOB, "tinyblob", B, charset="binary"), "tinyblob"),
    ("blob", ColumnType(T.BLOB, "blob", B, charset="binary"), "blob"),
    ("mediumblob", ColumnType(T.MEDIUMBLOB, "mediumblob", B, charset="binary"), "mediumblob"),
    ("longblob", ColumnType(T.LONGBLOB, "longblob", B, charset="binary"), "longblob"),
    ("long varbinary", ColumnType(T.MEDIUMBLOB, "mediumblob", B, charset="binary"), "mediumblob"),
    # TEXT(n)/BLOB(n): the smallest type holding n characters (utf8mb4: 4 bytes each by default)
    ("text(63)", ColumnType(T.TINYBLOB, "tinytext", length=63), "tinytext"),
    ("text(64)", ColumnType(T.BLOB, "text", length=64), "text"),
    ("text(255) character set latin1", ColumnType(T.TINYBLOB, "tinytext", length=255, charset="latin1"), "tinytext character set latin1"),
    ("blob(255)", ColumnType(T.TINYBLOB, "tinyblob", B, length=255, charset="binary"), "tinyblob"),
    ("blob(70000)", ColumnType(T.MEDIUMBLOB, "mediumblob", B, length=70000, charset="binary"), "mediumblob"),
    ("blob(16777216)", ColumnType(T.LONGBLOB, "longblob", B, length=16777216, charset="binary"), "longblob"),
    # ENUM / SET members, quotes and escapes resolved
    ("enum('a','b,c')", ColumnType(T.ENUM, "enum", members=("a", "b,c")), "enum('a','b,c')"),
    ("ENUM('it''s','x\\'y','a\\\\b','')", ColumnType(T.ENUM, "enum", members=("it's", "x'y", "a\\b", "")), "enum('it''s','x''y','a\\\\b','')"),
    ('enum("dq","it\'s")', ColumnType(T.ENUM, "enum", members=("dq", "it's")), "enum('dq','it''s')"),
    ("set('x','y')", ColumnType(T.SET, "set", members=("x", "y")), "set('x','y')"),
    # trailing spaces of members are deleted when the table is made (leading ones stay), but for binary
    ("enum('small ','large')", ColumnType(T.ENUM, "enum", members=("small", "large")), "enum('small','large')"),
    ("set('red  ',' blue')", ColumnType(T.SET, "set", members=("red", " blue")), "set('red',' blue')"),
    ("enum('a ') character set binary", ColumnType(T.ENUM, "enum", members=("a ",), charset="binary"), "enum('a ')"),
    ("set('测试','表')", ColumnType(T.SET, "set", members=("测试", "表")), "set('测试','表')"),
    (
        "enum('A','B') CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
        ColumnType(T.ENUM, "enum", members=("A", "B"), charset="utf8mb4", collation="utf8mb4_bin"),
        "enum('A','B')",
    ),
    # BIT is unsigned, length 1 by default; JSON; GEOMETRY
    ("bit(64)", ColumnType(T.BIT, "bit", U, length=64), "bit(64)"),
    ("bit", ColumnType(T.BIT, "bit", U, length=1), "bit(1)"),
    ("json", ColumnType(T.JSON, "json"), "json"),
    ("geometry", ColumnType(T.GEOMETRY, "geometry"), "geometry"),
    # TiDB 8.4+ VECTOR: the dimension, when given, is the length
    ("vector(3)", ColumnType(T.VECTOR_FLOAT32, "vector", length=3), "vector(3)"),
    ("VECTOR", ColumnType(T.VECTOR_FLOAT32, "vector"), "vector"),
]


@pytest.mark.parametrize(("text", "expected", "canonical"), CASES, ids=[c[0] for c in CASES])
def test_parse_column_type(text: str, expected: ColumnType, canonical: str) -> None:
    parsed = parse_column_type(text)
    assert parsed == expected
    assert parsed.sql() == canonical
    # the canonical text parses back to the same type (charset/collation of ENUM are not printed)
    if expected.type_code not in (T.ENUM, T.SET) or not expected.charset:
        assert parse_column_type(canonical).type_code == expected.type_code
        assert parse_column_type(canonical).flags == expected.flags


@pytest.mark.parametrize(("text", "expected", "canonical"), CASES, ids=[c[0] for c in CASES])
def test_column_type_from_sqlglot_node(text: str, expected: ColumnType, canonical: str) -> None:
    create = sqlglot.parse_one(f"CREATE TABLE t (c {text} NOT NULL DEFAULT NULL)", read=TiDBDialect)
    column = create.this.expressions[0]
    assert column_type_from_sqlglot(column.args["kind"], column.args.get("constraints") or []) == expected


def test_flags_and_properties() -> None:
    assert parse_column_type("int unsigned").unsigned
    assert not parse_column_type("int").unsigned
    assert parse_column_type("varbinary(3)").binary
    assert not parse_column_type("varchar(3)").binary
    assert not parse_column_type("char(3) binary").binary


def test_shared_all_types_table_matches_type_codes() -> None:
    from tests.codec.cases import ALL_TYPES

    for name, code, flags, mysql_type, _v1, _v2 in ALL_TYPES:
        if mysql_type in ("enum", "set"):
            mysql_type += "('a','b')"
        parsed = parse_column_type(mysql_type)
        assert parsed.type_code == code, name
        assert bool(parsed.flags & F.BINARY) == bool(flags & F.BINARY), name
        if code not in (T.YEAR,):
            assert bool(parsed.flags & F.UNSIGNED) == bool(flags & F.UNSIGNED), name


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "expected a column type text"),
        ("   ", "expected a column type text"),
        ("inet", "unsupported column type 'INET'"),
        ("int not null", "more than a column type: 'NOT NULL'"),
        ("int default 1", "more than a column type"),
        ("int, b int", "not a single MySQL column type"),
        ("int) ; drop table x; create table y (a int", "not a single MySQL column type"),
        ("varchar(", "not a MySQL column type"),
        ("no_such_type(3)", "not a MySQL column type"),
    ],
)
def test_parse_column_type_rejects(text: str, match: str) -> None:
    with pytest.raises(UnsupportedColumnTypeError, match=match):
        parse_column_type(text)


def test_rejects_non_string() -> None:
    with pytest.raises(UnsupportedColumnTypeError, match="expected a column type text"):
        parse_column_type(None)  # type: ignore[arg-type]


def test_unsupported_error_is_value_error() -> None:
    assert issubclass(UnsupportedColumnTypeError, ValueError)


def test_quote_string() -> None:
    assert quote_string("it's") == "'it''s'"
    assert quote_string("a\\b") == "'a\\\\b'"
    assert quote_string("") == "''"


def test_column_type_is_frozen_and_picklable() -> None:
    ct = parse_column_type("enum('a','b')")
    with pytest.raises(AttributeError):
        ct.length = 3  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(ct)) == ct
    assert hash(ct) == hash(parse_column_type("enum('a','b')"))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=8), min_size=1, max_size=5))
def test_enum_members_round_trip(members: list[str]) -> None:
    """Any member text, quoted the MySQL way, parses back to itself (less its trailing spaces, which MySQL
    and TiDB delete)."""
    text = "enum(" + ",".join(quote_string(m) for m in members) + ")"
    assert parse_column_type(text).members == tuple(m.rstrip(" ") for m in members)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_arbitrary_text_is_a_type_or_value_error(text: str) -> None:
    try:
        parsed = parse_column_type(text)
    except UnsupportedColumnTypeError:
        return
    assert isinstance(parsed, ColumnType)
