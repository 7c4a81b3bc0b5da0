"""Tests of :mod:`ticdc_delta.config`: YAML loading, ${ENV} substitution, validation messages that name
the YAML path, secret redaction, table-mapping precedence, and the shipped ``conf/*.yaml`` examples."""

from __future__ import annotations

import copy
import pickle
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ticdc_delta.config import (
    REDACTED,
    JobConfig,
    config_from_mapping,
    is_secret_key,
    load_config,
    substitute_env,
)
from ticdc_delta.errors import ConfigError, IdentifierError, TerminalError

REPO = Path(__file__).resolve().parent.parent
CONF_DIR = REPO / "conf"

# what the shipped examples need from the environment (a deployment sets these; values are dummies)
EXAMPLE_ENV = {
    "KAFKA_BOOTSTRAP": "broker-1:9093,broker-2:9093",
    "KAFKA_USER": "ticdc-delta",
    "KAFKA_PASSWORD": "kafka-pw-0d6f",
    "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-9c1e",
    "SR_URL": "http://schema-registry:8081",
    "SR_AUTH": "sr-user:sr-pw-77aa",
}

MINIMAL: dict[str, Any] = {
    "changefeed": "demo",
    "source": {"bootstrap_servers": "127.0.0.1:9092", "topic": "tidb-cdc", "protocol": "canal-json"},
    "sink": {"path": "/tmp/lake"},
    "checkpoint": "/tmp/ckpt/demo",
}


def _cfg(**overrides: Any) -> dict[str, Any]:
    """MINIMAL with dotted-path overrides, e.g. ``_cfg(**{"source.topic": None})`` (None deletes)."""
    data = copy.deepcopy(MINIMAL)
    for dotted, value in overrides.items():
        *parents, last = dotted.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return data


def _write(tmp_path: Path, data: Any, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False) if not isinstance(data, str) else data)
    return path


def _problems(exc: pytest.ExceptionInfo[ConfigError]) -> list[str]:
    return [line.strip() for line in str(exc.value).splitlines()[1:]]


# -- the happy path ----------------------------------------------------------------------------------


def test_minimal_config_gets_the_documented_defaults(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, MINIMAL), env={})
    assert cfg.changefeed == "demo"
    assert cfg.topics == ["tidb-cdc"]
    assert cfg.source.fail_on_data_loss is True
    assert cfg.source.starting_offsets == "earliest"
    assert cfg.source.max_offsets_per_trigger is None
    assert cfg.source.options == {} and cfg.source.kafka == {}
    assert cfg.sink.metadata_columns is None
    assert cfg.sink.source_timezone == "UTC"
    assert cfg.tables == []
    assert cfg.trigger_interval == "10 seconds" and cfg.trigger_interval_seconds == 10.0
    assert cfg.batch_timeout is None and cfg.batch_timeout_seconds is None
    assert cfg.log_level == "INFO"
    assert cfg.spark.master is None and cfg.spark.conf == {}
    assert cfg.ddl.drop_table == "ignore" and cfg.ddl.add_column == "evolve" and cfg.ddl.unknown == "fail"
    assert cfg.dead_letter_path == "/tmp/lake/_ticdc_dead_letter"
    assert cfg.consumer_group_id == "ticdc-delta-demo"
    assert cfg.librdkafka_conf() == {"bootstrap.servers": "127.0.0.1:9092"}


def test_protocol_names_match_the_codec_registry() -> None:
    from typing import get_args

    from ticdc_delta.codec import PROTOCOLS
    from ticdc_delta.config import Protocol

    assert get_args(Protocol) == PROTOCOLS


def test_setting_values_become_strings() -> None:
    cfg = config_from_mapping(
        _cfg(
            **{
                "source.options": {"enable-tidb-extension": True, "max-batch-size": 16, "ratio": 0.5},
                "source.kafka": {"enable.ssl.certificate.verification": False, "fetch.max.bytes": 1048576},
                "sink.storage_options": {"allow_http": True},
                "spark.conf": {"spark.sql.shuffle.partitions": 4},
            }
        ),
        env={},
    )
    assert cfg.source.options == {"enable-tidb-extension": "true", "max-batch-size": "16", "ratio": "0.5"}
    assert cfg.librdkafka_conf() == {
        "bootstrap.servers": "127.0.0.1:9092",
        "enable.ssl.certificate.verification": "false",
        "fetch.max.bytes": "1048576",
    }
    assert cfg.sink.storage_options == {"allow_http": "true"}
    assert cfg.spark.conf == {"spark.sql.shuffle.partitions": "4"}


def test_topics_list_and_bootstrap_list() -> None:
    cfg = config_from_mapping(
        _cfg(**{"source.topic": None, "source.topics": ["a", "b"], "source.bootstrap_servers": ["h1:9092", "h2:9092"]}),
        env={},
    )
    assert cfg.topics == ["a", "b"]
    assert cfg.librdkafka_conf()["bootstrap.servers"] == "h1:9092,h2:9092"


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, "ticdc-delta-demo"), (True, "ticdc-delta-demo"), (False, None), ("analytics", "analytics"),
     # boolean words from an environment default (`${GROUP:-false}`) are booleans, not group names
     ("false", None), ("off", None), (" No ", None), ("0", None), ("true", "ticdc-delta-demo"),
     ("on", "ticdc-delta-demo")],
)
def test_consumer_group_id(value: Any, expected: str | None) -> None:
    data = _cfg()
    data["source"]["consumer_group"] = value
    assert config_from_mapping(data, env={}).consumer_group_id == expected


def test_consumer_group_from_an_environment_default_false_commits_nothing() -> None:
    cfg = config_from_mapping(_cfg(**{"source.consumer_group": "${GROUP:-false}"}), env={})
    assert cfg.source.consumer_group is False and cfg.consumer_group_id is None


def test_starting_offsets_mapping() -> None:
    cfg = config_from_mapping(
        _cfg(**{"source.starting_offsets": {"tidb-cdc": {0: 5, "1": -2, 2: -1}}}), env={}
    )
    assert cfg.source.starting_offsets == {"tidb-cdc": {0: 5, 1: -2, 2: -1}}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, ("_tidb_commit_ts", "_tidb_op")),
        ("true", ("_tidb_commit_ts", "_tidb_op")),
        ({"op": "_change"}, ("_tidb_commit_ts", "_change")),
        ({"commit_ts": "_ts", "op": "_kind"}, ("_ts", "_kind")),
    ],
)
def test_metadata_columns(value: Any, expected: tuple[str, str]) -> None:
    meta = config_from_mapping(_cfg(**{"sink.metadata_columns": value}), env={}).sink.metadata_columns
    assert meta is not None and (meta.commit_ts, meta.op) == expected


@pytest.mark.parametrize("value", [False, "false", None])
def test_metadata_columns_off(value: Any) -> None:
    data = _cfg()
    data["sink"]["metadata_columns"] = value
    assert config_from_mapping(data, env={}).sink.metadata_columns is None


@pytest.mark.parametrize(
    ("value", "text", "seconds"),
    [
        ("10 seconds", "10 seconds", 10.0),
        ("1 minute 30 seconds", "1 minute 30 seconds", 90.0),
        ("interval 2 hours", "interval 2 hours", 7200.0),
        ("500 milliseconds", "500 milliseconds", 0.5),
        (30, "30 seconds", 30.0),
        (0, "0 seconds", 0.0),
        (1.5, "1.5 seconds", 1.5),
        (1e-07, "0.0000001 seconds", 1e-07),  # (not "1e-07 seconds", which no interval parser reads)
        ("45", "45 seconds", 45.0),  # a number of seconds as text: what ${TRIGGER:-45} gives
    ],
)
def test_trigger_interval(value: Any, text: str, seconds: float) -> None:
    cfg = config_from_mapping(_cfg(trigger_interval=value), env={})
    assert cfg.trigger_interval == text
    assert cfg.trigger_interval_seconds == pytest.approx(seconds)


@pytest.mark.parametrize(("value", "seconds"), [("30 minutes", 1800.0), ("1 hour 30 minutes", 5400.0), (90, 90.0),
                                               (None, None)])
