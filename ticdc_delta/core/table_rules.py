"""The consumer rules split in two: a small driver part and a per-table part that runs where the rows are.

:func:`~.batch_planner.plan_batch` applies every rule to one list of records on one machine. The Spark
engine keeps rows on the executors, so it runs the same rules in two parts that together give the same
plan:

1. **Driver** (:func:`plan_coordination`): ``plan_batch`` itself over the small records only — resolved
   marks and DDL (new and held). That yields the watermarks, the DDL steps (released, deduplicated, in
   apply order), held DDL, the plausibility rejections of marks and DDL, and :class:`TableRules`: what
   every executor needs to know to place a row.
2. **Per table** (:meth:`TableRules.apply_table`, on an executor, one call per table): the rows of one
   table (new ones and those held from earlier batches) through the same rules — plausibility, replay drop
   (commit ts at or below its partition's watermark *at its offset*, i.e. after the marks before it), release
   up to the lowest watermark of the topics, the DDL segment it falls in, the record screen, then
   :func:`~.merge.collapse` — one final change per key per segment.

Every rule used by both parts is the one defined in :mod:`.batch_planner`, :mod:`.pending_buffer`,
:mod:`.merge` and :mod:`.ts_guard`; ``tests/core/test_table_rules.py`` checks that the two parts together
equal ``plan_batch`` on generated streams.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import Any, Callable, Container, Iterable, Mapping, Sequence

from ..locations import fold_name
from .batch_planner import (
    OFFSET_ORDER, WATERMARK, BatchPlan, ConsumerState, RecordScreen, RejectedTs, ResolvedMark, _order, plan_batch,
)
from .merge import KeyResolver, TableChanges, collapse
from .pending_buffer import apply_order
from .records import ChangeRecord, DDLRecord, Record
from .resolved_ts import lowest, seed_new_partitions
from .snapshot_seam import SnapshotSeam
from .ts_guard import TsGuard

__all__ = ["TableRules", "TableOutcome", "plan_coordination", "RELEASED", "HELD", "SNAPSHOT", "REPLAY"]

RELEASED = "released"
"""A row applied in this batch (:meth:`TableRules.place`)."""
HELD = "held"
"""A row held for a later batch: its commit ts is past the lowest watermark of the job's topics."""
SNAPSHOT = "snapshot"
"""A row its table's snapshot already holds (dropped)."""
REPLAY = "replay"
"""A row at or below its partition's watermark at its offset: a replay (dropped)."""


@dataclass
class TableOutcome:
    """One table's share of a micro-batch: its collapsed changes per DDL segment (segment ``i`` lies
    after the first ``i`` DDL steps of the batch), the rows still held, and what was dropped."""

    segments: list[tuple[int, TableChanges]] = field(default_factory=list)
    held: list[ChangeRecord] = field(default_factory=list)
    replays: int = 0
    released: int = 0
    snapshot_dropped: int = 0
    rejected: list[RejectedTs] = field(default_factory=list)


