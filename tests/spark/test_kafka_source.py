"""Spark's Kafka source as the job reads it (``read_kafka_stream``) and the driver-side Kafka helpers.

Unit tests (no broker, no JVM) cover redaction, the batch-size rule, the Java config translation and the
typing of JVM failures. Integration tests run real streaming queries (foreachBatch collecting rows) on the
local Kafka broker: the rows, the starting offsets, the micro-batch sizes and restarts, data loss.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from ticdc_delta.errors import BrokerUnavailableError, ClaimCheckUnavailableError, ConfigError
from ticdc_delta.local_broker import LocalBroker, free_port
from ticdc_delta.spark.kafka_source import (
    REDACTED,
    ConsumerGroupMirror,
    KafkaDataLossError,
    commit_consumer_group_offsets,
    plan_end_offsets,
    read_kafka_stream,
    redact,
    to_java_client_conf,
    topics_pattern,
    unwrap_source_error,
)

SECRET = "s3cr3t-Pa55word"
Row = tuple[str, int, int, bytes | None, bytes | None]

# -- unit: secrets -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "sasl.password",
        "ssl.key.password",
        "ssl.keystore.password",
        "ssl.truststore.password",
        "ssl.key.pem",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.config",
        "sasl.jaas.config",
        "kafka.sasl.password",
        "KAFKA.SASL.PASSWORD",
        "sasl.oauthbearer.assertion.private.key.passphrase",
    ],
)
def test_redact_masks_secret_keys(key: str) -> None:
    conf = {key: SECRET, "bootstrap.servers": "h:1", "sasl.username": "alice", "ssl.key.location": "/k.pem"}
    masked = redact(conf)
    assert masked[key] == REDACTED
    assert masked["bootstrap.servers"] == "h:1"
    assert masked["sasl.username"] == "alice"
    assert masked["ssl.key.location"] == "/k.pem"
    assert conf[key] == SECRET  # the input is not modified


@pytest.mark.parametrize(
    "key",
    ["sasl.oauthbearer.config", "sasl.jaas.config", "sasl.password", "ssl.key.pem", "ssl.keystore.key",
     "basic.auth.user.info", "kafka.sasl.oauthbearer.client.secret", "ssl.key.location", "sasl.username",
     "security.protocol", "ssl.ca.location"],
)
def test_redact_and_the_config_agree_on_what_is_secret(key: str) -> None:
    """One rule: a setting the config shows in ``repr(cfg)`` is one the Kafka source shows in its logs."""
    from ticdc_delta.config import is_secret_key

    assert (redact({key: SECRET})[key] == REDACTED) is is_secret_key(key)


def test_java_only_settings_stay_away_from_librdkafka() -> None:
    from ticdc_delta.config import librdkafka_settings

    conf = {"default.api.timeout.ms": "5000", "ssl.truststore.location": "/t.jks", "sasl.jaas.config": "x",
            "security.protocol": "SSL", "session.timeout.ms": "45000"}
    assert librdkafka_settings(conf) == {"security.protocol": "SSL", "session.timeout.ms": "45000"}
    # the Java client gets them all
    assert to_java_client_conf(conf) == conf


def test_the_java_clients_credentials_reach_librdkafka() -> None:
    """The probe and the group mirror log in as the Spark source does: a PKCS#12 keystore under the Java
    names (librdkafka reads them too), the username/password of a PLAIN/SCRAM JAAS config."""
    from ticdc_delta.config import librdkafka_settings

    conf = {"ssl.keystore.type": "PKCS12", "ssl.keystore.location": "/c.p12", "ssl.keystore.password": SECRET,
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
                                f'username="cdc" password="{SECRET}\\"x";'}
    assert librdkafka_settings(conf) == {"ssl.keystore.location": "/c.p12", "ssl.keystore.password": SECRET,
                                         "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "cdc",
                                         "sasl.password": SECRET + '"x'}
    plain = "org.apache.kafka.common.security.plain.PlainLoginModule required username='u' password=pw ;"
    assert librdkafka_settings({"sasl.mechanism": "PLAIN", "sasl.jaas.config": plain}) == {
        "sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "pw"}
    # librdkafka's own names win over the JAAS config's
    assert librdkafka_settings({"sasl.jaas.config": plain, "sasl.username": "a", "sasl.password": "b"}) == {
        "sasl.username": "a", "sasl.password": "b"}
    # another mechanism (OAUTHBEARER, GSSAPI) has librdkafka settings of its own: the JAAS is the Java client's
    oauth = {"sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
             "sasl.jaas.config": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"}
    assert librdkafka_settings(oauth) == {"sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc"}


def test_mirror_repr_never_shows_secrets() -> None:
    mirror = ConsumerGroupMirror("h:1", "g", {"sasl.password": SECRET, "sasl.username": "alice"})
    assert SECRET not in repr(mirror) and REDACTED in repr(mirror) and "alice" in repr(mirror)
    with pytest.raises(TypeError, match=r"group_id must be a non-empty str"):
        ConsumerGroupMirror("h:1", "", {})


# -- unit: batch sizes (Spark's maxOffsetsPerTrigger rule) -------------------------------------------


def _tp(*pairs: tuple[str, int, int]) -> dict[tuple[str, int], int]:
    return {(t, p): o for t, p, o in pairs}


def test_plan_without_limit_is_latest() -> None:
    start = _tp(("a", 0, 5), ("a", 1, 7))
    latest = _tp(("a", 0, 10), ("a", 1, 7), ("b", 0, 3))
    assert plan_end_offsets(start, latest, None) == _tp(("a", 0, 10), ("a", 1, 7), ("b", 0, 3))


def test_plan_prorates_the_limit_like_spark() -> None:
    start = _tp(("a", 0, 0), ("a", 1, 100), ("a", 2, 0))
    latest = _tp(("a", 0, 2), ("a", 1, 200), ("a", 2, 50))
    # 152 waiting: a0 gets 20*2/152 = 0.26 -> 1 (never starved), a1 20*100/152 = 13.2 -> 13, a2 6.6 -> 6
    assert plan_end_offsets(start, latest, 20) == _tp(("a", 0, 1), ("a", 1, 113), ("a", 2, 6))
    assert plan_end_offsets(start, latest, 1000) == latest


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 1000])
def test_plan_stays_near_the_limit_and_never_starves(limit: int) -> None:
    start = _tp(("a", 0, 0), ("a", 1, 10), ("b", 0, 3), ("b", 1, 0))
    latest = _tp(("a", 0, 40), ("a", 1, 11), ("b", 0, 3), ("b", 1, 25), ("c", 0, 4))  # c0 is new: from 0
    end = plan_end_offsets(start, latest, limit)
    taken = {tp: end[tp] - start.get(tp, 0) for tp in end}
    available = {tp: latest[tp] - start.get(tp, 0) for tp in latest}
    assert all(0 <= taken[tp] <= available[tp] for tp in latest)
    assert all(taken[tp] >= 1 for tp in latest if available[tp] > 0)
    waiting = sum(1 for a in available.values() if a > 0)
    assert sum(taken.values()) <= max(limit, waiting)


def test_plan_never_goes_back_and_keeps_vanished_partitions() -> None:
    start = _tp(("a", 0, 9), ("a", 1, 4))
    latest = _tp(("a", 0, 5))  # watermark below our position; a1 no longer listed
    assert plan_end_offsets(start, latest, 3) == _tp(("a", 0, 9), ("a", 1, 4))


# -- unit: the Java client settings -----------------------------------------------------------------


def test_to_java_client_conf_translates_sasl_and_ssl() -> None:
    java = to_java_client_conf(
        {
            "security.protocol": "sasl_ssl",
            "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": "alice",
            "sasl.password": 'p"w\\d',
            "ssl.ca.location": "/etc/ca.pem",
            "client.id": "ticdc-delta",
        }
    )
    assert java == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
        'username="alice" password="p\\"w\\\\d";',
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": "/etc/ca.pem",
        "client.id": "ticdc-delta",
    }
    plain = to_java_client_conf({"sasl.mechanism": "plain", "sasl.username": "u", "sasl.password": "p"})
    assert plain["sasl.jaas.config"].startswith("org.apache.kafka.common.security.plain.PlainLoginModule")
    assert to_java_client_conf({"enable.ssl.certificate.verification": "false"}) == {
        "ssl.endpoint.identification.algorithm": ""
    }
    with pytest.raises(ConfigError, match=r"ssl\.key\.location have no direct Java client equivalent"):
        to_java_client_conf({"ssl.key.location": "/k.pem"})


def test_to_java_client_conf_makes_pem_text_a_pem_keystore_and_truststore() -> None:
    """librdkafka's certificates as PEM text (``ssl.certificate.pem``, ``ssl.key.pem``, ``ssl.ca.pem``) are the
    Java client's PEM keystore and truststore (KIP-651); passed unchanged, the Java client ignored them and
    Spark's source connected without the client certificate."""
    pem = {"security.protocol": "SSL", "ssl.ca.pem": "CA-PEM", "ssl.certificate.pem": "CERT-PEM",
           "ssl.key.pem": "KEY-PEM", "ssl.key.password": SECRET}
    assert to_java_client_conf(pem) == {
        "security.protocol": "SSL", "ssl.truststore.type": "PEM", "ssl.truststore.certificates": "CA-PEM",
        "ssl.keystore.type": "PEM", "ssl.keystore.certificate.chain": "CERT-PEM", "ssl.keystore.key": "KEY-PEM",
        "ssl.key.password": SECRET}
    for bad, message in [({"ssl.key.pem": "K"}, "needs both"), ({"ssl.ca.pem": "A", "ssl.ca.location": "/a"}, "not both"),
                         ({"ssl.key.pem": "K", "ssl.certificate.pem": "C", "ssl.keystore.location": "/k.p12"}, "once")]:
        with pytest.raises(ConfigError, match=message):
            to_java_client_conf(bad)


