"""TiCDC Craft: the protocol document's hex dumps, hand-assembled batches, round trips, errors, fuzzing."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from ticdc_delta.codec import decoder_for, encoder_for
from ticdc_delta.codec.base import COMPILE_AT, CompileGate
from ticdc_delta.codec.craft import CraftDecoder, CraftEncoder
from ticdc_delta.codec.model import (
    Column,
    ColumnFlag as F,
    DDLEvent,
    DecodeContext,
    Image,
    Op,
    ResolvedEvent,
    RowChange,
    TypeCode as T,
)
from ticdc_delta.errors import (
    DecodeError,
    EncodeError,
    FramingError,
    TruncatedMessageError,
    UnsupportedVersionError,
)

from . import cases

TESTDATA = Path(__file__).parent / "testdata" / "craft"
CTX = DecodeContext("tidb-cdc", 3, 99)


def load_hexdump(name: str) -> bytes:
    """A golden message typed in from the protocol document's ``hexdump -C`` style dump."""
    out = bytearray()
    for line in (TESTDATA / name).read_text().splitlines():
        if line and not line.startswith("#"):
            out += bytes.fromhex(line.split("|")[0])
    return bytes(out)


def decode(value: bytes | None, decoder: CraftDecoder | None = None) -> list:
    return (decoder or CraftDecoder({})).decode(None, value, CTX)


# --- an encoder independent of the one under test, to assemble messages byte by byte -------------


