"""Canal-JSON: the TiCDC document's examples, official Canal's variants, the shared cases, round trips, errors.

Golden files in ``testdata/canal_json/``:

- ``seed_*.json``: the examples of the TiCDC Canal-JSON document, byte for byte where it shows them (the
  envelope of its UPDATE / DELETE / VARBINARY examples, elided there with "...", is filled in from its
  INSERT example; its ``// TiDB extension field`` comments are dropped, JSON has none).
- ``canal_*.json``: official-Canal-shaped messages (several rows, changed-only ``old``, ``int(11)``).
- ``encoded_*.jsonl``: this encoder's output for the shared cases, one message per line. Regenerate with
  ``CANAL_JSON_UPDATE_GOLDEN=1 python -m pytest tests/codec/test_canal_json.py`` and review the diff.
"""

from __future__ import annotations

import itertools
import os
import pickle
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ticdc_delta.codec import canal_json as canal_json_module, decoder_for, encoder_for
from ticdc_delta.codec.base import COMPILE_AT
from ticdc_delta.codec.canal_json import (
    CanalJsonDecoder,
    CanalJsonEncoder,
    canal_event_type,
    java_sql_type,
    mysql_type_name,
    parse_mysql_type,
)
from ticdc_delta.codec.model import (
    BLOB_TYPES,
    INTEGER_TYPES,
    Column,
    ColumnFlag as F,
    DDLEvent,
    DDLType,
    DecodeContext,
    Event,
    Image,
    Op,
    ResolvedEvent,
    RowChange,
    TypeCode as T,
    is_binary_column,
)
from ticdc_delta.errors import (
    ClaimCheckError,
    DecodeError,
    EncodeError,
    FramingError,
    HandleKeyOnlyError,
    TruncatedMessageError,
)

from . import cases

TESTDATA = Path(__file__).parent / "testdata" / "canal_json"
CTX = DecodeContext("tidb-cdc", 3, 1234)
KEY = F.HANDLE_KEY | F.PRIMARY_KEY
EXT = {"enable-tidb-extension": "true"}
SEED_TS = 429918007904436226

# The seed's VARBINARY example: these 16 bytes, and the JSON string TiCDC writes for them.
SEED_VARBINARY_BYTES = bytes([5, 7, 10, 15, 36, 50, 43, 99, 120, 60, 38, 255, 254, 45, 55, 70])
SEED_VARBINARY_JSON = '"\\u0005\\u0007\\n\\u000f$2+cx\\u003c\\u0026ÿþ-7F"'


def golden(name: str) -> bytes:
    return (TESTDATA / name).read_bytes()


def decode(value: bytes | None, options: dict[str, str] | None = None) -> list[Event]:
    return CanalJsonDecoder(options or {}).decode(None, value, CTX)


def encode_one(event: Event, options: dict[str, str] | None = None) -> bytes:
    (message,) = CanalJsonEncoder(options or {}).encode([event])
    assert message.key is None
    assert message.value is not None
    return message.value


def carried_flags(col: Column) -> F:
    """The flags Canal-JSON carries: the key (pkNames), unsigned and binary (both in mysqlType)."""
    flags = KEY if col.flags & F.PRIMARY_KEY else F.NONE
    binary = is_binary_column(col.type, col.flags)
    if binary:
        flags |= F.BINARY
    # TiCDC's mysqlType has no "unsigned" for BIT and YEAR, nor for binary string types.
    if col.flags & F.UNSIGNED and col.type not in (T.BIT, T.YEAR) and not binary:
        flags |= F.UNSIGNED
    return flags


def carried_image(image: tuple[Column, ...] | None) -> tuple[Column, ...] | None:
    if image is None:
        return None
    return tuple(Column(c.name, c.type, carried_flags(c), c.value) for c in image)


def carried(event: Event, extension: bool) -> Event:
    """What a Canal-JSON round trip gives back of ``event`` (decoded with the shared context)."""
    if isinstance(event, ResolvedEvent):
        return ResolvedEvent(event.commit_ts, CTX)
    commit_ts = event.commit_ts if extension else None
    if isinstance(event, DDLEvent):
        return DDLEvent(commit_ts, event.schema, event.table or "", event.query, None, CTX)
    columns = None if event.op == Op.DELETE else carried_image(event.columns)
    old = carried_image(event.old) if event.op != Op.INSERT else None
    return RowChange(commit_ts, event.schema, event.table, event.op, columns, old, CTX)


# --- the seed's examples ----------------------------------------------------------------------------------

TP_INT_NEW = (
    Column("c_bigint", T.BIGINT, F.NONE, 9223372036854775807),
    Column("c_int", T.INT, F.NONE, 0),
    Column("c_mediumint", T.MEDIUMINT, F.NONE, 8388607),
    Column("c_smallint", T.SMALLINT, F.NONE, 32767),
    Column("c_tinyint", T.TINYINT, F.NONE, 0),
    Column("id", T.INT, KEY, 2),
)
TP_INT_OLD = (
    Column("c_bigint", T.BIGINT, F.NONE, 9223372036854775807),
    Column("c_int", T.INT, F.NONE, 2147483647),
    Column("c_mediumint", T.MEDIUMINT, F.NONE, 8388607),
    Column("c_smallint", T.SMALLINT, F.NONE, 32767),
    Column("c_tinyint", T.TINYINT, F.NONE, 127),
    Column("id", T.INT, KEY, 2),
)


def test_seed_ddl() -> None:
    expected = DDLEvent(SEED_TS, "test", "", "drop database if exists test", None, CTX)
    assert decode(golden("seed_ddl.json"), EXT) == [expected]


def test_seed_insert_keeps_bigint_max_exact() -> None:
    (event,) = decode(golden("seed_insert_tp_int.json"), EXT)
    assert event == RowChange(SEED_TS, "test", "tp_int", Op.INSERT, TP_INT_OLD, None, CTX)
    assert event.source is CTX
    assert event.key_columns() == ("id",)


def test_seed_update_with_every_old_column() -> None:
    (event,) = decode(golden("seed_update_ticdc.json"))
    assert event == RowChange(None, "test", "tp_int", Op.UPDATE, TP_INT_NEW, TP_INT_OLD, CTX)


def test_seed_update_with_changed_old_columns_only_gives_the_full_old_image() -> None:
    # Official Canal (and TiCDC with only-output-updated-columns) write only c_int and c_tinyint in old.
    changed_only = decode(golden("seed_update_canal.json"))
    assert changed_only == decode(golden("seed_update_ticdc.json"))
    assert [c.name for c in changed_only[0].old] == [c.name for c in TP_INT_NEW]  # the order of data


@pytest.mark.parametrize("name", ["seed_delete.json", "seed_delete_pre_v5_4.json"])
def test_seed_delete_reads_data_and_ignores_a_pre_v5_4_old(name: str) -> None:
    assert decode(golden(name)) == [RowChange(None, "test", "tp_int", Op.DELETE, None, TP_INT_NEW, CTX)]


@pytest.mark.parametrize("options", [EXT, {}])
def test_seed_watermark(options: dict[str, str]) -> None:
    # Without the option a _tidb field is still honoured (see the module docstring).
    assert decode(golden("seed_watermark.json"), options) == [ResolvedEvent(SEED_TS, CTX)]


def test_seed_varbinary_decodes_to_its_bytes() -> None:
    (event,) = decode(golden("seed_varbinary.json"))
    assert event.columns == (
        Column("id", T.INT, KEY, 1),
        Column("c_varbinary", T.VARCHAR, F.BINARY, SEED_VARBINARY_BYTES),
    )


