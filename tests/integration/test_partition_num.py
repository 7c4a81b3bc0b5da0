"""A changefeed whose sink URI sets ``partition-num`` below the topic's partitions: TiCDC writes rows and
resolved ts only to the first that many, so the others never resolve anything. Without the option the job
holds every row (and says which partitions it waits for); with it — as the sink URI has it — every row
lands, the rows held so far included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ticdc_delta.config import config_from_mapping
from ticdc_delta.simulator import Simulation
from ticdc_delta.simulator.output import KafkaSink
from ticdc_delta.spark.batch_handler import _ConfiguredSink
from ticdc_delta.spark.job import run_job
from ticdc_delta.status import collect_status
from ticdc_delta.verify import compare_with_oracle
from tests.integration.conftest import job_engine

pytestmark = pytest.mark.integration


def test_partitions_beyond_partition_num_are_not_waited_for(broker: Any, spark: Any, tmp_path: Path,
                                                            unique_name: Any, progress: Any) -> None:
    topic = unique_name("pnum")
    broker.create_topic(topic, partitions=3)
    sim = Simulation("open-protocol", {}, seed=5, events=300, tables=2, partitions=2, topic=topic)
    messages = list(sim.messages())
    half = len(messages) // 2

    def produce(part: list[Any]) -> None:
        sink = KafkaSink(broker.bootstrap_servers, topic, 2)
        for m in part:
            sink.write(m.partition, m.key, m.value)
        sink.close()

    def config(options: dict[str, str]) -> Any:
        return config_from_mapping({
            "changefeed": "pnum", "checkpoint": str(tmp_path / "ckpt"),
            "sink": {"path": str(tmp_path / "lake"), "engine": job_engine()},
            "source": {"bootstrap_servers": broker.bootstrap_servers, "topic": topic, "protocol": "open-protocol",
                       "options": options},
        })

    produce(messages[:half])
    held = config({})
    run_job(held, once=True, spark=spark)
    assert not any(line["rows_applied"] for line in progress.lines)
    assert progress.lines[-1]["unresolved_partitions"] == [f"{topic}[2]"]
    assert collect_status(held)["rows_held"] > 0

    progress.lines.clear()
    produce(messages[half:])
    told = config({"partition-num": "2"})
    run_job(told, once=True, spark=spark)
    assert collect_status(told)["rows_held"] == 0 and "unresolved_partitions" not in progress.lines[-1]
    diffs = compare_with_oracle(_ConfiguredSink(told), sim.oracle(), tz=told.sink.source_timezone)
    assert not [d.describe() for d in diffs if not d.ok] and sum(d.actual_rows for d in diffs) > 0


def test_a_listed_topic_missing_or_empty_holds_nothing_back(broker: Any, spark: Any, tmp_path: Path,
                                                            unique_name: Any, progress: Any) -> None:
    """A changefeed with a topic dispatcher: TiCDC creates a table's topic when it first writes to it, so a
    listed topic may not exist yet; and one created ahead of its table gets no resolved ts until the table
    exists. Their rows cannot be missing: the other topics' rows land (before, every batch failed on the
    topic's metadata, or held every row), the progress line names them; once TiCDC writes to one, its rows
    land too, held until it has resolved them."""
    from ticdc_delta.codec import encoder_for
    from ticdc_delta.codec.model import Column, ColumnFlag, Op, ResolvedEvent, RowChange, TypeCode
    from ticdc_delta.delta.sink import TableIdent

    first, later, ahead = unique_name("dispatch-a"), unique_name("dispatch-b"), unique_name("dispatch-c")
    broker.create_topic(first, partitions=1)
    broker.create_topic(ahead, partitions=2)  # created ahead of its table: empty, never resolved
    encode = encoder_for("canal-json", {"enable-tidb-extension": "true"}).encode
    key = ColumnFlag.HANDLE_KEY | ColumnFlag.PRIMARY_KEY

    def insert(ts: int, table: str, k: int) -> RowChange:
        image = (Column("k", TypeCode.BIGINT, key, k), Column("v", TypeCode.VARCHAR, ColumnFlag.NONE, f"{table}{k}"))
        return RowChange(ts, "d", table, Op.INSERT, image, None)

    def produce(topic: str, events: list[Any]) -> None:
        broker.produce_many(topic, [(0, m.key, m.value) for m in encode(events)])

    cfg = config_from_mapping({
        "changefeed": "dispatch", "checkpoint": str(tmp_path / "ckpt"),
        "sink": {"path": str(tmp_path / "lake"), "engine": "spark"},
        "source": {"bootstrap_servers": broker.bootstrap_servers, "topics": [first, later, ahead],
                   "protocol": "canal-json",
                   "options": {"enable-tidb-extension": "true"}},
    })
    base = 446_000_000_000_000_000
    produce(first, [insert(base + 1, "a", 1), insert(base + 2, "a", 2), ResolvedEvent(base + 3)])
    run_job(cfg, once=True, spark=spark)
    sink = _ConfiguredSink(cfg)
    assert sorted(sink.read(TableIdent("d", "a")).column("k").to_pylist()) == [1, 2]
    assert progress.lines[-1]["empty_topics"] == sorted([later, ahead])

    progress.lines.clear()
    broker.create_topic(later, partitions=1)
    produce(first, [insert(base + 4, "a", 3), ResolvedEvent(base + 6)])
    produce(later, [insert(base + 5, "b", 1)])  # not resolved yet: everything after base + 3 waits for it
    run_job(cfg, once=True, spark=spark)
    assert progress.lines[-1]["empty_topics"] == [ahead] and collect_status(cfg)["rows_held"] == 2
    produce(later, [ResolvedEvent(base + 6)])
    run_job(cfg, once=True, spark=spark)
    assert sorted(sink.read(TableIdent("d", "a")).column("k").to_pylist()) == [1, 2, 3]
    assert sink.read(TableIdent("d", "b")).to_pylist() == [{"k": 1, "v": "b1"}]
    assert collect_status(cfg)["rows_held"] == 0


def test_a_topic_taken_out_of_the_list_stops_with_the_way_on(broker: Any, spark: Any, tmp_path: Path,
                                                             unique_name: Any) -> None:
    """A topic dispatcher's topic whose tables are gone resolves nothing more and holds every row back;
    the documented way on is to take it out of ``source.topics``. Spark's Kafka source then took the topic's
    partitions for deleted and stopped as if Kafka had lost data (``KafkaDataLossError``, on every retry).
    Now the job says what happened and how to go on (``reset --from state``), which loses nothing."""
    import json

    from ticdc_delta.cli import EXIT_OK, main
    from ticdc_delta.codec import encoder_for
    from ticdc_delta.codec.model import Column, ColumnFlag, Op, ResolvedEvent, RowChange, TypeCode
    from ticdc_delta.delta.sink import TableIdent
    from ticdc_delta.errors import ConfigError

    kept, retired = unique_name("kept"), unique_name("retired")
    for topic in (kept, retired):
        broker.create_topic(topic, partitions=1)
    encode = encoder_for("canal-json", {"enable-tidb-extension": "true"}).encode
    key = ColumnFlag.HANDLE_KEY | ColumnFlag.PRIMARY_KEY

    def insert(ts: int, table: str, k: int) -> RowChange:
        return RowChange(ts, "d", table, Op.INSERT, (Column("k", TypeCode.BIGINT, key, k),), None)

    def produce(topic: str, events: list[Any]) -> None:
        broker.produce_many(topic, [(0, m.key, m.value) for m in encode(events)])

    def config(topics: list[str]) -> tuple[Any, Path]:
        data = {"changefeed": "retire", "checkpoint": str(tmp_path / "ckpt"),
                "sink": {"path": str(tmp_path / "lake"), "engine": job_engine("spark")},
                "source": {"bootstrap_servers": broker.bootstrap_servers, "topics": topics,
                           "protocol": "canal-json", "options": {"enable-tidb-extension": "true"}}}
        path = tmp_path / "job.yaml"
        path.write_text(json.dumps(data))
        return config_from_mapping(data), path

    base = 446_000_000_000_000_000
    produce(kept, [insert(base + 1, "a", 1), ResolvedEvent(base + 3)])
    produce(retired, [insert(base + 2, "b", 1), ResolvedEvent(base + 3)])
    both, _ = config([kept, retired])
    run_job(both, once=True, spark=spark)
    sink = _ConfiguredSink(both)
    assert sink.read(TableIdent("d", "b")).column("k").to_pylist() == [1]

    produce(kept, [insert(base + 4, "a", 2), ResolvedEvent(base + 6)])  # the retired topic resolves no more
    run_job(both, once=True, spark=spark)
    assert sink.read(TableIdent("d", "a")).column("k").to_pylist() == [1] and collect_status(both)["rows_held"] == 1

    one, yaml_path = config([kept])
    with pytest.raises(ConfigError, match=rf"source\.topics no longer lists {retired}, which the Spark checkpoint .*"
                                          r"reset --config <your\.yaml> --from state --yes"):
        run_job(one, once=True, spark=spark)
    assert main(["reset", "--config", str(yaml_path), "--from", "state", "--yes"]) == EXIT_OK
    run_job(one, once=True, spark=spark)
    assert sorted(sink.read(TableIdent("d", "a")).column("k").to_pylist()) == [1, 2]
    assert collect_status(one)["rows_held"] == 0


@pytest.mark.parametrize("engine", ["delta-rs", "spark"])
def test_partition_num_lowered_later_stops_waiting_for_the_partitions_left(engine: str, broker: Any, spark: Any,
                                                                           tmp_path: Path, unique_name: Any) -> None:
    """The changefeed's ``partition-num`` lowered from 3 to 2 (and ``source.options`` with it): TiCDC writes
    no more resolved ts to partition 2, whose last one held every later row for good (its watermark was in
    the state). Once partition 2 has been read to its end it is no longer waited for; its rows are applied."""
    from ticdc_delta.codec import encoder_for
    from ticdc_delta.codec.model import Column, ColumnFlag, Op, ResolvedEvent, RowChange, TypeCode
    from ticdc_delta.delta.sink import TableIdent

    topic = unique_name("pnum-lowered")
    broker.create_topic(topic, partitions=3)
    encode = encoder_for("canal-json", {"enable-tidb-extension": "true"}).encode
    key = ColumnFlag.HANDLE_KEY | ColumnFlag.PRIMARY_KEY

    def produce(partition: int, events: list[Any]) -> None:
        broker.produce_many(topic, [(partition, m.key, m.value) for m in encode(events)])

    def insert(ts: int, k: int) -> RowChange:
        return RowChange(ts, "d", "t", Op.INSERT, (Column("k", TypeCode.BIGINT, key, k),), None)

    def config(options: dict[str, str]) -> Any:
        return config_from_mapping({
            "changefeed": "lowered", "checkpoint": str(tmp_path / "ckpt"),
            "sink": {"path": str(tmp_path / "lake"), "engine": engine},
            "source": {"bootstrap_servers": broker.bootstrap_servers, "topic": topic, "protocol": "canal-json",
                       "options": {"enable-tidb-extension": "true", **options}},
        })

    base = 446_000_000_000_000_000
    for p in range(3):
        produce(p, [insert(base + 1 + p, p), ResolvedEvent(base + 5)])
    before = config({})
    run_job(before, once=True, spark=spark)
    sink = _ConfiguredSink(before)
    assert sorted(sink.read(TableIdent("d", "t")).column("k").to_pylist()) == [0, 1, 2]

    # partition-num 2 from here on: partition 2 gets nothing more, the others rows and resolved ts
    for p in range(2):
        produce(p, [insert(base + 6 + p, 10 + p), ResolvedEvent(base + 9)])
    after = config({"partition-num": "2"})
    run_job(after, once=True, spark=spark)
    assert sorted(sink.read(TableIdent("d", "t")).column("k").to_pylist()) == [0, 1, 2, 10, 11]
    assert collect_status(after)["rows_held"] == 0


def test_a_compacted_topic_is_refused_before_the_query_starts(broker: Any, tmp_path: Path, unique_name: Any) -> None:
    """Kafka's compaction keeps one message per key, and TiCDC's keys do not name one row (an Open Protocol
    key is a table and a commit ts: a transaction's 32 rows of one table are two messages of one key), so
    the rows of the messages compacted away were lost without a word. Refused, naming the topic and the
    setting to change; a topic that only deletes (the default) is read."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from ticdc_delta.errors import ConfigError
    from ticdc_delta.spark.batch_handler import check_cleanup_policy

    plain, compacted = unique_name("plain"), unique_name("compacted")
    broker.create_topic(plain, partitions=1)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    for future in admin.create_topics([NewTopic(compacted, num_partitions=1, replication_factor=1,
                                                config={"cleanup.policy": "compact,delete"})]).values():
        future.result(timeout=15)

    def cfg(*topics: str, protocol: str = "open-protocol") -> Any:
        return config_from_mapping({
            "changefeed": "cf", "checkpoint": str(tmp_path / "ckpt"), "sink": {"path": str(tmp_path / "lake")},
            "source": {"bootstrap_servers": broker.bootstrap_servers, "topics": list(topics), "protocol": protocol,
                       **({"schema_registry": {"url": "mock://r"}} if protocol == "avro" else {})},
        })

    check_cleanup_policy(cfg(plain, unique_name("not-there-yet")))
    with pytest.raises(ConfigError, match=rf"source\.topics: Kafka compacts {compacted} \(cleanup\.policy=compact,delete\)"
                                          r": compaction keeps one message per key"):
        check_cleanup_policy(cfg(plain, compacted))
    # Avro's key is the row's handle key: compaction keeps each row's last version (a delete's tombstone
    # expires, though): warned, not refused
    check_cleanup_policy(cfg(compacted, protocol="avro"))
