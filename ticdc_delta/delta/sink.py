"""Writing change batches to Delta tables: the :class:`TableSink` interface and :class:`DeltaRsSink`.

:class:`DeltaRsSink` writes through delta-rs (the ``deltalake`` package) on the Spark driver: no JVM, one
Arrow table per table per micro-batch. The ``spark`` engine's delta-spark sink
(:class:`~ticdc_delta.spark.delta_sink.SparkDeltaSink`) implements the same :class:`TableSink`; the callers
depend only on the interface.

**Exactly-once commits.** Every data commit carries a Delta *app transaction* ``(app_id, version)``
(Delta protocol: ``txn`` action, "set transaction"). Before writing, the sink reads the table's latest
version for ``app_id``; when it is already ``>= version`` the call does nothing: a previous attempt of
the same micro-batch committed it. This is what makes a re-run batch apply nothing twice. It relies on
the versions of one ``app_id`` growing with every data commit to a table, so a batch that writes one
table more than once (rows, TRUNCATE, more rows) must give each write its own, larger version:
:func:`batch_txn` packs ``(batch_id, step)`` into one version for that.

Schema commits (:meth:`~TableSink.ensure_table`, :meth:`~TableSink.add_columns`) are idempotent by
themselves (create if missing, add only the columns not there yet). They carry the transaction under
``app_id + SCHEMA_TXN_SUFFIX`` so that a schema change committed earlier in a batch does not make the
batch's data commit for the same table look already done. ``add_columns`` is also skipped when the table
has committed its transaction under ``app_id`` or a later one: a later step of the batch ran after it (it
may have dropped or renamed the column again, which the columns alone cannot tell: a re-run batch that adds
and then drops ``c`` must not add ``c`` again). Its callers give it a transaction no earlier step of the
batch committed (the DDL's own step, or that of the data commit it prepares).

**Reading back.** ``DeltaTable.to_pyarrow_table()`` / ``to_pyarrow_dataset()`` can make the process abort
at exit (delta-rs issue 2184: "terminate called without an active exception"; reproduced here with
deltalake 1.6.6 in 4 of 20 runs). :func:`read_table` reads through delta-rs's own DataFusion scan
(``DeltaTable.scan``) instead, which exited cleanly in 40 of 40 runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import shutil
import socket
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, NamedTuple, Protocol, Sequence, TypeVar, runtime_checkable

import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import fs as pafs
from deltalake import (
    CommitProperties,
    DeltaTable,
    Field as DeltaField,
    Transaction,
    WriterProperties,
    write_deltalake,
)
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.fs import DeltaStorageHandler

from ticdc_delta.delta.arrow_types import Narrowing, TextSource, narrowed, tidb_text
from ticdc_delta.errors import ConcurrentCommitError, SinkError, StorageUnavailableError, one_line
from ticdc_delta.locations import (
    check_inside,
    child_location,
    decode_component,
    encode_component,
    local_path,
    table_location,
)

__all__ = [
    "OP_COLUMN",
    "OP_UPSERT",
    "OP_DELETE",
    "SCHEMA_TXN_SUFFIX",
    "STEPS_PER_BATCH",
    "TableIdent",
    "TableFacts",
    "Txn",
    "rows_outside",
    "MergeStats",
    "TableSink",
    "TableCopy",
    "DeltaRsSink",
    "batch_txn",
    "quote_identifier",
    "path_component",
    "read_table",
    "snapshot_rows",
    "run_commit",
    "storage_unreachable",
    "storage_error",
    "constraint_violated",
    "constraint_error",
    "check_txn",
    "check_new_table",
    "check_new_fields",
    "commit_properties",
    "already_applied",
    "cast_column",
    "cast_columns",
    "narrow_columns",
    "table_arrow_schema",
]

log = logging.getLogger(__name__)

OP_COLUMN = "_ticdc_delta_merge_op__longer_than_any_tidb_identifier_so_no_column_has_it"
"""Column of a ``merge`` change table saying what to do with the key: :data:`OP_UPSERT` or
:data:`OP_DELETE`. It exists only in the MERGE's source, never in a Delta table. Its name is longer than
the 64 characters TiDB allows an identifier, so no upstream column can have it; a table still cannot have
a column of this name, which only a configured metadata column (``sink.metadata_columns``) could take."""
OP_UPSERT = "u"
OP_DELETE = "d"

SCHEMA_TXN_SUFFIX = "/schema"
"""Appended to the app id of the transaction recorded by schema commits (see the module docstring)."""

_RESERVED = (f"{OP_COLUMN!r} is reserved for merge operations and cannot be a table column "
             "(choose another name for sink.metadata_columns)")

STEPS_PER_BATCH = 1024
"""Data commits one micro-batch may make to one table, with :func:`batch_txn`."""

R = TypeVar("R")


class TableIdent(NamedTuple):
    """An upstream table: TiDB schema (database) and table name."""

    schema: str
    table: str


class TableFacts(NamedTuple):
    """What a table's log tells of its current version: its Arrow schema, its rows and its data files'
    statistics (``None``: not asked).

    ``files`` has a row per data file: ``num_records`` and the struct columns ``min`` and ``max``, whose
    fields are the table's columns by name (column mapping's physical names resolved); a value is null where
    the file has no statistic for it."""

    schema: pa.Schema
    rows: int | None
    files: pa.Table | None = None


def rows_outside(files: pa.Table, ranges: Mapping[str, tuple[object, object]]) -> int:
    """The rows of the data files (:attr:`TableFacts.files`) whose statistics lie wholly outside the range
    ``(least, greatest)`` of some column of ``ranges``: the rows a reader filtering on those ranges skips.
    A file without the statistic, or whose statistic cannot be compared with the range (another type), is
    counted as inside."""
    if not ranges or files.num_rows == 0:
        return 0
    outside = pa.array([False] * files.num_rows)
    lows, highs = files.column("min").combine_chunks(), files.column("max").combine_chunks()
    for name, (least, greatest) in ranges.items():
        if lows.type.get_field_index(name) < 0 or highs.type.get_field_index(name) < 0:
            continue
        low, high = pc.struct_field(lows, name), pc.struct_field(highs, name)  # (null where the file's is)
        try:
            beyond = pc.or_(pc.less(high, pa.scalar(least, high.type)), pc.greater(low, pa.scalar(greatest, low.type)))
        except (pa.ArrowException, TypeError, ValueError, OverflowError):  # a value its type cannot hold
            continue
        outside = pc.or_(outside, pc.fill_null(beyond, False))
    return pc.sum(pc.if_else(outside, files.column("num_records"), 0)).as_py() or 0


class Txn(NamedTuple):
    """A Delta app transaction: the writer's id and a version that grows with every data commit."""

    app_id: str
    version: int


def batch_txn(app_id: str, batch_id: int, step: int = 0) -> Txn:
    """The transaction of data commit ``step`` (0-based) of micro-batch ``batch_id`` to one table.

    Raises:
        ValueError: ``batch_id`` is negative or ``step`` is outside ``0 .. STEPS_PER_BATCH - 1``.
    """
    if batch_id < 0:
        raise ValueError(f"batch_id must be >= 0, got {batch_id}")
    if not 0 <= step < STEPS_PER_BATCH:
        raise ValueError(f"step must be in 0..{STEPS_PER_BATCH - 1}, got {step}")
    return Txn(app_id, batch_id * STEPS_PER_BATCH + step)


@dataclass(frozen=True)
class MergeStats:
    """What one write did. ``skipped``: the transaction was already committed, nothing was written."""

    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    version: int | None = None
    skipped: bool = False


