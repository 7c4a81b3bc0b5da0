"""TiCDC Craft: the columnar binary batch protocol (``protocol=craft``).

One Kafka message (key empty) carries one or more events::

    message    = uvarint version (1) | header | bodies | term dictionary | size tables | size-tables size
    header     = delta uvarint chunk commit ts | uvarint chunk event type (1 row, 2 DDL, 3 resolved)
                 | delta varint chunk partition id (-1: none) | delta varint chunk schema term id
                 | delta varint chunk table term id                     (term id -1: no name)
    row body   = 1 or 2 column groups
    group      = 1 byte type (1 new, 2 old) | uvarint column count | delta varint chunk name term ids
                 | uvarint chunk types | uvarint chunk flags | nullable bytes chunk values
    DDL body   = uvarint DDL type | uvarint length + query bytes
    resolved   = empty body
    dictionary = uvarint count | uvarint lengths | term bytes          (absent when no event names any)
    size table = uvarint count | delta varint chunk                    (meta [header, dictionary],
                 events [body size of each event], then one per row event: its column-group sizes)

The size of the size tables closes the message as a uvarint whose bytes are written in reverse order,
so a reader finds it from the end. Chunks store no count: every header chunk has one element per event
(the length of the events size table) and every group chunk one element per column.

Where the published document and TiCDC's code disagree, this module follows the code (``tiflow``
``cdc/sink/codec/craft``) and the document's own hex dumps: a *delta varint chunk* stores its
differences as zigzag varints (the document says uvarint), column names are a delta *varint* chunk,
``YEAR`` is always a zigzag varint (TiDB gives YEAR columns the unsigned flag, TiCDC ignores it there),
and DDL and resolved events travel each in a message of its own while row events are batched.

Value bytes per column type: signed integers zigzag varint, ``UNSIGNED`` integers, BIT, ENUM and SET
uvarint; FLOAT/DOUBLE a little-endian float64; dates, times, DECIMAL and JSON UTF-8 text; CHAR, VARCHAR,
TEXT and BLOB the raw bytes (``bytes`` with the binary flag, else UTF-8 text); NULL length -1.
"""

from __future__ import annotations

import struct
from itertools import accumulate
from typing import Any, Callable, Iterable, Sequence

from ..errors import DecodeError, EncodeError, FramingError, TruncatedMessageError, UnsupportedVersionError
from .base import Message
from .model import (
    Column,
    ColumnFlag,
    DDLEvent,
    DecodeContext,
    Event,
    Op,
    ResolvedEvent,
    RowChange,
    TypeCode,
    column_flag,
)

__all__ = ["PROTOCOL", "VERSION", "CraftDecoder", "CraftEncoder"]

PROTOCOL = "craft"
VERSION = 1
"""The only Craft version TiCDC writes."""

# Event types of the header's type chunk (TiCDC ``model.MessageType``).
_ROW, _DDL, _RESOLVED = 1, 2, 3
# Column group types (first byte of a group).
_GROUP_NEW, _GROUP_OLD = 1, 2
_NULL_ID = -1  # term id / partition id meaning "none"

_U64 = (1 << 64) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_MAX_DDL_TYPE = 255  # TiDB's ActionType is a byte

# zigzag decoding of a one-byte varint (values 0..127)
_ZZ: tuple[int, ...] = tuple((i >> 1) ^ -(i & 1) for i in range(128))
_zz = _ZZ.__getitem__

_FLOAT64 = struct.Struct("<d")
_unpack_float = _FLOAT64.unpack
_pack_float = _FLOAT64.pack

# Building the Column namedtuple through tuple.__new__ skips the generated Python-level __new__ and halves
# the cost of the commonest allocation of the decoder; the result is an ordinary Column.
_new_tuple = tuple.__new__

# TiCDC sink-uri parameters (Kafka sink and codec): the decoder does not need any of them, the encoder
# uses max-batch-size and max-message-bytes; anything else is a typo worth reporting.
_KNOWN_OPTIONS = frozenset(
    {
        "protocol",
        "max-batch-size",
        "max-message-bytes",
        "partition-num",
        "replication-factor",
        "kafka-version",
        "kafka-client-id",
        "compression",
        "auto-create-topic",
        "dial-timeout",
        "read-timeout",
        "write-timeout",
        "required-acks",
        "enable-tidb-extension",
        "enable-tls",
        "ca",
        "cert",
        "key",
        "insecure-skip-verify",
        "sasl-user",
        "sasl-password",
        "sasl-mechanism",
        "sasl-gssapi-auth-type",
        "sasl-gssapi-keytab-path",
        "sasl-gssapi-kerberos-config-path",
        "sasl-gssapi-service-name",
        "sasl-gssapi-user",
        "sasl-gssapi-password",
        "sasl-gssapi-realm",
        "sasl-gssapi-disable-pafxfast",
        "content-compatible",
    }
)

