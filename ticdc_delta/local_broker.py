"""A throw-away single-node Apache Kafka broker (KRaft mode) on 127.0.0.1 for the demo, tests and benchmarks.

The broker is Apache Kafka 4.1 from the jars ``make`` fetches with Maven (``jvm/broker/pom.xml`` →
``.jars/broker``; see :mod:`ticdc_delta.jars`), run as ``java kafka.Kafka server.properties`` in a child
process: one node that is both controller and broker, its storage formatted once
(``kafka.tools.StorageTool format``) in a temporary directory, its log on disk, a small heap. No Docker.
The broker can be stopped and started again on the same log directory and port (:meth:`LocalBroker.stop`
then :meth:`LocalBroker.start`), which restart tests need. Nothing here imports pyspark.

Example::

    with LocalBroker() as broker:
        broker.create_topic("orders", partitions=3)
        broker.produce_many("orders", [(0, b"k", b"v")])
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import base64
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from ticdc_delta.errors import BrokerUnavailableError
from ticdc_delta.jars import broker_classpath, chooses_gc, java_executable
from ticdc_delta.orphan_guard import guarded
from ticdc_delta.produce_order import ProduceLedger

__all__ = ["LocalBroker", "broker_classpath", "free_port", "wait_for_high_watermarks"]

#: A light collector (2-core machines run the broker next to Spark), left out when the JVM's environment
#: chooses one (:func:`~ticdc_delta.jars.chooses_gc`: two stop the JVM from starting).
_SERIAL_GC = "-XX:+UseSerialGC"

#: JVM options: a small heap and :data:`_SERIAL_GC`.
_JVM_OPTS = (
    "-Xms64m",
    _SERIAL_GC,
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
    "-Dlog4j2.configurationFile={log4j}",
)

#: server.properties of a one-node cluster that starts fast: replication factor 1 everywhere, one
#: partition for internal topics, no initial rebalance delay, few threads, a small cleaner buffer.
_SERVER_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller_port}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={data_dir}
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
delete.topic.enable=true
num.network.threads=2
num.io.threads=2
background.threads=2
num.recovery.threads.per.data.dir=1
log.cleaner.dedupe.buffer.size=8388608
log.cleaner.threads=1
"""

