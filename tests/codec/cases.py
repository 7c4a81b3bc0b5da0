"""Shared codec cases (after TiCDC's ``CodecRowCases``): one table with every column type, and events
over it that every protocol must carry. Used by the per-protocol tests and the round-trip tests.
"""

from __future__ import annotations

from ticdc_delta.codec.model import (
    Column,
    ColumnFlag as F,
    DDLEvent,
    DDLType,
    DecodeContext,
    Op,
    ResolvedEvent,
    RowChange,
    TypeCode as T,
)

CTX = DecodeContext("tidb-cdc", 0, 7)

KEY = F.HANDLE_KEY | F.PRIMARY_KEY
N = F.NULLABLE
U = F.UNSIGNED | F.NULLABLE
B = F.BINARY | F.NULLABLE

# (name, type code, flags, mysql type name as Canal-JSON's mysqlType writes it, value in row 1, value in row 2)
ALL_TYPES: list[tuple[str, int, F, str, object, object]] = [
    ("id", T.BIGINT, KEY, "bigint", 1, 2),
    ("c_tinyint", T.TINYINT, N, "tinyint", -128, 127),
    ("c_tinyint_u", T.TINYINT, U, "tinyint unsigned", 255, 0),
    ("c_smallint", T.SMALLINT, N, "smallint", -32768, 32767),
    ("c_mediumint", T.MEDIUMINT, N, "mediumint", -8388608, 8388607),
    ("c_int", T.INT, N, "int", -2147483648, 2147483647),
    ("c_int_u", T.INT, U, "int unsigned", 4294967295, 0),
    ("c_bigint", T.BIGINT, N, "bigint", -9223372036854775808, 9223372036854775807),
    ("c_bigint_u", T.BIGINT, U, "bigint unsigned", 18446744073709551615, 9223372036854775808),
    ("c_float", T.FLOAT, N, "float", 3.5, -0.25),
    ("c_double", T.DOUBLE, N, "double", 153.123, -1e-300),
    ("c_decimal", T.DECIMAL, N, "decimal", "129012.1230000", "-0.0000001"),
    ("c_date", T.DATE, N, "date", "2000-01-01", "9999-12-31"),
    ("c_datetime", T.DATETIME, N, "datetime", "2015-12-20 23:58:58", "1000-01-01 00:00:00.123456"),
    ("c_timestamp", T.TIMESTAMP, N, "timestamp", "1973-12-30 15:30:00", "2038-01-19 03:14:07"),
    ("c_time", T.TIME, N, "time", "23:59:59", "-838:59:59"),
    ("c_year", T.YEAR, N, "year", 1970, 2155),
    ("c_varchar", T.VARCHAR, N, "varchar", "测试", "it's \"quoted\" \\ <&>"),
    ("c_char", T.STRING, N, "char", "abc", ""),
    ("c_varbinary", T.VARCHAR, B, "varbinary", bytes([5, 7, 10, 15, 36, 50, 43, 99, 120, 60, 38, 255, 254, 45, 55, 70]), b""),
    ("c_binary", T.STRING, B, "binary", b"\x89PNG\r\n\x1a\n", b"\x00\x00"),
    ("c_tinytext", T.TINYBLOB, N, "tinytext", "测试text", "t"),
    ("c_text", T.BLOB, N, "text", "long text\nwith newline", ""),
    ("c_mediumtext", T.MEDIUMBLOB, N, "mediumtext", "m", "mm"),
    ("c_longtext", T.LONGBLOB, N, "longtext", "l", "ll"),
    ("c_tinyblob", T.TINYBLOB, B, "tinyblob", b"\x00\x01\xff", b"x"),
    ("c_blob", T.BLOB, B, "blob", bytes(range(256)), b""),
    ("c_mediumblob", T.MEDIUMBLOB, B, "mediumblob", b"\xfe", b"\xfd"),
    ("c_longblob", T.LONGBLOB, B, "longblob", b"\x80", b"\x81"),
    ("c_json", T.JSON, N, "json", '{"key1": "value1"}', "[1, 2.5, null]"),
    ("c_enum", T.ENUM, N, "enum", 1, 3),
    ("c_set", T.SET, N, "set", 3, 0),
    ("c_bit", T.BIT, U, "bit", 81, 18446744073709551615),
    ("c_null", T.VARCHAR, N, "varchar", None, None),
]


def image(row: int, names: set[str] | None = None) -> tuple[Column, ...]:
    """Row image ``row`` (1 or 2) of the all-types table, optionally only some columns."""
    out = []
    for name, tp, flags, _mysql, v1, v2 in ALL_TYPES:
        if names is None or name in names:
            out.append(Column(name, int(tp), flags, v1 if row == 1 else v2))
    return tuple(out)


SCHEMA, TABLE = "test", "all_types"
TS1, TS2, TS3 = 415508878783938562, 415508881418485761, 415508881418485770

INSERT = RowChange(TS1, SCHEMA, TABLE, Op.INSERT, image(1), None)
UPDATE = RowChange(TS2, SCHEMA, TABLE, Op.UPDATE, image(2), image(1))
DELETE = RowChange(TS3, SCHEMA, TABLE, Op.DELETE, None, image(2))
DELETE_KEY_ONLY = RowChange(TS3, SCHEMA, TABLE, Op.DELETE, None, image(2, {"id"}))
CREATE = DDLEvent(
    TS1 - 10,
    SCHEMA,
    TABLE,
    "CREATE TABLE `test`.`all_types` (`id` BIGINT PRIMARY KEY, `c_varchar` VARCHAR(16))",
    int(DDLType.CREATE_TABLE),
)
DROP_DB = DDLEvent(TS1 - 20, "test", "", "DROP DATABASE IF EXISTS `test`", int(DDLType.DROP_SCHEMA))
RESOLVED = ResolvedEvent(TS3 + 1)

ROW_EVENTS = [INSERT, UPDATE, DELETE]
ALL_EVENTS = [DROP_DB, CREATE, INSERT, UPDATE, DELETE, RESOLVED]