def uv(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def zz(value: int) -> bytes:
    return uv(value << 1 if value >= 0 else (-value << 1) - 1)


def delta_chunk(values: list[int]) -> bytes:
    out, last = b"", 0
    for v in values:
        out += zz(v - last)
        last = v
    return out


def assemble(header: bytes, bodies: list[bytes], groups: list[list[int]], terms: list[str]) -> bytes:
    """version | header | bodies | dictionary | size tables | reversed size of the size tables."""
    dictionary = b""
    if terms:
        encoded = [t.encode() for t in terms]
        dictionary = uv(len(terms)) + b"".join(uv(len(t)) for t in encoded) + b"".join(encoded)
    tables = b""
    for table in ([len(header), len(dictionary)], [len(b) for b in bodies], *groups):
        tables += uv(len(table)) + delta_chunk(table)
    return uv(1) + header + b"".join(bodies) + dictionary + tables + uv(len(tables))[::-1]


def one_row_message(group: bytes, terms: list[str] | None = None) -> bytes:
    """A message of one row event of a.b (terms 0, 1) whose body is ``group``."""
    header = uv(7) + uv(1) + zz(-1) + zz(0) + zz(1)
    return assemble(header, [group], [[len(group)]], terms if terms is not None else ["a", "b", "c"])


def group(names: list[int], types: list[int], flags: list[int], values: list[bytes | None], kind: int = 1) -> bytes:
    """A column group (kind 1 new, 2 old) of name term ids, type codes, flags and value bytes."""
    lengths = b"".join(zz(-1 if v is None else len(v)) for v in values)
    return (
        bytes([kind])
        + uv(len(names))
        + delta_chunk(names)
        + b"".join(uv(t) for t in types)
        + b"".join(uv(f) for f in flags)
        + lengths
        + b"".join(v for v in values if v is not None)
    )


# --- the protocol document's three hex dumps -----------------------------------------------------

# commit ts of the dumps: 9-byte uvarints, TSOs of 2021-04-17
ROW_TS, DDL_TS, RESOLVED_TS = 424316552636792833, 424316583965360129, 424316594097225729

NO_FLAGS = F(0)


def _doc_image(suffix: str, day: str, number: float) -> tuple[Column, ...]:
    stamp = f"2021/01/{day} 00:00:00"
    return (
        Column("varchar", T.VARCHAR, NO_FLAGS, f"varchar{suffix}"),
        Column("string", T.STRING, NO_FLAGS, f"string{suffix}"),
        Column("date", T.DATE, NO_FLAGS, f"2021/01/{day}"),
        Column("timestamp", T.TIMESTAMP, NO_FLAGS, stamp),
        Column("datetime", T.DATETIME, NO_FLAGS, stamp),
        Column("float", T.FLOAT, NO_FLAGS, number),
        Column("long", T.INT, NO_FLAGS, int(number * 1000)),
        Column("null", T.NULL, NO_FLAGS, None),
    )


GOLDEN = {
    "row_update.hex": [
        RowChange(ROW_TS, "a", "b", Op.UPDATE, _doc_image("1", "02", 2.0), _doc_image("0", "01", 1.0), CTX)
    ],
    "ddl.hex": [DDLEvent(DDL_TS, "a", "b", "create table a", 1, CTX)],
    "resolved.hex": [ResolvedEvent(RESOLVED_TS, CTX)],
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_document_dump_decodes(name: str) -> None:
    events = decode(load_hexdump(name))
    assert events == GOLDEN[name]
    assert all(e.source is CTX for e in events)
    if isinstance(events[0], RowChange):
        assert [type(c.flags) for c in events[0].columns] == [F] * 8


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_encoder_writes_the_document_dump_byte_for_byte(name: str) -> None:
    messages = CraftEncoder({}).encode(GOLDEN[name])
    assert messages == [(None, load_hexdump(name))]


def test_document_dump_sizes() -> None:
    """The layout read off the dumps: the row update is 301 bytes, its size tables close with 10 (0x0a)."""
    row = load_hexdump("row_update.hex")
    assert (len(row), row[-1], row[-11:-1].hex(" ")) == (301, 10, "02 1a 5e 01 b0 03 02 d8 01 00")
    assert load_hexdump("resolved.hex")[-6:].hex(" ") == "02 1a 19 01 00 05"  # meta [13, 0], events [0]


# --- batches ------------------------------------------------------------------------------------

# Two inserts into s.t1 and s.t2, typed in from the layout: header chunks, then terms in TiCDC's order
# (every schema, every table, then column names).
TWO_TABLES = bytes.fromhex(
    "01"  # version
    "01 02 0101 0100 0000 0202"  # ts [1, 3] | types [1, 1] | partitions [-1, -1] | schemas [0, 0] | tables [1, 2]
    "01 01 06 08 00 02 02"  # new group: 1 column, name term 3, BIGINT, flags 0, one 1-byte value: 1
    "01 01 06 08 00 02 04"  # the same for value 2
    "04 01020202 73 7431 7432 6964"  # dictionary: s t1 t2 id
    "021404 020e00 010e 010e"  # size tables: meta [10, 12] | events [7, 7] | groups [7] | groups [7]
    "0a"  # 10 bytes of size tables
)


def _id_row(ts: int, table: str, value: int) -> RowChange:
    return RowChange(ts, "s", table, Op.INSERT, (Column("id", T.BIGINT, NO_FLAGS, value),), None, CTX)


def test_batch_of_two_tables_decodes() -> None:
    assert decode(TWO_TABLES) == [_id_row(1, "t1", 1), _id_row(3, "t2", 2)]


def test_encoder_batches_two_tables_like_ticdc() -> None:
    assert CraftEncoder({}).encode([_id_row(1, "t1", 1), _id_row(3, "t2", 2)]) == [(None, TWO_TABLES)]


def test_encoder_packs_max_batch_size_rows_and_sends_ddl_and_resolved_alone() -> None:
    rows = [_id_row(10 + i, "t1", i) for i in range(5)]
    ddl = DDLEvent(20, "s", "t1", "ALTER TABLE t1 ADD c INT", 5, CTX)
    resolved = ResolvedEvent(30, CTX)
    messages = CraftEncoder({"max-batch-size": "2"}).encode([*rows[:3], ddl, *rows[3:], resolved])
    decoded = [decode(value) for key, value in messages]
    assert all(key is None for key, _ in messages)
    assert decoded == [rows[0:2], rows[2:3], [ddl], rows[3:5], [resolved]]


def test_default_batch_is_16_rows() -> None:
    rows = [_id_row(i, "t1", i) for i in range(40)]
    messages = CraftEncoder({}).encode(rows)
    assert [len(decode(v)) for _, v in messages] == [16, 16, 8]


def test_max_message_bytes_flushes_early() -> None:
    rows = [_id_row(i, "t1", i) for i in range(6)]
    # TiCDC's estimate of one row here: 32 + len("s") + len("t1") + len("id") + 1 value byte + 16 = 54
    messages = CraftEncoder({"max-message-bytes": "100"}).encode(rows)
    assert [len(decode(v)) for _, v in messages] == [2, 2, 2]


def test_mixed_message_decodes_in_order() -> None:
    events = [cases.CREATE, cases.INSERT, cases.RESOLVED, cases.DROP_DB, cases.UPDATE, cases.DELETE]
    value = CraftEncoder({}).encode_message(events)
    assert decode(value) == [e._replace(source=CTX) for e in events]


def test_dictionary_of_one_message_does_not_leak_into_the_next() -> None:
    """Same leading bytes (term ids), different dictionaries: names come from each message's own."""
    dec = CraftDecoder({})
    first = decode(one_row_message(group([2], [8], [0], [zz(5)]), ["a", "b", "x"]), dec)
    second = decode(one_row_message(group([2], [8], [0], [zz(5)]), ["c", "d", "y"]), dec)
    assert [(e.schema, e.table, e.columns[0].name) for e in first + second] == [("a", "b", "x"), ("c", "d", "y")]


def test_remembered_header_is_not_reused_for_another_event_count() -> None:
    """The decoder remembers headers past the commit ts; the same bytes with two events are invalid."""
    dec = CraftDecoder({})
    rest = uv(3) + zz(-1) + zz(-1) + zz(-1)  # one resolved event: type, partition, schema, table
    assert decode(assemble(uv(7) + rest, [b""], [], []), dec) == [ResolvedEvent(7, CTX)]
    with pytest.raises(FramingError, match="header of 2 events must hold 10 varints, holds 6"):
        decode(assemble(uv(7) + uv(0) + rest, [b"", b""], [], []), dec)


def test_wide_table_round_trips() -> None:
    """More columns than the decoder writes straight-line code for: the generic loop decodes them."""
    image = tuple(Column(f"c{i}", T.INT, F.NULLABLE, None if i % 7 == 0 else i - 150) for i in range(300))
    event = RowChange(5, "s", "wide", Op.UPDATE, image, image[::-1])
    assert decode(CraftEncoder({}).encode([event])[0][1]) == [event._replace(source=CTX)]


# --- the shared case table ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "event", [*cases.ALL_EVENTS, cases.DELETE_KEY_ONLY], ids=lambda e: f"{e.kind}-{getattr(e, 'op', '')}"
)
def test_shared_case_round_trips(event) -> None:
    messages = CraftEncoder({}).encode([event])
    assert len(messages) == 1 and messages[0].key is None
    assert decode(messages[0].value) == [event._replace(source=CTX)]


def test_shared_cases_round_trip_as_one_stream() -> None:
    dec = CraftDecoder({})
    messages = CraftEncoder({}).encode(cases.ALL_EVENTS)
    decoded = [e for _, v in messages for e in dec.decode(None, v, cases.CTX)]
    assert decoded == [e._replace(source=cases.CTX) for e in cases.ALL_EVENTS]


def test_shared_case_values_keep_their_python_types() -> None:
    (event,) = decode(CraftEncoder({}).encode([cases.INSERT])[0][1])
    values = event.new_values()
    assert values["c_bigint_u"] == 18446744073709551615 and values["c_bit"] == 81
    assert isinstance(values["c_varbinary"], bytes) and isinstance(values["c_tinytext"], str)
    assert values["c_decimal"] == "129012.1230000" and values["c_null"] is None


def test_year_is_a_signed_varint_even_with_the_unsigned_flag() -> None:
    """TiDB flags YEAR columns unsigned; TiCDC's craft still writes them as int64 (EncodeTiDBType)."""
    value = one_row_message(group([2], [T.YEAR], [F.UNSIGNED], [zz(2021)]))
    assert decode(value)[0].columns == (Column("c", T.YEAR, F.UNSIGNED, 2021),)
    event = RowChange(7, "a", "b", Op.INSERT, (Column("c", T.YEAR, F.UNSIGNED, 2021),), None)
    assert CraftEncoder({}).encode([event])[0].value == value


def test_decoder_and_encoder_pickle_after_use() -> None:
    """Spark ships them to executors; their caches (generated functions) stay behind."""
    dec, enc = CraftDecoder({}), CraftEncoder({"max-batch-size": "3"})
    value = enc.encode([cases.UPDATE])[0].value
    decode(value, dec)
    dec2, enc2 = pickle.loads(pickle.dumps(dec)), pickle.loads(pickle.dumps(enc))
    assert enc2.max_batch_size == 3 and enc2.encode([cases.UPDATE])[0].value == value
    assert decode(value, dec2) == [cases.UPDATE._replace(source=CTX)]


def test_registry_builds_craft() -> None:
    assert isinstance(decoder_for("craft", {}), CraftDecoder)
    assert isinstance(encoder_for("craft", {"max-batch-size": "4"}), CraftEncoder)


# --- options ------------------------------------------------------------------------------------


def test_decoder_accepts_ticdc_options_it_does_not_use() -> None:
    dec = CraftDecoder({"protocol": "craft", "max-batch-size": "8", "enable-tidb-extension": "true"})
    assert decode(load_hexdump("ddl.hex"), dec) == GOLDEN["ddl.hex"]


@pytest.mark.parametrize("cls", [CraftDecoder, CraftEncoder])
def test_unknown_option_is_refused(cls) -> None:
    with pytest.raises(ValueError, match="unknown craft option.*max-batch-sise"):
        cls({"max-batch-sise": "8"})


@pytest.mark.parametrize("bad", ["0", "-3", "many"])
def test_bad_max_batch_size_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="max-batch-size must be a positive integer"):
        CraftEncoder({"max-batch-size": bad})


