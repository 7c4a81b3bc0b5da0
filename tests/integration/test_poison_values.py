"""One bad value never stops the changefeed (issue 7): on a real broker, real Spark and real Delta tables,
a canal-json change with a value no Delta column can hold goes to the dead-letter table with its
coordinates, table, column and value, the rest of the batch applies, a re-run after a crash adds nothing
twice, an older dead-letter table gains the new columns, and ``fail_on_error`` stops the job before
anything is committed with an error naming all of it."""

from __future__ import annotations

import json
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from ticdc_delta.config import config_from_mapping
from ticdc_delta.delta.sink import read_table
from ticdc_delta.errors import UnwritableValueError

if TYPE_CHECKING:
    from tests.integration.conftest import ProgressLines

pytestmark = pytest.mark.integration

TYPES = {"id": ("int", 4), "d": ("date", 91), "n": ("varchar", 12), "amt": ("decimal", 3)}


def _row(table: str, op: str, data: dict[str, str | None], old: dict[str, str | None] | None = None,
         key: str = "id") -> bytes:
    return json.dumps({
        "id": 0, "database": "shop", "table": table, "pkNames": [key], "isDdl": False, "type": op,
        "es": 1700000000000, "ts": 1700000000001, "sql": "",
        "sqlType": {k: TYPES[k][1] for k in data}, "mysqlType": {k: TYPES[k][0] for k in data},
        "data": [data], "old": None if old is None else [old],
    }).encode()


def _ddl(table: str, sql: str) -> bytes:
    return json.dumps({
        "id": 0, "database": "shop", "table": table, "pkNames": None, "isDdl": True, "type": "CREATE",
        "es": 1700000000000, "ts": 1700000000001, "sql": sql, "sqlType": None, "mysqlType": None,
        "data": None, "old": None,
    }).encode()


MESSAGES = [
    _row("t", "INSERT", {"id": "1", "d": "2024-01-01", "n": "a"}),                       # 0
    _row("t", "INSERT", {"id": "2", "d": "2024-13-45", "n": "b"}),                       # 1 bad DATE
    _row("t", "INSERT", {"id": "3", "d": "0000-00-00", "n": "c"}),                       # 2 zero date → null
    _row("t", "INSERT", {"id": "4", "d": "2024-02-30", "n": "d"}),                       # 3 ALLOW_INVALID → null
    _row("t", "UPDATE", {"id": "1", "d": "2024-99-01", "n": "a2"},
         {"id": "1", "d": "2024-01-01", "n": "a"}),                                        # 4 bad: id 1 keeps offset 0
    _ddl("u", "CREATE TABLE `u` (`id` INT PRIMARY KEY, `amt` DECIMAL(5,2))"),            # 5
    _row("u", "INSERT", {"id": "1", "amt": "1234.567"}),                                 # 6 beyond DECIMAL(5,2)
    _row("u", "INSERT", {"id": "2", "amt": "12.5"}),                                     # 7
    # a zero date in a key column: as null, the two keys would merge into one row
    _row("k", "INSERT", {"d": "0000-00-00", "n": "z1"}, key="d"),                        # 8
    _row("k", "INSERT", {"d": "2020-00-15", "n": "z2"}, key="d"),                        # 9
    _row("k", "INSERT", {"d": "2024-01-02", "n": "ok"}, key="d"),                        # 10
]
BAD = {1: ("t", "d", b"2024-13-45"), 4: ("t", "d", b"2024-99-01"), 6: ("u", "amt", b"1234.567"),
       8: ("k", "d", b"0000-00-00"), 9: ("k", "d", b"2020-00-15")}
TSO = 429918007904436226  # a commit ts of 2021


def _messages(extension: bool) -> list[bytes]:
    """The stream; with the TiDB extension every message carries its commit ts and a watermark closes it
    (watermark mode: the rows are held until it comes, then screened as they are released)."""
    if not extension:
        return MESSAGES
    out = []
    for i, m in enumerate(MESSAGES):
        obj = json.loads(m)
        obj["_tidb"] = {"commitTs": TSO + i}
        out.append(json.dumps(obj).encode())
    watermark = {"id": 0, "database": "", "table": "", "pkNames": None, "isDdl": False, "type": "TIDB_WATERMARK",
                 "es": 1, "ts": 1, "sql": "", "sqlType": None, "mysqlType": None, "data": None, "old": None,
                 "_tidb": {"watermarkTs": TSO + 100}}
    return out + [json.dumps(watermark).encode()]


