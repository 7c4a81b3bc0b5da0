"""The Kafka reader of the job: Spark's own Kafka source (``spark-sql-kafka-0-10``), and what goes with it.

:func:`read_kafka_stream` builds ``spark.readStream.format("kafka")`` with ``subscribePattern`` (the topics),
``startingOffsets``, ``maxOffsetsPerTrigger``, ``failOnDataLoss`` and every client setting of the YAML
(librdkafka names, translated for the Java client by :func:`to_java_client_conf`: SASL user/password
become a JAAS config, a CA file a PEM truststore), and selects the columns the batch handler reads::

    topic string, partition int, offset long, key binary, value binary, timestamp timestamp

Offsets live in the Spark checkpoint (``{"topic": {"0": 23}}``); ``maxOffsetsPerTrigger`` splits the
limit over the partitions in proportion to what each has waiting (:func:`plan_end_offsets`). With
``trigger(availableNow=True)`` the source reads up to the offsets that were latest when the query started,
in batches of at most ``maxOffsetsPerTrigger``, then the query stops.

The jar comes from ``make`` (``.jars/spark``, see :mod:`ticdc_delta.jars`) or ``--packages``. The rest
of this module is plain librdkafka on the driver: probing the brokers before the query starts (a typed
error instead of a stack trace), and mirroring each committed batch's end offsets to a consumer group
(:class:`ConsumerGroupMirror`) so that lag tools see the job. Secrets never appear in messages or logs.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from ticdc_delta.config import is_secret_key, librdkafka_settings
from ticdc_delta.errors import (
    BrokerUnavailableError,
    ClaimCheckUnavailableError,
    ConfigError,
    KafkaDataLossError,
    SchemaRegistryUnavailableError,
    TicdcDeltaError,
    UnknownSchemaIdError,
    UpstreamUnavailableError,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "EXECUTOR_CONSUMER_DEFAULTS",
    "SCHEMA_DDL",
    "KafkaDataLossError",
    "ConsumerGroupMirror",
    "redact",
    "plan_end_offsets",
    "probe_brokers",
    "commit_consumer_group_offsets",
    "group_admin_client",
    "read_kafka_stream",
    "to_java_client_conf",
    "unwrap_source_error",
]

log = logging.getLogger(__name__)

#: The columns of :func:`read_kafka_stream` (Spark's source has them, plus ``timestampType`` and
#: ``headers``, which the job does not read).
SCHEMA_DDL = "topic string, partition int, offset long, key binary, value binary, timestamp timestamp"
_COLUMNS = ("topic", "partition", "offset", "key", "value", "timestamp")

#: Java client settings the source owns (Spark's Kafka source refuses them too).
_RESERVED_CLIENT_KEYS = frozenset(
    {
        "group.id",
        "auto.offset.reset",
        "enable.auto.commit",
        "enable.partition.eof",
        "key.deserializer",
        "value.deserializer",
        "interceptor.classes",
    }
)

TopicPartitionKey = tuple[str, int]

# -- secrets -------------------------------------------------------------------------------------

REDACTED = "*****"


def redact(conf: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``conf`` with the value of every secret-looking key (the config's own rule,
    :func:`~ticdc_delta.config.is_secret_key`) replaced by ``*****``.

    Works on librdkafka settings, Java client settings and ``kafka.``-prefixed Spark options alike.
    """
    return {key: (REDACTED if is_secret_key(key) else value) for key, value in conf.items()}


def _scrub(text: str, conf: Mapping[str, Any]) -> str:
    """``text`` with every secret value of ``conf`` masked (librdkafka may echo a bad value back)."""
    for key, value in conf.items():
        if is_secret_key(key) and isinstance(value, str) and len(value) >= 3:
            text = text.replace(value, REDACTED)
    return text


