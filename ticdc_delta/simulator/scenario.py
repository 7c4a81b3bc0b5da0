"""A scripted upstream: a TiDB + TiCDC pair that does exactly what a test says, and its expected state.

:class:`~ticdc_delta.simulator.Simulation` generates a random workload; a :class:`Scenario` plays one
written by hand, statement by statement, for tests that must put a given DDL between given rows::

    sc = Scenario("open-protocol", {}, partitions=2, topic="ddl-matrix")
    sc.ddl("CREATE TABLE `s`.`t` (`id` INT NOT NULL, `a` VARCHAR(20), PRIMARY KEY (`id`))")
    sc.insert("s", "t", id=1, a="x")
    sc.update("s", "t", {"id": 1}, a="y")
    sc.ddl("ALTER TABLE `s`.`t` ADD COLUMN `b` INT NOT NULL DEFAULT 7")   # existing rows read b = 7
    sc.delete("s", "t", id=1)
    sc.resolved()                      # every partition: resolved ts (a batch boundary helper)
    sc.messages()                      # [(partition, key, value), ...] in production order; ends the
                                       # stream (a final resolved ts on every partition)
    sc.oracle()                        # the upstream tables now (an Oracle, as verify wants it)
    sc.gone                            # tables that no longer exist upstream, with their last state

:meth:`Scenario.records` gives the messages with the events each carries; :meth:`Scenario.take` /
:meth:`Scenario.rest` give the stream in parts (to produce some, run a job, then play on).

The upstream model (:class:`ModelTable`) keeps, per table, the ordered columns (MySQL type as
:class:`~ticdc_delta.schema.mysql_types.ColumnType`: TiCDC type code, UNSIGNED/BINARY flags, precision,
scale, ENUM/SET members; nullability; DEFAULT), the primary key, the unique keys and the rows. DDL is
read with :func:`~ticdc_delta.schema.ddl.parse_ddl`; its effect on the data is computed here, as TiDB
would show it:

- ``ADD COLUMN``: existing rows read the column's DEFAULT, or NULL, or — ``NOT NULL`` without a
  DEFAULT — the type's zero value (TiDB's "origin default", ``generateOriginDefaultValue``);
  ``DEFAULT CURRENT_TIMESTAMP`` is the moment of the DDL (its commit ts' physical time, UTC), and of the
  insert for later inserts; ``FIRST``/``AFTER`` reorder the columns.
- ``DROP COLUMN`` removes the values; ``RENAME``/``CHANGE COLUMN`` renames them; ``MODIFY``/``CHANGE``
  re-reads them in the new type (a DECIMAL shows the new scale: ``"1.50"`` → ``"1.5000"``).
- ``ALTER COLUMN SET/DROP DEFAULT`` changes what later inserts get for an omitted column.
- ``ADD/DROP PRIMARY KEY``, ``ADD UNIQUE``, ``DROP INDEX`` change the keys, hence the handle key TiCDC
  flags (the primary key, else the first unique key over NOT NULL columns) and how updates are split.
- ``CREATE TABLE`` (``LIKE`` copies columns and keys, no rows), ``DROP TABLE``, ``TRUNCATE TABLE``,
  ``RENAME TABLE``, ``CREATE/DROP DATABASE``; index, partition, view, sequence and TiFlash DDL change
  nothing. A statement TiDB would refuse (unknown table, duplicate key, dropping a key column...) raises
  ``ValueError`` and sends nothing; a statement :func:`parse_ddl` cannot classify is sent and changes
  nothing in the model.

What TiCDC makes of it (seeds 003/004, tiflow ``cdc/sink``):

- Every DML statement is its own transaction with a new commit ts (a TSO: ``physical_ms << 18 |
  logical``), unless grouped with :meth:`Scenario.transaction`. Row images are full (every column, the
  old image on updates and deletes), values in the event model's canonical form
  (:mod:`ticdc_delta.codec.model`; ENUM/SET as numbers, as labels for Avro). An update that changes the
  primary key or a NOT NULL unique key is split into DELETE + INSERT at the same commit ts, and a
  transaction's deletes go first (TiCDC "Split primary or unique key UPDATE events").
- Rows are dispatched by a stable hash of schema, table and handle-key values
  (:func:`~ticdc_delta.simulator.stream.partition_for`) and written out, in order, at the next DDL
  (a barrier), resolved ts or :meth:`Scenario.flush`.
- Each DDL has its own commit ts and is broadcast to every partition; Canal-JSON sends it to partition 0
  only; Avro sends no DDL at all (the change shows in the next rows' schemas). A multi-table ``RENAME
  TABLE a TO b, c TO d`` is sent as one DDL event per table, all at the job's commit ts, each with its
  own ``RENAME TABLE a TO b`` query (tiflow ``BuildDDLEvents`` splits ``ActionRenameTables``).
- Resolved ts go to every partition on :meth:`Scenario.resolved` and once at the end (Canal-JSON only
  with ``enable-tidb-extension=true``; never with Avro).

Everything is deterministic: the same script gives the same bytes.
"""

from __future__ import annotations

import copy
import re
import struct
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation
from typing import Any, Iterator, Mapping, NamedTuple, Sequence

import numpy

from ..codec import encoder_for
from ..codec.base import EventEncoder
from ..codec.model import (
    INTEGER_TYPES,
    Column,
    ColumnFlag,
    DDLEvent,
    DDLType,
    Event,
    Op,
    ResolvedEvent,
    RowChange,
    TypeCode,
    column_flag,
)
from ..schema import ddl as d
from ..schema.mysql_types import ColumnType
from .oracle import Oracle, OracleColumn, TableOracle
from .stream import partition_for, protocol_rules
from .workload import TsoClock, compose_tso

__all__ = [
    "Scenario",
    "ScenarioMessage",
    "GoneTable",
    "ModelColumn",
    "ModelTable",
]

_MULTI_SCHEMA_CHANGE = 61  # TiDB model.ActionMultiSchemaChange: one ALTER TABLE with several changes