@dataclass(frozen=True)
class TableRules:
    """What an executor needs to apply the row rules of one micro-batch to one table (picklable, small:
    a few numbers per partition, resolved mark and DDL).

    ``marks``: per ``(topic, partition)`` the resolved marks of the batch that passed the guard, as
    ``((offset, idx), watermark after it)`` in offset order; ``start``: the watermarks before the batch.
    """

    mode: str
    start: Mapping[tuple[str, int], int]
    marks: Mapping[tuple[str, int], tuple[tuple[tuple[int, int], ...], tuple[int, ...]]]
    topic_watermarks: Mapping[str, int | None]
    ddl_steps: tuple[DDLRecord, ...]
    guard: TsGuard | None = None
    case_sensitive: bool = False
    seam: SnapshotSeam | None = None
    # per DDL step, the (folded) tables it can change, or None: every table (the default, and the answer for
    # anything not known to touch named tables only). A table's rows move past the steps that leave it alone,
    # so it gets one MERGE per DDL *of its own* in a batch instead of one per DDL of the batch.
    concerns: tuple[frozenset[tuple[str, str]] | None, ...] | None = None
    _placers: dict[tuple[str, str], Callable[..., Any]] = field(default_factory=dict, init=False, repr=False,
                                                                compare=False)  # (placer per table, not pickled)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_placers": {}}

    def segment_of(self, record: Record) -> int:
        """How many DDL steps of the batch come before ``record``."""
        if self.mode == OFFSET_ORDER:
            return len(self.ddl_steps)  # every DDL first, then the rows (offset-order plan)
        return bisect_right(self._ddl_order, apply_order(record))

    @property
    def _ddl_order(self) -> list[tuple[Any, ...]]:
        return [apply_order(d) for d in self.ddl_steps]

    def apply_table(
        self,
        new: Iterable[ChangeRecord],
        held: Iterable[ChangeRecord],
        keys: KeyResolver,
        screen: RecordScreen | None = None,
        *,
        secondary: Container[tuple[str, int, int, int]] = (),
        owns: Callable[[tuple[Any, ...]], bool] | None = None,
    ) -> TableOutcome:
        """The rules for the rows of one table: ``new`` from this batch, ``held`` from earlier batches.

        For one key bucket of a table (:mod:`.key_buckets`): the records whose coordinates ``(topic,
        partition, offset, idx)`` are in ``secondary`` only complete the history of this bucket's keys
        (they count nowhere and are neither held nor rejected here: their own bucket does that), and only
        the final changes of keys ``owns`` accepts are kept.

        Raises:
            MissingKeyError: a row without its key columns (from :func:`~.merge.collapse`).
        """
        out = TableOutcome()
        fold = (lambda r: r) if self.case_sensitive else _fold
        released: list[ChangeRecord] = []

        def counted(rec: ChangeRecord) -> bool:
            return not secondary or (rec.topic, rec.partition, rec.offset, rec.idx) not in secondary

        for rec, is_held in [*((fold(r), True) for r in held), *((r, False) for r in sorted(map(fold, new), key=_order))]:
            where = self.place(rec, held=is_held)
            if where == RELEASED:
                released.append(rec)
            elif where == HELD:
                if counted(rec):
                    out.held.append(rec)
            elif where == SNAPSHOT:
                out.snapshot_dropped += counted(rec)
            elif where == REPLAY:
                out.replays += counted(rec)
            elif counted(rec):  # a RejectedTs
                out.rejected.append(where)  # type: ignore[arg-type]
        if self.mode == WATERMARK:
            released.sort(key=apply_order)
            out.held.sort(key=apply_order)
        else:
            released.sort(key=_order)
        out.released = sum(map(counted, released)) if secondary else len(released)
        order = self._ddl_order
        own = self._own_steps(released[0]) if released and self.concerns is not None else None
        by_segment: dict[int, list[ChangeRecord]] = {}
        for rec in released:
            seg = len(order) if self.mode == OFFSET_ORDER else bisect_right(order, apply_order(rec))
            if own is not None:  # just before the table's next own DDL step (or at the end)
                i = bisect_left(own, seg)
                seg = own[i] if i < len(own) else len(order)
            by_segment.setdefault(seg, []).append(rec)
        for seg in range(len(self.ddl_steps) + 1):
            run = by_segment.get(seg)
            if run:
                kept = screen.rows(run) if screen is not None else run
                if kept:
                    for tc in collapse(kept, keys).values():
                        if owns is not None:
                            tc.changes = {k: fc for k, fc in tc.changes.items() if owns(k)}
                            if not tc.changes:
                                continue
                        out.segments.append((seg, tc))
            if screen is not None and seg < len(self.ddl_steps):
                screen.ddl(self.ddl_steps[seg])
        return out

    def place(self, rec: ChangeRecord, *, held: bool = False) -> "str | RejectedTs":
        """Where one row of this batch goes, decided by the row alone (its names folded as the rules fold
        them): :data:`RELEASED` (applied now), :data:`HELD` (its commit ts is past the lowest topic watermark),
        :data:`SNAPSHOT` (its table's snapshot holds it), :data:`REPLAY` (at or below its partition's watermark
        at its offset), or the :class:`~.batch_planner.RejectedTs` of an implausible commit ts. ``held``:
        the row was held by an earlier batch, so it was already checked for plausibility and replay.

        Both engines' per-table rules place every row with it; what is then done with the released rows
        (the value screen, the collapse per key) depends on the others of their table."""
        placer = self._placers.get((rec.schema, rec.table))
        if placer is None:
            placer = self._placers[(rec.schema, rec.table)] = self.placer(rec.schema, rec.table)
        return placer(rec.commit_ts, rec.topic, rec.partition, rec.offset, rec.idx, held)

    def placer(self, schema: str, table: str) -> Callable[[int | None, str, int, int, int, bool], "str | RejectedTs"]:
        """:meth:`place` for the rows of one (folded) table, as a function of what decides it — a row's
        commit ts, topic, partition, offset, index in its message and ``held`` — with the table's and the
        batch's lookups done once: the columnar path places a row without building its record."""
        guard, watermark = self.guard, self.mode == WATERMARK
        max_ts = guard.max_ts if guard is not None else None
        covered = self.seam.tsos.get((schema, table)) if self.seam else None  # (SnapshotSeam.covers of a row)
        start, marks, topics = self.start, self.marks, self.topic_watermarks
        low = lowest(topics.values())  # one bound for every topic of the changefeed (batch_planner's step 2)

        def place(ts: int | None, topic: str, partition: int, offset: int, idx: int, held: bool) -> "str | RejectedTs":
            if ts is not None:
                if max_ts is not None and ts > max_ts and not held:
                    return RejectedTs(topic, partition, offset, idx, "row", ts,
                                      guard.check(ts, "row commit ts"))  # type: ignore[union-attr,arg-type]
                if covered is not None and ts <= covered:
                    return SNAPSHOT
            if not watermark:
                return RELEASED
            if not held and ts is not None:
                # the partition's watermark just before the row: the starting one, or the one after the last
                # mark before it (``marks`` holds the running maximum: a smaller mark is a replay)
                wm = start.get((topic, partition))
                found = marks.get((topic, partition))
                if found:
                    i = bisect_left(found[0], (offset, idx))
                    if i:
                        wm = found[1][i - 1]
                if wm is not None and ts <= wm:
                    return REPLAY
            # (a row of a topic taken out of the configuration too: batch_planner releases it at the same bound)
            return RELEASED if low is not None and (ts or 0) <= low else HELD

        return place

    def _own_steps(self, rec: ChangeRecord) -> list[int]:
        """The indexes of the DDL steps that can change ``rec``'s table (``concerns``), ascending."""
        assert self.concerns is not None  # noqa: S101 - callers check
        name = (rec.schema, rec.table)
        return [i for i, tables in enumerate(self.concerns) if tables is None or name in tables]


