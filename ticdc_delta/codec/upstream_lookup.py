"""TiCDC's ``large-message-handle-option=handle-key-only``: the full row is read back from the upstream.

What TiCDC does: a row message above ``max-message-bytes`` is sent with only its handle-key columns
(Open Protocol ``"ohk": true`` in the event key, Canal-JSON ``_tidb.onlyHandleKey``); TiCDC's own consumer
(tiflow ``cmd/kafka-consumer``, ``codec/open`` and ``canal`` ``assembleHandleKeyOnlyEvent``,
``common.SnapshotQuery``) completes it by reading the row from the upstream TiDB as of the commit ts:
``SET @@tidb_snapshot = <commit ts>`` then ``SELECT * FROM db.t WHERE <handle key>``.

This module does the same on the executors, where messages are decoded: an :class:`UpstreamLookup` holds
one connection per decoder (one per Spark partition task, opened on first need, closed when the task ends)
and completes each handle-key-only INSERT/UPDATE in place — same offset, same position in the message —
with the new image read at the commit ts. The image has the columns the upstream table has, typed the way
the decoder types a full row of that protocol (type codes and flags from ``information_schema.COLUMNS``'
``COLUMN_TYPE``, read through :func:`~ticdc_delta.schema.mysql_types.parse_column_type`; Canal-JSON's
through its own ``mysqlType`` names), the handle-key columns exactly as the message carried them.

Not looked up: a DELETE (its handle key is the whole change for a MERGE by key) and an UPDATE's old image
(the message's handle key is kept: TiCDC splits a key-changing UPDATE into DELETE + INSERT, so the old key
is what the MERGE needs).

Two dialects, chosen by the server's ``SELECT VERSION()``:

- TiDB: ``SET @@tidb_snapshot = '<commit ts>'`` (TiDB takes a TSO there) before the ``SELECT``;
  ``information_schema`` then shows the table as it was at that TSO too.
- MariaDB (system-versioned tables, ``WITH SYSTEM VERSIONING``): ``SELECT ... FOR SYSTEM_TIME AS OF
  TIMESTAMP FROM_UNIXTIME(<physical seconds>)``, the TSO's physical milliseconds (``ts >> 18``). Used by
  the tests as a stand-in upstream whose history follows the simulated commit ts; ``information_schema``
  is the table's current shape.

Failures: no row at the snapshot (or several, or a server error for the query: an unknown table, a TSO
past TiDB's GC safe point) is an :class:`~ticdc_delta.errors.UpstreamRowError` (the message goes to the
dead-letter table); a server that cannot be reached, drops the connection or answers with a transient
error (:data:`_TRANSIENT_ERRORS`: too many connections, shutting down, a TiKV/PD timeout, a region
unavailable, a lock or schema-lease conflict...), on every one of :data:`ATTEMPTS` tries, is an
:class:`~ticdc_delta.errors.UpstreamUnavailableError` (transient: the batch is retried — dead-lettering
would drop a row the upstream has); refused credentials (:data:`_ACCESS_ERRORS`), an unknown database or
time zone when connecting, or a server with no snapshot reads are a :class:`~ticdc_delta.errors.ConfigError`;
any other refusal of a new connection is the server's state, not the row's nor the settings', so it is
retried too. The password is never part of a message.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple, Sequence
from urllib.parse import parse_qsl, unquote, urlsplit

from ..errors import ConfigError, UpstreamRowError, UpstreamUnavailableError, preview
from ..schema.mysql_types import ColumnType, UnsupportedColumnTypeError, parse_column_type
from .backoff import retry_with_backoff
from .model import (
    INTEGER_TYPES,
    ColumnFlag,
    Image,
    ImageLayout,
    TypeCode,
    column_flag,
    is_binary_column,
)

__all__ = [
    "PASSWORD_ENV",
    "ATTEMPTS",
    "UpstreamSettings",
    "UpstreamColumn",
    "UpstreamRow",
    "UpstreamLookup",
    "parse_upstream_dsn",
    "dialect_of",
    "snapshot_select",
    "tso_unix_seconds",
    "upstream_value",
    "complete_image",
]

PASSWORD_ENV = "TICDC_DELTA_UPSTREAM_PASSWORD"
"""Where the upstream password comes from when the DSN has none."""

ATTEMPTS = 4
"""Tries of one lookup before an unreachable upstream counts as unavailable."""
BACKOFF_SECONDS = 0.2
"""First pause between tries; doubled after each."""

_PARAMS = {"connect_timeout", "read_timeout", "time_zone"}
_TIDB, _MARIADB = "tidb", "mariadb"
_ACCESS_ERRORS = frozenset({
    1044,  # ER_DBACCESS_DENIED_ERROR: access denied to a database
    1045,  # ER_ACCESS_DENIED_ERROR: wrong user or password
    1130,  # ER_HOST_NOT_PRIVILEGED: the host may not connect
    1142,  # ER_TABLEACCESS_DENIED_ERROR: no SELECT on the table
    1143,  # ER_COLUMNACCESS_DENIED_ERROR: no SELECT on a column
    1227,  # ER_SPECIFIC_ACCESS_DENIED_ERROR: a privilege the statement needs
    1251,  # ER_NOT_SUPPORTED_AUTH_MODE: an authentication protocol the client lacks
    1698,  # ER_ACCESS_DENIED_NO_PASSWORD_ERROR: auth_socket / no-password user
    1862,  # ER_MUST_CHANGE_PASSWORD_LOGIN: the password has expired
    2059,  # CR_AUTH_PLUGIN_CANNOT_LOAD (client side): an auth plugin pymysql does not have
    3118,  # ER_ACCOUNT_HAS_BEEN_LOCKED
    3159,  # ER_SECURE_TRANSPORT_REQUIRED: the server wants TLS, which the DSN has no way to ask for
})
"""Errors that mean the job's user cannot read the tables: a :class:`ConfigError` wherever they come."""

