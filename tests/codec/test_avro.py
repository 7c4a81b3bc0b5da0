"""TiCDC Avro: framing, schema sources, TiCDC semantics, golden vectors, round trips and fuzzing."""

from __future__ import annotations

import io
import json
import struct
import pickle
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastavro import parse_schema, schemaless_reader
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ticdc_delta.codec import avro as avro_module
from ticdc_delta.codec import decoder_for, encoder_for
from ticdc_delta.codec.avro import (
    AvroDecoder,
    AvroEncoder,
    AvroSchemas,
    sanitize_name,
    table_params,
)
from ticdc_delta.codec.model import (
    TEXT_OR_BINARY_TYPES,
    Column,
    DecodeContext,
    Op,
    RowChange,
)
from ticdc_delta.codec.model import (
    ColumnFlag as F,
)
from ticdc_delta.codec.model import (
    TypeCode as T,
)
from ticdc_delta.errors import (
    ConfigError,
    DecodeError,
    EncodeError,
    FramingError,
    SchemaNotFoundError,
    TransientError,
    TruncatedMessageError,
)

from . import cases as C

TESTDATA = Path(__file__).parent / "testdata" / "avro"
KEY = F.HANDLE_KEY | F.PRIMARY_KEY
CTX = C.CTX
EXT = {"enable-tidb-extension": "true"}

# The shared cases carry ENUM/SET as numbers (index / bit mask); Avro carries labels.
ENUM_ELEMENTS = ("a", "b", "c")
SET_ELEMENTS = ("a", "b", "c")


def with_labels(event: RowChange) -> RowChange:
    """The shared-case event with ENUM/SET values turned into the labels Avro carries."""

    def label(col: Column) -> Column:
        if col.value is None:
            return col
        if col.type == T.ENUM:
            return col._replace(value=ENUM_ELEMENTS[col.value - 1] if col.value else "")
        if col.type == T.SET:
            return col._replace(value=",".join(e for i, e in enumerate(SET_ELEMENTS) if col.value >> i & 1))
        return col

    def image(cols: tuple[Column, ...] | None) -> tuple[Column, ...] | None:
        return None if cols is None else tuple(label(c) for c in cols)

    return event._replace(columns=image(event.columns), old=image(event.old))


def avro_column(col: Column, key: bool) -> Column:
    """What a column becomes after an Avro round trip: Avro's coarser types and flags (see avro.py)."""
    code = col.type
    if code in (T.TINYINT, T.SMALLINT, T.MEDIUMINT):
        code = T.INT
    binary = code in TEXT_OR_BINARY_TYPES and bool(col.flags & F.BINARY)
    if code in TEXT_OR_BINARY_TYPES:
        code = T.BLOB if binary else T.VARCHAR
    flags = col.flags & F.NULLABLE
    if binary:
        flags |= F.BINARY
    if code in (T.INT, T.BIGINT) and col.flags & F.UNSIGNED:
        flags |= F.UNSIGNED
    if key:
        flags |= KEY
    return Column(col.name, int(code), F(flags), col.value)


def expected(event: RowChange, extension: bool, ctx: DecodeContext = CTX) -> RowChange:
    """The event an Avro decoder yields for ``event`` written with/without the TiDB extension."""
    if event.op == Op.DELETE:
        old = tuple(avro_column(c, True) for c in event.old or () if c.is_key)
        return RowChange(None, event.schema, event.table, Op.DELETE, None, old, ctx)
    cols = tuple(avro_column(c, c.is_key) for c in event.columns or ())
    if extension:
        return RowChange(event.commit_ts, event.schema, event.table, event.op, cols, None, ctx)
    return RowChange(None, event.schema, event.table, Op.INSERT, cols, None, ctx)


def round_trip(
    events: list[RowChange],
    options: dict[str, str],
    schemas: AvroSchemas | None = None,
    column_params: dict[tuple[str, str, str], dict[str, Any]] | None = None,
) -> list[Any]:
    schemas = schemas if schemas is not None else AvroSchemas()
    messages = AvroEncoder(options, schemas=schemas, column_params=column_params).encode(events)
    decoder = AvroDecoder(options, schemas=schemas)
    return [ev for key, value in messages for ev in decoder.decode(key, value, CTX)]


def frame(schema_id: int, body: bytes) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + body


def record_schema(fields: list[dict[str, Any]], name: str = "t", namespace: str = "default.test") -> str:
    return json.dumps({"type": "record", "name": name, "namespace": namespace, "fields": fields})


def column_field(name: str, tidb_type: str, avro: str, nullable: bool = False, **extra: Any) -> dict[str, Any]:
    inner = {"type": avro, "connect.parameters": {"tidb_type": tidb_type}, **extra}
    if nullable:
        return {"default": None, "name": name, "type": ["null", inner]}
    return {"name": name, "type": inner}


class FakeRegistry:
    """An in-process Schema Registry client with confluent-kafka's interface and semantics.

    It counts lookups and can refuse a subject (HTTP 409), which confluent's mock cannot, and it needs
    none of the ``[schemaregistry]`` extras; :func:`test_confluent_mock_registry_round_trip` runs
    confluent's own mock.
    """

    class NotFound(Exception):
        http_status_code = 404

    class Incompatible(Exception):
        http_status_code = 409

    def __init__(self) -> None:
        self.by_id: dict[int, Any] = {}
        self.subjects: dict[str, list[int]] = {}
        self.lookups = 0
        self.refuse: set[str] = set()

    def register_schema(self, subject: str, schema: Any, normalize_schemas: bool = False) -> int:
        if subject in self.refuse:
            raise self.Incompatible(f"schema being registered is incompatible with an earlier one ({subject})")
        for sid, known in self.by_id.items():
            if known.schema_str == schema.schema_str:
                break
        else:
            sid = len(self.by_id) + 1
            self.by_id[sid] = schema
        versions = self.subjects.setdefault(subject, [])
        if sid not in versions:
            versions.append(sid)
        return sid

    def get_schema(self, schema_id: int, subject_name: str | None = None, fmt: str | None = None) -> Any:
        self.lookups += 1
        if schema_id not in self.by_id:
            raise self.NotFound("Schema Not Found")
        return self.by_id[schema_id]

    def get_versions(self, subject: str) -> list[int]:
        if subject not in self.subjects:
            raise self.NotFound(f"Subject {subject} not found")
        return list(range(1, len(self.subjects[subject]) + 1))

    def get_version(self, subject: str, version: int) -> Any:
        class Registered:
            schema_id = self.subjects[subject][version - 1]

        return Registered()


# --------------------------------------------------------------------------------------------------
# The shared cases


@pytest.mark.parametrize("event", C.ROW_EVENTS, ids=lambda e: e.op)
@pytest.mark.parametrize("extension", [False, True], ids=["plain", "extension"])
@pytest.mark.parametrize(
    "modes",
    [
        {},
        {"avro-decimal-handling-mode": "string", "avro-bigint-unsigned-handling-mode": "string"},
    ],
    ids=["precise-long", "string-string"],
)
def test_shared_cases_round_trip(event: RowChange, extension: bool, modes: dict[str, str]) -> None:
    options = {"enable-tidb-extension": str(extension).lower(), **modes}
    assert round_trip([with_labels(event)], options) == [expected(with_labels(event), extension)]


def test_shared_case_key_only_delete() -> None:
    assert round_trip([C.DELETE_KEY_ONLY], EXT) == [expected(C.DELETE_KEY_ONLY, True)]


@pytest.mark.parametrize("event", [e for e in C.ALL_EVENTS if not isinstance(e, RowChange)], ids=lambda e: e.kind)
def test_encoder_refuses_ddl_and_resolved(event: Any) -> None:
    with pytest.raises(EncodeError, match=f"not {event.kind} events"):
        AvroEncoder(EXT).encode([event])


def test_encoder_maps_enum_and_set_numbers_with_elements() -> None:
    elements = {(C.SCHEMA, C.TABLE, "c_enum"): ENUM_ELEMENTS, (C.SCHEMA, C.TABLE, "c_set"): SET_ELEMENTS}
    schemas = AvroSchemas()
    encoder = AvroEncoder(EXT, schemas=schemas, enum_elements=elements)
    (key, value), = encoder.encode([C.INSERT])
    (event,) = AvroDecoder(EXT, schemas=schemas).decode(key, value, CTX)
    assert event == expected(with_labels(C.INSERT), True)
    assert event.new_values()["c_enum"] == "a" and event.new_values()["c_set"] == "a,b"
    value_schema = json.loads(schemas.get(int.from_bytes(value[1:5], "big")))
    enum_field = next(f for f in value_schema["fields"] if f["name"] == "c_enum")
    assert enum_field["type"][1]["connect.parameters"] == {"allowed": "a,b,c", "tidb_type": "ENUM"}


@pytest.mark.parametrize("column, what", [("c_enum", "ENUM label"), ("c_set", "SET labels")])
def test_encoder_refuses_enum_numbers_without_elements(column: str, what: str) -> None:
    only = C.INSERT._replace(columns=tuple(c for c in C.INSERT.columns if c.name in {"id", column}))
    with pytest.raises(EncodeError, match=f"all_types column {column}: expected the {what} \\(str\\), got '\\d'"):
        AvroEncoder(EXT).encode([only])


