"""Issue 11 end to end on real Spark and real Delta tables: a Dumpling export of the simulated upstream at a
TSO is loaded by the ``snapshot`` command (delta-spark), then the job's batch handler plays a stream that
starts before the snapshot; the tables must equal the upstream's final state (the oracle), the overlap must
be dropped, a crashed load re-runs to the same tables, bad files are typed errors that leave no table
half-loaded, and a table the stream advanced past is refused unless ``--force``.

No Kafka broker: each micro-batch is a DataFrame of the Kafka-shaped messages (as the Kafka source gives).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from ticdc_delta.cli import main
from ticdc_delta.config import config_from_mapping
from ticdc_delta.delta.ddl_replay import DDLReplayer
from ticdc_delta.delta.state_store import StateStore
from ticdc_delta.errors import SnapshotConflictError, SnapshotFormatError
from ticdc_delta.simulator.dumpling_export import write_dumpling_export
from ticdc_delta.simulator.scenario import Scenario
from ticdc_delta.snapshot.dumpling import CsvDialect
from ticdc_delta.snapshot.load import load_dumpling_snapshot
from ticdc_delta.spark.batch_handler import BatchHandler
from ticdc_delta.status import collect_status
from ticdc_delta.verify import compare_with_oracle

pytestmark = pytest.mark.integration

ALL_TYPES = ("CREATE TABLE `shop`.`w` (`id` BIGINT NOT NULL, `u` BIGINT UNSIGNED, `f` FLOAT, `dbl` DOUBLE, "
             "`d` DECIMAL(10,3), `dt` DATE, `tm` DATETIME(6), `ts` TIMESTAMP NULL, `ti` TIME, `y` YEAR, "
             "`e` ENUM('a','b'), `st` SET('x','y'), `j` JSON, `b` BLOB, `vb` VARBINARY(4), `bt` BIT(3), "
             "`c` CHAR(3), `tx` TEXT, PRIMARY KEY (`id`))")


def _config(tmp_path: Path, protocol: str, options: dict[str, str], engine: str = "delta-rs") -> Any:
    return config_from_mapping({
        "changefeed": "boot",
        "source": {"bootstrap_servers": "127.0.0.1:9", "topic": "cdc", "protocol": protocol, "options": options},
        "sink": {"path": str(tmp_path / "lake"), "engine": engine},
        "tables": [{"source": "shop.skipped", "enabled": False}],
        "checkpoint": str(tmp_path / "ckpt"),
    })


def _before_snapshot(sc: Scenario) -> None:
    """Upstream history before the changefeed's start: tables and rows."""
    sc.ddl("CREATE DATABASE `shop`")
    sc.ddl(ALL_TYPES)
    sc.ddl("CREATE TABLE `shop`.`orders` (`id` INT NOT NULL, `v` VARCHAR(20), `amount` DECIMAL(12,2), PRIMARY KEY (`id`))")
    sc.ddl("CREATE TABLE `shop`.`skipped` (`id` INT NOT NULL, PRIMARY KEY (`id`))")
    sc.insert("shop", "skipped", id=1)
    sc.insert("shop", "w", id=1, u=18446744073709551615, f=0.1, dbl=-1e300, d="-1.5", dt="2024-02-29",
              tm="2024-01-01 00:00:00.000001", ts="2038-01-19 03:14:07", ti="-838:59:59", y=1901, e="b",
              st="x,y", j='{"k": [1, 2]}', b=b"\x00\x01\\\"\n,", vb=b"\xff", bt=5, c="ab", tx='q"u,o\\te\r\n\\N')
    sc.insert("shop", "w", id=2)
    for i in range(1, 30):
        sc.insert("shop", "orders", id=i, v=f"o{i}", amount=f"{i}.25")
    sc.ddl("CREATE TABLE `shop`.`tmp` (`id` INT NOT NULL, `v` VARCHAR(20), PRIMARY KEY (`id`))")