_SETUP_ERRORS = frozenset({
    1049,  # ER_BAD_DB_ERROR: unknown database (when connecting; in a lookup it is the row's table that is gone)
    1298,  # ER_UNKNOWN_TIME_ZONE: the session time_zone (init_command) the server does not know
})
"""Errors of a new connection that mean the settings are wrong: a :class:`ConfigError`."""

_TRANSIENT_ERRORS: Mapping[int, str] = {
    1040: "too many connections",
    1053: "the server is shutting down",
    1158: "a network read failed (ER_NET_READ_ERROR)",
    1159: "a network read timed out (ER_NET_READ_INTERRUPTED)",
    1160: "a network write failed (ER_NET_ERROR_ON_WRITE)",
    1161: "a network write timed out (ER_NET_WRITE_INTERRUPTED)",
    1203: "the user has max_user_connections open",
    1205: "lock wait timeout",
    1213: "deadlock: the transaction was rolled back",
    1317: "the query was interrupted (KILL QUERY, a restarting server)",
    1927: "the connection was killed (MariaDB ER_CONNECTION_KILLED)",
    3024: "max_execution_time exceeded",
    4031: "the server closed the connection as idle (wait_timeout, MySQL 8.0.24+)",
    8022: "TiDB: a KV error that is safe to retry (ErrTxnRetryable)",
    8027: "TiDB: the information schema is out of date, the schema lease expired (ErrInfoSchemaExpired)",
    8028: "TiDB: the information schema changed during the statement (ErrInfoSchemaChanged)",
    9001: "TiDB: PD server timeout",
    9002: "TiDB: TiKV server timeout",
    9003: "TiDB: TiKV server is busy",
    9004: "TiDB: resolve lock timeout",
    9005: "TiDB: region is unavailable (no leader, a TiKV down or busy)",
    9007: "TiDB: write conflict",
    9008: "TiDB: TiKV store limit reached",
    9010: "TiDB: TiKV stale command",
    9011: "TiDB: TiKV max timestamp not synced (a leader just changed)",
    9012: "TiDB: TiFlash server timeout",
    9013: "TiDB: TiFlash server is busy",
}
"""Server errors worth another try, each with why: the server's state, not the row's (TiDB's codes from
``pkg/errno/errcode.go``). 9006 (GC life time shorter than the transaction) and 8055 (snapshot older
than the GC safe point) are not here: the history is gone, retrying cannot bring it back."""