# --------------------------------------------------------------------------------------------------
# Golden vectors: hand-built messages against hand-written TiCDC schemas (make_vectors.py)


def golden() -> tuple[AvroSchemas, list[dict[str, Any]]]:
    doc = json.loads((TESTDATA / "vectors.json").read_text(encoding="utf-8"))
    schemas = AvroSchemas.from_files(
        {doc["key_schema_id"]: TESTDATA / "t_key.avsc", doc["value_schema_id"]: TESTDATA / "t_value.avsc"}
    )
    return schemas, doc["vectors"]


def golden_image(cols: list[list[Any]] | None) -> tuple[Column, ...] | None:
    if cols is None:
        return None
    out = []
    for name, code, flags, value in cols:
        if isinstance(value, dict):
            value = bytes.fromhex(value["hex"])
        out.append(Column(name, code, F(flags), value))
    return tuple(out)


@pytest.mark.parametrize("name", ["insert", "update", "delete"])
def test_golden_vectors_from_local_schema_files(name: str) -> None:
    schemas, vectors = golden()
    vector = next(v for v in vectors if v["name"] == name)
    value = bytes.fromhex(vector["value"]) if vector["value"] else None
    events = AvroDecoder(EXT, schemas=schemas).decode(bytes.fromhex(vector["key"]), value, CTX)
    want = vector["expect"]
    assert events == [
        RowChange(
            want["commit_ts"], want["schema"], want["table"], want["op"],
            golden_image(want["columns"]), golden_image(want["old"]), CTX,
        )
    ]


def test_golden_decimal_bigint_bit_and_float_values() -> None:
    # unscaled 123456789 at scale 4, a long of -1 for BIGINT UNSIGNED max, BIT b"\x51", Avro float
    schemas, vectors = golden()
    v = vectors[0]
    (event,) = AvroDecoder({}, schemas=schemas).decode(bytes.fromhex(v["key"]), bytes.fromhex(v["value"]), CTX)
    values = event.new_values()
    assert values["price"] == "12345.6789"
    assert values["big"] == 18446744073709551615
    assert values["flags"] == 81
    assert values["ratio"] == 3.5
    assert event.source is CTX


def test_golden_vectors_match_fastavro_reading() -> None:
    # the vectors are plain Avro: fastavro reads them with the .avsc files and consumes every byte
    _, vectors = golden()
    value_schema = parse_schema(json.loads((TESTDATA / "t_value.avsc").read_text()))
    raw = bytes.fromhex(vectors[0]["value"])
    fo = io.BytesIO(raw[5:])
    assert schemaless_reader(fo, value_schema)["_tidb_op"] == "c"
    assert fo.tell() == len(raw) - 5


# --------------------------------------------------------------------------------------------------
# Framing and errors


@pytest.fixture
def golden_decoder() -> AvroDecoder:
    return AvroDecoder(EXT, schemas=golden()[0])


def test_wrong_magic_byte_is_a_framing_error(golden_decoder: AvroDecoder) -> None:
    with pytest.raises(FramingError, match=r"value: expected magic byte 0, got 0x7b") as info:
        golden_decoder.decode(None, b'{"id": 1}', CTX)
    error = info.value
    assert (error.protocol, error.topic, error.partition, error.offset) == ("avro", "tidb-cdc", 0, 7)
    with pytest.raises(FramingError, match=r"key: expected magic byte 0, got 0x01"):
        golden_decoder.decode(b"\x01\x00\x00\x00\x65\x02", None, CTX)


@pytest.mark.parametrize("data", [b"\x00", b"\x00\x00\x00\x00"], ids=["1-byte", "4-byte"])
def test_short_message_is_truncated(golden_decoder: AvroDecoder, data: bytes) -> None:
    with pytest.raises(TruncatedMessageError, match=f"expected at least 5 bytes .* found {len(data)}"):
        golden_decoder.decode(None, data, CTX)


def test_unknown_schema_id(golden_decoder: AvroDecoder) -> None:
    with pytest.raises(SchemaNotFoundError, match=r"unknown schema id 7: not among the 2 local schemas") as info:
        golden_decoder.decode(None, frame(7, b"\x02"), CTX)
    assert info.value.offset == 7 and "tidb-cdc[0]@7" in str(info.value)


def test_record_that_ends_early_is_truncated(golden_decoder: AvroDecoder) -> None:
    _, vectors = golden()
    value = bytes.fromhex(vectors[0]["value"])
    with pytest.raises(TruncatedMessageError, match="value: the record of schema id 102 ends early"):
        golden_decoder.decode(bytes.fromhex(vectors[0]["key"]), value[:-3], CTX)


def test_trailing_bytes_after_the_record(golden_decoder: AvroDecoder) -> None:
    _, vectors = golden()
    with pytest.raises(DecodeError, match=r"key: 2 trailing bytes after the record of schema id 101"):
        golden_decoder.decode(bytes.fromhex(vectors[2]["key"]) + b"\x00\x00", None, CTX)


def test_bad_union_branch_is_a_decode_error(golden_decoder: AvroDecoder) -> None:
    key = frame(101, b"\x02")
    value = frame(102, b"\x02" + b"\x08")  # name's union has 2 branches; 4 is none of them
    with pytest.raises(DecodeError, match=r"value: invalid Avro for schema id 102: IndexError"):
        golden_decoder.decode(key, value, CTX)


def test_tombstone_without_key(golden_decoder: AvroDecoder) -> None:
    with pytest.raises(DecodeError, match="neither key nor value"):
        golden_decoder.decode(None, None, CTX)


def test_key_and_value_of_different_tables() -> None:
    schemas = AvroSchemas(
        {
            1: record_schema([column_field("id", "INT", "int")], name="other"),
            2: record_schema([column_field("id", "INT", "int")]),
        }
    )
    with pytest.raises(DecodeError, match=r"key schema 1 is for test.other, value schema 2 for test.t"):
        AvroDecoder({}, schemas=schemas).decode(frame(1, b"\x02"), frame(2, b"\x02"), CTX)


def test_key_columns_missing_from_value() -> None:
    schemas = AvroSchemas(
        {1: record_schema([column_field("k", "INT", "int")]), 2: record_schema([column_field("id", "INT", "int")])}
    )
    with pytest.raises(DecodeError, match=r"key columns \['k'\] of schema 1 are not in value schema 2"):
        AvroDecoder({}, schemas=schemas).decode(frame(1, b"\x02"), frame(2, b"\x02"), CTX)


def test_a_schema_that_is_not_ticdcs() -> None:
    plain = json.dumps({"type": "record", "name": "r", "fields": [{"name": "a", "type": "long"}]})
    decoder = AvroDecoder({}, schemas=AvroSchemas({5: plain}))
    for _ in range(2):  # the verdict is cached, the error stays the same
        with pytest.raises(DecodeError, match=r"schema id 5 is not a TiCDC Avro schema: field a: no connect\.param"):
            decoder.decode(None, frame(5, b"\x02"), CTX)


@pytest.mark.parametrize(
    "field, reason",
    [
        (column_field("a", "GEOMETRY", "bytes"), "unknown tidb_type 'GEOMETRY'"),
        (column_field("a", "INT", "string"), "tidb_type INT cannot be Avro 'string'"),
        (column_field("a", "DECIMAL", "bytes"), "a bytes DECIMAL needs logicalType decimal"),
        ({"name": "a", "type": ["null", "int", "long"]}, "expected a union of null and one type"),
    ],
)
def test_schema_field_checks(field: dict[str, Any], reason: str) -> None:
    decoder = AvroDecoder({}, schemas=AvroSchemas({5: record_schema([field])}))
    with pytest.raises(DecodeError, match=reason):
        decoder.decode(None, frame(5, b"\x02"), CTX)


@pytest.mark.parametrize(
    "field, body, reason",
    [
        (column_field("a", "BIT", "bytes"), b"\x12" + b"\x01" * 9, "field a: expected at most 8 bytes for a BIT"),
        (column_field("a", "BIGINT UNSIGNED", "string"), b"\x06abc", "expected a BIGINT UNSIGNED as decimal"),
        (
            column_field("a", "BIGINT UNSIGNED", "string"),
            b"\x28" + b"18446744073709551616",
            "expected a BIGINT UNSIGNED as decimal digits, got '18446744073709551616'",
        ),
        (column_field("a", "DECIMAL", "string"), b"\x061e5", "expected a decimal number, got '1e5'"),
        (
            column_field("a", "DECIMAL", "bytes", logicalType="decimal", precision=10, scale=2),
            b"\x00",
            "expected at least 1 byte for a DECIMAL",
        ),
    ],
    ids=["bit-too-long", "bigint-string", "bigint-too-big", "decimal-string", "decimal-empty"],
)
def test_bad_values_are_decode_errors(field: dict[str, Any], body: bytes, reason: str) -> None:
    decoder = AvroDecoder({}, schemas=AvroSchemas({5: record_schema([field])}))
    with pytest.raises(DecodeError, match=reason):
        decoder.decode(None, frame(5, body), CTX)