# The DDL type TiDB gives a job (model.ActionType), by the first change of the statement.
_DDL_TYPES: dict[type[d.SchemaChange], int] = {
    d.CreateDatabase: DDLType.CREATE_SCHEMA,
    d.DropDatabase: DDLType.DROP_SCHEMA,
    d.CreateTable: DDLType.CREATE_TABLE,
    d.DropTable: DDLType.DROP_TABLE,
    d.TruncateTable: DDLType.TRUNCATE_TABLE,
    d.RenameTable: DDLType.RENAME_TABLE,
    d.AddColumns: DDLType.ADD_COLUMN,
    d.DropColumn: DDLType.DROP_COLUMN,
    d.RenameColumn: DDLType.MODIFY_COLUMN,  # TiDB runs RENAME/CHANGE COLUMN as ActionModifyColumn
    d.ModifyColumn: DDLType.MODIFY_COLUMN,
    d.SetDefault: DDLType.SET_DEFAULT_VALUE,
    d.DropDefault: DDLType.SET_DEFAULT_VALUE,
    d.AddPrimaryKey: DDLType.ADD_PRIMARY_KEY,
    d.DropPrimaryKey: DDLType.DROP_PRIMARY_KEY,
    d.AddUniqueKey: DDLType.ADD_INDEX,
    d.DropIndex: DDLType.DROP_INDEX,
}
_NOOP_DDL_TYPES: dict[str, int] = {
    "index": DDLType.ADD_INDEX,
    "partition": DDLType.ADD_TABLE_PARTITION,
    "view": DDLType.CREATE_VIEW,
    "sequence": DDLType.CREATE_SEQUENCE,
    "tiflash": DDLType.SET_TIFLASH_REPLICA,
    "comment": DDLType.MODIFY_TABLE_COMMENT,
    "charset": DDLType.MODIFY_TABLE_CHARSET_AND_COLLATE,
    "auto_id": DDLType.REBASE_AUTO_ID,
    "foreign_key": DDLType.ADD_FOREIGN_KEY,
    "lock": DDLType.LOCK_TABLE,
    "table_option": DDLType.SHARD_ROW_ID,
}

_T = TypeCode
_TEXT_TYPES = frozenset({_T.VARCHAR, _T.VAR_STRING, _T.STRING, _T.TINYBLOB, _T.BLOB, _T.MEDIUMBLOB, _T.LONGBLOB})
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


# ------------------------------------------------------------------------------------------ the model


@dataclass
class ModelColumn:
    """One upstream column: name, MySQL type, nullability and DEFAULT (MySQL literal text or None)."""

    name: str
    type: ColumnType
    nullable: bool = True
    default: str | None = None
    auto_increment: bool = False
    generated: bool = False
    virtual: bool = False  # a VIRTUAL generated column: TiCDC's rows leave it out, the Delta table too

    @property
    def type_code(self) -> int:
        """TiCDC's type code."""
        return int(self.type.type_code)

    @property
    def mysql_type(self) -> str:
        """The type as ``SHOW CREATE TABLE`` spells it (``decimal(12,4)``, ``int unsigned``)."""
        return self.type.sql()


@dataclass
class ModelTable:
    """One upstream table: ordered columns, keys and rows (dicts by column name, in insertion order)."""

    schema: str
    table: str
    columns: list[ModelColumn]
    primary_key: tuple[str, ...] = ()
    unique_keys: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Unique keys by index name, in creation order."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    auto_next: int = 1

    @property
    def qualified(self) -> str:
        """``schema.table``."""
        return f"{self.schema}.{self.table}"

    def column(self, name: str) -> ModelColumn:
        """The column called ``name`` (MySQL column names are case-insensitive).

        Raises:
            ValueError: no such column.
        """
        low = name.lower()
        for col in self.columns:
            if col.name.lower() == low:
                return col
        raise ValueError(f"{self.qualified} has no column {name!r}")

    def has_column(self, name: str) -> bool:
        """Whether the table has a column called ``name`` (case-insensitive)."""
        low = name.lower()
        return any(c.name.lower() == low for c in self.columns)

    def position(self, name: str) -> int:
        """Index of column ``name`` in the column order.

        Raises:
            ValueError: no such column.
        """
        low = name.lower()
        for i, col in enumerate(self.columns):
            if col.name.lower() == low:
                return i
        raise ValueError(f"{self.qualified} has no column {name!r}")

    def handle_key(self) -> tuple[str, ...]:
        """TiCDC's handle key: the primary key, else the first unique key over NOT NULL columns (not VIRTUAL
        generated ones: its rows leave those out), else ()."""
        if self.primary_key:
            return self.primary_key
        for cols in self.unique_keys.values():
            if all(not self.column(c).nullable and not self.column(c).virtual for c in cols):
                return cols
        return ()

    def split_keys(self) -> list[tuple[str, ...]]:
        """Keys whose change splits an UPDATE: the primary key and every unique key over NOT NULL columns."""
        keys = [self.primary_key] if self.primary_key else []
        keys += [cols for cols in self.unique_keys.values() if all(not self.column(c).nullable for c in cols)]
        return keys

    def flags(self, col: ModelColumn) -> ColumnFlag:
        """The column's TiCDC flags: type flags, NULLABLE, PRIMARY_KEY, UNIQUE_KEY, HANDLE_KEY, GENERATED."""
        value = int(col.type.flags) & int(ColumnFlag.BINARY | ColumnFlag.UNSIGNED)
        low = col.name.lower()
        if col.nullable:
            value |= ColumnFlag.NULLABLE
        if low in (c.lower() for c in self.primary_key):
            value |= ColumnFlag.PRIMARY_KEY
        if any(low in (c.lower() for c in cols) for cols in self.unique_keys.values()):
            value |= ColumnFlag.UNIQUE_KEY
        if low in (c.lower() for c in self.handle_key()):
            value |= ColumnFlag.HANDLE_KEY
        if col.generated:
            value |= ColumnFlag.GENERATED
        return column_flag(int(value))

    def image(self, row: Mapping[str, Any], *, labels: bool = False) -> tuple[Column, ...]:
        """The row image of ``row``: every column but the VIRTUAL generated ones (TiCDC leaves them out), in
        column order (ENUM/SET as labels when ``labels``)."""
        out = []
        for col in self.columns:
            if col.virtual:
                continue
            value = row[col.name]
            if labels:
                value = _as_label(col, value)
            out.append(Column(col.name, col.type_code, self.flags(col), value))
        return tuple(out)

    def key_of(self, row: Mapping[str, Any]) -> tuple[Any, ...]:
        """The row's handle-key values (every value when the table has no handle key)."""
        names = self.handle_key() or tuple(c.name for c in self.columns)
        return tuple(row[self.column(n).name] for n in names)

    def oracle(self, *, labels: bool) -> TableOracle:
        """The table as the oracle describes it (ENUM/SET as labels when ``labels``; no VIRTUAL generated
        column: the Delta table has none)."""
        stored = [c for c in self.columns if not c.virtual]
        columns = [
            OracleColumn(c.name, c.type_code, int(self.flags(c)), c.mysql_type, c.type.precision, c.type.scale,
                         tuple(c.type.members) if c.type.members else None)
            for c in stored
        ]
        key = tuple(self.column(k).name for k in self.handle_key()) or tuple(c.name for c in stored)
        rows = [{c.name: (_as_label(c, r[c.name]) if labels else r[c.name]) for c in stored} for r in self.rows]
        return TableOracle(self.schema, self.table, key, columns, rows)