def test_batch_timeout(value: Any, seconds: float | None) -> None:
    cfg = config_from_mapping(_cfg(batch_timeout=value), env={})
    assert cfg.batch_timeout_seconds == seconds


def test_log_level_is_normalised() -> None:
    assert config_from_mapping(_cfg(log_level="warn"), env={}).log_level == "WARNING"
    assert config_from_mapping(_cfg(log_level="debug"), env={}).log_level == "DEBUG"


def test_paths_join_for_local_paths_and_uris() -> None:
    cfg = config_from_mapping(_cfg(**{"sink.path": "s3://bucket/lake/"}), env={})
    assert cfg.table_path("shop", "orders") == "s3://bucket/lake/shop/orders"
    assert cfg.dead_letter_path == "s3://bucket/lake/_ticdc_dead_letter"
    cfg = config_from_mapping(_cfg(**{"dead_letter.path": "/rejects"}), env={})
    assert cfg.dead_letter_path == "/rejects"


@pytest.mark.parametrize("written", ["file:{p}", "file://{p}", "file://localhost{p}", "FILE:{p}", "{p}"])
def test_file_urls_become_the_local_paths_they_name(tmp_path: Path, written: str) -> None:
    # Hadoop writes file:/x: taken for a relative path it would have put the lake in a directory named
    # "file:" under the cwd; and the overlap checks compare paths with paths
    from ticdc_delta.locations import local_path

    places = {key: written.format(p=tmp_path / key) for key in ("sink.path", "checkpoint", "dead_letter.path")}
    cfg = config_from_mapping(_cfg(**places, tables=[{"source": "shop.orders", "path": written.format(
        p=tmp_path / "orders")}]), env={})
    assert (cfg.sink.path, cfg.checkpoint, cfg.dead_letter.path) == tuple(
        str(tmp_path / key) for key in ("sink.path", "checkpoint", "dead_letter.path"))
    assert local_path(cfg.table_path("shop", "orders")) == str(tmp_path / "orders")
    assert local_path(cfg.table_path("shop", "items")) == str(tmp_path / "sink.path" / "shop" / "items")
    assert local_path(cfg.checkpoint) == str(tmp_path / "checkpoint")


@pytest.mark.parametrize(("written", "expected"), [
    ("file://nas-1/lake", "not of host 'nas-1'"),
    ("file:lake", "needs an absolute path"),
])
def test_file_urls_that_name_no_local_file_are_refused(written: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=rf"sink\.path: .*{expected}"):
        config_from_mapping(_cfg(**{"sink.path": written}), env={})


def test_a_file_url_is_decoded_and_its_overlaps_found() -> None:
    cfg = config_from_mapping(_cfg(**{"sink.path": "file:///data/my%20lake"}), env={})
    assert cfg.sink.path == "/data/my lake"
    # a checkpoint written as a URL where a table lands (written as a path) is found all the same
    cfg = config_from_mapping(_cfg(**{"sink.path": "/data/lake", "checkpoint": "file:/data/lake/shop/orders"}),
                              env={})
    with pytest.raises(IdentifierError, match=r"overlaps checkpoint \(/data/lake/shop/orders/state\)"):
        cfg.table_path("shop", "orders")


def test_config_is_immutable() -> None:
    cfg = config_from_mapping(_cfg(), env={})
    with pytest.raises(Exception, match="frozen"):
        cfg.changefeed = "other"  # type: ignore[misc]


# -- table mapping -----------------------------------------------------------------------------------

TABLES = [
    {"source": "test.*", "partition_by": ["region"]},
    {"source": "test.tmp_*", "enabled": False},
    {"source": "*.orders", "key": ["order_id"]},
    {"source": "test.orders", "path": "/lake/sales/orders"},
    {"source": "other.Customers"},
]


@pytest.mark.parametrize(
    ("schema", "table", "expected_index"),
    [
        ("test", "orders", 3),  # exact beats the wildcards listed before it
        ("TEST", "Orders", 3),  # TiDB names compare case-insensitively
        ("test", "tmp_x", 0),  # first matching wildcard in file order wins: test.* comes first
        ("shop", "orders", 2),
        ("test", "users", 0),
        ("other", "customers", 4),
        ("other", "users", None),
        ("testing", "users", None),  # `test.*` is anchored: the schema must be exactly "test"
        ("te.st", "orders", 2),  # `*` matches any run of characters
    ],
)
def test_table_mapping_precedence(schema: str, table: str, expected_index: int | None) -> None:
    cfg = config_from_mapping(_cfg(tables=TABLES), env={})
    found = cfg.table_mapping_for(schema, table)
    if expected_index is None:
        assert found is None
    else:
        assert found is cfg.tables[expected_index]


def test_wildcard_order_lets_a_narrow_pattern_win_when_listed_first() -> None:
    cfg = config_from_mapping(_cfg(tables=[TABLES[1], TABLES[0]]), env={})
    mapping = cfg.table_mapping_for("test", "tmp_scratch")
    assert mapping is not None and mapping.enabled is False
    mapping = cfg.table_mapping_for("test", "users")
    assert mapping is not None and mapping.enabled and mapping.partition_by == ["region"]


def test_entries_may_share_a_path_and_use_the_checkpoint_directory_beside_the_job() -> None:
    cfg = config_from_mapping(_cfg(tables=[{"source": "a.b", "path": "/data/t"}, {"source": "a.c", "path": "/data/t"},
                                           {"source": "a.d", "path": "/tmp/ckpt/demo/mine"}]), env={})
    assert cfg.table_path("a", "b") == cfg.table_path("A", "c") == "/data/t"


def test_table_path_uses_mapping_then_default() -> None:
    cfg = config_from_mapping(_cfg(tables=TABLES), env={})
    assert cfg.table_path("test", "orders") == "/lake/sales/orders"
    assert cfg.table_path("test", "users") == "/tmp/lake/test/users"
    assert cfg.table_path("nomap", "t") == "/tmp/lake/nomap/t"


def test_table_path_encodes_and_folds_names() -> None:
    cfg = config_from_mapping(_cfg(tables=TABLES), env={})
    assert cfg.case_sensitive is False
    assert cfg.table_path("Test", "ORDERS") == "/lake/sales/orders"  # the mapping matches any case
    assert cfg.table_path("s", "../../escape") == "/tmp/lake/s/@002e.@002f..@002fescape"
    assert cfg.table_path("/abs", "t") != cfg.table_path("abs", "t")
    assert cfg.table_path("a/b", "t") != cfg.table_path("a", "b/t")
    assert cfg.table_path("Shop", "Orders") == cfg.table_path("shop", "orders") == "/tmp/lake/shop/orders"
    assert cfg.dead_letter_path == "/tmp/lake/_ticdc_dead_letter"
    with pytest.raises(IdentifierError, match="table name is empty"):
        cfg.table_path("s", "")


def test_case_sensitive_option() -> None:
    cfg = config_from_mapping(_cfg(case_sensitive=True, tables=TABLES), env={})
    assert cfg.table_path("Shop", "Orders") == "/tmp/lake/Shop/Orders"
    assert cfg.table_path("test", "orders") == "/lake/sales/orders"
    assert cfg.table_path("Test", "orders") == "/tmp/lake/Test/orders"  # no longer matches test.orders
    both = [{"source": "shop.orders"}, {"source": "Shop.Orders"}]
    assert len(config_from_mapping(_cfg(case_sensitive=True, tables=both), env={}).tables) == 2
    with pytest.raises(ConfigError, match=r"tables\[1\]\.source: already mapped by tables\[0\]"):
        config_from_mapping(_cfg(tables=both), env={})
    with pytest.raises(ConfigError, match="case_sensitive: Input should be a valid boolean"):
        config_from_mapping(_cfg(case_sensitive="maybe"), env={})


# -- errors name the YAML path -----------------------------------------------------------------------