@dataclass(frozen=True)
class _ClientOptions:
    """Servers and librdkafka settings of a driver-side client (probe, group commit)."""

    bootstrap_servers: str
    client_conf: dict[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"_ClientOptions({self.bootstrap_servers!r}, {redact(self.client_conf)!r})"

    def consumer_conf(self, **overrides: Any) -> dict[str, Any]:
        """librdkafka settings for a metadata-only consumer (never joins a group)."""
        conf: dict[str, Any] = {"group.id": "ticdc-delta-probe", **self.client_conf}
        conf.update({"bootstrap.servers": self.bootstrap_servers, "enable.auto.commit": False})
        conf.update(overrides)
        return conf


def _client_options(bootstrap_servers: str, conf: dict[str, str]) -> _ClientOptions:
    return _ClientOptions(bootstrap_servers, conf)


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
        raise ConfigError(f"{what} offsets {offsets!r} are not a Kafka offset (a JSON object)")
    out: dict[TopicPartitionKey, int] = {}
    try:
        for topic, parts in offsets.items():
            for part, offset in parts.items():
                if isinstance(offset, bool) or not isinstance(offset, int):
                    raise TypeError(offset)
                out[(str(topic), int(part))] = offset
    except (AttributeError, TypeError, ValueError):
        raise ConfigError(
            f"{what} offsets {offsets!r} are not a Kafka offset "
            '({"topic": {"partition": offset}}); is the checkpoint from another source?'
        ) from None
    return out


def plan_end_offsets(
    start: Mapping[TopicPartitionKey, int],
    latest: Mapping[TopicPartitionKey, int],
    limit: int | None,
) -> dict[TopicPartitionKey, int]:
    """The end offsets of the next micro-batch as Spark's Kafka source plans them under ``maxOffsetsPerTrigger``.

    Spark's rule (``KafkaMicroBatchStream.rateLimit``): with ``total`` offsets waiting over all
    partitions, a partition with ``size`` waiting gets ``limit * size / total`` of them, rounded down, but
    at least one (rounded up below one, so no partition starves); never past its latest offset. A partition
    missing from ``start`` starts at 0. Used by tests to predict the batches of a pre-produced stream.
    """
    ends = {tp: max(int(latest[tp]), int(start.get(tp, 0))) for tp in latest}
    for tp, offset in start.items():
        ends.setdefault(tp, int(offset))  # a partition that vanished keeps its position
    if limit is None:
        return ends
    sizes = {tp: ends[tp] - start.get(tp, 0) for tp in latest if ends[tp] > start.get(tp, 0)}
    total = float(sum(sizes.values()))
    if total < 1:
        return ends
    out = dict(ends)
    for tp, size in sizes.items():
        prorate = limit * (size / total)
        take = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        out[tp] = min(ends[tp], start.get(tp, 0) + int(take))
    return out


def _new_consumer(opts: _ClientOptions, **overrides: Any) -> Consumer:
    """A librdkafka consumer for ``opts``.

    Raises:
        ConfigError: librdkafka rejects a client setting (the message names it; values are scrubbed).
    """
    try:
        return Consumer(opts.consumer_conf(**overrides))
    except KafkaException as exc:
        reason = _scrub(str(exc.args[0]), opts.client_conf)
        raise ConfigError(f"invalid Kafka client settings for {opts.bootstrap_servers}: {reason}") from None


#: A TLS failure no retry mends: the broker's certificate fails verification (librdkafka's ``_SSL`` handshake
#: errors; an OpenSSL ``certificate verify failed``), or the broker refuses the client's (a TLS alert such as
#: ``certificate required``, ``bad certificate``, ``unknown ca``). librdkafka reports a disconnect during the
#: handshake as ``SSL handshake failed: Disconnected`` with ``_TRANSPORT``: that one may pass, it stays retryable.
_TLS_REFUSED = re.compile(
    r"certificate verify failed|SSL handshake failed(?!: Disconnected)"
    r"|SSL routines::[^\n]*(?:certificate|unknown ca|handshake failure)",
    re.IGNORECASE,
)


def _kafka_failure(exc: BaseException, doing: str, opts: _ClientOptions) -> TicdcDeltaError:
    """The typed error for a librdkafka failure while ``doing`` something; secrets scrubbed.

    Terminal (:class:`ConfigError`): the broker refused the client (authentication, authorization) or the
    TLS handshake failed on a certificate. Anything else is :class:`BrokerUnavailableError` (retryable).
    """
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
    if (isinstance(err, KafkaError) and err.code() == KafkaError._SSL) or _TLS_REFUSED.search(text):
        return ConfigError(
            f"the TLS handshake with Kafka at {opts.bootstrap_servers} failed while {doing}: {text} — check "
            "the broker certificate's CA (ssl.ca.location) and host name (ssl.endpoint.identification.algorithm), "
            "and the client certificate (ssl.keystore.location) if the broker requires one"
        )
    return BrokerUnavailableError(f"Kafka at {opts.bootstrap_servers} is unavailable while {doing}: {text}")


#: How long one metadata request of :func:`probe_brokers` waits before the client's errors are looked at.
_PROBE_STEP_S = 0.5


def probe_brokers(
    bootstrap_servers: str, client_conf: Mapping[str, Any] | None = None, *, timeout_s: float = 10.0
) -> None:
    """Check that Kafka answers a metadata request.

    The metadata request fails with a bare "transport failure" whatever the cause; the cause is in the
    errors the client reports to ``error_cb``, which only ``poll`` serves. So the probe asks in steps of
    :data:`_PROBE_STEP_S`, polls after each failed step, and stops at once on a terminal one (a refused
    TLS handshake or login).

    Raises:
        BrokerUnavailableError: no answer within ``timeout_s`` (the message names the servers and the
            client's last error).
        ConfigError: the broker refused the client (authentication, a certificate that fails verification,
            a missing or refused client certificate).
    """
    opts = _client_options(bootstrap_servers, librdkafka_settings(client_conf or {}))
    reported: list[KafkaError] = []
    consumer = _new_consumer(opts, error_cb=reported.append)
    deadline = time.monotonic() + timeout_s
    looked_at = 0
    try:
        while True:
            try:
                consumer.list_topics(timeout=max(min(_PROBE_STEP_S, deadline - time.monotonic()), 0.01))
                return
            except KafkaException as exc:
                consumer.poll(0)  # serves error_cb
                failures = [_kafka_failure(exc, "probing", opts)]
                failures += [_kafka_failure(KafkaException(e), "probing", opts) for e in reported[looked_at:]]
                looked_at = len(reported)
                terminal = next((f for f in failures if isinstance(f, ConfigError)), None)
                if terminal is not None:
                    raise terminal from None
                if time.monotonic() >= deadline:
                    failure = failures[0]
                    if reported:
                        reason = _scrub(str(reported[-1]), opts.client_conf)
                        failure = BrokerUnavailableError(f"{failure} (last client error: {reason})")
                    raise failure from None
    finally:
        consumer.close()


def commit_consumer_group_offsets(
    bootstrap_servers: str,
    group_id: str,
    end_offsets: Mapping[str, Any] | str,
    client_conf: Mapping[str, Any] | None = None,
    *,
    timeout_s: float = 30.0,
    admin: AdminClient | None = None,
) -> None:
    """Commit ``end_offsets`` (``{topic: {partition: next_offset}}``, dict or JSON) to ``group_id``.

    So that standard lag tools (kafka-consumer-groups, Burrow, ...) see the job. The committed offset is
    the next offset to read, as Kafka defines it. The Spark checkpoint stays the source of truth.
    ``admin``: a client of ``bootstrap_servers`` built by :func:`group_admin_client` to commit through
    (:class:`ConsumerGroupMirror` keeps one); without it, one is built for this commit and dropped after.

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
            raise TypeError(f"end_offsets is not JSON: {str(end_offsets)[:100]!r}") from None
    try:
        offsets = _from_json(end_offsets, "end")
    except ConfigError as exc:
        raise TypeError(str(exc)) from None
    if not offsets:
        return
    conf = librdkafka_settings(client_conf or {})
    opts = _client_options(bootstrap_servers, conf)
    client = admin if admin is not None else group_admin_client(bootstrap_servers, conf)
    # AdminClient rather than Consumer.commit: a synchronous consumer commit has no timeout and waits
    # for a group coordinator for as long as the broker is away.
    request = ConsumerGroupTopicPartitions(
        group_id, [TopicPartition(t, p, o) for (t, p), o in sorted(offsets.items())]
    )
    error: TicdcDeltaError | None = None
    try:
        futures = client.alter_consumer_group_offsets([request], request_timeout=timeout_s)
        result = futures[group_id].result(timeout=timeout_s + 5.0)
    except KafkaException as exc:
        error = _kafka_failure(exc, f"committing offsets of group {group_id!r}", opts)
    except concurrent.futures.TimeoutError:
        error = BrokerUnavailableError(
            f"Kafka at {bootstrap_servers} did not confirm the offsets of group {group_id!r} within "
            f"{timeout_s:.0f} s"
        )
    finally:
        # a client of this commit alone goes now, not when a garbage collection finds it: alive, it
        # retries an absent broker and prints its connection failures to stderr after the job's own error
        del client
    if error is not None:
        raise error
    failed = [tp for tp in result.topic_partitions or () if tp.error is not None]
    if failed:
        raise BrokerUnavailableError(
            f"Kafka at {bootstrap_servers} refused the offsets of group {group_id!r} for "
            + ", ".join(f"{tp.topic}[{tp.partition}]: {_scrub(str(tp.error), conf)}" for tp in failed)
        )


def group_admin_client(bootstrap_servers: str, client_conf: Mapping[str, Any] | None = None) -> AdminClient:
    """The AdminClient :func:`commit_consumer_group_offsets` commits through.

    Raises:
        ConfigError: librdkafka refused the client settings.
    """
    conf = librdkafka_settings(client_conf or {})
    try:
        # log_level 4: no "purging unserved events" notice when the client is dropped after its answer
        return AdminClient({**conf, "bootstrap.servers": bootstrap_servers, "log_level": 4})
    except KafkaException as exc:
        raise ConfigError(
            f"invalid Kafka client settings for {bootstrap_servers}: {_scrub(str(exc.args[0]), conf)}"
        ) from None


def _jaas_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


#: librdkafka client-certificate settings: the Java client wants one keystore instead.
_NO_JAVA_EQUIVALENT = ("ssl.certificate.location", "ssl.key.location", "ssl.key.password")


def to_java_client_conf(conf: Mapping[str, Any]) -> dict[str, str]:
    """librdkafka client settings translated to the Java client's, for Spark's built-in ``kafka`` source.

    ``sasl.username``/``sasl.password`` become ``sasl.jaas.config`` (PLAIN or SCRAM login module),
    ``sasl.mechanisms`` becomes ``sasl.mechanism``, ``ssl.ca.location`` or ``ssl.ca.pem`` a PEM truststore,
    ``ssl.certificate.pem``/``ssl.key.pem`` (and ``ssl.key.password``) a PEM keystore,
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
    ca_pem = src.pop("ssl.ca.pem", None)
    if ca is not None and ca_pem is not None:
        raise ConfigError("give either ssl.ca.location or ssl.ca.pem, not both")
    if ca is not None or ca_pem is not None:
        out["ssl.truststore.type"] = "PEM"
        if ca is not None:
            out["ssl.truststore.location"] = ca
        else:
            out["ssl.truststore.certificates"] = str(ca_pem)
    cert_pem, key_pem = src.pop("ssl.certificate.pem", None), src.pop("ssl.key.pem", None)
    if cert_pem is not None or key_pem is not None:  # a client certificate as PEM text: a PEM keystore
        if cert_pem is None or key_pem is None:
            raise ConfigError("a client certificate as PEM text needs both ssl.certificate.pem and ssl.key.pem")
        if any(k.startswith("ssl.keystore.") for k in src) or any(k in src for k in ("ssl.certificate.location",
                                                                                     "ssl.key.location")):
            raise ConfigError("give the client certificate once: ssl.certificate.pem/ssl.key.pem or a keystore")
        out["ssl.keystore.type"] = "PEM"
        out["ssl.keystore.certificate.chain"] = cert_pem
        out["ssl.keystore.key"] = key_pem
        if "ssl.key.password" in src:  # the PEM key's password: the same name in both clients
            out["ssl.key.password"] = src.pop("ssl.key.password")
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
            "the Java client give ssl.keystore.type/ssl.keystore.location/ssl.keystore.password instead"
        )
    out.update(src)
    return out