def test_not_null_float_columns_with_whole_number_defaults() -> None:
    """TiCDC writes a NOT NULL column's default into its field; for ``DOUBLE NOT NULL DEFAULT 0`` Go prints
    the float64 as ``0``, which fastavro refuses as a double's default. Decoding reads with the writer's
    schema alone, where defaults play no part: every row of such a table decodes."""
    fields = [column_field("id", "BIGINT", "long"),
              {"default": 0, **column_field("price", "DOUBLE", "double")},
              {"default": 1, **column_field("w", "FLOAT", "float")},
              {"default": -1, **column_field("n", "INT", "int")}]
    decoder = AvroDecoder({}, schemas=AvroSchemas({5: record_schema(fields)}))
    body = b"\x02" + struct.pack("<d", 9.5) + struct.pack("<f", 2.0) + b"\x0e"  # id 1, 9.5, 2.0, n 7
    for _ in range(2):  # (a schema refused once stays refused: the second message too)
        (event,) = decoder.decode(None, frame(5, body), CTX)
        assert event.new_values() == {"id": 1, "price": 9.5, "w": 2.0, "n": 7}


def test_bad_tidb_op() -> None:
    fields = [column_field("id", "INT", "int"), {"name": "_tidb_op", "type": "string"},
              {"name": "_tidb_commit_ts", "type": "long"}, {"name": "_tidb_commit_physical_time", "type": "long"}]
    decoder = AvroDecoder({}, schemas=AvroSchemas({5: record_schema(fields)}))
    with pytest.raises(DecodeError, match=r"expected _tidb_op \"c\" or \"u\", got 'd'"):
        decoder.decode(None, frame(5, b"\x02\x02d\x02\x02"), CTX)


def test_extension_required_but_missing() -> None:
    schemas = AvroSchemas({5: record_schema([column_field("id", "INT", "int")])})
    assert AvroDecoder({}, schemas=schemas).decode(None, frame(5, b"\x02"), CTX)[0].op == Op.INSERT
    # a setting that does not match the changefeed, not a bad message: a ConfigError (the job stops)
    with pytest.raises(ConfigError, match=r"source\.options: enable-tidb-extension is 'true', but the value "
                       r"schema id 5 \(test\.t\) of the message at tidb-cdc\[0\]@7 has no "
                       r"_tidb_op/_tidb_commit_ts fields.*set enable-tidb-extension to false"):
        AvroDecoder(EXT, schemas=schemas).decode(None, frame(5, b"\x02"), CTX)


