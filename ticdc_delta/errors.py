"""Typed errors of ticdc-delta.

Every error is one failure kind, says what was expected and what came, and pickles (decoders run on
Spark executors and their errors travel back to the driver). Each class is either *transient* (worth
retrying: the broker is unreachable, a concurrent commit won) or *terminal* (retrying cannot help: bad
configuration, a message that cannot be decoded, a DDL refused by a ``fail`` policy). The job's exit code
follows that split (see :mod:`ticdc_delta.cli`).
"""

from __future__ import annotations

import re
import reprlib
from typing import Any

__all__ = [
    "preview",
    "TicdcDeltaError",
    "TransientError",
    "TerminalError",
    "DecodeError",
    "FramingError",
    "TruncatedMessageError",
    "UnsupportedVersionError",
    "SchemaNotFoundError",
    "UnknownSchemaIdError",
    "SchemaRegistryUnavailableError",
    "CompressionError",
    "LargeMessageError",
    "HandleKeyOnlyError",
    "ClaimCheckError",
    "ClaimCheckUnavailableError",
    "UpstreamRowError",
    "UpstreamUnavailableError",
    "EncodeError",
    "ConfigError",
    "BrokerUnavailableError",
    "KafkaDataLossError",
    "ProduceOrderError",
    "ConcurrentCommitError",
    "DDLPolicyError",
    "SinkError",
    "StorageUnavailableError",
    "StoppedBySignal",
    "one_line",
    "UnwritableValueError",
    "IdentifierError",
    "ImplausibleTimestampError",
    "CheckpointMismatchError",
    "ConcurrentJobError",
    "SnapshotFormatError",
    "SnapshotConflictError",
]


PREVIEW_LIMIT = 200
"""How many characters (or bytes) of an offending value an error message quotes."""

_containers = reprlib.Repr()
_containers.maxlevel = 3
_containers.maxdict = _containers.maxlist = _containers.maxtuple = _containers.maxset = 8
_containers.maxstring = _containers.maxother = 60


def preview(value: Any, limit: int = PREVIEW_LIMIT) -> str:
    """``repr(value)`` for an error message: at most about ``limit`` characters, never raising.

    A long string or bytes value is cut after ``limit`` characters (bytes) and says how long it was
    (``'aaa…'… (10485760 bytes)``); a nested list or dict is shown a few levels and items deep (a
    message nested 100,000 levels deep would make ``repr`` raise RecursionError). The dead-letter
    table keeps the full bytes; errors only point at them.
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        if len(data) <= limit:
            return repr(data)
        return f"{data[:limit]!r}… ({len(data)} bytes)"
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        size = len(value.encode("utf-8", "surrogatepass"))
        return f"{value[:limit]!r}… ({size} bytes)"
    try:
        text = _containers.repr(value)
    except Exception:  # noqa: BLE001 - a value whose repr fails still gets a message
        text = f"<{type(value).__name__}>"
    if len(text) > limit:
        text = f"{text[:limit]}… ({type(value).__name__})"
    return text


def _capped(text: str, limit: int = 4 * PREVIEW_LIMIT) -> str:
    """An error reason cut to ``limit`` characters (what a decoder wrote stays readable in one line)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"


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
        self.reason = _capped(str(reason))
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


class CompressionError(DecodeError):
    """A value that does not decompress with the changefeed's ``large-message-handle-compression``."""


class LargeMessageError(DecodeError):
    """A TiCDC large-message reference (``large-message-handle-option``) whose full row is not in Kafka.

    Never applied as a row: it goes to the dead-letter table, or stops the job under
    ``dead_letter.fail_on_error``.
    """


class HandleKeyOnlyError(LargeMessageError):
    """A ``handle-key-only`` message: only the handle key of a row too large for Kafka was sent; the rest
    of the row exists only in the upstream TiDB, and no ``source.upstream`` is configured to read it."""


class ClaimCheckError(LargeMessageError):
    """A ``claim-check`` message whose stored row could not be read: no ``claim-check-storage-uri``
    configured, the object is missing or unreadable, or it is not a valid claim-check message."""


class ClaimCheckUnavailableError(TransientError):
    """The claim-check storage failed on every bounded attempt (network, permissions, throttling): the
    object may well be there, so the batch is retried rather than its message dead-lettered."""


class UpstreamRowError(HandleKeyOnlyError):
    """A handle-key-only row that the upstream (``source.upstream``) could not complete: no row with that
    handle key at the commit ts (deleted since, or the snapshot is past TiDB's GC safe point), more than
    one, or a server error for the query. Goes to the dead-letter table like every decode error."""


class UpstreamUnavailableError(TransientError):
    """The upstream database (``source.upstream``) could not be reached or dropped the connection on every
    bounded attempt: the row may well be there, so the batch is retried rather than dead-lettered."""


class EncodeError(TerminalError):
    """An event that the chosen protocol cannot carry (e.g. a DDL in Avro)."""


class ConfigError(TerminalError):
    """Invalid configuration; the message names the YAML path of the bad value."""


