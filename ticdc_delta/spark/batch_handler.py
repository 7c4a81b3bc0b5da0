"""The ``foreachBatch`` handler: decode → plan (consumer rules) → MERGE / DDL → state, exactly once.

Per micro-batch ``N``:

1. If the state table already holds batch ``N`` (a crash after the state commit, before Spark recorded
   the batch), do nothing: the batch is complete.
2. Decode on the executors (``mapInArrow``) and collect the compact records on the driver.
3. Undecodable messages go to the dead-letter table (or stop the job with ``fail_on_error``).
4. Plan with the previous state (:func:`~ticdc_delta.core.batch_planner.plan_batch`), deterministically.
5. Apply the steps; each Delta commit carries app transaction ``(changefeed, N·1024 + step)``, so after a
   crash the re-run skips what was already committed.
6. Save the new state (watermarks, held rows, DDL ids, catalog) as one commit with transaction N.

A crash anywhere re-runs batch ``N`` with the same offsets (Spark's offset log) and the same previous
state, hence the same plan: what was committed is skipped, the rest is committed once.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from dataclasses import replace
from typing import Any, Callable, Mapping

import pyarrow as pa

from ..config import JobConfig
from ..core.batch_planner import OFFSET_ORDER, WATERMARK, ConsumerState, ResolvedMark, plan_batch
from ..core.merge import KeyResolver, MissingKeyError
from ..core.ts_guard import TsGuard, tso_physical_ms
from ..core.snapshot_seam import seam_from_state
from ..core.records import ChangeRecord, dump_record, gc_paused, load_record
from ..core.resolved_ts import lowest, resolved_topics
from ..codec.base import parse_bool_option
from ..codec.json_output import value_to_json
from ..delta.value_check import Rejection, ValueScreen, describe_rejections, value_bytes
from ..delta.applier import ApplyResult, DeltaApplier, TableCatalog, TableOptions
from ..delta.ddl_journal import DDLJournal
from ..delta.sink import DeltaRsSink, TableIdent, batch_txn
from ..delta.state_store import RESET_BATCH_ID, PipelineState, StateStore, epoch_app_id
from ..locations import child_location
from ..errors import (
    BrokerUnavailableError, ConfigError, DecodeError, ImplausibleTimestampError, TerminalError, TicdcDeltaError,
    UnwritableValueError,
)
from .checkpoint import SparkCheckpoint, check_state_belongs
from .decode import DECODED_SCHEMA, DecoderSpec, few_tasks, make_decode_fn

__all__ = ["BatchHandler", "next_state_meta", "protocol_mode", "InjectedFault", "FAULT_ENV", "tso_physical_ms"]

log = logging.getLogger(__name__)
progress_log = logging.getLogger("ticdc_delta.progress")

FAULT_ENV = "TICDC_DELTA_FAULT"
"""Fault injection for tests: ``stage@batch[:kill|:hang|:pause]`` (e.g. ``after_merge@2:kill``; ``hang``: the
batch never ends; ``pause``: it logs ``injected pause at <stage> of batch <n>``, waits :data:`FAULT_PAUSE_S`
and goes on). Stages:
``after_decode``, ``after_dead_letter``, ``after_merge`` (after the first table commit of the batch),
``before_state``, ``after_state``."""

FAULT_PAUSE_S = 5.0
"""How long a ``pause`` fault holds its batch."""

HELD_ROWS_WARNING = 1_000_000
"""Held rows (``delta-rs`` engine) from which each batch's progress is followed by a warning, again at each
doubling."""

STALLED_S = 60
"""How far (seconds of TSO time) a partition's unmoving resolved ts may lag the highest before it is
reported stalled (the progress line's ``stalled_partitions``, a warning)."""

DEAD_LETTER_IDENT = TableIdent("_ticdc", "dead_letter")
DEAD_LETTER_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("error", pa.string()),
        ("batch_id", pa.int64()),
        ("recorded_at", pa.timestamp("us", tz="UTC")),
        # A decoded change refused for a value no Delta column can hold (key/value are null then):
        ("schema", pa.string()),
        ("table", pa.string()),
        ("column", pa.string()),
        ("column_value", pa.binary()),  # the full offending value (text as UTF-8)
        ("row", pa.string()),  # the whole change as the `decode` command prints it (JSON)
    ]
)
"""Columns after ``recorded_at`` were added later: they are nullable, and a dead-letter table written
before them gains them on the next append (:class:`_DeadLetterSink`)."""


class InjectedFault(RuntimeError):
    """Raised by the fault injector (tests only)."""


def protocol_mode(protocol: str, options: Mapping[str, str]) -> str:
    """``watermark`` where the protocol carries resolved ts, ``offset-order`` where it does not."""
    if protocol in ("open-protocol", "craft"):
        return WATERMARK
    # (read as the decoder reads it: ``1``, ``yes``, ``on`` are true too — the decoder then sends watermarks)
    if protocol == "canal-json" and parse_bool_option(dict(options), "enable-tidb-extension", False):
        return WATERMARK
    return OFFSET_ORDER


class _ConfiguredSink(DeltaRsSink):
    """The Delta sink with the YAML table mapping applied to table locations (``tables[].path`` as
    configured; every other table at its encoded location under ``sink.path``)."""

    def __init__(self, cfg: JobConfig) -> None:
        super().__init__(
            cfg.sink.path, explicit=cfg.explicit_table_path, storage_options=cfg.sink.storage_options or None
        )
        self._cfg = cfg

    def table_path(self, schema: str, table: str) -> str:
        """:meth:`JobConfig.table_path`: the mapping's path, else the encoded default location, checked
        against the configured ones; readers that pass the upstream spelling (``Shop``, ``Orders``) find
        the table the job wrote under the folded names."""
        return self._cfg.table_path(schema, table)

    def tables_in_schema(self, schema: str) -> list[TableIdent]:
        """The tables under ``{sink.path}/{schema}/`` and those a ``tables[].path`` of that schema places
        elsewhere (DROP DATABASE drops them too).

        Raises:
            SinkError: the object store cannot be listed.
        """
        found = super().tables_in_schema(schema)
        folded = self._cfg.fold_name(schema)
        for mapping in self._cfg.tables:
            source_schema, _, table = mapping.source.partition(".")
            if mapping.path and mapping.enabled and not mapping.is_wildcard \
                    and self._cfg.fold_name(source_schema) == folded and self._load(mapping.path) is not None:
                found.append(TableIdent(schema, self._cfg.fold_name(table)))
        return list(dict.fromkeys(found))


