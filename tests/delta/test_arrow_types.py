"""The MySQL/TiDB → Delta (Arrow) type mapping and value conversions, both ways."""

from __future__ import annotations

from datetime import date, datetime, timezone
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from tests.codec.cases import ALL_TYPES, B, KEY, N, U
from tests.delta import ALL_TYPES_PARAMS
from ticdc_delta.codec.model import ColumnFlag as F, TypeCode as T
from ticdc_delta.delta.arrow_types import (
    Narrowing,
    narrowed,
    go_float_text,
    BIGINT_UNSIGNED_TYPE,
    TypeParams,
    arrow_field_for,
    arrow_type_for,
    canonical_from_delta,
    convert_value,
    source_zone,
    to_arrow_array,
)
from ticdc_delta.errors import ConfigError, SinkError

EXPECTED_TYPES: dict[str, pa.DataType] = {
    "id": pa.int64(),
    "c_tinyint": pa.int64(),
    "c_tinyint_u": pa.int64(),
    "c_smallint": pa.int64(),
    "c_mediumint": pa.int64(),
    "c_int": pa.int64(),
    "c_int_u": pa.int64(),
    "c_bigint": pa.int64(),
    "c_bigint_u": pa.decimal128(20, 0),
    "c_float": pa.float64(),
    "c_double": pa.float64(),
    "c_decimal": pa.decimal128(20, 7),
    "c_date": pa.date32(),
    "c_datetime": pa.timestamp("us"),
    "c_timestamp": pa.timestamp("us", tz="UTC"),
    "c_time": pa.string(),
    "c_year": pa.int32(),
    "c_varchar": pa.string(),
    "c_char": pa.string(),
    "c_varbinary": pa.binary(),
    "c_binary": pa.binary(),
    "c_tinytext": pa.string(),
    "c_text": pa.string(),
    "c_mediumtext": pa.string(),
    "c_longtext": pa.string(),
    "c_tinyblob": pa.binary(),
    "c_blob": pa.binary(),
    "c_mediumblob": pa.binary(),
    "c_longblob": pa.binary(),
    "c_json": pa.string(),
    "c_enum": pa.string(),
    "c_set": pa.string(),
    "c_bit": pa.binary(),
    "c_null": pa.string(),
}


def test_expected_table_covers_the_shared_cases() -> None:
    assert set(EXPECTED_TYPES) == {name for name, *_ in ALL_TYPES}


@pytest.mark.parametrize("name,tp,flags", [(c[0], c[1], c[2]) for c in ALL_TYPES], ids=[c[0] for c in ALL_TYPES])
def test_arrow_type_of_each_shared_column(name: str, tp: int, flags: F) -> None:
    assert arrow_type_for(tp, flags, ALL_TYPES_PARAMS.get(name)) == EXPECTED_TYPES[name]
    field = arrow_field_for(name, tp, flags, ALL_TYPES_PARAMS.get(name))
    assert field.nullable and field.name == name


@pytest.mark.parametrize("row", [1, 2])
@pytest.mark.parametrize("case", ALL_TYPES, ids=[c[0] for c in ALL_TYPES])
def test_shared_values_round_trip_through_arrow(case: tuple, row: int) -> None:
    name, tp, flags, _mysql, v1, v2 = case
    value = v1 if row == 1 else v2
    params = ALL_TYPES_PARAMS.get(name)
    array = to_arrow_array([value], tp, flags, params)
    assert array.type == EXPECTED_TYPES[name]
    back = canonical_from_delta(array[0].as_py(), tp, flags, params)
    assert back == value


@pytest.mark.parametrize("tp", [T.TINYINT, T.SMALLINT, T.MEDIUMINT, T.INT, T.BIGINT])
@pytest.mark.parametrize("flags", [N, U, KEY])
def test_integer_widening_never_changes_the_delta_type(tp: int, flags: F) -> None:
    if tp == T.BIGINT and flags & F.UNSIGNED:
        assert arrow_type_for(tp, flags) == BIGINT_UNSIGNED_TYPE
    else:
        assert arrow_type_for(tp, flags) == pa.int64()


def test_bigint_unsigned_max_is_exact() -> None:
    v = convert_value(18446744073709551615, T.BIGINT, U)
    assert v == Decimal("18446744073709551615")
    arr = pa.array([v, convert_value(0, T.BIGINT, U)], BIGINT_UNSIGNED_TYPE)
    assert [canonical_from_delta(x, T.BIGINT, U) for x in arr.to_pylist()] == [18446744073709551615, 0]


