"""MySQL/TiDB column types → Delta (Arrow) types, and values between the event model and Delta.

The Delta target tables are typed from what the event model knows of a column (its TiCDC type code and
flags, :mod:`ticdc_delta.codec.model`) plus what a DDL may add (decimal precision/scale, ENUM/SET members,
fractional-seconds precision) in :class:`TypeParams`:

==========================================  ====================================  ==========================
TiDB type                                   Delta / Arrow type                    value written
==========================================  ====================================  ==========================
TINYINT, SMALLINT, MEDIUMINT, INT (signed   ``long`` / ``int64``                  the integer
or unsigned), BIGINT (signed)
BIGINT UNSIGNED                             ``decimal(20,0)``                     the integer, exact
YEAR                                        ``integer`` / ``int32``               the year
FLOAT, DOUBLE                               ``double`` / ``float64``              the float (FLOAT: its single, widened)
DECIMAL(p,s), p ≤ 38 known                  ``decimal(p,s)``                      exact
DECIMAL otherwise (p > 38 or unknown)       ``string``                            TiDB's text, exact
DATE                                        ``date`` / ``date32``                 the date
DATETIME                                    ``timestamp_ntz`` / ``timestamp[us]`` wall-clock time
TIMESTAMP                                   ``timestamp`` / ``timestamp[us,UTC]`` the instant
TIME                                        ``string``                            TiDB's text
JSON                                        ``string``                            the JSON text
ENUM, SET                                   ``string``                            the label(s), see below
BIT                                         ``binary``                            8 bytes, big-endian
CHAR, VARCHAR, TEXT (no binary flag)        ``string``                            the text
BINARY, VARBINARY, BLOB (binary flag)       ``binary``                            the bytes
GEOMETRY                                    ``binary``                            the bytes
VECTOR, VECTOR(N) (TiDB 8.4+)               ``array<float>`` / ``list<float32>``  the elements
NULL                                        ``string``                            always null
==========================================  ====================================  ==========================

Choices worth knowing:

* **One integer type.** Every integer column except BIGINT UNSIGNED is ``int64``, so the usual integer
  widening DDL (``TINYINT`` → ``INT`` → ``BIGINT``) never changes the Delta type and never rewrites data.
  BIGINT UNSIGNED does not fit ``int64`` and goes to ``decimal(20,0)``.
* **BIT is binary.** A ``BIT(64)`` value reaches 2**64-1, which no Delta integer holds; every BIT value is
  written as exactly 8 bytes, big-endian (``b'\\x00'*7 + b'\\x51'`` for ``b'1010001'``), whatever the
  column's width, so comparisons and ordering of equal-width values behave.
* **TIMESTAMP** values arrive as wall-clock text in the changefeed's time zone (TiCDC formats TIMESTAMP in
  its ``--tz``); they are interpreted in the configured *source time zone* (default ``"UTC"``, an IANA
  name or a fixed offset such as ``"+08:00"``) and stored as UTC instants. A wall-clock time that a DST
  change makes ambiguous takes its first occurrence (``fold=0``). DATETIME has no zone and is stored as
  Delta ``timestamp_ntz``.
* **Zero dates.** MySQL's zero and partly-zero dates (``0000-00-00``, ``2020-00-15``, year ``0000``) have
  no Delta value and are written as null; so are the dates ``ALLOW_INVALID_DATES`` lets TiDB store (month
  1..12 and day 1..31 that the month does not have, ``2024-02-30``), as MySQL's own date functions read
  them. The same holds for the date part of DATETIME and TIMESTAMP. In a NOT NULL key column such a
  value is refused instead (a null key would merge rows of different keys: see
  :mod:`ticdc_delta.delta.value_check`). A date no MySQL mode stores
  (``2024-13-45``) is not written: it is bad input (see :mod:`ticdc_delta.delta.value_check`).
* **TIME** is TiDB's text as it comes: beyond 24 hours, negative, with a fraction (``838:59:59``,
  ``-12:00:00.5``); no Delta type holds a duration of that range.
* **Text** must be Unicode scalar values (a lone surrogate, which no UTF-8 file holds, is refused); NUL
  characters are kept.
* **ENUM/SET.** The label is stored. Where the wire carries the number (index for ENUM, bit mask for SET:
  Open Protocol, Craft, Canal-JSON) and the members are known from DDL, the number becomes the label(s);
  SET labels are joined with ``","`` in definition order, as MySQL prints them. ENUM index 0 (MySQL's
  invalid-value marker) is ``""``. Where the members are unknown, or the number lies outside them, the
  number is stored as decimal text (``"3"``).
"""