def java_client_conf(conf: Mapping[str, Any]) -> dict[str, str]:
    """``source.kafka`` (librdkafka settings) as Spark's Kafka source is given them
    (:func:`to_java_client_conf`), checked: the configuration loader calls it too, before any JVM.

    Raises:
        ConfigError: a setting without a Java client equivalent, or one the source owns.
    """
    client = to_java_client_conf(conf)
    reserved = sorted(_RESERVED_CLIENT_KEYS & client.keys())
    if reserved:
        raise ConfigError(f"Kafka setting(s) {', '.join(reserved)} are managed by the source and cannot be set "
                          "(use source.starting_offsets; offsets live in the checkpoint)")
    return client


class ConsumerGroupMirror:
    """Commits the end offsets of every finished micro-batch of one query to a Kafka consumer group.

    The job calls :meth:`commit` from a streaming query listener (:func:`ticdc_delta.spark.job.run_job`),
    which Spark tells of a batch once it is in the checkpoint's commit log, and once more with the last
    progress when the query stops. Never fails the job: a failed group commit is logged, the Spark
    checkpoint stays the source of truth.

    The commits go through one AdminClient, kept while they succeed (a job on a 1-second trigger would
    otherwise open a connection to the cluster, and on a secured one do its TLS and SASL handshakes, every
    second); after a failure the next commit builds a new one, and :meth:`close` drops it when the query
    has stopped.
    """

    def __init__(self, bootstrap_servers: str, group_id: str, client_conf: Mapping[str, Any] | None = None,
                 *, timeout_s: float = 30.0) -> None:
        if not isinstance(group_id, str) or not group_id:
            raise TypeError("group_id must be a non-empty str")
        self.bootstrap_servers = bootstrap_servers
        self.group_id = group_id
        self._conf = librdkafka_settings(client_conf or {})
        self._timeout_s = timeout_s
        self._committed: dict[TopicPartitionKey, int] = {}
        self._admin: AdminClient | None = None

    def __repr__(self) -> str:
        return f"ConsumerGroupMirror({self.bootstrap_servers!r}, {self.group_id!r}, {redact(self._conf)!r})"

    def commit(self, end_offsets: Mapping[TopicPartitionKey, int]) -> bool:
        """Commit ``{(topic, partition): next_offset}`` (only offsets that moved forward).

        Returns:
            Whether the broker took them (``False``: logged, the job goes on).
        """
        moved = {tp: o for tp, o in end_offsets.items() if o > self._committed.get(tp, -1)}
        if not moved:
            return True
        try:
            if self._admin is None:
                self._admin = group_admin_client(self.bootstrap_servers, self._conf)
            commit_consumer_group_offsets(
                self.bootstrap_servers, self.group_id, _to_json(moved), self._conf, timeout_s=self._timeout_s,
                admin=self._admin,
            )
        except TicdcDeltaError as exc:
            self._admin = None  # (a client that keeps retrying an absent broker is not kept)
            log.warning("could not commit offsets to consumer group %r: %s", self.group_id, exc)
            return False
        self._committed.update(moved)
        return True

    def close(self) -> None:
        """Drop the client (the next :meth:`commit` would build a new one)."""
        self._admin = None


