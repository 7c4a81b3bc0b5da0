"""The seam between a table's snapshot and its stream: changes the snapshot already holds are dropped.

A snapshot of a table taken at TSO ``S`` (Dumpling ``--snapshot``/``--consistency``, or a read with
``tidb_snapshot``) holds exactly the effect of every transaction with commit ts ≤ ``S``. A changefeed
created with ``--start-ts=S`` sends the changes with commit ts > ``S``; one started earlier sends some
the snapshot already holds. The rule: **for a table with a snapshot at ``S``, a row change or DDL of that
table with commit ts ≤ ``S`` is dropped; everything later applies as usual.** A table without a snapshot
is not affected. A DDL that names no table (CREATE/DROP DATABASE) is never dropped here: it acts on each
table of its schema, and the DDL replay leaves out each table whose own snapshot holds it
(:meth:`SnapshotSeam.holds`) — tables of one schema may be snapshotted at different TSOs, and some not at
all. A record without a
commit ts (Avro, Canal-JSON without the TiDB extension) cannot be placed: it is kept — start the
changefeed exactly at the snapshot TSO there.

Plain Python, no Spark: the planner applies it to records as they enter (:mod:`.batch_planner`).
"""

from __future__ import annotations

from typing import Iterable, Mapping

from ..errors import SnapshotConflictError
from .records import DDLRecord, Record

__all__ = ["SnapshotSeam", "seam_from_state"]


class SnapshotSeam:
    """Snapshot TSOs per ``(schema, table)`` (names as the planner compares them: folded unless the job is
    case-sensitive).

    Raises:
        ValueError: a TSO that is not a positive int.
    """

    def __init__(self, tsos: Mapping[tuple[str, str], int]) -> None:
        for key, ts in tsos.items():
            if not isinstance(ts, int) or isinstance(ts, bool) or ts <= 0:
                raise ValueError(f"snapshot TSO of {key!r} must be a positive int, got {ts!r}")
        self.tsos = dict(tsos)

    def __bool__(self) -> bool:
        return bool(self.tsos)

    def covers(self, record: Record) -> bool:
        """Whether the snapshot of ``record``'s table already holds it (so it must be dropped); never for a
        DDL that names no table (see the module docstring)."""
        if isinstance(record, DDLRecord) and not record.table:
            return False
        return self.holds(record.schema, record.table, record.commit_ts)

    def holds(self, schema: str, table: str, commit_ts: int | None) -> bool:
        """Whether the snapshot of ``schema.table`` holds the effect of a change at ``commit_ts`` (False for
        a table without a snapshot, or no commit ts)."""
        bound = self.tsos.get((schema, table))
        return bound is not None and commit_ts is not None and commit_ts <= bound

    def split(self, records: Iterable[Record]) -> tuple[list[Record], int]:
        """The records the snapshots do not hold, in order, and how many were dropped."""
        kept: list[Record] = []
        dropped = 0
        for rec in records:
            if self.covers(rec):
                dropped += 1
            else:
                kept.append(rec)
        return kept, dropped


def seam_from_state(snapshots: Mapping[str, Mapping[str, object]] | None) -> SnapshotSeam:
    """The seam of the snapshots the job state records (``meta["snapshots"]``, written by the
    ``snapshot`` command: per table ``schema``, ``table``, ``tso``, ``status``).

    Raises:
        SnapshotConflictError: a table whose load did not finish (status ``loading``): its Delta table may
            hold an older state than its recorded TSO, so no change of it can be placed yet.
    """
    tsos: dict[tuple[str, str], int] = {}
    for entry in (snapshots or {}).values():
        name = f"{entry.get('schema')}.{entry.get('table')}"
        if entry.get("status") != "done":
            raise SnapshotConflictError(
                f"the snapshot load of table {name} at TSO {entry.get('tso')} ({entry.get('source')}) did not "
                "finish: re-run the same `python -m ticdc_delta snapshot` command (it skips what was loaded), "
                "then run the job"
            )
        tsos[(str(entry["schema"]), str(entry["table"]))] = int(entry["tso"])  # type: ignore[call-overload]
    return SnapshotSeam(tsos)
