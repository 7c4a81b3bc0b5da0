"""DDL replay on real Delta tables (no Spark): each class under evolve / ignore / fail."""

from __future__ import annotations

from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

from ticdc_delta.core.batch_planner import RowsStep
from ticdc_delta.core.merge import KeyResolver, collapse
from ticdc_delta.core.records import ChangeRecord, DDLRecord
from ticdc_delta.core.snapshot_seam import SnapshotSeam
from ticdc_delta.delta.applier import DeltaApplier, TableOptions
from ticdc_delta.delta.arrow_types import TypeParams, widens
from ticdc_delta.delta.ddl_replay import DDLReplayer, ddl_tables, default_value
from ticdc_delta.delta.sink import DeltaRsSink, TableIdent
from ticdc_delta.errors import DDLPolicyError
from ticdc_delta.schema.ddl import parse_ddl

pytestmark = pytest.mark.integration

EVOLVE = SimpleNamespace(drop_table="evolve", drop_database="evolve", unknown="fail")
KEY = 0x0A


class Harness:
    def __init__(self, root: str, policies: Any = EVOLVE) -> None:
        self.sink = DeltaRsSink(root)
        self.applier = DeltaApplier(self.sink, "t", ddl_handler=DDLReplayer(policies))
        self.batch = 0
        self.ts = 1000 << 18

    def ddl(self, query: str, schema: str = "s", table: str = "t") -> None:
        self.applier.apply([self.ddl_step(query, schema, table)], self._next())

    def rows(self, *images: dict[str, Any], table: str = "t", types: dict[str, int] | None = None) -> None:
        self.applier.apply([self.rows_step(*images, table=table, types=types)], self._next())

    def ddl_step(self, query: str, schema: str = "s", table: str = "t") -> DDLRecord:
        self.ts += 1 << 18
        return DDLRecord(self.ts, "x", 0, 0, 0, schema, table, query, None)

    def rows_step(self, *images: dict[str, Any], table: str = "t", types: dict[str, int] | None = None) -> RowsStep:
        recs = []
        for i, img in enumerate(images):
            self.ts += 1 << 18
            cols = tuple((k, (types or {}).get(k, 8), KEY if k == "id" else 0, v) for k, v in img.items())
            recs.append(ChangeRecord(self.ts, "x", 0, i, 0, "s", table, "insert", cols, None))
        return RowsStep(collapse(recs, KeyResolver()))

    def _next(self) -> int:
        self.batch += 1
        return self.batch

    def read(self, table: str = "t") -> list[dict[str, Any]]:
        return sorted(self.sink.read(TableIdent("s", table)).to_pylist(), key=lambda r: str(r.get("id")))

    def schema(self, table: str = "t") -> pa.Schema | None:
        return self.sink.table_schema(TableIdent("s", table))


@pytest.fixture
def h(tmp_path: Any) -> Harness:
    h = Harness(str(tmp_path))
    h.ddl("CREATE TABLE `s`.`t` (`id` BIGINT NOT NULL, `a` VARCHAR(10), `d` DECIMAL(6,2), PRIMARY KEY (`id`))")
    h.rows({"id": 1, "a": "x", "d": "1.50"}, {"id": 2, "a": "y", "d": None}, types={"a": 15, "d": 246})
    return h


def test_create_table_types_from_ddl(h: Harness) -> None:
    assert h.schema().field("d").type == pa.decimal128(6, 2)
    assert h.read() == [{"id": 1, "a": "x", "d": Decimal("1.50")}, {"id": 2, "a": "y", "d": None}]


def test_add_column_with_default_fills_existing_rows(h: Harness) -> None:
    h.ddl("ALTER TABLE `s`.`t` ADD COLUMN `n` INT DEFAULT 7, ADD COLUMN `m` VARCHAR(3)")
    assert [(r["n"], r["m"]) for r in h.read()] == [(7, None), (7, None)]
    h.ddl("ALTER TABLE `s`.`t` ADD COLUMN `z` VARCHAR(5) NOT NULL DEFAULT 'it''s'")
    assert {r["z"] for r in h.read()} == {"it's"}


