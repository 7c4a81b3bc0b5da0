"""Values no Delta column can hold are refused per change, deterministically, before any commit (issue 7);
MySQL's own odd values (zero dates, ALLOW_INVALID_DATES, TIME beyond 24 h) are not bad input."""

from __future__ import annotations

from datetime import date, datetime, timezone
from decimal import Decimal

import pyarrow as pa
import pytest

from ticdc_delta.codec.model import ColumnFlag as F, TypeCode as T
from ticdc_delta.core.batch_planner import OFFSET_ORDER, WATERMARK, ConsumerState, ResolvedMark, plan_batch
from ticdc_delta.core.merge import UPSERT, KeyResolver
from ticdc_delta.core.records import ChangeRecord, DDLRecord
from ticdc_delta.delta.applier import TableCatalog
from ticdc_delta.delta.arrow_types import TypeParams, arrow_type_for, convert_value
from ticdc_delta.delta.value_check import Rejection, ValueScreen, describe_rejections, value_bytes
from ticdc_delta.errors import PREVIEW_LIMIT, SinkError

KEY = int(F.HANDLE_KEY | F.PRIMARY_KEY)
N = int(F.NULLABLE)
U = int(F.UNSIGNED | F.NULLABLE)
B = int(F.BINARY | F.NULLABLE)


def change(offset: int, column: tuple, *, id_: int = 1, op: str = "insert", old: tuple | None = None,
           ts: int | None = 100, schema: str = "s", table: str = "t", partition: int = 0) -> ChangeRecord:
    new = (("id", int(T.BIGINT), KEY, id_), column)
    return ChangeRecord(ts, "cdc", partition, offset, 0, schema, table, op, new, old)


def screen_of(catalog: TableCatalog | None = None, tz: str = "UTC") -> ValueScreen:
    return ValueScreen(catalog or TableCatalog(), tz)


# --- one bad value per type the README maps --------------------------------------------------------

BAD_VALUES = [
    ("DATE month 13", ("d", int(T.DATE), N, "2024-13-45")),
    ("DATE day 32", ("d", int(T.DATE), N, "2024-01-32")),
    ("DATE not a date", ("d", int(T.DATE), N, "yesterday")),
    ("DATETIME hour 24", ("dt", int(T.DATETIME), N, "2024-01-01 24:00:00")),
    ("DATETIME month 13", ("dt", int(T.DATETIME), N, "2024-13-01 10:00:00")),
    ("DATETIME with zone", ("dt", int(T.DATETIME), N, "2024-01-01 10:00:00+08:00")),
    ("TIMESTAMP garbage", ("ts", int(T.TIMESTAMP), N, "2024-01-01 10:61:00")),
    ("INT beyond int64", ("i", int(T.BIGINT), N, 1 << 63)),
    ("INT as float above 2**64", ("i", int(T.BIGINT), N, 1.8446744073709552e19)),
    ("INT not a number", ("i", int(T.INT), N, "12x")),
    ("INT fractional Decimal", ("i", int(T.BIGINT), N, Decimal("1.5"))),
    ("BIGINT UNSIGNED fractional Decimal", ("u", int(T.BIGINT), U, Decimal("7.25"))),
    ("TINYINT 128", ("i", int(T.TINYINT), N, 128)),
    ("TINYINT UNSIGNED 256", ("i", int(T.TINYINT), U, 256)),
    ("TINYINT UNSIGNED negative", ("i", int(T.TINYINT), U, -1)),
    ("SMALLINT -32769", ("i", int(T.SMALLINT), N, -32769)),
    ("MEDIUMINT UNSIGNED 2**24", ("i", int(T.MEDIUMINT), U, 1 << 24)),
    ("INT 2**31", ("i", int(T.INT), N, 1 << 31)),
    ("INT UNSIGNED 2**32", ("i", int(T.INT), U, 1 << 32)),
    ("BIGINT UNSIGNED negative", ("u", int(T.BIGINT), U, -1)),
    ("BIGINT UNSIGNED beyond 2**64", ("u", int(T.BIGINT), U, 1 << 64)),
    ("YEAR 5 digits", ("y", int(T.YEAR), N, 12345)),
    ("FLOAT text", ("f", int(T.DOUBLE), N, "fast")),
    ("DECIMAL not a number", ("dec", int(T.DECIMAL), N, "12.3.4")),
    ("DECIMAL infinity", ("dec", int(T.DECIMAL), N, "Infinity")),
    ("BIT wider than 64", ("b", int(T.BIT), U, 1 << 64)),
    ("BIT 9 bytes", ("b", int(T.BIT), U, b"\x01" * 9)),
    ("ENUM float", ("e", int(T.ENUM), N, 1.5)),
    ("SET negative", ("st", int(T.SET), N, -1)),
    ("VARCHAR lone surrogate", ("v", int(T.VARCHAR), N, "a\ud800b")),
    ("JSON lone surrogate", ("j", int(T.JSON), N, '{"k": "\udfff"}')),
    ("ENUM label lone surrogate", ("e", int(T.ENUM), N, "\ud800")),
    ("TEXT invalid UTF-8 bytes", ("v", int(T.BLOB), N, b"\xff\xfe")),
    ("BLOB given as int", ("bl", int(T.BLOB), B, 7)),
    ("unknown type code", ("x", 99, N, 1)),
]


