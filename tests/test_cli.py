"""``main``: how a failed command ends — one ``error:`` line on stderr and the exit code of its error kind."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from ticdc_delta.cli import EXIT_RETRYABLE, EXIT_TERMINAL, main


def _config(tmp_path: Path, checkpoint: str, storage_options: dict[str, str] | None = None) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps({
        "changefeed": "cf", "checkpoint": checkpoint,
        "sink": {"path": str(tmp_path / "lake"), "storage_options": storage_options or {}},
        "source": {"bootstrap_servers": "127.0.0.1:9", "topic": "cdc", "protocol": "canal-json"},
    }))
    return str(path)


def test_an_unexpected_error_is_one_line_with_its_type(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture) -> None:
    """Regression: an error no handler expected (here from a library, multi-line and in colour as delta-rs
    writes them) ended the command with a traceback."""
    def broken(*args: object, **kwargs: object) -> str:
        raise RuntimeError("Kernel error\n  \x1b[31m↳\x1b[0m something\n  \x1b[31m↳\x1b[0m deeper")

    monkeypatch.setattr("ticdc_delta.status.render_status", broken)
    assert main(["status", "--config", _config(tmp_path, str(tmp_path / "ckpt"))]) == EXIT_TERMINAL
    assert capsys.readouterr().err == "error: RuntimeError: Kernel error: something: deeper\n"


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_still_goes_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         interrupt: type[BaseException]) -> None:
    def stopped(*args: object, **kwargs: object) -> str:
        raise interrupt()

    monkeypatch.setattr("ticdc_delta.status.render_status", stopped)
    with pytest.raises(interrupt):
        main(["status", "--config", _config(tmp_path, str(tmp_path / "ckpt"))])


def test_an_unreachable_state_storage_is_retryable(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Regression: ``status`` (as ``run`` and ``reset``) on a checkpoint in an object store that refuses
    connections exited 1, as if an operator had to act, with delta-rs' multi-line message."""
    with socket.socket() as s:  # a port just free: nobody listens on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1",
               "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret", "max_retries": "0",
               "retry_timeout": "1s"}
    assert main(["status", "--config", _config(tmp_path, "s3://lake/ckpt", options)]) == EXIT_RETRYABLE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err
    assert err.startswith("error: cannot read the job state table at s3://lake/ckpt/state: ") and "refused" in err


def test_progress_lines_reach_stdout_whatever_the_log_level(capsys: pytest.CaptureFixture[str]) -> None:
    """A quiet ``log_level`` (``conf/open-protocol-tables.yaml`` has ``warn``) silences the stderr messages,
    not the progress lines monitoring reads."""
    import logging

    from ticdc_delta.cli import _setup_logging

    root = logging.getLogger()
    saved = (root.level, list(root.handlers), logging.getLogger("ticdc_delta.progress").level)
    try:
        for h in [h for h in root.handlers if getattr(h, "_ticdc_delta", False)]:
            root.removeHandler(h)
        _setup_logging("WARNING")
        progress = logging.makeLogRecord({"name": "ticdc_delta.progress"})
        for h in root.handlers:  # (they write to the streams pytest captures now)
            if isinstance(h, logging.StreamHandler) and getattr(h, "_ticdc_delta", False):
                h.setStream(sys.stdout if h.filter(progress) else sys.stderr)
        logging.getLogger("ticdc_delta.progress").info('{"batch_id": 7}')
        logging.getLogger("ticdc_delta.spark").info("an info message")
        logging.getLogger("ticdc_delta.spark").warning("a warning")
        out, err = capsys.readouterr()
        assert out == '{"batch_id": 7}\n'
        assert "a warning" in err and "an info message" not in err
    finally:
        for h in [h for h in root.handlers if getattr(h, "_ticdc_delta", False)]:
            root.removeHandler(h)
        root.setLevel(saved[0])
        for h in saved[1]:
            if h not in root.handlers:
                root.addHandler(h)
        logging.getLogger("ticdc_delta.progress").setLevel(saved[2])


STORAGE_OUTAGES = {
    "S3 throttling": "An error occurred while calling o412.execute.\n: org.apache.hadoop.fs.s3a.AWSServiceThrottledException: "
                     "PUT 0000000042.json on s3a://lake/t/_delta_log: software.amazon.awssdk.services.s3.model.S3Exception: "
                     "Please reduce your request rate. (Service: S3, Status Code: 503, Request ID: X):SlowDown",
    "S3 connection refused": "An error occurred while calling o412.execute.\n: org.apache.hadoop.fs.s3a.AWSClientIOException: "
                             "getFileStatus on s3a://lake/t/_delta_log: Unable to execute HTTP request: Connect to "
                             "lake.s3.amazonaws.com:443 failed: Connection refused",
    "socket timeout": "An error occurred while calling o77.save.\n: java.net.SocketTimeoutException: Read timed out",
    "HDFS NameNode away": "java.net.ConnectException: Call From worker/10.0.0.5 to namenode:8020 failed on connection "
                          "exception: java.net.ConnectException: Connection refused",
}


@pytest.mark.parametrize("text", STORAGE_OUTAGES.values(), ids=list(STORAGE_OUTAGES))
def test_a_storage_outage_on_sparks_side_is_retryable(text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The spark engine's tables and every Spark checkpoint are written through Hadoop: S3 throttling or a
    NameNode away arrived as an untyped Py4J error and exited 1 (terminal), where the same failure through
    delta-rs exits 75."""
    import types

    from ticdc_delta.config import load_config
    from ticdc_delta.spark import job

    class Py4JJavaError(Exception):  # stands in for py4j's: only its text is read
        pass

    cfg = load_config(_config(tmp_path, str(tmp_path / "ckpt")))
    err = job._unwrap(RuntimeError("[STREAM_FAILED] Query terminated with exception: " + text),
                      types.SimpleNamespace(error=Py4JJavaError(text), cfg=cfg))
    assert type(err).__name__ == "StorageUnavailableError" and getattr(err, "retryable", False)

    def failing(*args: object, **kwargs: object) -> int:
        raise err

    monkeypatch.setattr(job, "run_job", failing)
    assert main(["run", "--config", _config(tmp_path, str(tmp_path / "ckpt")), "--once"]) == EXIT_RETRYABLE
    assert capsys.readouterr().err.count("\n") == 1
    # denied access stays terminal
    denied = Py4JJavaError("java.nio.file.AccessDeniedException: s3a://lake/t: getFileStatus: 403 Forbidden")
    assert job._unwrap(RuntimeError("x"), types.SimpleNamespace(error=denied, cfg=cfg)) is denied
