"""TiCDC's Canal-JSON protocol (``protocol=canal-json``): decoder and encoder.

Canal-JSON is Alibaba Canal's ``FlatMessage`` written as JSON; TiCDC writes one event per Kafka message,
with a null key::

    {"id": 0, "database": "test", "table": "tp_int", "pkNames": ["id"], "isDdl": false,
     "type": "INSERT", "es": 1639633141221, "ts": 1639633142960, "sql": "",
     "sqlType": {"id": 4, ...}, "mysqlType": {"id": "int", ...},
     "data": [{"id": "2", ...}], "old": null, "_tidb": {"commitTs": 429918007904436226}}

Rules this module follows (TiCDC docs "TiCDC Canal-JSON Protocol" and tiflow ``pkg/sink/codec/canal``):

- ``isDdl: true`` is a DDL (``sql`` holds the statement). Otherwise ``type: "TIDB_WATERMARK"`` is a
  watermark (``_tidb.watermarkTs``), and ``INSERT`` / ``UPDATE`` / ``DELETE`` are row changes.
- Every column value is a JSON string or ``null``. Its type comes from ``mysqlType``: TiCDC writes the
  bare type name (``"int unsigned"``, ``"varbinary"``), official Canal the full column type
  (``"decimal(10, 4)"``, ``"int(10) unsigned zerofill"``); parameters are ignored either way. ``sqlType``
  (the Java SQL type) says nothing ``mysqlType`` does not, and is not read.
- Integers (and BIT, ENUM, SET, which TiCDC writes as numbers) become ``int``, FLOAT/DOUBLE ``float``;
  binary columns (BINARY, VARBINARY, BLOBs) carry one character U+0000..U+00FF per byte (TiCDC decodes
  the bytes as ISO-8859-1), so ``value.encode("latin-1")`` gives the bytes back; everything else is text.
- ``data`` is an array: official Canal can put several rows of one statement in one message, ``old[i]``
  pairing with ``data[i]``. TiCDC's UPDATE ``old`` holds every column; official Canal's (and TiCDC's with
  ``only-output-updated-columns``) only the changed ones, so the old image is ``data[i]`` overlaid with
  ``old[i]``. A DELETE's row is in ``data``; before TiCDC v5.4 ``old`` repeated it, and it is ignored.
- Columns named in ``pkNames`` are the key (:attr:`ColumnFlag.HANDLE_KEY` | :attr:`ColumnFlag.PRIMARY_KEY`).
  Nothing else of TiCDC's column flags survives the wire except unsigned (``"... unsigned"``) and binary
  (the type name); nullability is unknown and left unset.

The TiDB extension (sink-uri ``enable-tidb-extension=true``) adds ``_tidb.commitTs`` to DML and DDL
messages and sends watermarks. With the option set, a DML or DDL message without ``_tidb.commitTs`` is an
error (the stream promised commit timestamps and downstream ordering relies on them). Without it, events
have ``commit_ts=None`` -- but a ``_tidb`` field that is present is still honoured (its ``commitTs`` is
used and watermarks are decoded): it is what the producer wrote, and dropping it would only lose
information.

Where TiCDC's own code settled a question: BIT, ENUM and SET values are TiCDC's ``uint64`` written with
``FormatUint`` (its consumer parses BIT/SET with ``ParseUint``, ENUM with ``ParseInt``; tiflow
``canal_json_message.go``); FLOAT/DOUBLE use ``strconv.FormatFloat(v, 'f', -1, ...)`` (no exponent); a
DDL's ``type`` is Canal's QUERY / CREATE / ALTER / ERASE / TRUNCATE / RENAME / CINDEX / DINDEX
(``convertDdlEventType``), which the decoder does not map back (``ddl_type=None``). An UPDATE whose
``old`` is null (TiCDC never writes one) decodes with ``old=None``. TiCDC's large-message modes are
handled: a claim-check message is read from ``claim-check-storage-uri`` (refused without it); a
handle-key-only INSERT/UPDATE holds only the key, and its row is read from the upstream TiDB when the
decoder has an :class:`~.upstream_lookup.UpstreamLookup` (``source.upstream``), refused otherwise (a
handle-key-only DELETE is complete enough and decodes to a key-only DELETE).
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Any, Callable, Literal, Mapping, Optional, Sequence

import orjson

try:  # the fast path for row messages; without msgspec every message takes the orjson path
    import msgspec
except ImportError:  # pragma: no cover - msgspec is a dependency
    msgspec = None  # type: ignore[assignment]

from ..errors import (
    ClaimCheckError,
    DecodeError,
    EncodeError,
    FramingError,
    HandleKeyOnlyError,
    TruncatedMessageError,
    UpstreamRowError,
    preview,
)
from .base import CompileGate, Message, parse_bool_option
from .claim_check import (
    RAW_VALUE_OPTION,
    STORAGE_OPTION,
    ClaimCheckStorage,
    claim_check_file_name,
    large_message_policy,
    pack_claim_check_message,
    unpack_claim_check_message,
)
from .compression import compress, compression_option, decompress
from .upstream_lookup import UpstreamLookup, complete_image
from .model import (
    BLOB_TYPES,
    TEXT_OR_BINARY_TYPES,
    Column,
    ColumnFlag,
    DDLEvent,
    DDLType,
    DecodeContext,
    Event,
    Image,
    ImageLayout,
    Op,
    ResolvedEvent,
    RowChange,
    TypeCode,
    column_flag,
)

__all__ = [
    "PROTOCOL",
    "CanalJsonDecoder",
    "CanalJsonEncoder",
    "parse_mysql_type",
    "mysql_type_name",
    "java_sql_type",
    "canal_event_type",
]

PROTOCOL = "canal-json"

_T = TypeCode
_F = ColumnFlag
_KEY_FLAGS = int(_F.HANDLE_KEY | _F.PRIMARY_KEY)
_U64_LIMIT = 1 << 64
_WATERMARK = "TIDB_WATERMARK"

# ---------------------------------------------------------------------------------------------------------
# mysqlType <-> type code
# ---------------------------------------------------------------------------------------------------------

# Bare MySQL type name -> (TiCDC type code, binary?). The names are TiDB's ``types.TypeStr`` (what TiCDC
# writes, with "text"->"blob" and "char"->"binary" for binary columns) plus the spellings official Canal
# takes from ``SHOW COLUMNS``.
_MYSQL_TYPES: dict[str, tuple[int, bool]] = {
    "tinyint": (_T.TINYINT, False),
    "bool": (_T.TINYINT, False),
    "boolean": (_T.TINYINT, False),
    "smallint": (_T.SMALLINT, False),
    "mediumint": (_T.MEDIUMINT, False),
    "int": (_T.INT, False),
    "integer": (_T.INT, False),
    "bigint": (_T.BIGINT, False),
    "float": (_T.FLOAT, False),
    "double": (_T.DOUBLE, False),
    "decimal": (_T.DECIMAL, False),
    "numeric": (_T.DECIMAL, False),
    "date": (_T.DATE, False),
    "datetime": (_T.DATETIME, False),
    "timestamp": (_T.TIMESTAMP, False),
    "time": (_T.TIME, False),
    "year": (_T.YEAR, False),
    "bit": (_T.BIT, False),
    "json": (_T.JSON, False),
    "vector": (_T.VECTOR_FLOAT32, False),  # TiDB 8.4+: "vector" or "vector(N)"; the value is "[1,2,3]"
    "enum": (_T.ENUM, False),
    "set": (_T.SET, False),
    "char": (_T.STRING, False),
    "varchar": (_T.VARCHAR, False),
    "var_string": (_T.VAR_STRING, False),
    "binary": (_T.STRING, True),
    "varbinary": (_T.VARCHAR, True),
    "tinytext": (_T.TINYBLOB, False),
    "text": (_T.BLOB, False),
    "mediumtext": (_T.MEDIUMBLOB, False),
    "longtext": (_T.LONGBLOB, False),
    "tinyblob": (_T.TINYBLOB, True),
    "blob": (_T.BLOB, True),
    "mediumblob": (_T.MEDIUMBLOB, True),
    "longblob": (_T.LONGBLOB, True),
}

# Words that may follow the type ("int(10) unsigned zerofill"); ZEROFILL implies UNSIGNED in MySQL.
_TYPE_ATTRIBUTES = {"unsigned": True, "zerofill": True, "signed": False}


def parse_mysql_type(text: str) -> tuple[int, ColumnFlag]:
    """The type code and flags (BINARY, UNSIGNED) a ``mysqlType`` entry describes.

    Accepts TiCDC's bare names (``"int unsigned"``, ``"varbinary"``) and official Canal's full column
    types (``"decimal(10, 4)"``, ``"enum('a','b')"``, ``"int(10) unsigned zerofill"``).

    Raises:
        ValueError: not a MySQL type this protocol carries.
    """
    t = text.strip().lower()
    open_paren = t.find("(")
    if open_paren >= 0:
        close_paren = t.rfind(")")
        if close_paren < open_paren:
            raise ValueError(f"unbalanced parentheses in MySQL type {text!r}")
        base = t[:open_paren].strip()
        attributes = t[close_paren + 1 :].split()
    else:
        words = t.split()
        if not words:
            raise ValueError("empty MySQL type")
        base, attributes = words[0], words[1:]
    known = _MYSQL_TYPES.get(base)
    if known is None:
        raise ValueError(f"unknown MySQL type {text!r}")
    tp, binary = known
    flags = int(_F.BINARY) if binary else 0
    for word in attributes:
        unsigned = _TYPE_ATTRIBUTES.get(word)
        if unsigned is None:
            raise ValueError(f"unknown attribute {word!r} in MySQL type {text!r}")
        if unsigned:
            flags |= int(_F.UNSIGNED)
    return tp, column_flag(flags)


# TiCDC's ``getMySQLType``: TiDB's ``types.TypeStr`` of the type code, "text"->"blob" / "char"->"binary"
# for binary columns, " unsigned" appended for unsigned columns except BIT and YEAR.
_TYPE_NAMES: dict[int, str] = {
    _T.TINYINT: "tinyint",
    _T.SMALLINT: "smallint",
    _T.INT: "int",
    _T.FLOAT: "float",
    _T.DOUBLE: "double",
    _T.TIMESTAMP: "timestamp",
    _T.BIGINT: "bigint",
    _T.MEDIUMINT: "mediumint",
    _T.DATE: "date",
    _T.TIME: "time",
    _T.DATETIME: "datetime",
    _T.YEAR: "year",
    _T.NEWDATE: "date",
    _T.VARCHAR: "varchar",
    _T.BIT: "bit",
    _T.JSON: "json",
    _T.VECTOR_FLOAT32: "vector",
    _T.DECIMAL: "decimal",
    _T.ENUM: "enum",
    _T.SET: "set",
    _T.TINYBLOB: "tinytext",
    _T.MEDIUMBLOB: "mediumtext",
    _T.LONGBLOB: "longtext",
    _T.BLOB: "text",
    _T.VAR_STRING: "var_string",
    _T.STRING: "char",
}
_BINARY_NAMES: dict[int, str] = {
    _T.TINYBLOB: "tinyblob",
    _T.MEDIUMBLOB: "mediumblob",
    _T.LONGBLOB: "longblob",
    _T.BLOB: "blob",
    _T.VARCHAR: "varbinary",
    _T.STRING: "binary",
}
_NO_UNSIGNED_SUFFIX = {_T.BIT, _T.YEAR}


def mysql_type_name(type_code: int, flags: int) -> str:
    """The ``mysqlType`` TiCDC writes for a column: ``"int unsigned"``, ``"varbinary"``, ``"text"``.

    Raises:
        EncodeError: a type Canal-JSON cannot carry (NULL, GEOMETRY, binary VAR_STRING, unknown code).
    """
    binary = bool(flags & _F.BINARY) and type_code in TEXT_OR_BINARY_TYPES
    if binary:
        name = _BINARY_NAMES.get(type_code)
        if name is None:
            # TiCDC would write "var_string" and lose the binary flag; a consumer could not tell.
            raise EncodeError(f"{PROTOCOL}: binary column of type code {type_code} has no mysqlType")
        return name
    name = _TYPE_NAMES.get(type_code)
    if name is None:
        raise EncodeError(f"{PROTOCOL}: type code {type_code} cannot be written as mysqlType")
    if flags & _F.UNSIGNED and type_code not in _NO_UNSIGNED_SUFFIX:
        return name + " unsigned"
    return name


# Java SQL type codes (java.sql.Types) as TiCDC's ``MySQLType2JavaType`` assigns them.
_JAVA_TYPES: dict[int, int] = {
    _T.TINYINT: -6,  # TINYINT
    _T.SMALLINT: 5,  # SMALLINT
    _T.INT: 4,  # INTEGER
    _T.MEDIUMINT: 4,  # INTEGER
    _T.BIGINT: -5,  # BIGINT
    _T.FLOAT: 7,  # REAL
    _T.DOUBLE: 8,  # DOUBLE
    _T.DECIMAL: 3,  # DECIMAL
    _T.TIMESTAMP: 93,  # TIMESTAMP
    _T.DATETIME: 93,
    _T.DATE: 91,  # DATE
    _T.NEWDATE: 91,
    _T.TIME: 92,  # TIME
    _T.YEAR: 12,  # VARCHAR
    _T.ENUM: 4,  # INTEGER
    _T.SET: -7,  # BIT
    _T.BIT: -7,  # BIT
    _T.JSON: 12,  # VARCHAR
    _T.VECTOR_FLOAT32: 12,  # VARCHAR: the text form
    _T.VARCHAR: 12,  # VARCHAR (BLOB when binary)
    _T.VAR_STRING: 12,
    _T.STRING: 1,  # CHAR (BLOB when binary)
}
_JAVA_BLOB, _JAVA_CLOB = 2004, 2005
# Unsigned integers too big for the signed Java type are promoted (Canal's LogEventConvert rule, the
# seed's table): TINYINT > 127 -> SMALLINT, SMALLINT > 32767 -> INTEGER, INT > 2^31-1 -> BIGINT,
# BIGINT > 2^63-1 -> DECIMAL. MEDIUMINT is INTEGER either way.
_UNSIGNED_PROMOTION: dict[int, tuple[int, int]] = {
    _T.TINYINT: (127, 5),
    _T.SMALLINT: (32767, 4),
    _T.INT: (2147483647, -5),
    _T.BIGINT: (9223372036854775807, 3),
}


def java_sql_type(type_code: int, flags: int, value: Any) -> int:
    """The ``sqlType`` TiCDC writes for a column holding ``value``."""
    if type_code in TEXT_OR_BINARY_TYPES:
        if flags & _F.BINARY:
            return _JAVA_BLOB
        if type_code in BLOB_TYPES:
            return _JAVA_CLOB
    java = _JAVA_TYPES.get(type_code, 12)
    if flags & _F.UNSIGNED and type(value) is int:
        promotion = _UNSIGNED_PROMOTION.get(type_code)
        if promotion is not None and value > promotion[0]:
            return promotion[1]
    return java


# TiCDC's ``convertDdlEventType`` (after Canal's DruidDdlParser): the Canal event type of a DDL.
_DDL_EVENT_TYPES: dict[int, str] = {
    DDLType.CREATE_TABLE: "CREATE",
    DDLType.RENAME_TABLE: "RENAME",
    DDLType.ADD_INDEX: "CINDEX",
    DDLType.ADD_FOREIGN_KEY: "CINDEX",
    DDLType.ADD_PRIMARY_KEY: "CINDEX",
    DDLType.DROP_INDEX: "DINDEX",
    DDLType.DROP_FOREIGN_KEY: "DINDEX",
    DDLType.DROP_PRIMARY_KEY: "DINDEX",
    DDLType.ADD_COLUMN: "ALTER",
    DDLType.DROP_COLUMN: "ALTER",
    DDLType.MODIFY_COLUMN: "ALTER",
    DDLType.REBASE_AUTO_ID: "ALTER",
    DDLType.SET_DEFAULT_VALUE: "ALTER",
    DDLType.MODIFY_TABLE_COMMENT: "ALTER",
    DDLType.RENAME_INDEX: "ALTER",
    DDLType.ADD_TABLE_PARTITION: "ALTER",
    DDLType.DROP_TABLE_PARTITION: "ALTER",
    DDLType.MODIFY_TABLE_CHARSET_AND_COLLATE: "ALTER",
    DDLType.TRUNCATE_TABLE_PARTITION: "ALTER",
    DDLType.DROP_TABLE: "ERASE",
    DDLType.TRUNCATE_TABLE: "TRUNCATE",
}


def canal_event_type(ddl_type: int | None) -> str:
    """The Canal ``type`` TiCDC writes for a DDL: CREATE, ALTER, ERASE, ... or QUERY for the rest."""
    if ddl_type is None:
        return "QUERY"
    return _DDL_EVENT_TYPES.get(ddl_type, "QUERY")


# ---------------------------------------------------------------------------------------------------------
# Decoder
# ---------------------------------------------------------------------------------------------------------

_str_encode = str.encode

# Converters of a non-null JSON value, by column kind. Each refuses what is not a JSON string (a number,
# boolean, array or object is not a Canal-JSON value). Text columns have none: the string is the value.


def _to_int(s: str) -> int:
    return int(s, 10)  # with a base, int() refuses non-strings (generated builders inline this call)


def _to_uint(s: str) -> int:
    v = int(s, 10)
    if v < 0:
        raise ValueError("negative")
    return v


def _to_float(s: str) -> float:
    if s.__class__ is not str:
        raise TypeError("not a string")
    return float(s)


def _to_bytes(s: str) -> bytes:
    # Each byte was written as the character U+0000..U+00FF (ISO-8859-1); anything above is not binary.
    return _str_encode(s, "latin-1")


def _converter(type_code: int, flags: int) -> Callable[[Any], Any] | None:
    if type_code in (_T.TINYINT, _T.SMALLINT, _T.MEDIUMINT, _T.INT, _T.BIGINT, _T.YEAR):
        return _to_int
    if type_code in (_T.BIT, _T.SET, _T.ENUM):
        return _to_uint  # TiCDC writes the bits, the ENUM index and the SET bit mask as numbers
    if type_code in (_T.FLOAT, _T.DOUBLE):
        return _to_float
    if flags & _F.BINARY and type_code in TEXT_OR_BINARY_TYPES:
        return _to_bytes
    return None


_KIND_NAMES: dict[Any, str] = {_to_int: "an integer", _to_uint: "an unsigned integer", _to_float: "a number"}

# One column: (name, type code, flags, converter or None for text).
_Spec = tuple[str, int, ColumnFlag, Callable[[Any], Any] | None]
_Builder = Callable[[dict[str, Any]], tuple[Any, ...]]

_new = tuple.__new__  # builds a NamedTuple without the Python-level __new__ (half the cost)
_LAYOUT_CACHE_LIMIT = 512
_MAX_ORDERS = 8  # column orders remembered per layout (TiCDC and Canal always write one)
_MAX_GENERATED_COLUMNS = 255  # wider rows use the generic loop


def _text_or_null(v: Any) -> str | None:
    """The value of a text column that is not a string: NULL, or an error (TypeError, see explain)."""
    if v is None:
        return None
    raise TypeError("not a string")


def _compile_builder(specs: Sequence[_Spec], *, checked: bool = True) -> _Builder:
    """A function turning a row whose keys are exactly ``specs``' names, in that order, into its values.

    Like ``collections.namedtuple``, it is generated source: the loop over the columns is unrolled, so
    a row costs no dict lookup, tuple indexing or call per text column. The source holds only generated
    identifiers (``v0``, ``k0``, ...); converters are passed in as objects, never as text. Unless
    ``checked``, the row's values are known to be strings or null (the msgspec fast path checked them),
    so text columns take them as they are and FLOAT/DOUBLE columns call ``float`` directly.
    """
    n = len(specs)
    lines = ["def make(K, str, int, float, text_or_null):"]
    lines.append("    " + "".join(f"k{i}, " for i in range(n)) + "= K")
    lines.append("    def build(row):")
    lines.append("        " + "".join(f"v{i}, " for i in range(n)) + "= row.values()")
    lines.append("        return (")
    for i, spec in enumerate(specs):
        if spec[3] is None:
            value = f"v{i} if v{i}.__class__ is str else text_or_null(v{i})" if checked else f"v{i}"
        elif spec[3] is _to_int:
            value = f"None if v{i} is None else int(v{i}, 10)"
        elif spec[3] is _to_float and not checked:
            value = f"None if v{i} is None else float(v{i})"
        else:
            value = f"None if v{i} is None else k{i}(v{i})"
        lines.append(f"            {value},")
    lines.append("        )")
    lines.append("    return build")
    namespace: dict[str, Any] = {}
    exec(compile("\n".join(lines), "<canal-json row builder>", "exec"), namespace)  # noqa: S102
    converters = tuple(spec[3] for spec in specs)
    return namespace["make"](converters, str, int, float, _text_or_null)  # type: ignore[no-any-return]


def _generic_builder(specs: Sequence[_Spec]) -> _Builder:
    """:func:`_compile_builder` as a plain loop (for very wide rows)."""
    converters = tuple(spec[3] for spec in specs)

    def build(row: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(
            [
                (v if v.__class__ is str else _text_or_null(v)) if k is None else (None if v is None else k(v))
                for k, v in zip(converters, row.values())
            ]
        )

    return build


# A column order's image layout, the builder of checked rows, the builder of trusted rows, and whether the
# order holds every column mysqlType declares.
_Entry = tuple[ImageLayout, _Builder, _Builder, bool]


class _Layout:
    """The columns of one (mysqlType, pkNames): specs by name, and by column order the image layout
    (names, types, flags, shared by every event) and the functions building a row's values."""

    __slots__ = ("specs", "_keys", "_builders", "_last_order", "_last_entry", "_compile_gate")

    def __init__(self, specs: dict[str, _Spec]) -> None:
        self.specs = specs
        self._keys = frozenset(name for name, spec in specs.items() if int(spec[2]) & _KEY_FLAGS)
        self._builders: dict[tuple[Any, ...], _Entry] = {}
        # the previous row's column order: comparing two tuples of the same strings beats hashing one
        self._last_order: tuple[Any, ...] | None = None
        self._last_entry: _Entry | None = None
        self._compile_gate = CompileGate(limit=_MAX_ORDERS)  # builders are written for an order met often enough

    def image(self, row: dict[str, Any], *, whole: bool = True) -> Image:
        """The Image of one row image, in the row's order (the hot path: no checks beyond what the
        lookups and converters raise -- KeyError, TypeError, ValueError, AttributeError; :meth:`explain`
        says what was wrong). ``whole``: the row must hold every column mysqlType declares (a new image:
        a column left out would be written as NULL); a deleted row needs only its key columns (TiCDC's
        ``delete-only-output-handle-key-columns``)."""
        order = tuple(row)
        entry = self._last_entry if order == self._last_order else self._entry(order)
        if whole and not entry[3]:  # type: ignore[index]
            raise ValueError("a declared column is missing")
        return Image(entry[0], entry[1](row))  # type: ignore[index]

    def trusted_image(self, row: dict[str, str | None], *, whole: bool = True) -> Image:
        """:meth:`image` of a row whose values are known to be strings or null."""
        order = tuple(row)
        entry = self._last_entry if order == self._last_order else self._entry(order)
        if whole and not entry[3]:  # type: ignore[index]
            raise ValueError("a declared column is missing")
        return Image(entry[0], entry[2](row))  # type: ignore[index]

    def _entry(self, order: tuple[Any, ...]) -> _Entry:
        """The layout and values builders for a column order (cached up to :data:`_MAX_ORDERS`).

        TiCDC and Canal write ``data``, ``mysqlType`` and ``sqlType`` from the same columns: an order
        without one of them is only good for a deleted row's image (the entry says whether it is whole).

        Raises:
            KeyError: a column without a mysqlType.
            ValueError: an empty row, or one without a key column (pkNames).
        """
        entry = self._builders.get(order)
        if entry is None:
            if not order:
                raise ValueError("empty row")
            specs = [self.specs[name] for name in order]
            if not self._keys.issubset(order):
                raise ValueError("a key column is missing")
            whole = len(order) == len(self.specs)
            names = tuple(s[0] for s in specs)
            layout = ImageLayout(names, [s[1] for s in specs], [s[2] for s in specs])
            if len(self._builders) >= _MAX_ORDERS or (
                    len(order) <= _MAX_GENERATED_COLUMNS and not self._compile_gate.due(order)):
                # more column orders than any real producer writes, or one met too seldom yet to write code
                # for: decode them without caching anything
                generic = _generic_builder(specs)
                return layout, generic, generic, whole
            if len(order) > _MAX_GENERATED_COLUMNS:
                entry = (layout, _generic_builder(specs), _generic_builder(specs), whole)
            else:
                entry = (layout, _compile_builder(specs), _compile_builder(specs, checked=False), whole)
            self._builders[order] = entry
        self._last_order, self._last_entry = order, entry
        return entry

    def explain(self, row: Any, where: str, *, whole: bool = True) -> str | None:
        """Why :meth:`image` fails on ``row`` (``where`` is e.g. ``data[0]``), or None if it does not."""
        if not isinstance(row, dict):
            return f"{where} must be an object, got {_type_name(row)}"
        if not row:
            return f"{where} has no columns"
        for name, v in row.items():
            spec = self.specs.get(name)
            if spec is None:
                return f"{where} column {preview(name)} has no mysqlType"
            if v is None:
                continue
            if not isinstance(v, str):
                return f"{where} column {preview(name)} must be a string or null, got {_type_name(v)}"
            conv = spec[3]
            if conv is None:
                continue
            try:
                conv(v)
            except (ValueError, TypeError):
                if conv is _to_bytes:
                    return f"{where} column {preview(name)} is binary but has a character above U+00FF"
                kind = _KIND_NAMES.get(conv, "a value")
                return f"{where} column {preview(name)} must be {kind}, got {preview(v)}"
        keys = [name for name in self.specs if name in self._keys and name not in row]
        if keys:
            return f"{where} lacks its key columns (pkNames): {preview(keys)}"
        missing = [name for name in self.specs if name not in row]
        if missing and whole:
            return f"{where} lacks columns mysqlType declares: {preview(missing)}"
        return None


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if value is True or value is False:
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


