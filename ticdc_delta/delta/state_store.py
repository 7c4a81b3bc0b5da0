"""The job's durable state, in one Delta table, one table version per micro-batch.

Everything the job must remember across restarts — the resolved-ts watermark of every Kafka partition,
the rows held back until a watermark passes them, and bookkeeping (applied DDL ids, per-table applied
commit ts, counters) — is written as ONE overwrite commit per micro-batch. One commit is atomic, so a
crash leaves either the previous batch's state or this one's, never a mix.

The commit carries the Delta app transaction ``(app_id, batch_id)``; :meth:`StateStore.save` of a batch id
at or below the committed one does nothing, so a re-run micro-batch cannot move the state backwards or
write it twice.

Saves are optimistic: a store remembers the table version it last loaded or wrote, and a save finds the
table at another version only when some other writer committed in between — a second job running on the
same checkpoint, or a ``reset`` while the job runs. That is a
:class:`~ticdc_delta.errors.ConcurrentJobError` (terminal), never a silent interleaving.

Layout (one Delta row per item; ``kind`` says which):

==============  ===============================================================================
``kind``        row
==============  ===============================================================================
``state``       exactly one: ``batch_id``, ``meta`` (the JSON of :attr:`PipelineState.meta`)
``watermark``   one per (topic, partition): ``topic``, ``partition``, ``resolved_ts``
``held``        one per held row, in order: ``seq`` (0-based position), ``payload`` (opaque bytes)
==============  ===============================================================================
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Mapping

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError, TableNotFoundError

from ticdc_delta.errors import ConcurrentJobError, SinkError, StorageUnavailableError

from .sink import Txn, already_applied, commit_properties, read_table, run_commit, storage_error

__all__ = ["PipelineState", "StateStore", "vacuum_due", "STATE_SCHEMA", "STATE_FORMAT", "STATE_TABLE_PROPERTIES",
           "RESET_BATCH_ID", "epoch_app_id"]

log = logging.getLogger(__name__)

STATE_FORMAT = 1
"""Version of the row layout, stored in the ``state`` row."""

STATE_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("batch_id", pa.int64(), nullable=False),
        pa.field("format", pa.int32()),
        pa.field("meta", pa.string()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("resolved_ts", pa.int64()),
        pa.field("payload", pa.binary()),
    ]
)
"""The state table's schema."""

_STATE, _WATERMARK, _HELD = "state", "watermark", "held"
_INT64_MAX = (1 << 63) - 1
_NO_TABLE = -1
RESET_BATCH_ID = -1
"""The ``batch_id`` of a state written by :meth:`StateStore.reset`: no micro-batch ran since."""

STATE_TABLE_PROPERTIES = {
    "delta.checkpointInterval": "10",
    "delta.logRetentionDuration": "interval 1 hours",
    "delta.deletedFileRetentionDuration": "interval 10 minutes",
}
"""The state table's Delta properties: a checkpoint every 10 commits, an hour of log, ten minutes of
removed files' tombstones. The table takes one commit per micro-batch and is only read at its latest
version (its replaced files are vacuumed without retention), so Delta's defaults only made every load
slower as a job ran: delta-rs replays up to 99 commits after its checkpoint (~0.33 ms each here), lists
every log file of the last 30 days (~1 ms per 1,000: 86,400 a day with a 1-second trigger) and keeps a
week of tombstones in each checkpoint (~3.4 ms per 1,000 on every load: ~600,000 in a week at that
trigger). A store gives a table it creates these properties, and one made without them (by an earlier
version) before its first save."""


def epoch_app_id(changefeed: str, meta: Mapping[str, Any]) -> str:
    """The Delta app-transaction id of the epoch a job state's ``meta`` records: ``<changefeed>~<epoch>``
    (states written before epochs existed: the bare changefeed)."""
    epoch = meta.get("epoch")
    return changefeed if not epoch else f"{changefeed}~{epoch}"


@dataclass
class PipelineState:
    """What the job remembers after a micro-batch.

    Attributes:
        batch_id: the micro-batch this state is the result of.
        watermarks: ``(topic, partition)`` → resolved ts.
        held: opaque serialized held rows, in order.
        meta: JSON-able bookkeeping (applied DDL ids, per-table applied commit ts, counters). JSON has no
            tuples or int keys: they come back as lists and str keys.
    """

    batch_id: int
    watermarks: dict[tuple[str, int], int] = field(default_factory=dict)
    held: list[bytes] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)