class UnknownSchemaIdError(ConfigError):
    """An Avro message, well framed, whose schema id the job's schemas do not hold: not among
    ``source.avro_schemas``, or not registered under the topic's subjects of ``source.schema_registry``
    (soft-deleted versions included). Not a dead letter: the message is fine, its schema is missing, and
    every message of that schema would be lost; the job stops, naming the id and the message's
    coordinates (topic, partition, offset) and what to add. Raised on the executors."""


class SchemaRegistryUnavailableError(TransientError):
    """The Schema Registry (``source.schema_registry``) could not be reached or answered with a server
    error; or an Avro message's schema id is not among the schemas the job holds while the registry could
    not be listed for the batch (it may well know the id). The batch is retried, no message is
    dead-lettered."""


class BrokerUnavailableError(TransientError):
    """Kafka could not be reached or did not answer in time."""


class KafkaDataLossError(TerminalError):
    """Offsets the query needs are gone from Kafka (retention, truncation) and failOnDataLoss is on."""


class ProduceOrderError(TerminalError):
    """Kafka stored a partition's messages in another order than they were produced (a producer's
    retried request): the topic does not hold the stream that was sent."""


class ConcurrentCommitError(TransientError):
    """Another writer committed to the same Delta table first."""


class DDLPolicyError(TerminalError):
    """A DDL that the configured policy refuses (``fail``), named with its commit ts."""


class SinkError(TerminalError):
    """Writing to the Delta sink failed in a way retrying cannot fix."""


class TableMissingError(TerminalError):
    """A table the changefeed has written is not where the config puts it (deleted, moved, or the config's
    location changed): starting it over there would leave out every change before."""


class StoppedBySignal(TicdcDeltaError):
    """The run was asked to stop (SIGTERM, SIGINT) and did, after the micro-batch in flight; the next start
    resumes from the last committed batch. Exit code ``128 + signal`` (143 for SIGTERM, 130 for SIGINT), as
    for a process the signal ended."""

    def __init__(self, signum: int, batches: int, detail: str | None = None) -> None:
        import signal

        self.signum = signum
        self.batches = batches
        self.exit_code = 128 + signum
        try:
            self.signal_name = signal.Signals(signum).name
        except ValueError:
            self.signal_name = f"signal {signum}"
        super().__init__(
            f"stopped by {self.signal_name}: {detail}" if detail else
            f"stopped by {self.signal_name} after {batches} micro-batch(es) committed by this run; the next "
            "start resumes from the last committed batch")


class StorageUnavailableError(TransientError):
    """The storage of the Delta tables or of the job state (an object store, a file system) could not be
    reached or answered with a server error: connection refused or reset, a timeout, a DNS failure, HTTP 5xx
    or 429 (throttling: ``SlowDown``, ``ServiceUnavailable``). The same work may succeed later; names the
    location and what the storage said. Access denied, a missing bucket or an invalid request stay a
    :class:`SinkError`."""


class UnwritableValueError(SinkError):
    """Row changes carry values no Delta column can hold (a DATE ``2024-13-45``, a DECIMAL beyond its
    precision) and ``dead_letter.fail_on_error`` is set; names each change's coordinates (topic,
    partition, offset), table, column and value. Raised before anything of the batch is committed."""


class IdentifierError(SinkError):
    """A schema or table name no Delta location can hold (empty, NUL, too long once encoded), or a
    location that is not inside its root; names the table and what is wrong."""


class ImplausibleTimestampError(TerminalError):
    """A resolved ts or commit ts implausibly far in the future (forged or corrupt), with
    ``dead_letter.fail_on_error`` set; names the ts, its physical time and the bound."""


class CheckpointMismatchError(TerminalError):
    """The job state (``{checkpoint}/state``) and Spark's checkpoint (``{checkpoint}/spark``) do not
    belong together: one was deleted, replaced or restored alone. Says what was found and how to recover."""


class ConcurrentJobError(TerminalError):
    """Another job wrote the same checkpoint's state while this one ran (two jobs on one checkpoint)."""


class SnapshotFormatError(TerminalError):
    """A file of a snapshot export (Dumpling's ``metadata``, a schema file, a data file) that is missing,
    truncated or not in the format it claims; names the file and what was expected and what came.
    Raised before the table it belongs to is committed: no half-loaded table becomes visible."""


class SnapshotConflictError(TerminalError):
    """A snapshot that must not be loaded or streamed past as things are: the stream already applied
    changes of a table after the snapshot's TSO, a newer snapshot is loaded, or a load was interrupted
    (re-run the ``snapshot`` command). Says which table and TSOs, and the way out."""


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_BACKTRACE = re.compile(r"\n\s*(?:stack backtrace:|0: ).*", re.DOTALL)


def one_line(text: object) -> str:
    """An error text (a delta-rs message: several lines, ANSI colours, its causes each on a line of its own
    behind ``↳``, with ``RUST_BACKTRACE`` set a Rust backtrace after it) as one plain line: colours and the
    backtrace removed, the causes joined with ``: `` (the separator delta-rs turned into line breaks),
    whitespace runs collapsed."""
    plain = _BACKTRACE.sub("", _ANSI_ESCAPE.sub("", str(text)).replace("\x1b", ""))
    parts = (" ".join(line.replace("↳", " ").split()) for line in plain.splitlines())
    return ": ".join(part for part in parts if part)
