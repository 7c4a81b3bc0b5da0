"""The snapshot seam: changes a table's snapshot already holds (commit ts ≤ its TSO) are dropped."""

from __future__ import annotations

import pytest

from ticdc_delta.core.batch_planner import OFFSET_ORDER, WATERMARK, ConsumerState, ResolvedMark, plan_batch
from ticdc_delta.core.merge import KeyResolver
from ticdc_delta.core.records import ChangeRecord, DDLRecord
from ticdc_delta.core.snapshot_seam import SnapshotSeam


def row(ts, offset, id_, table="t", schema="s", partition=0):
    return ChangeRecord(ts, "cdc", partition, offset, 0, schema, table, "insert", (("id", 8, 0x0A, id_),), None)


def ddl(ts, offset, table="t", query="ALTER TABLE t ADD COLUMN c INT"):
    return DDLRecord(ts, "cdc", 0, offset, 0, "s", table, query, 5)


def applied_ids(plan, table="t"):
    out = []
    for step in plan.steps:
        if hasattr(step, "tables") and ("s", table) in step.tables:
            out += sorted(k[0] for k in step.tables[("s", table)].changes)
    return out


def test_rows_and_ddl_at_or_below_the_tso_are_dropped_for_that_table_only() -> None:
    seam = SnapshotSeam({("s", "t"): 100})
    records = [row(99, 0, 1), row(100, 1, 2), ddl(100, 2), row(101, 3, 3), row(50, 4, 4, table="other")]
    p = plan_batch(ConsumerState(), records, [ResolvedMark("cdc", 0, 9, 0, 200)], mode=WATERMARK,
                   keys=KeyResolver(), partitions={"cdc": [0]}, seam=seam)
    assert p.snapshot_dropped == 3
    assert applied_ids(p) == [3]
    assert applied_ids(p, "other") == [4]  # a table without a snapshot behaves as before
    assert not any(isinstance(s, DDLRecord) for s in p.steps)


def test_held_rows_below_a_later_snapshot_are_dropped_too_and_offset_order_keeps_unplaceable_rows() -> None:
    held = ConsumerState({("cdc", 0): 10}, [row(90, 0, 1), row(120, 1, 2)], [])
    p = plan_batch(held, [], [ResolvedMark("cdc", 0, 5, 0, 200)], mode=WATERMARK, keys=KeyResolver(),
                   partitions={"cdc": [0]}, seam=SnapshotSeam({("s", "t"): 100}))
    assert p.snapshot_dropped == 1 and applied_ids(p) == [2]
    q = plan_batch(ConsumerState(), [row(None, 0, 7), row(90, 1, 8)], [], mode=OFFSET_ORDER, keys=KeyResolver(),
                   seam=SnapshotSeam({("s", "t"): 100}))
    assert q.snapshot_dropped == 1 and applied_ids(q) == [7]


def test_database_ddl_is_kept_and_each_table_says_whether_its_snapshot_holds_it() -> None:
    """A DDL naming no table acts on each table of its schema; their snapshots may differ, and a table of
    the schema may have none: the DDL replay asks :meth:`SnapshotSeam.holds` table by table."""
    seam = SnapshotSeam({("s", "a"): 100, ("s", "b"): 50})
    for ts in (40, 60, 150):
        assert not seam.covers(ddl(ts, 0, table="", query="DROP DATABASE s"))
    assert seam.holds("s", "a", 60) and not seam.holds("s", "b", 60) and seam.holds("s", "b", 50)
    assert not seam.holds("s", "c", 1) and not seam.holds("s", "a", None)
    assert not SnapshotSeam({}).covers(row(1, 0, 1)) and not SnapshotSeam({})
    with pytest.raises(ValueError, match="positive int"):
        SnapshotSeam({("s", "t"): 0})