# --- errors -------------------------------------------------------------------------------------


def test_error_carries_protocol_and_message_coordinates() -> None:
    with pytest.raises(UnsupportedVersionError) as info:
        decode(b"\x02" + load_hexdump("resolved.hex")[1:])
    err = info.value
    assert (err.protocol, err.topic, err.partition, err.offset) == ("craft", "tidb-cdc", 3, 99)
    assert "tidb-cdc[3]@99" in str(err) and "version 2, expected 1" in str(err)
    assert pickle.loads(pickle.dumps(err)).reason == err.reason


@pytest.mark.parametrize("value", [None, b""])
def test_empty_message(value: bytes | None) -> None:
    with pytest.raises(FramingError, match="empty message"):
        decode(value)


def test_huge_column_count_is_refused_before_allocating() -> None:
    """A 10-byte uvarint claiming 2**63 columns in a 14-byte group."""
    body = b"\x01" + uv(1 << 63) + b"\x00\x00\x00"
    with pytest.raises(TruncatedMessageError, match="column group of 9223372036854775808 columns"):
        decode(one_row_message(body))


def test_huge_term_count_is_refused_before_allocating() -> None:
    header = uv(7) + uv(3) + zz(-1) + zz(-1) + zz(-1)
    dictionary = uv(1 << 62) + b"\x01a"
    tables = uv(2) + delta_chunk([len(header), len(dictionary)]) + uv(1) + delta_chunk([0])
    with pytest.raises(TruncatedMessageError, match="term lengths"):
        decode(uv(1) + header + dictionary + tables + uv(len(tables))[::-1])