_DEFAULT_MAX_BATCH_SIZE = 16  # TiCDC config.DefaultMaxBatchSize
_DEFAULT_MAX_MESSAGE_BYTES = 10 * 1024 * 1024  # TiCDC config.DefaultMaxMessageBytes


def _check_options(options: dict[str, str] | None) -> dict[str, str]:
    opts = dict(options or {})
    unknown = sorted(k for k in opts if k not in _KNOWN_OPTIONS)
    if unknown:
        raise ValueError(f"unknown {PROTOCOL} option(s): {', '.join(unknown)}")
    return opts


def _positive_int_option(options: dict[str, str], name: str, default: int) -> int:
    if name not in options:
        return default
    raw = str(options[name]).strip()
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"option {name} must be a positive integer, got {options[name]!r}")
    return value


# --------------------------------------------------------------------------------------------- decoding


def _bad(reason: str) -> DecodeError:
    return DecodeError(PROTOCOL, reason)


def _framing(reason: str) -> FramingError:
    return FramingError(PROTOCOL, reason)


def _truncated(what: str, end: int, pos: int) -> TruncatedMessageError:
    return TruncatedMessageError(PROTOCOL, f"{what}: needs more bytes than the {end - pos} left")


def _uvarint(data: bytes, pos: int, end: int, what: str) -> tuple[int, int]:
    """One uvarint at ``pos`` (not reaching ``end``): (value, next position).

    Raises:
        TruncatedMessageError: the varint runs past ``end``.
        DecodeError: longer than 10 bytes or above 2**64-1 (Go's ``binary.Uvarint`` overflow rule).
    """
    if pos >= end:
        raise _truncated(what, end, pos)
    b = data[pos]
    if b < 0x80:
        return b, pos + 1
    value = 0
    shift = 0
    start = pos
    while True:
        if pos >= end:
            raise _truncated(what, end, start)
        b = data[pos]
        pos += 1
        if b < 0x80:
            if shift == 63 and b > 1:
                raise _bad(f"{what}: varint overflows 64 bits")
            return value | (b << shift), pos
        if shift == 63:
            raise _bad(f"{what}: varint longer than 10 bytes")
        value |= (b & 0x7F) << shift
        shift += 7


def _uvarints(data: bytes, pos: int, end: int, what: str) -> list[int]:
    """Every uvarint of ``data[pos:end]``, which must hold nothing else.

    Raises:
        TruncatedMessageError: the last varint is cut by ``end``.
        DecodeError: a varint overflows 64 bits.
    """
    region = data[pos:end]
    if region.isascii():  # every byte is a whole varint
        return list(region)
    out: list[int] = []
    append = out.append
    value = 0
    shift = 0
    for b in region:
        if b < 0x80:
            if shift == 63 and b > 1:
                raise _bad(f"{what}: varint overflows 64 bits")
            append(value | (b << shift))
            value = 0
            shift = 0
        else:
            if shift == 63:
                raise _bad(f"{what}: varint longer than 10 bytes")
            value |= (b & 0x7F) << shift
            shift += 7
    if shift:
        raise TruncatedMessageError(PROTOCOL, f"{what}: the last varint is cut off")
    return out


def _uvarint_run(data: bytes, pos: int, end: int, count: int, what: str) -> tuple[list[int], int]:
    """``count`` consecutive uvarints from ``pos`` (not reaching ``end``): (values, next position).

    Raises:
        TruncatedMessageError: fewer than ``count`` varints before ``end``.
        DecodeError: a varint overflows 64 bits.
    """
    stop = pos + count
    if stop > end:
        raise _truncated(f"{what} ({count} varints)", end, pos)
    run = data[pos:stop]
    if run.isascii():  # fast path: each byte is one varint
        return list(run), stop
    out: list[int] = []
    append = out.append
    for _ in range(count):
        value, pos = _uvarint(data, pos, end, what)
        append(value)
    return out, pos


def _zigzag(u: int) -> int:
    return (u >> 1) ^ -(u & 1)


def _zigzags(values: Iterable[int]) -> list[int]:
    return [(u >> 1) ^ -(u & 1) for u in values]


def _exact_uvarint(raw: bytes) -> int:
    value, pos = _uvarint(raw, 0, len(raw), "value")
    if pos != len(raw):
        raise _bad(f"value holds {len(raw)} bytes but its varint takes {pos}")
    return value


def _dec_int(raw: bytes) -> int:
    if len(raw) == 1:
        b = raw[0]
        if b < 0x80:
            return _ZZ[b]
    u = _exact_uvarint(raw)
    return (u >> 1) ^ -(u & 1)


def _dec_uint(raw: bytes) -> int:
    if len(raw) == 1:
        b = raw[0]
        if b < 0x80:
            return b
    return _exact_uvarint(raw)


def _dec_float(raw: bytes) -> float:
    if len(raw) != 8:
        raise _bad(f"float64 value must be 8 bytes, found {len(raw)}")
    return _unpack_float(raw)[0]  # type: ignore[no-any-return]


