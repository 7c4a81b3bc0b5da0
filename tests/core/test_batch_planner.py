"""The consumer rules: replay drop, holding for the slowest partition, DDL placement and dedupe, collapse."""

from __future__ import annotations

import pytest

from ticdc_delta.core.batch_planner import (
    OFFSET_ORDER,
    WATERMARK,
    ConsumerState,
    ResolvedMark,
    RowsStep,
    plan_batch,
)
from ticdc_delta.core.merge import DELETE, UPSERT, KeyResolver, MissingKeyError
from ticdc_delta.core.records import ChangeRecord, DDLRecord, dump_record, load_record

KEY, PLAIN = 0x0A, 0


def row(ts, partition, offset, op, new=None, old=None, table="t", topic="cdc", idx=0):
    def img(d):
        return None if d is None else tuple((k, 8, KEY if k == "id" else PLAIN, v) for k, v in d.items())

    return ChangeRecord(ts, topic, partition, offset, idx, "s", table, op, img(new), img(old))


def ddl(ts, partition, offset, query="ALTER TABLE t ADD COLUMN c INT", topic="cdc"):
    return DDLRecord(ts, topic, partition, offset, 0, "s", "t", query, 5)


def rm(partition, offset, ts, topic="cdc"):
    return ResolvedMark(topic, partition, offset, 0, ts)


def plan(state, records, resolved, parts=(0, 1), mode=WATERMARK):
    return plan_batch(state, records, resolved, mode=mode, keys=KeyResolver(), partitions={"cdc": parts})


def final(step: RowsStep, table: str = "t") -> dict:
    tc = step.tables[("s", table)]
    return {k: (c.kind, dict((x[0], x[3]) for x in c.image)) for k, c in tc.changes.items()}


def test_rows_wait_for_the_slowest_partition_then_apply() -> None:
    p1 = plan(ConsumerState(), [row(10, 0, 0, "insert", {"id": 1, "v": "a"})], [rm(0, 1, 20)])
    assert p1.steps == [] and p1.held == 1  # partition 1 has promised nothing yet
    p2 = plan(p1.state, [], [rm(1, 0, 5)])
    assert p2.steps == [] and p2.held == 1  # partition 1 only up to 5 < 10
    p3 = plan(p2.state, [], [rm(1, 1, 10)])
    assert p3.held == 0 and final(p3.steps[0]) == {(1,): (UPSERT, {"id": 1, "v": "a"})}


def test_replays_below_the_partition_watermark_are_dropped_at_their_position() -> None:
    records = [
        row(10, 0, 0, "insert", {"id": 1, "v": "a"}),
        row(12, 0, 1, "delete", old={"id": 1}),
        row(10, 0, 3, "insert", {"id": 1, "v": "a"}),  # replay after resolved 15
    ]
    p = plan(ConsumerState(), records, [rm(0, 2, 15), rm(1, 0, 15)])
    assert p.replays_dropped == 1
    assert final(p.steps[0]) == {(1,): (DELETE, {"id": 1})}


def test_a_replay_at_the_partition_watermark_is_dropped_too() -> None:
    """A resolved ts R promises every event with commit ts ≤ R (seed 004). A TiCDC restarted from a
    checkpoint below R sends the transaction at R again; applied again, a batch cut inside it would commit
    half of it (here: both deletes of a key-shifting UPDATE without its inserts)."""
    txn = [row(106, 0, 0, "delete", old={"id": 2}), row(106, 0, 1, "delete", old={"id": 3}),
           row(106, 0, 2, "insert", {"id": 3, "v": "a"}), row(106, 0, 3, "insert", {"id": 4, "v": "b"})]
    first = plan(ConsumerState(), txn, [rm(0, 4, 106), rm(1, 0, 106)])
    assert final(first.steps[0]) == {(2,): (DELETE, {"id": 2}), (3,): (UPSERT, {"id": 3, "v": "a"}),
                                     (4,): (UPSERT, {"id": 4, "v": "b"})}
    resent = [r._replace(offset=r.offset + 5) for r in txn[:2]]  # the batch ends inside the copy
    again = plan(first.state, resent, [])
    assert again.steps == [] and again.replays_dropped == 2 and list(again.state.held) == []