_DML_OPS = {"INSERT": Op.INSERT, "UPDATE": Op.UPDATE, "DELETE": Op.DELETE}
_INSERT, _UPDATE = Op.INSERT, Op.UPDATE

# ---------------------------------------------------------------------------------------------------------
# Fast path: a row message as TiCDC writes it, parsed by msgspec against its expected shape
# ---------------------------------------------------------------------------------------------------------
#
# msgspec checks the JSON types while it parses (every row value a string or null, the TiDB extension
# exactly {"commitTs": <int>}, every field one TiCDC writes) and hands mysqlType, pkNames and sqlType over
# as their raw bytes: the first two identify the cached layout without building a dict; sqlType (not
# read) is only checked to be JSON orjson accepts, once per distinct value. A message of any other shape
# (DDL, watermark, unknown fields, an official-Canal float, an error of any kind) fails that parse and
# takes the orjson path, which holds every rule and every error message; so does anything the fast path
# would have to judge. What the fast path accepts, the orjson path decodes to the same events: both
# parsers take duplicate keys' last value, both check UTF-8 and surrogate escapes in every string they
# build; the integers msgspec reads are bounded to 64 bits (orjson reads wider ones as floats, or refuses
# them), and raw mysqlType/pkNames/sqlType are parsed by orjson the first time they are met
# (tests/codec/test_canal_json.py compares the two paths on valid, unusual and mutated messages).

