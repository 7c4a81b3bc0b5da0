"""``ticdc-kafka``: a Kafka source for Spark Structured Streaming written with the Python Data Source API.

Spark's own Kafka source lives in the ``spark-sql-kafka`` jar, which needs Maven to install. This source
reads with confluent-kafka (librdkafka) instead and produces the same columns::

    topic string, partition int, offset long, key binary, value binary, timestamp timestamp

Options (Spark lower-cases option names, so any capitalisation works):

``kafka.bootstrap.servers`` (required)
    ``host:port[,host:port...]``.
``subscribe`` (required)
    Comma-separated topic names. Partitions that appear later (a topic created or grown after the query
    started) are read from their earliest offset.
``startingOffsets`` (default ``latest``)
    ``earliest``, ``latest`` or JSON ``{"topic": {"0": 23, "1": -2}}`` with ``-2`` = earliest and
    ``-1`` = latest, as in Spark's Kafka source. Partitions of a subscribed topic that the JSON does not
    name start at earliest. Only used when the checkpoint has no offsets yet.
``maxOffsetsPerTrigger``
    At most this many offsets per micro-batch, across all partitions, shared max-min fairly (every
    partition gets an equal share; what a partition cannot use goes to the others).
``pollTimeoutMs`` / ``kafkaConsumer.pollTimeoutMs`` (default 120000)
    How long an executor waits for the broker without progress before failing the task.
``metadataTimeoutMs`` (default 30000)
    How long the driver waits for topic metadata and watermarks.
``failOnDataLoss`` (default ``true``)
    Fail when offsets the query needs were deleted (retention) or the broker's log shrank; with
    ``false`` the missing offsets are skipped. A log that ends below a planned range is only called
    lost after ``pollTimeoutMs`` without data (a new leader's high watermark can lag for a moment).
``arrowBatchRows`` (default 10000)
    Rows per Arrow record batch handed from the reader to Spark.
``commitGroupId``
    When set, the end offsets of every finished micro-batch are also committed to this Kafka consumer
    group (best effort), so standard lag tools see the job. The checkpoint stays the source of truth.
``kafka.*``
    Every other ``kafka.``-prefixed option is handed to librdkafka without the prefix (SASL, SSL, client
    id, ...). Secret values never appear in messages, logs or reprs (:func:`redact`).

How offsets flow. Offsets are JSON dicts ``{topic: {partition: next_offset}}``. The Python API of Spark
4.0 has no admission control (``latestOffset()`` gets no start offset), so the reader remembers where
the next batch starts: the ``end`` of the last ``partitions(start, end)`` call. When a query restarts
from a checkpoint, Spark's ``PythonMicroBatchStream.setLatestSeenOffset`` calls
``partitions(last, last)`` with the last offsets in the checkpoint's offset log before anything else
(observed on 4.0.1: ``partitions(X, X)``, then the re-run of an uncommitted batch, then
``latestOffset()``), which is what makes ``maxOffsetsPerTrigger`` exact after a restart.

``trigger(availableNow=True)`` is ignored for Python sources in Spark 4.0; to run until caught up use
``query.processAllAvailable()`` and then ``query.stop()``.

The offset JSON has the shape Spark's own Kafka source writes (``{"topic":{"0":23}}``), so a checkpoint
should be portable between ``reader="python"`` and ``reader="spark"`` of :func:`read_kafka_stream`
(not tested here: the spark-sql-kafka jar is not installed).
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ticdc_delta.errors import BrokerUnavailableError, ConfigError, KafkaDataLossError, TicdcDeltaError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "SOURCE_NAME",
    "SCHEMA",
    "EARLIEST",
    "LATEST",
    "KafkaDataLossError",
    "KafkaDataSource",
    "KafkaStreamReader",
    "KafkaInputPartition",
    "SourceOptions",
    "parse_options",
    "redact",
    "plan_end_offsets",
    "probe_brokers",
    "commit_consumer_group_offsets",
    "read_kafka_stream",
    "to_java_client_conf",
    "unwrap_source_error",
]

log = logging.getLogger(__name__)

SOURCE_NAME = "ticdc-kafka"

#: The columns of both readers (the Spark ``kafka`` source has them too, plus ``timestampType``).
SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("timestamp", TimestampType()),
    ]
)
_ARROW_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)

#: Offset sentinels in ``startingOffsets`` JSON, as in Spark's Kafka source.
EARLIEST = -2
LATEST = -1

_DEFAULT_POLL_TIMEOUT_MS = 120_000
_DEFAULT_METADATA_TIMEOUT_MS = 30_000
_DEFAULT_ARROW_BATCH_ROWS = 10_000
_DEFAULT_GROUP_ID = "ticdc-delta-source"

#: librdkafka settings the source owns; a user value would break offset tracking.
_RESERVED_CLIENT_KEYS = frozenset({"enable.auto.commit", "auto.offset.reset", "enable.partition.eof"})

#: Option names (lower-case, as Spark hands them over) other than ``kafka.*``.
_KNOWN_OPTIONS = frozenset(
    {
        "subscribe",
        "startingoffsets",
        "maxoffsetspertrigger",
        "polltimeoutms",
        "kafkaconsumer.polltimeoutms",
        "metadatatimeoutms",
        "failondataloss",
        "commitgroupid",
        "arrowbatchrows",
    }
)

# -- secrets -------------------------------------------------------------------------------------

#: Config keys whose values are secret: librdkafka's (sasl.password, ssl.key.password, ssl.key.pem,
#: sasl.oauthbearer.client.secret, sasl.oauthbearer.config, ...) and the Java client's (sasl.jaas.config,
#: ssl.truststore.password, ...). Spark's own ``spark.redaction.regex`` default is the core of it.
_SECRET_KEY = re.compile(
    r"(?i)password|passphrase|secret|token|jaas|credential|private|key\.pem|keystore\.key|access[._]?key"
    r"|oauthbearer\.config"
)
REDACTED = "*****"


def redact(conf: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``conf`` with the value of every secret-looking key replaced by ``*****``.

    Works on librdkafka settings, Java client settings and ``kafka.``-prefixed Spark options alike.
    """
    return {key: (REDACTED if _SECRET_KEY.search(str(key)) else value) for key, value in conf.items()}


