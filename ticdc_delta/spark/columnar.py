"""The ``spark`` engine's columnar path: a table's rows as typed columns, collapsed per key by Spark itself.

The record path (:func:`~ticdc_delta.spark.engine._table_fn`) runs every rule of a table in one Python
function per table (or key bucket): the rows are shuffled to it as pickled records, the final changes
leave it as pickles again, and the MERGE converts them to the table's types in one more Python pass. Most
of a micro-batch's time went there. Yet every rule but the collapse decides each row alone
(:meth:`~ticdc_delta.core.table_rules.TableRules.place`, the value screen), and the collapse — the last
change of each key in apply order, an update that changes the key deleting the old one — is a ``max``
per key, which Spark computes without Python. So for a table whose rows allow it:

1. one Python pass per row, where the decoded rows are (no shuffle): the row is placed by its columns
   (:meth:`~ticdc_delta.core.table_rules.TableRules.placer`: released, held, replay, covered by the
   snapshot, implausible ts; a dropped row is never unpickled), and the released ones' values are
   screened and converted a column at a time
   (:meth:`~ticdc_delta.delta.value_check.ValueScreen.images_converter`: the screen's checks convert as
   they check, to what the MERGE writes) into the table's typed columns — two rows for an update that
   changes the key (the old key's delete, the new key's upsert); held rows keep their record for the
   staging table, refusals their reason;
2. :func:`collapse_changes`: ``groupBy(key).max(struct(apply order, row))`` in the JVM;
3. the collapsed rows are the MERGE's source as they are (no Python in the MERGE).

Which tables: :func:`columnar_tables` — in a batch that applies no DDL (a DDL would cut the rows into
segments and may change type parameters between them), a table with ``sink.columnar_rows`` rows or more
whose records' layouts are all known and
:func:`~ticdc_delta.core.key_buckets.splittable` (every image names the same key, a column keeps one type,
the images' columns are prefixes of one order — so a row's outcome depends on no other row, and every
image's values sit at the same positions of one column list). Any other table takes the record path;
both give the same final changes (``tests/spark/test_columnar.py``, the engines' parity tests).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import pyarrow as pa

from ..codec.model import Op
from ..core.key_buckets import Layout, Router, splittable
from ..core.merge import flagged_key, spell_key
from ..core.records import ChangeRecord, dump_record, gc_paused, record_of_values, row_values
from ..core.table_rules import HELD, RELEASED, REPLAY, SNAPSHOT
from ..delta.arrow_types import arrow_type_for
from ..delta.sink import OP_COLUMN, OP_DELETE, OP_UPSERT
from ..errors import SinkError

__all__ = ["ColumnarTable", "columnar_tables", "columnar_schema", "columnar_fn", "collapse_changes",
           "final_counts", "integer_keys", "merge_source", "CHANGE", "SMALL_KINDS", "COORDS", "INPUT_COLUMNS"]

CHANGE = "change"
"""The ``_kind`` of a typed change (the other kinds carry a ``_payload``: ``held``, ``rejection``,
``rejected_ts``, ``summary``, ``error``, as the record path's rows do)."""
REJECTION = "rejection"
"""The ``_kind`` of a change the value screen refused (``_payload``: the pickled
:class:`~ticdc_delta.delta.value_check.Rejection`)."""
COORDS = ("commit_ts", "topic", "partition", "offset", "idx")
"""A new row's coordinates: columns of the decoded frame, the fields its :class:`ChangeRecord` starts with
(with its folded names, :data:`~ticdc_delta.core.records.Coords`)."""
INPUT_COLUMNS = ("held", "payload", "sig", *COORDS)
"""The columns :func:`columnar_fn` reads: the record path's ``held``, ``payload`` and ``sig``, and a new row's
coordinates (null for a held row: its record holds them), which place it without unpickling it."""
SMALL_KINDS = ("summary", "error")
"""The kinds the driver collects (one ``summary`` per Arrow batch: counts and held layouts)."""

_META = pa.schema([
    ("_kind", pa.string()), ("_commit_ts", pa.int64()), ("_topic", pa.string()), ("_partition", pa.int32()),
    ("_offset", pa.int64()), ("_idx", pa.int32()), ("_op", pa.string()), ("_source_op", pa.string()),
    ("_width", pa.int32()), ("_payload", pa.binary()), ("_sig", pa.int64()), ("_hashes", pa.list_(pa.int64())),
])


@dataclass(frozen=True)
class ColumnarTable:
    """One table of the columnar path (picklable, sent to the executors): its (folded) name, its columns
    in the order every image lists a prefix of — ``(name, type code, flags)`` — their Delta (Arrow) types,
    and the key (its columns' positions in ``columns``; ``None`` when an image lacks one: every released
    row is then a :class:`~ticdc_delta.core.merge.MissingKeyError`, as in the record path)."""

    schema: str
    table: str
    columns: tuple[tuple[str, int, int], ...]
    types: tuple[pa.DataType, ...]
    key: tuple[str, ...]

    @property
    def key_at(self) -> tuple[int, ...] | None:
        names = [c[0] for c in self.columns]
        return tuple(names.index(k) for k in self.key) if all(k in names for k in self.key) else None


def columnar_tables(layouts: Mapping[tuple[str, str], Sequence[Any]], held: Sequence[Any] | None,
                    keys: Callable[[str, str], Sequence[str] | None],
                    params: Callable[[str, str, str], Any], min_rows: int) -> dict[tuple[str, str], ColumnarTable]:
    """The tables of a batch that applies no DDL that take the columnar path: those with at least ``min_rows`` rows
    (``sink.columnar_rows``; 0: none) whose records' layouts — of the new rows (``layouts``: table ->
    ``[{signature: pickled`` :data:`~ticdc_delta.core.key_buckets.Layout` ``}, rows]``, from the decoder's
    ``LAYOUT`` rows) and of the held ones (``held``: ``[schema, table, signatures, rows]`` entries; ``None``:
    rows held without their layouts, so none) — are all known and
    :func:`~ticdc_delta.core.key_buckets.splittable`. A smaller table takes the record path, whose one
    Python task serves every small table of the batch at once. ``keys``: the configured key of a table (the
    YAML mapping); ``params``: its columns' type parameters (the job's catalog)."""
    if held is None or min_rows <= 0:
        return {}
    held_tables: dict[tuple[str, str], list[Any]] = {}
    for schema, table, sigs, n in held:
        found = held_tables.setdefault((schema, table), [set(), 0])
        found[0].update(sigs)
        found[1] += n
    out = {}
    for (schema, table), (found, n) in layouts.items():
        held_sigs, held_rows = held_tables.get((schema, table), (set(), 0))
        if n + held_rows < min_rows or not held_sigs <= set(found):
            continue  # a small table, or held rows of a layout no new row has (unknown here)
        decoded: list[Layout] = [pickle.loads(v) for v in found.values()]
        override = keys(schema, table)
        if not splittable(decoded, override):
            continue
        columns = max((image for lay in decoded for image in lay), key=len)
        key = spell_key(override, columns) if override else flagged_key(columns)
        if key is None:
            continue
        types = tuple(arrow_type_for(t, f, params(schema, table, name)) for name, t, f in columns)
        out[(schema, table)] = ColumnarTable(schema, table, tuple(columns), types, key)
    return out  # (a table with only held rows is not in ``layouts``: the record path)


def columnar_schema(table: ColumnarTable) -> pa.Schema:
    """The rows of :func:`columnar_fn`: the meta columns, then ``c0``, ``c1``, ... typed as the table's
    columns (positional names: a column's own name may be anything)."""
    return pa.schema([*_META, *(pa.field(f"c{i}", t) for i, t in enumerate(table.types))])


def columnar_fn(job: Any, table: ColumnarTable) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of one table's rows (:data:`INPUT_COLUMNS`: the decoder's rows travel
    as their values and coordinates, the held ones as whole records): per row its place
    (:meth:`~ticdc_delta.core.table_rules.TableRules.placer`); a released row screened and
    converted (``_kind`` :data:`CHANGE`: ``_op`` upsert or delete, the image's values in
    ``c0``... up to its ``_width``, the rest null), a held row with its record and routing for the staging
    table, a refused one with its reason; per Arrow batch one ``summary`` row of counts. ``job``: the
    engine's per-batch rules (``rules``, ``keys``, ``catalog_json``, ``tz``, ``policy``, ``case_sensitive``,
    ``delta_types``, ``layouts``: the rows' layouts by signature).

    Every image of the table's rows lists a prefix of ``table.columns`` (:func:`columnar_tables` checked
    the layouts of all of them), so an image's values are the first ``len(image)`` columns."""
    schema = columnar_schema(table)
    n_cols = len(table.columns)
    key_at = table.key_at
    last_key = max(key_at, default=-1) if key_at is not None else n_cols
    folded = (table.schema, table.table)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from ..delta.applier import TableCatalog
        from ..delta.value_check import ValueScreen

        screen = ValueScreen(TableCatalog(job.catalog_json), job.tz, ddl_policy=job.policy,
                             case_sensitive=job.case_sensitive, delta_type=job.delta_types)
        convert = screen.images_converter(table.schema, table.table, table.columns, table.types)
        router = Router(job.keys)
        place = job.rules.placer(*folded)

        def rows_of(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, bool]:
            changes: list[tuple] = []  # the meta columns of each typed change, in _META's order
            images: list[tuple] = []  # its image's values (a prefix of the table's columns)
            owners: list[int] = []  # its row, in ``released``
            screened: list[tuple] = []  # the old images of the other updates: screened, not written
            screened_owners: list[int] = []
            released: list[tuple] = []  # (fields, whole, sig) of each released row: for a rejection
            others: list[tuple] = []  # the meta columns of the other output rows (no typed values)
            counts = {"replays": 0, "held": 0, "released": 0, "rejections": 0, "snapshot_dropped": 0,
                      "rejected_ts": 0}
            held_sigs: set[int] = set()
            for is_held, payload, sig, *coords in zip(*(batch.column(name).to_pylist() for name in INPUT_COLUMNS)):
                if is_held:  # a row from the staging table: its coordinates are in its record
                    fields, whole = row_values(payload)
                    fields = (*fields[:5], *folded, *fields[7:])  # (the names as the rules fold them)
                    coords = [*fields[:5]]
                    where = place(*coords, True)
                else:  # placed by its columns: a row that is dropped is never unpickled
                    where = place(*coords, False)
                    if where == RELEASED or where == HELD:
                        fields, whole = row_values(payload, (*coords, *folded))
                if where == RELEASED:
                    counts["released"] += 1
                    new, old = fields[8], fields[9]
                    image = new if new is not None else old
                    if image is None or len(image) <= last_key:
                        # no key: the job stops, unless a value no Delta column can hold refuses the row first
                        present = [i for i in (new, old) if i is not None]
                        if not convert(present)[1]:
                            return _record_batch(schema, [], [], [("error", *(None,) * 8, pickle.dumps(
                                _missing_key(fields, table.key)), None, None)]), False
                        screened += present  # refused below, as they are converted again
                        screened_owners += [len(released)] * len(present)
                        released.append((fields, whole, sig))
                        continue
                    row = len(released)
                    released.append((fields, whole, sig))
                    if new is None:
                        changes.append((CHANGE, *coords, OP_DELETE, Op.DELETE, len(old), None, None, None))
                        images.append(old)
                        owners.append(row)
                        continue
                    if old is not None:
                        if len(old) > last_key and any(old[i] != new[i] for i in key_at or ()):
                            # the key changed: the row under the old key is gone (core.merge.collapse)
                            changes.append((CHANGE, *coords, OP_DELETE, Op.DELETE, len(old), None, None, None))
                            images.append(old)
                            owners.append(row)
                        else:
                            screened.append(old)
                            screened_owners.append(row)
                    changes.append((CHANGE, *coords, OP_UPSERT, fields[7], len(new), None, None, None))
                    images.append(new)
                    owners.append(row)
                elif where == HELD:
                    counts["held"] += 1
                    rec = _whole(fields, whole, job.layouts, sig)
                    routing = router(rec)
                    held_sigs.add(routing.signature)
                    others.append(("held", *coords, None, None, 0, dump_record(rec), routing.signature, routing.hashes))
                elif where == SNAPSHOT:
                    counts["snapshot_dropped"] += 1
                elif where == REPLAY:
                    counts["replays"] += 1
                else:
                    counts["rejected_ts"] += 1
                    others.append(("rejected_ts", *coords, None, None, 0, pickle.dumps(where), None, None))
            # the values of all changes at once, a column at a time; a row with a value (or column) no Delta
            # column can hold is refused whole, as the record path's screen refuses it
            typed, failed = convert([*images, *screened])
            refused: dict[int, SinkError] = {}
            for i, exc in failed.items():
                refused.setdefault(owners[i] if i < len(images) else screened_owners[i - len(images)], exc)
            for row, exc in sorted(refused.items()):
                fields, whole, sig = released[row]
                counts["rejections"] += 1
                rejection = screen.check(_whole(fields, whole, job.layouts, sig))
                if rejection is None:  # the screen and the converter disagree: a bug
                    raise RuntimeError(f"{table.schema}.{table.table}: {exc}") from exc
                others.append((REJECTION, *fields[:5], None, None, 0, pickle.dumps(rejection), None, None))
            typed = [a.slice(0, len(images)) for a in typed]
            if refused:
                keep = pa.array([owner not in refused for owner in owners], type=pa.bool_())
                typed = [a.filter(keep) for a in typed]
                changes = [meta for meta, owner in zip(changes, owners) if owner not in refused]
            others.append(("summary", *(None,) * 8, pickle.dumps({**counts, "layouts": sorted(held_sigs)}), None, None))
            return _record_batch(schema, changes, typed, others), True

        for batch in batches:
            with gc_paused():
                out, ok = rows_of(batch)
            yield out
            if not ok:  # a row without its key: the driver stops the job with it
                return

    return run