@pytest.mark.parametrize(
    "varint, match",
    [
        (b"\xff" * 10 + b"\x01", "longer than 10 bytes|at most 10"),
        (b"\xff" * 9 + b"\x02", "overflows 64 bits"),
    ],
)
def test_bad_varints(varint: bytes, match: str) -> None:
    header = varint + uv(3) + zz(-1) + zz(-1) + zz(-1)
    with pytest.raises(DecodeError, match=match):
        decode(assemble(header, [b""], [], []))


def test_max_commit_ts_decodes() -> None:
    header = b"\xff" * 9 + b"\x01" + uv(3) + zz(-1) + zz(-1) + zz(-1)
    assert decode(assemble(header, [b""], [], [])) == [ResolvedEvent(2**64 - 1, CTX)]


@pytest.mark.parametrize(
    "body, match",
    [
        (group([9], [8], [0], [zz(1)]), "term ids 9..9 outside the dictionary of 3 terms"),
        (group([2], [99], [0], [zz(1)]), "unknown column type code 99"),
        (group([2], [T.VARCHAR], [0], [b"\xff\xfe"]), "value of column 'c' is not UTF-8"),
        (group([2], [T.INT], [0], [b"\x80"]), "column 'c': varint 80 is cut off"),
        (group([2], [T.INT], [0], [b"\x02\x02"]), "column 'c': 2 value bytes hold more than one varint"),
        (group([2], [T.DOUBLE], [0], [b"\x00" * 4]), "column 'c': float64 value must be 8 bytes, found 4"),
        (group([2], [T.NULL], [0], [b"x"]), "NULL/GEOMETRY column carries 1 value bytes"),
        (group([2], [8], [0], [zz(1)], kind=3), "unexpected column group type 3 "),
        (group([], [], [], []), "column group with no columns"),
        (group([2, 1, 2], [T.INT] * 3, [0] * 3, [zz(1)] * 3), "column 'c' named twice in one column group"),
        (b"\x01\x01\x04\x08\x00\x05" + b"\x00" * 8, r"value length -3 \(-1 is NULL\)"),
        (group([2], [8], [0], [zz(1)]) + b"\x00", "column values end at byte"),
    ],
)
def test_invalid_row_bodies(body: bytes, match: str) -> None:
    with pytest.raises(DecodeError, match=match):
        decode(one_row_message(body))