_ER_UNKNOWN_ERROR = 1105
# TiDB hands many storage errors to the client as 1105 ER_UNKNOWN_ERROR with the inner error in the text:
# "[tikv:9002]TiKV server timeout" (terror's "[class:code]message"), client-go's bare "region unavailable",
# PD client errors in RFC form ("[PD:client:ErrClientGetTSOTimeout]get TSO timeout").
_TIDB_INNER_CODE = re.compile(r"\[[A-Za-z_-]+:(\d{4,5})\]")
_TRANSIENT_1105_TEXT = re.compile(
    r"(?:tikv|pd|tiflash) server (?:timeout|is busy)|region (?:is )?unavailable|epoch not match|not leader"
    r"|get tso timeout|\[PD:", re.IGNORECASE)


@dataclass(frozen=True)
class UpstreamSettings:
    """How to reach the upstream (``source.upstream``): picklable, shipped to the executors.

    ``password`` is kept out of ``repr`` and every message; :meth:`describe` is safe to log.
    """

    host: str
    port: int = 4000
    user: str = "root"
    password: str = field(default="", repr=False)
    connect_timeout: int = 10
    read_timeout: int = 60
    time_zone: str = "+00:00"

    def describe(self) -> str:
        """``mysql://user@host:port`` (no password)."""
        return f"mysql://{self.user}@{self.host}:{self.port}"


def parse_upstream_dsn(dsn: str, *, env: Mapping[str, str] | None = None, time_zone: str = "UTC") -> UpstreamSettings:
    """The settings of a DSN ``mysql://user[:password]@host[:port]/[?connect_timeout=10&read_timeout=60&time_zone=+08:00]``.

    The password is the DSN's (percent-encoded) or, when it has none, the environment variable
    :data:`PASSWORD_ENV` of ``env`` (default ``os.environ``). ``time_zone`` (the session's, in which TiDB
    prints TIMESTAMP values; the DSN's ``time_zone`` wins) is normally ``sink.source_timezone``.

    Raises:
        ValueError: not such a DSN; the message never quotes it (it may hold the password).
    """
    if not isinstance(dsn, str) or not dsn.strip():
        raise ValueError("expected a DSN such as mysql://user@host:4000/")
    try:
        split = urlsplit(dsn.strip())
        port = split.port
    except ValueError:
        raise ValueError("expected a DSN such as mysql://user@host:4000/ (the host or port does not parse)") from None
    if split.scheme.lower() not in ("mysql", "tidb"):
        raise ValueError("the DSN must start with mysql:// (TiDB speaks the MySQL protocol)")
    if not split.hostname:
        raise ValueError("the DSN names no host (mysql://user@host:4000/)")
    if split.path not in ("", "/") or split.fragment:
        raise ValueError("the DSN must not name a database or fragment: tables are read as schema.table")
    params: dict[str, str] = {}
    for key, value in parse_qsl(split.query, keep_blank_values=True):
        if key not in _PARAMS:
            raise ValueError(f"unknown DSN parameter {key!r}; allowed: {', '.join(sorted(_PARAMS))}")
        params[key] = value
    timeouts = {}
    for key in ("connect_timeout", "read_timeout"):
        if key in params:
            if not params[key].isdigit() or int(params[key]) < 1:
                raise ValueError(f"DSN parameter {key} must be a positive number of seconds")
            timeouts[key] = int(params[key])
    password = unquote(split.password) if split.password is not None else None
    if password is None:
        password = (os.environ if env is None else env).get(PASSWORD_ENV, "")
    zone = params.get("time_zone") or time_zone
    return UpstreamSettings(
        host=split.hostname, port=port or 4000, user=unquote(split.username or "root"), password=password,
        time_zone="+00:00" if zone.upper() in ("UTC", "Z", "ETC/UTC", "GMT") else zone, **timeouts,
    )


def dialect_of(version: str) -> str | None:
    """``"tidb"`` or ``"mariadb"`` for a ``SELECT VERSION()`` text; ``None`` for a server without
    snapshot reads (MySQL)."""
    low = version.lower()
    if "tidb" in low:
        return _TIDB
    if "mariadb" in low:
        return _MARIADB
    return None


