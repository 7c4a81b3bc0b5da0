"""Open Protocol: conformance with real TiCDC messages and the seed's example log, round trips, errors."""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings, strategies as st

from ticdc_delta.codec import decoder_for, encoder_for, open_protocol as open_protocol_module
from ticdc_delta.codec.base import COMPILE_AT
from ticdc_delta.codec.json_output import event_to_json_object
from ticdc_delta.codec.model import (
    Column, ColumnFlag as F, DecodeContext, DDLEvent, FailedEntry, Op, ResolvedEvent, RowChange, TypeCode as T,
)
from ticdc_delta.codec.open_protocol import go_quote, go_unquote
from ticdc_delta.errors import (
    ClaimCheckError,
    DecodeError,
    FramingError,
    HandleKeyOnlyError,
    TruncatedMessageError,
    UnsupportedVersionError,
)

from . import cases

TESTDATA = Path(__file__).parent / "testdata" / "open-protocol"  # copied from shared/testdata
CTX = DecodeContext("tidb-cdc", 1, 42)


def decode(key: bytes | None, value: bytes | None) -> list:
    return decoder_for("open-protocol").decode(key, value, CTX)


def frame_key(*entries: bytes) -> bytes:
    return struct.pack(">Q", 1) + b"".join(struct.pack(">Q", len(e)) + e for e in entries)


def frame_value(*entries: bytes) -> bytes:
    return b"".join(struct.pack(">Q", len(e)) + e for e in entries)


# --- real TiCDC messages (tiflow examples/java test resources) -----------------------------------

EXPECTED_TESTDATA = {
    "row_0": [{"kind": "row", "commit_ts": 1, "schema": "a", "table": "b", "op": "insert",
               "columns": {"col1": "aa"}, "old": None}],
    "row_1": [
        {"kind": "row", "commit_ts": ts, "schema": "a", "table": tbl, "op": "insert",
         "columns": {"col1": val}, "old": None}
        for ts, tbl, val in [(1, "b", "aa"), (2, "b", "bb"), (3, "b", "bb"), (4, "c", "cc")]
    ],
    "row_2": [],
    "ddl_0": [{"kind": "ddl", "commit_ts": 1, "schema": "a", "table": "b", "query": "create table a"}],
    "ddl_1": [
        {"kind": "ddl", "commit_ts": ts, "schema": "a", "table": "b", "query": q}
        for ts, q in [(1, "create table a"), (2, "create table b"), (3, "create table c")]
    ],
    "ddl_2": [],
    "rts_0": [{"kind": "resolved", "commit_ts": 1}],
    "rts_1": [{"kind": "resolved", "commit_ts": ts} for ts in (1, 2, 3)],
    "rts_2": [],
}


@pytest.mark.parametrize("name", sorted(EXPECTED_TESTDATA))
def test_real_ticdc_messages(name: str) -> None:
    kind, n = name.split("_")
    key = (TESTDATA / f"{kind}_key_{n}").read_bytes()
    value = (TESTDATA / f"{kind}_value_{n}").read_bytes()
    events = decode(key, value)
    assert [event_to_json_object(e) for e in events] == EXPECTED_TESTDATA[name]
    assert all(e.source == CTX for e in events)


def test_ddl_type_code_is_kept() -> None:
    events = decode((TESTDATA / "ddl_key_1").read_bytes(), (TESTDATA / "ddl_value_1").read_bytes())
    assert [e.ddl_type for e in events] == [1, 2, 3]


# --- the seed's example event stream (2 partitions, 14 messages) ----------------------------------

