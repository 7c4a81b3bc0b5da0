"""The ``spark`` engine's table creation and DDL, with Delta Lake's own operations on the Spark session.

The ``spark`` engine writes rows with Delta Lake's MERGE; :class:`SparkDeltaSink` makes its schema commits
the same way, behind the calls the applier (:meth:`~ticdc_delta.delta.applier.DeltaApplier.prepare_table`)
and the DDL replay (:mod:`ticdc_delta.delta.ddl_replay`) make of a sink:

==========================  ===========================================================================
call                        Delta Lake
==========================  ===========================================================================
``ensure_table``            ``DeltaTable.createIfNotExists`` with column mapping ``name`` (reader 2,
                            writer 5; unless ``sink.column_mapping: false``): columns can later be
                            dropped and renamed in place
``add_columns``             ``ALTER TABLE … ADD COLUMNS`` (metadata only)
``drop_column``             ``ALTER TABLE … DROP COLUMN`` (metadata only; the data stays in the files)
``rename_column``           ``ALTER TABLE … RENAME COLUMN`` (metadata only)
``change_column_type(s)``   with ``sink.type_widening``, where Delta widens in place (decimal growth,
                            integer → wider integer / decimal, float → double, date → timestamp_ntz):
                            ``ALTER TABLE … ALTER COLUMN … TYPE`` (table feature ``typeWidening``);
                            otherwise a rewrite with a lossless cast (also the applier's widening of a
                            type that grew without a DDL)
``rewrite``                 one overwrite commit (``overwriteSchema``), the transform run on the
                            executors (``mapInArrow``): ADD COLUMN with a DEFAULT for existing rows
``overwrite_empty``         TRUNCATE: an overwrite with no rows
==========================  ===========================================================================

A table without column mapping (one the ``delta-rs`` engine created, or any with ``sink.column_mapping:
false``) gets a rewrite for DROP / RENAME COLUMN, as on that engine. delta-rs 1.6 reads, appends to and
merges into column-mapping tables, but refuses to OPTIMIZE them ("Column mapping is not supported for
write operation 'OPTIMIZE' yet"): that is what the option is for. Reads — the schema, the app
transactions, the table properties — and the file-level operations (DROP TABLE, RENAME TABLE, the tables
of a schema) are the ``delta-rs`` sink's: delta-rs reads the log of column-mapping and type-widened tables
(it cannot scan a type-widened table's rows, which is why ``sink.type_widening`` is off by default). RENAME
TABLE on an object store copies the table with Spark (:meth:`SparkDeltaSink.copy_table`), keeping its
column mapping, type widening and properties.

A ``timestamp_ntz`` column joining an existing table first adds the ``timestampNtz`` table feature (one
protocol commit before the column's own), as Delta enables it by itself only at creation.

**Idempotence.** Rewrites and TRUNCATE carry the batch's app transaction (``txnAppId``/``txnVersion``
write options): Delta skips a committed one. An ``ALTER TABLE`` commit records no app transaction (Delta
takes ``txnAppId``/``txnVersion`` for writes and DML only; the session confs
``spark.databricks.delta.write.txnAppId``/``txnVersion`` are ignored by ALTER too, Delta 4.0), so DROP,
RENAME and an in-place type change are followed by an append of no rows carrying the transaction: one
commit holding only the ``txn`` action. Each change is checked against the table before it acts: it is done
when the table has committed the change's own transaction version or a later one of the changefeed (a later
step of the batch, which ran after it, was committed), or when the table no longer needs it (the column to
drop is gone, the new name is there, the type is the new one); the second check covers a crash between an
``ALTER`` and its transaction. ``add_columns`` records no transaction of its own (its callers may give it
the one of the step it prepares), but is skipped when a later step is committed: a re-run batch that added
and then dropped ``c`` does not add ``c`` again.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

import pyarrow as pa
from deltalake import DeltaTable as RsTable, Field as DeltaField

from ..delta.arrow_types import TextSource
from ..delta.sink import (
    DeltaRsSink,
    MergeStats,
    TableFacts,
    TableIdent,
    Txn,
    already_applied,
    cast_columns,
    check_new_fields,
    check_new_table,
    check_txn,
    table_arrow_schema,
)
from ..errors import SinkError, TicdcDeltaError

__all__ = ["SparkDeltaSink", "COLUMN_MAPPING_PROPERTIES", "TYPE_WIDENING_PROPERTY", "delta_widens_in_place",
           "set_tblproperties"]

log = logging.getLogger(__name__)

R = TypeVar("R")

COLUMN_MAPPING_PROPERTIES = {
    "delta.columnMapping.mode": "name",
    "delta.minReaderVersion": "2",
    "delta.minWriterVersion": "5",
}
"""Table properties of the tables the ``spark`` engine creates (Delta protocol: column mapping needs reader
version 2 and writer version 5)."""

TYPE_WIDENING_PROPERTY = "delta.enableTypeWidening"

_DERIVED_PROPERTIES = frozenset({
    "delta.columnMapping.maxColumnId",
    "delta.rowTracking.materializedRowIdColumnName",
    "delta.rowTracking.materializedRowCommitVersionColumnName",
})
"""Table properties Delta sets itself and refuses from a user (``DELTA_CANNOT_MODIFY_TABLE_PROPERTY``): not
carried over when a table is copied."""

_INT_DIGITS = {8: 3, 16: 5, 32: 10, 64: 20}
"""Decimal integer digits Delta's type widening asks for an integer type (``long`` → ``decimal(20, 0)``)."""