def test_seed_varbinary_encodes_byte_exactly() -> None:
    event = RowChange(
        SEED_TS, "test", "t", Op.INSERT, (Column("c_varbinary", T.VARCHAR, F.BINARY, SEED_VARBINARY_BYTES),), None
    )
    value = encode_one(event)
    assert b'"data":[{"c_varbinary":' + SEED_VARBINARY_JSON.encode("utf-8") + b"}]" in value
    assert b'"sqlType":{"c_varbinary":2004}' in value
    assert b'"mysqlType":{"c_varbinary":"varbinary"}' in value


MYSQL_TYPE_EXAMPLE = (
    Column("id", T.INT, KEY, 1),
    Column("c_decimal", T.DECIMAL, F.NONE, "123.4560"),
    Column("c_char", T.STRING, F.NONE, "abc"),
    Column("c_varchar", T.VARCHAR, F.NONE, "abc"),
    Column("c_binary", T.STRING, F.BINARY, b"abc" + bytes(13)),
    Column("c_varbinary", T.VARCHAR, F.BINARY, b"abc"),
    Column("c_enum", T.ENUM, F.NONE, 1),
    Column("c_set", T.SET, F.NONE, 3),
    Column("c_bit", T.BIT, F.NONE, 65),
)


@pytest.mark.parametrize("name", ["seed_mysql_type_ticdc.json", "seed_mysql_type_canal.json"])
def test_seed_mysql_type_with_and_without_parameters(name: str) -> None:
    assert decode(golden(name)) == [RowChange(None, "test", "t", Op.INSERT, MYSQL_TYPE_EXAMPLE, None, CTX)]


def test_seed_examples_are_what_the_encoder_writes() -> None:
    """Encoding the decoded seed events gives the seed's messages (es/ts: the commit ts's physical ms)."""
    es = SEED_TS >> 18
    for name, options in [
        ("seed_insert_tp_int.json", EXT),
        ("seed_update_ticdc.json", {}),
        ("seed_update_canal.json", {"only-output-updated-columns": "true"}),
        ("seed_delete.json", {}),
        ("seed_watermark.json", EXT),
    ]:
        seed = orjson.loads(golden(name))
        (event,) = decode(golden(name), options)
        if isinstance(event, RowChange):
            event = event._replace(commit_ts=SEED_TS)
        out = orjson.loads(encode_one(event, options))
        seed["es"] = seed["ts"] = es
        assert out == seed, name
        assert list(out) == list(seed), name  # the field order too

    ddl = DDLEvent(SEED_TS, "test", "", "drop database if exists test", DDLType.DROP_SCHEMA)
    seed = orjson.loads(golden("seed_ddl.json"))
    seed["es"] = seed["ts"] = es
    assert orjson.loads(encode_one(ddl, EXT)) == seed


def test_official_canal_message_with_several_rows() -> None:
    events = decode(golden("canal_multi_row_update.json"))
    int_cols = [("id", T.INT), ("c_tinyint", T.TINYINT), ("c_int", T.INT), ("c_bigint", T.BIGINT)]

    def image(*values: Any) -> tuple[Column, ...]:
        return tuple(Column(n, t, KEY if n == "id" else F.NONE, v) for (n, t), v in zip(int_cols, values))

    assert events == [
        RowChange(None, "test", "tp_int", Op.UPDATE, image(2, 0, 0, 9223372036854775807),
                  image(2, 127, 2147483647, 9223372036854775807), CTX),
        RowChange(None, "test", "tp_int", Op.UPDATE, image(3, 0, 0, None), image(3, 0, 5, None), CTX),
    ]
    assert events[0].source is events[1].source is CTX


# --- mysqlType, sqlType, DDL type ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "type_code", "flags"),
    [
        ("int", T.INT, F.NONE),
        ("int unsigned", T.INT, F.UNSIGNED),
        ("int(10) unsigned zerofill", T.INT, F.UNSIGNED),
        ("BIGINT(20) UNSIGNED", T.BIGINT, F.UNSIGNED),
        ("tinyint(1)", T.TINYINT, F.NONE),
        ("mediumint(8) unsigned", T.MEDIUMINT, F.UNSIGNED),
        ("decimal(10, 4)", T.DECIMAL, F.NONE),
        ("double unsigned", T.DOUBLE, F.UNSIGNED),
        ("float(7,3)", T.FLOAT, F.NONE),
        ("char(16)", T.STRING, F.NONE),
        ("varchar(16)", T.VARCHAR, F.NONE),
        ("binary(16)", T.STRING, F.BINARY),
        ("varbinary(16)", T.VARCHAR, F.BINARY),
        ("tinytext", T.TINYBLOB, F.NONE),
        ("tinyblob", T.TINYBLOB, F.BINARY),
        ("text", T.BLOB, F.NONE),
        ("blob", T.BLOB, F.BINARY),
        ("mediumtext", T.MEDIUMBLOB, F.NONE),
        ("mediumblob", T.MEDIUMBLOB, F.BINARY),
        ("longtext", T.LONGBLOB, F.NONE),
        ("longblob", T.LONGBLOB, F.BINARY),
        ("enum('a)','b','c')", T.ENUM, F.NONE),
        ("set('a','b','c')", T.SET, F.NONE),
        ("bit(64)", T.BIT, F.NONE),
        ("year(4)", T.YEAR, F.NONE),
        ("date", T.DATE, F.NONE),
        ("datetime(6)", T.DATETIME, F.NONE),
        ("timestamp(3)", T.TIMESTAMP, F.NONE),
        ("time", T.TIME, F.NONE),
        ("json", T.JSON, F.NONE),
    ],
)
def test_parse_mysql_type(text: str, type_code: T, flags: F) -> None:
    assert parse_mysql_type(text) == (type_code, flags)


@pytest.mark.parametrize("text", ["", "   ", "geometry", "int frobnicate", "decimal)10(", "varchar(16) charset"])
def test_parse_mysql_type_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="MySQL type"):
        parse_mysql_type(text)


@pytest.mark.parametrize(
    ("type_code", "flags", "name"),
    [
        (T.INT, F.UNSIGNED | F.NULLABLE, "int unsigned"),
        (T.BIGINT, F.UNSIGNED, "bigint unsigned"),
        (T.BIT, F.UNSIGNED, "bit"),  # TiCDC: no "unsigned" for BIT and YEAR
        (T.YEAR, F.UNSIGNED, "year"),
        (T.STRING, F.NONE, "char"),
        (T.STRING, F.BINARY, "binary"),
        (T.VARCHAR, F.BINARY, "varbinary"),
        (T.BLOB, F.NONE, "text"),
        (T.TINYBLOB, F.BINARY, "tinyblob"),
        (T.INT, F.BINARY, "int"),  # TiDB sets the binary flag on numbers; it means nothing here
        (T.DECIMAL, F.NONE, "decimal"),
    ],
)
def test_mysql_type_name(type_code: T, flags: F, name: str) -> None:
    assert mysql_type_name(type_code, flags) == name


@pytest.mark.parametrize("type_code", [T.NULL, T.GEOMETRY, 99])
def test_mysql_type_name_refuses_types_canal_json_cannot_carry(type_code: int) -> None:
    with pytest.raises(EncodeError, match="mysqlType"):
        mysql_type_name(type_code, F.NONE)