def test_decoder_needs_schemas() -> None:
    with pytest.raises(ValueError, match="needs schemas="):
        AvroDecoder({})
    with pytest.raises(TypeError, match="schemas must be an AvroSchemas, got dict"):
        AvroDecoder({}, schemas={1: "{}"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="avro-decimal-handling-mode must be one of precise, string"):
        AvroDecoder({"avro-decimal-handling-mode": "exact"}, schemas=AvroSchemas())


def test_registry_wiring() -> None:
    schemas = AvroSchemas()
    encoder = encoder_for("avro", EXT, schemas=schemas)
    (key, value), = encoder.encode([with_labels(C.INSERT)])
    decoded = decoder_for("avro", EXT, schemas=schemas).decode(key, value, CTX)
    assert decoded == [expected(with_labels(C.INSERT), True)]


# --------------------------------------------------------------------------------------------------
# Options and TiCDC semantics


def test_delete_is_a_tombstone() -> None:
    schemas = AvroSchemas()
    (key, value), = AvroEncoder(EXT, schemas=schemas).encode([C.DELETE])
    assert value is None
    decoder = AvroDecoder(EXT, schemas=schemas)
    for tombstone in (None, b""):
        (event,) = decoder.decode(key, tombstone, CTX)
        assert (event.op, event.commit_ts, event.columns) == (Op.DELETE, None, None)
        assert event.old == (Column("id", int(T.BIGINT), KEY, 2),)
        assert event.key_columns() == ("id",)


def test_delete_needs_a_key_column() -> None:
    no_key = C.DELETE._replace(old=tuple(c for c in C.DELETE.old if not c.is_key))
    with pytest.raises(EncodeError, match="has no handle-key column"):
        AvroEncoder(EXT).encode([no_key])


def test_extension_off_reads_update_as_insert_without_commit_ts() -> None:
    (event,) = round_trip([with_labels(C.UPDATE)], {})
    assert (event.op, event.commit_ts, event.old) == (Op.INSERT, None, None)


def test_extension_on_writes_ticdc_fields() -> None:
    schemas = AvroSchemas()
    (_, value), = AvroEncoder(EXT, schemas=schemas).encode([with_labels(C.UPDATE)])
    schema = json.loads(schemas.get(int.from_bytes(value[1:5], "big")))
    assert [f["name"] for f in schema["fields"][-3:]] == [
        "_tidb_op", "_tidb_commit_ts", "_tidb_commit_physical_time"
    ]
    record = schemaless_reader(io.BytesIO(value[5:]), parse_schema(schema))
    assert record["_tidb_op"] == "u"
    assert record["_tidb_commit_ts"] == C.TS2
    assert record["_tidb_commit_physical_time"] == C.TS2 >> 18  # ms since the epoch


def value_record(options: dict[str, str], event: RowChange) -> tuple[dict[str, Any], dict[str, Any]]:
    """The value schema (JSON) and the raw Avro record the encoder wrote for ``event``."""
    schemas = AvroSchemas()
    (_, value), = AvroEncoder(options, schemas=schemas).encode([event])
    schema = json.loads(schemas.get(int.from_bytes(value[1:5], "big")))
    fields = [{**f, "type": strip_logical(f["type"])} for f in schema["fields"]]
    parsed = parse_schema({**schema, "fields": fields})
    return schema, schemaless_reader(io.BytesIO(value[5:]), parsed)


def strip_logical(t: Any) -> Any:
    if isinstance(t, list):
        return [strip_logical(x) for x in t]
    if isinstance(t, dict):
        return {k: v for k, v in t.items() if k != "logicalType"}
    return t


def field_type(schema: dict[str, Any], name: str) -> dict[str, Any]:
    t = next(f["type"] for f in schema["fields"] if f["name"] == name)
    return t[1] if isinstance(t, list) else t


def test_bigint_unsigned_long_mode_wraps_max_to_minus_one() -> None:
    schema, record = value_record({}, with_labels(C.INSERT))
    assert field_type(schema, "c_bigint_u") == {
        "type": "long", "connect.parameters": {"tidb_type": "BIGINT UNSIGNED"}
    }
    assert record["c_bigint_u"] == -1  # int64(18446744073709551615)
    assert round_trip([with_labels(C.INSERT)], {})[0].new_values()["c_bigint_u"] == 18446744073709551615


def test_bigint_unsigned_string_mode() -> None:
    options = {"avro-bigint-unsigned-handling-mode": "string"}
    schema, record = value_record(options, with_labels(C.INSERT))
    assert field_type(schema, "c_bigint_u")["type"] == "string"
    assert field_type(schema, "c_bigint")["type"] == "long"  # signed BIGINT stays a long
    assert record["c_bigint_u"] == "18446744073709551615"
    assert round_trip([with_labels(C.INSERT)], options)[0].new_values()["c_bigint_u"] == 18446744073709551615


def test_decimal_precise_mode() -> None:
    schema, record = value_record({}, with_labels(C.INSERT))
    assert field_type(schema, "c_decimal") == {
        "type": "bytes", "connect.parameters": {"tidb_type": "DECIMAL"},
        "logicalType": "decimal", "precision": 65, "scale": 7,
    }
    assert int.from_bytes(record["c_decimal"], "big", signed=True) == 1290121230000
    assert round_trip([with_labels(C.UPDATE)], EXT)[0].new_values()["c_decimal"] == "-0.0000001"


def test_decimal_string_mode() -> None:
    options = {"avro-decimal-handling-mode": "string"}
    schema, record = value_record(options, with_labels(C.INSERT))
    assert field_type(schema, "c_decimal") == {"type": "string", "connect.parameters": {"tidb_type": "DECIMAL"}}
    assert record["c_decimal"] == "129012.1230000"
    assert round_trip([with_labels(C.INSERT)], options)[0].new_values()["c_decimal"] == "129012.1230000"


@pytest.mark.parametrize(
    "unscaled, scale, text",
    [
        (1290121230000, 7, "129012.1230000"),
        (-1, 7, "-0.0000001"),
        (0, 2, "0.00"),
        (-42, 0, "-42"),
        (10**64, 30, None),
    ],
)
def test_decimal_bytes_are_formatted_exactly(unscaled: int, scale: int, text: str | None) -> None:
    field = column_field("d", "DECIMAL", "bytes", logicalType="decimal", precision=65, scale=scale)
    raw = unscaled.to_bytes(((unscaled + (unscaled < 0)).bit_length() + 8) // 8, "big", signed=True)
    body = bytes([len(raw) * 2]) + raw
    (event,) = AvroDecoder({}, schemas=AvroSchemas({5: record_schema([field])})).decode(None, frame(5, body), CTX)
    want = text if text is not None else "1" + "0" * 34 + "." + "0" * 30
    assert event.new_values()["d"] == want


def test_decimal_scale_is_remembered_for_nulls_and_versions_follow_the_scale() -> None:
    schemas = AvroSchemas()
    encoder = AvroEncoder({}, schemas=schemas)

    def row(value: str | None) -> RowChange:
        cols = (Column("id", int(T.INT), KEY, 1), Column("d", int(T.DECIMAL), F.NULLABLE, value))
        return RowChange(None, "test", "t", Op.INSERT, cols, None)

    ids = [int.from_bytes(v[1:5], "big") for _, v in encoder.encode([row("1.50"), row(None), row("2.125")])]
    assert ids[0] == ids[1] != ids[2]  # NULL keeps scale 2; a new scale is a new schema version
    decoder = AvroDecoder({}, schemas=schemas)
    msgs = encoder.encode([row("1.50"), row(None), row("2.125")])
    assert [decoder.decode(k, v, CTX)[0].new_values()["d"] for k, v in msgs] == ["1.50", None, "2.125"]


def test_ticdc_type_mapping_in_the_schema() -> None:
    schema, _ = value_record({}, with_labels(C.INSERT))
    got = {f["name"]: (field_type(schema, f["name"])["type"], field_type(schema, f["name"])["connect.parameters"])
           for f in schema["fields"]}
    assert got["c_tinyint_u"] == ("int", {"tidb_type": "INT UNSIGNED"})
    assert got["c_int_u"] == ("long", {"tidb_type": "INT UNSIGNED"})
    assert got["c_varbinary"] == ("bytes", {"tidb_type": "BLOB"})
    assert got["c_text"] == ("string", {"tidb_type": "TEXT"})
    assert got["c_bit"] == ("bytes", {"length": "64", "tidb_type": "BIT"})
    assert got["c_year"] == ("int", {"tidb_type": "YEAR"})
    assert got["c_time"] == ("string", {"tidb_type": "TIME"})
    assert schema["name"] == "all_types" and schema["namespace"] == "default.test"
    id_field = schema["fields"][0]
    assert id_field == {"name": "id", "type": {"type": "long", "connect.parameters": {"tidb_type": "BIGINT"}}}
    assert schema["fields"][1]["default"] is None and schema["fields"][1]["type"][0] == "null"


def test_subjects_follow_the_topic_name_strategy() -> None:
    registry = FakeRegistry()
    AvroEncoder({**EXT, "topic": "tidb.test.t"}, schemas=AvroSchemas.from_registry(registry)).encode(
        [with_labels(C.INSERT)]
    )
    assert sorted(registry.subjects) == ["tidb_test_t-key", "tidb_test_t-value"]


def test_a_changed_column_set_registers_a_new_version() -> None:
    registry = FakeRegistry()
    schemas = AvroSchemas.from_registry(registry)
    encoder = AvroEncoder(EXT, schemas=schemas)
    narrow = with_labels(C.INSERT)._replace(columns=with_labels(C.INSERT).columns[:3])
    wide = with_labels(C.INSERT)
    messages = encoder.encode([narrow, wide, narrow])
    assert len(registry.subjects["tidb-cdc-value"]) == 2 and len(registry.subjects["tidb-cdc-key"]) == 1
    decoder = AvroDecoder(EXT, schemas=schemas)
    assert [len(decoder.decode(k, v, CTX)[0].columns) for k, v in messages] == [3, len(wide.columns), 3]


def test_sanitized_names_round_trip() -> None:
    cols = (
        Column("id-1", int(T.BIGINT), KEY, 7),
        Column("1st", int(T.VARCHAR), F.NULLABLE, "x"),
        Column("ok_name", int(T.INT), F.NULLABLE, 3),
    )
    event = RowChange(5, "my-db", "2024.orders", Op.INSERT, cols, None)
    schemas = AvroSchemas()
    (key, value), = AvroEncoder(EXT, schemas=schemas).encode([event])
    schema = json.loads(schemas.get(int.from_bytes(value[1:5], "big")))
    assert (schema["name"], schema["namespace"]) == ("_2024_orders", "default.my_db")
    assert schema["connect.parameters"] == {"tidb_schema_name": "my-db", "tidb_table_name": "2024.orders"}
    assert [f["name"] for f in schema["fields"][:3]] == ["id_1", "_1st", "ok_name"]
    assert field_type(schema, "id_1")["connect.parameters"] == {"tidb_column_name": "id-1", "tidb_type": "BIGINT"}
    assert "tidb_column_name" not in field_type(schema, "ok_name")["connect.parameters"]
    assert AvroDecoder(EXT, schemas=schemas).decode(key, value, CTX) == [expected(event, True)]


def test_ticdc_schema_without_original_names_decodes_to_sanitized_names() -> None:
    schema = record_schema([column_field("c_1", "INT", "int")], name="_2024_orders", namespace="default.my_db")
    schemas = AvroSchemas({5: schema})
    (event,) = AvroDecoder({}, schemas=schemas).decode(None, frame(5, b"\x02"), CTX)
    assert (event.schema, event.table, event.columns[0].name) == ("my_db", "_2024_orders", "c_1")


def test_sanitize_name_matches_ticdc() -> None:
    assert sanitize_name("c-1") == "c_1"
    assert sanitize_name("9lives") == "_9lives"
    assert sanitize_name("测试") == "__"
    assert sanitize_name("a1_B") == "a1_B"


def test_names_that_collide_after_sanitizing() -> None:
    cols = (
        Column("id", int(T.INT), KEY, 1),
        Column("a-b", int(T.INT), F.NULLABLE, 1),
        Column("a_b", int(T.INT), F.NULLABLE, 2),
    )
    with pytest.raises(EncodeError, match=r"column 'a_b' of test.t is 'a_b' as an Avro name, which is taken"):
        AvroEncoder({}).encode([RowChange(1, "test", "t", Op.INSERT, cols, None)])


@pytest.mark.parametrize(
    "column, reason",
    [
        (Column("v", int(T.INT), F.NULLABLE, 2**31), r"expected an integer in \[-2147483648, 2147483647\]"),
        (Column("v", int(T.BIGINT), F.UNSIGNED, -1), "expected a BIGINT UNSIGNED"),
        (Column("v", int(T.VARCHAR), F.NULLABLE, b"x"), "expected str, got bytes"),
        (Column("v", int(T.BLOB), F.BINARY, "x"), "expected bytes, got str"),
        (Column("v", int(T.DECIMAL), F.NULLABLE, "1e5"), "expected a DECIMAL as a decimal number string"),
        (Column("v", int(T.VARCHAR), F.NONE, None), "NULL in a column without the nullable flag"),
        (Column("v", int(T.GEOMETRY), F.NULLABLE, b""), "type code 255, which TiCDC's Avro sink does not map"),
    ],
)
def test_encoder_value_checks(column: Column, reason: str) -> None:
    event = RowChange(1, "test", "t", Op.INSERT, (Column("id", int(T.INT), KEY, 1), column), None)
    with pytest.raises(EncodeError, match=reason):
        AvroEncoder({}).encode([event])


def test_extension_needs_commit_ts() -> None:
    with pytest.raises(EncodeError, match="enable-tidb-extension needs a commit ts"):
        AvroEncoder(EXT).encode([with_labels(C.INSERT)._replace(commit_ts=None)])


# --------------------------------------------------------------------------------------------------
# Column parameters: DECIMAL(p, s) and ENUM/SET members, which only the schemas carry (no DDL in Avro)

# what the all_types table's DDL would declare for its parameterised columns
ALL_TYPES_PARAMS: dict[tuple[str, str, str], dict[str, Any]] = {
    (C.SCHEMA, C.TABLE, "c_decimal"): {"precision": 20, "scale": 7},
    (C.SCHEMA, C.TABLE, "c_enum"): {"members": list(ENUM_ELEMENTS)},
    (C.SCHEMA, C.TABLE, "c_set"): {"members": list(SET_ELEMENTS)},
}
ALL_TYPES_TABLE_PARAMS = {
    "c_decimal": {"precision": 20, "scale": 7, "members": None},
    "c_enum": {"precision": None, "scale": None, "members": ["a", "b", "c"]},
    "c_set": {"precision": None, "scale": None, "members": ["a", "b", "c"]},
}


def value_schema(schemas: AvroSchemas, value: bytes) -> str:
    return schemas.get(int.from_bytes(value[1:5], "big"))


def test_declared_params_in_precise_mode_round_trip_and_read_back() -> None:
    schemas = AvroSchemas()
    encoder = AvroEncoder(EXT, schemas=schemas, column_params=ALL_TYPES_PARAMS)
    messages = encoder.encode(list(C.ROW_EVENTS))  # ENUM/SET as numbers: the members map them
    decoder = AvroDecoder(EXT, schemas=schemas)
    got = [ev for k, v in messages for ev in decoder.decode(k, v, CTX)]
    assert got == [expected(with_labels(e), True) for e in C.ROW_EVENTS]
    text = value_schema(schemas, messages[0][1])
    assert field_type(json.loads(text), "c_decimal") == {
        "type": "bytes", "connect.parameters": {"tidb_type": "DECIMAL"},
        "logicalType": "decimal", "precision": 20, "scale": 7,
    }
    assert table_params(text) == (C.SCHEMA, C.TABLE, ALL_TYPES_TABLE_PARAMS)
    ids = sorted(schemas.known_ids)  # the key schema (id only) adds nothing
    assert schemas.table_params_for(ids) == {(C.SCHEMA, C.TABLE): ALL_TYPES_TABLE_PARAMS}


def test_string_mode_writes_what_tiflow_writes_so_precision_is_unknown() -> None:
    """tiflow's columnToAvroSchema gives a string-mode DECIMAL only its tidb_type: the declared precision
    and scale only check the values."""
    options = {**EXT, "avro-decimal-handling-mode": "string"}
    schemas = AvroSchemas()
    (key, value), = AvroEncoder(options, schemas=schemas, column_params=ALL_TYPES_PARAMS).encode([C.INSERT])
    text = value_schema(schemas, value)
    decimal_type = field_type(json.loads(text), "c_decimal")
    assert decimal_type == {"type": "string", "connect.parameters": {"tidb_type": "DECIMAL"}}
    _, _, params = table_params(text)
    assert "c_decimal" not in params and params["c_enum"]["members"] == ["a", "b", "c"]
    assert AvroDecoder(options, schemas=schemas).decode(key, value, CTX) == [expected(with_labels(C.INSERT), True)]


def test_without_params_the_schema_is_as_before() -> None:
    schemas = AvroSchemas()
    (_, value), = AvroEncoder(EXT, schemas=schemas).encode([with_labels(C.INSERT)])
    _, _, params = table_params(value_schema(schemas, value))
    assert params == {"c_decimal": {"precision": 65, "scale": 7, "members": None}}  # 65: unknown


@pytest.mark.parametrize("mode", ["precise", "string"])
@pytest.mark.parametrize(
    "declared, value, reason",
    [
        ({"precision": 4, "scale": 2}, "123.45", r"'123.45' has more digits than DECIMAL\(4,2\) holds"),
        ({"precision": 4, "scale": 2}, "1.5", "expected 2 fractional digits, got '1.5'"),
        ({"precision": 4}, "-99999", r"'-99999' has more digits than DECIMAL\(4(,0)?\) holds"),
        ({"precision": 4, "scale": 2}, "1e5", "expected a DECIMAL as a decimal number string"),
    ],
)
def test_decimal_values_must_fit_the_declared_type(
    mode: str, declared: dict[str, Any], value: str, reason: str
) -> None:
    cols = (Column("id", int(T.INT), KEY, 1), Column("d", int(T.DECIMAL), F.NULLABLE, value))
    encoder = AvroEncoder({"avro-decimal-handling-mode": mode}, column_params={("test", "t", "d"): declared})
    with pytest.raises(EncodeError, match=f"avro: test.t column d: {reason}"):
        encoder.encode([RowChange(1, "test", "t", Op.INSERT, cols, None)])


def test_declared_precision_alone_keeps_the_scale_of_the_values() -> None:
    schemas = AvroSchemas()
    cols = (Column("id", int(T.INT), KEY, 1), Column("d", int(T.DECIMAL), F.NULLABLE, "-99.99"))
    event = RowChange(1, "test", "t", Op.INSERT, cols, None)
    encoder = AvroEncoder({}, schemas=schemas, column_params={("test", "t", "d"): {"precision": 4}})
    (_, value), = encoder.encode([event])
    assert table_params(value_schema(schemas, value))[2] == {"d": {"precision": 4, "scale": 2, "members": None}}
    assert AvroDecoder({}, schemas=schemas).decode(None, value, CTX)[0].new_values()["d"] == "-99.99"


def test_members_with_commas_are_escaped_as_tiflow_does() -> None:
    members = ["a,b", "c", "", "it's"]
    cols = (Column("id", int(T.INT), KEY, 1), Column("s", int(T.SET), F.NULLABLE, 0b1001))
    schemas = AvroSchemas()
    encoder = AvroEncoder({}, schemas=schemas, column_params={("test", "t", "s"): {"members": members}})
    (_, value), = encoder.encode([RowChange(1, "test", "t", Op.INSERT, cols, None)])
    text = value_schema(schemas, value)
    assert field_type(json.loads(text), "s")["connect.parameters"]["allowed"] == "a\\,b,c,,it's"
    assert table_params(text)[2]["s"]["members"] == members
    assert AvroDecoder({}, schemas=schemas).decode(None, value, CTX)[0].new_values()["s"] == "a,b,it's"


def test_column_params_members_win_over_enum_elements() -> None:
    key = (C.SCHEMA, C.TABLE, "c_enum")
    encoder = AvroEncoder(
        EXT, enum_elements={key: ("x", "y", "z")}, column_params={key: {"members": ENUM_ELEMENTS}}
    )
    only = C.INSERT._replace(columns=tuple(c for c in C.INSERT.columns if c.name in {"id", "c_enum"}))
    (key_bytes, value), = encoder.encode([only])
    assert AvroDecoder(EXT, schemas=encoder.schemas).decode(key_bytes, value, CTX)[0].new_values()["c_enum"] == "a"
    # params without members keep the enum_elements' members
    encoder = AvroEncoder(EXT, enum_elements={key: ("x", "y")}, column_params={key: {"precision": None}})
    (key_bytes, value), = encoder.encode([only])
    assert AvroDecoder(EXT, schemas=encoder.schemas).decode(key_bytes, value, CTX)[0].new_values()["c_enum"] == "x"


@pytest.mark.parametrize(
    "params, error, match",
    [
        ({("t", "d"): {}}, TypeError, r"column_params keys must be \(schema, table, column\) tuples of str"),
        ({("s", "t", "d"): 10}, TypeError, r"column_params\[\('s', 't', 'd'\)\] must be a mapping, got int"),
        ({("s", "t", "d"): {"length": 3}}, ValueError, r"unknown keys \['length'\]; expected precision, scale"),
        ({("s", "t", "d"): {"precision": 0}}, ValueError, r"precision must be in 1..65, got 0"),
        ({("s", "t", "d"): {"precision": "10"}}, TypeError, r"precision must be an int or None, got str"),
        ({("s", "t", "d"): {"precision": True}}, TypeError, r"precision must be an int or None, got bool"),
        ({("s", "t", "d"): {"precision": 10, "scale": 11}}, ValueError, r"scale must be in 0..10, got 11"),
        ({("s", "t", "d"): {"scale": 31}}, ValueError, r"scale must be in 0..30, got 31"),
        ({("s", "t", "d"): {"members": "ab"}}, TypeError, r"members must be a sequence of str"),
        ({("s", "t", "d"): {"members": [1]}}, TypeError, r"members must be a sequence of str"),
    ],
)
def test_column_params_are_checked_eagerly(params: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        AvroEncoder({}, column_params=params)


def test_table_params_of_a_hand_written_ticdc_schema() -> None:
    assert table_params((TESTDATA / "t_value.avsc").read_text()) == ("test", "t", {
        "price": {"precision": 10, "scale": 4, "members": None},
        "color": {"precision": None, "scale": None, "members": ["red", "green", "blue"]},
    })
    assert table_params((TESTDATA / "t_key.avsc").read_text()) == ("test", "t", {})
    # a precision the schema leaves out is unknown; the scale defaults to 0 (Avro spec)
    field = column_field("d", "DECIMAL", "bytes", nullable=True, logicalType="decimal")
    assert table_params(record_schema([field]))[2] == {"d": {"precision": None, "scale": 0, "members": None}}


def test_table_params_restores_the_original_names() -> None:
    cols = (Column("id", int(T.INT), KEY, 1), Column("amount-1", int(T.DECIMAL), F.NULLABLE, "1.00"))
    schemas = AvroSchemas()
    params = {("my-db", "2024.orders", "amount-1"): {"precision": 6, "scale": 2}}
    (_, value), = AvroEncoder({}, schemas=schemas, column_params=params).encode(
        [RowChange(1, "my-db", "2024.orders", Op.INSERT, cols, None)]
    )
    assert table_params(value_schema(schemas, value)) == (
        "my-db", "2024.orders", {"amount-1": {"precision": 6, "scale": 2, "members": None}}
    )


@pytest.mark.parametrize(
    "text, reason",
    [
        ("{nope", "not JSON"),
        ('{"type": "string"}', "expected an Avro record schema"),
        (record_schema([{"name": "a", "type": "int"}]), "field a: no connect.parameters.tidb_type"),
        (record_schema([column_field("d", "DECIMAL", "bytes", logicalType="decimal", precision=0)]),
         "field d: a DECIMAL precision must be an int in 1..65, got 0"),
        (record_schema([column_field("d", "DECIMAL", "bytes", logicalType="decimal", precision=3, scale=5)]),
         "field d: a DECIMAL scale must be an int in 0..30 and at most the precision, got 5"),
        (record_schema([{"name": "e", "type": {"type": "string",
                                               "connect.parameters": {"tidb_type": "ENUM", "allowed": 3}}}]),
         "field e: connect.parameters allowed must be a string, got 3"),
    ],
)
def test_table_params_of_a_schema_that_is_not_ticdcs(text: str, reason: str) -> None:
    with pytest.raises(DecodeError, match=f"not a TiCDC Avro schema: {reason}"):
        table_params(text)
    if text != "{nope":  # AvroSchemas itself refuses a schema that is not a JSON object
        with pytest.raises(DecodeError, match=f"schema id 5 is not a TiCDC Avro schema: {reason}"):
            AvroSchemas({5: text}).table_params_for([5])


def test_table_params_for_merges_versions_in_order() -> None:
    def decimal(name: str, precision: int, scale: int) -> dict[str, Any]:
        return column_field(name, "DECIMAL", "bytes", nullable=True, logicalType="decimal", precision=precision,
                            scale=scale)

    def members(name: str, kind: str, allowed: str) -> dict[str, Any]:
        inner = {"type": "string", "connect.parameters": {"tidb_type": kind, "allowed": allowed}}
        return {"default": None, "name": name, "type": ["null", inner]}

    key = column_field("id", "INT", "int")
    v1 = record_schema([key, decimal("d", 10, 2), members("e", "ENUM", "a,b")])
    v2 = record_schema([key, decimal("d", 12, 4), column_field("e", "INT", "int"), members("f", "SET", "x")])
    other = record_schema([key], name="u")
    schemas = AvroSchemas({1: v1, 2: v2, 3: other})
    assert schemas.table_params_for([1, 2, 3]) == {
        ("test", "t"): {
            "d": {"precision": 12, "scale": 4, "members": None},  # the later version wins
            "f": {"precision": None, "scale": None, "members": ["x"]},  # e became an INT: nothing known
        },
        ("test", "u"): {},
    }
    assert schemas.table_params_for([2, 1])[("test", "t")] == {
        "d": {"precision": 12, "scale": 4, "members": None},  # a DECIMAL holds the values of both versions
        "e": {"precision": None, "scale": None, "members": ["a", "b"]},
        "f": {"precision": None, "scale": None, "members": ["x"]},
    }
    with pytest.raises(SchemaNotFoundError, match="unknown schema id 4"):
        schemas.table_params_for([1, 4])
    # (12,4), (10,2), then (12,4) registered again: the registry hands back id 5, so no order of ids says
    # which came last, and messages of both versions are in Kafka; the column takes the values of both
    wide, narrow = record_schema([key, decimal("d", 12, 4)]), record_schema([key, decimal("d", 10, 2)])
    again = AvroSchemas({5: wide, 6: narrow})
    for order in ([5, 6], [6, 5]):
        assert again.table_params_for(order)[("test", "t")]["d"] == {"precision": 12, "scale": 4, "members": None}
    mixed = AvroSchemas({7: record_schema([key, decimal("d", 20, 2)]), 8: record_schema([key, decimal("d", 10, 6)])})
    assert mixed.table_params_for([7, 8])[("test", "t")]["d"] == {"precision": 24, "scale": 6, "members": None}


# --------------------------------------------------------------------------------------------------
# Schema sources


def test_dict_backed_register_is_deterministic() -> None:
    text = record_schema([column_field("id", "INT", "int")])
    a, b = AvroSchemas(), AvroSchemas()
    assert a.register("s-value", text) == b.register("other-value", text) == a.register("s-value", text)
    assert a.known_ids == b.known_ids


def test_dict_backed_register_probes_past_collisions() -> None:
    text = record_schema([column_field("id", "INT", "int")])
    first = AvroSchemas().register("s", text)
    other = record_schema([column_field("x", "INT", "int")])
    schemas = AvroSchemas({first: other})  # pretend another schema already holds that id
    assert schemas.register("s", text) == first + 1
    assert schemas.get(first) == other


def test_local_files_round_trip(tmp_path: Path) -> None:
    written = AvroSchemas()
    messages = AvroEncoder(EXT, schemas=written).encode([with_labels(e) for e in C.ROW_EVENTS])
    files = {}
    for sid in written.known_ids:
        path = tmp_path / f"{sid}.avsc"
        path.write_text(written.get(sid), encoding="utf-8")
        files[sid] = path
    local = AvroSchemas.from_files(files)
    decoder = AvroDecoder(EXT, schemas=local)
    got = [ev for k, v in messages for ev in decoder.decode(k, v, CTX)]
    assert got == [expected(with_labels(e), True) for e in C.ROW_EVENTS]


def test_local_file_may_be_the_registry_answer(tmp_path: Path) -> None:
    text = (TESTDATA / "t_key.avsc").read_text()
    path = tmp_path / "101.json"
    path.write_text(json.dumps({"schema": text}))  # GET /schemas/ids/101 saved as is
    (event,) = AvroDecoder({}, schemas=AvroSchemas.from_files({101: path})).decode(frame(101, b"\x02"), None, CTX)
    assert event.old == (Column("id", int(T.INT), KEY, 1),)


@pytest.mark.parametrize(
    "content, reason", [(None, "No such file"), ("{not json", "not JSON"), ("[1]", "expected a JSON object")]
)
def test_bad_local_files_are_config_errors(tmp_path: Path, content: str | None, reason: str) -> None:
    path = tmp_path / "s.avsc"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=f"avro schema file for id 3 .*s.avsc.*{reason}"):
        AvroSchemas.from_files({3: path})


def test_registry_round_trip_resolves_lazily_and_caches() -> None:
    registry = FakeRegistry()
    AvroEncoder(EXT, schemas=AvroSchemas.from_registry(registry)).encode([with_labels(C.INSERT)])
    messages = AvroEncoder(EXT, schemas=AvroSchemas.from_registry(registry)).encode(
        [with_labels(e) for e in C.ROW_EVENTS]
    )
    registry.lookups = 0
    schemas = AvroSchemas.from_registry(registry)  # a fresh source: knows nothing yet
    assert schemas.known_ids == frozenset()
    decoder = AvroDecoder(EXT, schemas=schemas)
    got = [ev for _ in range(3) for k, v in messages for ev in decoder.decode(k, v, CTX)]
    assert got == [expected(with_labels(e), True) for e in C.ROW_EVENTS] * 3
    assert registry.lookups == 2  # key and value schema, once each
    assert schemas.known_ids == frozenset(registry.by_id)


def test_registry_unknown_id_and_failures() -> None:
    registry = FakeRegistry()
    decoder = AvroDecoder({}, schemas=AvroSchemas.from_registry(registry))
    with pytest.raises(SchemaNotFoundError, match="unknown schema id 9: the schema registry has none") as info:
        decoder.decode(None, frame(9, b"\x02"), CTX)
    assert info.value.topic == "tidb-cdc"

    class Down:
        def get_schema(self, schema_id: int) -> Any:
            raise ConnectionError("connection refused")

    with pytest.raises(TransientError, match="schema registry lookup of id 9 failed: ConnectionError"):
        AvroDecoder({}, schemas=AvroSchemas.from_registry(Down())).decode(None, frame(9, b"\x02"), CTX)


def test_registry_refusing_a_schema_is_an_encode_error() -> None:
    registry = FakeRegistry()
    registry.refuse.add("tidb-cdc-value")
    with pytest.raises(EncodeError, match="schema registry refused a schema for tidb-cdc-value: .*incompatible"):
        AvroEncoder(EXT, schemas=AvroSchemas.from_registry(registry)).encode([with_labels(C.INSERT)])


def test_from_registry_checks_the_client() -> None:
    with pytest.raises(TypeError, match="client must be a SchemaRegistryClient, got dict"):
        AvroSchemas.from_registry({})


def test_snapshot_pickles_and_decodes_without_the_registry() -> None:
    registry = FakeRegistry()
    driver = AvroSchemas.from_registry(registry)
    messages = AvroEncoder(EXT, schemas=driver).encode([with_labels(e) for e in C.ROW_EVENTS])
    with pytest.raises(TypeError, match=r"does not pickle; ship schemas.snapshot\(...\)"):
        pickle.dumps(driver)

    by_subject = AvroSchemas.from_registry(registry).snapshot(subjects=["tidb-cdc-key", "tidb-cdc-value"])
    by_id = driver.snapshot(sorted(registry.by_id))
    assert by_subject.known_ids == by_id.known_ids == frozenset(registry.by_id)

    registry.by_id.clear()  # the registry is gone: executors must not need it
    shipped = pickle.loads(pickle.dumps(by_id))
    assert repr(shipped) == "AvroSchemas(local, 2 schemas)"
    decoder = AvroDecoder(EXT, schemas=shipped)
    got = [ev for k, v in messages for ev in decoder.decode(k, v, CTX)]
    assert got == [expected(with_labels(e), True) for e in C.ROW_EVENTS]
    with pytest.raises(SchemaNotFoundError, match="unknown schema id 12345"):
        decoder.decode(None, frame(12345, b""), CTX)


def test_decoder_pickles_without_its_caches() -> None:
    schemas = AvroSchemas()
    messages = AvroEncoder(EXT, schemas=schemas).encode([with_labels(e) for e in C.ROW_EVENTS])
    decoder = AvroDecoder(EXT, schemas=schemas)
    decoder.decode(*messages[0], CTX)  # fills the caches (fastavro schemas, closures)
    shipped = pickle.loads(pickle.dumps(decoder))
    got = [ev for k, v in messages for ev in shipped.decode(k, v, CTX)]
    assert got == [expected(with_labels(e), True) for e in C.ROW_EVENTS]
    with pytest.raises(TypeError, match="registry-backed AvroSchemas does not pickle"):
        pickle.dumps(AvroDecoder({}, schemas=AvroSchemas.from_registry(FakeRegistry())))


def test_snapshot_of_unknown_subject() -> None:
    with pytest.raises(SchemaNotFoundError, match="no subject 'nope-value'"):
        AvroSchemas.from_registry(FakeRegistry()).snapshot(subjects=["nope-value"])
    with pytest.raises(SchemaNotFoundError, match="no schema registered under subject 'nope-value'"):
        AvroSchemas().snapshot(subjects=["nope-value"])


def test_confluent_mock_registry_round_trip() -> None:
    try:
        from confluent_kafka.schema_registry import SchemaRegistryClient
    except ImportError as exc:  # confluent-kafka without its [schemaregistry] extras (httpx, attrs, ...)
        pytest.skip(f"confluent_kafka.schema_registry unavailable: {exc}")
    conf = {"url": "mock://ticdc-delta-tests"}
    # confluent-kafka 2.x: new_client() picks the mock for mock://, the constructor does not
    new_client = getattr(SchemaRegistryClient, "new_client", None)
    client = new_client(conf) if new_client is not None else SchemaRegistryClient(conf)
    schemas = AvroSchemas.from_registry(client)
    messages = AvroEncoder(EXT, schemas=schemas).encode([with_labels(e) for e in C.ROW_EVENTS])
    shipped = pickle.loads(pickle.dumps(schemas.snapshot()))
    by_subject = AvroSchemas.from_registry(client).snapshot(subjects=["tidb-cdc-key", "tidb-cdc-value"])
    assert by_subject.known_ids == shipped.known_ids and len(shipped.known_ids) == 2
    for source in (AvroSchemas.from_registry(client), shipped, pickle.loads(pickle.dumps(by_subject))):
        decoder = AvroDecoder(EXT, schemas=source)
        got = [ev for k, v in messages for ev in decoder.decode(k, v, CTX)]
        assert got == [expected(with_labels(e), True) for e in C.ROW_EVENTS]
    with pytest.raises(SchemaNotFoundError):
        AvroDecoder({}, schemas=AvroSchemas.from_registry(client)).decode(None, frame(999999, b""), CTX)


# --------------------------------------------------------------------------------------------------
# Property tests: round trip and fuzz

_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_NAME = st.text(alphabet="acXYZ_-1 $", min_size=1, max_size=6)  # no "_tidb_..." collisions possible


def _ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.integers(lo, hi)


def _decimals(scale: int) -> st.SearchStrategy[str]:
    def fmt(n: int) -> str:
        sign, digits = ("-" if n < 0 else ""), str(abs(n)).rjust(scale + 1, "0")
        return sign + (digits if scale == 0 else f"{digits[:-scale]}.{digits[-scale:]}")

    return st.integers(-(10**20), 10**20).map(fmt)


# (type code, flags, value strategy); decimal columns get their scale per table
_KINDS: list[tuple[int, F, Any]] = [
    (T.TINYINT, F.NONE, _ints(-128, 127)),
    (T.TINYINT, F.UNSIGNED, _ints(0, 255)),
    (T.SMALLINT, F.NONE, _ints(-32768, 32767)),
    (T.MEDIUMINT, F.UNSIGNED, _ints(0, 16777215)),
    (T.INT, F.NONE, _ints(-(2**31), 2**31 - 1)),
    (T.INT, F.UNSIGNED, _ints(0, 2**32 - 1)),
    (T.BIGINT, F.NONE, _ints(-(2**63), 2**63 - 1)),
    (T.BIGINT, F.UNSIGNED, _ints(0, 2**64 - 1)),
    (T.YEAR, F.NONE, _ints(1901, 2155)),
    (T.FLOAT, F.NONE, st.floats(allow_nan=False, allow_infinity=False, width=32)),
    (T.DOUBLE, F.NONE, st.floats(allow_nan=False, allow_infinity=False)),
    (T.DECIMAL, F.NONE, None),
    (T.DATE, F.NONE, _TEXT),
    (T.DATETIME, F.NONE, _TEXT),
    (T.TIMESTAMP, F.NONE, _TEXT),
    (T.TIME, F.NONE, _TEXT),
    (T.JSON, F.NONE, _TEXT),
    (T.VARCHAR, F.NONE, _TEXT),
    (T.STRING, F.BINARY, st.binary(max_size=12)),
    (T.BLOB, F.NONE, _TEXT),
    (T.LONGBLOB, F.BINARY, st.binary(max_size=12)),
    (T.ENUM, F.NONE, _TEXT),
    (T.SET, F.NONE, _TEXT),
    (T.BIT, F.NONE, _ints(0, 2**64 - 1)),
]


_Case = tuple[list[RowChange], dict[str, str], dict[tuple[str, str, str], dict[str, Any]]]


@st.composite
def _table_events(draw: Any) -> _Case:
    names = draw(st.lists(_NAME, min_size=1, max_size=8, unique_by=sanitize_name))
    schema, table = draw(_NAME), draw(_NAME)
    key_kind = draw(st.sampled_from([(T.BIGINT, _ints(-(2**63), 2**63 - 1)), (T.VARCHAR, _TEXT)]))
    layout = [(names[0], int(key_kind[0]), KEY, key_kind[1])]
    params: dict[tuple[str, str, str], dict[str, Any]] = {}
    for name in names[1:]:
        code, flags, values = draw(st.sampled_from(_KINDS))
        if values is None:
            scale = draw(st.integers(0, 10))
            values = _decimals(scale)
            if draw(st.booleans()):  # declared: the values hold at most 21 digits
                params[(schema, table, name)] = {"precision": draw(st.integers(21, 65)), "scale": scale}
        if draw(st.booleans()):
            flags |= F.NULLABLE
            values = st.none() | values
        layout.append((name, int(code), F(flags), values))
    events = []
    for _ in range(draw(st.integers(1, 4))):
        image = tuple(Column(n, code, flags, draw(values)) for n, code, flags, values in layout)
        op = draw(st.sampled_from([Op.INSERT, Op.UPDATE, Op.DELETE]))
        ts = draw(st.integers(1, 2**64 - 1))
        if op == Op.DELETE:
            events.append(RowChange(ts, schema, table, op, None, image))
        else:
            events.append(RowChange(ts, schema, table, op, image, None))
    options = {
        "enable-tidb-extension": draw(st.sampled_from(["true", "false"])),
        "avro-decimal-handling-mode": draw(st.sampled_from(["precise", "string"])),
        "avro-bigint-unsigned-handling-mode": draw(st.sampled_from(["long", "string"])),
    }
    return events, options, params


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_table_events())
def test_property_round_trip(case: _Case) -> None:
    events, options, params = case
    extension = options["enable-tidb-extension"] == "true"
    assert round_trip(events, options, column_params=params) == [expected(e, extension) for e in events]


def _valid_messages() -> tuple[AvroSchemas, list[tuple[bytes | None, bytes | None]]]:
    schemas = AvroSchemas()
    encoder = AvroEncoder(EXT, schemas=schemas)
    messages = encoder.encode([with_labels(e) for e in C.ROW_EVENTS])
    plain = AvroEncoder({"avro-decimal-handling-mode": "string"}, schemas=schemas)
    messages += plain.encode([with_labels(C.INSERT)])
    return schemas, messages


_SCHEMAS, _MESSAGES = _valid_messages()
_KNOWN_HEADERS = sorted(frame(sid, b"") for sid in _SCHEMAS.known_ids)


def _framed(max_size: int) -> st.SearchStrategy[bytes]:
    """Random Avro bodies behind a valid header with a known schema id."""
    return st.tuples(st.sampled_from(_KNOWN_HEADERS), st.binary(max_size=max_size)).map(lambda hb: hb[0] + hb[1])


def _decode_or_typed_error(key: bytes | None, value: bytes | None) -> None:
    decoder = AvroDecoder({}, schemas=_SCHEMAS)
    try:
        events = decoder.decode(key, value, CTX)
    except DecodeError as exc:
        assert exc.protocol == "avro" and exc.offset == CTX.offset
        return
    assert len(events) == 1
    (event,) = events
    assert isinstance(event, RowChange) and event.op in (Op.INSERT, Op.UPDATE, Op.DELETE)
    image = event.columns if event.columns is not None else event.old
    assert image is not None and all(type(c) is Column and isinstance(c.name, str) for c in image)
    orjson.dumps([c.value for c in image if not isinstance(c.value, bytes)])  # plain, JSON-able values


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(st.none(), st.binary(max_size=40), _framed(60)),
    st.one_of(st.none(), st.binary(max_size=40), _framed(200)),
)
def test_fuzz_random_bytes(key: bytes | None, value: bytes | None) -> None:
    _decode_or_typed_error(key, value)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_fuzz_truncations_and_mutations(data: Any) -> None:
    key, value = data.draw(st.sampled_from(_MESSAGES))
    part = data.draw(st.sampled_from(["key", "value"] if value else ["key"]))
    target = key if part == "key" else value
    assert target is not None
    if data.draw(st.booleans()):
        mutated = target[: data.draw(st.integers(0, len(target) - 1))]
    else:
        pos = data.draw(st.integers(0, len(target) - 1))
        mutated = target[:pos] + bytes([data.draw(st.integers(0, 255))]) + target[pos + 1 :]
    if part == "key":
        _decode_or_typed_error(mutated, value)
    else:
        _decode_or_typed_error(key, mutated)


