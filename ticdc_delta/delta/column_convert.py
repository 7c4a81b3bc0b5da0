"""A column of values converted in one Arrow call, where Arrow can prove it converts them as the per-value
converters would.

The columnar path (:mod:`ticdc_delta.spark.columnar`) converts every value of a released change to what
the MERGE writes, by the value screen's checks
(:meth:`~ticdc_delta.delta.value_check.ValueScreen.images_converter`): a Python call or two per value,
then one more pass to build the Arrow column. For the common columns that is work Arrow does in C: an
integer column of Python ints is its ``int64`` array once the range is checked, a text column its string
array, a DATE column of ``YYYY-MM-DD`` text the date32 cast of it. :func:`convert_column` returns such
an array only when every value of the column passes a test that makes its result the one the per-value
converter gives (types, range, strict text format, and for parsed text a round trip: the parsed value
printed back is the text). Anything else — one value of another type, one text in another form, one
value the converter would refuse — and it returns ``None``: the caller converts that column value by
value, with the converter's own errors. So the fast path decides nothing; it only skips work.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence
from weakref import WeakKeyDictionary

import pyarrow as pa
import pyarrow.compute as pc

from .arrow_types import _to_bytes, _to_date, _to_datetime, _to_float, _to_int64, _to_single, _to_str

__all__ = ["INT", "FLOAT", "SINGLE", "TEXT", "BYTES", "DECIMAL", "DECIMAL_TEXT", "DATE", "DATETIME", "Kind",
           "convert_column", "kind_of", "register"]

INT, FLOAT, SINGLE, TEXT, BYTES, DECIMAL, DECIMAL_TEXT, DATE, DATETIME = (
    "int", "float", "single", "text", "bytes", "decimal", "decimal_text", "date", "datetime")

Kind = tuple[Any, ...]
"""What a converter does, for :func:`convert_column`: ``(INT, lo, hi)`` (an integer in ``lo..hi`` as it
is), ``(FLOAT,)``, ``(SINGLE,)`` (a float rounded to single precision), ``(TEXT,)``, ``(BYTES,)`` (the value as it is), ``(DECIMAL,)`` (a decimal number's
text as the column's ``decimal128``, refused where it would round or overflow), ``(DECIMAL_TEXT,)`` (a
decimal number's text as it is), ``(DATE,)``, ``(DATETIME,)`` (TiDB's text parsed, a zero date null)."""

_INT64 = (-(1 << 63), (1 << 63) - 1)
_PLAIN: dict[Callable[[Any], Any], Kind] = {
    _to_int64: (INT, *_INT64), _to_float: (FLOAT,), _to_single: (SINGLE,), _to_str: (TEXT,), _to_bytes: (BYTES,),
    _to_date: (DATE,), _to_datetime: (DATETIME,),
}
_KINDS: WeakKeyDictionary[Callable[[Any], Any], Kind] = WeakKeyDictionary(_PLAIN)
_NONE = type(None)
_ARROW_ERRORS = (pa.ArrowException, OverflowError, TypeError, ValueError, UnicodeError)

_DECIMAL_RE = r"^[+-]?[0-9]+(\.[0-9]+)?$"  # Decimal() reads each as the finite number it writes


def register(check: Callable[[Any], Any], kind: Kind) -> Callable[[Any], Any]:
    """Say what ``check`` (a converter made for one column, e.g. a range check around ``_to_int64``) does,
    for :func:`kind_of`; returns ``check``. Only for a check that gives exactly what ``kind`` says."""
    _KINDS[check] = kind
    return check


def kind_of(check: Any) -> Kind | None:
    """What a converter does (:data:`Kind`), or ``None``: no fast path (its values convert one by one)."""
    try:
        return _KINDS.get(check)
    except TypeError:  # not weakly referenceable (e.g. the str of a column that cannot be written)
        return None


def convert_column(kind: Kind, values: Sequence[Any], target: pa.DataType) -> pa.Array | None:
    """``values`` (``None`` for null) converted as the converter of ``kind`` converts each, as an Arrow
    array of ``target`` (the column's Delta type), or ``None`` when that is not proven for every value."""
    types = set(map(type, values))
    types.discard(_NONE)
    name = kind[0]
    try:
        if name == INT:
            if not types <= {int}:  # (not bool: the converter makes it an int, pyarrow refuses it)
                return None
            array = pa.array(values, type=target)  # beyond 64 bits: OverflowError
            if (kind[1], kind[2]) != _INT64 and array.null_count < len(array):
                low, high = pc.min_max(array).values()
                if low.as_py() < kind[1] or high.as_py() > kind[2]:
                    return None
            return array
        if name == FLOAT:
            return pa.array(values, type=target) if types <= {float} else None
        if name == SINGLE:  # rounded to a single as the converter rounds (to nearest), where no value overflows
            if not types <= {float}:
                return None
            doubles = pa.array(values, type=pa.float64())
            singles = doubles.cast(pa.float32(), safe=False)
            if pc.any(pc.and_(pc.is_inf(singles), pc.invert(pc.is_inf(doubles)))).as_py():
                return None
            return singles.cast(target)
        if name == BYTES:
            return pa.array(values, type=target) if types <= {bytes} else None
        if not types <= {str}:
            return None
        # a lone surrogate is no UTF-8: pyarrow raises, the converter refuses it
        text = pa.array(values, type=pa.string())
        if name == TEXT:
            return text.cast(target)
        if name in (DECIMAL, DECIMAL_TEXT):
            # to a decimal128, Arrow's cast refuses a number that would lose digits to the scale or overflow
            # the precision (ArrowInvalid), as the converter does: those columns are left to it
            return text.cast(target) if _all(pc.match_substring_regex(text, _DECIMAL_RE)) else None
        if name in (DATE, DATETIME):
            return _parsed(text, target)
    except _ARROW_ERRORS:
        return None
    return None


def _parsed(text: pa.Array, target: pa.DataType) -> pa.Array | None:
    """TiDB's DATE / DATETIME text (``YYYY-MM-DD[ HH:MM:SS[.f]]``) as ``target``: zero dates (year ``0000``,
    a month or day ``00``: the converters' positional test) null as the converters make them, the rest
    parsed by Arrow and proven by printing the value back: a text that prints back as itself is the
    canonical form of that value, which the converters read the same. ``None``: any other text (e.g.
    ``2024-01-02T03:04:05``), or not a valid date (the converter decides, e.g. MySQL's ``2024-02-30``)."""
    zero = pc.starts_with(text, "0000")
    if _any(zero):
        text = pc.if_else(zero, pa.scalar(None, pa.string()), text)
    try:
        parsed = text.cast(target)
    except pa.ArrowInvalid:  # a month or day "00", or text Arrow does not read: test the other zero dates
        zero = pc.or_(pc.equal(pc.utf8_slice_codeunits(text, 5, 7), "00"),
                      pc.equal(pc.utf8_slice_codeunits(text, 8, 10), "00"))
        if not _any(zero):
            return None
        text = pc.if_else(zero, pa.scalar(None, pa.string()), text)
        parsed = text.cast(target)  # ArrowInvalid: None
    printed = parsed.cast(pa.string())
    if not pa.types.is_timestamp(target):
        return parsed if _all(pc.equal(printed, text)) else None
    # printed with six fraction digits: ``YYYY-MM-DD HH:MM:SS.ffffff``
    length = pc.utf8_length(text)
    if _all(pc.equal(length, 19)):  # no fraction in the text: the value's is zero
        return parsed if _all(pc.equal(pc.utf8_slice_codeunits(printed, 0, 19), text)) else None
    if _any(pc.equal(length, 20)):  # "...SS." prints back padded, but is no time the converters read
        return None
    padded = pc.if_else(pc.equal(length, 19), pc.binary_join_element_wise(text, ".000000", ""),
                        pc.utf8_rpad(text, 26, "0"))
    return parsed if _all(pc.equal(printed, padded)) else None


def _all(mask: pa.Array) -> bool:
    """Whether every non-null entry of a boolean array is true."""
    return bool(pc.all(mask).as_py() is not False)


def _any(mask: pa.Array) -> bool:
    return bool(pc.any(mask).as_py())