def _setup(broker: Any, tmp: Path, topic: str, extension: bool = False, engine: str = "delta-rs",
           **dead_letter: Any) -> Any:
    from ticdc_delta.local_broker import wait_for_high_watermarks

    messages = _messages(extension)
    broker.create_topic(topic, 1)
    broker.produce_many(topic, [(0, None, m) for m in messages])
    wait_for_high_watermarks(broker.bootstrap_servers, {(topic, 0): len(messages)})
    return config_from_mapping({
        "changefeed": "poison", "checkpoint": str(tmp / "ckpt"), "sink": {"path": str(tmp / "lake"), "engine": engine},
        "source": {"bootstrap_servers": broker.bootstrap_servers, "topic": topic, "protocol": "canal-json",
                   "options": {"enable-tidb-extension": str(extension).lower()}},
        "dead_letter": dead_letter,
    })


def _rows(path: str) -> dict[int, dict[str, Any]]:
    # read_table: delta-rs's scan honours column mapping (the spark engine's tables); to_pyarrow_table does not
    return {r["id"]: r for r in read_table(path).to_pylist()}


@pytest.mark.parametrize("engine", ["delta-rs", "spark"])
@pytest.mark.parametrize("extension", [False, True], ids=["offset-order", "watermark"])
def test_bad_values_go_to_the_dead_letter_table_once_and_the_rest_applies(
    extension: bool, engine: str, broker: Any, spark: Any, tmp_path: Path, unique_name: Any, monkeypatch: pytest.MonkeyPatch,
    progress: ProgressLines,
) -> None:
    from ticdc_delta.spark.batch_handler import FAULT_ENV, InjectedFault
    from ticdc_delta.spark.job import run_job

    cfg = _setup(broker, tmp_path, unique_name("poison"), extension, engine)
    # a dead-letter table written before the table/column/value columns existed
    old_schema = pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                            ("key", pa.binary()), ("value", pa.binary()), ("error", pa.string()),
                            ("batch_id", pa.int64()), ("recorded_at", pa.timestamp("us", tz="UTC"))])
    write_deltalake(cfg.dead_letter_path, pa.Table.from_pylist(
        [{"topic": "old", "partition": 0, "offset": 9, "key": None, "value": b"x", "error": "old", "batch_id": 0,
          "recorded_at": None}], schema=old_schema))

    # crash after the first table commit of the batch (the dead letters are already appended) …
    monkeypatch.setenv(FAULT_ENV, "after_merge@0")
    with pytest.raises(InjectedFault, match="injected fault at after_merge of batch 0"):
        run_job(cfg, once=True, spark=spark)
    monkeypatch.delenv(FAULT_ENV)
    # … and the re-run of the same batch commits the rest, adding no dead letter twice
    run_job(cfg, once=True, spark=spark)

    t = _rows(cfg.table_path("shop", "t"))
    assert {k: (v["d"], v["n"]) for k, v in t.items()} == {
        1: (date(2024, 1, 1), "a"), 3: (None, "c"), 4: (None, "d")}
    u = _rows(cfg.table_path("shop", "u"))
    assert {k: v["amt"] for k, v in u.items()} == {2: Decimal("12.50")}
    k = read_table(cfg.table_path("shop", "k")).to_pylist()
    assert [(r["d"], r["n"]) for r in k] == [(date(2024, 1, 2), "ok")]

    dead = read_table(cfg.dead_letter_path).to_pylist()
    assert [d["offset"] for d in dead if d["topic"] == "old"] == [9]
    new = sorted((d for d in dead if d["topic"] != "old"), key=lambda d: d["offset"])
    assert [d["offset"] for d in new] == sorted(BAD)
    for d in new:
        table, column, value = BAD[d["offset"]]
        assert (d["partition"], d["schema"], d["table"], d["column"], d["column_value"]) == (
            0, "shop", table, column, value)
        assert f"[0]@{d['offset']}" in d["error"] and value.decode() in d["error"]
        row = json.loads(d["row"])
        assert row["schema"] == "shop" and row["table"] == table and row["columns"][column] == value.decode()

    last = progress.lines[-1]
    assert last["dead_letter_values"] == 5 and last["dead_letters"] >= 5
    from ticdc_delta.spark.batch_handler import BatchHandler

    saved = BatchHandler(cfg).store.load()
    assert saved is not None and saved.meta["totals"]["dead_letter_values"] == 5


def test_fail_on_error_stops_before_anything_is_committed_and_names_everything(
    broker: Any, spark: Any, tmp_path: Path, unique_name: Any
) -> None:
    from ticdc_delta.spark.job import run_job

    topic = unique_name("poison-fail")
    cfg = _setup(broker, tmp_path, topic, fail_on_error=True)
    for _ in range(2):  # the same decision on every re-run
        with pytest.raises(UnwritableValueError) as info:
            run_job(cfg, once=True, spark=spark)
        text = str(info.value)
        assert "5 change(s)" in text
        assert f"{topic}[0]@1 table 'shop'.'t' column 'd'" in text and "'2024-13-45'" in text
        assert f"{topic}[0]@6 table 'shop'.'u' column 'amt'" in text and "DECIMAL(5,2)" in text
    lake = tmp_path / "lake"
    assert not lake.exists() or not any(p.name == "_delta_log" for p in lake.rglob("_delta_log"))