def test_a_value_length_past_the_group_before_a_double_is_a_decode_error() -> None:
    """A VARCHAR that claims 200 bytes where one is left: the DOUBLE after it finds no bytes (struct.error
    escaped untyped, without the message's coordinates, from the code generated for the group)."""
    body = (bytes([1]) + uv(2) + zz(2) + zz(1) + uv(T.VARCHAR) + uv(T.DOUBLE) + uv(0) + uv(0) + zz(200) + zz(8)
            + b"x" + b"\x00" * 8)
    header = uv(7) + uv(1) + zz(-1) + zz(0) + zz(1)
    with pytest.raises(DecodeError, match=r"tidb-cdc\[3\]@99: column 'd': float64 value must be 8 bytes, found 0"):
        decode(assemble(header, [body], [[len(body)]], ["a", "b", "c", "d"]))


def test_two_new_groups_are_refused() -> None:
    g = group([2], [8], [0], [zz(1)])
    header = uv(7) + uv(1) + zz(-1) + zz(0) + zz(1)
    with pytest.raises(DecodeError, match="unexpected column group types 1, 1"):
        decode(assemble(header, [g + g], [[len(g), len(g)]], ["a", "b", "c"]))


def test_row_event_needs_its_group_size_table() -> None:
    g = group([2], [8], [0], [zz(1)])
    header = uv(7) + uv(1) + zz(-1) + zz(0) + zz(1)
    with pytest.raises(FramingError, match="1 row event\\(s\\) need 1 column-group size table\\(s\\), found 0"):
        decode(assemble(header, [g], [], ["a", "b", "c"]))


@pytest.mark.parametrize(
    "header, bodies, match",
    [
        (uv(7) + uv(4) + zz(-1) + zz(-1) + zz(-1), [b""], "unknown event type 4"),
        (uv(7) + uv(3) + zz(-2) + zz(-1) + zz(-1), [b""], r"partition ids -2\.\.-2"),
        (uv(7) + uv(3) + zz(-1) + zz(-1), [b""], "must hold 5 varints, holds 4"),
        (uv(7) + uv(3) + zz(-1) + zz(-1) + zz(-1), [b"\x00"], "resolved event 0 has a 1-byte body"),
        (uv(7) + uv(2) + zz(-1) + zz(-1) + zz(-1), [uv(3) + uv(9) + b"short"], "DDL query of 9 bytes"),
        (uv(7) + uv(2) + zz(-1) + zz(-1) + zz(-1), [uv(3) + uv(1) + b"ab"], "DDL query of 1 bytes in a 2-byte"),
        (uv(7) + uv(2) + zz(-1) + zz(-1) + zz(-1), [uv(3) + uv(2) + b"\xc3("], "DDL query is not UTF-8"),
        (uv(7) + uv(2) + zz(-1) + zz(-1) + zz(-1), [uv(256) + uv(0)], "DDL type 256 above 255"),
    ],
)
def test_invalid_headers_and_bodies(header: bytes, bodies: list[bytes], match: str) -> None:
    with pytest.raises(DecodeError, match=match):
        decode(assemble(header, bodies, [], []))


def test_ddl_without_type_or_names() -> None:
    header = uv(7) + uv(2) + zz(-1) + zz(-1) + zz(-1)
    assert decode(assemble(header, [uv(0) + uv(1) + b"q"], [], [])) == [DDLEvent(7, "", "", "q", None, CTX)]