def test_unwrap_source_error_from_query_exception_text() -> None:
    text = (
        "[STREAM_FAILED] Query terminated with exception: ...\n"
        "  File \"/x/kafka_source.py\", line 1, in latestOffset\n"
        "ticdc_delta.errors.BrokerUnavailableError: Kafka at 127.0.0.1:9 is unavailable while fetching\n"
    )
    error = unwrap_source_error(RuntimeError(text))
    assert isinstance(error, BrokerUnavailableError) and error.retryable
    assert str(error) == "Kafka at 127.0.0.1:9 is unavailable while fetching"
    assert unwrap_source_error(RuntimeError("something else")) is None


def test_unwrap_claim_check_outage_from_an_executor_is_retryable() -> None:
    # the claim-check fetch runs in the decode step on the executors; its outage reaches the driver as text
    text = (
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        "ticdc_delta.errors.ClaimCheckUnavailableError: claim-check storage file:///cc failed 4 times\n"
    )
    error = unwrap_source_error(RuntimeError(text))
    assert isinstance(error, ClaimCheckUnavailableError) and error.retryable
    assert str(error) == "claim-check storage file:///cc failed 4 times"


def test_unwrap_source_error_types_jvm_failures_in_one_line() -> None:
    timeout = (
        "An error occurred while calling o123.collect.\n: org.apache.spark.SparkException: Job aborted\n"
        "Caused by: org.apache.kafka.common.errors.TimeoutException: Timeout of 60000ms expired before "
        "the position for partition t-0 could be determined\n\tat org.apache.kafka.clients..."
    )
    error = unwrap_source_error(RuntimeError(timeout))
    assert isinstance(error, BrokerUnavailableError) and error.retryable
    assert "\n" not in str(error) and "TimeoutException: Timeout of 60000ms" in str(error)

    loss = (
        "[STREAM_FAILED] Query [id = 1] terminated with exception: [KAFKA_DATA_LOSS.PARTITION_OFFSET_CHANGED] "
        "Some data may have been lost because they are not available in Kafka any more; ...\n\tat x.y"
    )
    error = unwrap_source_error(RuntimeError(loss))
    assert isinstance(error, KafkaDataLossError) and not error.retryable
    assert "\n" not in str(error) and "KAFKA_DATA_LOSS.PARTITION_OFFSET_CHANGED" in str(error)
    assert "fail_on_data_loss" in str(error)

    s3 = 'org.apache.hadoop.fs.UnsupportedFileSystemException: No FileSystem for scheme "s3"\n\tat ...'
    error = unwrap_source_error(RuntimeError(s3))
    assert isinstance(error, ConfigError) and "\n" not in str(error)
    assert "org.apache.hadoop:hadoop-aws:3.4.1" in str(error) and "s3://" in str(error)
    s3a = "java.lang.ClassNotFoundException: Class org.apache.hadoop.fs.s3a.S3AFileSystem not found"
    assert "hadoop-aws" in str(unwrap_source_error(RuntimeError(s3a)))