def _record_batch(schema: pa.Schema, changes: list[tuple], typed: list[pa.Array], others: list[tuple]
                  ) -> pa.RecordBatch:
    """The output batch of :func:`columnar_fn`: the typed ``changes`` (their :data:`_META` columns, their
    values in ``typed``: one array per table column, empty when there are none), then the ``others``
    (meta columns only, their values null)."""
    meta = [*changes, *others]
    columns = list(zip(*meta)) if meta else [()] * len(_META)
    arrays = [pa.array(col, type=f.type) for col, f in zip(columns, schema)]
    for i, f in enumerate(list(schema)[len(_META):]):
        nulls = pa.nulls(len(others), f.type)
        arrays.append(pa.concat_arrays([typed[i], nulls]) if changes else nulls)  # (then meta is others)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _whole(fields: tuple[Any, ...], whole: ChangeRecord | None, layouts: Mapping[int, Layout], sig: int | None,
           ) -> ChangeRecord:
    """The :class:`ChangeRecord` of a row's :func:`~ticdc_delta.core.records.row_values` ``fields`` (its
    names folded): ``whole`` (the record the bytes held) with those names, or the record built from the
    row's layout (``layouts[sig]``)."""
    if whole is not None:
        return whole._replace(schema=fields[5], table=fields[6])
    return record_of_values(fields, layouts.get(sig))  # type: ignore[arg-type]