@pytest.mark.parametrize(
    "value, error, match",
    [
        (b"\x01\x80", TruncatedMessageError, "size of the size tables is cut off"),
        (b"\x01\x05", TruncatedMessageError, "size tables of 5 bytes announced, only 0 before them"),
        (b"\x01\x00", FramingError, "expected the meta and events size tables, found 0"),
        (b"\x01\x02\x00\x00\x02", FramingError, "meta size table must hold 2 sizes"),
        (b"\x01\x02\x00\x00\x00\x04", FramingError, "message holds no events"),
        (b"\x01\x02\x02\x01\x01\x00\x05", FramingError, "end at byte 2, but the size tables start at byte 1"),
        (b"\x01\x02\x00\x00\x01\x00\x05", FramingError, "header of 1 events must hold 5 varints, holds 0"),
        (b"\x01\x03\x02\x00\x03", TruncatedMessageError, "size table of 3 sizes, only 2 varints left"),
        (b"\x01\x00\x80\x02", TruncatedMessageError, "the last varint is cut off"),
        (b"\x00\x01", UnsupportedVersionError, "version 0"),
    ],
)
def test_broken_framing(value: bytes, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        decode(value)


def test_every_truncation_of_the_documents_dumps_fails_cleanly() -> None:
    for name in GOLDEN:
        value = load_hexdump(name)
        for cut in range(len(value)):
            with pytest.raises(DecodeError):
                decode(value[:cut])


# --- encoder errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "event, match",
    [
        (RowChange(None, "s", "t", Op.INSERT, (Column("c", T.INT, NO_FLAGS, 1),), None), "commit ts"),
        (RowChange(1, "s", "t", Op.INSERT, None, None), "has no columns"),
        (RowChange(1, "s", "t", Op.INSERT, (Column("c", T.INT, NO_FLAGS, "1"),), None), "'c' needs a signed"),
        (RowChange(1, "s", "t", Op.INSERT, (Column("c", T.INT, F.UNSIGNED, -1),), None), "unsigned 64-bit int"),
        (RowChange(1, "s", "t", Op.INSERT, (Column("c", T.BIGINT, NO_FLAGS, 2**63),), None), "signed 64-bit"),
        (RowChange(1, "s", "t", Op.INSERT, (Column("c", T.BLOB, F.BINARY, "text"),), None), "bytes"),
        (RowChange(1, "s", "t", Op.INSERT, (Column("c", T.ENUM, NO_FLAGS, "red"),), None), "unsigned 64-bit int"),
        (RowChange(1, "s", "t", Op.INSERT, (Column("c", T.GEOMETRY, NO_FLAGS, b"\x00"),), None), "None"),
        (RowChange(1, "s", "t", Op.INSERT, (Column("c", 99, NO_FLAGS, 1),), None), "unknown type code 99"),
        (RowChange(1, "s", "t", Op.INSERT, (Column("c", T.INT, -1, 1),), None), "bad flags -1"),
        (RowChange(1, "s", "t", Op.INSERT, (Column(None, T.INT, NO_FLAGS, 1),), None), "name must be str"),
        (RowChange(1, "s", "t", Op.INSERT, (Column("c", T.INT, NO_FLAGS, True),), None), "signed 64-bit int"),
        (RowChange(1, "s", "t", Op.INSERT, (Column("c", T.VARCHAR, NO_FLAGS, "\ud800"),), None), "UTF-8"),
        (RowChange(1, "s\ud800", "t", Op.INSERT, (Column("c", T.INT, NO_FLAGS, 1),), None), "UTF-8 cannot encode"),
        (DDLEvent(1, "s", "t", "q\udc00", 3), "UTF-8 cannot encode"),
        (DDLEvent(1, "s", "t", "q", 300), "DDL type must be an int in 0..255"),
        ("not an event", "cannot encode str"),
    ],
)
def test_encoder_refuses_what_craft_cannot_carry(event, match: str) -> None:
    with pytest.raises(EncodeError, match=match):
        CraftEncoder({}).encode([event])


# --- property tests -----------------------------------------------------------------------------

_I64 = st.integers(-(2**63), 2**63 - 1)
_U64 = st.integers(0, 2**64 - 1)
_TEXT = st.text(max_size=80)
_FLOAT = st.floats(allow_nan=False)

# (type code, flags, values) of every kind of column the protocol carries
_COLUMN_KINDS = [
    *[(t, F.NULLABLE, _I64) for t in (T.TINYINT, T.SMALLINT, T.INT, T.MEDIUMINT, T.BIGINT, T.YEAR)],
    *[(t, F.UNSIGNED, _U64) for t in (T.TINYINT, T.INT, T.BIGINT, T.BIT, T.ENUM, T.SET)],
    *[(t, F.NULLABLE, _FLOAT) for t in (T.FLOAT, T.DOUBLE)],
    *[(t, F.NULLABLE, _TEXT) for t in (T.DECIMAL, T.DATE, T.DATETIME, T.TIMESTAMP, T.TIME, T.JSON, T.NEWDATE)],
    *[(t, F.NULLABLE, _TEXT) for t in (T.VARCHAR, T.STRING, T.VAR_STRING, T.BLOB, T.TINYBLOB, T.LONGBLOB)],
    *[(t, F.BINARY, st.binary(max_size=200)) for t in (T.VARCHAR, T.STRING, T.BLOB, T.MEDIUMBLOB)],
    (T.NULL, F.NULLABLE, st.none()),
    (T.GEOMETRY, F.NULLABLE, st.none()),
]


@st.composite
def _columns(draw) -> tuple[Column, ...]:
    kinds = draw(st.lists(st.sampled_from(_COLUMN_KINDS), min_size=1, max_size=12))
    extra = draw(st.sampled_from([F(0), F.HANDLE_KEY | F.PRIMARY_KEY, F.UNIQUE_KEY, F(0x100)]))
    names = draw(st.lists(st.text(max_size=8), min_size=len(kinds), max_size=len(kinds), unique=True))
    return tuple(
        Column(name, int(tp), flags | extra, draw(st.one_of(st.none(), values)))
        for name, (tp, flags, values) in zip(names, kinds)
    )


