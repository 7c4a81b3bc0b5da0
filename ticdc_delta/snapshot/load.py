"""Load a Dumpling export into the Delta tables with Spark, record each table's snapshot TSO in the job state.

The driver only plans: it reads the export's ``metadata`` and schema files and lists the data files
(:func:`~ticdc_delta.snapshot.dumpling.read_export`). Every data file is read and parsed on an executor
(``mapInArrow``, one task per file), and the rows are written by delta-spark; no row passes through the
driver.

Per table, in this order:

1. **Checks** (before anything is written). The table's YAML mapping applies (``enabled``, ``key``,
   ``partition_by``, ``path``); a key override or ``partition_by`` column the table does not have is a
   :class:`~ticdc_delta.errors.ConfigError`. Loading is refused (:class:`~ticdc_delta.errors.
   SnapshotConflictError`) when the job state says the stream already applied a change of the table with
   a commit ts after the snapshot's TSO, or a newer snapshot of it is loaded — unless ``force``.
2. **Intent**: the job state records the snapshot TSO with status ``loading`` (and the column type
   parameters the stream's catalog needs: DECIMAL precision/scale, ENUM/SET members). While a table is
   ``loading`` the streaming job refuses to run (:func:`~ticdc_delta.core.snapshot_seam.seam_from_state`).
3. **Data**: one delta-spark overwrite of the table's location — one Delta commit, so the table is either
   as before or completely loaded, never half. The commit carries the app transaction
   (``<changefeed>/snapshot``, TSO) (Delta's ``txnAppId``/``txnVersion``): a re-run of the same snapshot
   finds it and skips the table (idempotent, also after a crash between tables).
4. **Done**: the state marks every loaded table ``done``; the stream from then on drops each table's
   changes with commit ts ≤ its TSO (:mod:`ticdc_delta.core.snapshot_seam`).

**Tables that share a location** (the shards a wildcard ``tables[]`` entry with a ``path`` merges, or
entries naming one path) are one Delta table: overwritten one by one, each would erase the rows of the one
before. They are loaded together: their rows in one overwrite commit, each table's columns placed by name
(a column one table lacks is NULL in its rows; one column's types made one, ``int`` and ``bigint``
``bigint``, or a ConfigError when no type holds both), the commit's app transaction named after exactly
these tables (``<changefeed>/snapshot/<digest>``), so a re-run skips them only when this very set of
tables is in, never a table a commit of other tables at the same TSO left out. Loading a location whose
Delta table, the job state says, also holds rows of tables the snapshot does not have (a ``--table``
selection naming some of the shards) is refused, ``force`` or not: they would be lost.

A failure anywhere (a truncated file, a crash) leaves the tables committed so far complete and the rest as
they were; the state still says ``loading``, so the stream waits until the command is re-run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import pyarrow as pa

from ..config import JobConfig
from ..delta.applier import TableCatalog
from ..delta.arrow_types import common_type
from ..delta.state_store import RESET_BATCH_ID, PipelineState, StateStore
from ..errors import ConfigError, SnapshotConflictError, SnapshotFormatError, TerminalError
from ..locations import child_location, tidb_lower
from .dumpling import CsvDialect, DataFile, SnapshotColumn, TableExport, data_file_batches, read_export

__all__ = [
    "SNAPSHOT_APP_SUFFIX",
    "SNAPSHOT_FAULT_STAGE",
    "TableLoad",
    "SnapshotSummary",
    "load_dumpling_snapshot",
    "load_snapshot",
    "DumplingSource",
    "spark_ddl_schema",
    "snapshot_key",
]

log = logging.getLogger(__name__)
progress_log = logging.getLogger("ticdc_delta.progress")

SNAPSHOT_APP_SUFFIX = "/snapshot"
"""The snapshot commit's Delta app id is the changefeed plus this suffix (plus ``/<digest>`` of the tables for
a location several tables share); its version is the TSO."""

SNAPSHOT_FAULT_STAGE = "snapshot_after_table"
"""Fault injection for tests: ``TICDC_DELTA_FAULT=snapshot_after_table@N`` fails after the N-th table
(1-based) of a load was committed."""

_FILES_SCHEMA = "path string, size long, format string, compression string"

_OBSERVATION_WAIT_S = 60.0
"""How long a shared location's load waits, once its commit is written, for its tables' row counts."""


def snapshot_key(schema: str, table: str) -> str:
    """The key of a table in the state's ``snapshots`` (and ``catalog``) map."""
    return f"{schema}\x00{table}"