def delta_widens_in_place(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether Delta 4's type widening changes ``old`` to ``new`` without rewriting files (the changes the
    Delta Lake documentation lists, "Supported type changes")."""
    if pa.types.is_decimal(old) and pa.types.is_decimal(new):
        # decimal(p, s) → decimal(p + k1, s + k2) with k1 >= k2 >= 0
        return new.scale >= old.scale and new.precision - new.scale >= old.precision - old.scale
    if pa.types.is_integer(old) and pa.types.is_signed_integer(old):
        if pa.types.is_signed_integer(new):
            return new.bit_width > old.bit_width
        if pa.types.is_decimal(new):
            return new.precision - new.scale >= _INT_DIGITS[old.bit_width]
        if pa.types.is_float64(new):
            return old.bit_width <= 32
        return False
    if pa.types.is_float32(old):
        return pa.types.is_float64(new)
    if pa.types.is_date32(old):
        return pa.types.is_timestamp(new) and new.tz is None
    return False


def _sql_table(path: str) -> str:
    return "delta.`" + path.replace("`", "``") + "`"


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _refused(exc: Exception, properties: Mapping[str, str] | None, path: str) -> Exception:
    """``exc`` itself, or a :class:`SinkError` naming the table and Delta Lake's reason when it refused one of
    the configured table ``properties`` (an unknown name, a bad value)."""
    text = str(exc)
    named = [key for key in properties or () if key.lower() in text.lower()]
    if isinstance(exc, TicdcDeltaError) or not named:
        return exc
    return SinkError(f"{path}: Delta Lake refused the table properties {', '.join(named)} (sink.table_properties, "
                     f"tables[].table_properties): {text.strip().splitlines()[0][:300]}")


def _sql_string(value: str) -> str:
    """``value`` as a Spark SQL string literal (backslash escapes)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def set_tblproperties(properties: Mapping[str, str]) -> str:
    """The ``ALTER TABLE`` clause that sets ``properties`` (names as config validates them: letters, digits,
    ``.``, ``_``, ``-``; values quoted)."""
    return "SET TBLPROPERTIES (" + ", ".join(f"'{key}' = {_sql_string(value)}" for key, value in properties.items()) + ")"


def _find(schema: pa.Schema, name: str) -> str | None:
    low = name.lower()
    return next((f.name for f in schema if f.name.lower() == low), None)


def _stored_type(field: pa.Field) -> pa.DataType:
    """The Arrow type a column of ``field``'s type reads back as from a Delta table."""
    return pa.field(DeltaField.from_arrow(field.with_nullable(True)).to_arrow()).type


