"""The ``spark`` engine: the consumer rules on the executors, Delta Lake's own MERGE, small things on the driver.

Per micro-batch ``N`` (the :class:`~ticdc_delta.spark.batch_handler.BatchHandler` has already skipped a
batch the state holds and built the ts guard):

1. Decode on the executors (``mapInArrow``, as the ``delta-rs`` engine does) and keep the result cached
   on the executors; its rows travel as their op and values
   (:func:`~ticdc_delta.core.records.dump_row_values`), their coordinates and folded names as columns,
   and the signature of their column layout. To the driver come only: per (topic, partition,
   kind) the offset span and count, each table's layouts, the resolved marks and the DDL
   (:mod:`ticdc_delta.core.table_rules`, driver part).
2. Undecodable messages are appended to the dead-letter table from the executors (Delta append with
   ``txnAppId``/``txnVersion``: a re-run is skipped); so are, after step 3, the changes the value
   screen refuses and the rows whose commit ts the ts guard refuses (with their messages).
3. The rows of the batch and the rows held by batch ``N-1`` (the staging table) are grouped by table
   and run through :meth:`~ticdc_delta.core.table_rules.TableRules.apply_table` on the executors: replay
   drop, release up to the topic watermark, DDL segment, value screen, collapse per key. A table with
   ``sink.split_rows`` rows or more is grouped by table and key bucket (:mod:`ticdc_delta.core.key_buckets`)
   when the layouts the decoder reports allow it. Out come the final changes per (table, segment), the
   rows still held, and per table (bucket) a few counters. In a batch that applies no DDL, a table with
   ``sink.columnar_rows`` rows or more takes the columnar path instead (:mod:`~ticdc_delta.spark.columnar`):
   its rows are placed, screened and converted to typed columns one by one, and Spark collapses them per
   key — the same final changes, without Python in the collapse or the MERGE.
4. Per segment, every table's final changes are applied with **one** ``DeltaTable.merge`` (tables of a
   segment concurrently, one Spark session per thread); a table's rows are split only by the DDL that can
   change it (:func:`~ticdc_delta.delta.ddl_replay.ddl_tables`), so a batch with DDL on other tables still
   MERGEs it once; the batch's DDL steps run between segments on the
   driver (:mod:`ticdc_delta.delta.ddl_replay`, as in the ``delta-rs`` engine) with Delta Lake's own
   operations (:class:`~ticdc_delta.spark.delta_sink.SparkDeltaSink`: tables created with column mapping,
   ``ALTER TABLE`` for columns), which also create the tables and add the columns rows carry. Each MERGE
   carries the app transaction ``(changefeed, N·1024 + step)`` through the session confs
   ``spark.databricks.delta.write.txnAppId``/``txnVersion``: after a crash the re-run skips what was
   committed. The ``delta-rs`` engine uses the same scheme but cuts a table's rows at every DDL of the batch,
   so its steps differ: a batch one engine began is not re-run on the other
   (:meth:`~ticdc_delta.spark.batch_handler.BatchHandler._check_engine_switch`).
5. Rows still held are appended to the staging table (``<checkpoint>/staging``) tagged ``held_at = N`` and
   ``app`` = the app id (``changefeed~epoch``; transaction ``(app/staging, N)``), in a thread of its own
   while step 4's MERGEs run; once both have ended, the state blob records
   ``staging_batch = N`` and ``staging_app`` and is saved with transaction ``N``. Batch ``N+1`` reads those
   rows only, so a re-run of a crashed batch reads exactly what its first attempt read — also after a
   ``reset``, whose new epoch numbers its batches from 0 again while the old epoch's rows are still there.
   Rows no batch will read again are deleted now and then, and the table's unused files vacuumed.

Nothing on the driver grows with the number of rows in a batch.
"""

from __future__ import annotations

import functools
import logging
import operator
import pickle
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, Callable, Iterator, Mapping, Sequence

import pyarrow as pa

from ..core.batch_planner import WATERMARK, ResolvedMark
from ..core.key_buckets import Layout, Router, Routing, owns, splittable
from ..core.merge import DELETE, KeyResolver, MissingKeyError
from ..core.records import ChangeRecord, DDLRecord, dump_record, gc_paused, load_record, load_row
from ..core.snapshot_seam import SnapshotSeam
from ..core.table_rules import TableRules, plan_coordination
from ..delta.applier import ApplyResult, DeltaApplier
from ..delta.arrow_types import arrow_type_for, converter_for, integer_value
from ..delta.ddl_replay import ddl_tables
from ..delta.sink import (OP_COLUMN, OP_DELETE, OP_UPSERT, TableIdent, Txn, constraint_error, constraint_violated,
                          rows_outside)
from ..delta.state_store import PipelineState
from ..delta.value_check import ValueScreen
from ..errors import ConcurrentCommitError, DecodeError, TerminalError
from ..locations import child_location, fold_name
from .columnar import (
    CHANGE, COORDS, INPUT_COLUMNS as COLUMNAR_INPUT, ColumnarTable, collapse_changes, columnar_fn, columnar_schema,
    columnar_tables, final_counts, integer_keys, merge_source,
)
from .decode import LAYOUT, NAMED_SCHEMA, SPAN, few_tasks, make_decode_fn, spark_ddl
from .delta_sink import SparkDeltaSink, _quote, _sql_table, set_tblproperties
from .session import cache_in_session, own_session

__all__ = ["SparkEngine", "STAGING_SCHEMA", "STAGING_PROPERTIES", "MERGE_SOURCE_HOOK", "staging_path", "is_conflict"]

log = logging.getLogger(__name__)

STAGING_SCHEMA = ("held_at long, schema string, table string, commit_ts long, payload binary, app string, sig long, "
                  "hashes array<long>")
"""The staging table of held rows: ``payload`` is :func:`~ticdc_delta.core.records.dump_record`; ``sig`` and
``hashes`` its :class:`~ticdc_delta.core.key_buckets.Routing`."""

STAGING_PROPERTIES = {
    "delta.dataSkippingNumIndexedCols": "0",
    "delta.logRetentionDuration": "interval 1 hours",
    "delta.deletedFileRetentionDuration": "interval 10 minutes",
}
"""The staging table's properties.

No per-file column statistics: each batch reads the rows the batch before it held (``held_at = <that
batch> AND app = <the job's id>``); with statistics, Delta's data skipping compiled that filter, the batch
number inlined, into a new Java class every batch (measured here: ~0.15–0.25 s of Janino on the driver per
batch, and a method too long for the JIT to compile). Parquet's own row-group statistics still let the scan
skip the other batches' files.

An hour of log and ten minutes of tombstones instead of Delta's 30 days and a week: the table takes a
commit per micro-batch that holds rows, and only the next batch reads it, at its latest version (its
unused files are vacuumed without retention). Delta lists the whole log directory to load a table on a
local or HDFS path (with a 1-second trigger, 86,400 more files a day), and every checkpoint carries each
tombstone still retained. Delta removes expired log files when it writes a checkpoint, whole days at a
time, so a day's log or so stays."""

_SMALL_KINDS = ("meta", "summary", "error")
_ONE_STAGING_FILE = 200_000  # held rows up to which a batch writes them to the staging table as one file

TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
# Delta copies a MERGE source it cannot prove deterministic (ours runs Python) before it reads it twice —
# one Spark job per MERGE. Ours is deterministic by construction: a filter and a pure conversion of the
# batch's persisted rule output, which a recomputation rebuilds from the same Kafka offsets and staging
# rows (the rules sort every table's rows by commit ts and coordinates before collapsing them).
MATERIALIZE_SOURCE_CONF = "spark.databricks.delta.merge.materializeSource"
SCHEDULER_POOL_PROPERTY = "spark.scheduler.pool"

_CONFLICTS = (
    "ConcurrentAppendException", "ConcurrentDeleteReadException", "ConcurrentDeleteDeleteException",
    "ConcurrentTransactionException", "MetadataChangedException", "ProtocolChangedException",
    "ConcurrentWriteException", "DELTA_CONCURRENT",
)


MERGE_SOURCE_HOOK: Callable[[str, str], None] | None = None
"""A test hook, ``None`` in production: called with the target table's path and where the MERGE's source
comes from (``"records"``: the record path's final changes; ``"columnar"``: the columnar path's), in a pass
that only calls the hook, on the executors that read a MERGE's source rows,
that is after the MERGE has read its snapshot of the target and before it commits. A commit another writer
makes there conflicts with the MERGE every time (the conflict tests). Must be picklable (it travels to
the executors in the source's closure)."""


def staging_path(checkpoint: str) -> str:
    """Where the held rows of a changefeed live: ``<checkpoint>/staging`` (checked to stay inside)."""
    return child_location(checkpoint, "staging")