def _missing_key(fields: tuple[Any, ...], key: tuple[str, ...]) -> str:
    """The text of :func:`~ticdc_delta.core.merge.collapse`'s ``MissingKeyError`` for a row
    (:func:`~ticdc_delta.core.records.row_values`' ``fields``: an image without a key column, or no image
    at all)."""
    schema, table, new, old = fields[5], fields[6], fields[8], fields[9]
    if new is None and old is None:
        return f"{schema}.{table}: a row change without any column image"
    what = "delete image" if new is None else "row image"
    return f"{schema}.{table}: {what} lacks key columns {key}"


def collapse_changes(conv: Any, table: ColumnarTable, *, watermark: bool) -> Any:
    """The final change per key of the typed changes in ``conv`` (:func:`columnar_fn`'s rows): the last in
    apply order — commit ts (watermark mode), then topic, partition, offset and position in the message —
    as :func:`~ticdc_delta.core.merge.collapse` keeps it; computed by Spark, no Python: the ``max`` per key
    of a struct that starts with the apply order (unique per key: one Kafka message holds a key's change
    once, so the values after it never decide). Columns: the key's ``c<i>``, then the other ``c<i>`` and
    ``_op``, ``_source_op``, ``_commit_ts``, ``_width``."""
    from pyspark.sql import functions as F

    key_at = table.key_at or ()
    keys = [f"c{i}" for i in key_at]
    rest = [f"c{i}" for i in range(len(table.columns)) if i not in key_at]
    order: list[Any] = [*([F.coalesce(F.col("_commit_ts"), F.lit(0)).alias("_ts")] if watermark else []),
             "_topic", "_partition", "_offset", "_idx"]
    last = F.max(F.struct(*order, *rest, "_op", "_source_op", "_commit_ts", "_width"))
    return (conv.filter(F.col("_kind") == CHANGE).groupBy(*keys).agg(last.alias("_last"))
            .select(*keys, *(F.col(f"_last.{c}") for c in [*rest, "_op", "_source_op", "_commit_ts", "_width"])))