def _fold(rec: ChangeRecord) -> ChangeRecord:
    schema, table = fold_name(rec.schema), fold_name(rec.table)
    if schema != rec.schema or table != rec.table:
        return rec._replace(schema=schema, table=table)
    return rec


def plan_coordination(
    state: ConsumerState,
    ddl: Iterable[DDLRecord],
    resolved: Sequence[ResolvedMark],
    *,
    mode: str,
    partitions: Mapping[str, Iterable[int]] | None = None,
    guard: TsGuard | None = None,
    case_sensitive: bool = False,
    seam: SnapshotSeam | None = None,
    concerns: Callable[[DDLRecord], frozenset[tuple[str, str]] | None] | None = None,
) -> tuple[BatchPlan, TableRules]:
    """The driver's part: :func:`~.batch_planner.plan_batch` over the resolved marks and DDL only
    (``state.held`` must hold only DDL: held rows live with the rows), and the :class:`TableRules` for the
    executors. The plan's steps are the DDL steps; its state is the state after the batch, with the held
    DDL (the held rows are the executors' :attr:`TableOutcome.held`). ``seam`` drops the DDL and (on the
    executors) the rows that tables' snapshots already hold, as in ``plan_batch``. ``concerns``: the
    (folded) tables a DDL can change, ``None`` for any (:attr:`TableRules.concerns`); without it every DDL
    splits every table's rows.

    Raises:
        ValueError: held rows in ``state``, or an unknown mode.
    """
    if any(not isinstance(r, DDLRecord) for r in state.held):
        raise ValueError("plan_coordination: state.held must hold only DDL (rows are held with the rows)")
    plan = plan_batch(state, ddl, resolved, mode=mode, keys=KeyResolver(), partitions=partitions, guard=guard,
                      case_sensitive=case_sensitive, seam=seam)
    steps = tuple(s for s in plan.steps if isinstance(s, DDLRecord))
    # (a partition added to a topic since starts where rows were last released, as plan_batch starts it)
    start = seed_new_partitions(state.watermarks, partitions, state.released_low)
    marks: dict[tuple[str, int], tuple[tuple[tuple[int, int], ...], tuple[int, ...]]] = {}
    if mode == WATERMARK:
        bad = {(r.topic, r.partition, r.offset, r.idx) for r in plan.rejected if r.kind == "resolved"}
        by_part: dict[tuple[str, int], list[ResolvedMark]] = {}
        for m in resolved:
            if (m.topic, m.partition, m.offset, m.idx) not in bad:
                by_part.setdefault((m.topic, m.partition), []).append(m)
        for tp, items in by_part.items():
            items.sort(key=lambda m: (m.offset, m.idx))
            wm = start.get(tp)
            after = []
            for m in items:
                wm = m.ts if wm is None or m.ts >= wm else wm
                after.append(wm)
            marks[tp] = (tuple((m.offset, m.idx) for m in items), tuple(after))  # type: ignore[misc]
    rules = TableRules(mode, start, marks, dict(plan.topic_watermarks), steps, guard, case_sensitive, seam or None,
                       None if concerns is None else tuple(concerns(d) for d in steps))
    return plan, rules


def group_rows(records: Iterable[ChangeRecord], case_sensitive: bool) -> dict[tuple[str, str], list[ChangeRecord]]:
    """Rows by (folded) table, as the Spark engine groups them."""
    out: dict[tuple[str, str], list[ChangeRecord]] = {}
    fold: Callable[[str], str] = (lambda n: n) if case_sensitive else fold_name
    for r in records:
        out.setdefault((fold(r.schema), fold(r.table)), []).append(r)
    return out