class BatchHandler:
    """Callable for ``DataStreamWriter.foreachBatch``; runs on the driver.

    Args:
        cfg: the job configuration.
        avro_schema_source: for Avro, the driver-side :class:`~ticdc_delta.codec.avro.AvroSchemas`.
        partitions_of: ``topic -> partitions`` (Kafka metadata); the default asks the broker.
    """

    def __init__(
        self,
        cfg: JobConfig,
        *,
        avro_schema_source: Any = None,
        partitions_of: Callable[[str], list[int]] | None = None,
        ddl_handler: Any = None,
    ) -> None:
        self.cfg = cfg
        self.mode = protocol_mode(cfg.source.protocol, cfg.source.options)
        self.sink = _ConfiguredSink(cfg)
        self.dead_letters = _DeadLetterSink(
            cfg.dead_letter_path,
            paths={(DEAD_LETTER_IDENT.schema, DEAD_LETTER_IDENT.table): cfg.dead_letter_path},
            storage_options=cfg.sink.storage_options or None,
        )
        self.store = StateStore(
            _join(cfg.checkpoint, "state"), cfg.changefeed, storage_options=cfg.sink.storage_options or None
        )
        self.journal = DDLJournal(
            _join(cfg.checkpoint, "ddl_journal"), storage_options=cfg.sink.storage_options or None
        )
        self._avro = avro_schema_source
        self._avro_registry = bool(getattr(avro_schema_source, "_client", None))
        self._avro_params_key: tuple[int, ...] | None = None
        asked = partitions_of or self._kafka_partitions
        self._seen_partitions: dict[str, list[int]] = {}  # each topic's partitions as the last batch asked

        def remembered(topic: str) -> list[int]:
            self._seen_partitions[topic] = found = asked(topic)
            if not found and topic not in self._warned_missing:
                self._warned_missing.add(topic)
                log.warning("topic %r does not exist or holds no message (yet): it holds no row back until it "
                            "does (TiCDC creates a topic dispatcher's topic when it first writes to it, and sends "
                            "resolved ts only to the topics of tables that exist); if it never fills, check its "
                            "name in source.topics", topic)
            return found

        self._partitions_of = remembered
        self._warned_unresolved = False
        # each partition's watermark after the last batch, and those warned about as stalled (_stalled_partitions)
        self._last_watermarks: dict[tuple[str, int], int] = {}
        self._warned_stalled: set[tuple[str, int]] = set()
        self._warned_missing: set[str] = set()
        self._ddl_handler = ddl_handler
        self._state: ConsumerState | None = None
        self._catalog: TableCatalog | None = None
        self._meta: dict[str, Any] = {}
        self._loaded_batch: int | None = None
        self.error: BaseException | None = None
        self.batches = 0
        self._warned_clock = False
        self._held_warning_at = HELD_ROWS_WARNING
        # (wall clock, ms) a batch Spark planned before this: begun by an earlier run (see _check_engine_switch)
        self._created_ms = int(time.time() * 1000)
        self._engine: Any = None
        if cfg.sink.engine == "spark":
            from .engine import SparkEngine

            self._engine = SparkEngine(self)

    def _configured_key(self, schema: str, table: str) -> list[str] | None:
        """The ``tables[].key`` override of a table (exact or wildcard entry), the one place it is read."""
        m = self.cfg.table_mapping_for(schema, table)
        return m.key if m is not None else None

    @property
    def _app_id(self) -> str:
        """The Delta app-transaction id: ``<changefeed>~<epoch>``. Batch ids start at 0 with every new Spark
        checkpoint, so each start from nothing (epoch: the Spark query id) and each ``reset`` (a new random
        epoch) gets ids of its own: batches committed to the same tables before can never make a new batch
        look committed. States written before epochs existed keep the bare changefeed."""
        return epoch_app_id(self.cfg.changefeed, self._meta)

    # --- state ---------------------------------------------------------------------------------------

    def _load_state(self) -> None:
        saved = self.store.load()
        if saved is None:
            self._state, self._catalog, self._meta, self._loaded_batch = ConsumerState(), TableCatalog(), {}, None
            return
        meta = dict(saved.meta)
        self._state = ConsumerState(
            dict(saved.watermarks),
            [load_record(b) for b in saved.held],
            [tuple(d) for d in meta.get("applied_ddl", [])],
            meta.get("released_low"),
        )
        self._catalog = TableCatalog(meta.get("catalog"), fold_names=not self.cfg.case_sensitive)
        self._meta = meta
        self._loaded_batch = saved.batch_id

    def _table_options(self, schema: str, table: str) -> TableOptions:
        m = self.cfg.table_mapping_for(schema, table)
        properties = tuple(self.cfg.table_properties_for(schema, table).items())
        if m is None:
            return TableOptions(properties=properties)
        return TableOptions(tuple(m.key) if m.key else None, tuple(m.partition_by), m.enabled, properties)

    def _retire_partitions(self, state: ConsumerState, offsets: Mapping[tuple[str, int], Any]) -> ConsumerState:
        """``state`` without the watermarks of the partitions at or past ``partition-num`` (``source.options``)
        that sent nothing in this batch: the changefeed's ``partition-num`` was lowered, TiCDC writes no
        more resolved ts there, and their last one would hold every later row for good. A partition Spark
        still had messages of gets some in each batch, so one that sent none has been read to its end;
        what TiCDC wrote there after its last resolved ts it sends again to the partitions it writes to now
        (a changefeed resumes from its checkpoint). Both engines, before planning; the state saved after
        the batch keeps them out."""
        limit = self.cfg.source.partition_num
        if limit is None or self.mode != WATERMARK:
            return state
        retired = sorted(tp for tp in state.watermarks if tp[1] >= limit and tp not in offsets)
        if not retired:
            return state
        log.warning("%s: at or past partition-num %d and read to the end: no longer waited for",
                    ", ".join(f"{t}[{p}]" for t, p in retired), limit)
        return replace(state, watermarks={tp: ts for tp, ts in state.watermarks.items() if tp not in retired})

    def _kafka_partitions(self, topic: str) -> list[int]:
        """The partitions of ``topic`` TiCDC writes to: the broker's, or the first ``partition-num`` of
        them when the sink URI set it (``source.options``; TiCDC then sends no row and no resolved ts to
        the others, which would otherwise hold every row for good)."""
        resolved = self._state is not None and topic in resolved_topics(self._state.watermarks)
        found = kafka_partitions(self.cfg, topic, empty_as_none=not resolved)
        limit = self.cfg.source.partition_num
        return found if limit is None else [p for p in found if p < limit]

    def starting_offsets(self, default: Any) -> Any:
        """Where a new Spark checkpoint starts: the offsets a ``reset`` chose (:mod:`ticdc_delta.reset`)
        while no batch has run since, else ``default`` (``source.starting_offsets``)."""
        saved = self.store.load()
        if saved is None or saved.batch_id != RESET_BATCH_ID or "starting_offsets" not in saved.meta:
            return default
        chosen = saved.meta["starting_offsets"]
        if isinstance(chosen, dict):  # JSON: partition keys came back as strings
            return {t: {int(p): int(o) for p, o in parts.items()} for t, parts in chosen.items()}
        return chosen

    def _fault(self, stage: str, batch_id: int) -> None:
        spec = os.environ.get(FAULT_ENV)
        if not spec:
            return
        where, _, how = spec.partition(":")
        name, _, at = where.partition("@")
        if name == stage and at.isdigit() and int(at) == batch_id:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if how == "hang":  # a batch that never ends (batch_timeout's watchdog ends the process)
                while True:
                    time.sleep(3600)
            if how == "pause":  # a batch held in flight (a stop requested meanwhile lets it finish)
                log.warning("injected pause at %s of batch %d", stage, batch_id)
                time.sleep(FAULT_PAUSE_S)
                return
            raise InjectedFault(f"injected fault at {stage} of batch {batch_id}")

    # --- the batch -----------------------------------------------------------------------------------

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        try:
            self._handle(batch_df, batch_id)
        except BaseException as exc:
            self.error = exc
            self._state = None  # reload from the store on the next attempt
            self._avro_params_key = None
            raise

    def close(self) -> None:
        """Wait for the engine's background work of the last batch (the ``spark`` engine's snapshot
        warm-up); the job calls it once the query has stopped."""
        if self._engine is not None:
            self._engine.close()

    def _decoder_spec(self) -> DecoderSpec:
        """What the executors decode the batch with: for Avro, every schema the driver resolves.

        Executors are other processes: every schema of the topics' subjects is resolved here, on the
        driver (TiCDC registers under TopicNameStrategy: ``<topic>-key`` / ``<topic>-value``), soft-deleted
        versions included, and shipped with where it came from, so that a message of an id not among them
        stops the job instead of going to the dead-letter table. A registry that cannot be listed while the
        subjects were listed in an earlier batch does not stop the job: the schemas of then are shipped
        (:meth:`~ticdc_delta.codec.avro.AvroSchemas.for_executors`).

        Raises:
            SchemaRegistryUnavailableError: the registry failed for a subject never listed before.
            ConfigError: the registry refused the credentials (HTTP 401/403).
        """
        schemas: dict[int, str] = {}
        if self._avro is not None:
            from ..codec.avro import _sanitize_topic

            subjects = [f"{_sanitize_topic(t)}-{part}" for t in self.cfg.topics for part in ("key", "value")]
            schemas = self._avro.for_executors(subjects if self._avro_registry else ())
        upstream = self.cfg.source.upstream_settings(self.cfg.sink.source_timezone)
        return DecoderSpec(self.cfg.source.protocol, dict(self.cfg.source.options), schemas, upstream)

    def _avro_type_params(self, spec: DecoderSpec, catalog: TableCatalog) -> None:
        """Avro carries no DDL: DECIMAL precision/scale and ENUM/SET members come from its schemas."""
        if self._avro is None or not spec.avro_schemas:
            return
        from ..codec.avro import AvroSchemas
        from ..delta.arrow_types import TypeParams

        # Later schema versions must win. A registry numbers schemas in registration order; local files
        # are taken in the order the YAML lists them (oldest first, as documented).
        listed = [int(i) for i in self.cfg.source.avro_schemas if int(i) in spec.avro_schemas]
        key = tuple(listed + sorted(i for i in spec.avro_schemas if i not in set(listed)))
        if key == self._avro_params_key:
            return
        params = AvroSchemas(spec.avro_schemas).table_params_for(list(key))
        for (schema, table), cols in params.items():
            for column, p in cols.items():
                members = tuple(p["members"]) if p.get("members") else None
                catalog.set_params(self.cfg.fold_name(schema), self.cfg.fold_name(table), column, TypeParams(p.get("precision"), p.get("scale"), members))
        self._avro_params_key = key

    def _check_engine_switch(self, checkpoint: SparkCheckpoint, batch_id: int) -> None:
        """Refuse to re-run, on the other engine, a batch an earlier run began on one engine and did not
        finish. Both engines number a batch's Delta transactions ``N·1024 + step``, but they cut a table's
        rows at different DDL (``delta-rs`` at every DDL of the batch, ``spark`` only at the table's own),
        so the steps do not line up: a table's MERGE the re-run numbers like one the first attempt
        committed would be skipped by Delta, its rows lost. A batch Spark planned before this run started
        (its offset log's ``batchTimestampMs``) is such a re-run; a switch between finished batches is safe.

        The engine that began it: the state's last batch's, unless a run on the other engine began it —
        such a run marks that in Spark's checkpoint (:meth:`~.checkpoint.SparkCheckpoint.mark_engine`)
        before its first batch commits anything."""
        finished = self._meta.get("engine")  # (None: a state saved before the engine was recorded)
        if finished is None:
            return
        engine = self.cfg.sink.engine
        mark = checkpoint.engine_mark()
        planned = checkpoint.batch_timestamp_ms(batch_id)
        if planned is not None and planned < self._created_ms:
            began = mark["engine"] if mark is not None and mark.get("batch") == batch_id else finished
            if began != engine:
                raise ConfigError(
                    f"micro-batch {batch_id}, planned by an earlier run on the {began} engine, did not finish (the "
                    f"state is at batch {self._loaded_batch}); the {engine} engine numbers its Delta commits "
                    f"differently and could skip what that run committed: finish it with sink.engine: {began} "
                    "(one `run --once`), then switch"
                )
        if engine != finished and mark != {"engine": engine, "batch": batch_id}:
            checkpoint.mark_engine(engine, batch_id)

    def _handle(self, batch_df: Any, batch_id: int) -> None:
        started = time.monotonic()
        if self._state is None:
            self._load_state()
        checkpoint = SparkCheckpoint(_join(self.cfg.checkpoint, "spark"), getattr(batch_df, "sparkSession", None))
        query_id = checkpoint.query_id()
        known = self._meta.get("checkpoint")
        if check_state_belongs(
            checkpoint=self.cfg.checkpoint.rstrip("/"),
            state_query_id=known.get("query_id") if isinstance(known, dict) else None,
            state_batch_id=self._loaded_batch,
            adopt=not isinstance(known, dict),
            query_id=query_id,
            batch_id=batch_id,
        ):
            log.info("batch %d was already committed (state at batch %d): skipping", batch_id, self._loaded_batch)
            return
        if self._loaded_batch is None and query_id is not None:
            # starting from nothing (no state): the Delta tables may still hold commits of an earlier life of
            # this changefeed whose checkpoint was deleted whole; a new epoch keeps batch 0 from being skipped.
            # The query id is the same when this batch is re-run, so the epoch is too.
            self._meta.setdefault("epoch", query_id)
        if self.batches == 0:
            self._check_engine_switch(checkpoint, batch_id)
        guard = self._ts_guard(checkpoint, batch_id)
        # a half-done snapshot load stops the job before anything is read (core/snapshot_seam)
        seam = seam_from_state(self._meta.get("snapshots"))
        if self._engine is not None:  # sink.engine: spark (ticdc_delta/spark/engine.py)
            self._engine.run(batch_df, batch_id, guard=guard, query_id=query_id, started=started, seam=seam,
                             messages=checkpoint.batch_messages(batch_id))
            return
        if self._meta.get("staging_batch") is not None:
            raise ConfigError(
                f"the state under {self.cfg.checkpoint} holds rows in the spark engine's staging table "
                f"(batch {self._meta['staging_batch']}): run with sink.engine: spark until none are held"
            )
        spec = self._decoder_spec()
        decoded: pa.Table = (few_tasks(batch_df, checkpoint.batch_messages(batch_id))
                             .mapInArrow(make_decode_fn(spec), DECODED_SCHEMA).toArrow())
        timings = {"read_decode": time.monotonic() - started}
        self._fault("after_decode", batch_id)

        cols = {name: decoded.column(name).to_pylist() for name in ("topic", "partition", "offset", "idx", "kind", "commit_ts")}
        kinds = cols["kind"]
        payloads = decoded.column("payload").to_pylist()
        records, resolved, errors = [], [], []
        offsets: dict[tuple[str, int], list[int]] = {}
        counts = {"row": 0, "ddl": 0, "resolved": 0, "error": 0, "empty": 0}
        with gc_paused():  # (records hold no cycles: see gc_paused)
            for i, kind in enumerate(kinds):
                tp = (cols["topic"][i], cols["partition"][i])
                off = cols["offset"][i]
                span = offsets.get(tp)
                if span is None:
                    offsets[tp] = [off, off]
                else:
                    span[0], span[1] = min(span[0], off), max(span[1], off)
                counts[kind] = counts.get(kind, 0) + 1
                if kind == "row" or kind == "ddl":
                    records.append(load_record(payloads[i]))
                elif kind == "resolved":
                    resolved.append(ResolvedMark(tp[0], tp[1], off, cols["idx"][i], cols["commit_ts"][i]))
                elif kind == "error":
                    errors.append(i)

        if errors:
            self._dead_letter(decoded, errors, batch_id)
        self._fault("after_dead_letter", batch_id)

        assert self._state is not None and self._catalog is not None  # noqa: S101 - loaded above
        state = self._retire_partitions(self._state, offsets)
        self._avro_type_params(spec, self._catalog)
        partitions = {t: self._partitions_of(t) for t in self.cfg.topics} if self.mode == WATERMARK else None
        t_plan = time.monotonic()
        timings["unpack"] = t_plan - started - timings["read_decode"]
        # values no Delta column can hold: refused per change, in apply order, with the DDL of the batch
        replay_policy = getattr(self._ddl_handler, "policy", None) if self._ddl_handler else (lambda cls: "ignore")
        has_ddl = any(r.kind == "ddl" for r in records) or any(r.kind == "ddl" for r in state.held)
        screen = ValueScreen(self._catalog, self.cfg.sink.source_timezone, ddl_policy=replay_policy,
                             case_sensitive=self.cfg.case_sensitive,
                             delta_type=None if has_ddl else self._delta_column_types())
        try:
            with gc_paused():
                plan = plan_batch(
                    state, records, resolved, mode=self.mode, keys=KeyResolver(lookup=self._configured_key),
                    partitions=partitions, guard=guard, case_sensitive=self.cfg.case_sensitive, screen=screen,
                    seam=seam,
                )
        except MissingKeyError as exc:
            raise TerminalError(f"batch {batch_id}: {exc}") from exc

        if plan.rejected:
            self._dead_letter_implausible(batch_df, plan.rejected, batch_id)
        if screen.rejections:
            self._dead_letter_rejections(screen.rejections, batch_id)
        applier = DeltaApplier(
            _FaultySink(self.sink, lambda: self._fault("after_merge", batch_id)),
            self._app_id,
            catalog=self._catalog,
            table_options=self._table_options,
            metadata_columns=(
                (self.cfg.sink.metadata_columns.commit_ts, self.cfg.sink.metadata_columns.op)
                if self.cfg.sink.metadata_columns else None
            ),
            source_timezone=self.cfg.sink.source_timezone,
            ddl_handler=self._ddl_handler,
            case_sensitive=self.cfg.case_sensitive,
            journal=self.journal,
            seam=seam,
            written=written_locations(self._meta), known=written_locations(self._meta, earlier=True),
        )
        t_apply = time.monotonic()
        timings["plan"] = t_apply - t_plan
        result = applier.apply(plan.steps, batch_id)
        timings["apply"] = time.monotonic() - t_apply

        meta = next_state_meta(
            self._meta, plan, applier, result, offsets, query_id, engine="delta-rs",
            totals={"replays_dropped": plan.replays_dropped,
                    "dead_letters": len(errors) + len(screen.rejections),
                    "dead_letter_values": len(screen.rejections),
                    "implausible_ts": len(plan.rejected),
                    "snapshot_dropped": plan.snapshot_dropped},
        )
        self._mark_compactions(meta, applier.written_tables, bool(errors or screen.rejections or plan.rejected),
                               batch_id)
        self._fault("before_state", batch_id)
        t_state = time.monotonic()
        self.store.save(
            batch_id,
            PipelineState(batch_id, plan.state.watermarks, [dump_record(r) for r in plan.state.held], meta),
            app_id=self._app_id,
        )
        timings["state"] = time.monotonic() - t_state
        self._state, self._meta, self._loaded_batch = plan.state, meta, batch_id
        self.batches += 1
        self._fault("after_state", batch_id)
        # small-file compaction of the tables written (after the state: it never fails the batch)
        from ..delta.compaction import delta_rs_compaction
        timings["compact"] = self._compact(applier.written_tables, bool(errors or screen.rejections or plan.rejected),
                                           delta_rs_compaction, batch_id)
        self._progress(batch_id, offsets, counts, plan, result, len(errors) + len(screen.rejections),
                       time.monotonic() - started, timings, values=len(screen.rejections))
        self._warn_held(batch_id, plan)

    def _mark_compactions(self, meta: dict, written: Any, dead_letters: bool, batch_id: int) -> None:
        """Mark in ``meta`` (batch ``batch_id``'s state, about to be saved) the tables :meth:`_compact` will
        compact after the save (:func:`~ticdc_delta.delta.compaction.mark_due_tables`)."""
        from ..delta.compaction import mark_due_tables

        policy = self.cfg.sink.compaction
        mark_due_tables(self.sink, written, policy, meta, batch_id)
        if dead_letters:
            mark_due_tables(self.dead_letters, [DEAD_LETTER_IDENT], policy, meta, batch_id)

    def _compact(self, written: Any, dead_letters: bool, compact: Any, batch_id: int) -> float:
        """Small-file compaction after batch ``batch_id``'s state is saved (either engine, with its
        ``compact``): of the ``written`` tables and, when the batch wrote ``dead_letters``, of the dead-letter
        table. Returns the seconds spent (:func:`~ticdc_delta.delta.compaction.compact_written_tables`)."""
        from ..delta.compaction import compact_written_tables

        policy = self.cfg.sink.compaction
        spent = compact_written_tables(self.sink, written, policy, compact, self._meta, batch_id)
        if dead_letters:
            spent += compact_written_tables(self.dead_letters, [DEAD_LETTER_IDENT], policy, compact, self._meta,
                                            batch_id)
        return spent

    def _dead_letter(self, decoded: pa.Table, rows: list[int], batch_id: int) -> None:
        take = decoded.take(pa.array(rows, type=pa.int64()))
        first = take.column("error")[0].as_py()
        if self.cfg.dead_letter.fail_on_error:
            raise DecodeError(
                self.cfg.source.protocol,
                f"{len(rows)} undecodable message(s) in batch {batch_id} and dead_letter.fail_on_error is set; "
                f"first: {first}",
            )
        now = pa.array([int(time.time() * 1e6)] * len(rows), type=pa.timestamp("us", tz="UTC"))
        arrays = [take.column("topic"), take.column("partition"), take.column("offset"), take.column("key"),
                  take.column("value"), take.column("error"), pa.array([batch_id] * len(rows), type=pa.int64()), now]
        arrays += [pa.nulls(len(rows), f.type) for f in list(DEAD_LETTER_SCHEMA)[len(arrays):]]
        table = pa.Table.from_arrays(arrays, schema=DEAD_LETTER_SCHEMA)
        self.dead_letters.append(DEAD_LETTER_IDENT, table, batch_txn(self._app_id + "/dead-letter", batch_id))
        log.warning("batch %d: %d undecodable message(s) sent to %s; first: %s",
                    batch_id, len(rows), self.cfg.dead_letter_path, first)

    def _ts_guard(self, checkpoint: SparkCheckpoint, batch_id: int) -> TsGuard | None:
        """The plausibility bound of this batch (:mod:`ticdc_delta.core.ts_guard`), ``None`` when off.

        The reference clock is Spark's ``batchTimestampMs`` of the batch: written to the offset log before
        the batch runs and re-used by a re-run, so a re-run after a crash rejects exactly what the first
        attempt rejected (the plan stays a pure function of state and batch). The Kafka record timestamp
        was not chosen: a producer sets it (CreateTime), so a forged message can carry a forged one.
        Outside a streaming query (no offset log) the driver's clock is used.
        """
        tolerance = self.cfg.source.max_future_ts_ms
        if tolerance is None:
            return None
        reference = checkpoint.batch_timestamp_ms(batch_id)
        if reference is None:
            if not self._warned_clock:
                log.warning("no Spark offset log entry for batch %d under %s: the ts plausibility check uses "
                            "the driver's clock", batch_id, checkpoint.location)
                self._warned_clock = True
            reference = int(time.time() * 1000)
        return TsGuard(reference, tolerance)

    def _dead_letter_implausible(self, batch_df: Any, rejected: list[Any], batch_id: int) -> None:
        """Resolved ts / rows / DDL with an implausible ts: to the dead-letter table with the original
        message (or, under ``fail_on_error``, a terminal error before anything is committed)."""
        first = rejected[0]
        where = f"{first.topic}[{first.partition}]@{first.offset}"
        if self.cfg.dead_letter.fail_on_error:
            raise implausible_ts_error(batch_id, len(rejected), where, first.reason)
        coords = sorted({(r.topic, r.partition, r.offset) for r in rejected})
        messages: dict[tuple[str, int, int], tuple[Any, Any]] = {}
        if hasattr(batch_df, "sparkSession"):
            wanted = batch_df.sparkSession.createDataFrame(coords, "topic string, partition int, offset long")
            for row in (batch_df.join(wanted, ["topic", "partition", "offset"], "left_semi")
                        .select("topic", "partition", "offset", "key", "value").collect()):
                messages[(row["topic"], row["partition"], row["offset"])] = (row["key"], row["value"])
        reasons: dict[tuple[str, int, int], str] = {}
        for r in rejected:
            reasons.setdefault((r.topic, r.partition, r.offset), r.reason)
        now = int(time.time() * 1e6)
        columns: dict[str, list[Any]] = {name: [] for name in DEAD_LETTER_SCHEMA.names}
        for c in coords:
            key, value = messages.get(c, (None, None))
            row = {"topic": c[0], "partition": c[1], "offset": c[2], "key": key, "value": value,
                   "error": reasons[c], "batch_id": batch_id, "recorded_at": now}
            for name in columns:
                columns[name].append(row.get(name))
        table = pa.Table.from_pydict(columns, schema=DEAD_LETTER_SCHEMA)
        self.dead_letters.append(DEAD_LETTER_IDENT, table, batch_txn(self._app_id + "/dead-letter-ts", batch_id))
        log.warning("batch %d: %d message(s) with an implausible ts sent to %s; first at %s: %s",
                    batch_id, len(coords), self.cfg.dead_letter_path, where, first.reason)

    def _delta_column_types(self) -> Callable[[str, str, str], pa.DataType | None]:
        """``(schema, table, column) -> type`` of the existing Delta tables, each table read once."""
        tables: dict[tuple[str, str], dict[str, pa.DataType] | None] = {}

        def column_type(schema: str, table: str, column: str) -> pa.DataType | None:
            if (schema, table) not in tables:
                try:
                    found = self.sink.table_schema(TableIdent(schema, table))
                except TicdcDeltaError:  # no location for the name, unreadable: the apply will say so
                    found = None
                tables[(schema, table)] = None if found is None else {f.name.lower(): f.type for f in found}
            cols = tables[(schema, table)]
            return None if cols is None else cols.get(column.lower())

        return column_type

    def _dead_letter_rejections(self, rejections: list[Rejection], batch_id: int) -> None:
        """Refused changes (:class:`~ticdc_delta.delta.value_check.Rejection`) to the dead-letter table in
        one append with this batch's transaction, or, under ``dead_letter.fail_on_error``, a terminal error
        naming them, before anything of the batch is committed. Usable for any refusal that has a record."""
        if self.cfg.dead_letter.fail_on_error:
            raise UnwritableValueError(
                f"batch {batch_id}: {len(rejections)} change(s) with a value no Delta column can hold and "
                f"dead_letter.fail_on_error is set: {describe_rejections(rejections)}"
            )
        now = int(time.time() * 1e6)
        columns: dict[str, list[Any]] = {name: [] for name in DEAD_LETTER_SCHEMA.names}
        for r in rejections:
            row = {"topic": r.topic, "partition": r.partition, "offset": r.offset, "error": f"{r.where()}: {r.error}",
                   "batch_id": batch_id, "recorded_at": now, "schema": r.schema, "table": r.table,
                   "column": r.column, "column_value": value_bytes(r.value),
                   "row": None if r.record is None else _record_json(r.record)}
            for name, values in columns.items():
                values.append(row.get(name))
        table = pa.Table.from_pydict(columns, schema=DEAD_LETTER_SCHEMA)
        self.dead_letters.append(DEAD_LETTER_IDENT, table, batch_txn(self._app_id + "/dead-letter-values", batch_id))
        log.warning("batch %d: %d change(s) with a value no Delta column can hold sent to %s: %s",
                    batch_id, len(rejections), self.cfg.dead_letter_path, describe_rejections(rejections, 3))

    def _progress(self, batch_id: int, offsets: dict, counts: dict, plan: Any, result: ApplyResult,
                  dead: int, seconds: float, timings: dict[str, float], *, values: int = 0,
                  implausible: int | None = None, split: dict[str, int] | None = None,
                  columnar: list[str] | None = None, key_range: list[str] | None = None) -> None:
        """The progress line of a batch. ``implausible``: the events the ts guard refused, when ``plan`` does
        not list them (the spark engine keeps its rows' rejections on the executors); ``split``: the tables
        whose rules ran in key buckets, and how many; ``columnar``: the tables that took the columnar path;
        ``key_range``: the tables whose MERGE was bounded to its key range (both the spark engine)."""
        low, lag = _watermark_lag(plan)
        line = {
            "batch_id": batch_id,
            "changefeed": self.cfg.changefeed,
            "offsets": {f"{t}[{p}]": {"first": a, "last": b} for (t, p), (a, b) in sorted(offsets.items())},
            "events": {k: v for k, v in counts.items() if v},
            "rows_applied": result.rows,
            "ddl_applied": result.ddl_applied,
            "rows_held": plan.held,
            "replays_dropped": plan.replays_dropped,
            "dead_letters": dead,
            "dead_letter_values": values,
            "implausible_ts": len(plan.rejected) if implausible is None else implausible,
            "snapshot_dropped": getattr(plan, "snapshot_dropped", 0),
            "watermark": low,
            "watermark_lag_s": lag,
            "seconds": round(seconds, 3),
            "timings": {k: round(v, 3) for k, v in timings.items()},
        }
        if split:
            line["split_tables"] = split
        if columnar:
            line["columnar_tables"] = columnar
        if key_range:
            line["key_range_tables"] = key_range
        regressions = getattr(plan, "watermark_regressions", 0)
        if regressions:
            line["resolved_ts_regressions"] = regressions
            log.warning(
                "batch %d: %d resolved ts went back below a partition's watermark and were ignored: TiCDC sent "
                "again from an older checkpoint (a changefeed restart: its rows at or below the watermark are "
                "dropped as replays), or a second changefeed writes to these topics — whose rows are then all "
                "dropped as replays (replays_dropped): read one changefeed's topics only", batch_id, regressions)
        unresolved = [f"{t}[{p}]" for t, p in self._unresolved_partitions()]
        if unresolved:
            line["unresolved_partitions"] = unresolved
        stalled = [f"{t}[{p}]" for t, p in self._stalled_partitions(offsets)]
        if stalled:
            line["stalled_partitions"] = stalled
        empty = self._empty_topics()
        if empty:
            line["empty_topics"] = empty
        progress_log.info(json.dumps(line, sort_keys=False))

    def _warn_held(self, batch_id: int, plan: Any) -> None:
        """On the delta-rs engine held rows live in the driver's memory and are written whole to the state
        table every batch: warn when they pass :data:`HELD_ROWS_WARNING`, then each doubling, naming the
        partition that holds them back (a stalled one grows them without bound, to the driver's end)."""
        held = plan.held
        if held < self._held_warning_at:
            if held < HELD_ROWS_WARNING // 2:
                self._held_warning_at = HELD_ROWS_WARNING  # (back to normal: warn again next time)
            return
        while self._held_warning_at <= held:
            self._held_warning_at *= 2
        _, lag = _watermark_lag(plan)
        marks = self._state.watermarks if self._state is not None else {}
        slowest = min(marks.items(), key=lambda item: item[1]) if marks else None
        behind = (f"the slowest partition is {slowest[0][0]}[{slowest[0][1]}] at resolved ts {slowest[1]}"
                  if slowest else "no partition has resolved yet")
        log.warning(
            "batch %d: %d rows held waiting for the watermark (%s; %s s behind); the delta-rs engine keeps "
            "them in the driver's memory and rewrites them to the state table every batch: find why that "
            "partition does not advance (`status` lists the partitions and topics rows wait for), or run "
            "with sink.engine: spark, which keeps held rows in a staging table",
            batch_id, held, behind, "?" if lag is None else f"{lag:.0f}")

    def _empty_topics(self) -> list[str]:
        """The listed topics that hold nothing back: the broker does not have them, or they have never resolved
        and hold no message (watermark mode asks for them each batch)."""
        return [topic for topic, parts in sorted(self._seen_partitions.items()) if not parts]

    def _stalled_partitions(self, offsets: Mapping[tuple[str, int], Any]) -> list[tuple[str, int]]:
        """In watermark mode, the partitions of the listed topics that sent nothing in this batch (not in
        ``offsets``) while another's resolved ts is more than :data:`STALLED_S` ahead: every row waits for
        them. TiCDC sends every partition of a changefeed's topics the same resolved ts, about once a second,
        so one left behind is a partition it does not write to — one added to the topic while the changefeed
        ran — or a stuck changefeed or broker (a partition that sends rows is catching up: one transaction's
        rows may fill a batch's share of it). Warned each time a partition becomes stalled (the progress line
        lists them as long as they are)."""
        if self.mode != WATERMARK or self._state is None:
            return []
        listed = set(self.cfg.topics)  # (the state keeps the watermarks of a topic taken out of the list)
        now = {key: ts for key, ts in self._state.watermarks.items() if key[0] in listed}
        before, self._last_watermarks = self._last_watermarks, now
        if len(now) < 2 or not before:
            return []
        top = max(now.values())
        stalled = [key for key, ts in sorted(now.items()) if before.get(key) == ts and key not in offsets
                   and tso_physical_ms(top) - tso_physical_ms(ts) > STALLED_S * 1000]
        new = [key for key in stalled if key not in self._warned_stalled]
        self._warned_stalled = set(stalled)
        if new:
            log.warning(
                "the resolved ts of %s did not move in this batch and is over %d s behind the highest partition's: "
                "every row waits for it. TiCDC writes only to the partitions a changefeed started with — a "
                "partition added to the topic since gets nothing until the changefeed restarts (restart it, or "
                "give the old partition count as source.options.partition-num); a topic dispatcher's topic "
                "whose tables are all gone gets nothing more either (take it out of source.topics once read to "
                "its end); otherwise look at the changefeed (cdc cli changefeed query) and at the partition's "
                "leader",
                ", ".join(f"{t}[{p}]" for t, p in new), STALLED_S)
        return stalled

    def _unresolved_partitions(self) -> list[tuple[str, int]]:
        """In watermark mode, the partitions that have never sent a resolved ts while others have: no row is
        applied until they do. Warned once the first time they are seen (the usual cause: the changefeed's
        ``partition-num`` below the topic's partitions). A partition added to a topic since rows were released
        has a watermark (seeded: :func:`~ticdc_delta.core.resolved_ts.seed_new_partitions`)."""
        if self.mode != WATERMARK or self._state is None or not self._state.watermarks:
            return []
        known = self._state.watermarks
        missing = [(topic, p) for topic, parts in sorted(self._seen_partitions.items()) for p in parts
                   if (topic, p) not in known]
        if missing and not self._warned_unresolved:
            self._warned_unresolved = True
            log.warning("no resolved ts yet from %s while the other partitions have sent theirs: rows are held "
                        "until every partition resolves them. If the changefeed's sink URI sets partition-num "
                        "below the topic's partitions, give it in source.options too; a topic of a topic "
                        "dispatcher gets resolved ts only while a table of it exists (one created ahead of its "
                        "table holds rows back until then: list it once its table exists)",
                        ", ".join(f"{t}[{p}]" for t, p in missing))
        return missing


