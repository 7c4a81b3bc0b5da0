"""Tables that share one Delta location (a wildcard ``tables[]`` entry's shards) on real Spark and real Delta
tables: the snapshot loads them together, in one overwrite commit — loaded one by one, the first was
loaded and the others marked done without their rows, and the stream then dropped their changes up to the
TSO. A re-run after a crash skips exactly what a commit of these tables holds."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from ticdc_delta.config import config_from_mapping
from ticdc_delta.delta.state_store import StateStore
from ticdc_delta.errors import SnapshotConflictError
from ticdc_delta.simulator.dumpling_export import write_dumpling_export
from ticdc_delta.simulator.scenario import Scenario
from ticdc_delta.snapshot.load import load_dumpling_snapshot

pytestmark = pytest.mark.integration


def _config(tmp_path: Path, tables: list[dict[str, Any]]) -> Any:
    return config_from_mapping({
        "changefeed": "boot", "checkpoint": str(tmp_path / "ckpt"), "sink": {"path": str(tmp_path / "lake")},
        "source": {"bootstrap_servers": "127.0.0.1:9", "topic": "cdc", "protocol": "open-protocol"},
        "tables": tables,
    })


def _export(tmp_path: Path, *, shards: tuple[str, ...] = ("db_1", "db_2"), name: str = "export") -> tuple[Path, int]:
    """``a.first`` (a table of its own), then shards ``db_N.t``: db_2's key is a BIGINT and it has a column
    db_1 lacks."""
    sc = Scenario("open-protocol", {}, partitions=1)
    sc.ddl("CREATE TABLE `a`.`first` (`id` INT NOT NULL, PRIMARY KEY (`id`))")
    sc.insert("a", "first", id=1)
    if "db_1" in shards:
        sc.ddl("CREATE TABLE `db_1`.`t` (`id` INT NOT NULL, `v` VARCHAR(5), PRIMARY KEY (`id`))")
        sc.insert("db_1", "t", id=1, v="a")
        sc.insert("db_1", "t", id=2, v="b")
    if "db_2" in shards:
        sc.ddl("CREATE TABLE `db_2`.`t` (`id` BIGINT NOT NULL, `note` VARCHAR(5), `V` VARCHAR(5), PRIMARY KEY (`id`))")
        for i in (1001, 1002, 1003):
            sc.insert("db_2", "t", id=i, V=f"x{i}", note="n")
    return tmp_path / name, write_dumpling_export(sc, tmp_path / name)


ALL_ROWS = [(1, "a", None), (2, "b", None), (1001, "x1001", "n"), (1002, "x1002", "n"), (1003, "x1003", "n")]


def _rows(path: Path) -> list[tuple[Any, ...]]:
    table = DeltaTable(str(path)).to_pyarrow_table()
    columns = [table.column(c).to_pylist() if c in table.column_names else [None] * table.num_rows
               for c in ("id", "v", "note")]
    return sorted(zip(*columns))


def _recorded(tmp_path: Path) -> dict[str, tuple[str, int, int]]:
    entries = StateStore(str(tmp_path / "ckpt" / "state"), "boot").load().meta["snapshots"]
    return {f"{e['schema']}.{e['table']}": (e["status"], e["tso"], e.get("rows")) for e in entries.values()}


def test_shards_of_one_location_are_loaded_together(spark: Any, tmp_path: Path) -> None:
    merged = tmp_path / "lake" / "merged"
    cfg = _config(tmp_path, [{"source": "db_*.t", "path": str(merged)}])
    export, tso = _export(tmp_path)

    summary = load_dumpling_snapshot(cfg, str(export), spark=spark)
    assert [(t.schema, t.table, t.path, t.rows, t.skipped) for t in summary.tables] == [
        ("a", "first", str(tmp_path / "lake" / "a" / "first"), 1, None),
        ("db_1", "t", str(merged), 2, None), ("db_2", "t", str(merged), 3, None)]
    assert _rows(merged) == ALL_ROWS
    # one commit; the columns by name (db_2's `V` is db_1's `v`), the key of the wider type
    table = DeltaTable(str(merged))
    assert table.version() == 0 and len(table.history()) == 1
    assert table.to_pyarrow_table().schema.names == ["id", "v", "note"]
    assert table.to_pyarrow_table().schema.field("id").type == pa.int64()
    assert _recorded(tmp_path) == {"a.first": ("done", tso, 1), "db_1.t": ("done", tso, 2), "db_2.t": ("done", tso, 3)}
    assert "3 table(s) loaded, 6 rows" in summary.describe()

    # the same snapshot again: everything is in, nothing is written
    again = load_dumpling_snapshot(cfg, str(export), spark=spark)
    assert [(t.table, t.rows, t.skipped) for t in again.tables] == [
        ("first", 1, "already loaded from this snapshot"), ("t", 2, "already loaded from this snapshot"),
        ("t", 3, "already loaded from this snapshot")]
    assert DeltaTable(str(merged)).version() == 0 and _rows(merged) == ALL_ROWS


@pytest.mark.parametrize("after", [1, 2])
def test_a_crashed_load_of_shards_reruns_to_all_their_rows(spark: Any, tmp_path: Path, after: int,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash after ``a.first`` (the shards not committed yet) or after the shards' commit (not recorded
    done yet): the re-run loads what is missing, once, and records every table done."""
    merged = tmp_path / "lake" / "merged"
    cfg = _config(tmp_path, [{"source": "db_*.t", "path": str(merged)}])
    export, tso = _export(tmp_path)
    monkeypatch.setenv("TICDC_DELTA_FAULT", f"snapshot_after_table@{after}")
    with pytest.raises(RuntimeError, match=f"injected fault after table {after}"):
        load_dumpling_snapshot(cfg, str(export), spark=spark)
    assert {v[0] for v in _recorded(tmp_path).values()} == {"loading"}
    assert merged.exists() == (after == 2)

    monkeypatch.delenv("TICDC_DELTA_FAULT")
    summary = load_dumpling_snapshot(cfg, str(export), spark=spark)
    skipped = {f"{t.schema}.{t.table}": t.skipped is not None for t in summary.tables}
    assert skipped == {"a.first": True, "db_1.t": after == 2, "db_2.t": after == 2}
    assert _rows(merged) == ALL_ROWS and len(DeltaTable(str(merged)).history()) == 1
    assert {k: v[:2] for k, v in _recorded(tmp_path).items()} == {
        "a.first": ("done", tso), "db_1.t": ("done", tso), "db_2.t": ("done", tso)}