SEED_LOG = [
    (0, '{"ts":415508856908021766,"scm":"test","tbl":"t1","t":2}',
     '{"q":"CREATE TABLE test.t1(id int primary key, val varchar(16))","t":3}'),
    (0, '{"ts":415508856908021766,"t":3}', None),
    (1, '{"ts":415508856908021766,"scm":"test","tbl":"t1","t":2}',
     '{"q":"CREATE TABLE test.t1(id int primary key, val varchar(16))","t":3}'),
    (1, '{"ts":415508856908021766,"t":3}', None),
    (0, '{"ts":415508878783938562,"scm":"test","tbl":"t1","t":1}',
     '{"u":{"id":{"t":3,"h":true,"v":1},"val":{"t":15,"v":"YWE="}}}'),
    (1, '{"ts":415508878783938562,"scm":"test","tbl":"t1","t":1}',
     '{"u":{"id":{"t":3,"h":true,"v":2},"val":{"t":15,"v":"YmI="}}}'),
    (0, '{"ts":415508878783938562,"scm":"test","tbl":"t1","t":1}',
     '{"u":{"id":{"t":3,"h":true,"v":3},"val":{"t":15,"v":"Y2M="}}}'),
    (0, '{"ts":415508878783938562,"scm":"test","tbl":"t1","t":1}',
     '{"u":{"id":{"t":3,"h":true,"v":3},"val":{"t":15,"v":"Y2M="}}}'),
    (0, '{"ts":415508881418485761,"scm":"test","tbl":"t1","t":1}', '{"d":{"id":{"t":3,"h":true,"v":1}}}'),
    (1, '{"ts":415508881418485761,"scm":"test","tbl":"t1","t":1}', '{"d":{"id":{"t":3,"h":true,"v":2}}}'),
    (0, '{"ts":415508881418485761,"scm":"test","tbl":"t1","t":1}',
     '{"u":{"id":{"t":3,"h":true,"v":3},"val":{"t":15,"v":"ZGQ="}}}'),
    (0, '{"ts":415508881418485761,"scm":"test","tbl":"t1","t":1}',
     '{"u":{"id":{"t":3,"h":true,"v":4},"val":{"t":15,"v":"ZWU="}}}'),
    (0, '{"ts":415508881038376963,"t":3}', None),
    (1, '{"ts":415508881038376963,"t":3}', None),
]

T0, T1, T2, R2 = 415508856908021766, 415508878783938562, 415508881418485761, 415508881038376963
DDL = "CREATE TABLE test.t1(id int primary key, val varchar(16))"


def _row(ts: int, op: str, id_: int, val: str | None) -> dict:
    image = {"id": id_} if val is None else {"id": id_, "val": val}
    return {"kind": "row", "commit_ts": ts, "schema": "test", "table": "t1", "op": op,
            "columns": None if op == "delete" else image, "old": image if op == "delete" else None}


SEED_EXPECTED = [
    {"kind": "ddl", "commit_ts": T0, "schema": "test", "table": "t1", "query": DDL},
    {"kind": "resolved", "commit_ts": T0},
    {"kind": "ddl", "commit_ts": T0, "schema": "test", "table": "t1", "query": DDL},
    {"kind": "resolved", "commit_ts": T0},
    _row(T1, "insert", 1, "aa"),
    _row(T1, "insert", 2, "bb"),
    _row(T1, "insert", 3, "cc"),
    _row(T1, "insert", 3, "cc"),
    _row(T2, "delete", 1, None),
    _row(T2, "delete", 2, None),
    _row(T2, "insert", 3, "dd"),
    _row(T2, "insert", 4, "ee"),
    {"kind": "resolved", "commit_ts": R2},
    {"kind": "resolved", "commit_ts": R2},
]


@pytest.mark.parametrize("empty_value", [None, b"", "framed"])
def test_seed_example_log(empty_value: object) -> None:
    got = []
    for partition, key_json, value_json in SEED_LOG:
        key = frame_key(key_json.encode())
        if value_json is not None:
            value: bytes | None = frame_value(value_json.encode())
        elif empty_value == "framed":
            value = frame_value(b"")
        else:
            value = empty_value  # type: ignore[assignment]
        events = decoder_for("open-protocol").decode(key, value, DecodeContext("t", partition, 0))
        assert len(events) == 1
        got.append(event_to_json_object(events[0]))
    assert got == SEED_EXPECTED


def test_seed_ddl_type_and_handle_flag() -> None:
    (ddl,) = decode(frame_key(SEED_LOG[0][1].encode()), frame_value(SEED_LOG[0][2].encode()))
    assert isinstance(ddl, DDLEvent) and ddl.ddl_type == 3
    (row,) = decode(frame_key(SEED_LOG[4][1].encode()), frame_value(SEED_LOG[4][2].encode()))
    assert isinstance(row, RowChange) and row.key_columns() == ("id",)


# --- the seed's type table examples ---------------------------------------------------------------

