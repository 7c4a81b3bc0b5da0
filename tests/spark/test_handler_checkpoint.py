"""BatchHandler driven directly on real Spark DataFrames and real Delta tables: two jobs on one
checkpoint, and the ts plausibility clock taken from the Spark offset log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ticdc_delta.config import config_from_mapping
from ticdc_delta.delta.sink import read_table
from ticdc_delta.errors import ConcurrentJobError
from ticdc_delta.simulator import simulate
from ticdc_delta.simulator.output import MemorySink
from ticdc_delta.simulator.workload import TsoClock
from ticdc_delta.spark.batch_handler import BatchHandler

pytestmark = pytest.mark.integration

KAFKA_SCHEMA = "topic string, partition int, offset long, key binary, value binary"
CANAL = {"enable-tidb-extension": "true"}


def _batches(spark: Any, n: int) -> list[Any]:
    """The simulated canal-json stream as Kafka-shaped DataFrames, cut into ``n`` batches."""
    memory = MemorySink()
    simulate("canal-json", CANAL, seed=4, events=120, tables=1, partitions=2, sink=memory, topic="cdc")
    next_offset = {0: 0, 1: 0}
    rows = []
    for partition, key, value in memory.messages:
        rows.append(("cdc", partition, next_offset[partition], key, value))
        next_offset[partition] += 1
    size = -(-len(rows) // n)
    return [spark.createDataFrame(rows[i:i + size], KAFKA_SCHEMA) for i in range(0, len(rows), size)]


def _cfg(tmp: Path) -> Any:
    return config_from_mapping({
        "changefeed": "two",
        "source": {"bootstrap_servers": "127.0.0.1:9", "topic": "cdc", "protocol": "canal-json", "options": CANAL},
        "sink": {"path": str(tmp / "lake")},
        "checkpoint": str(tmp / "ckpt"),
    })


def _handler(cfg: Any) -> BatchHandler:
    # partitions_of: the topic's partition list, as Kafka metadata would give it (there is no broker here)
    return BatchHandler(cfg, partitions_of=lambda topic: [0, 1])


def test_a_second_job_on_the_same_checkpoint_stops_with_a_terminal_error(spark: Any, tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    b0, b1, _ = _batches(spark, 3)
    job_a, job_b = _handler(cfg), _handler(cfg)
    job_a(b0, 0)
    job_b(b0, 0)  # sees batch 0 in the state: already committed, nothing done
    job_a(b1, 1)
    with pytest.raises(ConcurrentJobError, match="another job is running on the same checkpoint") as info:
        job_b(b1, 1)  # planned from the state after batch 0, but job A committed batch 1 meanwhile
    assert not info.value.retryable
    job_a2 = _handler(cfg)
    job_a2(b1, 1)  # a restarted job sees batch 1 committed and goes on
    assert job_a2.batches == 0


def test_the_ts_clock_is_the_batch_time_in_sparks_offset_log(spark: Any, tmp_path: Path) -> None:
    """A batch whose recorded time is 2 hours before the stream's commit ts: everything in it is from the
    future for that batch — on every attempt, whatever the wall clock says."""
    cfg = _cfg(tmp_path)
    (batch,) = _batches(spark, 1)
    offsets = tmp_path / "ckpt" / "spark" / "offsets"
    offsets.mkdir(parents=True)
    recorded = TsoClock.START_MS - 2 * 3_600_000
    (offsets / "0").write_text(
        f'v1\n{{"batchWatermarkMs":0,"batchTimestampMs":{recorded},"conf":{{}}}}\n{{"cdc":{{"0":0,"1":0}}}}\n'
    )
    (tmp_path / "ckpt" / "spark" / "metadata").write_text(json.dumps({"id": "q-1"}))
    handler = _handler(cfg)
    handler(batch, 0)
    dead = read_table(cfg.dead_letter_path).to_pylist()
    assert dead and all("ahead of the reference clock" in row["error"] for row in dead)
    assert {row["offset"] for row in dead if row["partition"] == 0}  # with their coordinates and bytes
    assert all(row["value"] for row in dead)
    assert handler.store.load().meta["checkpoint"] == {"query_id": "q-1"}  # type: ignore[union-attr]


def _canal_insert(commit_ts: int, row_id: int, code: str) -> bytes:
    return json.dumps({
        "id": 0, "database": "test", "table": "orders", "pkNames": ["id"], "isDdl": False, "type": "INSERT",
        "es": 1, "ts": 1, "sql": "", "sqlType": {"id": -5, "code": 12},
        "mysqlType": {"id": "bigint", "code": "varchar"}, "data": [{"id": str(row_id), "code": code}],
        "old": None, "_tidb": {"commitTs": commit_ts},
    }).encode()


def _canal_watermark(ts: int) -> bytes:
    return json.dumps({"id": 0, "database": "", "table": "", "pkNames": None, "isDdl": False,
                       "type": "TIDB_WATERMARK", "es": 1, "ts": 1, "sql": "", "sqlType": None, "mysqlType": None,
                       "data": None, "old": None, "_tidb": {"watermarkTs": ts}}).encode()


@pytest.mark.parametrize("engine,sink,key", [
    ("delta-rs", {}, "code"), ("delta-rs", {}, "CODE"), ("spark", {"columnar_rows": 1}, "Code"),
    ("spark", {"columnar_rows": 0, "split_rows": 1}, "CODE")], ids=["delta-rs", "delta-rs-case", "spark-columnar-case",
                                                                     "spark-records-case"])
def test_a_key_override_on_a_wildcard_mapping_is_the_merge_key(
        engine: str, sink: dict, key: str, spark: Any, tmp_path: Path) -> None:
    """``tables: [{source: "test.*", key: [code]}]``: rows with different ids but one code are one row. MySQL's
    column names are case-insensitive: ``CODE`` names the column ``code`` (it stopped the job with a missing key)."""
    base = json.loads(json.dumps(_cfg(tmp_path).model_dump(mode="json", exclude_none=True)))
    cfg = config_from_mapping({
        **base, "sink": {**base["sink"], "engine": engine, **sink},
        "tables": [{"source": "test.*", "key": [key]}],
    })
    ts = TsoClock.START_MS << 18
    rows = [("cdc", 0, 0, None, _canal_insert(ts + 1, 1, "A")), ("cdc", 0, 1, None, _canal_insert(ts + 2, 2, "A")),
            ("cdc", 0, 2, None, _canal_watermark(ts + 3)), ("cdc", 1, 0, None, _canal_watermark(ts + 3))]
    _handler(cfg)(spark.createDataFrame(rows, KAFKA_SCHEMA), 0)
    table = read_table(cfg.table_path("test", "orders")).to_pylist()
    assert [(r["id"], r["code"]) for r in table] == [(2, "A")]  # merged on code, not on the flagged id


def _canal_row(commit_ts: int, op: str, data: dict, old: dict | None = None) -> bytes:
    return json.dumps({
        "id": 0, "database": "test", "table": "sales", "pkNames": ["region", "id"], "isDdl": False, "type": op,
        "es": 1, "ts": 1, "sql": "", "sqlType": {"region": 12, "id": -5, "v": 12},
        "mysqlType": {"region": "varchar", "id": "bigint", "v": "varchar"}, "data": [data], "old": old and [old],
        "_tidb": {"commitTs": commit_ts},
    }).encode()


@pytest.mark.parametrize("engine", ["spark", "delta-rs"])
def test_an_empty_text_partition_value_of_the_key_is_updated_and_deleted_in_place(
        engine: str, spark: Any, tmp_path: Path) -> None:
    """``partition_by: [region]`` with the key (region, id) and region '': Spark writes '' there as null (Delta's
    partition values cannot hold ''), so the MERGE's ``t.region <=> s.region`` never matched the row again: an
    update inserted a second row, a delete removed nothing."""
    base = json.loads(json.dumps(_cfg(tmp_path).model_dump(mode="json", exclude_none=True)))
    cfg = config_from_mapping({**base, "sink": {**base["sink"], "engine": engine},
                               "tables": [{"source": "test.sales", "partition_by": ["region"]}]})
    ts = TsoClock.START_MS << 18
    handler = _handler(cfg)
    batches = [
        [_canal_row(ts + 1, "INSERT", {"region": "", "id": "1", "v": "a"}),
         _canal_row(ts + 1, "INSERT", {"region": "", "id": "2", "v": "b"}),
         _canal_row(ts + 1, "INSERT", {"region": "eu", "id": "1", "v": "c"})],
        [_canal_row(ts + 3, "UPDATE", {"region": "", "id": "1", "v": "a2"}, {"region": "", "id": "1", "v": "a"}),
         _canal_row(ts + 3, "DELETE", {"region": "", "id": "2", "v": "b"})],
    ]
    offset = 0
    for batch_id, messages in enumerate(batches):
        rows = [("cdc", 0, offset + i, None, m) for i, m in enumerate(messages)]
        offset += len(messages)
        rows += [("cdc", 0, offset, None, _canal_watermark(ts + 2 + 2 * batch_id)),
                 ("cdc", 1, batch_id, None, _canal_watermark(ts + 2 + 2 * batch_id))]
        offset += 1
        handler(spark.createDataFrame(rows, KAFKA_SCHEMA), batch_id)
    table = read_table(cfg.table_path("test", "sales")).to_pylist()
    assert sorted(((r["region"] or ""), r["id"], r["v"]) for r in table) == [("", 1, "a2"), ("eu", 1, "c")]


def test_the_delta_rs_engine_warns_when_held_rows_pile_up(spark: Any, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """Held rows live in the driver's memory on the delta-rs engine: past a bound (1M; 1 here) each batch
    that holds more than ever warns, naming the partition that holds them back."""
    import logging

    import ticdc_delta.spark.batch_handler as handler_module

    monkeypatch.setattr(handler_module, "HELD_ROWS_WARNING", 1)
    cfg = config_from_mapping({
        "changefeed": "held",
        "source": {"bootstrap_servers": "127.0.0.1:9", "topic": "cdc", "protocol": "canal-json", "options": CANAL},
        "sink": {"path": str(tmp_path / "lake"), "engine": "delta-rs"},
        "checkpoint": str(tmp_path / "ckpt"),
    })
    handler = _handler(cfg)
    held = []
    with caplog.at_level(logging.WARNING, logger="ticdc_delta.spark.batch_handler"):
        for i, batch in enumerate(_batches(spark, 4)):
            handler(batch, i)
            held.append(handler._state.held if handler._state is not None else [])
    warnings = [r.getMessage() for r in caplog.records if "rows held waiting for the watermark" in r.getMessage()]
    assert any(held), "no batch held rows: the test proves nothing"
    assert warnings and all("the slowest partition is cdc[" in w and "sink.engine: spark" in w for w in warnings)


def test_a_key_edited_between_runs_keeps_the_rows_held_across_it(spark: Any, tmp_path: Path) -> None:
    """Rows held by a run (staged with the buckets of the key then configured), then ``tables[].key``
    edited and the job restarted: the next batch splits the table into key buckets by the new key, and a
    held row in a bucket that does not own its new key was dropped without a word."""
    base = json.loads(json.dumps(_cfg(tmp_path).model_dump(mode="json", exclude_none=True)))
    sink = {**base["sink"], "engine": "spark", "columnar_rows": 0, "split_rows": 16}
    before = config_from_mapping({**base, "sink": sink})
    after = config_from_mapping({**base, "sink": sink, "tables": [{"source": "test.orders", "key": ["code"]}]})
    ts = TsoClock.START_MS << 18
    held = [("cdc", 0, i, None, _canal_insert(ts + 10, i + 1, f"h{i}")) for i in range(8)]
    _handler(before)(spark.createDataFrame(
        held + [("cdc", 0, 8, None, _canal_watermark(ts + 20)), ("cdc", 1, 0, None, _canal_watermark(ts + 5))],
        KAFKA_SCHEMA), 0)
    assert not Path(after.table_path("test", "orders")).exists()  # every row is held (partition 1 is behind)
    new = [("cdc", 0, 9 + i, None, _canal_insert(ts + 25, 100 + i, f"n{i}")) for i in range(40)]
    handler = _handler(after)
    handler(spark.createDataFrame(
        new + [("cdc", 0, 49, None, _canal_watermark(ts + 30)), ("cdc", 1, 1, None, _canal_watermark(ts + 30))],
        KAFKA_SCHEMA), 1)
    table = read_table(after.table_path("test", "orders")).to_pylist()
    assert sorted(r["code"] for r in table) == sorted([f"h{i}" for i in range(8)] + [f"n{i}" for i in range(40)])


def _canal_table_row(table: str, commit_ts: int, row_id: int) -> bytes:
    return json.dumps({
        "id": 0, "database": "test", "table": table, "pkNames": ["id"], "isDdl": False, "type": "INSERT",
        "es": 1, "ts": 1, "sql": "", "sqlType": {"id": -5}, "mysqlType": {"id": "bigint"},
        "data": [{"id": str(row_id)}], "old": None, "_tidb": {"commitTs": commit_ts},
    }).encode()


def _canal_ddl(table: str, commit_ts: int, sql: str) -> bytes:
    return json.dumps({"id": 0, "database": "test", "table": table, "pkNames": None, "isDdl": True, "type": "ALTER",
                       "es": 1, "ts": 1, "sql": sql, "sqlType": None, "mysqlType": None, "data": None,
                       "old": None, "_tidb": {"commitTs": commit_ts}}).encode()


def _offset_log(tmp: Path, batch_id: int, planned_ms: int) -> None:
    """Spark's offset log entry of ``batch_id`` (written before the batch runs, kept for its re-runs)."""
    offsets = tmp / "ckpt" / "spark" / "offsets"
    offsets.mkdir(parents=True, exist_ok=True)
    (offsets / str(batch_id)).write_text(
        f'v1\n{{"batchWatermarkMs":0,"batchTimestampMs":{planned_ms},"conf":{{}}}}\n{{"cdc":{{"0":0,"1":0}}}}\n')