def test_exact_duplicates_change_nothing() -> None:
    ins = row(10, 0, 0, "insert", {"id": 1, "v": "a"})
    p = plan(ConsumerState(), [ins, ins._replace(offset=1)], [rm(0, 2, 10), rm(1, 0, 10)])
    assert final(p.steps[0]) == {(1,): (UPSERT, {"id": 1, "v": "a"})}


def test_key_change_deletes_old_key_and_order_is_commit_ts_then_offset() -> None:
    records = [
        row(20, 1, 0, "update", {"id": 2, "v": "b"}, {"id": 1, "v": "a"}),
        row(10, 0, 0, "insert", {"id": 1, "v": "a"}),
        row(30, 0, 1, "insert", {"id": 3, "v": "c"}),
    ]
    p = plan(ConsumerState(), records, [rm(0, 2, 40), rm(1, 1, 40)])
    assert final(p.steps[0]) == {
        (1,): (DELETE, {"id": 1, "v": "a"}),
        (2,): (UPSERT, {"id": 2, "v": "b"}),
        (3,): (UPSERT, {"id": 3, "v": "c"}),
    }


def test_ddl_applies_between_older_and_newer_rows_once() -> None:
    records = [
        row(10, 0, 0, "insert", {"id": 1, "v": "a"}),
        ddl(15, 0, 1),
        ddl(15, 1, 0),  # broadcast copy
        row(20, 1, 1, "insert", {"id": 2, "v": "b", "c": 7}),
        row(12, 1, 2, "insert", {"id": 3, "v": "x"}),  # later offset, older ts: still before the DDL
    ]
    p = plan(ConsumerState(), records, [rm(0, 2, 25), rm(1, 3, 25)])
    kinds = [type(s).__name__ for s in p.steps]
    assert kinds == ["RowsStep", "DDLRecord", "RowsStep"]
    assert set(final(p.steps[0])) == {(1,), (3,)}
    assert set(final(p.steps[2])) == {(2,)}
    assert p.duplicate_ddl == 1
    # copies of a DDL in later batches: the watermarks (25) promised every event at or below them, so
    # one at the watermark is a replay, dropped and counted, never applied again
    p2 = plan(p.state, [ddl(25, 0, 3, "CREATE TABLE x (id INT)"), ddl(25, 1, 4, "CREATE TABLE x (id INT)")],
              [rm(0, 4, 30), rm(1, 5, 30)])
    assert p2.steps == [] and p2.replays_dropped == 2
    # a DDL past the watermarks, its copies in two batches: applied once
    p3 = plan(p2.state, [ddl(33, 0, 5, "CREATE TABLE y (id INT)")], [rm(0, 6, 35)])
    p4 = plan(p3.state, [ddl(33, 1, 6, "CREATE TABLE y (id INT)")], [rm(1, 7, 35)])
    applied = [s for p_ in (p3, p4) for s in p_.steps if isinstance(s, DDLRecord)]
    assert [d.query for d in applied] == ["CREATE TABLE y (id INT)"] and p4.duplicate_ddl == 1


def test_rows_and_ddl_of_every_topic_wait_for_the_lowest_topic_watermark() -> None:
    """A TiCDC topic dispatcher: each table's rows on its own topic, a RENAME TABLE on the old table's
    topic, CREATE/DROP DATABASE on the default one, the same resolved ts on every topic. Released by each
    topic's own watermark, a batch that has seen one topic's resolved ts but not yet another's applied the
    new table's row before the RENAME that made the table (and rows after a DROP DATABASE before it)."""
    a = row(100, 0, 0, "insert", {"id": 1, "v": "a"}, table="a", topic="s_a")
    rename = DDLRecord(110, "s_a", 0, 1, 0, "s", "b", "RENAME TABLE `s`.`a` TO `s`.`b`", 14)
    b = row(120, 0, 0, "insert", {"id": 2, "v": "b"}, table="b", topic="s_b")
    parts = {"s_a": [0], "s_b": [0]}
    first = plan_batch(ConsumerState(), [a, rename, b], [rm(0, 1, 130, topic="s_b")], mode=WATERMARK,
                       keys=KeyResolver(), partitions=parts)
    assert first.steps == [] and first.held == 3  # s_a has promised nothing yet
    second = plan_batch(first.state, [], [rm(0, 2, 130, topic="s_a")], mode=WATERMARK, keys=KeyResolver(),
                        partitions=parts)
    assert [type(s).__name__ for s in second.steps] == ["RowsStep", "DDLRecord", "RowsStep"]
    assert set(second.steps[0].tables) == {("s", "a")} and set(second.steps[2].tables) == {("s", "b")}
    assert second.topic_watermarks == {"s_a": 130, "s_b": 130}