#: Broker log: warnings and errors of everything, plus the lines that say the broker started/stopped.
_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.out.ref = out
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = info
logger.broker.name = kafka.server.BrokerServer
logger.broker.level = info
"""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that is free right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_for_high_watermarks(
    bootstrap_servers: str,
    expected: Mapping[tuple[str, int], int],
    *,
    timeout_s: float = 30.0,
    client_conf: Mapping[str, Any] | None = None,
) -> dict[tuple[str, int], int]:
    """Wait until every ``(topic, partition)`` has a high watermark of at least the expected offset.

    Returns:
        The high watermarks seen last, keyed like ``expected``.

    Raises:
        BrokerUnavailableError: the watermarks did not get there within ``timeout_s``.
    """
    conf = {**(client_conf or {}), "bootstrap.servers": bootstrap_servers, "group.id": "ticdc-delta-wm"}
    consumer = Consumer(conf)
    seen: dict[tuple[str, int], int] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            for (topic, partition), want in expected.items():
                if seen.get((topic, partition), -1) >= want:
                    continue
                try:
                    _, high = consumer.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=max(0.1, deadline - time.monotonic())
                    )
                except KafkaException:
                    high = -1
                seen[(topic, partition)] = high
            if all(seen[tp] >= want for tp, want in expected.items()):
                return seen
            if time.monotonic() >= deadline:
                raise BrokerUnavailableError(
                    f"high watermarks on {bootstrap_servers} did not reach {dict(expected)} within "
                    f"{timeout_s:.0f} s; last seen {seen}"
                )
            time.sleep(0.05)
    finally:
        consumer.close()


def _flush(producer: Producer, stall_timeout_s: float) -> int:
    """Flush ``producer`` until nothing is queued or no delivery happened for ``stall_timeout_s``.

    Returns:
        The number of messages still queued (0 on success).
    """
    remaining = producer.flush(min(1.0, stall_timeout_s))
    deadline = time.monotonic() + stall_timeout_s
    while remaining:
        before = remaining
        remaining = producer.flush(min(1.0, stall_timeout_s))
        if remaining < before:
            deadline = time.monotonic() + stall_timeout_s
        elif time.monotonic() >= deadline:
            break
    return int(remaining)


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes in URL-safe base64 without padding. Like Kafka's own
    ``Uuid.randomUuid()``, never one that starts with ``-``: the storage tool's argument parser would take
    it for an option (``--cluster-id: expected one argument``, about 1 start in 64)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


class LocalBroker:
    """A single-node Kafka broker in a child JVM, listening on a free 127.0.0.1 port, logging to disk.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`. :meth:`start` after :meth:`stop`
    restarts the broker on the same log directory and port (the topics and their messages survive).
    The child runs in its own process group, so stopping it never signals the caller; it is also stopped
    when the interpreter exits, and (through :mod:`~ticdc_delta.orphan_guard`) when this process dies
    without stopping it: killed, it leaves no broker running and, unless ``work_dir`` was given, no
    directory behind. :meth:`cleanup_logs` removes the directory after the last stop.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        start_timeout_s: float = 90.0,
        heap: str = "384m",
        work_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self._port = port
        self._controller_port: int | None = None
        self._start_timeout_s = start_timeout_s
        self._heap = heap
        self._work_dir: Path | None = Path(work_dir) if work_dir is not None else None
        self._own_work_dir = work_dir is None
        self._proc: subprocess.Popen[bytes] | None = None
        self._default_producer: Producer | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> "LocalBroker":
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"LocalBroker({self.bootstrap_servers if self._port else 'no port'}, {state})"

    @property
    def running(self) -> bool:
        """Whether the broker process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def port(self) -> int:
        """The TCP port the broker listens on.

        Raises:
            RuntimeError: the broker was never started.
        """
        if self._port is None:
            raise RuntimeError("LocalBroker has not been started")
        return self._port

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` to give Kafka clients."""
        return f"127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path | None:
        """The broker's log directory (topics, offsets, metadata), kept across :meth:`stop`/:meth:`start`."""
        return None if self._work_dir is None else self._work_dir / "data"

    @property
    def log_path(self) -> Path | None:
        """The broker's stdout/stderr log file (kept after :meth:`stop` for post-mortems)."""
        return None if self._work_dir is None else self._work_dir / "broker.log"

    @property
    def pid(self) -> int | None:
        """While the broker runs, the id of the process that leads its process group: the broker's
        :mod:`~ticdc_delta.orphan_guard`, the JVM's parent."""
        return self._proc.pid if self.running and self._proc is not None else None

    def start(self) -> "LocalBroker":
        """Start the broker (formatting its storage the first time) and wait until it answers metadata.

        Raises:
            ConfigError: Java or the broker jars are missing.
            BrokerUnavailableError: the broker exited or did not answer within the start timeout; the
                message carries the tail of the broker log.
        """
        if self.running:
            return self
        java = java_executable()
        classpath = broker_classpath()
        if self._work_dir is None:
            self._work_dir = Path(tempfile.mkdtemp(prefix="ticdc-delta-kafka-"))
        self._work_dir.mkdir(parents=True, exist_ok=True)
        if self._port is None:
            self._port = free_port()
        if self._controller_port is None:
            self._controller_port = free_port()
        data_dir, log_path = self._work_dir / "data", self._work_dir / "broker.log"
        props = self._work_dir / "server.properties"
        props.write_text(
            _SERVER_PROPERTIES.format(
                port=self._port, controller_port=self._controller_port, data_dir=data_dir
            )
        )
        log4j = self._work_dir / "log4j2.properties"
        log4j.write_text(_LOG4J2)
        theirs = chooses_gc()
        options = [o.format(log4j=log4j) for o in _JVM_OPTS if not (theirs and o == _SERIAL_GC)]
        jvm = [java, f"-Xmx{self._heap}", *options, "-cp", classpath]
        with open(log_path, "ab") as log:
            if not (data_dir / "meta.properties").exists():
                cid = _cluster_id()
                formatted = subprocess.run(
                    [*jvm, "kafka.tools.StorageTool", "format", "-t", cid, "-c", str(props)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=self._start_timeout_s,
                    check=False,
                )
                if formatted.returncode != 0:
                    raise BrokerUnavailableError(
                        f"formatting the Kafka storage in {data_dir} failed with status "
                        f"{formatted.returncode}; log tail:\n{self.log_tail()}"
                    )
            # through the orphan guard: the broker stops (and its own temporary directory goes) when this
            # process dies without stopping it, e.g. killed; the guard's standard input is our pipe to it
            self._proc = subprocess.Popen(
                guarded([*jvm, "kafka.Kafka", str(props)], remove=self._work_dir if self._own_work_dir else None),
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._work_dir,
                start_new_session=True,  # own process group: signals to it never reach us
            )
        atexit.register(self.stop)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self._start_timeout_s
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
        proc = self._proc
        while True:
            if proc is None or proc.poll() is not None:
                status = None if proc is None else proc.returncode
                raise BrokerUnavailableError(
                    f"Kafka exited with status {status} while starting on "
                    f"{self.bootstrap_servers}; log tail:\n{self.log_tail()}"
                )
            try:
                metadata = admin.list_topics(timeout=1.0)
                if metadata.brokers:
                    return
            except KafkaException:
                pass
            if time.monotonic() >= deadline:
                raise BrokerUnavailableError(
                    f"Kafka did not answer metadata requests on {self.bootstrap_servers} within "
                    f"{self._start_timeout_s:.0f} s; log tail:\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the broker (SIGTERM: a clean shutdown that flushes the log; SIGKILL after ``timeout_s``).

        Safe to call repeatedly. The log directory stays, so :meth:`start` resumes on it.
        """
        proc, self._proc = self._proc, None
        self._default_producer = None
        if proc is None:
            return
        atexit.unregister(self.stop)
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=timeout_s)
        if proc.stdin is not None:
            # only now: the guard takes the end of its input for this process's death and removes the
            # directory, which start() may still resume on
            proc.stdin.close()

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the broker log ('' when there is none)."""
        path = self.log_path
        if path is None or not path.exists():
            return ""
        text = path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def cleanup_logs(self) -> None:
        """Remove the broker's directory (log directory and log file) after :meth:`stop`."""
        if self._work_dir is not None and not self.running and self._own_work_dir:
            shutil.rmtree(self._work_dir, ignore_errors=True)
            self._work_dir = None

    # -- clients ---------------------------------------------------------------------------------

    def admin(self) -> AdminClient:
        """An AdminClient bound to this broker."""
        return AdminClient({"bootstrap.servers": self.bootstrap_servers})

    def create_topic(self, name: str, partitions: int = 1, *, timeout_s: float = 15.0) -> None:
        """Create ``name`` with ``partitions`` partitions and wait until metadata shows all of them.

        Raises:
            BrokerUnavailableError: the topic did not appear with all partitions in time.
            KafkaException: the broker refused the topic (e.g. it exists already).
        """
        admin = self.admin()
        futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
        futures[name].result(timeout=timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:
            metadata = admin.list_topics(timeout=max(0.5, deadline - time.monotonic()))
            topic = metadata.topics.get(name)
            if (
                topic is not None
                and topic.error is None
                and len(topic.partitions) == partitions
                and all(p.leader >= 0 and p.error is None for p in topic.partitions.values())
            ):
                # metadata has a leader everywhere; wait until the leader also answers for the log
                self._wait_for_leaders(name, partitions, deadline)
                return
            if time.monotonic() >= deadline:
                raise BrokerUnavailableError(
                    f"topic {name!r} did not show {partitions} partitions on {self.bootstrap_servers} "
                    f"within {timeout_s:.0f} s"
                )
            time.sleep(0.05)

    def producer(self, **extra: Any) -> Producer:
        """A Producer for this broker (normal batching, ``acks=all``, idempotent: a retried request keeps
        each partition's order and stores each message once, :mod:`ticdc_delta.produce_order`).

        ``extra`` are librdkafka settings; dotted names go through a dict:
        ``broker.producer(**{"linger.ms": 100})``.
        """
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers, "acks": "all", "linger.ms": 5,
                                "enable.idempotence": True}
        conf.update(extra)
        return Producer(conf)

    def produce_many(
        self,
        topic: str,
        messages: Iterable[tuple[int, bytes | None, bytes | None]],
        *,
        timeout_s: float = 30.0,
        producer: Producer | None = None,
    ) -> int:
        """Produce ``(partition, key, value)`` messages in order, flush, and check every delivery and that
        each partition stored its messages in that order.

        The final flush fails after ``timeout_s`` without any delivery. Without ``producer`` a shared
        producer of this broker is used; threads producing at the same time should
        each pass their own (:meth:`producer`), as a flush waits for every message of its producer.

        Returns:
            The number of messages delivered.

        Raises:
            BrokerUnavailableError: a delivery failed or the flush did not finish in time.
            ProduceOrderError: a partition holds its messages in another order (a ``producer`` that is
                not idempotent).
        """
        if producer is None:
            if self._default_producer is None:
                self._default_producer = self.producer()  # one per broker (clients are not cheap)
            producer = self._default_producer
        prod = producer
        ledger = ProduceLedger(topic)
        count = 0
        for partition, key, value in messages:
            on_delivery = ledger.expect(partition)
            while True:
                try:
                    prod.produce(topic, key=key, value=value, partition=partition, on_delivery=on_delivery)
                    break
                except BufferError:  # local queue full: let deliveries drain
                    prod.poll(0.1)
            count += 1
            prod.poll(0)
        remaining = _flush(prod, timeout_s)
        errors, delivered = ledger.errors, ledger.delivered
        if errors:
            raise BrokerUnavailableError(
                f"{len(errors)} of {count} messages to {topic!r} on {self.bootstrap_servers} failed; "
                f"first error: {errors[0]}"
            )
        if remaining or delivered != count:
            raise BrokerUnavailableError(
                f"only {delivered} of {count} messages to {topic!r} on {self.bootstrap_servers} were "
                f"acknowledged (no progress for {timeout_s:.0f} s)"
            )
        ledger.check()
        return count

    def _wait_for_leaders(self, topic: str, partitions: int, deadline: float) -> None:
        while True:
            try:
                self.high_watermarks(topic, range(partitions), timeout_s=max(0.5, deadline - time.monotonic()))
                return
            except KafkaException as exc:
                if time.monotonic() >= deadline:
                    raise BrokerUnavailableError(
                        f"topic {topic!r} on {self.bootstrap_servers} has no serving leader yet: {exc}"
                    ) from None

    def high_watermarks(
        self, topic: str, partitions: Iterable[int], *, timeout_s: float = 15.0
    ) -> dict[int, int]:
        """The current high watermark of each listed partition of ``topic``.

        Retriable answers (a partition whose leader is still being elected, e.g. right after the topic
        was created or the broker restarted) are retried until ``timeout_s``.

        Raises:
            KafkaException: the last error, when no answer came within ``timeout_s``.
        """
        consumer = Consumer({"bootstrap.servers": self.bootstrap_servers, "group.id": "ticdc-delta-wm"})
        deadline = time.monotonic() + timeout_s
        out: dict[int, int] = {}
        try:
            for p in partitions:
                while True:
                    try:
                        out[p] = consumer.get_watermark_offsets(
                            TopicPartition(topic, p), timeout=max(0.5, deadline - time.monotonic())
                        )[1]
                        break
                    except KafkaException as exc:
                        err = exc.args[0] if exc.args else None
                        retriable = isinstance(err, KafkaError) and (
                            err.retriable()
                            or err.code()
                            in (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.UNKNOWN_TOPIC_OR_PART)
                        )
                        if not retriable or time.monotonic() >= deadline:
                            raise
                        time.sleep(0.1)
            return out
        finally:
            consumer.close()