ERROR_CASES = [
    # (overrides, expected problem line — a regex anchored at the start of a line)
    ({"changefeed": None}, r"changefeed: required key is missing"),
    ({"changefeed": "my feed"}, r"changefeed: must be non-empty and hold only letters"),
    ({"checkpoint": None}, r"checkpoint: required key is missing"),
    ({"checkpoint": " "}, r"checkpoint: must not be empty"),
    ({"source": None}, r"source: required key is missing"),
    ({"source": "kafka"}, r"source: expected a mapping"),
    ({"source.bootstrap_servers": None}, r"source\.bootstrap_servers: required key is missing"),
    ({"source.bootstrap_servers": "localhost"}, r"source\.bootstrap_servers: expected a comma-separated list"),
    ({"source.protocol": None}, r"source\.protocol: required key is missing"),
    ({"source.protocol": "maxwell"}, r"source\.protocol: Input should be 'open-protocol', 'craft', 'canal-json'"),
    ({"source.topic": None}, r"source: set exactly one of topic \(one name\) or topics \(a list\)"),
    ({"source.topics": ["a"]}, r"source\.topics: set exactly one of topic"),
    ({"source.topic": None, "source.topics": []}, r"source\.topics: must name at least one topic"),
    ({"source.topic": None, "source.topics": ["a", "a"]}, r"source\.topics\[1\]: this topic is listed twice"),
    ({"source.reader": "python"}, r"source\.reader: "),
    ({"source.max_offsets_per_trigger": 0}, r"source\.max_offsets_per_trigger: Input should be greater than 0"),
    ({"source.max_offsets_per_trigger": True}, r"source\.max_offsets_per_trigger: expected an integer, got a bool"),
    ({"source.max_offsets_per_trigger": "many"}, r"source\.max_offsets_per_trigger: Input should be a valid integer"),
    ({"source.starting_offsets": "newest"}, r"source\.starting_offsets: expected earliest, latest or a mapping"),
    (
        {"source.starting_offsets": {"tidb-cdc": {"p0": 1}}},
        r'source\.starting_offsets\["tidb-cdc"\]\.p0: a partition must be an integer >= 0',
    ),
    (
        {"source.starting_offsets": {"tidb-cdc": {0: -3}}},
        r'source\.starting_offsets\["tidb-cdc"\]\[0\]: an offset must be an integer >= 0',
    ),
    (
        {"source.starting_offsets": {"other": {0: 1}}},
        r"source\.starting_offsets\.other: not one of the source topics",
    ),
    (
        {"source.topic": None, "source.topics": ["tidb-cdc", "b"], "source.starting_offsets": {"tidb-cdc": {0: 1}}},
        r"source\.starting_offsets: name every source topic's partitions: \['b'\] missing",
    ),
    (
        {"source.options": {"enable-tidb-extension": [True]}},
        r'source\.options\["enable-tidb-extension"\]: expected a string, number or boolean, got a list',
    ),
    ({"source.options": "a=b"}, r"source\.options: expected a mapping"),
    (
        {"source.kafka": {"bootstrap.servers": "x:1"}},
        r'source\.kafka\["bootstrap\.servers"\]: set it as source\.bootstrap_servers',
    ),
    ({"source.kafka": {"group.id": "g"}}, r'source\.kafka\["group\.id"\]: set it as source\.consumer_group'),
    ({"source.kafka": {"sasl password": "x"}}, r'source\.kafka\["sasl password"\]: a setting name may only hold'),
    (
        {"source.kafka": {"sasl.username": None}},
        r'source\.kafka\["sasl\.username"\]: expected a string, number or boolean, got null',
    ),
    ({"source.consumer_group": ""}, r"source\.consumer_group: expected a group name"),
    ({"source.consumer_group": 5}, r"source\.consumer_group: expected a group name"),
    ({"source.protocol": "avro"}, r"source: protocol avro needs schema_registry .* or avro_schemas"),
    (
        {"source.schema_registry": {"url": "http://sr:8081"}},
        r"source\.schema_registry: only used with protocol avro, not canal-json",
    ),
    ({"source.avro_schemas": {1: "a.avsc"}}, r"source\.avro_schemas: only used with protocol avro"),
    (
        {"source.protocol": "avro", "source.avro_schemas": {"one": "a.avsc"}},
        r"source\.avro_schemas\.one: invalid key: Input should be a valid integer",
    ),
    (
        {"source.protocol": "avro", "source.avro_schemas": {1: ""}},
        r"source\.avro_schemas\[1\]: must not be empty",
    ),
    (
        {"source.protocol": "avro", "source.schema_registry": {"url": "sr:8081"}},
        r"source\.schema_registry\.url: expected http://, https://",
    ),
    (
        {"source.protocol": "avro", "source.schema_registry": {"basic.auth.user.info": "u:p"}},
        r"source\.schema_registry\.url: required key is missing",
    ),
    (
        {"source.protocol": "avro", "source.schema_registry": {"url": "http://sr", "cache.capacity": 0}},
        r'source\.schema_registry\["cache\.capacity"\]: Input should be greater than 0',
    ),
    (
        {"source.protocol": "avro", "source.schema_registry": {"url": "http://sr", "ssl.key.location": "k.pem"}},
        r'source\.schema_registry\["ssl\.certificate\.location"\]: required with ssl\.key\.location',
    ),
    (
        {"source.protocol": "avro", "source.schema_registry": {"url": "http://u:p@sr", "basic.auth.user.info": "u:p"}},
        r'source\.schema_registry\["basic\.auth\.user\.info"\]: give credentials either here or in the url',
    ),
    ({"sink": None}, r"sink: required key is missing"),
    ({"sink.path": None}, r"sink\.path: required key is missing"),
    ({"sink.path": ""}, r"sink\.path: must not be empty"),
    (
        {"sink.storage_options": {"AWS_REGION": {"a": 1}}},
        r"sink\.storage_options\.AWS_REGION: expected a string, number or boolean, got a mapping",
    ),
    ({"sink.metadata_columns": "sometimes"}, r"sink\.metadata_columns: expected a mapping"),
    (
        {"sink.metadata_columns": {"commit_ts": "x", "op": "X"}},
        r"sink\.metadata_columns\.op: must differ from commit_ts",
    ),
    ({"sink.metadata_columns": {"op": ""}}, r"sink\.metadata_columns\.op: must not be empty"),
    ({"sink.source_timezone": "Mars/Olympus"}, r"sink\.source_timezone: unknown time zone; expected an IANA name"),
    ({"sink.source_timezone": "../../etc/passwd"}, r"sink\.source_timezone: unknown time zone"),
    ({"tables": {"source": "a.b"}}, r"tables: expected a list"),
    ({"tables": [{"path": "/x"}]}, r"tables\[0\]\.source: required key is missing"),
    ({"tables": [{"source": "orders"}]}, r'tables\[0\]\.source: expected "schema\.table"'),
    ({"tables": [{"source": "a.b.c"}]}, r'tables\[0\]\.source: expected "schema\.table"'),
    ({"tables": [{"source": ".b"}]}, r'tables\[0\]\.source: expected "schema\.table"'),
    ({"tables": [{"source": "a.b", "path": ""}]}, r"tables\[0\]\.path: must not be empty"),
    ({"tables": [{"source": "a.b", "key": []}]}, r"tables\[0\]\.key: must name at least one column"),
    ({"tables": [{"source": "a.b", "key": ["id", "ID"]}]}, r"tables\[0\]\.key\[1\]: this column is listed twice"),
    ({"tables": [{"source": "a.b", "partition_by": "region"}]}, r"tables\[0\]\.partition_by: expected a list"),
    ({"tables": [{"source": "a.b", "enabled": "maybe"}]}, r"tables\[0\]\.enabled: Input should be a valid boolean"),
    ({"tables": [{"source": "a.b"}, {"source": "A.B"}]}, r"tables\[1\]\.source: already mapped by tables\[0\]"),
    ({"dead_letter.path": ""}, r"dead_letter\.path: must not be empty"),
    # a table location must be its own: not the job's state, Spark's checkpoint, the dead letters, another table's
    (
        {"tables": [{"source": "a.b", "path": "/tmp/lake/_ticdc_dead_letter"}]},
        r"tables\[0\]\.path: overlaps dead_letter\.path \(/tmp/lake/_ticdc_dead_letter\)",
    ),
    ({"tables": [{"source": "a.b", "path": "/tmp/ckpt/demo/state"}]}, r"tables\[0\]\.path: overlaps checkpoint"),
    ({"tables": [{"source": "a.*", "path": "/tmp/ckpt"}]}, r"tables\[0\]\.path: overlaps checkpoint"),
    ({"dead_letter.path": "/tmp/ckpt/demo/spark/dl"}, r"dead_letter\.path: overlaps checkpoint \(/tmp/ckpt/demo/spark\)"),
    (
        {"tables": [{"source": "a.b", "path": "/data/t"}, {"source": "a.c", "path": "/data/t/inner"}]},
        r"tables\[1\]\.path: lies inside or holds tables\[0\]\.path \(/data/t\)",
    ),
    ({"sink.engine": "delta-rs", "sink.table_properties": {"delta.enableRowTracking": "true"}},
     r'sink\.table_properties\["delta\.enableRowTracking"\]: engine delta-rs cannot create a table with this property'),
    # every table without a path of its own would land inside it
    ({"tables": [{"source": "a.*", "path": "/tmp/lake"}], "dead_letter.path": "/tmp/dl"},
     r"tables\[0\]\.path: is or holds sink\.path \(/tmp/lake\)"),
    ({"tables": [{"source": "a.b", "path": "/tmp"}], "dead_letter.path": "/dl", "checkpoint": "/ckpt"},
     r"tables\[0\]\.path: is or holds sink\.path \(/tmp/lake\)"),
    # spellings that can name no TiDB table: the entry would silently do nothing
    ({"tables": [{"source": "shop .orders", "enabled": False}]},
     r"tables\[0\]\.source: 'shop ' ends with a space"),
    ({"tables": [{"source": "`shop`.`orders`"}]}, r"tables\[0\]\.source: '`shop`' is quoted"),
    ({"dead_letter.fail_on_error": "perhaps"}, r"dead_letter\.fail_on_error: Input should be a valid boolean"),
    ({"trigger_interval": "10 secs"}, r"trigger_interval: expected an interval such as \"10 seconds\""),
    ({"trigger_interval": "soon"}, r"trigger_interval: expected an interval"),
    ({"trigger_interval": -1}, r"trigger_interval: must not be negative"),
    ({"trigger_interval": float("inf")}, r"trigger_interval: expected a finite number of seconds, got inf"),
    ({"source.max_future_ts": float("nan")}, r"source\.max_future_ts: expected a finite number of seconds"),
    ({"sink.merge_threads": True}, r"sink\.merge_threads: expected an integer, got a bool"),
    ({"sink.split_rows": True}, r"sink\.split_rows: expected an integer, got a bool"),
    ({"sink.columnar_rows": False}, r"sink\.columnar_rows: expected an integer, got a bool"),
    ({"sink.merge_key_range_rows": True}, r"sink\.merge_key_range_rows: expected an integer, got a bool"),
    ({"sink.conflict_retries": False}, r"sink\.conflict_retries: expected an integer, got a bool"),
    ({"source.topic": "orders,payments"}, r"source\.topic: 'orders,payments' is not a Kafka topic name"),
    ({"source.topic": None, "source.topics": ["a", "b c"]}, r"source\.topics: 'b c' is not a Kafka topic"),
    # what the decoder (on the executors) and Spark's Kafka source refuse is refused before anything starts
    (
        {"source.options": {"large-message-handle-compression": "zstd"}},
        r"source\.options: option large-message-handle-compression must be one of none, lz4, snappy",
    ),
    (
        {"source.protocol": "avro", "source.avro_schemas": {1: "a.avsc"},
         "source.options": {"avro-enable-watermark": "true"}},
        r'source\.options\["avro-enable-watermark"\]: not supported',
    ),
    ({"source.options": {"partition-num": "0"}}, r'source\.options\["partition-num"\]: expected a number of partitions'),
    (
        {"source.options": {"enable-tidb-extension": "maybe"}},
        r"source\.options: option enable-tidb-extension must be true or false",
    ),
    (
        {"source.kafka": {"auto.offset.reset": "earliest"}},
        r"source\.kafka: Kafka setting\(s\) auto\.offset\.reset are managed by the source",
    ),
    (
        {"source.kafka": {"ssl.key.location": "k.pem"}},
        r"source\.kafka: librdkafka setting\(s\) ssl\.key\.location have no direct Java client equivalent",
    ),
    (
        {"source.kafka": {"sasl.username": "u", "sasl.jaas.config": "x"}},
        r"source\.kafka: give either sasl\.username/sasl\.password or sasl\.jaas\.config",
    ),
    (
        {"source.kafka": {"sasl.mechanism": "PLAIN", "sasl.jaas.config":
                          "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"}},
        r'source\.kafka\["sasl\.jaas\.config"\]: login module org\.apache\.kafka\.common\.security\.oauthbearer\.'
        r"OAuthBearerLoginModule is not supported: .* PlainLoginModule or ScramLoginModule",
    ),
    (
        {"source.kafka": {"sasl.mechanism": "SCRAM-SHA-256",
                          "sasl.jaas.config": "com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true;"}},
        r'source\.kafka\["sasl\.jaas\.config"\]: login module com\.sun\.security\.auth\.module\.Krb5LoginModule is '
        r"not supported",
    ),
    (
        {"source.kafka": {"sasl.mechanism": "PLAIN",
                          "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required "
                                              'password="p";'}},
        r'source\.kafka\["sasl\.jaas\.config"\]: .*PlainLoginModule has no username; give sasl\.username/sasl\.password',
    ),
    (
        {"source.kafka": {"sasl.mechanism": "PLAIN", "sasl.jaas.config": "x"}},
        r'source\.kafka\["sasl\.jaas\.config"\]: expected one login module, .*give sasl\.username/sasl\.password instead',
    ),
    (
        {"source.kafka": {"ssl.keystore.type": "JKS", "ssl.keystore.location": "/ks.jks"}},
        r'source\.kafka\["ssl\.keystore\.type"\]: the job\'s librdkafka clients .* read only a PKCS12 keystore, not JKS',
    ),
    ({"batch_timeout": 0}, r"batch_timeout: must be longer than 0 \(null turns the watchdog off\)"),
    ({"batch_timeout": "0 seconds"}, r"batch_timeout: must be longer than 0"),
    ({"batch_timeout": "a while"}, r"batch_timeout: expected an interval"),
    ({"batch_timeout": True}, r"batch_timeout: expected an interval"),
    ({"log_level": "LOUD"}, r"log_level: Input should be 'DEBUG', 'INFO', 'WARNING', 'ERROR' or 'CRITICAL'"),
    ({"spark.master": ""}, r"spark\.master: must not be empty"),
    ({"spark.conf": {"spark.x": [1]}}, r'spark\.conf\["spark\.x"\]: expected a string, number or boolean'),
    ({"ddl.drop_table": "drop"}, r"ddl\.drop_table: Input should be 'evolve', 'ignore' or 'fail'"),
    ({"ddl.unknown": "evolve"}, r"ddl\.unknown: Input should be 'fail' or 'ignore'"),
    ({"ddl.partition_data": "evolve"}, r"ddl\.partition_data: Input should be 'fail' or 'ignore'"),
]