# -- integration helpers -------------------------------------------------------------------------


def _produce(broker: LocalBroker, topic: str, partitions: int, count: int, first: int = 0) -> list[Row]:
    """``count`` messages spread round-robin; some keys/values None or empty. Returns the expected rows."""
    messages = []
    for i in range(first, first + count):
        key = None if i % 7 == 3 else f"k{i}".encode()
        value = None if i % 5 == 4 else b"" if i % 5 == 2 else f"{topic}:v{i}".encode()
        messages.append((i % partitions, key, value))
    before = broker.high_watermarks(topic, list(range(partitions)))
    broker.produce_many(topic, messages)
    rows: list[Row] = []
    next_offset = dict(before)
    for partition, key, value in messages:
        rows.append((topic, partition, next_offset[partition], key, value))
        next_offset[partition] += 1
    return rows


def _as_row(row: Any) -> Row:
    key = None if row.key is None else bytes(row.key)
    value = None if row.value is None else bytes(row.value)
    return (row.topic, row.partition, row.offset, key, value)


class Collector:
    """foreachBatch sink keeping each batch's rows by batch id (a re-run batch replaces its rows)."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.batches: dict[int, list[Row]] = {}
        self.timestamps_present = True
        self.delay_s = delay_s
        self.seen_batch = threading.Event()

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = df.collect()
        self.timestamps_present &= all(r.timestamp is not None for r in rows)
        self.batches[batch_id] = [_as_row(r) for r in rows]
        if len(self.batches) >= 2:
            self.seen_batch.set()
        time.sleep(self.delay_s)

    def rows(self) -> list[Row]:
        return [row for bid in sorted(self.batches) for row in self.batches[bid]]


def _start(spark: Any, df: Any, checkpoint: Path, sink: Collector) -> Any:
    return (
        df.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="0 seconds")
        .start()
    )


def _run_once(df: Any, checkpoint: Path, sink: Callable[[Any, int], None], name: str | None = None) -> Any:
    """Everything available now, in micro-batches, then stop: the job's ``--once`` (a query named ``name``).
    Returns the stopped query."""
    writer = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
    query = (writer if name is None else writer.queryName(name)).trigger(availableNow=True).start()
    try:
        query.awaitTermination(300)
    finally:
        query.stop()
    return query


def _stream(spark: Any, broker: LocalBroker, topics: list[str], **kwargs: Any) -> Any:
    return read_kafka_stream(spark, bootstrap_servers=broker.bootstrap_servers, topics=topics, **kwargs)


def _columns(schema: Any) -> list[tuple[str, Any]]:
    return [(f.name, f.dataType) for f in schema.fields]


def _key(rows: Iterable[Row]) -> list[Row]:
    return sorted(rows, key=lambda r: (r[0], r[1], r[2]))


# -- integration --------------------------------------------------------------------------------


class _Commits:
    """Stands in for the consumer-group mirror behind the job's progress listener: records what it is given."""

    def __init__(self) -> None:
        self.commits: list[dict[tuple[str, int], int]] = []

    def commit(self, end_offsets: dict[tuple[str, int], int]) -> bool:
        self.commits.append(dict(end_offsets))
        return True