def test_a_topic_no_longer_read_holds_nothing_back() -> None:
    """A topic taken out of the configuration keeps its watermark in the state; the bound is over the
    topics the job reads now (``partitions``)."""
    state = ConsumerState({("gone", 0): 50})
    p = plan(state, [row(100, 0, 0, "insert", {"id": 1, "v": "a"})], [rm(0, 1, 120), rm(1, 0, 120)])
    assert p.held == 0 and final(p.steps[0]) == {(1,): (UPSERT, {"id": 1, "v": "a"})}
    assert p.topic_watermarks == {"cdc": 120}


def test_a_partition_added_to_the_topic_starts_where_rows_were_released() -> None:
    """Partitions added, then TiCDC restarts from its checkpoint: it sends again what it had sent, now also to
    the new partition (its keys hash there, and its DDL is broadcast there). Those are replays: the job had
    released up to 300 once every partition of the time had resolved past it. The new partition had no
    watermark, so the re-sent TRUNCATE ran again and old row versions were upserted over newer ones."""
    truncate = "TRUNCATE TABLE t"
    first = plan(ConsumerState(), [
        row(100, 0, 0, "insert", {"id": 1, "v": "a"}), ddl(200, 0, 1, truncate), ddl(200, 1, 0, truncate),
        row(250, 1, 1, "insert", {"id": 2, "v": "old"}), row(260, 0, 2, "insert", {"id": 3, "v": "c"}),
        row(280, 1, 2, "update", {"id": 2, "v": "new"}, {"id": 2, "v": "old"}),
    ], [rm(0, 3, 300), rm(1, 3, 300)])
    assert first.state.released_low == 300 and [type(s).__name__ for s in first.steps] == [
        "RowsStep", "DDLRecord", "RowsStep"]
    resent = plan(first.state, [ddl(200, 0, 4, truncate), ddl(200, 1, 4, truncate), ddl(200, 2, 0, truncate),
                                row(250, 2, 1, "insert", {"id": 2, "v": "old"})],
                  [rm(0, 5, 310), rm(1, 5, 310), rm(2, 2, 310)], parts=(0, 1, 2))
    assert resent.steps == [] and resent.replays_dropped == 4 and resent.state.watermarks[("cdc", 2)] == 310
    later = plan(resent.state, [row(280, 2, 3, "update", {"id": 2, "v": "new"}, {"id": 2, "v": "old"}),
                                row(320, 2, 4, "insert", {"id": 4, "v": "d"})],
                 [rm(0, 6, 330), rm(1, 6, 330), rm(2, 5, 330)], parts=(0, 1, 2))
    assert later.replays_dropped == 1 and final(later.steps[0]) == {(4,): (UPSERT, {"id": 4, "v": "d"})}


