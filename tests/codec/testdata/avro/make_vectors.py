"""Builds ``vectors.json``: TiCDC Avro messages for ``t_key.avsc`` (id 101) and ``t_value.avsc`` (id 102).

The bytes are assembled by hand (zigzag varints, length-prefixed strings, union branch indexes), using
neither fastavro nor ticdc_delta, so the golden messages do not come from the code they test.
``--check`` reads each message back with fastavro and the ``.avsc`` files.

Run from anywhere: ``python tests/codec/testdata/avro/make_vectors.py --check``.
"""

from __future__ import annotations

import io
import json
import struct
import sys
from pathlib import Path

HERE = Path(__file__).parent
KEY_ID, VALUE_ID = 101, 102
TS1, TS2 = 415508878783938562, 415508881418485761


def varint(n: int) -> bytes:
    """An Avro int/long: zigzag, then 7 bits per byte, low first."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        low, z = z & 0x7F, z >> 7
        if not z:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def string(text: str) -> bytes:
    raw = text.encode()
    return varint(len(raw)) + raw


def blob(raw: bytes) -> bytes:
    return varint(len(raw)) + raw


def frame(schema_id: int, body: bytes) -> bytes:
    """Confluent wire format: magic byte 0, 4-byte big-endian schema id, Avro binary."""
    return b"\x00" + schema_id.to_bytes(4, "big") + body


# ["null", X]: branch 1 (varint 1 = 0x02) is X, branch 0 is null. "name" is [X, "null"]: the other way.
SOME, NONE = b"\x02", b"\x00"
NAME_SOME, NAME_NONE = b"\x00", b"\x02"

KEY = varint(1)  # id = 1
INSERT = b"".join([
    varint(1),                                           # id
    NAME_SOME + string("测试"),                           # name
    SOME + blob((123456789).to_bytes(4, "big", signed=True)),  # price 12345.6789, scale 4
    SOME + varint(-1),                                   # big: BIGINT UNSIGNED max as int64
    SOME + blob(b"\x51"),                                # flags: BIT 81
    SOME + string("green"),                              # color
    SOME + blob(b"\x00\xff"),                            # data
    SOME + struct.pack("<f", 3.5),                       # ratio: Avro float, 4 bytes little endian
    string("c"), varint(TS1), varint(TS1 >> 18),         # _tidb_op, _tidb_commit_ts, physical time
])
UPDATE = b"".join([
    varint(1),
    NAME_NONE,
    SOME + blob((-1).to_bytes(1, "big", signed=True)),   # price -0.0001
    SOME + varint(9223372036854775807),
    NONE, NONE, NONE, NONE,
    string("u"), varint(TS2), varint(TS2 >> 18),
])


def columns(*cols: tuple[str, int, int, object]) -> list[list[object]]:
    return [list(c) for c in cols]


VECTORS = [
    {
        "name": "insert", "key": frame(KEY_ID, KEY).hex(), "value": frame(VALUE_ID, INSERT).hex(),
        "expect": {"op": "insert", "commit_ts": TS1, "schema": "test", "table": "t", "old": None, "columns": columns(
            ("id", 3, 10, 1), ("name", 15, 64, "测试"), ("price", 246, 64, "12345.6789"),
            ("big", 8, 192, 18446744073709551615), ("flags", 16, 64, 81), ("color", 247, 64, "green"),
            ("data", 252, 65, {"hex": "00ff"}), ("ratio", 4, 64, 3.5),
        )},
    },
    {
        "name": "update", "key": frame(KEY_ID, KEY).hex(), "value": frame(VALUE_ID, UPDATE).hex(),
        "expect": {"op": "update", "commit_ts": TS2, "schema": "test", "table": "t", "old": None, "columns": columns(
            ("id", 3, 10, 1), ("name", 15, 64, None), ("price", 246, 64, "-0.0001"),
            ("big", 8, 192, 9223372036854775807), ("flags", 16, 64, None), ("color", 247, 64, None),
            ("data", 252, 65, None), ("ratio", 4, 64, None),
        )},
    },
    {
        "name": "delete", "key": frame(KEY_ID, KEY).hex(), "value": None,
        "expect": {"op": "delete", "commit_ts": None, "schema": "test", "table": "t", "columns": None,
                   "old": columns(("id", 3, 10, 1))},
    },
]


def check() -> None:
    from fastavro import parse_schema, schemaless_reader

    schemas = {
        "key": parse_schema(json.loads((HERE / "t_key.avsc").read_text())),
        "value": parse_schema(json.loads((HERE / "t_value.avsc").read_text())),
    }
    for vector in VECTORS:
        for part, schema in schemas.items():
            if vector[part]:
                raw = bytes.fromhex(vector[part])
                fo = io.BytesIO(raw[5:])
                record = schemaless_reader(fo, schema)
                assert fo.tell() == len(raw) - 5, (vector["name"], part, "trailing bytes")
                print(vector["name"], part, record)


def main() -> None:
    doc = {
        "_comment": "Hand-built TiCDC Avro messages (see make_vectors.py). Columns are "
        "[name, type code, flags, value]; {\"hex\": ...} is bytes.",
        "key_schema_id": KEY_ID,
        "value_schema_id": VALUE_ID,
        "vectors": VECTORS,
    }
    (HERE / "vectors.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    if "--check" in sys.argv:
        check()


if __name__ == "__main__":
    main()