@pytest.mark.integration
def test_the_group_mirror_listener_gets_each_finished_batchs_end_offsets(
    spark: Any, broker: LocalBroker, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """The job's listener reads each progress event as JSON (not through pyspark's conversion): every
    finished micro-batch of its query reaches the mirror with the end offsets of every partition; another
    query's progress does not. The commit the job makes after its query stopped carries the same offsets."""
    from ticdc_delta.spark.job import _group_mirror_listener, commit_progress, drain_listener_bus, final_progress

    topic = unique_name("mirror")
    broker.create_topic(topic, partitions=2)
    _produce(broker, topic, 2, 30)
    name = unique_name("mirrored").replace("-", "_")
    ours, others = _Commits(), _Commits()
    listeners = [_group_mirror_listener(ours, name), _group_mirror_listener(others, name + "_other")]
    for listener in listeners:
        spark.streams.addListener(listener)
    try:
        query = _run_once(_stream(spark, broker, [topic], max_offsets_per_trigger=10), tmp_path / "ckpt",
                          lambda df, batch_id: None, name)
        assert drain_listener_bus(spark)
    finally:
        for listener in listeners:
            spark.streams.removeListener(listener)
    ends = dict(broker.high_watermarks(topic, [0, 1]))
    assert len(ours.commits) >= 3  # 30 messages, at most 10 per micro-batch
    assert ours.commits[-1] == {(topic, 0): ends[0], (topic, 1): ends[1]}
    assert [sum(c.values()) for c in ours.commits] == sorted(sum(c.values()) for c in ours.commits)
    assert others.commits == []
    last = final_progress(query)
    assert last is not None
    after_stop = _Commits()
    commit_progress(after_stop, last)
    assert after_stop.commits == [ours.commits[-1]]


@pytest.mark.integration
def test_commit_consumer_group_offsets_reads_back(
    broker: LocalBroker, unique_name: Callable[[str], str]
) -> None:
    from confluent_kafka import Consumer, TopicPartition

    topic, group = unique_name("grp"), unique_name("group")
    broker.create_topic(topic, partitions=2)
    _produce(broker, topic, 2, 10)
    commit_consumer_group_offsets(broker.bootstrap_servers, group, {topic: {"0": 3, "1": 5}}, {})
    commit_consumer_group_offsets(broker.bootstrap_servers, group, json.dumps({topic: {"1": 4}}), None)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group})
    try:
        committed = consumer.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
    finally:
        consumer.close()
    assert [(tp.partition, tp.offset) for tp in committed] == [(0, 3), (1, 4)]

    # the job's mirror commits finished batches, only offsets that moved forward
    mirrored = unique_name("mirror")
    mirror = ConsumerGroupMirror(broker.bootstrap_servers, mirrored, {})
    assert mirror.commit({(topic, 0): 4, (topic, 1): 2})
    client = mirror._admin
    assert mirror.commit({(topic, 0): 5, (topic, 1): 2})
    assert mirror.commit({(topic, 0): 4, (topic, 1): 2})  # nothing moved forward: nothing sent
    assert client is not None and mirror._admin is client  # one client for the commits of a run
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": mirrored})
    try:
        committed = consumer.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
    finally:
        consumer.close()
    assert [(tp.partition, tp.offset) for tp in committed] == [(0, 5), (1, 2)]
    mirror.close()
    assert mirror._admin is None
    absent = ConsumerGroupMirror(f"127.0.0.1:{free_port()}", mirrored, {}, timeout_s=1)
    assert not absent.commit({(topic, 0): 9})
    assert absent._admin is None  # a failed commit's client is not kept
    with pytest.raises(TypeError, match=r"not a Kafka offset"):
        commit_consumer_group_offsets(broker.bootstrap_servers, group, {topic: 3}, None)
    with pytest.raises(BrokerUnavailableError, match=r"127\.0\.0\.1:\d+"):
        commit_consumer_group_offsets(f"127.0.0.1:{free_port()}", group, {topic: {"0": 1}}, None, timeout_s=1)