def _overlap(sc: Scenario) -> None:
    """Changes after the changefeed's start but before the snapshot: the stream carries them, the snapshot
    holds them already. A table is dropped and re-created: ``ddl.drop_table: ignore`` (the default) keeps
    the Delta table, so only the seam keeps the old rows from coming back."""
    for i in range(1, 6):
        sc.insert("shop", "tmp", id=i, v="old")
    sc.update("shop", "orders", {"id": 3}, v="changed-before")
    sc.delete("shop", "orders", id=4)
    sc.ddl("DROP TABLE `shop`.`tmp`")
    sc.ddl("CREATE TABLE `shop`.`tmp` (`id` INT NOT NULL, `v` VARCHAR(20), PRIMARY KEY (`id`))")
    sc.insert("shop", "tmp", id=1, v="new")
    sc.update("shop", "w", {"id": 2}, tx="before")


def _after_snapshot(sc: Scenario) -> None:
    sc.update("shop", "orders", {"id": 3}, v="changed-after")
    sc.delete("shop", "orders", id=5)
    sc.insert("shop", "orders", id=100, v="late", amount="0.01")
    sc.ddl("ALTER TABLE `shop`.`orders` ADD COLUMN `note` VARCHAR(10) DEFAULT 'n'")
    sc.insert("shop", "orders", id=101, v="later")
    sc.update("shop", "w", {"id": 2}, tx="after", e="a")
    sc.insert("shop", "tmp", id=2, v="new2")


def _frame(spark: Any, messages: list[tuple[int, bytes | None, bytes | None]], offsets: dict[int, int]) -> Any:
    rows = []
    for partition, key, value in messages:
        offset = offsets.get(partition, 0)
        offsets[partition] = offset + 1
        rows.append(("cdc", partition, offset, key, value))
    return spark.createDataFrame(rows, "topic string, partition int, offset long, key binary, value binary")


def _handler(cfg: Any) -> BatchHandler:
    return BatchHandler(cfg, partitions_of=lambda topic: [0, 1], ddl_handler=DDLReplayer(cfg.ddl))


@pytest.mark.parametrize("protocol,options,filetype,dialect,compress,engine", [
    ("canal-json", {"enable-tidb-extension": "true"}, "sql", CsvDialect(), False, "delta-rs"),
    ("open-protocol", {}, "csv", CsvDialect(), False, "delta-rs"),
    ("craft", {}, "csv", CsvDialect(binary_format="base64"), True, "delta-rs"),
    ("open-protocol", {}, "csv", CsvDialect(), False, "spark"),
])
def test_snapshot_then_stream_equals_the_upstream(spark: Any, tmp_path: Path, protocol: str, options: dict,
                                                  filetype: str, dialect: CsvDialect, compress: bool, engine: str,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    cfg = _config(tmp_path, protocol, options, engine)
    sc = Scenario(protocol, options, partitions=2, topic="cdc")
    _before_snapshot(sc)
    sc.take()  # before the changefeed's start: never sent
    _overlap(sc)
    export = tmp_path / "export"
    tso = write_dumpling_export(sc, export, filetype=filetype, dialect=dialect, rows_per_file=7, compress=compress)
    at_snapshot = sc.oracle()
    overlap = sc.take()
    _after_snapshot(sc)
    rest = sc.rest()

    summary = load_dumpling_snapshot(cfg, str(export), spark=spark, dialect=dialect)
    assert summary.tso == tso
    assert {f"{t.schema}.{t.table}": t.rows for t in summary.tables if t.skipped is None} == {
        "shop.orders": 28, "shop.tmp": 1, "shop.w": 2}
    assert [t.skipped for t in summary.tables if t.table == "skipped"] == ["disabled in the table mapping"]
    handler = _handler(cfg)
    assert all(d.ok for d in compare_with_oracle(handler.sink, _without(at_snapshot, "shop.skipped"))), \
        [d.describe() for d in compare_with_oracle(handler.sink, at_snapshot)]

    offsets: dict[int, int] = {}
    with caplog.at_level("INFO", logger="ticdc_delta.progress"):
        handler(_frame(spark, overlap, offsets), 0)
        handler(_frame(spark, rest, offsets), 1)
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "ticdc_delta.progress"
             and r.getMessage().startswith('{"batch_id"')]
    assert lines[0]["snapshot_dropped"] > 0  # the overlap: rows and DDL of the snapshot tables <= TSO

    diffs = compare_with_oracle(handler.sink, _without(sc.oracle(), "shop.skipped"))
    assert all(d.ok for d in diffs), [d.describe() for d in diffs]
    orders = {r["id"]: r for r in handler.sink.read(_ident("shop", "orders")).to_pylist()}
    assert orders[3]["v"] == "changed-after" and 4 not in orders and 5 not in orders and orders[1]["note"] == "n"

    # the stream advanced past the snapshot: loading it again is refused, --force does it
    with pytest.raises(SnapshotConflictError, match=r"table shop\.orders: the stream already applied changes up to"):
        load_dumpling_snapshot(cfg, str(export), spark=spark, dialect=dialect)


