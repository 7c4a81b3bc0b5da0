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
VECTOR (TiDB 8.4+, type code 225)      ``str``, the text form TiCDC sends (``"[1,2.5,-3]"``); see
                                       :func:`parse_vector` / :func:`format_vector`
ENUM, SET                              ``int`` (index / bit mask) where the protocol sends numbers
                                       (Open Protocol, Craft, Canal-JSON); ``str`` label(s) where it
                                       sends labels (Avro)
CHAR/VARCHAR/TEXT (no binary flag)     ``str``
BINARY/VARBINARY/BLOB (binary flag)    ``bytes``
NULL                                   ``None``
=====================================  =========================================================

The classes are tuples (``NamedTuple``) on purpose: a decoder builds millions of them, and a tuple is the
cheapest object Python can build. They are immutable, picklable and compare by value.

A row image (``RowChange.columns`` / ``RowChange.old``) is a sequence of :class:`Column`. Encoders, tests
and the simulator build it as a plain ``tuple`` of Columns; the decoders build an :class:`Image` instead:
one shared :class:`ImageLayout` per table (names, type codes, flags) and one tuple of values per event, the
Columns made only when someone iterates. An Image compares equal to the tuple of its Columns and hashes
the same, so the two are interchangeable. Code that only needs names and values should call
:func:`image_parts` (O(1) for an Image) rather than iterate Columns.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag
from functools import partial
from typing import Any, Iterator, Literal, NamedTuple, Sequence, Union, overload

__all__ = [
    "ColumnFlag",
    "TypeCode",
    "DDLType",
    "Op",
    "DecodeContext",
    "Column",
    "ImageLayout",
    "Image",
    "ColumnImage",
    "image_parts",
    "image_as_dict",
    "RowChange",
    "DDLEvent",
    "ResolvedEvent",
    "FailedEntry",
    "Event",
    "column_flag",
    "is_binary_column",
    "parse_vector",
    "format_vector",
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
    VECTOR_FLOAT32 = 225  # TiDB v8.4+ VECTOR / VECTOR(N) (mysql.TypeTiDBVectorFloat32)


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


def parse_vector(text: str) -> list[float]:
    """The float32 elements of a VECTOR value in TiDB's text form (``"[1,2.5,-3]"``; ``"[]"`` is empty).

    Raises:
        ValueError: not a bracketed list of finite numbers.
    """
    body = text.strip()
    if len(body) < 2 or body[0] != "[" or body[-1] != "]":
        raise ValueError("a VECTOR value must be a bracketed list such as [1,2.5,-3]")
    inner = body[1:-1].strip()
    if not inner:
        return []
    out = []
    for item in inner.split(","):
        x = float(item)  # ValueError for anything that is not a number
        if x != x or x in (float("inf"), float("-inf")):
            raise ValueError(f"a VECTOR element must be finite, got {item.strip()[:40]!r}")
        out.append(x)
    return out


def _go_float32(x: float) -> str:
    """Go's ``strconv.FormatFloat(float64(float32(x)), 'f', -1, 32)``: the shortest digits that read
    back as the same float32, positional (``2.5``, ``0.0000001``, ``1234567``, ``-0``)."""
    import numpy

    return str(numpy.format_float_positional(numpy.float32(x), unique=True, trim="-"))


def format_vector(values: Sequence[float]) -> str:
    """TiDB's text form of a VECTOR (``types.VectorFloat32.String()``): ``[e1,e2,...]``, each element
    the shortest positional text of its float32 value (``[1,2.5,-3]``)."""
    return "[" + ",".join(_go_float32(float(v)) for v in values) + "]"


_KEY_MASK = int(ColumnFlag.HANDLE_KEY | ColumnFlag.PRIMARY_KEY)
_column_of = partial(tuple.__new__, Column)  # Column from a 4-tuple without the Python-level __new__


class ImageLayout:
    """The shape of a row image: column names, type codes and flags, shared by every image of a table.

    Decoders build one per table (and column order) and reuse it for every event; it is immutable and
    compares, hashes and pickles by value. ``types`` are plain ``int``; ``flags`` are :class:`ColumnFlag`
    (what :attr:`Column.flags` holds) and ``int_flags`` the same as ``int`` (cheaper to pickle).

    Raises:
        ValueError: ``names``, ``types`` and ``flags`` differ in length.
    """

    __slots__ = ("names", "types", "flags", "int_flags", "_key_names", "_hash")

    names: tuple[str, ...]
    types: tuple[int, ...]
    flags: tuple[ColumnFlag, ...]
    int_flags: tuple[int, ...]
    _key_names: tuple[str, ...]
    _hash: int

    def __init__(self, names: Sequence[str], types: Sequence[int], flags: Sequence[int]) -> None:
        names, types, int_flags = tuple(names), tuple(map(int, types)), tuple(map(int, flags))
        if not len(names) == len(types) == len(int_flags):
            raise ValueError(
                f"layout of {len(names)} names, {len(types)} type codes and {len(int_flags)} flags"
            )
        set_ = object.__setattr__
        set_(self, "names", names)
        set_(self, "types", types)
        set_(self, "int_flags", int_flags)
        set_(self, "flags", tuple(map(column_flag, int_flags)))
        set_(self, "_key_names", tuple(n for n, f in zip(names, int_flags) if f & _KEY_MASK))
        set_(self, "_hash", hash((names, types, int_flags)))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"ImageLayout is immutable (cannot set {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"ImageLayout is immutable (cannot delete {name!r})")

    def __len__(self) -> int:
        return len(self.names)

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, ImageLayout):  # (a final class: no subclass to tell apart)
            return NotImplemented
        return (
            self._hash == other._hash
            and self.names == other.names
            and self.types == other.types
            and self.int_flags == other.int_flags
        )

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[Any, ...]:
        return (ImageLayout, (self.names, self.types, self.int_flags))

    def __repr__(self) -> str:
        return f"ImageLayout({self.names!r}, {self.types!r}, {self.int_flags!r})"

    @property
    def key_names(self) -> tuple[str, ...]:
        """Names of the handle-key columns (:attr:`Column.is_key`), in order."""
        return self._key_names


