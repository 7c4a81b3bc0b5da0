"""The snapshot command's refusals, decided from the export and the job state before anything is written
(no Spark needed: they come first)."""

from __future__ import annotations

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