@runtime_checkable
class TableSink(Protocol):
    """Where change batches land: one Delta table per upstream table.

    ``txn`` is ``(app_id, version)`` (:class:`Txn`); see the module docstring for how it makes every
    write idempotent.
    """

    def table_path(self, schema: str, table: str) -> str:
        """The location of the Delta table of an upstream table."""
        ...

    def table_schema(self, ident: TableIdent) -> pa.Schema | None:
        """The table's current Arrow schema, or ``None`` when it does not exist.

        Raises:
            SinkError: the table cannot be read.
        """
        ...

    def ensure_table(
        self, ident: TableIdent, arrow_schema: pa.Schema, partition_by: Sequence[str] | None, txn: Txn,
        properties: Mapping[str, str] | None = None,
    ) -> bool:
        """Create the table (with the Delta table ``properties``) if it is missing; ``True`` when this call
        created it.

        Raises:
            SinkError: the table cannot be created.
            ConcurrentCommitError: other writers kept winning.
        """
        ...

    def table_properties(self, ident: TableIdent) -> dict[str, str] | None:
        """The table's Delta table properties, as of this sink's last read of its log for
        :meth:`table_schema` when that was the last thing asked of it (else read now); ``None`` when it
        does not exist.

        Raises:
            SinkError: the table cannot be read.
        """
        ...

    def set_table_properties(self, ident: TableIdent, properties: Mapping[str, str]) -> None:
        """Set Delta table ``properties`` on the table (one commit).

        Raises:
            SinkError: the table is missing or refused them.
            ConcurrentCommitError: other writers kept winning.
        """
        ...

    def add_columns(self, ident: TableIdent, fields: Sequence[pa.Field], txn: Txn) -> list[str]:
        """Add the (nullable) columns the table does not have yet; the names added. Nothing when the table
        has committed ``txn`` or a later version of its app id (a later step ran after this one).

        Raises:
            SinkError: the table is missing, or has a column of that name with another type.
            ConcurrentCommitError: other writers kept winning.
        """
        ...

    def merge(
        self, ident: TableIdent, changes: pa.Table, key_columns: Sequence[str], txn: Txn
    ) -> MergeStats:
        """Apply one change per key: :data:`OP_COLUMN` ``'u'`` upserts the row, ``'d'`` deletes it.

        Raises:
            SinkError: the table is missing or the changes do not fit it.
            ConcurrentCommitError: other writers kept winning.
        """
        ...

    def append(self, ident: TableIdent, rows: pa.Table, txn: Txn) -> MergeStats:
        """Append rows (creating the table from their schema if it is missing).

        Raises:
            SinkError: the rows do not fit the table.
            ConcurrentCommitError: other writers kept winning.
        """
        ...

    def drop_column(self, ident: TableIdent, name: str, txn: Txn) -> bool:
        """DROP COLUMN ``name`` (the table's spelling); ``True`` unless already done.

        Raises:
            SinkError: the table is missing.
            ConcurrentCommitError: other writers kept winning.
        """
        ...

    def rename_column(self, ident: TableIdent, old: str, new: str, txn: Txn) -> bool:
        """RENAME COLUMN ``old`` (the table's spelling) to ``new``, values kept; ``True`` unless already done.

        Raises:
            SinkError: the table is missing.
            ConcurrentCommitError: other writers kept winning.
        """
        ...

    def change_column_type(self, ident: TableIdent, name: str, new_type: pa.DataType, txn: Txn,
                           text: TextSource | None = None) -> bool:
        """Give column ``name`` the wider type ``new_type`` (the caller checked that every value fits);
        ``True`` unless already done. A string ``new_type`` with ``text`` prints the old values as TiDB
        does (:func:`~ticdc_delta.delta.arrow_types.tidb_text`).

        Raises:
            SinkError: the table is missing, or a value cannot be cast.
            ConcurrentCommitError: other writers kept winning.
        """
        ...

    def change_column_types(self, ident: TableIdent, types: Mapping[str, pa.DataType], txn: Txn) -> bool:
        """:meth:`change_column_type` for every column of ``types`` (``{name: wider type}``) as one step with
        one ``txn`` (the applier's widening of the columns whose types grew at once: a commit per column
        with the same ``txn`` would leave all but the first skipped as done); ``True`` unless already done.

        Raises:
            SinkError: the table is missing, or a value cannot be cast.
            ConcurrentCommitError: other writers kept winning.
        """
        ...

    def overwrite_empty(self, ident: TableIdent, txn: Txn) -> bool:
        """TRUNCATE: a new table version with no rows; ``True`` unless already done.

        Raises:
            SinkError: the table is missing.
            ConcurrentCommitError: other writers kept winning.
        """
        ...

    def drop(self, ident: TableIdent) -> bool:
        """Remove the table and its files; ``True`` when there was a table.

        Raises:
            SinkError: the files cannot be removed.
        """
        ...

    def read(self, ident: TableIdent) -> pa.Table:
        """The table's current rows (order not defined).

        Raises:
            SinkError: the table is missing or cannot be read.
        """
        ...

    def table_facts(self, ident: TableIdent) -> TableFacts | None:
        """The table's schema, row count and files' statistics from its log; ``None`` when it is missing.

        Raises:
            SinkError: the table cannot be read.
        """
        ...

    def partition_columns(self, ident: TableIdent) -> tuple[str, ...]:
        """The table's partition columns (``()``: none, or no table).

        Raises:
            SinkError: the table cannot be read.
        """
        ...

    def rewrite(self, ident: TableIdent, transform: Callable[[pa.Table], pa.Table], txn: Txn) -> bool:
        """Replace the table's rows and schema with ``transform(current rows)`` in one commit; ``True``
        unless already done.

        Raises:
            SinkError: the table is missing, or the new rows cannot be written.
            ConcurrentCommitError: other writers kept winning.
        """
        ...

    def move(self, old: TableIdent, new: TableIdent) -> bool:
        """Move a table to the location of another name (RENAME TABLE); ``True`` when it moved.

        Raises:
            SinkError: the new location is taken, or the files cannot be moved.
        """
        ...

    def tables_in_schema(self, schema: str) -> list[TableIdent]:
        """The Delta tables of an upstream schema (for DROP DATABASE).

        Raises:
            SinkError: the location cannot be listed.
        """
        ...


def quote_identifier(name: str) -> str:
    """A column name as a delta-rs (DataFusion SQL) identifier: backticks, embedded backticks doubled."""
    return "`" + name.replace("`", "``") + "`"


def path_component(name: str) -> str:
    """A schema or table name as one path component: :func:`ticdc_delta.locations.encode_component`
    (letters, digits and ``_`` kept; ``a/b`` → ``a@002fb``).

    Raises:
        IdentifierError: a name no location can hold (empty, NUL, too long once encoded).
    """
    return encode_component(name)