@pytest.mark.parametrize("what,column", BAD_VALUES, ids=[c[0] for c in BAD_VALUES])
def test_bad_value_is_refused_with_its_coordinates_table_column_and_value(what: str, column: tuple) -> None:
    sc = screen_of()
    good = change(3, ("other", int(T.INT), N, 5), id_=2)
    bad = change(4, column, id_=1)
    assert sc.rows([good, bad]) == [good]
    [r] = sc.rejections
    assert (r.topic, r.partition, r.offset, r.schema, r.table, r.column) == ("cdc", 0, 4, "s", "t", column[0])
    assert r.value == column[3] and r.record == bad
    assert "cannot write" in r.error or "type code" in r.error


def test_decimal_beyond_its_precision_or_scale_is_refused() -> None:
    catalog = TableCatalog()
    catalog.set_params("s", "t", "dec", TypeParams(5, 2))
    sc = screen_of(catalog)
    ok = change(0, ("dec", int(T.DECIMAL), N, "123.45"), id_=1)
    too_big = change(1, ("dec", int(T.DECIMAL), N, "1234.50"), id_=2)
    too_fine = change(2, ("dec", int(T.DECIMAL), N, "1.234"), id_=3)
    junk = change(3, ("dec", int(T.DECIMAL), N, "NaN"), id_=4)
    assert sc.rows([ok, too_big, too_fine, junk]) == [ok]
    assert [r.offset for r in sc.rejections] == [1, 2, 3]
    assert "DECIMAL(5,2)" in sc.rejections[0].error


def test_old_image_values_are_checked_too() -> None:
    sc = screen_of()
    rec = change(0, ("d", int(T.DATE), N, "2024-01-01"), op="update",
                 old=(("id", int(T.BIGINT), KEY, 1), ("d", int(T.DATE), N, "2024-99-01")))
    assert sc.rows([rec]) == []
    assert sc.rejections[0].value == "2024-99-01"


@pytest.mark.parametrize("name,problem", [("a\x00b", "NUL"), ("", "empty"), ("x\ud800", "surrogate")])
def test_column_name_no_delta_column_can_have_is_refused(name: str, problem: str) -> None:
    sc = screen_of()
    assert sc.rows([change(0, (name, int(T.INT), N, 1))]) == []
    [r] = sc.rejections
    assert r.column == name and problem in r.error


def test_table_problem_refuses_every_change_of_the_table() -> None:
    sc = ValueScreen(TableCatalog(), table_problem=lambda s, t: "no location" if t == "bad" else None)
    ok = change(0, ("a", int(T.INT), N, 1))
    bad = change(1, ("a", int(T.INT), N, 1), table="bad")
    assert sc.rows([ok, bad]) == [ok]
    assert sc.rejections[0].column is None and sc.rejections[0].error == "no location"


# --- MySQL's own odd values are written, each with its mapping ------------------------------------

