"""The Spark engine's split of the consumer rules (driver part + per-table part) equals plan_batch."""

from __future__ import annotations

import random

import pytest

from ticdc_delta.core.batch_planner import OFFSET_ORDER, WATERMARK, ConsumerState, ResolvedMark, RowsStep, plan_batch
from ticdc_delta.core.merge import KeyResolver
from ticdc_delta.core.records import ChangeRecord, DDLRecord
from ticdc_delta.core.snapshot_seam import SnapshotSeam
from ticdc_delta.core.table_rules import group_rows, plan_coordination
from ticdc_delta.core.ts_guard import TsGuard

KEY, PLAIN = 0x0A, 0


def _img(d):
    return None if d is None else tuple((k, 8, KEY if k == "id" else PLAIN, v) for k, v in d.items())


def _stream(seed: int, n: int = 300, parts: int = 3):
    """Rows on a few tables (mixed case names), PK changes, deletes, DDL broadcast to every partition,
    resolved marks (some regressing), replays of earlier ranges and a forged far-future row."""
    rnd = random.Random(seed)
    offsets = [0] * parts
    records, marks = [], []
    ts = 100
    for _ in range(n):
        ts += rnd.randint(0, 3)
        p = rnd.randrange(parts)
        r = rnd.random()
        if r < 0.15:
            for q in range(parts):  # a resolved ts on every partition (sometimes a smaller one)
                marks.append(ResolvedMark("cdc", q, offsets[q], 0, ts - (5 if rnd.random() < 0.1 else 0)))
                offsets[q] += 1
            continue
        if r < 0.19:
            table = rnd.choice(["a", "b"])
            for q in range(parts):
                records.append(DDLRecord(ts, "cdc", q, offsets[q], 0, "S", table,
                                         f"ALTER TABLE {table} ADD COLUMN c{ts} INT", 5))
                offsets[q] += 1
            continue
        table = rnd.choice(["a", "A", "b", "c"])
        k = rnd.randrange(6)
        op = rnd.choice(["insert", "update", "delete", "pk"])
        if op == "insert":
            rec = ChangeRecord(ts, "cdc", p, offsets[p], 0, "s", table, "insert", _img({"id": k, "v": ts}), None)
        elif op == "delete":
            rec = ChangeRecord(ts, "cdc", p, offsets[p], 0, "s", table, "delete", None, _img({"id": k, "v": 0}))
        else:
            new_k = (k + 1) % 6 if op == "pk" else k
            rec = ChangeRecord(ts, "cdc", p, offsets[p], 0, "s", table, "update", _img({"id": new_k, "v": ts}),
                               _img({"id": k, "v": 0}))
        if rnd.random() < 0.05:  # a replay of something older at a later offset
            rec = rec._replace(commit_ts=max(1, ts - 20))
        if rnd.random() < 0.01:
            rec = rec._replace(commit_ts=(10**12) << 18)  # forged far future
        records.append(rec)
        offsets[p] += 1
    return records, marks


def _batches(records, marks, k: int):
    items = sorted([*records, *marks], key=lambda x: (x.offset, x.partition))
    size = len(items) // k + 1
    for i in range(k):
        chunk = items[i * size:(i + 1) * size]
        yield ([x for x in chunk if not isinstance(x, ResolvedMark)], [x for x in chunk if isinstance(x, ResolvedMark)])


def _by_segment(steps):
    out, seg = {}, 0
    for s in steps:
        if isinstance(s, RowsStep):
            for ident, tc in s.tables.items():
                out[(seg, ident)] = (tc.key_columns, list(tc.changes.items()), tc.source_rows)
        else:
            seg += 1
    return out