def read_kafka_stream(
    spark: "SparkSession",
    *,
    bootstrap_servers: str,
    topics: Sequence[str],
    starting_offsets: str | Mapping[str, Mapping[str, int]] = "earliest",
    max_offsets_per_trigger: int | None = None,
    client_conf: Mapping[str, Any] | None = None,
    fail_on_data_loss: bool = True,
    probe_timeout_s: float | None = 10.0,
) -> "DataFrame":
    """A streaming DataFrame of Kafka messages from Spark's ``kafka`` source, columns :data:`SCHEMA_DDL`.

    ``client_conf`` holds librdkafka-style settings (SASL, SSL, ...), translated with
    :func:`to_java_client_conf` and passed as ``kafka.*`` options. With ``probe_timeout_s`` set, Kafka is
    probed first, so an unreachable broker fails here with a typed error rather than later inside the
    query.

    Raises:
        TypeError: an argument has the wrong type (checked before touching the JVM).
        ConfigError: a client setting cannot be translated or is managed by the source.
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
    if max_offsets_per_trigger is not None and (
        isinstance(max_offsets_per_trigger, bool)
        or not isinstance(max_offsets_per_trigger, int)
        or max_offsets_per_trigger <= 0
    ):
        raise TypeError("max_offsets_per_trigger must be a positive int or None")
    if isinstance(starting_offsets, Mapping):
        starting = json.dumps(
            {t: {str(p): int(o) for p, o in parts.items()} for t, parts in starting_offsets.items()}
        )
    elif isinstance(starting_offsets, str) and starting_offsets.strip():
        starting = starting_offsets.strip()
    else:
        raise TypeError(
            "starting_offsets must be 'earliest', 'latest' or a {topic: {partition: offset}} mapping"
        )
    conf = {str(k): str(v) for k, v in (client_conf or {}).items()}
    client = java_client_conf(conf)
    if probe_timeout_s is not None:
        probe_brokers(bootstrap_servers, conf, timeout_s=probe_timeout_s)

    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap_servers)
        .option("subscribePattern", topics_pattern(topics))
        .option("startingOffsets", starting)
        .option("failOnDataLoss", "true" if fail_on_data_loss else "false")
        .option("includeHeaders", "false")
    )
    if max_offsets_per_trigger is not None:
        stream = stream.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    for key, value in {**EXECUTOR_CONSUMER_DEFAULTS, **client}.items():
        stream = stream.option(f"kafka.{key}", value)
    df = stream.load()
    return df.select(*[F.col(c) for c in _COLUMNS])


def topics_pattern(topics: Sequence[str]) -> str:
    """The Java regex Spark's ``subscribePattern`` reads exactly ``topics`` by (it must match a whole name).
    Not ``subscribe``: Spark's source then fails on a topic that does not exist, and TiCDC creates a topic
    of a topic dispatcher only when it first writes to it; a pattern reads such a topic once it exists, from
    its start. Every character but letters, digits, ``_`` and ``-`` is escaped (a Kafka name's dot too)."""
    return "|".join(re.sub(r"[^A-Za-z0-9_-]", lambda m: "\\" + m.group(), t) for t in topics)


#: Java consumer settings of the executors' Kafka reads unless ``source.client`` sets them. Spark keeps a
#: task's consumer between micro-batches, and its prefetch of the offsets after the last batch waits on the
#: broker for ``fetch.max.wait.ms`` (Java default 500 ms) when nothing new has come: the next batch's first
#: fetch waits for it. 20 ms cut the read of a micro-batch of 4 small partitions on 2 cores from 0.9 s
#: to 0.16 s; when data is there a fetch returns at once either way (``fetch.min.bytes`` is 1). A big
#: micro-batch is read in fewer, larger fetches (4 MiB per partition, not the Java default 1 MiB) through a
#: larger socket buffer (1 MiB, not 64 KiB): Spark's raw read of 250k canal-json messages (4 partitions,
#: 2 cores, four rounds alternately) took 0.8-1.6 s against 1.1-1.8 s. A cached consumer holds at most one
#: such fetch per partition.
EXECUTOR_CONSUMER_DEFAULTS: dict[str, str] = {"fetch.max.wait.ms": "20", "max.partition.fetch.bytes": str(4 << 20),
                                              "receive.buffer.bytes": str(1 << 20)}


_ERROR_TYPES: dict[str, type[TicdcDeltaError]] = {
    "BrokerUnavailableError": BrokerUnavailableError,
    # raised on the executors by the claim-check fetch: the storage is down, not the message bad
    "ClaimCheckUnavailableError": ClaimCheckUnavailableError,
    # raised on the executors by the handle-key-only lookup (source.upstream): the database is down
    "UpstreamUnavailableError": UpstreamUnavailableError,
    "KafkaDataLossError": KafkaDataLossError,
    # raised on the executors by the Avro decoder: a schema id the job's schemas lack (terminal), or one
    # met while the schema registry could not be listed (retryable)
    "UnknownSchemaIdError": UnknownSchemaIdError,
    "SchemaRegistryUnavailableError": SchemaRegistryUnavailableError,
    "ConfigError": ConfigError,
}
_ERROR_IN_TEXT = re.compile(r"(?:ticdc_delta\.[\w.]+\.)?(" + "|".join(_ERROR_TYPES) + r"): ([^\n]*)")


#: A Kafka client exception that says the brokers are (for now) out of reach: worth a retry.
_JVM_UNAVAILABLE = re.compile(
    r"(org\.apache\.kafka\.common\.errors\.(?:TimeoutException|NetworkException|DisconnectException"
    r"|NotLeaderOrFollowerException|LeaderNotAvailableException|CoordinatorNotAvailableException"
    r"|BrokerNotAvailableException|NotCoordinatorException)|java\.util\.concurrent\.TimeoutException"
    r"|Timed out waiting for a node assignment|Cannot fetch record for offset)[^\n]*"
)
#: Spark's Kafka source refusing to go on because offsets are gone (``failOnDataLoss``).
_JVM_DATA_LOSS = re.compile(r"(\[KAFKA_DATA_LOSS[.\w]*\][^\n]*|[^\n]*Some data may have been lost[^\n]*)")
#: A checkpoint/table URI whose Hadoop filesystem is not on the class path.
_JVM_NO_FILESYSTEM = re.compile(
    r"No FileSystem for scheme \W?(\w+)|Class org\.apache\.hadoop\.fs\.(s3a)\.S3AFileSystem not found"
)
_MAX_LINE = 400


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_LINE else text[: _MAX_LINE - 3] + "..."


def unwrap_source_error(exc: BaseException) -> TicdcDeltaError | None:
    """The typed error inside a Spark exception (``StreamingQueryException``, ``Py4JJavaError``,
    ``PythonException``), if any, with a one-line message.

    In order: a ticdc-delta error raised in a Python worker (it reaches the driver only as text); Spark's
    Kafka source reporting lost offsets (:class:`KafkaDataLossError`, terminal); a URI scheme without a
    Hadoop filesystem (:class:`ConfigError` naming the jar, e.g. ``hadoop-aws`` for ``s3://``); a Kafka
    client timeout or network error (:class:`BrokerUnavailableError`, worth a retry).
    """
    if isinstance(exc, TicdcDeltaError):
        return exc
    text = str(exc)
    found = _ERROR_IN_TEXT.findall(text)
    if found:
        name, message = found[-1]
        return _ERROR_TYPES[name](message)
    loss = _JVM_DATA_LOSS.search(text)
    if loss is not None:
        return KafkaDataLossError(
            "Kafka no longer has offsets the checkpoint needs (deleted by retention, or the topic was "
            f"deleted and re-created): {_one_line(loss.group(0))} — source.fail_on_data_loss is true; "
            "start from a fresh checkpoint (or `reset`), or set it to false to skip the missing offsets"
        )
    fs = _JVM_NO_FILESYSTEM.search(text)
    if fs is not None:
        from ticdc_delta.jars import HADOOP_AWS_PACKAGE

        scheme = fs.group(1) or fs.group(2)
        if scheme in ("s3", "s3a", "s3n"):
            return ConfigError(
                f"Spark has no Hadoop filesystem for {scheme}:// URIs (the checkpoint): add "
                f"{HADOOP_AWS_PACKAGE} to the session (spark.conf spark.jars.packages, or spark-submit "
                "--packages) and, for s3://, spark.hadoop.fs.s3.impl=org.apache.hadoop.fs.s3a.S3AFileSystem"
            )
        return ConfigError(
            f"Spark has no Hadoop filesystem for {scheme}:// URIs (the checkpoint): add the jar that "
            "provides it to the session (spark.jars.packages or --packages)"
        )
    unavailable = _JVM_UNAVAILABLE.search(text)
    if unavailable is not None:
        return BrokerUnavailableError(f"Kafka did not answer while reading: {_one_line(unavailable.group(0))}")
    return None