def _dec_null(raw: bytes) -> None:
    raise _bad(f"a NULL/GEOMETRY column carries {len(raw)} value bytes; TiCDC writes none")


_dec_str: Callable[[bytes], str] = bytes.decode  # strict UTF-8
_dec_bytes: Callable[[bytes], bytes] = bytes  # a slice already is a fresh bytes object

_SIGNED_OR_UNSIGNED = frozenset({1, 2, 3, 8, 9})  # TINYINT SMALLINT INT BIGINT MEDIUMINT
_UNSIGNED_NUMBERS = frozenset({16, 247, 248})  # BIT ENUM SET: uvarint
_TEXT_TYPES = frozenset({7, 10, 11, 12, 14, 245, 246})  # TIMESTAMP DATE TIME DATETIME NEWDATE JSON DECIMAL
_BYTES_TYPES = frozenset({15, 249, 250, 251, 252, 253, 254})  # VARCHAR, *BLOB/*TEXT, VAR_STRING, STRING
_FLOAT_TYPES = frozenset({4, 5})
_NULL_TYPES = frozenset({6, 255})  # NULL, GEOMETRY: TiCDC writes no value
_KNOWN_TYPES = frozenset(int(t) for t in TypeCode)

_UNSIGNED = int(ColumnFlag.UNSIGNED)
_BINARY = int(ColumnFlag.BINARY)


def _value_decoder(tp: int, flags: int) -> Callable[[bytes], Any]:
    if tp in _SIGNED_OR_UNSIGNED:
        return _dec_uint if flags & _UNSIGNED else _dec_int
    if tp == TypeCode.YEAR:
        return _dec_int  # TiCDC encodes YEAR as int64 whatever the flags say
    if tp in _TEXT_TYPES:
        return _dec_str
    if tp in _BYTES_TYPES:
        return _dec_bytes if flags & _BINARY else _dec_str
    if tp in _FLOAT_TYPES:
        return _dec_float
    if tp in _UNSIGNED_NUMBERS:
        return _dec_uint
    return _dec_null


# A column group's metadata once parsed: (name term ids, types, flags, value decoders); and resolved
# against one message's term dictionary: (names, types, flags, value decoders).
_GroupMeta = tuple[tuple[int, ...], tuple[int, ...], tuple[ColumnFlag, ...], tuple[Callable[[bytes], Any], ...]]
_ResolvedMeta = tuple[tuple[str, ...], tuple[int, ...], tuple[ColumnFlag, ...], tuple[Callable[[bytes], Any], ...]]

_META_CACHE_LIMIT = 4096
_META_LENGTHS_LIMIT = 16