def test_a_location_one_shard_was_loaded_into_at_the_same_tso_gets_every_shard(spark: Any, tmp_path: Path) -> None:
    """db_1.t alone was loaded at the TSO (the mapping named it only); the wildcard mapping then adds db_2.t
    to the location: the same snapshot loads both, its commit of db_1.t alone is no proof db_2.t is in."""
    merged = tmp_path / "lake" / "merged"
    export, tso = _export(tmp_path)
    load_dumpling_snapshot(_config(tmp_path, [{"source": "db_1.t", "path": str(merged)}]), str(export), spark=spark)
    assert _rows(merged) == ALL_ROWS[:2]

    summary = load_dumpling_snapshot(_config(tmp_path, [{"source": "db_*.t", "path": str(merged)}]), str(export),
                                     spark=spark)
    assert {f"{t.schema}.{t.table}": (t.rows, t.skipped) for t in summary.tables if t.path == str(merged)} == {
        "db_1.t": (2, None), "db_2.t": (3, None)}
    assert _rows(merged) == ALL_ROWS
    assert _recorded(tmp_path)["db_2.t"] == ("done", tso, 3)


def test_a_snapshot_of_some_shards_loads_only_into_a_location_started_over(spark: Any, tmp_path: Path) -> None:
    merged = tmp_path / "lake" / "merged"
    cfg = _config(tmp_path, [{"source": "db_*.t", "path": str(merged)}])
    load_dumpling_snapshot(cfg, str(_export(tmp_path)[0]), spark=spark)
    some, tso = _export(tmp_path, shards=("db_1",), name="some")
    with pytest.raises(SnapshotConflictError, match=r"also holds rows of db_2\.t"):
        load_dumpling_snapshot(cfg, str(some), spark=spark, force=True)
    assert _rows(merged) == ALL_ROWS

    shutil.rmtree(merged)  # the way out the message names: start the location over
    load_dumpling_snapshot(cfg, str(some), spark=spark, force=True)  # (its TSO is older: force)
    assert _rows(merged) == ALL_ROWS[:2] and _recorded(tmp_path)["db_1.t"] == ("done", tso, 2)