# --------------------------------------------------------------------------------------------------
# The generated readers (the fast path) against fastavro (AvroDecoder._decode_general)


def _outcome(decode: Any, key: bytes | None, value: bytes | None) -> str:
    """What decoding gives, comparable across paths: the events' repr (NaN-safe) or the typed error."""
    try:
        return repr(decode(key, value, CTX))
    except DecodeError as exc:
        # fastavro's messages may name its BytesIO object by address
        return re.sub(r" at 0x[0-9a-f]+", "", f"{type(exc).__name__}: {exc}")


def _warmed(schemas: AvroSchemas, messages: list[tuple[bytes | None, bytes | None]]) -> AvroDecoder:
    """A decoder that has read ``messages`` once, so each has its generated reader."""
    decoder = AvroDecoder({}, schemas=schemas)
    for key, value in messages:
        decoder.decode(key, value, CTX)
        header = (value[:5] + (key or b"")[:5]) if value else (key or b"")[:5]
        assert header in (decoder._fast if value else decoder._fast_deletes)
    return decoder


_WARMED = _warmed(_SCHEMAS, _MESSAGES)


@pytest.mark.parametrize("message", _MESSAGES, ids=lambda m: f"{len(m[0] or b'')}-{len(m[1] or b'')}")
def test_fast_reader_agrees_with_fastavro_on_the_shared_cases(message: tuple[bytes | None, bytes | None]) -> None:
    key, value = message
    fast = _outcome(_WARMED.decode, key, value)
    assert fast == _outcome(_WARMED._decode_general, key, value)
    assert not fast.startswith(("DecodeError", "TruncatedMessageError"))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_table_events())