@pytest.mark.parametrize("mode", [WATERMARK, OFFSET_ORDER])
@pytest.mark.parametrize("seed", range(6))
def test_driver_part_plus_per_table_part_equals_plan_batch(seed: int, mode: str) -> None:
    records, marks = _stream(seed)
    guard = TsGuard(10**12 - 1, 0) if seed % 2 else None
    # seeds 0, 3: table s.a (a and A, folded) was loaded by a snapshot at a TSO in the middle of the stream
    seam = SnapshotSeam({("s", "a"): records[len(records) // 2].commit_ts}) if seed % 3 == 0 else None
    parts = {"cdc": [0, 1, 2]}
    whole = ConsumerState()
    split_state, split_held = ConsumerState(), []
    seen = {"segments": 0, "held": 0, "replays": 0, "ddl": 0, "snapshot": 0}
    for rows_and_ddl, resolved in _batches(records, marks, 5):
        expected = plan_batch(whole, rows_and_ddl, resolved, mode=mode, keys=KeyResolver(), partitions=parts,
                              guard=guard, seam=seam)
        ddl = [r for r in rows_and_ddl if isinstance(r, DDLRecord)]
        rows = [r for r in rows_and_ddl if isinstance(r, ChangeRecord)]
        plan, rules = plan_coordination(split_state, ddl, resolved, mode=mode, partitions=parts, guard=guard,
                                        seam=seam)
        got, held, replays, rejected = {}, [], plan.replays_dropped, list(plan.rejected)
        dropped = plan.snapshot_dropped
        new_by_table = group_rows(rows, False)
        held_by_table = group_rows(split_held, False)
        for ident in sorted(set(new_by_table) | set(held_by_table)):
            out = rules.apply_table(new_by_table.get(ident, []), held_by_table.get(ident, []), KeyResolver())
            for seg, tc in out.segments:
                got[(seg, (tc.schema, tc.table))] = (tc.key_columns, list(tc.changes.items()), tc.source_rows)
            held += out.held
            replays += out.replays
            rejected += out.rejected
            dropped += out.snapshot_dropped
        assert got == _by_segment(expected.steps)
        assert [s for s in expected.steps if isinstance(s, DDLRecord)] == list(rules.ddl_steps)
        assert sorted(held) == sorted(r for r in expected.state.held if isinstance(r, ChangeRecord))
        assert plan.state.held == [r for r in expected.state.held if isinstance(r, DDLRecord)]
        assert plan.state.watermarks == expected.state.watermarks
        assert plan.state.applied_ddl == expected.state.applied_ddl
        assert replays == expected.replays_dropped
        assert sorted(rejected) == sorted(expected.rejected)
        assert dropped == expected.snapshot_dropped
        whole = expected.state
        split_state, split_held = plan.state, held
        for name, n in (("segments", len(got)), ("held", len(held)), ("replays", replays), ("ddl", len(rules.ddl_steps)),
                        ("snapshot", dropped)):
            seen[name] += n
    # the streams exercise every rule (no vacuous pass)
    assert seen["segments"] > 5 and seen["ddl"] > 0
    assert (seen["snapshot"] > 0) == (seam is not None)
    if mode == WATERMARK:
        assert seen["held"] > 0 and seen["replays"] > 0


def _final_tables(segments):
    """Each table's rows after applying ``(seg, TableChanges)`` in segment order (key → image)."""
    from ticdc_delta.core.merge import DELETE

    tables: dict = {}
    for _, tc in sorted(segments, key=lambda s: s[0]):
        rows = tables.setdefault((tc.schema, tc.table), {})
        for key, fc in tc.changes.items():
            if fc.kind == DELETE:
                rows.pop(key, None)
            else:
                rows[key] = fc.image
    return tables


@pytest.mark.parametrize("seed", range(4))
def test_rows_move_past_the_ddl_of_other_tables_only(seed: int) -> None:
    """With ``concerns`` a table's rows are split only by its own DDL steps (one MERGE between them) and
    every table ends as with a split at every DDL."""
    records, marks = _stream(seed)
    parts = {"cdc": [0, 1, 2]}
    state = {"all": (ConsumerState(), []), "own": (ConsumerState(), [])}
    count = {"all": 0, "own": 0}
    for rows_and_ddl, resolved in _batches(records, marks, 4):
        ddl = [r for r in rows_and_ddl if isinstance(r, DDLRecord)]
        rows = [r for r in rows_and_ddl if isinstance(r, ChangeRecord)]
        ends = {}
        for how, concerns in (("all", None), ("own", lambda d: frozenset({(d.schema.lower(), d.table.lower())}))):
            st, held_rows = state[how]
            plan, rules = plan_coordination(st, ddl, resolved, mode=WATERMARK, partitions=parts, concerns=concerns)
            segments, held = [], []
            new_by_table, held_by_table = group_rows(rows, False), group_rows(held_rows, False)
            for ident in sorted(set(new_by_table) | set(held_by_table)):
                out = rules.apply_table(new_by_table.get(ident, []), held_by_table.get(ident, []), KeyResolver())
                segments += out.segments
                held += out.held
                if how == "own":
                    own = [i for i, d in enumerate(rules.ddl_steps) if d.table.lower() == ident[1]]
                    assert {seg for seg, _ in out.segments} <= set(own) | {len(rules.ddl_steps)}, ident
            ends[how] = (_final_tables(segments), sorted(held))
            state[how] = (plan.state, held)
            count[how] += len(segments)
        assert ends["own"] == ends["all"]
    assert count["own"] < count["all"]  # fewer MERGEs, the same tables