def test_a_batch_begun_on_one_engine_is_not_rerun_on_the_other(spark: Any, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The delta-rs engine cuts every table's rows at every DDL of a batch, the spark engine only at the
    table's own DDL: the two number a table's commits of one batch differently. A batch the delta-rs engine
    half applied (table b's rows before a DDL of table a committed, its rows after it not) re-run on the
    spark engine had its one MERGE of b skipped as already committed, and b's later rows were lost. Such a
    re-run is refused with the way on, also when the batch was begun by a run that had just switched
    engines (the state's last batch is the other engine's); a switch between finished batches goes on."""
    import time

    from ticdc_delta.errors import ConfigError
    from ticdc_delta.spark.batch_handler import FAULT_ENV, InjectedFault

    base = json.loads(json.dumps(_cfg(tmp_path).model_dump(mode="json", exclude_none=True)))
    on = {engine: config_from_mapping({**base, "sink": {**base["sink"], "engine": engine}})
          for engine in ("delta-rs", "spark")}
    ts = TsoClock.START_MS << 18
    frames = [[_canal_table_row("a", ts + 1, 1), _canal_table_row("b", ts + 1, 1)],
              [_canal_table_row("b", ts + 3, 2), _canal_ddl("a", ts + 4, "ALTER TABLE a ADD COLUMN z INT"),
               _canal_table_row("b", ts + 5, 3)],
              [_canal_table_row("b", ts + 11, 4), _canal_ddl("a", ts + 12, "ALTER TABLE a ADD COLUMN y INT"),
               _canal_table_row("b", ts + 13, 5)]]
    batches = []
    for batch_id, messages in enumerate(frames):
        rows = [("cdc", 0, 10 * batch_id + i, None, m) for i, m in enumerate(messages)]
        rows += [("cdc", 0, 10 * batch_id + 9, None, _canal_watermark(ts + 2 + 8 * batch_id)),
                 ("cdc", 1, batch_id, None, _canal_watermark(ts + 2 + 8 * batch_id))]
        batches.append(spark.createDataFrame(rows, KAFKA_SCHEMA))

    def crash(engine: str, batch_id: int, frame: Any) -> None:
        monkeypatch.setenv(FAULT_ENV, f"after_merge@{batch_id}")
        with pytest.raises(InjectedFault):
            _handler(on[engine])(frame, batch_id)  # dies after its first commit (b's rows before the DDL)
        monkeypatch.delenv(FAULT_ENV)

    def refused(engine: str, batch_id: int, frame: Any, began: str) -> None:
        with pytest.raises(ConfigError, match=rf"micro-batch {batch_id}, planned by an earlier run on the {began} "
                                              rf"engine, did not finish .* finish it with sink\.engine: {began} "
                                              r"\(one `run --once`\), then switch"):
            _handler(on[engine])(frame, batch_id)

    _handler(on["delta-rs"])(batches[0], 0)
    _offset_log(tmp_path, 1, int(time.time() * 1000) - 60_000)  # batch 1 planned by that earlier run
    crash("delta-rs", 1, batches[1])
    refused("spark", 1, batches[1], "delta-rs")
    _handler(on["delta-rs"])(batches[1], 1)  # the way on: the batch finished on its engine ...
    spark_run = _handler(on["spark"])
    spark_run(batches[0], 2)  # ... then the other engine's run goes on (a replay of batch 0's messages)
    assert spark_run.batches == 1
    assert sorted(r["id"] for r in read_table(on["spark"].table_path("test", "b")).to_pylist()) == [1, 2, 3]

    # the state's last batch is the spark engine's; a run switched back to delta-rs begins batch 3 and dies
    _offset_log(tmp_path, 3, int(time.time() * 1000) + 60_000)
    crash("delta-rs", 3, batches[2])
    _offset_log(tmp_path, 3, int(time.time() * 1000) - 60_000)  # (for the runs after it: planned before them)
    refused("spark", 3, batches[2], "delta-rs")
    _handler(on["delta-rs"])(batches[2], 3)  # its own engine finishes it
    assert sorted(r["id"] for r in read_table(on["spark"].table_path("test", "b")).to_pylist()) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("engine", ["delta-rs", "spark"])
def test_a_table_the_config_now_puts_elsewhere_is_not_started_over_there(engine: str, spark: Any,
                                                                         tmp_path: Path) -> None:
    """``sink.path`` (or ``tables[].path``) edited between two runs: the next rows of a table made a new
    table at the new location holding only them, the earlier rows left behind without a word. Refused,
    naming both locations; once the table is moved there the job goes on."""
    import shutil

    from ticdc_delta.errors import TableMissingError

    base = json.loads(json.dumps(_cfg(tmp_path).model_dump(mode="json", exclude_none=True)))
    old, new = (config_from_mapping({**base, "sink": {**base["sink"], "engine": engine, "path": str(tmp_path / lake)}})
                for lake in ("lake", "moved"))
    ts = TsoClock.START_MS << 18

    def batch(offset: int, row_id: int) -> Any:
        return spark.createDataFrame([
            ("cdc", 0, offset, None, _canal_insert(ts + 2 * offset + 1, row_id, f"c{row_id}")),
            ("cdc", 0, offset + 1, None, _canal_watermark(ts + 2 * offset + 2)),
            ("cdc", 1, offset, None, _canal_watermark(ts + 2 * offset + 2))], KAFKA_SCHEMA)

    _handler(old)(batch(0, 1), 0)
    before = old.table_path("test", "orders")
    with pytest.raises(TableMissingError, match=rf"table test\.orders has had changes applied by this changefeed, but "
                                                rf"there is no Delta table at {new.table_path('test', 'orders')} "
                                                rf"\(the config put it at {before} before\)"):
        _handler(new)(batch(2, 2), 1)
    assert not Path(new.table_path("test", "orders")).exists()
    Path(new.table_path("test", "orders")).parent.mkdir(parents=True)
    shutil.move(before, new.table_path("test", "orders"))
    _handler(new)(batch(2, 2), 1)
    assert sorted(r["id"] for r in read_table(new.table_path("test", "orders")).to_pylist()) == [1, 2]


def test_a_partition_past_partition_num_is_waited_for_while_it_still_sends(tmp_path: Path) -> None:
    """``partition-num`` lowered: a partition past it that still has messages in the batch (rows TiCDC wrote
    before the change, not read yet) keeps its watermark; one that sent none is read to its end and dropped."""
    from ticdc_delta.core.batch_planner import ConsumerState

    base = json.loads(json.dumps(_cfg(tmp_path).model_dump(mode="json", exclude_none=True)))
    cfg = config_from_mapping({**base, "source": {**base["source"], "options": {**CANAL, "partition-num": "1"}}})
    handler = _handler(cfg)
    state = ConsumerState({("cdc", 0): 5, ("cdc", 1): 3}, [], [], 3)
    assert handler._retire_partitions(state, {("cdc", 0): [0, 1], ("cdc", 1): [7, 9]}) is state
    assert handler._retire_partitions(state, {("cdc", 0): [0, 1]}).watermarks == {("cdc", 0): 5}
    assert _handler(_cfg(tmp_path))._retire_partitions(state, {}) is state  # (no partition-num: all waited for)


@pytest.mark.parametrize("engine,sink", [("delta-rs", {}), ("spark", {"columnar_rows": 1}),
                                         ("spark", {"columnar_rows": 0, "split_rows": 1})],
                         ids=["delta-rs", "spark-columnar", "spark-records"])
def test_shards_mapped_to_one_path_all_land_from_one_batch(engine: str, sink: dict, spark: Any,
                                                           tmp_path: Path) -> None:
    """``tables: [{source: "test.shard_*", path: ...}]`` merges shards into one table. Regression: the
    shards' commits of one batch were numbered apart, so their first MERGEs carried one app transaction and
    Delta skipped all but one as committed already — the other shards' rows lost, though counted. The spark
    engine runs the MERGEs into one location one after another, in their order (concurrent, a later one
    committed first would make an earlier one a no-op)."""
    base = json.loads(json.dumps(_cfg(tmp_path).model_dump(mode="json", exclude_none=True)))
    shared = str(tmp_path / "merged")
    cfg = config_from_mapping({**base, "sink": {**base["sink"], "engine": engine, "merge_threads": 2, **sink},
                               "tables": [{"source": "test.shard_*", "path": shared}]})
    ts = TsoClock.START_MS << 18

    def batch(offset: int, *rows: tuple[str, int]) -> Any:
        changes = [("cdc", 0, offset + i, None, _canal_table_row(table, ts + offset + i + 1, row_id))
                   for i, (table, row_id) in enumerate(rows)]
        end = ts + offset + len(rows) + 1
        return spark.createDataFrame([*changes, ("cdc", 0, offset + len(rows), None, _canal_watermark(end)),
                                      ("cdc", 1, offset, None, _canal_watermark(end))], KAFKA_SCHEMA)

    _handler(cfg)(batch(0, ("shard_1", 1), ("shard_2", 1001), ("shard_3", 2001)), 0)
    _handler(cfg)(batch(10, ("shard_2", 1002), ("shard_1", 2)), 1)
    assert sorted(r["id"] for r in read_table(shared).to_pylist()) == [1, 2, 1001, 1002, 2001]


def _canal_spelled(commit_ts: int, row_id: int, column: str, value: str) -> bytes:
    return json.dumps({
        "id": 0, "database": "test", "table": "orders", "pkNames": ["id"], "isDdl": False, "type": "INSERT",
        "es": 1, "ts": 1, "sql": "", "sqlType": {"id": -5, column: 12}, "mysqlType": {"id": "bigint", column: "varchar"},
        "data": [{"id": str(row_id), column: value}], "old": None, "_tidb": {"commitTs": commit_ts},
    }).encode()


@pytest.mark.parametrize("engine,sink", [("delta-rs", {}), ("spark", {}),
                                         ("spark", {"columnar_rows": 0, "split_rows": 1})],
                         ids=["delta-rs", "spark", "spark-buckets"])
def test_images_that_spell_a_column_in_two_cases_are_one_column(engine: str, sink: dict, spark: Any,
                                                                tmp_path: Path) -> None:
    """Rows from before and after an upstream rename that changed only a column's case (``v`` → ``V``; Avro
    carries no DDL, so they can share a MERGE). Regression: the MERGE's source got two columns for the
    table's one — "duplicate column names" on every re-run, the job stopped for good."""
    base = json.loads(json.dumps(_cfg(tmp_path).model_dump(mode="json", exclude_none=True)))
    cfg = config_from_mapping({**base, "sink": {**base["sink"], "engine": engine, **sink}})
    ts = TsoClock.START_MS << 18
    messages = [_canal_spelled(ts + 1, 1, "v", "a"), _canal_spelled(ts + 2, 2, "V", "b"),
                _canal_spelled(ts + 3, 3, "v", "c"), _canal_spelled(ts + 4, 4, "V", "d")]
    rows = [("cdc", 0, i, None, m) for i, m in enumerate(messages)]
    rows += [("cdc", 0, len(messages), None, _canal_watermark(ts + 5)), ("cdc", 1, 0, None, _canal_watermark(ts + 5))]
    _handler(cfg)(spark.createDataFrame(rows, KAFKA_SCHEMA), 0)
    table = read_table(cfg.table_path("test", "orders"))
    assert table.schema.names == ["id", "v"]
    assert sorted((r["id"], r["v"]) for r in table.to_pylist()) == [(1, "a"), (2, "b"), (3, "c"), (4, "d")]


@pytest.mark.parametrize("engine", ["spark", "delta-rs"])
def test_a_row_a_check_constraint_refuses_stops_the_job_naming_the_table(engine: str, spark: Any,
                                                                         tmp_path: Path) -> None:
    """A user's CHECK constraint on a target table refuses a row whose value reads like a storage outage.
    Regression: the refusal quotes the row's values, so it was taken for an outage (exit 75, retried for
    ever); it is terminal, and names the table."""
    from ticdc_delta.cli import EXIT_TERMINAL, exit_code_for
    from ticdc_delta.errors import SinkError

    base = json.loads(json.dumps(_cfg(tmp_path).model_dump(mode="json", exclude_none=True)))
    cfg = config_from_mapping({**base, "sink": {**base["sink"], "engine": engine}})
    ts = TsoClock.START_MS << 18

    def batch(offset: int, code: str) -> Any:
        return spark.createDataFrame([
            ("cdc", 0, offset, None, _canal_insert(ts + 2 * offset + 1, offset, code)),
            ("cdc", 0, offset + 1, None, _canal_watermark(ts + 2 * offset + 2)),
            ("cdc", 1, offset, None, _canal_watermark(ts + 2 * offset + 2))], KAFKA_SCHEMA)

    _handler(cfg)(batch(0, "ok"), 0)
    spark.sql(f"ALTER TABLE delta.`{cfg.table_path('test', 'orders')}` ADD CONSTRAINT code_ok CHECK (code = 'ok')")
    with pytest.raises(SinkError, match=r"merge into .*test.*orders.* a table constraint \(a user's CHECK constraint, "
                                        r"NOT NULL column or generated column\) refused a row") as refused:
        _handler(cfg)(batch(2, "503 Service Unavailable"), 1)
    assert exit_code_for(refused.value) == EXIT_TERMINAL


def _canal_typed(table: str, commit_ts: int, row_id: int, v_type: str, v: str) -> bytes:
    return json.dumps({
        "id": 0, "database": "test", "table": table, "pkNames": ["id"], "isDdl": False, "type": "INSERT",
        "es": 1, "ts": 1, "sql": "", "sqlType": {"id": -5, "v": 3 if v_type.startswith("decimal") else -5},
        "mysqlType": {"id": "bigint", "v": v_type}, "data": [{"id": str(row_id), "v": v}], "old": None,
        "_tidb": {"commitTs": commit_ts},
    }).encode()


@pytest.mark.parametrize("engine", ["spark", "delta-rs"])
def test_a_shards_schema_commit_does_not_take_the_step_of_another_shards_merge(engine: str, spark: Any,
                                                                               tmp_path: Path) -> None:
    """Shards in one location, a batch where the later shard's images widen a column of the shared table
    (schema drift: its schema work commits). The spark engine runs every table's schema work before the
    MERGEs; were the MERGEs' steps numbered as each table was prepared, the later shard's schema commit
    would take a step past the earlier shard's MERGE, which Delta would then skip as committed."""
    base = json.loads(json.dumps(_cfg(tmp_path).model_dump(mode="json", exclude_none=True)))
    shared = str(tmp_path / "merged")
    cfg = config_from_mapping({**base, "sink": {**base["sink"], "engine": engine},
                               "tables": [{"source": "test.shard_*", "path": shared}]})
    ts = TsoClock.START_MS << 18

    def batch(offset: int, *rows: tuple[str, int, str, str]) -> Any:
        changes = [("cdc", 0, offset + i, None, _canal_typed(table, ts + offset + i + 1, row_id, v_type, v))
                   for i, (table, row_id, v_type, v) in enumerate(rows)]
        end = ts + offset + len(rows) + 1
        return spark.createDataFrame([*changes, ("cdc", 0, offset + len(rows), None, _canal_watermark(end)),
                                      ("cdc", 1, offset, None, _canal_watermark(end))], KAFKA_SCHEMA)

    _handler(cfg)(batch(0, ("shard_1", 1, "bigint", "10")), 0)
    _handler(cfg)(batch(10, ("shard_1", 2, "bigint", "20"), ("shard_2", 1001, "decimal(30,2)", "1.50")), 1)
    table = read_table(shared)
    assert pa.types.is_string(table.schema.field("v").type)  # widened by the later shard's schema work
    assert sorted((r["id"], r["v"]) for r in table.to_pylist()) == [(1, "10"), (2, "20"), (1001, "1.50")]


@pytest.mark.parametrize("engine", ["spark", "delta-rs"])
def test_a_resolved_ts_that_goes_back_is_reported(engine: str, spark: Any, tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """A resolved ts below a partition's watermark is ignored — after a TiCDC restart, or from a second
    changefeed writing the same topic, whose rows are then all dropped as replays. It was counted and never
    shown: the progress line carries it, and a warning names both causes."""
    import logging

    base = json.loads(json.dumps(_cfg(tmp_path).model_dump(mode="json", exclude_none=True)))
    cfg = config_from_mapping({**base, "sink": {**base["sink"], "engine": engine}})
    ts = TsoClock.START_MS << 18
    handler = _handler(cfg)
    handler(spark.createDataFrame([("cdc", 0, 0, None, _canal_insert(ts + 1, 1, "a")),
                                   ("cdc", 0, 1, None, _canal_watermark(ts + 10)),
                                   ("cdc", 1, 0, None, _canal_watermark(ts + 10))], KAFKA_SCHEMA), 0)
    with caplog.at_level(logging.INFO):
        handler(spark.createDataFrame([("cdc", 0, 2, None, _canal_insert(ts + 4, 2, "b")),
                                       ("cdc", 0, 3, None, _canal_watermark(ts + 5)),
                                       ("cdc", 1, 1, None, _canal_watermark(ts + 11))], KAFKA_SCHEMA), 1)
    line = json.loads([r.getMessage() for r in caplog.records if r.name == "ticdc_delta.progress"][-1])
    assert line["resolved_ts_regressions"] == 1 and line["replays_dropped"] == 1
    assert any("1 resolved ts went back below a partition's watermark" in r.getMessage()
               and "a second changefeed writes to these topics" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("engine", ["spark", "delta-rs"])
def test_a_partition_whose_resolved_ts_stops_is_reported_stalled(engine: str, spark: Any, tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """A partition TiCDC no longer sends resolved ts to (one added to the topic while the changefeed ran gets
    nothing until it restarts; a stuck changefeed) holds every row back. Only the watermark's lag showed it:
    the progress line lists it as stalled once it stays behind the others by over a minute, and a warning
    names it and the ways on."""
    import logging

    base = json.loads(json.dumps(_cfg(tmp_path).model_dump(mode="json", exclude_none=True)))
    cfg = config_from_mapping({**base, "sink": {**base["sink"], "engine": engine}})
    ts = TsoClock.START_MS << 18
    minute = 61_000 << 18
    handler = _handler(cfg)
    lines = []
    with caplog.at_level(logging.INFO):
        for batch_id in range(3):
            at = ts + (batch_id + 1) * minute
            rows = [("cdc", 0, 2 * batch_id, None, _canal_insert(at - 1, batch_id, "a")),
                    ("cdc", 0, 2 * batch_id + 1, None, _canal_watermark(at))]
            if batch_id == 0:  # partition 1 sends its first resolved ts, then nothing
                rows.append(("cdc", 1, 0, None, _canal_watermark(at)))
            handler(spark.createDataFrame(rows, KAFKA_SCHEMA), batch_id)
            lines.append(json.loads([r.getMessage() for r in caplog.records if r.name == "ticdc_delta.progress"][-1]))
    assert [line.get("stalled_partitions") for line in lines] == [None, ["cdc[1]"], ["cdc[1]"]]
    warned = [r.getMessage() for r in caplog.records if "did not move in this batch" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("the resolved ts of cdc[1] did not move")
    assert "source.options.partition-num" in warned[0]