ODD_VALUES = [
    (int(T.DATE), "0000-00-00", None),
    (int(T.DATE), "2024-00-10", None),
    (int(T.DATE), "2024-10-00", None),
    (int(T.DATE), "2024-02-30", None),  # ALLOW_INVALID_DATES
    (int(T.DATE), "2023-02-29", None),
    (int(T.DATE), "2024-04-31", None),
    (int(T.DATE), "2024-02-29", date(2024, 2, 29)),
    (int(T.DATE), "0001-01-01", date(1, 1, 1)),
    (int(T.DATETIME), "0000-00-00 00:00:00", None),
    (int(T.DATETIME), "2024-02-30 10:11:12", None),
    (int(T.DATETIME), "2024-02-30 10:11:12.123456", None),
    (int(T.DATETIME), "2024-01-01 10:11:12.5", datetime(2024, 1, 1, 10, 11, 12, 500000)),
    (int(T.DATETIME), "9999-12-31 23:59:59.999999", datetime(9999, 12, 31, 23, 59, 59, 999999)),
    (int(T.TIMESTAMP), "0000-00-00 00:00:00", None),
    (int(T.TIMESTAMP), "2024-02-30 00:00:00", None),
    (int(T.TIMESTAMP), "1970-01-01 00:00:01.000001",
     datetime(1970, 1, 1, 0, 0, 1, 1, tzinfo=timezone.utc)),
    (int(T.TIME), "838:59:59", "838:59:59"),
    (int(T.TIME), "-838:59:59", "-838:59:59"),
    (int(T.TIME), "-12:00:00", "-12:00:00"),
    (int(T.TIME), "100:00:00.500000", "100:00:00.500000"),
    (int(T.YEAR), 0, 0),
    (int(T.YEAR), 2155, 2155),
    (int(T.VARCHAR), "a\x00b", "a\x00b"),
    (int(T.JSON), '{"k": "\\ud800"}', '{"k": "\\ud800"}'),  # an escaped surrogate is valid JSON text
    (int(T.ENUM), 0, "0"),  # members unknown: the number as text
    (int(T.ENUM), 7, "7"),
    (int(T.TINYINT), -128, -128),
    (int(T.INT), 2147483647, 2147483647),
    (int(T.MEDIUMINT), -8388608, -8388608),
]


@pytest.mark.parametrize("type_code,value,expected", ODD_VALUES)
def test_mysql_odd_values_are_not_bad_input(type_code: int, value: object, expected: object) -> None:
    sc = screen_of()
    rec = change(0, ("c", type_code, N, value))
    assert sc.rows([rec]) == [rec] and sc.rejections == []
    if type_code in (int(T.TINYINT), int(T.INT)):  # and the unsigned range
        unsigned = change(1, ("u", type_code, U, (1 << (8 if type_code == int(T.TINYINT) else 32)) - 1))
        assert sc.rows([unsigned]) == [unsigned]
    assert convert_value(value, type_code, N) == expected
    pa.array([convert_value(value, type_code, N)], type=arrow_type_for(type_code, N))  # writable


def test_enum_and_set_numbers_outside_known_members_are_stored_as_text() -> None:
    catalog = TableCatalog()
    catalog.set_params("s", "t", "e", TypeParams(members=("a", "b")))
    sc = screen_of(catalog)
    recs = [change(0, ("e", int(T.ENUM), N, 5)), change(1, ("e", int(T.SET), N, 1 << 40), id_=2)]
    assert sc.rows(recs) == recs
    assert convert_value(5, T.ENUM, N, TypeParams(members=("a", "b"))) == "5"


# --- the rule for the rest of the key, in the planner ---------------------------------------------


def _final_values(plan) -> dict:
    [step] = plan.steps
    tc = step.tables[("s", "t")]
    return {k: (c.kind, dict((n, v) for n, _, _, v in c.image)) for k, c in tc.changes.items()}


@pytest.mark.parametrize("mode", [OFFSET_ORDER, WATERMARK])
def test_a_refused_change_is_dropped_and_the_key_keeps_its_other_changes_in_order(mode: str) -> None:
    d = ("d", int(T.DATE), N)
    records = [
        change(0, (*d, "2024-01-01"), id_=1, ts=10),
        change(1, (*d, "2024-13-45"), id_=1, op="update", ts=11),  # refused: id 1 stays at 2024-01-01
        change(2, (*d, "2024-01-02"), id_=2, ts=12),
        change(3, (*d, "2024-99-99"), id_=2, op="update", ts=13),  # refused
        change(4, (*d, "2024-01-04"), id_=2, op="update", ts=14),  # applies after the refused one
        change(5, (*d, "bad"), id_=3, ts=15),  # refused: id 3 never appears
    ]
    sc = screen_of()
    resolved = [ResolvedMark("cdc", 0, 6, 0, 20)]
    plan = plan_batch(ConsumerState(), records, resolved, mode=mode, keys=KeyResolver(),
                      partitions={"cdc": [0]}, screen=sc)
    finals = _final_values(plan)
    assert finals == {(1,): (UPSERT, {"id": 1, "d": "2024-01-01"}), (2,): (UPSERT, {"id": 2, "d": "2024-01-04"})}
    assert [r.offset for r in sc.rejections] == [1, 3, 5]
    # deterministic: a re-run of the batch refuses exactly the same changes
    sc2 = screen_of()
    plan_batch(ConsumerState(), records, resolved, mode=mode, keys=KeyResolver(), partitions={"cdc": [0]},
               screen=sc2)
    assert sc2.rejections == sc.rejections


