"""The ``ticdc-kafka`` Python data source.

Unit tests (no broker, no JVM) cover option parsing, redaction, batch planning and the Java config
translation. Integration tests run the reader against the local tansu broker, in-process where Spark adds
nothing, and through real streaming queries (foreachBatch collecting rows) for what only Spark can show:
the offsets Spark hands back on restart, the micro-batch sizes, the columns.
"""

from __future__ import annotations

import json
import pickle
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.datasource import CaseInsensitiveDict

from ticdc_delta.errors import BrokerUnavailableError, ConfigError
from ticdc_delta.local_broker import LocalBroker, free_port
from ticdc_delta.spark.kafka_source import (
    REDACTED,
    SCHEMA,
    SOURCE_NAME,
    KafkaDataLossError,
    KafkaDataSource,
    KafkaInputPartition,
    KafkaStreamReader,
    commit_consumer_group_offsets,
    parse_options,
    plan_end_offsets,
    probe_brokers,
    read_kafka_stream,
    redact,
    to_java_client_conf,
    unwrap_source_error,
)

SECRET = "s3cr3t-Pa55word"
Row = tuple[str, int, int, bytes | None, bytes | None]

# -- unit: options -------------------------------------------------------------------------------


def _options(**extra: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "a, b", **extra}


def test_parse_options_defaults_and_kafka_passthrough() -> None:
    opts = parse_options(_options(**{"kafka.security.protocol": "SASL_SSL", "kafka.sasl.password": SECRET}))
    assert opts.topics == ("a", "b")
    assert opts.starting_offsets == "latest"
    assert opts.max_offsets_per_trigger is None
    assert opts.fail_on_data_loss is True
    assert opts.client_conf == {"security.protocol": "SASL_SSL", "sasl.password": SECRET}
    assert SECRET not in repr(opts)