@pytest.mark.parametrize(
    "column, expected",
    [
        ({"t": 1, "f": 0, "v": 1}, 1),
        ({"t": 4, "f": 0, "v": 153.123}, 153.123),
        ({"t": 6, "f": 0, "v": None}, None),
        ({"t": 7, "f": 0, "v": "1973-12-30 15:30:00"}, "1973-12-30 15:30:00"),
        ({"t": 8, "f": 128, "v": 18446744073709551615}, 18446744073709551615),
        ({"t": 13, "f": 0, "v": 1970}, 1970),
        ({"t": 15, "f": 0, "v": "测试"}, "测试"),
        ({"t": 15, "f": 1, "v": "\\x89PNG\\r\\n\\x1a\\n"}, b"\x89PNG\r\n\x1a\n"),
        ({"t": 254, "f": 1, "v": "\\x89PNG\\r\\n\\x1a\\n"}, b"\x89PNG\r\n\x1a\n"),
        ({"t": 16, "f": 0, "v": 81}, 81),
        ({"t": 245, "f": 0, "v": '{"key1": "value1"}'}, '{"key1": "value1"}'),
        ({"t": 246, "f": 0, "v": "129012.1230000"}, "129012.1230000"),
        ({"t": 247, "f": 0, "v": 1}, 1),
        ({"t": 248, "f": 0, "v": 3}, 3),
        ({"t": 249, "f": 0, "v": "5rWL6K+VdGV4dA=="}, "测试text"),
        ({"t": 252, "f": 1, "v": "5rWL6K+VdGV4dA=="}, "测试text".encode()),
    ],
)
def test_type_table_examples(column: dict, expected: object) -> None:
    value = frame_value(orjson.dumps({"u": {"c": column}}))
    key = frame_key(b'{"ts":5,"scm":"s","tbl":"t","t":1}')
    (event,) = decode(key, value)
    assert event.columns[0].value == expected
    assert type(event.columns[0].value) is type(expected)


# --- round trips ----------------------------------------------------------------------------------

@pytest.mark.parametrize("event", cases.ALL_EVENTS, ids=lambda e: type(e).__name__ + "-" + str(e.commit_ts))
def test_shared_cases_round_trip(event: object) -> None:
    enc = encoder_for("open-protocol")
    messages = enc.encode([event])
    decoded = [e for m in messages for e in decode(m.key, m.value)]
    assert decoded == [event._replace(source=CTX)]


def test_batch_round_trip_and_batching() -> None:
    enc = encoder_for("open-protocol", {"max-batch-size": "2"})
    events = [cases.INSERT, cases.UPDATE, cases.DELETE, cases.RESOLVED, cases.CREATE, cases.INSERT]
    messages = enc.encode(events)
    # rows batched by two; DDL and resolved alone
    assert [len(decode(m.key, m.value)) for m in messages] == [2, 1, 1, 1, 1]
    assert [e._replace(source=None) for m in messages for e in decode(m.key, m.value)] == [
        e._replace(source=None) for e in events
    ]


def test_old_value_off_keeps_handle_key_only_on_delete() -> None:
    enc = encoder_for("open-protocol", {"enable-old-value": "false"})
    (update,) = [e for m in enc.encode([cases.UPDATE]) for e in decode(m.key, m.value)]
    assert update.op == "insert" and update.old is None  # "u" alone: TiCDC cannot tell insert from update
    (delete,) = [e for m in enc.encode([cases.DELETE]) for e in decode(m.key, m.value)]
    assert [c.name for c in delete.old] == ["id"]


@given(st.binary(max_size=64))
def test_go_quote_round_trip(data: bytes) -> None:
    assert go_unquote(go_quote(data)) == data


def test_go_quote_matches_go() -> None:
    assert go_quote(b"\x89PNG\r\n\x1a\n") == "\\x89PNG\\r\\n\\x1a\\n"
    assert go_quote('测试"\\'.encode()) == '测试\\"\\\\'
    assert go_quote("\u200b".encode()) == "\\u200b"


# --- errors ---------------------------------------------------------------------------------------

def test_framing_errors_carry_coordinates() -> None:
    with pytest.raises(FramingError, match=r"tidb-cdc\[1\]@42: key must start with the 8-byte protocol version"):
        decode(b"\x00\x01", b"")
    with pytest.raises(UnsupportedVersionError, match="expected protocol version 1, got 2"):
        decode(struct.pack(">Q", 2), b"")
    with pytest.raises(TruncatedMessageError, match="announces 100 bytes, 3 remain"):
        decode(struct.pack(">QQ", 1, 100) + b"abc", b"")
    key = frame_key(b'{"ts":1,"scm":"a","tbl":"b","t":1}')
    with pytest.raises(FramingError, match="key holds 1 events but value holds 0 entries"):
        decode(key, b"")
    with pytest.raises(DecodeError, match="not valid JSON"):
        decode(key, frame_value(b"{nope"))
    with pytest.raises(DecodeError, match='neither "u" nor "d"'):
        decode(key, frame_value(b"{}"))
    with pytest.raises(DecodeError, match="not base64"):
        decode(key, frame_value(b'{"u":{"c":{"t":252,"f":1,"v":"!!"}}}'))