class CraftDecoder:
    """Decodes TiCDC Craft messages into events.

    Options are TiCDC sink-uri parameters; none changes decoding, known ones are accepted and ignored.
    The decoder caches the metadata of column groups it has seen (names, types, flags), keyed by their
    exact bytes, so a batch of rows of one table parses that metadata once. Not thread-safe.
    """

    protocol = PROTOCOL

    def __init__(self, options: dict[str, str] | None = None) -> None:
        """Raises:
        ValueError: an option TiCDC does not have.
        """
        _check_options(options)
        self._meta_cache: dict[bytes, _GroupMeta] = {}
        self._meta_lengths: dict[int, list[int]] = {}

    def decode(self, key: bytes | None, value: bytes | None, ctx: DecodeContext) -> list[Event]:
        """All events of one Craft message, in message order; each has ``source=ctx``.

        The key is ignored (TiCDC sends none).

        Raises:
            FramingError: empty value, or sizes that do not add up to the message.
            TruncatedMessageError: a field runs past the end of its region.
            UnsupportedVersionError: a version other than 1.
            DecodeError: anything else invalid (unknown type code, term id out of range, bad UTF-8).
        """
        try:
            return self._decode(bytes(value) if value is not None else b"", ctx)
        except DecodeError as err:
            raise err.with_context(ctx.topic, ctx.partition, ctx.offset) from None

    # -- message structure --------------------------------------------------------------------------

    def _decode(self, data: bytes, ctx: DecodeContext) -> list[Event]:
        size = len(data)
        if size == 0:
            raise _framing("empty message")
        version, pos = _uvarint(data, 0, size, "version")
        if version != VERSION:
            raise UnsupportedVersionError(PROTOCOL, f"version {version}, expected {VERSION}")
        body_start = pos

        tables_size, tables_start = _size_tables_size(data, pos)
        tables = _size_tables(data, tables_start, tables_start + tables_size)
        if len(tables) < 2:
            raise _framing(f"expected the meta and events size tables, found {len(tables)} table(s)")
        meta, event_sizes = tables[0], tables[1]
        if len(meta) != 2:
            raise _framing(f"meta size table must hold 2 sizes (header, dictionary), holds {len(meta)}")
        header_size, dict_size = meta
        count = len(event_sizes)
        if count == 0:
            raise _framing("message holds no events")
        for s in (header_size, dict_size, *event_sizes):
            if s < 0:
                raise _framing(f"negative size {s} in the size tables")
        bodies_size = sum(event_sizes)
        if body_start + header_size + bodies_size + dict_size != tables_start:
            raise _framing(
                f"header {header_size} + bodies {bodies_size} + dictionary {dict_size} bytes after the "
                f"version make {body_start + header_size + bodies_size + dict_size}, but the size tables "
                f"start at byte {tables_start}"
            )

        dict_start = body_start + header_size + bodies_size
        terms = _term_dictionary(data, dict_start, dict_start + dict_size) if dict_size else ()

        header_end = body_start + header_size
        ts_list, types, schemas, table_names = _header(data, body_start, header_end, count, terms)

        rows = types.count(_ROW)
        if len(tables) != 2 + rows:
            raise _framing(f"{rows} row event(s) need {rows} column-group size table(s), found {len(tables) - 2}")

        events: list[Event] = []
        append = events.append
        msg_meta: dict[bytes, _ResolvedMeta] = {}
        row_index = 2
        pos = header_end
        for i in range(count):
            end = pos + event_sizes[i]
            tp = types[i]
            if tp == _ROW:
                group_sizes = tables[row_index]
                row_index += 1
                append(self._row(data, pos, end, group_sizes, terms, msg_meta, ts_list[i], schemas[i], table_names[i], ctx))
            elif tp == _DDL:
                ddl_type, query = _ddl_body(data, pos, end)
                append(DDLEvent(ts_list[i], schemas[i], table_names[i], query, ddl_type, ctx))
            else:  # _RESOLVED (the header accepted no other type)
                if end != pos:
                    raise _framing(f"resolved event {i} has a {end - pos}-byte body; it must be empty")
                append(ResolvedEvent(ts_list[i], ctx))
            pos = end
        return events

    # -- row events --------------------------------------------------------------------------------

    def _row(
        self,
        data: bytes,
        pos: int,
        end: int,
        group_sizes: list[int],
        terms: Sequence[str],
        msg_meta: dict[bytes, _ResolvedMeta],
        ts: int,
        schema: str,
        table: str,
        ctx: DecodeContext,
    ) -> RowChange:
        n_groups = len(group_sizes)
        if n_groups != 1 and n_groups != 2:
            raise _framing(f"a row event holds 1 or 2 column groups, its size table lists {n_groups}")
        if sum(group_sizes) != end - pos:
            raise _framing(f"column groups of {sum(group_sizes)} bytes in a row body of {end - pos} bytes")
        new = old = None
        for gsize in group_sizes:
            if gsize < 0:
                raise _framing(f"negative column group size {gsize}")
            gend = pos + gsize
            gtype, columns = self._group(data, pos, gend, terms, msg_meta)
            if gtype == _GROUP_NEW and new is None:
                new = columns
            elif gtype == _GROUP_OLD and old is None:
                old = columns
            else:
                raise _bad(f"unexpected column group type {gtype} (1 new, 2 old, each at most once)")
            pos = gend
        if new is not None:
            op = Op.UPDATE if old is not None else Op.INSERT
        else:
            op = Op.DELETE
        return RowChange(ts, schema, table, op, new, old, ctx)

    def _group(
        self, data: bytes, pos: int, end: int, terms: Sequence[str], msg_meta: dict[bytes, _ResolvedMeta]
    ) -> tuple[int, tuple[Column, ...]]:
        if pos >= end:
            raise _truncated("column group type", end, pos)
        gtype = data[pos]
        ncols, pos = _uvarint(data, pos + 1, end, "column count")
        # every column takes at least 4 bytes (name id, type, flag, value length): bound before allocating
        if ncols == 0 or 4 * ncols > end - pos:
            if ncols == 0:
                raise _bad("column group with no columns")
            raise _truncated(f"column group of {ncols} columns", end, pos)

        resolved = None
        for length in self._meta_lengths.get(ncols, ()):
            stop = pos + length
            if stop > end:
                continue
            key = data[pos:stop]
            resolved = msg_meta.get(key)
            if resolved is None:
                meta = self._meta_cache.get(key)
                if meta is not None:
                    resolved = msg_meta[key] = _resolve(meta, terms)
            if resolved is not None:
                pos = stop
                break
        else:
            start = pos
            meta, pos = _parse_group_meta(data, pos, end, ncols)
            key = data[start:pos]
            cache = self._meta_cache
            if len(cache) >= _META_CACHE_LIMIT:
                cache.clear()
                self._meta_lengths.clear()
            cache[key] = meta
            lengths = self._meta_lengths.setdefault(ncols, [])
            if len(lengths) < _META_LENGTHS_LIMIT:
                lengths.append(pos - start)
            resolved = msg_meta[key] = _resolve(meta, terms)
        names, types, flags, decoders = resolved

        # nullable bytes chunk: all lengths (zigzag varints, -1 = NULL), then all value bytes
        stop = pos + ncols
        run = data[pos:stop]
        if stop <= end and run.isascii():
            lengths = list(map(_zz, run))
            pos = stop
        else:
            raw_lengths, pos = _uvarint_run(data, pos, end, ncols, "value lengths")
            lengths = _zigzags(raw_lengths)
        columns = []
        add = columns.append
        i = 0
        try:
            for i in range(ncols):
                n = lengths[i]
                if n < 0:
                    if n != -1:
                        raise _bad(f"value length {n} of column {names[i]!r}")
                    add(_new_tuple(Column, (names[i], types[i], flags[i], None)))
                else:
                    stop = pos + n
                    add(_new_tuple(Column, (names[i], types[i], flags[i], decoders[i](data[pos:stop]))))
                    pos = stop
        except UnicodeDecodeError as err:
            raise _bad(f"value of column {names[i]!r} is not UTF-8: {err.reason}") from None
        except DecodeError as err:
            raise type(err)(PROTOCOL, f"column {names[i]!r}: {err.reason}") from None
        if pos != end:
            raise _framing(f"column values end at byte {pos} but the column group ends at byte {end}")
        return gtype, tuple(columns)