def test_drop_rename_modify_column(h: Harness) -> None:
    h.ddl("ALTER TABLE `s`.`t` DROP COLUMN `a`")
    assert "a" not in h.schema().names and len(h.read()) == 2
    h.ddl("ALTER TABLE `s`.`t` CHANGE COLUMN `d` `amount` DECIMAL(10,4)")
    assert h.schema().field("amount").type == pa.decimal128(10, 4)
    assert [r["amount"] for r in h.read()] == [Decimal("1.5000"), None]
    with pytest.raises(DDLPolicyError, match="would lose data"):
        h.ddl("ALTER TABLE `s`.`t` MODIFY `amount` DECIMAL(4,1)")


def test_virtual_generated_columns_get_no_delta_column(tmp_path: Any) -> None:
    """TiCDC's rows never carry a VIRTUAL generated column (STORED ones they do): a Delta column of one
    would hold only NULLs where TiDB shows values. CREATE and ADD leave it out; a later DDL naming it finds
    nothing to change."""
    h = Harness(str(tmp_path))
    h.ddl("CREATE TABLE `s`.`t` (`id` BIGINT NOT NULL PRIMARY KEY, `a` INT, `v` INT AS (`a` * 2), "
          "`g` INT GENERATED ALWAYS AS (`a` + 1) STORED, `w` INT GENERATED ALWAYS AS (`a`) VIRTUAL NOT NULL)")
    assert h.schema().names == ["id", "a", "g"]
    h.rows({"id": 1, "a": 3, "g": 4})
    h.ddl("ALTER TABLE `s`.`t` ADD COLUMN `x` VARCHAR(5) AS (CONCAT(`a`, 'x')), ADD COLUMN `n` INT DEFAULT 5")
    h.ddl("ALTER TABLE `s`.`t` MODIFY COLUMN `v` BIGINT AS (`a` * 3) VIRTUAL")
    h.ddl("ALTER TABLE `s`.`t` RENAME COLUMN `w` TO `w2`")
    h.ddl("ALTER TABLE `s`.`t` DROP COLUMN `x`")
    assert h.schema().names == ["id", "a", "g", "n"]
    assert h.read() == [{"id": 1, "a": 3, "g": 4, "n": 5}]


def test_modify_to_text_prints_old_values_as_tidb_does(tmp_path: Any) -> None:
    """MODIFY COLUMN to VARCHAR: TiDB rewrites each stored value as its text (``convertToString``): DATETIME
    and TIMESTAMP with the column's fractional digits (TIMESTAMP in the source zone), FLOAT and DOUBLE in
    full with the fewest digits that read back (a FLOAT's as a single). Arrow's cast printed six digits and
    a "Z", the double's digits of a FLOAT, and exponents."""
    h = Harness(str(tmp_path))
    h.applier = DeltaApplier(h.sink, "t", ddl_handler=DDLReplayer(EVOLVE, "+08:00"), source_timezone="+08:00")
    h.ddl("CREATE TABLE `s`.`t` (`id` BIGINT PRIMARY KEY, `dt` DATETIME(3), `ts` TIMESTAMP(2) NULL, `f` FLOAT, "
          "`db` DOUBLE, `i` INT, `dec` DECIMAL(6,2), `day` DATE)")
    # (the row images as the codecs give them: text for dates and times, TIMESTAMP in the source zone)
    types = {"dt": 12, "ts": 7, "f": 4, "db": 5, "i": 3, "dec": 246, "day": 10}
    h.rows({"id": 1, "dt": "2024-01-02 03:04:05.120", "ts": "2024-06-30 23:59:59.50", "f": 0.10000000149011612,
            "db": 1e20, "i": -5, "dec": "1.50", "day": "2024-02-29"},
           {"id": 2, "dt": "1999-12-31 00:00:00.000", "ts": "2024-01-01 07:00:00.00", "f": 3.4028234663852886e38,
            "db": 1e-7, "i": 0, "dec": "-0.01", "day": "0001-01-01"},
           {"id": 3}, types=types)
    h.ddl("ALTER TABLE `s`.`t` " + ", ".join(f"MODIFY `{c}` VARCHAR(64)" for c in types))
    assert all(h.schema().field(c).type == pa.string() for c in types)
    assert [{k: v for k, v in r.items() if k != "id"} for r in h.read()] == [
        {"dt": "2024-01-02 03:04:05.120", "ts": "2024-06-30 23:59:59.50", "f": "0.1", "db": "100000000000000000000",
         "i": "-5", "dec": "1.50", "day": "2024-02-29"},
        {"dt": "1999-12-31 00:00:00.000", "ts": "2024-01-01 07:00:00.00", "f": "340282350000000000000000000000000000000",
         "db": "0.0000001", "i": "0", "dec": "-0.01", "day": "0001-01-01"},
        dict.fromkeys(types),
    ]