def tso_unix_seconds(tso: int) -> str:
    """The TSO's physical time (``tso >> 18`` milliseconds) as Unix seconds with three decimals."""
    ms = tso >> 18
    return f"{ms // 1000}.{ms % 1000:03d}"


def _quote_name(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def snapshot_select(
    dialect: str, schema: str, table: str, key: Sequence[tuple[str, Any]], commit_ts: int
) -> tuple[list[tuple[str, tuple[Any, ...]]], str]:
    """The statements that read one row as of ``commit_ts``: ``(setup, select)`` where ``setup`` is a list
    of ``(sql, params)`` to run first and ``select`` the query (pymysql ``%s`` placeholders, one per
    non-NULL key value, in ``key`` order).

    Raises:
        ValueError: an unknown dialect or no key column.
    """
    if not key:
        raise ValueError("a handle-key-only row without key columns cannot be looked up")
    where = " AND ".join(
        f"{_quote_name(name)} IS NULL" if value is None else f"{_quote_name(name)} = %s" for name, value in key
    )
    target = f"{_quote_name(schema)}.{_quote_name(table)}"
    if dialect == _TIDB:
        return [("SET @@tidb_snapshot = %s", (str(commit_ts),))], f"SELECT * FROM {target} WHERE {where} LIMIT 2"
    if dialect == _MARIADB:
        at = f"FOR SYSTEM_TIME AS OF TIMESTAMP FROM_UNIXTIME({tso_unix_seconds(commit_ts)})"
        return [], f"SELECT * FROM {target} {at} WHERE {where} LIMIT 2"
    raise ValueError(f"unknown upstream dialect {dialect!r}")


class UpstreamColumn(NamedTuple):
    """One column of the upstream table (``information_schema.COLUMNS``)."""

    name: str
    type: ColumnType
    nullable: bool
    key: str  # COLUMN_KEY: "PRI", "UNI", "MUL" or ""
    generated: bool

    def ticdc_flags(self) -> ColumnFlag:
        """The flags TiCDC gives the column (Open Protocol, Craft): type flags, NULLABLE, key kind,
        GENERATED; HANDLE_KEY comes from the message."""
        flags = int(self.type.flags) & int(ColumnFlag.BINARY | ColumnFlag.UNSIGNED)
        if self.nullable:
            flags |= ColumnFlag.NULLABLE
        flags |= {"PRI": ColumnFlag.PRIMARY_KEY, "UNI": ColumnFlag.UNIQUE_KEY, "MUL": ColumnFlag.MULTIPLE_KEY}.get(
            self.key, 0)
        if self.generated:
            flags |= ColumnFlag.GENERATED
        return column_flag(int(flags))


class UpstreamRow(NamedTuple):
    """A row read from the upstream: its columns and their values in the event model's form."""

    columns: tuple[UpstreamColumn, ...]
    values: tuple[Any, ...]


def upstream_value(col: ColumnType, raw: Any) -> Any:
    """The event model's value (:mod:`.model`) of a text-protocol value the server sent (``str``, or
    ``bytes`` for a binary-charset column): integers as ``int``, BIT as the unsigned number of its bytes,
    FLOAT/DOUBLE ``float``, ENUM the 1-based index and SET the bit mask of the labels (as TiCDC sends them),
    binary strings ``bytes``, everything else the text as the server printed it.

    Raises:
        ValueError: a value the column type cannot hold (an unknown ENUM label...).
    """
    if raw is None:
        return None
    t = col.type_code
    if t == TypeCode.BIT:
        data = raw if isinstance(raw, (bytes, bytearray)) else str(raw).encode("latin-1")
        return int.from_bytes(bytes(data), "big")
    text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) and not col.binary else raw
    if t in INTEGER_TYPES:
        return int(text)
    if t in (TypeCode.FLOAT, TypeCode.DOUBLE):
        return float(text)
    if t == TypeCode.ENUM:
        if text == "":
            return 0
        return _member(col, text) + 1
    if t == TypeCode.SET:
        mask = 0
        for label in filter(None, str(text).split(",")):
            mask |= 1 << _member(col, label)
        return mask
    if is_binary_column(t, int(col.flags)):
        return bytes(raw) if isinstance(raw, (bytes, bytearray)) else str(raw).encode("utf-8")
    return text