_RAW_CACHE_LIMIT = 512

if msgspec is not None:
    # the integers TiCDC and Canal write (id, es, ts, sqlType): signed 64-bit, which orjson reads too
    _Int64 = Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)]
    _Rows = list[dict[str, Optional[str]]]

    # gc=False: the instances hold only parsed JSON, never a reference cycle
    class _FastTidb(msgspec.Struct, forbid_unknown_fields=True, gc=False):
        """``_tidb`` of a TiCDC row message: the commit ts and nothing else (no claim check, no
        handle-key-only marker)."""

        commitTs: int

    class _FastRowMessage(msgspec.Struct, forbid_unknown_fields=True, gc=False):
        """A Canal-JSON row message of the usual shape (field names as on the wire)."""

        isDdl: bool
        type: Literal["INSERT", "UPDATE", "DELETE"]
        database: str
        table: str
        mysqlType: msgspec.Raw
        data: _Rows
        id: _Int64 = 0
        pkNames: msgspec.Raw = msgspec.Raw(b"null")
        es: _Int64 = 0
        ts: _Int64 = 0
        sql: str = ""
        sqlType: msgspec.Raw = msgspec.Raw(b"null")  # not read, but must be JSON orjson accepts
        old: Optional[_Rows] = None
        tidb: Optional[_FastTidb] = msgspec.field(default=None, name="_tidb")

    _fast_parse: Callable[[bytes], Any] | None = msgspec.json.Decoder(_FastRowMessage).decode