def is_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` is one of Delta's optimistic-concurrency conflicts (another writer won)."""
    text = f"{type(exc).__name__}: {exc}"
    return any(name in text for name in _CONFLICTS)


# --- executor-side functions (picklable closures over small data) -----------------------------------


class _ConfiguredKeys:
    """``(schema, table) -> key override`` from the job config (picklable, for executors)."""

    def __init__(self, cfg: Any) -> None:
        self._cfg = cfg

    def __call__(self, schema: str, table: str) -> list[str] | None:
        m = self._cfg.table_mapping_for(schema, table)
        return m.key if m is not None else None


class _DeltaColumnTypes:
    """``(schema, table, column) -> Arrow type`` of the existing Delta tables, read on the executor that
    screens the table (each table's log read once; picklable: built from the job config). The ``delta-rs``
    engine's ``BatchHandler._delta_column_types`` on the executors."""

    def __init__(self, cfg: Any) -> None:
        self._cfg = cfg
        self._tables: dict[tuple[str, str], dict[str, Any] | None] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"_cfg": self._cfg, "_tables": {}}

    def __call__(self, schema: str, table: str, column: str) -> Any:
        from ..errors import TicdcDeltaError
        from .batch_handler import _ConfiguredSink

        if (schema, table) not in self._tables:
            try:
                found = _ConfiguredSink(self._cfg).table_schema(TableIdent(schema, table))
            except TicdcDeltaError:  # no location for the name, unreadable: the apply will say so
                found = None
            self._tables[(schema, table)] = None if found is None else {f.name.lower(): f.type for f in found}
        cols = self._tables[(schema, table)]
        return None if cols is None else cols.get(column.lower())


def _evolve_all(cls: str) -> str:
    return "ignore"


@dataclass(frozen=True)
class _TableJob:
    """What the per-table function needs (pickled to the executors once per batch)."""

    rules: TableRules
    keys: _ConfiguredKeys
    catalog_json: dict
    tz: str
    policy: Callable[[str], str]
    case_sensitive: bool
    delta_types: Any = None  # _DeltaColumnTypes for a batch without DDL (ValueScreen's delta_type)
    # the layouts of the batch's new rows by signature: the decoder hands their images on as values alone
    # (core.records.dump_row_values), the layouts once each (its LAYOUT rows)
    layouts: Mapping[int, Layout] = field(default_factory=dict)


_OUT_ARROW = pa.schema([("schema", pa.string()), ("table", pa.string()), ("kind", pa.string()),
                        ("seg", pa.int32()), ("commit_ts", pa.int64()), ("payload", pa.binary()),
                        ("sig", pa.int64()), ("hashes", pa.list_(pa.int64()))])
_OUT_SCHEMA = spark_ddl(_OUT_ARROW)


def _table_fn(job: _TableJob) -> Callable[[pa.Table], pa.Table]:
    """The per-table rules (``groupBy(schema, table, bucket).applyInArrow``) of one key bucket of a table
    (:mod:`ticdc_delta.core.key_buckets`; the whole table when it has one bucket)."""

    def apply(tbl: pa.Table) -> pa.Table:
        with gc_paused():  # (records hold no cycles: see gc_paused)
            return rules_of(tbl)

    def rules_of(tbl: pa.Table) -> pa.Table:
        from ..delta.applier import TableCatalog

        cols: dict[str, list[Any]] = {name: [] for name in _OUT_ARROW.names}
        if tbl.num_rows == 0:
            return pa.Table.from_pydict(cols, schema=_OUT_ARROW)
        schema, table = tbl.column("schema")[0].as_py(), tbl.column("table")[0].as_py()
        bucket, buckets = tbl.column("bucket")[0].as_py(), tbl.column("buckets")[0].as_py()

        def emit(kind: str, seg: int, ts: int | None, payload: bytes, routing: Routing | None = None) -> None:
            for name, value in (("schema", schema), ("table", table), ("kind", kind), ("seg", seg),
                                ("commit_ts", ts), ("payload", payload)):
                cols[name].append(value)
            cols["sig"].append(None if routing is None else routing.signature)
            cols["hashes"].append(None if routing is None else routing.hashes)

        new: list[ChangeRecord] = []
        held: list[ChangeRecord] = []
        secondary: set[tuple[str, int, int, int]] = set()
        for is_held, primary, payload, sig, *coords in zip(*(tbl.column(name).to_pylist() for name in (
                "held", "primary", "payload", "sig", *COORDS))):
            # a new row's coordinates and names are columns (a held one's are in its record)
            rec = load_row(payload, job.layouts.get(sig), None if is_held else (*coords, schema, table))
            (held if is_held else new).append(rec)
            if not primary:
                secondary.add((rec.topic, rec.partition, rec.offset, rec.idx))
        screen = ValueScreen(TableCatalog(job.catalog_json), job.tz, ddl_policy=job.policy,
                             case_sensitive=job.case_sensitive, delta_type=job.delta_types)
        try:
            out = job.rules.apply_table(new, held, KeyResolver(lookup=job.keys), screen, secondary=secondary,
                                        owns=owns(bucket, buckets) if buckets > 1 else None)
        except MissingKeyError as exc:
            emit("error", -1, None, pickle.dumps(str(exc)))
            return pa.Table.from_pydict(cols, schema=_OUT_ARROW)
        for seg, tc in out.segments:
            col_types: dict[str, tuple[int, int]] = {}
            n_del, last = 0, None
            keys = set(tc.key_columns)
            # each integer key column's least and greatest value and how many images hold it (the MERGE's
            # key range without a job of its own); None: the column holds a null; "other": a value of
            # another type
            spans: dict[str, list[int] | str | None] = {}
            spelled: set[str] = set()  # a column's name in lower case: an upstream rename may change only its case
            for fc in tc.changes.values():
                for name, type_code, flags, value in fc.image:
                    if (low := name.lower()) not in spelled:
                        spelled.add(low)
                        col_types[name] = (type_code, flags)
                    if name in keys:
                        _span(spans, name, type_code, value)
                if fc.kind == DELETE:
                    n_del += 1
                if fc.commit_ts is not None:
                    last = fc.commit_ts if last is None else max(last, fc.commit_ts)
                emit("change", seg, fc.commit_ts, pickle.dumps((fc.kind, fc.image, fc.commit_ts, fc.op)))
            meta = {"keys": tc.key_columns, "col_types": list(col_types.items()), "rows": len(tc.changes),
                    "deleted": n_del, "last_ts": last,
                    "ranges": _key_ranges(spans, tc.key_columns, len(tc.changes))}
            emit("meta", seg, last, pickle.dumps(meta))
        router = Router(job.keys)
        layouts = set()
        for rec in out.held:  # with their routing: the next batch buckets them as the decoder does new rows
            routing = router(rec)
            layouts.add(routing.signature)
            emit("held", -1, rec.commit_ts, dump_record(rec), routing)
        for rej in out.rejected:
            emit("rejected_ts", -1, rej.ts, pickle.dumps(rej))
        rejections = [r for r in screen.rejections if (r.topic, r.partition, r.offset, r.idx) not in secondary]
        for rejection in rejections:
            emit("rejection", -1, None, pickle.dumps(rejection))
        emit("summary", -1, None, pickle.dumps({"replays": out.replays, "held": len(out.held),
                                                "released": out.released, "rejections": len(rejections),
                                                "snapshot_dropped": out.snapshot_dropped,
                                                "rejected_ts": len(out.rejected), "layouts": sorted(layouts)}))
        return pa.Table.from_pydict(cols, schema=_OUT_ARROW)

    return apply


def _picker(names: tuple[str, ...], wanted: list[str]) -> Callable[[tuple], tuple]:
    """The values of the ``wanted`` columns, in that order, out of an image's values listed as ``names``:
    ``None`` for a column the image lacks (a delete that carries only the key), the last value of a repeated
    name (as a dict of the image keeps). Names compare ignoring case, as MySQL's column names do: the images
    before and after an upstream rename that changed only a column's case (Avro carries no DDL) are one
    column's values."""
    at = {name.lower(): i for i, name in enumerate(names)}
    positions = [at.get(name.lower(), len(names)) for name in wanted]  # len(names): the None appended below
    if not positions:
        return lambda values: ()
    getter = operator.itemgetter(*positions) if len(positions) > 1 else (lambda v, i=positions[0]: (v[i],))
    if all(name.lower() in at for name in wanted):
        return getter  # type: ignore[return-value]
    return lambda values: getter(values + (None,))


def _typed_fn(fields: list[tuple[str, str, int, int, Any]], meta: tuple[str, str] | None, upserts: bool,
              tz: str, arrow_schema: pa.Schema) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """Final changes (pickled) → the target table's typed columns plus
    :data:`~ticdc_delta.delta.sink.OP_COLUMN` (the ``delta-rs`` applier's conversion:
    :func:`~ticdc_delta.delta.arrow_types.converter_for` per column)."""

    def convert(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        converters = [(name, converter_for(t, f, params, tz), arrow_type_for(t, f, params))
                      for _, name, t, f, params in fields]
        wanted = [name for name, _, _ in converters]
        pickers: dict[tuple[str, ...], Callable[[tuple], tuple]] = {}  # an image's names -> its values, in order
        for b in batches:
            changes = [pickle.loads(p) for p in b.column("payload").to_pylist()]
            rows = []
            for ch in changes:
                names, _, _, values = zip(*ch[1]) if ch[1] else ((), (), (), ())
                pick = pickers.get(names)
                if pick is None:
                    pick = pickers[names] = _picker(names, wanted)
                rows.append(pick(values))
            columns = list(zip(*rows)) if rows else [() for _ in converters]
            arrays: list[pa.Array] = []
            for (name, conv, typ), values in zip(converters, columns):
                arrays.append(pa.array([None if v is None else conv(v) for v in values], type=typ))
            if meta and upserts:
                arrays.append(pa.array([ch[2] for ch in changes], type=pa.int64()))
                arrays.append(pa.array([ch[3] for ch in changes], type=pa.string()))
            arrays.append(pa.array([OP_DELETE if ch[0] == DELETE else OP_UPSERT for ch in changes], type=pa.string()))
            yield pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)

    return convert


_DEAD_VALUES_ARROW = pa.schema([
    ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()), ("error", pa.string()),
    ("schema", pa.string()), ("table", pa.string()), ("column", pa.string()), ("column_value", pa.binary()),
    ("row", pa.string()), ("order_ts", pa.int64()), ("idx", pa.int32()), ("payload", pa.binary()),
])
_DEAD_VALUES_SCHEMA = spark_ddl(_DEAD_VALUES_ARROW)


def _dead_values_fn() -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """Refused changes (pickled :class:`~ticdc_delta.delta.value_check.Rejection`) → the dead-letter
    table's columns, as ``BatchHandler._dead_letter_rejections`` writes them, plus the sort key of the
    messages (commit ts, coordinates) and the pickle (for the few the driver names)."""

    def convert(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from ..delta.value_check import value_bytes
        from .batch_handler import _record_json

        for b in batches:
            cols: dict[str, list[Any]] = {name: [] for name in _DEAD_VALUES_ARROW.names}
            for payload in b.column("payload").to_pylist():
                r = pickle.loads(payload)
                row = {"topic": r.topic, "partition": r.partition, "offset": r.offset,
                       "error": f"{r.where()}: {r.error}", "schema": r.schema, "table": r.table,
                       "column": r.column, "column_value": value_bytes(r.value),
                       "row": None if r.record is None else _record_json(r.record),
                       "order_ts": (r.record.commit_ts or 0) if r.record is not None else 0, "idx": r.idx,
                       "payload": payload}
                for name, values in cols.items():
                    values.append(row[name])
            yield pa.RecordBatch.from_pydict(cols, schema=_DEAD_VALUES_ARROW)

    return convert


_REJECTED_TS_ARROW = pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                                ("idx", pa.int32()), ("reason", pa.string())])
_REJECTED_TS_SCHEMA = spark_ddl(_REJECTED_TS_ARROW)


def _rejected_ts_fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Rows the ts guard refused (pickled :class:`~ticdc_delta.core.batch_planner.RejectedTs`) → their
    coordinates and reason."""
    for b in batches:
        rejected = [pickle.loads(p) for p in b.column("payload").to_pylist()]
        yield pa.RecordBatch.from_pydict({name: [getattr(r, name) for r in rejected] for name in _REJECTED_TS_ARROW.names},
                                         schema=_REJECTED_TS_ARROW)


def _parallelism(spark: Any) -> int:
    """The session's default parallelism (its cores), or 1 where the session does not say (a shared
    cluster that hides the SparkContext)."""
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:  # noqa: BLE001 - e.g. Spark Connect: no SparkContext; then tables are not split
        return 1


def _split_tables(spark: Any, layouts: dict[tuple[str, str], list[Any]], held: list[Any] | None,
                  split_rows: int, keys: _ConfiguredKeys) -> dict[tuple[str, str], int]:
    """The tables to split into key buckets (:mod:`ticdc_delta.core.key_buckets`) and into how many: one
    bucket per ``split_rows`` rows (``sink.split_rows``; 0: none) up to the session's default parallelism,
    for the tables whose rows, new (``layouts``: table -> [{signature: pickled layout}, rows]) and held
    (``held``: [schema, table, signatures, rows] entries; ``None``: unknown), are
    :func:`~ticdc_delta.core.key_buckets.splittable` — held rows of a layout no new row has are unknown."""
    if held is None or split_rows <= 0:
        return {}
    tables: dict[tuple[str, str], list[Any]] = {ident: [dict(found), n, set()] for ident, (found, n) in layouts.items()}
    for schema, table, sigs, n in held:
        found = tables.setdefault((schema, table), [{}, 0, set()])
        found[1] += n
        found[2].update(sigs)
    most = _parallelism(spark)
    out = {}
    for (schema, table), (known, n, held_sigs) in tables.items():
        buckets = min(most, n // split_rows)
        if buckets > 1 and held_sigs <= set(known) and splittable(
                (pickle.loads(v) for v in known.values()), keys(schema, table)):
            out[(schema, table)] = buckets
    return out


def _rekeyed(meta: dict[str, Any], keys: _ConfiguredKeys) -> set[tuple[str, str]]:
    """The tables whose staged held rows were routed under another configured key than today's
    (``tables[].key`` edited between two runs): their stored ``hashes`` name the old key's buckets, so such
    a table is not split into key buckets for this batch — a held row in a bucket that does not own its
    key would be dropped — and its rows held again are routed by today's key. A state from before the
    staged rows' keys were recorded (no ``held_keys``): every table with staged rows."""
    recorded = meta.get("held_keys")
    tables = {(schema, table) for schema, table, *_ in meta.get("held_layouts") or ()}
    if recorded is None:
        return tables
    known = {(schema, table): key for schema, table, key in recorded}
    return {ident for ident in tables if ident not in known or known[ident] != keys(*ident)}


def _with_buckets(rows: Any, split: dict[tuple[str, str], int], slots: list[int] | None = None) -> Any:
    """``rows`` with the ``bucket`` each goes to, the table's ``buckets`` and whether it is there as
    ``primary`` (a key-changing update of a split table is in its new key's bucket and, when another, in
    its old key's: :func:`ticdc_delta.core.key_buckets.split`), and the ``slot`` its group is shuffled by
    (:func:`_group_rules`)."""
    from pyspark.sql import functions as F

    if not split:
        return rows.select("*", F.lit(0).alias("bucket"), F.lit(1).alias("buckets"), F.lit(True).alias("primary"),
                           F.lit(0).alias("slot"))
    names = F.concat_ws("\0", "schema", "table")
    sizes = F.create_map(*[v for (schema, table), n in split.items() for v in (F.lit(f"{schema}\0{table}"), F.lit(n))])
    n = F.col("buckets")
    first = F.when(n > 1, F.pmod(F.col("hashes")[0], n)).otherwise(0)
    second = F.when((n > 1) & (F.size("hashes") > 1), F.pmod(F.col("hashes")[1], n))
    out = (rows.withColumn("buckets", F.coalesce(F.element_at(sizes, names), F.lit(1)).cast("int"))
           .withColumn("first", first).withColumn("second", second)
           .select("*", F.posexplode(F.when(F.col("second").isNotNull() & (F.col("second") != F.col("first")),
                                            F.array("first", "second")).otherwise(F.array("first")))
                   .alias("pos", "bucket"))
           .select(*rows.columns, F.col("bucket").cast("int").alias("bucket"), "buckets",
                   (F.col("pos") == 0).alias("primary")))
    # each bucket of a split table in a shuffle partition of its own (its own task, so its own core):
    # ``slots[j]`` is a value Spark's hash partitioning sends to partition j; other tables spread by name
    assert slots  # noqa: S101 - _group_rules passes them with a split
    starts, at = {}, 0
    for ident, k in sorted(split.items()):
        starts[ident] = at
        at += k
    base = F.create_map(*[v for (schema, table), a in starts.items() for v in (F.lit(f"{schema}\0{table}"), F.lit(a))])
    slot_of = F.array(*[F.lit(v) for v in slots])
    start = F.element_at(base, names)
    return out.select("*", F.when(start.isNull(), F.hash("schema", "table"))
                      .otherwise(F.element_at(slot_of, F.pmod(start + F.col("bucket"), len(slots)) + 1))
                      .cast("int").alias("slot"))


def _span(spans: dict[str, Any], name: str, type_code: int, value: Any) -> None:
    """Widen key column ``name``'s ``[least, greatest, images]`` in ``spans`` by ``value``: ``None`` once it
    holds a null (the MERGE leaves it unbounded), ``"other"`` for a value that is no integer of an integer
    type (a Spark job finds its range, :func:`_key_range`)."""
    found = spans.get(name, [])
    if found is None:
        return
    if value is None:
        spans[name] = None
        return
    if found == "other":
        return
    v = integer_value(type_code, value)
    if v is None:
        spans[name] = "other"
    elif not found:
        spans[name] = [v, v, 1]
    else:
        found[2] += 1
        if v < found[0]:
            found[0] = v
        elif v > found[1]:
            found[1] = v


def _key_ranges(spans: Mapping[str, Any], keys: Sequence[str], changes: int
                ) -> dict[str, tuple[int, int] | None]:
    """The meta's ``ranges`` from :func:`_span`'s ``spans`` of a segment's ``changes`` final changes: the
    least and greatest value of each integer key column that every image holds, ``None`` for one that holds
    a null or that an image lacks (the MERGE's source has a null there); none for the others."""
    out: dict[str, tuple[int, int] | None] = {}
    for k in keys:
        found = spans.get(k)
        if found == "other":
            continue
        out[k] = None if found is None or found[2] != changes else (found[0], found[1])
    return out


def _add_meta(metas: dict[tuple[int, str, str], dict], at: tuple[int, str, str], meta: dict) -> None:
    """Put one bucket's meta of a table's segment together with the other buckets' (their final changes
    are of different keys; they have the same key columns, and each bucket's columns are a prefix of the
    table's: :func:`~ticdc_delta.core.key_buckets.splittable`).

    Raises:
        TerminalError: two buckets disagree on the key or the columns (a bug: nothing is written).
    """
    found = metas.get(at)
    if found is None:
        metas[at] = dict(meta)
        return
    short, long_ = sorted((found["col_types"], meta["col_types"]), key=len)
    # (each bucket names a column as its first image does: the case may differ after an upstream rename)
    if tuple(found["keys"]) != tuple(meta["keys"]) or [(n.lower(), t) for n, t in long_[:len(short)]] != \
            [(n.lower(), t) for n, t in short]:
        raise TerminalError(f"{at[1]}.{at[2]}: the key buckets of one table disagree on its key or columns "
                            f"({found['keys']} / {meta['keys']})")
    found["col_types"] = long_
    mine, theirs = found.get("ranges", {}), meta.get("ranges", {})
    # a key column with a null in either bucket stays unbounded; one a bucket has no integer range of
    # (values of another type) is left to the MERGE's job
    found["ranges"] = {k: None if mine[k] is None or theirs[k] is None else
                       (min(mine[k][0], theirs[k][0]), max(mine[k][1], theirs[k][1]))
                       for k in mine.keys() & theirs.keys()}
    found["ranges"].update({k: None for k, r in (*mine.items(), *theirs.items()) if r is None})
    found["rows"] += meta["rows"]
    found["deleted"] += meta["deleted"]
    if meta["last_ts"] is not None:
        found["last_ts"] = meta["last_ts"] if found["last_ts"] is None else max(found["last_ts"], meta["last_ts"])


_SIDE_COLUMNS = ("schema", "table", "kind", "seg", "commit_ts", "payload", "sig", "hashes")


def _side_rows(out: Any, typed: dict[tuple[str, str], Any]) -> Any:
    """The rows both paths leave besides the typed changes the columnar path MERGEs, in the record path's
    columns (:data:`_SIDE_COLUMNS`): ``out`` (the record path's, ``None``: none) and every columnar table's
    held rows, refusals and summaries (``typed``: table -> its :func:`~.columnar.columnar_fn` rows). What
    the driver collects, the dead letters and the staging append read it. ``None`` when there is neither."""
    from pyspark.sql import functions as F

    frames = [] if out is None else [out.select(*_SIDE_COLUMNS)]
    for (schema, table), conv in typed.items():
        frames.append(conv.filter(F.col("_kind") != CHANGE).select(
            F.lit(schema).alias("schema"), F.lit(table).alias("table"), F.col("_kind").alias("kind"),
            F.lit(0).alias("seg"), F.col("_commit_ts").alias("commit_ts"), F.col("_payload").alias("payload"),
            F.col("_sig").alias("sig"), F.col("_hashes").alias("hashes")))
    return functools.reduce(lambda a, b: a.unionByName(b), frames) if frames else None


def _spark_schema(arrow: pa.Schema) -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(arrow, prefer_timestamp_ntz=True)


def _key_range(source: Any, keys: Sequence[str], files: pa.Table | None = None, least: int = 0,
               known: Mapping[str, tuple[int, int] | None] | None = None) -> list[Any]:
    """Conditions on the target alone for a MERGE: ``t.k >= least`` and ``t.k <= greatest`` of each key
    column ``k`` of an integer, decimal (BIGINT UNSIGNED) or string type whose values in ``source`` (the
    MERGE's source, its key columns named and typed as the target's) are all non-null (``<=>`` matches a
    null key, a range would not). They change no match — every source key lies within them — and Delta
    skips the target files whose statistics lie outside them instead of reading every file for matches.
    The bounds are literals of the column's own type (a cast of the target column would keep Delta from
    skipping). ``known``: key columns whose range is known already (each integer key column's, found by the
    record path's rules or the columnar path's counts; ``None`` where it holds a null), used where the column's type holds it; one Spark
    job over ``source`` finds the others'. ``[]`` when the source is empty or no key column qualifies, or
    when the target's files (``files``, :attr:`~ticdc_delta.delta.sink.TableFacts.files`) lying outside them
    hold fewer than ``least`` rows: bounds that spare the MERGE little (random keys: every file overlaps the
    range) would cost more than they save (the code Spark compiles for their literals, Delta's skipping)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DecimalType, IntegralType, StringType

    types = {f.name: f.dataType for f in source.schema}
    usable = [k for k in keys if isinstance(types.get(k), (IntegralType, DecimalType, StringType))]
    known = known or {}
    ranges: dict[str, tuple[Any, Any]] = {k: span for k in usable
                                          if (span := known.get(k)) is not None and _holds(types[k], span)}
    ask = [k for k in usable if k not in ranges and not (k in known and known[k] is None)]
    if ask:
        aggs = [F.count(F.lit(1)).alias("n")]
        for i, k in enumerate(ask):
            col = F.col(_quote(k))
            aggs += [F.min(col).alias(f"lo{i}"), F.max(col).alias(f"hi{i}"), F.count(col).alias(f"n{i}")]
        row = source.agg(*aggs).collect()[0]
        ranges.update({k: (row[f"lo{i}"], row[f"hi{i}"]) for i, k in enumerate(ask)
                       if row["n"] and row[f"n{i}"] == row["n"]})
    if not ranges or files is not None and rows_outside(files, ranges) < least:
        return []

    def literal(value: Any, t: Any) -> Any:  # (an int beyond a long, BIGINT UNSIGNED's, as the decimal it is)
        return F.lit(Decimal(value) if isinstance(t, DecimalType) and isinstance(value, int) else value).cast(t)

    return [bound for k, (lo, hi) in ranges.items() for bound in
            (F.col(f"t.{_quote(k)}") >= literal(lo, types[k]), F.col(f"t.{_quote(k)}") <= literal(hi, types[k]))]


def _holds(spark_type: Any, span: tuple[Any, Any]) -> bool:
    """Whether a column of ``spark_type`` (an integer or decimal type) holds the integers ``span``."""
    from pyspark.sql.types import ByteType, DecimalType, IntegerType, LongType, ShortType

    if isinstance(spark_type, DecimalType):
        limit = 10 ** (spark_type.precision - spark_type.scale)
        return -limit < span[0] and span[1] < limit
    bits = {ByteType: 8, ShortType: 16, IntegerType: 32, LongType: 64}.get(type(spark_type))
    return bits is not None and -(1 << (bits - 1)) <= span[0] and span[1] < 1 << (bits - 1)


_UNPINNED: set[str] = set()  # the tables pinned_read could not pin (warned once each)


def pinned_read(spark: Any, path: str) -> tuple[Any, bool]:
    """The Delta table at ``path`` as of its current version, named in the read (``versionAsOf``), and
    ``True``; or, when Delta Lake's log cannot be asked for that version, the table read without one and
    ``False``.

    The version matters to what Spark caches: a write to a Delta table makes Spark drop from its cache
    (to recompute them on their next use) the cached frames whose plan reads that table without a version.
    The spark engine's held rows flow into the frames its MERGEs read (``out``, the columnar path's final
    changes): read without a version, the batch's own staging append, running beside the MERGEs, made them
    compute the whole batch again (measured: a 250k-change batch's MERGE 1.7 s → 4 s). ``False`` tells the
    caller to append after the MERGEs instead.

    The version comes from ``DeltaLog.update()`` (~10 ms, the log's listing), the one piece of Delta Lake
    the job reaches past its public API for; the other public ways took 0.3 s (``history(1)``).
    """
    reader = spark.read.format("delta")
    try:
        none = spark._jvm.scala.Option.empty()
        version = int(spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(
            spark._jsparkSession, path).update(False, none, none).version())
    except Exception as exc:  # noqa: BLE001 - Delta Lake's internals moved: the read is right, only not pinned
        if path not in _UNPINNED:
            _UNPINNED.add(path)
            log.warning("could not read the version of %s (its appends wait for the MERGEs): %s", path,
                        str(exc).splitlines()[0][:200])
        return reader.load(path), False
    return reader.option("versionAsOf", version).load(path), True


def _settle(work: Future[None] | None) -> None:
    """Wait for ``work`` to end when a batch has failed: the batch's own error is the one raised, the
    work's is only logged."""
    if work is None:
        return
    try:
        work.result()
    except BaseException as exc:  # noqa: BLE001 - the batch's error wins
        log.warning("while the batch failed, its staging append failed too: %s", str(exc).splitlines()[0][:200])


def _calling(on_read: Callable[[], None]) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function that calls ``on_read`` (:data:`MERGE_SOURCE_HOOK`), then passes its rows on."""

    def call(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        on_read()
        yield from batches

    return call


# --- the engine (driver) ------------------------------------------------------------------------------


@dataclass
class _Progress:
    """What the progress line needs from a batch (the fields of a plan it reads)."""

    topic_watermarks: dict[str, int | None]
    held: int
    replays_dropped: int
    snapshot_dropped: int = 0
    watermark_regressions: int = 0


class SparkEngine:
    """Applies micro-batches for a :class:`~ticdc_delta.spark.batch_handler.BatchHandler` on Spark."""

    def __init__(self, handler: Any) -> None:
        self.h = handler
        self.cfg = handler.cfg
        self.staging = staging_path(self.cfg.checkpoint)
        self._sessions = threading.local()  # the merge threads' sessions, one per thread for the job's life
        self._pool: ThreadPoolExecutor | None = None  # the merge threads, made on first use, shut in close()
        self._staging_pool: ThreadPoolExecutor | None = None  # the staging appends' thread (_stage_held), likewise
        self._compaction: Any = None  # spark_compaction(spark), made on the first batch (its own session)
        self._slots: dict[int, list[int]] = {}  # shuffle partitions -> a slot value hashed to each (_group_rules)
        self._warming: threading.Thread | None = None  # _warm_snapshots' thread, joined before the next MERGE
        self._warm_session: Any = None
        self._staging_tuned = False  # the staging table has STAGING_PROPERTIES (_tune_staging)
        self._bounded: set[str] = set()  # the tables whose MERGE of this batch took its key range (_merge)

    def close(self) -> None:
        """Wait for the snapshot warm-up of the last batch (:meth:`_warm_snapshots`) to end: nothing of
        this engine runs once the job returns; and stop the merge and staging threads (a later batch makes new
        ones)."""
        self._join_warming()
        for name in ("_pool", "_staging_pool"):
            pool = getattr(self, name)
            setattr(self, name, None)
            if pool is not None:
                pool.shutdown(wait=True)

    def _join_warming(self) -> None:
        thread, self._warming = self._warming, None
        if thread is not None:
            thread.join()

    def _warm_snapshots(self, spark: Any, paths: list[str]) -> None:
        """Compute the current snapshot of the Delta tables at ``paths`` in the background, while the next
        micro-batch reads and decodes: the tables this batch committed to and the staging table the next
        one reads and appends to.

        Every commit makes a new table version, and Delta reconstructs a version's state (its files,
        app transactions) the first time it is used: a Spark job over the log's checkpoint and commits,
        ~0.5 s here. The next MERGE would do it first thing; done now, it finds it done (~2.3 s → ~1.5 s
        per MERGE measured here). Read-only: a failure is only logged (the MERGE computes it then), and a
        newer version by then (a DDL, another writer) just makes this one wasted. The thread has a session
        of its own and is joined before the next batch's first MERGE and when the job ends (:meth:`close`).
        """
        if not paths:
            return
        self._join_warming()
        try:
            if self._warm_session is None:
                self._warm_session = own_session(spark)
        except Exception as exc:  # noqa: BLE001 - the batch is committed: an optimization must not fail it
            log.debug("no session to warm snapshots in: %s", str(exc).splitlines()[0][:200])
            return
        session = self._warm_session

        def warm() -> None:
            session.sparkContext.setLocalProperty(SCHEDULER_POOL_PROPERTY, "ticdc-warm")
            for path in paths:
                try:
                    session.sparkContext.setJobDescription(f"ticdc-delta: snapshot of {path}")
                    session.read.format("delta").load(path).inputFiles()  # the file list: the whole state
                except Exception as exc:  # noqa: BLE001 - an optimization: the MERGE computes it anyway
                    log.debug("could not warm the snapshot of %s: %s", path, str(exc).splitlines()[0][:200])

        self._warming = threading.Thread(target=warm, name="ticdc-snapshot-warm", daemon=True)
        self._warming.start()

    # --- helpers ---------------------------------------------------------------------------------------

    def _retry(self, what: str, attempt: Callable[[], Any]) -> Any:
        """``attempt()``, again after a Delta conflict, up to ``sink.conflict_retries`` times.

        Raises:
            ConcurrentCommitError: other writers kept winning (exit 75: retry the job).
            SinkError: a constraint of the table refused a row (:func:`~ticdc_delta.delta.sink.constraint_error`).
        """
        tries = self.cfg.sink.conflict_retries
        for n in range(tries + 1):
            try:
                return attempt()
            except Exception as exc:  # noqa: BLE001 - only conflicts are retried, the rest re-raised
                if constraint_violated(exc):  # a row the table's own CHECK / NOT NULL refuses: named here
                    raise constraint_error(f"{what} failed", exc) from exc
                if not is_conflict(exc):
                    raise
                if n == tries:
                    raise ConcurrentCommitError(
                        f"{what}: another writer's commit kept conflicting ({tries + 1} attempts): "
                        f"{str(exc).splitlines()[0][:300]}"
                    ) from None
                log.warning("%s: conflict with another writer, attempt %d of %d: %s", what, n + 1, tries + 1,
                            str(exc).splitlines()[0][:200])
                time.sleep(min(0.2 * 2 ** n, 5.0))
        raise AssertionError("unreachable")  # pragma: no cover

    def _append(self, df: Any, path: str, txn: Txn, *, merge_schema: bool = False,
                properties: Mapping[str, str] | None = None) -> None:
        """Append ``df`` to the Delta table at ``path`` once (``txn``); ``properties``: the table's
        properties when this append creates it."""
        writer = (df.write.format("delta").mode("append").option("txnAppId", txn.app_id)
                  .option("txnVersion", str(txn.version)))
        if merge_schema:
            writer = writer.option("mergeSchema", "true")
        for key, value in (properties or {}).items():
            writer = writer.option(key, value)
        self._retry(f"append to {path}", lambda: writer.save(path))

    def _stage_held(self, side: Any, rows_held: int, batch_id: int) -> Future[None]:
        """Start appending the batch's ``rows_held`` held rows (``side``'s ``held`` rows) to the staging
        table, once (the changefeed's staging transaction, version ``batch_id``), in the staging thread:
        while the MERGEs run, which need nothing from it (a Delta append's fixed cost, 0.7–1.2 s per 250k-change
        batch here, was on every batch that held rows). The caller waits for it before the state is saved, which makes
        the rows the next batch's; a crash before then re-runs the batch, whose append Delta skips when
        the first attempt committed it. The write goes through ``side``'s session with its transaction
        in the writer's options, which Delta Lake takes over the session confs a MERGE sets."""
        from pyspark.sql import functions as F

        staged_rows = side.filter(F.col("kind") == "held").select(
            F.lit(batch_id).cast("long").alias("held_at"), "schema", "table", "commit_ts", "payload",
            F.lit(self.h._app_id).alias("app"), "sig", "hashes")
        if rows_held <= _ONE_STAGING_FILE:
            # one file, not one per partition of the rules' output (plus the empty file Spark writes
            # for an empty first partition, which Delta does not commit and only VACUUM removes)
            staged_rows = staged_rows.coalesce(1)
        txn = Txn(self.h._app_id + "/staging", batch_id)

        def append() -> None:
            context = side.sparkSession.sparkContext
            context.setLocalProperty(SCHEDULER_POOL_PROPERTY, "ticdc-staging")
            context.setJobDescription(f"ticdc-delta: held rows of batch {batch_id}")
            self._append(staged_rows, self.staging, txn, merge_schema=True, properties=STAGING_PROPERTIES)

        if self._staging_pool is None:
            self._staging_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ticdc-staging")
        return self._staging_pool.submit(append)

    def _tune_staging(self, spark: Any) -> None:
        """Give the staging table :data:`STAGING_PROPERTIES` if it lacks them (made by an earlier version
        of the job): once per run of the job, after a staging append (so the table exists). Never fails
        the batch: the properties only make it faster."""
        from deltalake import DeltaTable as RsTable

        self._staging_tuned = True
        try:
            found = RsTable(self.staging, storage_options=self.cfg.sink.storage_options or None).metadata().configuration
            missing = {key: value for key, value in STAGING_PROPERTIES.items() if found.get(key) != value}
            if missing:
                self._retry("tune staging", lambda: spark.sql(
                    f"ALTER TABLE {_sql_table(self.staging)} {set_tblproperties(missing)}"))
        except Exception as exc:  # noqa: BLE001 - the next run tries again
            log.warning("could not set the properties of the staging table %s: %s", self.staging,
                        str(exc).splitlines()[0][:200])

    # --- the batch -------------------------------------------------------------------------------------

    def run(self, batch_df: Any, batch_id: int, *, guard: Any, query_id: Any, started: float,
            seam: Any = None, messages: int | None = None) -> None:
        """Apply micro-batch ``batch_id`` (see the module docstring). ``seam``: the tables' snapshot TSOs
        (:mod:`ticdc_delta.core.snapshot_seam`): their rows and DDL at or below it are dropped. ``messages``:
        how many Kafka messages the batch reads, when known (Spark's offset log); a batch of at most
        :data:`~ticdc_delta.spark.decode.ONE_DECODE_TASK` is decoded in one task instead of one per Kafka partition.

        Raises:
            DecodeError / UnwritableValueError / ImplausibleTimestampError: bad input under
                ``dead_letter.fail_on_error``; TerminalError: a row without its key columns;
            ConcurrentCommitError: Delta conflicts beyond ``sink.conflict_retries``;
            DDLPolicyError, SinkError: from the DDL replay.
        """
        from pyspark.sql import functions as F
        from pyspark import StorageLevel

        h, cfg = self.h, self.cfg
        self._bounded = set()
        spark = cache_in_session(batch_df.sparkSession)  # the stream's session: this batch persists frames
        spec = h._decoder_spec()
        names = functools.partial(fold_name, case_sensitive=cfg.case_sensitive)
        keys = _ConfiguredKeys(cfg)
        decoded = (few_tasks(batch_df, messages)
                   .mapInArrow(make_decode_fn(spec, names=names, spans=True, keys=keys), NAMED_SCHEMA)
                   .persist(StorageLevel.MEMORY_AND_DISK))
        out = view = None
        persisted: list[Any] = []  # the columnar path's frames, unpersisted with ``decoded`` and ``out``
        views: list[str] = []  # the global views of the columnar path's final changes (dropped at the end)
        try:
            # 1. small things to the driver: the decoder's span rows, the DDL and the resolved marks (a filter
            # of the decoded rows, which this pass caches; no second Python pass over them)
            offsets: dict[tuple[str, int], list[int]] = {}
            counts = {"row": 0, "ddl": 0, "resolved": 0, "error": 0, "empty": 0}
            ddl: list[DDLRecord] = []
            resolved: list[ResolvedMark] = []
            layouts: dict[tuple[str, str], list[Any]] = {}  # table -> [its rows' {signature: layout}, rows]
            small_cols = ("topic", "partition", "kind", "offset", "idx", "commit_ts", "payload", "error", "schema",
                          "table", "sig")
            for r in decoded.filter(F.col("kind").isin(SPAN, LAYOUT, "ddl", "resolved")).select(*small_cols).collect():
                if r["kind"] == LAYOUT:
                    found = layouts.setdefault((r["schema"], r["table"]), [{}, 0])
                    found[0].setdefault(r["sig"], r["payload"])
                    found[1] += r["idx"]
                elif r["kind"] == SPAN:  # (kind in error, first offset, last offset in commit_ts, count in idx)
                    counts[r["error"]] = counts.get(r["error"], 0) + r["idx"]
                    span = offsets.setdefault((r["topic"], r["partition"]), [r["offset"], r["commit_ts"]])
                    span[0], span[1] = min(span[0], r["offset"]), max(span[1], r["commit_ts"])
                elif r["kind"] == "ddl":
                    ddl.append(load_record(r["payload"]))  # type: ignore[arg-type]
                else:
                    resolved.append(ResolvedMark(r["topic"], r["partition"], r["offset"], r["idx"], r["commit_ts"]))
            # the order the delta-rs engine sees them in (Kafka's, per partition)
            ddl.sort(key=lambda d: (d.topic, d.partition, d.offset, d.idx))
            resolved.sort(key=lambda m: (m.topic, m.partition, m.offset, m.idx))
            timings = {"read_decode": time.monotonic() - started}
            h._fault("after_decode", batch_id)

            # 2. undecodable messages: from the executors to the dead-letter table
            if counts["error"]:
                self._dead_letter_errors(decoded, counts["error"], batch_id)
            h._fault("after_dead_letter", batch_id)

            # 3. the driver's part of the rules
            assert h._state is not None and h._catalog is not None  # noqa: S101 - loaded by the handler
            state = h._retire_partitions(h._state, offsets)
            held_rows = [r for r in state.held if isinstance(r, ChangeRecord)]  # a state left by delta-rs
            ddl_state = replace(state, held=[r for r in state.held if isinstance(r, DDLRecord)])
            h._avro_type_params(spec, h._catalog)
            partitions = {t: h._partitions_of(t) for t in cfg.topics} if h.mode == WATERMARK else None
            # a table's rows are split only by its own DDL: one MERGE per table between them (ddl_tables)
            plan, rules = plan_coordination(ddl_state, ddl, resolved, mode=h.mode, partitions=partitions,
                                            guard=guard, case_sensitive=cfg.case_sensitive, seam=seam,
                                            concerns=functools.partial(ddl_tables, case_sensitive=cfg.case_sensitive))

            # 4. the per-table part, on the executors
            t_plan = time.monotonic()
            rows = decoded.filter(F.col("kind") == "row").select(
                "schema", "table", F.lit(False).alias("held"), "payload", "sig", "hashes", *COORDS)
            # a held row's coordinates are in its record (the staging table does not keep them)
            no_coords = [F.lit(None).cast(t).alias(c)
                         for c, t in zip(COORDS, ("long", "string", "int", "long", "int"))]
            staged_batch, staged_app = h._meta.get("staging_batch"), h._meta.get("staging_app")
            overlap = True  # whether this batch's staging append may run beside its MERGEs (pinned_read)
            # the layouts of the held rows (None: rows held by an earlier version, without their routing)
            held_layouts: list[Any] | None = [] if staged_batch is None else h._meta.get("held_layouts")
            if held_layouts is not None:
                held_layouts = list(held_layouts)  # (a copy: this batch adds to it, the state's stays)
            if staged_batch is not None:
                which = F.col("held_at") == int(staged_batch)
                if staged_app is not None:  # (a state written before staging rows carried their app id: none)
                    which = which & (F.col("app") == staged_app)
                staged, overlap = pinned_read(spark, self.staging)
                routed = "sig" in staged.columns
                rows = rows.unionByName(staged.filter(which).select(
                    "schema", "table", F.lit(True).alias("held"), "payload",
                    *(("sig", "hashes") if routed else (F.lit(None).cast("long").alias("sig"),
                                                       F.lit(None).cast("array<long>").alias("hashes"))),
                    *no_coords))
                if not routed:
                    held_layouts = None  # rows held before they carried their routing: no table is split
            if held_rows:
                router = Router(keys)
                held_data = []
                for r in held_rows:
                    folded = r._replace(schema=names(r.schema), table=names(r.table))
                    routing = router(folded)
                    held_data.append((folded.schema, folded.table, True, dump_record(r), routing.signature,
                                      routing.hashes))
                    if held_layouts is not None:
                        held_layouts.append([folded.schema, folded.table, [routing.signature], 1])
                rows = rows.unionByName(spark.createDataFrame(
                    held_data, "schema string, table string, held boolean, payload binary, sig long, hashes array<long>"
                ).select("*", *no_coords))
            policy = h._ddl_handler.policy if h._ddl_handler is not None else _evolve_all
            has_ddl = bool(ddl) or any(isinstance(r, DDLRecord) for r in state.held)
            job = _TableJob(rules, _ConfiguredKeys(cfg), h._catalog.to_json(), cfg.sink.source_timezone, policy,
                            cfg.case_sensitive, None if has_ddl else _DeltaColumnTypes(cfg),
                            {sig: pickle.loads(v) for found, _ in layouts.values() for sig, v in found.items()})
            # the tables whose rows take the columnar path (spark/columnar.py); the others the record path
            # (in a batch that applies no DDL: a DDL would cut a table's rows into segments)
            columnar = {} if rules.ddl_steps else columnar_tables(layouts, held_layouts, keys, h._catalog.params,
                                                                  cfg.sink.columnar_rows)
            record_rows = rows
            if columnar:
                record_rows = rows.filter(~F.concat_ws("\0", "schema", "table").isin(
                    *[f"{schema}\0{table}" for schema, table in columnar]))
            unsplit = set(columnar) | (_rekeyed(h._meta, keys) if staged_batch is not None else set())
            split = {ident: n for ident, n in _split_tables(spark, layouts, held_layouts, cfg.sink.split_rows,
                                                            keys).items() if ident not in unsplit}
            tables = set(layouts) | {(schema, table) for schema, table, _, _ in held_layouts or ()}
            if held_layouts is None or not tables <= set(columnar):  # rows of a table the record path takes
                out = self._group_rules(spark, record_rows, split, job).persist(StorageLevel.MEMORY_AND_DISK)
            typed = {ident: rows.filter((F.col("schema") == ident[0]) & (F.col("table") == ident[1]))
                     .select(*COLUMNAR_INPUT)
                     .mapInArrow(columnar_fn(job, table), _spark_schema(columnar_schema(table)))
                     .persist(StorageLevel.MEMORY_AND_DISK)
                     for ident, table in columnar.items()}
            persisted.extend(typed.values())
            # what the record path and the columnar path leave besides the changes they MERGE, in one frame
            side = _side_rows(out, typed)
            small = side.filter(F.col("kind").isin(*_SMALL_KINDS)).collect() if side is not None else []
            n_values = 0  # changes the value screen refused: they stay on the executors
            metas: dict[int, list[tuple[str, str, dict]]] = {}
            rows_rejected = 0  # rows the ts guard refused: they stay on the executors too
            replays, held = plan.replays_dropped, len(plan.state.held)
            held_by_table: dict[str, int] = {}
            next_layouts: dict[tuple[str, str], list[Any]] = {}  # the held rows' layouts, for the next batch
            table_metas: dict[tuple[int, str, str], dict] = {}
            for r in small:
                value = pickle.loads(r["payload"])
                if r["kind"] == "error":
                    raise TerminalError(f"batch {batch_id}: {value}")
                if r["kind"] == "meta":
                    _add_meta(table_metas, (r["seg"], r["schema"], r["table"]), value)
                elif r["kind"] == "summary":
                    replays += value["replays"]
                    held += value["held"]
                    n_values += value["rejections"]
                    plan.snapshot_dropped += value.get("snapshot_dropped", 0)
                    rows_rejected += value["rejected_ts"]
                    if value["held"]:
                        name = f"{r['schema']}.{r['table']}"
                        held_by_table[name] = held_by_table.get(name, 0) + value["held"]
                        found = next_layouts.setdefault((r["schema"], r["table"]), [set(), 0])
                        found[0].update(value["layouts"])
                        found[1] += value["held"]
            for (seg, schema, table), value in table_metas.items():
                metas.setdefault(seg, []).append((schema, table, value))
            if typed:  # the columnar path's final changes: collapsed by Spark (no DDL: one segment)
                for ident, meta in self._collapse_typed(typed, columnar, views, persisted).items():
                    metas.setdefault(0, []).append((*ident, meta))
            timings["plan"] = time.monotonic() - t_plan
            implausible = len(plan.rejected) + rows_rejected
            if implausible:
                self._dead_letter_implausible(batch_df, side, plan.rejected, implausible, batch_id)
            if n_values:
                self._dead_letter_values(side, n_values, batch_id)

            # 5. MERGE per table per segment, DDL between segments (after the previous batch's snapshot
            # warm-up, which ran while this batch was read, decoded and planned)
            self._join_warming()
            t_apply = time.monotonic()
            # the rows still held go to the staging table while the MERGEs run (another table, its own
            # idempotent transaction: it needs nothing from them, and the state comes after both)
            rows_held = held - len(plan.state.held)
            staging = self._stage_held(side, rows_held, batch_id) if rows_held and overlap else None
            try:
                if metas and out is not None:
                    # the MERGEs' threads read ``out`` through a global view (a DataFrame belongs to one
                    # session). Dropping a view uncaches its plan, which is ``out``'s: it is dropped last
                    # (below), after the staging append has read ``out`` too
                    view = f"ticdc_out_{uuid.uuid4().hex}"
                    out.createOrReplaceGlobalTempView(view)
                result, applier = self._apply(spark, view, metas, rules.ddl_steps, batch_id, seam)
            except BaseException:
                _settle(staging)  # nothing of this batch runs on once it fails
                raise
            timings["apply"] = time.monotonic() - t_apply

            # 6. the held rows' append ends, then the state
            t_state = time.monotonic()
            if staging is None and rows_held:
                staging = self._stage_held(side, rows_held, batch_id)
            if staging is not None:
                staging.result()
            from .batch_handler import next_state_meta  # the handler imports this module

            meta = next_state_meta(
                h._meta, plan, applier, result, offsets, query_id, engine="spark",
                totals={"replays_dropped": replays, "dead_letters": counts["error"] + n_values,
                        "dead_letter_values": n_values, "implausible_ts": implausible,
                        "snapshot_dropped": plan.snapshot_dropped},
            )
            meta["staging_batch"] = batch_id if rows_held else None
            meta["staging_app"] = h._app_id if rows_held else None
            meta["rows_held"] = rows_held
            meta["held_by_table"] = held_by_table  # for `status` (the rows are in the staging table)
            meta["held_layouts"] = [[schema, table, sorted(sigs), n]
                                    for (schema, table), (sigs, n) in sorted(next_layouts.items())]
            # the key each held table's staged rows were routed by (their ``hashes``; see _rekeyed)
            meta["held_keys"] = [[schema, table, keys(schema, table)] for schema, table in sorted(next_layouts)]
            h._mark_compactions(meta, applier.written_tables, bool(counts["error"] + n_values + implausible), batch_id)
            h._fault("before_state", batch_id)
            h.store.save(
                batch_id,
                PipelineState(batch_id, plan.state.watermarks, [dump_record(r) for r in plan.state.held], meta),
                app_id=h._app_id,
            )
            h._state = replace(plan.state, held=list(plan.state.held))
            h._meta, h._loaded_batch = meta, batch_id
            h.batches += 1
            timings["state"] = time.monotonic() - t_state
            h._fault("after_state", batch_id)
            if rows_held and not self._staging_tuned:
                self._tune_staging(spark)
            # now and then; batch 0 too, the first after a reset (the old epoch's rows are never read again);
            # before the compaction, which a batch watchdog may not let finish
            if staged_batch is not None and batch_id % 16 == 0:
                self._clean_staging(spark, meta["staging_batch"], meta["staging_app"])
            # small-file compaction of the tables written (after the state: it never fails the batch)
            from .compaction import spark_compaction
            if self._compaction is None:
                self._compaction = spark_compaction(spark)
            timings["compact"] = h._compact(applier.written_tables, bool(counts["error"] + n_values + implausible),
                                            self._compaction, batch_id)
            progress = _Progress(dict(plan.topic_watermarks), held, replays, plan.snapshot_dropped,
                                 plan.watermark_regressions)
            h._progress(batch_id, offsets, counts, progress, result, counts["error"] + n_values,
                        time.monotonic() - started, timings, values=n_values, implausible=implausible,
                        split={f"{schema}.{table}": n for (schema, table), n in sorted(split.items())},
                        columnar=[f"{schema}.{table}" for schema, table in sorted(columnar)],
                        key_range=sorted(self._bounded))
            self._warm_snapshots(spark, [applier.sink.table_path(t.schema, t.table) for t in applier.written_tables]
                                 + ([self.staging] if rows_held else []))
        finally:
            for name in ([view] if view is not None else []) + views:
                spark.catalog.dropGlobalTempView(name)
            decoded.unpersist()
            for frame in ([out] if out is not None else []) + persisted:
                frame.unpersist()


    def _collapse_typed(self, typed: dict[tuple[str, str], Any], columnar: dict[tuple[str, str], ColumnarTable],
                        views: list[str], persisted: list[Any]) -> dict[tuple[str, str], dict]:
        """The columnar path's final changes per table (:func:`~.columnar.collapse_changes`, kept on the
        executors and reachable from the MERGE threads' sessions through a global view each, added to
        ``views``), and the meta of each table with any (one Spark job for all of them's counts)."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        finals = {}
        for ident, conv in typed.items():
            frame = collapse_changes(conv, columnar[ident], watermark=self.h.mode == WATERMARK)
            finals[ident] = frame.persist(StorageLevel.MEMORY_AND_DISK)
            persisted.append(finals[ident])
        counts = functools.reduce(lambda a, b: a.unionByName(b), [
            final_counts(frame, integer_keys(columnar[(schema, table)])).select(
                F.lit(schema).alias("schema"), F.lit(table).alias("table"), "*")
            for (schema, table), frame in finals.items()])
        metas = {}
        for r in counts.collect():
            if not r["rows"]:
                continue
            ident = (r["schema"], r["table"])
            table = columnar[ident]
            view = f"ticdc_final_{uuid.uuid4().hex}"
            finals[ident].createOrReplaceGlobalTempView(view)
            views.append(view)
            metas[ident] = {"keys": table.key, "col_types": [(n, (t, f)) for n, t, f in table.columns[:r["width"]]],
                            "rows": r["rows"], "deleted": r["deleted"], "last_ts": r["last_ts"],
                            "columnar": (view, table),
                            # each integer key column's range (None: it holds a null), for the key range
                            "ranges": {k: None if v is None else (int(v[0]), int(v[1]))
                                       for k, v in (r["ranges"] or {}).items()}}
        return metas

    def _group_rules(self, spark: Any, rows: Any, split: dict[tuple[str, str], int], job: _TableJob) -> Any:
        """The per-table rules over ``rows``: one group per table, or per (table, key bucket) for the
        ``split`` tables, whose buckets are each shuffled to a partition (a task) of their own."""
        if not split:
            return _with_buckets(rows, split).groupBy("schema", "table", "bucket").applyInArrow(_table_fn(job), _OUT_SCHEMA)
        from pyspark.sql import functions as F

        try:
            parts = int(spark.conf.get("spark.sql.shuffle.partitions"))
        except ValueError:  # Databricks' "auto"
            parts = _parallelism(spark)
        parts = max(parts, sum(split.values()))
        slots = self._slots.get(parts)
        if slots is None:
            # a value per partition that Spark's hash partitioning (Murmur3 of an int, pmod) sends there
            found: dict[int, int] = {}
            for r in (spark.range(0, 64 * parts).select(F.col("id").cast("int").alias("v"))
                      .select("v", F.pmod(F.hash("v"), F.lit(parts)).alias("p")).collect()):
                found.setdefault(r["p"], r["v"])
            slots = self._slots[parts] = [found[j] for j in sorted(found)]
        return (_with_buckets(rows, split, slots).repartition(parts, "slot")
                .groupBy("slot", "schema", "table", "bucket").applyInArrow(_table_fn(job), _OUT_SCHEMA))

    def _append_dead_letters(self, rows: Any, kind: str, batch_id: int) -> None:
        """Append ``rows`` to the dead-letter table in its layout: the columns of
        :data:`~ticdc_delta.spark.batch_handler.DEAD_LETTER_SCHEMA` that ``rows`` has, ``batch_id`` and
        ``recorded_at`` set here, null for the rest. The transaction is the ``delta-rs`` engine's,
        ``(changefeed + kind, N·1024)``, so a changefeed that changes engines skips nothing."""
        from pyspark.sql import functions as F

        from ..delta.sink import batch_txn
        from .batch_handler import DEAD_LETTER_SCHEMA

        fixed = {"batch_id": F.lit(batch_id).cast("long"), "recorded_at": F.current_timestamp()}
        cols = []
        for f in DEAD_LETTER_SCHEMA:
            if f.name in fixed:
                col = fixed[f.name]
            elif f.name in rows.columns:
                col = F.col(f.name)
            else:
                col = F.lit(None).cast("binary" if pa.types.is_binary(f.type) else "string")
            cols.append(col.alias(f.name))
        self._append(rows.select(*cols), self.cfg.dead_letter_path, batch_txn(self.h._app_id + kind, batch_id),
                     merge_schema=True)

    def _dead_letter_errors(self, decoded: Any, n: int, batch_id: int) -> None:
        from pyspark.sql import functions as F

        errors = decoded.filter(F.col("kind") == "error")
        if self.cfg.dead_letter.fail_on_error:
            first = errors.select("error").first()["error"]
            raise DecodeError(
                self.cfg.source.protocol,
                f"{n} undecodable message(s) in batch {batch_id} and dead_letter.fail_on_error is set; first: {first}",
            )
        self._append_dead_letters(errors.select("topic", "partition", "offset", "key", "value", "error"),
                                  "/dead-letter", batch_id)
        log.warning("batch %d: %d undecodable message(s) sent to %s", batch_id, n, self.cfg.dead_letter_path)

    def _dead_letter_implausible(self, batch_df: Any, out: Any, marks: list[Any], n: int, batch_id: int) -> None:
        """The ``n`` events with an implausible ts — ``marks`` (resolved marks and DDL, from the driver's
        plan) and the rows the executors' guard refused (in ``out``) — appended to the dead-letter table
        with their original messages, from the executors (the ``delta-rs`` engine's rows and transaction,
        ``(changefeed/dead-letter-ts, N·1024)``: one row per message, with its first event's reason).

        Raises:
            ImplausibleTimestampError: ``dead_letter.fail_on_error`` is set (before anything of the batch is
                committed), naming the first of them.
        """
        from pyspark.sql import functions as F

        from .batch_handler import implausible_ts_error

        spark = batch_df.sparkSession
        events = out.filter(F.col("kind") == "rejected_ts").select("payload").mapInArrow(_rejected_ts_fn,
                                                                                          _REJECTED_TS_SCHEMA)
        if marks:
            events = events.unionByName(spark.createDataFrame(
                [(r.topic, r.partition, r.offset, r.idx, r.reason) for r in marks], _REJECTED_TS_SCHEMA))
        first = events.orderBy("topic", "partition", "offset", "idx").first()
        where = f"{first['topic']}[{first['partition']}]@{first['offset']}"
        if self.cfg.dead_letter.fail_on_error:
            raise implausible_ts_error(batch_id, n, where, first["reason"])
        coords = ["topic", "partition", "offset"]
        per_message = events.groupBy(*coords).agg(F.min_by("reason", "idx").alias("error"))
        rows = per_message.join(batch_df.select(*coords, "key", "value"), coords, "left")
        self._append_dead_letters(rows, "/dead-letter-ts", batch_id)
        log.warning("batch %d: %d event(s) with an implausible ts sent to %s; first at %s: %s",
                    batch_id, n, self.cfg.dead_letter_path, where, first["reason"])

    def _dead_letter_values(self, out: Any, n: int, batch_id: int) -> None:
        """The ``n`` changes the value screen refused, appended to the dead-letter table from the executors
        (the ``delta-rs`` engine's rows and transaction, ``(changefeed/dead-letter-values, N·1024)``); to
        the driver come only the first five, for the messages.

        Raises:
            UnwritableValueError: ``dead_letter.fail_on_error`` is set (before anything of the batch is
                committed), naming the first five and how many more.
        """
        from pyspark.sql import functions as F

        from ..delta.value_check import describe_rejections
        from ..errors import UnwritableValueError

        rows = out.filter(F.col("kind") == "rejection").select("payload").mapInArrow(_dead_values_fn(),
                                                                                      _DEAD_VALUES_SCHEMA)
        first = [pickle.loads(r["payload"]) for r in rows.orderBy("order_ts", "topic", "partition", "offset", "idx")
                 .select("payload").limit(5).collect()]

        def describe(limit: int) -> str:
            more = f"; … and {n - limit} more" if n > limit else ""
            return describe_rejections(first[:limit], limit) + more

        if self.cfg.dead_letter.fail_on_error:
            raise UnwritableValueError(
                f"batch {batch_id}: {n} change(s) with a value no Delta column can hold and "
                f"dead_letter.fail_on_error is set: {describe(5)}"
            )
        self._append_dead_letters(rows, "/dead-letter-values", batch_id)
        log.warning("batch %d: %d change(s) with a value no Delta column can hold sent to %s: %s",
                    batch_id, n, self.cfg.dead_letter_path, describe(3))

    def _clean_staging(self, spark: Any, keep_batch: int | None, keep_app: str | None) -> None:
        """Delete the staging rows no batch will read again: all but those of ``(keep_batch, keep_app)``,
        the rows the next batch reads (none: ``None``). Other epochs' rows (before a ``reset``) go too.
        Then remove every file the latest version does not use (a full VACUUM, no retention: also the
        empty files Delta's DELETE leaves uncommitted): only the next batch reads the table, at its latest
        version, so a job triggered every second does not leave ~86k files a day."""
        from delta.tables import DeltaTable
        from deltalake import DeltaTable as RsTable
        from pyspark.sql import functions as F

        stale = F.lit(True) if keep_batch is None else ~(
            (F.col("held_at") == int(keep_batch)) & F.col("app").eqNullSafe(F.lit(keep_app)))
        try:
            self._retry("clean staging", lambda: DeltaTable.forPath(spark, self.staging).delete(stale))
            RsTable(self.staging, storage_options=self.cfg.sink.storage_options or None).vacuum(
                retention_hours=0, dry_run=False, enforce_retention_duration=False, full=True)
        except Exception as exc:  # noqa: BLE001 - housekeeping: the next clean-up tries again
            log.warning("could not clean the staging table %s: %s", self.staging, str(exc).splitlines()[0][:200])

    # --- applying ---------------------------------------------------------------------------------------

    def _apply(self, spark: Any, view: str | None, metas: dict[int, list[tuple[str, str, dict]]],
               ddl_steps: tuple[DDLRecord, ...], batch_id: int,
               seam: SnapshotSeam | None = None) -> tuple[ApplyResult, DeltaApplier]:
        from .batch_handler import written_locations  # the handler imports this module

        h = self.h
        # table creation and DDL with Delta Lake's own operations (column mapping, ALTER TABLE)
        sink = SparkDeltaSink(h.sink, spark, type_widening=self.cfg.sink.type_widening,
                              column_mapping=self.cfg.sink.column_mapping, retry=self._retry,
                              stats=self.cfg.sink.merge_key_range_rows > 0)
        applier = DeltaApplier(
            sink, h._app_id, catalog=h._catalog, table_options=h._table_options,
            metadata_columns=((self.cfg.sink.metadata_columns.commit_ts, self.cfg.sink.metadata_columns.op)
                              if self.cfg.sink.metadata_columns else None),
            source_timezone=self.cfg.sink.source_timezone, ddl_handler=h._ddl_handler,
            case_sensitive=self.cfg.case_sensitive, journal=h.journal, seam=seam,
            written=written_locations(h._meta), known=written_locations(h._meta, earlier=True),
        )
        applier.check_steps(batch_id, [[TableIdent(s, t) for s, t, _ in metas.get(seg, [])]
                                       for seg in range(len(ddl_steps) + 1)], ddl_steps)
        skip, result = applier.begin(batch_id, ddl_steps)
        merged = [False]
        for seg in range(len(ddl_steps) + 1):
            if seg < skip:
                continue  # this segment's rows and its DDL were committed by the first attempt
            tasks = []
            # the rows before the DDL the batch resumes at were committed by the first attempt
            rows = metas.get(seg, []) if seg > skip else []
            for schema, table, meta in sorted(rows, key=lambda m: (m[0], m[1])):
                task = self._prepare(applier, schema, table, meta, seg, batch_id)
                if task is not None:
                    tasks.append(task)
                    result.count(f"{schema}.{table}", meta["rows"], meta["deleted"], meta["last_ts"])
            # every table's schema work (its commits among them) comes before the MERGEs run: the MERGEs take
            # their steps after all of it, or a later table's schema commit to a location tables share
            # (shards) would take a step past an earlier one's MERGE, which Delta would then skip as committed
            for task in tasks:
                task["txn"] = applier.next_txn(task["ident"], batch_id)
            if tasks:
                self._merge_all(spark, view, tasks, merged, batch_id)
            if seg < len(ddl_steps):
                applier.apply_ddl(ddl_steps[seg], seg, skip, batch_id, result)
        return result, applier

    def _prepare(self, applier: DeltaApplier, schema: str, table: str, meta: dict, seg: int,
                 batch_id: int) -> dict | None:
        """The target table's schema work on the driver (as the ``delta-rs`` applier does it: create,
        add the columns the images carry, widen drifted types) and the MERGE to run, or ``None``."""
        opts = applier.options(schema, table)
        if not opts.enabled:
            return None
        ident = TableIdent(schema, table)
        col_types: dict[str, tuple[int, int]] = dict(meta["col_types"])
        upserts = meta["rows"] > meta["deleted"]
        have = applier.prepare_table(ident, col_types, upserts, opts, batch_id)
        if have is None:
            return None  # deletes for a table we never had: nothing to delete
        mc = applier.metadata_columns
        keys = list(meta["keys"])
        names = list(col_types) if upserts else keys
        fields = []
        for name in names:
            t, f = col_types[name]
            fields.append((name, have.get(name.lower(), name), t, f, applier.catalog.params(schema, table, name)))
        arrow_fields = [pa.field(target, arrow_type_for(t, f, params)) for _, target, t, f, params in fields]
        if mc and upserts:
            arrow_fields += [pa.field(mc[0], pa.int64()), pa.field(mc[1], pa.string())]
        arrow_fields.append(pa.field(OP_COLUMN, pa.string()))
        columnar = None
        if "columnar" in meta:  # the final changes' view, and which of its c<i> is which target column
            view, typed = meta["columnar"]
            at = {c[0]: i for i, c in enumerate(typed.columns)}
            columnar = (view, [(at[src], f.name, f.type) for (src, _, _, _, _), f in zip(fields, arrow_fields)])
        least = self.cfg.sink.merge_key_range_rows
        facts = applier.sink.table_facts(ident) if least > 0 else None
        parts = {c.lower() for c in applier.sink.partition_columns(ident)}
        types = {f.name: f.type for f in arrow_fields}
        return {
            "ident": ident, "seg": seg, "path": applier.sink.table_path(schema, table),
            "fields": [(src, src, t, f, p) for src, _, t, f, p in fields], "arrow": pa.schema(arrow_fields),
            "keys": [have.get(k.lower(), k) for k in keys], "upserts": upserts, "meta": mc,
            # a text partition column of the key: '' and NULL are one value there (see _merge)
            "text_parts": [have.get(k.lower(), k) for k in keys if k.lower() in parts
                           and pa.types.is_string(types.get(have.get(k.lower(), k), pa.null()))],
            "columnar": columnar,  # (and "txn", once every table of the segment is prepared: _apply)
            # the target's files, for the key range (_key_range) of a table big enough for it to pay, and
            # the integer key ranges found as the changes were collapsed (no Spark job for them)
            "key_range": facts.files if facts is not None and (facts.rows or 0) >= least else None,
            "ranges": {have.get(k.lower(), k): r for k, r in meta.get("ranges", {}).items()},
        }

    def _merge_all(self, spark: Any, view: str | None, tasks: list[dict], merged: list[bool], batch_id: int) -> None:
        # the MERGEs into one location (upstream tables the config maps to one path) run one after another
        # in the order of their steps: Delta skips a transaction whose version is not above the last one
        # committed for the app id, so a later step committed first would make an earlier one a no-op
        groups: dict[str, list[dict]] = {}
        for task in tasks:
            groups.setdefault(task["path"], []).append(task)
        threads = min(self.cfg.sink.merge_threads, len(groups))
        if threads <= 1:
            for task in tasks:
                self._merge(spark, view, task)
                self._after_merge(merged, batch_id)
            return

        def run(group: list[dict]) -> None:
            session = getattr(self._sessions, "session", None)
            if session is None:
                session = self._sessions.session = own_session(spark)
                # a pool per thread: under spark.scheduler.mode FAIR a small table's MERGE gets cores next
                # to a busy table's instead of waiting behind its tasks (FIFO ignores pools)
                spark.sparkContext.setLocalProperty(SCHEDULER_POOL_PROPERTY, threading.current_thread().name)
            for task in group:
                self._merge(session, view, task)

        # The threads, and so their sessions, live as long as the job: with new threads for every batch, the
        # driver's JVM kept every batch's new sessions (measured: one more live session per merge thread
        # per batch, never freed) and its heap grew with the number of batches.
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.cfg.sink.merge_threads, thread_name_prefix="ticdc-merge")
        futures = [self._pool.submit(run, g) for g in groups.values()]
        errors = []
        for fut in futures:
            try:
                fut.result()
            except BaseException as exc:  # noqa: BLE001 - re-raised below, first one wins
                errors.append(exc)
        if errors:
            raise errors[0]
        self._after_merge(merged, batch_id)

    def _after_merge(self, merged: list[bool], batch_id: int) -> None:
        if not merged[0]:
            merged[0] = True
            self.h._fault("after_merge", batch_id)

    def _merge(self, session: Any, view: str | None, task: dict) -> None:
        """One ``DeltaTable.merge`` of a table's final changes of one segment, with its app transaction in
        the session's ``txnAppId``/``txnVersion`` confs (Delta skips it when already committed)."""
        from delta.tables import DeltaTable
        from pyspark import StorageLevel
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_schema

        ident = task["ident"]
        arrow: pa.Schema = task["arrow"]
        hook = MERGE_SOURCE_HOOK
        on_read = None if hook is None else functools.partial(
            hook, task["path"], "records" if task["columnar"] is None else "columnar")
        # the columnar path's final changes are typed and kept already; the record path's are converted here
        converted = task["columnar"] is None
        if not converted:
            final_view, targets = task["columnar"]
            source = merge_source(session.table(f"global_temp.{final_view}"), targets,
                                  task["meta"] if task["upserts"] else None)
        else:
            source = (session.table(f"global_temp.{view}")
                      .filter((F.col("kind") == "change") & (F.col("schema") == ident.schema)
                              & (F.col("table") == ident.table) & (F.col("seg") == task["seg"]))
                      .select("payload")
                      .mapInArrow(_typed_fn(task["fields"], task["meta"], task["upserts"],
                                            self.cfg.sink.source_timezone, arrow),
                                  from_arrow_schema(arrow, prefer_timestamp_ntz=True)))
        columns = [f.name for f in arrow if f.name != OP_COLUMN]
        # A text partition column of the key compares '' and NULL alike: Delta's partition values cannot
        # hold '' (Spark writes it as null; a table delta-rs wrote reads it back as '' until rewritten), so
        # either of them in the target must match either in the source. Its range does not bound the MERGE.
        text_parts = task.get("text_parts", [])
        cond = F.expr(" AND ".join(f"coalesce(t.{_quote(k)}, '') <=> coalesce(s.{_quote(k)}, '')" if k in text_parts
                                   else f"t.{_quote(k)} <=> s.{_quote(k)}" for k in task["keys"]))
        op = f"s.{_quote(OP_COLUMN)}"
        assign: dict[str, Any] = {_quote(c): f"s.{_quote(c)}" for c in columns}  # (str | Column)
        txn: Txn = task["txn"]

        def attempt() -> None:
            session.conf.set(TXN_APP_ID_CONF, txn.app_id)
            session.conf.set(TXN_VERSION_CONF, str(txn.version))
            ours = session.conf.get(MATERIALIZE_SOURCE_CONF, None) is None  # a value the user set stays
            if ours:
                session.conf.set(MATERIALIZE_SOURCE_CONF, "none")
            # Delta reads a MERGE's source twice (the files it touches, then the rows it writes): the
            # converted rows are kept after the first read instead of converted again
            cached = source.persist(StorageLevel.MEMORY_AND_DISK) if converted else source
            try:
                bounds = ([] if task["key_range"] is None else
                          _key_range(cached, [k for k in task["keys"] if k not in text_parts], task["key_range"],
                                     self.cfg.sink.merge_key_range_rows,
                                     task["ranges"]))
                narrowed = functools.reduce(lambda a, b: a & b, bounds, cond)
                if bounds:
                    self._bounded.add(f"{ident.schema}.{ident.table}")  # (a set: the threads' adds are atomic)
                read = cached if on_read is None else cached.mapInArrow(_calling(on_read), cached.schema)
                (DeltaTable.forPath(session, task["path"]).alias("t").merge(read.alias("s"), narrowed)
                 .whenMatchedDelete(f"{op} = '{OP_DELETE}'")
                 .whenMatchedUpdate(f"{op} = '{OP_UPSERT}'", assign)
                 .whenNotMatchedInsert(f"{op} = '{OP_UPSERT}'", assign)
                 .execute())
            finally:
                if converted:
                    cached.unpersist()
                session.conf.unset(TXN_APP_ID_CONF)
                session.conf.unset(TXN_VERSION_CONF)
                if ours:
                    session.conf.unset(MATERIALIZE_SOURCE_CONF)

        self._retry(f"merge into {ident.schema}.{ident.table}", attempt)
