"""The ``spark`` engine's small-file compaction: Delta Lake's own ``OPTIMIZE`` (bin-packing).

When a table is compacted is decided for both engines by :mod:`ticdc_delta.delta.compaction` from the
delta-rs snapshot's file list (no Spark job unless a table is due). This module only says how:
``DeltaTable.forPath(...).optimize().executeCompaction()``, which handles the column-mapping tables the
engine creates (delta-rs 1.x cannot optimize them).

It runs in a session of its own (:func:`~ticdc_delta.spark.session.own_session`: same SparkContext, its
own SQL conf, made once), for two reasons: ``OPTIMIZE``'s file sizes
(``spark.databricks.delta.optimize.minFileSize`` / ``maxFileSize``: the policy's
:attr:`~ticdc_delta.delta.compaction.CompactionPolicy.small_file_size` / ``target_file_size``, so that it
rewrites the small files the policy counted and no others) are set there without touching the job's
session, and the MERGEs' app-transaction confs
(``spark.databricks.delta.write.txnAppId`` / ``txnVersion``, set on the merging sessions around each
MERGE) can never be seen by it: a compaction commit carries no app transaction, so it neither makes a
later MERGE look applied nor hides one. Delta's auto compaction (``spark.databricks.delta.autoCompact``)
is not used: it would run inside each MERGE's commit, in the session holding those confs.
"""

from __future__ import annotations

from typing import Any

from deltalake import DeltaTable as RsTable

from ..delta.compaction import CompactionPolicy, CompactionResult, TableCompaction
from .session import own_session

__all__ = ["spark_compaction", "OPTIMIZE_MIN_FILE_SIZE_CONF", "OPTIMIZE_MAX_FILE_SIZE_CONF"]

OPTIMIZE_MIN_FILE_SIZE_CONF = "spark.databricks.delta.optimize.minFileSize"
"""Files smaller than this are rewritten by ``OPTIMIZE`` (Delta's default: 1 GiB); set to the policy's
``small_file_size`` (half the target): a file of half the target or more cannot share a bin with another
such file, and ``OPTIMIZE`` would otherwise rewrite near-target files to take in one small file each."""
OPTIMIZE_MAX_FILE_SIZE_CONF = "spark.databricks.delta.optimize.maxFileSize"
"""The size ``OPTIMIZE`` bins files up to (Delta's default: 1 GiB)."""


def spark_compaction(spark: Any) -> TableCompaction:
    """The ``spark`` engine's :data:`~ticdc_delta.delta.compaction.TableCompaction`: ``OPTIMIZE`` of the
    files smaller than the policy's ``small_file_size`` (the ones :class:`CompactionPolicy` counts), binned
    up to its ``target_file_size``, in a session of its own made on first use.

    The function raises what Delta raises (e.g. a ``ConcurrentDeleteReadException`` when another writer
    removed files it was rewriting); the caller logs it and tries again later.
    """
    sessions: list[Any] = []

    def compact(path: str, dt: RsTable, policy: CompactionPolicy) -> CompactionResult:
        from delta.tables import DeltaTable

        if not sessions:
            sessions.append(own_session(spark))
        session = sessions[0]
        session.conf.set(OPTIMIZE_MIN_FILE_SIZE_CONF, str(policy.small_file_size))
        session.conf.set(OPTIMIZE_MAX_FILE_SIZE_CONF, str(policy.target_file_size))
        rows = DeltaTable.forPath(session, path).optimize().executeCompaction().collect()
        metrics = rows[0]["metrics"] if rows else None
        removed = int(metrics["numFilesRemoved"]) if metrics is not None else 0
        added = int(metrics["numFilesAdded"]) if metrics is not None else 0
        version = None
        if removed:
            dt.update_incremental()  # the compaction's commit, read from the log (no Spark job)
            version = dt.version()
        return CompactionResult(removed, added, version)

    return compact
