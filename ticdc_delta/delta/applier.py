"""Apply a planned micro-batch to the Delta tables: MERGE the collapsed rows, replay DDL.

The applier turns the steps of a :class:`~ticdc_delta.core.batch_planner.BatchPlan` into sink calls, each
carrying the batch's Delta app transaction (:func:`~ticdc_delta.delta.sink.batch_txn`), so re-running a
batch that crashed half-way commits only what the first attempt did not.

What the applier knows of each table (:class:`TableCatalog`) — column type parameters a DDL gave
(DECIMAL precision/scale, ENUM/SET members, fsp) — is saved with the job state so it survives restarts.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import pyarrow as pa

from ..core.batch_planner import RowsStep
from ..core.merge import DELETE, TableChanges
from ..core.records import DDLRecord
from ..core.snapshot_seam import SnapshotSeam
from .arrow_types import TypeParams, arrow_field_for, arrow_type_for, common_type, converter_for
from .ddl_journal import DDLJournal, JournalEntry
from .sink import OP_COLUMN, OP_DELETE, OP_UPSERT, STEPS_PER_BATCH, TableIdent, TableSink, Txn, batch_txn
from ..errors import ConfigError, IdentifierError, SinkError, TableMissingError, TerminalError

__all__ = ["TableCatalog", "ApplyResult", "DeltaApplier", "METADATA_COMMIT_TS", "METADATA_OP"]

log = logging.getLogger(__name__)

METADATA_COMMIT_TS = "_tidb_commit_ts"
METADATA_OP = "_tidb_op"


class TableCatalog:
    """Per upstream table: type parameters of its columns known from DDL (JSON-able for the state)."""

    def __init__(self, data: Mapping[str, Any] | None = None, *, fold_names: bool = False) -> None:
        # fold_names: a state saved before names were folded (``case_sensitive: false``) may hold
        # "Shop\x00Orders"; the job now looks tables up as "shop\x00orders"
        self._params: dict[str, dict[str, TypeParams]] = {}
        for table, cols in (data or {}).items():
            if fold_names:
                table = table.lower()
            self._params[table] = {
                name: TypeParams(p.get("precision"), p.get("scale"),
                                 tuple(p["members"]) if p.get("members") is not None else None, p.get("fsp"),
                                 p.get("float32"))
                for name, p in cols.items()
            }

    @staticmethod
    def _key(schema: str, table: str) -> str:
        return f"{schema}\x00{table}"

    def params(self, schema: str, table: str, column: str) -> TypeParams | None:
        return self._params.get(self._key(schema, table), {}).get(column.lower())

    def set_params(self, schema: str, table: str, column: str, params: TypeParams) -> None:
        if params != TypeParams():
            self._params.setdefault(self._key(schema, table), {})[column.lower()] = params

    def drop_table(self, schema: str, table: str) -> None:
        self._params.pop(self._key(schema, table), None)

    def drop_column(self, schema: str, table: str, column: str) -> None:
        self._params.get(self._key(schema, table), {}).pop(column.lower(), None)

    def rename_column(self, schema: str, table: str, old: str, new: str) -> None:
        cols = self._params.get(self._key(schema, table), {})
        if old.lower() in cols:
            cols[new.lower()] = cols.pop(old.lower())

    def copy_table(self, source: tuple[str, str], target: tuple[str, str]) -> None:
        cols = self._params.get(self._key(*source))
        if cols:
            self._params[self._key(*target)] = dict(cols)

    def rename_table(self, old: tuple[str, str], new: tuple[str, str]) -> None:
        cols = self._params.pop(self._key(*old), None)
        if cols is not None:
            self._params[self._key(*new)] = cols

    def restore(self, data: Mapping[str, Any]) -> None:
        """Replace everything known with ``data`` (:meth:`to_json`'s form, names already folded)."""
        self._params = TableCatalog(data)._params

    def to_json(self) -> dict[str, Any]:
        return {
            table: {
                name: {"precision": p.precision, "scale": p.scale,
                       "members": list(p.members) if p.members is not None else None, "fsp": p.fsp,
                       **({"float32": True} if p.float32 else {})}
                for name, p in cols.items()
            }
            for table, cols in self._params.items()
        }


@dataclass
class ApplyResult:
    """What one batch changed: rows merged per table (``schema.table``) and DDL applied."""

    rows: dict[str, int] = field(default_factory=dict)
    deleted: dict[str, int] = field(default_factory=dict)
    ddl_applied: int = 0
    ddl_ignored: int = 0
    commit_ts: dict[str, int] = field(default_factory=dict)

    def count(self, name: str, rows: int, deleted: int, last_ts: int | None) -> None:
        """Add a table's (``schema.table``) ``rows`` merged, of them ``deleted``, and the largest commit ts
        among them (``None``: none known)."""
        self.rows[name] = self.rows.get(name, 0) + rows
        self.deleted[name] = self.deleted.get(name, 0) + deleted
        if last_ts is not None:
            self.commit_ts[name] = max(self.commit_ts.get(name, 0), last_ts)


@dataclass
class TableOptions:
    """Per-table settings from the YAML mapping."""

    key: tuple[str, ...] | None = None
    partition_by: tuple[str, ...] = ()
    enabled: bool = True
    # Delta table properties (``sink.table_properties`` and the entry's own), as (name, value) pairs
    properties: tuple[tuple[str, str], ...] = ()


class DeltaApplier:
    """Applies plan steps through a :class:`TableSink`.

    Args:
        sink: where tables live.
        app_id: the job's Delta app-transaction id (the changefeed).
        catalog: DDL-known type parameters, restored from the job state.
        table_options: per-table YAML settings (``(schema, table)`` → :class:`TableOptions`) as a function.
        metadata_columns: ``None`` for none, else the names ``(commit_ts column, op column)``.
        source_timezone: the zone TIMESTAMP text is read in.
        ddl_handler: replays one DDL; returns True if it changed anything (set by the job, see
            :mod:`ticdc_delta.delta.ddl_replay`).
        case_sensitive: the job's ``case_sensitive`` setting; the DDL handler folds the names in DDL text
            by it, as the planner folds the names of records.
        journal: where the batch's progress is written before each table-level DDL, and read back by a
            re-run of the batch (:mod:`~ticdc_delta.delta.ddl_journal`); ``None``: no journal.
        seam: the tables' snapshot TSOs (a DDL that names no table leaves out the tables it predates).
        written: where the job state says each table (``schema.table``) got rows: a table there is not made
            anew elsewhere (:class:`~ticdc_delta.errors.TableMissingError`).
        known: the same, with where tables' rows went before a ``reset`` that reads the stream again: the
            tables that share a location (:meth:`sharing`) and a schema's tables (:meth:`written_in`).
    """

    def __init__(
        self,
        sink: TableSink,
        app_id: str,
        *,
        catalog: TableCatalog | None = None,
        table_options: Callable[[str, str], TableOptions] | None = None,
        metadata_columns: tuple[str, str] | None = None,
        source_timezone: str = "UTC",
        ddl_handler: Callable[[DDLRecord, "DeltaApplier", int], bool] | None = None,
        case_sensitive: bool = False,
        journal: DDLJournal | None = None,
        seam: SnapshotSeam | None = None,
        written: Mapping[str, str] | None = None,
        known: Mapping[str, str] | None = None,
    ) -> None:
        self.sink = sink
        self.app_id = app_id
        self.catalog = catalog or TableCatalog()
        self._options = table_options or (lambda s, t: TableOptions())
        self.metadata_columns = metadata_columns
        self.tz = source_timezone
        self._ddl_handler = ddl_handler
        self.case_sensitive = case_sensitive
        self.journal = journal
        # the tables' snapshot TSOs: a DDL that names no table leaves out the tables whose snapshot holds it
        self.seam = seam
        self._steps: dict[TableIdent, int] = {}
        self._at: dict[str, int] = {}  # per location: the step its next commit takes
        self._paths: dict[TableIdent, str] = {}
        # where the state says each table (``schema.table``) got rows before; this batch's own writes
        self._written = dict(written or {})
        # ... and where tables' rows went before a reset that reads the stream again (``sharing``, ``written_in``)
        self._known = dict(known or {})
        self.locations: dict[str, str] = {}
        self.gone: set[str] = set()

    # --- transactions --------------------------------------------------------------------------------

    def next_txn(self, ident: TableIdent, batch_id: int) -> Any:
        """The app transaction of the next data commit to ``ident`` in this batch: a step past every one
        this batch numbered for a table at the same location. Upstream tables the config maps to one path
        (shards merged into one table) share its Delta log, where Delta skips a transaction whose version
        is not above the last one committed for the app id — with a counter per upstream table the second
        shard's first MERGE of a batch took the first's step and was skipped, its rows lost."""
        here = self._location(ident)
        step = max(self._at.get(here, 0), self._steps.get(ident, 0))
        self._steps[ident] = self._at[here] = step + 1
        return batch_txn(self.app_id, batch_id, step)

    def _count_steps(self, steps: Mapping[TableIdent, int]) -> None:
        """Take ``steps`` (the steps numbered per table) as this batch's so far, and each location's next
        step from them."""
        self._steps = dict(steps)
        self._at = {}
        for ident, n in steps.items():
            here = self._location(ident)
            self._at[here] = max(self._at.get(here, 0), n)

    def _location(self, ident: TableIdent) -> str:
        """Where the config puts ``ident``'s Delta table (cached: :meth:`next_txn` compares every table the
        batch has written with it)."""
        path = self._paths.get(ident)
        if path is None:
            path = self._paths[ident] = self.sink.table_path(ident.schema, ident.table)
        return path

    def carry_steps(self, old: TableIdent, new: TableIdent) -> None:
        """A table moved (RENAME TABLE) keeps its Delta log, with this batch's transactions in it: the
        next commit under the new name must use a later step than any the old name used."""
        self._steps[new] = max(self._steps.get(new, 0), self._steps.get(old, 0))
        here = self._location(new)
        self._at[here] = max(self._at.get(here, 0), self._steps[new])

    def forget(self, ident: TableIdent) -> None:
        """``ident`` was dropped or renamed away by a DDL of this batch: a table made under its name after
        this starts over by right (the state's entry for it keeps its commit ts, not its location)."""
        name = f"{ident.schema}.{ident.table}"
        self._written.pop(name, None)
        self._known.pop(name, None)
        self.locations.pop(name, None)
        self.gone.add(name)

    def sharing(self, ident: TableIdent) -> list[str]:
        """The other upstream tables (``schema.table``) whose rows went to ``ident``'s location, before
        (the state) or in this batch: shards ``tables[].path`` maps to one Delta table."""
        here, name = self._location(ident), f"{ident.schema}.{ident.table}"
        return sorted(n for n, where in self._recorded().items() if where == here and n != name)

    def _recorded(self) -> dict[str, str]:
        """Where each table's rows went, latest record first: this batch's, the state's, before a reset."""
        return {**self._known, **self._written, **self.locations}

    def written_in(self, schema: str) -> list[TableIdent]:
        """The tables of ``schema`` that have rows where the config puts them, before (the state) or in
        this batch, wherever that is (a wildcard ``tables[].path`` entry's location too)."""
        found = []
        for name, where in self._recorded().items():
            if name.startswith(schema + "."):
                ident = TableIdent(schema, name[len(schema) + 1:])
                if self._location(ident) == where:  # (a "." in a name makes the split ambiguous)
                    found.append(ident)
        return found

    def _refuse_missing(self, ident: TableIdent) -> None:
        """Refuse to create anew a table the changefeed has written before (deleted, moved, or the
        config's location for it changed): it would hold only the changes from here on."""
        name = f"{ident.schema}.{ident.table}"
        before = self._written.get(name)
        if before is None:
            return
        here = self.sink.table_path(ident.schema, ident.table)
        why = ("it was deleted or moved: by hand, or by a DROP / RENAME of another table mapped to the same "
               "location" if before == here else f"the config put it at {before} before")
        raise TableMissingError(
            f"table {name} has had changes applied by this changefeed, but there is no Delta table at {here} "
            f"({why}): a new table there would leave out every change before. Put the table (its directory "
            "with _delta_log) there or point tables[].path / sink.path back at it; to build it again from the "
            "stream, reset the changefeed (see README, 'Recovery')"
        )

    @property
    def written_tables(self) -> list[TableIdent]:
        """The tables this batch has made data commits to so far (MERGE, rewrite), in first-write order:
        the ones small-file compaction checks after the batch (:mod:`ticdc_delta.delta.compaction`)."""
        return list(self._steps)

    def schema_txn(self, batch_id: int) -> Any:
        return batch_txn(self.app_id, batch_id, 0)

    def options(self, schema: str, table: str) -> TableOptions:
        return self._options(schema, table)

    # --- resuming a batch (the DDL journal) -----------------------------------------------------------

    def resume(self, batch_id: int, ddls: Sequence[DDLRecord]) -> tuple[int, ApplyResult] | None:
        """Where a re-run of ``batch_id`` starts, given the batch's DDL in apply order: the ordinal of the
        DDL before which its first attempt journaled its progress, and the counts until then; the step
        counters and the catalog are taken from the journal. ``None``: from the start.

        Raises:
            SinkError: the journal cannot be read, or names a DDL this run of the batch does not have
                there (the batch reads differently than its first attempt did).
        """
        if self.journal is None or not ddls:
            return None
        entry = self.journal.load(self.app_id, batch_id)
        if entry is None:
            return None
        at = entry.ddl_ordinal
        if not 0 <= at < len(ddls) or [ddls[at].commit_ts, ddls[at].query] != entry.ddl:
            raise SinkError(
                f"batch {batch_id}: the DDL journal {self.journal.path} says the first attempt reached DDL "
                f"#{at} {entry.ddl!r}, but this run of the batch has {len(ddls)} DDL"
                + (f" (#{at}: {[ddls[at].commit_ts, ddls[at].query]!r})" if 0 <= at < len(ddls) else "")
            )
        self._count_steps({TableIdent(*ident): n for ident, n in entry.steps.items()})
        self.catalog.restore(entry.catalog)
        log.info("batch %d: resuming at its DDL #%d (commit ts %s): the first attempt committed everything "
                 "before it", batch_id, at, ddls[at].commit_ts)
        return at, ApplyResult(**entry.result)

    def journal_before(self, ddl: DDLRecord, ordinal: int, batch_id: int, result: ApplyResult) -> None:
        """Journal the batch's progress before its DDL number ``ordinal`` runs, when that DDL can change
        which table a name refers to (the DDL handler's ``journaled``; every DDL without one)."""
        if self.journal is None:
            return
        journaled = getattr(self._ddl_handler, "journaled", None)
        if journaled is not None and not journaled(ddl):
            return
        self.journal.save(JournalEntry(
            self.app_id, batch_id, ordinal, [ddl.commit_ts, ddl.query],
            {(i.schema, i.table): n for i, n in self._steps.items()}, self.catalog.to_json(), asdict(result),
        ))

    # --- the batch -----------------------------------------------------------------------------------

    def apply(self, steps: Sequence[RowsStep | DDLRecord], batch_id: int) -> ApplyResult:
        """Apply every step in order.

        Raises:
            SinkError, ConcurrentCommitError: from the sink; DDLPolicyError from the DDL handler.
        """
        ddls = [s for s in steps if isinstance(s, DDLRecord)]
        self.check_steps(batch_id, [[TableIdent(*t) for t in s.tables] for s in steps if isinstance(s, RowsStep)], ddls)
        skip, result = self.begin(batch_id, ddls)
        ordinal = -1  # the DDL steps seen so far, less one
        for step in steps:
            if isinstance(step, DDLRecord):
                ordinal += 1
                if ordinal >= skip:
                    self.apply_ddl(step, ordinal, skip, batch_id, result)
                continue
            if ordinal < skip:
                continue  # rows before the DDL the batch resumes at: committed by the first attempt
            for (schema, table), changes in step.tables.items():
                opts = self.options(schema, table)
                if not opts.enabled:
                    continue
                n_up, n_del, last_ts = self._apply_table(TableIdent(schema, table), changes, opts, batch_id)
                result.count(f"{schema}.{table}", n_up + n_del, n_del, last_ts)
        return result

    def check_steps(self, batch_id: int, segments: Sequence[Iterable[TableIdent]], ddls: Sequence[DDLRecord]) -> None:
        """Refuse, before its first commit, a batch that could number more commits to one location than a
        batch has steps (``STEPS_PER_BATCH``): ``segments`` are the tables with rows in each of its
        segments (two commits each: schema work, MERGE; none for a disabled table), ``ddls`` its DDL (one
        commit to each table a DDL changes under ``evolve``: the DDL handler's ``stepped_tables``). Found at
        the step past the last one, it stopped the batch part-way, on every re-run, with a bare ValueError —
        and with commits made, no re-planned batch could take its place safely.

        Raises:
            TerminalError: the batch could need more steps for one location, naming the way on.
        """
        from .ddl_replay import ddl_tables

        need: dict[str, int] = {}
        named: dict[str, set[str]] = {}

        def add(schema: str, table: str, n: int) -> None:
            if not self.options(schema, table).enabled:
                return
            try:
                where = self._location(TableIdent(schema, table))
            except IdentifierError:
                return  # no location can hold it: its rows and DDL commit nothing
            need[where] = need.get(where, 0) + n
            named.setdefault(where, set()).add(f"{schema}.{table}")

        for tables in segments:
            for ident in tables:
                add(ident.schema, ident.table, 2)
        stepped = getattr(self._ddl_handler, "stepped_tables", None)
        for ddl in ddls:
            for schema, table in (stepped(ddl, self.case_sensitive) if stepped is not None else
                                  ddl_tables(ddl, case_sensitive=self.case_sensitive) or ()):
                add(schema, table, 1)
        if not need:
            return
        where = max(need, key=need.__getitem__)
        if need[where] > STEPS_PER_BATCH:
            raise TerminalError(
                f"micro-batch {batch_id} could make up to {need[where]} commits to the Delta table at {where} "
                f"({', '.join(sorted(named[where]))}: rows and DDL of {len(ddls) + 1} DDL segments), more than "
                f"the {STEPS_PER_BATCH} a micro-batch can number; nothing of it was committed. Lower "
                "source.max_offsets_per_trigger, then run `reset --from state --yes` (Spark's checkpoint holds "
                "the batch as planned already; the reset plans it again under the new bound, losing nothing) "
                "and start the job again")

    def begin(self, batch_id: int, ddls: Sequence[DDLRecord]) -> tuple[int, ApplyResult]:
        """Start applying ``batch_id`` (either engine), given its DDL in apply order: the ordinal of the DDL
        a re-run of the batch resumes at (:meth:`resume`; -1: from the start) and the counts until then.

        Raises:
            SinkError: from :meth:`resume`.
        """
        self._count_steps({})
        # a re-run of a batch that got past a table-level DDL resumes before it (see .ddl_journal)
        resume = self.resume(batch_id, ddls)
        if resume is None:
            return -1, ApplyResult()
        # the DDL before it ran in the first attempt and do not run again: a table they dropped or renamed
        # away is forgotten here, as running them forgets it (forget)
        from .ddl_replay import tables_removed

        for ddl in ddls[:resume[0]]:
            removed = tables_removed(ddl, case_sensitive=self.case_sensitive)
            if removed is None:
                self._written.clear()
            for schema, table in removed or ():
                self.forget(TableIdent(schema, table))
        return resume

    def apply_ddl(self, ddl: DDLRecord, ordinal: int, skip: int, batch_id: int, result: ApplyResult) -> None:
        """Run the batch's DDL number ``ordinal`` through the DDL handler and count it in ``result``; journaled
        first (:meth:`journal_before`) unless it is the one the batch resumes at (``skip``), whose entry
        is there already.

        Raises:
            SinkError, ConcurrentCommitError, DDLPolicyError: from the DDL handler and the journal.
        """
        if ordinal != skip:
            self.journal_before(ddl, ordinal, batch_id, result)
        if self._ddl_handler is not None and self._ddl_handler(ddl, self, batch_id):
            result.ddl_applied += 1
            if ddl.commit_ts is not None:  # the tables it changed are upstream's as of its commit ts too
                from .ddl_replay import ddl_tables

                for schema, table in ddl_tables(ddl, case_sensitive=self.case_sensitive) or ():
                    name = f"{schema}.{table}"
                    result.commit_ts[name] = max(result.commit_ts.get(name, 0), ddl.commit_ts)
        else:
            result.ddl_ignored += 1

    def _field(self, ident: TableIdent, name: str, type_code: int, flags: int) -> pa.Field:
        return arrow_field_for(name, type_code, flags, self.catalog.params(ident.schema, ident.table, name))

    def check_columns(self, ident: TableIdent, names: Iterable[str], partition_by: Sequence[str] = ()) -> list[str]:
        """``partition_by`` (``tables[].partition_by``) as the table's columns ``names`` spell them (MySQL's column names compare
        ignoring case, as ``tables[].key`` does), for a table about to be created; checks first that no
        upstream column takes the name of a metadata column, whose values would replace its own.

        Raises:
            ConfigError: a partition column the table does not have, or a column named as a metadata column.
        """
        spelled = {n.lower(): n for n in names}
        for name in self.metadata_columns or ():
            if name.lower() in spelled:
                raise ConfigError(
                    f"table {ident.schema}.{ident.table} has a column {spelled[name.lower()]!r}, and "
                    f"sink.metadata_columns names {name!r} too: choose other names for the metadata columns "
                    "(sink.metadata_columns: {commit_ts: ..., op: ...})")
        missing = [p for p in partition_by if p.lower() not in spelled]
        if missing:
            raise ConfigError(
                f"tables[].partition_by of {ident.schema}.{ident.table}: {missing} not among its columns "
                f"{list(spelled.values())}; a wildcard entry's partition_by must name columns of every table it "
                "matches")
        return [spelled[p.lower()] for p in partition_by]

    def prepare_table(self, ident: TableIdent, col_types: Mapping[str, tuple[int, int]], upserts: bool,
                      opts: TableOptions, batch_id: int) -> dict[str, str] | None:
        """The target table's schema work before its rows are written, for either engine: create it from
        the images' column types (plus the metadata columns), add the columns the images carry that it
        lacks (and the metadata columns, when they are on and the table was made without them: turned on
        for an existing deployment), widen drifted types. Returns its columns (lower-case name → name), or
        ``None`` when the table does not exist and there are only deletes (nothing to do).

        The schema work has a step of its own, taken whatever the table shows, so the data commit after it
        gets the same step on a re-run of the batch (see :mod:`~ticdc_delta.delta.ddl_replay`)."""
        txn = self.next_txn(ident, batch_id)
        existing = self.sink.table_schema(ident)
        meta = self.metadata_columns
        if existing is None:
            if not upserts:
                return None
            self._refuse_missing(ident)
            parts = self.check_columns(ident, col_types, opts.partition_by)
            fields = [self._field(ident, n, t, f) for n, (t, f) in col_types.items()]
            if meta:
                fields += [pa.field(meta[0], pa.int64()), pa.field(meta[1], pa.string())]
            self.sink.ensure_table(ident, pa.schema(fields), parts, self.schema_txn(batch_id),
                                   dict(opts.properties))
            existing = self.sink.table_schema(ident)
        elif opts.properties:
            self.reconcile_properties(ident, opts)
        assert existing is not None  # noqa: S101 - ensure_table just created it
        if meta:
            self.check_columns(ident, col_types)
        have = {f.name.lower(): f.name for f in existing}
        missing = [self._field(ident, n, t, f) for n, (t, f) in col_types.items() if n.lower() not in have]
        if meta:
            # metadata columns turned on for tables made without them: nullable, null in the existing rows
            wanted = {f.name.lower() for f in missing}
            missing += [pa.field(name, kind) for name, kind in ((meta[0], pa.int64()), (meta[1], pa.string()))
                        if name.lower() not in have and name.lower() not in wanted]
        if missing:
            # schema drift without a DDL (Avro schema change, a DDL we did not see): evolve additively
            self.sink.add_columns(ident, missing, txn)
            log.info("added columns %s to %s.%s", [f.name for f in missing], *ident)
            have.update({f.name.lower(): f.name for f in missing})
        self._widen_drifted(ident, existing, col_types, txn)
        self.locations[f"{ident.schema}.{ident.table}"] = self.sink.table_path(ident.schema, ident.table)
        return have

    def reconcile_properties(self, ident: TableIdent, opts: TableOptions) -> list[str]:
        """Set the configured table properties (``opts.properties``) whose value the existing table does not
        have, in one commit of their own (metadata only: the table's rows, and so the upstream state its
        version stands for, stay as they are); the names set. Names and values compare ignoring case (Delta
        Lake stores its own properties' names in its spelling, ``true`` as given).

        Raises:
            SinkError: the table refused them; ConcurrentCommitError: other writers kept winning.
        """
        found = {k.lower(): v.strip().lower() for k, v in (self.sink.table_properties(ident) or {}).items()}
        differ = {k: v for k, v in opts.properties if found.get(k.lower()) != v.strip().lower()}
        if differ:
            self.sink.set_table_properties(ident, differ)
            log.info("set table properties of %s.%s: %s", *ident,
                     ", ".join(f"{k}={v}" for k, v in sorted(differ.items())))
        return sorted(differ)

    def _apply_table(
        self, ident: TableIdent, tc: TableChanges, opts: TableOptions, batch_id: int
    ) -> tuple[int, int, int | None]:
        changes = list(tc.changes.values())
        upserts = [c for c in changes if c.kind != DELETE]
        # Column types come from the images: the first image carrying a column names its type. Names compare
        # ignoring case, as MySQL's column names do: an upstream rename that changed only a column's case
        # (Avro carries no DDL) leaves images of both spellings, one column's values.
        col_types: dict[str, tuple[int, int]] = {}
        spelled: set[str] = set()
        for c in changes:
            for name, type_code, flags, _ in c.image:
                if (low := name.lower()) not in spelled:
                    spelled.add(low)
                    col_types[name] = (type_code, flags)
        have = self.prepare_table(ident, col_types, bool(upserts), opts, batch_id)
        if have is None:
            return 0, 0, None  # deletes for a table we never had: nothing to delete
        meta = self.metadata_columns

        keys = tc.key_columns
        names = list(col_types) if upserts else list(keys)
        images = [{col[0].lower(): col[3] for col in c.image} for c in changes]
        columns: list[pa.Array] = []
        fields: list[pa.Field] = []
        for name in names:
            type_code, flags = col_types[name]
            params = self.catalog.params(ident.schema, ident.table, name)
            convert = converter_for(type_code, flags, params, self.tz)
            try:
                low = name.lower()
                values = [None if (v := img.get(low)) is None else convert(v) for img in images]
            except SinkError as exc:
                # the value screen (value_check) refuses such changes before the batch; reaching this
                # means the type parameters changed in a way it could not follow (see value_check)
                raise SinkError(f"table {ident.schema}.{ident.table} column {name!r}: {exc}") from exc
            columns.append(pa.array(values, type=arrow_type_for(type_code, flags, params)))
            fields.append(pa.field(have.get(name.lower(), name), columns[-1].type))
        if meta and upserts:  # (by the table's spelling of their names)
            columns.append(pa.array([c.commit_ts for c in changes], type=pa.int64()))
            fields.append(pa.field(have.get(meta[0].lower(), meta[0]), pa.int64()))
            columns.append(pa.array([c.op for c in changes], type=pa.string()))
            fields.append(pa.field(have.get(meta[1].lower(), meta[1]), pa.string()))
        columns.append(pa.array([OP_DELETE if c.kind == DELETE else OP_UPSERT for c in changes], type=pa.string()))
        fields.append(pa.field(OP_COLUMN, pa.string()))
        table = pa.Table.from_arrays(columns, schema=pa.schema(fields))
        key_names = [have.get(k.lower(), k) for k in keys]
        self.sink.merge(ident, table, key_names, self.next_txn(ident, batch_id))
        n_del = sum(1 for c in changes if c.kind == DELETE)
        last = max((c.commit_ts for c in changes if c.commit_ts is not None), default=None)
        return len(changes) - n_del, n_del, last


    def _widen_drifted(
        self, ident: TableIdent, existing: pa.Schema, col_types: Mapping[str, tuple[int, int]], txn: Txn
    ) -> None:
        """Widen columns whose type the row images say changed without a DDL (Avro: a new schema version
        with a larger DECIMAL, or INT made DECIMAL) to a type holding the table's values and the images'
        (:func:`~.arrow_types.common_type`: ``decimal(10,2)`` then ``decimal(10,4)`` is ``decimal(12,4)``),
        through the sink's type change: in place where the ``spark`` engine's type widening can, else a
        rewrite. Narrower types keep the table's type; incompatible ones too (the value screen refuses the
        values that do not fit it)."""
        want: dict[str, pa.DataType] = {}
        for f in existing:
            spec = col_types.get(f.name) or next(
                (v for k, v in col_types.items() if k.lower() == f.name.lower()), None
            )
            if spec is None:
                continue
            target = arrow_type_for(spec[0], spec[1], self.catalog.params(ident.schema, ident.table, f.name))
            both = common_type(f.type, target)  # (a retyped Avro column: the table holds the old values)
            if both is not None and both != f.type:
                want[f.name] = both
        if not want:
            return
        log.info("widening %s of %s.%s from the row images", want, *ident)
        self.sink.change_column_types(ident, want, txn)


def iter_tables(steps: Iterable[RowsStep | DDLRecord]) -> Iterable[tuple[str, str]]:
    """Every table a plan touches (for logging)."""
    for step in steps:
        if isinstance(step, RowsStep):
            yield from step.tables
