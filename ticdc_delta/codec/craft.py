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

import re
import struct
from itertools import accumulate
from typing import Any, Callable, Iterator, NamedTuple, Sequence, TypeVar

from ..errors import DecodeError, EncodeError, FramingError, TruncatedMessageError, UnsupportedVersionError
from .base import CompileGate, Message
from .model import (
    Column,
    ColumnFlag,
    DDLEvent,
    DecodeContext,
    Event,
    Image,
    ImageLayout,
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
_INSERT, _UPDATE, _DELETE = Op.INSERT, Op.UPDATE, Op.DELETE

_U64 = (1 << 64) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_MAX_DDL_TYPE = 255  # TiDB's ActionType is a byte

# zigzag decoding of a one-byte varint (values 0..127)
_ZZ: tuple[int, ...] = tuple((i >> 1) ^ -(i & 1) for i in range(128))
_zz = _ZZ.__getitem__

_FLOAT64 = struct.Struct("<d")
_unpack_float = _FLOAT64.unpack
_pack_float = _FLOAT64.pack

# Building a NamedTuple (RowChange) through tuple.__new__ skips the generated Python-level __new__ and
# halves its cost; the result is an ordinary RowChange.
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
        "only-output-updated-columns",
        "avro-decimal-handling-mode",
        "avro-bigint-unsigned-handling-mode",
        "avro-enable-watermark",
        "schema-registry",
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
    return TruncatedMessageError(PROTOCOL, f"{what}: needs more than the {end - pos} byte(s) left")


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
    m = _VARINT.match(data, pos, min(end, pos + 11))
    if m is None:
        raise _truncated(what, end, pos)
    return _UVARINT[m.group()], m.end()


# Masks to read a varint of up to 10 bytes with integer operations rather than a loop over its bytes.
_HIGH_BITS = [int.from_bytes(b"\x80" * n, "little") for n in range(11)]
_LOW_BITS = [int.from_bytes(b"\x7f" * n, "little") for n in range(11)]
_LANES = [
    # (mask of the low half of each lane, shift that packs the high half next to it)
    (int.from_bytes(b"\xff\x00" * 8, "little"), 1),
    (int.from_bytes(b"\xff\xff\x00\x00" * 4, "little"), 2),
    (int.from_bytes(b"\xff" * 4 + b"\x00" * 4 + b"\xff" * 4 + b"\x00" * 4, "little"), 4),
    ((1 << 64) - 1, 8),
]


def _parse_varint(raw: bytes) -> int:
    """The value of ``raw``, which must be exactly one uvarint.

    Raises:
        TruncatedMessageError: ``raw`` ends inside the varint.
        DecodeError: more than one varint, longer than 10 bytes, above 2**64-1.
    """
    n = len(raw)
    if n == 0 or raw[-1] >= 0x80:
        raise TruncatedMessageError(PROTOCOL, f"varint {raw[:12].hex()} is cut off")
    if n > 10:
        raise _bad(f"varint of {n} bytes; at most 10")
    x = int.from_bytes(raw, "little")
    if x & _HIGH_BITS[n] != _HIGH_BITS[n - 1]:  # continuation bit on every byte but the last
        raise _bad(f"{n} value bytes hold more than one varint")
    if n == 10 and raw[9] > 1:
        raise _bad("varint overflows 64 bits")
    # drop the continuation bits, then pack the 7-bit groups: pairs, quads, octets, the last two octets
    x &= _LOW_BITS[n]
    for mask, shift in _LANES:
        x = (x & mask) | ((x & ~mask) >> shift)
    return x


_VARINT_MEMO_LIMIT = 1 << 15


class _VarintValues(dict):  # type: ignore[type-arg]
    """Maps the bytes of one varint to its value (zigzag-decoded when ``signed``).

    ``table[raw]`` is a C-level dict hit for the one-byte varints (all pre-filled) and for the 2- and
    3-byte varints seen before (memoized up to a bound); ``__missing__`` parses and validates the rest, so
    a lookup also rejects bytes that are not exactly one varint.
    """

    __slots__ = ("_signed",)

    def __init__(self, signed: bool) -> None:
        super().__init__()
        self._signed = signed
        for b in range(0x80):
            self[bytes((b,))] = _ZZ[b] if signed else b

    def __missing__(self, raw: bytes) -> int:
        value = _parse_varint(raw)
        if self._signed:
            value = (value >> 1) ^ -(value & 1)
        if len(raw) <= 3 and len(self) < _VARINT_MEMO_LIMIT:
            self[raw] = value
        return value


_UVARINT = _VarintValues(signed=False)
_SVARINT = _VarintValues(signed=True)
_VARINT = re.compile(rb"[\x80-\xff]*[\x00-\x7f]")
"""One varint: its continuation bytes (high bit set), then its last byte."""


def _varint_parts(data: bytes, start: int, end: int, what: str) -> list[bytes]:
    """``data[start:end]``, which must hold nothing but varints, split into one bytes object per varint.

    Raises:
        TruncatedMessageError: the region ends inside a varint.
    """
    if start < end and data[end - 1] >= 0x80:
        raise TruncatedMessageError(PROTOCOL, f"{what}: the last varint is cut off")
    return _VARINT.findall(data, start, end)


def _read_varints(
    data: bytes, pos: int, end: int, count: int, table: _VarintValues, what: str
) -> tuple[list[int], int]:
    """``count`` consecutive varints from ``pos`` (not reaching ``end``): (values, next position).

    Raises:
        TruncatedMessageError: fewer than ``count`` varints before ``end``.
        DecodeError: a varint longer than 10 bytes or above 2**64-1.
    """
    stop = pos + count
    if stop > end:
        raise _truncated(f"{what} ({count} varints)", end, pos)
    run = data[pos:stop]
    if run.isascii():  # fast path: every byte is a whole varint
        return (list(run) if table is _UVARINT else list(map(_zz, run))), stop
    # a varint takes at most 10 bytes: scan no further than that, whatever follows the run
    parts = _VARINT.findall(data, pos, min(end, pos + 10 * count))
    if len(parts) < count:
        raise _truncated(f"{what} ({count} varints)", end, pos)
    del parts[count:]
    return list(map(table.__getitem__, parts)), pos + sum(map(len, parts))


def _dec_float(raw: bytes) -> float:
    if len(raw) != 8:
        raise _bad(f"float64 value must be 8 bytes, found {len(raw)}")
    return _unpack_float(raw)[0]  # type: ignore[no-any-return]


def _dec_null(raw: bytes) -> None:
    raise _bad(f"a NULL/GEOMETRY column carries {len(raw)} value bytes; TiCDC writes none")


_dec_int: Callable[[bytes], int] = _SVARINT.__getitem__
_dec_uint: Callable[[bytes], int] = _UVARINT.__getitem__
_dec_str: Callable[[bytes], str] = bytes.decode  # strict UTF-8
_dec_bytes: Callable[[bytes], bytes] = bytes  # a slice already is a fresh bytes object

_SIGNED_OR_UNSIGNED = frozenset({1, 2, 3, 8, 9})  # TINYINT SMALLINT INT BIGINT MEDIUMINT
_UNSIGNED_NUMBERS = frozenset({16, 247, 248})  # BIT ENUM SET: uvarint
# TIMESTAMP DATE TIME DATETIME NEWDATE JSON DECIMAL, and VECTOR (225, TiDB 8.4+: its text form "[1,2,3]")
_TEXT_TYPES = frozenset({7, 10, 11, 12, 14, 225, 245, 246})
_BYTES_TYPES = frozenset({15, 249, 250, 251, 252, 253, 254})  # VARCHAR, *BLOB/*TEXT, VAR_STRING, STRING
_FLOAT_TYPES = frozenset({4, 5})
_KNOWN_TYPES = frozenset(int(t) for t in TypeCode)  # the rest of them (NULL, GEOMETRY) carry no value
_EVENT_TYPES = frozenset({_ROW, _DDL, _RESOLVED})

_UNSIGNED = int(ColumnFlag.UNSIGNED)
_BINARY = int(ColumnFlag.BINARY)


def _value_decoder(tp: int, flags: int) -> Callable[[bytes], Any]:
    """How to turn a value's bytes into its Python value (TiCDC ``DecodeTiDBType``)."""
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


# Lengths of the nullable bytes chunk, as one-byte zigzag varints: the bytes a valid length can take
# (0, 2, 4, ... for 0..63 bytes; 1 for NULL). ``run.translate(None, _LENGTH_BYTES)`` leaves the others.
_LENGTH_BYTES = bytes(range(0, 0x80, 2)) + b"\x01"

# A column group's values are decoded by a function made for the group's shape (its types and flags):
# ``decode_values(data, pos, end, layout) -> Image`` reads the value lengths from ``pos``, then the values,
# which must end exactly at ``end``; the image is the group's layout (names, types, flags) and the values.
_ValuesDecoder = Callable[[bytes, int, int, ImageLayout], Image]

# A column group's metadata parsed from its leading bytes: (name term ids, values decoder, types, flags)
_GroupMeta = tuple[tuple[int, ...], _ValuesDecoder, tuple[int, ...], tuple[ColumnFlag, ...]]


class _GroupShape(NamedTuple):
    """A column group's shape, resolved against one term dictionary."""

    lead: bytes  # the group's leading bytes: type, column count, names, types, flags
    lead_size: int
    group_type: int  # 1 new, 2 old
    names: tuple[str, ...]
    decode_values: _ValuesDecoder
    types: tuple[int, ...]
    flags: tuple[ColumnFlag, ...]
    layout: ImageLayout  # names, types and flags, shared by every image of this shape


_ONE_GROUP: list[int] = []  # marks a row event whose one column group fills its body
_CACHE_LIMIT = 4096  # entries per decoder cache; a cache that fills up is cleared
_MEMO_MAX_BYTES = 4096  # longer keys (dictionaries, headers, group metadata) are parsed every time
_META_LENGTHS_LIMIT = 16
_SHAPES_PER_DICTIONARY = 64  # group shapes tried by their bytes before parsing a group's metadata
_GENERATED_MAX_COLUMNS = 256


def _read_lengths(data: bytes, pos: int, end: int, count: int) -> tuple[list[int], int]:
    """The ``count`` value lengths of a nullable bytes chunk (zigzag varints, -1 = NULL).

    Raises:
        TruncatedMessageError: fewer than ``count`` varints before ``end``.
        DecodeError: a length below -1.
    """
    lengths, pos = _read_varints(data, pos, end, count, _SVARINT, "value lengths")
    if min(lengths) < -1:
        raise _bad(f"value length {min(lengths)} (-1 is NULL)")
    return lengths, pos


def _values_end_error(pos: int, end: int) -> FramingError:
    return _framing(f"column values end at byte {pos} but the column group ends at byte {end}")


def _generic_values_decoder(types: tuple[int, ...], flags: tuple[ColumnFlag, ...]) -> _ValuesDecoder:
    """A values decoder for any shape: one loop over the columns."""
    decoders = tuple(_value_decoder(tp, fl) for tp, fl in zip(types, flags))
    ncols = len(types)

    def decode_values(data: bytes, pos: int, end: int, layout: ImageLayout) -> Image:
        lengths, pos = _read_lengths(data, pos, end, ncols)
        values = tuple(
            [
                # the walrus advances ``pos`` over each value's bytes (NULL has none)
                None if n < 0 else dec(data[pos : (pos := pos + n)])
                for dec, n in zip(decoders, lengths)
            ]
        )
        if pos != end:
            raise _values_end_error(pos, end)
        return Image(layout, values)

    return decode_values


_STRUCTS_PER_DECODER = 256  # value-length patterns with a compiled struct, per values decoder
_SEEN_PER_DECODER = 4096  # value-length patterns seen once, per values decoder
_STRUCT_FIELD = ["%ds" % (z >> 1) for z in range(0x80)]  # by zigzag length byte: "<n>s"


class _LengthPatterns:
    """The value-length patterns of one values decoder that have a compiled :class:`struct.Struct`.

    A column group's lengths come first (one byte each for values under 64 bytes), so their bytes say
    where every value is: for a pattern met more than once, one ``Struct.unpack_from`` cuts all the
    values out at once (half the cost of slicing them one by one). Only patterns that decoded without
    error get one; FLOAT/DOUBLE values (8 bytes in such a pattern) come out as floats. Patterns with a
    NULL (zigzag length byte 1, a ``0s`` field) are kept apart in ``null_structs``: their values are
    checked against the length bytes.
    """

    __slots__ = ("structs", "null_structs", "_seen", "_floats")

    def __init__(self, types: tuple[int, ...]) -> None:
        self.structs: dict[bytes, struct.Struct] = {}
        self.null_structs: dict[bytes, struct.Struct] = {}
        self._seen: set[bytes] = set()
        self._floats = [tp in _FLOAT_TYPES for tp in types]

    def learn(self, run: bytes) -> None:
        """Note a pattern of one-byte lengths whose values just decoded; compile it the second time."""
        if run not in self._seen:
            if len(self._seen) >= _SEEN_PER_DECODER:
                self._seen.clear()
            self._seen.add(run)
            return
        fields = ["d" if is_float and z != 1 else _STRUCT_FIELD[z] for z, is_float in zip(run, self._floats)]
        compiled = struct.Struct("<" + "".join(fields))
        _remember_bounded(self.null_structs if 1 in run else self.structs, run, compiled, _STRUCTS_PER_DECODER)


def _generated_values_decoder(types: tuple[int, ...], flags: tuple[ColumnFlag, ...]) -> _ValuesDecoder:
    """A values decoder written for one shape: straight-line code, one statement per column.

    A loop over the columns spends about a third of its time iterating, unpacking and dispatching; this
    function does none of that. Only integers (column count, indexes) go into the source; helpers are
    bound as globals of the generated function. It builds no Column: the values go into an :class:`Image`
    of the group's layout. Value-length patterns seen before are cut with one struct call
    (:class:`_LengthPatterns`); the others value by value.
    """
    ncols = len(types)
    patterns = _LengthPatterns(types)
    env: dict[str, Any] = {
        "Image": Image,
        "S": _SVARINT,
        "U": _UVARINT,
        "ZZ": _zz,
        "LENGTH_BYTES": _LENGTH_BYTES,
        "read_lengths": _read_lengths,
        "end_error": _values_end_error,
        "dec_float": _dec_float,
        "dec_null": _dec_null,
        "STRUCTS": patterns.structs,
        "NULL_STRUCTS": patterns.null_structs,
        "learn": patterns.learn,
    }
    lengths = ", ".join(f"n{i}" for i in range(ncols)) + ","
    raws = ", ".join(f"r{i}" for i in range(ncols)) + ","
    zigzags = ", ".join(f"z{i}" for i in range(ncols)) + ","
    quick: list[str] = []  # each value from its bytes r<i> (struct path; a float is already a float)
    slow: list[str] = []  # each value sliced from data (n<i> bytes at p)
    for i, (tp, fl) in enumerate(zip(types, flags)):
        dec = _value_decoder(tp, int(fl))
        raw = f"data[p : (p := p + n{i})]"  # the value's bytes; ``p`` moves past them
        if dec is _dec_str:
            expr, fast = f"{raw}.decode()", f"r{i}.decode()"
        elif dec is _dec_bytes:
            expr, fast = raw, f"r{i}"
        elif dec is _dec_int:
            expr, fast = f"S[{raw}]", f"S[r{i}]"
        elif dec is _dec_uint:
            expr, fast = f"U[{raw}]", f"U[r{i}]"
        elif dec is _dec_float:
            # (the bytes there, not n: a value before it that claims more bytes than the group holds
            # leaves fewer than n)
            expr, fast = f"dec_float({raw})", f"r{i}"
        else:
            expr, fast = f"dec_null({raw})", f"dec_null(r{i})"
        quick.append(fast)
        slow.append(f"    v{i} = None if n{i} < 0 else {expr}")
    lines = [
        "def decode_values(data, p, end, layout):",
        f"    q = p + {ncols}",
        "    run = data[p:q]",
        "    st = STRUCTS.get(run)",
        "    if st is not None and q + st.size == end:",
        f"        {raws} = st.unpack_from(data, q)",
        "        return Image(layout, (" + ", ".join(quick) + ",))",
        "    st = NULL_STRUCTS.get(run)",
        "    if st is not None and q + st.size == end:",
        f"        {raws} = st.unpack_from(data, q)",
        f"        {zigzags} = run",  # length byte 1 (zigzag -1) is NULL
        "        return Image(layout, ("
        + ", ".join(f"None if z{i} == 1 else {e}" for i, e in enumerate(quick))
        + ",))",
        # every length one byte (values under 64 bytes), each a valid one (zigzag: even, or 1 for NULL)
        "    if q <= end and run.isascii() and not run.translate(None, LENGTH_BYTES):",
        f"        {lengths} = map(ZZ, run)",
        "    else:",
        f"        ({lengths}), q = read_lengths(data, p, end, {ncols})",
        "        run = None",
        "    p = q",
        *slow,
        "    if p != end:",
        "        raise end_error(p, end)",
        "    if run is not None:",
        "        learn(run)",
        "    return Image(layout, (" + " ".join(f"v{i}," for i in range(ncols)) + "))",
    ]
    exec("\n".join(lines), env)  # noqa: S102 - source built from integers only, see above
    return env["decode_values"]  # type: ignore[no-any-return]


class CraftDecoder:
    """Decodes TiCDC Craft messages into events.

    Options are TiCDC sink-uri parameters; none changes decoding, so known ones are accepted and ignored.

    What repeats from message to message is parsed once and then recognized by its bytes: the term
    dictionary, the header past the commit timestamps, and each column group's leading bytes (type,
    column count, names, types, flags), for which a values decoder is written. Not thread-safe (one
    decoder per thread).
    """

    protocol = PROTOCOL

    def __init__(self, options: dict[str, str] | None = None) -> None:
        """Raises:
        ValueError: an option TiCDC does not have.
        """
        self._options = _check_options(options)
        # term dictionary bytes -> (terms, shapes of column groups met with this dictionary)
        self._dictionaries: dict[bytes, tuple[tuple[str, ...], list[_GroupShape]]] = {}
        # (header bytes past the commit ts chunk, dictionary bytes, event count) -> (types, schemas, tables)
        self._headers: dict[tuple[bytes, bytes, int], tuple[list[int], list[str], list[str]]] = {}
        # leading bytes of a column group -> (name term ids, values decoder, types, flags)
        self._metas: dict[bytes, _GroupMeta] = {}
        self._meta_lengths: dict[int, list[int]] = {}  # column count -> lengths of known leading bytes
        self._values_decoders: dict[tuple[tuple[int, ...], tuple[ColumnFlag, ...]], _ValuesDecoder] = {}
        self._compile_gate = CompileGate()  # a values decoder is written for a shape met often enough
        # (names, types, flags) -> the layout every image of those columns shares, across dictionaries
        self._layouts: dict[tuple[tuple[str, ...], tuple[int, ...], tuple[ColumnFlag, ...]], ImageLayout] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        # the caches hold generated functions, which do not pickle; a copy starts with empty caches
        return (type(self), (self._options,))

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

    def _decode(self, data: bytes, ctx: DecodeContext) -> list[Event]:
        size = len(data)
        if size == 0:
            raise _framing("empty message")
        # framing first: version, then the size tables at the end, then whether the sizes add up
        version, body_start = _uvarint(data, 0, size, "version")
        if version != VERSION:
            raise UnsupportedVersionError(PROTOCOL, f"version {version}, expected {VERSION}")
        tables_start, tables_end = _size_tables_bounds(data, body_start)
        # a batch of inserts/deletes has one column group per event, filling its body: read its size tables
        # in one pass (``group_sizes``), else table by table
        quick = _row_batch_size_tables(data, tables_start, tables_end)
        if quick is not None:
            meta, event_sizes, group_sizes = quick
            tables = [meta, event_sizes]
        else:
            tables = _size_tables(data, tables_start, tables_end)
            group_sizes = None
        if len(tables) < 2:
            raise _framing(f"expected the meta and events size tables, found {len(tables)} table(s)")
        meta, event_sizes = tables[0], tables[1]
        if len(meta) != 2:
            raise _framing(f"meta size table must hold 2 sizes (header, dictionary), holds {len(meta)}")
        header_size, dict_size = meta
        count = len(event_sizes)
        if count == 0:
            raise _framing("message holds no events")
        if min(header_size, dict_size, min(event_sizes)) < 0:
            raise _framing("negative size in the size tables")
        bodies_size = sum(event_sizes)
        if body_start + header_size + bodies_size + dict_size != tables_start:
            raise _framing(
                f"header {header_size} + bodies {bodies_size} + dictionary {dict_size} bytes after the "
                f"version end at byte {body_start + header_size + bodies_size + dict_size}, but the size "
                f"tables start at byte {tables_start}"
            )

        header_end = body_start + header_size
        dict_start = header_end + bodies_size
        dict_bytes = data[dict_start:tables_start]
        known = self._dictionaries.get(dict_bytes)
        if known is None:
            known = (_term_dictionary(dict_bytes) if dict_size else (), [])
            if dict_size <= _MEMO_MAX_BYTES:
                _remember(self._dictionaries, dict_bytes, known)
        terms, shapes = known
        ts_list, types, schemas, table_names = self._header(
            data, body_start, header_end, count, terms, dict_bytes
        )
        rows = types.count(_ROW)
        group_tables: Iterator[list[int]] | None = None
        if group_sizes is None or rows != count or group_sizes != event_sizes:
            if group_sizes is not None:  # not what it looked like: read the tables one by one
                tables = _size_tables(data, tables_start, tables_end)
            if len(tables) != 2 + rows:
                raise _framing(
                    f"{rows} row event(s) need {rows} column-group size table(s), found {len(tables) - 2}"
                )
            group_tables = iter(tables[2:])
        # else: every event is a row whose one column group fills its body (group_tables stays None)

        events: list[Event] = []
        append = events.append
        group = self._group
        pos = header_end
        for tp, ev_size, ts, schema, table in zip(types, event_sizes, ts_list, schemas, table_names):
            end = pos + ev_size
            if tp == _ROW:
                sizes = _ONE_GROUP if group_tables is None else next(group_tables)
                if sizes is _ONE_GROUP or (len(sizes) == 1 and sizes[0] == ev_size):
                    # an insert or a delete; inline _group: this is the hot path
                    for shape in shapes:
                        if data.startswith(shape.lead, pos):
                            break
                    else:
                        shape = self._shape(data, pos, end, terms, shapes)
                    try:
                        columns = shape.decode_values(data, pos + shape.lead_size, end, shape.layout)
                    except (UnicodeDecodeError, DecodeError) as err:
                        raise _value_error(data, pos + shape.lead_size, end, shape, err) from None
                    gtype = shape.group_type
                    if gtype == _GROUP_NEW:
                        append(_new_tuple(RowChange, (ts, schema, table, _INSERT, columns, None, ctx)))
                    elif gtype == _GROUP_OLD:  # TiCDC writes a deleted row as its old image
                        append(_new_tuple(RowChange, (ts, schema, table, _DELETE, None, columns, ctx)))
                    else:
                        raise _bad(f"unexpected column group type {gtype} (1 new, 2 old)")
                else:  # an update: new and old image
                    if len(sizes) != 2 or min(sizes) < 0 or sum(sizes) != ev_size:
                        raise _framing(f"column groups of sizes {sizes} in a row body of {ev_size} bytes")
                    mid = pos + sizes[0]
                    first_type, first = group(data, pos, mid, terms, shapes)
                    second_type, second = group(data, mid, end, terms, shapes)
                    if first_type == _GROUP_NEW and second_type == _GROUP_OLD:
                        append(_new_tuple(RowChange, (ts, schema, table, _UPDATE, first, second, ctx)))
                    elif first_type == _GROUP_OLD and second_type == _GROUP_NEW:
                        append(_new_tuple(RowChange, (ts, schema, table, _UPDATE, second, first, ctx)))
                    else:
                        raise _bad(
                            f"unexpected column group types {first_type}, {second_type} (1 new and 2 old)"
                        )
            elif tp == _DDL:
                ddl_type, query = _ddl_body(data, pos, end)
                append(DDLEvent(ts, schema, table, query, ddl_type, ctx))
            else:  # _RESOLVED: the header allows no other type
                if ev_size:
                    raise _framing(
                        f"resolved event {len(events)} has a {ev_size}-byte body; it must be empty"
                    )
                append(ResolvedEvent(ts, ctx))
            pos = end
        return events

    def _group(
        self, data: bytes, pos: int, end: int, terms: tuple[str, ...], shapes: list[_GroupShape]
    ) -> tuple[int, Image]:
        """The type (1 new, 2 old) and the columns of the column group ``data[pos:end]``.

        Raises:
            DecodeError: the group is invalid (a subclass says how).
        """
        # a group's leading bytes are usually those of a group met before with this dictionary
        for shape in shapes:
            if data.startswith(shape.lead, pos):
                break
        else:
            shape = self._shape(data, pos, end, terms, shapes)
        try:
            return shape.group_type, shape.decode_values(data, pos + shape.lead_size, end, shape.layout)
        except (UnicodeDecodeError, DecodeError) as err:
            raise _value_error(data, pos + shape.lead_size, end, shape, err) from None

    def _header(
        self, data: bytes, pos: int, end: int, count: int, terms: tuple[str, ...], dict_bytes: bytes
    ) -> tuple[list[int], list[int], list[str], list[str]]:
        """The columnar header: commit ts, event type, partition, schema and table of ``count`` events.

        Raises:
            FramingError: the header holds more or fewer than 5 * count varints.
            DecodeError: an unknown event type, a bad partition id or term id.
        """
        # The commit ts chunk comes first: its first varint is long, the deltas are usually one byte
        # each. What follows (types, partitions, schemas, tables) usually repeats from message to message.
        first = _VARINT.match(data, pos, end)
        if first is not None:
            deltas_end = first.end() + count - 1
            deltas = data[first.end() : deltas_end]
            if deltas_end <= end and deltas.isascii():
                rest_key = (data[deltas_end:end], dict_bytes, count)
                rest = self._headers.get(rest_key)
                if rest is None:
                    rest = _header_rest(rest_key[0], count, terms)
                    if end - deltas_end + len(dict_bytes) <= _MEMO_MAX_BYTES:
                        _remember(self._headers, rest_key, rest)
                ts_list = list(accumulate(deltas, initial=_UVARINT[first.group()]))
                if ts_list[-1] > _U64:  # Go's uint64 arithmetic wraps
                    ts_list = [ts & _U64 for ts in ts_list]
                return ts_list, *rest
        return _general_header(data, pos, end, count, terms)

    def _shape(
        self, data: bytes, pos: int, end: int, terms: tuple[str, ...], shapes: list[_GroupShape]
    ) -> _GroupShape:
        """Parse a column group's leading bytes: type, column count, names, types and flags.

        Raises:
            TruncatedMessageError: they run past the group.
            DecodeError: no columns, an unknown type code, a name term id outside the dictionary.
        """
        if pos >= end:
            raise _truncated("column group type", end, pos)
        gtype = data[pos]
        ncols, p = _uvarint(data, pos + 1, end, "column count")
        if ncols == 0:
            raise _bad("column group with no columns")
        # each column takes at least 4 bytes (name id, type, flag, value length): bound before allocating
        if 4 * ncols > end - p:
            raise _truncated(f"column group of {ncols} columns", end, p)
        meta = None
        provisional = False
        for length in self._meta_lengths.get(ncols, ()):
            stop = pos + length
            if stop <= end:
                meta = self._metas.get(data[pos:stop])
                if meta is not None:
                    break
        if meta is None:
            raw, stop = _read_varints(data, p, end, 3 * ncols, _UVARINT, "column names, types and flags")
            ids = tuple(accumulate(_ZZ[u] if u < 0x80 else (u >> 1) ^ -(u & 1) for u in raw[:ncols]))
            types = tuple(raw[ncols : 2 * ncols])
            if not _KNOWN_TYPES.issuperset(types):
                raise _bad(f"unknown column type code {min(set(types) - _KNOWN_TYPES)}")
            flags = tuple(column_flag(fl) for fl in raw[2 * ncols :])
            decode_values = self._values_decoders.get((types, flags))
            if decode_values is None:
                if ncols <= _GENERATED_MAX_COLUMNS and self._compile_gate.due((types, flags)):
                    decode_values = _generated_values_decoder(types, flags)
                else:
                    decode_values = _generic_values_decoder(types, flags)
                    # (a shape met too seldom yet to write code for: nothing of it is kept, so it is parsed
                    # again until it is)
                    provisional = ncols <= _GENERATED_MAX_COLUMNS
                if not provisional:
                    _remember(self._values_decoders, (types, flags), decode_values)
            meta = (ids, decode_values, types, flags)
            if not provisional and stop - pos <= _MEMO_MAX_BYTES:
                if len(self._metas) >= _CACHE_LIMIT:
                    self._metas.clear()
                    self._meta_lengths.clear()
                self._metas[data[pos:stop]] = meta
                lengths = self._meta_lengths.setdefault(ncols, [])
                if len(lengths) < _META_LENGTHS_LIMIT and stop - pos not in lengths:
                    lengths.append(stop - pos)
        ids, decode_values, types, flags = meta
        if min(ids) < 0 or max(ids) >= len(terms):
            raise _bad(
                f"column name term ids {min(ids)}..{max(ids)} outside the dictionary of {len(terms)} terms"
            )
        names = tuple(map(terms.__getitem__, ids))
        layout = self._layouts.get((names, types, flags))
        if layout is None:
            if len(set(names)) < len(names):  # (one check per shape: the layout is kept)
                twice = sorted({n for n in names if names.count(n) > 1})
                raise _bad(f"column {twice[0]!r} named twice in one column group")
            layout = _remember(self._layouts, (names, types, flags), ImageLayout(names, types, flags))
        shape = _GroupShape(data[pos:stop], stop - pos, gtype, names, decode_values, types, flags, layout)
        if len(shapes) < _SHAPES_PER_DICTIONARY and not provisional:
            shapes.append(shape)
        return shape


_K = TypeVar("_K")
_V = TypeVar("_V")


def _remember(cache: dict[_K, _V], key: _K, value: _V) -> _V:
    """Store ``value`` under ``key`` in a bounded cache (cleared when full) and return it."""
    return _remember_bounded(cache, key, value, _CACHE_LIMIT)


def _remember_bounded(cache: dict[_K, _V], key: _K, value: _V, limit: int) -> _V:
    """Store ``value`` under ``key`` in a cache of at most ``limit`` entries (cleared when full)."""
    if len(cache) >= limit:
        cache.clear()
    cache[key] = value
    return value


def _value_error(data: bytes, pos: int, end: int, shape: _GroupShape, err: Exception) -> DecodeError:
    """The error for the first value of a column group that does not decode, named by its column;
    ``err`` itself when no value is at fault (lengths that do not fill the group)."""
    lengths, pos = _read_lengths(data, pos, end, len(shape.names))
    for name, tp, fl, n in zip(shape.names, shape.types, shape.flags, lengths):
        if n < 0:
            continue
        try:
            _value_decoder(tp, int(fl))(data[pos : pos + n])
        except UnicodeDecodeError as value_err:
            return _bad(f"value of column {name!r} is not UTF-8: {value_err.reason}")
        except DecodeError as value_err:
            return type(value_err)(PROTOCOL, f"column {name!r}: {value_err.reason}")
        pos += n
    return err if isinstance(err, DecodeError) else _bad(str(err))


def _size_tables_bounds(data: bytes, floor: int) -> tuple[int, int]:
    """Where the size tables start and end: their size closes the message as a uvarint whose bytes are
    written in reverse order (TiCDC ``encodeUvarintReversed``), so it is read backwards from the end.

    Raises:
        TruncatedMessageError: the varint, or the tables it announces, run before ``floor``.
        DecodeError: the varint is longer than 10 bytes or overflows.
    """
    last = len(data) - 1
    value = data[last]
    tables_end = last
    if value >= 0x80:
        tail = data[max(floor, last - 10) : last + 1][::-1]
        m = _VARINT.match(tail)
        if m is None:
            raise TruncatedMessageError(PROTOCOL, "size of the size tables is cut off")
        value = _UVARINT[m.group()]
        tables_end = last + 1 - m.end()
    if value > tables_end - floor:
        raise TruncatedMessageError(
            PROTOCOL, f"size tables of {value} bytes announced, only {max(tables_end - floor, 0)} before them"
        )
    return tables_end - value, tables_end


def _row_batch_size_tables(data: bytes, start: int, end: int) -> tuple[list[int], list[int], list[int]] | None:
    """The size tables of a typical batch of inserts and deletes, read in one pass: (meta, event sizes,
    the one column-group size of each event), or None when they are not laid out that way (two sizes in
    the meta table, N event sizes, then N tables of one size each, every count a one-byte varint).

    The caller still checks that every event is a row and that each group size is its event's size;
    :func:`_size_tables` reads (and validates) every other layout.
    """
    parts = _VARINT.findall(data, start, end)
    if len(parts) < 4 or parts[0] != b"\x02" or data[end - 1] >= 0x80:
        return None
    count = _UVARINT[parts[3]]
    singles = parts[4 + count :]
    if len(singles) != 2 * count or singles[0::2].count(b"\x01") != count:
        return None
    delta_of = _SVARINT.__getitem__
    return (
        list(accumulate(map(delta_of, parts[1:3]))),
        list(accumulate(map(delta_of, parts[4 : 4 + count]))),
        list(map(delta_of, singles[1::2])),  # a table of one size holds the size itself
    )


def _size_tables(data: bytes, start: int, end: int) -> list[list[int]]:
    """All size tables of ``data[start:end]``: each a uvarint count and a delta varint chunk of sizes.

    Raises:
        TruncatedMessageError: a table lists more sizes than its bytes hold, or a varint is cut off.
    """
    parts = _varint_parts(data, start, end, "size tables")
    count_of = _UVARINT.__getitem__
    delta_of = _SVARINT.__getitem__
    tables: list[list[int]] = []
    append = tables.append
    i = 0
    n = len(parts)
    while i < n:
        count = count_of(parts[i])
        i += 1
        j = i + count
        if j > n:
            raise TruncatedMessageError(PROTOCOL, f"size table of {count} sizes, only {n - i} varints left")
        if count == 1:  # the column groups of an insert or a delete
            append([delta_of(parts[i])])
        else:
            append(list(accumulate(map(delta_of, parts[i:j]))))
        i = j
    return tables


def _term_dictionary(region: bytes) -> tuple[str, ...]:
    """The term dictionary: uvarint count, uvarint lengths, then the terms' bytes.

    Raises:
        TruncatedMessageError / FramingError: counts or lengths that do not fill its region exactly.
        DecodeError: a term is not UTF-8.
    """
    end = len(region)
    count, pos = _uvarint(region, 0, end, "term count")
    lengths, pos = _read_varints(region, pos, end, count, _UVARINT, "term lengths")
    if sum(lengths) != end - pos:
        raise _framing(f"terms of {sum(lengths)} bytes in a {end - pos}-byte remainder of the dictionary")
    terms = []
    for n in lengths:
        stop = pos + n
        try:
            terms.append(region[pos:stop].decode())
        except UnicodeDecodeError:
            raise _bad(f"term {len(terms)} is not UTF-8") from None
        pos = stop
    return tuple(terms)


def _general_header(
    data: bytes, pos: int, end: int, count: int, terms: tuple[str, ...]
) -> tuple[list[int], list[int], list[str], list[str]]:
    """The columnar header of ``count`` events, read varint by varint.

    Raises:
        FramingError: the header holds more or fewer than 5 * count varints.
        DecodeError: an unknown event type, a bad partition id or term id.
    """
    parts = _varint_parts(data, pos, end, "header")
    if len(parts) != 5 * count:
        raise _framing(f"header of {count} events must hold {5 * count} varints, holds {len(parts)}")
    ts_list = list(accumulate(map(_UVARINT.__getitem__, parts[:count])))  # delta uvarint chunk
    if ts_list[-1] > _U64:  # Go's uint64 arithmetic wraps
        ts_list = [ts & _U64 for ts in ts_list]
    return ts_list, *_header_columns(parts[count:], count, terms)


def _header_rest(region: bytes, count: int, terms: tuple[str, ...]) -> tuple[list[int], list[str], list[str]]:
    """The header past the commit ts chunk: ``count`` event types, partitions, schemas and tables.

    Raises:
        FramingError: the region holds more or fewer than 4 * count varints.
        DecodeError: an unknown event type, a bad partition id or term id.
    """
    parts = _varint_parts(region, 0, len(region), "header")
    if len(parts) != 4 * count:
        raise _framing(f"header of {count} events must hold {5 * count} varints, holds {len(parts) + count}")
    return _header_columns(parts, count, terms)


def _header_columns(
    parts: list[bytes], count: int, terms: tuple[str, ...]
) -> tuple[list[int], list[str], list[str]]:
    """Event types (uvarint chunk), partitions, schema and table term ids (delta varint chunks)."""
    types = list(map(_UVARINT.__getitem__, parts[:count]))
    if not _EVENT_TYPES.issuperset(types):
        raise _bad(f"unknown event type {min(set(types) - _EVENT_TYPES)} (1 row, 2 DDL, 3 resolved)")
    delta_of = _SVARINT.__getitem__
    partitions = list(accumulate(map(delta_of, parts[count : 2 * count])))
    if min(partitions) < _NULL_ID or max(partitions) > _I64_MAX:
        raise _bad(f"partition ids {min(partitions)}..{max(partitions)} (-1 or a physical table id)")
    named = (*terms, "")  # term id -1 (no name) picks the trailing ""
    names = []
    for what, chunk in (("schema", parts[2 * count : 3 * count]), ("table", parts[3 * count :])):
        ids = list(accumulate(map(delta_of, chunk)))
        if min(ids) < _NULL_ID or max(ids) >= len(terms):
            raise _bad(f"{what} term ids {min(ids)}..{max(ids)} outside the dictionary of {len(terms)} terms")
        names.append(list(map(named.__getitem__, ids)))
    return types, names[0], names[1]


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
    got = f"{type(value).__name__} {value!r:.60}"
    return EncodeError(f"{PROTOCOL}: column {column!r} needs {expected}, got {got}")


# One-byte varints of small values, by value (negative indexes count from the end, as zigzag wants).
_SMALL_UNSIGNED = [bytes((i,)) for i in range(128)]
_SMALL_SIGNED = [bytes((_zigzag_encode(i),)) for i in (*range(64), *range(-64, 0))]


def _as_int(v: Any) -> int | None:
    """``v`` as an int, or None when it is no integer (bool included: it would come back as 0 or 1)."""
    if type(v) is int:
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        return int(v)
    return None


def _value_encoder(tp: int, flags: int) -> Callable[[str, Any], bytes]:
    """Value bytes for a column of type ``tp`` with ``flags`` (TiCDC ``EncodeTiDBType``)."""

    def signed(name: str, v: Any) -> bytes:
        if type(v) is int and -64 <= v < 64:
            return _SMALL_SIGNED[v]
        i = _as_int(v)
        if i is None or not _I64_MIN <= i <= _I64_MAX:
            raise _enc_fail(name, "a signed 64-bit int", v)
        return _uvarint_bytes(_zigzag_encode(i))

    def unsigned(name: str, v: Any) -> bytes:
        if type(v) is int and 0 <= v < 128:
            return _SMALL_UNSIGNED[v]
        i = _as_int(v)
        if i is None or not 0 <= i <= _U64:
            raise _enc_fail(name, "an unsigned 64-bit int", v)
        return _uvarint_bytes(i)

    def float64(name: str, v: Any) -> bytes:
        if not isinstance(v, (float, int)) or isinstance(v, bool):
            raise _enc_fail(name, "a float", v)
        return _pack_float(v)

    def text(name: str, v: Any) -> bytes:
        if not isinstance(v, str):
            raise _enc_fail(name, "str", v)
        try:
            return v.encode()
        except UnicodeEncodeError:
            raise _enc_fail(name, "text that UTF-8 can encode", v) from None

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


# A row event ready to be laid out: its column groups as (group type, columns, value bytes or None for
# NULL), and TiCDC's estimate of its size.
_Group = tuple[int, Sequence[Column], list["bytes | None"]]


class _PreparedRow(NamedTuple):
    event: RowChange
    groups: list[_Group]
    estimated_size: int


class CraftEncoder:
    """Writes events as TiCDC's Craft batch encoder does.

    Row events are packed into one message until it holds ``max-batch-size`` events (default 16) or
    TiCDC's estimate of its size exceeds ``max-message-bytes`` (default 10 MiB); a DDL or resolved event
    flushes the pending rows and goes in a message of its own. Keys are ``None`` (TiCDC sends an empty
    key). Partition ids are written as -1: the event model does not know partitioned tables.
    """

    protocol = PROTOCOL

    def __init__(self, options: dict[str, str] | None = None) -> None:
        """Raises:
        ValueError: an option TiCDC does not have, or a bad max-batch-size / max-message-bytes.
        """
        opts = self._options = _check_options(options)
        self.max_batch_size = _positive_int_option(opts, "max-batch-size", _DEFAULT_MAX_BATCH_SIZE)
        self.max_message_bytes = _positive_int_option(opts, "max-message-bytes", _DEFAULT_MAX_MESSAGE_BYTES)
        self._value_encoders: dict[tuple[int, int], Callable[[str, Any], bytes]] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        # the value encoders are closures, which do not pickle; a copy builds its own
        return (type(self), (self._options,))

    def encode(self, events: Sequence[Event]) -> list[Message]:
        """Messages for ``events``, in order.

        Raises:
            EncodeError: an event Craft cannot carry (no commit ts, a row without columns, a value of the
                wrong Python type for its column, an unknown type code).
        """
        messages: list[Message] = []
        rows: list[_PreparedRow] = []
        estimated = 0
        for event in events:
            if isinstance(event, RowChange):
                row = self._prepare_row(event)
                rows.append(row)
                estimated += row.estimated_size
                # TiCDC flushes after appending the event that reaches either limit
                if len(rows) >= self.max_batch_size or estimated > self.max_message_bytes:
                    messages.append(Message(None, self._assemble(rows)))
                    rows = []
                    estimated = 0
            elif isinstance(event, (DDLEvent, ResolvedEvent)):
                if rows:
                    messages.append(Message(None, self._assemble(rows)))
                    rows = []
                    estimated = 0
                messages.append(Message(None, self._assemble([event])))
            else:
                raise EncodeError(f"{PROTOCOL}: cannot encode {type(event).__name__}")
        if rows:
            messages.append(Message(None, self._assemble(rows)))
        return messages

    def encode_message(self, events: Sequence[Event]) -> bytes:
        """One Craft message holding ``events`` (any mix of kinds), laid out as TiCDC lays it out.

        TiCDC itself only batches row events; the decoder reads mixed messages too.

        Raises:
            EncodeError: no events, or an event Craft cannot carry.
        """
        prepared: list[_PreparedRow | DDLEvent | ResolvedEvent] = []
        for ev in events:
            if isinstance(ev, RowChange):
                prepared.append(self._prepare_row(ev))
            elif isinstance(ev, (DDLEvent, ResolvedEvent)):
                prepared.append(ev)
            else:
                raise EncodeError(f"{PROTOCOL}: cannot encode {type(ev).__name__}")
        return self._assemble(prepared)

    def _prepare_row(self, ev: RowChange) -> _PreparedRow:
        """Encode a row's values now (TiCDC builds its column groups when a row is appended).

        Raises:
            EncodeError: a column Craft cannot carry, or no columns at all.
        """
        groups: list[_Group] = []
        size = 32 + _utf8_len(ev.schema) + _utf8_len(ev.table)  # TiCDC Headers.appendHeader
        for gtype, columns in ((_GROUP_NEW, ev.columns), (_GROUP_OLD, ev.old)):
            if not columns:  # TiCDC writes no group for a missing or empty image
                continue
            values: list[bytes | None] = []
            append = values.append
            for name, tp, fl, v in columns:
                enc = self._value_encoders.get((tp, fl))
                if enc is None:
                    enc = self._value_encoder(name, tp, fl)
                if not isinstance(name, str):
                    raise EncodeError(f"{PROTOCOL}: column name must be str, got {name!r}")
                if v is None:
                    append(None)
                    size += 16
                else:
                    raw = enc(name, v)
                    append(raw)
                    size += len(raw) + 16  # TiCDC newColumnGroup: name + value + 16
                size += len(name) if name.isascii() else _utf8_len(name)
            groups.append((gtype, columns, values))
        if not groups:
            raise EncodeError(f"{PROTOCOL}: row event of {ev.schema}.{ev.table} has no columns")
        return _PreparedRow(ev, groups, size)

    def _value_encoder(self, name: Any, tp: Any, fl: Any) -> Callable[[str, Any], bytes]:
        """The (cached) value encoder for a column's type and flags.

        Raises:
            EncodeError: an unknown type code or bad flags.
        """
        if not isinstance(tp, int) or tp not in _KNOWN_TYPES:
            raise EncodeError(f"{PROTOCOL}: column {name!r} has unknown type code {tp!r}")
        if not isinstance(fl, int) or not 0 <= fl <= _U64:
            raise EncodeError(f"{PROTOCOL}: column {name!r} has bad flags {fl!r}")
        enc = self._value_encoders[(tp, fl)] = _value_encoder(int(tp), int(fl))
        return enc

    def _assemble(self, items: Sequence[_PreparedRow | DDLEvent | ResolvedEvent]) -> bytes:
        """The message for prepared rows, DDL and resolved events.

        Terms get ids in TiCDC's order: every event's schema, then every event's table, then column
        names as the bodies use them.

        Raises:
            EncodeError: no events, a bad commit ts, DDL type or query.
        """
        if not items:
            raise EncodeError(f"{PROTOCOL}: a message needs at least one event")
        events = [item.event if isinstance(item, _PreparedRow) else item for item in items]
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
        try:
            named = [(e.schema, e.table) if not isinstance(e, ResolvedEvent) else ("", "") for e in events]
            schema_ids = [terms.nullable_id(schema) for schema, _ in named]
            table_ids = [terms.nullable_id(table) for _, table in named]

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
            for item in items:
                start = len(out)
                if isinstance(item, _PreparedRow):
                    sizes = []
                    for gtype, columns, values in item.groups:
                        group_start = len(out)
                        _put_group(out, gtype, columns, values, terms)
                        sizes.append(len(out) - group_start)
                    group_tables.append(sizes)
                elif isinstance(item, DDLEvent):
                    _put_ddl(out, item)
                event_sizes.append(len(out) - start)

            dict_start = len(out)
            if terms.terms:  # TiCDC writes no dictionary at all when it is empty
                _put_uvarint(out, len(terms.terms))
                encoded = [t.encode() for t in terms.terms]
                for t in encoded:
                    _put_uvarint(out, len(t))
                for t in encoded:
                    out += t
        except UnicodeEncodeError as err:
            reason = err.reason
            raise EncodeError(f"{PROTOCOL}: a name or query that UTF-8 cannot encode ({reason})") from None
        dict_size = len(out) - dict_start

        tables_start = len(out)
        for table in ([header_size, dict_size], event_sizes, *group_tables):
            _put_uvarint(out, len(table))
            _put_delta_varints(out, table)
        # the size of the size tables, as a uvarint with its bytes in reverse order
        out += _uvarint_bytes(len(out) - tables_start)[::-1]
        return bytes(out)


def _put_group(
    out: bytearray, gtype: int, columns: Sequence[Column], values: list[bytes | None], terms: _Terms
) -> None:
    """A column group: type, column count, names, types, flags, nullable bytes chunk of values."""
    out.append(gtype)
    _put_uvarint(out, len(columns))
    _put_delta_varints(out, [terms.id(col[0]) for col in columns])
    out += _types_and_flags(tuple(col[1] for col in columns), tuple(col[2] for col in columns))
    lengths = [1 if raw is None else len(raw) << 1 for raw in values]  # zigzag: -1 for NULL
    if max(lengths) < 0x80:
        out += bytes(lengths)
    else:
        for n in lengths:
            _put_uvarint(out, n)
    for raw in values:
        if raw is not None:
            out += raw


_TYPES_AND_FLAGS: dict[tuple[tuple[int, ...], tuple[int, ...]], bytes] = {}


def _types_and_flags(types: tuple[int, ...], flags: tuple[int, ...]) -> bytes:
    """The uvarint chunks of a group's types and flags (memoized: tables repeat)."""
    chunk = _TYPES_AND_FLAGS.get((types, flags))
    if chunk is None:
        out = bytearray()
        for v in (*types, *flags):
            _put_uvarint(out, int(v))
        chunk = bytes(out)
        if len(_TYPES_AND_FLAGS) < _CACHE_LIMIT:
            _TYPES_AND_FLAGS[(types, flags)] = chunk
    return chunk


def _put_ddl(out: bytearray, ev: DDLEvent) -> None:
    """A DDL body: uvarint DDL type (None is TiDB's ActionNone, 0) and the query.

    Raises:
        EncodeError: a DDL type outside 0..255, a query that is no str.
    """
    ddl_type = 0 if ev.ddl_type is None else _as_int(ev.ddl_type)
    if ddl_type is None or not 0 <= ddl_type <= _MAX_DDL_TYPE:
        raise EncodeError(f"{PROTOCOL}: DDL type must be an int in 0..255, got {ev.ddl_type!r}")
    if not isinstance(ev.query, str):
        raise EncodeError(f"{PROTOCOL}: DDL query must be str, got {type(ev.query).__name__}")
    query = ev.query.encode()
    _put_uvarint(out, ddl_type)
    _put_uvarint(out, len(query))
    out += query


def _utf8_len(s: Any) -> int:
    if isinstance(s, str):
        return len(s) if s.isascii() else len(s.encode("utf-8", "replace"))
    return 0