@pytest.mark.parametrize("kind", [b"true", b"1.0", b"3.0", b'"1"', b"null"])
def test_event_type_must_be_an_integer(kind: bytes) -> None:
    """``true == 1`` and ``3.0 == 3`` in Python; TiCDC's key always holds an integer "t"."""
    key = frame_key(b'{"ts":5,"scm":"s","tbl":"t","t":' + kind + b"}")
    with pytest.raises(DecodeError, match=r'tidb-cdc\[1\]@42: .*event key 0 has no integer event type "t"'):
        decode(key, frame_value(b'{"u":{"id":{"t":3,"f":11,"v":7}}}'))
    with pytest.raises(FramingError, match="key holds 1 events but value holds 0 entries"):
        decode(key, b"")  # (not a resolved event's key: a message of those alone may come without a value)


@pytest.mark.parametrize("entry", [b"[1]", b"null", b'"x"', b"7"])
def test_a_key_entry_that_is_no_object_with_no_value_is_a_framing_error(entry: bytes) -> None:
    with pytest.raises(FramingError, match=r"tidb-cdc\[1\]@42: .*key holds 1 events but value holds 0 entries"):
        decode(frame_key(entry), b"")
    with pytest.raises(FramingError, match="key holds 2 events"):
        decode(frame_key(b'{"ts":5,"t":3}', entry), None)


def _valid_message() -> tuple[bytes, bytes]:
    (m,) = encoder_for("open-protocol", {"max-batch-size": "8"}).encode(cases.ROW_EVENTS)
    return m.key or b"", m.value or b""


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.binary(max_size=200))
def test_fuzz_random_bytes(key: bytes, value: bytes) -> None:
    try:
        events = decode(key, value)
    except DecodeError:
        return
    assert all(isinstance(e, (RowChange, DDLEvent, ResolvedEvent)) for e in events)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_fuzz_truncated_and_mutated(data: st.DataObject) -> None:
    key, value = _valid_message()
    which = data.draw(st.sampled_from(["key", "value"]))
    buf = bytearray(key if which == "key" else value)
    if data.draw(st.booleans()):
        buf = buf[: data.draw(st.integers(0, len(buf)))]
    elif buf:
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] = data.draw(st.integers(0, 255))
    k, v = (bytes(buf), value) if which == "key" else (key, bytes(buf))
    try:
        events = decode(k, v)
    except DecodeError:
        return
    for e in events:
        assert isinstance(e, (RowChange, DDLEvent, ResolvedEvent))
        event_to_json_object(e)  # every decoded event renders


# --- the msgspec fast path decodes exactly as the orjson path -------------------------------------

class _OrjsonOnly:
    """Within: the decoders take the orjson path for every message (the fast path is switched off)."""

    def __enter__(self) -> None:
        self._saved = open_protocol_module._fast_key
        open_protocol_module._fast_key = None

    def __exit__(self, *exc: object) -> None:
        open_protocol_module._fast_key = self._saved


def outcome(decoder: Any, key: bytes, value: bytes | None) -> tuple[Any, ...]:
    """What decoding gives: ("events", repr of the events) or ("error", error type, message)."""
    try:
        events = decoder.decode(key, value, CTX)
    except DecodeError as exc:
        return ("error", type(exc), str(exc))
    return ("events", repr(events))  # repr tells -0.0 from 0.0 and types apart (1 vs 1.0)


_WARM: dict[bool, Any] = {}


def warm_decoder(fast: bool) -> Any:
    """A decoder (per path) that has met the valid messages below: its caches are hot."""
    decoder = _WARM.get(fast)
    if decoder is None:
        decoder = _WARM[fast] = decoder_for("open-protocol")
        for key, value in VALID_BATCHES:
            outcome(decoder, key, value)
    return decoder


def assert_paths_agree(key: bytes, value: bytes | None) -> None:
    fast = outcome(warm_decoder(True), key, value)
    fresh = outcome(decoder_for("open-protocol"), key, value)
    with _OrjsonOnly():
        slow = outcome(warm_decoder(False), key, value)
    assert fast == slow
    assert fresh == slow


def _batches() -> list[tuple[bytes, bytes]]:
    enc = encoder_for("open-protocol", {"max-batch-size": "8"})
    out = [(m.key or b"", m.value or b"") for m in enc.encode(cases.ALL_EVENTS)]
    wide = tuple(cases.Column(f"c{i}", 3, cases.F(0), i) for i in range(300))
    out += [(m.key or b"", m.value or b"") for m in enc.encode([cases.INSERT._replace(columns=wide)])]
    return out


VALID_BATCHES = _batches()
ROW_KEY = b'{"ts":5,"scm":"s","tbl":"t","t":1}'