from __future__ import annotations

import re
import struct
from datetime import date, datetime, timedelta, timezone, tzinfo
from decimal import Context, Decimal, InvalidOperation
from functools import lru_cache
from typing import Any, Callable, Iterable, NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import pyarrow as pa

from ticdc_delta.codec.model import (
    ColumnFlag,
    TEXT_OR_BINARY_TYPES,
    TypeCode,
    format_vector,
    is_binary_column,
    parse_vector,
)
from ticdc_delta.errors import ConfigError, SinkError, preview

__all__ = [
    "TypeParams",
    "MAX_DECIMAL_PRECISION",
    "BIGINT_UNSIGNED_TYPE",
    "BIT_WIDTH_BYTES",
    "VECTOR_TYPE",
    "arrow_type_for",
    "arrow_field_for",
    "converter_for",
    "common_type",
    "single",
    "convert_value",
    "integer_value",
    "to_arrow_array",
    "canonical_from_delta",
    "TextSource",
    "Narrowing",
    "narrowed",
    "go_float_text",
    "tidb_text",
    "source_zone",
    "widens",
]

MAX_DECIMAL_PRECISION = 38
"""Largest precision of a Delta decimal; wider MySQL DECIMALs (up to 65) are stored as text."""

BIGINT_UNSIGNED_TYPE = pa.decimal128(20, 0)
"""Delta type of BIGINT UNSIGNED: 20 digits hold 18446744073709551615."""

BIT_WIDTH_BYTES = 8
"""Every BIT value is stored as this many bytes, big-endian."""

VECTOR_TYPE = pa.list_(pa.float32())
"""Delta type of TiDB's VECTOR (float32 elements): ``array<float>``, what a lakehouse user queries."""

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_UINT64_MAX = (1 << 64) - 1

_SMALL_INTEGER_TYPES = frozenset(
    {TypeCode.TINYINT, TypeCode.SMALLINT, TypeCode.MEDIUMINT, TypeCode.INT, TypeCode.BIGINT}
)
_DATE_TYPES = frozenset({TypeCode.DATE, TypeCode.NEWDATE})
_STRING_TYPES = frozenset({TypeCode.TIME, TypeCode.JSON, TypeCode.NULL})
_LABEL_TYPES = frozenset({TypeCode.ENUM, TypeCode.SET})

# Decimal arithmetic wide enough for DECIMAL(65, 30) without rounding.
_DECIMAL_CONTEXT = Context(prec=100)

_OFFSET_RE = re.compile(r"^(?:UTC|GMT)?([+-])(\d{1,2}):?(\d{2})$")


class TypeParams(NamedTuple):
    """What a DDL adds to a column's type code; every field is optional.

    ``precision``/``scale`` of DECIMAL (MySQL's ``DECIMAL(p)`` means scale 0); ``members`` of ENUM/SET in
    definition order; ``fsp`` (fractional seconds precision, 0..6) of DATETIME/TIMESTAMP and ``float32``
    (``True`` for FLOAT, whose single-precision values a Delta ``double`` holds), used only to print values
    in TiDB's format (:func:`canonical_from_delta`, :func:`tidb_text`).
    """

    precision: int | None = None
    scale: int | None = None
    members: tuple[str, ...] | None = None
    fsp: int | None = None
    float32: bool | None = None


_NO_PARAMS = TypeParams()


def _decimal_precision_scale(params: TypeParams) -> tuple[int, int] | None:
    """``(p, s)`` when the DECIMAL fits a Delta decimal, else ``None`` (stored as text).

    Raises:
        SinkError: the DDL's precision/scale are impossible (scale above precision, negative).
    """
    p, s = params.precision, params.scale
    if p is None:
        return None
    if s is None:
        s = 0  # MySQL: DECIMAL(M) is DECIMAL(M, 0)
    if p < 1 or s < 0 or s > p:
        raise SinkError(f"invalid DECIMAL({p},{s}): expected 1 <= precision and 0 <= scale <= precision")
    if p > MAX_DECIMAL_PRECISION:
        return None
    return p, s