def test_fast_reader_agrees_with_fastavro_on_random_tables(case: _Case) -> None:
    events, options, params = case
    schemas = AvroSchemas()
    messages = [(m.key, m.value) for m in AvroEncoder(options, schemas=schemas, column_params=params).encode(events)]
    decoder = _warmed(schemas, messages)
    for key, value in messages:
        fast = _outcome(decoder.decode, key, value)
        assert fast == _outcome(decoder._decode_general, key, value)
        assert fast.startswith("["), fast  # the events, not an error (a value may spell "Error")


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_fast_reader_gives_fastavros_errors_on_truncated_and_mutated_messages(data: Any) -> None:
    key, value = data.draw(st.sampled_from(_MESSAGES))
    part = data.draw(st.sampled_from(["key", "value"] if value else ["key"]))
    target = key if part == "key" else value
    assert target is not None
    if data.draw(st.booleans()):
        mutated = target[: data.draw(st.integers(5, len(target) - 1))]  # keep the header: the fast path
    else:
        pos = data.draw(st.integers(5, len(target) - 1))
        mutated = target[:pos] + bytes([data.draw(st.integers(0, 255))]) + target[pos + 1 :]
    key, value = (mutated, value) if part == "key" else (key, mutated)
    assert _outcome(_WARMED.decode, key, value) == _outcome(_WARMED._decode_general, key, value)