def _size_tables_size(data: bytes, floor: int) -> tuple[int, int]:
    """The size of the size tables: a uvarint written backwards at the end of the message.

    Returns (size, start of the size tables).

    Raises:
        TruncatedMessageError / FramingError: the varint or the tables it announces do not fit.
    """
    pos = len(data) - 1
    value = 0
    shift = 0
    while True:
        if pos < floor:
            raise TruncatedMessageError(PROTOCOL, "size of the size tables is cut off")
        b = data[pos]
        if b < 0x80:
            if shift == 63 and b > 1:
                raise _bad("size of the size tables overflows 64 bits")
            value |= b << shift
            break
        if shift == 63:
            raise _bad("size of the size tables is longer than 10 bytes")
        value |= (b & 0x7F) << shift
        shift += 7
        pos -= 1
    if value > pos - floor:
        raise TruncatedMessageError(
            PROTOCOL, f"size tables of {value} bytes announced, only {pos - floor} bytes before them"
        )
    return value, pos - value


def _size_tables(data: bytes, start: int, end: int) -> list[list[int]]:
    """All size tables: each a uvarint count and a delta varint chunk of that many sizes.

    Raises:
        TruncatedMessageError: a table lists more sizes than its bytes hold.
    """
    values = _uvarints(data, start, end, "size tables")
    tables: list[list[int]] = []
    i = 0
    n = len(values)
    while i < n:
        count = values[i]
        i += 1
        if count > n - i:
            raise TruncatedMessageError(PROTOCOL, f"size table of {count} sizes, only {n - i} varints left")
        j = i + count
        tables.append(list(accumulate(_zigzags(values[i:j]))))
        i = j
    return tables


def _term_dictionary(data: bytes, pos: int, end: int) -> tuple[str, ...]:
    """The term dictionary: uvarint count, uvarint lengths, then the terms' bytes.

    Raises:
        TruncatedMessageError / FramingError: counts or lengths that do not fill its region exactly.
        DecodeError: a term is not UTF-8.
    """
    count, pos = _uvarint(data, pos, end, "term count")
    if count > end - pos:
        raise _truncated(f"term dictionary of {count} terms", end, pos)
    lengths, pos = _uvarint_run(data, pos, end, count, "term lengths")
    if sum(lengths) != end - pos:
        raise _framing(f"terms of {sum(lengths)} bytes in a {end - pos}-byte remainder of the dictionary")
    terms = []
    for n in lengths:
        stop = pos + n
        try:
            terms.append(data[pos:stop].decode())
        except UnicodeDecodeError:
            raise _bad(f"term {len(terms)} is not UTF-8") from None
        pos = stop
    return tuple(terms)


def _term(terms: Sequence[str], tid: int, what: str) -> str:
    if tid == _NULL_ID:
        return ""
    if 0 <= tid < len(terms):
        return terms[tid]
    raise _bad(f"{what} term id {tid} outside the dictionary of {len(terms)} terms")