# The seed's integer table: unsigned values beyond the signed range are promoted to the next Java type.
@pytest.mark.parametrize(
    ("type_code", "flags", "value", "java"),
    [
        (T.TINYINT, F.NONE, -128, -6),
        (T.TINYINT, F.UNSIGNED, 127, -6),
        (T.TINYINT, F.UNSIGNED, 128, 5),
        (T.SMALLINT, F.NONE, 32767, 5),
        (T.SMALLINT, F.UNSIGNED, 32767, 5),
        (T.SMALLINT, F.UNSIGNED, 32768, 4),
        (T.MEDIUMINT, F.UNSIGNED, 8388607, 4),
        (T.MEDIUMINT, F.UNSIGNED, 16777215, 4),
        (T.INT, F.UNSIGNED, 2147483647, 4),
        (T.INT, F.UNSIGNED, 2147483648, -5),
        (T.BIGINT, F.NONE, -9223372036854775808, -5),
        (T.BIGINT, F.UNSIGNED, 9223372036854775807, -5),
        (T.BIGINT, F.UNSIGNED, 9223372036854775808, 3),
        (T.BIGINT, F.UNSIGNED, None, -5),
        (T.FLOAT, F.NONE, 1.5, 7),
        (T.DOUBLE, F.NONE, 1.5, 8),
        (T.DECIMAL, F.UNSIGNED, "1", 3),
        (T.STRING, F.NONE, "a", 1),
        (T.VARCHAR, F.NONE, "a", 12),
        (T.STRING, F.BINARY, b"a", 2004),
        (T.VARCHAR, F.BINARY, b"a", 2004),
        (T.TINYBLOB, F.NONE, "a", 2005),
        (T.BLOB, F.NONE, "a", 2005),
        (T.MEDIUMBLOB, F.NONE, "a", 2005),
        (T.LONGBLOB, F.NONE, "a", 2005),
        (T.TINYBLOB, F.BINARY, b"a", 2004),
        (T.LONGBLOB, F.BINARY, b"a", 2004),
        (T.DATE, F.NONE, "2000-01-01", 91),
        (T.DATETIME, F.NONE, "2000-01-01 00:00:00", 93),
        (T.TIMESTAMP, F.NONE, "2000-01-01 00:00:00", 93),
        (T.TIME, F.NONE, "00:00:00", 92),
        (T.YEAR, F.UNSIGNED, 2000, 12),
        (T.ENUM, F.NONE, 1, 4),
        (T.SET, F.NONE, 3, -7),
        (T.BIT, F.UNSIGNED, 18446744073709551615, -7),
        (T.JSON, F.NONE, "{}", 12),
    ],
)
def test_java_sql_type(type_code: T, flags: F, value: Any, java: int) -> None:
    assert java_sql_type(type_code, flags, value) == java


@pytest.mark.parametrize(
    ("ddl_type", "canal_type"),
    [
        (None, "QUERY"),
        (DDLType.CREATE_SCHEMA, "QUERY"),
        (DDLType.DROP_SCHEMA, "QUERY"),
        (DDLType.CREATE_TABLE, "CREATE"),
        (DDLType.DROP_TABLE, "ERASE"),
        (DDLType.TRUNCATE_TABLE, "TRUNCATE"),
        (DDLType.ADD_COLUMN, "ALTER"),
        (DDLType.MODIFY_COLUMN, "ALTER"),
        (DDLType.RENAME_TABLE, "RENAME"),
        (DDLType.ADD_INDEX, "CINDEX"),
        (DDLType.DROP_INDEX, "DINDEX"),
        (DDLType.CREATE_VIEW, "QUERY"),
    ],
)
def test_ddl_canal_event_type(ddl_type: int | None, canal_type: str) -> None:
    assert canal_event_type(ddl_type) == canal_type
    event = DDLEvent(SEED_TS, "test", "t", "ddl", ddl_type)
    assert orjson.loads(encode_one(event))["type"] == canal_type
    # Any type with isDdl true is a DDL; the decoder does not guess a DDL type code from it.
    assert decode(encode_one(event)) == [DDLEvent(None, "test", "t", "ddl", None, CTX)]


# --- the shared cases -------------------------------------------------------------------------------------

SHARED_EVENTS = [*cases.ALL_EVENTS, cases.DELETE_KEY_ONLY]
ROUND_TRIP_OPTIONS = [
    EXT,
    {},
    {"enable-tidb-extension": "true", "only-output-updated-columns": "true"},
    {"only-output-updated-columns": "true"},
]


def options_id(options: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in options.items()) or "default"


@pytest.mark.parametrize("options", ROUND_TRIP_OPTIONS, ids=options_id)
@pytest.mark.parametrize("event", SHARED_EVENTS, ids=lambda e: f"{e.kind}-{getattr(e, 'op', '')}-{e.commit_ts}")
def test_shared_case_round_trip(event: Event, options: dict[str, str]) -> None:
    extension = options.get("enable-tidb-extension") == "true"
    if isinstance(event, ResolvedEvent) and not extension:
        with pytest.raises(EncodeError, match="enable-tidb-extension"):
            CanalJsonEncoder(options).encode([event])
        return
    assert decode(encode_one(event, options), options) == [carried(event, extension)]


def test_shared_cases_through_the_registry() -> None:
    encoder = encoder_for("canal-json", EXT)
    decoder = decoder_for("canal-json", EXT)
    assert encoder.protocol == decoder.protocol == "canal-json"
    messages = encoder.encode(cases.ALL_EVENTS)
    assert len(messages) == len(cases.ALL_EVENTS)  # one event per message, as TiCDC writes them
    assert all(m.key is None for m in messages)
    decoded = [e for m in messages for e in decoder.decode(m.key, m.value, CTX)]
    assert decoded == [carried(e, True) for e in cases.ALL_EVENTS]


GOLDEN_STREAMS = {
    "encoded_tidb_extension.jsonl": (EXT, SHARED_EVENTS),
    "encoded_plain_only_updated.jsonl": (
        {"only-output-updated-columns": "true"},
        [e for e in SHARED_EVENTS if not isinstance(e, ResolvedEvent)],
    ),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_STREAMS))
def test_encoder_golden_bytes(name: str) -> None:
    options, events = GOLDEN_STREAMS[name]
    lines = [m.value for m in CanalJsonEncoder(options).encode(events)]
    assert all(b"\n" not in line for line in lines)  # control characters are always escaped
    produced = b"\n".join(lines) + b"\n"
    if os.environ.get("CANAL_JSON_UPDATE_GOLDEN") == "1":
        (TESTDATA / name).write_bytes(produced)
    assert produced == golden(name)


def test_update_old_holds_every_column_or_only_the_changed_ones() -> None:
    full = orjson.loads(encode_one(cases.UPDATE))
    assert list(full["old"][0]) == [c.name for c in cases.UPDATE.old]
    changed = orjson.loads(encode_one(cases.UPDATE, {"only-output-updated-columns": "true"}))
    unchanged = {"c_null"}  # NULL in both rows
    assert list(changed["old"][0]) == [c.name for c in cases.UPDATE.old if c.name not in unchanged]


def test_delete_writes_the_row_in_data_and_a_null_old() -> None:
    out = orjson.loads(encode_one(cases.DELETE, EXT))
    assert out["type"] == "DELETE"
    assert out["old"] is None
    assert out["data"][0]["id"] == "2"
    assert out["_tidb"] == {"commitTs": cases.TS3}
    assert out["es"] == out["ts"] == cases.TS3 >> 18


def test_without_the_extension_there_is_no_tidb_field() -> None:
    for event in [cases.INSERT, cases.CREATE]:
        assert "_tidb" not in orjson.loads(encode_one(event))


# --- encoder details --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.1, "0.1"),
        (3.0, "3"),
        (-0.0, "-0"),
        (1e16, "10000000000000000"),
        (-1.5e-7, "-0.00000015"),
        (153.123, "153.123"),
        (float("inf"), "+Inf"),
        (float("-inf"), "-Inf"),
        (float("nan"), "NaN"),
        (7, "7"),
    ],
)
def test_floats_are_written_as_go_formats_them(value: float, text: str) -> None:
    event = RowChange(1, "s", "t", Op.INSERT, (Column("f", T.DOUBLE, F.NONE, value),), None)
    assert orjson.loads(encode_one(event))["data"] == [{"f": text}]


