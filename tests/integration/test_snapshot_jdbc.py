"""``snapshot --from tidb``: Spark's JDBC source against a real MySQL-protocol server (MariaDB from Debian's
packages, started here), split into key ranges, typed as the stream types. What only a real TiDB can show
(``tidb_snapshot``: every connection reading the same TSO) is not tested here (see the README).

Needs ``mariadb-server`` (``apt-get install mariadb-server``) and the MySQL JDBC driver in ``.jars/spark``
(``make``); skipped without them.
"""

from __future__ import annotations

import os
import struct
import subprocess
from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pytest

from ticdc_delta.config import config_from_mapping
from ticdc_delta.delta.sink import DeltaRsSink, TableIdent
from ticdc_delta.errors import ConfigError
from ticdc_delta.jars import spark_jars
from ticdc_delta.snapshot.jdbc import JdbcSource
from ticdc_delta.snapshot.load import load_snapshot, spark_ddl_schema
from tests.integration.conftest import mariadb_programs, running_mariadb, job_engine

pytestmark = pytest.mark.integration

SETUP = r"""
SET time_zone = '+00:00';
CREATE DATABASE shop CHARACTER SET utf8mb4;
USE shop;
CREATE TABLE shop.w (id BIGINT NOT NULL, u BIGINT UNSIGNED, f FLOAT, dbl DOUBLE, d DECIMAL(10,3), dt DATE,
  tm DATETIME(6), ts TIMESTAMP NULL, ti TIME, y YEAR, e ENUM('a','b'), st SET('x','y'), b BLOB, vb VARBINARY(4),
  bt BIT(3), c CHAR(3), tx TEXT, PRIMARY KEY (id));
INSERT INTO shop.w VALUES (1, 18446744073709551615, 0.1, -1e300, -1.5, '2024-02-29', '2024-01-01 00:00:00.000001',
  '2038-01-19 03:14:07', '-838:59:59', 1901, 'b', 'x,y', X'00015C220A2C', X'FF', b'101', 'ab', 'q"u,o\\te\r\n测试');
INSERT INTO shop.w (id) SELECT seq FROM seq_2_to_1000;
CREATE TABLE shop.nokey (a INT, v VARCHAR(5), UNIQUE KEY uv (v));
INSERT INTO shop.nokey VALUES (1, 'x'), (NULL, NULL);
CREATE TABLE shop.gen (id INT NOT NULL, a INT, v INT AS (a * 2) VIRTUAL, g INT AS (a + 1) STORED, PRIMARY KEY (id),
  UNIQUE KEY uv (v));
INSERT INTO shop.gen (id, a) VALUES (1, 10), (2, NULL);
"""



@pytest.fixture(scope="module")
def mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # `make test` installs both; in CI a missing one is a failure, not a silent skip
    programs = mariadb_programs("apt-get install mariadb-server")
    if not any("mysql-connector-j" in j for j in spark_jars()):
        (pytest.fail if os.environ.get("CI") else pytest.skip)("the MySQL JDBC driver is not in .jars/spark (run make)")
    with running_mariadb(programs, tmp_path_factory.mktemp("mariadb")) as db:
        done = subprocess.run([db.client, f"--socket={db.socket}", "--default-character-set=utf8mb4", "-e", SETUP],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"setting up the MariaDB tables failed: {done.stderr}")
        yield f"jdbc:mysql://127.0.0.1:{db.port}/?user=root&password=&useSSL=false"


def test_tables_read_over_jdbc_in_key_ranges_typed_as_the_stream_types_them(
        spark: Any, tmp_path: Path, mariadb: str) -> None:
    cfg = config_from_mapping({
        "changefeed": "jdbc", "checkpoint": str(tmp_path / "ckpt"), "sink": {"path": str(tmp_path / "lake"), "engine": job_engine()},
        "source": {"bootstrap_servers": "127.0.0.1:9", "topic": "cdc", "protocol": "canal-json"},
    })
    source = JdbcSource(spark, mariadb, ["shop.*"], tso=4242 << 18, partitions=3)
    assert source.location.endswith("password=***&useSSL=false") and not source.tidb
    w = next(t for t in source.tables if t.table == "w")
    assert w.key == ("id",) and next(t for t in source.tables if t.table == "nokey").key == ()
    fields = pa.schema([c.field() for c in w.columns])
    assert source.rows_frame(spark, w, w.columns, [], spark_ddl_schema(fields)).rdd.getNumPartitions() == 3

    summary = load_snapshot(cfg, source, spark=spark)
    assert {t.table: t.rows for t in summary.tables} == {"nokey": 2, "w": 1000, "gen": 2} and summary.tso == 4242 << 18

    sink = DeltaRsSink(str(tmp_path / "lake"))
    schema = sink.table_schema(TableIdent("shop", "w"))
    assert {f.name: f.type for f in schema} == {f.name: f.type for f in fields}
    assert schema.field("u").type == pa.decimal128(20, 0) and schema.field("tm").type == pa.timestamp("us")
    rows = {r["id"]: r for r in sink.read(TableIdent("shop", "w")).to_pylist()}
    assert len(rows) == 1000 and rows[500] == {**{k: None for k in rows[500]}, "id": 500}
    assert rows[1] == {
        "id": 1, "u": Decimal(18446744073709551615), "f": struct.unpack("<f", struct.pack("<f", 0.1))[0],
        "dbl": -1e300, "d": Decimal("-1.500"), "dt": date(2024, 2, 29), "tm": datetime(2024, 1, 1, 0, 0, 0, 1),
        "ts": datetime(2038, 1, 19, 3, 14, 7, tzinfo=timezone.utc), "ti": "-838:59:59", "y": 1901, "e": "b",
        "st": "x,y", "b": b'\x00\x01\\"\n,', "vb": b"\xff", "bt": b"\x00" * 7 + b"\x05", "c": "ab",
        "tx": 'q"u,o\\te\r\n测试',
    }
    assert sorted(sink.read(TableIdent("shop", "nokey")).to_pylist(), key=str) == sorted(
        [{"a": 1, "v": "x"}, {"a": None, "v": None}], key=str)

    # a VIRTUAL generated column is left out as the stream's DDL leaves it out (TiCDC never sends its values:
    # a snapshot value would never change again), and so is a unique key over it; a STORED one is read
    assert sink.table_schema(TableIdent("shop", "gen")).names == ["id", "a", "g"]
    assert sorted(sink.read(TableIdent("shop", "gen")).to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "a": 10, "g": 11}, {"id": 2, "a": None, "g": None}]
    gen = next(t for t in source.tables if t.table == "gen")
    assert gen.create.unique_keys == () and gen.key == ("id",)

    with pytest.raises(ConfigError, match=r"is not TiDB .*: it has no snapshot TSO; give --tso"):
        JdbcSource(spark, mariadb, ["shop.w"])
    with pytest.raises(ConfigError, match=r"shop\.missing: no such table"):
        JdbcSource(spark, mariadb, ["shop.missing"], tso=1)