def implausible_ts_error(batch_id: int, n: int, where: str, reason: str) -> ImplausibleTimestampError:
    """The stop under ``dead_letter.fail_on_error`` for ``n`` events with an implausible ts (both engines)."""
    return ImplausibleTimestampError(
        f"batch {batch_id}: {n} event(s) with an implausible ts and dead_letter.fail_on_error is set; "
        f"first at {where}: {reason}"
    )


class _DeadLetterSink(DeltaRsSink):
    """The dead-letter table's sink: an append first adds the columns an older table lacks (nullable)."""

    def append(self, ident: TableIdent, rows: pa.Table, txn: Any) -> Any:
        existing = self.table_schema(ident)
        if existing is not None:
            missing = [f for f in rows.schema if existing.get_field_index(f.name) < 0]
            if missing:
                self.add_columns(ident, [f.with_nullable(True) for f in missing], txn)
        return super().append(ident, rows, txn)


def _record_json(record: ChangeRecord) -> str:
    """A change as the ``decode`` command prints it; ASCII JSON, so lone surrogates survive as escapes."""
    def image(cols: Any) -> Any:
        return None if cols is None else {c[0]: value_to_json(c[3]) for c in cols}

    return json.dumps({"kind": "row", "commit_ts": record.commit_ts, "schema": record.schema,
                       "table": record.table, "op": record.op, "columns": image(record.new),
                       "old": image(record.old)}, ensure_ascii=True)


