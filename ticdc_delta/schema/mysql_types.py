"""MySQL/TiDB column types, parsed with sqlglot into one :class:`ColumnType`.

A column type reaches ticdc-delta in two shapes: inside a DDL statement (``ADD COLUMN c DECIMAL(10,4)``,
parsed by :mod:`ticdc_delta.schema.ddl`) and as a bare text (Canal-JSON's ``mysqlType``:
``"bigint(20) unsigned"``, ``"enum('a','b,c')"``). Both go through sqlglot's MySQL grammar and end as the
same :class:`ColumnType`: TiCDC's type code (:class:`~ticdc_delta.codec.model.TypeCode`), the UNSIGNED and
BINARY flags, and the type's parameters (length, precision/scale, fractional seconds, ENUM/SET members,
charset and collation).

The type codes and flags follow what TiDB stores in its column info, which is what TiCDC puts on the wire:

* CHAR is ``STRING`` (254), VARCHAR is ``VARCHAR`` (15); BINARY and VARBINARY are the same codes with the
  BINARY flag; TEXT and BLOB share the four blob codes and differ only by the BINARY flag.
* A string type whose charset is ``binary`` gets the BINARY flag, any other charset clears it (TiDB
  ``ddl.setCharsetCollationFlenDecimal`` / ``checkColumnAttributes``). ``CHAR(3) BINARY`` is *not* a binary
  string: the ``BINARY`` attribute only asks for the charset's ``_bin`` collation.
* BIT is always UNSIGNED; YEAR and ZEROFILL columns are UNSIGNED too (TiDB adds the zerofill flag to YEAR
  and the unsigned flag to every zerofill column).
* ``TEXT(n)``/``BLOB(n)`` become the smallest blob type that holds ``n`` characters of the column's
  charset (TiDB ``adjustBlobTypesFlen``); without a charset TiDB's default ``utf8mb4`` is assumed.
* ``FLOAT(p)`` with ``p`` > 24 is a DOUBLE (MySQL "Floating-Point Types").
* DECIMAL without precision is ``DECIMAL(10,0)``, DECIMAL(p) is ``DECIMAL(p,0)``.

sqlglot's MySQL dialect gets a few TiDB/MySQL spellings wrong or not at all; :class:`TiDBDialect` fixes
them (see its docstring). Nothing here uses regular expressions over SQL.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Sequence

from sqlglot import exp
from sqlglot.dialects.mysql import MySQL
from sqlglot.errors import SqlglotError
from sqlglot.tokens import TokenType

from ticdc_delta.codec.model import ColumnFlag, TypeCode

__all__ = [
    "ColumnType",
    "TiDBDialect",
    "RenameTables",
    "UnsupportedColumnTypeError",
    "parse_column_type",
    "column_type_from_sqlglot",
    "quote_string",
]


class UnsupportedColumnTypeError(ValueError):
    """A column type that TiCDC's type codes cannot express, or a text that is not a column type.

    A ``ValueError`` so callers can treat it as bad input; :mod:`ticdc_delta.schema.ddl` turns it into an
    ``Unknown`` change instead of raising.
    """


class RenameTables(exp.Expression):
    """``RENAME TABLE a TO b [, c TO d ...]``: ``expressions`` holds one ``exp.Tuple(old, new)`` per pair."""

    arg_types = {"expressions": True}


class TiDBDialect(MySQL):
    """sqlglot's MySQL dialect, corrected where TiDB DDL needs it.

    sqlglot 30 limitations worked around here (each checked against MySQL 8.0's and TiDB's grammar):

    * ``INT8`` parsed as TINYINT (it is BIGINT); ``INT3``/``MIDDLEINT`` (MEDIUMINT) not parsed at all.
    * ``REAL`` parsed as FLOAT (it is DOUBLE unless the REAL_AS_FLOAT sql mode is on, which TiDB lacks).
    * ``LONG``, ``LONG VARCHAR`` (MEDIUMTEXT) and ``LONG VARBINARY`` (MEDIUMBLOB) parsed as BIGINT or not at
      all; ``NATIONAL CHAR/VARCHAR`` not parsed.
    * ``RENAME TABLE`` fell back to an opaque ``Command``: parsed here into :class:`RenameTables`.
    * ``FLOAT UNSIGNED`` was a parse error (sqlglot has no unsigned FLOAT): read as FLOAT.
    * ``PRIMARY KEY (a DESC)`` was a parse error: key parts may carry ASC/DESC, as in other indexes.
    * TiDB index options ``GLOBAL``/``LOCAL`` and ``CLUSTERED``/``NONCLUSTERED`` written without the
      ``/*T![...] */`` comment were parse errors; they are accepted and dropped (they do not change which
      columns a key has).
    """

    class Tokenizer(MySQL.Tokenizer):
        KEYWORDS = {
            **MySQL.Tokenizer.KEYWORDS,
            "INT8": TokenType.BIGINT,
            "INT3": TokenType.MEDIUMINT,
            "MIDDLEINT": TokenType.MEDIUMINT,
            "REAL": TokenType.DOUBLE,
            "LONG": TokenType.MEDIUMTEXT,
            "LONG VARCHAR": TokenType.MEDIUMTEXT,
            "LONG VARBINARY": TokenType.MEDIUMBLOB,
            "NATIONAL CHAR": TokenType.NCHAR,
            "NATIONAL CHARACTER": TokenType.NCHAR,
            "NATIONAL VARCHAR": TokenType.NVARCHAR,
        }
        # RENAME is a statement this dialect parses (see Parser._parse_rename_tables), not an opaque command.
        COMMANDS = MySQL.Tokenizer.COMMANDS - {TokenType.RENAME}

    class Parser(MySQL.Parser):  # type: ignore[misc,valid-type]  # (sqlglot builds its dialects' classes)
        STATEMENT_PARSERS = {
            **MySQL.Parser.STATEMENT_PARSERS,
            TokenType.RENAME: lambda self: self._parse_rename_tables(),
        }
        CONSTRAINT_PARSERS = {
            **MySQL.Parser.CONSTRAINT_PARSERS,
            # TiDB: `id BIGINT AUTO_RANDOM[(shard_bits[, range_bits])]`, a server-side value generator.
            "AUTO_RANDOM": lambda self: self._parse_auto_random(),
        }
        # FLOAT UNSIGNED (MySQL's deprecated attribute, which TiDB keeps): sqlglot has no unsigned FLOAT and
        # refused the whole statement; read as FLOAT (the same float32 values; DOUBLE UNSIGNED it knows)
        SIGNED_TO_UNSIGNED_TYPE_TOKEN = {
            **MySQL.Parser.SIGNED_TO_UNSIGNED_TYPE_TOKEN,
            TokenType.FLOAT: TokenType.FLOAT,
        }

        def _warn_unsupported(self) -> None:
            # A statement sqlglot cannot parse becomes a Command; ticdc_delta.schema.ddl classifies those
            # itself and records why in the change it returns, so sqlglot's log warning would only be noise.
            return None

        def _parse_auto_random(self) -> exp.Expr:
            if self._match(TokenType.L_PAREN, advance=False):
                self._parse_wrapped_csv(self._parse_number)
            return exp.var("AUTO_RANDOM")

        def _parse_rename_tables(self) -> exp.Expr:
            start = self._prev
            if not self._match(TokenType.TABLE):
                return self._parse_as_command(start)
            pairs = self._parse_csv(self._parse_rename_pair)
            return self.expression(RenameTables(expressions=pairs))

        def _parse_rename_pair(self) -> exp.Expr:
            old = self._parse_table_parts()
            if not self._match_text_seq("TO"):
                self.raise_error("Expected TO in RENAME TABLE")
            new = self._parse_table_parts()
            return exp.Tuple(expressions=[old, new])

        def _parse_primary_key_part(self) -> exp.Expr | None:
            ordered = self._parse_ordered(super()._parse_primary_key_part)
            return ordered.this if ordered and ordered.args.get("desc") is None else ordered

        def _parse_index_constraint_options(self) -> list[exp.IndexConstraintOption]:
            options: list[exp.IndexConstraintOption] = []
            while True:
                options.extend(super()._parse_index_constraint_options())
                # TiDB: global/local indexes of partitioned tables, clustered/nonclustered primary keys.
                if not self._match_texts(("GLOBAL", "LOCAL", "CLUSTERED", "NONCLUSTERED")):
                    return options


# Bytes per character of the charsets TiDB supports (TiDB ``charset.CharacterSetInfos``).
_CHARSET_MAXLEN = {"utf8mb4": 4, "utf8": 3, "utf8mb3": 3, "latin1": 1, "ascii": 1, "binary": 1, "gbk": 2, "gb18030": 4}
_DEFAULT_CHARSET = "utf8mb4"  # TiDB's default character set

_BLOB_SIZES = ((255, TypeCode.TINYBLOB), (65535, TypeCode.BLOB), (16777215, TypeCode.MEDIUMBLOB))

_D = exp.DataType.Type

# sqlglot type -> (TiCDC type code, unsigned, binary string, MySQL type name)
_TYPES: dict[Any, tuple[TypeCode, bool, bool, str]] = {  # (keys: exp.DataType.Type members)
    _D.TINYINT: (TypeCode.TINYINT, False, False, "tinyint"),
    _D.UTINYINT: (TypeCode.TINYINT, True, False, "tinyint"),
    _D.BOOLEAN: (TypeCode.TINYINT, False, False, "tinyint"),
    _D.SMALLINT: (TypeCode.SMALLINT, False, False, "smallint"),
    _D.USMALLINT: (TypeCode.SMALLINT, True, False, "smallint"),
    _D.MEDIUMINT: (TypeCode.MEDIUMINT, False, False, "mediumint"),
    _D.UMEDIUMINT: (TypeCode.MEDIUMINT, True, False, "mediumint"),
    _D.INT: (TypeCode.INT, False, False, "int"),
    _D.UINT: (TypeCode.INT, True, False, "int"),
    _D.BIGINT: (TypeCode.BIGINT, False, False, "bigint"),
    _D.UBIGINT: (TypeCode.BIGINT, True, False, "bigint"),
    _D.SERIAL: (TypeCode.BIGINT, True, False, "bigint"),  # SERIAL = BIGINT UNSIGNED NOT NULL AUTO_INCREMENT UNIQUE
    _D.FLOAT: (TypeCode.FLOAT, False, False, "float"),
    _D.DOUBLE: (TypeCode.DOUBLE, False, False, "double"),
    _D.UDOUBLE: (TypeCode.DOUBLE, True, False, "double"),
    _D.DECIMAL: (TypeCode.DECIMAL, False, False, "decimal"),
    _D.UDECIMAL: (TypeCode.DECIMAL, True, False, "decimal"),
    _D.DATE: (TypeCode.DATE, False, False, "date"),
    _D.DATETIME: (TypeCode.DATETIME, False, False, "datetime"),
    _D.TIMESTAMP: (TypeCode.TIMESTAMP, False, False, "timestamp"),
    _D.TIMESTAMPTZ: (TypeCode.TIMESTAMP, False, False, "timestamp"),  # sqlglot's MySQL TIMESTAMP
    _D.TIME: (TypeCode.TIME, False, False, "time"),
    _D.YEAR: (TypeCode.YEAR, True, False, "year"),
    _D.CHAR: (TypeCode.STRING, False, False, "char"),
    _D.NCHAR: (TypeCode.STRING, False, False, "char"),
    _D.VARCHAR: (TypeCode.VARCHAR, False, False, "varchar"),
    _D.NVARCHAR: (TypeCode.VARCHAR, False, False, "varchar"),
    _D.BINARY: (TypeCode.STRING, False, True, "binary"),
    _D.VARBINARY: (TypeCode.VARCHAR, False, True, "varbinary"),
    _D.TINYTEXT: (TypeCode.TINYBLOB, False, False, "tinytext"),
    _D.TEXT: (TypeCode.BLOB, False, False, "text"),
    _D.MEDIUMTEXT: (TypeCode.MEDIUMBLOB, False, False, "mediumtext"),
    _D.LONGTEXT: (TypeCode.LONGBLOB, False, False, "longtext"),
    _D.TINYBLOB: (TypeCode.TINYBLOB, False, True, "tinyblob"),
    _D.BLOB: (TypeCode.BLOB, False, True, "blob"),
    _D.MEDIUMBLOB: (TypeCode.MEDIUMBLOB, False, True, "mediumblob"),
    _D.LONGBLOB: (TypeCode.LONGBLOB, False, True, "longblob"),
    _D.JSON: (TypeCode.JSON, False, False, "json"),
    _D.ENUM: (TypeCode.ENUM, False, False, "enum"),
    _D.SET: (TypeCode.SET, False, False, "set"),
    _D.BIT: (TypeCode.BIT, True, False, "bit"),
    _D.GEOMETRY: (TypeCode.GEOMETRY, False, False, "geometry"),
    _D.VECTOR: (TypeCode.VECTOR_FLOAT32, False, False, "vector"),  # TiDB 8.4+ VECTOR / VECTOR(N): N is length
}

_TEXT_BY_CODE = {
    TypeCode.TINYBLOB: ("tinytext", "tinyblob"),
    TypeCode.BLOB: ("text", "blob"),
    TypeCode.MEDIUMBLOB: ("mediumtext", "mediumblob"),
    TypeCode.LONGBLOB: ("longtext", "longblob"),
}

_STRING_CODES = frozenset(
    {TypeCode.STRING, TypeCode.VARCHAR, TypeCode.TINYBLOB, TypeCode.BLOB, TypeCode.MEDIUMBLOB, TypeCode.LONGBLOB}
)


def quote_string(value: str) -> str:
    """``value`` as a MySQL single-quoted string literal (``'it''s'``, backslashes doubled)."""
    return exp.Literal.string(value).sql(dialect=TiDBDialect)


@dataclass(frozen=True)
class ColumnType:
    """A MySQL column type as TiCDC describes it, with its parameters.

    ``name`` is the MySQL type name in lower case (``"tinyint"``, ``"varbinary"``, ``"mediumtext"``): the
    type code alone does not tell TEXT from BLOB without the flag, nor CHAR from BINARY. Parameters the
    type does not have are ``None`` (``members`` is empty). ``length`` is the display width of integer
    types (``tinyint(1)``), the length of string and BIT types, the year width of YEAR.
    """

    type_code: TypeCode
    name: str
    flags: ColumnFlag = ColumnFlag.NONE
    length: int | None = None
    precision: int | None = None
    scale: int | None = None
    fsp: int | None = None
    members: tuple[str, ...] = ()
    charset: str | None = None
    collation: str | None = None

    @property
    def unsigned(self) -> bool:
        """Whether the column has the UNSIGNED flag."""
        return bool(self.flags & ColumnFlag.UNSIGNED)

    @property
    def binary(self) -> bool:
        """Whether values are bytes (BINARY flag on a string/blob type)."""
        return bool(self.flags & ColumnFlag.BINARY)

    def sql(self) -> str:
        """The type as MySQL's ``SHOW CREATE TABLE`` spells it, lower case: ``bigint(20) unsigned``."""
        if self.members:
            text = f"{self.name}({','.join(quote_string(m) for m in self.members)})"
        elif self.precision is not None:
            text = f"{self.name}({self.precision},{self.scale or 0})"
        elif self.fsp:
            text = f"{self.name}({self.fsp})"
        elif self.length is not None and self.type_code not in _TEXT_BY_CODE:
            text = f"{self.name}({self.length})"
        else:
            text = self.name
        if self.unsigned and self.type_code not in (TypeCode.BIT, TypeCode.YEAR):
            text += " unsigned"
        if self.charset and self.type_code in _STRING_CODES and not self.binary:
            text += f" character set {self.charset}"
        if self.collation and self.type_code in _STRING_CODES and not self.binary:
            text += f" collate {self.collation}"
        return text