def test_fast_path_is_taken_for_ticdc_rows() -> None:
    # every value within 64-bit signed integers (BIGINT UNSIGNED max takes the orjson path)
    columns = tuple(c for c in cases.INSERT.columns if c.name != "c_bigint_u")
    rows = [cases.INSERT._replace(columns=columns), cases.DELETE._replace(old=columns)]
    (message,) = encoder_for("open-protocol").encode(rows)
    key, value = message.key or b"", message.value or b""
    decoder = decoder_for("open-protocol")
    events = decoder.decode(key, value, CTX)
    assert decoder._last_shape is not None  # the fast path built its converter
    assert events == [e._replace(source=CTX) for e in rows]
    with _OrjsonOnly():
        other = decoder_for("open-protocol")
        assert other.decode(key, value, CTX) == events
        assert other._last_shape is None


@pytest.mark.parametrize("batch", range(len(VALID_BATCHES)))
def test_fast_path_agrees_on_valid_messages(batch: int) -> None:
    assert_paths_agree(*VALID_BATCHES[batch])


@pytest.mark.parametrize(
    "key, value",
    [
        (ROW_KEY, b'{"u":{"c":{"t":8,"f":128,"v":18446744073709551615}}}'),  # beyond int64: orjson path
        (ROW_KEY, b'{"u":{"c":{"t":8,"f":128,"v":18446744073709551616}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":8,"f":0,"v":-9223372036854775809}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":5,"f":0,"v":1e999}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":5,"f":0,"v":-0.0}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":5,"f":0,"v":0.1e-400}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":5,"f":0,"v":1}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":5,"f":0,"v":"2.5"}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":3,"f":0,"v":2.0}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":3,"f":0,"v":2.5}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":3,"f":0,"v":"aa"}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":3,"f":0,"v":true}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":3,"f":0,"v":[1]}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":3.0,"f":0,"v":1}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":true,"f":0,"v":1}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":3,"f":0.0,"v":1}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":3,"f":4294967296,"v":1}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":256,"f":0,"v":1}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":3,"v":1}}}'),  # legacy: no flags
        (ROW_KEY, b'{"u":{"c":{"t":3,"h":true,"v":1}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":3,"h":"yes","f":0,"v":1}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":3,"f":0,"v":1,"x":"\xff"}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":3,"f":0}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":15,"f":0,"v":"\xff"}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":15,"f":0,"v":"\\ud800"}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":15,"f":0,"v":12}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":15,"f":1,"v":"\\\\x89"}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":15,"f":1,"v":"\\\\q"}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":252,"f":1,"v":"!!"}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":6,"f":0,"v":"x"}}}'),
        (ROW_KEY, b'{"u":{}}'),
        (ROW_KEY, b'{"u":{"c":{"t":3,"f":0,"v":1},"c":{"t":15,"f":0,"v":"x"}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":3,"f":0,"v":1}},"d":null}'),
        (ROW_KEY, b'{"u":{"c":{"t":3,"f":0,"v":1}},"d":{"c":{"t":3,"f":0,"v":2}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":3,"f":0,"v":1}},"p":{"c":{"t":3,"f":0,"v":2}}}'),
        (ROW_KEY, b'{"u":{"c":{"t":3,"f":0,"v":1}},"p":{}}'),
        (ROW_KEY, b'{"u":{"c":{"t":3,"f":0,"v":1}},"x":1}'),
        (ROW_KEY, b'{"p":{"c":{"t":3,"f":0,"v":1}}}'),
        (ROW_KEY, b'[]'),
        (b'{"ts":5,"scm":"s","tbl":"t","t":1,"ptn":7}', b'{"u":{"c":{"t":3,"f":0,"v":1}}}'),
        (b'{"ts":5,"scm":"s","tbl":"t","t":1,"x":7}', b'{"u":{"c":{"t":3,"f":0,"v":1}}}'),
        (b'{"ts":18446744073709551615,"t":1}', b'{"u":{"c":{"t":3,"f":0,"v":1}}}'),
        (b'{"ts":-1,"t":1}', b'{"u":{"c":{"t":3,"f":0,"v":1}}}'),
        (b'{"ts":5,"scm":null,"t":1}', b'{"u":{"c":{"t":3,"f":0,"v":1}}}'),
        (b'{"ts":5,"t":2}', b'{"q":"CREATE TABLE t (c int)","t":3}'),
        (b'{"ts":5,"t":3}', b""),
    ],
)
def test_fast_path_agrees_on_unusual_entries(key: bytes, value: bytes) -> None:
    assert_paths_agree(frame_key(key), frame_value(value))
    # and as the second entry of a batch whose first entry is an ordinary row
    first_key, first_value = b'{"ts":4,"scm":"s","tbl":"t","t":1}', b'{"u":{"c":{"t":3,"f":0,"v":1}}}'
    assert_paths_agree(frame_key(first_key, key), frame_value(first_value, value))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(VALID_BATCHES[:-1]), st.data())
