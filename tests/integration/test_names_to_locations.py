"""Issue 7 through the real batch handler on a real Spark session (no Kafka: the micro-batch is a
DataFrame of Kafka-shaped messages): hostile and unholdable table names, identifier case."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from ticdc_delta.config import config_from_mapping
from ticdc_delta.delta.ddl_replay import DDLReplayer
from ticdc_delta.delta.sink import TableIdent
from ticdc_delta.spark.batch_handler import DEAD_LETTER_IDENT, BatchHandler
from tests.integration.conftest import job_engine

pytestmark = pytest.mark.integration


def _row(schema: str, table: str, id_: int) -> bytes:
    return json.dumps({
        "id": 0, "database": schema, "table": table, "pkNames": ["id"], "isDdl": False, "type": "INSERT",
        "es": 1, "ts": 1, "sql": "", "sqlType": {"id": -5}, "mysqlType": {"id": "bigint"},
        "data": [{"id": str(id_)}], "old": None,
    }).encode()


def _ddl(schema: str, table: str, sql: str) -> bytes:
    return json.dumps({
        "id": 0, "database": schema, "table": table, "pkNames": None, "isDdl": True, "type": "QUERY",
        "es": 1, "ts": 1, "sql": sql, "sqlType": None, "mysqlType": None, "data": None, "old": None,
    }).encode()


def test_hostile_names_through_the_batch_handler(spark: Any, tmp_path: Path) -> None:
    lake, ckpt = tmp_path / "lake", tmp_path / "ckpt"
    victim = tmp_path / "victim" / "keep.txt"
    victim.parent.mkdir()
    victim.write_text("keep")
    cfg = config_from_mapping({
        "changefeed": "names",
        "source": {"bootstrap_servers": "127.0.0.1:9", "topic": "cdc", "protocol": "canal-json"},
        "sink": {"path": str(lake), "engine": job_engine("spark")},
        "checkpoint": str(ckpt),
    })
    values = [
        _ddl("Shop", "Orders", "CREATE TABLE `Shop`.`Orders` (`id` BIGINT NOT NULL PRIMARY KEY)"),
        _row("Shop", "Orders", 1),
        _row("shop", "ORDERS", 2),
        _row("s", "../../victim", 3),
        _row("s", "a\x00b", 4),  # no location can hold it: dead letter, the rest applies
        _row("s", "x" * 300, 5),
        _ddl("s", "", "TRUNCATE TABLE `s`.`../_ticdc_dead_letter`"),
    ]
    df = spark.createDataFrame(
        [("cdc", 0, i, None, v) for i, v in enumerate(values)],
        "topic string, partition int, offset long, key binary, value binary",
    )
    handler = BatchHandler(cfg, ddl_handler=DDLReplayer(cfg.ddl))
    handler(df, 0)

    assert victim.read_text() == "keep" and os.listdir(victim.parent) == ["keep.txt"]
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "lake", "victim"]
    assert sorted(os.listdir(lake)) == ["_ticdc_dead_letter", "s", "shop"]
    assert os.listdir(lake / "shop") == ["orders"]
    ids = sorted(r["id"] for r in handler.sink.read(TableIdent("Shop", "Orders")).to_pylist())
    assert ids == [1, 2]
    assert [r["id"] for r in handler.sink.read(TableIdent("s", "../../victim")).to_pylist()] == [3]
    dead = sorted(handler.dead_letters.read(DEAD_LETTER_IDENT).to_pylist(), key=lambda r: r["offset"])
    assert [r["offset"] for r in dead] == [4, 5]
    assert "table 's'.'a\\x00b'" in dead[0]["error"] and dead[0]["value"] == values[4]
    assert "at most 255 fit" in dead[1]["error"]