@pytest.mark.parametrize(("overrides", "expected"), ERROR_CASES, ids=[c[1][:60] for c in ERROR_CASES])
def test_every_error_names_its_yaml_path(tmp_path: Path, overrides: dict[str, Any], expected: str) -> None:
    path = _write(tmp_path, _cfg(**overrides))
    with pytest.raises(ConfigError, match=re.escape(str(path))) as exc:
        load_config(path, env={})
    problems = _problems(exc)
    assert any(re.match(expected, line) for line in problems), problems


def test_all_problems_are_reported_at_once() -> None:
    data = _cfg(**{"source.max_offsets_per_trigger": -5, "sink.path": "", "log_level": "x", "ddl.no_op": "y"})
    with pytest.raises(ConfigError) as exc:
        config_from_mapping(data, env={})
    paths = [line.split(":")[0] for line in _problems(exc)]
    assert paths == ["source.max_offsets_per_trigger", "sink.path", "log_level", "ddl.no_op"]


def test_config_error_is_terminal_and_pickles() -> None:
    with pytest.raises(ConfigError) as exc:
        config_from_mapping(_cfg(checkpoint=""), env={})
    assert isinstance(exc.value, TerminalError) and not exc.value.retryable
    assert str(pickle.loads(pickle.dumps(exc.value))) == str(exc.value)