else:  # pragma: no cover
    _fast_parse = None


class CanalJsonDecoder:
    """Decodes TiCDC (and official Canal) Canal-JSON messages.

    Options (TiCDC sink-uri names): ``enable-tidb-extension`` (default false): the stream carries
    ``_tidb.commitTs`` on every DML/DDL message and TIDB_WATERMARK messages. See the module docstring
    for what a ``_tidb`` field means when the option is off.
    """

    protocol = PROTOCOL

    def __init__(self, options: Mapping[str, str] | None = None, *, upstream: UpstreamLookup | None = None) -> None:
        """A decoder for the sink-uri ``options`` the stream was written with; ``upstream`` completes
        handle-key-only rows (:mod:`.upstream_lookup`).

        Raises:
            ValueError: ``enable-tidb-extension`` is not a boolean word, or an unknown
                ``large-message-handle-compression``.
        """
        opts = dict(options or {})
        self._extension = parse_bool_option(opts, "enable-tidb-extension", False)
        self._compression = compression_option(opts)
        uri = opts.get(STORAGE_OPTION)
        self._claim_check = ClaimCheckStorage(uri) if uri else None
        self._claim_check_raw = parse_bool_option(opts, RAW_VALUE_OPTION, False)
        self._upstream = upstream
        self._clear_caches()

    def _clear_caches(self) -> None:
        self._layouts: dict[Any, _Layout] = {}
        # fast path: (raw mysqlType, raw pkNames) -> layout, and the previous message's; raw sqlTypes
        # that orjson accepts, and the previous message's
        self._raw_layouts: dict[tuple[bytes, bytes], _Layout] = {}
        self._raw_sql_types: set[bytes] = set()
        self._last_raw_sql_type: Any = None
        self._last_raw_types: Any = None
        self._last_raw_pk: Any = None
        self._last_raw_layout: _Layout | None = None
        # The layout of the previous message: consecutive messages are usually of one table, and
        # comparing two small dicts is cheaper than hashing one.
        self._last_types: Any = None
        self._last_pk: Any = None
        self._last_layout: _Layout | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Pickled to Spark executors: the caches hold generated functions, which do not pickle.
        return {"extension": self._extension, "compression": self._compression,
                "claim_check": self._claim_check, "claim_check_raw": self._claim_check_raw,
                "upstream": self._upstream}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._extension = bool(state["extension"])
        self._compression = str(state.get("compression", "none"))
        self._claim_check = state.get("claim_check")
        self._claim_check_raw = bool(state.get("claim_check_raw", False))
        self._upstream = state.get("upstream")
        self._clear_caches()

    # -- entry point --------------------------------------------------------------------------------------

    def decode(self, key: bytes | None, value: bytes | None, ctx: DecodeContext) -> list[Event]:
        """The events of one Canal-JSON message: one per row of ``data``, or one DDL / watermark.

        The key is not read (TiCDC writes none; any is accepted).

        Raises:
            FramingError: the value is missing, not JSON, or not a JSON object.
            TruncatedMessageError: the JSON ends early.
            DecodeError: a field is missing or of the wrong JSON type, a value does not parse as its
                column type, ``data`` and ``old`` disagree, an unknown ``type`` / ``mysqlType``, the
                TiDB extension is enabled and ``_tidb.commitTs`` is missing, or the message is a TiCDC
                claim-check / handle-key-only reference to a row it does not contain.
            CompressionError: ``large-message-handle-compression`` is set and the value does not
                decompress with it.
            ClaimCheckError: a claim-check reference without ``claim-check-storage-uri``, or whose object
                is missing or invalid.
            ClaimCheckUnavailableError: the claim-check storage kept failing (transient).
            UpstreamRowError: a handle-key-only row the upstream (``upstream``) has no row for at its
                commit ts.
            UpstreamUnavailableError: the upstream kept failing (transient).
        """
        if self._compression != "none" and value is not None:
            # TiCDC compresses the whole value of every Canal-JSON message
            try:
                value = decompress(self._compression, bytes(value), PROTOCOL)
            except DecodeError as exc:
                raise exc.with_context(*ctx) from None
        return self._decode_value(value, ctx, False)

    def _decode_value(self, value: bytes | None, ctx: DecodeContext, claimed: bool) -> list[Event]:
        """:meth:`decode` of a decompressed value (``claimed``: read from a claim-check object)."""
        if value.__class__ is bytes and _fast_parse is not None:
            try:
                events = self._fast_rows(_fast_parse(value), ctx)
            except Exception:  # noqa: BLE001 - not of the usual shape, or a value to refuse: the orjson path decides
                events = None
            if events is not None:
                return events
        if value is None:
            raise _error(ctx, "message value is null (Canal-JSON has no tombstones)", FramingError)
        try:
            msg = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            text = str(exc)
            cls = TruncatedMessageError if "unexpected end of data" in text else FramingError
            raise _error(ctx, f"value is not valid JSON: {text}", cls) from None
        if msg.__class__ is not dict:
            raise _error(ctx, f"value must be a JSON object, got {_type_name(msg)}", FramingError)

        tidb = msg.get("_tidb")
        if tidb.__class__ is dict and "claimCheckLocation" in tidb and self._claim_check is not None:
            # TiCDC's large-message claim check: the message is a reference to the stored full message
            if claimed:
                raise _error(ctx, "a claim-check object refers to another claim-check object", ClaimCheckError)
            return self._claimed(tidb["claimCheckLocation"], ctx)

        # TiCDC's consumer: isDdl true is a DDL; otherwise TIDB_WATERMARK is a watermark, else a DML.
        is_ddl = msg.get("isDdl")
        if is_ddl is False:
            kind = msg.get("type")
            op = _DML_OPS.get(kind) if kind.__class__ is str else None
            if op is not None:
                return self._rows(msg, op, ctx)
            if kind == _WATERMARK:
                return [self._watermark(msg, ctx)]
            if kind.__class__ is str:
                raise _error(ctx, f"field type must be INSERT, UPDATE, DELETE or {_WATERMARK}, got {preview(kind)}")
            raise _error(ctx, f"field type must be a string, got {_type_name(kind)}")
        if is_ddl is True:
            return [self._ddl(msg, ctx)]
        if tidb.__class__ is dict and "claimCheckLocation" in tidb:
            # TiCDC's large-message claim check: {"_tidb": {"claimCheckLocation": ...}} and nothing else.
            raise _error(ctx, _claim_check_reason(tidb), ClaimCheckError)
        raise _error(ctx, f"field isDdl must be a boolean, got {_type_name(is_ddl)}")

    def _claimed(self, location: Any, ctx: DecodeContext) -> list[Event]:
        """The rows of the message a claim-check reference stands for, read from the claim-check storage
        (the ClaimCheckMessage JSON, or with ``claim-check-raw-value`` the raw value; compressed as every
        value is).

        Raises:
            ClaimCheckError: the object is missing or is not a valid Canal-JSON row message.
            ClaimCheckUnavailableError: the storage kept failing.
        """
        assert self._claim_check is not None
        try:
            name = claim_check_file_name(location, PROTOCOL)
            data = self._claim_check.read(location, PROTOCOL)
            if not self._claim_check_raw:
                _, data = unpack_claim_check_message(data, PROTOCOL, name)
            if self._compression != "none":
                data = decompress(self._compression, data, PROTOCOL, f"claim-check object {name!r}")
            events = self._decode_value(data, ctx, True)
        except ClaimCheckError as exc:
            raise exc.with_context(*ctx) from None
        except DecodeError as exc:
            raise _error(ctx, f"claim-check object {name!r}: {exc.reason}", ClaimCheckError) from None
        if not events or not all(isinstance(e, RowChange) for e in events):
            raise _error(ctx, f"claim-check object {name!r} holds no row message", ClaimCheckError)
        return events

    # -- DDL / watermark / commit ts ----------------------------------------------------------------------

    def _ddl(self, msg: dict[str, Any], ctx: DecodeContext) -> DDLEvent:
        commit_ts = self._commit_ts(msg, ctx)
        schema = _string_field(msg, "database", ctx)
        table = msg.get("table")
        if table is None:
            table = ""
        elif table.__class__ is not str:
            raise _error(ctx, f"field table must be a string, got {_type_name(table)}")
        query = _string_field(msg, "sql", ctx)
        # Canal-JSON carries no DDL type code (only Canal's coarse QUERY/CREATE/ALTER/...).
        return DDLEvent(commit_ts, schema, table, query, None, ctx)

    def _watermark(self, msg: dict[str, Any], ctx: DecodeContext) -> ResolvedEvent:
        tidb = msg.get("_tidb")
        if tidb.__class__ is not dict:
            raise _error(ctx, f"{_WATERMARK} message needs the object _tidb, got {_type_name(tidb)}")
        ts = tidb.get("watermarkTs")
        if ts.__class__ is not int or not 0 <= ts < _U64_LIMIT:
            raise _error(ctx, f"field _tidb.watermarkTs must be an unsigned 64-bit integer, got {preview(ts)}")
        return ResolvedEvent(ts, ctx)

    def _commit_ts(self, msg: dict[str, Any], ctx: DecodeContext) -> int | None:
        tidb = msg.get("_tidb")
        if tidb is None:
            if self._extension:
                raise _error(ctx, "enable-tidb-extension is true but the message has no _tidb.commitTs")
            return None
        if tidb.__class__ is not dict:
            raise _error(ctx, f"field _tidb must be an object, got {_type_name(tidb)}")
        if "claimCheckLocation" in tidb:
            raise _error(ctx, _claim_check_reason(tidb), ClaimCheckError)
        ts = tidb.get("commitTs")
        if ts.__class__ is int and 0 <= ts < _U64_LIMIT:
            return ts  # type: ignore[no-any-return]
        if ts is None and not self._extension:
            return None
        raise _error(ctx, f"field _tidb.commitTs must be an unsigned 64-bit integer, got {preview(ts)}")

    # -- rows ---------------------------------------------------------------------------------------------

    def _layout(self, types: Any, pk: Any, ctx: DecodeContext) -> _Layout:
        """The column specs of a message's ``mysqlType`` and ``pkNames`` (cached)."""
        if types.__class__ is not dict:
            raise _error(ctx, f"field mysqlType must be an object, got {_type_name(types)}")
        if pk is not None and (pk.__class__ is not list or any(p.__class__ is not str for p in pk)):
            raise _error(ctx, "field pkNames must be null or an array of strings")
        for name, text in types.items():
            if text.__class__ is not str:
                raise _error(ctx, f"mysqlType of column {preview(name)} must be a string, got {_type_name(text)}")
        # Go writes mysqlType from a map: its order changes from message to message, so the key is a set.
        cache_key = (frozenset(types.items()), frozenset(pk) if pk else None)
        layout = self._layouts.get(cache_key)
        if layout is None:
            layout = _build_layout(types, pk or (), ctx)
            if len(self._layouts) >= _LAYOUT_CACHE_LIMIT:
                self._layouts.clear()
            self._layouts[cache_key] = layout
        self._last_types, self._last_pk, self._last_layout = types, pk, layout
        return layout

    def _fast_rows(self, msg: Any, ctx: DecodeContext) -> list[Event] | None:
        """The events of a row message msgspec parsed (``_FastRowMessage``), or None when the orjson
        path must decide (see the comment above ``_FastRowMessage``). Mirrors :meth:`_rows`.

        Raises:
            KeyError, TypeError, ValueError, AttributeError: a row the orjson path must judge.
        """
        if msg.isDdl:
            return None
        tidb = msg.tidb
        if tidb is None:
            if self._extension:
                return None  # the orjson path raises: the extension promises a commit ts
            commit_ts = None
        else:
            commit_ts = tidb.commitTs
            if not 0 <= commit_ts < _U64_LIMIT:
                return None
        raw_types, raw_pk = msg.mysqlType, msg.pkNames
        if raw_types == self._last_raw_types and raw_pk == self._last_raw_pk:
            layout = self._last_raw_layout
        else:
            layout = self._raw_layout(raw_types, raw_pk, ctx)
        data = msg.data
        if layout is None or not data:
            return None
        if msg.sqlType != self._last_raw_sql_type and not self._raw_sql_type_ok(msg.sqlType):
            return None
        op = _DML_OPS[msg.type]
        schema, table = msg.database, msg.table
        if len(data) == 1 and op != _UPDATE:  # TiCDC's case: one row per message; trusted_image inlined
            row = data[0]
            order = tuple(row)
            entry = layout._last_entry if order == layout._last_order else layout._entry(order)
            image = Image(entry[0], entry[2](row))  # type: ignore[index]
            if op == _INSERT:
                if not entry[3]:  # type: ignore[index]
                    return None  # a declared column is missing: the orjson path says which
                return [_new(RowChange, (commit_ts, schema, table, op, image, None, ctx))]
            return [_new(RowChange, (commit_ts, schema, table, op, None, image, ctx))]
        image_of = layout.trusted_image
        if op == _INSERT:
            return [_new(RowChange, (commit_ts, schema, table, op, image_of(row), None, ctx)) for row in data]
        if op == Op.DELETE:
            return [_new(RowChange, (commit_ts, schema, table, op, None, image_of(row, whole=False), ctx))
                    for row in data]
        old = msg.old
        if old is None:
            return [_new(RowChange, (commit_ts, schema, table, op, image_of(row), None, ctx)) for row in data]
        if len(old) != len(data):
            return None
        out: list[Event] = []
        for row, before in zip(data, old):
            merged = row | before
            if len(merged) != len(row):
                return None
            out.append(_new(RowChange, (commit_ts, schema, table, op, image_of(row), image_of(merged), ctx)))
        return out

    def _raw_sql_type_ok(self, raw: Any) -> bool:
        """Whether a raw sqlType is JSON orjson accepts (msgspec only skipped over it)."""
        data = bytes(raw)
        if data not in self._raw_sql_types:
            try:
                orjson.loads(data)
            except orjson.JSONDecodeError:
                return False
            if len(self._raw_sql_types) >= _RAW_CACHE_LIMIT:
                self._raw_sql_types.clear()
            self._raw_sql_types.add(data)
        self._last_raw_sql_type = raw
        return True

    def _raw_layout(self, raw_types: Any, raw_pk: Any, ctx: DecodeContext) -> _Layout | None:
        """The layout of a raw mysqlType and pkNames (cached by their bytes), or None when they do not
        make one (the orjson path then says why)."""
        key = (bytes(raw_types), bytes(raw_pk))
        layout = self._raw_layouts.get(key)
        if layout is None:
            try:
                layout = self._layout(orjson.loads(key[0]), orjson.loads(key[1]), ctx)
            except (ValueError, DecodeError):  # orjson.JSONDecodeError is a ValueError
                return None
            if len(self._raw_layouts) >= _RAW_CACHE_LIMIT:
                self._raw_layouts.clear()
            self._raw_layouts[key] = layout
        self._last_raw_types, self._last_raw_pk, self._last_raw_layout = raw_types, raw_pk, layout
        return layout

    def _rows(self, msg: dict[str, Any], op: str, ctx: DecodeContext) -> list[Event]:
        """One RowChange per element of ``data`` (the hot path of the decoder)."""
        tidb = msg.get("_tidb")
        if tidb.__class__ is dict and len(tidb) == 1 and (ts := tidb.get("commitTs")).__class__ is int:
            commit_ts = ts if 0 <= ts < _U64_LIMIT else self._commit_ts(msg, ctx)  # the common TiCDC case
        else:
            commit_ts = self._commit_ts(msg, ctx)
            if tidb is not None and tidb.get("onlyHandleKey") is True and op != Op.DELETE:
                # TiCDC's large-message "handle-key-only" mode: the consumer must re-read the row upstream.
                if self._upstream is not None:
                    plain = {**msg, "_tidb": {k: v for k, v in tidb.items() if k != "onlyHandleKey"}}
                    return [_upstream_row_of(self._upstream, e, ctx) for e in self._rows(plain, op, ctx)]
                raise _error(
                    ctx,
                    f"{op} message carries only the handle key (_tidb.onlyHandleKey, large-message-handle-option="
                    "handle-key-only): the rest of the row exists only in the upstream TiDB; set source.upstream "
                    "to its DSN (mysql://user@tidb-host:4000/) so that the job reads the row there, or change "
                    "the changefeed to large-message-handle-option=claim-check (or raise max-message-bytes)",
                    HandleKeyOnlyError,
                )
        schema = msg.get("database")
        table = msg.get("table")
        if schema.__class__ is not str or table.__class__ is not str:
            _string_field(msg, "database", ctx)
            _string_field(msg, "table", ctx)
        types = msg.get("mysqlType")
        pk = msg.get("pkNames")
        layout = self._last_layout
        if layout is None or types != self._last_types or pk != self._last_pk:
            layout = self._layout(types, pk, ctx)
        data = msg.get("data")
        if data.__class__ is not list or not data:
            raise _error(ctx, f"field data must be a non-empty array of rows, got {_type_name(data)}")
        old = msg.get("old") if op == Op.UPDATE else None
        if old is not None and (old.__class__ is not list or len(old) != len(data)):
            raise _error(
                ctx,
                f"field old must be null or an array as long as data ({len(data)} rows), "
                f"got {_type_name(old)}" + (f" of {len(old)}" if isinstance(old, list) else ""),
            )
        image = layout.image
        try:
            if op == Op.INSERT:
                return [_new(RowChange, (commit_ts, schema, table, op, image(row), None, ctx)) for row in data]
            if op == Op.DELETE:
                # The deleted row is in data; old is null (or, before v5.4, the same row again: ignored).
                return [_new(RowChange, (commit_ts, schema, table, op, None, image(row, whole=False), ctx))
                        for row in data]
            if old is None:
                # No previous image (not written by TiCDC, which always sends old with an UPDATE).
                return [_new(RowChange, (commit_ts, schema, table, op, image(row), None, ctx)) for row in data]
            out: list[Event] = []
            for row, before in zip(data, old):
                # old may hold only the changed columns (official Canal, only-output-updated-columns):
                # the old image is the new one overlaid with them, in the column order of data.
                merged = row | before
                if len(merged) != len(row):
                    raise KeyError("old")
                out.append(_new(RowChange, (commit_ts, schema, table, op, image(row), image(merged), ctx)))
            return out
        except (KeyError, TypeError, ValueError, AttributeError):
            raise _error(ctx, _explain_rows(layout, data, old, whole=op != Op.DELETE)) from None