def test_fast_path_agrees_on_mutated_messages(batch: tuple[bytes, bytes], data: st.DataObject) -> None:
    key, value = batch
    which = data.draw(st.sampled_from(["key", "value"]))
    buf = bytearray(key if which == "key" else value)
    if not buf:
        return
    i = data.draw(st.integers(0, len(buf) - 1))
    how = data.draw(st.sampled_from(["replace", "delete", "insert"]))
    if how == "replace":
        buf[i] = data.draw(st.integers(0, 255))
    elif how == "delete":
        del buf[i]
    else:
        buf.insert(i, data.draw(st.integers(0, 255)))
    k, v = (bytes(buf), value) if which == "key" else (key, bytes(buf))
    assert_paths_agree(k, v)


_JSON_SCALARS = (
    st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1)  # what orjson writes
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6)
)


@settings(max_examples=300, deadline=None)
@given(st.data(), _JSON_SCALARS, st.sampled_from(["t", "f", "v", "h"]))
def test_fast_path_agrees_on_replaced_column_fields(data: st.DataObject, replacement: Any, field: str) -> None:
    """One column field of a valid batch replaced by an arbitrary JSON scalar (a type, flags, a value)."""
    key, value = _valid_message()
    entries = []
    pos = 0
    while pos < len(value):
        (n,) = struct.unpack_from(">Q", value, pos)
        entries.append(orjson.loads(value[pos + 8 : pos + 8 + n]))
        pos += 8 + n
    body = data.draw(st.sampled_from(entries))
    columns = body[data.draw(st.sampled_from(sorted(body)))]
    columns[data.draw(st.sampled_from(sorted(columns)))][field] = replacement
    assert_paths_agree(key, frame_value(*(orjson.dumps(e) for e in entries)))


_NUMBER_TEXTS = st.from_regex(r"-?(0|[1-9][0-9]{0,40})(\.[0-9]{1,30})?([eE][-+]?[0-9]{1,3})?", fullmatch=True)


@settings(max_examples=300, deadline=None)
@given(_NUMBER_TEXTS, st.sampled_from([1, 3, 8, 4, 5, 15, 246]))
def test_fast_path_reads_numbers_as_orjson_does(number: str, type_code: int) -> None:
    """Integers beyond 64 bits, long fractions, huge exponents: msgspec and orjson read them alike, or
    the fast path leaves them to the orjson path."""
    value = b'{"u":{"c":{"t":%d,"f":0,"v":%s}}}' % (type_code, number.encode())
    assert_paths_agree(frame_key(ROW_KEY), frame_value(value))


def test_decoder_pickles_after_use() -> None:
    """Spark ships decoders to executors: the generated converters stay behind, the copy rebuilds them."""
    import pickle

    key, value = VALID_BATCHES[2]
    decoder = decoder_for("open-protocol")
    events = decoder.decode(key, value, CTX)
    copy = pickle.loads(pickle.dumps(decoder))
    assert copy.options == decoder.options and copy._last_shape is None
    assert copy.decode(key, value, CTX) == events


# --- large-message handling (issue 10): never a row holding only its key ---------------------------

_LARGE_VALUES = {
    "insert": b'{"u":{"id":{"t":3,"h":true,"f":11,"v":7}}}',
    "update": b'{"u":{"id":{"t":3,"h":true,"f":11,"v":7}},"p":{"id":{"t":3,"h":true,"f":11,"v":7}}}',
}


@pytest.mark.parametrize("op", sorted(_LARGE_VALUES))
def test_handle_key_only_row_is_refused(op: str) -> None:
    """TiCDC's messageKey carries "ohk": true when only the handle key columns were sent."""
    key = frame_key(b'{"ts":9,"scm":"s","tbl":"t","t":1,"ohk":true}')
    with pytest.raises(HandleKeyOnlyError, match=r"tidb-cdc\[1\]@42: row 0 of s\.t .*handle-key-only"):
        decode(key, frame_value(_LARGE_VALUES[op]))


def test_handle_key_only_delete_is_a_delete_by_key() -> None:
    key = frame_key(b'{"ts":9,"scm":"s","tbl":"t","t":1,"ohk":true}')
    (event,) = decode(key, frame_value(b'{"d":{"id":{"t":3,"h":true,"f":11,"v":7}}}'))
    assert event.op == "delete" and event.old_values() == {"id": 7}