def _watermark_lag(plan: Any) -> tuple[int | None, float | None]:
    """The batch's watermark (the lowest of its topics': none while a topic has none, the bound rows wait
    for) and how many seconds it is behind the clock (rounded to the millisecond)."""
    low = lowest(plan.topic_watermarks.values())
    return low, None if low is None else round(time.time() - tso_physical_ms(low) / 1000.0, 3)


def written_locations(meta: Mapping[str, Any], *, earlier: bool = False) -> dict[str, str]:
    """Where the state says each table (``schema.table``) got its rows (see ``DeltaApplier``'s ``written``);
    with ``earlier``, also where they went before a ``reset`` that reads the stream again (``known``)."""
    tables = meta.get("tables")
    keys = ("location", "earlier_location") if earlier else ("location",)
    return {name: where for name, entry in (tables.items() if isinstance(tables, dict) else ())
            if isinstance(entry, dict) and isinstance(where := next((entry[k] for k in keys if k in entry), None), str)}


def next_state_meta(previous: Mapping[str, Any], plan: Any, applier: DeltaApplier, result: ApplyResult,
                    offsets: Mapping[tuple[str, int], tuple[int, int] | list[int]], query_id: Any, *,
                    engine: str, totals: Mapping[str, int]) -> dict[str, Any]:
    """The state's ``meta`` after a batch, for either engine: applied DDL ids, the type catalog, per-table
    rows applied and commit ts, running totals (``totals`` are this batch's counts; ``rows_applied`` is
    added from ``result``), topic watermarks, the Spark query it belongs to, and where each partition goes
    on after this batch (what ``reset --from state`` restarts from), and the ``engine`` that applied it."""
    meta = dict(previous)
    meta["engine"] = engine
    meta["applied_ddl"] = [list(d) for d in plan.state.applied_ddl]
    meta["catalog"] = applier.catalog.to_json()
    tables = dict(meta.get("tables", {}))
    locations = applier.locations
    for name in applier.gone & set(tables):  # dropped or renamed away by a DDL of the batch: where it was is void
        tables[name] = {k: v for k, v in tables[name].items() if k not in ("location", "earlier_location")}
    for name in {**result.rows, **result.commit_ts}:  # (a table a DDL changed has a commit ts, maybe no rows)
        entry = dict(tables.get(name, {}))
        entry["rows_applied"] = entry.get("rows_applied", 0) + result.rows.get(name, 0)
        if name in result.commit_ts:
            entry["commit_ts"] = max(entry.get("commit_ts", 0), result.commit_ts[name])
        if name in locations:  # where its rows went (a later batch refuses to start it over elsewhere)
            entry["location"] = locations[name]
        tables[name] = entry
    meta["tables"] = tables
    running = dict(meta.get("totals", {}))
    for key, n in (*totals.items(), ("rows_applied", sum(result.rows.values()))):
        running[key] = running.get(key, 0) + n
    meta["totals"] = running
    meta["topic_watermarks"] = dict(plan.topic_watermarks)
    meta["released_low"] = getattr(plan.state, "released_low", None)
    meta["checkpoint"] = {"query_id": query_id}
    meta.pop("reset", None)
    started = meta.pop("starting_offsets", None)
    next_offsets = {t: dict(v) for t, v in meta.get("next_offsets", {}).items()}
    if isinstance(started, dict):  # a reset to offsets: a partition without messages since goes on from there
        for t, parts in started.items():
            seen = next_offsets.setdefault(t, {})
            for p, offset in parts.items():
                if int(offset) >= 0:
                    seen.setdefault(str(p), int(offset))
    for (t, p), (_, last) in offsets.items():
        seen = next_offsets.setdefault(t, {})
        seen[str(p)] = max(int(seen.get(str(p), 0)), last + 1)
    meta["next_offsets"] = next_offsets
    return meta