@st.composite
def _events(draw):
    ts = draw(_U64)
    kind = draw(st.sampled_from(["insert", "update", "delete", "ddl", "resolved"]))
    schema, table = draw(st.text(max_size=10)), draw(st.text(max_size=10))
    if kind == "ddl":
        return DDLEvent(ts, schema, table, draw(_TEXT), draw(st.one_of(st.none(), st.integers(1, 255))))
    if kind == "resolved":
        return ResolvedEvent(ts)
    new = draw(_columns()) if kind != "delete" else None
    old = draw(_columns()) if kind != "insert" else None
    return RowChange(ts, schema, table, kind, new, old)


def _same(a, b) -> bool:
    """Equality that tells 0.0 from -0.0 (a float64 keeps the sign); a decoded Image is its Columns."""
    if isinstance(a, Image):
        a = tuple(a)
    if isinstance(a, float) and isinstance(b, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b and type(a) is type(b)


@settings(max_examples=150, deadline=None)
@given(st.lists(_events(), min_size=1, max_size=20), st.integers(1, 8))
def test_encode_decode_round_trip(events, batch: int) -> None:
    dec = CraftDecoder({})
    messages = CraftEncoder({"max-batch-size": str(batch)}).encode(events)
    decoded = [e for _, v in messages for e in dec.decode(None, v, CTX)]
    assert _same(tuple(decoded), tuple(e._replace(source=CTX) for e in events))


@settings(max_examples=100, deadline=None)
@given(st.lists(_events(), min_size=1, max_size=8))
def test_mixed_messages_round_trip(events) -> None:
    decoded = decode(CraftEncoder({}).encode_message(events))
    assert _same(tuple(decoded), tuple(e._replace(source=CTX) for e in events))


def _decodes_or_raises_decode_error(value: bytes, decoder: CraftDecoder) -> None:
    try:
        events = decoder.decode(None, value, CTX)
    except DecodeError as err:
        assert err.protocol == "craft" and err.offset == CTX.offset
    else:
        assert events and all(isinstance(e, (RowChange, DDLEvent, ResolvedEvent)) for e in events)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_fail_cleanly(value: bytes) -> None:
    _decodes_or_raises_decode_error(value, CraftDecoder({}))
    _decodes_or_raises_decode_error(b"\x01" + value, CraftDecoder({}))


_VALID = [load_hexdump(name) for name in sorted(GOLDEN)] + [
    TWO_TABLES,
    CraftEncoder({}).encode_message([cases.INSERT, cases.UPDATE, cases.DELETE]),
    CraftEncoder({}).encode_message(cases.ALL_EVENTS),
]


def _eager() -> CraftDecoder:
    """A decoder that writes a shape's values decoder the first time it meets it (not at its
    :data:`~ticdc_delta.codec.base.COMPILE_AT`-th sighting): what these tests compare with the plain one."""
    decoder = CraftDecoder({})
    decoder._compile_gate = CompileGate(at=1)
    return decoder


_WARM = _eager()  # a decoder whose caches know the valid messages: mutations must not fool them
for _value in _VALID * 2:  # twice: value-length patterns met twice get a compiled struct
    _WARM.decode(None, _value, CTX)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(_VALID), st.data())
def test_mutations_of_valid_messages_fail_cleanly(value: bytes, data) -> None:
    mutated = bytearray(value)
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(mutated) - 1))
        mutated[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(mutated)))
    for candidate in (bytes(mutated), bytes(mutated[:cut])):
        _decodes_or_raises_decode_error(candidate, CraftDecoder({}))
        _decodes_or_raises_decode_error(candidate, _WARM)


# --- value-length patterns met before are cut out with one struct call --------------------------


def _outcome(decoder: CraftDecoder, value: bytes) -> tuple:
    try:
        return ("events", repr(decoder.decode(None, value, CTX)))  # repr tells -0.0 from 0.0
    except DecodeError as err:
        return ("error", type(err), str(err))


def _structs(decoder: CraftDecoder) -> int:
    """How many value-length patterns the decoder's values decoders have compiled."""
    return sum(
        len(f.__globals__["STRUCTS"]) + len(f.__globals__["NULL_STRUCTS"])
        for f in decoder._values_decoders.values()
        if "STRUCTS" in f.__globals__
    )


