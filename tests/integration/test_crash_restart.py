"""Kill the driver (and its JVM) with SIGKILL at random moments, restart it, until a run completes:
the Delta tables must equal the oracle — nothing lost, nothing applied twice.

``make soak`` runs a longer version (``TICDC_DELTA_SOAK=1``: a bigger stream, more kills).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from ticdc_delta.config import load_config
from ticdc_delta.simulator import simulate
from ticdc_delta.simulator.output import KafkaSink
from ticdc_delta.spark.batch_handler import _ConfiguredSink
from ticdc_delta.verify import compare_with_oracle
from tests.integration.conftest import job_engine

pytestmark = pytest.mark.integration

SOAK = os.environ.get("TICDC_DELTA_SOAK") == "1"
REPO = Path(__file__).resolve().parents[2]


def _start(cfg_path: Path, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TICDC_DELTA_FAULT", None)
    return subprocess.Popen(
        [sys.executable, "-m", "ticdc_delta", "run", "--config", str(cfg_path), "--once"],
        stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env, cwd=str(REPO),
        start_new_session=True,  # its own process group: the JVM dies with the driver, as in a crash
    )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=60)


def _committed(ckpt: Path) -> int:
    """Micro-batches in the Spark checkpoint's commit log."""
    commits = ckpt / "spark" / "commits"
    return sum(1 for p in commits.iterdir() if p.name.isdigit()) if commits.is_dir() else 0


def _wait_for_a_random_moment(proc: subprocess.Popen[bytes], rnd: random.Random, ckpt: Path) -> None:
    """Until a random moment of the run, or its end: a third of the time 2–10 s after the start (the JVM
    starting, the first batch), else within 3 s after the run's first committed batch (in the middle of
    the next one). A wall-clock moment alone missed a whole run on a fast machine."""
    started = time.monotonic()
    if rnd.random() < 1 / 3:
        until = started + rnd.uniform(2.0, 10.0)
    else:
        before = _committed(ckpt)
        while proc.poll() is None and _committed(ckpt) <= before and time.monotonic() < started + 300:
            time.sleep(0.05)
        until = time.monotonic() + rnd.uniform(0.0, 3.0)
    while time.monotonic() < until and proc.poll() is None:
        time.sleep(0.05)


def test_sigkill_at_random_moments_then_restart(broker: Any, tmp_path: Path, unique_name: Any) -> None:
    rnd = random.Random(int(os.environ.get("TICDC_DELTA_SOAK_SEED", "20261122")))
    topic = unique_name("crash")
    events, kills_wanted = (20000, 8) if SOAK else (1500, 2)
    options = {"max-batch-size": "4"}
    result = simulate("open-protocol", options, seed=21, events=events, tables=3, partitions=3,
                      sink=KafkaSink(broker.bootstrap_servers, topic, 3), topic=topic)
    cfg_path = tmp_path / "job.yaml"
    cfg_path.write_text(yaml.safe_dump({
        "changefeed": "crash",
        "source": {"bootstrap_servers": broker.bootstrap_servers, "topic": topic, "protocol": "open-protocol",
                   "options": options, "max_offsets_per_trigger": max(30, result.summary["messages"] // 12)},
        "sink": {"path": str(tmp_path / "lake"), "engine": job_engine()},
        "checkpoint": str(tmp_path / "ckpt"),
        "log_level": "WARNING",
    }))
    log = tmp_path / "driver.log"
    kills = 0
    completed = False
    for _attempt in range(kills_wanted + 6):
        proc = _start(cfg_path, log)
        if kills < kills_wanted:
            _wait_for_a_random_moment(proc, rnd, tmp_path / "ckpt")
            if proc.poll() is None:
                _kill_group(proc)
                kills += 1
                continue
        rc = proc.wait(timeout=600)
        assert rc == 0, log.read_text()[-4000:]
        completed = True
        break
    assert completed, "the job never completed"
    assert kills >= 1, "no run was killed: the test proved nothing"
    cfg = load_config(cfg_path)
    diffs = compare_with_oracle(_ConfiguredSink(cfg), result.oracle, tz=cfg.sink.source_timezone)
    bad = [d.describe() for d in diffs if not d.ok]
    assert not bad, "\n".join(bad)