def _member(col: ColumnType, label: str) -> int:
    try:
        return col.members.index(label)
    except ValueError:
        raise ValueError(f"{preview(label)} is not in {col.name}{preview(col.members)}") from None


def complete_image(key_image: Any, row: UpstreamRow, protocol: str) -> Image:
    """The full new image of a handle-key-only row: every upstream column in table order, typed as the
    ``protocol``'s decoder types a full row, the message's key columns (``key_image``) exactly as sent.

    Canal-JSON carries only ``mysqlType`` names: each column's type code and BINARY/UNSIGNED flags are
    what its decoder reads from the name TiCDC would write, the key flags those of ``pkNames``. Open
    Protocol (and Craft) carry TiCDC's flags: :meth:`UpstreamColumn.ticdc_flags`.

    Raises:
        ValueError: the upstream row lacks a key column of the message.
    """
    sent = {c[0]: (int(c[1]), int(c[2]), c[3]) for c in key_image}
    names, types, flags = [], [], []
    values = list(row.values)
    for i, col in enumerate(row.columns):
        names.append(col.name)
        if col.name in sent:
            tp, fl, values[i] = sent.pop(col.name)
        elif protocol == "canal-json":
            from .canal_json import mysql_type_name, parse_mysql_type

            tp, canal_flags = parse_mysql_type(mysql_type_name(int(col.type.type_code), int(col.type.flags)))
            fl = int(canal_flags)
        else:
            tp, fl = int(col.type.type_code), int(col.ticdc_flags())
        types.append(tp)
        flags.append(fl)
    if sent:
        raise ValueError(f"the upstream table has no column {preview(sorted(sent))} of the message's handle key")
    return Image(ImageLayout(names, types, flags), tuple(values))


Connect = Callable[[UpstreamSettings], Any]


def _pymysql_connect(settings: UpstreamSettings) -> Any:
    import pymysql
    import pymysql.converters

    return pymysql.connect(
        host=settings.host, port=settings.port, user=settings.user, password=settings.password,
        charset="utf8mb4", autocommit=True, connect_timeout=settings.connect_timeout,
        read_timeout=settings.read_timeout, write_timeout=settings.read_timeout,
        # encoders only: every value comes back as the text (bytes for binary columns) the server sent
        conv=dict(pymysql.converters.encoders),
        init_command=f"SET time_zone = '{settings.time_zone.replace(chr(39), '')}'",
    )


class _Unavailable(Exception):
    """A connection-level failure worth another try."""