UNKNOWN_KEY_CASES = [
    ({"colour": "blue"}, "colour", "changefeed, source, sink"),
    ({"source.colour": 1}, "source.colour", "bootstrap_servers, topic, topics, protocol"),
    ({"sink.colour": 1}, "sink.colour", "path, storage_options, metadata_columns, source_timezone"),
    ({"sink.metadata_columns": {"ts": "x"}}, "sink.metadata_columns.ts", "commit_ts, op"),
    ({"tables": [{"source": "a.b", "colour": 1}]}, "tables[0].colour", "source, path, key, partition_by, enabled"),
    ({"dead_letter.colour": 1}, "dead_letter.colour", "path, fail_on_error"),
    ({"spark.colour": 1}, "spark.colour", "master, app_name, conf"),
    ({"ddl.alter_table": "evolve"}, "ddl.alter_table", "create_table, drop_table"),
    (
        {"source.protocol": "avro", "source.schema_registry": {"url": "http://sr", "basic.auth.user": "u"}},
        'source.schema_registry["basic.auth.user"]',
        "url, basic.auth.user.info",
    ),
]


@pytest.mark.parametrize(("overrides", "path", "allowed"), UNKNOWN_KEY_CASES, ids=[c[1] for c in UNKNOWN_KEY_CASES])
def test_unknown_keys_are_rejected_at_any_depth(overrides: dict[str, Any], path: str, allowed: str) -> None:
    with pytest.raises(ConfigError) as exc:
        config_from_mapping(_cfg(**overrides), env={})
    line = f"{path}: unknown key (expected one of: {allowed}"
    assert any(p.startswith(line) for p in _problems(exc)), _problems(exc)


# -- YAML-level errors -------------------------------------------------------------------------------


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match=r"cannot read configuration file /nonexistent/job\.yaml"):
        load_config("/nonexistent/job.yaml")


def test_yaml_syntax_error_gives_line_and_column(tmp_path: Path) -> None:
    path = _write(tmp_path, "changefeed: demo\nsource:\n  topic: [a, b\nsink: {}\n")
    with pytest.raises(ConfigError, match=r"not valid YAML: line \d+, column \d+: "):
        load_config(path, env={})


def test_duplicate_keys_are_rejected(tmp_path: Path) -> None:
    path = _write(tmp_path, "changefeed: a\nchangefeed: b\n")
    with pytest.raises(ConfigError, match=r"line 2, column 1: duplicate key 'changefeed'"):
        load_config(path, env={})


@pytest.mark.parametrize(("text", "expected"), [("", "the file is empty"), ("- a\n- b\n", "expected a mapping")])
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=rf"\(top level\): {expected}"):
        load_config(_write(tmp_path, text), env={})


# -- ${ENV} substitution -----------------------------------------------------------------------------


def test_env_substitution_with_defaults_and_embedding(tmp_path: Path) -> None:
    text = (
        "changefeed: ${FEED}\n"
        "source:\n"
        "  bootstrap_servers: ${KAFKA_HOST:-localhost}:${KAFKA_PORT:-9092}\n"
        "  topic: ${TOPIC:-tidb-cdc}\n"
        "  protocol: canal-json\n"
        "  max_offsets_per_trigger: ${MAX_OFFSETS}\n"
        "sink: {path: '${LAKE}/tidb', source_timezone: '${TZ_NAME:-UTC}'}\n"
        "checkpoint: /ckpt/$${not_a_var}\n"
    )
    env = {"FEED": "feed-1", "KAFKA_PORT": "19092", "MAX_OFFSETS": "5000", "LAKE": "s3://b/l", "TZ_NAME": ""}
    cfg = load_config(_write(tmp_path, text), env=env)
    assert cfg.changefeed == "feed-1"
    assert cfg.source.bootstrap_servers == "localhost:19092"
    assert cfg.topics == ["tidb-cdc"]
    assert cfg.source.max_offsets_per_trigger == 5000  # substituted text is validated like YAML text
    assert cfg.sink.path == "s3://b/l/tidb"
    assert cfg.sink.source_timezone == "UTC"  # `:-` also applies when the variable is empty
    assert cfg.checkpoint == "/ckpt/${not_a_var}"  # `$${` is a literal `${`


def test_env_defaults_to_os_environ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TICDC_DELTA_TEST_FEED", "from-os-env")
    path = _write(tmp_path, _cfg(changefeed="${TICDC_DELTA_TEST_FEED}"))
    assert load_config(path).changefeed == "from-os-env"


def test_substituted_values_are_not_parsed_again() -> None:
    data = _cfg(**{"source.kafka": {"sasl.password": "${PW}"}})
    cfg = config_from_mapping(data, env={"PW": "yes: [1, ${X}]"})
    assert cfg.source.kafka["sasl.password"] == "yes: [1, ${X}]"


def test_missing_variables_name_the_yaml_path_and_the_variable(tmp_path: Path) -> None:
    text = (
        "changefeed: demo\n"
        "source:\n"
        "  bootstrap_servers: ${KAFKA_BOOTSTRAP}\n"
        "  topic: tidb-cdc\n"
        "  protocol: canal-json\n"
        "  kafka:\n"
        "    sasl.password: ${KAFKA_PASSWORD}\n"
        "sink: {path: /lake}\n"
        "tables:\n"
        "  - {source: a.b, path: '${LAKE}/b'}\n"
        "checkpoint: /ckpt\n"
    )
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match=re.escape(str(path))) as exc:
        load_config(path, env={"LAKE": ""})
    assert _problems(exc) == [
        "source.bootstrap_servers: environment variable KAFKA_BOOTSTRAP is not set"
        " (write ${KAFKA_BOOTSTRAP:-default} to give a default)",
        'source.kafka["sasl.password"]: environment variable KAFKA_PASSWORD is not set'
        " (write ${KAFKA_PASSWORD:-default} to give a default)",
    ]
    # an empty variable without `:-` is a value (here it leaves `/b` as the path)
    cfg = load_config(path, env={"KAFKA_BOOTSTRAP": "k:9092", "KAFKA_PASSWORD": "x", "LAKE": ""})
    assert cfg.tables[0].path == "/b"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("${1BAD}", r"checkpoint: bad reference \$\{1BAD\.\.\.\}; expected \$\{NAME\} or \$\{NAME:-default\}"),
        ("/ckpt/${UNCLOSED", r"checkpoint: unclosed \$\{ \(write \$\$\{ for a literal \$\{\)"),
        ("${A:-${B}}", r"checkpoint: nested references are not supported in \$\{A:-\.\.\.\}"),
    ],
)
def test_malformed_references(value: str, expected: str) -> None:
    with pytest.raises(ConfigError) as exc:
        config_from_mapping(_cfg(checkpoint=value), env={"A": "1", "B": "2"})
    assert any(re.match(expected, p) for p in _problems(exc)), _problems(exc)


def test_substitute_env_leaves_keys_and_non_strings_alone() -> None:
    data = {"${K}": [1, True, None, "${V}"]}
    assert substitute_env(data, {"K": "k", "V": "v"}) == {"${K}": [1, True, None, "v"]}


# -- secrets -----------------------------------------------------------------------------------------

SECRETS = {
    "KAFKA_PASSWORD": "kafka-s3cr3t-value",
    "JAAS": 'org.apache.kafka.common.security.plain.PlainLoginModule required username="svc" password=jaas-s3cr3t;',
    "SSL_KEY_PW": "sslkey-s3cr3t",
    "SR_AUTH": "sr-user:sr-s3cr3t",
    "SR_TOKEN": "bearer-s3cr3t",
    "AWS_SECRET": "aws-s3cr3t",
    "AZURE_KEY": "azure-account-key-s3cr3t",
    "GCS_CREDS": "gcs-credential-s3cr3t",
    "SINK_PW": "sink-uri-s3cr3t",
    "SPARK_KEY": "spark-s3a-s3cr3t",
}


