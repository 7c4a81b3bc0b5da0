"""DDL replay where names and locations do not map one to one (real Delta tables, no Spark): shards that
``tables[].path`` maps to one Delta table, a table placed outside its schema's directory, and a RENAME
between a name ``tables[]`` disables and one it does not."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ticdc_delta.core.batch_planner import RowsStep
from ticdc_delta.core.merge import KeyResolver, collapse
from ticdc_delta.core.records import ChangeRecord, DDLRecord
from ticdc_delta.delta.applier import DeltaApplier, TableOptions
from ticdc_delta.delta.ddl_replay import DDLReplayer
from ticdc_delta.delta.sink import DeltaRsSink, TableIdent
from ticdc_delta.errors import DDLPolicyError

pytestmark = pytest.mark.integration

EVOLVE = dict(drop_table="evolve", drop_database="evolve", truncate_table="evolve", drop_column="evolve",
              rename_column="evolve", rename_table="evolve", add_column="evolve", unknown="fail")
KEY = 0x0A


class Job:
    """The delta-rs engine's applier and DDL replay over ``sink``, one batch per call, ``disabled``
    tables as ``tables[].enabled: false`` leaves them."""

    def __init__(self, sink: DeltaRsSink, disabled: set[tuple[str, str]] = frozenset(), **policies: str) -> None:
        self.sink = sink
        options = lambda s, t: TableOptions(enabled=(s, t) not in disabled)  # noqa: E731
        self.applier = DeltaApplier(sink, "cf", table_options=options,
                                    ddl_handler=DDLReplayer(SimpleNamespace(**{**EVOLVE, **policies})))
        self.batch, self.ts = 0, 1000 << 18

    def rows(self, schema: str, table: str, *ids: int) -> None:
        recs = []
        for i in ids:
            self.ts += 1 << 18
            cols = (("id", 8, KEY, i), ("v", 8, 0, i * 10))
            recs.append(ChangeRecord(self.ts, "x", 0, i, 0, schema, table, "insert", cols, None))
        self._apply(RowsStep(collapse(recs, KeyResolver())))

    def ddl(self, query: str, schema: str, table: str = "") -> None:
        self.ts += 1 << 18
        self._apply(DDLRecord(self.ts, "x", 0, 0, 0, schema, table, query, None))

    def _apply(self, step: Any) -> None:
        self.batch += 1
        self.applier.apply([step], self.batch)

    def ids(self, schema: str, table: str) -> list[int]:
        return sorted(r["id"] for r in self.sink.read(TableIdent(schema, table)).to_pylist())


@pytest.fixture
def shards(tmp_path: Path) -> Job:
    merged = str(tmp_path / "merged")
    job = Job(DeltaRsSink(str(tmp_path / "lake"), paths={("db_1", "t"): merged, ("db_2", "t"): merged}))
    job.rows("db_1", "t", 1, 2)
    job.rows("db_2", "t", 1001)
    return job


@pytest.mark.parametrize("query,cls", [
    ("TRUNCATE TABLE t", "truncate_table"), ("ALTER TABLE t DROP COLUMN v", "drop_column"),
    ("ALTER TABLE t RENAME COLUMN v TO w", "rename_column"), ("DROP TABLE t", "drop_table"),
    ("RENAME TABLE t TO t_old", "rename_table"), ("DROP DATABASE db_1", "drop_database")])
def test_a_shards_ddl_that_would_change_the_others_rows_is_refused(shards: Job, query: str, cls: str) -> None:
    """Regression: one shard's TRUNCATE emptied every shard's rows, its DROP COLUMN dropped the others'
    values, its RENAME / DROP TABLE / DROP DATABASE took the table away from under the others. Refused
    before anything changes, naming the tables that share the location and the policy that goes on."""
    with pytest.raises(DDLPolicyError, match=rf"{cls} DDL at commit ts \d+ on db_1\.t would change the Delta table "
                                             rf"at .*merged, which also holds the rows of db_2\.t \(tables\[\]\.path "
                                             rf"maps them to one location\).*Set ddl\.{cls}: ignore to go on"):
        shards.ddl(query, "db_1", "t")
    assert shards.ids("db_1", "t") == [1, 2, 1001]
    assert shards.sink.table_schema(TableIdent("db_1", "t")).names == ["id", "v"]


def test_a_shards_ddl_that_changes_no_rows_is_replayed(shards: Job) -> None:
    shards.ddl("ALTER TABLE t ADD COLUMN note VARCHAR(10)", "db_2", "t")
    assert shards.sink.table_schema(TableIdent("db_2", "t")).names == ["id", "v", "note"]
    assert shards.ids("db_2", "t") == [1, 2, 1001]


def test_drop_database_drops_its_tables_wherever_they_were_put(tmp_path: Path) -> None:
    """Regression: DROP DATABASE dropped the tables under ``{sink.path}/{schema}/`` and those exact
    ``tables[].path`` entries name, but left one a wildcard entry's path placed elsewhere — a table made
    again under that name afterwards landed on the dropped table's rows. The state's record of where each
    table's rows went finds it."""
    audit = str(tmp_path / "audit")
    job = Job(DeltaRsSink(str(tmp_path / "lake"), paths={("shop", "audit_1"): audit}))
    job.rows("shop", "audit_1", 1)
    job.rows("shop", "plain", 1)
    job.ddl("DROP DATABASE shop", "shop")
    assert job.sink.table_schema(TableIdent("shop", "audit_1")) is None
    assert job.sink.table_schema(TableIdent("shop", "plain")) is None
    job.rows("shop", "audit_1", 2)
    assert job.ids("shop", "audit_1") == [2]