def test_strings_are_escaped_as_go_escapes_them() -> None:
    text = "a\"b\\c\x00\x08\x0c\x1f\x7f<>&\u2028\u2029é测"
    event = RowChange(1, "s<", "t&", Op.INSERT, (Column("c>", T.VARCHAR, F.NONE, text),), None)
    value = encode_one(event)
    assert (
        b'"data":[{"c\\u003e":"a\\"b\\\\c\\u0000\\u0008\\u000c\\u001f\x7f\\u003c\\u003e\\u0026\\u2028\\u2029'
        + "é测".encode()
        + b'"}]'
    ) in value
    assert b'"database":"s\\u003c","table":"t\\u0026"' in value
    assert decode(value)[0].columns == (Column("c>", T.VARCHAR, F.NONE, text),)


@pytest.mark.parametrize(
    ("column", "match"),
    [
        (Column("c", T.INT, F.NONE, "1"), "cannot hold a str"),
        (Column("c", T.INT, F.NONE, True), "cannot hold a bool"),
        (Column("c", T.BIT, F.NONE, -1), "cannot hold a int"),
        (Column("c", T.DOUBLE, F.NONE, "1.5"), "cannot hold a str"),
        (Column("c", T.VARCHAR, F.NONE, b"x"), "cannot hold a bytes"),
        (Column("c", T.BLOB, F.BINARY, "x"), "cannot hold a str"),
        (Column("c", T.ENUM, F.NONE, "a"), "cannot hold a str"),
        (Column("c", T.GEOMETRY, F.NONE, b"x"), "mysqlType"),
        (Column("c", T.VAR_STRING, F.BINARY, b"x"), "binary column"),
        (Column("c", T.VARCHAR, F.NONE, "\ud800"), "not valid Unicode"),
        (Column(5, T.INT, F.NONE, 1), "column name must be a str"),  # type: ignore[arg-type]
    ],
)
def test_encoder_refuses_values_that_do_not_fit(column: Column, match: str) -> None:
    with pytest.raises(EncodeError, match=match):
        encode_one(RowChange(1, "s", "t", Op.INSERT, (column,), None))


@pytest.mark.parametrize(
    ("event", "options", "match"),
    [
        (cases.RESOLVED, {}, "resolved events need enable-tidb-extension"),
        (RowChange(None, "s", "t", Op.INSERT, cases.image(1), None), EXT, "needs a commit ts"),
        (RowChange(-1, "s", "t", Op.INSERT, cases.image(1), None), {}, "unsigned 64-bit"),
        (ResolvedEvent(1 << 64), EXT, "unsigned 64-bit"),
        (RowChange(1, "s", "t", Op.INSERT, None, None), {}, "without the row image"),
        (RowChange(1, "s", "t", Op.DELETE, cases.image(1), None), {}, "without the row image"),
        (RowChange(1, "s", "t", "upsert", cases.image(1), None), {}, "unknown row operation"),
        (RowChange(1, "s", "t", Op.INSERT, cases.image(1) * 2, None), {}, "appears twice"),
        (
            RowChange(1, "s", "t", Op.UPDATE, cases.image(1, {"id"}), cases.image(2, {"id", "c_int"})),
            {},
            "old column 'c_int'",
        ),
        (
            RowChange(1, "s", "t", Op.UPDATE, cases.image(1, {"id"}), cases.image(2, {"id"}) * 2),
            {},
            "old column 'id' appears twice",
        ),
        (DDLEvent(1, None, "t", "q"), {}, "schema must be a str"),  # type: ignore[arg-type]
        ("not an event", {}, "not an event"),
    ],
)
def test_encoder_refuses_events_it_cannot_write(event: Any, options: dict[str, str], match: str) -> None:
    with pytest.raises(EncodeError, match=match):
        CanalJsonEncoder(options).encode([event])


def test_update_without_old_image_round_trips_as_update() -> None:
    event = RowChange(5, "s", "t", Op.UPDATE, cases.image(2), None)
    assert orjson.loads(encode_one(event))["old"] is None
    assert decode(encode_one(event, EXT), EXT) == [carried(event, True)]


@pytest.mark.parametrize("cls", [CanalJsonEncoder, CanalJsonDecoder])
def test_options_must_be_booleans(cls: type) -> None:
    with pytest.raises(ValueError, match="enable-tidb-extension must be true or false"):
        cls({"enable-tidb-extension": "maybe"})


# --- decoder errors ---------------------------------------------------------------------------------------


def seed_insert() -> dict[str, Any]:
    return orjson.loads(golden("seed_insert_tp_int.json"))  # type: ignore[no-any-return]


def with_changes(**changes: Any) -> bytes:
    msg = seed_insert()
    for field, value in changes.items():
        if value is ...:
            del msg[field]
        else:
            msg[field] = value
    return orjson.dumps(msg)


def with_data(row_changes: dict[str, Any], **changes: Any) -> bytes:
    msg = seed_insert()
    msg["data"][0].update(row_changes)
    msg.update(changes)
    return orjson.dumps(msg)


UPDATE_MSG = orjson.loads(golden("seed_update_ticdc.json"))

