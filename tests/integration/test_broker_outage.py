"""The Kafka broker goes away for ~20 s in the middle of a continuous run and comes back on the same log
directory: the job either waits and resumes, or exits retryable (75) and resumes when started again —
either way the Delta tables end equal to the oracle, and a broker that stays away mid-batch gives exit 75
with one line on stderr.
"""

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
from confluent_kafka import Consumer, TopicPartition

from ticdc_delta.cli import EXIT_RETRYABLE
from ticdc_delta.config import load_config
from ticdc_delta.local_broker import LocalBroker
from ticdc_delta.simulator import simulate
from ticdc_delta.simulator.output import MemorySink
from ticdc_delta.spark.batch_handler import _ConfiguredSink
from ticdc_delta.verify import compare_with_oracle
from tests.integration.conftest import job_engine

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 3


def _start(cfg_path: Path, log: Path, *, once: bool) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TICDC_DELTA_FAULT", None)
    args = [sys.executable, "-m", "ticdc_delta", "run", "--config", str(cfg_path)] + (["--once"] if once else [])
    return subprocess.Popen(
        args, stdout=log.open("ab"), stderr=subprocess.PIPE, env=env, cwd=str(REPO), start_new_session=True
    )


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=60)


def _committed(servers: str, group: str, topic: str) -> dict[int, int]:
    """The consumer group's committed offsets (the job mirrors them after each batch)."""
    consumer = Consumer({"bootstrap.servers": servers, "group.id": group})
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in tps}


def _write_config(path: Path, tmp_path: Path, servers: str, topic: str, cap: int) -> None:
    path.write_text(yaml.safe_dump({
        "changefeed": "outage",
        "source": {"bootstrap_servers": servers, "topic": topic, "protocol": "open-protocol",
                   "max_offsets_per_trigger": cap},
        "sink": {"path": str(tmp_path / "lake"), "engine": job_engine()},
        "checkpoint": str(tmp_path / "ckpt"),
        "trigger_interval": "1 second",
        "log_level": "WARNING",
    }))


def test_broker_stopped_for_20_s_mid_run_then_restarted(tmp_path: Path) -> None:
    stream = MemorySink()
    result = simulate("open-protocol", {}, seed=7, events=1500, tables=3, partitions=PARTITIONS, sink=stream)
    messages = stream.messages
    half = len(messages) // 2
    topic = "outage"
    broker = LocalBroker()
    proc: subprocess.Popen[bytes] | None = None
    try:
        broker.start()
        broker.create_topic(topic, partitions=PARTITIONS)
        broker.produce_many(topic, messages[:half])
        cfg_path = tmp_path / "job.yaml"
        _write_config(cfg_path, tmp_path, broker.bootstrap_servers, topic, cap=max(50, half // 6))
        log = tmp_path / "driver.log"
        proc = _start(cfg_path, log, once=False)

        # wait for the first committed batch (mirrored to the group), then take the broker away mid-run
        deadline = time.monotonic() + 240
        while not any(o > 0 for o in _committed(broker.bootstrap_servers, "ticdc-delta-outage", topic).values()):
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "no batch committed within 240 s"
            time.sleep(1)
        broker.stop()
        time.sleep(20)
        broker.start()  # same log directory, same port
        broker.produce_many(topic, messages[half:])
        ends = broker.high_watermarks(topic, range(PARTITIONS))

        # either the running job resumes and catches up, or it exited 75 and a restart does
        deadline = time.monotonic() + 420
        restarts = 0
        while _committed(broker.bootstrap_servers, "ticdc-delta-outage", topic) != ends:
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                assert proc.returncode == EXIT_RETRYABLE, err[-3000:]
                assert len(err.strip().splitlines()[-1:]) == 1 and err.strip().splitlines()[-1].startswith("error:")
                restarts += 1
                assert restarts <= 3, "the job kept failing after the broker was back"
                proc = _start(cfg_path, log, once=False)
            assert time.monotonic() < deadline, "the job did not catch up within 420 s of the restart"
            time.sleep(1)
        _kill(proc)
        proc = None

        cfg = load_config(cfg_path)
        diffs = compare_with_oracle(_ConfiguredSink(cfg), result.oracle, tz=cfg.sink.source_timezone)
        bad = [d.describe() for d in diffs if not d.ok]
        assert not bad, "\n".join(bad)
    finally:
        if proc is not None:
            _kill(proc)
        broker.stop()
        broker.cleanup_logs()


def test_broker_gone_for_good_mid_run_exits_75_with_one_line(tmp_path: Path) -> None:
    """The broker dies while the job is between or inside batches and does not come back: exit 75, and
    stderr ends with one ``error:`` line that names Kafka (short client timeouts keep the test short)."""
    stream = MemorySink()
    simulate("open-protocol", {}, seed=8, events=3000, tables=2, partitions=PARTITIONS, sink=stream)
    topic = "gone"
    broker = LocalBroker()
    proc: subprocess.Popen[bytes] | None = None
    try:
        broker.start()
        broker.create_topic(topic, partitions=PARTITIONS)
        broker.produce_many(topic, stream.messages)
        cfg_path = tmp_path / "job.yaml"
        _write_config(cfg_path, tmp_path, broker.bootstrap_servers, topic, cap=max(20, len(stream.messages) // 40))
        cfg = yaml.safe_load(cfg_path.read_text())
        cfg["source"]["kafka"] = {"default.api.timeout.ms": 8000, "request.timeout.ms": 4000}
        cfg_path.write_text(yaml.safe_dump(cfg))
        proc = _start(cfg_path, tmp_path / "driver.log", once=True)
        deadline = time.monotonic() + 240
        while not any(o > 0 for o in _committed(broker.bootstrap_servers, "ticdc-delta-outage", topic).values()):
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "no batch committed within 240 s"
            time.sleep(0.5)
        broker.stop()
        _, err = proc.communicate(timeout=400)
        text = err.decode()
        assert proc.returncode == EXIT_RETRYABLE, text[-3000:]
        last = text.strip().splitlines()[-1]
        assert last.startswith("error: ") and "Kafka" in last, text[-3000:]
        assert len(last) < 1000
        proc = None
    finally:
        if proc is not None:
            _kill(proc)
        broker.stop()
        broker.cleanup_logs()


def test_s3_checkpoint_without_hadoop_aws_names_the_jar(spark: Any, tmp_path: Path) -> None:
    """No S3A filesystem on the session: one terminal line naming hadoop-aws, before anything touches the
    checkpoint (``run`` prints it as its ``error:`` line and exits 1)."""
    from ticdc_delta.config import config_from_mapping
    from ticdc_delta.errors import ConfigError
    from ticdc_delta.spark.job import run_job

    cfg = config_from_mapping({
        "changefeed": "s3ck",
        "source": {"bootstrap_servers": "127.0.0.1:9", "topic": "t", "protocol": "open-protocol"},
        "sink": {"path": str(tmp_path / "lake"), "engine": job_engine()},
        "checkpoint": "s3://ticdc-delta-no-such-bucket/ckpt",
    })
    with pytest.raises(ConfigError, match=r"no Hadoop filesystem for s3:// .*org\.apache\.hadoop:hadoop-aws:3\.4\.1") as caught:
        run_job(cfg, once=True, spark=spark)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "lake").exists()
