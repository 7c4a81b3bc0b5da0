"""A FLOAT (single precision in TiDB) lands as one Delta value whatever the protocol: Craft and Avro carry
the single's bits, Open Protocol and Canal-JSON the shortest text that reads back as the same single (Go's
32-bit formatting: ``0.1``), which read as a double is another number. The Delta ``double`` holds the
single widened, as a Dumpling snapshot loads it and as TiDB compares it."""

from __future__ import annotations

import io
import json
import struct

import pyarrow as pa
import pytest
from fastavro import parse_schema, schemaless_writer

from ticdc_delta.codec.avro import AvroDecoder, AvroSchemas
from ticdc_delta.codec.canal_json import CanalJsonDecoder
from ticdc_delta.codec.craft import CraftDecoder, CraftEncoder
from ticdc_delta.codec.model import Column, ColumnFlag, DecodeContext, RowChange, TypeCode
from ticdc_delta.codec.open_protocol import OpenProtocolDecoder
from ticdc_delta.delta.arrow_types import converter_for
from ticdc_delta.delta.column_convert import convert_column, kind_of

CTX = DecodeContext("t", 0, 0)


def _single(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def _go_float32_text(x: float) -> str:
    """What Go's 32-bit formatting writes: the fewest digits that read back as the same single."""
    for digits in range(1, 10):
        text = f"{_single(x):.{digits}g}"
        try:
            if _single(float(text)) == _single(x):
                return text
        except OverflowError:  # rounded up past the largest single
            continue
    raise AssertionError(x)


def _open_protocol(text: str) -> float:
    key = json.dumps({"ts": 1, "scm": "s", "tbl": "t", "t": 1}).encode()
    value = b'{"u":{"id":{"t":3,"f":11,"v":1},"c":{"t":4,"f":64,"v":' + text.encode() + b"}}}"
    (ev,) = OpenProtocolDecoder().decode(struct.pack(">QQ", 1, len(key)) + key,
                                          struct.pack(">Q", len(value)) + value, CTX)
    return ev.new_values()["c"]


def _canal_json(text: str) -> float:
    msg = {"id": 0, "database": "s", "table": "t", "pkNames": ["id"], "isDdl": False, "type": "INSERT", "es": 1,
           "ts": 1, "sql": "", "sqlType": {"id": 4, "c": 7}, "mysqlType": {"id": "int", "c": "float"},
           "data": [{"id": "1", "c": text}], "old": None, "_tidb": {"commitTs": 1}}
    (ev,) = CanalJsonDecoder({"enable-tidb-extension": "true"}).decode(None, json.dumps(msg).encode(), CTX)
    return ev.new_values()["c"]


def _craft(single: float) -> float:
    row = RowChange(1, "s", "t", "insert", (Column("id", TypeCode.INT, ColumnFlag(11), 1),
                                            Column("c", TypeCode.FLOAT, ColumnFlag(64), single)), None)
    (msg,) = CraftEncoder().encode([row])
    (ev,) = CraftDecoder().decode(msg.key, msg.value, CTX)
    return ev.new_values()["c"]


def _avro(single: float) -> float:
    schema = {"type": "record", "name": "t", "namespace": "default.s", "fields": [
        {"name": "id", "type": {"type": "int", "connect.parameters": {"tidb_type": "INT"}}},
        {"name": "c", "type": {"type": "float", "connect.parameters": {"tidb_type": "FLOAT"}}}]}
    buf = io.BytesIO()
    schemaless_writer(buf, parse_schema(schema), {"id": 1, "c": single})
    dec = AvroDecoder({}, schemas=AvroSchemas({7: json.dumps(schema)}))
    (ev,) = dec.decode(None, b"\x00" + (7).to_bytes(4, "big") + buf.getvalue(), CTX)
    return ev.new_values()["c"]


@pytest.mark.parametrize("value", [0.1, -1.7, 3.14159, 1e-30, 3.4028234e38, 16777217.0, -0.0, 0.0])
def test_a_float_is_one_delta_value_from_every_protocol(value: float) -> None:
    held = _single(value)  # what TiDB holds
    text = _go_float32_text(value)
    convert = converter_for(TypeCode.FLOAT, 0)
    decoded = {"open-protocol": _open_protocol(text), "canal-json": _canal_json(text), "craft": _craft(held),
               "avro": _avro(held)}
    landed = {name: convert(v) for name, v in decoded.items()}
    assert all(v == held and str(v) == str(held) for v in landed.values()), (held, landed)
    # the columnar path's one Arrow call gives the same doubles
    column = convert_column(kind_of(convert), list(decoded.values()), pa.float64())
    assert column is not None and column.to_pylist() == [held] * 4


def test_open_protocol_keeps_the_sign_of_a_negative_zero() -> None:
    """Go writes -0 (a JSON integer to orjson and msgspec): a DOUBLE/FLOAT negative zero keeps its sign; a text
    holding the same characters is left alone."""
    key = json.dumps({"ts": 1, "scm": "s", "tbl": "t", "t": 1}).encode()
    value = (b'{"u":{"id":{"t":3,"f":11,"v":1},"d":{"t":5,"f":64,"v":-0},"s":{"t":15,"f":64,"v":"\\"v\\":-0,"},'
             b'"z":{"t":5,"f":64,"v":-0}}}')
    (ev,) = OpenProtocolDecoder().decode(struct.pack(">QQ", 1, len(key)) + key, struct.pack(">Q", len(value)) + value,
                                         CTX)
    got = ev.new_values()
    assert str(got["d"]) == str(got["z"]) == "-0.0" and got["s"] == '"v":-0,'


def test_a_double_is_kept_as_it_is_and_a_float_beyond_a_single_is_refused() -> None:
    assert converter_for(TypeCode.DOUBLE, 0)(0.1) == 0.1
    with pytest.raises(Exception, match="as a FLOAT"):
        converter_for(TypeCode.FLOAT, 0)(1e39)
    convert = converter_for(TypeCode.FLOAT, 0)
    assert convert_column(kind_of(convert), [0.5, 1e39], pa.float64()) is None  # (the converter refuses it)
