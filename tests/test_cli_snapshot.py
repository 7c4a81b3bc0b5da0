"""`snapshot` refuses arguments it cannot use before anything starts (exit 2, one line naming the fix):
a Spark JVM takes many seconds to start, and a flag it would ignore must not look taken."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ticdc_delta.cli import EXIT_USAGE, main

DSN = "jdbc:mysql://127.0.0.1:4000/?user=root"


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    def no_spark(*_: Any, **__: Any) -> Any:
        raise AssertionError("the Spark session was started before the arguments were checked")

    monkeypatch.setattr("ticdc_delta.spark.job.spark_for", no_spark)
    path = tmp_path / "job.yaml"
    path.write_text(f"changefeed: snap\ncheckpoint: {tmp_path / 'ckpt'}\nsink: {{path: {tmp_path / 'lake'}}}\n"
                    "source: {bootstrap_servers: '127.0.0.1:9', topic: cdc, protocol: canal-json}\n")
    return path


@pytest.mark.parametrize(("args", "said"), [
    (["--from", "tidb", "--dsn", DSN], "name the tables to read: --table db.table"),
    (["--from", "tidb", "--dsn", "mysql://h:4000", "--table", "a.b"], "--dsn must look like jdbc:mysql://"),
    (["--from", "tidb", "--dsn", DSN, "--table", "orders"], "--table must look like db.table or db.*, got 'orders'"),
    (["--from", "tidb", "--dsn", DSN, "--table", "a.b", "--partitions", "0"], "--partitions must be >= 1, got 0"),
    (["--from", "tidb", "--dsn", DSN, "--table", "a.b", "--timestamp-zone", "Mars/Olympus"],
     "--timestamp-zone: unknown time zone 'Mars/Olympus'"),
    (["--from", "dumpling", "/x", "--table", "a.b"], "--table, --tso and --partitions are for --from tidb"),
    (["--from", "dumpling", "/x", "--tso", "5"], "--table, --tso and --partitions are for --from tidb"),
    (["--from", "dumpling", "/x", "--partitions", "8"], "--table, --tso and --partitions are for --from tidb"),
])
def test_arguments_it_cannot_use_are_refused_before_spark_starts(config: Path, args: list[str], said: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["snapshot", "--config", str(config), *args]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert said in err, err