def _header(
    data: bytes, pos: int, end: int, count: int, terms: Sequence[str]
) -> tuple[list[int], list[int], list[str], list[str]]:
    """The columnar header: commit ts, event type, partition, schema and table of ``count`` events.

    Raises:
        FramingError: the header holds more or fewer than 5 * count varints.
        DecodeError: an unknown event type, a bad partition id or term id.
    """
    values = _uvarints(data, pos, end, "header")
    if len(values) != 5 * count:
        raise _framing(f"header of {count} events must hold {5 * count} varints, holds {len(values)}")
    ts = values[0]
    ts_list = [ts]
    for delta in values[1:count]:  # delta uvarint chunk; Go's uint64 arithmetic wraps
        ts = (ts + delta) & _U64
        ts_list.append(ts)
    types = values[count : 2 * count]
    for tp in types:
        if tp != _ROW and tp != _DDL and tp != _RESOLVED:
            raise _bad(f"unknown event type {tp} (1 row, 2 DDL, 3 resolved)")
    for partition in accumulate(_zigzags(values[2 * count : 3 * count])):
        if partition < _NULL_ID or partition > _I64_MAX:
            raise _bad(f"partition id {partition} (-1 or a physical table id)")
    schema_ids = accumulate(_zigzags(values[3 * count : 4 * count]))
    table_ids = accumulate(_zigzags(values[4 * count :]))
    schemas = [_term(terms, tid, "schema") for tid in schema_ids]
    tables = [_term(terms, tid, "table") for tid in table_ids]
    return ts_list, types, schemas, tables


def _ddl_body(data: bytes, pos: int, end: int) -> tuple[int | None, str]:
    """A DDL body: uvarint DDL type and a uvarint-length query. Type 0 (TiDB ``ActionNone``) → None.

    Raises:
        TruncatedMessageError / FramingError: the query does not fill the body exactly.
        DecodeError: DDL type above 255, query not UTF-8.
    """
    ddl_type, pos = _uvarint(data, pos, end, "DDL type")
    if ddl_type > _MAX_DDL_TYPE:
        raise _bad(f"DDL type {ddl_type} above {_MAX_DDL_TYPE}")
    n, pos = _uvarint(data, pos, end, "DDL query length")
    if n != end - pos:
        if n > end - pos:
            raise _truncated(f"DDL query of {n} bytes", end, pos)
        raise _framing(f"DDL query of {n} bytes in a {end - pos}-byte remainder of the body")
    try:
        query = data[pos:end].decode()
    except UnicodeDecodeError:
        raise _bad("DDL query is not UTF-8") from None
    return (ddl_type or None), query


def _parse_group_meta(data: bytes, pos: int, end: int, ncols: int) -> tuple[_GroupMeta, int]:
    """Names (delta varint chunk of term ids), types and flags (uvarint chunks) of a column group.

    Raises:
        TruncatedMessageError: the chunks run past the group.
        DecodeError: an unknown type code or a flag above 64 bits.
    """
    raw, pos = _uvarint_run(data, pos, end, 3 * ncols, "column names, types and flags")
    ids = tuple(accumulate(_zigzags(raw[:ncols])))
    types = tuple(raw[ncols : 2 * ncols])
    flags = raw[2 * ncols :]
    for tp in types:
        if tp not in _KNOWN_TYPES:
            raise _bad(f"unknown column type code {tp}")
    decoders = tuple(_value_decoder(tp, fl) for tp, fl in zip(types, flags))
    return (ids, types, tuple(column_flag(f) for f in flags), decoders), pos


def _resolve(meta: _GroupMeta, terms: Sequence[str]) -> _ResolvedMeta:
    ids, types, flags, decoders = meta
    n = len(terms)
    for tid in ids:
        if not 0 <= tid < n:
            raise _bad(f"column name term id {tid} outside the dictionary of {n} terms")
    return tuple(terms[tid] for tid in ids), types, flags, decoders


# --------------------------------------------------------------------------------------------- encoding


def _put_uvarint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _uvarint_bytes(value: int) -> bytes:
    out = bytearray()
    _put_uvarint(out, value)
    return bytes(out)


def _zigzag_encode(value: int) -> int:
    return value << 1 if value >= 0 else ((-value) << 1) - 1


def _put_delta_varints(out: bytearray, values: Sequence[int]) -> None:
    last = 0
    for v in values:
        _put_uvarint(out, _zigzag_encode(v - last))
        last = v


def _enc_fail(column: str, expected: str, value: Any) -> EncodeError:
    return EncodeError(f"{PROTOCOL}: column {column!r} needs {expected}, got {type(value).__name__} {value!r:.60}")