@pytest.mark.parametrize("value", [18446744073709551616, -1])
def test_bigint_unsigned_out_of_range_is_refused(value: int) -> None:
    with pytest.raises(SinkError, match="BIGINT UNSIGNED"):
        convert_value(value, T.BIGINT, U)


@pytest.mark.parametrize("value", [1 << 63, -(1 << 63) - 1, 1.5, "x"])
def test_int64_out_of_range_or_not_an_integer_is_refused(value: object) -> None:
    with pytest.raises(SinkError, match="64-bit integer"):
        convert_value(value, T.BIGINT, N)


@pytest.mark.parametrize(
    "text,p,s",
    [
        ("-129012.1230000", 13, 7),
        ("-0.0000001", 10, 7),
        ("-99999999999999999999999999999999999.999", 38, 3),
        ("0", 5, 0),
        ("-0.50", 4, 2),
    ],
)
def test_negative_and_extreme_decimals_round_trip(text: str, p: int, s: int) -> None:
    params = TypeParams(precision=p, scale=s)
    arr = to_arrow_array([text], T.DECIMAL, N, params)
    assert arr.type == pa.decimal128(p, s)
    assert canonical_from_delta(arr[0].as_py(), T.DECIMAL, N, params) == text


def test_decimal_text_is_padded_to_the_scale() -> None:
    params = TypeParams(precision=10, scale=3)
    v = convert_value("1.5", T.DECIMAL, N, params)
    assert v == Decimal("1.500") and v.as_tuple().exponent == -3
    assert canonical_from_delta(v, T.DECIMAL, N, params) == "1.500"


@pytest.mark.parametrize(
    "text,match",
    [("1.2345", r"DECIMAL\(10,3\)"), ("123456789.1", r"DECIMAL\(10,3\)"), ("NaN", "DECIMAL"), ("abc", "DECIMAL")],
)
def test_decimal_that_would_lose_digits_is_refused(text: str, match: str) -> None:
    with pytest.raises(SinkError, match=match):
        convert_value(text, T.DECIMAL, N, TypeParams(precision=10, scale=3))


@pytest.mark.parametrize("params", [None, TypeParams(), TypeParams(precision=65, scale=30)])
def test_wide_or_unknown_decimal_is_exact_text(params: TypeParams | None) -> None:
    text = "12345678901234567890123456789012345.123456789012345678901234567890"
    assert arrow_type_for(T.DECIMAL, N, params) == pa.string()
    assert convert_value(text, T.DECIMAL, N, params) == text
    assert canonical_from_delta(text, T.DECIMAL, N, params) == text


def test_decimal_precision_alone_means_scale_zero() -> None:
    assert arrow_type_for(T.DECIMAL, N, TypeParams(precision=12)) == pa.decimal128(12, 0)


def test_impossible_decimal_parameters_are_refused() -> None:
    with pytest.raises(SinkError, match=r"invalid DECIMAL\(3,5\)"):
        arrow_type_for(T.DECIMAL, N, TypeParams(precision=3, scale=5))


def test_year_is_int32() -> None:
    arr = to_arrow_array([1970, 2155, 0, None], T.YEAR, N)
    assert arr.type == pa.int32() and arr.to_pylist() == [1970, 2155, 0, None]


def test_datetime_keeps_microseconds_and_has_no_zone() -> None:
    v = convert_value("2015-12-20 23:58:58.000123", T.DATETIME, N)
    assert v == datetime(2015, 12, 20, 23, 58, 58, 123) and v.tzinfo is None
    arr = pa.array([v], pa.timestamp("us"))
    assert canonical_from_delta(arr[0].as_py(), T.DATETIME, N) == "2015-12-20 23:58:58.000123"


@pytest.mark.parametrize(
    "stored,fsp,text",
    [
        (datetime(2020, 1, 2, 3, 4, 5, 120000), 2, "2020-01-02 03:04:05.12"),
        (datetime(2020, 1, 2, 3, 4, 5), 3, "2020-01-02 03:04:05.000"),
        (datetime(2020, 1, 2, 3, 4, 5, 1), 0, "2020-01-02 03:04:05"),
        (datetime(999, 1, 2, 3, 4, 5), None, "0999-01-02 03:04:05"),
    ],
)
def test_datetime_text_follows_the_fsp(stored: datetime, fsp: int | None, text: str) -> None:
    assert canonical_from_delta(stored, T.DATETIME, N, TypeParams(fsp=fsp)) == text