def final_counts(finals: Any, keys: Sequence[tuple[str, str]] = ()) -> Any:
    """One row of :func:`collapse_changes`' result: ``rows``, ``deleted``, ``last_ts`` (the largest commit
    ts), ``width`` (the most columns an image of them holds: the table's columns the MERGE writes) and
    ``ranges``: for each of ``keys`` (``(name, column)``, the integer key columns, :func:`integer_keys`) its
    least and greatest value as text, or null when one of its values is null — the MERGE's key range
    without a Spark job of its own."""
    from pyspark.sql import functions as F

    entries = []
    for name, column in keys:
        col = F.col(column)
        entries += [F.lit(name), F.when(F.count(col) == F.count(F.lit(1)),
                                        F.array(F.min(col).cast("string"), F.max(col).cast("string")))]
    return finals.agg(F.count(F.lit(1)).alias("rows"),
                      F.coalesce(F.sum(F.when(F.col("_op") == OP_DELETE, 1).otherwise(0)), F.lit(0)).alias("deleted"),
                      F.max("_commit_ts").alias("last_ts"), F.coalesce(F.max("_width"), F.lit(0)).alias("width"),
                      F.create_map(*entries).cast("map<string,array<string>>").alias("ranges"))


def integer_keys(table: ColumnarTable) -> list[tuple[str, str]]:
    """The key columns of ``table`` whose Delta type holds integers (``int64``, BIGINT UNSIGNED's
    ``decimal(20,0)``), as ``(name, column of collapse_changes' result)``."""
    at = {c[0]: i for i, c in enumerate(table.columns)}
    return [(k, f"c{at[k]}") for k in table.key if k in at and (
        pa.types.is_integer(t := table.types[at[k]]) or pa.types.is_decimal(t) and t.scale == 0)]


def merge_source(finals: Any, targets: Iterable[tuple[int, str, Any]], meta: tuple[str, str] | None) -> Any:
    """The MERGE's source from :func:`collapse_changes`' rows: column ``c<i>`` as ``name``, cast to the
    Spark type of the table's column (``targets``: ``(i, name, Arrow type)``; the same type but where the
    target table's differs), the metadata columns (``meta``: the commit ts and op columns' names) and
    :data:`~ticdc_delta.delta.sink.OP_COLUMN`."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_type

    cols = [F.col(f"c{i}").cast(from_arrow_type(t, prefer_timestamp_ntz=True)).alias(name) for i, name, t in targets]
    if meta:
        cols += [F.col("_commit_ts").alias(meta[0]), F.col("_source_op").alias(meta[1])]
    return finals.select(*cols, F.col("_op").alias(OP_COLUMN))
