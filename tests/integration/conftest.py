"""Fixtures of the integration tests (the broker and the Spark session are in ``tests/conftest.py``)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ticdc_delta.local_broker import free_port
from ticdc_delta.orphan_guard import guarded

__all__ = ["ProgressLines", "MariaDB", "canal_job_yaml", "capture_logs", "job_engine", "mariadb_programs",
           "running_mariadb"]

ENGINE_ENV = "TICDC_DELTA_TEST_ENGINE"


def job_engine(default: str = "delta-rs") -> str:
    """``sink.engine`` for an integration test that is not about one engine: ``$TICDC_DELTA_TEST_ENGINE``
    when set (``make test-spark`` runs every such test on the ``spark`` engine, the default engine of the
    job), else ``default``. ``make test`` runs the slow, engine-agnostic ones (broker outage, SIGKILL soak,
    DDL matrix, end to end per protocol) on ``delta-rs``, whose batches cost a fraction of a second, and
    has their ``spark`` twins in the engine's own tests (parity per protocol, fault stages, versions)."""
    engine = os.environ.get(ENGINE_ENV) or default
    if engine not in ("delta-rs", "spark"):
        raise ValueError(f"{ENGINE_ENV} must be delta-rs or spark, got {engine!r}")
    return engine


def canal_job_yaml(tmp_path: Path, changefeed: str, bootstrap_servers: str, topic: str, engine: str,
                   extra: str = "") -> Path:
    """A hand-written job YAML (``tmp_path/job.yaml``, as a user writes one) for a canal-json topic with the
    TiDB extension, its lake and checkpoint under ``tmp_path``; ``extra``: more top-level YAML."""
    path = tmp_path / "job.yaml"
    path.write_text(
        f"""\
changefeed: {changefeed}
source:
  bootstrap_servers: "{bootstrap_servers}"
  topic: {topic}
  protocol: canal-json
  options: {{enable-tidb-extension: "true"}}
sink:
  path: {tmp_path / "lake"}
  engine: {engine}
checkpoint: {tmp_path / "ckpt"}
{extra}"""
    )
    return path


@contextmanager
def capture_logs(name: str, handler: logging.Handler) -> Iterator[logging.Handler]:
    """``handler`` attached to logger ``name`` at INFO for the block (level and handlers restored after)."""
    log = logging.getLogger(name)
    old = log.level
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.setLevel(old)


class ProgressLines(logging.Handler):
    """Collects the job's progress lines (logger ``ticdc_delta.progress``, one JSON object per
    micro-batch), parsed, in ``lines``."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(record.getMessage()))


@pytest.fixture
def progress() -> Iterator[ProgressLines]:
    """The progress lines the job logs during the test (``progress.lines``)."""
    with capture_logs("ticdc_delta.progress", ProgressLines()) as handler:
        yield handler  # type: ignore[misc]


@dataclass(frozen=True)
class MariaDB:
    """A MariaDB server started by a test: its TCP port, its socket and the ``mariadb`` client program."""

    port: int
    socket: Path
    client: str


def mariadb_programs(hint: str) -> tuple[str, str, str]:
    """``mariadbd``, ``mariadb-install-db`` and ``mariadb``; missing ones skip the test, or fail it under CI
    (``make test`` installs them), naming ``hint``."""
    server, install, client = shutil.which("mariadbd"), shutil.which("mariadb-install-db"), shutil.which("mariadb")
    if not (server and install and client):
        give_up = pytest.fail if os.environ.get("CI") else pytest.skip
        give_up(f"mariadb-server is not installed ({hint})")
    return server, install, client  # type: ignore[return-value]


@contextmanager
def running_mariadb(programs: tuple[str, str, str], base: Path) -> Iterator[MariaDB]:
    """A fresh MariaDB under ``base`` on a free 127.0.0.1 port (root without a password), stopped after.

    Raises:
        RuntimeError: it did not answer within 60 s (the end of its error log is in the message).
    """
    server, install, client = programs
    data, sock, port = base / "data", base / "sock", free_port()
    subprocess.run([install, f"--datadir={data}", "--user=root", "--skip-test-db",
                    "--auth-root-authentication-method=normal"], check=True, capture_output=True)
    # under the orphan guard: a killed test run leaves no server behind
    proc = subprocess.Popen(guarded([server, "--no-defaults", f"--datadir={data}", f"--socket={sock}", f"--port={port}",
                                     "--bind-address=127.0.0.1", "--user=root", "--skip-grant-tables",
                                     "--skip-log-bin", f"--pid-file={base / 'pid'}",
                                     f"--log-error={base / 'error.log'}"]), stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while subprocess.run([client, f"--socket={sock}", "-e", "SELECT 1"], capture_output=True).returncode != 0:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"mariadbd did not start: {(base / 'error.log').read_text()[-2000:]}")
            time.sleep(0.3)
        yield MariaDB(port, sock, client)
    finally:
        proc.terminate()
        proc.wait(60)
        assert proc.stdin is not None
        proc.stdin.close()