def test_parse_options_is_case_insensitive_like_spark() -> None:
    # Spark lower-cases option names (CaseInsensitiveDict) before they reach the data source
    spark_style = CaseInsensitiveDict(
        {
            "Kafka.Bootstrap.Servers": "h:1",
            "subscribe": "t",
            "startingOffsets": '{"t": {"0": 5, "1": -2}}',
            "maxOffsetsPerTrigger": "10",
            "failOnDataLoss": "false",
            "kafkaConsumer.pollTimeoutMs": "1234",
        }
    )
    assert set(spark_style) == {
        "kafka.bootstrap.servers",
        "subscribe",
        "startingoffsets",
        "maxoffsetspertrigger",
        "failondataloss",
        "kafkaconsumer.polltimeoutms",
    }
    opts = parse_options(spark_style)
    assert opts.bootstrap_servers == "h:1"
    assert opts.starting_offsets == {"t": {0: 5, 1: -2}}
    assert opts.max_offsets_per_trigger == 10
    assert opts.fail_on_data_loss is False
    assert opts.poll_timeout_ms == 1234
    # camelCase names straight from a dict work too
    assert parse_options(_options(startingOffsets="EARLIEST")).starting_offsets == "earliest"


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"subscribe": "t"}, r"kafka\.bootstrap\.servers is required"),
        ({"kafka.bootstrap.servers": "h:1"}, r"subscribe is required"),
        (_options(startingOffsets="oldest"), r"startingOffsets: expected earliest, latest or JSON"),
        (_options(startingOffsets='{"zzz": {"0": 1}}'), r"topic 'zzz' is not in subscribe"),
        (_options(startingOffsets='{"a": {"x": 1}}'), r"partition 'x' of 'a' is not a number"),
        (_options(startingOffsets='{"a": {"0": -3}}'), r"a\[0\] must be an offset >= 0, -1 \(latest\) or -2"),
        (_options(startingOffsets='["a"]'), r"JSON must be an object of topics"),
        (_options(maxOffsetsPerTrigger="0"), r"maxoffsetspertrigger: expected a positive integer, got 0"),
        (_options(maxOffsetsPerTrigger="ten"), r"maxoffsetspertrigger: expected a positive integer"),
        (_options(failOnDataLoss="maybe"), r"failondataloss: expected true or false"),
        (_options(maxOffsetPerTrigger="5"), r"unknown option\(s\) maxoffsetpertrigger"),
        (_options(**{"kafka.auto.offset.reset": "x"}), r"kafka\.auto\.offset\.reset are managed by"),
    ],
)
def test_parse_options_rejects(options: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_options(options)


# -- unit: redaction -----------------------------------------------------------------------------


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


def test_reprs_never_show_secrets() -> None:
    source = KafkaDataSource(CaseInsensitiveDict(_options(**{"kafka.sasl.password": SECRET})))
    reader = source.streamReader(SCHEMA)
    assert isinstance(reader, KafkaStreamReader)
    for text in (repr(source), repr(reader), repr(reader.options), str(reader)):
        assert SECRET not in text
        assert REDACTED in text
    assert repr(KafkaInputPartition("t", 1, 5, 9)) == "KafkaInputPartition(t[1] 5..9)"


def test_reader_pickles_without_a_client() -> None:
    reader = KafkaDataSource(CaseInsensitiveDict(_options())).streamReader(SCHEMA)
    clone = pickle.loads(pickle.dumps(reader))
    assert clone.options == reader.options
    assert clone._client is None


# -- unit: planning ------------------------------------------------------------------------------


def _tp(*pairs: tuple[str, int, int]) -> dict[tuple[str, int], int]:
    return {(t, p): o for t, p, o in pairs}


def test_plan_without_limit_is_latest() -> None:
    start = _tp(("a", 0, 5), ("a", 1, 7))
    latest = _tp(("a", 0, 10), ("a", 1, 7), ("b", 0, 3))
    assert plan_end_offsets(start, latest, None) == _tp(("a", 0, 10), ("a", 1, 7), ("b", 0, 3))


def test_plan_shares_the_limit_max_min_fairly() -> None:
    start = _tp(("a", 0, 0), ("a", 1, 100), ("a", 2, 0))
    latest = _tp(("a", 0, 2), ("a", 1, 200), ("a", 2, 50))
    # a0 needs only 2: it gets them, the other two split the remaining 18 evenly
    assert plan_end_offsets(start, latest, 20) == _tp(("a", 0, 2), ("a", 1, 109), ("a", 2, 9))
    # remainder of an uneven split goes to the first partitions in (topic, partition) order
    assert plan_end_offsets(start, latest, 7) == _tp(("a", 0, 2), ("a", 1, 103), ("a", 2, 2))


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 1000])
def test_plan_respects_the_limit_and_never_starves(limit: int) -> None:
    start = _tp(("a", 0, 0), ("a", 1, 10), ("b", 0, 3), ("b", 1, 0))
    latest = _tp(("a", 0, 40), ("a", 1, 11), ("b", 0, 3), ("b", 1, 25), ("c", 0, 4))  # c0 is new: from 0
    end = plan_end_offsets(start, latest, limit)
    taken = {tp: end[tp] - start.get(tp, 0) for tp in end}
    available = {tp: latest[tp] - start.get(tp, 0) for tp in latest}
    assert all(0 <= taken[tp] <= available[tp] for tp in latest)
    assert sum(taken.values()) == min(limit, sum(available.values()))
    # max-min fair: a partition that got less than it wanted got at least as much as any other
    for tp, got in taken.items():
        if got < available[tp]:
            assert all(got >= other - 1 for other in taken.values())


def test_plan_never_goes_back_and_keeps_vanished_partitions() -> None:
    start = _tp(("a", 0, 9), ("a", 1, 4))
    latest = _tp(("a", 0, 5))  # watermark below our position; a1 no longer listed
    assert plan_end_offsets(start, latest, 3) == _tp(("a", 0, 9), ("a", 1, 4))


# -- unit: the Java client settings for reader="spark" ---------------------------------------------


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


def _start(spark: Any, options: dict[str, str], checkpoint: Path, sink: Collector) -> Any:
    stream = spark.readStream.format(SOURCE_NAME)
    for key, value in options.items():
        stream = stream.option(key, value)
    return (
        stream.load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="0 seconds")
        .start()
    )


def _run_until_caught_up(spark: Any, options: dict[str, str], checkpoint: Path, sink: Collector) -> None:
    query = _start(spark, options, checkpoint, sink)
    try:
        query.processAllAvailable()
    finally:
        query.stop()


def _columns(schema: Any) -> list[tuple[str, Any]]:
    return [(f.name, f.dataType) for f in schema.fields]


def _key(rows: Iterable[Row]) -> list[Row]:
    return sorted(rows, key=lambda r: (r[0], r[1], r[2]))