class _FaultySink:
    """Wraps a sink to call ``hook`` after the first data commit (fault injection for tests)."""

    def __init__(self, sink: Any, hook: Callable[[], None]) -> None:
        self._sink, self._hook, self._done = sink, hook, False

    def merge(self, *args: Any, **kwargs: Any) -> Any:
        out = self._sink.merge(*args, **kwargs)
        if not self._done:
            self._done = True
            self._hook()
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sink, name)


def kafka_partitions(cfg: JobConfig, topic: str, *, empty_as_none: bool = False) -> list[int]:
    """The partitions of ``topic`` (Kafka metadata); none when the topic does not exist (yet): TiCDC creates a
    topic of a topic dispatcher when it first writes to it. With ``empty_as_none``, none either when no
    partition holds a message (the job asks so of a topic that has never resolved: one created ahead of its
    table gets no resolved ts from TiCDC — only topics of tables that exist do —, and held every row back;
    asked after the other topics' resolved ts were read, an empty topic has nothing at or below them, as
    TiCDC writes an event before a resolved ts past it).

    Raises:
        BrokerUnavailableError: the broker did not answer, or the topic is not available (e.g. not authorized).
    """
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    consumer = Consumer({**cfg.librdkafka_conf(), "group.id": "ticdc-delta-metadata"})
    asking = "a metadata request"
    try:
        t = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if t is not None and t.error is not None and t.error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART,
                                                                         KafkaError._UNKNOWN_TOPIC):
            return []
        if t is None or t.error is not None:
            raise BrokerUnavailableError(f"topic {topic!r} is not available: {getattr(t, 'error', 'missing')}")
        partitions = sorted(t.partitions)
        if empty_as_none:  # (the same client: one connection for both requests)
            asking = "an offsets request"
            offsets = (consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in partitions)
            if not any(high > low for low, high in offsets):
                return []
        return partitions
    except KafkaException as exc:
        raise BrokerUnavailableError(
            f"Kafka at {cfg.source.bootstrap_servers} did not answer {asking}: {exc}"
        ) from None
    finally:
        consumer.close()