def _upstream_row_of(upstream: UpstreamLookup, event: Any, ctx: DecodeContext) -> Any:
    """A handle-key-only INSERT/UPDATE with its new image read from the upstream as of its commit ts (the
    old image keeps the message's handle key: what a MERGE by key needs).

    Raises:
        UpstreamRowError: no commit ts (the TiDB extension is off), or the upstream has no such row at
            that snapshot (or refused the query).
        UpstreamUnavailableError: the upstream stayed unreachable.
    """
    where = f"handle-key-only row of {event.schema}.{event.table}"
    if event.commit_ts is None:
        raise _error(ctx, f"{where} has no commit ts (_tidb.commitTs) to read the upstream at", UpstreamRowError)
    key = [(c[0], c[3]) for c in event.columns]
    try:
        found = upstream.fetch(event.schema, event.table, key, event.commit_ts, PROTOCOL)
    except DecodeError as exc:
        raise exc.with_context(*ctx) from None
    try:
        image = complete_image(event.columns, found, PROTOCOL)
    except ValueError as exc:
        raise _error(ctx, f"{where}: {exc}", UpstreamRowError) from None
    return event._replace(columns=image)


def _error(ctx: DecodeContext, reason: str, cls: type[DecodeError] = DecodeError) -> DecodeError:
    return cls(PROTOCOL, reason, ctx.topic, ctx.partition, ctx.offset)


