"""Plan one micro-batch: which rows and DDL to apply, in which order, and what stays held.

Watermark mode (Open Protocol, Craft, Canal-JSON with ``enable-tidb-extension``), after TiCDC's own
Kafka consumer:

1. Walk every partition in offset order. A resolved ts raises that partition's watermark (a smaller one
   is a replay and ignored). A row or DDL whose commit ts is at or below its partition's watermark *at
   that point* is a replay of something already promised (a resolved ts R promises every event with
   commit ts ≤ R; a TiCDC that restarts from an older checkpoint sends them again): drop and count it.
2. The rest joins the held records. Everything with commit ts ≤ the minimum watermark over every
   partition of every topic is released; the remainder stays held (durably, in the job state). One
   bound for all the topics of a changefeed (a topic dispatcher): TiCDC writes a RENAME TABLE to the old
   table's topic and CREATE/DROP DATABASE to the default one, so a DDL in one topic orders the rows of
   another, and every topic gets the same resolved ts.
3. Released records are applied in (commit ts, partition, offset) order. DDL is applied exactly between
   the rows before and after its commit ts, once: broadcast copies (every partition but Canal-JSON's
   partition 0 only) share (commit ts, schema, table, query) and are deduplicated, also against copies
   applied in earlier batches.
4. Between DDLs, rows are collapsed to one final change per key (:mod:`.merge`).

Offset-order mode (Avro; Canal-JSON without the extension: no watermarks, maybe no commit ts): the batch
is applied as it comes — DDL first (deduplicated), then every row in (partition, offset) order per key.

In both modes a resolved ts, row or DDL whose ts is implausibly far in the future (:mod:`.ts_guard`) is
not taken: it is returned in :attr:`BatchPlan.rejected` (for the dead-letter table), neither applied nor
held, and moves no watermark.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, NamedTuple, Protocol, Sequence

from .merge import KeyResolver, TableChanges, collapse
from .pending_buffer import PendingBuffer, apply_order
from .records import ChangeRecord, DDLRecord, Record
from .resolved_ts import WatermarkTracker, live_topics, seed_new_partitions
from ..locations import fold_name
from .ts_guard import TsGuard
from .snapshot_seam import SnapshotSeam

__all__ = [
    "WATERMARK",
    "OFFSET_ORDER",
    "ResolvedMark",
    "RejectedTs",
    "RecordScreen",
    "ConsumerState",
    "RowsStep",
    "BatchPlan",
    "plan_batch",
]

WATERMARK = "watermark"
OFFSET_ORDER = "offset-order"


class ResolvedMark(NamedTuple):
    """A resolved ts / watermark event at its Kafka coordinates."""

    topic: str
    partition: int
    offset: int
    idx: int
    ts: int


class RejectedTs(NamedTuple):
    """A resolved mark, row or DDL not taken because its ts is implausible, with the reason."""

    topic: str
    partition: int
    offset: int
    idx: int
    kind: str  # "resolved" | "row" | "ddl"
    ts: int
    reason: str


class RecordScreen(Protocol):
    """Keeps row changes the sink cannot take out of a plan (see :func:`plan_batch`)."""

    def rows(self, records: list[ChangeRecord]) -> list[ChangeRecord]:
        """The changes of ``records`` (in apply order) to apply; it records why it dropped the others."""
        ...

    def ddl(self, record: DDLRecord) -> None:
        """A DDL that will be applied before the rows that follow."""
        ...


@dataclass
class ConsumerState:
    """What must survive a restart besides the Kafka offsets: watermarks, held records and the
    identities of DDL already applied (to drop late broadcast copies)."""

    watermarks: dict[tuple[str, int], int] = field(default_factory=dict)
    held: list[Record] = field(default_factory=list)
    applied_ddl: list[tuple[Any, ...]] = field(default_factory=list)
    # the highest bound rows were released up to (watermark mode), None before any: a partition added to
    # a topic since starts from it (resolved_ts.seed_new_partitions)
    released_low: int | None = None


@dataclass
class RowsStep:
    """Rows to merge, per table, between two DDLs."""

    tables: dict[tuple[str, str], TableChanges]


@dataclass
class BatchPlan:
    """The ordered steps of one micro-batch, the state after it, and its counters."""

    steps: list[RowsStep | DDLRecord]
    state: ConsumerState
    replays_dropped: int = 0
    duplicate_ddl: int = 0
    watermark_regressions: int = 0
    rows_released: int = 0
    topic_watermarks: dict[str, int | None] = field(default_factory=dict)
    rejected: list[RejectedTs] = field(default_factory=list)
    snapshot_dropped: int = 0

    @property
    def held(self) -> int:
        return len(self.state.held)


def _order(item: Record | ResolvedMark) -> tuple[str, int, int, int]:
    return (item.topic, item.partition, item.offset, item.idx)


def plan_batch(
    state: ConsumerState,
    records: Iterable[Record],
    resolved: Iterable[ResolvedMark],
    *,
    mode: str,
    keys: KeyResolver,
    partitions: Mapping[str, Iterable[int]] | None = None,
    guard: TsGuard | None = None,
    case_sensitive: bool = False,
    screen: RecordScreen | None = None,
    seam: SnapshotSeam | None = None,
) -> BatchPlan:
    """Plan a micro-batch from the previous ``state`` and the batch's decoded records and resolved marks.

    ``partitions`` names every partition of each topic (a partition that has sent nothing yet still
    holds back every topic). The function is deterministic: the same state and input give the same plan,
    which is what lets a re-run of a crashed micro-batch commit exactly what the first attempt would have
    (``guard``, when given, must be built from a clock that is itself the same on a re-run).

    Schema and table names enter here: unless ``case_sensitive``, every record's (and every held
    record's) names are folded to lower case (:func:`ticdc_delta.locations.fold_name`), so ``Orders``,
    ``orders`` and ``SHOP.orders`` are one table for keys, collapsing, the catalog and the location.

    ``screen``, when given, sees the row changes about to be applied in apply order, before they are
    collapsed per key, and the DDL between them; the changes it drops are neither applied nor held (the
    job's :class:`~ticdc_delta.delta.value_check.ValueScreen` drops values no Delta column can hold). It
    must decide from the records alone, so that the plan stays deterministic.

    ``seam``, when given, drops the rows and DDL a table's snapshot already holds (commit ts ≤ its
    snapshot TSO, :mod:`.snapshot_seam`), new and held alike; they are counted in
    :attr:`BatchPlan.snapshot_dropped`.

    Raises:
        ValueError: unknown mode; MissingKeyError (from :mod:`.merge`) for a row without its key.
    """
    if mode not in (WATERMARK, OFFSET_ORDER):
        raise ValueError(f"unknown mode {mode!r}")
    if not case_sensitive:
        records = _fold_names(records)
        if state.held:
            state = replace(state, held=_fold_names(state.held))
    rejected: list[RejectedTs] = []
    if guard is not None:
        records = _plausible(records, guard, rejected)
        resolved = _plausible(resolved, guard, rejected)
    snapshot_dropped = 0
    if seam:
        records, snapshot_dropped = seam.split(records)
        if state.held:
            held, dropped_held = seam.split(state.held)
            snapshot_dropped += dropped_held
            state = replace(state, held=held)
    if mode == OFFSET_ORDER:
        plan = _plan_offset_order(state, records, keys, screen)
        plan.rejected = rejected
        plan.snapshot_dropped = snapshot_dropped
        return plan

    tracker = WatermarkTracker(seed_new_partitions(state.watermarks, partitions, state.released_low))
    for topic, parts in (partitions or {}).items():
        tracker.add_partitions(topic, parts)
    pending = PendingBuffer(state.held)
    replays = 0
    items: list[Record | ResolvedMark] = [*records, *resolved]
    items.sort(key=_order)
    for item in items:
        if isinstance(item, ResolvedMark):
            tracker.observe(item.topic, item.partition, item.ts)
            continue
        wm = tracker.partition_watermark(item.topic, item.partition)
        if wm is not None and item.commit_ts is not None and item.commit_ts <= wm:
            replays += 1
            continue
        pending.add(item)

    released: list[Record] = []
    topic_wms: dict[str, int | None] = {}
    # the topics the job reads now: a topic taken out of the configuration keeps its watermarks in the
    # state, and would hold every row back; a listed topic that does not exist yet (no partitions, never
    # read: TiCDC creates a topic dispatcher's topic when it first writes to it) holds nothing back either
    topics = live_topics(partitions, state.watermarks) if partitions else tracker.topics()
    low = tracker.global_low(topics)
    for topic in topics:
        topic_wms[topic] = tracker.topic_watermark(topic)
    # the records of every topic are released up to that bound, those of a topic taken out of the
    # configuration too (read to its end, as the docs ask, its records held so far — a RENAME, a DROP, rows —
    # are complete up to any resolved ts of the changefeed: they were stranded in the state for good)
    for topic in pending.topics():
        released.extend(pending.release(topic, low))
    released.sort(key=apply_order)
    released = renames_in_order(released, case_sensitive)

    applied = set(state.applied_ddl)
    steps, duplicate_ddl, new_ddl = _steps(released, keys, applied, screen)
    # A DDL copy older than every watermark would be dropped as a replay anyway: forget it.
    kept_ddl = [d for d in (*state.applied_ddl, *new_ddl) if low is None or (d[0] or 0) >= low]
    released_low = state.released_low if low is None else max(low, state.released_low or low)
    new_state = ConsumerState(tracker.snapshot(), list(pending), sorted(set(kept_ddl), key=_ddl_sort), released_low)
    return BatchPlan(
        steps,
        new_state,
        replays_dropped=replays,
        duplicate_ddl=duplicate_ddl,
        watermark_regressions=tracker.regressions,
        rows_released=sum(1 for r in released if isinstance(r, ChangeRecord)),
        topic_watermarks=topic_wms,
        rejected=rejected,
        snapshot_dropped=snapshot_dropped,
    )


def renames_in_order(records: list[Record], case_sensitive: bool = False) -> list[Record]:
    """``records`` (in apply order) with each run of DDL of one commit ts from several topics ordered so that a
    RENAME that moves a table away goes before one, in another topic, that takes its name.

    TiCDC splits ``RENAME TABLE a TO a_old, b TO a`` (the cut-over of gh-ost or pt-online-schema-change) into
    one DDL event per table, all of the statement's commit ts, each written to the old table's topic: with a
    topic dispatcher the events' only order is their topics' names, which may put ``b TO a`` first — refused
    (``a`` is still there), on every retry. DDL of one topic keep their order (the statement's); so does a
    run that this rule would turn into a cycle (``a TO tmp, b TO a, tmp TO b`` across three topics: which
    name was free is not in the events). A pure function of the records: a re-run orders them alike."""
    out: list[Record] = []
    i = 0
    while i < len(records):
        first, j = records[i], i + 1
        if isinstance(first, DDLRecord):
            while j < len(records) and isinstance(records[j], DDLRecord) and records[j].commit_ts == first.commit_ts:
                j += 1
        group = records[i:j]
        out.extend(_by_renames(group, case_sensitive) if len({r.topic for r in group}) > 1 else group)
        i = j
    return out


def _by_renames(group: list[Record], case_sensitive: bool) -> list[Record]:
    """One commit ts's DDL from several topics (:func:`renames_in_order`): a stable topological order."""
    from ..schema.ddl import RenameTable, parse_ddl

    fold = (lambda n: n) if case_sensitive else fold_name
    moves: list[list[tuple[tuple[str, str], tuple[str, str]]]] = []
    for rec in group:
        assert isinstance(rec, DDLRecord)  # noqa: S101 - renames_in_order groups DDL only
        try:
            changes = parse_ddl(rec.query, default_schema=rec.schema, ddl_type=rec.ddl_type)
        except Exception:  # noqa: BLE001 - a DDL the parser cannot read renames nothing here (the applier says why)
            changes = []
        moves.append([((fold(c.schema), fold(c.table)), (fold(c.new_schema), fold(c.new_table)))
                      for c in changes if isinstance(c, RenameTable)])
    before: list[set[int]] = [set() for _ in group]  # the DDL each one must follow
    for b, rec in enumerate(group):
        for a in range(b):
            if group[a].topic == rec.topic:  # (one topic: the statement's order)
                before[b].add(a)
            elif any(old == new_b for old, _ in moves[a] for _, new_b in moves[b]):
                before[b].add(a)  # a moves away the table whose name b takes
            elif any(old == new_a for old, _ in moves[b] for _, new_a in moves[a]):
                before[a].add(b)
    order: list[int] = []
    left = list(range(len(group)))
    while left:
        ready = next((k for k in left if before[k] <= set(order)), None)
        if ready is None:  # a cycle: the apply order as it is
            return group
        order.append(ready)
        left.remove(ready)
    return [group[k] for k in order]


def _plausible(items: Iterable[Any], guard: TsGuard, rejected: list[RejectedTs]) -> list[Any]:
    """The items whose ts passes ``guard``; the others are appended to ``rejected``."""
    kept = []
    for item in items:
        if isinstance(item, ResolvedMark):
            kind, ts, what = "resolved", item.ts, "resolved ts"
        else:
            kind, ts, what = item.kind, item.commit_ts, f"{item.kind} commit ts"
        reason = guard.check(ts, what)
        if reason is None:
            kept.append(item)
        else:
            rejected.append(RejectedTs(item.topic, item.partition, item.offset, item.idx, kind, ts, reason))
    rejected.sort(key=lambda r: (r.topic, r.partition, r.offset, r.idx))
    return kept


def _fold_names(records: Iterable[Record]) -> list[Record]:
    """``records`` with schema and table names lower-cased (TiDB compares them case-insensitively)."""
    out: list[Record] = []
    for rec in records:
        schema, table = fold_name(rec.schema), fold_name(rec.table)
        if schema != rec.schema or table != rec.table:
            rec = rec._replace(schema=schema, table=table)
        out.append(rec)
    return out


def _ddl_sort(identity: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple("" if v is None else v for v in identity)


def _steps(
    ordered: Sequence[Record], keys: KeyResolver, applied: set[tuple[Any, ...]], screen: RecordScreen | None = None
) -> tuple[list[RowsStep | DDLRecord], int, list[tuple[Any, ...]]]:
    steps: list[RowsStep | DDLRecord] = []
    duplicates = 0
    new_ddl: list[tuple[Any, ...]] = []
    run: list[ChangeRecord] = []

    def flush() -> None:
        rows = screen.rows(run) if screen is not None and run else run
        if rows:
            steps.append(RowsStep(collapse(rows, keys)))
        run.clear()

    for rec in ordered:
        if isinstance(rec, DDLRecord):
            ident = rec.identity()
            if ident in applied:
                duplicates += 1
                continue
            applied.add(ident)
            new_ddl.append(ident)
            flush()
            if screen is not None:
                screen.ddl(rec)
            steps.append(rec)
        else:
            run.append(rec)
    flush()
    return steps, duplicates, new_ddl


def _plan_offset_order(
    state: ConsumerState, records: Iterable[Record], keys: KeyResolver, screen: RecordScreen | None = None
) -> BatchPlan:
    # records held by an earlier batch in watermark mode (the job's mode changed since: the stream no longer
    # carries resolved ts) first, as they came, then the batch's: applied, not dropped
    ordered = [*sorted(state.held, key=_order), *sorted(records, key=_order)]
    ddl = [r for r in ordered if isinstance(r, DDLRecord)]
    rows = [r for r in ordered if isinstance(r, ChangeRecord)]
    applied = set(state.applied_ddl)
    steps, duplicates, new_ddl = _steps(ddl, keys, applied, screen)
    kept_rows = screen.rows(rows) if screen is not None and rows else rows
    if kept_rows:
        steps.append(RowsStep(collapse(kept_rows, keys)))
    # Without commit ts there is no watermark to age DDL identities out; keep the most recent ones.
    kept = [*state.applied_ddl, *new_ddl][-1000:]
    return BatchPlan(
        steps,
        replace(state, watermarks=dict(state.watermarks), held=[], applied_ddl=kept),
        duplicate_ddl=duplicates,
        rows_released=len(rows),
    )