def arrow_type_for(type_code: int, flags: int, params: TypeParams | None = None) -> pa.DataType:
    """The Arrow type of a target column (see the module docstring for the table).

    Raises:
        SinkError: an unknown type code, or impossible DECIMAL parameters.
    """
    params = params or _NO_PARAMS
    try:
        tc = TypeCode(type_code)
    except ValueError:
        raise SinkError(f"no Delta type for TiCDC type code {type_code!r}") from None
    if tc in _SMALL_INTEGER_TYPES:
        if tc is TypeCode.BIGINT and flags & ColumnFlag.UNSIGNED:
            return BIGINT_UNSIGNED_TYPE
        return pa.int64()
    if tc is TypeCode.YEAR:
        return pa.int32()
    if tc in (TypeCode.FLOAT, TypeCode.DOUBLE):
        return pa.float64()
    if tc is TypeCode.DECIMAL:
        ps = _decimal_precision_scale(params)
        return pa.string() if ps is None else pa.decimal128(*ps)
    if tc in _DATE_TYPES:
        return pa.date32()
    if tc is TypeCode.DATETIME:
        return pa.timestamp("us")
    if tc is TypeCode.TIMESTAMP:
        return pa.timestamp("us", tz="UTC")
    if tc in _STRING_TYPES or tc in _LABEL_TYPES:
        return pa.string()
    if tc is TypeCode.BIT or tc is TypeCode.GEOMETRY:
        return pa.binary()
    if tc in TEXT_OR_BINARY_TYPES:
        return pa.binary() if is_binary_column(tc, flags) else pa.string()
    if tc is TypeCode.VECTOR_FLOAT32:
        return VECTOR_TYPE
    raise SinkError(f"no Delta type for TiCDC type code {type_code!r}")  # pragma: no cover - enum is closed


def arrow_field_for(name: str, type_code: int, flags: int, params: TypeParams | None = None) -> pa.Field:
    """A nullable Arrow field for a target column.

    Target columns are always nullable: a column added by DDL is null in older rows, and Delta cannot add
    a NOT NULL column to a table that has rows.

    Raises:
        SinkError: as :func:`arrow_type_for`.
    """
    return pa.field(name, arrow_type_for(type_code, flags, params), nullable=True)


@lru_cache(maxsize=64)
def source_zone(tz: str) -> tzinfo:
    """The time zone TIMESTAMP text is read in: an IANA name (``"Asia/Shanghai"``), ``"UTC"``, or a fixed
    offset (``"+08:00"``, ``"-0530"``, ``"UTC+08:00"``).

    Raises:
        ConfigError: the name is neither a known zone nor an offset.
    """
    if tz in ("UTC", "Z", "utc"):
        return timezone.utc
    m = _OFFSET_RE.match(tz)
    if m:
        sign = -1 if m.group(1) == "-" else 1
        hours, minutes = int(m.group(2)), int(m.group(3))
        if hours > 23 or minutes > 59:
            raise ConfigError(f"source time zone {tz!r}: offset out of range")
        return timezone(sign * timedelta(hours=hours, minutes=minutes))
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigError(
            f"source time zone {tz!r} is not an IANA time zone name or a UTC offset like '+08:00'"
        ) from exc


# --- model value → Delta value -------------------------------------------------------------------------


def _bad(value: Any, what: str) -> SinkError:
    return SinkError(f"cannot write {preview(value)} as {what}")


def _is_zero_date(text: str) -> bool:
    # MySQL zero / partly-zero dates ("0000-00-00", "2020-00-15", "2020-01-00"); year 0 has no
    # proleptic-Gregorian value in Delta either.
    return text[0:4] == "0000" or text[5:7] == "00" or text[8:10] == "00"


_YMD_RE = re.compile(r"(\d{4})-(\d{2})-(\d{2})")


def _is_allowed_invalid_date(text: str, parse: Callable[[str], Any]) -> bool:
    """A date MySQL's ``ALLOW_INVALID_DATES`` stores: month 1..12, day 1..31, not a day of that month
    (``2024-02-30``); the rest of the text (a time part) must be valid."""
    m = _YMD_RE.match(text)
    if m is None or not 1 <= int(m.group(2)) <= 12 or not 1 <= int(m.group(3)) <= 31:
        return False
    try:
        parse(text[:8] + "01" + text[10:])
    except ValueError:
        return False
    return True


