"""The ``spark`` engine's small-file compaction (Delta Lake's OPTIMIZE) of a column-mapping table written by
many small commits, with the MERGE app-transaction checks the engine relies on afterwards (real Spark, real
Delta tables)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from ticdc_delta.config import CompactionConfig
from ticdc_delta.delta.compaction import (
    CompactionPolicy,
    compact_written_tables,
    delta_rs_compaction,
    files_by_partition,
    mark_due_tables,
)
from ticdc_delta.delta.sink import OP_COLUMN, DeltaRsSink, TableIdent, batch_txn
from ticdc_delta.spark.compaction import spark_compaction
from ticdc_delta.spark.delta_sink import SparkDeltaSink
from ticdc_delta.spark.engine import TXN_APP_ID_CONF, TXN_VERSION_CONF

integration = pytest.mark.integration

T = TableIdent("s", "t")
APP = "cf"
SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.string())])
BATCHES = 60


def _changes(batch: int) -> pa.Table:
    """Two new keys per batch; every tenth batch also an update and a delete of older keys."""
    ids, ops = [2 * batch, 2 * batch + 1], ["u", "u"]
    if batch % 10 == 9:
        ids += [batch, batch - 5]
        ops += ["u", "d"]
    return pa.table({"id": ids, "v": [f"b{batch}-{i}" for i in ids], OP_COLUMN: ops})


def _spark_merge(spark: Any, path: str, batch: int) -> int:
    """Batch ``batch``'s MERGE as the engine runs it (app transaction in the session's txn confs); the
    table's version after it."""
    from delta.tables import DeltaTable as SparkTable

    source = spark.createDataFrame(_changes(batch).to_pandas())
    txn = batch_txn(APP, batch)
    spark.conf.set(TXN_APP_ID_CONF, txn.app_id)
    spark.conf.set(TXN_VERSION_CONF, str(txn.version))
    try:
        (SparkTable.forPath(spark, path).alias("t").merge(source.alias("s"), "t.id <=> s.id")
         .whenMatchedDelete(f"s.`{OP_COLUMN}` = 'd'")
         .whenMatchedUpdate(f"s.`{OP_COLUMN}` = 'u'", {"v": "s.v"})
         .whenNotMatchedInsert(f"s.`{OP_COLUMN}` = 'u'", {"id": "s.id", "v": "s.v"})
         .execute())
    finally:
        spark.conf.unset(TXN_APP_ID_CONF)
        spark.conf.unset(TXN_VERSION_CONF)
    return DeltaTable(path).version()


def _rows(spark: Any, path: str) -> list[tuple[int, str]]:
    return sorted((r["id"], r["v"]) for r in spark.read.format("delta").load(path).collect())


def _commit(path: str, version: int) -> list[dict]:
    log = Path(path) / "_delta_log" / f"{version:020d}.json"
    return [json.loads(line) for line in log.read_text().splitlines()]


