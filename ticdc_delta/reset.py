"""``python -m ticdc_delta reset``: start a changefeed over, consistently, from chosen Kafka offsets.

The job keeps two stores that must move together (:mod:`ticdc_delta.spark.checkpoint`): Spark's
checkpoint (``{checkpoint}/spark``: which offsets each batch read) and the job state (``{checkpoint}/state``:
watermarks, held rows, DDL bookkeeping, type catalog). When they disagree the job stops with a
:class:`~ticdc_delta.errors.CheckpointMismatchError`; ``reset`` is the way on. It

1. writes a new job state: watermarks and held rows cleared — or kept, with ``--from state`` — the type
   catalog and applied-DDL ids kept (the Delta tables keep their columns; a DDL read again is not applied
   twice), the chosen starting offsets, and the next *epoch*;
2. deletes Spark's checkpoint, so the next run starts a new query at batch 0 from those offsets.

The epoch (random) suffixes the Delta app-transaction id (``<changefeed>~<epoch>``): batch ids restart at 0
and must not be mistaken for batches committed before the reset. Both steps can be repeated: if ``reset`` is
interrupted, the job refuses to run (the two stores disagree) and running ``reset`` again completes it.

Starting points:

- ``earliest`` / ``latest``: every partition from its earliest / latest offset. Re-reading applies the
  changes again (as upserts by key, in order): the tables converge to the upstream's state at the end of
  what was read. ``latest`` skips everything not yet read — rows of that range are not in the tables.
- explicit offsets ``{topic: {partition: offset}}`` (``-2`` earliest, ``-1`` latest); name every partition.
- ``state``: the offsets right after the last batch the state committed, keeping the watermarks and held
  rows: the recovery when only Spark's checkpoint was lost (nothing is read twice or skipped). Partitions
  the job never read start at earliest; this asks the broker for the topics' partitions.

The job must not run while ``reset`` does (a running job then stops with
:class:`~ticdc_delta.errors.ConcurrentJobError` at its next state commit).
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Mapping, Sequence

from .config import JobConfig
from .delta.state_store import RESET_BATCH_ID, PipelineState, StateStore, epoch_app_id
from .errors import CheckpointMismatchError, SinkError
from .locations import local_path

__all__ = ["ResetPlan", "plan_reset", "apply_reset", "STATE_START"]

log = logging.getLogger(__name__)

STATE_START = "state"
"""``--from state``: continue right after the last batch the state committed."""


@dataclass
class ResetPlan:
    """What :func:`apply_reset` will do, for the confirmation prompt."""

    checkpoint: str
    previous_batch: int | None
    previous_query_id: str | None
    epoch: str
    starting_offsets: Any
    keep_position: bool
    state: PipelineState

    def describe(self) -> str:
        was = "no job state" if self.previous_batch is None else (
            f"job state after batch {self.previous_batch} (Spark query {self.previous_query_id})"
        )
        keep = "kept" if self.keep_position else "cleared"
        return (
            f"reset changefeed checkpoint {self.checkpoint}: {was}; watermarks and held rows {keep}, type "
            f"catalog and applied DDL kept; {self.checkpoint}/spark deleted; next run starts at batch 0 "
            f"(epoch {self.epoch}) from offsets {self.starting_offsets}"
        )


def _state_store(cfg: JobConfig) -> StateStore:
    return StateStore(cfg.checkpoint.rstrip("/") + "/state", cfg.changefeed,
                      storage_options=cfg.sink.storage_options or None)


def plan_reset(
    cfg: JobConfig,
    start: str | Mapping[str, Mapping[int, int]],
    *,
    partitions_of: Callable[[str], list[int]] | None = None,
    ends_of: Callable[[str], Mapping[int, int]] | None = None,
) -> ResetPlan:
    """Decide the new state for starting over from ``start`` (``earliest``, ``latest``, ``state`` or a
    ``{topic: {partition: offset}}`` mapping). Reads the state; changes nothing.

    Raises:
        ValueError: a mapping naming a topic the job does not read, leaving out a source topic or one of its
            partitions, or naming a partition the topic does not have; ``state`` without a saved state.
        SinkError: the state table cannot be read.
        BrokerUnavailableError: ``state`` or a mapping: the broker did not list the topics' partitions
            (``partitions_of``: a topic's partitions, by default the broker's; ``ends_of``: the offset after
            each partition's last message, by default the broker's when ``partitions_of`` is not given).
    """
    store = _state_store(cfg)
    saved = store.load()
    meta: dict[str, Any] = dict(saved.meta) if saved is not None else {}
    known = meta.get("checkpoint")
    previous_query = known.get("query_id") if isinstance(known, dict) else None
    # a fresh random epoch: tables may hold transactions of any earlier epoch of this changefeed
    epoch = uuid.uuid4().hex[:12]
    keep_position = start == STATE_START
    if keep_position:
        if saved is None:
            raise ValueError(f"--from state: there is no job state in {store.path} to continue from")
        _refuse_a_batch_stopped_past_a_table_ddl(cfg, meta, saved.batch_id + 1)
        starting: Any = _offsets_after_state(cfg, meta, partitions_of)
        _refuse_offsets_past_the_end(starting, ends_of or (_broker_ends(cfg) if partitions_of is None else None))
    elif isinstance(start, str):
        if start not in ("earliest", "latest"):
            raise ValueError(f"start must be earliest, latest, state or a mapping, got {start!r}")
        starting = start
    else:
        starting = {str(t): {int(p): int(o) for p, o in parts.items()} for t, parts in start.items()}
        unknown = sorted(set(starting) - set(cfg.topics))
        if unknown:
            raise ValueError(f"offsets name topic(s) {unknown} the job does not read (source topics: {cfg.topics})")
        # Spark's Kafka source refuses to start with specific offsets for only some topics, or only some
        # partitions of a topic: checked against the broker before anything is deleted (a topic that does
        # not exist yet is left out: it is read from its start once it exists)
        partitions_of = partitions_of or _broker_partitions(cfg)
        broker = {t: set(partitions_of(t)) for t in cfg.topics}
        missing = [t for t in cfg.topics if t not in starting and broker[t]]
        if missing:
            raise ValueError(f"offsets must name every partition of every source topic; none given for {missing}")
        starting = {t: given for t, given in starting.items() if given or broker[t]}
        for topic, given in starting.items():
            have = broker[topic]
            left_out, unknown = sorted(have - set(given)), sorted(set(given) - have)
            if left_out or unknown:
                raise ValueError(
                    f"offsets must name every partition of {topic} ({len(have)} on the broker): "
                    + "; ".join(([f"partition(s) {left_out} not named"] if left_out else [])
                                + ([f"partition(s) {unknown} do not exist"] if unknown else [])))
    # kept: what describes the Delta tables (types, DDL taken, snapshot seams, counters); with --from state
    # also where the held rows are (the spark engine keeps them in its staging table, by batch)
    kept: tuple[str, ...] = ("catalog", "applied_ddl", "tables", "totals", "snapshots")
    kept += ("staging_batch", "staging_app", "held_layouts", "held_by_table", "topic_watermarks",
             "released_low") if keep_position else ()
    new_meta = {k: v for k, v in meta.items() if k in kept}
    if not keep_position and isinstance(new_meta.get("tables"), dict):
        # the stream is read again: a table deleted to be built again from it is made anew, not refused; where
        # its rows went stays known as an earlier location (the tables that share one still do: their DDL that
        # would change the others' rows are refused again)
        new_meta["tables"] = {name: _forget_location(entry) for name, entry in new_meta["tables"].items()}
    if not keep_position and start != "latest" and new_meta.get("applied_ddl"):
        # read again, a DDL that removes rows must remove them again, after the rows before it came back
        # (--from latest reads nothing again: a copy of an applied DDL still to come, on a partition TiCDC
        # had not written it to yet, stays applied)
        new_meta["applied_ddl"] = [i for i in new_meta["applied_ddl"] if not _removes_rows(i)]
    new_meta["epoch"] = epoch
    new_meta["resets"] = int(meta.get("resets", 0)) + 1
    new_meta["starting_offsets"] = starting
    if keep_position:
        new_meta["next_offsets"] = meta.get("next_offsets", {})
    new_meta["reset"] = {
        "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "previous_batch": None if saved is None else saved.batch_id,
        "previous_query_id": previous_query,
    }
    state = PipelineState(
        RESET_BATCH_ID,
        dict(saved.watermarks) if keep_position and saved is not None else {},
        list(saved.held) if keep_position and saved is not None else [],
        new_meta,
    )
    return ResetPlan(cfg.checkpoint.rstrip("/"), None if saved is None else saved.batch_id, previous_query,
                     epoch, starting, keep_position, state)


def _refuse_a_batch_stopped_past_a_table_ddl(cfg: JobConfig, meta: Mapping[str, Any], batch_id: int) -> None:
    """``--from state`` reads the batch after the state's again, under a new epoch. When that batch stopped
    after its DDL journal entry (a RENAME / DROP / CREATE TABLE, DROP DATABASE it may have run), the rows
    before the DDL would be merged again into tables the DDL moved (a stale table, then a refused move):
    only a re-run of that batch itself (its Spark checkpoint) can finish it.

    Raises:
        ValueError: there is such an entry.
        SinkError: the journal cannot be read.
    """
    from .delta.ddl_journal import DDLJournal

    journal = DDLJournal(cfg.checkpoint.rstrip("/") + "/ddl_journal", storage_options=cfg.sink.storage_options or None)
    entry = journal.load(epoch_app_id(cfg.changefeed, meta), batch_id)
    if entry is not None:
        raise ValueError(
            f"--from state: batch {batch_id} stopped part-way, after committing what came before its DDL "
            f"{entry.ddl[1]!r} (commit ts {entry.ddl[0]}), which moves or drops tables; read again from the "
            f"state it would re-create tables that DDL moved. Restore the matching {cfg.checkpoint}/spark and "
            "run the job to finish that batch, or reset to offsets after that DDL"
        )


def _removes_rows(identity: Sequence[Any]) -> bool:
    """Whether the DDL of an applied-DDL identity (:meth:`~ticdc_delta.core.records.DDLRecord.identity`)
    removes rows: TRUNCATE / DROP TABLE, DROP DATABASE, DROP / TRUNCATE / EXCHANGE PARTITION (or cannot be
    read: then it is applied again too, as every DDL the kept identities do not name)."""
    from .schema import ddl as d

    try:
        schema, query = str(identity[1]), str(identity[3])
        changes = d.parse_ddl(query, default_schema=schema)
    except Exception:  # noqa: BLE001 - an identity or statement of another form
        return True
    return any(isinstance(c, (d.TruncateTable, d.DropTable, d.DropDatabase))
               or (isinstance(c, d.NoOp) and c.affects_data) for c in changes)


def _broker_partitions(cfg: JobConfig) -> Callable[[str], list[int]]:
    """A topic's partitions as the broker lists them (BrokerUnavailableError when it does not answer)."""
    from .spark.batch_handler import kafka_partitions

    def partitions_of(topic: str) -> list[int]:
        return kafka_partitions(cfg, topic)

    return partitions_of