def kafka_log_ends(cfg: JobConfig, topic: str) -> dict[int, int]:
    """The offset after the last message of each partition of ``topic`` (none when the topic does not exist).

    Raises:
        BrokerUnavailableError: the broker did not answer.
    """
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    partitions = kafka_partitions(cfg, topic)
    consumer = Consumer({**cfg.librdkafka_conf(), "group.id": "ticdc-delta-metadata"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
    except KafkaException as exc:
        raise BrokerUnavailableError(
            f"Kafka at {cfg.source.bootstrap_servers} did not answer an offsets request: {exc}") from None
    finally:
        consumer.close()


def check_cleanup_policy(cfg: JobConfig) -> None:
    """Refuse to read a topic Kafka compacts (``cleanup.policy`` with ``compact``): compaction keeps the
    last message of each key, and TiCDC's keys do not name one row — an Open Protocol key is a table and a
    commit ts, the same for every message of a transaction's rows of a table (16 rows to a message), a
    Canal-JSON or Craft message has none — so the rows of the messages compacted away are gone, and Spark's
    source skips the gaps as it skips a transaction's markers, without a word. Avro's key is the row's
    handle key, so compaction keeps each row's last version: warned only (a delete's tombstone goes after
    ``delete.retention.ms``, so a job stopped longer misses it). A topic the job may not describe (no
    DescribeConfigs right) is warned about, unchecked; one not there yet is not checked.

    Raises:
        ConfigError: a topic is compacted (not Avro); the client settings are invalid.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import ConfigResource, ResourceType

    from .kafka_source import group_admin_client

    admin = group_admin_client(cfg.source.bootstrap_servers, cfg.source.kafka)
    futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic) for topic in cfg.topics],
                                     request_timeout=5)
    compacted = []
    for resource, future in futures.items():
        try:
            policy = future.result(timeout=10).get("cleanup.policy")
        except (KafkaException, TimeoutError) as exc:
            denied = isinstance(exc, KafkaException) and "AUTHORIZATION" in str(exc).upper()
            (log.warning if denied else log.debug)(
                "cannot read the cleanup.policy of topic %s (%s): not checked for compaction, which loses rows"
                "%s", resource.name, exc, " — grant the job's principal DESCRIBE_CONFIGS on it" if denied else "")
            continue
        if policy is not None and "compact" in (policy.value or ""):
            compacted.append(f"{resource.name} (cleanup.policy={policy.value})")
    if compacted and cfg.source.protocol == "avro":
        log.warning("Kafka compacts %s: a delete's tombstone is removed after the topic's delete.retention.ms, so "
                    "a job stopped longer than that misses the delete; set cleanup.policy=delete",
                    ", ".join(sorted(compacted)))
    elif compacted:
        raise ConfigError(
            f"source.topics: Kafka compacts {', '.join(sorted(compacted))}: compaction keeps one message per key, "
            "and TiCDC's keys do not name one row, so the rows of the messages it removes would be lost without "
            "a word. Set the topic's cleanup.policy to delete (kafka-configs --alter --entity-type topics "
            "--entity-name <topic> --add-config cleanup.policy=delete), with a retention longer than the job "
            "may ever be stopped")


def _join(base: str, leaf: str) -> str:
    return child_location(base, leaf)  # checked to stay inside the checkpoint