DECODE_ERRORS: list[tuple[str, bytes | None, dict[str, str], type[DecodeError], str]] = [
    ("null value", None, {}, FramingError, "value is null"),
    ("empty value", b"", {}, FramingError, "not valid JSON"),
    ("not json", b"\x00\xffgarbage", {}, FramingError, "not valid JSON"),
    ("truncated", golden("seed_insert_tp_int.json")[:100], {}, TruncatedMessageError, "end of data"),
    ("array", b"[1, 2]", {}, FramingError, "must be a JSON object, got array"),
    ("no isDdl", with_changes(isDdl=...), {}, DecodeError, "isDdl must be a boolean, got null"),
    ("isDdl string", with_changes(isDdl="false"), {}, DecodeError, "isDdl must be a boolean, got string"),
    ("unknown type", with_changes(type="UPSERT"), {}, DecodeError, "type must be INSERT, UPDATE, DELETE"),
    ("type number", with_changes(type=1), {}, DecodeError, "type must be a string, got number"),
    ("database null", with_changes(database=None), {}, DecodeError, "database must be a string"),
    ("table number", with_changes(table=5), {}, DecodeError, "table must be a string"),
    ("no mysqlType", with_changes(mysqlType=...), {}, DecodeError, "mysqlType must be an object, got null"),
    ("mysqlType entry", with_changes(mysqlType={"id": 3}), {}, DecodeError, "mysqlType of column 'id' must be a"),
    ("unknown mysqlType", with_changes(mysqlType={"id": "geometry"}), {}, DecodeError, "unknown MySQL type"),
    ("pkNames string", with_changes(pkNames="id"), {}, DecodeError, "pkNames must be null or an array"),
    ("pkNames unknown", with_changes(pkNames=["nope"]), {}, DecodeError, "pkNames names columns without"),
    ("no data", with_changes(data=None), {}, DecodeError, "data must be a non-empty array"),
    ("empty data", with_changes(data=[]), {}, DecodeError, "data must be a non-empty array"),
    ("row not object", with_changes(data=["x"]), {}, DecodeError, r"data\[0\] must be an object, got string"),
    ("empty row", with_changes(data=[{}]), {}, DecodeError, r"data\[0\] has no columns"),
    ("unknown column", with_data({"extra": "1"}), {}, DecodeError, r"column 'extra' has no mysqlType"),
    ("int not a number", with_data({"c_int": "12a"}), {}, DecodeError, r"'c_int' must be an integer, got '12a'"),
    ("int as json number", with_data({"c_int": 12}), {}, DecodeError, "must be a string or null, got number"),
    ("value a boolean", with_data({"c_int": True}), {}, DecodeError, "must be a string or null, got boolean"),
    ("value a list", with_data({"c_int": ["1"]}), {}, DecodeError, "must be a string or null, got array"),
    ("text as number", with_data({}, mysqlType={**seed_insert()["mysqlType"], "c_int": "varchar"},
                                 data=[{"c_int": 1}]), {}, DecodeError, "must be a string or null, got number"),
    ("binary above latin-1", with_data({}, mysqlType={"id": "varbinary"}, data=[{"id": "ā"}]), {},
     DecodeError, "binary but has a character above U\\+00FF"),
    ("negative bit", with_data({}, mysqlType={"id": "bit"}, data=[{"id": "-1"}]), {},
     DecodeError, "must be an unsigned integer"),
    ("float as json number", with_data({}, mysqlType={"id": "double"}, data=[{"id": 1.5}]), {},
     DecodeError, "must be a string or null, got number"),
    ("bad value after text columns", orjson.dumps({**orjson.loads(golden("seed_mysql_type_canal.json")),
                                                   "data": [{"c_char": "x", "c_varchar": "y", "c_enum": "a"}]}),
     {}, DecodeError, "'c_enum' must be an unsigned integer, got 'a'"),
    ("claim check on a DML", with_changes(_tidb={"commitTs": 5, "claimCheckLocation": "s3://b/x"}), EXT,
     ClaimCheckError, r"claim-check message \(large-message-handle-option=claim-check\): the row is stored at "
     r"'s3://b/x'; set the source option claim-check-storage-uri"),
    ("float garbage", with_data({}, mysqlType={"id": "double"}, data=[{"id": "1.5.5"}]), {},
     DecodeError, "must be a number"),
    ("old not array", orjson.dumps({**UPDATE_MSG, "old": {"id": "2"}}), {}, DecodeError,
     "old must be null or an array"),
    ("old too short", orjson.dumps({**UPDATE_MSG, "old": []}), {}, DecodeError, r"as long as data \(1 rows\)"),
    ("old row not object", orjson.dumps({**UPDATE_MSG, "old": [1]}), {}, DecodeError, r"old\[0\] must be an object"),
    ("old extra column", orjson.dumps({**UPDATE_MSG, "old": [{"zz": "1"}]}), {}, DecodeError,
     r"old\[0\] has columns that data\[0\] lacks: \['zz'\]"),
    ("old column not in data", orjson.dumps({**UPDATE_MSG, "old": [{"zz": "1"}]}), {},
     DecodeError, r"old\[0\] has columns that data\[0\] lacks: \['zz'\]"),
    # TiCDC (and Canal) write data, mysqlType and sqlType from the same columns: a new image without one
    # would write NULL over its value; a row without its key has nothing to be applied by
    ("insert lacks a column", with_data({}, data=[{"id": "2", "c_int": "1"}]), {}, DecodeError,
     r"data\[0\] lacks columns mysqlType declares: \['c_bigint', 'c_mediumint', 'c_smallint', 'c_tinyint'\]"),
    ("update lacks a column", orjson.dumps({**UPDATE_MSG, "data": [{k: v for k, v in UPDATE_MSG["data"][0].items()
                                                                    if k != "c_int"}], "old": None}), {},
     DecodeError, r"data\[0\] lacks columns mysqlType declares: \['c_int'\]"),
    ("insert lacks its key", with_data({}, data=[{k: v for k, v in seed_insert()["data"][0].items() if k != "id"}]),
     {}, DecodeError, r"data\[0\] lacks its key columns \(pkNames\): \['id'\]"),
    ("delete lacks its key", with_data({}, type="DELETE", data=[{"c_int": "1"}]), {}, DecodeError,
     r"data\[0\] lacks its key columns \(pkNames\): \['id'\]"),
    ("old bad value", orjson.dumps({**UPDATE_MSG, "old": [{"c_int": "x"}]}), {}, DecodeError,
     r"old\[0\] column 'c_int' must be an integer"),
    ("missing _tidb", with_changes(_tidb=...), EXT, DecodeError, "enable-tidb-extension is true but"),
    ("DDL missing _tidb", orjson.dumps({**orjson.loads(golden("seed_ddl.json")), "_tidb": None}), EXT,
     DecodeError, "no _tidb.commitTs"),
    ("_tidb not object", with_changes(_tidb=[1]), {}, DecodeError, "_tidb must be an object"),
    ("commitTs string", with_changes(_tidb={"commitTs": "1"}), {}, DecodeError, "commitTs must be an unsigned"),
    ("commitTs negative", with_changes(_tidb={"commitTs": -1}), {}, DecodeError, "commitTs must be an unsigned"),
    ("commitTs too big", golden("seed_insert_tp_int.json").replace(b"429918007904436226", b"18446744073709551616"),
     {}, DecodeError, "commitTs must be"),
    ("commitTs absent", with_changes(_tidb={}), EXT, DecodeError, "commitTs must be an unsigned"),
    ("watermark no _tidb", with_changes(type="TIDB_WATERMARK", _tidb=...), EXT, DecodeError, "needs the object _tidb"),
    ("watermark bad ts", with_changes(type="TIDB_WATERMARK", _tidb={"watermarkTs": 1.5}), EXT, DecodeError,
     "watermarkTs must be an unsigned"),
    ("claim check", b'{"_tidb":{"claimCheckLocation":"s3://bucket/x"}}', EXT, ClaimCheckError, "claim-check message"),
    ("handle key only", with_changes(_tidb={"commitTs": 5, "onlyHandleKey": True}), EXT, HandleKeyOnlyError,
     "only the handle key .*handle-key-only"),
    ("deep commitTs", b'{"isDdl":false,"type":"INSERT","_tidb":{"commitTs":' + b"[" * 1000 + b"]" * 1000 + b"}}",
     EXT, DecodeError, r"commitTs must be an unsigned 64-bit integer, got \[\[\["),
    ("deep type", b'{"isDdl":false,"type":' + b"[" * 1000 + b"]" * 1000 + b"}", EXT, DecodeError,
     "type must be a string"),
    ("deep watermark", b'{"isDdl":false,"type":"TIDB_WATERMARK","_tidb":{"watermarkTs":' + b"[" * 1000
     + b"]" * 1000 + b"}}", EXT, DecodeError, r"watermarkTs must be an unsigned 64-bit integer, got \[\[\["),
    ("second row's old", orjson.dumps({**orjson.loads(golden("canal_multi_row_update.json")),
                                       "old": [{}, {"c_int": "x"}]}), {}, DecodeError,
     r"old\[1\] column 'c_int' must be an integer, got 'x'"),
    ("DDL sql", orjson.dumps({**orjson.loads(golden("seed_ddl.json")), "sql": None}), {}, DecodeError,
     "sql must be a string"),
    ("DDL table", orjson.dumps({**orjson.loads(golden("seed_ddl.json")), "table": 1}), {}, DecodeError,
     "table must be a string"),
]


@pytest.mark.parametrize(("value", "options", "error", "match"), [c[1:] for c in DECODE_ERRORS],
                         ids=[c[0] for c in DECODE_ERRORS])
def test_decode_errors(value: bytes | None, options: dict[str, str], error: type[DecodeError], match: str) -> None:
    with pytest.raises(error, match=match) as info:
        decode(value, options)
    assert (info.value.protocol, info.value.topic, info.value.partition, info.value.offset) == (
        "canal-json", "tidb-cdc", 3, 1234)
    assert pickle.loads(pickle.dumps(info.value)).reason == info.value.reason


def test_tidb_field_is_honoured_without_the_option() -> None:
    (insert,) = decode(golden("seed_insert_tp_int.json"))
    (ddl,) = decode(golden("seed_ddl.json"))
    assert insert.commit_ts == ddl.commit_ts == SEED_TS


def test_ddl_with_a_null_table_has_an_empty_table() -> None:
    msg = {**orjson.loads(golden("seed_ddl.json")), "table": None, "type": "CREATE", "_tidb": None}
    assert decode(orjson.dumps(msg)) == [DDLEvent(None, "test", "", "drop database if exists test", None, CTX)]


