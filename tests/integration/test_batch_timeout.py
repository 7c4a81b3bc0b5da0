"""``batch_timeout``: a micro-batch that never ends (here: one held at a stage by the fault hook, as a stuck
socket or commit would hold it) ends the job with exit 75 and one ``error:`` line, its JVM with it; the
next start resumes from the checkpoint and the tables equal the oracle."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from ticdc_delta.cli import EXIT_RETRYABLE
from ticdc_delta.config import load_config
from ticdc_delta.simulator import simulate
from ticdc_delta.simulator.output import KafkaSink
from ticdc_delta.spark.batch_handler import FAULT_ENV, _ConfiguredSink
from ticdc_delta.verify import compare_with_oracle
from tests.integration.conftest import canal_job_yaml, job_engine

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# far above a batch of this small stream, also in a slow hour (the spark engine's first batch in a fresh JVM
# took over 30 s in one: its first MERGEs and the staging table's creation)
TIMEOUT_S = {"delta-rs": 20, "spark": 150}


def _run(cfg_path: Path, fault: str | None) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop(FAULT_ENV, None)
    if fault:
        env[FAULT_ENV] = fault
    return subprocess.Popen(
        [sys.executable, "-m", "ticdc_delta", "run", "--config", str(cfg_path), "--once"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO),
        start_new_session=True,  # its own process group: what is left of it after the exit can be seen
    )


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_hung_micro_batch_ends_the_job_with_75_and_the_next_start_loses_nothing(
        broker: Any, tmp_path: Path, unique_name: Any) -> None:
    topic = unique_name("hung")
    result = simulate("canal-json", {"enable-tidb-extension": "true"}, seed=5, events=400, tables=2, partitions=2,
                      sink=KafkaSink(broker.bootstrap_servers, topic, 2), topic=topic)
    engine = job_engine()
    cfg_path = canal_job_yaml(tmp_path, "hung", broker.bootstrap_servers, topic, engine)
    data = yaml.safe_load(cfg_path.read_text())
    data["source"]["max_offsets_per_trigger"] = max(20, result.oracle.counts["messages"] // 4)  # several batches
    data["batch_timeout"] = f"{TIMEOUT_S[engine]} seconds"
    cfg_path.write_text(yaml.safe_dump(data))

    proc = _run(cfg_path, "after_decode@1:hang")  # batch 0 commits, batch 1 never ends
    try:
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:  # (a hang guard only: the watchdog failed)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == EXIT_RETRYABLE, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: micro-batch 1 still running after "), err[-3000:]
    assert f"(batch_timeout {TIMEOUT_S[engine]} s)" in last and "resumes from the checkpoint" in last
    deadline = time.monotonic() + 60
    while _group_alive(proc.pid) and time.monotonic() < deadline:  # the JVM ends with its driver
        time.sleep(0.2)
    assert not _group_alive(proc.pid), "the job's JVM outlived its driver"
    assert (tmp_path / "ckpt" / "spark" / "commits" / "0").exists()  # batch 0 was committed before the hang
    assert not (tmp_path / "ckpt" / "spark" / "commits" / "1").exists()

    del data["batch_timeout"]  # (the restart's first batch is no test of the watchdog)
    cfg_path.write_text(yaml.safe_dump(data))
    proc = _run(cfg_path, None)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    cfg = load_config(cfg_path)
    diffs = compare_with_oracle(_ConfiguredSink(cfg), result.oracle, tz=cfg.sink.source_timezone)
    assert not [d.describe() for d in diffs if not d.ok]
    assert sum(d.actual_rows for d in diffs) > 0