def _without(oracle: Any, name: str) -> Any:
    oracle.tables.pop(name, None)
    return oracle


def _ident(schema: str, table: str) -> Any:
    from ticdc_delta.delta.sink import TableIdent

    return TableIdent(schema, table)


def _versions(lake: Path) -> dict[str, int]:
    return {f"{p.parent.name}.{p.name}": DeltaTable(str(p)).version()
            for p in sorted(lake.glob("*/*")) if (p / "_delta_log").is_dir()}


def test_a_crashed_load_reruns_to_the_same_tables_and_the_stream_waits_for_it(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    cfg = _config(tmp_path, "open-protocol", {})
    sc = Scenario("open-protocol", {}, partitions=2, topic="cdc")
    _before_snapshot(sc)
    _overlap(sc)
    export = tmp_path / "export"
    write_dumpling_export(sc, export, filetype="csv", rows_per_file=10)
    at_snapshot = _without(sc.oracle(), "shop.skipped")

    monkeypatch.setenv("TICDC_DELTA_FAULT", "snapshot_after_table@1")
    with pytest.raises(RuntimeError, match="injected fault after table 1"):
        load_dumpling_snapshot(cfg, str(export), spark=spark)
    assert sorted(_versions(tmp_path / "lake")) == ["shop.orders"]  # one table complete, the others untouched
    entries = StateStore(str(tmp_path / "ckpt" / "state"), "boot").load().meta["snapshots"]
    assert {e["table"]: e["status"] for e in entries.values()} == {"orders": "loading", "tmp": "loading", "w": "loading"}
    with pytest.raises(SnapshotConflictError, match=r"snapshot load of table shop\.\w+ at TSO \d+ .* did not finish"):
        _handler(cfg)(_frame(spark, sc.take(), {}), 0)

    monkeypatch.delenv("TICDC_DELTA_FAULT")
    caplog.clear()  # only the re-run's progress lines (the first load's may be captured too)
    with caplog.at_level("INFO", logger="ticdc_delta.progress"):
        summary = load_dumpling_snapshot(cfg, str(export), spark=spark)
    progress = [json.loads(r.getMessage()) for r in caplog.records if r.name == "ticdc_delta.progress"]
    assert [(p["table"], p["tables_done"], p["tables"]) for p in progress] == [
        ("shop.orders", 1, 3), ("shop.tmp", 2, 3), ("shop.w", 3, 3)]
    assert progress[-1]["total_rows"] == 31 and progress[-1]["total_bytes"] == summary.bytes > 0
    assert progress[-1]["rows_per_s"] > 0 and progress[0]["skipped"] == "already loaded from this snapshot"
    assert "2 table(s) loaded, 31 rows" in summary.describe() and "shop.orders: skipped" in summary.describe()
    assert [t.skipped for t in summary.tables if t.table == "orders"] == ["already loaded from this snapshot"]
    handler = _handler(cfg)
    diffs = compare_with_oracle(handler.sink, at_snapshot)
    assert all(d.ok for d in diffs), [d.describe() for d in diffs]
    versions = _versions(tmp_path / "lake")

    snapshots = collect_status(cfg)["snapshots"]
    assert {n: (e["status"], e["rows"]) for n, e in snapshots.items()} == {
        "shop.orders": ("done", 28), "shop.tmp": ("done", 1), "shop.w": ("done", 2)}

    again = load_dumpling_snapshot(cfg, str(export), spark=spark)  # idempotent: nothing written
    assert all(t.skipped for t in again.tables) and _versions(tmp_path / "lake") == versions
    assert all(d.ok for d in compare_with_oracle(handler.sink, at_snapshot))


def test_bad_files_are_typed_errors_naming_the_file_and_leave_no_half_loaded_table(
        spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = _config(tmp_path, "open-protocol", {})
    sc = Scenario("open-protocol", {}, partitions=2, topic="cdc")
    _before_snapshot(sc)
    export = tmp_path / "export"
    write_dumpling_export(sc, export, filetype="csv", rows_per_file=10)
    second = export / "shop.orders.000000001.csv"
    second.write_bytes(second.read_bytes()[:-9])  # truncated in the middle of its last row
    with pytest.raises(SnapshotFormatError, match=r"shop\.orders\.000000001\.csv: line \d+: .*truncated"):
        load_dumpling_snapshot(cfg, str(export), spark=spark)
    # nothing of it committed: no Delta version exists (delta-spark may have made an empty _delta_log)
    assert not list((tmp_path / "lake" / "shop" / "orders").glob("_delta_log/*.json"))
    with pytest.raises(TableNotFoundError):
        DeltaTable(str(tmp_path / "lake" / "shop" / "orders"))

    config = tmp_path / "job.yaml"
    config.write_text(json.dumps({
        "changefeed": "boot", "checkpoint": str(tmp_path / "ckpt2"), "sink": {"path": str(tmp_path / "lake2")},
        "source": {"bootstrap_servers": "127.0.0.1:9", "topic": "cdc", "protocol": "open-protocol"},
    }))
    os.remove(export / "metadata")
    assert main(["snapshot", "--config", str(config), "--from", "dumpling", str(export)]) == 1
    assert f"{export}/metadata: missing" in capsys.readouterr().err
    write_dumpling_export(sc, export, filetype="csv", rows_per_file=10)
    (export / "shop.w-schema.sql").write_text("CREATE TABLE `w` (`id` BIGINT NOT NULL, PRIMARY KEY (`id`)")
    assert main(["snapshot", "--config", str(config), "--from", "dumpling", str(export)]) == 1
    assert "shop.w-schema.sql: expected one CREATE TABLE statement" in capsys.readouterr().err
    assert not (tmp_path / "lake2").exists()


def test_snapshot_then_an_avro_stream_started_at_the_tso(spark: Any, tmp_path: Path) -> None:
    """Avro carries no commit ts (no seam possible): the changefeed starts exactly at the snapshot TSO, and
    the snapshot-created tables take the Avro rows (types, ENUM/SET labels, DECIMAL scale) as their own."""
    import uuid

    from confluent_kafka.schema_registry import SchemaRegistryClient

    from ticdc_delta.codec.avro import AvroSchemas

    url = f"mock://boot-{uuid.uuid4().hex[:8]}"
    schemas = AvroSchemas.from_registry(SchemaRegistryClient.new_client({"url": url}))
    cfg = config_from_mapping({
        "changefeed": "boot",
        "source": {"bootstrap_servers": "127.0.0.1:9", "topic": "cdc", "protocol": "avro",
                   "options": {"enable-tidb-extension": "true"}, "schema_registry": {"url": url}},
        "sink": {"path": str(tmp_path / "lake")},
        "checkpoint": str(tmp_path / "ckpt"),
    })
    sc = Scenario("avro", {"enable-tidb-extension": "true"}, partitions=2, topic="cdc", schemas=schemas)
    _before_snapshot(sc)
    _overlap(sc)
    sc.take()  # the changefeed starts at the snapshot TSO: nothing up to it is sent
    export = tmp_path / "export"
    write_dumpling_export(sc, export, filetype="csv")
    sc.update("shop", "orders", {"id": 3}, v="changed-after", amount="7.5")
    sc.delete("shop", "orders", id=5)
    sc.insert("shop", "orders", id=100, v="late", amount="0.01")
    sc.update("shop", "w", {"id": 2}, tx="after", e="a", st="y", d="2.25", bt=7, vb=b"\x01")
    sc.insert("shop", "tmp", id=2, v="new2")
    rest = sc.rest()

    load_dumpling_snapshot(cfg, str(export), spark=spark)
    handler = BatchHandler(cfg, avro_schema_source=schemas, partitions_of=lambda topic: [0, 1],
                           ddl_handler=DDLReplayer(cfg.ddl))
    handler(_frame(spark, rest, {}), 0)
    diffs = compare_with_oracle(handler.sink, sc.oracle())
    assert all(d.ok for d in diffs), [d.describe() for d in diffs]
