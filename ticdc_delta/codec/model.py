"""The one event model every protocol decodes into and encodes from.

TiCDC's own model (``RowChangedEvent``) carries the new columns and the previous columns of a row; the
operation follows from which side is present: only new columns is an insert, only old columns a delete,
both an update. A decoder yields three kinds of events: :class:`RowChange`, :class:`DDLEvent` and
:class:`ResolvedEvent`. Each carries where it came from (:class:`DecodeContext`).

Column values are plain Python values, the same for every protocol:

=====================================  =========================================================
TiCDC type                             Python value
=====================================  =========================================================
TINYINT..BIGINT, MEDIUMINT, YEAR       ``int`` (BIGINT UNSIGNED up to 18446744073709551615)
BIT                                    ``int`` (the bits as an unsigned number)
FLOAT, DOUBLE                          ``float``
DECIMAL                                ``str``, exactly as TiDB prints it (``"129012.1230000"``)
DATE, DATETIME, TIMESTAMP, TIME        ``str`` as TiDB prints it
JSON                                   ``str``
ENUM, SET                              ``int`` (index / bit mask) where the protocol sends numbers
                                       (Open Protocol, Craft, Canal-JSON); ``str`` label(s) where it
                                       sends labels (Avro)
CHAR/VARCHAR/TEXT (no binary flag)     ``str``
BINARY/VARBINARY/BLOB (binary flag)    ``bytes``
NULL                                   ``None``
=====================================  =========================================================

The classes are tuples (``NamedTuple``) on purpose: a decoder builds millions of them, and a tuple is the
cheapest object Python can build. They are immutable, picklable and compare by value.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag
from typing import Any, NamedTuple, Union

__all__ = [
    "ColumnFlag",
    "TypeCode",
    "DDLType",
    "Op",
    "DecodeContext",
    "Column",
    "RowChange",
    "DDLEvent",
    "ResolvedEvent",
    "Event",
    "column_flag",
    "is_binary_column",
    "INTEGER_TYPES",
    "TEXT_OR_BINARY_TYPES",
    "BLOB_TYPES",
]


class ColumnFlag(IntFlag):
    """TiCDC's column flags (Open Protocol ``f``, Craft flag chunk)."""

    NONE = 0
    BINARY = 0x01
    HANDLE_KEY = 0x02
    GENERATED = 0x04
    PRIMARY_KEY = 0x08
    UNIQUE_KEY = 0x10
    MULTIPLE_KEY = 0x20
    NULLABLE = 0x40
    UNSIGNED = 0x80


# Building an IntFlag member is slow (a class call and a cache lookup); decoders build one per column, so
# they take them from this table instead. Flags above 0xff are built on demand.
_FLAGS: tuple[ColumnFlag, ...] = tuple(ColumnFlag(i) for i in range(256))


def column_flag(value: int) -> ColumnFlag:
    """The :class:`ColumnFlag` for an integer, cheaply for the usual 0..255."""
    if 0 <= value < 256:
        return _FLAGS[value]
    return ColumnFlag(value)


class TypeCode(IntEnum):
    """TiCDC's column type codes (MySQL's ``mysql.TypeXxx``), as in the protocol documents."""

    TINYINT = 1
    SMALLINT = 2
    INT = 3
    FLOAT = 4
    DOUBLE = 5
    NULL = 6
    TIMESTAMP = 7
    BIGINT = 8
    MEDIUMINT = 9
    DATE = 10
    TIME = 11
    DATETIME = 12
    YEAR = 13
    NEWDATE = 14
    VARCHAR = 15
    BIT = 16
    JSON = 245
    DECIMAL = 246
    ENUM = 247
    SET = 248
    TINYBLOB = 249
    MEDIUMBLOB = 250
    LONGBLOB = 251
    BLOB = 252
    VAR_STRING = 253
    STRING = 254
    GEOMETRY = 255


INTEGER_TYPES = frozenset(
    {TypeCode.TINYINT, TypeCode.SMALLINT, TypeCode.INT, TypeCode.BIGINT, TypeCode.MEDIUMINT, TypeCode.YEAR}
)
"""Types whose values are integers (BIT, ENUM and SET are numbers on most wires but not integers)."""

BLOB_TYPES = frozenset({TypeCode.TINYBLOB, TypeCode.MEDIUMBLOB, TypeCode.LONGBLOB, TypeCode.BLOB})
"""TEXT and BLOB share these codes; the binary flag tells them apart."""

TEXT_OR_BINARY_TYPES = BLOB_TYPES | {TypeCode.VARCHAR, TypeCode.VAR_STRING, TypeCode.STRING}
"""Types whose value is text, or bytes when the column has the binary flag."""


