"""DeltaRsSink's overwrites (rewrite, TRUNCATE) racing another writer's real commit to the same table."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from ticdc_delta.delta.sink import DeltaRsSink, TableIdent, Txn

pytestmark = pytest.mark.integration  # real Delta tables

T = TableIdent("db", "t")
SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string()), ("c", pa.int64())])


def _optimize(path: str) -> None:
    """A user's OPTIMIZE: the table's files compacted into one (the same rows, new files)."""
    DeltaTable(path).optimize.compact()


def _append(path: str) -> None:
    """Another writer's append of row 4."""
    write_deltalake(path, pa.table({"id": [4], "v": ["d"], "c": [4]}, schema=SCHEMA), mode="append")


class InterruptedSink(DeltaRsSink):
    """Runs ``other`` (another writer's commit) once, right after the next snapshot this sink loads: between
    the load an overwrite is built from and its commit."""

    other: Callable[[str], None] | None = None

    def _load(self, path: str) -> DeltaTable | None:
        dt = super()._load(path)
        other, self.other = self.other, None
        if dt is not None and other is not None:
            other(path)
        return dt


def _table(tmp_path: Path) -> InterruptedSink:
    """A sink whose table db.t holds rows 1, 2, 3 and 5 in two files (so an OPTIMIZE has work to do)."""
    sink = InterruptedSink(str(tmp_path), retry_backoff_s=0.001)
    path = sink.table_path(*T)
    write_deltalake(path, pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"], "c": [1, 2, 3]}, schema=SCHEMA))
    write_deltalake(path, pa.table({"id": [5], "v": ["e"], "c": [5]}, schema=SCHEMA), mode="append")
    return sink


def _rows(sink: DeltaRsSink) -> list[tuple]:
    return sorted(tuple(r.values()) for r in sink.read(T).to_pylist())


@pytest.mark.parametrize("other,expected", [
    (_optimize, [(1, "a"), (2, "b"), (3, "c"), (5, "e")]),
    (_append, [(1, "a"), (2, "b"), (3, "c"), (4, "d"), (5, "e")]),
], ids=["optimize", "append"])
def test_a_rewrite_racing_another_commit_keeps_each_row_once(
    tmp_path: Path, other: Callable[[str], None], expected: list[tuple]
) -> None:
    """Regression: delta-rs 1.6.6 committed the rewrite (here DROP COLUMN c) on top of the other writer's commit,
    whose files stayed next to the rewrite's: an OPTIMIZE's left every row twice, and an append's row, read
    again by a second load of the table, was there twice. The rewrite is redone from a fresh snapshot now."""
    sink = _table(tmp_path)
    sink.other = other
    assert sink.drop_column(T, "c", Txn("cf", 1)) is True
    assert sink.other is None  # (the other writer did commit in between)
    assert sink.table_schema(T).names == ["id", "v"]
    assert _rows(sink) == expected


@pytest.mark.parametrize("other", [_optimize, _append], ids=["optimize", "append"])
def test_a_truncate_racing_another_commit_leaves_no_row(tmp_path: Path, other: Callable[[str], None]) -> None:
    """Regression: a TRUNCATE committed on top of a user's OPTIMIZE left every row (the compacted file), on top
    of an append the appended row."""
    sink = _table(tmp_path)
    sink.other = other
    assert sink.overwrite_empty(T, Txn("cf", 1)) is True
    assert sink.other is None
    assert _rows(sink) == []
    assert sink.overwrite_empty(T, Txn("cf", 1)) is False  # (committed once, with its transaction)
