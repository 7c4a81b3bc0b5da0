"""``python -m ticdc_delta run/status`` as a user runs them: a hand-written YAML, exit codes, no secrets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ticdc_delta.cli import EXIT_RETRYABLE, EXIT_TERMINAL
from ticdc_delta.local_broker import free_port
from ticdc_delta.simulator import simulate
from ticdc_delta.simulator.output import KafkaSink
from tests.integration.conftest import canal_job_yaml, job_engine

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SECRET = "s3cr3t-pa55word-do-not-log"


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([sys.executable, "-m", "ticdc_delta", *args], capture_output=True, text=True,
                          env=full_env, cwd=str(REPO), timeout=timeout)


def test_run_once_then_status(broker: Any, tmp_path: Path, unique_name: Any) -> None:
    topic = unique_name("cli")
    simulate("canal-json", {"enable-tidb-extension": "true"}, seed=4, events=300, tables=2, partitions=2,
             sink=KafkaSink(broker.bootstrap_servers, topic, 2), topic=topic)
    cfg = canal_job_yaml(tmp_path, "cli-demo", broker.bootstrap_servers, topic, job_engine("spark"))
    run = _cli("run", "--config", str(cfg), "--once")
    assert run.returncode == 0, run.stderr[-3000:]
    progress = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert progress and progress[-1]["changefeed"] == "cli-demo"
    assert sum(sum(p["rows_applied"].values()) for p in progress) > 0
    status = _cli("status", "--config", str(cfg), "--json")
    assert status.returncode == 0, status.stderr
    st = json.loads(status.stdout)
    assert st["batch_id"] == progress[-1]["batch_id"] and st["tables"]
    assert all(t["applied_commit_ts"] for t in st["tables"].values())
    text = _cli("status", "--config", str(cfg))
    assert "applied commit ts" in text.stdout


def test_exit_codes_and_no_secrets(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("changefeed: x\nsource: {bootstrap_servers: h:1, topic: t, protocol: nope}\n"
                   f"sink: {{path: {tmp_path}}}\ncheckpoint: {tmp_path / 'c'}\n")
    res = _cli("run", "--config", str(bad), "--once")
    assert res.returncode == EXIT_TERMINAL and "source.protocol" in res.stderr

    dead = tmp_path / "dead.yaml"
    dead.write_text(
        f"""\
changefeed: dead
source:
  bootstrap_servers: "127.0.0.1:{free_port()}"
  topic: t
  protocol: open-protocol
  kafka:
    security.protocol: SASL_PLAINTEXT
    sasl.mechanism: PLAIN
    sasl.username: u
    sasl.password: ${{KAFKA_PASSWORD}}
sink: {{path: {tmp_path / "lake"}, engine: {job_engine("spark")}}}
checkpoint: {tmp_path / "ckpt"}
"""
    )
    res = _cli("run", "--config", str(dead), "--once", env={"KAFKA_PASSWORD": SECRET}, timeout=180)
    assert res.returncode == EXIT_RETRYABLE, res.stderr[-2000:]
    assert "BrokerUnavailable" in res.stderr or "did not answer" in res.stderr or "Kafka at" in res.stderr
    assert SECRET not in res.stderr and SECRET not in res.stdout