def test_a_length_pattern_met_twice_is_compiled_and_decodes_alike() -> None:
    value = CraftEncoder({}).encode_message([cases.INSERT, cases.UPDATE, cases.DELETE])
    decoder = _eager()
    first = decoder.decode(None, value, CTX)
    assert first == [e._replace(source=CTX) for e in (cases.INSERT, cases.UPDATE, cases.DELETE)]
    assert decoder.decode(None, value, CTX) == first
    # row 2 (met twice, with a NULL: c_null) is compiled; row 1 has a 256-byte value: never one-byte lengths
    assert _structs(decoder) == 1
    assert decoder.decode(None, value, CTX) == first  # through the structs
    # a row without NULLs, twice in one message: its pattern is compiled at the second
    row = RowChange(1, "s", "t", Op.INSERT, (Column("a", int(T.INT), F(0), 5), Column("b", int(T.DOUBLE), F(0), -0.0),
                                             Column("c", int(T.VARCHAR), F.BINARY, b"\x00\xff"),
                                             Column("d", int(T.BIGINT), F.UNSIGNED, 1 << 63),
                                             Column("e", int(T.VARCHAR), F(0), "é")), None)
    message = CraftEncoder({}).encode_message([row, row._replace(commit_ts=2)])
    cold = _outcome(CraftDecoder({}), message)
    assert _outcome(decoder, message) == cold
    assert _structs(decoder) >= 1
    warm = _outcome(decoder, message)  # through the struct
    assert warm == cold and "-0.0" in warm[1] and "b'\\x00\\xff'" in warm[1]


@pytest.mark.parametrize(
    "value, match",
    [
        (b"\xff", "value of column 'e' is not UTF-8"),
        (b"\x80", "column 'a': varint 80 is cut off"),
    ],
)
def test_bad_values_in_a_compiled_pattern_are_refused_alike(value: bytes, match: str) -> None:
    names, types, flags = [0, 1], [int(T.INT), int(T.VARCHAR)], [0, 0]
    good = one_row_message(group(names, types, flags, [b"\x02", b"x"]), ["a", "e"])
    bad = one_row_message(group(names, types, flags, [value if match.startswith("column") else b"\x02",
                                                      value if "UTF-8" in match else b"x"]), ["a", "e"])
    warm = _eager()
    for _ in range(3):
        warm.decode(None, good, CTX)
    assert _structs(warm) == 1
    cold = _outcome(CraftDecoder({}), bad)
    assert cold[0] == "error" and match in cold[2]
    assert _outcome(warm, bad) == cold
    assert _outcome(warm, good) == _outcome(CraftDecoder({}), good)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(_VALID), st.data())
def test_warm_and_cold_decoders_agree_on_mutations(value: bytes, data) -> None:
    mutated = bytearray(value)
    at = data.draw(st.integers(0, len(mutated) - 1))
    mutated[at] = data.draw(st.integers(0, 255))
    assert _outcome(_WARM, bytes(mutated)) == _outcome(CraftDecoder({}), bytes(mutated))


def test_a_shape_is_written_code_for_at_its_compile_at_th_sighting_only() -> None:
    """Writing a shape's values decoder costs what a few hundred of its rows cost the plain way: a shape met
    once (a stream of ever new shapes, corrupt or hostile) is decoded by the plain loop and nothing of it is
    kept; a table's stream of rows gets its code at the COMPILE_AT-th row, and decodes alike."""
    def message(n: int, ts: int) -> bytes:
        row = RowChange(ts, "s", "t", Op.INSERT, tuple(Column(f"c{i}", int(T.INT), F(0), i) for i in range(n)), None)
        return CraftEncoder({}).encode_message([row])

    decoder, plain = CraftDecoder({}), CraftDecoder({})
    decoder._compile_gate = CompileGate(COMPILE_AT)  # (the codec tests' decoders compile at once: conftest)
    for n in range(1, 60):  # 59 shapes, each met once
        assert decoder.decode(None, message(n, n), CTX) == plain.decode(None, message(n, n), CTX)
    assert not decoder._values_decoders and not decoder._metas
    for ts in range(1, COMPILE_AT + 1):
        expected = [e._replace(source=CTX) for e in plain.decode(None, message(3, ts), CTX)]
        assert decoder.decode(None, message(3, ts), CTX) == expected
        assert bool(decoder._values_decoders) == (ts >= COMPILE_AT - 1)  # (n = 3 met once above)
    (written,) = decoder._values_decoders.values()
    assert "STRUCTS" in written.__globals__  # generated code, not the plain loop
