"""Read tables straight from TiDB at a snapshot TSO with Spark's JDBC source (``snapshot --from tidb``).

TiDB speaks the MySQL protocol; the MySQL JDBC driver (``com.mysql:mysql-connector-j``, in ``jvm/spark``)
reads it. Every connection Spark opens — the metadata queries on the driver and each partition's read on
an executor — first runs ``SET @@tidb_snapshot = '<TSO>', time_zone = '+00:00'`` (Spark's
``sessionInitStatement``), so every read sees the same consistent snapshot and TIMESTAMPs come as UTC.

Schemas are rebuilt as ``CREATE TABLE`` text from ``information_schema.COLUMNS`` (``COLUMN_TYPE`` is
MySQL's own spelling: ``decimal(10,3)``, ``enum('a','b')``, ``bigint(20) unsigned``) and the primary /
unique keys from ``information_schema.STATISTICS``, then read by the job's DDL parser — the same typing
as a Dumpling export or a ``CREATE TABLE`` in the stream. Values are read as MySQL's text
(``CAST(c AS CHAR)``, ``HEX(c)`` for binary columns, the number of a BIT) and converted on the executors
by the stream's converters.

A table with a one-column integer key is read in ``partitions`` parallel key ranges (``MIN``/``MAX`` of the
key at the snapshot, Spark's ``partitionColumn``); any other table in one partition.

A MySQL-protocol server that is not TiDB (MariaDB, MySQL: the tests) has no ``tidb_snapshot``: the reads
are then *not* at one TSO, and the command requires ``--tso`` to be given explicitly.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Callable, Iterator, Sequence

import pyarrow as pa

from ..codec.model import TypeCode
from ..delta.arrow_types import arrow_type_for, converter_for
from ..errors import ConfigError, SinkError, SnapshotFormatError
from ..schema.ddl import quote_ident
from .dumpling import SnapshotColumn, TableExport, parse_schema_file

__all__ = ["JdbcSource", "redact_dsn"]

log = logging.getLogger(__name__)

_INTEGER_CODES = {TypeCode.TINYINT, TypeCode.SMALLINT, TypeCode.MEDIUMINT, TypeCode.INT, TypeCode.BIGINT}


#: Connector/J's ``user:password@host``: everything from ``//`` to the last ``@`` before the properties (a
#: password may hold a ``/``; of a host list only the last host stays visible), and any ``password…=``
#: property (``password``, ``password1``..``password3`` of multi-factor authentication,
#: ``trustCertificateKeyStorePassword``, ``clientCertificateKeyStorePassword``, ...).
_USER_INFO = re.compile(r"(?<=//)[^?#]*@")
_PASSWORD_PROPERTY = re.compile(r"(?i)(password\w*=)[^&;]*")


def redact_dsn(dsn: str) -> str:
    """The DSN with its passwords replaced (for messages and the state): the user info of
    ``jdbc:mysql://user:password@host/`` becomes ``***@``, every ``password…=`` property's value ``***``."""
    return _PASSWORD_PROPERTY.sub(r"\1***", _USER_INFO.sub("***@", dsn))