def test_an_applied_ddl_counts_as_a_change_of_its_tables_as_of_its_commit_ts(h: Harness) -> None:
    """The state records each table's applied commit ts (what `status` shows and what `snapshot` refuses
    to load under): a TRUNCATE / RENAME changes its tables as of its commit ts, rows or not."""
    truncate = h.ddl_step("TRUNCATE TABLE `s`.`t`")
    result = h.applier.apply([truncate], h._next())
    assert result.commit_ts == {"s.t": truncate.commit_ts} and result.rows == {}
    rename = h.ddl_step("RENAME TABLE `s`.`t` TO `s`.`t9`")
    result = h.applier.apply([rename], h._next())
    assert result.commit_ts == {"s.t": rename.commit_ts, "s.t9": rename.commit_ts}
    ignored = Harness(str(h.sink.root) + "-2", SimpleNamespace(truncate_table="ignore"))
    assert ignored.applier.apply([ignored.ddl_step("TRUNCATE TABLE `s`.`t`")], 1).commit_ts == {}


def test_truncate_rename_drop_table(h: Harness) -> None:
    h.ddl("RENAME TABLE `s`.`t` TO `s`.`t2`")
    assert h.schema() is None and len(h.read("t2")) == 2
    h.ddl("TRUNCATE TABLE `s`.`t2`", table="t2")
    assert h.read("t2") == []
    h.ddl("CREATE TABLE `s`.`t3` LIKE `s`.`t2`", table="t3")
    assert h.schema("t3").names == h.schema("t2").names
    h.ddl("DROP TABLE `s`.`t2`", table="t2")
    assert h.schema("t2") is None
    h.ddl("DROP DATABASE `s`", table="")
    assert h.schema("t3") is None


def test_drop_database_keeps_the_tables_whose_snapshot_is_later(tmp_path: Any) -> None:
    """Tables of one schema loaded from snapshots at different TSOs (and one streamed, without any): a
    DROP DATABASE between the TSOs drops only the tables whose snapshot was taken before it."""
    h = Harness(str(tmp_path))
    for table in ("early", "late", "streamed"):
        h.rows({"id": 1}, table=table)
    drop = h.ddl_step("DROP DATABASE `s`", table="")
    h.applier.seam = SnapshotSeam({("s", "early"): drop.commit_ts - 1, ("s", "late"): drop.commit_ts + 5})
    h.applier.apply([drop], h._next())
    assert h.schema("early") is None and h.schema("streamed") is None
    assert h.read("late") == [{"id": 1}]


def test_policies(tmp_path: Any) -> None:
    strict = SimpleNamespace(drop_column="fail", add_column="ignore", unknown="ignore")
    h = Harness(str(tmp_path), strict)
    h.ddl("CREATE TABLE `s`.`t` (`id` BIGINT PRIMARY KEY, `a` INT)")
    h.rows({"id": 1, "a": 1})
    h.ddl("ALTER TABLE `s`.`t` ADD COLUMN `b` INT")
    assert "b" not in h.schema().names
    h.ddl("THIS IS NOT SQL")
    with pytest.raises(DDLPolicyError, match=r"drop_column DDL at commit ts \d+ refused by policy ddl.drop_column: fail"):
        h.ddl("ALTER TABLE `s`.`t` DROP COLUMN `a`")