def test_a_failed_group_commit_leaves_no_client_behind_printing_to_stderr() -> None:
    """The offsets' admin client goes with the failed commit: it does not go on retrying the absent broker
    and printing librdkafka's connection failures to stderr after the job's own ``error:`` line."""
    import subprocess
    import sys

    script = (
        "import sys, time\n"
        "from ticdc_delta.errors import BrokerUnavailableError\n"
        "from ticdc_delta.spark.kafka_source import commit_consumer_group_offsets\n"
        "try:\n"
        f"    commit_consumer_group_offsets('127.0.0.1:{free_port()}', 'g', {{'t': {{'0': 1}}}}, timeout_s=1)\n"
        "except BrokerUnavailableError:\n"
        "    print('error: the end', file=sys.stderr, flush=True)\n"
        "time.sleep(3)\n"  # librdkafka retries a refused connection about once a second
    )
    err = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60, check=True).stderr.decode()
    lines = err.strip().splitlines()
    assert "error: the end" in lines, err
    after = lines[lines.index("error: the end") + 1:]
    assert not after, after


# -- unit: TLS failures of the probe (a local TLS listener, no Kafka) --------------------------------


def _certificate(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A self-signed EC certificate for 127.0.0.1 and its key, as PEM files."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


class _TlsListener:
    """A TLS server on 127.0.0.1 that completes handshakes and hangs up (no Kafka behind it); it records the
    subject of each client certificate it got, or the handshake's error."""

    def __init__(self, cert: Path, key: Path, client_ca: Path | None = None) -> None:
        import socket
        import ssl

        self._ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._ctx.load_cert_chain(cert, key)
        if client_ca is not None:  # a broker with ssl.client.auth=required
            self._ctx.verify_mode = ssl.CERT_REQUIRED
            self._ctx.load_verify_locations(client_ca)
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.seen: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            try:
                with self._ctx.wrap_socket(conn, server_side=True) as tls:
                    self.seen.append(str((tls.getpeercert() or {}).get("subject")))
            except OSError as exc:
                self.seen.append(f"refused: {exc}")
                conn.close()

    def close(self) -> None:
        self._sock.close()


@pytest.mark.parametrize("conf", [{"security.protocol": "SSL"},
                                  {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                                   "sasl.username": "u", "sasl.password": SECRET}])
def test_probe_a_broker_certificate_that_fails_verification_is_terminal(
        tmp_path: Path, conf: dict[str, str]) -> None:
    """No CA trusts the listener's certificate: a retry cannot mend that, so it is a ConfigError (exit 1)
    naming the cause, not a broker that is unavailable (exit 75, restarted for ever)."""
    from ticdc_delta.spark.kafka_source import probe_brokers

    listener = _TlsListener(*_certificate(tmp_path, "broker"))
    try:
        started = time.monotonic()
        with pytest.raises(ConfigError, match=r"TLS handshake with Kafka at 127\.0\.0\.1:\d+ failed while probing: "
                                              r".*certificate verify failed") as caught:
            probe_brokers(f"127.0.0.1:{listener.port}", conf, timeout_s=5)
        assert time.monotonic() - started < 4  # at the first failed step, not at the timeout
        assert SECRET not in str(caught.value)
    finally:
        listener.close()


def test_probe_presents_the_keystores_client_certificate(tmp_path: Path) -> None:
    """A broker that requires a client certificate gets the one of ``ssl.keystore.*`` (the settings the
    docs ask for, which the Java client uses) from the probe too; without one, the refusal is terminal."""
    from cryptography.hazmat.primitives.serialization import BestAvailableEncryption, load_pem_private_key, pkcs12
    from cryptography.x509 import load_pem_x509_certificate

    from ticdc_delta.spark.kafka_source import probe_brokers

    broker_cert, broker_key = _certificate(tmp_path, "broker")
    client_cert, client_key = _certificate(tmp_path, "ticdc-delta-client")
    keystore = tmp_path / "client.p12"
    keystore.write_bytes(pkcs12.serialize_key_and_certificates(
        b"client", load_pem_private_key(client_key.read_bytes(), None),  # type: ignore[arg-type]
        load_pem_x509_certificate(client_cert.read_bytes()), None, BestAvailableEncryption(SECRET.encode())))
    listener = _TlsListener(broker_cert, broker_key, client_ca=client_cert)
    tls = {"security.protocol": "SSL", "ssl.ca.location": str(broker_cert)}
    try:
        with pytest.raises(BrokerUnavailableError):  # the handshake passes; no Kafka answers behind it
            probe_brokers(f"127.0.0.1:{listener.port}", {**tls, "ssl.keystore.type": "PKCS12",
                          "ssl.keystore.location": str(keystore), "ssl.keystore.password": SECRET}, timeout_s=1)
        assert listener.seen and all("ticdc-delta-client" in s for s in listener.seen), listener.seen
        with pytest.raises(ConfigError, match=r"TLS handshake .* failed while probing: .*certificate required"):
            probe_brokers(f"127.0.0.1:{listener.port}", tls, timeout_s=5)
        # the same certificate as PEM text (librdkafka's own settings)
        listener.seen.clear()
        with pytest.raises(BrokerUnavailableError):
            probe_brokers(f"127.0.0.1:{listener.port}", {**tls, "ssl.certificate.pem": client_cert.read_text(),
                          "ssl.key.pem": client_key.read_text()}, timeout_s=1)
        assert listener.seen and all("ticdc-delta-client" in s for s in listener.seen), listener.seen
    finally:
        listener.close()


# -- integration: real streaming queries -----------------------------------------------------------


@pytest.mark.integration
def test_query_reads_exactly_what_was_produced(
    spark: Any, broker: LocalBroker, unique_name: Callable[[str], str], checkpoint_dir: Path
) -> None:
    orders, users = unique_name("orders"), unique_name("users")
    broker.create_topic(orders, partitions=3)
    broker.create_topic(users, partitions=1)
    expected = _produce(broker, orders, 3, 25) + _produce(broker, users, 1, 6)
    df = read_kafka_stream(
        spark,
        bootstrap_servers=broker.bootstrap_servers,
        topics=[orders, users],
        starting_offsets="earliest",
        client_conf={"client.id": "ticdc-delta-test", "sasl.password": SECRET},
    )
    assert df.isStreaming
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("topic", "string"), ("partition", "int"), ("offset", "bigint"),
        ("key", "binary"), ("value", "binary"), ("timestamp", "timestamp"),
    ]
    assert SECRET not in df._jdf.queryExecution().toString()
    sink = Collector()
    query = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint_dir)).start()
    try:
        query.processAllAvailable()
        progress = "\n".join(p.json for p in query.recentProgress)
    finally:
        query.stop()
    assert SECRET not in progress
    assert _key(sink.rows()) == _key(expected)
    assert len(sink.rows()) == len(expected)
    assert any(r[4] is None for r in sink.rows()) and any(r[4] == b"" for r in sink.rows())
    assert any(r[3] is None for r in sink.rows())
    assert sink.timestamps_present