class UpstreamLookup:
    """Reads handle-key-only rows from the upstream, one connection at a time (see the module text).

    Picklable (only the settings travel); not thread-safe: one per decoder.
    """

    def __init__(self, settings: UpstreamSettings, *, attempts: int = ATTEMPTS, backoff: float = BACKOFF_SECONDS,
                 sleep: Callable[[float], None] = time.sleep, connect: Connect | None = None) -> None:
        self.settings = settings
        self.attempts = max(1, int(attempts))
        self.backoff = backoff
        self._sleep = sleep
        self._connect = connect or _pymysql_connect
        self._reset()

    def _reset(self) -> None:
        self._conn: Any = None
        self.dialect: str | None = None
        self._columns: dict[tuple[str, str], tuple[UpstreamColumn, ...]] = {}
        self._snapshot: int | None = None
        self.lookups = 0

    def __getstate__(self) -> dict[str, Any]:
        return {"settings": self.settings, "attempts": self.attempts, "backoff": self.backoff}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["settings"], attempts=state["attempts"], backoff=state["backoff"])  # type: ignore[misc]

    def close(self) -> None:
        """Close the connection (a later lookup opens a new one)."""
        conn, self._conn = self._conn, None
        self._snapshot = None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection: nothing left to do
                pass

    # -- the connection -----------------------------------------------------------------------------------

    def _open(self) -> Any:
        if self._conn is None:
            import pymysql

            try:
                conn = self._call(lambda: self._connect(self.settings))
            except pymysql.err.MySQLError as exc:  # the server answered, and said no
                if _error_code(exc) in _SETUP_ERRORS:  # an unknown time_zone or database: the settings
                    raise ConfigError(
                        f"source.upstream {self.settings.describe()} refused the connection: {preview(str(exc))}"
                    ) from None
                # any other refusal (not access: _call sorted that) is the server's state: try again
                raise _Unavailable(str(exc)) from None
            try:
                version = self._query(conn, "SELECT VERSION()", ())[0][0]
            except BaseException:
                conn.close()
                raise
            dialect = dialect_of(str(version))
            if dialect is None:
                conn.close()
                raise ConfigError(
                    f"source.upstream {self.settings.describe()} is {preview(str(version))}, which has no snapshot "
                    "reads: handle-key-only rows need the upstream TiDB (or, for tests, a MariaDB with "
                    "system-versioned tables)"
                )
            self._conn, self.dialect = conn, dialect
        return self._conn

    def _call(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` with pymysql's errors sorted: connection failures and transient server errors →
        :class:`_Unavailable`, refused credentials → :class:`ConfigError`; other server errors pass through."""
        import pymysql

        try:
            return fn()
        except pymysql.err.InterfaceError as exc:  # pymysql's own: a closed or broken connection
            raise _Unavailable(str(exc)) from None
        except pymysql.err.MySQLError as exc:
            code = _error_code(exc)
            if code in _ACCESS_ERRORS:
                raise ConfigError(
                    f"source.upstream {self.settings.describe()} refused the job's user (error {code}): set the "
                    f"password in the DSN or in {PASSWORD_ENV}, and grant SELECT on the replicated tables"
                ) from None
            if code == 0 and isinstance(exc, (pymysql.err.OperationalError, pymysql.err.InternalError)):
                raise _Unavailable(str(exc)) from None  # pymysql's own connection failures carry no number
            reason = _transient_reason(code, str(exc))
            if reason is not None:
                raise _Unavailable(f"{exc}: {reason}") from None
            raise
        except OSError as exc:
            raise _Unavailable(str(exc)) from None

    def _query(self, conn: Any, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        def run() -> list[tuple[Any, ...]]:
            with conn.cursor() as cur:
                cur.execute(sql, tuple(params) or None)
                return list(cur.fetchall())

        return self._call(run)  # type: ignore[no-any-return]

    def _query_described(self, conn: Any, sql: str, params: Sequence[Any]) -> tuple[list[str], list[tuple[Any, ...]]]:
        def run() -> tuple[list[str], list[tuple[Any, ...]]]:
            with conn.cursor() as cur:
                cur.execute(sql, tuple(params) or None)
                return [d[0] for d in cur.description or ()], list(cur.fetchall())

        return self._call(run)  # type: ignore[no-any-return]

    # -- the lookup -----------------------------------------------------------------------------------------

    def fetch(self, schema: str, table: str, key: Sequence[tuple[str, Any]], commit_ts: int, protocol: str) -> UpstreamRow:
        """The row of ``schema.table`` whose handle key is ``key`` (``(column, value)`` pairs from the
        message), as of ``commit_ts``.

        Raises:
            UpstreamRowError: no such row at that snapshot, several, or the server refused the query with
                an error that is not transient (an unknown table, a snapshot past the GC safe point).
            UpstreamUnavailableError: the upstream could not be reached, or answered with a transient error
                (:data:`_TRANSIENT_ERRORS`), on every attempt.
            ConfigError: the upstream refused the credentials, the session time zone, or has no snapshot
                reads.
        """
        import pymysql

        where = f"{schema}.{table} at commit ts {commit_ts} (key {preview(dict(key))})"

        def fetch_once() -> UpstreamRow:
            try:
                return self._fetch_once(schema, table, key, commit_ts, where)
            except _Unavailable:
                raise
            except pymysql.err.MySQLError as exc:
                raise UpstreamRowError(
                    protocol, f"handle-key-only row of {where}: the upstream {self.settings.describe()} refused "
                    f"the lookup: {preview(str(exc))}") from None
            except _Missing as exc:
                raise UpstreamRowError(protocol, f"handle-key-only row of {where}: {exc}") from None

        try:  # close() between attempts: a broken connection must not stick
            return retry_with_backoff(fetch_once, attempts=self.attempts, backoff=self.backoff, sleep=self._sleep,
                                      retry_on=(_Unavailable,), reset=self.close)
        except _Unavailable as exc:
            raise UpstreamUnavailableError(
                f"{protocol}: source.upstream {self.settings.describe()} failed {self.attempts} times reading the "
                f"handle-key-only row of {where}: {preview(str(exc))}"
            ) from None

    def _fetch_once(self, schema: str, table: str, key: Sequence[tuple[str, Any]], commit_ts: int,
                    where: str) -> UpstreamRow:
        conn = self._open()
        assert self.dialect is not None  # noqa: S101 - set by _open
        setup, sql = snapshot_select(self.dialect, schema, table, key, commit_ts)
        if self._snapshot != commit_ts:
            self._snapshot = None
            for stmt, params in setup:
                self._query(conn, stmt, params)
            self._snapshot = commit_ts
        args = [v for _, v in key if v is not None]
        names, rows = self._query_described(conn, sql, args)
        self.lookups += 1
        if not rows:
            raise _Missing(
                f"the upstream {self.settings.describe()} has no such row at that snapshot (deleted or "
                "changed since, or the snapshot is past TiDB's GC safe point: raise tikv_gc_life_time)"
            )
        if len(rows) > 1:
            raise _Missing(f"the upstream {self.settings.describe()} has {len(rows)} rows with that key")
        columns = self._table_columns(conn, schema, table, names)
        try:
            values = tuple(upstream_value(c.type, v) for c, v in zip(columns, rows[0]))
        except (ValueError, UnicodeDecodeError) as exc:
            raise _Missing(f"a value of the upstream row does not fit its column: {exc}") from None
        return UpstreamRow(columns, values)

    def _table_columns(self, conn: Any, schema: str, table: str, names: list[str]) -> tuple[UpstreamColumn, ...]:
        """The columns of ``schema.table`` (cached per connection; read again when the SELECT's columns
        differ: a DDL in between)."""
        cached = self._columns.get((schema, table))
        if cached is not None and [c.name for c in cached] == names:
            return cached
        rows = self._query(
            conn,
            "SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLUMN_KEY, EXTRA FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
            (schema, table),
        )
        by_name = {}
        for name, ctype, nullable, ckey, extra in rows:
            try:
                parsed = parse_column_type(_text(ctype))
            except UnsupportedColumnTypeError as exc:
                raise _Missing(f"column {_text(name)!r} has a type TiCDC cannot carry: {exc}") from None
            by_name[_text(name)] = UpstreamColumn(
                _text(name), parsed, _text(nullable).upper() == "YES", _text(ckey).upper(),
                "GENERATED" in _text(extra).upper(),
            )
        missing = [n for n in names if n not in by_name]
        if missing:
            raise _Missing(f"information_schema.COLUMNS does not describe column(s) {preview(missing)}")
        columns = tuple(by_name[n] for n in names)
        self._columns[(schema, table)] = columns
        return columns


class _Missing(Exception):
    """The lookup answered, but not with one usable row."""


def _error_code(exc: BaseException) -> int:
    """The MySQL error number of a pymysql error (``0`` when it carries none)."""
    return exc.args[0] if exc.args and isinstance(exc.args[0], int) else 0


def _transient_reason(code: int, message: str) -> str | None:
    """Why an error with this number and text is worth another try, or ``None`` when it is not: no
    server answer (the client-side ``CR_*`` 2xxx codes), a code of :data:`_TRANSIENT_ERRORS`, or TiDB's
    1105 wrapping one of them or naming a TiKV/PD timeout or an unavailable region."""
    if 2000 <= code < 3000:
        return "no answer from the server"
    if code in _TRANSIENT_ERRORS:
        return _TRANSIENT_ERRORS[code]
    if code == _ER_UNKNOWN_ERROR:
        for inner in _TIDB_INNER_CODE.findall(message):
            if int(inner) in _TRANSIENT_ERRORS:
                return _TRANSIENT_ERRORS[int(inner)]
        if _TRANSIENT_1105_TEXT.search(message):
            return "TiDB: a TiKV/PD timeout or an unavailable region"
    return None


def _text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8")
    return "" if value is None else str(value)