def _forget_location(entry: Any) -> Any:
    """A state ``tables`` entry without its ``location``, kept as its ``earlier_location``."""
    if not isinstance(entry, dict) or "location" not in entry:
        return entry
    kept = {k: v for k, v in entry.items() if k != "location"}
    kept["earlier_location"] = entry["location"]
    return kept


def _broker_ends(cfg: JobConfig) -> Callable[[str], Mapping[int, int]]:
    """The offset after each partition's last message, as the broker says (BrokerUnavailableError when it
    does not answer)."""
    from .spark.batch_handler import kafka_log_ends

    return lambda topic: kafka_log_ends(cfg, topic)


def _refuse_offsets_past_the_end(starting: Mapping[str, Mapping[int, int]],
                                 ends_of: Callable[[str], Mapping[int, int]] | None) -> None:
    """Refuse to continue from the state at an offset past a partition's end: the topic was deleted and
    made again (or its log cut), and its new messages sit below where the job stopped. Spark's source
    stops at such a range as lost data, and told to skip lost data, skips the new messages up to the old
    offset; either way the new topic's messages would not be read."""
    if ends_of is None:
        return
    past = []
    for topic, parts in starting.items():
        ends = ends_of(topic)
        # (-2: a partition the job never read, started at earliest; one the broker no longer has is past too)
        past += [(topic, p, offset, ends.get(p)) for p, offset in sorted(parts.items())
                 if offset >= 0 and (p not in ends or offset > ends[p])]
    if past:
        shown = ", ".join(f"{t}[{p}] " + ("is not on the broker" if end is None else f"ends at {end}")
                          + f", the state stopped at {offset}" for t, p, offset, end in past)
        raise ValueError(
            f"--from state: {shown}: the topic was deleted and made again (or its log cut), so continuing from "
            "the state would skip its messages. Start those partitions at the new topic's first offset with "
            "`reset --offset TOPIC:PARTITION=OFFSET ...` (every partition of every topic; -2 is earliest) or "
            "`--from earliest`, which clear the held rows and watermarks; if the changefeed was made again "
            "too, start where it began writing")