def _claim_check_reason(tidb: dict[str, Any]) -> str:
    location = tidb.get("claimCheckLocation")
    return (
        f"claim-check message (large-message-handle-option=claim-check): the row is stored at "
        f"{preview(location)}; set the source option claim-check-storage-uri to the changefeed's so that "
        "the job reads it from there"
    )


def _string_field(msg: dict[str, Any], field: str, ctx: DecodeContext) -> str:
    v = msg.get(field)
    if v.__class__ is not str:
        raise _error(ctx, f"field {field} must be a string, got {_type_name(v)}")
    return v  # type: ignore[no-any-return]


def _build_layout(types: dict[str, str], pk: list[str] | tuple[()], ctx: DecodeContext) -> _Layout:
    keys = set(pk)
    missing = keys.difference(types)
    if missing:
        raise _error(ctx, f"pkNames names columns without a mysqlType: {preview(sorted(missing))}")
    specs: dict[str, _Spec] = {}
    for name, text in types.items():
        try:
            tp, flags = parse_mysql_type(text)
        except ValueError as exc:
            raise _error(ctx, f"mysqlType of column {preview(name)}: {preview(str(exc))}") from None
        if name in keys:
            flags = column_flag(int(flags) | _KEY_FLAGS)
        specs[name] = (name, int(tp), flags, _converter(tp, flags))
    return _Layout(specs)