@pytest.mark.parametrize(("query", "ddl_type"), [
    ("ALTER TABLE `s`.`t` TRUNCATE PARTITION `p0`", None),
    ("ALTER TABLE `s`.`t` DROP PARTITION `p0`, `p1`", None),
    ("ALTER TABLE `s`.`t` EXCHANGE PARTITION `p0` WITH TABLE `s`.`t2`", None),
    ("ALTER TABLE `s`.`t` TRUNCATE PARTITION ALL /* a form the parser does not read */ ???", 23),
])
def test_partition_ddl_that_removes_rows_stops_the_job_by_default(tmp_path: Any, query: str,
                                                                  ddl_type: int | None) -> None:
    """DROP / TRUNCATE / EXCHANGE PARTITION remove or swap rows upstream without row events: the Delta table
    cannot follow, so the YAML's default (``ddl.partition_data: fail``) stops the job, with the DDL, its
    commit ts and the ways on in the error; ``ignore`` goes on and keeps the rows."""
    from ticdc_delta.config import DDLPolicies

    h = Harness(str(tmp_path), DDLPolicies())
    h.ddl("CREATE TABLE `s`.`t` (`id` BIGINT PRIMARY KEY) PARTITION BY RANGE (`id`) "
          "(PARTITION `p0` VALUES LESS THAN (10), PARTITION `p1` VALUES LESS THAN (20))")
    h.rows({"id": 1}, {"id": 15})
    step = h.ddl_step(query)
    step = step._replace(ddl_type=ddl_type)
    with pytest.raises(DDLPolicyError) as raised:
        h.applier.apply([step], h._next())
    text = str(raised.value)
    assert "ddl.partition_data: fail" in text and str(step.commit_ts) in text and query in text
    assert "ddl.partition_data: ignore" in text and "snapshot" in text

    h.applier._ddl_handler = DDLReplayer(DDLPolicies(partition_data="ignore"))
    h.applier.apply([step], h._next())
    h.rows({"id": 2})
    assert h.read() == [{"id": 1}, {"id": 15}, {"id": 2}]


def test_partition_ddl_that_keeps_rows_is_a_no_op(h: Harness) -> None:
    from ticdc_delta.config import DDLPolicies

    h.applier._ddl_handler = DDLReplayer(DDLPolicies())
    for query in ("ALTER TABLE `s`.`t` ADD PARTITION (PARTITION `p9` VALUES LESS THAN (90))",
                  "ALTER TABLE `s`.`t` REORGANIZE PARTITION `p0` INTO (PARTITION `p0a` VALUES LESS THAN (5))",
                  "ALTER TABLE `s`.`t` REMOVE PARTITIONING"):
        h.ddl(query)
    assert [r["id"] for r in h.read()] == [1, 2]


