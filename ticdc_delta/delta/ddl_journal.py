"""Where a micro-batch stood before its last table-level DDL: what a re-run of the batch resumes from.

A table's own commits are idempotent through its Delta log (each carries the batch's app transaction),
but a DDL that changes which table a name refers to — RENAME TABLE, DROP TABLE, DROP DATABASE, CREATE
TABLE — moves or removes the very logs those checks read. Re-running a batch whose first attempt got past
``RENAME TABLE a TO b`` would MERGE the rows before the RENAME into a new, stale table ``a`` (``a``'s log
is now ``b``'s) and then refuse to move it onto ``b``: the job could never start again.

So before each such DDL the applier writes a :class:`JournalEntry` — the batch, the DDL's ordinal among
the batch's DDL, the per-table step counters, the DDL-known column types (the catalog) and the counts so
far — to a one-row Delta table beside the state (``<checkpoint>/ddl_journal``). Everything before that
DDL is committed by then, as steps run in order. A re-run of the same batch (same app id, same batch id)
skips every step before the entry's DDL without touching a table, takes the counters, catalog and counts
from the entry, and runs that DDL and the rest as the first attempt would have: the DDL itself is
idempotent alone (a move already done, or whose copy is complete, finishes; a dropped table stays
dropped). An entry of another batch or app id (an older batch, a reset's new epoch) is ignored.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Mapping

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError, TableNotFoundError

from ..errors import SinkError
from .sink import run_commit
from .state_store import vacuum_due

__all__ = ["JournalEntry", "DDLJournal", "JOURNAL_FORMAT"]

log = logging.getLogger(__name__)

JOURNAL_FORMAT = 1

_SCHEMA = pa.schema([
    pa.field("format", pa.int32()),
    pa.field("app_id", pa.string()),
    pa.field("batch_id", pa.int64()),
    pa.field("ddl_ordinal", pa.int64()),
    pa.field("payload", pa.string()),
])


@dataclass
class JournalEntry:
    """A batch's progress just before its DDL number ``ddl_ordinal`` (0-based, in apply order).

    Attributes:
        ddl: ``[commit ts, query]`` of that DDL: a re-run checks that it has the same one there.
        steps: ``(schema, table)`` → the data commits the batch had numbered for it.
        catalog: the applier's :class:`~ticdc_delta.delta.applier.TableCatalog` as JSON.
        result: the batch's :class:`~ticdc_delta.delta.applier.ApplyResult` so far, as a dict.
    """

    app_id: str
    batch_id: int
    ddl_ordinal: int
    ddl: list[Any]
    steps: dict[tuple[str, str], int] = field(default_factory=dict)
    catalog: dict[str, Any] = field(default_factory=dict)
    result: dict[str, Any] = field(default_factory=dict)

    def payload(self) -> str:
        steps = [[s, t, n] for (s, t), n in self.steps.items()]
        return json.dumps({"ddl": self.ddl, "steps": steps, "catalog": self.catalog, "result": self.result},
                          sort_keys=True)

    @classmethod
    def from_payload(cls, app_id: str, batch_id: int, ordinal: int, payload: str) -> "JournalEntry":
        data = json.loads(payload)
        steps = {(s, t): int(n) for s, t, n in data["steps"]}
        return cls(app_id, batch_id, ordinal, list(data["ddl"]), steps, dict(data["catalog"]), dict(data["result"]))


class DDLJournal:
    """The one-row journal table at ``path`` (delta-rs; a few hundred bytes per table-level DDL).

    Raises (every method):
        SinkError: the table cannot be read or written, or holds something this version cannot read.
    """

    def __init__(self, path: str, *, storage_options: Mapping[str, str] | None = None, vacuum_every: int = 64) -> None:
        if not path:
            raise ValueError("path must be a non-empty path or URI")
        self.path = path
        self._storage_options = dict(storage_options) if storage_options else None
        self._vacuum_every = vacuum_every

    def _table(self) -> DeltaTable | None:
        try:
            return DeltaTable(self.path, storage_options=self._storage_options)
        except TableNotFoundError:
            return None

    def load(self, app_id: str, batch_id: int) -> JournalEntry | None:
        """The entry of ``batch_id`` written under ``app_id``, or ``None`` (none, or another batch's)."""
        try:
            dt = self._table()
            if dt is None:
                return None
            rows = pa.table(dt.scan()).to_pylist()  # (the scan read_table uses, on the table loaded here)
        except (DeltaError, OSError, pa.ArrowException) as exc:
            raise SinkError(f"cannot read the DDL journal {self.path}: {exc}") from exc
        if len(rows) != 1:
            raise SinkError(f"DDL journal {self.path}: expected 1 row, found {len(rows)}")
        row = rows[0]
        if row["format"] != JOURNAL_FORMAT:
            raise SinkError(f"DDL journal {self.path}: format {row['format']}, this version reads {JOURNAL_FORMAT}")
        if row["app_id"] != app_id or row["batch_id"] != batch_id:
            return None
        try:
            return JournalEntry.from_payload(app_id, batch_id, row["ddl_ordinal"], row["payload"])
        except (ValueError, KeyError, TypeError) as exc:
            raise SinkError(f"DDL journal {self.path}: unreadable entry of batch {batch_id}: {exc}") from exc

    def save(self, entry: JournalEntry) -> None:
        """Replace the journal's row with ``entry`` (one overwrite commit)."""
        table = pa.Table.from_pylist([{
            "format": JOURNAL_FORMAT, "app_id": entry.app_id, "batch_id": entry.batch_id,
            "ddl_ordinal": entry.ddl_ordinal, "payload": entry.payload(),
        }], schema=_SCHEMA)

        def attempt() -> int:
            dt = self._table()
            before = dt.version() if dt is not None else -1  # (the write moves `dt` to its own version)
            write_deltalake(dt if dt is not None else self.path, table, mode="overwrite",
                            storage_options=self._storage_options if dt is None else None)
            return before + 1  # an overwrite commits right after the snapshot it read, or fails (retried)

        try:
            version = run_commit("write the DDL journal", self.path, attempt)
        except (DeltaError, OSError) as exc:
            raise SinkError(f"cannot write the DDL journal {self.path}: {exc}") from exc
        if vacuum_due(version, self._vacuum_every):
            # only the latest version is ever read: the files of replaced rows go
            try:
                dt = self._table()
                if dt is not None:
                    dt.vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False)
            except (DeltaError, OSError) as exc:
                log.warning("vacuum of the DDL journal %s failed (the entry is written): %s", self.path, exc)