def test_handle_key_only_entry_with_u_and_d_is_a_delete_by_key_not_an_upstream_read() -> None:
    """A row value with "d" is a delete whatever else it holds (the decoder reads it so); a handle-key-only
    one is deleted by its key, never completed from the upstream as if it were an insert."""

    class Upstream:  # (stands for the upstream TiDB: only whether it is asked matters here)
        def fetch(self, schema: str, table: str, key: Any, commit_ts: int, protocol: str) -> Any:
            raise LookupError(f"asked for {schema}.{table} {key} at {commit_ts}")

    decoder = open_protocol_module.OpenProtocolDecoder(upstream=Upstream())
    key = frame_key(b'{"ts":9,"scm":"s","tbl":"t","t":1,"ohk":true}')
    column = b'{"t":3,"h":true,"f":11,"v":7}'
    (event,) = decoder.decode(key, frame_value(b'{"u":{"id":' + column + b'},"d":{"id":' + column + b"}}"), CTX)
    assert event.op == "delete" and event.old_values() == {"id": 7}
    with pytest.raises(LookupError, match=r"asked for s\.t \[\('id', 7\)\] at 9"):  # an insert: completed
        decoder.decode(key, frame_value(b'{"u":{"id":' + column + b"}}"), CTX)


def test_handle_key_only_row_in_a_batch_refuses_only_itself() -> None:
    """TiCDC batches a handle-key-only row with whole rows, of any table: the whole rows decode, and the
    key-only one is a FailedEntry (its own dead letter) naming the entry and the message."""
    ok = b'{"ts":8,"scm":"s","tbl":"t","t":1}'
    other = b'{"ts":10,"scm":"s","tbl":"u","t":1}'
    key = frame_key(ok, b'{"ts":9,"scm":"s","tbl":"t","t":1,"ohk":true}', other)
    first, failed, last = decode(key, frame_value(*[_LARGE_VALUES["insert"]] * 3))
    assert (first.kind, first.commit_ts, first.table, first.new_values()) == ("row", 8, "t", {"id": 7})
    assert (last.kind, last.commit_ts, last.table) == ("row", 10, "u")
    assert isinstance(failed, FailedEntry) and failed.kind == "failed" and failed.commit_ts == 9
    assert re.search(r"tidb-cdc\[1\]@42: entry 1 of 3: row 1 of s\.t at commit ts 9 .*handle-key-only", failed.error)
    assert failed.error.startswith("open-protocol: cannot decode message at ")


def test_claim_check_reference_without_storage_is_refused() -> None:
    key = frame_key(b'{"ts":9,"scm":"s","tbl":"t","t":1,"ccl":"s3://bucket/cc/s-t-9-abc.json"}')
    with pytest.raises(ClaimCheckError, match=r"claim-check.*s-t-9-abc\.json.*claim-check-storage-uri"):
        decode(key, frame_value(_LARGE_VALUES["insert"]))


def test_bad_large_message_flags_are_decode_errors() -> None:
    key = frame_key(b'{"ts":9,"scm":"s","tbl":"t","t":1,"ohk":"yes"}')
    with pytest.raises(DecodeError, match='"ohk" a boolean'):
        decode(key, frame_value(_LARGE_VALUES["insert"]))


# --- hostile input (issue 7) -----------------------------------------------------------------------

def test_deeply_nested_json_is_a_decode_error() -> None:
    """repr() of a 1000-deep list raised RecursionError from inside an error message."""
    for field in (b"ts", b"t"):
        nested = b"[" * 1000 + b"]" * 1000
        entry = b'{"ts":1,"scm":"s","tbl":"t","t":1}'.replace(b'"%s":1' % field, b'"%s":%s' % (field, nested))
        with pytest.raises(DecodeError, match=r"\[\[\["):
            decode(frame_key(entry), frame_value(_LARGE_VALUES["insert"]))
    ddl = b'{"q":"create table t (a int)","t":' + b"[" * 1000 + b"]" * 1000 + b"}"
    with pytest.raises(DecodeError, match="non-integer type"):
        decode(frame_key(b'{"ts":1,"scm":"s","tbl":"t","t":2}'), frame_value(ddl))


def test_error_messages_cap_what_they_quote() -> None:
    big = "x" * 5_000_000
    entry = orjson.dumps({"ts": big, "scm": "s", "tbl": "t", "t": 1})
    with pytest.raises(DecodeError) as info:
        decode(frame_key(entry), frame_value(_LARGE_VALUES["insert"]))
    message = str(info.value)
    assert len(message) < 1000 and "… (5000000 bytes)" in message


