"""Claim-check objects on an S3-compatible server (moto's, started here): the simulator plays TiCDC's
claim-check writer into a bucket, ``ticdc-delta run`` reads them back on its executors with the credentials
of the usual ``AWS_*`` environment variables, and the tables match the oracle; a reference to an object the
bucket does not hold is a dead letter, not a crash. The delta-rs sink's own object-store paths are tested
on such a server too: RENAME TABLE's copy-then-drop, DROP DATABASE's listing and a killed first commit's log."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from ticdc_delta.codec.compression import compress
from ticdc_delta.config import config_from_mapping
from ticdc_delta.simulator import simulate
from ticdc_delta.simulator.output import KafkaSink
from ticdc_delta.spark.batch_handler import _ConfiguredSink
from ticdc_delta.verify import compare_with_oracle
from tests.integration.conftest import job_engine

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BUCKET = "cdc-claim-check"


@pytest.fixture
def s3_server() -> Iterator[dict[str, str]]:
    """moto's S3 on a free 127.0.0.1 port that only answers requests signed by its one IAM user (so a
    reader without the credentials fails); yields the endpoint and that user's keys, with the bucket made."""
    import boto3  # moto[server] (the test extra) brings boto3
    from moto.server import ThreadedMotoServer
    from pyarrow import fs as pafs

    werkzeug = logging.getLogger("werkzeug")
    level = werkzeug.level
    werkzeug.setLevel(logging.WARNING)  # not a line per request in a failure's log
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"

    def set_auth(count: str) -> None:  # moto's switch: requests allowed before authentication starts
        request = urllib.request.Request(f"{url}/moto-api/reset-auth", data=count.encode(), method="POST",
                                         headers={"Content-Type": "text/plain"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            answer.read()

    try:
        iam = boto3.client("iam", endpoint_url=url, region_name="us-east-1", aws_access_key_id="setup",
                           aws_secret_access_key="setup")
        iam.create_user(UserName="ticdc")
        iam.put_user_policy(UserName="ticdc", PolicyName="s3", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="ticdc")["AccessKey"]
        set_auth("0")
        endpoint = f"{host}:{port}"
        pafs.S3FileSystem(access_key=key["AccessKeyId"], secret_key=key["SecretAccessKey"], region="us-east-1",
                          endpoint_override=endpoint, scheme="http", allow_bucket_creation=True).create_dir(BUCKET)
        yield {"endpoint": endpoint, "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
               "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
    finally:
        set_auth("inf")
        server.stop()
        werkzeug.setLevel(level)


def test_claim_check_on_s3_lands_exactly(s3_server: dict[str, str], broker: Any, tmp_path: Path,
                                         unique_name: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from pyarrow import fs as pafs

    from ticdc_delta.delta.sink import read_table

    aws = {"AWS_ACCESS_KEY_ID": s3_server["AWS_ACCESS_KEY_ID"],
           "AWS_SECRET_ACCESS_KEY": s3_server["AWS_SECRET_ACCESS_KEY"],
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
    for name, value in aws.items():  # the simulator (TiCDC's writer) runs in this process
        monkeypatch.setenv(name, value)
    uri = f"s3://{BUCKET}/changefeed-1?endpoint_override={s3_server['endpoint']}&scheme=http"
    opts = {"enable-tidb-extension": "true", "large-message-handle-compression": "lz4",
            "large-message-handle-option": "claim-check", "max-message-bytes": "1000",
            "claim-check-storage-uri": uri}
    topic = unique_name("cc-s3")
    result = simulate("canal-json", opts, seed=5, events=300, tables=2, partitions=2,
                      sink=KafkaSink(broker.bootstrap_servers, topic, 2), topic=topic)
    s3, root = pafs.FileSystem.from_uri(uri)
    stored = [f for f in s3.get_file_info(pafs.FileSelector(root)) if f.type == pafs.FileType.File]
    assert len(stored) > 10  # many rows really went through the bucket
    stranger = pafs.S3FileSystem(access_key="AKIASTRANGER", secret_key="x", region="us-east-1",
                                 endpoint_override=s3_server["endpoint"], scheme="http")
    with pytest.raises(OSError, match="ACCESS_DENIED"):  # the bucket is readable with the credentials only
        stranger.open_input_stream(stored[0].path).read()
    # one more reference (compressed, as every value), to an object the bucket does not hold
    missing = f"s3://{BUCKET}/changefeed-1/test-t1-1-not-stored.json"
    sink = KafkaSink(broker.bootstrap_servers, topic, 2)
    sink.write(1, None, compress("lz4", orjson.dumps({"_tidb": {"claimCheckLocation": missing}})))
    sink.close()

    mapping = {"changefeed": "cc-s3",
               "source": {"bootstrap_servers": broker.bootstrap_servers, "topic": topic,
                          "protocol": "canal-json", "options": opts},
               "sink": {"path": str(tmp_path / "lake"), "engine": job_engine()}, "checkpoint": str(tmp_path / "ckpt")}
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps(mapping))
    # as a user runs it: a local job's executors are Python workers that inherit the job's environment,
    # which is the only place the credentials are (the config names none)
    run = subprocess.run([sys.executable, "-m", "ticdc_delta", "run", "--config", str(job), "--once"],
                         capture_output=True, text=True, cwd=str(REPO), timeout=300,
                         env=dict(os.environ, PYTHONPATH=str(REPO), **aws))
    assert run.returncode == 0, run.stderr[-3000:]
    assert s3_server["AWS_SECRET_ACCESS_KEY"] not in run.stdout + run.stderr

    cfg = config_from_mapping(mapping)
    diffs = compare_with_oracle(_ConfiguredSink(cfg), result.oracle, tz=cfg.sink.source_timezone)
    bad = [d.describe() for d in diffs if not d.ok]
    assert not bad, "\n".join(bad)
    assert sum(d.actual_rows for d in diffs) > 0
    (dead,) = read_table(cfg.dead_letter_path).to_pylist()
    assert "test-t1-1-not-stored.json" in dead["error"] and "is not in" in dead["error"]


def _storage(endpoint: str) -> dict[str, str]:
    """delta-rs' storage options for :func:`s3_process`'s server (it takes any credentials)."""
    return {"AWS_ENDPOINT_URL": f"http://{endpoint}", "AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "k",
            "AWS_SECRET_ACCESS_KEY": "s", "AWS_ALLOW_HTTP": "true", "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}


@pytest.fixture
def s3_process() -> Iterator[str]:
    """moto's S3 in a process of its own on a free 127.0.0.1 port (any credentials); yields the endpoint.
    Some delta-rs calls (its storage handler's listing and deletes) hold the GIL while they wait for the
    server, so a server thread in this process would never answer them."""
    import time

    from ticdc_delta.local_broker import free_port
    from ticdc_delta.orphan_guard import guarded

    port = free_port()
    # under the orphan guard: a killed test run leaves no server behind
    proc = subprocess.Popen(guarded([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]),
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=2) as answer:
                    answer.read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto's S3 server did not start") from None
                time.sleep(0.2)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/{BUCKET}", method="PUT")
        with urllib.request.urlopen(request, timeout=10) as answer:
            answer.read()
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        assert proc.stdin is not None
        proc.stdin.close()


def test_rename_table_on_s3_finishes_a_move_stopped_between_copy_and_drop(
        s3_process: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """RENAME TABLE on an object store copies the table, then drops the old one. A job that stops between
    the two finds both tables on its restart: the copy's own commit says it is a complete copy of the old
    location, so the move finishes (the old table dropped, the rows once under the new name); a table that
    was already at the new name without that mark is still refused."""
    import pyarrow as pa

    from ticdc_delta.delta.sink import OP_COLUMN, DeltaRsSink, TableIdent, Txn
    from ticdc_delta.errors import SinkError

    sink = DeltaRsSink(f"s3://{BUCKET}/lake", storage_options=_storage(s3_process))
    rows = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]})
    a, b, c = TableIdent("db", "a"), TableIdent("db", "b"), TableIdent("db", "c")
    for ident in (a, c):
        sink.ensure_table(ident, rows.schema, [], Txn("it", 0))
        sink.merge(ident, rows.append_column(OP_COLUMN, pa.array(["u"] * 3)), ["id"], Txn("it", 1))

    real_drop = DeltaRsSink.drop
    monkeypatch.setattr(DeltaRsSink, "drop", lambda self, ident: (_ for _ in ()).throw(OSError("stopped")))
    with pytest.raises(OSError, match="stopped"):
        sink.move(a, b)
    monkeypatch.setattr(DeltaRsSink, "drop", real_drop)
    assert sink.table_schema(a) is not None and sink.table_schema(b) is not None  # stopped half-way

    assert sink.move(a, b) is True  # the restart finishes it
    assert sink.table_schema(a) is None
    assert sorted(sink.read(b).select(["id", "v"]).to_pylist(), key=lambda r: r["id"]) == rows.to_pylist()
    assert sink.move(a, b) is False  # done: nothing more

    sink.ensure_table(a, rows.schema, [], Txn("it", 0))
    with pytest.raises(SinkError, match="already there"):
        sink.move(a, c)  # c is a table of its own, not a copy of a
    assert sink.read(c).num_rows == 3


def test_drop_database_on_s3_finds_every_table_of_the_schema(s3_process: str) -> None:
    """DROP DATABASE lists the schema's prefix on the object store (it found nothing there before: only
    local roots were listed, and the tables stayed to take the rows of a new table of the same name)."""
    import pyarrow as pa

    from ticdc_delta.delta.sink import DeltaRsSink, TableIdent, Txn

    sink = DeltaRsSink(f"s3://{BUCKET}/lake", storage_options=_storage(s3_process))
    rows = pa.table({"id": pa.array([1, 2], pa.int64())})
    tables = [TableIdent("db", "a"), TableIdent("db", "b/c"), TableIdent("db2", "a"), TableIdent("db_x", "z")]
    for ident in tables:
        sink.ensure_table(ident, rows.schema, [], Txn("it", 0))
        sink.append(ident, rows, Txn("it", 1))

    assert sorted(sink.tables_in_schema("db")) == [TableIdent("db", "a"), TableIdent("db", "b/c")]
    assert sink.tables_in_schema("none") == []
    for ident in sink.tables_in_schema("db"):
        assert sink.drop(ident)
    assert sink.tables_in_schema("db") == []
    assert [sink.read(t).num_rows for t in tables[2:]] == [2, 2]


def test_uncommitted_log_on_s3_is_no_table_and_is_cleared(s3_process: str) -> None:
    """A log that holds only a killed first commit's temporary files is no table on an object store either:
    the schema's listing skips it and ``clear_uncommitted_log`` removes those files (then the table is made
    as usual); a log holding anything else is refused with a clear error, a committed table left alone."""
    import pyarrow as pa
    import pyarrow.fs as pafs

    from ticdc_delta.delta.sink import DeltaRsSink, TableIdent, Txn
    from ticdc_delta.errors import SinkError

    sink = DeltaRsSink(f"s3://{BUCKET}/lake", storage_options=_storage(s3_process))
    bucket = pafs.S3FileSystem(access_key="k", secret_key="s", region="us-east-1", endpoint_override=s3_process,
                               scheme="http")

    def put(ident: TableIdent, name: str) -> str:
        key = f"{sink.table_path(*ident).removeprefix('s3://')}/_delta_log/{name}"
        with bucket.open_output_stream(key) as out:
            out.write(b"{")
        return key

    def exists(key: str) -> bool:
        return bucket.get_file_info(key).type == pafs.FileType.File

    rows = pa.table({"id": pa.array([1, 2], pa.int64())})
    killed, committed, foreign = TableIdent("db", "killed"), TableIdent("db", "done"), TableIdent("db", "other")
    assert not sink.clear_uncommitted_log(killed)  # nothing there at all
    debris = [put(killed, ".00000000000000000000.json.0b1c.tmp"),
              put(killed, "..00000000000000000000.json.0b1c.tmp.crc")]
    sink.ensure_table(committed, rows.schema, [], Txn("it", 0))
    sink.append(committed, rows, Txn("it", 1))
    stray = put(committed, ".00000000000000000002.json.0b1e.tmp")
    staged = put(foreign, "_staged_commits/00000000000000000000.5e7f.json")
    assert sink.tables_in_schema("db") == [committed]

    assert sink.clear_uncommitted_log(killed)
    assert not any(exists(key) for key in debris)
    assert not sink.clear_uncommitted_log(committed)
    assert exists(stray) and sink.read(committed).num_rows == 2
    with pytest.raises(SinkError, match="cannot clear the uncommitted Delta log"):
        sink.clear_uncommitted_log(foreign)
    assert exists(staged)

    sink.ensure_table(killed, rows.schema, [], Txn("it", 0))
    sink.append(killed, rows, Txn("it", 1))
    assert sorted(sink.tables_in_schema("db")) == [committed, killed] and sink.read(killed).num_rows == 2