@pytest.mark.integration
def test_listener_bus_drains_before_a_listener_goes(
    spark: Any, broker: LocalBroker, unique_name: Callable[[str], str], checkpoint_dir: Path
) -> None:
    # run_job removes its group-mirror listener once the query stopped; Spark delivers events to
    # listeners asynchronously, so a delivery may still be under way (here: a slow listener) and a process
    # that exits then makes the JVM log the failed call into Python. Draining first delivers it.
    from pyspark.sql.streaming import StreamingQueryListener

    from ticdc_delta.spark.job import drain_listener_bus

    seen: list[int] = []
    gate = threading.Event()

    class Slow(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            gate.wait(60)
            time.sleep(1.0)  # (a drain that did not wait would find nothing yet)
            seen.append(event.progress.batchId)

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    topic = unique_name("drain")
    broker.create_topic(topic, partitions=1)
    _produce(broker, topic, 1, 5)
    listener = Slow()
    spark.streams.addListener(listener)
    try:
        _run_once(_stream(spark, broker, [topic]), checkpoint_dir, Collector())
        assert not seen  # still in the slow listener: what a removal right now would race
        gate.set()
        assert drain_listener_bus(spark, timeout_s=30)
        assert seen == [0]
    finally:
        gate.set()
        spark.streams.removeListener(listener)
    assert drain_listener_bus(spark, timeout_s=30)


@pytest.mark.integration
def test_query_starting_offsets_latest_and_explicit(
    spark: Any, broker: LocalBroker, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    topic = unique_name("late")
    broker.create_topic(topic, partitions=3)
    old = _produce(broker, topic, 3, 9)  # offsets 0..2 in each partition

    latest_sink = Collector()
    query = _start(spark, _stream(spark, broker, [topic], starting_offsets="latest"), tmp_path / "l", latest_sink)
    try:
        query.processAllAvailable()  # the initial (latest) offsets are resolved by now
        new = _produce(broker, topic, 3, 6, first=9)
        query.processAllAvailable()
    finally:
        query.stop()
    assert _key(latest_sink.rows()) == _key(new)

    explicit_sink = Collector()
    spec = {topic: {"0": 2, "1": -2, "2": -1}}
    _run_once(_stream(spark, broker, [topic], starting_offsets=spec), tmp_path / "e", explicit_sink)
    wanted = [r for r in old + new if (r[1] == 0 and r[2] >= 2) or r[1] == 1 or (r[1] == 2 and r[2] >= 5)]
    assert _key(explicit_sink.rows()) == _key(wanted)


@pytest.mark.integration
def test_max_offsets_per_trigger_and_restart_from_checkpoint(
    spark: Any, broker: LocalBroker, unique_name: Callable[[str], str], checkpoint_dir: Path
) -> None:
    """maxOffsetsPerTrigger splits the backlog, also right after a restart; the restart loses and
    duplicates nothing."""
    cap = 6
    topic = unique_name("restart")
    broker.create_topic(topic, partitions=3)
    first = _produce(broker, topic, 3, 27)
    df = _stream(spark, broker, [topic], starting_offsets="earliest", max_offsets_per_trigger=cap)

    # run 1: slow batches, stopped after two of them, mid-stream
    run1 = Collector(delay_s=0.5)
    query = _start(spark, df, checkpoint_dir, run1)
    try:
        assert run1.seen_batch.wait(120), "no two micro-batches within 120 s"
    finally:
        query.stop()
    assert 0 < len(run1.rows()) < len(first), "run 1 was meant to stop mid-stream"

    second = _produce(broker, topic, 3, 12, first=27)

    # run 2: same checkpoint, --once style (availableNow honours maxOffsetsPerTrigger)
    run2 = Collector()
    _run_once(df, checkpoint_dir, run2)

    sizes = {b: len(r) for b, r in sorted({**run1.batches, **run2.batches}.items())}
    assert all(size <= cap + 3 for size in sizes.values()), sizes  # + one each for starved partitions
    assert len([s for s in sizes.values() if s]) >= (len(first) + len(second)) // (cap + 3), sizes
    assert run2.batches and all(len(rows) <= cap + 3 for rows in run2.batches.values()), sizes
    # a batch interrupted by the stop is re-run with exactly the same offsets
    for batch_id in run1.batches.keys() & run2.batches.keys():
        assert _key(run1.batches[batch_id]) == _key(run2.batches[batch_id])
    merged = {**run1.batches, **run2.batches}
    rows = [row for rows in merged.values() for row in rows]
    assert len(rows) == len(first) + len(second)  # no duplicates
    assert _key(rows) == _key(first + second)  # no loss


@pytest.mark.integration
def test_topic_deleted_and_recreated_is_terminal_data_loss(
    spark: Any, broker: LocalBroker, unique_name: Callable[[str], str], checkpoint_dir: Path
) -> None:
    """failOnDataLoss (the default): offsets the checkpoint has that the re-created topic lacks stop the
    query, and the error comes out as a one-line terminal KafkaDataLossError."""
    from pyspark.errors import StreamingQueryException

    topic = unique_name("gone")
    broker.create_topic(topic, partitions=1)
    _produce(broker, topic, 1, 10)
    _run_once(_stream(spark, broker, [topic]), checkpoint_dir, Collector())
    admin = broker.admin()  # kept referenced until the future resolves
    admin.delete_topics([topic])[topic].result(timeout=30)
    deadline = time.monotonic() + 30
    while True:
        try:
            broker.create_topic(topic, partitions=1)
            break
        except Exception:  # noqa: BLE001 - the deletion is asynchronous
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    _produce(broker, topic, 1, 3)  # offsets 0..2 < the checkpoint's 10
    sink = Collector()
    query = _start(spark, _stream(spark, broker, [topic]), checkpoint_dir, sink)
    try:
        with pytest.raises(StreamingQueryException) as caught:
            query.awaitTermination(120)
    finally:
        query.stop()
    error = unwrap_source_error(caught.value)
    assert isinstance(error, KafkaDataLossError) and not error.retryable, str(caught.value)[:2000]
    assert "\n" not in str(error)
    assert sink.rows() == []

    # with failOnDataLoss off the query goes on from what the topic has
    skip = Collector()
    _run_once(_stream(spark, broker, [topic], fail_on_data_loss=False), checkpoint_dir, skip)


def test_read_kafka_stream_checks_arguments_before_the_jvm() -> None:
    with pytest.raises(TypeError, match=r"spark must be a SparkSession"):
        read_kafka_stream(None, bootstrap_servers="h:1", topics=["t"])  # type: ignore[arg-type]


@pytest.mark.integration
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"topics": "t"}, TypeError, r"topics must be a non-empty sequence"),
        ({"starting_offsets": ""}, TypeError, r"starting_offsets must be"),
        ({"max_offsets_per_trigger": 0}, TypeError, r"max_offsets_per_trigger must be a positive int"),
        ({"client_conf": {"enable.auto.commit": "true"}}, ConfigError, r"managed by the source"),
        ({"client_conf": {"ssl.key.location": "/k.pem"}}, ConfigError, r"no direct Java client equivalent"),
    ],
)
def test_read_kafka_stream_rejects(spark: Any, kwargs: dict[str, Any], error: type, match: str) -> None:
    arguments: dict[str, Any] = {"bootstrap_servers": "127.0.0.1:9", "topics": ["t"], "probe_timeout_s": None}
    arguments.update(kwargs)
    with pytest.raises(error, match=match):
        read_kafka_stream(spark, **arguments)