def test_timestamp_in_a_non_utc_source_zone_is_stored_as_utc() -> None:
    v = convert_value("2020-01-01 08:00:00.5", T.TIMESTAMP, N, tz="Asia/Shanghai")
    assert v == datetime(2020, 1, 1, 0, 0, 0, 500000, tzinfo=timezone.utc)
    arr = pa.array([v], pa.timestamp("us", tz="UTC"))
    assert arr.cast(pa.int64())[0].as_py() == 1577836800_500000
    assert canonical_from_delta(arr[0].as_py(), T.TIMESTAMP, N, tz="Asia/Shanghai") == "2020-01-01 08:00:00.500000"
    assert canonical_from_delta(arr[0].as_py(), T.TIMESTAMP, N) == "2020-01-01 00:00:00.500000"


def test_timestamp_dst_zone_and_fixed_offset() -> None:
    # New York in July is UTC-4, in January UTC-5.
    summer = convert_value("2021-07-01 12:00:00", T.TIMESTAMP, N, tz="America/New_York")
    winter = convert_value("2021-01-01 12:00:00", T.TIMESTAMP, N, tz="America/New_York")
    assert summer == datetime(2021, 7, 1, 16, tzinfo=timezone.utc)
    assert winter == datetime(2021, 1, 1, 17, tzinfo=timezone.utc)
    assert convert_value("2021-01-01 12:00:00", T.TIMESTAMP, N, tz="-05:30") == datetime(
        2021, 1, 1, 17, 30, tzinfo=timezone.utc
    )


def test_unknown_source_zone_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="Mars/Olympus"):
        source_zone("Mars/Olympus")


@pytest.mark.parametrize(
    "tp,text",
    [
        (T.DATE, "0000-00-00"),
        (T.DATE, "2020-00-15"),
        (T.DATE, "2020-01-00"),
        (T.DATETIME, "0000-00-00 00:00:00"),
        (T.TIMESTAMP, "0000-00-00 00:00:00"),
    ],
)
def test_zero_dates_become_null(tp: int, text: str) -> None:
    assert convert_value(text, tp, N) is None


def test_date_values() -> None:
    assert convert_value("9999-12-31", T.DATE, N) == date(9999, 12, 31)
    assert canonical_from_delta(date(1000, 1, 1), T.DATE, N) == "1000-01-01"


@pytest.mark.parametrize("tp,text", [(T.DATE, "2020-13-01"), (T.DATETIME, "yesterday"), (T.TIMESTAMP, 12)])
def test_invalid_temporal_values_are_refused(tp: int, text: object) -> None:
    with pytest.raises(SinkError, match="cannot write"):
        convert_value(text, tp, N)


def test_time_and_json_stay_text() -> None:
    assert convert_value("-838:59:59", T.TIME, N) == "-838:59:59"
    assert convert_value('{"a": [1, 2]}', T.JSON, N) == '{"a": [1, 2]}'


ENUM = TypeParams(members=("small", "medium", "large"))
SET = TypeParams(members=("a", "b", "c", "d"))


@pytest.mark.parametrize("value,label", [(1, "small"), (3, "large"), (0, ""), (4, "4"), ("medium", "medium")])
def test_enum_index_becomes_its_label(value: object, label: str) -> None:
    assert convert_value(value, T.ENUM, N, ENUM) == label


@pytest.mark.parametrize(
    "value,label", [(0b0101, "a,c"), (0, ""), (0b1111, "a,b,c,d"), (0b10000, "16"), ("b,d", "b,d")]
)
def test_set_mask_becomes_labels_in_definition_order(value: object, label: str) -> None:
    assert convert_value(value, T.SET, N, SET) == label


def test_enum_and_set_with_unknown_members_store_the_number() -> None:
    assert convert_value(2, T.ENUM, N) == "2"
    assert convert_value(5, T.SET, N) == "5"
    assert canonical_from_delta("2", T.ENUM, N) == 2
    assert canonical_from_delta("5", T.SET, N) == 5


def test_enum_and_set_labels_back_to_numbers() -> None:
    assert canonical_from_delta("large", T.ENUM, N, ENUM) == 3
    assert canonical_from_delta("a,c", T.SET, N, SET) == 0b0101
    assert canonical_from_delta("", T.SET, N, SET) == 0
    assert canonical_from_delta("a,c", T.SET, N, SET, enum_labels=True) == "a,c"
    with pytest.raises(SinkError, match="'huge' is not one of"):
        canonical_from_delta("huge", T.ENUM, N, ENUM)