def test_a_partition_that_has_not_resolved_yet_is_no_new_partition() -> None:
    """Rows are held (nothing released) while a partition of the time has not resolved: it is no added
    partition, and its rows below the other's watermark are not replays."""
    first = plan(ConsumerState(), [row(10, 0, 0, "insert", {"id": 1, "v": "a"})], [rm(0, 1, 50)])
    assert first.held == 1 and first.state.released_low is None
    second = plan(first.state, [row(20, 1, 0, "insert", {"id": 2, "v": "b"})], [rm(1, 1, 60)])
    assert second.replays_dropped == 0 and set(final(second.steps[0])) == {(1,), (2,)}
    # and a topic added to the job is read from its start: nothing of it was released
    added = plan_batch(second.state, [row(5, 0, 0, "insert", {"id": 3, "v": "c"}, topic="more")],
                       [rm(0, 2, 70), rm(1, 2, 70), rm(0, 1, 70, topic="more")], mode=WATERMARK, keys=KeyResolver(),
                       partitions={"cdc": (0, 1), "more": (0,)})
    assert added.replays_dropped == 0 and set(final(added.steps[0])) == {(3,)}


def test_a_listed_topic_that_does_not_exist_yet_holds_nothing_back() -> None:
    """A topic dispatcher's topic TiCDC has not created yet (the broker lists no partitions): nothing of it can
    be missing, so the rows of the other topics are released. Once it exists, it has promised nothing until it
    resolves; a topic that had been read and is gone (no partitions, but watermarks) still holds rows back."""
    def step(state, records, resolved, more):
        return plan_batch(state, records, resolved, mode=WATERMARK, keys=KeyResolver(),
                          partitions={"cdc": (0,), "more": more})

    first = step(ConsumerState(), [row(10, 0, 0, "insert", {"id": 1, "v": "a"})], [rm(0, 1, 20)], ())
    assert first.held == 0 and set(final(first.steps[0])) == {(1,)} and first.topic_watermarks == {"cdc": 20}
    created = step(first.state, [row(30, 0, 2, "insert", {"id": 2, "v": "b"}),
                                 row(25, 0, 0, "insert", {"id": 3, "v": "c"}, topic="more")], [rm(0, 3, 40)], (0,))
    assert created.steps == [] and created.held == 2 and created.replays_dropped == 0
    resolved = step(created.state, [], [rm(0, 1, 40, topic="more")], (0,))
    assert set(final(resolved.steps[0])) == {(2,), (3,)} and resolved.state.released_low == 40
    gone = step(resolved.state, [row(50, 0, 4, "insert", {"id": 4, "v": "d"})], [rm(0, 5, 60)], ())
    assert gone.steps == [] and gone.held == 1


def test_watermark_regression_is_ignored() -> None:
    p = plan(ConsumerState(), [], [rm(0, 0, 50), rm(0, 1, 40), rm(1, 0, 50)])
    assert p.state.watermarks[("cdc", 0)] == 50 and p.watermark_regressions == 1


def test_plan_is_deterministic_and_state_round_trips() -> None:
    records = [row(10 + i, i % 2, i, "insert", {"id": i, "v": str(i)}) for i in range(20)]
    a = plan(ConsumerState(), records, [rm(0, 100, 20), rm(1, 100, 15)])
    b = plan(ConsumerState(), list(reversed(records)), [rm(1, 100, 15), rm(0, 100, 20)])
    assert [final(s) for s in a.steps] == [final(s) for s in b.steps]
    assert a.state == b.state and a.held == 14
    assert [load_record(dump_record(r)) for r in a.state.held] == a.state.held


def test_offset_order_mode_applies_everything_ddl_first() -> None:
    records = [
        row(None, 0, 0, "insert", {"id": 1, "v": "a"}),
        row(None, 1, 0, "insert", {"id": 2, "v": "b"}),
        row(None, 0, 1, "delete", old={"id": 1}),
        ddl(None, 0, 2),
    ]
    p = plan(ConsumerState(), records, [], mode=OFFSET_ORDER)
    assert isinstance(p.steps[0], DDLRecord)
    assert final(p.steps[1]) == {(1,): (DELETE, {"id": 1}), (2,): (UPSERT, {"id": 2, "v": "b"})}
    assert p.held == 0