def _value_encoder(tp: int, flags: int) -> Callable[[str, Any], bytes]:
    """Value bytes for a column of type ``tp`` with ``flags`` (TiCDC ``EncodeTiDBType``)."""

    def signed(name: str, v: Any) -> bytes:
        if type(v) is not int or not _I64_MIN <= v <= _I64_MAX:
            raise _enc_fail(name, "a signed 64-bit int", v)
        return _uvarint_bytes(_zigzag_encode(v))

    def unsigned(name: str, v: Any) -> bytes:
        if type(v) is not int or not 0 <= v <= _U64:
            raise _enc_fail(name, "an unsigned 64-bit int", v)
        return _uvarint_bytes(v)

    def float64(name: str, v: Any) -> bytes:
        if type(v) is not float and type(v) is not int:
            raise _enc_fail(name, "a float", v)
        return _pack_float(v)

    def text(name: str, v: Any) -> bytes:
        if type(v) is not str:
            raise _enc_fail(name, "str", v)
        return v.encode()

    def binary(name: str, v: Any) -> bytes:
        if not isinstance(v, (bytes, bytearray, memoryview)):
            raise _enc_fail(name, "bytes (binary flag)", v)
        return bytes(v)

    def null(name: str, v: Any) -> bytes:
        raise _enc_fail(name, "None (TiCDC writes no value for NULL/GEOMETRY columns)", v)

    if tp in _SIGNED_OR_UNSIGNED:
        return unsigned if flags & _UNSIGNED else signed
    if tp == TypeCode.YEAR:
        return signed
    if tp in _TEXT_TYPES:
        return text
    if tp in _BYTES_TYPES:
        return binary if flags & _BINARY else text
    if tp in _FLOAT_TYPES:
        return float64
    if tp in _UNSIGNED_NUMBERS:
        return unsigned
    return null


class _Terms:
    """A message's term dictionary under construction: ids in order of first use."""

    __slots__ = ("ids", "terms")

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.terms: list[str] = []

    def id(self, term: str) -> int:
        tid = self.ids.get(term)
        if tid is None:
            tid = self.ids[term] = len(self.terms)
            self.terms.append(term)
        return tid

    def nullable_id(self, term: str) -> int:
        # TiCDC writes a nil (-1) name for an empty schema or table name
        return self.id(term) if term else _NULL_ID