def _secret_config(*overrides: tuple[tuple[str, ...], Any]) -> dict[str, Any]:
    """A config full of ${secret} references; ``overrides`` are (key path, value) pairs (the
    setting names hold dots, so paths are tuples)."""
    data = _cfg(
        **{
            "source.protocol": "avro",
            "source.options": {"sasl-password": "${SINK_PW}", "enable-tidb-extension": True},
            "source.kafka": {
                "security.protocol": "SASL_SSL",
                "sasl.username": "svc-user",
                "sasl.password": "${KAFKA_PASSWORD}",
                "ssl.keystore.password": "${SSL_KEY_PW}",  # (ssl.key.password: no Java client equivalent)
            },
            "source.schema_registry": {
                "url": "https://schema-registry:8081",
                "basic.auth.user.info": "${SR_AUTH}",
                "bearer.auth.token": "${SR_TOKEN}",
            },
            "sink.storage_options": {
                "AWS_REGION": "eu-west-1",
                "AWS_SECRET_ACCESS_KEY": "${AWS_SECRET}",
                "azure_storage_account_key": "${AZURE_KEY}",
                "google_service_account_credentials": "${GCS_CREDS}",
            },
            "spark.conf": {"spark.hadoop.fs.s3a.secret.key": "${SPARK_KEY}"},
        }
    )
    for (*parents, last), value in overrides:
        node = data
        for part in parents:
            node = node[part]
        node[last] = value
    return data


def _assert_no_secret(text: str) -> None:
    for name, secret in SECRETS.items():
        assert secret not in text, f"{name} leaked"
        assert "s3cr3t" not in text, "a secret fragment leaked"


def test_redacted_hides_every_secret_and_keeps_the_rest() -> None:
    cfg = config_from_mapping(_secret_config(), env=SECRETS)
    # the real values are there for the consumer ...
    assert cfg.librdkafka_conf()["sasl.password"] == SECRETS["KAFKA_PASSWORD"]
    assert cfg.source.schema_registry is not None
    assert cfg.source.schema_registry.client_conf() == {
        "url": "https://schema-registry:8081",
        "basic.auth.user.info": SECRETS["SR_AUTH"],
        "bearer.auth.token": SECRETS["SR_TOKEN"],
    }
    # ... and never in what gets logged
    red = cfg.redacted()
    _assert_no_secret(repr(red))
    _assert_no_secret(repr(cfg))
    _assert_no_secret(str(cfg))
    _assert_no_secret(repr(cfg.source))
    _assert_no_secret(repr(cfg.source.schema_registry))
    _assert_no_secret(repr(cfg.sink))
    _assert_no_secret(repr(cfg.spark))
    kafka = red["source"]["kafka"]
    assert kafka["sasl.password"] == kafka["ssl.keystore.password"] == REDACTED
    assert kafka["sasl.username"] == "svc-user" and kafka["security.protocol"] == "SASL_SSL"
    assert red["source"]["options"] == {"sasl-password": REDACTED, "enable-tidb-extension": "true"}
    registry = red["source"]["schema_registry"]
    assert registry["basic.auth.user.info"] == registry["bearer.auth.token"] == REDACTED
    assert registry["url"] == "https://schema-registry:8081"
    storage = red["sink"]["storage_options"]
    assert storage["AWS_REGION"] == "eu-west-1"
    assert storage["AWS_SECRET_ACCESS_KEY"] == storage["azure_storage_account_key"] == REDACTED
    assert storage["google_service_account_credentials"] == REDACTED
    assert red["spark"]["conf"]["spark.hadoop.fs.s3a.secret.key"] == REDACTED
    assert red["changefeed"] == "demo" and red["sink"]["path"] == "/tmp/lake"


def test_redacted_hides_a_jaas_config() -> None:
    data = _secret_config()
    kafka = data["source"]["kafka"]
    del kafka["sasl.username"], kafka["sasl.password"]  # (one or the other: both is refused)
    kafka["sasl.jaas.config"] = "${JAAS}"
    cfg = config_from_mapping(data, env=SECRETS)
    assert cfg.redacted()["source"]["kafka"]["sasl.jaas.config"] == REDACTED
    _assert_no_secret(repr(cfg))


def test_a_plain_or_scram_jaas_config_logs_the_librdkafka_clients_in() -> None:
    """``sasl.jaas.config`` goes to Spark's source unchanged; the job's librdkafka clients (broker probe,
    group mirror) get its username and password under their own names, so they log in as the source does."""
    data = _secret_config()
    kafka = data["source"]["kafka"]
    del kafka["sasl.username"], kafka["sasl.password"]
    kafka["sasl.mechanism"] = "SCRAM-SHA-512"
    kafka["sasl.jaas.config"] = "${JAAS}"
    conf = config_from_mapping(data, env=SECRETS).librdkafka_conf()
    assert (conf["sasl.username"], conf["sasl.password"]) == ("svc", "jaas-s3cr3t")
    assert "sasl.jaas.config" not in conf and conf["sasl.mechanism"] == "SCRAM-SHA-512"
    # OAUTHBEARER (or GSSAPI): librdkafka has settings of its own; the JAAS login module is the Java client's
    kafka["sasl.mechanism"] = "OAUTHBEARER"
    kafka["sasl.oauthbearer.method"] = "oidc"
    kafka["sasl.jaas.config"] = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"
    conf = config_from_mapping(data, env=SECRETS).librdkafka_conf()
    assert "sasl.username" not in conf and conf["sasl.oauthbearer.method"] == "oidc"


def test_a_pkcs12_keystore_reaches_the_librdkafka_clients() -> None:
    """The client certificate the docs ask for (``ssl.keystore.*``, the Java client's) is presented by the
    broker probe too: librdkafka reads a PKCS#12 keystore under the same names (not the type)."""
    kafka = {"security.protocol": "SSL", "ssl.keystore.location": "/etc/kafka/client.p12",
             "ssl.keystore.password": "${SSL_KEY_PW}"}
    for extra in ({}, {"ssl.keystore.type": "pkcs12"}):
        cfg = config_from_mapping(_cfg(**{"source.kafka": {**kafka, **extra}}), env=SECRETS)
        assert cfg.librdkafka_conf() == {"bootstrap.servers": cfg.source.bootstrap_servers, "security.protocol": "SSL",
                                         "ssl.keystore.location": "/etc/kafka/client.p12",
                                         "ssl.keystore.password": SECRETS["SSL_KEY_PW"]}


def test_redacted_hides_credentials_in_the_registry_url() -> None:
    data = _secret_config((("source", "schema_registry", "url"), "https://user:url-s3cr3t@sr:8081,https://sr2:8081"))
    del data["source"]["schema_registry"]["basic.auth.user.info"]
    cfg = config_from_mapping(data, env=SECRETS)
    url = cfg.redacted()["source"]["schema_registry"]["url"]
    assert url == "https://***@sr:8081,https://sr2:8081"
    _assert_no_secret(repr(cfg.source.schema_registry))


@pytest.mark.parametrize(
    "overrides",
    [
        # an unrelated error: the secrets must not ride along in the message
        [(("checkpoint",), "")],
        # a secret that is itself invalid (no ':' in USER:PASSWORD)
        [(("source", "schema_registry", "basic.auth.user.info"), "${KAFKA_PASSWORD}")],
        # wrong type for a secret value
        [(("source", "kafka", "sasl.password"), ["${KAFKA_PASSWORD}"])],
        # secrets substituted into fields that reject them (number, time zone, pattern, interval, enum)
        [(("source", "schema_registry", "timeout"), "${SR_TOKEN}")],
        [(("sink", "source_timezone"), "${AZURE_KEY}"), (("sink", "path"), "")],
        [(("changefeed",), "${SR_AUTH}"), (("trigger_interval",), "${GCS_CREDS}")],
        [(("tables",), [{"source": "${AWS_SECRET}"}]), (("log_level",), "${SPARK_KEY}")],
        [(("source", "bootstrap_servers"), "${JAAS}"), (("source", "protocol"), "${SSL_KEY_PW}")],
    ],
)
def test_secret_values_never_appear_in_config_errors(overrides: list[tuple[tuple[str, ...], Any]]) -> None:
    data = _secret_config(*overrides)
    with pytest.raises(ConfigError) as exc:
        config_from_mapping(data, env=SECRETS)
    text = str(exc.value)
    assert exc.value.__cause__ is None and exc.value.__suppress_context__  # no pydantic error chained
    _assert_no_secret(text)
    _assert_no_secret(repr(exc.value))