class GoneTable(NamedTuple):
    """A table that no longer exists upstream under this name, and what it held when it went."""

    schema: str
    table: str
    reason: str
    """``"drop_table"``, ``"drop_database"`` or ``"rename_table"`` (the policy class that removed it)."""
    commit_ts: int
    last: TableOracle
    """The table just before the DDL (what a job that ignores the DDL keeps)."""


class ScenarioMessage(NamedTuple):
    """One Kafka message of the scenario, with the events it carries."""

    partition: int
    key: bytes | None
    value: bytes | None
    kind: str
    """``"rows"``, ``"ddl"`` or ``"resolved"``."""
    events: tuple[Event, ...]


# ------------------------------------------------------------------------------------------ values


def _as_label(col: ModelColumn, value: Any) -> Any:
    """ENUM index / SET bit mask as the member label(s) (what Avro carries)."""
    members = col.type.members
    if value is None or not members or not isinstance(value, int):
        return value
    if col.type_code == _T.ENUM:
        return members[value - 1] if 1 <= value <= len(members) else ""
    if col.type_code == _T.SET:
        return ",".join(m for i, m in enumerate(members) if value >> i & 1)
    return value


def _float32(value: float) -> float:
    """``value`` as TiDB stores a FLOAT (single precision), widened back to a Python float."""
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


def _is_text(col: ModelColumn) -> bool:
    return col.type_code in _TEXT_TYPES and not col.type.binary


def _as_text(col: ModelColumn, value: Any) -> Any:
    """A model value of ``col`` as the text TiDB's MODIFY COLUMN to a string type gives it (``Datum``'s
    ``convertToString``): numbers in full, never an exponent (FLOAT with the fewest digits that read back as
    the same single), BIT as its number, ENUM/SET as their labels; text values (dates, times, DECIMAL, JSON)
    as they are."""
    tc = col.type_code
    if value is None or isinstance(value, (str, bytes)):
        return value
    if tc == _T.FLOAT:
        return numpy.format_float_positional(numpy.float32(value), unique=True, trim="-")
    if tc == _T.DOUBLE:
        return numpy.format_float_positional(float(value), unique=True, trim="-")
    if tc == _T.ENUM:
        return col.type.members[value - 1] if value else ""
    if tc == _T.SET:
        return ",".join(m for i, m in enumerate(col.type.members) if value >> i & 1)
    return str(value)


_TIMES = (_T.DATETIME, _T.TIMESTAMP, _T.TIME)


def _rounded(old: ModelColumn, new: ModelColumn, value: Any) -> Any:
    """A DATETIME/TIMESTAMP/TIME text value of ``old`` with ``new``'s fewer fractional digits, as TiDB's
    reorg rounds it (half up: 10:10:10.5 → 10:10:11, -00:00:00.5 → 00:00:00); others as they are."""
    if not isinstance(value, str) or old.type_code not in _TIMES or new.type_code != old.type_code:
        return value
    fsp = new.type.fsp or 0
    if fsp >= (old.type.fsp or 0):
        return value
    head, _, seconds = value.rpartition(":")
    step = Decimal(1).scaleb(-fsp)
    if old.type_code == _T.TIME:
        negative = head.startswith("-")
        hours, minutes = head.lstrip("-").split(":")
        total = (int(hours) * 3600 + int(minutes) * 60) + Decimal(seconds)
        total = -total if negative else total
        total = (total + step / 2).quantize(step, rounding="ROUND_FLOOR")
        sign, total = ("-", -total) if total < 0 else ("", total)
        whole = int(total)
        fraction = f"{total - whole:.{fsp}f}"[1:] if fsp else ""
        return f"{sign}{whole // 3600:02d}:{whole // 60 % 60:02d}:{whole % 60:02d}{fraction}"
    moment = datetime.strptime(value[:19], "%Y-%m-%d %H:%M:%S")
    exact = Decimal(seconds) - int(Decimal(seconds))
    carried = (exact + step / 2).quantize(step, rounding="ROUND_FLOOR")
    moment += timedelta(seconds=int(carried))
    fraction = f"{carried - int(carried):.{fsp}f}"[1:] if fsp else ""
    return moment.strftime("%Y-%m-%d %H:%M:%S") + fraction


def _decimal_text(col: ModelColumn, value: Any, where: str) -> str:
    """A DECIMAL value as TiDB prints it: exactly ``scale`` fraction digits, no exponent, no ``-0``."""
    precision = col.type.precision if col.type.precision is not None else 10
    scale = col.type.scale or 0
    try:
        number = Decimal(str(value)) if not isinstance(value, Decimal) else value
        number = number.quantize(Decimal(1).scaleb(-scale))
    except InvalidOperation:
        raise ValueError(f"{where}: {value!r} is not a DECIMAL value") from None
    if number.is_zero():
        number = abs(number)
    text = format(number, "f")
    digits = text.lstrip("-").split(".")[0].lstrip("0")
    if len(digits) > precision - scale:
        raise ValueError(f"{where}: {value!r} does not fit DECIMAL({precision},{scale})")
    return text


def _canonical(col: ModelColumn, value: Any, where: str) -> Any:
    """``value`` in the event model's canonical form for ``col`` (``codec.model`` docstring).

    Accepts the canonical value, and the text of a literal (what a DEFAULT gives) for numeric types.

    Raises:
        ValueError: NULL for a NOT NULL column, or a value the type cannot hold.
    """
    if value is None:
        if not col.nullable:
            raise ValueError(f"{where}: column {col.name!r} is NOT NULL")
        return None
    tc = col.type_code
    if tc == _T.DECIMAL:
        return _decimal_text(col, value, where)
    try:
        if tc in INTEGER_TYPES or tc == _T.BIT:
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                raise ValueError
            number = int(value, 0) if isinstance(value, str) and value.lower().startswith(("0x", "0b")) else int(value)
            if col.type.unsigned and number < 0:
                raise ValueError
            return number
        if tc == _T.FLOAT:
            return _float32(float(value))
        if tc == _T.DOUBLE:
            return float(value)
        if tc in (_T.ENUM, _T.SET):
            members = tuple(col.type.members)
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, int):
                return value
            if not isinstance(value, str):
                raise ValueError
            if tc == _T.ENUM:
                return members.index(value) + 1 if value else 0
            mask = 0
            for label in filter(None, value.split(",")):
                mask |= 1 << members.index(label)
            return mask
        if tc in _TEXT_TYPES and col.type.binary:
            if isinstance(value, str):
                return value.encode()
            if not isinstance(value, (bytes, bytearray)):
                raise ValueError
            return bytes(value)
        if not isinstance(value, str):
            raise ValueError
        return value
    except (ValueError, TypeError, OverflowError):
        raise ValueError(f"{where}: {value!r} is not a value of column {col.name!r} ({col.mysql_type})") from None


