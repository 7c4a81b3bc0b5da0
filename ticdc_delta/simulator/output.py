"""Where simulated messages go: a Kafka topic, files, or a list in memory.

Every sink has ``write(partition, key, value)`` and ``close()``; ``close`` makes everything durable
(flushes the producer or the file) and raises if something was not delivered.

Files (``FileSink``): ``messages.jsonl`` in the output directory, one JSON object per message in the
order the simulator produced them: ``{"partition": int, "key_b64": str | null, "value_b64": str | null}``
(``null`` for a missing key or a tombstone value). :func:`read_messages` reads them back.

Kafka (``KafkaSink``): creates the topic with the wanted partition count when it is missing, then
produces each message to its partition, batching normally with one request in flight, so a retry can
never reorder a partition.
"""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path
from typing import Any, Iterator, Protocol

import orjson

from ..errors import BrokerUnavailableError, ConfigError

__all__ = ["MessageSink", "FileSink", "KafkaSink", "MemorySink", "read_messages", "MESSAGES_FILE"]

MESSAGES_FILE = "messages.jsonl"


class MessageSink(Protocol):
    """A destination for simulated Kafka messages."""

    def write(self, partition: int, key: bytes | None, value: bytes | None) -> None:
        """Send one message to ``partition``."""
        ...

    def close(self) -> None:
        """Make every written message durable.

        Raises:
            BrokerUnavailableError: (Kafka) a message was not acknowledged.
            OSError: (files) writing failed.
        """
        ...


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


class MemorySink:
    """Keeps ``(partition, key, value)`` tuples in :attr:`messages` (tests, small streams)."""

    def __init__(self) -> None:
        self.messages: list[tuple[int, bytes | None, bytes | None]] = []

    def write(self, partition: int, key: bytes | None, value: bytes | None) -> None:
        self.messages.append((partition, key, value))

    def close(self) -> None:
        pass


class FileSink:
    """Writes messages as JSON lines to ``<directory>/messages.jsonl`` (created; replaced if present).

    Raises:
        OSError: the directory or file cannot be created.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / MESSAGES_FILE
        self._fh = open(self.path, "wb", buffering=1 << 20)
        self.count = 0

    def write(self, partition: int, key: bytes | None, value: bytes | None) -> None:
        self._fh.write(orjson.dumps({"partition": partition, "key_b64": _b64(key), "value_b64": _b64(value)}))
        self._fh.write(b"\n")
        self.count += 1

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()


def read_messages(path: str | os.PathLike[str]) -> Iterator[tuple[int, bytes | None, bytes | None]]:
    """``(partition, key, value)`` of each line of a ``messages.jsonl`` (or of the directory holding it).

    Raises:
        OSError: the file cannot be read.
        ValueError: a line is not a message object (names the line number).
    """
    p = Path(path)
    if p.is_dir():
        p = p / MESSAGES_FILE
    with open(p, "rb") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
                key, value = obj["key_b64"], obj["value_b64"]
                yield (
                    int(obj["partition"]),
                    None if key is None else base64.b64decode(key, validate=True),
                    None if value is None else base64.b64decode(value, validate=True),
                )
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{p}:{n}: not a message line: {type(exc).__name__}: {exc}") from None


class KafkaSink:
    """Produces messages to ``topic`` on ``bootstrap_servers``, creating the topic if it is missing, with
    an idempotent producer; :meth:`close` checks that Kafka acknowledged every message and stored each
    partition's in the order they were written.

    Raises:
        BrokerUnavailableError: the broker cannot be reached, the topic did not appear in time, or (close)
            a message was not acknowledged.
        ConfigError: the topic exists with fewer partitions than the stream needs.
        ProduceOrderError: (close) a partition holds its messages in another order
            (:mod:`ticdc_delta.produce_order`).
    """

    def __init__(self, bootstrap_servers: str, topic: str, partitions: int, *, timeout_s: float = 30.0,
                 producer_config: dict[str, Any] | None = None) -> None:
        from confluent_kafka import KafkaException, Producer
        from confluent_kafka.admin import AdminClient, NewTopic

        from ..produce_order import ProduceLedger

        self.topic = topic
        self.timeout_s = timeout_s
        self._ledger = ProduceLedger(topic)  # where Kafka stored each message: checked at close()
        self.sent = 0
        admin = AdminClient({"bootstrap.servers": bootstrap_servers})
        try:
            metadata = admin.list_topics(timeout=timeout_s)
        except KafkaException as exc:
            raise BrokerUnavailableError(f"cannot reach Kafka at {bootstrap_servers}: {exc}") from exc
        existing = metadata.topics.get(topic)
        if existing is None or existing.error is not None:
            futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
            try:
                futures[topic].result(timeout=timeout_s)
            except KafkaException as exc:
                # another process may have created it meanwhile; the check below decides
                if "already exists" not in str(exc).lower() and "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise BrokerUnavailableError(f"cannot create topic {topic!r}: {exc}") from exc
            self._wait_for_partitions(admin, partitions)
        elif len(existing.partitions) < partitions:
            raise ConfigError(
                f"topic {topic!r} has {len(existing.partitions)} partitions, the stream needs {partitions}"
            )
        conf: dict[str, Any] = {
            "bootstrap.servers": bootstrap_servers,
            "acks": "all",
            # each partition's order is the stream's meaning: an idempotent producer keeps it (and stores
            # each message once) when a request is retried, e.g. to a partition of a just-created topic
            # whose leader is not serving yet; one request in flight alone did not (see produce_order)
            "enable.idempotence": True,
            "linger.ms": 5,
            **(producer_config or {}),
        }
        self._producer = Producer(conf)

    def _wait_for_partitions(self, admin: Any, partitions: int) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            topic = admin.list_topics(timeout=max(0.5, deadline - time.monotonic())).topics.get(self.topic)
            if topic is not None and topic.error is None and len(topic.partitions) >= partitions:
                return
            if time.monotonic() >= deadline:
                raise BrokerUnavailableError(
                    f"topic {self.topic!r} did not show {partitions} partitions within {self.timeout_s:.0f} s"
                )
            time.sleep(0.05)

    def write(self, partition: int, key: bytes | None, value: bytes | None) -> None:
        on_delivery = self._ledger.expect(partition)
        while True:
            try:
                self._producer.produce(self.topic, key=key, value=value, partition=partition,
                                       on_delivery=on_delivery)
                break
            except BufferError:  # local queue full: let deliveries drain
                self._producer.poll(0.1)
        self.sent += 1
        self._producer.poll(0)

    def close(self) -> None:
        remaining = self._producer.flush(self.timeout_s)
        errors, delivered = self._ledger.errors, self._ledger.delivered
        if errors:
            raise BrokerUnavailableError(
                f"{len(errors)} of {self.sent} messages to {self.topic!r} failed; first: {errors[0]}"
            )
        if remaining or delivered != self.sent:
            raise BrokerUnavailableError(
                f"only {delivered} of {self.sent} messages to {self.topic!r} were acknowledged "
                f"within {self.timeout_s:.0f} s"
            )
        self._ledger.check()