class Image(Sequence[Column]):
    """A row image as a layout shared by many events and this event's values: a lazy sequence of Columns.

    ``Image(layout, values)`` behaves as the tuple ``tuple(Column(n, t, f, v) ...)`` does (length,
    iteration, indexing -- a slice gives a tuple --, ``==`` with that tuple or another Image, ``hash``,
    ordering, pickling), but costs one object instead of one per column; the Columns are built when
    someone iterates or indexes. :attr:`names`, :attr:`types`, :attr:`flags`, :attr:`values` and
    :meth:`as_dict` read the parts directly. ``values`` must be a tuple as long as the layout.

    Raises:
        ValueError: ``values`` is not as long as the layout.
    """

    __slots__ = ("_layout", "_values")

    def __init__(self, layout: ImageLayout, values: tuple[Any, ...]) -> None:
        # the decoders' hot path: one object per row image, so no more than a length check
        if len(values) != len(layout.names):
            raise ValueError(f"{len(values)} values for a layout of {len(layout.names)} columns")
        self._layout = layout
        self._values = values

    @classmethod
    def from_columns(cls, columns: Sequence[Column]) -> Image:
        """The Image of a sequence of Columns (or ``(name, type, flags, value)`` tuples)."""
        names, types, flags, values = image_parts(columns)
        return cls(ImageLayout(names, types, flags), tuple(values))

    # -- parts ------------------------------------------------------------------------------------------

    @property
    def layout(self) -> ImageLayout:
        """The shared names, type codes and flags."""
        return self._layout

    @property
    def values(self) -> tuple[Any, ...]:
        """The column values, in column order."""
        return self._values

    @property
    def names(self) -> tuple[str, ...]:
        """The column names, in column order."""
        return self._layout.names

    @property
    def types(self) -> tuple[int, ...]:
        """The column type codes, in column order."""
        return self._layout.types

    @property
    def flags(self) -> tuple[ColumnFlag, ...]:
        """The column flags, in column order."""
        return self._layout.flags

    def as_dict(self) -> dict[str, Any]:
        """The image as ``{name: value}``."""
        return dict(zip(self._layout.names, self._values))

    # -- the sequence of Columns --------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[Column]:
        layout = self._layout
        return map(_column_of, zip(layout.names, layout.types, layout.flags, self._values))

    @overload
    def __getitem__(self, index: int) -> Column: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Column, ...]: ...

    def __getitem__(self, index: int | slice) -> Column | tuple[Column, ...]:
        if isinstance(index, slice):
            return tuple(self)[index]
        layout = self._layout
        return _column_of((layout.names[index], layout.types[index], layout.flags[index], self._values[index]))

    def __contains__(self, item: object) -> bool:
        return any(c == item for c in self)

    def __reversed__(self) -> Iterator[Column]:
        return reversed(tuple(self))

    def index(self, value: Any, start: int = 0, stop: int | None = None) -> int:
        """The position of the first Column equal to ``value`` (as ``tuple.index``).

        Raises:
            ValueError: no such Column.
        """
        return tuple(self).index(value, start, len(self) if stop is None else stop)

    def count(self, value: Any) -> int:
        """How many Columns equal ``value``."""
        return tuple(self).count(value)

    # -- value semantics of the tuple of Columns ----------------------------------------------------------

    def _same_layout(self, other: Image) -> bool:
        return self._layout is other._layout or self._layout == other._layout

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Image):
            if self._same_layout(other):
                return self._values == other._values
            return len(self._values) == len(other._values) and tuple(self) == tuple(other)
        if isinstance(other, tuple):
            return len(self._values) == len(other) and tuple(self) == other
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash(tuple(self))  # the hash of the equal tuple of Columns

    def _as_tuple(self, other: object) -> tuple[Any, ...] | None:
        if isinstance(other, Image):
            return tuple(other)
        if isinstance(other, tuple):
            return other
        return None

    def __lt__(self, other: object) -> bool:
        o = self._as_tuple(other)
        return NotImplemented if o is None else tuple(self) < o

    def __le__(self, other: object) -> bool:
        o = self._as_tuple(other)
        return NotImplemented if o is None else tuple(self) <= o

    def __gt__(self, other: object) -> bool:
        o = self._as_tuple(other)
        return NotImplemented if o is None else tuple(self) > o

    def __ge__(self, other: object) -> bool:
        o = self._as_tuple(other)
        return NotImplemented if o is None else tuple(self) >= o

    def __add__(self, other: object) -> tuple[Any, ...]:
        o = self._as_tuple(other)
        return NotImplemented if o is None else tuple(self) + o

    def __radd__(self, other: object) -> tuple[Any, ...]:
        o = self._as_tuple(other)
        return NotImplemented if o is None else o + tuple(self)

    def __mul__(self, n: int) -> tuple[Column, ...]:
        return tuple(self) * n

    __rmul__ = __mul__

    def __reduce__(self) -> tuple[Any, ...]:
        return (Image, (self._layout, self._values))

    def __repr__(self) -> str:
        return f"Image({tuple(self)!r})"