def test_empty_tidb_field_without_the_option_means_no_commit_ts() -> None:
    assert decode(with_changes(_tidb={}))[0].commit_ts is None


def test_row_without_commit_ts_and_without_the_extension() -> None:
    event = RowChange(None, "s", "t", Op.INSERT, cases.image(1, {"id"}), None)
    out = orjson.loads(encode_one(event))
    assert out["es"] == out["ts"] == 0
    assert decode(encode_one(event)) == [carried(event, False)]


def test_layout_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ticdc_delta.codec.canal_json._LAYOUT_CACHE_LIMIT", 3)
    decoder = CanalJsonDecoder({})
    for i in range(10):
        msg = {**seed_insert(), "mysqlType": {"id": "int", f"c{i}": "int"}, "data": [{"id": "1", f"c{i}": "2"}]}
        (event,) = decoder.decode(None, orjson.dumps(msg), CTX)
        assert event.columns == (Column("id", T.INT, KEY, 1), Column(f"c{i}", T.INT, F.NONE, 2))
        assert len(decoder._layouts) <= 3


def test_delete_of_key_columns_only_is_a_delete_by_key() -> None:
    """A deleted row needs only its key (TiCDC's delete-only-output-handle-key-columns writes just those;
    should mysqlType still declare the others, the delete is the same)."""
    msg = orjson.loads(golden("seed_delete.json"))
    msg["data"] = [{"id": "2"}]
    for events in (decode(orjson.dumps(msg), {}), decode(bytearray(orjson.dumps(msg)), {})):  # (both paths)
        assert [(e.op, e.old_values(), e.key_columns()) for e in events] == [(Op.DELETE, {"id": 2}, ("id",))]


def test_handle_key_only_delete_is_a_key_only_delete() -> None:
    msg = orjson.loads(golden("seed_delete.json"))
    msg["data"] = [{"id": "2"}]
    msg["_tidb"] = {"commitTs": 5, "onlyHandleKey": True}
    assert decode(orjson.dumps(msg), EXT) == [
        RowChange(5, "test", "tp_int", Op.DELETE, None, (Column("id", T.INT, KEY, 2),), CTX)
    ]


@pytest.mark.parametrize("options", [EXT, {}])
def test_decoder_pickles_after_use(options: dict[str, str]) -> None:
    """Spark ships decoders to executors; the layout caches (generated functions) are not shipped."""
    decoder = CanalJsonDecoder(options)
    value = golden("seed_insert_tp_int.json")
    events = decoder.decode(None, value, CTX)
    copy = pickle.loads(pickle.dumps(decoder))
    assert copy.decode(None, value, CTX) == events
    if not options:
        assert copy.decode(None, golden("seed_update_ticdc.json"), CTX)[0].commit_ts is None
    else:
        with pytest.raises(DecodeError, match="no _tidb.commitTs"):
            copy.decode(None, golden("seed_update_ticdc.json"), CTX)


def test_key_is_ignored() -> None:
    decoder = CanalJsonDecoder({})
    value = golden("seed_update_ticdc.json")
    assert decoder.decode(b"anything", value, CTX) == decoder.decode(None, value, CTX)


def test_layout_changes_between_messages_of_one_table() -> None:
    """An ALTER between two messages: the cached layout of the first must not be used for the second."""
    decoder = CanalJsonDecoder({})
    first = decoder.decode(None, golden("seed_insert_tp_int.json"), CTX)[0]
    msg = seed_insert()
    msg["mysqlType"]["c_int"] = "varchar"
    msg["pkNames"] = ["id", "c_bigint"]
    second = decoder.decode(None, orjson.dumps(msg), CTX)[0]
    assert first.columns[1] == Column("c_int", T.INT, F.NONE, 2147483647)
    assert second.columns[1] == Column("c_int", T.VARCHAR, F.NONE, "2147483647")
    assert second.columns[0].flags == KEY
    # and back: the first layout comes from the cache again
    assert decoder.decode(None, golden("seed_insert_tp_int.json"), CTX)[0] == first


def test_rows_with_other_column_orders_and_wide_rows() -> None:
    decoder = CanalJsonDecoder({})
    msg = seed_insert()
    row = msg["data"][0]
    expected = decode(golden("seed_insert_tp_int.json"))[0].columns
    by_name = {c.name: c for c in expected}
    for order in itertools.islice(itertools.permutations(row), 12):  # more than it compiles builders for
        msg["data"] = [{n: row[n] for n in order}]
        (event,) = decoder.decode(None, orjson.dumps(msg), CTX)
        assert event.columns == tuple(by_name[n] for n in order)
    wide = {f"c{i}": str(i) for i in range(300)}
    msg = {**seed_insert(), "pkNames": None, "mysqlType": {n: "int" for n in wide}, "data": [wide]}
    (event,) = decoder.decode(None, orjson.dumps(msg), CTX)
    assert event.columns == tuple(Column(n, T.INT, F.NONE, i) for i, n in enumerate(wide))


# --- round trip and fuzz (hypothesis) ---------------------------------------------------------------------

U64 = (1 << 64) - 1
TEXT = st.text(max_size=12)


def _int_kinds(type_code: T, bits: int) -> list[tuple[T, F, st.SearchStrategy[Any]]]:
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return [(type_code, F.NONE, st.integers(lo, hi)), (type_code, F.UNSIGNED, st.integers(0, (1 << bits) - 1))]


KINDS: list[tuple[T, F, st.SearchStrategy[Any]]] = [
    *_int_kinds(T.TINYINT, 8),
    *_int_kinds(T.SMALLINT, 16),
    *_int_kinds(T.MEDIUMINT, 24),
    *_int_kinds(T.INT, 32),
    *_int_kinds(T.BIGINT, 64),
    (T.YEAR, F.UNSIGNED, st.integers(0, 2155)),
    (T.FLOAT, F.NONE, st.floats(allow_nan=False, width=32)),
    (T.DOUBLE, F.UNSIGNED, st.floats(allow_nan=False)),
    (T.DECIMAL, F.NONE, st.from_regex(r"-?[0-9]{1,20}\.[0-9]{0,10}", fullmatch=True)),
    (T.DATE, F.NONE, TEXT),
    (T.DATETIME, F.NONE, TEXT),
    (T.TIMESTAMP, F.NONE, TEXT),
    (T.TIME, F.NONE, TEXT),
    (T.JSON, F.NONE, TEXT),
    (T.BIT, F.UNSIGNED, st.integers(0, U64)),
    (T.ENUM, F.NONE, st.integers(0, 65535)),
    (T.SET, F.NONE, st.integers(0, U64)),
    *[(tp, F.NONE, TEXT) for tp in (T.VARCHAR, T.STRING, *BLOB_TYPES)],
    *[(tp, F.BINARY, st.binary(max_size=12)) for tp in (T.VARCHAR, T.STRING, *BLOB_TYPES)],
]
# Flags Canal-JSON does not carry; the round trip drops them.
EXTRA_FLAGS = st.sampled_from(
    [F.NONE, F.NULLABLE, F.UNIQUE_KEY | F.NULLABLE, F.MULTIPLE_KEY, F.GENERATED, F.HANDLE_KEY]
)


@st.composite
def row_events(draw: st.DrawFn) -> RowChange:
    names = draw(st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=8, unique=True))
    columns = []
    for name in names:
        tp, flags, values = draw(st.sampled_from(KINDS))
        if draw(st.booleans()) and draw(st.booleans()):
            flags |= KEY
        columns.append((name, int(tp), flags | draw(EXTRA_FLAGS), st.none() | values))

    def image() -> tuple[Column, ...]:
        return tuple(Column(name, tp, flags, draw(values)) for name, tp, flags, values in columns)

    op = draw(st.sampled_from([Op.INSERT, Op.UPDATE, Op.DELETE]))
    new = image() if op != Op.DELETE else None
    old = image() if op != Op.INSERT else None
    return RowChange(draw(st.integers(0, U64)), draw(TEXT), draw(TEXT), op, new, old)