def _int_param(param: exp.Expr, what: str) -> int:
    node = param.this if isinstance(param, exp.DataTypeParam) else param
    if isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit():
        return int(node.this)
    raise UnsupportedColumnTypeError(f"{what} must be a non-negative integer, found {param.sql(dialect=TiDBDialect)!r}")


def _constraint_name(node: exp.Expr | None) -> str | None:
    if node is None:
        return None
    if isinstance(node, exp.Literal):
        return str(node.this).lower()
    return node.name.lower() or None


def column_type_from_sqlglot(
    kind: exp.DataType, constraints: Sequence[exp.Expr] = ()
) -> ColumnType:
    """The :class:`ColumnType` of a sqlglot ``DataType`` and the column's constraints.

    ``constraints`` are the ``ColumnConstraint`` nodes of the column definition; only the ones that belong
    to the type are read (CHARACTER SET, COLLATE, the BINARY attribute, ZEROFILL).

    Raises:
        UnsupportedColumnTypeError: the type has no TiCDC type code (e.g. INET, arrays) or a parameter
            that is not a non-negative integer.
    """
    entry = _TYPES.get(kind.this)
    if entry is None:
        raise UnsupportedColumnTypeError(f"unsupported column type {kind.sql(dialect=TiDBDialect)!r}")
    code, unsigned, binary, name = entry
    params = kind.expressions

    charset = collation = None
    binary_attribute = zerofill = False
    for constraint in constraints:
        node = constraint.args.get("kind") if isinstance(constraint, exp.ColumnConstraint) else constraint
        if isinstance(node, exp.CharacterSetColumnConstraint):
            charset = _constraint_name(node.this)
        elif isinstance(node, exp.CollateColumnConstraint):
            collation = _constraint_name(node.this)
        elif isinstance(node, exp.BinaryColumnConstraint):
            binary_attribute = True
        elif isinstance(node, exp.ZeroFillColumnConstraint):
            zerofill = True

    length = precision = scale = fsp = None
    members: tuple[str, ...] = ()
    if code in (TypeCode.ENUM, TypeCode.SET):
        # MySQL and TiDB delete trailing spaces from ENUM and SET members when the table is made (but for
        # the binary character set): 'small ' is the member 'small', which is what TiDB sends and stores
        keep_spaces = "binary" in (charset, collation)
        values = []
        for member in params:
            if not (isinstance(member, exp.Literal) and member.is_string):
                found = member.sql(dialect=TiDBDialect)
                raise UnsupportedColumnTypeError(f"{name} member must be a string, found {found!r}")
            values.append(member.this if keep_spaces else member.this.rstrip(" "))
        members = tuple(values)
    elif code == TypeCode.DECIMAL:
        precision = _int_param(params[0], "DECIMAL precision") if params else 10
        scale = _int_param(params[1], "DECIMAL scale") if len(params) > 1 else 0
        if precision == 0 and scale == 0:
            precision = 10  # MySQL and TiDB: DECIMAL(0) and DECIMAL(0,0) are DECIMAL(10,0)
    elif code in (TypeCode.FLOAT, TypeCode.DOUBLE):
        if len(params) == 2:
            precision = _int_param(params[0], f"{name} precision")
            scale = _int_param(params[1], f"{name} scale")
        elif len(params) == 1 and code == TypeCode.FLOAT and _int_param(params[0], "FLOAT precision") > 24:
            code, name = TypeCode.DOUBLE, "double"  # MySQL: FLOAT(p), 25 <= p <= 53, is a DOUBLE
    elif code in (TypeCode.DATETIME, TypeCode.TIMESTAMP, TypeCode.TIME):
        fsp = _int_param(params[0], f"{name} fractional seconds") if params else 0
    elif params:
        length = _int_param(params[0], f"{name} length")
    if kind.this == _D.BOOLEAN:
        length = 1  # BOOL is TINYINT(1)
    elif code == TypeCode.BIT and length is None:
        length = 1
    elif code == TypeCode.STRING and length is None:
        length = 1  # CHAR and BINARY default to one character/byte

    if code in _TEXT_BY_CODE and length is not None and name in ("text", "blob"):
        # TEXT(n)/BLOB(n): the smallest blob type holding n characters (TiDB adjustBlobTypesFlen).
        size = length * _CHARSET_MAXLEN.get(charset or ("binary" if binary else _DEFAULT_CHARSET), 4)
        code = next((c for limit, c in _BLOB_SIZES if size <= limit), TypeCode.LONGBLOB)
        name = _TEXT_BY_CODE[code][1 if binary else 0]

    if code in _STRING_CODES:
        if charset == "binary":
            binary = True
            if code in _TEXT_BY_CODE:
                name = _TEXT_BY_CODE[code][1]
            else:
                name = {"char": "binary", "varchar": "varbinary"}.get(name, name)
        if binary_attribute and not binary and collation is None and charset is not None:
            collation = f"{charset}_bin"  # CHAR(n) BINARY: the charset's binary collation, still text
    elif code in (TypeCode.ENUM, TypeCode.SET) and binary_attribute and collation is None and charset is not None:
        collation = f"{charset}_bin"

    flags = ColumnFlag.NONE
    if unsigned or zerofill:
        flags |= ColumnFlag.UNSIGNED
    if binary and code in _STRING_CODES:
        flags |= ColumnFlag.BINARY
    if binary:
        charset = charset or "binary"
    return ColumnType(code, name, flags, length, precision, scale, fsp, members, charset, collation)