def vacuum_due(version: int | None, every: int) -> bool:
    """Whether a table whose save just committed ``version`` is due for a vacuum: once in ``every``
    versions (never for ``0``). From the table's version, not a count of this process's saves: a job run
    ``--once`` every few minutes saves a few times per process, and its replaced files piled up forever."""
    return bool(every) and version is not None and (version + 1) % every == 0


class StateStore:
    """The job's state table at ``path``, written by app id ``app_id``.

    Args:
        path: the Delta table's location (local path or object-store URI).
        app_id: the writer's app id for the Delta app transaction (the job's identity).
        storage_options: passed to delta-rs.
        vacuum_every: delete the data files of replaced versions (only the latest version is ever read)
            once in this many versions of the table: decided from the version a save commits, so that
            short runs (``--once`` under a scheduler, a few batches each) vacuum too; ``0`` never.
        max_retries: commit races retried before :class:`~ticdc_delta.errors.ConcurrentCommitError`.

    Raises:
        ValueError: an empty ``path`` or ``app_id``, or a negative ``vacuum_every``.
    """

    def __init__(
        self,
        path: str,
        app_id: str,
        *,
        storage_options: Mapping[str, str] | None = None,
        vacuum_every: int = 100,
        max_retries: int = 5,
    ) -> None:
        if not path:
            raise ValueError("path must be a non-empty path or URI")
        if not isinstance(app_id, str) or not app_id:
            raise ValueError("app_id must be a non-empty str")
        if vacuum_every < 0:
            raise ValueError(f"vacuum_every must be >= 0, got {vacuum_every}")
        self.path = path
        self.app_id = app_id
        self._storage_options = dict(storage_options) if storage_options else None
        self._vacuum_every = vacuum_every
        self._max_retries = max_retries
        self._seen_version: int | None = None  # the table version last loaded or written (-1: none)
        self._tuned = False  # the table has STATE_TABLE_PROPERTIES (made with them, or _tune)

    def _load_table(self) -> DeltaTable | None:
        """The state table's latest snapshot, or ``None`` when there is none.

        Raises:
            StorageUnavailableError: the storage could not be reached (retryable).
            SinkError: the table's log cannot be read (a damaged or foreign log, no access).
        """
        try:
            return DeltaTable(self.path, storage_options=self._storage_options)
        except TableNotFoundError:
            return None
        except (DeltaError, OSError) as exc:
            raise storage_error(f"cannot read the job state table at {self.path}", exc) from exc

    def committed_batch_id(self) -> int | None:
        """The batch id of the last committed save, or ``None`` before the first.

        Raises:
            StorageUnavailableError: the storage could not be reached (retryable).
            SinkError: the table cannot be read.
        """
        dt = self._load_table()
        try:
            return None if dt is None else dt.transaction_version(self.app_id)
        except (DeltaError, OSError) as exc:
            raise storage_error(f"cannot read the job state table at {self.path}", exc) from exc

    def load(self) -> PipelineState | None:
        """The last committed state, or ``None`` when nothing was saved yet.

        Raises:
            StorageUnavailableError: the storage could not be reached (retryable).
            SinkError: the table cannot be read, or does not hold one well-formed state.
        """
        dt = self._load_table()
        if dt is None:
            self._seen_version = _NO_TABLE
            return None
        self._seen_version = dt.version()
        table = read_table(self.path, storage_options=self._storage_options)
        if table.num_rows == 0:
            return None
        kind = table.column("kind")
        head = table.filter(pc.equal(kind, _STATE))
        if head.num_rows != 1:
            raise SinkError(f"state table {self.path}: expected 1 'state' row, found {head.num_rows}")
        fmt = head.column("format")[0].as_py()
        if fmt != STATE_FORMAT:
            raise SinkError(f"state table {self.path}: format {fmt}, this version reads {STATE_FORMAT}")
        batch_id = head.column("batch_id")[0].as_py()
        try:
            meta = json.loads(head.column("meta")[0].as_py() or "{}")
        except ValueError as exc:
            raise SinkError(f"state table {self.path}: meta is not JSON: {exc}") from exc

        wm = table.filter(pc.equal(kind, _WATERMARK))
        watermarks = {
            (t, p): ts
            for t, p, ts in zip(
                wm.column("topic").to_pylist(),
                wm.column("partition").to_pylist(),
                wm.column("resolved_ts").to_pylist(),
            )
        }
        held_rows = table.filter(pc.equal(kind, _HELD))
        if held_rows.num_rows:
            held_rows = held_rows.take(pc.sort_indices(held_rows.column("seq")))
        held = held_rows.column("payload").to_pylist()
        return PipelineState(batch_id=batch_id, watermarks=watermarks, held=held, meta=meta)

    def save(self, batch_id: int, state: PipelineState, *, app_id: str | None = None) -> bool:
        """Replace the stored state with ``state`` in one commit; ``False`` (nothing written) when
        ``batch_id`` is at or below the last committed batch id of ``app_id`` (default: the store's).

        After a :meth:`load` or a save by this object, the table must still be at the version seen then.

        Raises:
            ConcurrentJobError: another writer committed to the state table since this object loaded
                or saved it (two jobs on one checkpoint, or a reset while the job runs).
            TypeError/ValueError: ``batch_id`` is not an int >= 0 or differs from ``state.batch_id``; a
                watermark key is not ``(str, int)`` or its value not an int; a held item is not bytes;
                ``meta`` is not JSON-able.
            SinkError: the table cannot be written.
            StorageUnavailableError: the storage could not be reached (retryable).
            ConcurrentCommitError: another writer kept winning the commit race.
        """
        if not isinstance(batch_id, int) or isinstance(batch_id, bool) or batch_id < 0:
            raise ValueError(f"batch_id must be an int >= 0, got {batch_id!r}")
        if state.batch_id != batch_id:
            raise ValueError(f"state.batch_id {state.batch_id!r} differs from batch_id {batch_id}")
        table = self._to_table(batch_id, state)
        txn = Txn(app_id or self.app_id, batch_id)

        def attempt() -> bool:
            dt = self._load_table()
            self._check_unchanged(dt, f"saving batch {batch_id}")
            if dt is not None and already_applied(dt, txn):
                return False
            if dt is not None and not self._tuned:
                dt = self._tune(dt)
            before = _NO_TABLE if dt is None else dt.version()
            write_deltalake(
                dt if dt is not None else self.path,
                table,
                mode="overwrite",
                storage_options=self._storage_options if dt is None else None,
                configuration=STATE_TABLE_PROPERTIES if dt is None else None,
                commit_properties=commit_properties(*txn),
            )
            self._tuned = True
            # an overwrite commits right after the snapshot it read, or fails (and is retried)
            self._seen_version = before + 1
            return True

        written = run_commit("save state to", self.path, attempt, max_retries=self._max_retries)
        if written and vacuum_due(self._seen_version, self._vacuum_every):
            self.vacuum()
        return written

    def reset(self, state: PipelineState) -> None:
        """Replace the stored state with ``state`` unconditionally, without an app transaction (the
        ``reset`` command: the next micro-batch starts a new transaction epoch; see
        :mod:`ticdc_delta.reset`). ``state.batch_id`` is usually :data:`RESET_BATCH_ID`.

        Raises:
            SinkError: the table cannot be written.
            StorageUnavailableError: the storage could not be reached (retryable).
        """
        table = self._to_table(state.batch_id, state)

        def attempt() -> None:
            dt = self._load_table()
            write_deltalake(
                dt if dt is not None else self.path,
                table,
                mode="overwrite",
                storage_options=self._storage_options if dt is None else None,
                configuration=STATE_TABLE_PROPERTIES if dt is None else None,
            )

        run_commit("reset state in", self.path, attempt, max_retries=self._max_retries)
        self._remember_version()

    def _tune(self, dt: DeltaTable) -> DeltaTable:
        """``dt`` with the :data:`STATE_TABLE_PROPERTIES` it lacks set (one commit), reloaded; a property
        somebody set to another value stays.

        Raises:
            ConcurrentJobError: another writer committed at the same time.
        """
        self._tuned = True
        found = dt.metadata().configuration
        missing = {key: value for key, value in STATE_TABLE_PROPERTIES.items() if key not in found}
        if not missing:
            return dt
        expected = dt.version() + 1
        dt.alter.set_table_properties(missing)
        tuned = self._load_table()
        self._seen_version = expected
        self._check_unchanged(tuned, "setting its properties")
        assert tuned is not None  # noqa: S101 - _check_unchanged raised for a missing table
        log.info("state table %s: set %s", self.path, ", ".join(f"{k}={v}" for k, v in sorted(missing.items())))
        return tuned

    def _check_unchanged(self, dt: DeltaTable | None, doing: str) -> None:
        if self._seen_version is None:
            return  # nothing loaded or saved by this object: no expectation
        now = _NO_TABLE if dt is None else dt.version()
        if now != self._seen_version:
            seen = "no table" if self._seen_version == _NO_TABLE else f"version {self._seen_version}"
            found = "no table" if now == _NO_TABLE else f"version {now}"
            raise ConcurrentJobError(
                f"state table {self.path}: {doing}, expected {seen} (as this job last read or wrote it) "
                f"but found {found}: another job is running on the same checkpoint, or the state was reset "
                "or replaced while this job ran. Stop the other job; then restart this one"
            )

    def _remember_version(self) -> None:
        dt = self._load_table()
        self._seen_version = _NO_TABLE if dt is None else dt.version()

    def vacuum(self) -> list[str]:
        """Delete the data files of replaced versions (the state is only read at its latest version);
        the files removed. A failure is logged, not raised: the state itself is already committed.
        """
        try:
            dt = self._load_table()
            if dt is None:
                return []
            return dt.vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False)
        except (DeltaError, OSError, SinkError, StorageUnavailableError) as exc:
            log.warning("vacuum of state table %s failed (the state is committed): %s", self.path, exc)
            return []
        finally:
            # delta-rs records a vacuum as commits of its own (VACUUM START / END): expect them
            try:
                self._remember_version()
            except (DeltaError, OSError, SinkError, StorageUnavailableError):
                self._seen_version = None  # unknown: the next save skips the check once

    @staticmethod
    def _to_table(batch_id: int, state: PipelineState) -> pa.Table:
        """The rows of one state (see the module docstring).

        Raises:
            TypeError/ValueError: as :meth:`save`.
        """
        try:
            meta = json.dumps(state.meta, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"state.meta is not JSON-able: {exc}") from exc
        topics: list[str] = []
        partitions: list[int] = []
        stamps: list[int] = []
        for key, ts in state.watermarks.items():
            if (
                not isinstance(key, tuple)
                or len(key) != 2
                or not isinstance(key[0], str)
                or not isinstance(key[1], int)
                or not 0 <= key[1] < 1 << 31
            ):
                raise TypeError(f"watermark keys must be (topic: str, partition: int >= 0), got {key!r}")
            if not isinstance(ts, int) or not 0 <= ts <= _INT64_MAX:
                raise ValueError(f"watermark {key!r} must be an int in 0..2**63-1, got {ts!r}")
            topics.append(key[0])
            partitions.append(key[1])
            stamps.append(ts)
        held = state.held
        for i, item in enumerate(held):
            if type(item) is not bytes:
                raise TypeError(f"held[{i}] must be bytes, got {type(item).__name__}")
        n_wm, n_held = len(topics), len(held)
        n = 1 + n_wm + n_held
        nulls = [None] * (n_wm + n_held)
        columns = {
            "kind": pa.array([_STATE] + [_WATERMARK] * n_wm + [_HELD] * n_held, pa.string()),
            "seq": pa.array([0, *range(n_wm), *range(n_held)], pa.int64()),
            "batch_id": pa.array([batch_id] * n, pa.int64()),
            "format": pa.array([STATE_FORMAT] + nulls, pa.int32()),
            "meta": pa.array([meta] + nulls, pa.string()),
            "topic": pa.array([None, *topics] + [None] * n_held, pa.string()),
            "partition": pa.array([None, *partitions] + [None] * n_held, pa.int32()),
            "resolved_ts": pa.array([None, *stamps] + [None] * n_held, pa.int64()),
            "payload": pa.array([None] * (1 + n_wm) + held, pa.binary()),
        }
        return pa.Table.from_pydict(columns, schema=STATE_SCHEMA)