EVENTS = st.one_of(
    row_events(),
    st.builds(DDLEvent, st.integers(0, U64), TEXT, TEXT, st.text(max_size=40),
              st.none() | st.sampled_from([int(t) for t in DDLType])),
    st.builds(ResolvedEvent, st.integers(0, U64)),
)
OPTIONS = st.fixed_dictionaries({
    "enable-tidb-extension": st.sampled_from(["true", "false"]),
    "only-output-updated-columns": st.sampled_from(["true", "false"]),
})


@settings(max_examples=200, deadline=None)
@given(EVENTS, OPTIONS)
def test_round_trip_property(event: Event, options: dict[str, str]) -> None:
    extension = options["enable-tidb-extension"] == "true"
    if isinstance(event, ResolvedEvent) and not extension:
        with pytest.raises(EncodeError):
            CanalJsonEncoder(options).encode([event])
        return
    assert decode(encode_one(event, options), options) == [carried(event, extension)]


def assert_well_formed(events: list[Event]) -> None:
    """No garbage: every event is complete and every value has its column type's Python type."""
    assert isinstance(events, list) and events
    for event in events:
        assert event.source is CTX
        if isinstance(event, ResolvedEvent):
            assert type(event.commit_ts) is int and 0 <= event.commit_ts <= U64
            continue
        assert event.commit_ts is None or (type(event.commit_ts) is int and 0 <= event.commit_ts <= U64)
        if isinstance(event, DDLEvent):
            assert all(type(v) is str for v in (event.schema, event.table, event.query))
            continue
        assert isinstance(event, RowChange)
        assert type(event.schema) is str and type(event.table) is str
        assert event.op in (Op.INSERT, Op.UPDATE, Op.DELETE)
        assert (event.columns is None) == (event.op == Op.DELETE)
        assert event.old is not None or event.op != Op.DELETE
        if event.op == Op.INSERT:
            assert event.old is None
        for image in (event.columns, event.old):
            if image is None:
                continue
            assert type(image) is Image and image  # the decoder builds Images
            for col in image:
                assert type(col) is Column and type(col.name) is str and col.type in set(T)
                assert type(col.flags) is F
                if col.value is None:
                    continue
                if col.type in INTEGER_TYPES or col.type in (T.BIT, T.ENUM, T.SET):
                    assert type(col.value) is int
                elif col.type in (T.FLOAT, T.DOUBLE):
                    assert type(col.value) is float
                elif is_binary_column(col.type, col.flags):
                    assert type(col.value) is bytes
                else:
                    assert type(col.value) is str


def decode_or_error(value: bytes, options: dict[str, str]) -> None:
    try:
        events = decode(value, options)
    except DecodeError as exc:
        assert (exc.topic, exc.partition, exc.offset) == (CTX.topic, CTX.partition, CTX.offset)
        return
    assert_well_formed(events)


VALID_MESSAGES = [
    *(m.value for m in CanalJsonEncoder(EXT).encode(SHARED_EVENTS)),
    *(golden(p.name) for p in sorted(TESTDATA.glob("seed_*.json"))),
    golden("canal_multi_row_update.json"),
]
FUZZ_OPTIONS = st.sampled_from([EXT, {}])


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), FUZZ_OPTIONS)
def test_fuzz_random_bytes(value: bytes, options: dict[str, str]) -> None:
    decode_or_error(value, options)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(VALID_MESSAGES), st.data(), FUZZ_OPTIONS)
def test_fuzz_mutations_of_valid_messages(value: bytes, data: st.DataObject, options: dict[str, str]) -> None:
    i = data.draw(st.integers(0, len(value) - 1))
    how = data.draw(st.sampled_from(["truncate", "replace", "delete", "insert"]))
    if how == "truncate":
        mutated = value[:i]
    elif how == "replace":
        mutated = value[:i] + bytes([data.draw(st.integers(0, 255))]) + value[i + 1 :]
    elif how == "delete":
        mutated = value[:i] + value[i + 1 :]
    else:
        mutated = value[:i] + bytes([data.draw(st.integers(0, 255))]) + value[i:]
    decode_or_error(mutated, options)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 63), U64) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8) | st.sampled_from(["1", "-1", "int", "varbinary", "ā", "TIDB_WATERMARK", "UPDATE"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(VALID_MESSAGES), st.data(), JSON_VALUES, FUZZ_OPTIONS)
def test_fuzz_json_values_in_valid_messages(value: bytes, data: st.DataObject, replacement: Any,
                                            options: dict[str, str]) -> None:
    """A valid message with one field (or one nested value) replaced by an arbitrary JSON value."""
    msg = orjson.loads(value)
    node: Any = msg
    path = []
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            break
        k = data.draw(st.sampled_from(keys))
        path.append(k)
        child = node[k]
        if not isinstance(child, (dict, list)) or not child or data.draw(st.booleans()):
            node[k] = replacement
            break
        node = child
    decode_or_error(orjson.dumps(msg), options)


# --- the msgspec fast path decodes exactly as the orjson path -------------------------------------------


class _OrjsonOnly:
    """Within: the decoders take the orjson path for every message (the fast path is switched off)."""

    def __enter__(self) -> None:
        self._saved = canal_json_module._fast_parse
        canal_json_module._fast_parse = None

    def __exit__(self, *exc: object) -> None:
        canal_json_module._fast_parse = self._saved


def outcome(decoder: CanalJsonDecoder, value: bytes) -> tuple[Any, ...]:
    """What decoding gives: ("events", repr of the events) or ("error", error type, message)."""
    try:
        events = decoder.decode(None, value, CTX)
    except DecodeError as exc:
        return ("error", type(exc), str(exc))
    return ("events", repr(events))  # repr tells -0.0 from 0.0 and compares NaN


# decoders that have met every valid message (their caches hot), per option set, per path
_WARM: dict[tuple[str, bool], CanalJsonDecoder] = {}


def warm_decoder(options: dict[str, str], fast: bool) -> CanalJsonDecoder:
    key = (orjson.dumps(options).decode(), fast)
    decoder = _WARM.get(key)
    if decoder is None:
        decoder = _WARM[key] = CanalJsonDecoder(options)
        for value in VALID_MESSAGES:
            outcome(decoder, value)
    return decoder


def assert_paths_agree(value: bytes, options: dict[str, str]) -> None:
    fast = outcome(warm_decoder(options, True), value)
    fresh = outcome(CanalJsonDecoder(options), value)
    with _OrjsonOnly():
        slow = outcome(warm_decoder(options, False), value)
    assert fast == slow
    assert fresh == slow


def test_fast_path_is_taken_for_ticdc_rows() -> None:
    value = CanalJsonEncoder(EXT).encode([cases.INSERT])[0].value
    decoder = CanalJsonDecoder(EXT)
    assert decoder.decode(None, value, CTX)[0] == carried(cases.INSERT._replace(source=CTX), True)
    assert decoder._last_raw_layout is not None  # the fast path built its layout
    with _OrjsonOnly():
        other = CanalJsonDecoder(EXT)
        assert other.decode(None, value, CTX) == decoder.decode(None, value, CTX)
        assert other._last_raw_layout is None


@pytest.mark.parametrize("value", VALID_MESSAGES, ids=range(len(VALID_MESSAGES)))
@pytest.mark.parametrize("options", [EXT, {}], ids=["ext", "plain"])
def test_fast_path_agrees_on_valid_messages(value: bytes, options: dict[str, str]) -> None:
    assert_paths_agree(value, options)


_INSERT_VALUE = CanalJsonEncoder(EXT).encode([cases.INSERT])[0].value.decode()


@pytest.mark.parametrize(
    "value",
    [
        # fields or values the fast path does not take, which the orjson path accepts or refuses
        _INSERT_VALUE.replace('"es":', '"gtid":"x","es":'),
        _INSERT_VALUE.replace('"es":', '"es":1e999,"x":'),
        _INSERT_VALUE.replace('"es":', '"es":1.5,"x":'),
        _INSERT_VALUE.replace('"es":', '"es":18446744073709551616,"x":'),
        _INSERT_VALUE.replace('"es":', '"es":1' + "0" * 400 + ',"x":'),
        _INSERT_VALUE.replace('"sql":""', '"sql":"\xff"'),
        _INSERT_VALUE.replace('"sql":""', '"sql":"\\ud800"'),
        _INSERT_VALUE.replace('"sqlType":{', '"sqlType":{"x":1e999,'),
        _INSERT_VALUE.replace('"sqlType":{', '"sqlType":{"\xff":1,'),
        _INSERT_VALUE.replace('"mysqlType":{', '"mysqlType":{"x":"int","y":1e999,'),
        _INSERT_VALUE.replace('"pkNames":["id"]', '"pkNames":["id",1e999]'),
        _INSERT_VALUE.replace('"pkNames":["id"]', '"pkNames":["nope"]'),
        _INSERT_VALUE.replace('"commitTs":', '"onlyHandleKey":true,"commitTs":'),
        _INSERT_VALUE.replace('"commitTs":', '"claimCheckLocation":"s3://x","commitTs":'),
        _INSERT_VALUE.replace('"commitTs":415508878783938562', '"commitTs":18446744073709551616'),
        _INSERT_VALUE.replace('"commitTs":415508878783938562', '"commitTs":-1'),
        _INSERT_VALUE.replace('"commitTs":415508878783938562', '"commitTs":null'),
        _INSERT_VALUE.replace('"_tidb":{"commitTs":415508878783938562}', '"_tidb":null'),
        _INSERT_VALUE.replace('"isDdl":false', '"isDdl":true'),
        _INSERT_VALUE.replace('"type":"INSERT"', '"type":"INSERT","type":"DELETE"'),
        _INSERT_VALUE.replace('"type":"INSERT"', '"type":"UPDATE"'),
        _INSERT_VALUE.replace('"old":null', '"old":5'),
        _INSERT_VALUE.replace('"old":null', '"old":[]'),
        _INSERT_VALUE.replace('"data":[{', '"data":[{"extra":"1",'),
        _INSERT_VALUE.replace('"data":[{"id":"1"', '"data":[{"id":"1","id":"2"'),
        _INSERT_VALUE.replace('"data":[{"id":"1"', '"data":[{"id":1'),
        _INSERT_VALUE.replace('"data":[{"id":"1"', '"data":[{"id":" 1_0 "'),
        _INSERT_VALUE.replace('"c_tinyint":"-128"', '"c_tinyint":"x"'),
        _INSERT_VALUE.replace('"c_float":"3.5"', '"c_float":"nan"'),
        _INSERT_VALUE.replace('"c_float":"3.5"', '"c_float":"-0"'),
        _INSERT_VALUE.replace('"c_varchar":"', '"c_varchar":"\\u0000\\ud83d\\ude00'),
        _INSERT_VALUE.replace('"data":[{', '"data":[]').split('"data":[]')[0] + '"data":[]}',
        _INSERT_VALUE + " ",
        _INSERT_VALUE + "x",
    ],
)
def test_fast_path_agrees_on_unusual_messages(value: str) -> None:
    assert value != _INSERT_VALUE  # the replacement applied
    for options in (EXT, {}):
        assert_paths_agree(value.encode("utf-8", "surrogateescape"), options)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(VALID_MESSAGES), st.data(), FUZZ_OPTIONS)