@dataclass
class TableLoad:
    """What the load did to one table."""

    schema: str
    table: str
    path: str
    rows: int = 0
    bytes: int = 0
    files: int = 0
    skipped: str | None = None
    seconds: float = 0.0


@dataclass
class SnapshotSummary:
    """The whole load: the TSO, per-table results and totals."""

    source: str
    tso: int
    tables: list[TableLoad] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables)

    @property
    def bytes(self) -> int:
        return sum(t.bytes for t in self.tables)

    def describe(self) -> str:
        loaded = [t for t in self.tables if t.skipped is None]
        skipped = [t for t in self.tables if t.skipped is not None]
        rate = self.rows / self.seconds if self.seconds > 0 else 0.0
        text = (f"snapshot {self.source} at TSO {self.tso}: {len(loaded)} table(s) loaded, {self.rows} rows, "
                f"{self.bytes} bytes in {self.seconds:.1f}s ({rate:.0f} rows/s)")
        for t in skipped:
            text += f"\n  {t.schema}.{t.table}: skipped ({t.skipped})"
        return text


def _spark_type(t: pa.DataType) -> str:
    if pa.types.is_int64(t):
        return "bigint"
    if pa.types.is_int32(t):
        return "int"
    if pa.types.is_float64(t):
        return "double"
    if pa.types.is_float32(t):
        return "float"
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_date32(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz else "timestamp_ntz"
    if pa.types.is_string(t):
        return "string"
    if pa.types.is_binary(t):
        return "binary"
    if pa.types.is_list(t):
        return f"array<{_spark_type(t.value_type)}>"
    raise TerminalError(f"no Spark type for Arrow type {t}")


def spark_ddl_schema(schema: pa.Schema) -> str:
    """A Spark DDL schema string (```a` bigint, ...``) for an Arrow schema of Delta column types."""
    return ", ".join(f"`{f.name.replace('`', '``')}` {_spark_type(f.type)}" for f in schema)


def make_load_fn(
    columns: Sequence[SnapshotColumn], dialect: CsvDialect, tz: str, extra: Sequence[tuple[pa.Field, Any]]
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: file rows (path, size, format, compression) in, table rows out."""
    columns, extra = list(columns), list(extra)

    def load(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for row in batch.to_pylist():
                f = DataFile(row["path"], row["size"], row["format"], row["compression"])
                yield from data_file_batches(f, columns, dialect=dialect, tz=tz, extra=extra)

    return load


def _fault(table_index: int) -> None:
    spec = os.environ.get("TICDC_DELTA_FAULT", "")
    name, _, at = spec.partition(":")[0].partition("@")
    if name == SNAPSHOT_FAULT_STAGE and at.isdigit() and int(at) == table_index:
        raise RuntimeError(f"injected fault after table {table_index} of the snapshot load")


_WORKER_ERROR = re.compile(r"SnapshotFormatError: (.*)")


def _typed(exc: Exception) -> Exception:
    """A Spark job failure caused by a SnapshotFormatError on an executor, as that error again."""
    text = str(exc)
    m = _WORKER_ERROR.search(text)
    if m is not None:
        return SnapshotFormatError(m.group(1).strip())
    return exc


def _delta_txn_version(path: str, app_id: str, storage_options: Mapping[str, str] | None) -> int | None:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(path, storage_options=dict(storage_options) if storage_options else None).transaction_version(app_id)
    except TableNotFoundError:
        return None


def _delta_table_exists(path: str, storage_options: Mapping[str, str] | None) -> bool:
    from deltalake import DeltaTable

    return bool(DeltaTable.is_deltatable(path, dict(storage_options) if storage_options else None))


def _committed_rows(path: str, storage_options: Mapping[str, str] | None) -> int:
    from deltalake import DeltaTable

    history = DeltaTable(path, storage_options=dict(storage_options) if storage_options else None).history(1)
    metrics = history[0].get("operationMetrics") or {} if history else {}
    try:
        return int(metrics.get("numOutputRows", 0))
    except (TypeError, ValueError):
        return 0


def _check_columns(cfg: JobConfig, t: TableExport, what: str, names: Sequence[str]) -> None:
    have = {c.name.lower() for c in t.create.columns}
    missing = [n for n in names if n.lower() not in have]
    if missing:
        raise ConfigError(
            f"tables[{t.schema}.{t.table}].{what}: columns {missing} are not in the snapshot's schema file "
            f"{t.schema_file} (columns: {[c.name for c in t.create.columns]})"
        )


class DumplingSource:
    """A Dumpling export as a snapshot source: its files are parsed on the executors."""

    def __init__(self, location: str, dialect: CsvDialect = CsvDialect(), timestamp_zone: str = "UTC") -> None:
        export = read_export(location)
        self.location, self.tso, self.tables = location, export.tso, export.tables
        self.dialect, self.timestamp_zone = dialect, timestamp_zone

    def rows_frame(self, spark: Any, t: TableExport, columns: Sequence[SnapshotColumn],
                   extra: Sequence[tuple[pa.Field, Any]], spark_schema: str) -> Any:
        files = [(f.path, f.size, f.format, f.compression) for f in t.files]
        rdd = spark.sparkContext.parallelize(files, max(1, len(files)))
        files_df = spark.createDataFrame(rdd, _FILES_SCHEMA)
        return files_df.mapInArrow(make_load_fn(columns, self.dialect, self.timestamp_zone, extra), spark_schema)


def load_dumpling_snapshot(
    cfg: JobConfig,
    location: str,
    *,
    spark: Any,
    force: bool = False,
    dialect: CsvDialect = CsvDialect(),
    timestamp_zone: str = "UTC",
) -> SnapshotSummary:
    """Load the Dumpling export at ``location`` (see :func:`load_snapshot`).

    Raises:
        as :func:`load_snapshot`; SnapshotFormatError also for a missing ``metadata`` or a schema file that
        does not parse, before anything is written.
    """
    return load_snapshot(cfg, DumplingSource(location, dialect, timestamp_zone), spark=spark, force=force)


def _shared_app_id(app_id: str, members: Sequence[tuple[str, str]]) -> str:
    """The app id of the one commit that loads several tables into a shared location: the snapshot app id
    and a digest of the tables, so that a commit of other tables at the same TSO (a run before the
    mapping gained a shard, or with another ``--table`` selection) is never taken for this one."""
    names = json.dumps(sorted([schema, table] for schema, table in members))
    return f"{app_id}/{hashlib.sha256(names.encode()).hexdigest()[:16]}"


def _shared_fields(path: str, members: Sequence[tuple[str, Sequence[SnapshotColumn]]]) -> list[pa.Field]:
    """The columns of the one Delta table at ``path`` that several tables land in: every table's columns,
    matched by name as TiDB compares names (case-insensitively), in the order they first appear, each of the
    narrowest type holding the values of every table that has it
    (:func:`~ticdc_delta.delta.arrow_types.common_type`: ``int`` and ``bigint`` make ``bigint``). A table
    without a column gets NULLs in it, as a stream row of that table gets.

    Raises:
        ConfigError: a column no one type holds for every table (text in one table, numbers in another).
    """
    fields: dict[str, pa.Field] = {}
    seen: dict[str, list[str]] = {}
    for name, columns in members:
        for c in columns:
            f, key = c.field(), tidb_lower(c.name)
            have = fields.get(key)
            if have is None:
                fields[key], seen[key] = f.with_nullable(True), [name]
                continue
            wider = common_type(have.type, f.type)
            if wider is None:
                raise ConfigError(
                    f"tables[].path {path}: tables {', '.join(seen[key])} and {name} land in this one Delta table, "
                    f"but column {c.name!r} is {have.type} in {', '.join(seen[key])} and {f.type} in {name}, and "
                    "no column type holds both: make the column's type agree upstream, or give the tables their "
                    "own tables[].path"
                )
            fields[key] = have.with_type(wider)
            seen[key].append(name)
    return list(fields.values())


def _recorded_elsewhere(path: str, members: Sequence[tuple[str, str]], snapshots: Mapping[str, Any],
                        applied: Mapping[str, Any]) -> list[str]:
    """The tables other than ``members`` whose rows the job state places at ``path``: loaded there by an
    earlier snapshot, or written there by the stream (its recorded ``location``)."""
    keys = {snapshot_key(schema, table) for schema, table in members}
    names = {f"{schema}.{table}" for schema, table in members}
    others = {f"{e.get('schema')}.{e.get('table')}" for k, e in snapshots.items()
              if isinstance(e, dict) and e.get("path") == path and k not in keys}
    others |= {name for name, e in applied.items()
               if isinstance(e, dict) and e.get("location") == path and name not in names}
    return sorted(others)


def _observed_rows(observation: Any, deadline: float) -> int | None:
    """The row count a Spark ``Observation`` took while its frame was written, ``None`` when it has not
    arrived by ``deadline`` (``time.monotonic()``): Spark hands it over on its listener bus, which may drop
    events under load, and a wait without a bound could hang a load whose rows are committed."""
    got: dict[str, Any] = {}
    waiter = threading.Thread(target=lambda: got.update(observation.get), daemon=True)
    waiter.start()
    waiter.join(max(0.0, deadline - time.monotonic()))
    rows = got.get("rows")
    return None if rows is None else int(rows)


def load_snapshot(cfg: JobConfig, source: Any, *, spark: Any, force: bool = False) -> SnapshotSummary:
    """Load a snapshot into the job's Delta tables (see the module docstring).

    Args:
        cfg: the job configuration (table mapping, sink, checkpoint).
        source: where the rows come from: ``location``, ``tso``, ``tables`` (each with ``schema``, ``table``,
            ``create``, ``schema_file``, ``columns``, ``bytes``, ``files``) and ``rows_frame(spark, table,
            columns, extra, spark_schema)`` (:class:`DumplingSource`, :class:`~.jdbc.JdbcSource`).
        spark: the SparkSession (Delta Lake on it).
        force: load even into a table the stream advanced past, or over a newer snapshot.

    Raises:
        SnapshotFormatError: a missing, truncated or malformed file (named); nothing of its table is
            committed.
        SnapshotConflictError: a table the stream already advanced past, or with a newer snapshot; a
            location that holds rows of tables this snapshot does not have (also with ``force``).
        ConfigError: a key override or ``partition_by`` column the table does not have; tables that share
            a location with a column no one type holds, or with different ``partition_by``.
    """
    started = time.monotonic()
    location, tso = source.location, source.tso
    summary = SnapshotSummary(location, tso)
    storage = cfg.sink.storage_options or None
    app_id = cfg.changefeed + SNAPSHOT_APP_SUFFIX

    store = StateStore(child_location(cfg.checkpoint, "state"), cfg.changefeed, storage_options=storage)
    saved = store.load()
    state = saved or PipelineState(RESET_BATCH_ID)
    meta = dict(state.meta)
    if saved is None:
        # the first state of this changefeed: like `reset`, a fresh epoch for the stream's Delta app id, so
        # transactions an earlier life of the changefeed left in the tables cannot make batch 0 look done
        meta["epoch"] = uuid.uuid4().hex[:12]
    snapshots: dict[str, Any] = dict(meta.get("snapshots", {}))
    earlier = dict(snapshots)  # as the state had them before this load (step 2 replaces the entries)
    applied = meta.get("tables", {})

    # 1. which tables, and may they be loaded
    plan: list[tuple[TableExport, str, str, str]] = []
    for t in source.tables:
        schema, table = cfg.fold_name(t.schema), cfg.fold_name(t.table)
        mapping = cfg.table_mapping_for(t.schema, t.table)
        if mapping is not None and not mapping.enabled:
            summary.tables.append(TableLoad(schema, table, "", skipped="disabled in the table mapping"))
            continue
        if mapping is not None and mapping.key:
            _check_columns(cfg, t, "key", mapping.key)
        if mapping is not None and mapping.partition_by:
            _check_columns(cfg, t, "partition_by", mapping.partition_by)
        name = f"{schema}.{table}"
        stream_ts = int(applied.get(name, {}).get("commit_ts", 0) or 0)
        previous = snapshots.get(snapshot_key(schema, table)) or {}
        if not force and stream_ts > tso:
            raise SnapshotConflictError(
                f"table {name}: the stream already applied changes up to commit ts {stream_ts}, after this "
                f"snapshot's TSO {tso} ({location}): loading it would move the table back in time. Use a newer "
                "snapshot, or --force to replace the table anyway (then reset the changefeed to the snapshot's TSO)"
            )
        if not force and int(previous.get("tso", 0)) > tso:
            raise SnapshotConflictError(
                f"table {name}: a newer snapshot (TSO {previous['tso']}, {previous.get('source')}) is already "
                f"recorded, this one is at TSO {tso}; use --force to load the older one"
            )
        path = cfg.table_path(t.schema, t.table)
        loaded = _delta_txn_version(path, app_id, storage)
        if not force and loaded is not None and loaded > tso:
            raise SnapshotConflictError(
                f"table {name}: its Delta table {path} holds a newer snapshot (TSO {loaded}) than this one "
                f"(TSO {tso}, {location}); use --force to load the older one"
            )
        plan.append((t, schema, table, path))

    # the tables that land in one location (a wildcard entry's shards, entries naming one path) are loaded
    # into it together, in one overwrite commit: loaded one by one, each overwrite would erase the others
    by_path: dict[str, list[tuple[TableExport, str, str, str]]] = {}
    for item in plan:
        by_path.setdefault(item[3], []).append(item)
    shared: dict[str, tuple[list[pa.Field], str]] = {}
    for path, members in by_path.items():
        names = [(schema, table) for _, schema, table, _ in members]
        others = _recorded_elsewhere(path, names, earlier, applied)
        # (no Delta table there, no rows to lose: the way to start a location over is to move it away)
        if others and _delta_table_exists(path, storage):
            loading = ", ".join(f"{s}.{t}" for s, t in names)
            raise SnapshotConflictError(
                f"{path}: this snapshot ({location}) has {loading} for this Delta table, but the job state says "
                f"it also holds rows of {', '.join(others)}, which the snapshot does not have: loading would "
                "overwrite the table and lose their rows. Load all the tables that land there in one snapshot "
                "(export them too, or name each with --table), or move the Delta table away to start it over"
            )
        if len(members) == 1:
            continue
        labels = [f"{t.schema}.{t.table}" for t, _, _, _ in members]
        fields = _shared_fields(path, [(label, t.columns) for label, (t, _, _, _) in zip(labels, members)])
        parts = {label: [p.lower() for p in (m.partition_by if m is not None else [])]
                 for label, m in ((label, cfg.table_mapping_for(t.schema, t.table))
                                  for label, (t, _, _, _) in zip(labels, members))}
        if len({tuple(p) for p in parts.values()}) > 1:
            raise ConfigError(
                f"tables[].path {path}: tables {', '.join(labels)} land in this one Delta table but their "
                f"tables[] entries partition it differently ({parts}): give the entries the same partition_by"
            )
        shared_id = _shared_app_id(app_id, names)
        loaded = _delta_txn_version(path, shared_id, storage)
        if not force and loaded is not None and loaded > tso:
            raise SnapshotConflictError(
                f"tables {', '.join(labels)}: their Delta table {path} holds a newer snapshot of them (TSO {loaded}) "
                f"than this one (TSO {tso}, {location}); use --force to load the older one"
            )
        shared[path] = (fields, shared_id)

    # 2. intent: TSOs (status loading) and type parameters, before any table is written
    catalog = TableCatalog(meta.get("catalog"), fold_names=not cfg.case_sensitive)
    for t, schema, table, path in plan:
        catalog.drop_table(schema, table)
        for col in t.columns:
            catalog.set_params(schema, table, col.name, col.params)
        snapshots[snapshot_key(schema, table)] = {"schema": schema, "table": table, "tso": tso, "status": "loading",
                                                  "source": location, "path": path}
    meta["snapshots"], meta["catalog"] = snapshots, catalog.to_json()
    store.reset(PipelineState(state.batch_id, state.watermarks, state.held, meta))

    # 3. data, one overwrite commit per location
    meta_cols = cfg.sink.metadata_columns
    extra: list[tuple[pa.Field, Any]] = []
    if meta_cols:
        extra = [(pa.field(meta_cols.commit_ts, pa.int64()), tso), (pa.field(meta_cols.op, pa.string()), "insert")]
    i = 0
    for path, members in by_path.items():
        t0 = time.monotonic()
        mapping = cfg.table_mapping_for(members[0][0].schema, members[0][0].table)
        partition_by = mapping.partition_by if mapping is not None else []
        if path in shared:
            fields, shared_id = shared[path]
            results = _load_shared(spark, source, members, fields + [f for f, _ in extra], extra, path=path,
                                   app_id=shared_id, tso=tso, force=force, partition_by=partition_by,
                                   storage=storage, earlier=earlier)
        else:
            results = [_load_one(spark, source, members[0], extra, path=path, app_id=app_id, tso=tso, force=force,
                                 partition_by=partition_by, storage=storage)]
        seconds = time.monotonic() - t0
        for result in results:
            i += 1
            result.seconds = seconds
            summary.tables.append(result)
            elapsed = time.monotonic() - started
            done_rows = summary.rows
            progress_log.info(json.dumps({
                "snapshot": location, "tso": tso, "table": f"{result.schema}.{result.table}", "tables_done": i,
                "tables": len(plan), "rows": result.rows, "bytes": result.bytes, "skipped": result.skipped,
                "total_rows": done_rows, "total_bytes": summary.bytes, "seconds": round(elapsed, 3),
                "rows_per_s": round(done_rows / elapsed, 1) if elapsed > 0 else None,
                "mb_per_s": round(summary.bytes / 1e6 / elapsed, 3) if elapsed > 0 else None,
            }))
            _fault(i)

    # 4. done
    saved = store.load()
    state = saved or PipelineState(RESET_BATCH_ID)
    meta = dict(state.meta)
    snapshots = dict(meta.get("snapshots", {}))
    for r in summary.tables:
        entry = snapshots.get(snapshot_key(r.schema, r.table))
        if entry is not None and r.path:
            snapshots[snapshot_key(r.schema, r.table)] = {**entry, "status": "done", "rows": r.rows}
    meta["snapshots"] = snapshots
    store.reset(PipelineState(state.batch_id, state.watermarks, state.held, meta))
    summary.seconds = time.monotonic() - started
    return summary


def _save(writer: Any, path: str, partition_by: Sequence[str], storage: Mapping[str, str] | None) -> None:
    """Commit ``writer`` (a Delta overwrite) at ``path``; a worker's typed error surfaces as itself."""
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    for key, value in (storage or {}).items():
        writer = writer.option(key, value)
    try:
        writer.save(path)
    except Exception as exc:  # a Spark job failure: surface a worker's typed error as itself
        typed = _typed(exc)
        if typed is exc:
            raise
        raise typed from None


def _load_one(spark: Any, source: Any, item: tuple[TableExport, str, str, str], extra: Sequence[tuple[pa.Field, Any]],
              *, path: str, app_id: str, tso: int, force: bool, partition_by: Sequence[str],
              storage: Mapping[str, str] | None) -> TableLoad:
    """One table alone in its location: one overwrite commit, skipped when the location's snapshot app
    transaction says it holds this snapshot already."""
    t, schema, table, _ = item
    result = TableLoad(schema, table, path, bytes=t.bytes, files=len(t.files))
    have = _delta_txn_version(path, app_id, storage)
    if have is not None and have == tso and not force:
        result.skipped = "already loaded from this snapshot"
        result.rows = _committed_rows(path, storage)
        return result
    arrow_schema = pa.schema([c.field() for c in t.columns] + [f for f, _ in extra])
    rows_df = source.rows_frame(spark, t, t.columns, extra, spark_ddl_schema(arrow_schema))
    writer = rows_df.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
    if have is None or have < tso:  # (Delta skips a write whose version is not above the recorded one)
        writer = writer.option("txnAppId", app_id).option("txnVersion", tso)
    _save(writer, path, partition_by, storage)
    result.rows = _committed_rows(path, storage)
    return result


def _load_shared(spark: Any, source: Any, members: Sequence[tuple[TableExport, str, str, str]],
                 fields: Sequence[pa.Field], extra: Sequence[tuple[pa.Field, Any]], *, path: str, app_id: str,
                 tso: int, force: bool, partition_by: Sequence[str], storage: Mapping[str, str] | None,
                 earlier: Mapping[str, Any]) -> list[TableLoad]:
    """Several tables that land in one location: their rows, each table's columns placed by name in the
    shared ``fields``, written in one overwrite commit carrying the app transaction (``app_id``, TSO) of
    exactly these tables; skipped, all of them, when the location holds that transaction already.

    Each table's row count is counted while the commit is written (a Spark ``Observation`` per table);
    one that does not arrive counts 0, with a warning (the rows are in the table either way)."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    results = [TableLoad(schema, table, path, bytes=t.bytes, files=len(t.files)) for t, schema, table, _ in members]
    have = _delta_txn_version(path, app_id, storage)
    if have is not None and have == tso and not force:
        for result in results:
            entry = earlier.get(snapshot_key(result.schema, result.table)) or {}
            result.skipped = "already loaded from this snapshot"
            result.rows = int(entry.get("rows") or 0) if entry.get("tso") == tso else 0
        return results
    frames, observations = [], []
    for t, _, _, _ in members:
        arrow_schema = pa.schema([c.field() for c in t.columns] + [f for f, _ in extra])
        observation = Observation(f"ticdc_delta_snapshot_rows_{uuid.uuid4().hex}")
        rows_df = source.rows_frame(spark, t, t.columns, extra, spark_ddl_schema(arrow_schema))
        rows_df = rows_df.observe(observation, F.count(F.lit(1)).alias("rows"))
        own = {tidb_lower(f.name): f.name for f in arrow_schema}
        frames.append(rows_df.select(*[
            (F.col("`" + own[key].replace("`", "``") + "`") if key in own else F.lit(None))
            .cast(_spark_type(f.type)).alias(f.name)
            for f, key in ((f, tidb_lower(f.name)) for f in fields)
        ]))
        observations.append(observation)
    union = frames[0]
    for frame in frames[1:]:
        union = union.union(frame)  # (the columns are aligned by the select above: by position is by name)
    writer = union.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
    if have is None or have < tso:  # (Delta skips a write whose version is not above the recorded one)
        writer = writer.option("txnAppId", app_id).option("txnVersion", tso)
    _save(writer, path, partition_by, storage)
    missing, deadline = [], time.monotonic() + _OBSERVATION_WAIT_S
    for result, observation in zip(results, observations):
        rows = _observed_rows(observation, deadline)
        if rows is None:
            missing.append(f"{result.schema}.{result.table}")
        result.rows = rows or 0
    if missing:
        log.warning("%s: the row counts of %s did not arrive from Spark; counted 0 (the commit wrote %d rows "
                    "for all its tables)", path, ", ".join(missing), _committed_rows(path, storage))
    return results
