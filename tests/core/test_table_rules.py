"""The Spark engine's split of the consumer rules (driver part + per-table part) equals plan_batch."""

from __future__ import annotations

import random
from typing import Any

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


def _two_topics(records, marks):
    """The stream with table c on a topic of its own (a topic dispatcher): one partition, its own offsets
    in the stream's order, and a copy of partition 0's resolved marks (every topic gets them)."""
    items = sorted([*records, *marks], key=lambda x: (x.offset, x.partition))
    out_records, out_marks, offset = [], [], 0
    for x in items:
        if isinstance(x, ResolvedMark):
            out_marks.append(x)
            if x.partition == 0:
                out_marks.append(x._replace(topic="other", offset=offset))
                offset += 1
        elif isinstance(x, ChangeRecord) and x.table == "c":
            out_records.append(x._replace(topic="other", partition=0, offset=offset))
            offset += 1
        else:
            out_records.append(x)
    return out_records, out_marks


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


@pytest.mark.parametrize("topics", [1, 2])
@pytest.mark.parametrize("mode", [WATERMARK, OFFSET_ORDER])
@pytest.mark.parametrize("seed", range(6))
def test_driver_part_plus_per_table_part_equals_plan_batch(seed: int, mode: str, topics: int) -> None:
    records, marks = _stream(seed)
    if topics == 2:
        records, marks = _two_topics(records, marks)
    guard = TsGuard(10**12 - 1, 0) if seed % 2 else None
    # seeds 0, 3: table s.a (a and A, folded) was loaded by a snapshot at a TSO in the middle of the stream
    seam = SnapshotSeam({("s", "a"): records[len(records) // 2].commit_ts}) if seed % 3 == 0 else None
    parts = {"cdc": [0, 1, 2], **({"other": [0]} if topics == 2 else {})}
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


@pytest.mark.parametrize("buckets", [2, 3, 7])
@pytest.mark.parametrize("seed", range(4))
def test_a_table_split_into_key_buckets_gives_the_unsplit_outcome(seed: int, buckets: int) -> None:
    """Each bucket of a table (key_buckets.split: an update that changes the key in both its keys'
    buckets) through apply_table with ``secondary``/``owns``, put together, equals the table unsplit:
    the same final change per key and segment, the same held rows, counts and rejections."""
    from ticdc_delta.core.key_buckets import owns, route, split, splittable
    from ticdc_delta.core.table_rules import TableOutcome

    records, marks = _stream(seed, n=500)
    guard = TsGuard(10**12 - 1, 0)
    seam = SnapshotSeam({("s", "b"): records[len(records) // 2].commit_ts})
    parts = {"cdc": [0, 1, 2]}
    state, held_rows = ConsumerState(), []
    crossed = 0
    for rows_and_ddl, resolved in _batches(records, marks, 4):
        ddl = [r for r in rows_and_ddl if isinstance(r, DDLRecord)]
        rows = [r for r in rows_and_ddl if isinstance(r, ChangeRecord)]
        plan, rules = plan_coordination(state, ddl, resolved, mode=WATERMARK, partitions=parts, guard=guard,
                                        seam=seam)
        new_by_table, held_by_table = group_rows(rows, False), group_rows(held_rows, False)
        next_held = []
        for ident in sorted(set(new_by_table) | set(held_by_table)):
            new, held = new_by_table.get(ident, []), held_by_table.get(ident, [])
            whole = rules.apply_table(new, held, KeyResolver())
            folded = [r._replace(schema=ident[0], table=ident[1]) for r in new]  # as the decoder folds
            assert splittable({route(r, KeyResolver()).layout for r in [*folded, *held]}, None)  # a table to split
            crossed += sum(len({h % buckets for h in route(r, KeyResolver()).hashes}) == 2 for r in folded)
            new_ids = {id(r) for r in folded}
            parts_out = TableOutcome()
            for b, (recs, secondary) in sorted(split([*folded, *held], buckets, KeyResolver()).items()):
                out = rules.apply_table([r for r in recs if id(r) in new_ids], [r for r in recs if id(r) not in new_ids],
                                        KeyResolver(), secondary=secondary, owns=owns(b, buckets))
                parts_out.segments += out.segments
                parts_out.held += out.held
                parts_out.rejected += out.rejected
                parts_out.replays += out.replays
                parts_out.released += out.released
                parts_out.snapshot_dropped += out.snapshot_dropped

            def finals(segments):
                got: dict = {}
                for seg, tc in segments:
                    keys_of, changes = got.setdefault(seg, (tc.key_columns, {}))
                    assert keys_of == tc.key_columns
                    assert not set(changes) & set(tc.changes)  # each key in one bucket only
                    changes.update(tc.changes)
                return got

            assert finals(parts_out.segments) == finals(whole.segments), ident
            assert sorted(parts_out.held) == sorted(whole.held)
            assert sorted(parts_out.rejected) == sorted(whole.rejected)
            assert (parts_out.replays, parts_out.released, parts_out.snapshot_dropped) == (
                whole.replays, whole.released, whole.snapshot_dropped)
            next_held += whole.held
        state, held_rows = plan.state, next_held
    assert crossed > 10  # updates that change the key across buckets (no vacuous pass)


def test_key_hash_is_by_value_and_the_same_in_every_process() -> None:
    """Equal keys (1, 1.0, Decimal(1), True) hash alike; text hashes by its bytes, so another
    interpreter (another PYTHONHASHSEED) agrees."""
    import subprocess
    import sys
    from decimal import Decimal

    from ticdc_delta.core.key_buckets import key_hash

    assert key_hash((1,)) == key_hash((1.0,)) == key_hash((Decimal(1),)) == key_hash((True,))
    assert key_hash(("1",)) != key_hash((1,)) != key_hash((b"1",))
    assert key_hash(("a", "b")) != key_hash(("ab", ""))
    code = "from ticdc_delta.core.key_buckets import key_hash; print(key_hash(('caf\u00e9', b'x', 2, None)))"
    here = key_hash(("caf\u00e9", b"x", 2, None))
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={"PYTHONHASHSEED": seed, "PATH": ""})
        assert int(out.stdout) == here


def test_splittable_only_when_no_record_depends_on_another() -> None:
    """A table is split only when every image names the same key alone, every column keeps one type and
    every image's columns are a prefix of the longest one's."""
    from ticdc_delta.core.key_buckets import layout, splittable

    full = (("id", 8, KEY), ("v", 8, PLAIN), ("w", 8, PLAIN))
    insert = ChangeRecord(1, "t", 0, 0, 0, "s", "a", "insert", tuple((*c, 1) for c in full), None)
    key_only_delete = ChangeRecord(1, "t", 0, 1, 0, "s", "a", "delete", None, (("id", 8, KEY, 1),))
    added = insert._replace(new=(*insert.new, ("x", 8, PLAIN, 1)))  # a column added at the end (Avro)
    assert splittable([layout(insert), layout(key_only_delete), layout(added)], None)
    unflagged = insert._replace(new=tuple((n, t, PLAIN, v) for n, t, _, v in insert.new))
    assert not splittable([layout(insert), layout(unflagged)], None)  # would use the remembered key
    assert splittable([layout(unflagged)] * 2, ["v"])  # the configured key names it alone
    retyped = insert._replace(new=(insert.new[0], ("v", 15, PLAIN, "1"), insert.new[2]))
    assert not splittable([layout(insert), layout(retyped)], None)  # one column, two types
    middle_key = ChangeRecord(1, "t", 0, 2, 0, "s", "a", "delete", None, (("v", 8, KEY, 1),))
    assert not splittable([layout(insert), layout(middle_key)], None)  # another key, not a prefix
    reordered = insert._replace(new=(insert.new[0], insert.new[2], insert.new[1]))
    assert not splittable([layout(insert), layout(reordered)], None)


def test_the_router_routes_as_the_key_resolver_keys() -> None:
    """Router (what the decoder uses: key positions worked out once per layout) gives every record the
    routing that key_buckets.route gives with a KeyResolver, the key columns collapse uses."""
    from ticdc_delta.core.key_buckets import Router, route

    records, _ = _stream(5, n=400)
    router = Router()
    rows = [r for r in records if isinstance(r, ChangeRecord)]
    assert [router(r) for r in rows] == [route(r, KeyResolver()) for r in rows]
    assert any(len(router(r).hashes) == 2 for r in rows)  # key-changing updates among them
    configured = Router(lambda schema, table: ["v"])
    r = next(r for r in rows if r.new is not None and r.old is not None)
    assert configured(r) == route(r, KeyResolver({(r.schema, r.table): ["v"]}))


def test_the_router_routes_a_row_given_as_its_values_as_its_record() -> None:
    """Router.of_values (the decoder's rows: each image its values, its layout by identity) gives each row
    the routing of its record, and works out each pair of layouts' columns once."""
    from ticdc_delta.core.key_buckets import Router, layout, route

    records, _ = _stream(6, n=400)
    rows = [r for r in records if isinstance(r, ChangeRecord)]
    built = []

    def columns(r: ChangeRecord) -> Any:
        built.append(r)
        return layout(r)

    def ident(image: Any) -> Any:
        return None if image is None else tuple(c[:3] for c in image)

    for override in (None, ["v"]):
        router = Router(None if override is None else (lambda schema, table: override))
        built.clear()
        for r in rows:
            values = [None if i is None else tuple(c[3] for c in i) for i in (r.new, r.old)]
            got = router.of_values(*values, ident(r.new), ident(r.old), (r.schema, r.table), columns, r)
            assert got == route(r, KeyResolver({(r.schema, r.table): override} if override else None)), r
        assert len(built) == len({(ident(r.new), ident(r.old)) for r in rows}) < len(rows)


def test_the_executors_rules_start_an_added_partition_where_rows_were_released() -> None:
    """The spark engine's split of the rules drops what TiCDC sends again to a partition added since (see
    test_batch_planner) as plan_batch does: the re-sent TRUNCATE is no DDL step, the old row no change."""
    def rec(ts: int, partition: int, offset: int, v: str) -> ChangeRecord:
        return ChangeRecord(ts, "cdc", partition, offset, 0, "s", "t", "insert", _img({"id": 1, "v": v}), None)

    def trunc(partition: int, offset: int) -> DDLRecord:
        return DDLRecord(200, "cdc", partition, offset, 0, "s", "t", "TRUNCATE TABLE t", 11)

    def rm(partition: int, offset: int, ts: int) -> ResolvedMark:
        return ResolvedMark("cdc", partition, offset, 0, ts)

    first, _ = plan_coordination(ConsumerState(), [trunc(0, 0), trunc(1, 0)], [rm(0, 1, 300), rm(1, 1, 300)],
                                 mode=WATERMARK, partitions={"cdc": [0, 1]})
    assert first.state.released_low == 300
    plan, rules = plan_coordination(first.state, [trunc(2, 0)], [rm(2, 2, 310)], mode=WATERMARK,
                                    partitions={"cdc": [0, 1, 2]})
    assert rules.ddl_steps == () and plan.replays_dropped == 1
    out = rules.apply_table([rec(250, 2, 1, "old"), rec(320, 2, 3, "new")], [], KeyResolver())
    assert out.replays == 1 and out.segments == [] and [r.commit_ts for r in out.held] == [320]


def test_records_held_of_a_topic_taken_out_of_the_job_are_released_at_the_bound() -> None:
    """A topic dispatcher: RENAME TABLE s.a TO s.c goes to s_a, which then gets no resolved ts (its tables are
    gone) and holds rows back until it is taken out of ``source.topics``, as the docs say. Its held RENAME
    (and rows) then apply at the other topics' bound — in both engines; they stayed in the state for good."""
    def rec(ts: int, topic: str, offset: int, table: str, v: str) -> ChangeRecord:
        return ChangeRecord(ts, topic, 0, offset, 0, "s", table, "insert", _img({"id": 1, "v": v}), None)

    def rm(topic: str, offset: int, ts: int) -> ResolvedMark:
        return ResolvedMark(topic, 0, offset, 0, ts)

    rename = DDLRecord(200, "s_a", 0, 1, 0, "s", "c", "RENAME TABLE `s`.`a` TO `s`.`c`", 14)
    late = rec(190, "s_a", 2, "b", "late")  # a row of s_a held with it (s_a's watermark is 150)
    batches = [([rename, late, rec(210, "s_c", 0, "c", "y")], [rm("s_a", 3, 150), rm("s_c", 1, 250)],
                {"s_a": [0], "s_c": [0]}),
               ([], [rm("s_c", 2, 300)], {"s_c": [0]})]  # s_a taken out of the job
    whole, split, held = ConsumerState(), ConsumerState(), []
    for records, marks, parts in batches:
        expected = plan_batch(whole, records, marks, mode=WATERMARK, keys=KeyResolver(), partitions=parts)
        plan, rules = plan_coordination(split, [r for r in records if isinstance(r, DDLRecord)], marks,
                                        mode=WATERMARK, partitions=parts)
        rows = [r for r in records if isinstance(r, ChangeRecord)]
        placed = {r.commit_ts: rules.place(r, held=r in held) for r in [*held, *rows]}
        held = [r for r in [*held, *rows] if placed[r.commit_ts] == "held"]
        whole, split = expected.state, plan.state
    assert [type(s).__name__ for s in expected.steps] == ["RowsStep", "DDLRecord", "RowsStep"]
    assert list(rules.ddl_steps) == [rename] and placed == {190: "released", 210: "released"}
    assert whole.held == [] and split.held == [] and held == []


def test_a_cut_over_rename_split_across_topics_applies_in_an_order_that_can_run() -> None:
    """``RENAME TABLE orders TO _orders_del, _orders_gho TO orders`` (gh-ost's cut-over): TiCDC writes one
    event per table, of one commit ts, to each old table's topic. By topic name ``_orders_gho TO orders`` came
    first, refused (``orders`` still there) on every retry; the table moved away goes first, in both engines.
    In one topic the statement's order stands, and a cycle keeps the apply order."""
    def rename(topic: str, offset: int, old: str, new: str) -> DDLRecord:
        return DDLRecord(500, topic, 0, offset, 0, "s", new, f"RENAME TABLE `s`.`{old}` TO `s`.`{new}`", 14)

    away, into = rename("s_orders", 0, "orders", "_orders_del"), rename("s__orders_gho", 0, "_orders_gho", "orders")
    marks = [ResolvedMark(t, 0, 5, 0, 600) for t in ("s_orders", "s__orders_gho")]
    parts = {"s_orders": [0], "s__orders_gho": [0]}
    whole = plan_batch(ConsumerState(), [into, away], marks, mode=WATERMARK, keys=KeyResolver(), partitions=parts)
    _, rules = plan_coordination(ConsumerState(), [into, away], marks, mode=WATERMARK, partitions=parts)
    assert whole.steps == [away, into] and list(rules.ddl_steps) == [away, into]
    # one topic: the order it came in (a chain through a new name, a TO tmp then tmp TO b, is one)
    chain = [rename("cdc", 0, "a", "tmp"), rename("cdc", 1, "tmp", "b")]
    assert plan_batch(ConsumerState(), chain, [ResolvedMark("cdc", 0, 2, 0, 600)], mode=WATERMARK,
                      keys=KeyResolver(), partitions={"cdc": [0]}).steps == chain
    swap = [rename("t1", 0, "a", "tmp"), rename("t2", 0, "b", "a"), rename("t3", 0, "tmp", "b")]
    three = {t: [0] for t in ("t1", "t2", "t3")}
    assert plan_batch(ConsumerState(), swap, [ResolvedMark(t, 0, 1, 0, 600) for t in three], mode=WATERMARK,
                      keys=KeyResolver(), partitions=three).steps == swap