@pytest.mark.parametrize(
    "number", [0, -1, 63, -64, 64, 8191, -8192, 8192, 2**20, -(2**27), 2**55, 2**62, -(2**63), 2**63 - 1]
)
def test_fast_reader_reads_every_varint_length(number: int) -> None:
    column = Column("id", int(T.BIGINT), KEY, number)
    event = RowChange(7, "db", "t", Op.INSERT, (column,), None)
    schemas = AvroSchemas()
    messages = [(m.key, m.value) for m in AvroEncoder(EXT, schemas=schemas).encode([event, event])]
    decoder = _warmed(schemas, messages[:1])
    key, value = messages[1]
    assert key is not None and value is not None
    (row,) = decoder._fast[value[:5] + key[:5]](key, value, CTX)  # the generated reader itself, no fallback
    assert isinstance(row, RowChange) and row.columns == (column,) and row.commit_ts == 7


@pytest.mark.parametrize(
    "commit_ts", [0, 1, 63, 64, 8191, 8192, 2**20, 446_000_000_000_000_000, 2**62 - 2**14]
)
def test_fast_reader_reads_every_commit_ts_length_through_its_memo(commit_ts: int) -> None:
    column = Column("id", int(T.BIGINT), KEY, 5)
    events = [RowChange(commit_ts + d, "db", "t", Op.INSERT, (column,), None) for d in (0, 0, 1, 2**13)]
    schemas = AvroSchemas()
    messages = [(m.key, m.value) for m in AvroEncoder(EXT, schemas=schemas).encode(events)]
    decoder = _warmed(schemas, messages[:1])
    for (key, value), event in zip(messages, events):
        assert key is not None and value is not None
        # the generated reader itself, no fallback: the first read fills the memo, the next hit it
        (row,) = decoder._fast[value[:5] + key[:5]](key, value, CTX)
        assert row.commit_ts == event.commit_ts
        assert _outcome(decoder.decode, key, value) == _outcome(decoder._decode_general, key, value)