def _now_text(col: ModelColumn, ts: int) -> str:
    """``CURRENT_TIMESTAMP`` at commit ts ``ts`` (its physical milliseconds, UTC) for a DATETIME/TIMESTAMP
    column, with the column's fractional digits (exact up to 3: a TSO has millisecond precision)."""
    moment = _EPOCH + timedelta(milliseconds=ts >> 18)
    text = moment.strftime("%Y-%m-%d %H:%M:%S")
    fsp = col.type.fsp or 0
    return text + (f".{moment.microsecond:06d}"[: fsp + 1] if fsp else "")


def _literal(col: ModelColumn, text: str, ts: int, where: str) -> Any:
    """The value of a DEFAULT in :class:`~ticdc_delta.schema.ddl.ColumnDef`'s canonical text, for a
    statement committed at ``ts`` (``CURRENT_TIMESTAMP`` is that moment, as TiDB fills it).

    Raises:
        ValueError: an expression default (``(UUID())``...) the model cannot evaluate, or
            ``CURRENT_TIMESTAMP`` for a column that is not DATETIME/TIMESTAMP.
    """
    upper = text.upper()
    if upper.startswith("CURRENT_TIMESTAMP"):
        if col.type_code not in (_T.DATETIME, _T.TIMESTAMP):
            raise ValueError(f"{where}: DEFAULT {text} needs a DATETIME or TIMESTAMP column")
        return _now_text(col, ts)
    if upper == "NULL":
        return None
    if upper in ("TRUE", "FALSE"):
        return str(int(upper == "TRUE"))
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return text[1:-1].replace("''", "'").replace("\\\\", "\\")
    if upper.startswith("B'") and text.endswith("'"):
        return str(int(text[2:-1] or "0", 2))
    if upper.startswith("X'") and text.endswith("'"):
        return bytes.fromhex(text[2:-1])
    if _NUMBER.fullmatch(text):
        return text
    raise ValueError(f"{where}: DEFAULT {text} is an expression the scenario model cannot evaluate")


def _zero_value(col: ModelColumn) -> Any:
    """What TiDB shows for a NOT NULL column without DEFAULT added to existing rows (the type's zero)."""
    tc = col.type_code
    if tc in INTEGER_TYPES or tc in (_T.BIT, _T.SET):
        return 0
    if tc in (_T.FLOAT, _T.DOUBLE):
        return 0.0
    if tc == _T.DECIMAL:
        return _decimal_text(col, 0, col.name)
    if tc == _T.ENUM:
        return 1  # the first member
    if tc in (_T.DATE, _T.NEWDATE):
        return "0000-00-00"
    if tc in (_T.DATETIME, _T.TIMESTAMP):
        fsp = col.type.fsp or 0
        return "0000-00-00 00:00:00" + ("." + "0" * fsp if fsp else "")
    if tc == _T.TIME:
        return "00:00:00"
    if tc == _T.JSON:
        return "null"
    if tc in _TEXT_TYPES and col.type.binary:
        if col.type.type_code == _T.STRING:
            return b"\x00" * (col.type.length or 1)  # BINARY(n) pads with zero bytes
        return b""
    return ""


def _default_value(col: ModelColumn, ts: int, where: str) -> tuple[bool, Any]:
    """``(has a default, its value)`` of ``col`` in a statement committed at ``ts`` (a nullable column
    without DEFAULT defaults to NULL)."""
    if col.default is None:
        return (col.nullable, None)
    return True, _canonical(col, _literal(col, col.default, ts, where), where)


def _model_column(cdef: d.ColumnDef) -> ModelColumn:
    return ModelColumn(cdef.name, cdef.type, cdef.nullable, cdef.default, cdef.auto_increment, cdef.generated,
                       cdef.virtual)


def _q(name: str) -> str:
    return d.quote_ident(name)


# ------------------------------------------------------------------------------------------ scenario


