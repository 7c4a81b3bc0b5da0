"""Small-file compaction: the policy (no I/O) and the ``delta-rs`` engine's compaction of a real Delta table
written by many small MERGEs, with the app-transaction checks the engines rely on afterwards."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from ticdc_delta.config import CompactionConfig
from ticdc_delta.delta.compaction import (
    RETRY_AFTER_BATCHES,
    CompactionPolicy,
    compact_written_tables,
    delta_rs_compaction,
    files_by_partition,
    mark_due_tables,
)
from ticdc_delta.delta.sink import OP_COLUMN, DeltaRsSink, TableIdent, batch_txn

T = TableIdent("s", "t")
APP = "cf"
SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("p", pa.int64()), pa.field("v", pa.string())])
MiB = 1024**2


# --- the policy ---------------------------------------------------------------------------------------


def test_policy_counts_small_files_that_can_be_combined() -> None:
    policy = CompactionPolicy(min_files=4, target_file_size=100)
    assert policy.small_file_size == 50
    assert policy.compactable({(): [10, 20, 30]}) == 3
    assert not policy.due({(): [10, 20, 30]})
    assert policy.due({(): [10, 20, 30, 49]})
    assert not policy.due({(): [100, 500, 10, 20]})  # files at the target size or larger are not small
    assert not policy.due({})


def test_policy_does_not_count_files_of_half_the_target_or_more() -> None:
    # two files of half the target or more never share a compacted file: counting them made a table holding
    # min_files of them (what compaction leaves) due after every batch, each batch's file topping one up
    policy = CompactionPolicy(min_files=4, target_file_size=100)
    assert policy.compactable({(): [50, 60, 90, 99, 10]}) == 0 and not policy.due({(): [50, 60, 90, 99, 10]})
    assert policy.compactable({(): [49, 49, 90, 99]}) == 2
    assert CompactionPolicy(target_file_size=101).small_file_size == 51  # 50 + 50 < 101: small
    assert CompactionPolicy(target_file_size=1).small_file_size == 1


def test_policy_ignores_a_lone_small_file_per_partition() -> None:
    # one small file per partition: compaction cannot combine anything, so it must not be due
    policy = CompactionPolicy(min_files=3, target_file_size=100)
    one_each = {(("p", i),): [10, 1000] for i in range(10)}
    assert policy.compactable(one_each) == 0 and not policy.due(one_each)
    assert policy.due({(("p", 0),): [10, 10], (("p", 1),): [10], (("p", 2),): [5, 5, 500]})


def _append(path: str, rows: int, seed: int) -> None:
    """One micro-batch's file: ``rows`` rows of random (incompressible) values, ~16 bytes each."""
    rng = random.Random(seed)
    write_deltalake(path, pa.table({"k": pa.array([rng.getrandbits(62) for _ in range(rows)], pa.int64()),
                                    "v": pa.array([rng.random() for _ in range(rows)])}), mode="append")


def _sizes(path: str) -> dict[str, int]:
    adds = pa.table(DeltaTable(path).get_add_actions(flatten=True))
    return dict(zip(adds.column("path").to_pylist(), adds.column("size_bytes").to_pylist()))