def _to_int64(value: Any) -> int | None:
    if value is None:
        return None
    if type(value) is int and _INT64_MIN <= value <= _INT64_MAX:
        return value
    v = _exact_int(value)
    if v is None or not _INT64_MIN <= v <= _INT64_MAX:
        raise _bad(value, "a 64-bit integer")
    return v


def _exact_int(value: Any) -> int | None:
    """``value`` as an int when it is one exactly (an int, integer text, an integral Decimal), else None.
    A float or a fractional Decimal is not: ``int()`` would truncate it silently."""
    if isinstance(value, float):
        return None
    if isinstance(value, Decimal):
        return int(value) if value.is_finite() and value == value.to_integral_value() else None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def integer_value(type_code: int, value: Any) -> int | None:
    """The integer a column of type ``type_code`` holds for ``value`` when it is of an integer type
    (TINYINT to BIGINT, signed or not: their converters write exactly this number), else ``None`` (another
    type, a null, or a value that is no exact integer and that the converter refuses)."""
    if value is None or type_code not in _SMALL_INTEGER_TYPES:
        return None
    return _exact_int(value)


def _to_year(value: Any) -> int | None:
    v = _to_int64(value)
    if v is not None and not 0 <= v <= 9999:
        raise _bad(value, "a YEAR")
    return v


def _to_uint64_decimal(value: Any) -> Decimal | None:
    if value is None:
        return None
    v = _exact_int(value)
    if v is None or not 0 <= v <= _UINT64_MAX:
        raise _bad(value, "a BIGINT UNSIGNED")
    return Decimal(v)


def _to_float(value: Any) -> float | None:
    if value is None:
        return None
    if type(value) is float:
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        raise _bad(value, "a FLOAT/DOUBLE") from None


_SINGLE = struct.Struct("<f")


def single(value: float) -> float:
    """``value`` rounded to the nearest single-precision float (as TiDB stores a FLOAT), widened back.

    Raises:
        OverflowError: beyond the largest single.
    """
    return _SINGLE.unpack(_SINGLE.pack(value))[0]  # type: ignore[no-any-return]


def _to_single(value: Any) -> float | None:
    """A FLOAT's value as TiDB holds it, a single-precision float, widened to the Delta ``double``: Craft
    and Avro carry those bits, Open Protocol and Canal-JSON the shortest text that reads back as the same
    single (``0.1``: not the double nearest 0.1), so every protocol (and a snapshot) gives one value."""
    v = _to_float(value)
    if v is None:
        return None
    try:
        return single(v)
    except OverflowError:  # beyond the largest single: no FLOAT holds it
        raise _bad(value, "a FLOAT") from None


def _decimal_converter(precision: int, scale: int) -> Callable[[Any], Decimal | None]:
    quantum = Decimal(1).scaleb(-scale)
    what = f"DECIMAL({precision},{scale})"

    def convert(value: Any) -> Decimal | None:
        if value is None:
            return None
        try:
            d = value if isinstance(value, Decimal) else Decimal(str(value))
            q = d.quantize(quantum, context=_DECIMAL_CONTEXT)
        except (InvalidOperation, TypeError, ValueError):
            raise _bad(value, what) from None
        # Rounding or overflow would lose what TiDB stored: refuse rather than write a different number.
        if not d.is_finite() or q != d or len(q.as_tuple().digits) > precision:
            raise _bad(value, what)
        return q

    return convert


def _to_text_decimal(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return _to_str(value)
    if isinstance(value, (int, Decimal)):
        return str(value)
    raise _bad(value, "DECIMAL text")


def _to_date(value: Any) -> date | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    if not isinstance(value, str):
        raise _bad(value, "a DATE")
    if _is_zero_date(value):
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        if _is_allowed_invalid_date(value, date.fromisoformat):
            return None
        raise _bad(value, "a DATE") from None


def _parse_wall_clock(value: Any, what: str) -> datetime | None:
    """TiDB's ``YYYY-MM-DD HH:MM:SS[.ffffff]`` as a naive datetime; ``None`` for a zero date."""
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        raise _bad(value, what)
    if _is_zero_date(value):
        return None
    try:
        d = datetime.fromisoformat(value)
    except ValueError:
        if _is_allowed_invalid_date(value, datetime.fromisoformat):
            return None
        raise _bad(value, what) from None
    if d.tzinfo is not None:
        raise _bad(value, f"{what} (no zone expected)")
    return d


def _to_datetime(value: Any) -> datetime | None:
    if value is None:
        return None
    return _parse_wall_clock(value, "a DATETIME")


def _timestamp_converter(tz: str) -> Callable[[Any], datetime | None]:
    zone = source_zone(tz)
    utc = timezone.utc

    def convert(value: Any) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, datetime) and value.tzinfo is not None:
            return value.astimezone(utc)
        d = _parse_wall_clock(value, "a TIMESTAMP")
        if d is None:
            return None
        try:
            return d.replace(tzinfo=zone).astimezone(utc)
        except OverflowError:
            raise _bad(value, f"a TIMESTAMP in zone {tz}") from None

    return convert