def _offsets_after_state(
    cfg: JobConfig, meta: Mapping[str, Any], partitions_of: Callable[[str], list[int]] | None
) -> dict[str, dict[int, int]]:
    partitions_of = partitions_of or _broker_partitions(cfg)
    seen = meta.get("next_offsets") or {}
    out: dict[str, dict[int, int]] = {}
    for topic in cfg.topics:
        done = {int(p): int(o) for p, o in (seen.get(topic) or {}).items()}
        # -2 = earliest (Spark's startingOffsets JSON): a partition this job never read from
        parts = {p: done.get(p, -2) for p in sorted(set(partitions_of(topic)) | set(done))}
        if parts:  # (a topic that does not exist yet: read from its start once it does)
            out[topic] = parts
    return out


def apply_reset(cfg: JobConfig, plan: ResetPlan, *, spark: Any = None) -> None:
    """Write the planned state, then delete Spark's checkpoint (in that order: an interrupted reset leaves
    a state that says "reset" next to an old checkpoint, which the job refuses; run reset again).

    Raises:
        SinkError: the state cannot be written or the checkpoint not deleted.
        CheckpointMismatchError: the state changed since :func:`plan_reset` read it.
    """
    store = _state_store(cfg)
    current = store.load()
    if (None if current is None else current.batch_id) != plan.previous_batch:
        raise CheckpointMismatchError(
            f"job state {store.path} moved from batch {plan.previous_batch} to "
            f"{None if current is None else current.batch_id} while resetting: is a job still running? "
            "Stop it and run reset again"
        )
    store.reset(plan.state)
    _delete_dir(plan.checkpoint + "/spark", spark)
    log.warning("%s", plan.describe())


def _delete_dir(path: str, spark: Any) -> None:
    local = local_path(path)
    try:
        if local is not None:
            if os.path.exists(local):
                shutil.rmtree(local)
        elif spark is not None:
            jvm = spark._jvm  # noqa: SLF001 - Hadoop's FileSystem: every scheme Spark can checkpoint to
            hpath = jvm.org.apache.hadoop.fs.Path(path)
            hpath.getFileSystem(spark._jsc.hadoopConfiguration()).delete(hpath, True)  # noqa: SLF001
        else:
            import pyarrow.fs as pafs

            fs, root = pafs.FileSystem.from_uri(path.replace("s3a://", "s3://", 1))
            if fs.get_file_info(root).type != pafs.FileType.NotFound:
                fs.delete_dir(root)
    except Exception as exc:  # noqa: BLE001 - named and typed for the operator
        raise SinkError(f"cannot delete the Spark checkpoint {path}: {exc}; delete it by hand") from exc