def test_missing_secret_variable_message_names_only_the_variable() -> None:
    env = {k: v for k, v in SECRETS.items() if k != "KAFKA_PASSWORD"}
    with pytest.raises(ConfigError, match=r'source\.kafka\["sasl\.password"\]: environment variable KAFKA_PASSWORD'):
        config_from_mapping(_secret_config(), env=env)


def test_redacted_hides_credentials_in_url_values() -> None:
    """A URL-valued setting (``claim-check-storage-uri``, a storage option) keeps its user info and its
    secret query parameters out of ``redacted()`` and every ``repr``; so does ``upstream`` in ``repr``."""
    data = _cfg(**{
        "source.options": {"enable-tidb-extension": "true", "large-message-handle-option": "claim-check",
                           "claim-check-storage-uri": "s3://AKIAEXAMPLE:cc-s3cr3t@bucket/cc?endpoint_override=minio:9000"},
        "source.upstream": "mysql://cdc:upstream-s3cr3t@tidb:4000/",
        "sink.storage_options": {"proxy_url": "https://proxy:8443/?region=eu&secret_key=proxy-s3cr3t"},
    })
    cfg = config_from_mapping(data, env={})
    red = cfg.redacted()
    assert red["source"]["options"]["claim-check-storage-uri"] == "s3://***@bucket/cc?endpoint_override=minio:9000"
    assert red["sink"]["storage_options"]["proxy_url"] == "https://proxy:8443/?region=eu&secret_key=***"
    assert red["source"]["options"]["enable-tidb-extension"] == "true"
    for text in (repr(cfg), repr(cfg.source), repr(cfg.sink)):
        _assert_no_secret(text)
        assert "AKIAEXAMPLE" not in text
    assert "upstream='mysql://***@tidb:4000/'" in repr(cfg.source)


@pytest.mark.parametrize(
    ("uri", "match"),
    [
        ("sss3://bucket/cc", r"unknown storage scheme 'sss3://'"),
        ("s3://AKIAEXAMPLE:uri-s3cr3t@bucket/cc?region=us-east-1&endpiont_override=minio:9000",
         r"s3://bucket/cc: unknown query parameter 'endpiont_override' for s3://"),
    ],
)
def test_claim_check_storage_uri_is_checked_when_loaded(uri: str, match: str) -> None:
    """A URI pyarrow cannot open is refused before Spark starts (it failed every batch on the executors,
    as a retryable error), checked offline: pyarrow's ``from_uri`` would ask S3 for the bucket's region."""
    data = _cfg(**{"source.options": {"enable-tidb-extension": "true", "large-message-handle-option": "claim-check",
                                      "claim-check-storage-uri": uri}})
    with pytest.raises(ConfigError, match=r'source\.options\["claim-check-storage-uri"\]: ' + match) as exc:
        config_from_mapping(data, env={})
    _assert_no_secret(str(exc.value))
    assert "AKIAEXAMPLE" not in str(exc.value)


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("sasl.oauthbearer.config", True),
        ("sasl.oauthbearer.client.secret", True),
        ("ssl.keystore.key", True),
        ("sasl.oauthbearer.assertion.private.key.passphrase", True),
        ("fs.azure.account.key.acct.dfs.core.windows.net", True),
        ("azure_storage_account_key", True),
        ("aws_access_key_id", True),
        ("ssl.key.location", False),
        ("sasl.password", True),
        ("SASL.JAAS.CONFIG", True),
        ("ssl.key.pem", True),
        ("ssl.keystore.password", True),
        ("basic.auth.user.info", True),
        ("bearer.auth.client.secret", True),
        ("sasl.oauthbearer.token.endpoint.url", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("aws_session_token", True),
        ("google_application_credentials", True),
        ("sasl.username", False),
        ("security.protocol", False),
        ("AWS_REGION", False),
        ("ssl.ca.location", False),
    ],
)
def test_is_secret_key(key: str, secret: bool) -> None:
    assert is_secret_key(key) is secret


# -- the shipped examples ----------------------------------------------------------------------------

EXAMPLES = sorted(CONF_DIR.glob("*.yaml"))


def test_examples_exist() -> None:
    names = {p.name for p in EXAMPLES}
    expected = {"demo.yaml", "canal-json-sasl.yaml", "avro-registry.yaml", "open-protocol-tables.yaml", "compose.yaml"}
    assert expected <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_loads(path: Path) -> None:
    cfg = load_config(path, env=EXAMPLE_ENV)
    assert isinstance(cfg, JobConfig)
    assert cfg.topics
    _ = cfg.redacted(), cfg.librdkafka_conf(), cfg.dead_letter_path, cfg.trigger_interval_seconds
    for secret in ("kafka-pw-0d6f", "aws-secret-9c1e", "sr-pw-77aa"):
        assert secret not in repr(cfg.redacted())


def test_examples_use_what_they_document() -> None:
    sasl = load_config(CONF_DIR / "canal-json-sasl.yaml", env=EXAMPLE_ENV)
    assert sasl.librdkafka_conf()["sasl.password"] == EXAMPLE_ENV["KAFKA_PASSWORD"]
    assert sasl.sink.storage_options["AWS_SECRET_ACCESS_KEY"] == EXAMPLE_ENV["AWS_SECRET_ACCESS_KEY"]
    mapping = sasl.table_mapping_for("shop", "audit_2024")
    assert mapping is not None and not mapping.enabled

    avro = load_config(CONF_DIR / "avro-registry.yaml", env=EXAMPLE_ENV)
    assert avro.source.protocol == "avro" and avro.source.schema_registry is not None
    assert avro.source.schema_registry.client_conf()["basic.auth.user.info"] == EXAMPLE_ENV["SR_AUTH"]
    no_auth = load_config(CONF_DIR / "avro-registry.yaml", env={"SR_URL": "http://sr:8081"})
    assert no_auth.source.schema_registry is not None
    assert "basic.auth.user.info" not in no_auth.source.schema_registry.client_conf()

    tables = load_config(CONF_DIR / "open-protocol-tables.yaml", env={})
    assert tables.table_path("sales", "orders") == "/data/lake/erp/sales_orders_v2"
    assert tables.table_path("sales", "invoices") == "/data/lake/erp/sales/invoices"
    assert tables.consumer_group_id is None
    assert tables.trigger_interval_seconds == 90.0
    assert tables.table_properties_for("sales", "orders") == {"delta.logRetentionDuration": "interval 7 days",
                                                              "delta.enableChangeDataFeed": "true"}
    assert tables.table_properties_for("stock", "movements") == {"delta.logRetentionDuration": "interval 7 days"}

    demo = load_config(CONF_DIR / "demo.yaml", env={})
    assert demo.source.bootstrap_servers == "127.0.0.1:9092" and demo.sink.path == "/tmp/lake"


def test_table_properties_sink_wide_then_per_table_and_the_ones_the_job_sets_are_refused() -> None:
    sink = {**MINIMAL["sink"], "table_properties": {"delta.checkpointInterval": 50, "delta.logRetentionDuration":
                                                     "interval 7 days"}}
    cfg = config_from_mapping({**MINIMAL, "sink": sink, "tables": [
        {"source": "a.*", "table_properties": {"delta.checkpointInterval": 20, "delta.enableChangeDataFeed": True}}]})
    assert cfg.table_properties_for("a", "t") == {"delta.checkpointInterval": "20", "delta.logRetentionDuration":
                                                  "interval 7 days", "delta.enableChangeDataFeed": "true"}
    assert cfg.table_properties_for("b", "t") == {"delta.checkpointInterval": "50",
                                                  "delta.logRetentionDuration": "interval 7 days"}
    assert config_from_mapping(MINIMAL).table_properties_for("a", "t") == {}
    for key, why in [("delta.appendOnly", "updates and deletes"), ("DELTA.COLUMNMAPPING.MODE", "sink.column_mapping"),
                     ("delta.enableTypeWidening", "sink.type_widening"), ("delta.minWriterVersion", "features"),
                     ("delta.x'y", "letters, digits")]:
        with pytest.raises(ConfigError, match=rf"sink\.table_properties.*: .*{why}"):
            config_from_mapping({**MINIMAL, "sink": {**MINIMAL["sink"], "table_properties": {key: "1"}}})
        with pytest.raises(ConfigError, match=rf"tables\[0\]\.table_properties.*: .*{why}"):
            config_from_mapping({**MINIMAL, "tables": [{"source": "a.b", "table_properties": {key: "1"}}]})
    # delta-rs takes Delta's own names only
    rs = {**MINIMAL["sink"], "engine": "delta-rs"}
    assert config_from_mapping({**MINIMAL, "sink": {**rs, "table_properties": {"delta.checkpointInterval": 5}}})
    with pytest.raises(ConfigError, match=r"sink\.table_properties\.owner: engine delta-rs .*delta\.\*"):
        config_from_mapping({**MINIMAL, "sink": {**rs, "table_properties": {"owner": "x"}}})
    with pytest.raises(ConfigError, match=r"tables\[0\]\.table_properties\.owner: engine delta-rs"):
        config_from_mapping({**MINIMAL, "sink": rs, "tables": [{"source": "a.b", "table_properties": {"owner": "x"}}]})
    # the spark engine takes other names too (Delta Lake keeps them)
    assert config_from_mapping({**MINIMAL, "sink": {**MINIMAL["sink"], "table_properties": {"owner": "x"}}})