def _to_str(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                # a lone surrogate (e.g. JSON "\\ud800"): no UTF-8 text, so no Delta string, holds it
                raise _bad(value, "UTF-8 text (it holds a lone surrogate)") from None
        return value if type(value) is str else str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise _bad(value, "UTF-8 text") from None
    raise _bad(value, "text")


def _to_bytes(value: Any) -> bytes | None:
    if value is None or type(value) is bytes:
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise _bad(value, "bytes (binary column)")


def _to_bit(value: Any) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        if len(raw) > BIT_WIDTH_BYTES:
            raise _bad(value, "a BIT (at most 64 bits)")
        return raw.rjust(BIT_WIDTH_BYTES, b"\x00")
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _UINT64_MAX:
        return value.to_bytes(BIT_WIDTH_BYTES, "big")
    raise _bad(value, "a BIT (0 .. 2**64-1)")


def _null(_value: Any) -> None:
    return None


def _to_vector(value: Any) -> list[float] | None:
    """A VECTOR's text form (``"[1,2.5,-3]"``, what TiCDC sends) as its float32 elements."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return parse_vector(value)
        except ValueError:
            raise _bad(value, "a VECTOR ([x1,x2,...] of finite numbers)") from None
    if isinstance(value, (list, tuple)):
        return [float(v) for v in value]
    raise _bad(value, "a VECTOR")


def _enum_converter(members: tuple[str, ...] | None) -> Callable[[Any], str | None]:
    def convert(value: Any) -> str | None:
        if value is None or isinstance(value, str):
            return _to_str(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise _bad(value, "an ENUM (index or label)")
        if members is not None:
            if value == 0:
                return ""  # MySQL stores an invalid ENUM value as index 0, printed as ''
            if 1 <= value <= len(members):
                return members[value - 1]  # ENUM indexes count from 1
        return str(value)

    return convert


def _set_converter(members: tuple[str, ...] | None) -> Callable[[Any], str | None]:
    def convert(value: Any) -> str | None:
        if value is None or isinstance(value, str):
            return _to_str(value)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise _bad(value, "a SET (bit mask or labels)")
        if members is not None and value >> len(members) == 0:
            # Bit i is the i-th member; MySQL prints the members in definition order, comma-separated.
            return ",".join(m for i, m in enumerate(members) if value >> i & 1)
        return str(value)

    return convert


@lru_cache(maxsize=4096)
def converter_for(
    type_code: int, flags: int, params: TypeParams | None = None, tz: str = "UTC"
) -> Callable[[Any], Any]:
    """A function from a model value (see :mod:`ticdc_delta.codec.model`) to the Python value pyarrow
    accepts for :func:`arrow_type_for` of the same column. Cached: build rows column by column with it.

    The returned function raises :class:`~ticdc_delta.errors.SinkError` for a value the target type cannot
    hold exactly (a decimal with more digits than its scale, an integer out of range, an invalid date).

    Raises:
        SinkError: an unknown type code or impossible DECIMAL parameters.
        ConfigError: ``tz`` is not a time zone.
    """
    params = params or _NO_PARAMS
    target = arrow_type_for(type_code, flags, params)
    tc = TypeCode(type_code)
    if tc in _SMALL_INTEGER_TYPES:
        return _to_uint64_decimal if target == BIGINT_UNSIGNED_TYPE else _to_int64
    if tc is TypeCode.YEAR:
        return _to_year
    if tc is TypeCode.FLOAT:
        return _to_single
    if tc is TypeCode.DOUBLE:
        return _to_float
    if tc is TypeCode.DECIMAL:
        if pa.types.is_decimal(target):
            return _decimal_converter(target.precision, target.scale)
        return _to_text_decimal
    if tc in _DATE_TYPES:
        return _to_date
    if tc is TypeCode.DATETIME:
        return _to_datetime
    if tc is TypeCode.TIMESTAMP:
        return _timestamp_converter(tz)
    if tc is TypeCode.NULL:
        return _null
    if tc is TypeCode.ENUM:
        return _enum_converter(params.members)
    if tc is TypeCode.SET:
        return _set_converter(params.members)
    if tc is TypeCode.BIT:
        return _to_bit
    if tc is TypeCode.VECTOR_FLOAT32:
        return _to_vector
    if pa.types.is_binary(target):
        return _to_bytes
    return _to_str


def convert_value(
    value: Any, type_code: int, flags: int, params: TypeParams | None = None, tz: str = "UTC"
) -> Any:
    """One model value as the Python value pyarrow accepts for the column's Delta type.

    ``tz`` is the source time zone of TIMESTAMP text. Zero dates become ``None``.

    Raises:
        SinkError: the value cannot be stored exactly in the column's Delta type.
        ConfigError: ``tz`` is not a time zone.
    """
    return converter_for(type_code, int(flags), params, tz)(value)


def to_arrow_array(
    values: Iterable[Any], type_code: int, flags: int, params: TypeParams | None = None, tz: str = "UTC"
) -> pa.Array:
    """A column of model values as an Arrow array of the column's Delta type.

    Raises:
        SinkError: a value cannot be stored exactly in the column's Delta type.
        ConfigError: ``tz`` is not a time zone.
    """
    convert = converter_for(type_code, int(flags), params, tz)
    target = arrow_type_for(type_code, flags, params)
    return pa.array([convert(v) for v in values], type=target)


# --- Delta value → model value (for comparing Delta contents with an oracle) ---------------------------


def _format_wall_clock(d: datetime, fsp: int | None) -> str:
    # strftime("%Y") does not zero-pad years below 1000 on every platform; format the fields by hand.
    text = (
        f"{d.year:04d}-{d.month:02d}-{d.day:02d} {d.hour:02d}:{d.minute:02d}:{d.second:02d}"
    )
    if fsp is None:
        return f"{text}.{d.microsecond:06d}" if d.microsecond else text
    return text + fraction_text(f"{d.microsecond:06d}", fsp)


def fraction_text(digits: str | None, fsp: int) -> str:
    """``.`` and ``fsp`` fractional digits of ``digits`` (padded with zeros; none at all for ``fsp`` 0): how
    TiDB ends the text of a DATETIME, TIMESTAMP or TIME of that precision."""
    return f".{(digits or '').ljust(6, '0')[:fsp]}" if fsp else ""


class TextSource(NamedTuple):
    """What :func:`tidb_text` needs to print a column's values as TiDB does: the column's type parameters
    before the DDL (``None`` when no DDL gave any) and the zone TIMESTAMP values are shown in."""

    params: TypeParams | None
    tz: str = "UTC"


def go_float_text(value: float, float32: bool = False) -> str:
    """A FLOAT (``float32``) or DOUBLE value as TiDB turns it into text (Go's ``strconv.FormatFloat(v, 'f',
    -1, 32|64)``): the fewest digits that read back as the same single or double, never an exponent
    (``1e20`` is ``100000000000000000000``, ``1.0`` is ``1``)."""
    if float32:
        rounded = single(value)
        digits = repr(rounded)
        for precision in range(1, 10):
            text = f"{rounded:.{precision}g}"
            try:
                if single(float(text)) == rounded:
                    digits = text
                    break
            except OverflowError:  # rounded up past the largest single
                continue
    else:
        digits = repr(value)
    text = format(Decimal(digits), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def tidb_text(column: pa.Array | pa.ChunkedArray, source: TextSource) -> pa.Array | None:
    """``column``'s values as the text TiDB gives them when MODIFY COLUMN makes the column a string type,
    where Arrow's cast prints them otherwise: DATETIME and TIMESTAMP (``timestamp``: TiDB's
    ``YYYY-MM-DD HH:MM:SS[.fff]`` with the column's fractional digits, TIMESTAMP in ``source.tz``; Arrow
    prints six digits and a ``Z``) and FLOAT/DOUBLE (:func:`go_float_text`; Arrow prints ``1e+20``).
    ``None`` for the other types, whose Arrow text is TiDB's (integers, DECIMAL with its scale, DATE).
    """
    params = source.params or _NO_PARAMS
    kind = column.type
    convert: Callable[[Any], str]
    if pa.types.is_timestamp(kind):
        if kind.tz is None:
            def convert(v: Any) -> str:
                return _format_wall_clock(v, params.fsp)
        else:
            zone = source_zone(source.tz)

            def convert(v: Any) -> str:
                return _format_wall_clock(v.astimezone(zone).replace(tzinfo=None), params.fsp)
    elif pa.types.is_floating(kind):
        single = bool(params.float32)

        def convert(v: Any) -> str:
            return go_float_text(v, single)
    else:
        return None
    return pa.array([None if v is None else convert(v) for v in column.to_pylist()], pa.string())


class Narrowing(NamedTuple):
    """How TiDB's MODIFY COLUMN rounds the stored values when the column keeps its Delta type but loses
    precision: to ``fsp`` fractional digits (DATETIME and TIMESTAMP, a ``timestamp``; TIME, its text) or
    to a single (``float32``: DOUBLE → FLOAT)."""

    fsp: int | None = None
    float32: bool = False


_TIME_TEXT_RE = re.compile(r"(-?)(\d+):(\d{2}):(\d{2})(?:\.(\d{1,6}))?")


def narrowed(column: pa.Array | pa.ChunkedArray, how: Narrowing) -> pa.Array:
    """``column``'s values rounded as TiDB rounds them for ``how`` (``Time.RoundFrac``,
    ``Duration.RoundFrac``: half up, carrying into the seconds; ``float32(f)``: to the nearest single).

    Raises:
        SinkError: a TIME text that is not ``[-]H:MM:SS[.f]``.
    """
    kind = column.type
    if how.float32:
        out: list[Any] = [None if v is None else single(v) for v in column.to_pylist()]
        return pa.array(out, kind)
    step = 10 ** (6 - (how.fsp or 0))
    if pa.types.is_timestamp(kind):
        micros = column.cast(pa.int64()).to_pylist()
        out = [None if v is None else (v + step // 2) // step * step for v in micros]
        return pa.array(out, pa.int64()).cast(kind)
    out = []
    for text in column.to_pylist():
        if text is None:
            out.append(None)
            continue
        m = _TIME_TEXT_RE.fullmatch(text)
        if m is None:
            raise SinkError(f"cannot round the TIME value {preview(text)} to {how.fsp} fractional digits")
        sign, h, mi, sec, frac = m.groups()
        total = ((int(h) * 60 + int(mi)) * 60 + int(sec)) * 1_000_000 + int((frac or "").ljust(6, "0"))
        total = -total if sign else total
        total = (total + step // 2) // step * step  # (Go's Time.Round: half up, on the signed duration)
        out.append(_time_text(total, how.fsp or 0))
    return pa.array(out, pa.string())


def _time_text(micros: int, fsp: int) -> str:
    sign, micros = ("-", -micros) if micros < 0 else ("", micros)
    seconds, fraction = divmod(micros, 1_000_000)
    return f"{sign}{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" + fraction_text(
        f"{fraction:06d}", fsp)


def canonical_from_delta(
    value: Any,
    type_code: int,
    flags: int,
    params: TypeParams | None = None,
    tz: str = "UTC",
    *,
    enum_labels: bool = False,
) -> Any:
    """The inverse of :func:`convert_value`: a value read back from Delta, as the event model writes it.

    DECIMAL → ``str`` with exactly ``scale`` fractional digits; DATE → ``"YYYY-MM-DD"``; DATETIME and
    TIMESTAMP → ``"YYYY-MM-DD HH:MM:SS[.ffffff]"`` (TIMESTAMP in the source zone ``tz``; the fraction has
    ``params.fsp`` digits when known, else six digits when non-zero, else none); BIGINT UNSIGNED → ``int``;
    BIT → ``int``; ENUM/SET → the index / bit mask when ``params.members`` are known (or the stored text
    is a number), else the label text; with ``enum_labels=True`` ENUM/SET stay labels. Zero dates were
    stored as null and come back as ``None``.

    Raises:
        SinkError: an unknown type code, or a label that is not among ``params.members``.
        ConfigError: ``tz`` is not a time zone.
    """
    if value is None:
        return None
    params = params or _NO_PARAMS
    target = arrow_type_for(type_code, flags, params)
    tc = TypeCode(type_code)
    if tc in _SMALL_INTEGER_TYPES or tc is TypeCode.YEAR:
        return int(value)
    if tc in (TypeCode.FLOAT, TypeCode.DOUBLE):
        return float(value)
    if tc is TypeCode.DECIMAL:
        if pa.types.is_decimal(target):
            d = Decimal(value).quantize(Decimal(1).scaleb(-target.scale), context=_DECIMAL_CONTEXT)
            return format(d, "f")
        return str(value)
    if tc in _DATE_TYPES:
        return value.isoformat()
    if tc is TypeCode.DATETIME:
        return _format_wall_clock(value, params.fsp)
    if tc is TypeCode.TIMESTAMP:
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        local = value.astimezone(source_zone(tz)).replace(tzinfo=None)
        return _format_wall_clock(local, params.fsp)
    if tc is TypeCode.BIT:
        return int.from_bytes(value, "big")
    if tc in _LABEL_TYPES:
        return value if enum_labels else _label_to_number(value, tc, params.members)
    if tc is TypeCode.NULL:
        return None
    if tc is TypeCode.VECTOR_FLOAT32:
        return format_vector(value)
    if pa.types.is_binary(target):
        return bytes(value)
    return str(value)


def _label_to_number(text: str, tc: TypeCode, members: tuple[str, ...] | None) -> int | str:
    if members is None:
        return int(text) if text.isdigit() else text
    if tc is TypeCode.ENUM:
        if text == "":
            return 0
        if text in members:
            return members.index(text) + 1
        if text.isdigit():
            return int(text)  # stored as a number: it was outside the known members
        raise SinkError(f"ENUM label {text!r} is not one of {list(members)}")
    if text == "":
        return 0
    if text.isdigit() and text not in members:
        return int(text)
    mask = 0
    for label in text.split(","):
        if label not in members:
            raise SinkError(f"SET label {label!r} is not one of {list(members)}")
        mask |= 1 << members.index(label)
    return mask


_INT_DIGITS = {8: 3, 16: 5, 32: 10, 64: 19}
"""The decimal digits of a signed integer type's values, by bit width."""


