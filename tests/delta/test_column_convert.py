"""The columnar path converts a column in one Arrow call only where that gives what the per-value
converters give: the same values, the same refusals, whatever the input."""

from __future__ import annotations

import math
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from ticdc_delta.codec.model import ColumnFlag as F, TypeCode as T
from ticdc_delta.core.records import ChangeRecord
from ticdc_delta.delta.applier import TableCatalog
from ticdc_delta.delta.arrow_types import TypeParams, arrow_type_for, convert_value
from ticdc_delta.delta.column_convert import DATE, DATETIME, DECIMAL, DECIMAL_TEXT, INT, TEXT, convert_column
from ticdc_delta.delta.value_check import ValueScreen

N = int(F.NULLABLE)
U = int(F.UNSIGNED | F.NULLABLE)
B = int(F.BINARY | F.NULLABLE)

# one column per converter with a fast path, and two without (YEAR, TIMESTAMP)
COLUMNS = (("big", int(T.BIGINT), N), ("tiny", int(T.TINYINT), N), ("utiny", int(T.TINYINT), U),
           ("i", int(T.INT), N), ("f", int(T.DOUBLE), N), ("v", int(T.VARCHAR), N), ("bl", int(T.BLOB), B),
           ("dec", int(T.DECIMAL), N), ("dec52", int(T.DECIMAL), N), ("d", int(T.DATE), N),
           ("dt", int(T.DATETIME), N), ("y", int(T.YEAR), N), ("ts", int(T.TIMESTAMP), N))
PARAMS = {"dec52": TypeParams(5, 2)}  # (the other DECIMAL's parameters are unknown: written as text)
TYPES = tuple(arrow_type_for(t, f, PARAMS.get(name)) for name, t, f in COLUMNS)

_DIGITS = st.text("0123456789", min_size=1, max_size=4)
# text near TiDB's date forms: most of it valid, some of it in other forms or out of range
_DATE_TEXT = st.one_of(
    st.dates().map(str),
    st.builds(lambda y, m, d: f"{y}-{m}-{d}", _DIGITS, _DIGITS, _DIGITS),
    st.sampled_from(["0000-00-00", "2024-02-30", "2023-02-29", "2024-00-10", "2024-1-02", "20240102", " 2024-01-02",
                     "é34000x", "2024-00-1é", "0000x", "2024-01-00", "+2024-01-02", "2024-01-02 ", "10000-01-01"]),
)
_DATETIME_TEXT = st.one_of(
    st.datetimes().map(str),
    st.datetimes().map(lambda d: d.isoformat()),
    st.builds(lambda d, h, m, s, f: f"{d} {h}:{m}:{s}{f}", _DATE_TEXT, _DIGITS, _DIGITS, _DIGITS,
              st.sampled_from(["", ".", ".5", ".123456", ".1234567", "Z", "+08:00"])),
    st.sampled_from(["0000-00-00 00:00:00", "2024-01-01 24:00:00", "2024-01-01 23:59:60", "2024-02-30 10:00:00",
                     "2024-01-02 03:04:05.", "2024-01-02 03:04", "2024-01-02 03:04:05.000000000", "2024-00-02 03:04:05",
                     "2024-01-02 03:04:05Z"]),
)
_INTS = st.one_of(st.integers(-300, 300), st.integers(-(1 << 64), 1 << 64),
                  st.sampled_from([-(1 << 63), (1 << 63) - 1]))
_ODD = st.one_of(st.booleans(), st.floats(allow_nan=False), st.decimals(allow_nan=False, places=2), st.text(max_size=3),
                 st.binary(max_size=3))
_VALUES = {
    "big": _INTS, "tiny": _INTS, "utiny": _INTS, "i": _INTS, "y": st.integers(-5, 10_000),
    "f": st.one_of(st.floats(), st.integers(-5, 5)),
    "v": st.one_of(st.text(max_size=5), st.sampled_from(["a\ud800b", "\udfff", "é"])),
    "bl": st.one_of(st.binary(max_size=5), st.text(max_size=2)),
    "dec": st.one_of(st.decimals(allow_nan=False, places=3).map(str), st.integers(-99, 99).map(str),
                     st.sampled_from(["12.3.4", "Infinity", "1_000", " 5", "+5", "5.", ".5", "1e3"])),
    "d": _DATE_TEXT, "dt": _DATETIME_TEXT, "ts": _DATETIME_TEXT,
}
_VALUES["dec52"] = st.one_of(_VALUES["dec"],
                             st.decimals(allow_nan=False, places=2, min_value=-999, max_value=999).map(str),
                             st.sampled_from(["999.99", "1000.00", "-999.995", "1.10", "1.15", "007.5", "-0"]))


def catalog() -> TableCatalog:
    cat = TableCatalog()
    for name, params in PARAMS.items():
        cat.set_params("s", "t", name, params)
    return cat


def reference(screen: ValueScreen, image: tuple) -> list[Any] | None:
    """What the record path does with one image: ``None`` when its screen refuses it, else each value as
    the MERGE converts it."""
    rec = ChangeRecord(1, "t", 0, 0, 0, "s", "t", "insert",
                       tuple((*c, v) for c, v in zip(COLUMNS, image)), None)
    if screen.check(rec) is not None:
        return None
    return [None if v is None else convert_value(v, t, f, PARAMS.get(name)) for (name, t, f), v in zip(COLUMNS, image)]