def test_a_table_of_near_target_files_is_compacted_only_when_small_files_gather(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    for i in range(12):
        _append(path, 3000, i)  # what compactions leave: files of nearly the target size
    big = _sizes(path)
    policy = CompactionPolicy(min_files=10, target_file_size=max(big.values()) * 10 // 9)
    assert all(2 * size >= policy.target_file_size for size in big.values())
    # two batches' files beside 12 near-target ones: nothing to combine but the two, not due
    _append(path, 100, 100)
    _append(path, 100, 101)
    assert policy.compactable(files_by_partition(DeltaTable(path))) == 2
    assert not policy.due(files_by_partition(DeltaTable(path)))
    for i in range(8):
        _append(path, 100, 102 + i)
    dt = DeltaTable(path)
    assert policy.due(files_by_partition(dt))  # ten small files: due

    result = delta_rs_compaction(path, dt, policy)

    assert result.files_removed >= 10 and result.files_added <= 2
    assert not policy.due(files_by_partition(DeltaTable(path)))  # not due again right after
    assert DeltaTable(path).to_pyarrow_table().num_rows == 12 * 3000 + 10 * 100
    # and from then on a batch's file is not a reason to compact: about every min_files batches, not each
    compactions = 0
    batches = 45
    for b in range(batches):
        _append(path, 100, 200 + b)
        dt = DeltaTable(path)
        if policy.due(files_by_partition(dt)):
            assert delta_rs_compaction(path, dt, policy).files_removed >= policy.min_files - 1
            compactions += 1
            assert not policy.due(files_by_partition(DeltaTable(path)))
    assert 1 <= compactions <= batches // (policy.min_files - 1)
    after = _sizes(path)
    assert len([p for p in big if p in after]) >= 10  # the near-target files stay as they are
    # what is left: the near-target files, the compactions' files, the batches' files since the last one
    assert len(after) < len(big) + 2 * compactions + policy.min_files
    assert DeltaTable(path).to_pyarrow_table().num_rows == 12 * 3000 + (10 + batches) * 100


def test_policy_from_config_and_its_checks() -> None:
    cfg = CompactionConfig(min_files=7, target_file_size="64 MiB")
    assert CompactionPolicy.from_config(cfg) == CompactionPolicy(min_files=7, target_file_size=64 * MiB)
    assert CompactionPolicy.from_config(CompactionConfig()) == CompactionPolicy(50, 128 * MiB)
    with pytest.raises(ValueError, match="min_files must be >= 2"):
        CompactionPolicy(min_files=1)
    with pytest.raises(ValueError, match="target_file_size must be >= 1"):
        CompactionPolicy(target_file_size=0)


# --- the delta-rs engine, a real table ---------------------------------------------------------------


def _changes(batch: int) -> pa.Table:
    """Batch ``batch``'s changes: two new keys (a new file each batch); every tenth batch also an update
    and a delete of older keys (which rewrite the files holding them)."""
    ids, ops = [2 * batch, 2 * batch + 1], ["u", "u"]
    if batch % 10 == 9:
        ids += [batch, batch - 5]
        ops += ["u", "d"]
    return pa.table({"id": ids, "p": [i % 2 for i in ids], "v": [f"b{batch}-{i}" for i in ids], OP_COLUMN: ops})


def _written(tmp_path: Path, batches: int, *, partition_by: list[str] | None = None) -> DeltaRsSink:
    sink = DeltaRsSink(str(tmp_path))
    sink.ensure_table(T, SCHEMA, partition_by, batch_txn(APP + "/schema", 0))
    for b in range(batches):
        assert not sink.merge(T, _changes(b), ["id"], batch_txn(APP, b)).skipped
    return sink


def _rows(sink: DeltaRsSink) -> list[dict]:
    return sorted(sink.read(T).to_pylist(), key=lambda r: r["id"])


def _file_count(sink: DeltaRsSink) -> int:
    return len(DeltaTable(sink.table_path(*T)).file_uris())


def _commit(sink: DeltaRsSink, version: int) -> list[dict]:
    log = Path(sink.table_path(*T)) / "_delta_log" / f"{version:020d}.json"
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.mark.parametrize("partition_by", [None, ["p"]])
def test_many_small_merges_are_compacted_and_the_app_transactions_still_hold(
    tmp_path: Path, partition_by: list[str] | None
) -> None:
    sink = _written(tmp_path, 60, partition_by=partition_by)
    before_files, before_rows = _file_count(sink), _rows(sink)
    before_version = DeltaTable(sink.table_path(*T)).version()
    assert before_files >= 40
    meta: dict = {"totals": {"rows_applied": 1}}
    cfg = CompactionConfig(min_files=20, target_file_size="1 MiB")

    mark_due_tables(sink, [T, T], cfg, meta, 59)  # (before the batch's state save)
    seconds = compact_written_tables(sink, [T, T], cfg, delta_rs_compaction, meta, 59)

    assert seconds >= 0
    dt = DeltaTable(sink.table_path(*T))
    assert dt.version() == before_version + 1  # one commit, however many times the table was listed
    after_files = _file_count(sink)
    assert after_files <= (2 if partition_by else 1) < before_files
    assert _rows(sink) == before_rows
    # the compaction commit records no app transaction: the table's version for the changefeed is the
    # last batch's, so a re-run of that batch is still skipped and the next batch still applies
    commit = _commit(sink, dt.version())
    assert not [a for a in commit if "txn" in a]
    assert commit[0]["commitInfo"]["operation"] == "OPTIMIZE"
    assert all(not a["add"]["dataChange"] for a in commit if "add" in a)
    assert dt.transaction_version(APP) == batch_txn(APP, 59).version
    assert sink.merge(T, _changes(59), ["id"], batch_txn(APP, 59)).skipped
    assert sink.merge(T, _changes(0).slice(0, 1), ["id"], batch_txn(APP, 59)).skipped  # never half-applied
    assert _rows(sink) == before_rows
    assert not sink.merge(T, _changes(60), ["id"], batch_txn(APP, 60)).skipped
    assert {r["id"]: r["v"] for r in _rows(sink)}[120] == "b60-120"
    entry = meta["compaction"]["tables"]["s.t"]
    assert entry["compactions"] == 1 and entry["last_batch"] == 59
    assert entry["files_removed"] == before_files and entry["files_added"] == after_files
    assert meta["totals"] == {"rows_applied": 1}

    # nothing more to do until min_files small files gather again: no commit, no record change
    version = DeltaTable(sink.table_path(*T)).version()
    mark_due_tables(sink, [T], cfg, meta, 60)
    compact_written_tables(sink, [T], cfg, delta_rs_compaction, meta, 60)
    assert DeltaTable(sink.table_path(*T)).version() == version
    assert meta["compaction"]["tables"]["s.t"]["compactions"] == 1


def test_below_the_threshold_or_disabled_nothing_is_compacted(tmp_path: Path) -> None:
    sink = _written(tmp_path, 12)
    version = DeltaTable(sink.table_path(*T)).version()
    meta: dict = {}
    for tables, cfg in (([T], CompactionConfig(min_files=50)), ([T], CompactionConfig(enabled=False, min_files=2)),
                        ([TableIdent("s", "missing")], CompactionConfig(min_files=2))):
        mark_due_tables(sink, tables, cfg, meta, 11)
        compact_written_tables(sink, tables, cfg, delta_rs_compaction, meta, 11)
    assert DeltaTable(sink.table_path(*T)).version() == version
    assert meta == {}


def test_a_failed_compaction_is_logged_not_raised_and_tried_again_later(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = _written(tmp_path, 10)
    rows = _rows(sink)
    dt = DeltaTable(sink.table_path(*T))
    version = dt.version()
    # a data file vanishes under the table (a real failure of the compaction's read)
    lost = dt.file_uris()[0]
    moved = Path(str(tmp_path / "lost.parquet"))
    os.rename(lost.removeprefix("file://"), moved)
    cfg = CompactionConfig(min_files=5, target_file_size="1 MiB")
    meta: dict = {}

    with caplog.at_level("WARNING", logger="ticdc_delta.delta.compaction"):
        mark_due_tables(sink, [T], cfg, meta, 9)
        compact_written_tables(sink, [T], cfg, delta_rs_compaction, meta, 9)

    assert "compaction of s.t failed" in caplog.text
    entry = meta["compaction"]["tables"]["s.t"]
    assert entry["failed_batch"] == 9 and entry["error"]
    assert DeltaTable(sink.table_path(*T)).version() == version
    os.rename(moved, lost.removeprefix("file://"))
    # not retried before RETRY_AFTER_BATCHES batches have passed
    mark_due_tables(sink, [T], cfg, meta, 9 + RETRY_AFTER_BATCHES - 1)
    compact_written_tables(sink, [T], cfg, delta_rs_compaction, meta, 9 + RETRY_AFTER_BATCHES - 1)
    assert DeltaTable(sink.table_path(*T)).version() == version
    mark_due_tables(sink, [T], cfg, meta, 9 + RETRY_AFTER_BATCHES)
    compact_written_tables(sink, [T], cfg, delta_rs_compaction, meta, 9 + RETRY_AFTER_BATCHES)
    assert DeltaTable(sink.table_path(*T)).version() == version + 1
    entry = meta["compaction"]["tables"]["s.t"]
    assert entry["compactions"] == 1 and "failed_batch" not in entry and "error" not in entry
    assert _rows(sink) == rows


def test_a_compaction_the_job_does_not_live_through_is_a_failure_the_next_start_backs_off(tmp_path: Path) -> None:
    """The batch watchdog (batch_timeout) ends the run during a slow compaction, after the batch's state was
    saved: the restarted job found the table due after its next batch and the watchdog ended that run too,
    one batch per start. The tables due are marked in the state saved before the compaction; a mark the
    compaction never cleared is a failure, tried again RETRY_AFTER_BATCHES batches later."""
    sink = _written(tmp_path, 10)
    cfg = CompactionConfig(min_files=5, target_file_size="1 MiB")
    version = DeltaTable(sink.table_path(*T)).version()
    saved: dict = {}  # the meta saved with batch 9's state
    mark_due_tables(sink, [T], cfg, saved, 9)
    assert saved["compaction"]["tables"]["s.t"] == {"started_batch": 9, "started_version": version}
    # ... the compaction never comes back: the restarted job goes on from that state
    meta = json.loads(json.dumps(saved))
    mark_due_tables(sink, [T], cfg, meta, 10)  # before batch 10's save
    entry = meta["compaction"]["tables"]["s.t"]
    assert entry["failed_batch"] == 9 and "did not finish" in entry["error"] and "started_batch" not in entry
    compact_written_tables(sink, [T], cfg, delta_rs_compaction, meta, 10)
    assert DeltaTable(sink.table_path(*T)).version() == version  # backing off
    mark_due_tables(sink, [T], cfg, meta, 9 + RETRY_AFTER_BATCHES)
    assert meta["compaction"]["tables"]["s.t"]["started_batch"] == 9 + RETRY_AFTER_BATCHES
    compact_written_tables(sink, [T], cfg, delta_rs_compaction, meta, 9 + RETRY_AFTER_BATCHES)
    entry = meta["compaction"]["tables"]["s.t"]
    assert DeltaTable(sink.table_path(*T)).version() == version + 1
    assert entry["compactions"] == 1 and not {"started_batch", "failed_batch", "error"} & set(entry)
    # a table not due is not marked
    fresh: dict = {}
    mark_due_tables(sink, [T], cfg, fresh, 20)
    assert fresh == {}


def test_a_compaction_that_finished_before_the_job_ended_is_no_failure(tmp_path: Path) -> None:
    """The job ended after the compaction but before the next batch saved the cleared mark (a crash in the
    next batch): the table's log shows the compaction, so the mark just goes."""
    sink = _written(tmp_path, 10)
    cfg = CompactionConfig(min_files=5, target_file_size="1 MiB")
    saved: dict = {}
    mark_due_tables(sink, [T], cfg, saved, 9)
    done = json.loads(json.dumps(saved))
    compact_written_tables(sink, [T], cfg, delta_rs_compaction, done, 9)  # its record is lost with the crash
    assert done["compaction"]["tables"]["s.t"]["compactions"] == 1
    meta = json.loads(json.dumps(saved))
    mark_due_tables(sink, [T], cfg, meta, 10)
    assert meta["compaction"]["tables"]["s.t"] == {}


def test_files_by_partition_reads_the_snapshot(tmp_path: Path) -> None:
    sink = _written(tmp_path, 4, partition_by=["p"])
    sizes = files_by_partition(DeltaTable(sink.table_path(*T)))
    assert set(sizes) == {(("p", 0),), (("p", 1),)}
    assert sum(len(v) for v in sizes.values()) == _file_count(sink)
    assert all(s > 0 for v in sizes.values() for s in v)