def widens(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether every value of ``old`` is exactly representable in ``new``."""
    if pa.types.is_string(new):
        return not pa.types.is_binary(old)
    if pa.types.is_decimal(old) and pa.types.is_decimal(new):
        return new.scale >= old.scale and (new.precision - new.scale) >= (old.precision - old.scale)
    if pa.types.is_integer(old) and pa.types.is_decimal(new):
        digits = _INT_DIGITS[old.bit_width]
        return new.precision - new.scale >= digits
    if pa.types.is_integer(old) and pa.types.is_integer(new):
        return new.bit_width >= old.bit_width
    if pa.types.is_integer(old) and pa.types.is_floating(new):
        return old.bit_width <= 32
    if pa.types.is_date(old) and pa.types.is_timestamp(new):
        return new.tz is None
    return False



def common_type(old: pa.DataType, new: pa.DataType) -> pa.DataType | None:
    """The narrowest type holding every value of ``old`` and of ``new`` exactly: one of them where it
    :func:`widens` the other, else, for integers and decimals, the decimal with the integer digits and the
    scale of the larger (``int64`` and ``decimal(10,2)``: ``decimal(21,2)``; ``decimal(10,2)`` and
    ``decimal(10,4)``: ``decimal(12,4)``) up to 38 digits; ``None`` when there is none (text and numbers,
    a double and an integer).

    Avro carries no DDL: a column retyped upstream (``MODIFY c DECIMAL(10,4)`` of a ``DECIMAL(10,2)``, an
    INT made DECIMAL) shows only in new schema versions, while the table and older messages still hold
    values of the old type; the table's column must take both."""
    if old == new or widens(new, old):
        return old
    if widens(old, new):
        return new

    def digits(t: pa.DataType) -> tuple[int, int] | None:  # (integer digits, scale)
        if pa.types.is_decimal(t):
            return t.precision - t.scale, t.scale
        if pa.types.is_integer(t):
            return _INT_DIGITS[t.bit_width] + (1 if pa.types.is_unsigned_integer(t) and t.bit_width == 64 else 0), 0
        return None

    a, b = digits(old), digits(new)
    if a is None or b is None:
        return None
    scale = max(a[1], b[1])
    precision = max(a[0], b[0]) + scale
    return pa.decimal128(precision, scale) if precision <= 38 else None