@pytest.mark.parametrize(
    "value,stored",
    [
        (0b1010001, b"\x00" * 7 + b"\x51"),
        (0, b"\x00" * 8),
        (18446744073709551615, b"\xff" * 8),
        (b"\x01\x02", b"\x00" * 6 + b"\x01\x02"),
    ],
)
def test_bit_is_eight_bytes_big_endian(value: object, stored: bytes) -> None:
    v = convert_value(value, T.BIT, U)
    assert v == stored
    assert canonical_from_delta(v, T.BIT, U) == int.from_bytes(stored, "big")


@pytest.mark.parametrize("value", [1 << 64, -1, b"\x00" * 9])
def test_bit_wider_than_64_bits_is_refused(value: object) -> None:
    with pytest.raises(SinkError, match="BIT"):
        convert_value(value, T.BIT, U)


def test_text_and_binary_follow_the_binary_flag() -> None:
    assert arrow_type_for(T.BLOB, N) == pa.string()
    assert arrow_type_for(T.BLOB, B) == pa.binary()
    assert convert_value(bytearray(b"\x00\xff"), T.VARCHAR, B) == b"\x00\xff"
    assert convert_value("测试", T.VARCHAR, N) == "测试"
    with pytest.raises(SinkError, match="bytes"):
        convert_value("text", T.VARCHAR, B)
    with pytest.raises(SinkError, match="UTF-8"):
        convert_value(b"\xff", T.VARCHAR, N)


def test_null_type_is_an_all_null_string() -> None:
    arr = to_arrow_array([None, None], T.NULL, N)
    assert arr.type == pa.string() and arr.null_count == 2


def test_unknown_type_code_is_refused() -> None:
    with pytest.raises(SinkError, match="type code 99"):
        arrow_type_for(99, N)


# --- properties: model value → Arrow → model value is the identity --------------------------------------

SETTINGS = settings(max_examples=60, deadline=None)


def _through_arrow(value: object, tp: int, flags: F, params: TypeParams | None = None, tz: str = "UTC") -> object:
    array = to_arrow_array([value], tp, flags, params, tz)
    return canonical_from_delta(array[0].as_py(), tp, flags, params, tz)


@SETTINGS
@given(st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1))
def test_property_bigint(v: int) -> None:
    assert _through_arrow(v, T.BIGINT, N) == v


@SETTINGS
@given(st.integers(min_value=0, max_value=(1 << 64) - 1))
def test_property_bigint_unsigned_and_bit(v: int) -> None:
    assert _through_arrow(v, T.BIGINT, U) == v
    assert _through_arrow(v, T.BIT, U) == v


@st.composite
def decimal_texts(draw: st.DrawFn) -> tuple[str, TypeParams]:
    """A DECIMAL(p,s) value as TiDB prints it: exactly s fractional digits."""
    p = draw(st.integers(min_value=1, max_value=38))
    s = draw(st.integers(min_value=0, max_value=p))
    int_part = draw(st.integers(min_value=0, max_value=10 ** (p - s) - 1))
    frac = draw(st.integers(min_value=0, max_value=10**s - 1))
    negative = draw(st.booleans()) and (int_part or frac)
    text = ("-" if negative else "") + str(int_part) + (f".{frac:0{s}d}" if s else "")
    return text, TypeParams(precision=p, scale=s)


@SETTINGS
@given(decimal_texts())
def test_property_decimal(case: tuple[str, TypeParams]) -> None:
    text, params = case
    assert _through_arrow(text, T.DECIMAL, N, params) == text


@SETTINGS
@given(st.datetimes(min_value=datetime(1000, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59, 999999)))
def test_property_datetime(d: datetime) -> None:
    text = _format(d)
    assert _through_arrow(text, T.DATETIME, N, TypeParams(fsp=6)) == text


@SETTINGS
@given(
    st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2038, 1, 18)),
    st.sampled_from(["UTC", "+05:30", "-08:00", "Asia/Tokyo"]),
)
def test_property_timestamp(d: datetime, tz: str) -> None:
    text = _format(d)
    assert _through_arrow(text, T.TIMESTAMP, N, TypeParams(fsp=6), tz) == text


@SETTINGS
@given(st.integers(min_value=0, max_value=(1 << 4) - 1), st.integers(min_value=0, max_value=3))
def test_property_set_and_enum(mask: int, index: int) -> None:
    assert _through_arrow(mask, T.SET, N, SET) == mask
    assert _through_arrow(index, T.ENUM, N, ENUM) == index


def _format(d: datetime) -> str:
    return (
        f"{d.year:04d}-{d.month:02d}-{d.day:02d} {d.hour:02d}:{d.minute:02d}:{d.second:02d}.{d.microsecond:06d}"
    )