@pytest.mark.parametrize(
    "literal, type_code, expected",
    [
        (b"18446744073709551616", 8, 18446744073709551616),
        (b"-9223372036854775809", 8, -9223372036854775809),
        (b"123456789012345678901234567890123456789", 8, 123456789012345678901234567890123456789),
        (b"123456789012345678901234567890", 246, "123456789012345678901234567890"),
        (b"18446744073709551615", 8, 18446744073709551615),
        (b"1.25", 246, "1.25"),
    ],
)
def test_integers_keep_exact_precision_at_any_size(literal: bytes, type_code: int, expected: object) -> None:
    value = b'{"u":{"c":{"t":%d,"f":0,"v":%s}}}' % (type_code, literal)
    (event,) = decode(frame_key(ROW_KEY), frame_value(value))
    assert event.new_values() == {"c": expected}
    assert type(event.new_values()["c"]) is type(expected)


# --- only-output-updated-columns (issue 10): the full old image is rebuilt, as Canal-JSON does ----------

def test_only_updated_columns_old_image_is_rebuilt() -> None:
    """TiCDC drops unchanged columns from "p" (messageRow.dropNotUpdatedColumns)."""
    value = (b'{"u":{"id":{"t":3,"h":true,"f":11,"v":1},"a":{"t":15,"f":64,"v":"new"},"b":{"t":3,"f":64,"v":7}},'
             b'"p":{"a":{"t":15,"f":64,"v":"old"}}}')
    for decoder in (decoder_for("open-protocol"), warm_decoder(True)):
        (event,) = decoder.decode(frame_key(ROW_KEY), frame_value(value), CTX)
        assert event.op == "update"
        assert event.old_values() == {"id": 1, "a": "old", "b": 7}
        assert event.new_values() == {"id": 1, "a": "new", "b": 7}
        assert [c.name for c in event.old] == ["id", "a", "b"] and event.old.layout == event.columns.layout
    assert_paths_agree(frame_key(ROW_KEY), frame_value(value))


def test_only_updated_columns_old_with_unknown_column_is_refused() -> None:
    value = b'{"u":{"id":{"t":3,"h":true,"f":11,"v":1}},"p":{"zz":{"t":3,"f":0,"v":1}}}'
    with pytest.raises(DecodeError, match=r'"p" has columns that "u" lacks: \[\'zz\'\]'):
        decode(frame_key(ROW_KEY), frame_value(value))
    assert_paths_agree(frame_key(ROW_KEY), frame_value(value))


def test_only_updated_columns_encoder_round_trip() -> None:
    opts = {"only-output-updated-columns": "true"}
    (message,) = encoder_for("open-protocol", opts).encode([cases.UPDATE])
    (length,) = struct.unpack_from(">Q", message.value, 0)
    body = orjson.loads(message.value[8 : 8 + length])
    changed = {c.name for c, o in zip(cases.UPDATE.columns, cases.UPDATE.old) if c.value != o.value}
    assert set(body["p"]) == changed and len(body["p"]) < len(body["u"])
    (event,) = decode(message.key, message.value)
    assert event.old_values() == cases.UPDATE.old_values() and event.new_values() == cases.UPDATE.new_values()


def test_a_shape_is_written_code_for_at_its_compile_at_th_sighting_only() -> None:
    """A column group's converter (generated code) costs what a few hundred rows cost the plain way: a stream
    of ever new shapes (corrupt or hostile) decodes without writing code for any; a table's rows get theirs
    at the COMPILE_AT-th row, and decode alike."""
    def message(name: str, ts: int) -> tuple[bytes, bytes]:
        row = RowChange(ts, "s", "t", Op.INSERT, (Column("id", int(T.BIGINT), F.HANDLE_KEY, ts),
                                                  Column(name, int(T.VARCHAR), F(0), "x")), None)
        (m,) = encoder_for("open-protocol").encode([row])
        return m.key or b"", m.value or b""

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("ticdc_delta.codec.base.COMPILE_AT", COMPILE_AT)  # (the codec tests' is 1: conftest)
        decoder = decoder_for("open-protocol")
        mp.setattr("ticdc_delta.codec.base.COMPILE_AT", 1)
        eager = decoder_for("open-protocol")
        for i in range(50):  # 50 shapes, each met once
            assert decoder.decode(*message(f"c{i}", i + 1), CTX) == eager.decode(*message(f"c{i}", i + 1), CTX)
        assert not decoder._shapes and decoder._last_shape is None
        for n in range(1, COMPILE_AT + 1):
            assert decoder.decode(*message("c7", n), CTX) == eager.decode(*message("c7", n), CTX)
            assert len(decoder._shapes) == (1 if n >= COMPILE_AT - 1 else 0)  # (met once above)
        assert decoder._last_shape is not None