def _plain_type(t: pa.DataType) -> pa.DataType:
    """``t`` with Arrow view types (what DataFusion scans produce) replaced by the plain ones."""
    if t == pa.string_view():
        return pa.string()
    if t == pa.binary_view():
        return pa.binary()
    if pa.types.is_list_view(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
        item = t.value_field
        return pa.list_(item.with_type(_plain_type(item.type)))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_plain_type(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(_plain_type(t.key_type), t.item_field.with_type(_plain_type(t.item_type)))
    return t


# What an object store (delta-rs' object_store crate) or the network says when the storage cannot be reached
# or is overloaded: the same request may succeed later. ``\btimeout\b`` leaves out the ``retry_timeout``
# every object_store message quotes; status codes only count after "status" or with their reason phrase
# (an elapsed time such as "in 503.2ms" is no status).
_UNREACHABLE = re.compile(
    r"connection (?:refused|reset|closed|aborted)|broken pipe|timed out|\btimeout\b|deadline has elapsed"
    r"|dns error|failed to lookup address|name or service not known|temporary failure in name resolution"
    r"|no route to host|network is unreachable|host is unreachable"
    r"|status(?: code)?:? *(?:429|5\d\d)\b|\b(?:429 too many requests|500 internal server error|502 bad gateway"
    r"|503 service unavailable|504 gateway timeout)\b"
    r"|\bslow ?down\b|serviceunavailable|service unavailable|throttl|requesttimeout|too many requests"
    r"|<code>internalerror</code>",
    re.IGNORECASE,
)
# ... and what says retrying cannot help, whatever else the text holds
_REFUSED = re.compile(
    r"access ?denied|forbidden|unauthori[sz]ed|permission denied|necessary privileges|invalidaccesskeyid"
    r"|signaturedoesnotmatch|nosuchbucket|not found|expiredtoken|invalid ?argument|invalid ?request",
    re.IGNORECASE,
)


# What a Delta writer says when a row breaks a rule of the table itself: a CHECK constraint, a NOT NULL
# column or a generated column's expression, which a user may have added to a table the job writes. delta-rs
# 1.6.6: "Invalid data found: N rows failed validation check. Preview of invalid data: <the rows>" (or
# "Invalid data found: validation check failed with value <v>"); Delta Lake 4: DeltaInvariantViolationException,
# "[DELTA_VIOLATE_CONSTRAINT_WITH_VALUES] CHECK constraint c (<expr>) violated by row with values: - v : <v>",
# "[DELTA_NOT_NULL_CONSTRAINT_VIOLATED] NOT NULL constraint violated for column: v". Both quote the row's
# values, so nothing after these words is searched for what a storage outage says.
_CONSTRAINT_VIOLATED = re.compile(
    r"Invalid data found: (?:\d+ rows failed validation check|validation check failed)"
    r"|InvariantViolationException|\[DELTA_VIOLATE_CONSTRAINT_WITH_VALUES\]|\[DELTA_NOT_NULL_CONSTRAINT_VIOLATED\]"
    r"|violated by row with values"
)
_QUOTED_LIMIT = 400
"""How many characters of a refusal that quotes a row's values a constraint error keeps."""


def constraint_violated(exc: BaseException) -> bool:
    """Whether ``exc`` (from delta-rs, or from Delta Lake through Spark) says a row broke a constraint of the
    table: a CHECK constraint, a NOT NULL column or a generated column."""
    return bool(_CONSTRAINT_VIOLATED.search(one_line(exc)))


def constraint_error(doing: str, exc: BaseException) -> SinkError:
    """The terminal error for ``exc``, a table constraint refusing a row while ``doing`` (``"merge into
    s3://... failed"``): retrying writes the same row again, so an operator has to drop or change the
    constraint (or the table). Its message keeps the start of what the writer said (the constraint and the
    row's values), at most :data:`_QUOTED_LIMIT` characters."""
    text = one_line(exc)
    if len(text) > _QUOTED_LIMIT:
        text = f"{text[:_QUOTED_LIMIT]}… ({len(text)} characters)"
    return SinkError(
        f"{doing}: a table constraint (a user's CHECK constraint, NOT NULL column or generated column) refused a "
        f"row; drop or change the constraint, then run the job again: {text}")


def storage_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (from delta-rs, pyarrow or the OS) says the storage could not be reached or was
    overloaded (connection refused/reset, timeout, DNS failure, HTTP 5xx or 429): worth retrying later. An
    access, not-found or invalid-request failure is not, even when the text also mentions a retry; nor is a
    table constraint refusing a row (:func:`constraint_violated`), whose text quotes the row's values."""
    if isinstance(exc, (PermissionError, FileNotFoundError, NotADirectoryError, IsADirectoryError)):
        return False
    text = one_line(exc)
    if _REFUSED.search(text) or _CONSTRAINT_VIOLATED.search(text):
        return False
    return isinstance(exc, (ConnectionError, TimeoutError, socket.gaierror)) or bool(_UNREACHABLE.search(text))


def storage_error(doing: str, exc: BaseException) -> SinkError | StorageUnavailableError:
    """The error to raise for ``exc``, a delta-rs, pyarrow or OS failure while ``doing`` (``"cannot read
    Delta table s3://..."``): for a table constraint refusing a row, :func:`constraint_error` (terminal);
    :class:`~ticdc_delta.errors.StorageUnavailableError` (retryable: exit 75) when the storage could not be
    reached (:func:`storage_unreachable`); else :class:`~ticdc_delta.errors.SinkError` (terminal). The
    message is ``doing`` and ``exc`` in one line (:func:`one_line`)."""
    if constraint_violated(exc):
        return constraint_error(doing, exc)
    message = f"{doing}: {one_line(exc)}"
    if storage_unreachable(exc):
        return StorageUnavailableError(f"{message} (the storage is unreachable or overloaded; retry later)")
    return SinkError(message)


def read_table(
    path: str, *, storage_options: Mapping[str, str] | None = None, columns: Sequence[str] | None = None
) -> pa.Table:
    """The current rows of the Delta table at ``path``, with plain (non-view) Arrow types.

    Safe to use in a process that must exit cleanly: it reads through delta-rs's DataFusion scan, not
    ``to_pyarrow_table``/``to_pyarrow_dataset`` (see the module docstring). Row order is not defined.

    Raises:
        SinkError: there is no Delta table at ``path``, or it cannot be read.
        StorageUnavailableError: the storage could not be reached (retryable).
    """
    try:
        return snapshot_rows(DeltaTable(path, storage_options=dict(storage_options) if storage_options else None),
                             columns)
    except TableNotFoundError as exc:
        raise SinkError(f"no Delta table at {path}") from exc
    except (DeltaError, pa.ArrowException, OSError) as exc:
        raise storage_error(f"cannot read Delta table {path}", exc) from exc


def snapshot_rows(dt: DeltaTable, columns: Sequence[str] | None = None) -> pa.Table:
    """The rows of the loaded snapshot ``dt`` — its version, whatever was committed since — with plain
    (non-view) Arrow types, read as :func:`read_table` reads them. Row order is not defined.

    Raises:
        deltalake.exceptions.DeltaError, OSError, pyarrow.ArrowException: from delta-rs.
    """
    table = pa.table(dt.scan(columns=list(columns) if columns is not None else None))
    target = pa.schema([f.with_type(_plain_type(f.type)) for f in table.schema])
    return table if target == table.schema else table.cast(target)


def run_commit(
    action: str, path: str, attempt: Callable[[], R], *, max_retries: int = 5, backoff_s: float = 0.05
) -> R:
    """Run ``attempt`` (which must load a fresh snapshot and re-check its transaction each time),
    retrying it when a concurrent writer wins the commit race.

    Raises:
        ConcurrentCommitError: still losing after ``max_retries`` retries.
        StorageUnavailableError: the storage could not be reached (retryable: the job exits 75).
        SinkError: any other delta-rs or Arrow failure, naming the table path.
    """
    last: CommitFailedError | None = None
    for n in range(max_retries + 1):
        if n:
            delay = min(5.0, backoff_s * (2 ** (n - 1))) * (0.5 + random.random())
            log.warning("%s %s: concurrent commit (%s); retry %d in %.2fs", action, path, last, n, delay)
            time.sleep(delay)
        try:
            return attempt()
        except CommitFailedError as exc:
            last = exc
        except SinkError:
            raise
        except (DeltaError, pa.ArrowException, OSError) as exc:
            raise storage_error(f"{action} {path} failed", exc) from exc
    raise ConcurrentCommitError(
        f"{action} {path}: lost to concurrent commits {max_retries + 1} times; last: {last}"
    ) from last


def check_txn(txn: Txn) -> Txn:
    """``txn`` as a :class:`Txn`, checked.

    Raises:
        TypeError: not an ``(app_id, version)`` pair.
        ValueError: an empty app id or a negative version.
    """
    if not isinstance(txn, tuple) or len(txn) != 2:
        raise TypeError(f"txn must be an (app_id, version) pair, got {txn!r}")
    app_id, version = txn
    if not isinstance(app_id, str) or not app_id:
        raise ValueError(f"txn app_id must be a non-empty str, got {app_id!r}")
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise ValueError(f"txn version must be an int >= 0, got {version!r}")
    return Txn(app_id, version)


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def check_new_table(arrow_schema: pa.Schema, partition_by: Sequence[str] | None) -> list[str]:
    """The partition columns of a table to be created with ``arrow_schema``, checked (every sink's
    ``ensure_table``).

    Raises:
        TypeError: not a schema.
        ValueError: a partition column not in it, or the reserved :data:`OP_COLUMN`.
    """
    if not isinstance(arrow_schema, pa.Schema):
        raise TypeError(f"arrow_schema must be a pyarrow.Schema, got {type(arrow_schema).__name__}")
    parts = list(partition_by or [])
    for name in parts:
        if arrow_schema.get_field_index(name) < 0:
            raise ValueError(f"partition column {name!r} is not in the schema {arrow_schema.names}")
        kind = arrow_schema.field(name).type
        if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
            # (delta-rs writes such values escaped and re-escapes them at every compaction; Spark refuses them)
            raise ValueError(f"partition column {name!r} holds bytes ({kind}), which no Delta partition value keeps "
                             "as they are: partition by another column (tables[].partition_by)")
    if OP_COLUMN in arrow_schema.names:
        raise ValueError(_RESERVED)
    return parts


def check_new_fields(fields: Iterable[pa.Field]) -> list[pa.Field]:
    """``fields`` as a list, checked as columns to add to a table (every sink's ``add_columns``).

    Raises:
        TypeError: an item that is not a ``pyarrow.Field``.
        ValueError: the reserved :data:`OP_COLUMN`.
    """
    wanted = list(fields)
    for f in wanted:
        if not isinstance(f, pa.Field):
            raise TypeError(f"fields must be pyarrow.Field, got {type(f).__name__}")
        if f.name == OP_COLUMN:
            raise ValueError(_RESERVED)
    return wanted


def commit_properties(app_id: str, version: int, *, rebase: bool = True) -> CommitProperties:
    """Commit properties recording the app transaction ``(app_id, version)``.

    ``rebase=False`` is for overwrites: the commit lands right after the snapshot it was built from or fails
    with ``CommitFailedError``, for :func:`run_commit` to redo the work from a fresh snapshot. delta-rs 1.6.6
    otherwise commits an overwrite on top of another writer's commit made since its snapshot was loaded (its
    conflict check lets a compaction or an append through), and that commit's files stay next to the
    overwrite's: a user's OPTIMIZE during a rewrite left every row twice, during a TRUNCATE every row. A
    MERGE keeps delta-rs's retries: its conflict check refuses a commit that changed the files it read."""
    return CommitProperties(
        app_transactions=[Transaction(app_id, version, int(time.time() * 1000))],
        max_commit_retries=None if rebase else 0,
    )


def moved_from(location: str) -> str:
    """The app id of the transaction a table copied from ``location`` (RENAME TABLE on an object store)
    records in the copy's first commit."""
    return f"ticdc-delta/moved-from/{location}"


TableCopy = Callable[[str, str, str], None]
"""How a table is copied to another location for RENAME TABLE on an object store: ``(src, dst, app_id)``,
the rows and schema of ``src`` written to ``dst`` (no Delta table there) in one commit that records the app
transaction ``(app_id, 0)`` (:func:`moved_from`)."""


def already_applied(dt: DeltaTable, txn: Txn) -> bool:
    """Whether ``dt`` has committed ``txn.app_id`` at ``txn.version`` or later."""
    committed = dt.transaction_version(txn.app_id)
    return committed is not None and committed >= txn.version


def cast_column(name: str, new_type: pa.DataType, text: TextSource | None = None) -> Callable[[pa.Table], pa.Table]:
    """A table transform casting column ``name`` to ``new_type`` (for rewrites: picklable, runs on
    executors too); to a string type with ``text``, values print as TiDB prints them
    (:func:`~ticdc_delta.delta.arrow_types.tidb_text`).

    The transform raises SinkError when a value cannot be cast.
    """
    return cast_columns({name: new_type}, {name: text} if text is not None else None)


def cast_columns(types: Mapping[str, pa.DataType],
                 texts: Mapping[str, TextSource] | None = None) -> Callable[[pa.Table], pa.Table]:
    """A table transform casting each column of ``types`` (``{name: new type}``) to its type, as
    :func:`cast_column` (``texts``: ``{name: TextSource}`` of the columns that become strings).

    The transform raises SinkError when a value cannot be cast.
    """
    wanted = dict(types)
    as_text = dict(texts or {})

    def cast(table: pa.Table) -> pa.Table:
        for name, new_type in wanted.items():
            i = table.column_names.index(name)
            old_type = table.schema.field(i).type
            try:
                printed = (tidb_text(table.column(i), as_text[name])
                           if name in as_text and pa.types.is_string(new_type) else None)
                column = printed if printed is not None else table.column(i).cast(new_type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise SinkError(f"cannot cast {name} from {old_type} to {new_type}: {exc}") from exc
            table = table.set_column(i, pa.field(name, new_type), column)
        return table

    return cast


def narrow_columns(specs: Mapping[str, Narrowing]) -> Callable[[pa.Table], pa.Table]:
    """A table transform rounding each column of ``specs`` (``{name: Narrowing}``) as TiDB's MODIFY COLUMN
    does when the column loses precision but keeps its Delta type
    (:func:`~ticdc_delta.delta.arrow_types.narrowed`); picklable, for rewrites on the executors too.

    The transform raises SinkError when a value cannot be rounded.
    """
    wanted = dict(specs)

    def narrow(table: pa.Table) -> pa.Table:
        for name, how in wanted.items():
            i = table.column_names.index(name)
            table = table.set_column(i, table.schema.field(i), narrowed(table.column(i), how))
        return table

    return narrow


def table_arrow_schema(dt: DeltaTable) -> pa.Schema:
    """The current schema of a delta-rs table, as an Arrow schema."""
    return pa.schema(dt.schema().to_arrow())


def _file_stats(actions: pa.Table, dt: DeltaTable) -> pa.Table:
    """:attr:`TableFacts.files` from delta-rs's add actions (``flatten=False``): ``num_records``, ``min`` and
    ``max`` with the statistics' physical column names (column mapping) turned into the table's names; a
    partition column's value is its least and greatest."""
    logical = {}
    for field in dt.schema().fields:
        physical = (field.metadata or {}).get("delta.columnMapping.physicalName")
        logical[str(physical) if physical else field.name] = field.name

    def by_name(column: str) -> dict[str, pa.Array]:
        found = actions.column(column).combine_chunks() if column in actions.column_names else None
        if found is None or not pa.types.is_struct(found.type):
            return {}
        # flatten: the children with the struct's own nulls (a file without statistics)
        return {logical.get(f.name, f.name): child for f, child in zip(found.type, found.flatten())}

    partitions = by_name("partition")
    columns = {"num_records": actions.column("num_records") if "num_records" in actions.column_names
               else pa.nulls(actions.num_rows, pa.int64())}
    for side in ("min", "max"):
        found = {**by_name(side), **partitions}
        columns[side] = (pa.StructArray.from_arrays(list(found.values()), names=list(found)) if found
                         else pa.nulls(actions.num_rows, pa.struct([])))
    return pa.table(columns)


def _distinct_keys(table: pa.Table, keys: Sequence[str]) -> int:
    """How many distinct values the ``keys`` columns of ``table`` hold together. Arrow cannot group by a
    nested column (a VECTOR is ``list<float32>``: a table without a key is keyed by all its columns, that
    one too): such a column is grouped by its values' ``repr`` (one string per value, null kept null)."""
    columns = {}
    for i, name in enumerate(keys):
        column = table.column(name)
        if pa.types.is_nested(column.type):
            column = pa.array([None if v is None else repr(v) for v in column.to_pylist()], pa.string())
        columns[f"k{i}"] = column
    return pa.table(columns).group_by(list(columns)).aggregate([]).num_rows


def _uncommitted(name: str) -> bool:
    """Whether a file of a Delta log is a commit's temporary file (a hidden name: ``.<version>.json.<uuid>.tmp``
    and its ``.crc``), never a commit, checkpoint or checksum of a committed version."""
    return name.startswith(".")


class DeltaRsSink:
    """:class:`TableSink` on delta-rs (``deltalake``), for the Spark driver.

    Args:
        root: where tables live (local path or object-store URI); table ``(s, t)`` is at ``{root}/{s}/{t}``
            (names through :func:`ticdc_delta.locations.table_location`: encoded, checked to stay inside).
        paths: explicit locations for some tables, ``{(schema, table): path}``; they win over ``root``.
        explicit: a function giving the explicit location of a table or ``None`` (the YAML mapping);
            consulted after ``paths``. Explicit locations are the operator's and are used as given.
        storage_options: passed to delta-rs (object-store credentials and settings).
        max_retries: how many times a write lost to a concurrent commit is retried before
            :class:`~ticdc_delta.errors.ConcurrentCommitError`.
        retry_backoff_s: first back-off; doubled on each retry (with jitter), capped at 5 s.
        writer_properties: Parquet writer settings for every write.

    Raises:
        ValueError: ``root`` is empty, or ``max_retries`` is negative.
    """

    def __init__(
        self,
        root: str,
        *,
        paths: Mapping[tuple[str, str], str] | None = None,
        explicit: Callable[[str, str], str | None] | None = None,
        storage_options: Mapping[str, str] | None = None,
        max_retries: int = 5,
        retry_backoff_s: float = 0.05,
        writer_properties: WriterProperties | None = None,
    ) -> None:
        if not root:
            raise ValueError("root must be a non-empty path or URI")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.root = root.rstrip("/") or "/"
        self._paths = {TableIdent(*k): v for k, v in (paths or {}).items()}
        self._explicit = explicit
        self._storage_options = dict(storage_options) if storage_options else None
        self._max_retries = max_retries
        self._backoff = retry_backoff_s
        self._writer_properties = writer_properties
        self._read_properties: dict[str, dict[str, str]] = {}  # path -> properties of its last table_facts read
        self._partitions: dict[str, tuple[str, ...]] = {}  # path -> partition columns (fixed at creation)

    # --- locations ------------------------------------------------------------------------------------

    def table_path(self, schema: str, table: str) -> str:
        """``{root}/{schema}/{table}`` (encoded names) unless ``paths`` or ``explicit`` names the table.

        Raises:
            IdentifierError: a name no location can hold (empty, NUL, too long once encoded).
        """
        explicit = self._explicit_path(schema, table)
        if explicit is not None:
            return explicit
        return table_location(self.root, schema, table)

    def _explicit_path(self, schema: str, table: str) -> str | None:
        explicit = self._paths.get(TableIdent(schema, table))
        if explicit is None and self._explicit is not None:
            explicit = self._explicit(schema, table)
        return explicit

    def _path(self, ident: TableIdent) -> str:
        return self.table_path(ident[0], ident[1])

    def _removable(self, ident: TableIdent) -> str:
        """The location of ``ident`` for deleting files: an explicit location as configured, else one
        checked once more to lie inside the root (never the root itself or anything above it).

        Raises:
            IdentifierError: the location is not inside the root.
        """
        path = self._path(ident)
        if self._explicit_path(*ident) is None:
            check_inside(self.root, path)
        return path

    def _load(self, path: str) -> DeltaTable | None:
        """The table's latest snapshot, or ``None`` when there is none.

        Raises:
            StorageUnavailableError: the storage could not be reached (retryable).
            SinkError: the table's log cannot be read.
        """
        try:
            return DeltaTable(path, storage_options=self._storage_options)
        except TableNotFoundError:
            return None
        except (DeltaError, OSError) as exc:
            raise storage_error(f"cannot read the Delta log of {path}", exc) from exc

    def _require(self, path: str) -> DeltaTable:
        dt = self._load(path)
        if dt is None:
            raise SinkError(f"no Delta table at {path} (create it with ensure_table first)")
        return dt

    # --- commit plumbing ------------------------------------------------------------------------------

    def _run(self, action: str, path: str, attempt: Callable[[], R]) -> R:
        return run_commit(action, path, attempt, max_retries=self._max_retries, backoff_s=self._backoff)

    def _conform(
        self,
        rows: pa.Table,
        target: pa.Schema,
        path: str,
        ignore: Iterable[str] = (),
        fill_missing: bool = False,
    ) -> pa.Table:
        """``rows`` with each column cast to the target column's type; with ``fill_missing``, also the
        target columns ``rows`` lacks (as nulls), in the target's column order.

        Raises:
            SinkError: a column the table does not have, or a value that does not fit.
        """
        skip = set(ignore)
        arrays, fields = [], []
        for field, column in zip(rows.schema, rows.columns):
            if field.name in skip:
                arrays.append(column)
                fields.append(field)
                continue
            idx = target.get_field_index(field.name)
            if idx < 0:
                raise SinkError(
                    f"{path}: column {field.name!r} is not in the table (add it with add_columns first); "
                    f"table columns: {target.names}"
                )
            want = target.field(idx).type
            if column.type != want:
                try:
                    column = column.cast(want)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    reason = str(exc)  # Arrow quotes the whole offending value: cap it
                    if len(reason) > 400:
                        reason = f"{reason[:400]}… ({len(reason)} characters)"
                    raise SinkError(
                        f"{path}: column {field.name!r} ({column.type}) does not fit {want}: {reason}"
                    ) from exc
            arrays.append(column)
            fields.append(pa.field(field.name, want, nullable=True))
        if fill_missing:
            given = dict(zip((f.name for f in fields), zip(fields, arrays)))
            fields, arrays = [], []
            for t in target:
                f, a = given.get(t.name) or (t.with_nullable(True), pa.nulls(rows.num_rows, t.type))
                fields.append(f)
                arrays.append(a)
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))

    # --- reads ----------------------------------------------------------------------------------------

    def table_schema(self, ident: TableIdent) -> pa.Schema | None:
        """The table's current Arrow schema, or ``None`` when it does not exist.

        Raises:
            SinkError: the table cannot be read.
        """
        facts = self.table_facts(ident, stats=False)
        return None if facts is None else facts.schema

    def table_rows(self, ident: TableIdent) -> int | None:
        """The table's current number of rows by its files' statistics, or ``None`` when it does not exist
        (:meth:`table_facts`).

        Raises:
            SinkError: the table cannot be read.
        """
        facts = self.table_facts(ident)
        return None if facts is None else facts.rows

    def table_facts(self, ident: TableIdent, *, stats: bool = True) -> TableFacts | None:
        """The table's current schema and, with ``stats``, its number of rows and its files' statistics (no
        data is read; a file without the row count counts 0), from one read of its log; ``None`` when it does
        not exist.

        Raises:
            SinkError: the table cannot be read.
        """
        path = self._path(ident)
        try:
            dt = self._load(path)
            if dt is None:
                return None
            schema = table_arrow_schema(dt)
            self._read_properties[path] = dict(dt.metadata().configuration)  # (for table_properties)
            self._partitions[path] = tuple(dt.metadata().partition_columns)
            if not stats:
                return TableFacts(schema, None)
            files = _file_stats(pa.table(dt.get_add_actions(flatten=False)), dt)
            return TableFacts(schema, pc.sum(files.column("num_records")).as_py() or 0, files)
        except (DeltaError, pa.ArrowException, OSError) as exc:
            raise storage_error(f"cannot read the log of {path}", exc) from exc

    def partition_columns(self, ident: TableIdent) -> tuple[str, ...]:
        """The table's partition columns (``()``: none, or no table), as its last log read found them.

        Raises:
            SinkError: the table cannot be read.
        """
        path = self._path(ident)
        found = self._partitions.get(path)
        if found is None:
            dt = self._load(path)
            found = () if dt is None else tuple(dt.metadata().partition_columns)
            if dt is not None:
                self._partitions[path] = found
        return found

    def read(self, ident: TableIdent) -> pa.Table:
        """The table's current rows (order not defined), via :func:`read_table`.

        Raises:
            SinkError: the table is missing or cannot be read.
        """
        return read_table(self._path(ident), storage_options=self._storage_options)

    # --- schema commits -------------------------------------------------------------------------------

    def ensure_table(
        self,
        ident: TableIdent,
        arrow_schema: pa.Schema,
        partition_by: Sequence[str] | None,
        txn: Txn,
        properties: Mapping[str, str] | None = None,
    ) -> bool:
        """Create the table with ``arrow_schema`` (and the Delta table ``properties``) if it is missing;
        ``True`` when this call created it.

        An existing table is left as it is (use :meth:`add_columns` for new columns).

        Raises:
            TypeError/ValueError: bad arguments (not a schema, a partition column not in it, bad txn).
            SinkError: the table cannot be created.
            ConcurrentCommitError: other writers kept winning.
        """
        parts = check_new_table(arrow_schema, partition_by)
        txn = check_txn(txn)
        path = self._path(ident)

        def attempt() -> bool:
            if self._load(path) is not None:
                return False
            DeltaTable.create(
                path,
                arrow_schema,
                mode="ignore",  # another writer created it meanwhile: fine, it is there
                partition_by=parts or None,
                storage_options=self._storage_options,
                configuration=dict(properties) if properties else None,
                commit_properties=commit_properties(txn.app_id + SCHEMA_TXN_SUFFIX, txn.version),
            )
            return True

        return self._run("create", path, attempt)

    def table_properties(self, ident: TableIdent) -> dict[str, str] | None:
        """See :meth:`TableSink.table_properties`.

        Raises:
            SinkError: the table cannot be read.
        """
        path = self._path(ident)
        found = self._read_properties.pop(path, None)
        if found is not None:
            return found
        try:
            dt = self._load(path)
        except (DeltaError, OSError) as exc:
            raise storage_error(f"cannot read the log of {path}", exc) from exc
        return None if dt is None else dict(dt.metadata().configuration)

    def set_table_properties(self, ident: TableIdent, properties: Mapping[str, str]) -> None:
        """See :meth:`TableSink.set_table_properties`.

        Raises:
            SinkError: the table is missing or refused them.
            ConcurrentCommitError: other writers kept winning.
        """
        path = self._path(ident)

        def attempt() -> None:
            self._require(path).alter.set_table_properties(dict(properties))

        self._run("set properties of", path, attempt)

    def add_columns(self, ident: TableIdent, fields: Sequence[pa.Field], txn: Txn) -> list[str]:
        """Add the columns of ``fields`` the table does not have yet, as nullable columns.

        A column already there with the same Delta type is skipped (a re-run batch adds nothing), and so is
        the whole call when the table has committed ``txn`` or a later version of its app id (see the
        module docstring); the names added are returned. Names compare case-insensitively, as MySQL column
        names do.

        Raises:
            TypeError/ValueError: bad arguments.
            SinkError: the table is missing, or has a column of that name with another type or case.
            ConcurrentCommitError: other writers kept winning.
        """
        wanted = check_new_fields(fields)
        txn = check_txn(txn)
        path = self._path(ident)

        def attempt() -> list[str]:
            dt = self._require(path)
            if already_applied(dt, txn):
                return []
            existing = {f.name.lower(): f for f in table_arrow_schema(dt)}
            new: list[DeltaField] = []
            for f in wanted:
                delta_field = DeltaField.from_arrow(f.with_nullable(True))
                as_stored = pa.field(delta_field.to_arrow())
                have = existing.get(f.name.lower())
                if have is None:
                    new.append(delta_field)
                    existing[f.name.lower()] = as_stored
                elif have.name != f.name or have.type != as_stored.type:
                    raise SinkError(
                        f"{path}: cannot add column {f.name!r} {as_stored.type}: "
                        f"the table has {have.name!r} {have.type}"
                    )
            if new:
                dt.alter.add_columns(
                    new, commit_properties=commit_properties(txn.app_id + SCHEMA_TXN_SUFFIX, txn.version)
                )
            return [f.name for f in new]

        return self._run("add columns to", path, attempt)

    # --- data commits ---------------------------------------------------------------------------------

    def merge(
        self, ident: TableIdent, changes: pa.Table, key_columns: Sequence[str], txn: Txn
    ) -> MergeStats:
        """Apply ``changes`` (the target columns plus :data:`OP_COLUMN`) keyed by ``key_columns``.

        At most one row per key (the caller has collapsed each key to its final change). Matched and
        ``'d'`` → delete; matched and ``'u'`` → update every column given; not matched and ``'u'`` →
        insert (columns not given are null); not matched and ``'d'`` → nothing. Keys compare null-safely
        (``<=>``: a NULL key part matches a NULL key part), so unique keys with nullable parts work.

        Raises:
            TypeError/ValueError: ``changes`` is not a table, lacks :data:`OP_COLUMN` or a key column, has
                an op other than ``'u'``/``'d'``, or has two rows for one key; bad ``txn``.
            SinkError: the table is missing, or a column is not in it / does not fit it.
            ConcurrentCommitError: other writers kept winning.
        """
        if not isinstance(changes, pa.Table):
            raise TypeError(f"changes must be a pyarrow.Table, got {type(changes).__name__}")
        keys = list(key_columns)
        if not keys:
            raise ValueError("key_columns must name at least one column")
        names = changes.column_names
        if OP_COLUMN not in names:
            raise ValueError(f"changes must have an {OP_COLUMN!r} column ('u' upsert / 'd' delete)")
        for k in keys:
            if k not in names:
                raise ValueError(f"key column {k!r} is not in changes {names}")
        if len(set(names)) != len(names):
            raise ValueError(f"changes has duplicate column names: {names}")
        txn = check_txn(txn)
        if changes.num_rows == 0:
            return MergeStats()
        ops = changes.column(OP_COLUMN)
        if ops.null_count or not set(pc.unique(ops).to_pylist()) <= {OP_UPSERT, OP_DELETE}:
            raise ValueError(f"{OP_COLUMN!r} values must be {OP_UPSERT!r} or {OP_DELETE!r}")
        if _distinct_keys(changes, keys) != changes.num_rows:
            raise ValueError(f"changes has more than one row for some key {keys}: collapse them first")
        path = self._path(ident)
        columns = [c for c in names if c != OP_COLUMN]
        # Null-safe `<=>` only where the changes hold a NULL key part. Where they hold none, `=` matches
        # exactly the same rows (a non-NULL source value is never equal to a NULL target value either way)
        # and lets delta-rs prune target files by the source's key range; `<=>` disables that pruning
        # (delta-rs 1.6.6, 1k changes into a 20-file table: 0.09 s with `=`, 0.47 s with `<=>`).
        # Decimal keys always use `<=>`: with `=`, delta-rs 1.6.6's pruning by the source's key range
        # misses matching rows of a decimal(20,0) key (BIGINT UNSIGNED) and inserts them again. Nested keys
        # (a VECTOR of a table keyed by all its columns) too: with `=`, delta-rs 1.6.6 fails to build the
        # pruning filter from the source's values ("Unable to convert expression to string").
        def null_safe(k: str) -> bool:
            col = changes.column(k)
            return bool(col.null_count) or pa.types.is_decimal(col.type) or pa.types.is_nested(col.type)

        def predicate_for(dt: DeltaTable) -> str:
            # A text partition column of the key compares '' and NULL alike: Delta's partition values
            # cannot hold '' (the spec reads it as null; Spark writes it so, delta-rs reads it back as ''
            # until a rewrite such as compaction makes it null), so '' and NULL are one value there, and
            # either of them in the target must match either in the source.
            parts = set(dt.metadata().partition_columns)
            return " AND ".join(
                f"(coalesce(t.{q}, '') = coalesce(s.{q}, ''))" if k in parts and _is_text(changes.column(k).type)
                else f"(t.{q} {'<=>' if null_safe(k) else '='} s.{q})"
                for k, q in ((k, quote_identifier(k)) for k in keys))

        # Explicit column maps, not update_all/insert_all: those do not escape backticks in column names
        # (delta-rs 1.6.6: "Expected close delimiter '`'").
        assignments = {quote_identifier(c): f"s.{quote_identifier(c)}" for c in columns}
        op = f"s.{quote_identifier(OP_COLUMN)}"

        def attempt() -> MergeStats:
            dt = self._require(path)
            if already_applied(dt, txn):
                return MergeStats(version=dt.version(), skipped=True)
            source = self._conform(changes, table_arrow_schema(dt), path, ignore=(OP_COLUMN,))
            metrics = (
                dt.merge(
                    source,
                    predicate_for(dt),
                    source_alias="s",
                    target_alias="t",
                    writer_properties=self._writer_properties,
                    # the source is in memory: let delta-rs use its statistics to prune target files
                    streamed_exec=False,
                    commit_properties=commit_properties(*txn),
                )
                .when_matched_delete(f"{op} = '{OP_DELETE}'")
                .when_matched_update(assignments, f"{op} = '{OP_UPSERT}'")
                .when_not_matched_insert(assignments, f"{op} = '{OP_UPSERT}'")
                .execute()
            )
            return MergeStats(
                inserted=int(metrics.get("num_target_rows_inserted", 0)),
                updated=int(metrics.get("num_target_rows_updated", 0)),
                deleted=int(metrics.get("num_target_rows_deleted", 0)),
                version=dt.version(),
            )

        return self._run("merge into", path, attempt)

    def append(self, ident: TableIdent, rows: pa.Table, txn: Txn) -> MergeStats:
        """Append ``rows``; a missing table is created from their schema.

        Raises:
            TypeError/ValueError: ``rows`` is not a table; bad ``txn``.
            SinkError: a column is not in the table or does not fit it.
            ConcurrentCommitError: other writers kept winning.
        """
        if not isinstance(rows, pa.Table):
            raise TypeError(f"rows must be a pyarrow.Table, got {type(rows).__name__}")
        txn = check_txn(txn)
        path = self._path(ident)

        def attempt() -> MergeStats:
            dt = self._load(path)
            if dt is not None and already_applied(dt, txn):
                return MergeStats(version=dt.version(), skipped=True)
            data = rows if dt is None else self._conform(rows, table_arrow_schema(dt), path, fill_missing=True)
            write_deltalake(  # type: ignore[call-overload]  # (its overloads refuse writer_properties=None)
                dt if dt is not None else path,
                data,
                mode="append",
                storage_options=self._storage_options if dt is None else None,
                writer_properties=self._writer_properties,
                commit_properties=commit_properties(*txn),
            )
            written = self._require(path)
            return MergeStats(inserted=rows.num_rows, version=written.version())

        return self._run("append to", path, attempt)

    def overwrite_empty(self, ident: TableIdent, txn: Txn) -> bool:
        """TRUNCATE: commit a new version with no rows (schema and partitioning kept).

        Always commits (unless already done), even when the table is empty, so the transaction is
        recorded; ``DeltaTable.delete()`` would commit nothing on an empty table.

        Raises:
            ValueError: bad ``txn``.
            SinkError: the table is missing.
            ConcurrentCommitError: other writers kept winning.
        """
        return self._overwrite(ident, lambda dt: table_arrow_schema(dt).empty_table(), txn, "truncate")

    def rewrite(self, ident: TableIdent, transform: Callable[[pa.Table], pa.Table], txn: Txn,
                renames: Mapping[str, str] | None = None) -> bool:
        """Replace the table's rows *and schema* with ``transform(current rows)`` in one overwrite commit.

        For the DDL Delta cannot express in place without column mapping (DROP / RENAME COLUMN, a type
        change, ADD COLUMN with a DEFAULT for existing rows). The previous rows stay in the table's
        history (time travel) until a VACUUM. Partitioning is kept: by the partition columns the output
        still has, under their new names where ``renames`` (old name -> new) renames them; a partition
        column the output lacks (dropped) no longer partitions the table. ``True`` when this call rewrote it.

        Raises:
            ValueError: bad ``txn``.
            SinkError: the table is missing, or the transform's output cannot be written.
            ConcurrentCommitError: other writers kept winning.
        """
        return self._overwrite(ident, lambda dt: transform(snapshot_rows(dt)), txn, "rewrite", renames)

    def drop_column(self, ident: TableIdent, name: str, txn: Txn) -> bool:
        """DROP COLUMN ``name`` (the table's spelling): a :meth:`rewrite` without it (delta-rs writes no
        column mapping, without which Delta cannot drop a column in place).

        Raises:
            ValueError: bad ``txn``.
            SinkError: the table is missing.
            ConcurrentCommitError: other writers kept winning.
        """
        return self.rewrite(ident, lambda t: t.drop_columns([name]), txn)

    def rename_column(self, ident: TableIdent, old: str, new: str, txn: Txn) -> bool:
        """RENAME COLUMN ``old`` (the table's spelling) to ``new``: a :meth:`rewrite` with the column renamed.

        Raises:
            ValueError: bad ``txn``.
            SinkError: the table is missing.
            ConcurrentCommitError: other writers kept winning.
        """
        return self.rewrite(ident, lambda t: t.rename_columns([new if n == old else n for n in t.column_names]), txn,
                            {old: new})

    def change_column_type(self, ident: TableIdent, name: str, new_type: pa.DataType, txn: Txn,
                           text: TextSource | None = None) -> bool:
        """Column ``name`` (the table's spelling) as ``new_type``: a :meth:`rewrite` with a cast (the caller
        checks that the change loses nothing: :func:`~ticdc_delta.delta.arrow_types.widens`; ``text``: as
        :func:`cast_column`).

        Raises:
            ValueError: bad ``txn``.
            SinkError: the table is missing, or a value cannot be cast.
            ConcurrentCommitError: other writers kept winning.
        """
        return self.rewrite(ident, cast_column(name, new_type, text), txn)

    def change_column_types(self, ident: TableIdent, types: Mapping[str, pa.DataType], txn: Txn) -> bool:
        """Each column of ``types`` (the table's spelling) as its type: one :meth:`rewrite` with the casts.

        Raises:
            ValueError: bad ``txn``.
            SinkError: the table is missing, or a value cannot be cast.
            ConcurrentCommitError: other writers kept winning.
        """
        return self.rewrite(ident, cast_columns(types), txn)

    def snapshot(self, ident: TableIdent) -> DeltaTable | None:
        """The table's latest delta-rs snapshot (metadata, app transactions), or ``None`` when there is none.

        Raises:
            SinkError: the table's log cannot be read.
        """
        path = self._path(ident)
        try:
            return self._load(path)
        except (DeltaError, OSError) as exc:
            raise storage_error(f"cannot read the Delta log of {path}", exc) from exc

    def _overwrite(
        self, ident: TableIdent, rows: Callable[[DeltaTable], pa.Table], txn: Txn, action: str,
        renames: Mapping[str, str] | None = None,
    ) -> bool:
        """One overwrite commit (rows and schema) carrying ``txn``, unless it is already committed.

        ``rows`` makes the new rows from the snapshot the commit replaces, and nothing else: the commit is
        made on that snapshot or not at all (:func:`commit_properties` with ``rebase=False``), so rows
        another writer commits meanwhile (an append, a compaction's rewritten files) are neither lost nor
        kept twice; the attempt is redone from a fresh snapshot instead."""
        txn = check_txn(txn)
        path = self._path(ident)

        def attempt() -> bool:
            dt = self._require(path)
            if already_applied(dt, txn):
                return False
            new = rows(dt)
            named = [(renames or {}).get(c, c) for c in dt.metadata().partition_columns]
            # (a list, empty too: None would keep the old partitioning, whose columns may be gone)
            parts = [c for c in named if c in new.column_names]
            write_deltalake(  # type: ignore[call-overload]  # (its overloads refuse writer_properties=None)
                dt,
                new,
                mode="overwrite",
                schema_mode="overwrite",
                partition_by=parts,
                writer_properties=self._writer_properties,
                commit_properties=commit_properties(*txn, rebase=False),
            )
            return True

        return self._run(action, path, attempt)

    def move(self, old: TableIdent, new: TableIdent, copy: TableCopy | None = None) -> bool:
        """Move a table to the location of another name (RENAME TABLE); ``True`` when it moved.

        Local tables are renamed as directories (Delta logs hold relative file paths); object-store
        tables are copied with ``copy`` (by default :meth:`copy_table`, through delta-rs), then the old one
        dropped. Moving onto a location that already holds a table is refused; a move already done (old
        gone, new there) does nothing. The copy's commit records the app transaction :func:`moved_from` of
        the old location, so a move that stopped between the copy and the drop (both there) is told from a
        taken location, and finishes by dropping the old table.

        Raises:
            SinkError: the new location is taken, or the files cannot be moved.
        """
        src, dst = self._removable(old), self._removable(new)
        if src == dst:
            return False
        # (not DeltaTable.is_deltatable: delta-rs 1.6.6 holds the GIL while it waits for the store)
        if self._load(src) is None:
            return False
        there = self._load(dst)
        if there is not None:
            if there.transaction_version(moved_from(src)) is None:
                raise SinkError(f"cannot move {src} to {dst}: a Delta table is already there")
            log.info("finishing the move of %s to %s: the copy is complete, dropping the old table", src, dst)
            self.drop(old)
            return True
        local_src, local_dst = local_path(src), local_path(dst)
        try:
            if local_src is not None and local_dst is not None:
                if os.path.exists(local_dst):
                    shutil.rmtree(local_dst)  # leftovers without a _delta_log: not a table
                os.makedirs(os.path.dirname(local_dst) or ".", exist_ok=True)
                os.rename(local_src, local_dst)
                return True
            (copy or self.copy_table)(src, dst, moved_from(src))
        except (DeltaError, OSError, pa.ArrowException) as exc:
            raise storage_error(f"cannot move Delta table {src} to {dst}", exc) from exc
        self.drop(old)
        return True

    def copy_table(self, src: str, dst: str, app_id: str) -> None:
        """The :data:`TableCopy` of the ``delta-rs`` engine: the rows of ``src`` streamed through this process
        (a record batch at a time, not the whole table in memory) into one overwrite commit at ``dst``
        recording the app transaction ``(app_id, 0)`` (the ``spark`` engine copies on its executors).

        Raises:
            SinkError: ``src`` is not a Delta table.
            deltalake.exceptions.DeltaError, OSError, pyarrow.ArrowException: from delta-rs.
        """
        dt = self._require(src)
        scan = pa.RecordBatchReader.from_stream(dt.scan())
        schema = pa.schema([f.with_type(_plain_type(f.type)) for f in scan.schema])
        write_deltalake(
            dst,
            pa.RecordBatchReader.from_batches(schema, (batch.cast(schema) for batch in scan)),
            mode="overwrite",
            partition_by=list(dt.metadata().partition_columns) or None,
            storage_options=self._storage_options,
            commit_properties=commit_properties(app_id, 0),
        )

    def tables_in_schema(self, schema: str) -> list[TableIdent]:
        """The Delta tables under ``{root}/{schema}/`` (for DROP DATABASE): a directory listing on local
        storage, one listing of the schema's prefix (not of the tables' files) on an object store.

        Directory names are decoded with :func:`ticdc_delta.locations.decode_component`; entries that are
        not encoded names (not created by the job) are skipped and logged.

        Raises:
            SinkError: the object store cannot be listed.
        """
        base = child_location(self.root, path_component(schema))
        local = local_path(base)
        if local is not None:
            # (a log directory without a commit is no table: what a process killed in a table's first
            # commit leaves; clear_uncommitted_log removes it)
            names = sorted(n for n in os.listdir(local) if os.path.isdir(os.path.join(local, n, "_delta_log"))
                           and self._load(child_location(base, n)) is not None) if os.path.isdir(local) else []
        else:
            try:
                found = DeltaStorageHandler(base, options=self._storage_options).get_file_info_selector(
                    pafs.FileSelector("", allow_not_found=True, recursive=False))
            except (DeltaError, OSError) as exc:
                raise storage_error(f"cannot list the tables under {base}", exc) from exc
            names = sorted(f.base_name for f in found if f.type == pafs.FileType.Directory
                           and self._load(f"{base}/{f.base_name}") is not None)
        out = []
        for name in names:
            try:
                out.append(TableIdent(schema, decode_component(name)))
            except ValueError as exc:
                log.warning("schema %r: leaving %s/%s alone: %s", schema, base, name, exc)
        return out

    def clear_uncommitted_log(self, ident: TableIdent) -> bool:
        """Remove the table's log directory when it holds no commit (``True`` when there was one to
        remove): what a process killed while it committed the table's first version leaves — the commit's
        temporary files. No reader sees a table there, but Delta Lake's table builder takes the directory
        for a table and fails on it, on every restart. Only the temporary files go, one by one; a table
        with a committed version is left alone, also one whose first commit lands meanwhile.

        Raises:
            IdentifierError: the table's location is not inside the root.
            SinkError: the log cannot be read or the files cannot be removed.
        """
        path = self._removable(ident)
        try:
            if self._load(path) is not None:
                return False
            local = local_path(path)
            if local is None:
                store = DeltaStorageHandler(path, options=self._storage_options)
                found = [f.path for f in store.get_file_info_selector(
                    pafs.FileSelector("_delta_log", allow_not_found=True, recursive=True))
                    if f.type == pafs.FileType.File]
                foreign = [name for name in found if not _uncommitted(name.rsplit("/", 1)[-1])]
                if foreign:  # (as a directory that is not empty locally, below)
                    raise OSError(f"the log holds {foreign[0]}, not a commit's temporary file")
                if not found:
                    return False
                for name in found:
                    store.delete_file(name)
                return True
            log_dir = os.path.join(local, "_delta_log")
            if not os.path.isdir(log_dir):
                return False
            for root, dirs, files in os.walk(log_dir, topdown=False):
                for name in files:
                    if _uncommitted(name):
                        os.remove(os.path.join(root, name))
                for name in dirs:
                    with contextlib.suppress(OSError):  # (not empty: it holds more than temporary files)
                        os.rmdir(os.path.join(root, name))
            os.rmdir(log_dir)  # fails when anything but temporary files is there
            return True
        except OSError as exc:
            if self._load(path) is not None:  # a commit landed meanwhile: the table is there now
                return False
            raise storage_error(f"cannot clear the uncommitted Delta log of {path}", exc) from exc
        except DeltaError as exc:
            raise storage_error(f"cannot clear the uncommitted Delta log of {path}", exc) from exc

    def drop(self, ident: TableIdent) -> bool:
        """Delete the table's files (its log first, so a crash part-way leaves no half table).

        Raises:
            IdentifierError: the table's location is not inside the root.
            SinkError: the files cannot be removed.
        """
        path = self._removable(ident)
        try:
            existed = self._load(path) is not None
            local = local_path(path)
            if local is not None:
                if os.path.isdir(local):
                    shutil.rmtree(os.path.join(local, "_delta_log"), ignore_errors=True)
                    shutil.rmtree(local)
            elif existed:
                store = DeltaStorageHandler(path, options=self._storage_options)
                store.delete_dir("_delta_log")
                store.delete_dir("")
        except (DeltaError, OSError) as exc:
            raise storage_error(f"cannot drop Delta table {path}", exc) from exc
        return existed