def test_fast_path_agrees_on_mutated_messages(value: bytes, data: st.DataObject, options: dict[str, str]) -> None:
    i = data.draw(st.integers(0, len(value) - 1))
    how = data.draw(st.sampled_from(["replace", "delete", "insert"]))
    if how == "replace":
        mutated = value[:i] + bytes([data.draw(st.integers(0, 255))]) + value[i + 1 :]
    elif how == "delete":
        mutated = value[:i] + value[i + 1 :]
    else:
        mutated = value[:i] + bytes([data.draw(st.integers(0, 255))]) + value[i:]
    assert_paths_agree(mutated, options)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(VALID_MESSAGES), st.data(), JSON_VALUES, FUZZ_OPTIONS)
def test_fast_path_agrees_on_replaced_json_values(value: bytes, data: st.DataObject, replacement: Any,
                                                 options: dict[str, str]) -> None:
    msg = orjson.loads(value)
    node: Any = msg
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            break
        k = data.draw(st.sampled_from(keys))
        child = node[k]
        if not isinstance(child, (dict, list)) or not child or data.draw(st.booleans()):
            node[k] = replacement
            break
        node = child
    assert_paths_agree(orjson.dumps(msg), options)


def test_error_messages_cap_what_they_quote() -> None:
    """A 5 MB value is quoted by its first 200 characters and its size; the dead-letter row keeps it all."""
    big = "9" * 100 + "x" * 5_000_000
    msg = {**orjson.loads(golden("seed_insert_tp_int.json")), "mysqlType": {"id": "int"}, "data": [{"id": big}]}
    with pytest.raises(DecodeError, match=r"column 'id' must be an integer, got '9+x+'… \(5000100 bytes\)") as info:
        decode(orjson.dumps(msg), {})
    assert len(str(info.value)) < 1000
    kind = {**orjson.loads(golden("seed_insert_tp_int.json")), "type": "Y" * 1_000_000}
    with pytest.raises(DecodeError, match=r"… \(1000000 bytes\)") as info:
        decode(orjson.dumps(kind), {})
    assert len(str(info.value)) < 1000


def test_a_column_order_is_written_code_for_at_its_compile_at_th_sighting_only() -> None:
    """A row shape's builders (generated code) cost what a few hundred rows cost the plain way: a stream of
    ever new shapes (``mysqlType``s, corrupt or hostile) decodes without writing code for any; a table's rows
    get theirs at the COMPILE_AT-th row, and decode alike."""
    def message(i: int, cols: int) -> bytes:
        types = {"id": "int", **{f"c{i}_{j}": "int" for j in range(cols)}}
        row = {"id": str(i), **{f"c{i}_{j}": str(j) for j in range(cols)}}
        return orjson.dumps({**seed_insert(), "mysqlType": types, "data": [row]})

    built: list[Any] = []
    original = canal_json_module._compile_builder

    def counting(*args: Any, **kwargs: Any) -> Any:
        built.append(args)
        return original(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("ticdc_delta.codec.base.COMPILE_AT", COMPILE_AT)  # (the codec tests' is 1: conftest)
        mp.setattr(canal_json_module, "_compile_builder", counting)
        decoder = CanalJsonDecoder({})
        for i in range(50):  # 50 shapes, each met once
            (event,) = decoder.decode(None, message(i, 3), CTX)
            assert event.columns[0] == Column("id", T.INT, KEY, i)
        assert not built
        for n in range(1, COMPILE_AT + 1):
            (event,) = decoder.decode(None, message(7, 3), CTX)
            assert len(built) == (2 if n >= COMPILE_AT - 1 else 0)  # checked and trusted (met once above)
        mp.setattr("ticdc_delta.codec.base.COMPILE_AT", 1)
        eager = CanalJsonDecoder({})
        assert eager.decode(None, message(7, 3), CTX) == decoder.decode(None, message(7, 3), CTX)