@pytest.mark.parametrize("disabled,query", [
    (("shop", "_orders_del"), "RENAME TABLE orders TO _orders_del, _orders_gho TO orders"),
    (("shop", "_orders_gho"), "RENAME TABLE _orders_gho TO orders")], ids=["to-disabled", "from-disabled"])
def test_a_rename_between_an_enabled_and_a_disabled_name_is_refused(tmp_path: Path, disabled: tuple[str, str],
                                                                    query: str) -> None:
    """Regression: a gh-ost / pt-osc cut-over with its scratch tables disabled (``shop._*``) moved the
    landed table to the disabled name and skipped the ghost table's half, whose old name was disabled:
    the next update started ``shop.orders`` anew, holding only the rows changed after it. Refused before
    any part of the statement runs; ``ddl.rename_table: ignore`` goes on, the landed table kept."""
    sink = DeltaRsSink(str(tmp_path / "lake"))
    job = Job(sink, {disabled, ("shop", "_orders_gho")})
    job.rows("shop", "orders", 1, 2, 3)
    with pytest.raises(DDLPolicyError, match=r"rename_table DDL at commit ts \d+ renames shop\.\S+ to shop\.\S+, "
                                             r"and tables\[\] disables the (first|second) name"):
        job.ddl(query, "shop", "orders")
    assert job.ids("shop", "orders") == [1, 2, 3]
    assert sink.table_schema(TableIdent("shop", "_orders_del")) is None

    ignoring = Job(sink, {disabled, ("shop", "_orders_gho")}, rename_table="ignore")
    ignoring.ddl(query, "shop", "orders")
    ignoring.rows("shop", "orders", 4)
    assert ignoring.ids("shop", "orders") == [1, 2, 3, 4]


def test_a_shard_of_a_schema_whose_name_holds_a_dot_is_not_taken_for_the_dropped_schemas(tmp_path: Path) -> None:
    """DROP DATABASE ``db``: the tables it drops share their location harmlessly among themselves, but not
    with ``db.x``.``t`` — whose name begins like one of ``db``'s and which a prefix test took for one."""
    merged = str(tmp_path / "merged")
    job = Job(DeltaRsSink(str(tmp_path / "lake"), paths={("db", "t"): merged, ("db.x", "t"): merged}))
    job.rows("db", "t", 1)
    job.rows("db.x", "t", 2)
    with pytest.raises(DDLPolicyError, match=r"drop_database DDL .* also holds the rows of db\.x\.t"):
        job.ddl("DROP DATABASE db", "db")
    assert job.ids("db", "t") == [1, 2]


def test_drop_database_drops_a_table_a_ddl_created_elsewhere_before_its_first_row(tmp_path: Path) -> None:
    """A table a CREATE TABLE made at a location outside the schema's directory, with no rows yet: DROP
    DATABASE left it, and the table made again under its name kept the old one's columns."""
    job = Job(DeltaRsSink(str(tmp_path / "lake"), paths={("shop", "audit_1"): str(tmp_path / "audit")}))
    job.ddl("CREATE TABLE audit_1 (id BIGINT PRIMARY KEY, legacy INT)", "shop", "audit_1")
    job.ddl("DROP DATABASE shop", "shop")
    assert job.sink.table_schema(TableIdent("shop", "audit_1")) is None


def test_tables_sharing_a_location_stay_known_across_a_reset_that_reads_the_stream_again(tmp_path: Path) -> None:
    """``reset --from earliest`` (or latest, or offsets) forgets where each table's rows went, so that a table
    deleted to be built again is made anew; it kept nothing else, so the first batches after it replayed one
    shard's TRUNCATE onto every shard's rows. The earlier locations still say which tables share one."""
    from ticdc_delta.config import config_from_mapping
    from ticdc_delta.reset import plan_reset
    from ticdc_delta.spark.batch_handler import written_locations

    merged = str(tmp_path / "merged")
    meta = {"tables": {"db_1.t": {"rows_applied": 2, "location": merged},
                       "db_2.t": {"rows_applied": 1, "location": merged}}}
    cfg = config_from_mapping({
        "changefeed": "cf", "checkpoint": str(tmp_path / "ckpt"), "sink": {"path": str(tmp_path / "lake")},
        "source": {"bootstrap_servers": "127.0.0.1:9", "topic": "cdc", "protocol": "canal-json"}})
    from ticdc_delta.delta.state_store import PipelineState, StateStore

    StateStore(str(tmp_path / "ckpt" / "state"), "cf").save(3, PipelineState(3, meta=meta))
    after = plan_reset(cfg, "latest").state.meta
    assert written_locations(after) == {}
    sink = DeltaRsSink(str(tmp_path / "lake"), paths={("db_1", "t"): merged, ("db_2", "t"): merged})
    job = Job(sink)
    job.applier = DeltaApplier(sink, "cf", known=written_locations(after, earlier=True),
                               ddl_handler=DDLReplayer(SimpleNamespace(**EVOLVE)))
    job.rows("db_1", "t", 1)
    with pytest.raises(DDLPolicyError, match=r"truncate_table DDL .* also holds the rows of db_2\.t"):
        job.ddl("TRUNCATE TABLE t", "db_1", "t")
