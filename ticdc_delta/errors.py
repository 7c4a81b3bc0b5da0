"""Typed errors of ticdc-delta.

Every error is one failure kind, says what was expected and what came, and pickles (decoders run on
Spark executors and their errors travel back to the driver). Each class is either *transient* (worth
retrying: the broker is unreachable, a concurrent commit won) or *terminal* (retrying cannot help: bad
configuration, a message that cannot be decoded, a DDL refused by a ``fail`` policy). The job's exit code
follows that split (see :mod:`ticdc_delta.cli`).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "TicdcDeltaError",
    "TransientError",
    "TerminalError",
    "DecodeError",
    "FramingError",
    "TruncatedMessageError",
    "UnsupportedVersionError",
    "SchemaNotFoundError",
    "EncodeError",
    "ConfigError",
    "BrokerUnavailableError",
    "KafkaDataLossError",
    "ConcurrentCommitError",
    "DDLPolicyError",
    "SinkError",
]


class TicdcDeltaError(Exception):
    """Base of every error raised by ticdc-delta."""

    retryable: bool = False


class TransientError(TicdcDeltaError):
    """A failure worth retrying: the same work may succeed later."""

    retryable = True


class TerminalError(TicdcDeltaError):
    """A failure that retrying cannot fix; an operator has to act."""

    retryable = False


class DecodeError(TerminalError):
    """A Kafka message that is not valid for its protocol.

    Carries the protocol, the message's coordinates (topic, partition, offset) and what was wrong, so a
    user can find the message with any Kafka tool.
    """

    def __init__(
        self,
        protocol: str,
        reason: str,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> None:
        self.protocol = protocol
        self.reason = reason
        self.topic = topic
        self.partition = partition
        self.offset = offset
        super().__init__(self._render())

    def _render(self) -> str:
        where = ""
        if self.topic is not None or self.partition is not None or self.offset is not None:
            where = f" at {self.topic}[{self.partition}]@{self.offset}"
        return f"{self.protocol}: cannot decode message{where}: {self.reason}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.protocol, self.reason, self.topic, self.partition, self.offset))

    def with_context(self, topic: str | None, partition: int | None, offset: int | None) -> "DecodeError":
        """The same error, located at the given message coordinates."""
        return type(self)(self.protocol, self.reason, topic, partition, offset)


class FramingError(DecodeError):
    """The message's envelope is wrong: version word, length prefix, magic byte, schema id."""


class TruncatedMessageError(DecodeError):
    """The message ends before a field it announces (expected N bytes, found M)."""


class UnsupportedVersionError(DecodeError):
    """The message declares a protocol version this decoder does not know."""


class SchemaNotFoundError(DecodeError):
    """An Avro message refers to a schema id that neither the registry nor the local files know."""


class EncodeError(TerminalError):
    """An event that the chosen protocol cannot carry (e.g. a DDL in Avro)."""


class ConfigError(TerminalError):
    """Invalid configuration; the message names the YAML path of the bad value."""


class BrokerUnavailableError(TransientError):
    """Kafka could not be reached or did not answer in time."""


class KafkaDataLossError(TerminalError):
    """Offsets the query needs are gone from Kafka (retention, truncation) and failOnDataLoss is on."""


class ConcurrentCommitError(TransientError):
    """Another writer committed to the same Delta table first."""


class DDLPolicyError(TerminalError):
    """A DDL that the configured policy refuses (``fail``), named with its commit ts."""


class SinkError(TerminalError):
    """Writing to the Delta sink failed in a way retrying cannot fix."""
