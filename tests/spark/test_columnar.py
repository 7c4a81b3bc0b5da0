"""The spark engine's columnar path gives the record path's final changes.

The record path runs a table's rules in :meth:`~ticdc_delta.core.table_rules.TableRules.apply_table` and
converts the final changes for the MERGE; the columnar path places, screens and converts each row alone
(:func:`~ticdc_delta.spark.columnar.columnar_fn`) and lets Spark keep the last change per key
(:func:`~ticdc_delta.spark.columnar.collapse_changes`). Over generated streams — held rows carried from batch
to batch, replays, key-changing updates, deletes, a snapshot seam, forged commit ts, values no column can
hold — both must give the same converted final change per key, the same held rows and the same refusals.
"""

from __future__ import annotations

import pickle
import random
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

from ticdc_delta.codec.model import ColumnFlag as F, TypeCode as T
from ticdc_delta.core.batch_planner import OFFSET_ORDER, WATERMARK, ConsumerState
from ticdc_delta.core.key_buckets import route, signature
from ticdc_delta.core.merge import DELETE, KeyResolver
from ticdc_delta.core.records import ChangeRecord, dump_record, dump_row_values, load_record
from ticdc_delta.core.snapshot_seam import SnapshotSeam
from ticdc_delta.core.table_rules import RELEASED, group_rows, plan_coordination
from ticdc_delta.core.ts_guard import TsGuard
from ticdc_delta.delta.applier import TableCatalog
from ticdc_delta.delta.arrow_types import converter_for
from ticdc_delta.delta.value_check import ValueScreen
from ticdc_delta.spark.columnar import (CHANGE, COORDS, ColumnarTable, collapse_changes, columnar_fn,
                                        columnar_tables, final_counts, integer_keys)

from ..core.test_table_rules import _batches, _stream

TOO_BIG = 1 << 70  # no BIGINT column holds it: the value screen refuses the change


def _records(seed: int) -> tuple[list[ChangeRecord], list[Any]]:
    """The rows of a generated stream (no DDL: the columnar path's batches), a few with a value the
    screen refuses."""
    rnd = random.Random(seed)
    records, marks = _stream(seed, n=600)
    rows = []
    for r in records:
        if not isinstance(r, ChangeRecord):
            continue
        if r.new is not None and rnd.random() < 0.03:
            r = r._replace(new=(r.new[0], (*r.new[1][:3], TOO_BIG)))
        rows.append(r)
    return rows, marks