def test_rows_held_in_watermark_mode_are_applied_when_the_mode_changes() -> None:
    """A job whose stream stops carrying resolved ts (canal-json's TiDB extension turned off) goes on in
    offset order: what the watermarks held is applied, not dropped."""
    held = plan(ConsumerState(), [row(10, 0, 0, "insert", {"id": 1, "v": "a"}), ddl(12, 0, 1)], [rm(0, 2, 20)])
    assert held.held == 2 and held.steps == []
    after = plan(held.state, [row(30, 1, 0, "insert", {"id": 2, "v": "b"})], [], mode=OFFSET_ORDER)
    assert [type(s).__name__ for s in after.steps] == ["DDLRecord", "RowsStep"]
    assert set(final(after.steps[1])) == {(1,), (2,)} and after.held == 0


def test_offset_order_mode_applies_a_statement_run_twice_twice() -> None:
    """Without commit ts a DDL is the message it came in: ``TRUNCATE TABLE t`` run twice upstream (two
    messages) truncates twice, across batches too; the same message read again (a re-run) once."""
    truncate = "TRUNCATE TABLE t"
    first = plan(ConsumerState(), [row(None, 0, 0, "insert", {"id": 1}), ddl(None, 0, 1, truncate)], [],
                 mode=OFFSET_ORDER)
    second = plan(first.state, [row(None, 0, 2, "insert", {"id": 2}), ddl(None, 0, 3, truncate),
                                row(None, 0, 4, "insert", {"id": 3})], [], mode=OFFSET_ORDER)
    assert [s.query for s in second.steps if isinstance(s, DDLRecord)] == [truncate]
    again = plan(second.state, [ddl(None, 0, 3, truncate)], [], mode=OFFSET_ORDER)
    assert again.steps == [] and again.duplicate_ddl == 1


def test_key_override_and_missing_key() -> None:
    keys = KeyResolver({("s", "t"): ["v"]})
    p = plan_batch(ConsumerState(), [row(1, 0, 0, "insert", {"id": 1, "v": "a"})], [rm(0, 1, 1)],
                   mode=WATERMARK, keys=keys, partitions={"cdc": [0]})
    assert set(final(p.steps[0])) == {("a",)}
    with pytest.raises(MissingKeyError, match="lacks key columns"):
        plan_batch(ConsumerState(), [row(1, 0, 0, "delete", old={"id": 1})], [rm(0, 1, 1)],
                   mode=WATERMARK, keys=keys, partitions={"cdc": [0]})


def test_unknown_mode() -> None:
    with pytest.raises(ValueError, match="unknown mode"):
        plan(ConsumerState(), [], [], mode="nope")


def test_names_are_folded_where_records_enter_unless_case_sensitive() -> None:
    recs = [row(10, 0, 0, "insert", {"id": 1, "v": "a"}, table="Orders")._replace(schema="SHOP"),
            row(11, 0, 1, "update", {"id": 1, "v": "b"}, {"id": 1, "v": "a"}, table="orders"),
            ddl(12, 0, 2)._replace(schema="S", table="T")]
    held = plan(ConsumerState(), recs[:1], [rm(0, 1, 10)])  # partition 1 holds it back
    assert held.state.held[0].schema == "shop" and held.state.held[0].table == "orders"
    p = plan_batch(ConsumerState(held.state.watermarks, [recs[0]]), recs[1:], [rm(0, 3, 20), rm(1, 0, 20)],
                   mode=WATERMARK, keys=KeyResolver(), partitions={"cdc": (0, 1)})
    assert set(p.steps[0].tables) == {("shop", "orders"), ("s", "orders")}
    assert p.steps[1].schema == "s" and p.steps[1].table == "t"
    one = plan_batch(ConsumerState(), [recs[0], recs[1]._replace(schema="Shop")], [], mode=OFFSET_ORDER,
                     keys=KeyResolver())
    assert list(one.steps[0].tables) == [("shop", "orders")]
    assert one.steps[0].tables[("shop", "orders")].changes[(1,)].image[1][3] == "b"
    apart = plan_batch(ConsumerState(), [recs[0], recs[1]._replace(schema="Shop")], [], mode=OFFSET_ORDER,
                       keys=KeyResolver(), case_sensitive=True)
    assert set(apart.steps[0].tables) == {("SHOP", "Orders"), ("Shop", "orders")}
