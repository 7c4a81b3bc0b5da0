"""The handle-key-only upstream lookup without a server: the DSN, the SQL each dialect runs (TiDB's is
tested only here, as text: there is no TiDB on this machine), the values and the completed image.
The lookup against a real server (MariaDB) is tests/integration/test_handle_key_only.py."""

from __future__ import annotations

import pickle

import pytest

from ticdc_delta.codec.model import ColumnFlag, TypeCode
from ticdc_delta.codec.upstream_lookup import (
    PASSWORD_ENV,
    UpstreamColumn,
    UpstreamLookup,
    UpstreamRow,
    UpstreamSettings,
    complete_image,
    dialect_of,
    parse_upstream_dsn,
    snapshot_select,
    tso_unix_seconds,
    upstream_value,
)
from ticdc_delta.config import config_from_mapping
from ticdc_delta.errors import ConfigError, DecodeError, UpstreamRowError, UpstreamUnavailableError
from ticdc_delta.schema.mysql_types import parse_column_type

F = ColumnFlag
TSO = (1_700_000_000_123 << 18) | 7  # physical 2023-11-14 22:13:20.123 UTC, logical 7


def test_dsn_password_from_the_dsn_or_the_environment_never_shown() -> None:
    s = parse_upstream_dsn("mysql://cdc:p%40ss@tidb.example:4001/?connect_timeout=3&read_timeout=9", env={})
    assert (s.host, s.port, s.user, s.password, s.connect_timeout, s.read_timeout) == (
        "tidb.example", 4001, "cdc", "p@ss", 3, 9)
    assert "p@ss" not in repr(s) and s.describe() == "mysql://cdc@tidb.example:4001"
    env = parse_upstream_dsn("mysql://cdc@tidb:4000", env={PASSWORD_ENV: "s3cret"}, time_zone="Asia/Shanghai")
    assert (env.password, env.port, env.time_zone) == ("s3cret", 4000, "Asia/Shanghai")
    assert parse_upstream_dsn("mysql://root@h/", env={}).time_zone == "+00:00"  # UTC: no tz tables needed
    assert parse_upstream_dsn("mysql://root@h/?time_zone=%2B08:00", env={}).time_zone == "+08:00"