def _rewrite_fn(transform: Callable[[pa.Table], pa.Table], schema: pa.Schema
                ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """``transform`` per Arrow batch on the executors, its output cast to ``schema`` (the declared one)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            out = transform(pa.Table.from_batches([batch]))
            yield from out.select(schema.names).cast(schema).to_batches()

    return run


class SparkDeltaSink:
    """Schema commits with delta-spark on ``spark``, reads and file operations through ``base``.

    Not a whole :class:`~ticdc_delta.delta.sink.TableSink`: the ``spark`` engine makes the data commits
    (MERGE) itself, so :meth:`merge` and :meth:`append` refuse.

    Args:
        base: the job's delta-rs sink (table locations, reads, DROP / RENAME TABLE).
        spark: the Spark session (with Delta Lake's SQL extension and catalog).
        type_widening: ``sink.type_widening``: widen column types in place where Delta can (the table gets
            the ``typeWidening`` feature, which delta-rs 1.x cannot scan).
        column_mapping: ``sink.column_mapping``: create tables with column mapping ``name``.
        retry: runs one attempt again after a Delta conflict (the engine's ``sink.conflict_retries``).
        stats: :meth:`table_schema` keeps the table's row count and files' statistics it read with the schema
            for :meth:`table_facts` (the engine's MERGE key range, ``sink.merge_key_range_rows``).
    """

    def __init__(self, base: DeltaRsSink, spark: Any, *, type_widening: bool = False, column_mapping: bool = True,
                 retry: Callable[[str, Callable[[], Any]], Any] | None = None, stats: bool = False) -> None:
        self.base = base
        self.spark = spark
        self.type_widening = type_widening
        self.column_mapping = column_mapping
        self._retry = retry or (lambda what, attempt: attempt())
        self.stats = stats
        self._facts: dict[TableIdent, TableFacts | None] = {}  # what table_schema read, for table_facts

    # --- delegated: locations, reads, file operations ---------------------------------------------------

    def table_path(self, schema: str, table: str) -> str:
        """See :meth:`DeltaRsSink.table_path`.

        Raises:
            IdentifierError: a name no location can hold.
        """
        return self.base.table_path(schema, table)

    def table_schema(self, ident: TableIdent) -> pa.Schema | None:
        """See :meth:`DeltaRsSink.table_schema` (delta-rs reads the log of every table this sink writes).
        With ``stats``, the row count and files' statistics of the version read are kept for
        :meth:`table_facts`.

        Raises:
            SinkError: the table cannot be read.
        """
        facts = self.base.table_facts(ident, stats=self.stats)
        if self.stats:
            self._facts[ident] = facts
        return None if facts is None else facts.schema

    def table_facts(self, ident: TableIdent) -> TableFacts | None:
        """See :meth:`DeltaRsSink.table_facts` (with the statistics): of the version :meth:`table_schema`
        read last (taken once: the engine asks right after the schema work before a MERGE, without a second
        read of the log), else read now.

        Raises:
            SinkError: the table cannot be read.
        """
        if ident in self._facts:
            return self._facts.pop(ident)
        return self.base.table_facts(ident)

    def partition_columns(self, ident: TableIdent) -> tuple[str, ...]:
        """See :meth:`DeltaRsSink.partition_columns`."""
        return self.base.partition_columns(ident)

    def tables_in_schema(self, schema: str) -> list[TableIdent]:
        """See :meth:`DeltaRsSink.tables_in_schema`."""
        return self.base.tables_in_schema(schema)

    def drop(self, ident: TableIdent) -> bool:
        """See :meth:`DeltaRsSink.drop` (files removed, log first).

        Raises:
            SinkError: the files cannot be removed.
        """
        try:
            return self.base.drop(ident)
        finally:
            self._forget(self.table_path(*ident))

    def move(self, old: TableIdent, new: TableIdent) -> bool:
        """See :meth:`DeltaRsSink.move`: a directory rename on local storage; on an object store a copy by
        :meth:`copy_table` (on the executors), then the old table dropped.

        Raises:
            SinkError: the new location is taken, or the files cannot be moved.
        """
        try:
            return self.base.move(old, new, copy=self.copy_table)
        finally:
            self._forget(self.table_path(*old), self.table_path(*new))

    def _forget(self, *paths: str) -> None:
        """Drop the tables at ``paths`` from Delta Lake's log cache in this JVM: their files were removed
        or moved outside Delta, and the cache would keep the old snapshot (its state and plans) for up to
        an hour; a table made again at the same path would first be read against the old one (which Delta
        notices by the table id, logging both snapshots whole). Never fails the DDL: a failure is logged."""
        jvm = self.spark._jvm  # noqa: SLF001 - Delta Lake's DeltaLog has no Python API
        for path in paths:
            try:
                jvm.org.apache.spark.sql.delta.DeltaLog.invalidateCache(
                    self.spark._jsparkSession, jvm.org.apache.hadoop.fs.Path(path))  # noqa: SLF001
            except Exception as exc:  # noqa: BLE001 - the cache only costs memory and a warning
                log.warning("could not drop %s from Delta Lake's log cache: %s", path, exc)

    def copy_table(self, src: str, dst: str, app_id: str) -> None:
        """The :data:`~ticdc_delta.delta.sink.TableCopy` of the ``spark`` engine: the rows of ``src`` read and
        written to ``dst`` by Spark's executors (nothing per row on the driver) in one commit that records
        the app transaction ``(app_id, 0)``, with ``src``'s partition columns and ``delta.*`` table
        properties (column mapping, type widening, deletion vectors, retention settings; the table features
        its columns need, e.g. ``timestampNtz``, come with them). A type-widened table, which delta-rs cannot
        scan, is copied too. Not carried: properties outside ``delta.*`` (a writer option is a table
        property only under that prefix) and the table's history. Stray files at ``dst`` (no Delta log: a
        copy that died before its commit) are left behind unreferenced.

        Raises:
            SinkError: ``src`` cannot be read or ``dst`` cannot be written.
        """
        try:
            detail = self.spark.sql(f"DESCRIBE DETAIL {_sql_table(src)}").first()
            writer = (self.spark.read.format("delta").load(src).write.format("delta").mode("overwrite")
                      .option("txnAppId", app_id).option("txnVersion", "0"))
            for key, value in (detail.properties or {}).items():
                if key not in _DERIVED_PROPERTIES:
                    writer = writer.option(key, value)
            if detail.partitionColumns:
                writer = writer.partitionBy(*detail.partitionColumns)
            writer.save(dst)
        except Exception as exc:  # noqa: BLE001 - Spark's (Py4J, analysis) errors: the copy failed
            raise SinkError(f"cannot copy Delta table {src} to {dst}: {str(exc).splitlines()[0]}") from exc

    def read(self, ident: TableIdent) -> pa.Table:
        """See :meth:`DeltaRsSink.read`.

        Raises:
            SinkError: the table is missing or cannot be read.
        """
        return self.base.read(ident)

    def merge(self, ident: TableIdent, changes: pa.Table, key_columns: Sequence[str], txn: Txn) -> MergeStats:
        """Not here: the ``spark`` engine merges with ``DeltaTable.merge`` itself.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError("SparkDeltaSink makes schema commits only; the spark engine runs the MERGE")

    def append(self, ident: TableIdent, rows: pa.Table, txn: Txn) -> MergeStats:
        """Not here: the ``spark`` engine appends with DataFrame writes itself.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError("SparkDeltaSink makes schema commits only; the spark engine appends")

    # --- helpers ----------------------------------------------------------------------------------------

    def _require(self, ident: TableIdent) -> RsTable:
        dt = self.base.snapshot(ident)
        if dt is None:
            raise SinkError(f"no Delta table at {self.table_path(*ident)} (create it with ensure_table first)")
        return dt

    def _alter(self, path: str, clause: str) -> None:
        self.spark.sql(f"ALTER TABLE {_sql_table(path)} {clause}")

    def _record(self, path: str, txn: Txn) -> None:
        """Commit ``txn`` after an ``ALTER TABLE``, which records none: an append of no rows (Delta still
        commits, with just the ``txn`` action; it skips the append when ``txn`` is committed already)."""
        (self.spark.read.format("delta").load(path).limit(0).write.format("delta").mode("append")
         .option("txnAppId", txn.app_id).option("txnVersion", str(txn.version)).save(path))

    def _support_types(self, dt: RsTable, path: str, types: Iterable[pa.DataType]) -> None:
        """Add the ``timestampNtz`` table feature before a column of that type joins an existing table:
        Delta enables it by itself only when a table is created (``DELTA_FEATURES_REQUIRE_MANUAL_ENABLEMENT``)."""
        if any(pa.types.is_timestamp(t) and t.tz is None for t in types) and \
                "timestampNtz" not in (dt.protocol().writer_features or []):
            self._alter(path, set_tblproperties({"delta.feature.timestampNtz": "supported"}))

    def _unless_applied(self, what: str, ident: TableIdent, txn: Txn,
                        act: Callable[[RsTable, pa.Schema, str], bool]) -> bool:
        """Run ``act(snapshot, schema, path)`` unless the table has committed ``txn`` or a later version."""
        txn = check_txn(txn)
        path = self.table_path(*ident)

        def attempt() -> bool:
            dt = self._require(ident)
            if already_applied(dt, txn):
                return False
            return act(dt, table_arrow_schema(dt), path)

        return bool(self._retry(f"{what} {path}", attempt))

    # --- schema commits ---------------------------------------------------------------------------------

    def ensure_table(self, ident: TableIdent, arrow_schema: pa.Schema, partition_by: Sequence[str] | None,
                     txn: Txn, properties: Mapping[str, str] | None = None) -> bool:
        """Create the table (with column mapping ``name`` unless ``column_mapping`` is off, and the Delta
        table ``properties``) if it is missing; ``True`` when this call created it.

        Raises:
            TypeError/ValueError: not a schema, a partition column not in it, the reserved
                :data:`~ticdc_delta.delta.sink.OP_COLUMN`.
            SinkError: the table cannot be created.
            ConcurrentCommitError: other writers kept winning.
        """
        from delta.tables import DeltaTable
        from pyspark.sql.pandas.types import from_arrow_schema

        parts = check_new_table(arrow_schema, partition_by)
        check_txn(txn)
        path = self.table_path(*ident)
        if self.base.snapshot(ident) is not None:
            return False
        if self.base.clear_uncommitted_log(ident):
            # a creation killed before its first commit: Delta Lake's table builder fails on what it left
            log.warning("%s: removed the log of a table creation that never committed", path)
            self._forget(path)
        builder = (DeltaTable.createIfNotExists(self.spark).location(path)
                   .addColumns(from_arrow_schema(arrow_schema, prefer_timestamp_ntz=True)))
        if parts:
            builder = builder.partitionedBy(*parts)
        for key, value in {**(COLUMN_MAPPING_PROPERTIES if self.column_mapping else {}), **(properties or {})}.items():
            builder = builder.property(key, value)
        self._retry_properties(f"create {path}", path, properties, builder.execute)
        return True

    def table_properties(self, ident: TableIdent) -> dict[str, str] | None:
        """See :meth:`DeltaRsSink.table_properties` (delta-rs reads the log).

        Raises:
            SinkError: the table cannot be read.
        """
        return self.base.table_properties(ident)

    def set_table_properties(self, ident: TableIdent, properties: Mapping[str, str]) -> None:
        """``ALTER TABLE SET TBLPROPERTIES`` (one commit).

        Raises:
            SinkError: the table is missing or Delta Lake refused them.
            ConcurrentCommitError: other writers kept winning.
        """
        path = self.table_path(*ident)
        self._retry_properties(f"set properties of {path}", path, properties,
                               lambda: self._alter(path, set_tblproperties(properties)))

    def _retry_properties(self, what: str, path: str, properties: Mapping[str, str] | None,
                          attempt: Callable[[], Any]) -> None:
        """:meth:`_retry` of a commit that sets table ``properties``; Delta Lake's refusal of one of them
        becomes a :class:`SinkError` naming it (:func:`_refused`).

        Raises:
            SinkError: Delta Lake refused a property; ConcurrentCommitError: other writers kept winning.
        """
        try:
            self._retry(what, attempt)
        except Exception as exc:
            refused = _refused(exc, properties, path)
            if refused is exc:
                raise
            raise refused from exc

    def add_columns(self, ident: TableIdent, fields: Sequence[pa.Field], txn: Txn) -> list[str]:
        """``ALTER TABLE ADD COLUMNS`` for the columns of ``fields`` the table does not have yet (nullable);
        the names added. Nothing when the table has committed ``txn`` or a later version of its app id (a
        later step ran after this one). Names compare case-insensitively, as MySQL column names do.

        Raises:
            TypeError/ValueError: bad arguments.
            SinkError: the table is missing, or has a column of that name with another type or case.
            ConcurrentCommitError: other writers kept winning.
        """
        from pyspark.sql.pandas.types import from_arrow_type

        wanted = check_new_fields(fields)
        txn = check_txn(txn)
        path = self.table_path(*ident)

        def attempt() -> list[str]:
            dt = self._require(ident)
            if already_applied(dt, txn):
                return []
            existing = {f.name.lower(): f for f in table_arrow_schema(dt)}
            new: list[pa.Field] = []
            for f in wanted:
                have = existing.get(f.name.lower())
                if have is None:
                    new.append(f)
                    existing[f.name.lower()] = pa.field(f.name, _stored_type(f))
                elif have.name != f.name or pa.field(have).type != _stored_type(f):
                    raise SinkError(f"{path}: cannot add column {f.name!r} {_stored_type(f)}: the table has "
                                    f"{have.name!r} {pa.field(have).type}")
            if new:
                self._support_types(dt, path, (f.type for f in new))
                columns = ", ".join(
                    f"{_quote(f.name)} {from_arrow_type(f.type, prefer_timestamp_ntz=True).simpleString()}"
                    for f in new)
                self._alter(path, f"ADD COLUMNS ({columns})")
            return [f.name for f in new]

        return list(self._retry(f"add columns to {path}", attempt))

    def drop_column(self, ident: TableIdent, name: str, txn: Txn) -> bool:
        """DROP COLUMN ``name`` (the table's spelling): in place on a column-mapping table, else a rewrite.

        Raises:
            ValueError: bad ``txn``.
            SinkError: the table is missing.
            ConcurrentCommitError: other writers kept winning.
        """

        def act(dt: RsTable, schema: pa.Schema, path: str) -> bool:
            if name not in schema.names:
                return False
            # Delta drops no partition column in place (DELTA_UNSUPPORTED_DROP_PARTITION_COLUMN): the table is
            # rewritten without it, partitioned by the others, as the delta-rs engine does
            if not _column_mapping(dt) or name in dt.metadata().partition_columns:
                return self._rewrite_now(dt, path, lambda t: t.drop_columns([name]), txn)
            self._alter(path, f"DROP COLUMN {_quote(name)}")
            self._record(path, txn)
            return True

        return self._unless_applied("drop column of", ident, txn, act)

    def rename_column(self, ident: TableIdent, old: str, new: str, txn: Txn) -> bool:
        """RENAME COLUMN ``old`` (the table's spelling) to ``new``: in place on a column-mapping table, else a
        rewrite. Done already when ``old`` is gone or ``new`` is there.

        Raises:
            ValueError: bad ``txn``.
            SinkError: the table is missing.
            ConcurrentCommitError: other writers kept winning.
        """

        def act(dt: RsTable, schema: pa.Schema, path: str) -> bool:
            if old not in schema.names or old == new:
                return False
            there = _find(schema, new)
            if there is not None and there != old:
                return False  # renamed by an earlier attempt (and `old` added again since)
            if not _column_mapping(dt) or old.lower() == new.lower():
                # a change of case only: Delta's RENAME COLUMN compares names case-insensitively
                rename = lambda t: t.rename_columns([new if n == old else n for n in t.column_names])  # noqa: E731
                return self._rewrite_now(dt, path, rename, txn)
            self._alter(path, f"RENAME COLUMN {_quote(old)} TO {_quote(new)}")
            self._record(path, txn)
            return True

        return self._unless_applied("rename column of", ident, txn, act)

    def change_column_type(self, ident: TableIdent, name: str, new_type: pa.DataType, txn: Txn,
                           text: TextSource | None = None) -> bool:
        """Column ``name`` (the table's spelling) as the wider ``new_type``: with ``type_widening``, in place
        where Delta can widen it (:func:`delta_widens_in_place`), else a rewrite with a cast (to a string
        type with ``text``: values printed as TiDB prints them, :func:`~ticdc_delta.delta.sink.cast_column`).

        Raises:
            ValueError: bad ``txn``.
            SinkError: the table is missing, or a value cannot be cast.
            ConcurrentCommitError: other writers kept winning.
        """
        return self.change_column_types(ident, {name: new_type}, txn, {name: text} if text is not None else None)

    def change_column_types(self, ident: TableIdent, types: Mapping[str, pa.DataType], txn: Txn,
                            texts: Mapping[str, TextSource] | None = None) -> bool:
        """Each column of ``types`` (the table's spelling) as its wider type, as one step: with
        ``type_widening`` and when Delta can widen every one of them in place, ``ALTER COLUMN … TYPE`` each,
        else one rewrite with the casts. Columns gone or already of their type are left alone.

        Raises:
            ValueError: bad ``txn``.
            SinkError: the table is missing, or a value cannot be cast.
            ConcurrentCommitError: other writers kept winning.
        """
        from pyspark.sql.pandas.types import from_arrow_type

        wanted = dict(types)

        def act(dt: RsTable, schema: pa.Schema, path: str) -> bool:
            todo = {name: t for name, t in wanted.items()
                    if name in schema.names and schema.field(name).type != _stored_type(pa.field(name, t))}
            if not todo:
                return False
            if not (self.type_widening and all(delta_widens_in_place(schema.field(name).type, t)
                                               for name, t in todo.items())):
                return self._rewrite_now(dt, path, cast_columns(todo, texts), txn)
            self._support_types(dt, path, todo.values())
            if dt.metadata().configuration.get(TYPE_WIDENING_PROPERTY) != "true":
                self._alter(path, set_tblproperties({TYPE_WIDENING_PROPERTY: "true"}))
            for name, new_type in todo.items():
                spark_type = from_arrow_type(new_type, prefer_timestamp_ntz=True).simpleString()
                self._alter(path, f"ALTER COLUMN {_quote(name)} TYPE {spark_type}")
                log.info("widened %s of %s from %s to %s in place (Delta type widening)",
                         name, path, schema.field(name).type, new_type)
            self._record(path, txn)
            return True

        return self._unless_applied("change column types of", ident, txn, act)

    # --- data rewrites ----------------------------------------------------------------------------------

    def rewrite(self, ident: TableIdent, transform: Callable[[pa.Table], pa.Table], txn: Txn) -> bool:
        """Replace the table's rows and schema with ``transform(rows)`` in one overwrite commit carrying
        ``txn`` (skipped when committed); ``transform`` runs per Arrow batch on the executors, so it must be
        row-wise and picklable. Partitioning is kept. ``True`` when this call rewrote the table.

        Raises:
            ValueError: bad ``txn``.
            SinkError: the table is missing.
            ConcurrentCommitError: other writers kept winning.
        """
        txn = check_txn(txn)
        return self._unless_applied("rewrite", ident, txn,
                                    lambda dt, _schema, path: self._rewrite_now(dt, path, transform, txn))

    def _rewrite_now(self, dt: RsTable, path: str, transform: Callable[[pa.Table], pa.Table], txn: Txn) -> bool:
        from pyspark.sql.pandas.types import from_arrow_schema

        current = table_arrow_schema(dt)
        target = transform(current.empty_table()).schema
        spark_schema = from_arrow_schema(target, prefer_timestamp_ntz=True)
        self._support_types(dt, path, target.types)
        rows = self.spark.read.format("delta").load(path).mapInArrow(_rewrite_fn(transform, target), spark_schema)
        parts = list(dt.metadata().partition_columns)
        if len(target.names) == len(current.names):  # a rename or a cast: a partition column keeps its place
            parts = [target.names[current.names.index(c)] for c in parts]
        else:  # a column dropped: the table is partitioned by the others
            parts = [c for c in parts if c in target.names]
        writer = (rows.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
                  .option("txnAppId", txn.app_id).option("txnVersion", str(txn.version)))
        if parts:
            writer = writer.partitionBy(*parts)
        writer.save(path)
        return True

    def overwrite_empty(self, ident: TableIdent, txn: Txn) -> bool:
        """TRUNCATE: one overwrite commit with no rows (schema and partitioning kept) carrying ``txn``.

        Raises:
            ValueError: bad ``txn``.
            SinkError: the table is missing.
            ConcurrentCommitError: other writers kept winning.
        """
        txn = check_txn(txn)

        def truncate(_dt: RsTable, _schema: pa.Schema, path: str) -> bool:
            (self.spark.read.format("delta").load(path).limit(0).write.format("delta").mode("overwrite")
             .option("txnAppId", txn.app_id).option("txnVersion", str(txn.version)).save(path))
            return True

        return self._unless_applied("truncate", ident, txn, truncate)


def _column_mapping(dt: RsTable) -> bool:
    return dt.metadata().configuration.get("delta.columnMapping.mode", "none") in ("name", "id")