@pytest.mark.parametrize(("type_text", "default", "expected"), [
    ("BIGINT", "1234567890123456789", 1234567890123456789),  # (through a float: ...768)
    ("BIGINT", "9007199254740993", 9007199254740993),
    ("BIGINT UNSIGNED", "18446744073709551615", 18446744073709551615),
    ("INT", "1.5", 2),  # MySQL rounds half away from zero
    ("INT", "-1.5", -2),
    ("INT", "'7'", 7),
    ("TINYINT(1)", "TRUE", 1),
    ("BOOLEAN", "FALSE", 0),
    ("DOUBLE", "TRUE", 1.0),
    ("DOUBLE", "1e3", 1000.0),
])
def test_numeric_defaults_are_exact(type_text: str, default: str, expected: Any) -> None:
    (ch,) = parse_ddl(f"ALTER TABLE t ADD c {type_text} NOT NULL DEFAULT {default}", default_schema="s")
    got = default_value(ch.columns[0], 1 << 18, "UTC")
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(("column", "expected"), [
    # what TiDB shows in the rows that existed before the column: its own text of the DEFAULT
    ("DATE DEFAULT '2020-1-2'", "2020-01-02"),
    ("DATETIME DEFAULT '2020-1-2 3:4:5'", "2020-01-02 03:04:05"),
    ("DATETIME(3) DEFAULT '2020-01-02 03:04:05.5'", "2020-01-02 03:04:05.500"),
    ("TIME DEFAULT '1:2:3'", "01:02:03"),
    ("TIME DEFAULT 10", "00:00:10"),
    ("TIME DEFAULT 112233", "11:22:33"),
    ("TIME(3) DEFAULT '-1:2:3.5'", "-01:02:03.500"),
    ("YEAR DEFAULT 24", 2024),
    ("YEAR DEFAULT 70", 1970),
    ("YEAR DEFAULT '0'", 2000),
    ("YEAR DEFAULT 0", 0),
    ("YEAR DEFAULT 2024", 2024),
    ("ENUM('a','b') DEFAULT 'B'", "b"),
    ("SET('x','y') DEFAULT 'Y,x,y'", "x,y"),
    ("SET('x','y') DEFAULT ''", ""),
    ("BINARY(4) DEFAULT 'ab'", b"ab\0\0"),
    ("VARBINARY(4) DEFAULT 'ab'", b"ab"),
    ("VARCHAR(10) DEFAULT N'abc'", "abc"),
    ("VARCHAR(10) DEFAULT 'a' 'b' 'c'", "abc"),
    # NOT NULL without a DEFAULT: the type's zero value
    ("VECTOR(3) NOT NULL", "[]"),
    ("TIME(3) NOT NULL", "00:00:00.000"),
    ("BINARY(2) NOT NULL", b"\0\0"),
])
def test_literal_defaults_as_tidb_stores_them(column: str, expected: Any) -> None:
    (ch,) = parse_ddl(f"ALTER TABLE t ADD c {column}", default_schema="s")
    got = default_value(ch.columns[0], 1 << 18, "UTC")
    assert got == expected and type(got) is type(expected)


def test_default_value_and_widening() -> None:
    (ch,) = parse_ddl("ALTER TABLE t ADD c DATETIME DEFAULT CURRENT_TIMESTAMP", default_schema="s")
    assert default_value(ch.columns[0], 1_700_000_000_000 << 18, "UTC") == "2023-11-14 22:13:20"
    (ch,) = parse_ddl("ALTER TABLE t ADD c BIT(8) DEFAULT b'101'", default_schema="s")
    assert default_value(ch.columns[0], None, "UTC") == 5
    assert widens(pa.decimal128(6, 2), pa.decimal128(10, 4))
    assert not widens(pa.decimal128(6, 2), pa.decimal128(6, 3))
    assert widens(pa.int64(), pa.string()) and not widens(pa.string(), pa.int64())


ADD_C = "ALTER TABLE `s`.`t` ADD COLUMN `c` INT"
REPLAYED_BATCHES = {
    "add then drop": [ADD_C, {"id": 3, "c": 5}, "ALTER TABLE `s`.`t` DROP COLUMN `c`", {"id": 4}],
    "add, drop, add as another type": [ADD_C, "ALTER TABLE `s`.`t` DROP COLUMN `c`", {"id": 3},
                                       "ALTER TABLE `s`.`t` ADD COLUMN `c` DECIMAL(8,3)", ({"id": 4, "c": "1.5"}, {"c": 246})],
    "add then rename": [ADD_C, {"id": 3, "c": 5}, "ALTER TABLE `s`.`t` RENAME COLUMN `c` TO `e`", {"id": 4, "e": 6}],
    "rename then add the old name": ["ALTER TABLE `s`.`t` RENAME COLUMN `a` TO `b`", {"id": 3, "b": "z"},
                                     "ALTER TABLE `s`.`t` ADD COLUMN `a` INT", ({"id": 4, "a": 9}, {"a": 3})],
    "modify then drop": ["ALTER TABLE `s`.`t` MODIFY `d` DECIMAL(9,2)", {"id": 3, "d": "1234567.00"},
                         "ALTER TABLE `s`.`t` DROP COLUMN `d`", {"id": 4}],
}
ROW_TYPES = {"a": 15, "b": 15, "c": 3, "e": 3, "d": 246}


def _batch(h: Harness, spec: list[Any]) -> list[Any]:
    """DDL text as DDL steps; an image (or an ``(image, types)`` pair) as a rows step."""
    return [h.ddl_step(s) if isinstance(s, str) else
            h.rows_step(s[0], types={**ROW_TYPES, **s[1]}) if isinstance(s, tuple) else h.rows_step(s, types=ROW_TYPES)
            for s in spec]