@pytest.mark.parametrize(("value", "float32", "text"), [
    (0.10000000149011612, True, "0.1"),
    (0.1, False, "0.1"),
    (0.10000000149011612, False, "0.10000000149011612"),
    (1e20, False, "100000000000000000000"),
    (1e-7, False, "0.0000001"),
    (-0.0, False, "-0"),
    (1.0, False, "1"),
    (-2.5, True, "-2.5"),
    (123456789.0, True, "123456790"),
    (3.4028234663852886e38, True, "340282350000000000000000000000000000000"),
    (1e-45, True, "0.000000000000000000000000000000000000000000001"),
])
def test_go_float_text(value: float, float32: bool, text: str) -> None:
    """TiDB's text of a FLOAT/DOUBLE: Go's FormatFloat(v, 'f', -1, 32|64)."""
    assert go_float_text(value, float32) == text


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False), st.booleans())
def test_go_float_text_reads_back_with_the_fewest_digits(value: float, float32: bool) -> None:
    import numpy

    if float32 and abs(value) > 3.4028234663852886e38:
        return  # (no single)
    number = numpy.float32(value) if float32 else value
    assert go_float_text(value, float32) == numpy.format_float_positional(number, unique=True, trim="-")


@pytest.mark.parametrize(("values", "kind", "how", "expected"), [
    # TIME text: half up on the signed duration (Go's Time.Round), carrying into the hours
    (["12:34:56.123456", "-00:00:00.5", "-12:00:00.449999", "99:59:59.95", None], pa.string(), Narrowing(fsp=0),
     ["12:34:56", "00:00:00", "-12:00:00", "100:00:00", None]),
    (["12:34:56.123556", "-01:00:00.0004"], pa.string(), Narrowing(fsp=3), ["12:34:56.124", "-01:00:00.000"]),
    # DATETIME / TIMESTAMP: the fraction half up, carrying into the seconds, the day, the year
    ([datetime(2024, 12, 31, 23, 59, 59, 995000), datetime(1969, 12, 31, 23, 59, 59, 500000), None],
     pa.timestamp("us"), Narrowing(fsp=2), [datetime(2025, 1, 1), datetime(1969, 12, 31, 23, 59, 59, 500000), None]),
    ([datetime(1969, 12, 31, 23, 59, 59, 500000)], pa.timestamp("us"), Narrowing(fsp=0), [datetime(1970, 1, 1)]),
    ([datetime(2024, 6, 30, 12, 0, 0, 499999, tzinfo=timezone.utc)], pa.timestamp("us", tz="UTC"),
     Narrowing(fsp=0), [datetime(2024, 6, 30, 12, 0, 0, tzinfo=timezone.utc)]),
    # DOUBLE -> FLOAT: the nearest single (a single stays as it is)
    ([0.1, 0.10000000149011612, -2.5, None], pa.float64(), Narrowing(float32=True),
     [0.10000000149011612, 0.10000000149011612, -2.5, None]),
])
def test_narrowed_rounds_as_tidb_does(values: list, kind: pa.DataType, how: Narrowing, expected: list) -> None:
    got = narrowed(pa.array(values, kind), how)
    assert got.type == kind and got.to_pylist() == expected


def test_narrowed_refuses_a_time_text_it_cannot_read() -> None:
    with pytest.raises(SinkError, match="cannot round the TIME value"):
        narrowed(pa.array(["noon"]), Narrowing(fsp=0))


def test_common_type_holds_the_values_of_both() -> None:
    """Avro carries no DDL: a retyped column's table holds values of the old type, new messages of the new."""
    from ticdc_delta.delta.arrow_types import common_type

    d = pa.decimal128
    assert common_type(pa.int64(), d(10, 2)) == d(21, 2)
    assert common_type(d(10, 2), pa.int64()) == d(21, 2)
    assert common_type(pa.int32(), d(10, 2)) == d(12, 2)
    assert common_type(d(10, 2), d(10, 4)) == d(12, 4)
    assert common_type(d(12, 4), d(10, 2)) == d(12, 4)  # the table's type holds the narrower one
    assert common_type(d(10, 2), d(12, 2)) == d(12, 2)
    assert common_type(pa.int32(), pa.int64()) == pa.int64()
    assert common_type(pa.int64(), pa.string()) == pa.string()
    assert common_type(d(38, 0), d(10, 4)) is None  # beyond 38 digits
    assert common_type(pa.int64(), pa.float64()) is None  # a double holds no int64 exactly
    assert common_type(pa.string(), pa.int64()) == pa.string()  # a text column takes the numbers as text
    assert common_type(pa.binary(), pa.string()) is None