class Scenario:
    """A hand-written upstream and the TiCDC changefeed writing it to Kafka (see the module docstring).

    Args:
        protocol: ``open-protocol``, ``craft``, ``canal-json`` or ``avro``.
        options: TiCDC sink-uri options for the encoder (``max-batch-size``, ``enable-tidb-extension``...).
        partitions: Kafka partitions.
        topic: the topic (recorded in the oracle; Avro's subjects are ``<topic>-key/-value``).
        schemas: Avro only: the :class:`~ticdc_delta.codec.avro.AvroSchemas` schemas are registered in
            (default: a fresh dict-backed one, :attr:`schemas`).

    Raises:
        ValueError: unknown protocol, bad option, or ``partitions`` < 1.
    """

    def __init__(
        self,
        protocol: str = "open-protocol",
        options: Mapping[str, str] | None = None,
        *,
        partitions: int = 2,
        topic: str | None = None,
        schemas: Any = None,
    ) -> None:
        if partitions < 1:
            raise ValueError(f"partitions must be at least 1, got {partitions}")
        self.protocol = protocol
        self.options = {str(k): str(v) for k, v in (options or {}).items()}
        self.rules = protocol_rules(protocol, self.options)
        self.partitions = partitions
        self.topic = topic
        self._encoder_options = dict(self.options)
        if protocol == "avro":
            from ..codec.avro import AvroSchemas

            schemas = AvroSchemas() if schemas is None else schemas
            if topic and "topic" not in self._encoder_options:
                self._encoder_options["topic"] = topic  # TopicNameStrategy subjects
        self.schemas = schemas
        self.databases: set[str] = set()
        self.tables: dict[tuple[str, str], ModelTable] = {}
        self.gone: dict[str, GoneTable] = {}
        """Tables that existed and no longer do, by ``schema.table`` (dropped, renamed away)."""
        self.ddl_log: list[DDLEvent] = []
        """Every DDL event sent (or, for Avro, that would have been), in commit order."""
        self.unknown_ddl: list[str] = []
        """Queries :func:`parse_ddl` could not classify (sent, no effect on the model)."""
        self.counts = {"insert": 0, "update": 0, "delete": 0, "pk_change_splits": 0, "ddl": 0, "resolved": 0}
        self._tick = 0
        self.last_ts = 0
        self._pending: list[list[RowChange]] = [[] for _ in range(partitions)]
        self._out: list[ScenarioMessage] = []
        self._taken = 0
        self._txn: list[RowChange] | None = None
        self._txn_ts = 0
        self._txn_touched: set[tuple[Any, ...]] = set()
        self._finished = False
        self._encoder = self._new_encoder()

    # -- public API ---------------------------------------------------------------------------------

    def table(self, schema: str, table: str) -> ModelTable:
        """The live model of ``schema.table``.

        Raises:
            ValueError: no such table upstream.
        """
        found = self._find(schema, table)
        if found is None:
            raise ValueError(f"table {schema}.{table} does not exist upstream")
        return found

    def ddl(self, query: str, *, schema: str = "", ddl_type: int | None = None, split_renames: bool = True) -> int:
        """Run a DDL statement upstream; returns its commit ts.

        Args:
            query: the statement, as TiDB would receive it (and TiCDC send it).
            schema: the session's current database: the database of names the statement does not
                qualify, and the DDL event's schema when the statement names none.
            ddl_type: the DDL type to send (default: the one TiDB gives the statement's first change).
            split_renames: send a multi-table ``RENAME TABLE`` as one event per table, as TiCDC does;
                ``False`` sends the statement as one event (as older producers did).

        Raises:
            ValueError: TiDB would refuse the statement (unknown table or column, duplicate key...).
            RuntimeError: inside a transaction, or after the stream was finished.
        """
        self._check_open()
        if self._txn is not None:
            raise RuntimeError("a DDL cannot run inside a transaction (TiDB commits the transaction first)")
        changes = d.parse_ddl(query, default_schema=schema, ddl_type=ddl_type)
        ts = self._next_ts()
        saved = (copy.deepcopy(self.tables), set(self.databases), dict(self.gone))
        try:
            for change in changes:
                self._apply(change, ts)
        except Exception:
            self.tables, self.databases, self.gone = saved
            raise
        if any(isinstance(c, d.Unknown) for c in changes):
            self.unknown_ddl.append(query)
        renames = [c for c in changes if isinstance(c, d.RenameTable)]
        if split_renames and len(renames) > 1 and len(renames) == len(changes):
            events = [
                DDLEvent(ts, r.new_schema, r.new_table,
                         f"RENAME TABLE {_q(r.schema)}.{_q(r.table)} TO {_q(r.new_schema)}.{_q(r.new_table)}",
                         int(DDLType.RENAME_TABLE))
                for r in renames
            ]
        else:
            ev_schema, ev_table = self._ddl_target(changes, schema)
            events = [DDLEvent(ts, ev_schema, ev_table, query, self._ddl_type(changes, query, ddl_type))]
        self._barrier()
        for event in events:
            self.ddl_log.append(event)
            self.counts["ddl"] += 1
            if self.rules.sends_ddl:
                targets = range(self.partitions) if self.rules.ddl_to_all_partitions else range(1)
                for p in targets:
                    self._send(p, [event], "ddl")
        if self.protocol == "avro":
            self._encoder = self._new_encoder()  # the new column types go into the next schemas
        return ts

    def insert(self, schema: str, table: str, **values: Any) -> int:
        """``INSERT`` one row (omitted columns get their DEFAULT); returns the commit ts.

        Raises:
            ValueError: unknown column, NULL for a NOT NULL column, no value for a column without a
                DEFAULT, a duplicate key, or a value the column's type cannot hold.
        """
        t = self._table_for_dml(schema, table)
        where = f"INSERT INTO {t.qualified}"
        ts = self._statement_ts()
        given = {t.column(n).name: v for n, v in values.items()}
        if len(given) != len(values):
            raise ValueError(f"{where}: a column is given twice: {sorted(values)}")
        row: dict[str, Any] = {}
        for col in t.columns:
            if col.name in given:
                row[col.name] = _canonical(col, given[col.name], where)
                if col.auto_increment and isinstance(row[col.name], int):
                    t.auto_next = max(t.auto_next, row[col.name] + 1)
                continue
            if col.auto_increment:
                row[col.name] = t.auto_next
                t.auto_next += 1
                continue
            has, value = _default_value(col, ts, where)
            if not has:
                raise ValueError(f"{where}: column {col.name!r} has no DEFAULT and no value was given")
            row[col.name] = value
        self._check_unique(t, row, None, where)
        t.rows.append(row)
        self.counts["insert"] += 1
        return self._emit(t, [RowChange(ts, t.schema, t.table, Op.INSERT, t.image(row), None)], [row])

    def update(self, schema: str, table: str, where: Mapping[str, Any], **changes: Any) -> int | None:
        """``UPDATE`` the one row matching ``where`` (column → value); returns the commit ts, or ``None``
        when nothing changed (TiDB writes nothing then, so TiCDC sends nothing).

        An update that changes the primary key or a NOT NULL unique key is sent as DELETE + INSERT.

        Raises:
            ValueError: no row or several rows match, an unknown column, a duplicate key, a bad value.
        """
        t = self._table_for_dml(schema, table)
        what = f"UPDATE {t.qualified}"
        ts = self._statement_ts()
        i = self._match(t, where, what)
        old = t.rows[i]
        new = dict(old)
        for name, value in changes.items():
            col = t.column(name)
            new[col.name] = _canonical(col, value, what)
        if new == old:
            return None
        self._check_unique(t, new, i, what)
        t.rows[i] = new
        if any(tuple(old[t.column(c).name] for c in k) != tuple(new[t.column(c).name] for c in k)
               for k in t.split_keys()):
            self.counts["delete"] += 1
            self.counts["insert"] += 1
            self.counts["pk_change_splits"] += 1
            events = [RowChange(ts, t.schema, t.table, Op.DELETE, None, t.image(old)),
                      RowChange(ts, t.schema, t.table, Op.INSERT, t.image(new), None)]
            return self._emit(t, events, [old, new])
        self.counts["update"] += 1
        return self._emit(t, [RowChange(ts, t.schema, t.table, Op.UPDATE, t.image(new), t.image(old))], [new])

    def delete(self, schema: str, table: str, **where: Any) -> int:
        """``DELETE`` the one row matching ``where``; returns the commit ts.

        Raises:
            ValueError: no row or several rows match, or an unknown column.
        """
        t = self._table_for_dml(schema, table)
        what = f"DELETE FROM {t.qualified}"
        ts = self._statement_ts()
        i = self._match(t, where, what)
        old = t.rows.pop(i)
        self.counts["delete"] += 1
        return self._emit(t, [RowChange(ts, t.schema, t.table, Op.DELETE, None, t.image(old))], [old])

    @contextmanager
    def transaction(self) -> Iterator[int]:
        """Group the DML inside into one transaction (one commit ts, yielded); deletes are sent first.

        A transaction changes each row at most once (TiCDC sends one event per row per transaction). When
        the block raises, the model is rolled back and nothing is sent.

        Raises:
            RuntimeError: nested, or after the stream was finished.
            ValueError: a row changed twice.
        """
        self._check_open()
        if self._txn is not None:
            raise RuntimeError("transactions do not nest")
        saved = (copy.deepcopy(self.tables), dict(self.counts))
        self._txn, self._txn_ts, self._txn_touched = [], self._next_ts(), set()
        try:
            yield self._txn_ts
        except BaseException:
            self.tables, self.counts = saved
            self._txn = None
            raise
        events, self._txn = self._txn, None
        # TiCDC sends the DELETE halves of split updates (and every delete) before the other changes.
        ordered = [e for e in events if e.op == Op.DELETE] + [e for e in events if e.op != Op.DELETE]
        self._dispatch(ordered)

    def resolved(self) -> int:
        """Write every pending row, then a resolved ts to every partition (where the protocol sends them).

        Returns:
            The resolved ts (a fresh TSO: every commit so far is below it).
        """
        self._check_open()
        if self._txn is not None:
            raise RuntimeError("resolved() inside a transaction")
        ts = self._next_ts()
        self._barrier()
        if self.rules.sends_resolved:
            self.counts["resolved"] += 1
            for p in range(self.partitions):
                self._send(p, [ResolvedEvent(ts)], "resolved")
        return ts

    def flush(self) -> None:
        """Write every partition's pending rows now (TiCDC writes rows out as they come)."""
        self._barrier()

    def take(self) -> list[tuple[int, bytes | None, bytes | None]]:
        """The messages written since the last :meth:`take` (pending rows are flushed first); the stream
        stays open (for producing a scenario in parts, between job runs)."""
        self._check_open()
        self._barrier()
        out = [(m.partition, m.key, m.value) for m in self._out[self._taken:]]
        self._taken = len(self._out)
        return out

    def finish(self) -> None:
        """End the stream: pending rows, then a final resolved ts on every partition. Idempotent."""
        if self._finished:
            return
        if self._txn is not None:
            raise RuntimeError("finish() inside a transaction")
        self.resolved()
        self._finished = True

    def records(self) -> list[ScenarioMessage]:
        """Every message with its events, in production order (finishes the stream)."""
        self.finish()
        return list(self._out)

    def messages(self) -> list[tuple[int, bytes | None, bytes | None]]:
        """``(partition, key, value)`` of every message in production order (finishes the stream: the
        rest goes out, then a final resolved ts on every partition)."""
        return [(m.partition, m.key, m.value) for m in self.records()]

    def rest(self) -> list[tuple[int, bytes | None, bytes | None]]:
        """The messages not yet returned by :meth:`take` (finishes the stream)."""
        self.finish()
        out = [(m.partition, m.key, m.value) for m in self._out[self._taken:]]
        self._taken = len(self._out)
        return out

    def oracle(self) -> Oracle:
        """The upstream state now — after the last statement, the expected final state: every table that
        exists upstream. Does not finish the stream (``counts["messages"]`` counts what was written so far).

        Tables that are gone are not in it; :attr:`gone` has them (``counts["gone_tables"]`` names them
        with the reason).
        """
        labels = self.rules.enum_as_label
        tables = {t.qualified: t.oracle(labels=labels) for t in self.tables.values()}
        ddl = [{"commit_ts": e.commit_ts, "schema": e.schema, "table": e.table, "query": e.query,
                "ddl_type": e.ddl_type} for e in self.ddl_log]
        counts: dict[str, Any] = dict(self.counts)
        counts["messages"] = len(self._out)
        counts["last_commit_ts"] = self.last_ts
        counts["gone_tables"] = {name: g.reason for name, g in sorted(self.gone.items())}
        return Oracle(self.protocol, dict(self.options), 0, self.partitions, dict(sorted(tables.items())), ddl,
                      counts, self.topic)

    # -- commits and messages -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._finished:
            raise RuntimeError("the scenario's stream is finished (messages()/records()/rest() were called)")

    def _next_ts(self) -> int:
        # deterministic TSOs: physical time advancing 3 ms per commit, the logical part cycling
        self._tick += 1
        ts = compose_tso(TsoClock.START_MS + 3 * self._tick, self._tick % 3)
        self.last_ts = ts
        return ts

    def _table_for_dml(self, schema: str, table: str) -> ModelTable:
        self._check_open()
        return self.table(schema, table)

    def _statement_ts(self) -> int:
        """The commit ts of the DML statement being run: the transaction's, or a new one."""
        return self._txn_ts if self._txn is not None else self._next_ts()

    def _emit(self, t: ModelTable, events: list[RowChange], rows: list[dict[str, Any]]) -> int:
        """Send the events of one statement (their commit ts already set), or add them to the transaction."""
        if self._txn is not None:
            for row in rows:
                ident = (t.schema, t.table, t.key_of(row))
                if ident in self._txn_touched:
                    raise ValueError(f"{t.qualified}: a transaction changes each row at most once ({ident[2]})")
                self._txn_touched.add(ident)
            self._txn.extend(events)
            return self._txn_ts
        self._dispatch(events)
        ts = events[0].commit_ts
        assert ts is not None  # noqa: S101 - the simulator's row events carry their commit ts
        return ts

    def _dispatch(self, events: Sequence[RowChange]) -> None:
        labels = self.rules.enum_as_label
        for e in events:
            if labels:
                e = self._labelled(e)
            self._pending[partition_for(e, self.partitions)].append(e)

    def _labelled(self, e: RowChange) -> RowChange:
        t = self.tables.get((e.schema, e.table))

        def render(image: Any) -> Any:
            if image is None or t is None:
                return image
            return tuple(c._replace(value=_as_label(t.column(c.name), c.value))
                         if c.type in (_T.ENUM, _T.SET) else c for c in image)

        return e._replace(columns=render(e.columns), old=render(e.old))

    def _barrier(self) -> None:
        """Write every partition's pending rows (before a DDL or resolved ts, TiCDC's barrier)."""
        for p, rows in enumerate(self._pending):
            if rows:
                self._pending[p] = []
                self._send(p, rows, "rows")

    def _send(self, partition: int, events: list[Any], kind: str) -> None:
        chunk = 1
        if kind == "rows" and self.protocol in ("open-protocol", "craft"):
            chunk = int(self.options.get("max-batch-size", "16"))
        for i in range(0, len(events), chunk):
            part = tuple(events[i:i + chunk])
            messages = self._encoder.encode(part)
            if len(messages) == len(part):
                spread = [(e,) for e in part]
            else:
                spread = [part] * len(messages)  # the encoder split the batch its own way: attribute all
            for (key, value), evs in zip(messages, spread):
                self._out.append(ScenarioMessage(partition, key, value, kind, evs))

    def _new_encoder(self) -> EventEncoder:
        if self.protocol != "avro":
            return encoder_for(self.protocol, self._encoder_options)
        from ..codec.avro import AvroEncoder

        # TiCDC writes a DECIMAL's declared precision/scale and an ENUM/SET's members into the schema
        params: dict[tuple[str, str, str], dict[str, Any]] = {}
        for t in self.tables.values():
            for c in t.columns:
                if c.type_code == _T.DECIMAL or c.type.members:
                    params[(t.schema, t.table, c.name)] = {
                        "precision": c.type.precision if c.type_code == _T.DECIMAL else None,
                        "scale": c.type.scale if c.type_code == _T.DECIMAL else None,
                        "members": list(c.type.members) if c.type.members else None,
                    }
        return AvroEncoder(self._encoder_options, schemas=self.schemas, column_params=params)

    # -- rows ---------------------------------------------------------------------------------------

    @staticmethod
    def _match(t: ModelTable, where: Mapping[str, Any], what: str) -> int:
        if not where:
            raise ValueError(f"{what}: a WHERE (column -> value) is needed")
        conds = {}
        for name, value in where.items():
            col = t.column(name)
            conds[col.name] = _canonical(col, value, what) if value is not None else None
        hits = [i for i, r in enumerate(t.rows) if all(r[n] == v for n, v in conds.items())]
        if len(hits) != 1:
            raise ValueError(f"{what}: {len(hits)} rows match {dict(where)!r}; expected exactly one")
        return hits[0]

    @staticmethod
    def _check_unique(t: ModelTable, row: Mapping[str, Any], skip: int | None, what: str) -> None:
        keys = [("PRIMARY", t.primary_key)] if t.primary_key else []
        keys += list(t.unique_keys.items())
        for name, cols in keys:
            names = [t.column(c).name for c in cols]
            mine = tuple(row[n] for n in names)
            if any(v is None for v in mine):
                continue  # a unique key allows any number of NULLs
            for i, other in enumerate(t.rows):
                if i != skip and tuple(other[n] for n in names) == mine:
                    raise ValueError(f"{what}: duplicate entry {mine!r} for key {name!r}")

    # -- DDL ----------------------------------------------------------------------------------------

    def _find(self, schema: str, table: str) -> ModelTable | None:
        found = self.tables.get((schema, table))
        if found is not None:
            return found
        for (s, t), model in self.tables.items():  # TiDB table names are case-insensitive by default
            if s.lower() == schema.lower() and t.lower() == table.lower():
                return model
        return None

    def _require(self, schema: str, table: str, what: str) -> ModelTable:
        found = self._find(schema, table)
        if found is None:
            raise ValueError(f"{what}: table {schema}.{table} does not exist upstream")
        return found

    def _gone(self, t: ModelTable, reason: str, ts: int) -> None:
        del self.tables[(t.schema, t.table)]
        self.gone[t.qualified] = GoneTable(t.schema, t.table, reason, ts, t.oracle(labels=self.rules.enum_as_label))

    def _add(self, t: ModelTable) -> None:
        self.tables[(t.schema, t.table)] = t
        self.databases.add(t.schema)
        self.gone.pop(t.qualified, None)

    def _ddl_target(self, changes: Sequence[d.SchemaChange], schema: str) -> tuple[str, str]:
        for c in changes:
            if isinstance(c, d.RenameTable):
                return c.new_schema, c.new_table
            if isinstance(c, (d.CreateDatabase, d.DropDatabase)):
                return c.name, ""
            s, t = getattr(c, "schema", ""), getattr(c, "table", "")
            if s or t:
                return s or schema, t
        return schema, ""

    @staticmethod
    def _ddl_type(changes: Sequence[d.SchemaChange], query: str, given: int | None) -> int | None:
        if given is not None:
            return given
        real = [c for c in changes if not isinstance(c, d.NoOp)] or list(changes)
        if len(real) > 1 and query.lstrip().upper().startswith("ALTER"):
            return _MULTI_SCHEMA_CHANGE
        first = real[0]
        if isinstance(first, d.NoOp):
            if first.kind == "partition" and first.affects_data:
                return int(DDLType.TRUNCATE_TABLE_PARTITION)
            return _NOOP_DDL_TYPES.get(first.kind)
        code = _DDL_TYPES.get(type(first))
        return None if code is None else int(code)

    def _apply(self, change: d.SchemaChange, ts: int) -> None:
        """Apply one parsed change to the model, as TiDB would (raises ValueError where TiDB refuses)."""
        if isinstance(change, (d.NoOp, d.Unknown)):
            return
        if isinstance(change, d.CreateDatabase):
            self.databases.add(change.name)
            return
        if isinstance(change, d.DropDatabase):
            for t in [t for (s, _), t in self.tables.items() if s.lower() == change.name.lower()]:
                self._gone(t, "drop_database", ts)
            self.databases.discard(change.name)
            return
        if isinstance(change, d.CreateTable):
            self._create_table(change, ts)
            return
        if isinstance(change, d.RenameTable):
            t = self._require(change.schema, change.table, "RENAME TABLE")
            if self._find(change.new_schema, change.new_table) is not None:
                raise ValueError(f"RENAME TABLE: {change.new_schema}.{change.new_table} exists already")
            self._gone(t, "rename_table", ts)
            t.schema, t.table = change.new_schema, change.new_table
            self._add(t)
            return
        # every change left names a table (the base class declares no schema or table)
        t = self._require(getattr(change, "schema"), getattr(change, "table"), type(change).__name__)
        if isinstance(change, d.DropTable):
            self._gone(t, "drop_table", ts)
        elif isinstance(change, d.TruncateTable):
            t.rows.clear()
        elif isinstance(change, d.AddColumns):
            for cdef, pos in zip(change.columns, change.positions):
                self._add_column(t, cdef, pos, ts)
        elif isinstance(change, d.DropColumn):
            self._drop_column(t, change.name)
        elif isinstance(change, d.RenameColumn):
            self._rename_column(t, change.old, change.new)
        elif isinstance(change, d.ModifyColumn):
            self._modify_column(t, change, ts)
        elif isinstance(change, d.SetDefault):
            col = t.column(change.name)
            col.default = change.default
            _default_value(col, ts, f"ALTER COLUMN {col.name} SET DEFAULT")  # TiDB checks the default's type
        elif isinstance(change, d.DropDefault):
            t.column(change.name).default = None
        elif isinstance(change, d.AddPrimaryKey):
            if t.primary_key:
                raise ValueError(f"{t.qualified}: multiple primary key defined")
            names = tuple(t.column(c).name for c in change.columns)
            for n in names:
                col = t.column(n)
                if any(r[n] is None for r in t.rows):
                    raise ValueError(f"{t.qualified}: column {n!r} has NULLs and cannot be in the primary key")
                col.nullable = False  # MySQL: primary-key columns are NOT NULL
            self._check_new_key(t, names, "PRIMARY")
            t.primary_key = names
        elif isinstance(change, d.DropPrimaryKey):
            if not t.primary_key:
                raise ValueError(f"{t.qualified}: no primary key to drop")
            t.primary_key = ()
        elif isinstance(change, d.AddUniqueKey):
            names = tuple(t.column(c).name for c in change.columns)
            name = change.name or names[0]
            if name.lower() in (n.lower() for n in t.unique_keys):
                base, i = name, 2
                while f"{base}_{i}".lower() in (n.lower() for n in t.unique_keys):
                    i += 1
                name = f"{base}_{i}"  # MySQL names an unnamed key after its first column, then _2, _3...
            self._check_new_key(t, names, name)
            t.unique_keys[name] = names
        elif isinstance(change, d.DropIndex):
            for name in list(t.unique_keys):
                if name.lower() == change.name.lower():
                    del t.unique_keys[name]
        else:  # pragma: no cover - parse_ddl's change types are all handled above
            raise ValueError(f"the scenario model cannot apply {change!r}")

    def _create_table(self, change: d.CreateTable, ts: int) -> None:
        if self._find(change.schema, change.table) is not None:
            if change.if_not_exists:
                return
            raise ValueError(f"CREATE TABLE: table {change.schema}.{change.table} exists already")
        if change.like is not None:
            src = self._require(*change.like, what="CREATE TABLE ... LIKE")
            t = ModelTable(change.schema, change.table, copy.deepcopy(src.columns), src.primary_key,
                           dict(src.unique_keys))
        else:
            columns = [_model_column(c) for c in change.columns]
            names = [c.name.lower() for c in columns]
            if len(set(names)) != len(names):
                raise ValueError(f"CREATE TABLE {change.schema}.{change.table}: duplicate column name")
            t = ModelTable(change.schema, change.table, columns)
            t.primary_key = tuple(t.column(c).name for c in change.primary_key)
            for cols in change.unique_keys:
                names_ = tuple(t.column(c).name for c in cols)
                name = names_[0]
                i = 2
                while name in t.unique_keys:
                    name, i = f"{names_[0]}_{i}", i + 1
                t.unique_keys[name] = names_
            for col in columns:
                if col.default is not None:
                    _default_value(col, ts, f"CREATE TABLE {t.qualified}")  # TiDB checks the default's type
        self._add(t)

    def _add_column(self, t: ModelTable, cdef: d.ColumnDef, pos: d.ColumnPosition | None, ts: int) -> None:
        where = f"ALTER TABLE {t.qualified} ADD COLUMN {cdef.name}"
        if t.has_column(cdef.name):
            raise ValueError(f"{where}: duplicate column name")
        col = _model_column(cdef)
        has, value = _default_value(col, ts, where)
        if not has:
            value = _zero_value(col)  # NOT NULL without DEFAULT: existing rows read the type's zero value
        t.columns.insert(self._insert_at(t, pos, where), col)
        for row in t.rows:
            row[col.name] = value
        self._reorder_rows(t)

    @staticmethod
    def _insert_at(t: ModelTable, pos: d.ColumnPosition | None, where: str) -> int:
        if pos is None:
            return len(t.columns)
        if pos.first:
            return 0
        if pos.after is None:
            raise ValueError(f"{where}: bad column position")
        return t.position(pos.after) + 1

    @staticmethod
    def _reorder_rows(t: ModelTable) -> None:
        names = [c.name for c in t.columns]
        t.rows[:] = [{n: r[n] for n in names} for r in t.rows]

    def _drop_column(self, t: ModelTable, name: str) -> None:
        col = t.column(name)
        where = f"ALTER TABLE {t.qualified} DROP COLUMN {col.name}"
        if len(t.columns) == 1:
            raise ValueError(f"{where}: cannot drop the only column")
        low = col.name.lower()
        if low in (c.lower() for c in t.primary_key):
            raise ValueError(f"{where}: the column is in the primary key")
        for key, cols in list(t.unique_keys.items()):
            if low in (c.lower() for c in cols):
                if len(cols) > 1:
                    raise ValueError(f"{where}: the column is in the composite unique key {key!r}")
                del t.unique_keys[key]  # TiDB drops a single-column index along with its column
        t.columns.remove(col)
        for row in t.rows:
            del row[col.name]

    def _rename_column(self, t: ModelTable, old: str, new: str) -> None:
        col = t.column(old)
        if new.lower() != col.name.lower() and t.has_column(new):
            raise ValueError(f"{t.qualified}: RENAME COLUMN {old} TO {new}: duplicate column name")
        before = col.name
        col.name = new
        low = before.lower()
        t.primary_key = tuple(new if c.lower() == low else c for c in t.primary_key)
        t.unique_keys = {k: tuple(new if c.lower() == low else c for c in cols) for k, cols in t.unique_keys.items()}
        t.rows[:] = [{(new if k == before else k): v for k, v in r.items()} for r in t.rows]

    def _modify_column(self, t: ModelTable, change: d.ModifyColumn, ts: int) -> None:
        col = t.column(change.name)
        where = f"ALTER TABLE {t.qualified} MODIFY COLUMN {col.name}"
        cdef = change.column
        in_pk = col.name.lower() in (c.lower() for c in t.primary_key)
        new = ModelColumn(col.name, cdef.type, cdef.nullable and not in_pk, cdef.default, cdef.auto_increment,
                          cdef.generated, cdef.virtual)
        if new.default is not None:
            _default_value(new, ts, where)
        # TiDB re-reads every stored value in the new type (a DECIMAL shows the new scale; a column that
        # becomes text shows its old values as TiDB prints them)
        values = [_canonical(new, _as_text(col, row[col.name]) if _is_text(new) else _rounded(col, new, row[col.name]),
                             where)
                  for row in t.rows]
        i = t.position(col.name)
        t.columns[i] = new
        if change.position is not None:
            t.columns.pop(i)
            t.columns.insert(self._insert_at(t, change.position, where), new)
        for row, value in zip(t.rows, values):
            row[new.name] = value
        self._reorder_rows(t)

    @staticmethod
    def _check_new_key(t: ModelTable, names: tuple[str, ...], key: str) -> None:
        seen: set[tuple[Any, ...]] = set()
        for row in t.rows:
            values = tuple(row[n] for n in names)
            if any(v is None for v in values):
                continue
            if values in seen:
                raise ValueError(f"{t.qualified}: duplicate entry {values!r} for key {key!r}")
            seen.add(values)