def test_the_topics_pattern_matches_exactly_the_listed_topics() -> None:
    """Spark's ``subscribePattern`` reads a topic whose whole name the pattern matches (Java's regex, which
    reads these escapes as Python's does)."""
    import re

    pattern = re.compile(topics_pattern(["cdc.orders", "cdc-items_2", "a|b"]))
    assert all(pattern.fullmatch(t) for t in ["cdc.orders", "cdc-items_2", "a|b"])
    assert not any(pattern.fullmatch(t) for t in ["cdcxorders", "cdc.orders2", "xcdc-items_2", "a", "b", ""])


@pytest.mark.integration
def test_read_kafka_stream_probes_the_broker(spark: Any) -> None:
    servers = f"127.0.0.1:{free_port()}"
    with pytest.raises(BrokerUnavailableError, match=rf"Kafka at {servers} is unavailable while probing"):
        read_kafka_stream(spark, bootstrap_servers=servers, topics=["t"], probe_timeout_s=1.0)


@pytest.mark.integration
def test_read_kafka_stream_passes_java_client_settings_without_showing_secrets(spark: Any) -> None:
    df = read_kafka_stream(
        spark,
        bootstrap_servers="127.0.0.1:9",
        topics=["t"],
        client_conf={
            "security.protocol": "sasl_plaintext",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "u",
            "sasl.password": SECRET,
        },
        probe_timeout_s=None,
    )
    assert [f.name for f in df.schema.fields] == ["topic", "partition", "offset", "key", "value", "timestamp"]
    plan = df._jdf.queryExecution().toString()
    assert SECRET not in plan