def parse_column_type(text: str) -> ColumnType:
    """Parse a MySQL column type text such as ``"bigint(20) unsigned"`` or ``"enum('a','b,c')"``.

    The text may carry the type's own attributes (``UNSIGNED``, ``ZEROFILL``, ``BINARY``, ``CHARACTER SET``,
    ``COLLATE``), nothing else (no ``NOT NULL``, no ``DEFAULT``).

    Raises:
        UnsupportedColumnTypeError: the text is not a single MySQL column type, or one TiCDC cannot carry.
    """
    if not isinstance(text, str) or not text.strip():
        raise UnsupportedColumnTypeError(f"expected a column type text, found {text!r}")
    return _parse_column_type(text)


# Decoders ask for the same few type texts on every message (Canal-JSON's mysqlType); parsing one costs
# about a millisecond, a cache hit well under a microsecond. ColumnType is immutable, so sharing is safe.
@functools.lru_cache(maxsize=4096)
def _parse_column_type(text: str) -> ColumnType:
    try:
        statements = TiDBDialect().parse(f"CREATE TABLE _t (_c {text})")
    except SqlglotError as err:
        detail = str(err).split("\n", 1)[0] or type(err).__name__
        raise UnsupportedColumnTypeError(f"not a MySQL column type: {text!r} ({detail})") from None
    except RecursionError:
        raise UnsupportedColumnTypeError(f"not a MySQL column type (nested too deeply): {text[:80]!r}") from None
    except Exception as err:  # noqa: BLE001 - sqlglot bugs on odd input (TypeError...) mean "not a type"
        raise UnsupportedColumnTypeError(f"not a MySQL column type: {text!r} ({type(err).__name__})") from None
    create = statements[0] if len(statements) == 1 else None
    schema = create.this if isinstance(create, exp.Create) else None
    columns = schema.expressions if isinstance(schema, exp.Schema) else []
    if len(columns) != 1 or not isinstance(columns[0], exp.ColumnDef) or columns[0].name != "_c":
        raise UnsupportedColumnTypeError(f"not a single MySQL column type: {text!r}")
    column = columns[0]
    kind = column.args.get("kind")
    if not isinstance(kind, exp.DataType):
        raise UnsupportedColumnTypeError(f"not a MySQL column type: {text!r}")
    type_attributes = (
        exp.CharacterSetColumnConstraint,
        exp.CollateColumnConstraint,
        exp.BinaryColumnConstraint,
        exp.ZeroFillColumnConstraint,
    )
    constraints = column.args.get("constraints") or []
    for constraint in constraints:
        if not isinstance(constraint.args.get("kind"), type_attributes):
            raise UnsupportedColumnTypeError(
                f"{text!r} is more than a column type: {constraint.sql(dialect=TiDBDialect)!r}"
            )
    return column_type_from_sqlglot(kind, constraints)