def _explain_rows(layout: _Layout, data: list[Any], old: list[Any] | None, *, whole: bool = True) -> str:
    """What is wrong with the rows that :meth:`_Layout.image` refused (``whole``: as new images)."""
    for i, row in enumerate(data):
        reason = layout.explain(row, f"data[{i}]", whole=whole)
        if reason:
            return reason
        if old is not None:
            before = old[i]
            if not isinstance(before, dict):
                return f"old[{i}] must be an object, got {_type_name(before)}"
            extra = [name for name in before if name not in row]
            if extra:
                return f"old[{i}] has columns that data[{i}] lacks: {extra}"
            reason = layout.explain(row | before, f"old[{i}]")  # the old image (an empty old is fine)
            if reason:
                return reason
    return "invalid row data"  # pragma: no cover - image() and explain() disagree


# ---------------------------------------------------------------------------------------------------------
# Encoder
# ---------------------------------------------------------------------------------------------------------

# Go's JSON string escaping as TiCDC's writers (easyjson's jwriter, encoding/json) apply it: '"' and '\'
# escaped, \t \n \r short, other control characters \u00XX (lower-case hex), and the HTML characters
# < > & as \u003c \u003e \u0026, U+2028/U+2029 as \u2028/\u2029. Everything else is literal UTF-8, so a
# binary value's bytes 0x80..0xff appear as the characters U+0080..U+00FF.
_ESCAPES: dict[str, str] = {chr(i): f"\\u{i:04x}" for i in range(0x20)}
_ESCAPES.update(
    {
        "\t": "\\t",
        "\n": "\\n",
        "\r": "\\r",
        '"': '\\"',
        "\\": "\\\\",
        "<": "\\u003c",
        ">": "\\u003e",
        "&": "\\u0026",
        "\u2028": "\\u2028",
        "\u2029": "\\u2029",
    }
)
_NEEDS_ESCAPE = re.compile('[\x00-\x1f"\\\\<>&\u2028\u2029]')


def _escape_match(m: re.Match[str]) -> str:
    return _ESCAPES[m.group()]


def _quote(s: str) -> str:
    """``s`` as a JSON string literal, escaped the way TiCDC's Go writers do."""
    if _NEEDS_ESCAPE.search(s) is None:
        return '"' + s + '"'
    return '"' + _NEEDS_ESCAPE.sub(_escape_match, s) + '"'


def _go_float(x: float) -> str:
    """Go's ``strconv.FormatFloat(x, 'f', -1, 64)``: shortest digits that round-trip, never an exponent."""
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "+Inf" if x > 0 else "-Inf"
    r = repr(float(x))
    if "e" in r:
        r = format(Decimal(r), "f")
    if r.endswith(".0"):
        r = r[:-2]
    return r


_INT_CODES = frozenset({_T.TINYINT, _T.SMALLINT, _T.MEDIUMINT, _T.INT, _T.BIGINT, _T.YEAR})
_UINT_CODES = frozenset({_T.BIT, _T.SET, _T.ENUM})


def _wire_value(col: Column) -> str | None:
    """The string TiCDC writes for a column value (before JSON quoting), None for NULL.

    Raises:
        EncodeError: the value's Python type does not fit the column type.
    """
    v = col.value
    if v is None:
        return None
    tp = col.type
    if tp in _INT_CODES:
        if type(v) is int:
            return str(v)
    elif tp in _UINT_CODES:
        # TiCDC writes the BIT value, ENUM index and SET bit mask as an unsigned number.
        if type(v) is int and v >= 0:
            return str(v)
    elif tp == _T.FLOAT or tp == _T.DOUBLE:
        if type(v) is float or type(v) is int:
            return _go_float(v)
    elif col.flags & _F.BINARY and tp in TEXT_OR_BINARY_TYPES:
        if isinstance(v, (bytes, bytearray, memoryview)):
            # Canal's rule: every byte becomes the ISO-8859-1 character of the same number.
            return bytes(v).decode("latin-1")
    elif isinstance(v, str):
        return v
    raise EncodeError(
        f"{PROTOCOL}: column {col.name!r} of type code {tp} cannot hold a {type(v).__name__} value"
    )


def _text(value: Any, what: str) -> str:
    """``value`` quoted as a JSON string.

    Raises:
        EncodeError: ``value`` is not a str.
    """
    if not isinstance(value, str):
        raise EncodeError(f"{PROTOCOL}: {what} must be a str, got {type(value).__name__}")
    return _quote(value)


def _object(pairs: Sequence[tuple[str, str]]) -> str:
    return "{" + ",".join(_quote(k) + ":" + v for k, v in pairs) + "}"


