"""The local Kafka broker (KRaft, from the Maven-fetched jars): start, produce, read back, stop, restart."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from ticdc_delta.errors import BrokerUnavailableError
from ticdc_delta.errors import ConfigError
from ticdc_delta.local_broker import LocalBroker, broker_classpath, free_port, wait_for_high_watermarks

pytestmark = pytest.mark.integration


def _read_all(
    bootstrap: str, topic: str, partition: int, count: int
) -> list[tuple[int, bytes | None, bytes | None]]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "test-read", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, partition, 0)])
    out: list[tuple[int, bytes | None, bytes | None]] = []
    deadline = time.monotonic() + 20
    try:
        while len(out) < count and time.monotonic() < deadline:
            for msg in consumer.consume(100, timeout=0.5):
                if msg.error() is None:
                    out.append((msg.offset(), msg.key(), msg.value()))
    finally:
        consumer.close()
    return out


def test_broker_classpath_is_the_fetched_jars() -> None:
    classpath = broker_classpath()
    assert classpath.endswith(os.path.join(".jars", "broker", "*")) or "TICDC_DELTA_JARS" in os.environ


def test_missing_broker_jars_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TICDC_DELTA_JARS", str(tmp_path))
    with pytest.raises(ConfigError, match=r"broker needs its jars in .*broker, found none: run `make install`"):
        LocalBroker().start()


def test_start_produce_read_stop(unique_name: Callable[[str], str], monkeypatch: pytest.MonkeyPatch) -> None:
    # a collector chosen in the environment every JVM reads: the broker's own (serial) is left out, since
    # two stop the JVM from starting (its storage format failed before)
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-XX:+UseG1GC")
    topic = unique_name("lb")
    broker = LocalBroker()
    with broker:
        assert broker.running
        assert broker._proc is not None
        assert "-XX:+UseSerialGC" not in Path(f"/proc/{broker._proc.pid}/cmdline").read_bytes().decode().split("\0")
        assert broker.bootstrap_servers == f"127.0.0.1:{broker.port}"
        broker.create_topic(topic, partitions=3)
        messages = [(i % 3, f"k{i}".encode(), f"v{i}".encode()) for i in range(12)]
        messages += [(0, None, None), (1, b"", b""), (2, b"k", None)]
        assert broker.produce_many(topic, messages) == 15

        assert broker.high_watermarks(topic, [0, 1, 2]) == {0: 5, 1: 5, 2: 5}
        seen = wait_for_high_watermarks(broker.bootstrap_servers, {(topic, p): 5 for p in range(3)})
        assert seen == {(topic, p): 5 for p in range(3)}
        for partition in range(3):
            expected = [(k, v) for p, k, v in messages if p == partition]
            got = _read_all(broker.bootstrap_servers, topic, partition, len(expected))
            assert [o for o, _, _ in got] == list(range(len(expected)))
            assert [(k, v) for _, k, v in got] == expected
        pid = broker._proc.pid if broker._proc else None
    assert not broker.running
    assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    broker.stop()  # idempotent
    assert "Kafka Server started" in broker.log_tail(100)
    broker.cleanup_logs()


def test_start_failure_reports_log_tail() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        broker = LocalBroker(port=port, start_timeout_s=60)
        with pytest.raises(BrokerUnavailableError, match=rf"Kafka .*127\.0\.0\.1:{port}.*log tail"):
            broker.start()
        assert not broker.running
        broker.cleanup_logs()


def test_wait_for_high_watermarks_times_out(broker: LocalBroker, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("wm")
    broker.create_topic(topic, partitions=1)
    with pytest.raises(BrokerUnavailableError, match=r"did not reach"):
        wait_for_high_watermarks(broker.bootstrap_servers, {(topic, 0): 1}, timeout_s=0.5)


def test_create_existing_topic_is_refused(broker: LocalBroker, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("dup")
    broker.create_topic(topic, partitions=1)
    with pytest.raises(Exception, match=r"(?i)exist"):
        broker.create_topic(topic, partitions=1)


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_batched_produce_counts_every_record(broker: LocalBroker, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("batch")
    broker.create_topic(topic, partitions=1)
    producer = broker.producer(**{"batch.num.messages": 500, "linger.ms": 100})
    for i in range(1000):
        producer.produce(topic, value=b"x%d" % i, partition=0)
    assert producer.flush(10) == 0
    assert broker.high_watermarks(topic, [0]) == {0: 1000}
    assert [v for _, _, v in _read_all(broker.bootstrap_servers, topic, 0, 1000)] == [
        b"x%d" % i for i in range(1000)
    ]


def test_restart_on_the_same_log_directory(unique_name: Callable[[str], str]) -> None:
    topic = unique_name("restart")
    broker = LocalBroker()
    try:
        broker.start()
        port, data_dir = broker.port, broker.data_dir
        broker.create_topic(topic, partitions=2)
        broker.produce_many(topic, [(i % 2, None, b"a%d" % i) for i in range(10)])
        broker.stop()
        assert not broker.running
        with pytest.raises(BrokerUnavailableError):
            wait_for_high_watermarks(f"127.0.0.1:{port}", {(topic, 0): 5}, timeout_s=1)
        broker.start()
        assert (broker.port, broker.data_dir) == (port, data_dir)
        broker.produce_many(topic, [(i % 2, None, b"b%d" % i) for i in range(10)])
        assert broker.high_watermarks(topic, [0, 1]) == {0: 10, 1: 10}
        got = [v for _, _, v in _read_all(broker.bootstrap_servers, topic, 0, 10)]
        assert got == [b"a%d" % i for i in range(0, 10, 2)] + [b"b%d" % i for i in range(0, 10, 2)]
    finally:
        broker.stop()
        broker.cleanup_logs()



def _kafka_pids(work_dir: str) -> list[int]:
    """The broker JVMs whose command line names ``work_dir`` (its server.properties)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                args = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"kafka.Kafka" in args and any(work_dir.encode() in a for a in args) and b"--" not in args:
                pids.append(int(proc.name))
    return pids


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads processes from /proc")
def test_a_killed_starter_leaves_no_broker_and_no_directory(tmp_path: Path) -> None:
    # the process that started the broker is SIGKILLed, so neither stop() nor atexit runs: the broker's
    # orphan guard stops the JVM and removes the broker's own temporary directory
    out = tmp_path / "started"
    starter = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from ticdc_delta.local_broker import LocalBroker; b = LocalBroker().start(); "
        f"open({str(out)!r}, 'w').write(str(b._work_dir)); time.sleep(600)")])
    try:
        deadline = time.monotonic() + 120
        while not (out.exists() and out.read_text()):
            assert starter.poll() is None and time.monotonic() < deadline, "the broker did not start"
            time.sleep(0.2)
        work_dir = out.read_text()
        jvms = _kafka_pids(work_dir)
        assert len(jvms) == 1 and Path(work_dir, "data").is_dir()
        starter.kill()
        starter.wait()
        deadline = time.monotonic() + 60
        while _kafka_pids(work_dir) or Path(work_dir).exists():
            assert time.monotonic() < deadline, f"broker {jvms} or {work_dir} still there after its starter died"
            time.sleep(0.2)
    finally:
        starter.kill()
        starter.wait()

def test_cluster_ids_never_look_like_an_option() -> None:
    from ticdc_delta.local_broker import _cluster_id

    ids = [_cluster_id() for _ in range(5000)]
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)
