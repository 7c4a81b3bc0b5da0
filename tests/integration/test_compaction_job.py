"""Small-file compaction in a real job run (broker, Spark, Delta tables), on both engines: an insert-heavy
table written one small micro-batch at a time is compacted between batches, a crash after a later batch's
MERGE is re-run without applying anything twice, the table holds exactly the upstream rows, and `status`
and the progress line say what was done."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from ticdc_delta.config import config_from_mapping
from ticdc_delta.delta.sink import read_table
from ticdc_delta.spark.batch_handler import FAULT_ENV, InjectedFault
from ticdc_delta.spark.job import run_job
from ticdc_delta.status import collect_status

pytestmark = pytest.mark.integration

INSERTS = 3


def _row(op: str, id_: int, v: str, old: str | None = None) -> bytes:
    return json.dumps({
        "id": 0, "database": "shop", "table": "t", "pkNames": ["id"], "isDdl": False, "type": op,
        "es": 1700000000000, "ts": 1700000000001, "sql": "",
        "sqlType": {"id": 4, "v": 12}, "mysqlType": {"id": "int", "v": "varchar"},
        "data": [{"id": str(id_), "v": v}], "old": None if old is None else [{"v": old}],
    }).encode()


def _one_message_per_batch(broker: Any, topic: str, messages: list[bytes], engine: str, tmp_path: Path) -> Any:
    """``messages`` on a one-partition topic, and a job config reading one per micro-batch (canal-json,
    offset-order mode) that compacts a table once it has two small files."""
    from ticdc_delta.local_broker import wait_for_high_watermarks

    broker.create_topic(topic, 1)
    broker.produce_many(topic, [(0, None, m) for m in messages])
    wait_for_high_watermarks(broker.bootstrap_servers, {(topic, 0): len(messages)})
    return config_from_mapping({
        "changefeed": "compaction", "checkpoint": str(tmp_path / "ckpt"),
        "sink": {"path": str(tmp_path / "lake"), "engine": engine, "compaction": {"min_files": 2}},
        "source": {"bootstrap_servers": broker.bootstrap_servers, "topic": topic, "protocol": "canal-json",
                   "max_offsets_per_trigger": 1},
    })


@pytest.mark.parametrize("engine", ["delta-rs", "spark"])
def test_a_job_compacts_the_tables_it_writes(engine: str, broker: Any, spark: Any, tmp_path: Path,
                                             unique_name: Any, monkeypatch: pytest.MonkeyPatch,
                                             progress: Any) -> None:
    # one change per micro-batch (offset-order mode: each batch applies what it read): new keys, each
    # batch a new small file, then an update of the first key
    messages = [_row("INSERT", i, f"v{i}") for i in range(INSERTS)] + [_row("UPDATE", 0, "new", "v0")]
    cfg = _one_message_per_batch(broker, unique_name(f"compaction-{engine}"), messages, engine, tmp_path)
    path = cfg.table_path("shop", "t")

    # crash after the MERGE of the last insert's batch (compactions have happened before it) …
    monkeypatch.setenv(FAULT_ENV, f"after_merge@{INSERTS - 1}")
    with pytest.raises(InjectedFault):
        run_job(cfg, once=True, spark=spark)
    monkeypatch.delenv(FAULT_ENV)
    ops = [h["operation"] for h in DeltaTable(path).history()]
    assert "OPTIMIZE" in ops, ops
    # … the re-run skips that MERGE (its app transaction is the table's, a compaction did not hide it),
    # then applies the update
    run_job(cfg, once=True, spark=spark)

    rows = {r["id"]: r["v"] for r in read_table(path).to_pylist()}
    assert rows == {0: "new", **{i: f"v{i}" for i in range(1, INSERTS)}}
    history = DeltaTable(path).history()
    merges = [h for h in history if h["operation"] == "MERGE"]
    assert len(merges) == INSERTS + 1  # one per change: none twice
    assert sum(1 for h in history if h["operation"] == "OPTIMIZE") >= 2
    assert all("compact" in line["timings"] for line in progress.lines)
    # recorded with the state of the batch after the one compacted (the crashed batch's record is lost)
    assert collect_status(cfg)["tables"]["shop.t"]["compactions"] >= 1
    assert len(DeltaTable(path).file_uris()) <= 2


@pytest.mark.parametrize("engine", ["delta-rs", "spark"])
def test_the_dead_letter_table_is_compacted_too(engine: str, broker: Any, spark: Any, tmp_path: Path,
                                                unique_name: Any) -> None:
    """A dead letter now and then adds a small file to the dead-letter table at every batch that has one:
    the table is compacted by the same policy as the target tables, and keeps every dead letter."""
    messages = [b"{not json %d" % i for i in range(INSERTS)] + [_row("INSERT", 1, "v1")]
    cfg = _one_message_per_batch(broker, unique_name(f"dead-letter-compaction-{engine}"), messages, engine,
                                 tmp_path)
    run_job(cfg, once=True, spark=spark)

    dead = DeltaTable(cfg.dead_letter_path)
    assert "OPTIMIZE" in [h["operation"] for h in dead.history()]
    assert sorted(r["offset"] for r in read_table(cfg.dead_letter_path).to_pylist()) == list(range(INSERTS))
    assert len(dead.file_uris()) < INSERTS
    status = collect_status(cfg)["dead_letter"]
    assert status["rows"] == INSERTS and status["compactions"] >= 1, status
    assert {r["id"]: r["v"] for r in read_table(cfg.table_path("shop", "t")).to_pylist()} == {1: "v1"}