def _lit(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


class JdbcSource:
    """TiDB (or another MySQL-protocol server) over JDBC as a snapshot source for
    :func:`~ticdc_delta.snapshot.load.load_snapshot`.

    Args:
        spark: the SparkSession (the MySQL JDBC driver on its classpath).
        dsn: ``jdbc:mysql://host:port/?user=...&password=...``.
        tables: ``db.table`` names and/or ``db.*`` (every base table of ``db``).
        tso: the snapshot TSO; default: TiDB's current one (``TIDB_CURRENT_TSO()``). Required for servers
            that are not TiDB.
        partitions: parallel key ranges per table.

    Raises:
        ConfigError: no table named, a bad DSN, ``tso`` missing for a server that is not TiDB, a named
            table that does not exist.
    """

    def __init__(self, spark: Any, dsn: str, tables: Sequence[str], *, tso: int | None = None,
                 partitions: int = 4) -> None:
        if not dsn.startswith("jdbc:mysql://"):
            raise ConfigError(f"--dsn must look like jdbc:mysql://host:port/?user=...&password=..., got {redact_dsn(dsn)!r}")
        if not tables:
            raise ConfigError("name the tables to read: --table db.table or --table 'db.*' (repeatable)")
        if partitions < 1:
            raise ConfigError(f"--partitions must be >= 1, got {partitions}")
        self.spark, self.dsn, self.partitions = spark, dsn, partitions
        self.location = redact_dsn(dsn)
        version = self._query("SELECT VERSION() AS v", init=False)[0]["v"]
        self.tidb = "tidb" in str(version).lower()
        if tso is None:
            if not self.tidb:
                raise ConfigError(f"{self.location} is not TiDB ({version}): it has no snapshot TSO; give --tso")
            tso = int(self._query("SELECT TIDB_CURRENT_TSO() AS tso", init=False)[0]["tso"])
        elif not self.tidb:
            log.warning("%s is not TiDB (%s): the tables are read as they are now, not at TSO %d", self.location,
                        version, tso)
        self.tso = tso
        self.tables = [self._table(db, t) for db, t in self._names(tables)]

    # --- JDBC --------------------------------------------------------------------------------------

    def _init_statement(self) -> str:
        stmt = "SET time_zone = '+00:00'"
        if self.tidb:
            stmt += f", @@tidb_snapshot = '{int(self.tso)}'"
        return stmt

    def _reader(self, init: bool = True) -> Any:
        reader = self.spark.read.format("jdbc").option("url", self.dsn).option("driver", "com.mysql.cj.jdbc.Driver")
        if init:
            reader = reader.option("sessionInitStatement", self._init_statement())
        return reader

    def _query(self, sql: str, init: bool = True) -> list[dict[str, Any]]:
        """A small metadata query, collected on the driver (never table rows)."""
        try:
            return [r.asDict() for r in self._reader(init).option("query", sql).load().collect()]
        except Exception as exc:  # the JDBC driver's message: unreachable server, access denied, bad SQL
            raise ConfigError(f"{self.location}: {sql!r} failed: {str(exc).splitlines()[0][:300]}") from None

    def _names(self, patterns: Sequence[str]) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for pattern in patterns:
            db, sep, table = pattern.partition(".")
            if not sep or not db or not table:
                raise ConfigError(f"--table must look like db.table or db.*, got {pattern!r}")
            if table == "*":
                rows = self._query(
                    "SELECT TABLE_NAME AS t FROM information_schema.TABLES WHERE TABLE_SCHEMA = "
                    f"{_lit(db)} AND TABLE_TYPE = 'BASE TABLE' ORDER BY TABLE_NAME")
                out += [(db, r["t"]) for r in rows]
            else:
                out.append((db, table))
        return list(dict.fromkeys(out))

    def _table(self, db: str, table: str) -> TableExport:
        where = f"{self.location} {db}.{table}"
        cols = self._query(
            "SELECT COLUMN_NAME AS name, COLUMN_TYPE AS type, IS_NULLABLE AS nullable, EXTRA AS extra "
            f"FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = {_lit(db)} AND TABLE_NAME = {_lit(table)} "
            "ORDER BY ORDINAL_POSITION")
        if not cols:
            raise ConfigError(f"{where}: no such table (information_schema.COLUMNS has no columns for it)")
        # a VIRTUAL generated column is left out, as the stream's DDL replay leaves it out: TiCDC never sends
        # its values, so a snapshot value of it would never change again (STORED ones are sent: read)
        cols = [c for c in cols if "VIRTUAL" not in str(c["extra"] or "").upper()]
        keys = self._query(
            "SELECT INDEX_NAME AS idx, COLUMN_NAME AS name, NON_UNIQUE AS nu FROM information_schema.STATISTICS "
            f"WHERE TABLE_SCHEMA = {_lit(db)} AND TABLE_NAME = {_lit(table)} ORDER BY INDEX_NAME, SEQ_IN_INDEX")
        lines = [f"  {quote_ident(c['name'])} {c['type']}{'' if c['nullable'] == 'YES' else ' NOT NULL'}" for c in cols]
        unique: dict[str, list[str | None]] = {}
        kept = {c["name"].lower() for c in cols}
        for k in keys:
            if int(k["nu"]) == 0:  # (an expression part has no column; a VIRTUAL column's is left out)
                unique.setdefault(k["idx"], []).append(k["name"] if (k["name"] or "").lower() in kept else None)
        indexes = {name: [p for p in parts if p is not None] for name, parts in unique.items() if None not in parts}
        for name, parts in indexes.items():
            cols_sql = ",".join(quote_ident(p) for p in parts)
            lines.append(f"  PRIMARY KEY ({cols_sql})" if name.upper() == "PRIMARY"
                         else f"  UNIQUE KEY {quote_ident(name)} ({cols_sql})")
        ddl = f"CREATE TABLE {quote_ident(table)} (\n" + ",\n".join(lines) + "\n)"
        create = parse_schema_file(ddl, db, where)
        return TableExport(db, create.table, create, where)

    # --- rows ----------------------------------------------------------------------------------------

    def rows_frame(self, spark: Any, t: TableExport, columns: Sequence[SnapshotColumn],
                   extra: Sequence[tuple[pa.Field, Any]], spark_schema: str) -> Any:
        exprs = []
        for i, c in enumerate(columns):
            q = quote_ident(c.name)
            if c.type_code == TypeCode.BIT:
                expr = f"CAST({q} + 0 AS CHAR)"
            elif c.binary:
                expr = f"HEX({q})"
            else:
                expr = f"CAST({q} AS CHAR)"
            exprs.append(f"{expr} AS `c{i}`")
        source = f"{quote_ident(t.schema)}.{quote_ident(t.table)}"
        reader = self._reader()
        key = t.key
        key_col = next((c for c in columns if len(key) == 1 and c.name.lower() == key[0].lower()), None)
        if key_col is not None and key_col.type_code in _INTEGER_CODES and self.partitions > 1:
            q = quote_ident(key_col.name)
            bounds = self._query(f"SELECT MIN({q}) AS lo, MAX({q}) AS hi FROM {source}")[0]
            if bounds["lo"] is not None:
                exprs.append(f"{q} AS `__key`")
                reader = (reader.option("partitionColumn", "__key").option("lowerBound", str(int(bounds["lo"])))
                          .option("upperBound", str(int(bounds["hi"]) + 1)).option("numPartitions", str(self.partitions)))
        table_sql = f"(SELECT {', '.join(exprs)} FROM {source}) AS snapshot_rows"
        df = reader.option("dbtable", table_sql).load()
        df = df.select(*[f"c{i}" for i in range(len(columns))])
        return df.mapInArrow(make_text_fn(list(columns), list(extra), t.schema_file), spark_schema)


def make_text_fn(columns: list[SnapshotColumn], extra: list[tuple[pa.Field, Any]], where: str
                 ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: MySQL's text of each value in, the table's Delta types out."""

    def convert(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        converters = [converter_for(c.type_code, c.flags, c.params, "UTC") for c in columns]
        schema = pa.schema([c.field() for c in columns] + [f for f, _ in extra])
        for batch in batches:
            arrays = []
            for i, col in enumerate(columns):
                values: list[Any] = []
                for text in batch.column(i).to_pylist():
                    if text is None:
                        values.append(None)
                        continue
                    try:
                        if col.type_code == TypeCode.BIT:
                            value: Any = int(text)
                        elif col.binary:
                            value = bytes.fromhex(text)
                        else:
                            value = text
                        values.append(converters[i](value))
                    except (ValueError, SinkError) as exc:
                        raise SnapshotFormatError(f"{where}: column {col.name!r}: {text[:60]!r}: {exc}") from None
                arrays.append(pa.array(values, type=arrow_type_for(col.type_code, col.flags, col.params)))
            for f, value in extra:
                arrays.append(pa.array([value] * batch.num_rows, type=f.type))
            yield pa.RecordBatch.from_arrays(arrays, schema=schema)

    return convert
