"""Schema and table names never become paths outside the lake (issue 7), on real Delta tables.

Driven through the job's own driver-side chain (the YAML-configured sink, the planner, the applier and
the DDL replayer) with records as the decoders produce them; no Spark or Kafka needed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ticdc_delta.config import config_from_mapping
from ticdc_delta.core.batch_planner import OFFSET_ORDER, ConsumerState, plan_batch
from ticdc_delta.core.merge import KeyResolver
from ticdc_delta.core.records import ChangeRecord, DDLRecord
from ticdc_delta.delta.applier import DeltaApplier, TableCatalog
from ticdc_delta.delta.ddl_replay import DDLReplayer
from ticdc_delta.delta.sink import TableIdent
from ticdc_delta.spark.batch_handler import DEAD_LETTER_IDENT, DEAD_LETTER_SCHEMA, _ConfiguredSink

pytestmark = pytest.mark.integration

KEY = 0x0A  # handle key | primary key flags


def _files(root: Path) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs}


class Job:
    """The driver side of one changefeed: YAML config → sink → planner → applier → DDL replay."""

    def __init__(self, tmp: Path, **extra: Any) -> None:
        self.outside = tmp  # everything the job must not touch lives next to the lake
        self.lake = tmp / "data" / "lake"
        self.lake.mkdir(parents=True)
        data = {
            "changefeed": "cf",
            "source": {"bootstrap_servers": "127.0.0.1:9", "topic": "t", "protocol": "canal-json"},
            "sink": {"path": str(self.lake)},
            "checkpoint": str(tmp / "ckpt"),
            "ddl": {"drop_table": "evolve", "drop_database": "evolve"},
            **extra,
        }
        self.cfg = config_from_mapping(data)
        self.sink = _ConfiguredSink(self.cfg)
        self.state = ConsumerState()
        self.catalog = TableCatalog()
        self.batch = 0
        self.offset = 0
        self.ts = 1000 << 18

    def _coords(self) -> tuple[int, str, int, int, int]:
        self.ts += 1 << 18
        self.offset += 1
        return (self.ts, "t", 0, self.offset, 0)

    def row(self, schema: str, table: str, flags: int = KEY, **values: Any) -> ChangeRecord:
        cols = tuple((k, 246 if k == "d" else 8, flags if k == "id" else 0, v) for k, v in values.items())
        return ChangeRecord(*self._coords(), schema, table, "insert", cols, None)

    def ddl(self, query: str, schema: str = "s", table: str = "") -> DDLRecord:
        return DDLRecord(*self._coords(), schema, table, query, None)

    def _key(self, schema: str, table: str) -> Any:
        mapping = self.cfg.table_mapping_for(schema, table)
        return mapping.key if mapping is not None else None

    def run(self, *records: Any) -> Any:
        cs = self.cfg.case_sensitive
        plan = plan_batch(self.state, list(records), [], mode=OFFSET_ORDER, keys=KeyResolver(lookup=self._key),
                          case_sensitive=cs)
        applier = DeltaApplier(self.sink, "cf", catalog=self.catalog, ddl_handler=DDLReplayer(self.cfg.ddl),
                               case_sensitive=cs)
        self.batch += 1
        result = applier.apply(plan.steps, self.batch)
        self.state = plan.state
        return result

    def ids(self, schema: str, table: str) -> list[int]:
        return sorted(r["id"] for r in self.sink.read(TableIdent(schema, table)).to_pylist())


@pytest.fixture
def job(tmp_path: Path) -> Job:
    return Job(tmp_path)


def _plant_outside(job: Job) -> dict[str, bytes]:
    """Files outside the lake that an escaping name could reach."""
    planted = {}
    for rel in ("data/victim/keep.txt", "other/lake/s/t/keep.txt", "escape/keep.txt"):
        p = job.outside / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rel.encode())
        planted[rel] = rel.encode()
    return planted


def _assert_outside_untouched(job: Job, planted: dict[str, bytes]) -> None:
    for rel, content in planted.items():
        assert (job.outside / rel).read_bytes() == content, f"{rel} was changed"
    outside = {f for f in _files(job.outside) if not f.startswith(("data/lake/", "ckpt/"))}
    assert outside == set(planted), f"written outside the lake: {sorted(outside - set(planted))}"


def test_a_row_with_a_dotdot_table_lands_inside_the_lake(job: Job) -> None:
    planted = _plant_outside(job)
    job.run(job.row("s", "../../escape", id=1), job.row("..", "../other/lake/s/t", id=2))
    _assert_outside_untouched(job, planted)
    assert job.ids("s", "../../escape") == [1]
    assert job.ids("..", "../other/lake/s/t") == [2]


def test_rename_to_dotdot_moves_inside_the_lake_and_deletes_nothing_outside(job: Job) -> None:
    planted = _plant_outside(job)
    job.run(job.ddl("CREATE TABLE `s`.`t` (`id` BIGINT NOT NULL PRIMARY KEY)"), job.row("s", "t", id=1))
    job.run(job.ddl("RENAME TABLE `s`.`t` TO `..`.`victim`"))
    _assert_outside_untouched(job, planted)
    assert job.ids("..", "victim") == [1]
    job.run(job.ddl("DROP TABLE `..`.`victim`"), job.ddl("DROP DATABASE `..`"))
    _assert_outside_untouched(job, planted)
    assert job.sink.table_schema(TableIdent("..", "victim")) is None


def test_truncate_cannot_reach_the_dead_letter_table(job: Job) -> None:
    import pyarrow as pa

    from ticdc_delta.delta.sink import DeltaRsSink, batch_txn

    dead = DeltaRsSink(job.cfg.dead_letter_path, paths={tuple(DEAD_LETTER_IDENT): job.cfg.dead_letter_path})
    row = {"topic": "t", "partition": 0, "offset": 7, "key": b"k", "value": b"v", "error": "bad", "batch_id": 0,
           "recorded_at": 0}
    dead.append(DEAD_LETTER_IDENT, pa.Table.from_pylist([row], schema=DEAD_LETTER_SCHEMA), batch_txn("cf/dl", 0))
    for name in ("../_ticdc_dead_letter", "_ticdc_dead_letter"):
        job.run(job.ddl(f"CREATE TABLE `s`.`{name}` (`id` BIGINT NOT NULL PRIMARY KEY)"), job.row("s", name, id=1))
        job.run(job.ddl(f"TRUNCATE TABLE `s`.`{name}`"))
    job.run(job.ddl("CREATE TABLE `_ticdc_dead_letter`.`_delta_log` (`id` BIGINT NOT NULL PRIMARY KEY)"),
            job.row("_ticdc_dead_letter", "_delta_log", id=1))
    job.run(job.ddl("DROP TABLE `_ticdc_dead_letter`.`_delta_log`"), job.ddl("DROP DATABASE `_ticdc_dead_letter`"))
    assert [r["offset"] for r in dead.read(DEAD_LETTER_IDENT).to_pylist()] == [7]


@pytest.mark.parametrize(
    "a, b", [(("/abs", "t"), ("abs", "t")), (("a/b", "t"), ("a", "b/t")), (("s", "a\\b"), ("s", "a/b")),
             (("s", "."), ("s", "@002e")), (("s", "a@002fb"), ("s", "a/b")), (("s", "x%2fy"), ("s", "x/y"))],
)
def test_distinct_names_get_distinct_tables(job: Job, a: tuple[str, str], b: tuple[str, str]) -> None:
    job.run(job.row(*a, id=1), job.row(*b, id=2))
    assert job.sink.table_path(*a) != job.sink.table_path(*b)
    assert job.ids(*a) == [1] and job.ids(*b) == [2]


# --- identifier case ---------------------------------------------------------------------------------


def test_names_are_case_insensitive_by_default(tmp_path: Path) -> None:
    import pyarrow as pa

    job = Job(tmp_path, tables=[{"source": "Shop.Orders", "key": ["id"]}])
    job.run(job.ddl("CREATE TABLE `Shop`.`Orders` (`id` BIGINT NOT NULL PRIMARY KEY, `d` DECIMAL(6,2))"),
            job.row("Shop", "Orders", id=1, d="1.50"))
    # one table, one key (the override of Shop.Orders; these rows flag no key), one catalog entry
    job.run(job.row("shop", "orders", flags=0, id=2, d="2.25"), job.row("SHOP", "ORDERS", flags=0, id=1, d="9.99"))
    assert sorted(os.listdir(job.lake)) == ["shop"] and os.listdir(job.lake / "shop") == ["orders"]
    rows = sorted(job.sink.read(TableIdent("shop", "orders")).to_pylist(), key=lambda r: r["id"])
    assert [(r["id"], str(r["d"])) for r in rows] == [(1, "9.99"), (2, "2.25")]
    assert job.sink.table_schema(TableIdent("shop", "orders")).field("d").type == pa.decimal128(6, 2)
    # DDL spelled another way applies to the table created as `Shop`.`Orders`
    job.run(job.ddl("ALTER TABLE `shop`.`ORDERS` ADD COLUMN `Note` VARCHAR(10)"))
    assert "Note" in job.sink.table_schema(TableIdent("shop", "orders")).names
    job.run(job.ddl("TRUNCATE TABLE `SHOP`.`orders`", schema="SHOP"))
    assert job.ids("shop", "orders") == []
    job.run(job.row("Shop", "Orders", id=3, d="3.00"))
    job.run(job.ddl("RENAME TABLE `shop`.`orders` TO `Shop`.`Archive`", schema="shop"))
    assert job.ids("shop", "archive") == [3]
    assert os.listdir(job.lake / "shop") == ["archive"]
    assert job.cfg.table_path("SHOP", "Archive") == f"{job.lake}/shop/archive"


def test_case_sensitive_keeps_spellings_apart(tmp_path: Path) -> None:
    job = Job(tmp_path, case_sensitive=True)
    job.run(job.row("Shop", "Orders", id=1), job.row("shop", "orders", id=2))
    assert job.ids("Shop", "Orders") == [1] and job.ids("shop", "orders") == [2]
    job.run(job.ddl("TRUNCATE TABLE `shop`.`orders`"))
    assert job.ids("Shop", "Orders") == [1] and job.ids("shop", "orders") == []
    assert job.cfg.table_path("Shop", "Orders") == f"{job.lake}/Shop/Orders"


# --- names no location can hold ---------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", "a\x00b", "x" * 256])
def test_ddl_to_a_name_no_location_can_hold_follows_the_policy(tmp_path: Path, bad: str) -> None:
    from ticdc_delta.errors import DDLPolicyError

    job = Job(tmp_path)
    job.run(job.ddl("CREATE TABLE `s`.`t` (`id` BIGINT NOT NULL PRIMARY KEY)"), job.row("s", "t", id=1))
    quoted = bad.replace("`", "``")
    for query, cls in ((f"RENAME TABLE `s`.`t` TO `s`.`{quoted}`", "rename_table"),
                       (f"CREATE TABLE `s`.`{quoted}` (`id` BIGINT NOT NULL PRIMARY KEY)", "create_table")):
        # (the SQL parser already refuses an empty name: an unclassifiable DDL, ddl.unknown decides)
        expected = (rf"{cls} DDL at commit ts \d+ cannot be replayed: table 's'\..*set ddl.{cls}: ignore" if bad
                    else r"DDL at commit ts \d+ cannot be classified .* ddl.unknown is fail")
        with pytest.raises(DDLPolicyError, match=expected):
            job.run(job.ddl(query))
        assert job.ids("s", "t") == [1]  # nothing moved
    ignoring = Job(tmp_path / "ignore", ddl={"rename_table": "ignore", "create_table": "ignore", "unknown": "ignore"})
    ignoring.run(ignoring.ddl("CREATE TABLE `s`.`t` (`id` BIGINT NOT NULL PRIMARY KEY)"), ignoring.row("s", "t", id=1))
    ignoring.run(ignoring.ddl(f"RENAME TABLE `s`.`t` TO `s`.`{quoted}`"),
                 ignoring.ddl(f"CREATE TABLE `s`.`{quoted}` (`id` BIGINT)"))
    assert ignoring.ids("s", "t") == [1]
    # DDL on such a table (it has no Delta table) changes nothing and stops nothing
    ignoring.run(ignoring.ddl(f"TRUNCATE TABLE `s`.`{quoted}`"), ignoring.ddl(f"DROP TABLE `s`.`{quoted}`"))
    assert ignoring.ids("s", "t") == [1]


def test_rows_of_a_table_no_location_can_hold_go_to_the_dead_letter_table() -> None:
    import json

    from ticdc_delta.codec import decoder_for
    from ticdc_delta.spark.decode import decode_messages

    def message(table: str, id_: int) -> bytes:
        return json.dumps({
            "id": 0, "database": "s", "table": table, "pkNames": ["id"], "isDdl": False, "type": "INSERT",
            "es": 1, "ts": 1, "sql": "", "sqlType": {"id": 4}, "mysqlType": {"id": "int"},
            "data": [{"id": str(id_)}], "old": None,
        }).encode()

    tables = ["ok", "a\x00b", "", "x" * 300, "../../escape"]
    out = decode_messages(decoder_for("canal-json", {}), ["t"] * 5, [0] * 5, list(range(5)), [None] * 5,
                          [message(t, i) for i, t in enumerate(tables)])
    assert out["kind"] == ["row", "error", "error", "error", "row"]
    errors = [e for e in out["error"] if e]
    assert "at t[0]@1" in errors[0] and "table 's'.'a\\x00b': table name 'a\\x00b' holds NUL" in errors[0]
    assert "table name is empty" in errors[1]
    assert "needs 300 bytes as a path component; at most 255 fit" in errors[2] and len(errors[2]) < 400
    assert out["value"][1] == message(tables[1], 1)  # the dead-letter row keeps the message


def test_readers_find_a_table_by_any_spelling(job: Job) -> None:
    job.run(job.row("Shop", "Orders", id=1))
    assert job.ids("SHOP", "orders") == [1] and job.ids("Shop", "Orders") == [1]
    assert job.sink.table_path("Shop", "Orders") == job.cfg.table_path("shop", "orders")


def test_a_catalog_saved_before_folding_is_found_under_the_folded_names() -> None:
    saved = {"Shop\x00Orders": {"d": {"precision": 6, "scale": 2, "members": None, "fsp": None}}}
    assert TableCatalog(saved, fold_names=True).params("shop", "orders", "d").precision == 6
    assert TableCatalog(saved).params("shop", "orders", "d") is None  # case_sensitive: spellings stay apart


def test_listing_a_schema_decodes_the_names_and_leaves_foreign_directories_alone(tmp_path: Path) -> None:
    import pyarrow as pa

    from ticdc_delta.delta.sink import DeltaRsSink, batch_txn

    sink = DeltaRsSink(str(tmp_path / "lake"))
    names = ["a/b", "..", "_x", "表", "T", "100%", "@0040"]
    for name in names:
        sink.ensure_table(TableIdent("s/1", name), pa.schema([("id", pa.int64())]), None, batch_txn("a", 0))
    foreign = tmp_path / "lake" / "s@002f1" / "Not Encoded" / "_delta_log"
    foreign.mkdir(parents=True)
    assert sorted(sink.tables_in_schema("s/1")) == sorted(TableIdent("s/1", n) for n in names)
    for ident in sink.tables_in_schema("s/1"):
        assert sink.drop(ident)
    assert os.listdir(tmp_path / "lake" / "s@002f1") == ["Not Encoded"]


def test_drop_database_finds_the_schema_tables_a_mapping_places_elsewhere(tmp_path: Path) -> None:
    """DROP DATABASE drops every table of the schema: those at their default location under sink.path and
    those a tables[].path entry puts somewhere else (not a wildcard's, not another schema's)."""
    import pyarrow as pa

    from ticdc_delta.config import config_from_mapping
    from ticdc_delta.delta.sink import batch_txn
    from ticdc_delta.spark.batch_handler import _ConfiguredSink

    cfg = config_from_mapping({
        "changefeed": "cf", "checkpoint": str(tmp_path / "ckpt"),
        "sink": {"path": str(tmp_path / "lake")},
        "source": {"bootstrap_servers": "127.0.0.1:9", "topic": "t", "protocol": "canal-json"},
        "tables": [{"source": "Shop.Orders", "path": str(tmp_path / "elsewhere" / "orders")},
                   {"source": "other.items", "path": str(tmp_path / "elsewhere" / "items")},
                   {"source": "shop.never_written", "path": str(tmp_path / "elsewhere" / "none")}],
    })
    sink = _ConfiguredSink(cfg)
    for ident in (TableIdent("shop", "orders"), TableIdent("shop", "users"), TableIdent("other", "items")):
        sink.ensure_table(ident, pa.schema([("id", pa.int64())]), None, batch_txn("a", 0))
    assert sorted(sink.tables_in_schema("shop")) == [TableIdent("shop", "orders"), TableIdent("shop", "users")]
    for ident in sink.tables_in_schema("shop"):
        assert sink.drop(ident)
    assert not (tmp_path / "elsewhere" / "orders").exists()
    assert (tmp_path / "elsewhere" / "items" / "_delta_log").is_dir()


@pytest.mark.parametrize(
    "schema, table, what",
    [("ckpt", "state", "checkpoint"), ("rejects", "x", "dead_letter.path"), ("sales", "orders_v2", r"tables\[0\]\.path"),
     ("items_v2", "t", r"tables\[1\]\.path")],
)
def test_a_table_never_lands_on_a_configured_location(tmp_path: Path, schema: str, table: str, what: str) -> None:
    from ticdc_delta.errors import IdentifierError

    lake = tmp_path / "data" / "lake"
    job = Job(tmp_path, checkpoint=str(lake / "ckpt"), dead_letter={"path": str(lake / "rejects")},
              tables=[{"source": "sales.orders", "path": str(lake / "sales" / "orders_v2")},
                      {"source": "sales.items", "path": str(lake / "items_v2")}])
    job.run(job.row("sales", "orders", id=1), job.row("sales", "orders_x", id=2))
    with pytest.raises(IdentifierError, match=rf"table '{schema}'.'{table}' would land at .* which overlaps {what}"):
        job.run(job.row(schema, table, id=3))
    if schema == "items_v2":
        with pytest.raises(IdentifierError, match="overlaps"):
            job.run(job.row("ITEMS_V2", "t", id=4))
    assert job.ids("sales", "orders") == [1] and job.ids("sales", "orders_x") == [2]
