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