def _source_options(broker: LocalBroker, topics: Iterable[str], **extra: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": broker.bootstrap_servers, "subscribe": ",".join(topics), **extra}


# -- integration: reader in-process (broker, no JVM) -----------------------------------------------


@pytest.mark.integration
def test_reader_resolves_starting_offsets(broker: LocalBroker, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("start")
    broker.create_topic(topic, partitions=3)
    _produce(broker, topic, 3, 12)  # 4 per partition

    def initial(spec: str) -> dict:
        reader = KafkaStreamReader(parse_options(_source_options(broker, [topic], startingOffsets=spec)))
        try:
            return reader.initialOffset()
        finally:
            reader.stop()

    assert initial("earliest") == {topic: {"0": 0, "1": 0, "2": 0}}
    assert initial("latest") == {topic: {"0": 4, "1": 4, "2": 4}}
    # JSON: -2 earliest, -1 latest, a number as is, unnamed partitions at earliest
    assert initial(json.dumps({topic: {"0": 3, "1": -1}})) == {topic: {"0": 3, "1": 4, "2": 0}}


@pytest.mark.integration
def test_reader_plans_and_reads_ranges(broker: LocalBroker, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("plan")
    broker.create_topic(topic, partitions=2)
    expected = _produce(broker, topic, 2, 10)
    reader = KafkaStreamReader(
        parse_options(_source_options(broker, [topic], startingOffsets="earliest", maxOffsetsPerTrigger="4"))
    )
    try:
        start = reader.initialOffset()
        end = reader.latestOffset()
        assert end == {topic: {"0": 2, "1": 2}}
        assert reader.latestOffset() == end  # idempotent until Spark plans the batch
        parts = reader.partitions(start, end)
        assert [repr(p) for p in parts] == [
            f"KafkaInputPartition({topic}[0] 0..2)",
            f"KafkaInputPartition({topic}[1] 0..2)",
        ]
        assert reader.latestOffset() == {topic: {"0": 4, "1": 4}}
        # an executor gets a pickled copy; it reads every offset of its range, nothing more
        executor = pickle.loads(pickle.dumps(reader))
        everything = executor.partitions(start, {topic: {"0": 5, "1": 5}})
        got = [row for p in everything for batch in executor.read(p) for row in batch.to_pylist()]
    finally:
        reader.stop()
    got_rows = [(r["topic"], r["partition"], r["offset"], r["key"], r["value"]) for r in got]
    assert _key(got_rows) == _key(expected)
    assert all(r["timestamp"] is not None for r in got)


@pytest.mark.integration
def test_reader_picks_up_new_topics_from_earliest(
    broker: LocalBroker, unique_name: Callable[[str], str]
) -> None:
    old, new = unique_name("old"), unique_name("new")
    broker.create_topic(old, partitions=1)
    _produce(broker, old, 1, 2)
    reader = KafkaStreamReader(parse_options(_source_options(broker, [old, new], startingOffsets="latest")))
    try:
        start = reader.initialOffset()
        assert start == {old: {"0": 2}}  # `new` does not exist yet
        broker.create_topic(new, partitions=2)
        _produce(broker, new, 2, 4)
        _produce(broker, old, 1, 1, first=2)
        end = reader.latestOffset()
        assert end == {new: {"0": 2, "1": 2}, old: {"0": 3}}
        planned = [repr(p) for p in reader.partitions(start, end)]
    finally:
        reader.stop()
    # partitions that appeared after the start are read from their beginning, whatever startingOffsets said
    assert planned == [
        f"KafkaInputPartition({new}[0] 0..2)",
        f"KafkaInputPartition({new}[1] 0..2)",
        f"KafkaInputPartition({old}[0] 2..3)",
    ]


@pytest.mark.integration
def test_read_times_out_with_a_clear_error(broker: LocalBroker, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("short")
    broker.create_topic(topic, partitions=1)
    _produce(broker, topic, 1, 3)
    reader = KafkaStreamReader(parse_options(_source_options(broker, [topic], pollTimeoutMs="500")))
    # the log ends at 3 but 0..10 was planned: after pollTimeoutMs without data it is data loss
    with pytest.raises(KafkaDataLossError, match=rf"{topic}\[0\] ends at 3 .* offsets up to 10 were planned"):
        list(reader.read(KafkaInputPartition(topic, 0, 0, 10)))
    # with failOnDataLoss=false the rows that exist are returned and the rest skipped
    lenient = KafkaStreamReader(
        parse_options(_source_options(broker, [topic], pollTimeoutMs="500", failOnDataLoss="false"))
    )
    rows = [r for batch in lenient.read(KafkaInputPartition(topic, 0, 0, 10)) for r in batch.to_pylist()]
    assert [r["offset"] for r in rows] == [0, 1, 2]


@pytest.mark.integration
def test_unreachable_broker_raises_broker_unavailable_without_secrets() -> None:
    servers = f"127.0.0.1:{free_port()}"
    options = {
        "kafka.bootstrap.servers": servers,
        "subscribe": "t",
        "metadataTimeoutMs": "1000",
        "pollTimeoutMs": "1000",
        "kafka.sasl.username": "alice",
        "kafka.sasl.password": SECRET,
    }
    reader = KafkaStreamReader(parse_options(options))
    try:
        with pytest.raises(BrokerUnavailableError, match=rf"Kafka at {servers} is unavailable") as on_driver:
            reader.latestOffset()
    finally:
        reader.stop()
    with pytest.raises(BrokerUnavailableError, match=rf"no data from Kafka at {servers}") as on_executor:
        list(reader.read(KafkaInputPartition("t", 0, 0, 5)))
    with pytest.raises(BrokerUnavailableError, match=rf"Kafka at {servers}") as probed:
        probe_brokers(servers, {"sasl.password": SECRET}, timeout_s=1.0)
    for caught in (on_driver, on_executor, probed):
        assert SECRET not in str(caught.value)
        assert SECRET not in repr(caught.value)
        assert pickle.loads(pickle.dumps(caught.value)).args == caught.value.args  # travels from workers


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

    # the source's commit() mirrors finished batches to commitGroupId
    mirrored = unique_name("mirror")
    reader = KafkaStreamReader(parse_options(_source_options(broker, [topic], commitGroupId=mirrored)))
    reader.commit({topic: {"0": 5, "1": 2}})
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": mirrored})
    try:
        committed = consumer.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
    finally:
        consumer.close()
    assert [(tp.partition, tp.offset) for tp in committed] == [(0, 5), (1, 2)]
    with pytest.raises(TypeError, match=r"not a ticdc-kafka offset"):
        commit_consumer_group_offsets(broker.bootstrap_servers, group, {topic: 3}, None)
    with pytest.raises(BrokerUnavailableError, match=r"127\.0\.0\.1:\d+"):
        commit_consumer_group_offsets(f"127.0.0.1:{free_port()}", group, {topic: {"0": 1}}, None, timeout_s=1)


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
    assert _columns(df.schema) == _columns(SCHEMA)
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
def test_query_starting_offsets_latest_and_explicit(
    spark: Any, broker: LocalBroker, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    topic = unique_name("late")
    broker.create_topic(topic, partitions=3)
    old = _produce(broker, topic, 3, 9)  # offsets 0..2 in each partition

    latest_sink = Collector()
    latest_options = _source_options(broker, [topic], startingOffsets="latest")
    query = _start(spark, latest_options, tmp_path / "l", latest_sink)
    try:
        query.processAllAvailable()  # the initial (latest) offsets are resolved by now
        new = _produce(broker, topic, 3, 6, first=9)
        query.processAllAvailable()
    finally:
        query.stop()
    assert _key(latest_sink.rows()) == _key(new)

    explicit_sink = Collector()
    spec = json.dumps({topic: {"0": 2, "1": -2, "2": -1}})
    _run_until_caught_up(
        spark, _source_options(broker, [topic], startingOffsets=spec), tmp_path / "e", explicit_sink
    )
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
    options = _source_options(broker, [topic], startingOffsets="earliest", maxOffsetsPerTrigger=str(cap))

    # run 1: slow batches, stopped after two of them, mid-stream
    run1 = Collector(delay_s=0.5)
    query = _start(spark, options, checkpoint_dir, run1)
    try:
        assert run1.seen_batch.wait(120), "no two micro-batches within 120 s"
    finally:
        query.stop()
    assert 0 < len(run1.rows()) < len(first), "run 1 was meant to stop mid-stream"

    second = _produce(broker, topic, 3, 12, first=27)

    # run 2: same checkpoint; Spark hands the reader the checkpointed position before the first batch
    run2 = Collector()
    _run_until_caught_up(spark, options, checkpoint_dir, run2)

    sizes = {b: len(r) for b, r in sorted({**run1.batches, **run2.batches}.items())}
    assert all(size <= cap for size in sizes.values()), sizes
    assert len([s for s in sizes.values() if s]) >= -(-(len(first) + len(second)) // cap), sizes
    assert run2.batches and all(len(rows) <= cap for rows in run2.batches.values()), sizes
    # a batch interrupted by the stop is re-run with exactly the same offsets
    for batch_id in run1.batches.keys() & run2.batches.keys():
        assert _key(run1.batches[batch_id]) == _key(run2.batches[batch_id])
    merged = {**run1.batches, **run2.batches}
    rows = [row for rows in merged.values() for row in rows]
    assert len(rows) == len(first) + len(second)  # no duplicates
    assert _key(rows) == _key(first + second)  # no loss


@pytest.mark.integration
def test_query_on_unreachable_broker_fails_with_broker_unavailable(spark: Any, tmp_path: Path) -> None:
    from pyspark.errors import StreamingQueryException

    servers = f"127.0.0.1:{free_port()}"
    options = {
        "kafka.bootstrap.servers": servers,
        "subscribe": "nowhere",
        "metadataTimeoutMs": "1000",
        "kafka.sasl.password": SECRET,
    }
    query = _start(spark, options, tmp_path / "ck", Collector())
    try:
        with pytest.raises(StreamingQueryException) as caught:
            query.awaitTermination(60)
    finally:
        query.stop()
    text = str(caught.value)
    assert "BrokerUnavailableError" in text and servers in text
    assert SECRET not in text
    error = unwrap_source_error(caught.value)
    assert isinstance(error, BrokerUnavailableError) and servers in str(error)


def test_read_kafka_stream_checks_arguments_before_the_jvm() -> None:
    with pytest.raises(TypeError, match=r"spark must be a SparkSession"):
        read_kafka_stream(None, bootstrap_servers="h:1", topics=["t"])  # type: ignore[arg-type]


@pytest.mark.integration
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"topics": "t"}, TypeError, r"topics must be a non-empty sequence"),
        ({"reader": "flink"}, ValueError, r"reader must be 'python' or 'spark'"),
        ({"starting_offsets": "soon"}, ConfigError, r"startingOffsets"),
        ({"client_conf": {"enable.auto.commit": "true"}}, ConfigError, r"managed by the source"),
    ],
)
def test_read_kafka_stream_rejects(spark: Any, kwargs: dict[str, Any], error: type, match: str) -> None:
    arguments: dict[str, Any] = {"bootstrap_servers": "127.0.0.1:9", "topics": ["t"], "probe_timeout_s": None}
    arguments.update(kwargs)
    with pytest.raises(error, match=match):
        read_kafka_stream(spark, **arguments)


@pytest.mark.integration
def test_read_kafka_stream_probes_the_broker(spark: Any) -> None:
    servers = f"127.0.0.1:{free_port()}"
    with pytest.raises(BrokerUnavailableError, match=rf"Kafka at {servers} is unavailable while probing"):
        read_kafka_stream(spark, bootstrap_servers=servers, topics=["t"], probe_timeout_s=1.0)


@pytest.mark.integration
def test_read_kafka_stream_spark_reader_builds_the_same_columns(spark: Any) -> None:
    """reader="spark" needs the spark-sql-kafka jar: without it Spark says so; with it, same columns."""
    from pyspark.errors import AnalysisException

    try:
        df = read_kafka_stream(
            spark,
            bootstrap_servers="127.0.0.1:9",
            topics=["t"],
            reader="spark",
            client_conf={
                "security.protocol": "sasl_plaintext",
                "sasl.mechanism": "PLAIN",
                "sasl.username": "u",
                "sasl.password": SECRET,
            },
            probe_timeout_s=None,
        )
    except AnalysisException as exc:
        assert "kafka" in str(exc).lower()
        assert SECRET not in str(exc)
    else:
        assert _columns(df.schema) == _columns(SCHEMA)


@pytest.mark.integration
def test_session_is_tuned_and_lets_workers_import_the_package(spark: Any) -> None:
    from ticdc_delta.spark.session import get_or_create_spark, package_root

    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.executorEnv.PYTHONPATH").split(":")[0] == package_root()
    assert get_or_create_spark("again") is spark  # the active session is reused, sources stay registered

    # a Python worker started by Spark imports ticdc_delta from the checkout
    def where(_: Any) -> Iterable[str]:
        import ticdc_delta

        yield ticdc_delta.__file__

    found = spark.sparkContext.parallelize([0], 1).mapPartitions(where).collect()
    assert found[0].startswith(package_root())