@pytest.mark.integration
def test_session_is_tuned_and_lets_workers_import_the_package(spark: Any) -> None:
    from ticdc_delta.spark.session import get_or_create_spark, package_root

    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.executorEnv.PYTHONPATH").split(":")[0] == package_root()
    assert get_or_create_spark("again") is spark  # the active session is reused
    # Spark's Kafka source and Delta Lake come from the jars make fetched (.jars/spark)
    jars = conf.get("spark.jars") or ""
    assert "spark-sql-kafka-0-10_2.13-4.0.4.jar" in jars and "delta-spark_2.13-4.0.1.jar" in jars
    assert spark.conf.get("spark.sql.extensions") == "io.delta.sql.DeltaSparkSessionExtension"
    assert spark.conf.get("spark.sql.catalog.spark_catalog") == "org.apache.spark.sql.delta.catalog.DeltaCatalog"

    # a Python worker started by Spark imports ticdc_delta from the checkout
    def where(_: Any) -> Iterable[str]:
        import ticdc_delta

        yield ticdc_delta.__file__

    found = spark.sparkContext.parallelize([0], 1).mapPartitions(where).collect()
    assert found[0].startswith(package_root())


@pytest.mark.parametrize("client_conf,expected", [({}, "20"), ({"fetch.max.wait.ms": "300"}, "300")])
def test_executor_consumers_do_not_wait_out_the_java_fetch_default(
    spark: Any, client_conf: dict[str, str], expected: str
) -> None:
    # 500 ms (the Java default) would be waited out at the start of every micro-batch; a user's value wins
    df = read_kafka_stream(spark, bootstrap_servers="h:1", topics=["t"], client_conf=client_conf, probe_timeout_s=None)
    plan = df._jdf.queryExecution().logical().toString()
    assert f"kafka.fetch.max.wait.ms={expected}," in plan or f"kafka.fetch.max.wait.ms={expected}]" in plan


@pytest.mark.parametrize("client_conf,expected", [({}, str(4 << 20)), ({"max.partition.fetch.bytes": "65536"}, "65536")])
def test_executor_consumers_fetch_a_big_batch_in_large_fetches(
    spark: Any, client_conf: dict[str, str], expected: str
) -> None:
    # 4 MiB per partition and fetch (Java's default: 1 MiB) and a 1 MiB socket buffer; a user's value wins
    df = read_kafka_stream(spark, bootstrap_servers="h:1", topics=["t"], client_conf=client_conf, probe_timeout_s=None)
    plan = df._jdf.queryExecution().logical().toString()
    assert f"kafka.max.partition.fetch.bytes={expected}" in plan
    assert f"kafka.receive.buffer.bytes={1 << 20}" in plan


@pytest.mark.integration
def test_a_checkpoint_of_a_query_that_subscribed_by_name_continues_under_the_topics_pattern(
        spark: Any, broker: LocalBroker, tmp_path: Path, unique_name: Any) -> None:
    """Versions before read the topics with ``subscribe``; the source now reads them by an exact
    ``subscribePattern``. A checkpoint of the old query goes on where it stopped: nothing read twice or lost."""
    topic = unique_name("by-name")
    broker.create_topic(topic, partitions=2)
    broker.produce_many(topic, [(i % 2, None, b"old-%d" % i) for i in range(10)])
    old = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap_servers)
           .option("subscribe", topic).option("startingOffsets", "earliest").load())
    before = Collector()
    _run_once(old, tmp_path / "ckpt", before)
    assert sorted(r[4] for r in before.rows()) == sorted(b"old-%d" % i for i in range(10))
    broker.produce_many(topic, [(i % 2, None, b"new-%d" % i) for i in range(6)])
    after = Collector()
    _run_once(_stream(spark, broker, [topic], probe_timeout_s=None), tmp_path / "ckpt", after)
    assert sorted(r[4] for r in after.rows()) == sorted(b"new-%d" % i for i in range(6))