@pytest.mark.parametrize(
    ("key", "instead"),
    [
        ("delta.feature.deletionVectors", r"set delta\.enableDeletionVectors: true instead"),
        ("delta.feature.changeDataFeed", r"set delta\.enableChangeDataFeed: true instead"),
        ("Delta.Feature.DELETIONVECTORS", r"set delta\.enableDeletionVectors: true instead"),
        ("delta.feature.columnMapping", r"set sink\.column_mapping instead"),
        ("delta.feature.typeWidening", r"set sink\.type_widening instead"),
        ("delta.feature.appendOnly", r"the job updates and deletes rows"),
        ("delta.feature.timestampNtz", r"leave it out: Delta Lake adds the feature 'timestampNtz' when a table"),
        ("delta.ignoreProtocolDefaults", r"leave it out: Delta Lake derives the protocol"),
        ("DELTA.IGNOREPROTOCOLDEFAULTS", r"leave it out"),
    ],
)
@pytest.mark.parametrize("engine", ["spark", "delta-rs"])
def test_table_properties_refuse_delta_protocol_keys(key: str, instead: str, engine: str) -> None:
    # Delta Lake strips delta.feature.* and delta.ignoreProtocolDefaults from the properties it stores, so on
    # the spark engine the job would commit a SET TBLPROPERTIES before every write; delta-rs refuses them
    why = r"a protocol setting, not a table property: .*set it again before every write .*; " + instead
    sink = {**MINIMAL["sink"], "engine": engine}
    with pytest.raises(ConfigError, match=rf"sink\.table_properties\[\"{re.escape(key)}\"\]: {why}"):
        config_from_mapping({**MINIMAL, "sink": {**sink, "table_properties": {key: "supported"}}})
    with pytest.raises(ConfigError, match=rf"tables\[0\]\.table_properties\[\"{re.escape(key)}\"\]: {why}"):
        config_from_mapping({**MINIMAL, "sink": sink,
                             "tables": [{"source": "a.b", "table_properties": {key: "true"}}]})
    # the property that adds a feature is a table property Delta Lake keeps: accepted
    assert config_from_mapping({**MINIMAL, "sink": {**sink, "table_properties": {
        "delta.enableDeletionVectors": "true", "delta.enableChangeDataFeed": "true"}}})


@pytest.mark.parametrize(
    ("example", "variable"),
    [("canal-json-sasl.yaml", "KAFKA_PASSWORD"), ("avro-registry.yaml", "SR_URL")],
)
def test_examples_require_their_secrets_from_the_environment(example: str, variable: str) -> None:
    env = {k: v for k, v in EXAMPLE_ENV.items() if k != variable}
    with pytest.raises(ConfigError, match=rf"environment variable {variable} is not set"):
        load_config(CONF_DIR / example, env=env)


# -- the reference documentation ---------------------------------------------------------------------

DOC = REPO / "docs" / "configuration.md"


def _all_keys(model: type[Any], prefix: str = "") -> list[tuple[str, str]]:
    """(YAML path, key) of every key the models accept, nested sections included."""
    from pydantic import BaseModel

    from ticdc_delta.config import _unwrap

    keys = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        keys.append((f"{prefix}{key}", key))
        for typ in _unwrap(field.annotation):
            if getattr(typ, "__origin__", None) is list:
                (typ,) = typ.__args__
                key += "[]"
            if isinstance(typ, type) and issubclass(typ, BaseModel):
                keys.extend(_all_keys(typ, f"{prefix}{key}."))
    return keys


def test_reference_documents_every_key() -> None:
    text = DOC.read_text()
    keys = _all_keys(JobConfig)
    assert ("tables[].partition_by", "partition_by") in keys and ("ddl.no_op", "no_op") in keys
    missing = [path for path, key in keys if f"`{key}`" not in text]
    assert not missing, f"docs/configuration.md does not mention {missing}"


def test_reference_minimum_example_loads(tmp_path: Path) -> None:
    text = DOC.read_text()
    block = text.split("## The minimum", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    cfg = load_config(_write(tmp_path, block), env={})
    assert cfg.source.options == {"enable-tidb-extension": "true"}


def test_reference_error_example_is_what_the_loader_prints() -> None:
    text = DOC.read_text()
    data = _cfg(
        **{
            "source.max_offsets_per_trigger": 0,
            "source.kafka": {"group.id": "g"},
            "tables": [{"source": "a.b"}, {"source": "orders"}],
            "sink.colour": "blue",
        }
    )
    with pytest.raises(ConfigError) as exc:
        config_from_mapping(data, env={})
    for line in _problems(exc):
        assert f"  {line}\n" in text, line


# -- robustness --------------------------------------------------------------------------------------


_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=True), st.text(max_size=12),
    st.sampled_from(["${X}", "${X:-1}", "$${", "${", "earliest", "avro", "a.b", "*.*", "10 seconds", "UTC"]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.text(max_size=8), st.integers(0, 3), st.booleans()), inner, max_size=3),
    ),
    max_leaves=8,
)
_paths = st.sampled_from(
    [
        "changefeed", "checkpoint", "tables", "trigger_interval", "log_level", "spark", "ddl", "dead_letter",
        "source", "sink", "source.topic", "source.topics", "source.protocol", "source.options", "source.kafka",
        "source.starting_offsets", "source.max_offsets_per_trigger", "source.consumer_group",
        "source.schema_registry", "source.avro_schemas", "source.bootstrap_servers", "sink.path",
        "sink.metadata_columns", "sink.source_timezone", "sink.storage_options", "spark.conf", "ddl.no_op",
    ]
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(_paths, _values), min_size=1, max_size=3))
def test_any_input_gives_a_config_or_a_config_error(edits: list[tuple[str, Any]]) -> None:
    data = _cfg()
    for dotted, value in edits:
        *parents, last = dotted.split(".")
        node: Any = data
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[last] = value
    try:
        cfg = config_from_mapping(data, env={"X": "s3cr3t-x"})
    except ConfigError as exc:
        assert str(exc).startswith("invalid configuration in configuration:\n")
        assert "s3cr3t" not in str(exc)
    else:
        assert isinstance(cfg, JobConfig)
        cfg.redacted()
        repr(cfg)


@pytest.mark.parametrize("word", ["true", "1", "yes", "on", "TRUE", True, 1, "false", "0", "no", "off", False])
def test_the_job_orders_canal_json_as_its_decoder_reads_the_tidb_extension(word: Any) -> None:
    """The decoder reads ``1``/``yes``/``on`` as true and then sends the stream's watermarks: the job must
    hold rows to them (watermark mode) rather than apply in offset order, ignoring them."""
    from ticdc_delta.codec.base import parse_bool_option
    from ticdc_delta.spark.batch_handler import protocol_mode

    cfg = config_from_mapping(_cfg(**{"source.options": {"enable-tidb-extension": word}}), env={})
    on = parse_bool_option(dict(cfg.source.options), "enable-tidb-extension")
    assert on == (str(word).lower() in ("true", "1", "yes", "on"))
    assert protocol_mode("canal-json", cfg.source.options) == ("watermark" if on else "offset-order")