@pytest.mark.parametrize("name", list(REPLAYED_BATCHES))
def test_a_batch_rerun_after_a_crash_ends_as_one_run(tmp_path: Any, name: str) -> None:
    """A batch whose DDL adds and then drops (renames, retypes) the same column, crashed after its first k
    steps and run again (same batch id): the table ends as after one run, with no column added twice and
    no rows step skipped."""
    spec = REPLAYED_BATCHES[name]
    ends = []
    for crash_after in (None, *range(1, len(spec) + 1)):
        h = Harness(str(tmp_path / f"k{crash_after}"))
        h.ddl("CREATE TABLE `s`.`t` (`id` BIGINT NOT NULL, `a` VARCHAR(10), `d` DECIMAL(6,2), PRIMARY KEY (`id`))")
        h.rows({"id": 1, "a": "x", "d": "1.50"}, types=ROW_TYPES)
        steps, batch = _batch(h, spec), h._next()
        if crash_after is not None:
            h.applier.apply(steps[:crash_after], batch)
        h.applier.apply(steps, batch)
        ends.append((crash_after, h.schema(), h.read()))
    _, once_schema, once_rows = ends[0]
    for crash_after, schema, rows in ends[1:]:
        assert (crash_after, schema) == (crash_after, once_schema)
        assert (crash_after, rows) == (crash_after, once_rows)


def test_rows_whose_type_grew_are_merged_when_a_batch_crashed_after_widening_runs_again(h: Harness) -> None:
    """A crash between the widening of a DECIMAL that grew without a DDL (an Avro schema version) and the
    MERGE of its rows: the re-run finds the column wide already, and still merges the rows (the schema work
    takes its step whether or not it commits, so the MERGE keeps the step of the first run)."""
    h.applier.catalog.set_params("s", "t", "d", TypeParams(9, 2))
    step, batch = h.rows_step({"id": 3, "d": "1234567.25"}, types={"d": 246}), h._next()
    col_types = {"id": (8, KEY), "d": (246, 0)}
    first = DeltaApplier(h.sink, "t", catalog=h.applier.catalog)  # the attempt that crashed
    first.prepare_table(TableIdent("s", "t"), col_types, True, TableOptions(), batch)
    assert h.schema().field("d").type == pa.decimal128(9, 2)
    h.applier.apply([step], batch)
    assert {r["id"]: r["d"] for r in h.read()} == {1: Decimal("1.50"), 2: None, 3: Decimal("1234567.25")}


@pytest.mark.parametrize("query,table,expected", [
    ("ALTER TABLE T ADD COLUMN c INT", "T", {("s", "t")}),
    ("ALTER TABLE T DROP COLUMN c, RENAME COLUMN a TO b", "T", {("s", "t")}),
    ("RENAME TABLE a TO b, c TO x.d", "a", {("s", "a"), ("s", "b"), ("s", "c"), ("x", "d")}),
    ("CREATE TABLE n LIKE o.p", "n", {("s", "n"), ("o", "p")}),
    ("TRUNCATE TABLE T", "T", {("s", "t")}),
    ("CREATE INDEX i ON T (a)", "T", {("s", "t")}),
    ("DROP DATABASE S", "", None),  # every table of the schema
    ("CREATE DATABASE z", "", None),
    ("this is not sql", "T", None),  # unknown: could be any table
])
def test_ddl_tables_names_what_a_ddl_can_change(query: str, table: str, expected: set | None) -> None:
    got = ddl_tables(DDLRecord(1, "t", 0, 0, 0, "S", table, query, None))
    assert got == (None if expected is None else frozenset(expected))


def test_ddl_tables_keeps_the_case_of_a_case_sensitive_job() -> None:
    rec = DDLRecord(1, "t", 0, 0, 0, "S", "T", "ALTER TABLE T ADD COLUMN c INT", None)
    assert ddl_tables(rec, case_sensitive=True) == frozenset({("S", "T")})