def test_held_rows_are_screened_when_released_not_when_they_arrive() -> None:
    sc = screen_of()
    bad = change(0, ("d", int(T.DATE), N, "2024-13-45"), ts=50)
    plan = plan_batch(ConsumerState(), [bad], [ResolvedMark("cdc", 0, 1, 0, 10)], mode=WATERMARK,
                      keys=KeyResolver(), partitions={"cdc": [0]}, screen=sc)
    assert plan.held == 1 and sc.rejections == []
    sc2 = screen_of()
    plan2 = plan_batch(plan.state, [], [ResolvedMark("cdc", 0, 2, 0, 60)], mode=WATERMARK,
                       keys=KeyResolver(), partitions={"cdc": [0]}, screen=sc2)
    assert plan2.held == 0 and plan2.steps == [] and [r.offset for r in sc2.rejections] == [0]


def test_decimal_follows_the_parameters_a_ddl_of_the_batch_gives() -> None:
    catalog = TableCatalog()
    catalog.set_params("s", "t", "dec", TypeParams(5, 2))
    sc = screen_of(catalog)
    before = change(0, ("dec", int(T.DECIMAL), N, "1234.567"), id_=1, ts=10)
    alter = DDLRecord(11, "cdc", 0, 1, 0, "s", "t", "ALTER TABLE t MODIFY dec DECIMAL(10,3)", None)
    after = change(2, ("dec", int(T.DECIMAL), N, "1234.567"), id_=2, ts=12)
    garbage = change(3, ("dec", int(T.DECIMAL), N, "x"), id_=3, ts=13)
    plan = plan_batch(ConsumerState(), [before, alter, after, garbage], [ResolvedMark("cdc", 0, 4, 0, 20)],
                      mode=WATERMARK, keys=KeyResolver(), partitions={"cdc": [0]}, screen=sc)
    assert [r.offset for r in sc.rejections] == [0, 3]
    # the refused row before the DDL leaves no rows step before it
    assert isinstance(plan.steps[0], DDLRecord) and list(plan.steps[1].tables[("s", "t")].changes) == [(2,)]
    assert catalog.params("s", "t", "dec") == TypeParams(5, 2)  # the job's catalog is not touched


def test_create_table_in_the_same_batch_types_its_first_rows() -> None:
    sc = screen_of()
    create = DDLRecord(10, "cdc", 0, 0, 0, "S", "U", "CREATE TABLE `U` (`id` INT PRIMARY KEY, `amt` DECIMAL(5,2))",
                       None)
    rows = [change(1, ("amt", int(T.DECIMAL), N, "1234.567"), table="u", ts=11),
            change(2, ("amt", int(T.DECIMAL), N, "12.5"), id_=2, table="u", ts=12)]
    plan_batch(ConsumerState(), [create, *rows], [], mode=OFFSET_ORDER, keys=KeyResolver(), screen=sc)
    assert [(r.offset, r.column) for r in sc.rejections] == [(1, "amt")]
    assert "DECIMAL(5,2)" in sc.rejections[0].error


@pytest.mark.parametrize("policy,rejected", [("evolve", [1]), ("ignore", [])])
def test_a_ddl_the_policy_ignores_changes_no_parameters(policy: str, rejected: list[int]) -> None:
    sc = ValueScreen(TableCatalog(), ddl_policy=lambda cls: policy)
    create = DDLRecord(10, "cdc", 0, 0, 0, "s", "t", "CREATE TABLE t (id INT PRIMARY KEY, amt DECIMAL(3,0))", None)
    plan_batch(ConsumerState(), [create, change(1, ("amt", int(T.DECIMAL), N, "12345"))], [], mode=OFFSET_ORDER,
               keys=KeyResolver(), screen=sc)
    assert [r.offset for r in sc.rejections] == rejected


def test_after_a_ddl_it_cannot_follow_decimals_are_checked_only_as_numbers() -> None:
    catalog = TableCatalog()
    catalog.set_params("s", "t", "dec", TypeParams(3, 0))
    sc = screen_of(catalog)
    sc.ddl(DDLRecord(10, "cdc", 0, 0, 0, "s", "", "DROP DATABASE s", None))
    ok = change(1, ("dec", int(T.DECIMAL), N, "12345"))
    assert sc.rows([ok, change(2, ("dec", int(T.DECIMAL), N, "1e"), id_=2)]) == [ok]
    assert [r.offset for r in sc.rejections] == [2]


# --- error messages quote at most a preview; the dead-letter bytes are whole ------------------------