class CanalJsonEncoder:
    """Writes events as TiCDC's Canal-JSON sink does: one event per message, null key.

    Options (TiCDC sink-uri names): ``enable-tidb-extension`` (default false) adds ``_tidb.commitTs``
    and makes resolved events into TIDB_WATERMARK messages; ``only-output-updated-columns`` (default
    false) writes only the changed columns in an UPDATE's ``old``; ``large-message-handle-compression``
    (lz4 | snappy) compresses every message value; ``large-message-handle-option`` (handle-key-only |
    claim-check, with ``max-message-bytes``, ``claim-check-storage-uri`` and ``claim-check-raw-value``)
    handles rows above the size limit as TiCDC does.

    ``es`` and ``ts`` are both the commit ts's physical time (``commit_ts >> 18``, milliseconds), so the
    output is deterministic (TiCDC writes the wall clock into ``ts``). Fields come in the order of the
    TiCDC document's examples (``data`` before ``old``; TiCDC's own DML writer puts ``old`` first, which
    no JSON reader can tell apart). Without ``_tidb`` a row's ``es``/``ts`` is 0 when it has no commit ts.
    """

    protocol = PROTOCOL

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        """An encoder writing as a changefeed with these sink-uri ``options`` would.

        Raises:
            ValueError: an option is not a boolean word.
        """
        opts = dict(options or {})
        self._extension = parse_bool_option(opts, "enable-tidb-extension", False)
        self._only_updated = parse_bool_option(opts, "only-output-updated-columns", False)
        self._compression = compression_option(opts)
        self._large = large_message_policy(opts)
        if self._large.mode != "none" and not self._extension:
            raise ValueError("large-message-handle-option needs enable-tidb-extension=true (as TiCDC requires)")

    def encode(self, events: Sequence[Event]) -> list[Message]:
        """One message per event, in order.

        Raises:
            EncodeError: a resolved event without the TiDB extension, a row without the image its
                operation needs, a value that does not fit its column type, a type Canal-JSON cannot
                carry, a commit ts outside 0..2^64-1.
        """
        if self._large.mode != "none":
            return [Message(None, self._value_or_reference(e)) for e in events]
        if self._compression != "none":
            return [Message(None, compress(self._compression, self._encode_one(e))) for e in events]
        return [Message(None, self._encode_one(e)) for e in events]

    def _value_or_reference(self, event: Event) -> bytes:
        """The (compressed) value of ``event``; a row above ``max-message-bytes`` as TiCDC's large-message
        handling writes it: the handle-key columns with ``_tidb.onlyHandleKey``, or (claim-check) the
        whole value stored and ``_tidb.claimCheckLocation`` added."""
        value = compress(self._compression, self._encode_one(event))
        if not isinstance(event, RowChange) or not self._large.too_large(len(value)):
            return value
        keys_only = event._replace(
            columns=None if event.columns is None else tuple(c for c in event.columns if c.is_key),
            old=None if event.old is None else tuple(c for c in event.old if c.is_key),
        )
        small = self._encode_one(keys_only)
        if self._large.mode == "claim-check":
            stored = value if self._large.raw_value else pack_claim_check_message(None, value)
            location = self._large.store(event.schema, event.table, event.commit_ts, stored)
            extra = b',"claimCheckLocation":' + orjson.dumps(location)
        else:
            extra = b',"onlyHandleKey":true'
        # the message ends with its _tidb object: {..."_tidb":{"commitTs":N}}
        return compress(self._compression, small[:-2] + extra + b"}}")

    def _ts(self, ts: Any, what: str) -> int:
        if type(ts) is not int or not 0 <= ts < _U64_LIMIT:
            raise EncodeError(f"{PROTOCOL}: {what} must be an unsigned 64-bit integer, got {preview(ts)}")
        return ts

    def _tail(self, commit_ts: int | None) -> tuple[str, str]:
        """(es/ts value, _tidb suffix) for an event's commit ts."""
        if commit_ts is None:
            if self._extension:
                raise EncodeError(f"{PROTOCOL}: enable-tidb-extension needs a commit ts on every event")
            return "0", ""
        ts = self._ts(commit_ts, "commit ts")
        suffix = f',"_tidb":{{"commitTs":{ts}}}' if self._extension else ""
        return str(ts >> 18), suffix

    def _encode_one(self, event: Event) -> bytes:
        if isinstance(event, RowChange):
            text = self._row(event)
        elif isinstance(event, DDLEvent):
            text = self._ddl(event)
        elif isinstance(event, ResolvedEvent):
            text = self._watermark(event)
        else:
            raise EncodeError(f"{PROTOCOL}: not an event: {type(event).__name__}")
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate in some text
            raise EncodeError(f"{PROTOCOL}: text is not valid Unicode: {exc}") from None

    def _watermark(self, event: ResolvedEvent) -> str:
        if not self._extension:
            # TiCDC sends no watermark without the extension (there is no field to carry it).
            raise EncodeError(f"{PROTOCOL}: resolved events need enable-tidb-extension=true")
        ts = self._ts(event.commit_ts, "resolved ts")
        es = ts >> 18
        return (
            '{"id":0,"database":"","table":"","pkNames":null,"isDdl":false,"type":"TIDB_WATERMARK",'
            f'"es":{es},"ts":{es},"sql":"","sqlType":null,"mysqlType":null,"data":null,"old":null,'
            f'"_tidb":{{"watermarkTs":{ts}}}}}'
        )

    def _ddl(self, event: DDLEvent) -> str:
        es, tidb = self._tail(event.commit_ts)
        schema = _text(event.schema, "schema")
        table = _text(event.table or "", "table")
        query = _text(event.query, "query")
        return (
            f'{{"id":0,"database":{schema},"table":{table},"pkNames":null,'
            f'"isDdl":true,"type":"{canal_event_type(event.ddl_type)}","es":{es},"ts":{es},'
            f'"sql":{query},"sqlType":null,"mysqlType":null,"data":null,"old":null{tidb}}}'
        )

    def _row(self, event: RowChange) -> str:
        op = event.op
        if op == Op.INSERT or op == Op.UPDATE:
            image, kind = event.columns, ("INSERT" if op == Op.INSERT else "UPDATE")
        elif op == Op.DELETE:
            image, kind = event.old, "DELETE"
        else:
            raise EncodeError(f"{PROTOCOL}: unknown row operation {op!r}")
        if not image:
            raise EncodeError(f"{PROTOCOL}: {op} event without the row image it needs")
        es, tidb = self._tail(event.commit_ts)

        values: dict[str, str | None] = {}
        types: list[tuple[str, str]] = []
        java: list[tuple[str, str]] = []
        pk: list[str] = []
        for col in image:
            _text(col.name, "column name")
            if col.name in values:
                raise EncodeError(f"{PROTOCOL}: column {col.name!r} appears twice")
            types.append((col.name, _quote(mysql_type_name(col.type, col.flags))))
            values[col.name] = _wire_value(col)
            java.append((col.name, str(java_sql_type(col.type, col.flags, col.value))))
            if col.flags & _F.PRIMARY_KEY:
                pk.append(col.name)
        data = "[" + _object([(n, "null" if v is None else _quote(v)) for n, v in values.items()]) + "]"

        old = "null"
        if op == Op.UPDATE and event.old is not None:
            type_of = dict(types)
            pairs: list[tuple[str, str]] = []
            seen: set[str] = set()
            for col in event.old:
                if col.name in seen:
                    raise EncodeError(f"{PROTOCOL}: old column {col.name!r} appears twice")
                seen.add(col.name)
                if type_of.get(col.name) != _quote(mysql_type_name(col.type, col.flags)):
                    raise EncodeError(
                        f"{PROTOCOL}: old column {col.name!r} is not a column of the new image with the same type"
                    )
                v = _wire_value(col)
                if self._only_updated and v == values[col.name]:
                    continue  # TiCDC's only-output-updated-columns: unchanged columns are left out
                pairs.append((col.name, "null" if v is None else _quote(v)))
            old = "[" + _object(pairs) + "]"

        pk_names = "[" + ",".join(_quote(n) for n in pk) + "]" if pk else "null"
        return (
            f'{{"id":0,"database":{_text(event.schema, "schema")},"table":{_text(event.table, "table")},'
            f'"pkNames":{pk_names},'
            f'"isDdl":false,"type":"{kind}","es":{es},"ts":{es},"sql":"",'
            f'"sqlType":{_object(java)},"mysqlType":{_object(types)},"data":{data},"old":{old}{tidb}}}'
        )
