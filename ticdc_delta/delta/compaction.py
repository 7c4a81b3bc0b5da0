"""Small-file compaction of the target tables after a micro-batch: when (one policy for both engines) and,
for the ``delta-rs`` engine, how.

Every micro-batch adds at least one data file to each table it writes (one MERGE or append per table per
DDL segment): a job triggered every second makes ~86k files per table per day, and every MERGE, which
scans the target's files, and every reader gets slower. Before a batch's state is saved, each table the
batch wrote is checked with the file list of its delta-rs snapshot (no Spark job, a few milliseconds;
:func:`mark_due_tables`), and after the save each due one is compacted (:func:`compact_written_tables`):
once it has
``sink.compaction.min_files`` small files, smaller than half of ``target_file_size``, that compaction can
combine (two or more in one partition), it is compacted — by delta-rs's ``optimize.compact`` here
(:func:`delta_rs_compaction`), by Delta Lake's own ``OPTIMIZE`` on the ``spark`` engine
(:mod:`ticdc_delta.spark.compaction`), each engine its own way because delta-rs 1.x cannot optimize the
column-mapping tables the ``spark`` engine creates. The threshold is that of Delta's auto compaction
(``minNumFiles`` 50). The dead-letter table is checked the same way after a batch that appended to it.

**Why it is safe.** Compaction runs after the batch's state is saved: the batch is committed whatever
happens to it. A compaction commit removes files and adds files holding the same rows (``dataChange:
false``, so streaming readers of the table skip it) and records no app transaction: the table's
``(changefeed, version)`` stays that of the batch's last data commit, so a re-run MERGE is still skipped
(:func:`~ticdc_delta.delta.sink.already_applied`) and the next batch's, with a larger version, still
applies. A compaction that fails (a conflict with another writer, an I/O error) is logged and never fails
the batch; the table is tried again when a batch writes it :data:`RETRY_AFTER_BATCHES` or more batches
later. What was done is kept in the state's ``meta["compaction"]`` (saved with the next batch's state,
shown by ``status``).

A compaction the job does not live through — the batch watchdog (``batch_timeout``) ends the run while a
slow ``OPTIMIZE`` runs, or the process is killed — counts as failed too. The tables due are found before the
batch's state is saved and marked there (:func:`mark_due_tables`: ``started_batch`` and the table's
version); a mark still there when the next batch looks (the job ended before it saved the cleared record)
is a failure at that batch unless the table's log shows a compaction after the version marked.
Without it, the restarted job found the table due again after its next batch and the watchdog ended that
run too: one batch per start, for good.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, MutableMapping

import pyarrow as pa
from deltalake import DeltaTable

from .sink import TableIdent

__all__ = [
    "CompactionPolicy",
    "CompactionResult",
    "TableCompaction",
    "RETRY_AFTER_BATCHES",
    "files_by_partition",
    "column_mapping",
    "delta_rs_compaction",
    "compact_written_tables",
    "mark_due_tables",
    "table_name",
]

log = logging.getLogger(__name__)

RETRY_AFTER_BATCHES = 10
"""Batches to wait before a table whose compaction failed is tried again."""

_ERROR_CHARS = 300


@dataclass(frozen=True)
class CompactionPolicy:
    """When a table is compacted: once it has ``min_files`` small files that compaction can combine, that
    is two or more in one partition (a lone small file in a partition stays as it is, so it must not keep
    triggering compactions that do nothing).

    A file is small when it is smaller than half of ``target_file_size`` (:attr:`small_file_size`), so any
    two small files fit one compacted file. A file of half the target or more is not counted: two of them
    never share a bin (both engines bin files up to the target), and compaction itself leaves a table full
    of them (each bin's output). Counting them made a table that holds ``min_files`` of them due after
    every batch, forever, each compaction rewriting near-target files to take in that batch's file. The
    ``spark`` engine's ``OPTIMIZE`` is given the same bound (``minFileSize``), so it rewrites the files
    counted here; delta-rs (which bins every file up to the target) may also top up such a file with small
    ones, which brings it to at most the target, after which it is left alone.

    Raises:
        ValueError: ``min_files`` below 2 or ``target_file_size`` below 1.
    """

    min_files: int = 50
    target_file_size: int = 128 * 1024**2

    def __post_init__(self) -> None:
        if self.min_files < 2:
            raise ValueError(f"min_files must be >= 2, got {self.min_files}")
        if self.target_file_size < 1:
            raise ValueError(f"target_file_size must be >= 1, got {self.target_file_size}")

    @property
    def small_file_size(self) -> int:
        """Files smaller than this many bytes are small: half of ``target_file_size``, rounded up (two files
        of at most ``small_file_size - 1`` bytes are together smaller than ``target_file_size``)."""
        return (self.target_file_size + 1) // 2

    @classmethod
    def from_config(cls, cfg: Any) -> "CompactionPolicy":
        """The policy of ``sink.compaction`` (a :class:`~ticdc_delta.config.CompactionConfig`)."""
        return cls(min_files=cfg.min_files, target_file_size=cfg.target_file_size)

    def compactable(self, sizes: Mapping[Any, Iterable[int]]) -> int:
        """How many files compaction would combine: the small files (smaller than :attr:`small_file_size`)
        of every partition holding two or more.

        ``sizes``: the sizes (bytes) of a table's files per partition (``()`` for an unpartitioned table).
        """
        total = 0
        for part in sizes.values():
            small = sum(1 for size in part if size < self.small_file_size)
            if small >= 2:
                total += small
        return total

    def due(self, sizes: Mapping[Any, Iterable[int]]) -> bool:
        """Whether a table with these file sizes per partition should be compacted now."""
        return self.compactable(sizes) >= self.min_files


@dataclass(frozen=True)
class CompactionResult:
    """What one compaction did: files removed and added, the table version it committed (``None``: none)."""

    files_removed: int
    files_added: int
    version: int | None = None


TableCompaction = Callable[[str, DeltaTable, CompactionPolicy], CompactionResult]
"""How an engine compacts one table: ``(path, snapshot, policy) -> result``. Must commit no app transaction;
raises whatever the engine raises (the caller logs it)."""


def files_by_partition(dt: DeltaTable) -> dict[tuple[Any, ...], list[int]]:
    """The sizes (bytes) of the snapshot's data files per partition (``()`` for an unpartitioned table):
    read from the snapshot's file list, no data is read."""
    adds = pa.table(dt.get_add_actions(flatten=False))
    sizes = adds.column("size_bytes").to_pylist()
    if "partition" not in adds.column_names or not dt.metadata().partition_columns:
        return {(): sizes} if sizes else {}
    out: dict[tuple[Any, ...], list[int]] = {}
    for size, values in zip(sizes, adds.column("partition").to_pylist()):
        key = tuple(sorted((values or {}).items()))
        out.setdefault(key, []).append(size)
    return out


def column_mapping(dt: DeltaTable) -> bool:
    """Whether the table uses Delta column mapping (which delta-rs 1.x cannot OPTIMIZE)."""
    return dt.metadata().configuration.get("delta.columnMapping.mode", "none") in ("name", "id")


def delta_rs_compaction(path: str, dt: DeltaTable, policy: CompactionPolicy) -> CompactionResult:
    """Compact with delta-rs (``DeltaTable.optimize.compact``): one commit, no app transaction.

    Raises:
        NotImplementedError: the table uses column mapping (delta-rs 1.x: "Column mapping is not supported
            for write operation 'OPTIMIZE' yet"; compact it with ``sink.engine: spark``).
        deltalake.exceptions.DeltaError: from delta-rs (e.g. ``CommitFailedError``: another writer won).
    """
    if column_mapping(dt):
        raise NotImplementedError(
            f"{path} uses column mapping, which delta-rs cannot OPTIMIZE: compact it with sink.engine: spark"
        )
    metrics = dt.optimize.compact(target_size=policy.target_file_size)
    removed = int(metrics.get("numFilesRemoved", 0))
    return CompactionResult(removed, int(metrics.get("numFilesAdded", 0)), dt.version() if removed else None)


def table_name(ident: TableIdent) -> str:
    """The name a table's compactions are recorded under in the state's ``meta["compaction"]``."""
    return f"{ident.schema}.{ident.table}"


def compact_written_tables(
    sink: Any,
    tables: Iterable[TableIdent],
    cfg: Any,
    compact: TableCompaction,
    meta: MutableMapping[str, Any],
    batch_id: int,
) -> float:
    """After batch ``batch_id``'s state is saved: compact each of ``tables`` (the tables the batch wrote)
    that :func:`mark_due_tables` marked for this batch before the save (due, not backing off), with
    ``compact`` (the engine's way). Never raises for a table: a failure is logged and recorded, and the
    table is tried again :data:`RETRY_AFTER_BATCHES` batches later. Returns the seconds spent (the progress
    line's ``timings.compact``).

    Args:
        sink: the job's delta-rs sink (``snapshot(ident)``, ``table_path(schema, table)``).
        tables: the tables the batch wrote (:attr:`~ticdc_delta.delta.applier.DeltaApplier.written_tables`).
        cfg: ``sink.compaction`` (a :class:`~ticdc_delta.config.CompactionConfig`).
        compact: :func:`delta_rs_compaction` or the ``spark`` engine's
            (:func:`ticdc_delta.spark.compaction.spark_compaction`).
        meta: the handler's state meta, as saved with the batch's state (its marks); ``meta["compaction"]``
            is replaced by the updated record (saved with the next batch's state).
        batch_id: the batch just committed.
    """
    if not cfg.enabled:
        return 0.0
    started = time.monotonic()
    policy = CompactionPolicy.from_config(cfg)
    record = _records(meta)
    changed = False
    for ident in dict.fromkeys(tables):
        name = table_name(ident)
        entry = record.get(name)
        if entry is None or entry.get("started_batch") != batch_id:
            continue  # not due: mark_due_tables decided, before the state save
        entry = record[name] = {k: v for k, v in entry.items() if k not in ("started_batch", "started_version")}
        changed = True
        try:
            dt = sink.snapshot(ident)
            if dt is None:  # dropped since
                continue
            path = sink.table_path(ident.schema, ident.table)
            t0 = time.monotonic()
            result = compact(path, dt, policy)
        except Exception as exc:  # noqa: BLE001 - compaction never fails the batch: logged, retried later
            record[name] = _failed(entry, name, batch_id, exc)
            continue
        log.info("batch %d: compacted %s: %d files -> %d in %.2fs (table version %s)", batch_id, name,
                 result.files_removed, result.files_added, time.monotonic() - t0, result.version)
        entry = {k: v for k, v in entry.items() if k not in ("failed_batch", "error")}
        entry["compactions"] = entry.get("compactions", 0) + 1
        entry["files_removed"] = entry.get("files_removed", 0) + result.files_removed
        entry["files_added"] = entry.get("files_added", 0) + result.files_added
        entry["last_batch"] = batch_id
        record[name] = entry
    if changed:
        meta["compaction"] = {"tables": record}
    return time.monotonic() - started


def _failed(entry: Mapping[str, Any], name: str, batch_id: int, exc: BaseException) -> dict[str, Any]:
    """``entry`` recording that the compaction of table ``name`` failed at batch ``batch_id`` with ``exc``
    (logged): tried again :data:`RETRY_AFTER_BATCHES` batches later."""
    reason = str(exc).splitlines()[0][:_ERROR_CHARS] if str(exc) else type(exc).__name__
    log.warning("batch %d: compaction of %s failed (tried again in %d batches): %s",
                batch_id, name, RETRY_AFTER_BATCHES, reason)
    return {**entry, "failed_batch": batch_id, "error": reason}


def _records(meta: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A copy of the state's compaction record per table (``meta["compaction"]["tables"]``)."""
    return {k: dict(v) for k, v in (meta.get("compaction") or {}).get("tables", {}).items()}


_UNFINISHED = "did not finish: the job ended while it ran (batch_timeout, or the process was stopped)"


def _settle(sink: Any, ident: TableIdent, entry: dict[str, Any], batch_id: int) -> bool:
    """An earlier batch's mark on ``entry`` (``started_batch``, never cleared: the job ended after the state
    save, during the compaction or after it): gone when the table's log holds a compaction commit after the
    version marked, else a failure at that batch. Whether ``entry`` changed."""
    mark = entry.get("started_batch")
    if mark is None or mark >= batch_id:
        return False
    since = entry.pop("started_version", None)
    del entry["started_batch"]
    try:
        dt = sink.snapshot(ident)
        done = dt is None or (since is not None and dt.version() > since and any(
            h.get("operation") == "OPTIMIZE" for h in dt.history(dt.version() - since)))
    except Exception:  # noqa: BLE001 - unknown: taken as not done (a later try costs a compaction at most)
        done = False
    if not done:
        entry.update(failed_batch=mark, error=_UNFINISHED)
        log.warning("compaction of %s after batch %d %s; tried again in %d batches", table_name(ident), mark,
                    _UNFINISHED, RETRY_AFTER_BATCHES)
    return True


def mark_due_tables(
    sink: Any,
    tables: Iterable[TableIdent],
    cfg: Any,
    meta: MutableMapping[str, Any],
    batch_id: int,
) -> None:
    """Before batch ``batch_id``'s state is saved (``meta``: the state's meta about to be saved): mark each
    of ``tables`` that :class:`CompactionPolicy` says is due and that is not backing off from a failure
    with ``started_batch`` — the tables :func:`compact_written_tables` compacts after the save — so that a
    compaction the job does not live through is a failure the next start backs off from instead of running
    it again at once; earlier marks still there become failures. Never raises: a table whose file list
    cannot be read is recorded as failed."""
    if not cfg.enabled:
        return
    policy = CompactionPolicy.from_config(cfg)
    record = _records(meta)
    changed = False
    for ident in dict.fromkeys(tables):
        name = table_name(ident)
        entry = record.get(name, {})
        if _settle(sink, ident, entry, batch_id):
            record[name] = entry
            changed = True
        failed = entry.get("failed_batch")
        if failed is not None and batch_id - failed < RETRY_AFTER_BATCHES:
            continue  # backing off from a failure
        try:
            dt = sink.snapshot(ident)
            if dt is None or not policy.due(files_by_partition(dt)):
                continue
        except Exception as exc:  # noqa: BLE001 - compaction never fails the batch: logged, retried later
            record[name] = _failed(entry, name, batch_id, exc)
            changed = True
            continue
        record[name] = {**entry, "started_batch": batch_id, "started_version": dt.version()}
        changed = True
    if changed:
        meta["compaction"] = {"tables": record}