def test_errors_quote_a_capped_preview_and_dead_letter_bytes_are_whole() -> None:
    huge = "9" * 5_000_000 + "x"
    with pytest.raises(SinkError) as info:
        convert_value(huge, T.INT, N)
    assert len(str(info.value)) < 3 * PREVIEW_LIMIT and "(5000001 bytes)" in str(info.value)
    sc = screen_of()
    sc.rows([change(0, ("i", int(T.INT), N, huge))])
    [r] = sc.rejections
    assert len(r.error) < 3 * PREVIEW_LIMIT and len(describe_rejections([r] * 10)) < 20 * PREVIEW_LIMIT
    assert value_bytes(r.value) == huge.encode()
    assert value_bytes("\ud800") == b"\xed\xa0\x80" and value_bytes(b"\x00\xff") == b"\x00\xff"
    assert value_bytes(Decimal("1.5")) == b"1.5"


def test_describe_rejections_names_coordinates_table_column() -> None:
    r = Rejection("cdc", 2, 41, 0, "shop", "orders", "d", "2024-13-45", "cannot write '2024-13-45' as a DATE")
    text = describe_rejections([r])
    assert text == "cdc[2]@41 table 'shop'.'orders' column 'd': cannot write '2024-13-45' as a DATE"


# --- per protocol: the decoders carry MySQL's odd values to the same mapping ------------------------

PROTOCOL_OPTIONS = [
    ("open-protocol", {}),
    ("craft", {}),
    ("canal-json", {"enable-tidb-extension": "true"}),
    ("avro", {"enable-tidb-extension": "true"}),
]

ODD_ROW = [  # (name, type code, value as TiDB prints it, Delta value)
    ("d_zero", int(T.DATE), "0000-00-00", None),
    ("d_part", int(T.DATE), "2024-00-10", None),
    ("d_invalid", int(T.DATE), "2024-02-30", None),
    ("dt_zero", int(T.DATETIME), "0000-00-00 00:00:00", None),
    ("dt_invalid", int(T.DATETIME), "2024-02-30 10:00:00.123456", None),
    ("dt_frac", int(T.DATETIME), "2024-01-01 10:00:00.123456", datetime(2024, 1, 1, 10, 0, 0, 123456)),
    ("ts_zero", int(T.TIMESTAMP), "0000-00-00 00:00:00", None),
    ("tm_big", int(T.TIME), "838:59:59", "838:59:59"),
    ("tm_neg", int(T.TIME), "-12:00:00", "-12:00:00"),
    ("tm_frac", int(T.TIME), "100:00:00.500000", "100:00:00.500000"),
    ("y_zero", int(T.YEAR), 0, 0),
]


@pytest.mark.parametrize("protocol,options", PROTOCOL_OPTIONS, ids=[p for p, _ in PROTOCOL_OPTIONS])
def test_each_protocol_carries_odd_values_to_their_mapping_and_bad_ones_to_a_rejection(
    protocol: str, options: dict[str, str]
) -> None:
    from ticdc_delta.codec import decoder_for, encoder_for
    from ticdc_delta.codec.model import Column, DecodeContext, Op, RowChange
    from ticdc_delta.core.records import record_from_event

    def event(id_: int, extra: list[tuple[str, int, object]]) -> RowChange:
        cols = [Column("id", int(T.BIGINT), F.HANDLE_KEY | F.PRIMARY_KEY, id_)]
        cols += [Column(n, t, F.NULLABLE, v) for n, t, v in extra]
        return RowChange(1 << 30, "s", "t", Op.INSERT, tuple(cols), None)

    odd = event(1, [(n, t, v) for n, t, v, _ in ODD_ROW])
    bad = event(2, [("d_bad", int(T.DATE), "2024-13-45")])
    kwargs: dict = {}
    if protocol == "avro":
        from ticdc_delta.codec.avro import AvroSchemas

        kwargs["schemas"] = AvroSchemas()
    messages = encoder_for(protocol, options, **kwargs).encode([odd, bad])
    decoder = decoder_for(protocol, options, **kwargs)
    records = []
    for offset, (key, value) in enumerate(messages):
        for idx, ev in enumerate(decoder.decode(key, value, DecodeContext("cdc", 0, offset))):
            records.append(record_from_event(ev, "cdc", 0, offset, idx))
    sc = screen_of()
    kept = sc.rows(records)
    assert [r.value for r in sc.rejections] == ["2024-13-45"] and sc.rejections[0].column == "d_bad"
    [rec] = kept
    got = {name: convert_value(v, tc, flags) for name, tc, flags, v in rec.new if name != "id"}
    assert got == {n: expected for n, _, _, expected in ODD_ROW}


