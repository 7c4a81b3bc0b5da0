"""The snapshot command's refusals, decided from the export and the job state before anything is written
(no Spark needed: they come first)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ticdc_delta.config import config_from_mapping
from ticdc_delta.delta.state_store import PipelineState, StateStore
from ticdc_delta.errors import ConfigError, SnapshotConflictError
from ticdc_delta.simulator.dumpling_export import write_dumpling_export
from ticdc_delta.simulator.scenario import Scenario
from ticdc_delta.snapshot.load import load_dumpling_snapshot, snapshot_key


def _setup(tmp_path: Path, tables: list | None = None) -> tuple[object, Path, int]:
    cfg = config_from_mapping({
        "changefeed": "boot", "checkpoint": str(tmp_path / "ckpt"), "sink": {"path": str(tmp_path / "lake")},
        "source": {"bootstrap_servers": "127.0.0.1:9", "topic": "cdc", "protocol": "open-protocol"},
        "tables": tables or [],
    })
    sc = Scenario("open-protocol", {}, partitions=1)
    sc.ddl("CREATE TABLE `Shop`.`Orders` (`id` INT NOT NULL, `v` VARCHAR(5), PRIMARY KEY (`id`))")
    sc.insert("Shop", "Orders", id=1, v="a")
    tso = write_dumpling_export(sc, tmp_path / "export")
    return cfg, tmp_path / "export", tso


def _state(tmp_path: Path, meta: dict) -> None:
    StateStore(str(tmp_path / "ckpt" / "state"), "boot").save(3, PipelineState(3, {("cdc", 0): 5}, [], meta))


def test_a_table_the_stream_advanced_past_is_refused(tmp_path: Path) -> None:
    cfg, export, tso = _setup(tmp_path)
    _state(tmp_path, {"tables": {"shop.orders": {"commit_ts": tso + 1}}})
    with pytest.raises(SnapshotConflictError, match=rf"table shop\.orders: the stream already applied changes up to "
                                                    rf"commit ts {tso + 1}, after this snapshot's TSO {tso}.*--force"):
        load_dumpling_snapshot(cfg, str(export), spark=None)
    state = StateStore(str(tmp_path / "ckpt" / "state"), "boot").load()
    assert state.batch_id == 3 and "snapshots" not in state.meta  # nothing recorded


def test_an_older_snapshot_than_the_recorded_one_is_refused(tmp_path: Path) -> None:
    cfg, export, tso = _setup(tmp_path)
    _state(tmp_path, {"snapshots": {snapshot_key("shop", "orders"): {
        "schema": "shop", "table": "orders", "tso": tso + 10, "status": "done", "source": "/newer"}}})
    with pytest.raises(SnapshotConflictError, match=rf"a newer snapshot \(TSO {tso + 10}, /newer\) is already recorded"):
        load_dumpling_snapshot(cfg, str(export), spark=None)


def test_key_and_partition_columns_must_exist_in_the_snapshot(tmp_path: Path) -> None:
    cfg, export, _ = _setup(tmp_path, [{"source": "shop.orders", "key": ["nope"]}])
    with pytest.raises(ConfigError, match=r"tables\[Shop\.Orders\]\.key: columns \['nope'\] are not in the snapshot's "
                                          r"schema file .*Shop\.Orders-schema\.sql"):
        load_dumpling_snapshot(cfg, str(export), spark=None)
    cfg, export, _ = _setup(tmp_path, [{"source": "shop.*", "partition_by": ["missing"]}])
    with pytest.raises(ConfigError, match=r"partition_by: columns \['missing'\]"):
        load_dumpling_snapshot(cfg, str(export), spark=None)


def _shards(tmp_path: Path, tables: list, *, second_v: tuple[str, object] = ("VARCHAR(5)", "b"),
            shards: tuple[str, ...] = ("db_1", "db_2")) -> tuple[object, Path, int]:
    """Shards ``db_N.t`` of one table, merged by the ``tables`` mapping."""
    cfg = config_from_mapping({
        "changefeed": "boot", "checkpoint": str(tmp_path / "ckpt"), "sink": {"path": str(tmp_path / "lake")},
        "source": {"bootstrap_servers": "127.0.0.1:9", "topic": "cdc", "protocol": "open-protocol"},
        "tables": tables,
    })
    sc = Scenario("open-protocol", {}, partitions=1)
    for n, db in enumerate(shards):
        v, value = ("VARCHAR(5)", "a") if n == 0 else second_v
        sc.ddl(f"CREATE TABLE `{db}`.`t` (`id` INT NOT NULL, `v` {v}, PRIMARY KEY (`id`))")
        sc.insert(db, "t", id=n + 1, v=value)
    tso = write_dumpling_export(sc, tmp_path / "export")
    return cfg, tmp_path / "export", tso


@pytest.mark.parametrize("recorded", ["snapshot", "stream"])
def test_a_snapshot_without_every_table_of_a_shared_location_is_refused(tmp_path: Path, recorded: str) -> None:
    """The export has db_1.t only, but the shared table also holds db_2.t's rows (an earlier snapshot
    loaded them, or the stream wrote them): overwriting it would lose them, ``--force`` or not."""
    import pyarrow as pa
    from deltalake import write_deltalake

    merged = str(tmp_path / "lake" / "merged")
    cfg, export, tso = _shards(tmp_path, [{"source": "db_*.t", "path": merged}], shards=("db_1",))
    write_deltalake(merged, pa.table({"id": pa.array([2], pa.int32()), "v": ["x"]}))
    if recorded == "snapshot":
        _state(tmp_path, {"snapshots": {snapshot_key("db_2", "t"): {
            "schema": "db_2", "table": "t", "tso": tso - 1, "status": "done", "source": "/old", "path": merged}}})
    else:
        _state(tmp_path, {"tables": {"db_2.t": {"commit_ts": tso - 1, "location": merged}}})
    for force in (False, True):
        with pytest.raises(SnapshotConflictError, match=rf"{re.escape(merged)}: this snapshot \(.*export\) has db_1\.t for this "
                                                        r"Delta table, but the job state says it also holds rows of "
                                                        r"db_2\.t.*move the Delta table away to start it over"):
            load_dumpling_snapshot(cfg, str(export), spark=None, force=force)
    state = StateStore(str(tmp_path / "ckpt" / "state"), "boot").load()
    assert snapshot_key("db_1", "t") not in state.meta.get("snapshots", {})  # nothing recorded


def test_shards_whose_column_no_one_type_holds_are_refused(tmp_path: Path) -> None:
    """A text column in one shard, a binary one in the other: no Delta column holds both (int and bigint, or
    text and numbers, do: bigint, text)."""
    cfg, export, _ = _shards(tmp_path, [{"source": "db_*.t", "path": str(tmp_path / "merged")}],
                             second_v=("BLOB", b"\x00"))
    with pytest.raises(ConfigError, match=r"tables\[\]\.path .*merged: tables db_1\.t and db_2\.t land in this one "
                                          r"Delta table, but column 'v' is string in db_1\.t and binary in db_2\.t.*"
                                          r"own tables\[\]\.path"):
        load_dumpling_snapshot(cfg, str(export), spark=None)
    state = StateStore(str(tmp_path / "ckpt" / "state"), "boot").load()
    assert state is None  # nothing recorded


def test_entries_of_one_location_must_partition_it_alike(tmp_path: Path) -> None:
    merged = str(tmp_path / "merged")
    cfg, export, _ = _shards(tmp_path, [{"source": "db_1.t", "path": merged, "partition_by": ["v"]},
                                        {"source": "db_2.t", "path": merged}])
    with pytest.raises(ConfigError, match=r"tables db_1\.t, db_2\.t land in this one Delta table but their tables\[\] "
                                          r"entries partition it differently"):
        load_dumpling_snapshot(cfg, str(export), spark=None)