@pytest.mark.parametrize("dsn, match", [
    ("postgres://u:secret@h:5432/", "must start with mysql://"),
    ("mysql://u:secret@:4000/", "names no host"),
    ("mysql://u:secret@h:4000/db", "must not name a database"),
    ("mysql://u:secret@h:4000/?ssl=1", "unknown DSN parameter 'ssl'"),
    ("mysql://u:secret@h:4000/?connect_timeout=0", "connect_timeout must be a positive"),
    ("mysql://u:secret@h:port/", "does not parse"),
])
def test_bad_dsns_are_refused_without_quoting_them(dsn: str, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        parse_upstream_dsn(dsn, env={})
    assert "secret" not in str(info.value)


def _cfg(**source: object) -> dict[str, object]:
    return {"changefeed": "c", "checkpoint": "/tmp/c", "sink": {"path": "/tmp/l"},
            "source": {"bootstrap_servers": "b:9092", "topic": "t", "protocol": "canal-json", **source}}


def test_source_upstream_is_validated_at_start_up_and_redacted() -> None:
    cfg = config_from_mapping(_cfg(upstream="mysql://cdc:hunter2@tidb:4000/"))
    assert cfg.redacted()["source"]["upstream"] == "mysql://***@tidb:4000/" and "hunter2" not in repr(cfg)
    assert cfg.source.upstream_settings("UTC").password == "hunter2"
    assert config_from_mapping(_cfg()).source.upstream_settings() is None
    with pytest.raises(ConfigError, match=r"source\.upstream: .*must start with mysql://") as info:
        config_from_mapping(_cfg(upstream="http://cdc:hunter2@tidb/"))
    assert "hunter2" not in str(info.value)
    with pytest.raises(ConfigError, match=r"source\.upstream: handle-key-only rows exist only with open-protocol"):
        config_from_mapping(_cfg(upstream="mysql://root@tidb:4000/", protocol="craft"))


def test_dialect_by_server_version() -> None:
    assert dialect_of("8.0.11-TiDB-v7.5.1") == "tidb"
    assert dialect_of("10.11.6-MariaDB-0+deb12u1") == "mariadb"
    assert dialect_of("8.0.36") is None


def test_tidb_reads_at_the_commit_ts_with_tidb_snapshot() -> None:
    setup, sql = snapshot_select("tidb", "shop", "or`ders", [("id", 5), ("region", "eu"), ("k", None)], TSO)
    assert setup == [("SET @@tidb_snapshot = %s", (str(TSO),))]
    assert sql == "SELECT * FROM `shop`.`or``ders` WHERE `id` = %s AND `region` = %s AND `k` IS NULL LIMIT 2"


def test_mariadb_reads_the_system_versioned_history_at_the_physical_time() -> None:
    assert tso_unix_seconds(TSO) == "1700000000.123"
    assert tso_unix_seconds(5 << 18) == "0.005"
    setup, sql = snapshot_select("mariadb", "s", "t", [("id", 1)], TSO)
    assert setup == []
    assert sql == ("SELECT * FROM `s`.`t` FOR SYSTEM_TIME AS OF TIMESTAMP FROM_UNIXTIME(1700000000.123) "
                   "WHERE `id` = %s LIMIT 2")
    with pytest.raises(ValueError, match="without key columns"):
        snapshot_select("tidb", "s", "t", [], TSO)
    with pytest.raises(ValueError, match="unknown upstream dialect 'mysql'"):
        snapshot_select("mysql", "s", "t", [("id", 1)], TSO)


@pytest.mark.parametrize("ctype, raw, value", [
    ("bigint unsigned", "18446744073709551615", 18446744073709551615),
    ("year", "1901", 1901),
    ("bit(10)", b"\x02\x01", 513),
    ("double", "-1e300", -1e300),
    ("decimal(10,3)", "-1.500", "-1.500"),
    ("datetime(6)", "2024-01-01 00:00:00.000001", "2024-01-01 00:00:00.000001"),
    ("enum('a','b')", "b", 2),
    ("enum('a','b')", "", 0),
    ("set('x','y','z')", "x,z", 5),
    ("set('x','y','z')", "", 0),
    ("varbinary(4)", b"\xff\x00", b"\xff\x00"),
    ("blob", b"\x00\x01", b"\x00\x01"),
    ("text", "q\"u测试", "q\"u测试"),
    ("json", '{"a": 1}', '{"a": 1}'),
    ("int", None, None),
])
def test_server_text_becomes_the_event_models_value(ctype: str, raw: object, value: object) -> None:
    assert upstream_value(parse_column_type(ctype), raw) == value


def test_an_unknown_enum_label_is_refused() -> None:
    with pytest.raises(ValueError, match="'c' is not in"):
        upstream_value(parse_column_type("enum('a','b')"), "c")


def _row() -> UpstreamRow:
    cols = (
        UpstreamColumn("id", parse_column_type("bigint"), False, "PRI", False),
        UpstreamColumn("name", parse_column_type("varchar(20)"), True, "UNI", False),
        UpstreamColumn("n", parse_column_type("int unsigned"), True, "", True),
        UpstreamColumn("b", parse_column_type("varbinary(3)"), True, "MUL", False),
    )
    return UpstreamRow(cols, (999, "ann", 7, b"\x01"))


def test_open_protocol_image_has_ticdcs_flags_and_the_key_as_sent() -> None:
    key = [("id", int(TypeCode.BIGINT), int(F.HANDLE_KEY | F.PRIMARY_KEY), 42)]
    image = complete_image(key, _row(), "open-protocol")
    assert [tuple(c) for c in image] == [
        ("id", TypeCode.BIGINT, F.HANDLE_KEY | F.PRIMARY_KEY, 42),  # the message's, not the lookup's 999
        ("name", TypeCode.VARCHAR, F.NULLABLE | F.UNIQUE_KEY, "ann"),
        ("n", TypeCode.INT, F.UNSIGNED | F.NULLABLE | F.GENERATED, 7),
        ("b", TypeCode.VARCHAR, F.BINARY | F.NULLABLE | F.MULTIPLE_KEY, b"\x01"),
    ]


def test_canal_json_image_has_only_what_its_mysql_type_names_carry() -> None:
    key = [("id", int(TypeCode.BIGINT), int(F.HANDLE_KEY | F.PRIMARY_KEY), 42)]
    image = complete_image(key, _row(), "canal-json")
    assert [(c.name, c.type, c.flags) for c in image] == [
        ("id", TypeCode.BIGINT, F.HANDLE_KEY | F.PRIMARY_KEY),
        ("name", TypeCode.VARCHAR, F.NONE),
        ("n", TypeCode.INT, F.UNSIGNED),
        ("b", TypeCode.VARCHAR, F.BINARY),
    ]


def test_a_key_column_the_upstream_table_lacks_is_refused() -> None:
    with pytest.raises(ValueError, match=r"no column \['gone'\] of the message's handle key"):
        complete_image([("gone", 3, 2, 1)], _row(), "open-protocol")


def test_lookup_pickles_without_its_connection_and_retries_a_dead_server_a_bounded_number_of_times() -> None:
    import pymysql

    calls: list[UpstreamSettings] = []

    def refuse(settings: UpstreamSettings) -> object:
        calls.append(settings)
        raise pymysql.err.OperationalError(2003, "Can't connect to MySQL server on 'tidb' ([Errno 111] refused)")

    pauses: list[float] = []
    lookup = UpstreamLookup(UpstreamSettings(host="tidb", password="pw"), attempts=3, backoff=0.5,
                            sleep=pauses.append, connect=refuse)
    with pytest.raises(UpstreamUnavailableError, match=r"mysql://root@tidb:4000 failed 3 times .* s\.t at commit ts 9"):
        lookup.fetch("s", "t", [("id", 1)], 9, "open-protocol")
    assert len(calls) == 3 and pauses == [0.5, 1.0]
    copy = pickle.loads(pickle.dumps(lookup))
    assert copy.settings == lookup.settings and copy.attempts == 3 and copy.dialect is None


def test_refused_credentials_are_a_config_error_not_retried() -> None:
    import pymysql

    calls: list[int] = []

    def deny(settings: UpstreamSettings) -> object:
        calls.append(1)
        raise pymysql.err.OperationalError(1045, "Access denied for user 'cdc'@'10.0.0.1' (using password: YES)")

    lookup = UpstreamLookup(UpstreamSettings(host="tidb", user="cdc"), attempts=3, sleep=lambda s: None, connect=deny)
    with pytest.raises(ConfigError, match=f"refused the job's user .*{PASSWORD_ENV}"):
        lookup.fetch("s", "t", [("id", 1)], 9, "canal-json")
    assert calls == [1]


class _FakeTiDB:
    """A scripted upstream TiDB for the injected ``connect`` hook: ``SELECT VERSION()``, ``SET
    @@tidb_snapshot``, the row's ``SELECT *`` (which raises each of ``failures`` in turn, then answers
    ``id=1, name='ann'``) and ``information_schema.COLUMNS``. Counts the connections opened."""

    def __init__(self, failures: list[BaseException]) -> None:
        self.failures = failures
        self.connections = 0

    def connect(self, settings: UpstreamSettings) -> object:
        self.connections += 1
        return _FakeConnection(self)


class _FakeConnection:
    def __init__(self, server: _FakeTiDB) -> None:
        self.server = server

    def cursor(self) -> _FakeCursor:
        return _FakeCursor(self.server)

    def close(self) -> None:
        pass


class _FakeCursor:
    def __init__(self, server: _FakeTiDB) -> None:
        self.server = server
        self.rows: list[tuple[object, ...]] = []
        self.description: list[tuple[str]] | None = None

    def __enter__(self) -> _FakeCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def execute(self, sql: str, params: object = None) -> None:
        if sql == "SELECT VERSION()":
            self.rows = [("8.0.11-TiDB-v7.5.0",)]
        elif sql.startswith("SELECT * FROM"):
            if self.server.failures:
                raise self.server.failures.pop(0)
            self.description, self.rows = [("id",), ("name",)], [("1", "ann")]
        elif "information_schema.COLUMNS" in sql:
            self.rows = [("id", "bigint", "NO", "PRI", ""), ("name", "varchar(20)", "YES", "", "")]
        else:
            self.rows = []

    def fetchall(self) -> list[tuple[object, ...]]:
        return self.rows


def _server_error(code: int, message: str) -> Exception:
    """The error pymysql raises for a server error packet with this number (its class follows the number)."""
    import pymysql

    cls = pymysql.err.error_map.get(code, pymysql.err.OperationalError)
    return cls(code, message)


# Errors of a healthy row on a struggling server: retried, never dead-lettered.
_TRANSIENT_LOOKUP_ERRORS = [
    (9005, "Region is unavailable"),
    (9001, "PD server timeout"),
    (9002, "TiKV server timeout"),
    (9003, "TiKV server is busy"),
    (8027, "Information schema is out of date: schema failed to update in 1 lease, please make sure TiDB can "
           "connect to TiKV"),
    (8028, "Information schema is changed during the execution of the statement"),
    (8022, "Error: KV error safe to retry"),
    (9007, "Write conflict, txnStartTS=1, conflictStartTS=2"),
    (1205, "Lock wait timeout exceeded; try restarting transaction"),
    (1213, "Deadlock found when trying to get lock; try restarting transaction"),
    (1317, "Query execution was interrupted"),
    (1105, "[tikv:9002]TiKV server timeout"),
    (1105, "[tikv:9005]Region is unavailable"),
    (1105, "region unavailable"),
    (1105, "[PD:client:ErrClientGetTSOTimeout]get TSO timeout"),
]


@pytest.mark.parametrize("code, message", _TRANSIENT_LOOKUP_ERRORS)
def test_a_transient_server_error_in_a_lookup_is_retried_on_a_new_connection(code: int, message: str) -> None:
    server = _FakeTiDB([_server_error(code, message)])
    pauses: list[float] = []
    lookup = UpstreamLookup(UpstreamSettings(host="tidb"), attempts=3, backoff=0.5, sleep=pauses.append,
                            connect=server.connect)
    row = lookup.fetch("shop", "orders", [("id", 1)], TSO, "canal-json")
    assert row.values == (1, "ann") and [c.name for c in row.columns] == ["id", "name"]
    assert server.connections == 2 and pauses == [0.5]  # the failed connection was dropped, a new one read


@pytest.mark.parametrize("code, message", [
    (9005, "Region is unavailable"),
    (9001, "PD server timeout"),
    (1105, "[tikv:9002]TiKV server timeout"),
])
def test_a_transient_server_error_on_every_attempt_is_retryable_not_a_dead_letter(code: int, message: str) -> None:
    server = _FakeTiDB([_server_error(code, message) for _ in range(3)])
    lookup = UpstreamLookup(UpstreamSettings(host="tidb", user="cdc"), attempts=3, sleep=lambda s: None,
                            connect=server.connect)
    with pytest.raises(UpstreamUnavailableError,
                       match=rf"mysql://cdc@tidb:4000 failed 3 times .* shop\.orders .*{code}") as info:
        lookup.fetch("shop", "orders", [("id", 1)], TSO, "open-protocol")
    assert info.value.retryable and not isinstance(info.value, DecodeError) and server.connections == 3


@pytest.mark.parametrize("code, message", [
    (1040, "Too many connections"),
    (1053, "Server shutdown in progress"),
    (1203, "User cdc already has more than 'max_user_connections' active connections"),
    (1105, "[tikv:9001]PD server timeout"),  # TiDB reads the privilege tables from TiKV at login
])
def test_a_transient_refusal_of_the_connection_is_retryable_not_a_config_error(code: int, message: str) -> None:
    calls: list[int] = []

    def refuse(settings: UpstreamSettings) -> object:
        calls.append(1)
        raise _server_error(code, message)

    lookup = UpstreamLookup(UpstreamSettings(host="tidb"), attempts=3, sleep=lambda s: None, connect=refuse)
    with pytest.raises(UpstreamUnavailableError, match=rf"failed 3 times .*\({code}, ") as info:
        lookup.fetch("s", "t", [("id", 1)], 9, "canal-json")
    assert info.value.retryable and len(calls) == 3


@pytest.mark.parametrize("code, message", [
    (1130, "Host '10.0.0.1' is not allowed to connect to this MySQL server"),
    (1251, "Client does not support authentication protocol requested by server"),
    (2059, "Authentication plugin 'authentication_ldap_sasl_client' not configured"),
    (3118, "Access denied for user 'cdc'@'%'. Account is locked."),
])
def test_an_access_refusal_when_connecting_names_the_job_user_and_is_not_retried(code: int, message: str) -> None:
    calls: list[int] = []

    def deny(settings: UpstreamSettings) -> object:
        calls.append(1)
        raise _server_error(code, message)

    lookup = UpstreamLookup(UpstreamSettings(host="tidb", user="cdc"), attempts=3, sleep=lambda s: None, connect=deny)
    with pytest.raises(ConfigError, match=rf"refused the job's user \(error {code}\)"):
        lookup.fetch("s", "t", [("id", 1)], 9, "canal-json")
    assert calls == [1]


@pytest.mark.parametrize("code, message", [
    (1146, "Table 'shop.orders' doesn't exist"),
    (8055, "snapshot is older than GC safe point 2024-01-01 00:00:00 +0000 UTC"),
    (9006, "GC life time is shorter than transaction duration"),
    (1105, "[tikv:9006]GC life time is shorter than transaction duration, transaction starts at 1, GC safe "
           "point is 2"),
])
def test_a_genuine_row_problem_stays_a_dead_letter_after_one_try(code: int, message: str) -> None:
    """Guard for the sorting above: what retrying cannot mend is still the row's error."""
    server = _FakeTiDB([_server_error(code, message)])
    lookup = UpstreamLookup(UpstreamSettings(host="tidb"), attempts=3, sleep=lambda s: None, connect=server.connect)
    with pytest.raises(UpstreamRowError, match=rf"shop\.orders .*refused the lookup: .*{code}"):
        lookup.fetch("shop", "orders", [("id", 1)], TSO, "canal-json")
    assert server.connections == 1


@pytest.mark.parametrize("code, message", [
    (1298, "Unknown or incorrect time zone: 'Mars/Olympus_Mons'"),
    (1049, "Unknown database 'shop'"),
])
def test_an_unknown_time_zone_or_database_when_connecting_is_a_config_error(code: int, message: str) -> None:
    """Guard: the settings' own errors still stop the job."""
    def refuse(settings: UpstreamSettings) -> object:
        raise _server_error(code, message)

    lookup = UpstreamLookup(UpstreamSettings(host="tidb"), attempts=3, sleep=lambda s: None, connect=refuse)
    with pytest.raises(ConfigError, match=rf"refused the connection: .*{code}"):
        lookup.fetch("s", "t", [("id", 1)], 9, "canal-json")