@integration
def test_a_column_mapping_table_of_many_small_commits_is_compacted_by_optimize(spark: Any, tmp_path: Path) -> None:
    base = DeltaRsSink(str(tmp_path))
    sink = SparkDeltaSink(base, spark)
    assert sink.ensure_table(T, SCHEMA, None, batch_txn(APP + "/schema", 0))
    path = sink.table_path(*T)
    # the small commits: delta-rs merges (fast) for most batches, the engine's Spark MERGE for the last ones
    for b in range(BATCHES - 3):
        assert not base.merge(T, _changes(b), ["id"], batch_txn(APP, b)).skipped
    for b in range(BATCHES - 3, BATCHES):
        _spark_merge(spark, path, b)
    dt = DeltaTable(path)
    assert dt.metadata().configuration["delta.columnMapping.mode"] == "name"
    before_files, before_rows, before_version = len(dt.file_uris()), _rows(spark, path), dt.version()
    assert before_files >= 40
    with pytest.raises(NotImplementedError, match="column mapping"):  # why each engine compacts its own way
        delta_rs_compaction(path, dt, None)  # type: ignore[arg-type]

    # txn confs left on the job's session must not reach the compaction (it runs in a session of its own)
    spark.conf.set(TXN_APP_ID_CONF, APP)
    spark.conf.set(TXN_VERSION_CONF, str(batch_txn(APP, 999).version))
    meta: dict = {}
    try:
        cfg = CompactionConfig(min_files=20, target_file_size="1 MiB")
        mark_due_tables(base, [T], cfg, meta, BATCHES - 1)
        compact_written_tables(base, [T], cfg, spark_compaction(spark), meta, BATCHES - 1)
    finally:
        spark.conf.unset(TXN_APP_ID_CONF)
        spark.conf.unset(TXN_VERSION_CONF)

    dt = DeltaTable(path)
    assert dt.version() == before_version + 1
    assert len(dt.file_uris()) == 1 < before_files
    assert _rows(spark, path) == before_rows
    commit = _commit(path, dt.version())
    assert not [a for a in commit if "txn" in a]
    assert commit[0]["commitInfo"]["operation"] == "OPTIMIZE"
    assert dt.transaction_version(APP) == batch_txn(APP, BATCHES - 1).version
    entry = meta["compaction"]["tables"]["s.t"]
    assert entry == {"compactions": 1, "files_removed": before_files, "files_added": 1,
                     "last_batch": BATCHES - 1}
    # a re-run of the last batch's MERGE is still skipped by Delta; the next batch's applies
    assert _spark_merge(spark, path, BATCHES - 1) == dt.version()
    assert _rows(spark, path) == before_rows
    assert _spark_merge(spark, path, BATCHES) == dt.version() + 1
    assert (2 * BATCHES, f"b{BATCHES}-{2 * BATCHES}") in _rows(spark, path)


def _append(spark: Any, path: str, first: int, rows: int) -> None:
    """One file of ``rows`` new keys from ``first`` (random, hardly compressible values), appended by Spark."""
    rng = random.Random(first)
    frame = pa.table({"id": list(range(first, first + rows)),
                      "v": [f"{rng.getrandbits(64):016x}" for _ in range(rows)]})
    spark.createDataFrame(frame.to_pandas()).coalesce(1).write.format("delta").mode("append").save(path)


def _sizes(path: str) -> dict[str, int]:
    adds = pa.table(DeltaTable(path).get_add_actions(flatten=True))
    return dict(zip(adds.column("path").to_pylist(), adds.column("size_bytes").to_pylist()))


@integration
def test_optimize_rewrites_the_small_files_the_policy_counts_not_the_near_target_ones(
    spark: Any, tmp_path: Path
) -> None:
    base = DeltaRsSink(str(tmp_path))
    sink = SparkDeltaSink(base, spark)
    assert sink.ensure_table(T, SCHEMA, None, batch_txn(APP + "/schema", 0))
    path = sink.table_path(*T)
    for i in range(3):
        _append(spark, path, i * 16_000, 16_000)  # files as compactions leave them: near the target size
    big = _sizes(path)
    for i in range(3):
        _append(spark, path, 100_000 + i * 10, 10)  # three batches' files
    small = {p: size for p, size in _sizes(path).items() if p not in big}
    policy = CompactionPolicy(min_files=2, target_file_size=max(big.values()) * 10 // 9)
    assert len(big) == 3 and len(small) == 3
    assert all(2 * size >= policy.target_file_size for size in big.values())
    # OPTIMIZE binning every file below the target (minFileSize = the target) would put a near-target file
    # in with the small ones and rewrite it: it must rewrite only the small files the policy counts
    assert sum(small.values()) + min(big.values()) <= policy.target_file_size
    dt = DeltaTable(path)
    assert policy.compactable(files_by_partition(dt)) == 3
    rows = _rows(spark, path)

    result = spark_compaction(spark)(path, dt, policy)

    after = _sizes(path)
    assert (result.files_removed, result.files_added) == (3, 1)
    assert set(big) <= set(after) and not set(small) & set(after)
    assert not policy.due(files_by_partition(DeltaTable(path)))
    assert _rows(spark, path) == rows