def test_a_value_that_reaches_the_merge_unscreened_names_its_table_and_column(tmp_path) -> None:
    from ticdc_delta.core.merge import collapse
    from ticdc_delta.core.batch_planner import RowsStep
    from ticdc_delta.delta.applier import DeltaApplier
    from ticdc_delta.delta.sink import DeltaRsSink

    catalog = TableCatalog()
    catalog.set_params("s", "t", "amt", TypeParams(5, 2))
    applier = DeltaApplier(DeltaRsSink(str(tmp_path)), "cf", catalog=catalog)
    step = RowsStep(collapse([change(0, ("amt", int(T.DECIMAL), N, "1234.567"))], KeyResolver()))
    with pytest.raises(SinkError, match=r"table s\.t column 'amt': cannot write '1234.567' as DECIMAL\(5,2\)"):
        applier.apply([step], 0)


def test_canal_json_column_name_with_nul_decodes_and_is_refused() -> None:
    from ticdc_delta.codec import decoder_for
    from ticdc_delta.codec.model import DecodeContext
    from ticdc_delta.core.records import record_from_event

    msg = ('{"id":0,"database":"shop","table":"t","pkNames":["id"],"isDdl":false,"type":"INSERT","es":1,"ts":1,'
           '"sql":"","sqlType":{"id":4,"n\\u0000x":12},"mysqlType":{"id":"int","n\\u0000x":"varchar"},'
           '"data":[{"id":"1","n\\u0000x":"v"}],"old":null}')
    [ev] = decoder_for("canal-json", {}).decode(None, msg.encode(), DecodeContext("cdc", 0, 5))
    sc = screen_of()
    assert sc.rows([record_from_event(ev, "cdc", 0, 5, 0)]) == []
    [r] = sc.rejections
    assert (r.offset, r.column) == (5, "n\x00x") and "NUL" in r.error


def test_value_the_existing_delta_column_cannot_take_is_refused_and_the_rest_merges(tmp_path) -> None:
    """A table keeps its BIGINT column when MODIFY COLUMN ... DOUBLE was ignored (int64 -> double is not a
    widening the applier makes): a fractional value would fail the MERGE's cast on every re-run."""
    from ticdc_delta.core.batch_planner import RowsStep
    from ticdc_delta.core.merge import collapse
    from ticdc_delta.delta.applier import DeltaApplier
    from ticdc_delta.delta.sink import DeltaRsSink, TableIdent

    sink = DeltaRsSink(str(tmp_path))
    applier = DeltaApplier(sink, "cf")
    applier.apply([RowsStep(collapse([change(0, ("a", int(T.INT), N, 1))], KeyResolver()))], 0)

    def delta_type(schema: str, table: str, column: str):
        found = sink.table_schema(TableIdent(schema, table))
        return None if found is None else {f.name: f.type for f in found}.get(column)

    text = [change(1, ("a", int(T.DOUBLE), N, 123.0), id_=2), change(2, ("a", int(T.DOUBLE), N, 1.5), id_=3)]
    with pytest.raises(SinkError, match="does not fit"):  # what the screen prevents
        DeltaApplier(sink, "cf").apply([RowsStep(collapse(text, KeyResolver()))], 1)
    sc = ValueScreen(TableCatalog(), delta_type=delta_type)
    kept = sc.rows(text)
    assert [r.offset for r in kept] == [1]
    [r] = sc.rejections
    assert (r.offset, r.column, r.value) == (2, "a", 1.5) and "int64 column" in r.error
    DeltaApplier(sink, "cf").apply([RowsStep(collapse(kept, KeyResolver()))], 2)
    from deltalake import DeltaTable

    rows = {x["id"]: x["a"] for x in DeltaTable(sink.table_path("s", "t")).to_pyarrow_table().to_pylist()}
    assert rows == {1: 1, 2: 123}


def test_a_column_with_two_types_in_the_batch_is_not_checked_against_the_table() -> None:
    """The applier types a new column by its first image; a re-run after a crash would see that type in
    the table, so the first attempt must not decide by the table either."""
    sc = ValueScreen(TableCatalog(), delta_type=lambda s, t, c: pa.int64())
    recs = [change(0, ("a", int(T.DOUBLE), N, 1.5)), change(1, ("a", int(T.DECIMAL), N, "2.5"), id_=2)]
    assert sc.rows(recs) == recs
    sc = ValueScreen(TableCatalog(), delta_type=lambda s, t, c: pa.int64())
    assert sc.rows(recs[:1]) == [] and sc.rejections[0].value == 1.5


def test_a_column_the_applier_widens_is_not_checked_against_the_old_type() -> None:
    sc = ValueScreen(TableCatalog(), delta_type=lambda s, t, c: pa.int64())
    rec = change(0, ("a", int(T.VARCHAR), N, "abc"))  # int64 -> string: the applier rewrites the column
    assert sc.rows([rec]) == [rec]