class DDLType(IntEnum):
    """TiCDC's DDL type codes (Open Protocol ``t`` of a DDL value, Craft DDL body)."""

    CREATE_SCHEMA = 1
    DROP_SCHEMA = 2
    CREATE_TABLE = 3
    DROP_TABLE = 4
    ADD_COLUMN = 5
    DROP_COLUMN = 6
    ADD_INDEX = 7
    DROP_INDEX = 8
    ADD_FOREIGN_KEY = 9
    DROP_FOREIGN_KEY = 10
    TRUNCATE_TABLE = 11
    MODIFY_COLUMN = 12
    REBASE_AUTO_ID = 13
    RENAME_TABLE = 14
    SET_DEFAULT_VALUE = 15
    SHARD_ROW_ID = 16
    MODIFY_TABLE_COMMENT = 17
    RENAME_INDEX = 18
    ADD_TABLE_PARTITION = 19
    DROP_TABLE_PARTITION = 20
    CREATE_VIEW = 21
    MODIFY_TABLE_CHARSET_AND_COLLATE = 22
    TRUNCATE_TABLE_PARTITION = 23
    DROP_VIEW = 24
    RECOVER_TABLE = 25
    MODIFY_SCHEMA_CHARSET_AND_COLLATE = 26
    LOCK_TABLE = 27
    UNLOCK_TABLE = 28
    REPAIR_TABLE = 29
    SET_TIFLASH_REPLICA = 30
    UPDATE_TIFLASH_REPLICA_STATUS = 31
    ADD_PRIMARY_KEY = 32
    DROP_PRIMARY_KEY = 33
    CREATE_SEQUENCE = 34
    ALTER_SEQUENCE = 35
    DROP_SEQUENCE = 36


class Op:
    """Row operations, as plain strings (they appear in JSON output and Delta metadata columns)."""

    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"


class DecodeContext(NamedTuple):
    """Where a message came from (like confluent-kafka's ``SerializationContext``)."""

    topic: str | None = None
    partition: int | None = None
    offset: int | None = None


NO_CONTEXT = DecodeContext()


class Column(NamedTuple):
    """One column of a row image: name, TiCDC type code, flags and value."""

    name: str
    type: int
    flags: ColumnFlag
    value: Any

    @property
    def is_key(self) -> bool:
        """Part of the handle key (TiCDC's choice of primary or unique key)."""
        return bool(self.flags & (ColumnFlag.HANDLE_KEY | ColumnFlag.PRIMARY_KEY))


def is_binary_column(type_code: int, flags: int) -> bool:
    """Whether a column's value is bytes rather than text (BLOB/BINARY/VARBINARY, binary flag)."""
    return type_code in TEXT_OR_BINARY_TYPES and bool(flags & ColumnFlag.BINARY)


class RowChange(NamedTuple):
    """A row change: the row image after (``columns``) and before (``old``) the change.

    ``op`` is :attr:`Op.INSERT` (only ``columns``), :attr:`Op.DELETE` (only ``old``) or
    :attr:`Op.UPDATE` (``columns``, and ``old`` where the protocol carries the previous image).
    ``commit_ts`` is ``None`` where the protocol carries none (Canal-JSON without the TiDB extension,
    Avro without it or for a delete tombstone).
    """

    commit_ts: int | None
    schema: str
    table: str
    op: str
    columns: tuple[Column, ...] | None
    old: tuple[Column, ...] | None
    source: DecodeContext = NO_CONTEXT

    kind = "row"

    def new_values(self) -> dict[str, Any] | None:
        """The new image as ``{name: value}``, or ``None``."""
        return None if self.columns is None else {c.name: c.value for c in self.columns}

    def old_values(self) -> dict[str, Any] | None:
        """The old image as ``{name: value}``, or ``None``."""
        return None if self.old is None else {c.name: c.value for c in self.old}

    def key_columns(self) -> tuple[str, ...]:
        """Names of the handle-key columns, as flagged by the protocol (may be empty)."""
        image = self.columns if self.columns is not None else self.old
        return tuple(c.name for c in image or () if c.is_key)


class DDLEvent(NamedTuple):
    """A DDL statement run upstream. ``table`` is ``""`` when the DDL names none."""

    commit_ts: int | None
    schema: str
    table: str
    query: str
    ddl_type: int | None = None
    source: DecodeContext = NO_CONTEXT

    kind = "ddl"


class ResolvedEvent(NamedTuple):
    """A resolved ts (Canal-JSON: WATERMARK): every event of this partition older than it was sent."""

    commit_ts: int
    source: DecodeContext = NO_CONTEXT

    kind = "resolved"


Event = Union[RowChange, DDLEvent, ResolvedEvent]