@pytest.mark.parametrize("commit_ts", [2**62, 2**63 - 1, 2**63, 2**64 - 2**62 - 1])
def test_fast_reader_declines_a_commit_ts_of_ten_bytes(commit_ts: int) -> None:
    # 9 varint bytes hold 63 bits: a zigzagged int64(commit ts) of 2**62 or more takes 10, read by fastavro
    event = RowChange(commit_ts, "db", "t", Op.INSERT, (Column("id", int(T.BIGINT), KEY, 5),), None)
    schemas = AvroSchemas()
    messages = [(m.key, m.value) for m in AvroEncoder(EXT, schemas=schemas).encode([event, event])]
    decoder = _warmed(schemas, messages[:1])
    key, value = messages[1]
    assert key is not None and value is not None
    with pytest.raises(avro_module._Decline):
        decoder._fast[value[:5] + key[:5]](key, value, CTX)
    (row,) = decoder.decode(key, value, CTX)
    assert row.commit_ts == commit_ts


def _inline_decimal(scale: int) -> Any:
    """The generated reader's DECIMAL lines as a function of the bytes."""
    lines = avro_module._decimal_source("v", scale)
    env: dict[str, Any] = {"DECLINE": avro_module._Decline, "FB": int.from_bytes}
    exec("def read(v):\n" + "\n".join("    " + line for line in [*lines, "return v"]), env)  # noqa: S102
    return env["read"]


@pytest.mark.parametrize("scale", [0, 1, 2, 3, 5, 10, 18, 30])
def test_inline_decimal_text_equals_format_unscaled(scale: int) -> None:
    read = _inline_decimal(scale)
    values = {0, 1, -1, 9, -9, 10, -10, 99, 100, -100, 12345, -12345, 2**63, -(2**63), 10**65 - 1, -(10**65 - 1)}
    values |= {sign * 10**e + d for e in range(0, 40, 3) for d in (-1, 0, 1) for sign in (1, -1)}
    for unscaled in sorted(values):
        raw = unscaled.to_bytes(max(1, (unscaled.bit_length() + 8) // 8), "big", signed=True)
        assert read(raw) == avro_module._format_unscaled(unscaled, scale)
        assert read(raw) == avro_module._DecimalReader(scale)(raw)
    for bad in (b"", b"\x01" * 33):
        with pytest.raises(avro_module._Decline):
            read(bad)


@settings(max_examples=200, deadline=None)
@given(st.integers(-(2**255), 2**255 - 1), st.integers(0, 30))
def test_inline_decimal_text_equals_format_unscaled_for_any_value(unscaled: int, scale: int) -> None:
    pad = b"\xff" if unscaled < 0 else b"\x00"
    raw = unscaled.to_bytes(32, "big", signed=True).lstrip(pad) or pad  # -1 is all 0xff: one byte of it
    if (raw[0] >= 0x80) != (unscaled < 0):
        raw = (b"\xff" if unscaled < 0 else b"\x00") + raw
    assert _inline_decimal(scale)(raw) == avro_module._format_unscaled(unscaled, scale)