def test_an_avro_column_retyped_without_a_widening_takes_the_values_of_both_types(tmp_path) -> None:
    """Avro carries no DDL: ``MODIFY n DECIMAL(10,2)`` of an INT column shows only in new schema versions.
    The table held int64 and its fractional values were dead-lettered for good ("does not fit the int64
    column"); the applier now widens the column to a decimal holding both, ``decimal(21,2)``."""
    from deltalake import DeltaTable

    from ticdc_delta.core.batch_planner import RowsStep
    from ticdc_delta.core.merge import collapse
    from ticdc_delta.delta.applier import DeltaApplier
    from ticdc_delta.delta.sink import DeltaRsSink, TableIdent

    sink = DeltaRsSink(str(tmp_path))
    DeltaApplier(sink, "cf").apply([RowsStep(collapse([change(0, ("n", int(T.INT), N, 7))], KeyResolver()))], 0)
    catalog = TableCatalog()
    catalog.set_params("s", "t", "n", TypeParams(10, 2))

    def delta_type(schema: str, table: str, column: str):
        found = sink.table_schema(TableIdent(schema, table))
        return None if found is None else {f.name: f.type for f in found}.get(column)

    recs = [change(1, ("n", int(T.DECIMAL), N, "5.25"), id_=2), change(2, ("n", int(T.DECIMAL), N, "12345678.99"), id_=3)]
    sc = ValueScreen(catalog, delta_type=delta_type)
    assert sc.rows(recs) == recs and sc.rejections == []
    applier = DeltaApplier(sink, "cf")
    applier.catalog.set_params("s", "t", "n", TypeParams(10, 2))
    applier.apply([RowsStep(collapse(recs, KeyResolver()))], 1)
    table = DeltaTable(sink.table_path("s", "t")).to_pyarrow_table()
    assert table.schema.field("n").type == pa.decimal128(21, 2)
    assert {r["id"]: r["n"] for r in table.to_pylist()} == {1: Decimal("7.00"), 2: Decimal("5.25"),
                                                           3: Decimal("12345678.99")}


@pytest.mark.parametrize("protocol,options", PROTOCOL_OPTIONS[:3], ids=[p for p, _ in PROTOCOL_OPTIONS[:3]])
def test_the_simulated_changefeed_has_nothing_to_refuse(protocol: str, options: dict[str, str]) -> None:
    """No false refusals: every value a (simulated) TiDB stores, of every column type it generates, passes."""
    from ticdc_delta.codec import decoder_for
    from ticdc_delta.codec.model import DecodeContext
    from ticdc_delta.core.records import record_from_event
    from ticdc_delta.simulator import simulate
    from ticdc_delta.simulator.output import MemorySink

    sink = MemorySink()
    simulate(protocol, options, seed=11, events=1500, tables=4, partitions=1, sink=sink)
    decoder = decoder_for(protocol, options)
    sc = screen_of()
    rows = 0
    for offset, (_, key, value) in enumerate(sink.messages):
        for idx, ev in enumerate(decoder.decode(key, value, DecodeContext("cdc", 0, offset))):
            if ev.kind == "ddl":
                sc.ddl(record_from_event(ev, "cdc", 0, offset, idx))
            elif ev.kind == "row":
                rows += len(sc.rows([record_from_event(ev, "cdc", 0, offset, idx)]))
    assert sc.rejections == [] and rows > 1000


def test_a_merge_cast_error_quotes_a_capped_value(tmp_path) -> None:
    from ticdc_delta.delta.sink import OP_COLUMN, DeltaRsSink, TableIdent, batch_txn

    sink = DeltaRsSink(str(tmp_path))
    ident = TableIdent("s", "t")
    sink.ensure_table(ident, pa.schema([("id", pa.int64()), ("a", pa.int64())]), [], batch_txn("cf", 0))
    huge = "9" * 1_000_000 + "x"
    changes = pa.table({"id": [1], "a": [huge], OP_COLUMN: ["u"]})
    with pytest.raises(SinkError, match="does not fit") as info:
        sink.merge(ident, changes, ["id"], batch_txn("cf", 1))
    assert len(str(info.value)) < 1000 and "characters)" in str(info.value)


# --- the columnar path's converter: the screen's decision, the MERGE's values ------------------------

_GOOD = [("DATE", ("d", int(T.DATE), N, "2024-02-29")), ("zero DATE", ("d", int(T.DATE), N, "0000-00-00")),
         ("DECIMAL text", ("dec", int(T.DECIMAL), N, "12.50")), ("TINYINT", ("i", int(T.TINYINT), N, -128)),
         ("BIT", ("b", int(T.BIT), U, 5)), ("TIME", ("tm", int(T.TIME), N, "838:59:59")),
         ("NULL", ("v", int(T.VARCHAR), N, None))]