def assert_converts_as_the_screen(images: list[tuple]) -> None:
    screen = ValueScreen(catalog())
    arrays, failed = screen.images_converter("s", "t", COLUMNS, TYPES)(images)
    assert [a.type for a in arrays] == list(TYPES)
    for i, image in enumerate(images):
        expected = reference(screen, image)
        assert (i in failed) == (expected is None), (image, failed.get(i))
        if expected is None:  # (its values are dropped with it)
            continue
        expected += [None] * (len(COLUMNS) - len(expected))  # a shorter image: the other columns null
        got = [_nan_free(a[i].as_py()) for a in arrays]
        assert got == [_nan_free(pa.array([v], type=t)[0].as_py()) for v, t in zip(expected, TYPES)], image


def _nan_free(value: Any) -> Any:
    """``value``, a float NaN as a marker that equals itself (a NaN DOUBLE converts to NaN on both paths)."""
    return "NaN" if isinstance(value, float) and math.isnan(value) else value


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_a_column_converts_and_refuses_as_value_by_value(data: st.DataObject) -> None:
    # mostly columns of one kind of value, where the fast path is tried, some with odd values mixed in
    columns: dict[str, list] = {}
    for name, _, _ in COLUMNS:
        odd = [_ODD] if data.draw(st.booleans()) else []
        columns[name] = data.draw(st.lists(st.one_of(st.none(), _VALUES[name], *odd), min_size=1, max_size=8))
    rows = max(map(len, columns.values()))
    images = [tuple(columns[name][i] if i < len(columns[name]) else None for name, _, _ in COLUMNS)
              for i in range(rows)]
    images.append(images[0][:3])  # an image of the first columns (an Avro delete: the key)
    assert_converts_as_the_screen(images)


def test_common_columns_take_one_arrow_call() -> None:
    """The point of it: ints, text, decimal text and TiDB's date text (zero dates too) convert without a
    Python call per value, to the values the converters give."""
    cases = [
        ((INT, -128, 127), [1, None, -128, 127], pa.int64(), [1, None, -128, 127]),
        ((INT, -(1 << 63), (1 << 63) - 1), [1 << 62, None], pa.int64(), [1 << 62, None]),
        ((TEXT,), ["a", None, "é"], pa.string(), ["a", None, "é"]),
        ((DECIMAL_TEXT,), ["12.50", "-3", None, "+0.001"], pa.string(), ["12.50", "-3", None, "+0.001"]),
        ((DECIMAL,), ["12.5", "-3", None, "999.99", "1.10"], pa.decimal128(5, 2),
         [Decimal("12.50"), Decimal("-3.00"), None, Decimal("999.99"), Decimal("1.10")]),
        ((DATE,), ["2024-02-29", "0000-00-00", "2024-00-10", None], pa.date32(),
         [date(2024, 2, 29), None, None, None]),
        ((DATETIME,), ["2024-01-02 03:04:05", "2024-01-02 03:04:05.5", "0000-00-00 00:00:00",
                       "9999-12-31 23:59:59.999999"],
         pa.timestamp("us"), [datetime(2024, 1, 2, 3, 4, 5), datetime(2024, 1, 2, 3, 4, 5, 500000), None,
                              datetime(9999, 12, 31, 23, 59, 59, 999999)]),
    ]
    for kind, values, target, expected in cases:
        array = convert_column(kind, values, target)
        assert array is not None and array.to_pylist() == expected, kind


@pytest.mark.parametrize("kind,values,target", [
    ((INT, -128, 127), [1, 128], pa.int64()),  # out of the column's range: the converter refuses it
    ((INT, -128, 127), [1, True], pa.int64()),  # a bool: the converter makes it 1
    ((INT, -(1 << 63), (1 << 63) - 1), [1 << 63], pa.int64()),
    ((TEXT,), ["a\ud800"], pa.string()),
    ((TEXT,), ["a", 1], pa.string()),
    ((DECIMAL_TEXT,), ["1_000"], pa.string()),  # Decimal reads it; left to the converter
    ((DECIMAL,), ["1.15"], pa.decimal128(5, 1)),  # it would round: the converter refuses it
    ((DECIMAL,), ["1000.00"], pa.decimal128(5, 2)),  # beyond the precision
    ((DECIMAL,), [Decimal("1.5")], pa.decimal128(5, 2)),
    ((DATE,), ["2024-02-30"], pa.date32()),  # ALLOW_INVALID_DATES: the converter makes it null
    ((DATE,), ["20240102"], pa.date32()),
    ((DATETIME,), ["2024-01-02T03:04:05"], pa.timestamp("us")),
    ((DATETIME,), ["2024-01-02 03:04:05."], pa.timestamp("us")),
    ((DATETIME,), ["2024-01-02 03:04:05.1234567"], pa.timestamp("us")),
    ((DATETIME,), [datetime(2024, 1, 2)], pa.timestamp("us")),
    ((DATE,), [Decimal(1)], pa.date32()),
])
def test_anything_unproven_is_left_to_the_per_value_converter(kind: tuple, values: list, target: pa.DataType) -> None:
    assert convert_column(kind, values, target) is None