def _cases(seed: int, mode: str):
    """Per batch and table: the columnar path's table, its input rows (``held``, ``payload``), what
    :func:`columnar_fn` makes of them, and the record path's outcome with its final changes converted."""
    records, marks = _records(seed)
    guard = TsGuard(10**12 - 1, 0)
    seam = SnapshotSeam({("s", "b"): records[len(records) // 3].commit_ts})
    state, held_rows = ConsumerState(), []
    for rows, resolved in _batches(records, marks, 4):
        plan, rules = plan_coordination(state, [], resolved, mode=mode, partitions={"cdc": [0, 1, 2]}, guard=guard,
                                        seam=seam)
        state = plan.state
        new_by_table, held_by_table = group_rows(rows, False), group_rows(held_rows, False)
        next_held = []
        for ident in sorted(set(new_by_table) | set(held_by_table)):
            new, held = new_by_table.get(ident, []), held_by_table.get(ident, [])
            screen = ValueScreen(TableCatalog(), "UTC")
            whole = rules.apply_table(new, held, KeyResolver(), screen)
            next_held += whole.held
            folded = [r._replace(schema=ident[0], table=ident[1]) for r in new]
            layouts = {signature(route(r, KeyResolver()).layout): pickle.dumps(route(r, KeyResolver()).layout)
                       for r in [*folded, *held]}
            table = columnar_tables({ident: [layouts, len(new) + len(held)]}, [], lambda s, t: None,
                                    TableCatalog().params, 1)[ident]
            # as the engine has them: the decoder's rows as their values, the held ones as whole records
            routes = [route(r, KeyResolver()) for r in [*new, *held]]
            batch = _input(new, held, routes)
            job = SimpleNamespace(rules=rules, keys=None, catalog_json=TableCatalog().to_json(), tz="UTC",
                                  policy=None, case_sensitive=False, delta_types=None,
                                  layouts={r.signature: r.layout for r in routes})
            out = pa.Table.from_batches(list(columnar_fn(job, table)(iter([batch]))))
            yield table, out, whole, screen
        held_rows = next_held


def _input(new: list[ChangeRecord], held: list[ChangeRecord], routes: list[Any]) -> pa.RecordBatch:
    """The columnar path's input as the engine gives it: the decoder's rows as their values with their
    coordinates, then the held ones as whole records (no coordinates: the staging table has none)."""
    coords = {name: [getattr(r, name) for r in new] + [None] * len(held) for name in COORDS}
    return pa.RecordBatch.from_pydict({"held": [False] * len(new) + [True] * len(held),
                                       "payload": [*map(_in_flight, new), *map(dump_record, held)],
                                       "sig": [r.signature for r in routes], **coords})


def _in_flight(r: ChangeRecord) -> bytes:
    """A new row's bytes as the decoder hands them on (its images as values alone)."""
    return dump_row_values(r.op, *(None if i is None else tuple(c[3] for c in i) for i in (r.new, r.old)))


def _expected(table: Any, whole: Any) -> dict:
    """The record path's final changes, converted as the MERGE converts them: key -> (op, values by
    column, commit ts, source op)."""
    got = {}
    for _, tc in whole.segments:
        assert tc.key_columns == table.key
        for key, fc in tc.changes.items():
            image = {c[0]: converter_for(c[1], c[2], None, "UTC")(c[3]) for c in fc.image}
            got[key] = ("d" if fc.kind == DELETE else "u", image, fc.commit_ts, fc.op)
    return got


def _as_finals(table: Any, rows: list[dict]) -> dict:
    """Final changes (rows of ``c<i>``, ``_op``...) as :func:`_expected` gives them."""
    names = [c[0] for c in table.columns]
    key_at = table.key_at
    return {tuple(r[f"c{i}"] for i in key_at): (r["_op"], {n: r[f"c{i}"] for i, n in enumerate(names[:r["_width"]])},
                                               r["_commit_ts"], r["_source_op"]) for r in rows}


def _last_per_key(table: Any, out: pa.Table, watermark: bool) -> list[dict]:
    """The reference collapse: per key, the change row last in apply order."""
    last: dict = {}
    for r in out.to_pylist():
        if r["_kind"] != CHANGE:
            continue
        order = ((r["_commit_ts"] or 0,) if watermark else ()) + (r["_topic"], r["_partition"], r["_offset"], r["_idx"])
        key = tuple(r[f"c{i}"] for i in table.key_at)
        if key not in last or last[key][0] < order:
            last[key] = (order, r)
    return [r for _, r in last.values()]


@pytest.mark.parametrize("mode", [WATERMARK, OFFSET_ORDER])
@pytest.mark.parametrize("seed", range(4))
def test_the_columnar_rows_give_the_record_paths_outcome(seed: int, mode: str) -> None:
    """Per table and batch: the last change per key of the columnar rows equals the record path's final
    changes (converted); held rows, replays, snapshot drops, implausible ts and value refusals agree."""
    seen = {"held": 0, "replays": 0, "rejections": 0, "rejected_ts": 0, "snapshot_dropped": 0, "key_changes": 0}
    for table, out, whole, screen in _cases(seed, mode):
        rows = out.to_pylist()
        assert _as_finals(table, _last_per_key(table, out, mode == WATERMARK)) == _expected(table, whole)
        summary = pickle.loads(next(r["_payload"] for r in rows if r["_kind"] == "summary"))
        assert (summary["replays"], summary["released"], summary["snapshot_dropped"]) == (
            whole.replays, whole.released, whole.snapshot_dropped)
        assert sorted(load_record(r["_payload"]) for r in rows if r["_kind"] == "held") == sorted(whole.held)
        assert summary["held"] == len(whole.held)
        assert sorted(pickle.loads(r["_payload"]) for r in rows if r["_kind"] == "rejected_ts") == sorted(whole.rejected)
        refused = [pickle.loads(r["_payload"]) for r in rows if r["_kind"] == "rejection"]
        assert sorted(refused) == sorted(screen.rejections) and summary["rejections"] == len(refused)
        coords = [(r["_partition"], r["_offset"]) for r in rows if r["_kind"] == CHANGE]
        seen["key_changes"] += len(coords) - len(set(coords))  # an update that changed the key: two rows
        for name in ("held", "replays", "rejected_ts", "snapshot_dropped"):
            seen[name] += summary[name]
        seen["rejections"] += len(refused)
    # every rule had something to do (no vacuous pass)
    assert all(seen[name] for name in ("rejections", "rejected_ts", "snapshot_dropped", "key_changes")), seen
    if mode == WATERMARK:
        assert seen["held"] and seen["replays"], seen


@pytest.mark.integration
@pytest.mark.parametrize("mode", [WATERMARK, OFFSET_ORDER])
def test_spark_collapses_the_columnar_rows_to_the_last_change_per_key(spark: Any, mode: str) -> None:
    """collapse_changes (Spark's max per key of the apply order) keeps each key's last change, and
    final_counts counts them, over the columnar rows of generated streams."""
    checked = ranged = 0
    for seed in range(2):
        for table, out, whole, _ in _cases(seed, mode):
            frame = spark.createDataFrame(out)
            finals = collapse_changes(frame, table, watermark=mode == WATERMARK)
            rows = [r.asDict() for r in finals.collect()]
            got = _as_finals(table, rows)
            assert got == _expected(table, whole)
            keys = integer_keys(table)
            counts = final_counts(finals, keys).first()
            for name, column in keys:  # each integer key column's range, None where it holds a null
                values = [r[column] for r in rows]
                if not values:
                    continue
                want = None if None in values else [str(min(values)), str(max(values))]
                assert counts["ranges"][name] == want, (name, values)
                ranged += want is not None
            assert (counts["rows"], counts["deleted"]) == (len(got), sum(v[0] == "d" for v in got.values()))
            assert counts["last_ts"] == max((v[2] for v in got.values()), default=None)
            assert counts["width"] == max((len(v[1]) for v in got.values()), default=0)
            checked += len(got)
    assert checked > 100 and ranged > 0


def test_a_row_without_its_key_stops_the_job_unless_a_value_refuses_it_first() -> None:
    """As the record path: a released change whose image lacks the key is an error (the driver stops the
    job with it), but one that also holds a value no Delta column can hold is refused (dead-lettered)
    first; the other rows of the batch convert."""
    key, other = ("id", int(T.BIGINT), int(F.PRIMARY_KEY | F.HANDLE_KEY)), ("a", int(T.BIGINT), int(F.NULLABLE))
    table = ColumnarTable("s", "t", (other, key), (pa.int64(), pa.int64()), ("id",))

    def run(*images: tuple) -> list[dict]:
        recs = [ChangeRecord(100 + i, "cdc", 0, i, 0, "s", "t", "insert", image, None)
                for i, image in enumerate(images)]
        routes = [route(r, KeyResolver()) for r in recs]
        job = SimpleNamespace(rules=SimpleNamespace(placer=lambda schema, table: lambda *row: RELEASED), keys=None,
                              catalog_json=TableCatalog().to_json(), tz="UTC", policy=None, case_sensitive=False,
                              delta_types=None, layouts={r.signature: r.layout for r in routes})
        batch = _input(recs, [], routes)
        return pa.Table.from_batches(list(columnar_fn(job, table)(iter([batch])))).to_pylist()

    whole = ((*other, 5), (*key, 1))
    rows = run(whole, ((*other, 7),))
    assert [r["_kind"] for r in rows] == ["error"]
    assert pickle.loads(rows[0]["_payload"]) == "s.t: row image lacks key columns ('id',)"
    rows = run(whole, ((*other, TOO_BIG),))
    assert [(r["_kind"], r["c0"], r["c1"]) for r in rows if r["_kind"] != "summary"] == [
        (CHANGE, 5, 1), ("rejection", None, None)]
    rejection = pickle.loads(next(r["_payload"] for r in rows if r["_kind"] == "rejection"))
    assert (rejection.offset, rejection.column, rejection.value) == (1, "a", TOO_BIG)
    assert pickle.loads(rows[-1]["_payload"])["rejections"] == 1