class CraftEncoder:
    """Writes events as TiCDC's Craft batch encoder does.

    Row events are packed into one message until it holds ``max-batch-size`` events (default 16) or
    its estimated size exceeds ``max-message-bytes``; a DDL or resolved event flushes the pending rows and
    goes in a message of its own. Keys are ``None`` (TiCDC sends an empty key). Partition ids are written
    as -1: the event model does not know partitioned tables.
    """

    protocol = PROTOCOL

    def __init__(self, options: dict[str, str] | None = None) -> None:
        """Raises:
        ValueError: an option TiCDC does not have, or a bad max-batch-size / max-message-bytes.
        """
        opts = _check_options(options)
        self.max_batch_size = _positive_int_option(opts, "max-batch-size", _DEFAULT_MAX_BATCH_SIZE)
        self.max_message_bytes = _positive_int_option(opts, "max-message-bytes", _DEFAULT_MAX_MESSAGE_BYTES)
        self._value_encoders: dict[tuple[int, int], Callable[[str, Any], bytes]] = {}

    def encode(self, events: Sequence[Event]) -> list[Message]:
        """Messages for ``events``, in order.

        Raises:
            EncodeError: an event Craft cannot carry (no commit ts, a row without columns, a value of the
                wrong Python type for its column, an unknown type code).
        """
        messages: list[Message] = []
        rows: list[RowChange] = []
        estimated = 0
        for event in events:
            if isinstance(event, RowChange):
                rows.append(event)
                estimated += _estimated_size(event)
                # TiCDC flushes after appending the event that reaches either limit
                if len(rows) >= self.max_batch_size or estimated > self.max_message_bytes:
                    messages.append(Message(None, self.encode_message(rows)))
                    rows = []
                    estimated = 0
            elif isinstance(event, (DDLEvent, ResolvedEvent)):
                if rows:
                    messages.append(Message(None, self.encode_message(rows)))
                    rows = []
                    estimated = 0
                messages.append(Message(None, self.encode_message([event])))
            else:
                raise EncodeError(f"{PROTOCOL}: cannot encode {type(event).__name__}")
        if rows:
            messages.append(Message(None, self.encode_message(rows)))
        return messages

    def encode_message(self, events: Sequence[Event]) -> bytes:
        """One Craft message holding ``events`` (any mix of kinds), laid out as TiCDC lays it out.

        Terms get ids in TiCDC's order: every event's schema, then every event's table, then column
        names as the bodies use them.

        Raises:
            EncodeError: no events, or an event Craft cannot carry.
        """
        if not events:
            raise EncodeError(f"{PROTOCOL}: a message needs at least one event")
        terms = _Terms()
        ts_list: list[int] = []
        types: list[int] = []
        for ev in events:
            ts = ev.commit_ts
            if type(ts) is not int or not 0 <= ts <= _U64:
                raise EncodeError(f"{PROTOCOL}: commit ts must be an unsigned 64-bit int, got {ts!r}")
            ts_list.append(ts)
            if isinstance(ev, RowChange):
                types.append(_ROW)
            elif isinstance(ev, DDLEvent):
                types.append(_DDL)
            elif isinstance(ev, ResolvedEvent):
                types.append(_RESOLVED)
            else:
                raise EncodeError(f"{PROTOCOL}: cannot encode {type(ev).__name__}")
        schema_ids = [_NULL_ID if isinstance(ev, ResolvedEvent) else terms.nullable_id(ev.schema) for ev in events]
        table_ids = [_NULL_ID if isinstance(ev, ResolvedEvent) else terms.nullable_id(ev.table) for ev in events]

        out = bytearray()
        _put_uvarint(out, VERSION)
        header_start = len(out)
        last = 0
        for ts in ts_list:  # delta uvarint chunk, uint64 arithmetic
            _put_uvarint(out, (ts - last) & _U64)
            last = ts
        for tp in types:
            _put_uvarint(out, tp)
        _put_delta_varints(out, [_NULL_ID] * len(events))
        _put_delta_varints(out, schema_ids)
        _put_delta_varints(out, table_ids)
        header_size = len(out) - header_start

        event_sizes: list[int] = []
        group_tables: list[list[int]] = []
        for ev in events:
            start = len(out)
            if isinstance(ev, RowChange):
                sizes = []
                for gtype, columns in ((_GROUP_NEW, ev.columns), (_GROUP_OLD, ev.old)):
                    if columns:  # TiCDC writes no group for a missing or empty image
                        gstart = len(out)
                        self._put_group(out, gtype, columns, terms)
                        sizes.append(len(out) - gstart)
                if not sizes:
                    raise EncodeError(f"{PROTOCOL}: row event of {ev.schema}.{ev.table} has no columns")
                group_tables.append(sizes)
            elif isinstance(ev, DDLEvent):
                ddl_type = 0 if ev.ddl_type is None else ev.ddl_type
                if not isinstance(ddl_type, int) or isinstance(ddl_type, bool) or not 0 <= ddl_type <= _MAX_DDL_TYPE:
                    raise EncodeError(f"{PROTOCOL}: DDL type must be an int in 0..255, got {ev.ddl_type!r}")
                if not isinstance(ev.query, str):
                    raise EncodeError(f"{PROTOCOL}: DDL query must be str, got {type(ev.query).__name__}")
                _put_uvarint(out, int(ddl_type))
                query = ev.query.encode()
                _put_uvarint(out, len(query))
                out += query
            event_sizes.append(len(out) - start)

        dict_start = len(out)
        if terms.terms:  # TiCDC writes no dictionary at all when it is empty
            _put_uvarint(out, len(terms.terms))
            encoded = [t.encode() for t in terms.terms]
            for t in encoded:
                _put_uvarint(out, len(t))
            for t in encoded:
                out += t
        dict_size = len(out) - dict_start

        tables_start = len(out)
        for table in ([header_size, dict_size], event_sizes, *group_tables):
            _put_uvarint(out, len(table))
            _put_delta_varints(out, table)
        # the size of the size tables, as a uvarint with its bytes in reverse order
        out += _uvarint_bytes(len(out) - tables_start)[::-1]
        return bytes(out)

    def _put_group(self, out: bytearray, gtype: int, columns: Sequence[Column], terms: _Terms) -> None:
        out.append(gtype)
        _put_uvarint(out, len(columns))
        ids = []
        types = []
        flags = []
        for col in columns:
            name, tp, fl = col[0], col[1], col[2]
            if not isinstance(name, str):
                raise EncodeError(f"{PROTOCOL}: column name must be str, got {name!r}")
            if not isinstance(tp, int) or int(tp) not in _KNOWN_TYPES:
                raise EncodeError(f"{PROTOCOL}: column {name!r} has unknown type code {tp!r}")
            if not isinstance(fl, int) or not 0 <= fl <= _U64:
                raise EncodeError(f"{PROTOCOL}: column {name!r} has bad flags {fl!r}")
            ids.append(terms.id(name))
            types.append(int(tp))
            flags.append(int(fl))
        _put_delta_varints(out, ids)
        for tp in types:
            _put_uvarint(out, tp)
        for fl in flags:
            _put_uvarint(out, fl)
        values: list[bytes | None] = []
        encoders = self._value_encoders
        for col, tp, fl in zip(columns, types, flags):
            v = col[3]
            if v is None:
                values.append(None)
                continue
            enc = encoders.get((tp, fl))
            if enc is None:
                enc = encoders[(tp, fl)] = _value_encoder(tp, fl)
            values.append(enc(col[0], v))
        for b in values:  # nullable bytes chunk: zigzag lengths (-1 = NULL), then the bytes
            _put_uvarint(out, 1 if b is None else len(b) << 1)
        for b in values:
            if b is not None:
                out += b


def _estimated_size(ev: RowChange) -> int:
    """TiCDC's size estimate of a buffered row (``appendHeader`` + ``newColumnGroup``)."""
    size = 32 + len(ev.schema) + len(ev.table)
    for columns in (ev.columns, ev.old):
        for col in columns or ():
            v = col[3]
            if isinstance(v, (str, bytes, bytearray)):
                n = len(v)
            elif v is None:
                n = 0
            else:
                n = 8
            size += len(col[0]) + n + 16
    return size