def _scrub(text: str, conf: Mapping[str, Any]) -> str:
    """``text`` with every secret value of ``conf`` masked (librdkafka may echo a bad value back)."""
    for key, value in conf.items():
        if _SECRET_KEY.search(str(key)) and isinstance(value, str) and len(value) >= 3:
            text = text.replace(value, REDACTED)
    return text


# -- options -------------------------------------------------------------------------------------

TopicPartitionKey = tuple[str, int]
StartingOffsets = Literal["earliest", "latest"] | dict[str, dict[int, int]]


@dataclass(frozen=True)
class SourceOptions:
    """The validated options of one ``ticdc-kafka`` source."""

    bootstrap_servers: str
    topics: tuple[str, ...]
    starting_offsets: StartingOffsets = "latest"
    max_offsets_per_trigger: int | None = None
    poll_timeout_ms: int = _DEFAULT_POLL_TIMEOUT_MS
    metadata_timeout_ms: int = _DEFAULT_METADATA_TIMEOUT_MS
    fail_on_data_loss: bool = True
    commit_group_id: str | None = None
    arrow_batch_rows: int = _DEFAULT_ARROW_BATCH_ROWS
    client_conf: dict[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        return (
            f"SourceOptions(bootstrap_servers={self.bootstrap_servers!r}, topics={self.topics!r}, "
            f"starting_offsets={self.starting_offsets!r}, "
            f"max_offsets_per_trigger={self.max_offsets_per_trigger!r}, "
            f"fail_on_data_loss={self.fail_on_data_loss!r}, client_conf={redact(self.client_conf)!r})"
        )

    def consumer_conf(self, **overrides: Any) -> dict[str, Any]:
        """librdkafka settings for a consumer of this source (never joins a group: ``assign`` only)."""
        conf: dict[str, Any] = {"group.id": _DEFAULT_GROUP_ID, **self.client_conf}
        conf.update(
            {
                "bootstrap.servers": self.bootstrap_servers,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                # failOnDataLoss: an out-of-range start must surface as an error instead of a silent jump
                "auto.offset.reset": "error" if self.fail_on_data_loss else "earliest",
            }
        )
        conf.update(overrides)
        return conf


def _positive_int(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ConfigError(f"option {name}: expected a positive integer, got {raw!r}") from None
    if value <= 0:
        raise ConfigError(f"option {name}: expected a positive integer, got {value}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ConfigError(f"option {name}: expected true or false, got {raw!r}")


def _parse_starting_offsets(raw: str, topics: Sequence[str]) -> StartingOffsets:
    text = raw.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()  # type: ignore[return-value]
    try:
        parsed = json.loads(text)
    except ValueError:
        raise ConfigError(
            f'option startingOffsets: expected earliest, latest or JSON like {{"topic": {{"0": 23}}}}, '
            f"got {raw!r}"
        ) from None
    if not isinstance(parsed, dict):
        raise ConfigError(f"option startingOffsets: JSON must be an object of topics, got {raw!r}")
    result: dict[str, dict[int, int]] = {}
    for topic, parts in parsed.items():
        if topic not in topics:
            raise ConfigError(
                f"option startingOffsets: topic {topic!r} is not in subscribe ({', '.join(topics)})"
            )
        if not isinstance(parts, dict):
            raise ConfigError(f"option startingOffsets: {topic!r} must map partitions to offsets")
        result[topic] = {}
        for part, offset in parts.items():
            try:
                p = int(part)
            except ValueError:
                raise ConfigError(
                    f"option startingOffsets: partition {part!r} of {topic!r} is not a number"
                ) from None
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST or p < 0:
                raise ConfigError(
                    f"option startingOffsets: {topic}[{part}] must be an offset >= 0, -1 (latest) or "
                    f"-2 (earliest), got {offset!r}"
                )
            result[topic][p] = offset
    return result


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate the source's options (see the module docstring) into :class:`SourceOptions`.

    Raises:
        ConfigError: a required option is missing, a value is malformed, an option is unknown, or a
            ``kafka.*`` setting the source manages itself is given.
    """
    opts = {str(k).lower(): v for k, v in options.items()}
    servers = str(opts.get("kafka.bootstrap.servers") or "").strip()
    if not servers:
        raise ConfigError("option kafka.bootstrap.servers is required (host:port[,host:port...])")
    topics = tuple(t.strip() for t in str(opts.get("subscribe") or "").split(",") if t.strip())
    if not topics:
        raise ConfigError("option subscribe is required: comma-separated topic names")
    unknown = sorted(k for k in opts if not k.startswith("kafka.") and k not in _KNOWN_OPTIONS)
    if unknown:
        raise ConfigError(
            f"unknown option(s) {', '.join(unknown)} for the {SOURCE_NAME} source; known: "
            f"kafka.*, {', '.join(sorted(_KNOWN_OPTIONS))}"
        )
    client_conf = {k[len("kafka.") :]: v for k, v in opts.items() if k.startswith("kafka.")}
    client_conf.pop("bootstrap.servers", None)
    reserved = sorted(_RESERVED_CLIENT_KEYS & client_conf.keys())
    if reserved:
        raise ConfigError(
            f"option(s) {', '.join('kafka.' + k for k in reserved)} are managed by the source and "
            "cannot be set (use startingOffsets / failOnDataLoss)"
        )
    poll = _positive_int(opts, "polltimeoutms", None) or _positive_int(
        opts, "kafkaconsumer.polltimeoutms", _DEFAULT_POLL_TIMEOUT_MS
    )
    commit_group = opts.get("commitgroupid")
    return SourceOptions(
        bootstrap_servers=servers,
        topics=topics,
        starting_offsets=_parse_starting_offsets(str(opts.get("startingoffsets") or "latest"), topics),
        max_offsets_per_trigger=_positive_int(opts, "maxoffsetspertrigger", None),
        poll_timeout_ms=int(poll or _DEFAULT_POLL_TIMEOUT_MS),
        metadata_timeout_ms=int(
            _positive_int(opts, "metadatatimeoutms", _DEFAULT_METADATA_TIMEOUT_MS)
            or _DEFAULT_METADATA_TIMEOUT_MS
        ),
        fail_on_data_loss=_bool(opts, "failondataloss", True),
        commit_group_id=str(commit_group).strip() if commit_group else None,
        arrow_batch_rows=int(
            _positive_int(opts, "arrowbatchrows", _DEFAULT_ARROW_BATCH_ROWS) or _DEFAULT_ARROW_BATCH_ROWS
        ),
        client_conf={k: str(v) for k, v in client_conf.items()},
    )


# -- offsets -------------------------------------------------------------------------------------


def _to_json(offsets: Mapping[TopicPartitionKey, int]) -> dict[str, dict[str, int]]:
    """``{(topic, p): o}`` as the JSON-able offset dict, keys sorted so equal offsets serialise equally.

    Spark compares offsets by their JSON text, so a different key order would look like new data.
    """
    out: dict[str, dict[str, int]] = {}
    for topic, partition in sorted(offsets):
        out.setdefault(topic, {})[str(partition)] = int(offsets[(topic, partition)])
    return out


def _from_json(offsets: Any, what: str) -> dict[TopicPartitionKey, int]:
    """The JSON-able offset dict back as ``{(topic, p): o}``.

    Raises:
        ConfigError: the dict is not an offset of this source (e.g. a checkpoint of another source).
    """
    if not isinstance(offsets, Mapping):
        raise ConfigError(f"{what} offsets {offsets!r} are not a {SOURCE_NAME} offset (a JSON object)")
    out: dict[TopicPartitionKey, int] = {}
    try:
        for topic, parts in offsets.items():
            for part, offset in parts.items():
                if isinstance(offset, bool) or not isinstance(offset, int):
                    raise TypeError(offset)
                out[(str(topic), int(part))] = offset
    except (AttributeError, TypeError, ValueError):
        raise ConfigError(
            f"{what} offsets {offsets!r} are not a {SOURCE_NAME} offset "
            '({"topic": {"partition": offset}}); is the checkpoint from another source?'
        ) from None
    return out


def plan_end_offsets(
    start: Mapping[TopicPartitionKey, int],
    latest: Mapping[TopicPartitionKey, int],
    limit: int | None,
) -> dict[TopicPartitionKey, int]:
    """The end offsets of the next micro-batch: ``latest``, or at most ``limit`` offsets past ``start``.

    The limit is shared max-min fairly: each partition with data gets an equal share, and what a
    partition cannot use (it has fewer offsets waiting) is handed to the others. Deterministic: the
    remainder of an uneven split goes to the partitions in (topic, partition) order. A partition missing
    from ``start`` starts at 0. The end never falls below the start.
    """
    ends = {tp: max(int(latest[tp]), int(start.get(tp, 0))) for tp in latest}
    for tp, offset in start.items():
        ends.setdefault(tp, int(offset))  # a partition that vanished keeps its position
    if limit is None:
        return ends
    avail = {tp: ends[tp] - start.get(tp, 0) for tp in sorted(latest) if ends[tp] > start.get(tp, 0)}
    if sum(avail.values()) <= limit:
        return ends
    grant = {tp: 0 for tp in avail}
    budget = limit
    waiting = sorted(avail, key=lambda tp: (avail[tp], tp))
    while waiting and budget > 0:
        share, extra = divmod(budget, len(waiting))
        smallest = waiting[0]
        if avail[smallest] - grant[smallest] <= share:
            # the smallest demand fits in a fair share: satisfy it completely, re-split the rest
            take = avail[smallest] - grant[smallest]
            grant[smallest] += take
            budget -= take
            waiting.pop(0)
            continue
        # every remaining partition wants more than its share: give the share, remainder in tp order
        for i, tp in enumerate(sorted(waiting)):
            grant[tp] += share + (1 if i < extra else 0)
        budget = 0
    return {tp: (start.get(tp, 0) + grant[tp] if tp in grant else ends[tp]) for tp in ends}


# -- the data source -----------------------------------------------------------------------------


class KafkaInputPartition(InputPartition):
    """One Spark task: offsets ``[start, end)`` of one topic partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end

    def __repr__(self) -> str:
        return f"KafkaInputPartition({self.topic}[{self.partition}] {self.start}..{self.end})"


class KafkaDataSource(DataSource):
    """Spark data source ``ticdc-kafka``.

    Register it with :func:`ticdc_delta.spark.session.register_sources` (``get_or_create_spark`` does).
    """

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return SCHEMA

    def streamReader(self, schema: StructType) -> "KafkaStreamReader":
        """The micro-batch reader.

        Raises:
            ConfigError: the options are invalid.
        """
        return KafkaStreamReader(parse_options(self.options))

    def __repr__(self) -> str:
        return f"KafkaDataSource({redact(dict(self.options))!r})"


def _new_consumer(opts: SourceOptions, **overrides: Any) -> Consumer:
    """A librdkafka consumer for ``opts``.

    Raises:
        ConfigError: librdkafka rejects a client setting (the message names it; values are scrubbed).
    """
    try:
        return Consumer(opts.consumer_conf(**overrides))
    except KafkaException as exc:
        reason = _scrub(str(exc.args[0]), opts.client_conf)
        raise ConfigError(f"invalid Kafka client settings for {opts.bootstrap_servers}: {reason}") from None


def _kafka_failure(exc: BaseException, doing: str, opts: SourceOptions) -> TicdcDeltaError:
    """The typed error for a librdkafka failure while ``doing`` something; secrets scrubbed."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
    text = _scrub(str(err), opts.client_conf)
    if isinstance(err, KafkaError) and err.code() in (
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError._AUTHENTICATION,
        KafkaError._INVALID_ARG,
    ):
        return ConfigError(f"Kafka at {opts.bootstrap_servers} refused {doing}: {text}")
    return BrokerUnavailableError(f"Kafka at {opts.bootstrap_servers} is unavailable while {doing}: {text}")


class KafkaStreamReader(DataSourceStreamReader):
    """Micro-batch reader: plans offset ranges on the driver, reads them with librdkafka on executors.

    One instance lives in Spark's streaming-source runner process for the whole query (offsets,
    planning); Spark pickles another one to the executors for :meth:`read`, so no client is opened in
    ``__init__`` and none is pickled.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._client: Consumer | None = None
        self._client_error: str | None = None
        self._initial: dict[TopicPartitionKey, int] | None = None
        self._next_start: dict[TopicPartitionKey, int] | None = None

    def __repr__(self) -> str:
        return f"KafkaStreamReader({self.options!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None
        return state

    # -- driver side -----------------------------------------------------------------------------

    def _metadata_client(self) -> Consumer:
        if self._client is None:

            def on_error(err: KafkaError) -> None:
                self._client_error = _scrub(str(err), self.options.client_conf)

            self._client = _new_consumer(self.options, error_cb=on_error)
        return self._client

    def _watermarks(self) -> dict[TopicPartitionKey, tuple[int, int]]:
        """``{(topic, p): (low, high)}`` for every partition of the subscribed topics that exists now.

        Raises:
            BrokerUnavailableError: the broker did not answer within metadataTimeoutMs.
            ConfigError: the broker refused (authentication, authorization).
        """
        client = self._metadata_client()
        timeout = self.options.metadata_timeout_ms / 1000.0
        deadline = time.monotonic() + timeout
        try:
            metadata = client.list_topics(timeout=timeout)
        except KafkaException as exc:
            raise self._failure(exc, "fetching topic metadata") from None
        out: dict[TopicPartitionKey, tuple[int, int]] = {}
        for topic in self.options.topics:
            meta = metadata.topics.get(topic)
            if meta is None:
                continue  # not created yet: its partitions are new partitions when they appear
            if meta.error is not None:
                if meta.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    continue
                raise self._failure(KafkaException(meta.error), f"fetching metadata of topic {topic!r}")
            for partition in sorted(meta.partitions):
                try:
                    low, high = client.get_watermark_offsets(
                        TopicPartition(topic, partition),
                        timeout=max(0.5, deadline - time.monotonic()),
                        cached=False,
                    )
                except KafkaException as exc:
                    raise self._failure(exc, f"fetching watermarks of {topic}[{partition}]") from None
                out[(topic, partition)] = (low, high)
        return out

    def _failure(self, exc: BaseException, doing: str) -> TicdcDeltaError:
        error = _kafka_failure(exc, doing, self.options)
        if self._client_error and isinstance(error, BrokerUnavailableError):
            error = BrokerUnavailableError(f"{error} (last client error: {self._client_error})")
        return error

    def _initial_offsets(self) -> dict[TopicPartitionKey, int]:
        if self._initial is None:
            marks = self._watermarks()
            spec = self.options.starting_offsets
            initial: dict[TopicPartitionKey, int] = {}
            for (topic, partition), (low, high) in marks.items():
                if spec == "earliest":
                    wanted = EARLIEST
                elif spec == "latest":
                    wanted = LATEST
                else:
                    wanted = spec.get(topic, {}).get(partition, EARLIEST)  # type: ignore[union-attr]
                if wanted == EARLIEST:
                    wanted = low
                elif wanted == LATEST:
                    wanted = high
                initial[(topic, partition)] = wanted
            self._initial = initial
        return self._initial

    def initialOffset(self) -> dict[str, dict[str, int]]:
        """Where a query without checkpointed offsets starts (resolved once, then fixed).

        Raises:
            BrokerUnavailableError: the broker did not answer.
        """
        return _to_json(self._initial_offsets())

    def latestOffset(self) -> dict[str, dict[str, int]]:
        """The end of the next micro-batch: the high watermarks, capped by maxOffsetsPerTrigger.

        Raises:
            BrokerUnavailableError: the broker did not answer.
            KafkaDataLossError: a partition's log is now shorter than offsets already planned.
        """
        start = self._next_start if self._next_start is not None else self._initial_offsets()
        marks = self._watermarks()
        latest: dict[TopicPartitionKey, int] = {}
        for tp, (_low, high) in marks.items():
            planned = start.get(tp, 0)
            if high < planned:
                reason = (
                    f"{tp[0]}[{tp[1]}] has high watermark {high} on {self.options.bootstrap_servers}, "
                    f"below offset {planned} where the query is (topic re-created or log truncated?)"
                )
                if self.options.fail_on_data_loss:
                    raise KafkaDataLossError(reason + "; set failOnDataLoss=false to go on")
                log.warning("%s; skipping (failOnDataLoss=false)", reason)
            latest[tp] = high
        return _to_json(plan_end_offsets(start, latest, self.options.max_offsets_per_trigger))

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        """One task per topic partition with offsets in ``[start, end)``.

        Also records ``end`` as where the next batch starts: Spark calls ``partitions(last, last)`` right
        after a restart from a checkpoint, which is how the reader learns the position (see module doc).

        Raises:
            ConfigError: the offsets are not of this source (checkpoint of another query).
        """
        begin = _from_json(start, "start")
        finish = _from_json(end, "end")
        self._next_start = dict(finish)
        planned: list[InputPartition] = []
        for (topic, partition), stop in sorted(finish.items()):
            first = begin.get((topic, partition), 0)  # a partition new in this batch: from the start
            if stop > first:
                planned.append(KafkaInputPartition(topic, partition, first, stop))
        return planned

    def commit(self, end: dict) -> None:
        """Spark finished every offset below ``end``; mirror it to ``commitGroupId`` if configured.

        Never fails the query: a failed group commit is logged (the checkpoint is the source of truth).
        """
        group = self.options.commit_group_id
        if not group:
            return
        try:
            commit_consumer_group_offsets(
                self.options.bootstrap_servers,
                group,
                end,
                self.options.client_conf,
                timeout_s=self.options.metadata_timeout_ms / 1000.0,
            )
        except TicdcDeltaError as exc:
            log.warning("could not commit offsets to consumer group %r: %s", group, exc)

    def stop(self) -> None:
        """Close the driver-side metadata client."""
        client, self._client = self._client, None
        if client is not None:
            client.close()

    # -- executor side ---------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The messages at offsets ``[start, end)`` of one topic partition, as Arrow record batches.

        Offsets with no message (transaction markers, compacted away) are skipped: reading stops as soon
        as the consumer's position reaches ``end``.

        Raises:
            BrokerUnavailableError: no progress for pollTimeoutMs (names the servers, never secrets).
            KafkaDataLossError: the start offset is no longer in the log and failOnDataLoss is on.
        """
        if not isinstance(partition, KafkaInputPartition):
            raise TypeError(f"expected a KafkaInputPartition, got {type(partition).__name__}")
        opts = self.options
        consumer = _new_consumer(opts)
        try:
            consumer.assign([TopicPartition(partition.topic, partition.partition, partition.start)])
            yield from _read_range(consumer, partition, opts)
        except KafkaException as exc:
            raise _kafka_failure(
                exc, f"reading {partition.topic}[{partition.partition}]", opts
            ) from None
        finally:
            consumer.close()


def _read_range(
    consumer: Consumer, part: KafkaInputPartition, opts: SourceOptions
) -> Iterator[pa.RecordBatch]:
    topic, pnum, end = part.topic, part.partition, part.end
    batch_rows = opts.arrow_batch_rows
    poll_timeout = opts.poll_timeout_ms / 1000.0
    offsets: list[int] = []
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    stamps: list[int | None] = []
    position = part.start
    log_end: int | None = None  # where the log ended, when the broker said EOF below our end
    last_progress = time.monotonic()
    consume = consumer.consume
    while position < end:
        messages = consume(num_messages=min(batch_rows, end - position), timeout=min(0.5, poll_timeout))
        if not messages:
            if time.monotonic() - last_progress > poll_timeout:
                if log_end is not None:
                    position = _log_shrank(part, position, log_end, opts)
                    break
                raise BrokerUnavailableError(
                    f"no data from Kafka at {opts.bootstrap_servers} for {poll_timeout:.1f} s while "
                    f"reading {topic}[{pnum}] offsets {part.start}..{end} (stuck at {position}); "
                    "raise pollTimeoutMs if the broker is slow"
                )
            continue
        before = position
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    # EOF carries the log end. At or past our end, the rest of the range holds no
                    # messages (transaction markers, compaction). Below it, the log is shorter than
                    # planned: keep polling (a new leader's high watermark can lag for a moment) and
                    # call it data loss only when pollTimeoutMs passes without more data.
                    if msg.offset() >= end:
                        position = end
                        break
                    if log_end != msg.offset():
                        log_end = msg.offset()
                        last_progress = time.monotonic()  # news from the broker: wait afresh
                    continue
                _raise_read_error(err, part, position, opts)
                continue  # retriable: librdkafka retries on its own, pollTimeoutMs bounds the wait
            offset = msg.offset()
            if offset >= end:
                position = end
                break
            if offset < position:
                continue  # already read (cannot happen with assign and no seek; cheap to guard)
            ts_type, ts = msg.timestamp()
            offsets.append(offset)
            keys.append(msg.key())
            values.append(msg.value())
            stamps.append(ts * 1000 if ts_type else None)
            position = offset + 1
        if position > before:
            last_progress = time.monotonic()  # only progress resets the clock, not repeated errors
        if len(offsets) >= batch_rows:
            yield _record_batch(topic, pnum, offsets, keys, values, stamps)
            offsets, keys, values, stamps = [], [], [], []
    if offsets:
        yield _record_batch(topic, pnum, offsets, keys, values, stamps)


def _raise_read_error(err: KafkaError, part: KafkaInputPartition, position: int, opts: SourceOptions) -> None:
    """Raise the typed error for a non-retriable error event while reading; return if it is retriable.

    Raises:
        KafkaDataLossError: the offsets are gone and failOnDataLoss is on.
        BrokerUnavailableError / ConfigError: a non-retriable client error.
    """
    code = err.code()
    where = f"{part.topic}[{part.partition}]"
    if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
        raise KafkaDataLossError(
            f"{where} offset {position} is out of range on {opts.bootstrap_servers} (deleted by "
            f"retention or never written; reading {part.start}..{part.end}): "
            f"{_scrub(str(err), opts.client_conf)}; set failOnDataLoss=false to skip missing offsets"
        )
    if err.retriable() or code in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN):
        return
    raise _kafka_failure(KafkaException(err), f"reading {where}", opts)


def _log_shrank(part: KafkaInputPartition, position: int, log_end: int, opts: SourceOptions) -> int:
    reason = (
        f"{part.topic}[{part.partition}] ends at {log_end} on {opts.bootstrap_servers} but offsets up to "
        f"{part.end} were planned (log truncated or topic re-created)"
    )
    if opts.fail_on_data_loss:
        raise KafkaDataLossError(reason + "; set failOnDataLoss=false to skip missing offsets")
    log.warning("%s; skipping offsets %d..%d", reason, position, part.end)
    return part.end


def _record_batch(
    topic: str,
    partition: int,
    offsets: list[int],
    keys: list[bytes | None],
    values: list[bytes | None],
    stamps: list[int | None],
) -> pa.RecordBatch:
    n = len(offsets)
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            pa.array(offsets, pa.int64()),
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.array(stamps, pa.timestamp("us", tz="UTC")),
        ],
        schema=_ARROW_SCHEMA,
    )


# -- helpers for jobs ----------------------------------------------------------------------------


def _client_options(bootstrap_servers: str, conf: dict[str, str]) -> SourceOptions:
    """Options for a one-off client (probe, group commit): servers and client settings only."""
    return SourceOptions(bootstrap_servers, (), client_conf=conf)


def probe_brokers(
    bootstrap_servers: str, client_conf: Mapping[str, Any] | None = None, *, timeout_s: float = 10.0
) -> None:
    """Check that Kafka answers a metadata request.

    Raises:
        BrokerUnavailableError: no answer within ``timeout_s`` (the message names the servers only).
        ConfigError: the broker refused the client (authentication).
    """
    opts = _client_options(bootstrap_servers, {k: str(v) for k, v in (client_conf or {}).items()})
    last: list[str] = []
    consumer = _new_consumer(opts, error_cb=lambda err: last.append(str(err)))
    try:
        consumer.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        error = _kafka_failure(exc, "probing", opts)
        if last and isinstance(error, BrokerUnavailableError):
            reason = _scrub(last[-1], opts.client_conf)
            error = BrokerUnavailableError(f"{error} (last client error: {reason})")
        raise error from None
    finally:
        consumer.close()


def commit_consumer_group_offsets(
    bootstrap_servers: str,
    group_id: str,
    end_offsets: Mapping[str, Any] | str,
    client_conf: Mapping[str, Any] | None = None,
    *,
    timeout_s: float = 30.0,
) -> None:
    """Commit ``end_offsets`` (``{topic: {partition: next_offset}}``, dict or JSON) to ``group_id``.

    So that standard lag tools (kafka-consumer-groups, Burrow, ...) see the job. The committed offset is
    the next offset to read, as Kafka defines it. The Spark checkpoint stays the source of truth.

    Raises:
        TypeError: ``group_id`` is empty or ``end_offsets`` is not offsets.
        BrokerUnavailableError: the broker did not answer or refused a partition's commit.
        ConfigError: the broker refused the client (authentication, authorization).
    """
    if not isinstance(group_id, str) or not group_id:
        raise TypeError("group_id must be a non-empty str")
    if isinstance(end_offsets, str):
        try:
            end_offsets = json.loads(end_offsets)
        except ValueError:
            raise TypeError(f"end_offsets is not JSON: {end_offsets[:100]!r}") from None
    try:
        offsets = _from_json(end_offsets, "end")
    except ConfigError as exc:
        raise TypeError(str(exc)) from None
    if not offsets:
        return
    conf = {k: str(v) for k, v in (client_conf or {}).items()}
    opts = _client_options(bootstrap_servers, conf)
    try:
        admin = AdminClient({**conf, "bootstrap.servers": bootstrap_servers})
    except KafkaException as exc:
        raise ConfigError(
            f"invalid Kafka client settings for {bootstrap_servers}: {_scrub(str(exc.args[0]), conf)}"
        ) from None
    # AdminClient rather than Consumer.commit: a synchronous consumer commit has no timeout and waits
    # for a group coordinator for as long as the broker is away.
    request = ConsumerGroupTopicPartitions(
        group_id, [TopicPartition(t, p, o) for (t, p), o in sorted(offsets.items())]
    )
    try:
        futures = admin.alter_consumer_group_offsets([request], request_timeout=timeout_s)
        result = futures[group_id].result(timeout=timeout_s + 5.0)
    except KafkaException as exc:
        raise _kafka_failure(exc, f"committing offsets of group {group_id!r}", opts) from None
    except concurrent.futures.TimeoutError:
        raise BrokerUnavailableError(
            f"Kafka at {bootstrap_servers} did not confirm the offsets of group {group_id!r} within "
            f"{timeout_s:.0f} s"
        ) from None
    failed = [tp for tp in result.topic_partitions or () if tp.error is not None]
    if failed:
        raise BrokerUnavailableError(
            f"Kafka at {bootstrap_servers} refused the offsets of group {group_id!r} for "
            + ", ".join(f"{tp.topic}[{tp.partition}]: {_scrub(str(tp.error), conf)}" for tp in failed)
        )


def _jaas_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


#: librdkafka client-certificate settings: the Java client wants one keystore instead.
_NO_JAVA_EQUIVALENT = ("ssl.certificate.location", "ssl.key.location", "ssl.key.password")


def to_java_client_conf(conf: Mapping[str, Any]) -> dict[str, str]:
    """librdkafka client settings translated to the Java client's, for Spark's built-in ``kafka`` source.

    ``sasl.username``/``sasl.password`` become ``sasl.jaas.config`` (PLAIN or SCRAM login module),
    ``sasl.mechanisms`` becomes ``sasl.mechanism``, ``ssl.ca.location`` a PEM truststore,
    ``enable.ssl.certificate.verification=false`` / ``ssl.endpoint.identification.algorithm=none`` turn off
    host name checks. Settings both clients share (``security.protocol``, ``client.id``, Java-only ones
    such as ``sasl.jaas.config``) pass unchanged.

    Raises:
        ConfigError: a setting has no Java equivalent here (client certificate files: give the Java
            client's ``ssl.keystore.*`` settings instead).
    """
    src = {str(k): str(v) for k, v in conf.items()}
    out: dict[str, str] = {}
    mechanism = (src.pop("sasl.mechanisms", None) or src.pop("sasl.mechanism", None) or "").upper()
    username = src.pop("sasl.username", None)
    password = src.pop("sasl.password", None)
    if mechanism:
        out["sasl.mechanism"] = mechanism
    if username is not None or password is not None:
        if "sasl.jaas.config" in src:
            raise ConfigError("give either sasl.username/sasl.password or sasl.jaas.config, not both")
        module = (
            "org.apache.kafka.common.security.scram.ScramLoginModule"
            if mechanism.startswith("SCRAM")
            else "org.apache.kafka.common.security.plain.PlainLoginModule"
        )
        out["sasl.jaas.config"] = (
            f"{module} required username={_jaas_quote(username or '')} "
            f"password={_jaas_quote(password or '')};"
        )
    if "security.protocol" in src:
        out["security.protocol"] = src.pop("security.protocol").upper()
    ca = src.pop("ssl.ca.location", None)
    if ca is not None:
        out["ssl.truststore.type"] = "PEM"
        out["ssl.truststore.location"] = ca
    verify = src.pop("enable.ssl.certificate.verification", None)
    algorithm = src.pop("ssl.endpoint.identification.algorithm", None)
    if (verify is not None and verify.lower() == "false") or (algorithm or "").lower() == "none":
        out["ssl.endpoint.identification.algorithm"] = ""
    elif algorithm is not None:
        out["ssl.endpoint.identification.algorithm"] = algorithm
    unmapped = sorted(k for k in _NO_JAVA_EQUIVALENT if k in src)
    if unmapped:
        raise ConfigError(
            f"librdkafka setting(s) {', '.join(unmapped)} have no direct Java client equivalent; for "
            "reader='spark' give ssl.keystore.type/ssl.keystore.location/ssl.keystore.password instead"
        )
    out.update(src)
    return out


def read_kafka_stream(
    spark: "SparkSession",
    *,
    bootstrap_servers: str,
    topics: Sequence[str],
    starting_offsets: str | Mapping[str, Mapping[str, int]] = "earliest",
    max_offsets_per_trigger: int | None = None,
    client_conf: Mapping[str, Any] | None = None,
    reader: Literal["python", "spark"] = "python",
    fail_on_data_loss: bool = True,
    poll_timeout_ms: int | None = None,
    commit_group_id: str | None = None,
    probe_timeout_s: float | None = 10.0,
) -> "DataFrame":
    """A streaming DataFrame of Kafka messages with columns ``topic, partition, offset, key, value,
    timestamp`` — from this module's Python source (``reader="python"``) or from Spark's built-in
    ``kafka`` source (``reader="spark"``, needs the spark-sql-kafka jar; ``client_conf`` is translated
    with :func:`to_java_client_conf`).

    ``client_conf`` holds librdkafka settings (SASL, SSL, ...). With ``probe_timeout_s`` set, Kafka is
    probed first, so an unreachable broker fails here with a typed error rather than later inside the
    query.

    Raises:
        TypeError: an argument has the wrong type (checked before touching the JVM).
        ValueError: ``reader`` is neither ``python`` nor ``spark``; ``commit_group_id`` with ``spark``.
        ConfigError: the options are invalid.
        BrokerUnavailableError: the probe got no answer.
    """
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    if not isinstance(spark, SparkSession):
        raise TypeError(f"spark must be a SparkSession, got {type(spark).__name__}")
    if not isinstance(bootstrap_servers, str) or not bootstrap_servers.strip():
        raise TypeError("bootstrap_servers must be a non-empty str")
    if isinstance(topics, str) or not topics or not all(isinstance(t, str) and t for t in topics):
        raise TypeError("topics must be a non-empty sequence of topic names (not a single str)")
    if reader not in ("python", "spark"):
        raise ValueError(f"reader must be 'python' or 'spark', got {reader!r}")
    if max_offsets_per_trigger is not None and (
        isinstance(max_offsets_per_trigger, bool) or not isinstance(max_offsets_per_trigger, int)
    ):
        raise TypeError("max_offsets_per_trigger must be an int or None")
    if isinstance(starting_offsets, Mapping):
        starting = json.dumps(
            {t: {str(p): int(o) for p, o in parts.items()} for t, parts in starting_offsets.items()}
        )
    elif isinstance(starting_offsets, str):
        starting = starting_offsets
    else:
        raise TypeError(
            "starting_offsets must be 'earliest', 'latest' or a {topic: {partition: offset}} mapping"
        )
    conf = {str(k): str(v) for k, v in (client_conf or {}).items()}

    options: dict[str, str] = {
        "kafka.bootstrap.servers": bootstrap_servers,
        "subscribe": ",".join(topics),
        "startingOffsets": starting,
        "failOnDataLoss": "true" if fail_on_data_loss else "false",
    }
    if max_offsets_per_trigger is not None:
        options["maxOffsetsPerTrigger"] = str(max_offsets_per_trigger)
    if poll_timeout_ms is not None:
        options["kafkaConsumer.pollTimeoutMs"] = str(int(poll_timeout_ms))
    if reader == "python" and commit_group_id:
        options["commitGroupId"] = commit_group_id
    elif commit_group_id:
        raise ValueError("commit_group_id is only supported by reader='python'")
    # eager validation, so that a bad option fails here and not inside the streaming query
    parse_options({**options, **{f"kafka.{k}": v for k, v in conf.items()}})
    if probe_timeout_s is not None:
        probe_brokers(bootstrap_servers, conf, timeout_s=probe_timeout_s)

    if reader == "python":
        from ticdc_delta.spark.session import register_sources

        register_sources(spark)
        client = conf
        fmt = SOURCE_NAME
    else:
        client = to_java_client_conf(conf)
        fmt = "kafka"
    stream = spark.readStream.format(fmt)
    for key, value in options.items():
        stream = stream.option(key, value)
    for key, value in client.items():
        stream = stream.option(f"kafka.{key}", value)
    df = stream.load()
    return df.select(*[F.col(f.name).cast(f.dataType).alias(f.name) for f in SCHEMA.fields])


_ERROR_TYPES: dict[str, type[TicdcDeltaError]] = {
    "BrokerUnavailableError": BrokerUnavailableError,
    "KafkaDataLossError": KafkaDataLossError,
    "ConfigError": ConfigError,
}
_ERROR_IN_TEXT = re.compile(r"(?:ticdc_delta\.[\w.]+\.)?(" + "|".join(_ERROR_TYPES) + r"): ([^\n]*)")


def unwrap_source_error(exc: BaseException) -> TicdcDeltaError | None:
    """The source's typed error inside a Spark exception (e.g. ``StreamingQueryException``), if any.

    Errors raised by the source run in Spark's Python worker processes and reach the driver only as
    text; this rebuilds the typed error from that text so a job can pick its exit code.
    """
    if isinstance(exc, TicdcDeltaError):
        return exc
    found = _ERROR_IN_TEXT.findall(str(exc))
    if not found:
        return None
    name, message = found[-1]
    return _ERROR_TYPES[name](message)