ColumnImage = Union[Image, tuple[Column, ...]]
"""A row image: an :class:`Image` (decoders) or a plain tuple of :class:`Column` (encoders, tests)."""


def image_parts(
    columns: Sequence[Column],
) -> tuple[tuple[str, ...], tuple[int, ...], tuple[Any, ...], tuple[Any, ...]]:
    """``(names, types, flags, values)`` of a row image: O(1) for an :class:`Image`, one pass otherwise.

    Flags are as the image holds them (:class:`ColumnFlag` for an Image; whatever a tuple's Columns
    carry).
    """
    if columns.__class__ is Image:
        layout = columns.layout  # type: ignore[attr-defined]
        return layout.names, layout.types, layout.flags, columns.values  # type: ignore[attr-defined]
    if not columns:
        return (), (), (), ()
    names, types, flags, values = zip(*columns)
    return names, types, flags, values


def image_as_dict(columns: Sequence[Column] | None) -> dict[str, Any] | None:
    """A row image as ``{name: value}`` (``None`` for no image)."""
    if columns is None:
        return None
    if columns.__class__ is Image:
        return columns.as_dict()  # type: ignore[attr-defined]
    return {c[0]: c[3] for c in columns}


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
    columns: ColumnImage | None
    old: ColumnImage | None
    source: DecodeContext = NO_CONTEXT

    @property
    def kind(self) -> Literal["row"]:
        """``"row"`` (a class attribute: see below the class)."""
        return "row"

    def new_values(self) -> dict[str, Any] | None:
        """The new image as ``{name: value}``, or ``None``."""
        return image_as_dict(self.columns)

    def old_values(self) -> dict[str, Any] | None:
        """The old image as ``{name: value}``, or ``None``."""
        return image_as_dict(self.old)

    def key_columns(self) -> tuple[str, ...]:
        """Names of the handle-key columns, as flagged by the protocol (may be empty)."""
        image = self.columns if self.columns is not None else self.old
        if image.__class__ is Image:
            return image.layout.key_names  # type: ignore[union-attr]
        return tuple(c.name for c in image or () if c.is_key)


RowChange.kind = "row"  # type: ignore[assignment]  # faster than the property mypy reads


class DDLEvent(NamedTuple):
    """A DDL statement run upstream. ``table`` is ``""`` when the DDL names none."""

    commit_ts: int | None
    schema: str
    table: str
    query: str
    ddl_type: int | None = None
    source: DecodeContext = NO_CONTEXT

    @property
    def kind(self) -> Literal["ddl"]:
        """``"ddl"`` (a class attribute: see below the class)."""
        return "ddl"


DDLEvent.kind = "ddl"  # type: ignore[assignment]  # faster than the property mypy reads


class ResolvedEvent(NamedTuple):
    """A resolved ts (Canal-JSON: WATERMARK): every event of this partition older than it was sent."""

    commit_ts: int
    source: DecodeContext = NO_CONTEXT

    @property
    def kind(self) -> Literal["resolved"]:
        """``"resolved"`` (a class attribute: see below the class)."""
        return "resolved"


ResolvedEvent.kind = "resolved"  # type: ignore[assignment]  # faster than the property mypy reads


class FailedEntry(NamedTuple):
    """An entry of a batched message (Open Protocol packs up to ``max-batch-size`` rows of any tables into
    one) that cannot become a row while the message's other entries can: a large-message reference whose
    row is not in Kafka (handle-key-only without an upstream, a row the upstream no longer has, a
    claim-check object that cannot be read). It goes to the dead-letter table by itself; the others apply.
    ``error`` says why, naming the entry and the message."""

    commit_ts: int | None
    error: str
    source: DecodeContext = NO_CONTEXT

    @property
    def kind(self) -> Literal["failed"]:
        """``"failed"`` (a class attribute: see below the class)."""
        return "failed"


FailedEntry.kind = "failed"  # type: ignore[assignment]  # faster than the property mypy reads


Event = Union[RowChange, DDLEvent, ResolvedEvent, FailedEntry]
