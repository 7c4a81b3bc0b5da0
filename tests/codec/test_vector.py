"""TiDB 8.4+ VECTOR columns in every protocol (type code 225, the text form "[1,2,3]") and their Delta type."""

from __future__ import annotations

import struct

import orjson
import pyarrow as pa
import pytest

from ticdc_delta.codec import decoder_for, encoder_for
from ticdc_delta.codec.avro import AvroSchemas
from ticdc_delta.codec.model import Column, ColumnFlag as F, DecodeContext, Op, RowChange, TypeCode, format_vector, parse_vector
from ticdc_delta.delta.arrow_types import VECTOR_TYPE, arrow_type_for, canonical_from_delta, to_arrow_array
from ticdc_delta.errors import SinkError

CTX = DecodeContext("tidb-cdc", 0, 9)
KEY = F.HANDLE_KEY | F.PRIMARY_KEY
ROW = RowChange(5, "s", "t", Op.INSERT, (
    Column("id", TypeCode.INT, KEY, 1),
    Column("v", TypeCode.VECTOR_FLOAT32, F.NONE, "[1,2.5,-3]"),
    Column("w", TypeCode.VECTOR_FLOAT32, F.NULLABLE, None),
    Column("e", TypeCode.VECTOR_FLOAT32, F.NULLABLE, "[]"),
), None, CTX)


@pytest.mark.parametrize("protocol, options", [
    ("open-protocol", {}), ("craft", {}), ("canal-json", {"enable-tidb-extension": "true"}),
    ("avro", {"enable-tidb-extension": "true"}),
])
def test_vector_round_trips_in_every_protocol(protocol: str, options: dict[str, str]) -> None:
    kw = {"schemas": AvroSchemas()} if protocol == "avro" else {}
    messages = encoder_for(protocol, options, **kw).encode([ROW])
    decoder = decoder_for(protocol, options, **kw)
    (event,) = [e for m in messages for e in decoder.decode(m.key, m.value, CTX)]
    assert event.new_values() == {"id": 1, "v": "[1,2.5,-3]", "w": None, "e": "[]"}
    assert [c.type for c in event.columns][1:] == [TypeCode.VECTOR_FLOAT32] * 3


def test_open_protocol_type_225() -> None:
    key = struct.pack(">Q", 1) + struct.pack(">Q", 34) + b'{"ts":5,"scm":"s","tbl":"t","t":1}'
    body = b'{"u":{"id":{"t":3,"h":true,"f":11,"v":1},"v":{"t":225,"f":65,"v":"[0.1,-2,3e-7]"}}}'
    (event,) = decoder_for("open-protocol").decode(key, struct.pack(">Q", len(body)) + body, CTX)
    assert event.new_values()["v"] == "[0.1,-2,3e-7]" and event.columns[1].type == 225


@pytest.mark.parametrize("mysql_type", ["vector", "vector(3)", "VECTOR(768)"])
def test_canal_json_mysql_type_vector(mysql_type: str) -> None:
    msg = {"id": 0, "database": "s", "table": "t", "pkNames": ["id"], "isDdl": False, "type": "INSERT",
           "es": 1, "ts": 1, "sql": "", "sqlType": {"id": 4, "v": 12}, "mysqlType": {"id": "int", "v": mysql_type},
           "data": [{"id": "1", "v": "[1,2,3]"}], "old": None, "_tidb": {"commitTs": 5}}
    (event,) = decoder_for("canal-json", {"enable-tidb-extension": "true"}).decode(None, orjson.dumps(msg), CTX)
    assert event.columns[1] == Column("v", TypeCode.VECTOR_FLOAT32, F.NONE, "[1,2,3]")


def test_text_form_is_tidbs() -> None:
    """TiDB prints each float32 with strconv.AppendFloat(.., 'f', -1, 32)."""
    assert format_vector([1, 2.5, -3, 0.1, 1e-7, 1234567, -0.0]) == "[1,2.5,-3,0.1,0.0000001,1234567,-0]"
    assert format_vector([]) == "[]"
    assert parse_vector(" [1, 2.5 ,-3e2] ") == [1.0, 2.5, -300.0]
    for bad in ["1,2", "[1,,2]", "[nan]", "[1,inf]", "[a]", ""]:
        with pytest.raises(ValueError):
            parse_vector(bad)


def test_delta_type_is_array_of_float() -> None:
    assert arrow_type_for(TypeCode.VECTOR_FLOAT32, 0) == VECTOR_TYPE == pa.list_(pa.float32())
    array = to_arrow_array(["[1,2.5,-3]", None, "[]", "[0.1]"], TypeCode.VECTOR_FLOAT32, 0)
    assert array.type == VECTOR_TYPE
    assert array.to_pylist()[:3] == [[1.0, 2.5, -3.0], None, []]
    back = [canonical_from_delta(v, TypeCode.VECTOR_FLOAT32, 0) for v in array.to_pylist()]
    assert back == ["[1,2.5,-3]", None, "[]", "[0.1]"]  # float32 0.1 prints back as TiDB prints it
    with pytest.raises(SinkError, match=r"cannot write '\[1,x\]' as a VECTOR"):
        to_arrow_array(["[1,x]"], TypeCode.VECTOR_FLOAT32, 0)