@pytest.mark.parametrize("what,column", [*BAD_VALUES, *_GOOD], ids=[c[0] for c in [*BAD_VALUES, *_GOOD]])
def test_images_converter_refuses_what_the_screen_refuses_and_converts_as_the_merge(what: str, column: tuple) -> None:
    rec = change(0, column)
    columns = tuple(c[:3] for c in rec.new)
    types = [arrow_type_for(c[1], c[2]) if c[1] in set(T) else pa.string() for c in columns]
    refused = screen_of().check(rec)
    convert = screen_of().images_converter("s", "t", columns, types)
    values = tuple(c[3] for c in rec.new)
    # the image, an image of the first columns (an Avro delete: the key), one with a null
    arrays, failed = convert([values, values[:1], (2, None)])
    assert [a.type for a in arrays] == types
    assert set(failed) == ({0} if refused is not None else set())
    rows = [[a[i].as_py() for a in arrays] for i in range(3)]
    if refused is None:
        expected = [None if c[3] is None else convert_value(c[3], c[1], c[2]) for c in rec.new]
        assert rows[0] == [pa.array([v], type=t)[0].as_py() for v, t in zip(expected, types)]
    assert rows[1:] == [[1, None], [2, None]]


def test_images_converter_refuses_a_column_name_or_a_table_no_location_can_hold() -> None:
    columns = (("id", int(T.BIGINT), KEY), ("a\x00b", int(T.INT), N))
    convert = screen_of().images_converter("s", "t", columns, [pa.int64(), pa.int64()])
    arrays, failed = convert([(1,), (2, None)])
    assert set(failed) == {1}  # the column itself, whatever its value; an image that stops before it is fine
    assert arrays[0][0].as_py() == 1 and arrays[1][0].as_py() is None
    problem = ValueScreen(TableCatalog(), table_problem=lambda s, t: "no location")
    assert set(problem.images_converter("s", "t", columns[:1], [pa.int64()])([(1,), (2,)])[1]) == {0, 1}


# --- a zero or invalid date in a key column -------------------------------------------------------

ZERO_KEYS = [("zero DATE", int(T.DATE), "0000-00-00"), ("partly-zero DATE", int(T.DATE), "2020-00-15"),
             ("ALLOW_INVALID_DATES DATE", int(T.DATE), "2024-02-30"),
             ("zero DATETIME", int(T.DATETIME), "0000-00-00 00:00:00"),
             ("zero TIMESTAMP", int(T.TIMESTAMP), "0000-00-00 00:00:00")]


@pytest.mark.parametrize("what,type_code,value", ZERO_KEYS, ids=[z[0] for z in ZERO_KEYS])
def test_a_key_column_date_the_table_would_hold_as_null_is_refused(what: str, type_code: int, value: str) -> None:
    """Written as null, distinct upstream keys (0000-00-00, 2020-00-15) would be one key: the second
    insert replaced the first, one delete removed both. Outside a key the value is still null."""
    def keyed(offset: int, day: str, flags: int, op: str = "insert") -> ChangeRecord:
        new = (("d", type_code, flags, day), ("n", int(T.VARCHAR), N, f"row {offset}"))
        return ChangeRecord(100, "cdc", 0, offset, 0, "s", "t", op, new, None)

    sc = screen_of()
    good = keyed(1, "2024-01-01" + value[10:], KEY)
    kept = sc.rows([keyed(0, value, KEY), good, keyed(2, value, int(F.UNIQUE_KEY)), keyed(3, value, KEY, "delete")])
    assert kept == [good]  # a NOT NULL unique key's value too: it may be the key TiCDC hands the handle
    assert [(r.offset, r.column, r.value) for r in sc.rejections] == [(0, "d", value), (2, "d", value), (3, "d", value)]
    assert "key column" in sc.rejections[0].error and "null" in sc.rejections[0].error
    # a nullable unique key is no merge key (flagged_key): its zero date is null, as in any other column
    nullable = keyed(4, value, int(F.UNIQUE_KEY | F.NULLABLE))
    assert screen_of().rows([nullable]) == [nullable]
    # the columnar path's converter refuses the same images
    columns = (("d", type_code, KEY), ("n", int(T.VARCHAR), N))
    types = [arrow_type_for(type_code, KEY), pa.string()]
    arrays, failed = screen_of().images_converter("s", "t", columns, types)(
        [(value, "a"), ("2024-01-01" + value[10:], "b"), (value,)])
    assert set(failed) == {0, 2} and "key column" in str(failed[0])
    assert arrays[0][1].as_py() is not None
