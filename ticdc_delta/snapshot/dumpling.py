"""Read a Dumpling export: the snapshot TSO, the table schemas and the rows, exactly as Dumpling wrote them.

Plain Python (pyarrow only, no Spark): the Spark load (:mod:`.load`) plans the file list on the driver with
:func:`read_export` and parses each data file on an executor with :func:`data_file_batches`.

Layout of an export (Dumpling, ``dumpling/export``; file names from its default ``--output-filename-
template``, ``{{.DB}}.{{.Table}}.{{.Index}}``)::

    metadata                              the snapshot: "SHOW MASTER STATUS:" then "\\tPos: <TSO>"
    {db}-schema-create.sql                CREATE DATABASE
    {db}.{table}-schema.sql               CREATE TABLE (SHOW CREATE TABLE)
    {db}.{table}.{NNNNNNNNN}.csv|.sql     the rows; ``.gz`` when ``--compress gzip``

``{db}`` and ``{table}`` are the names escaped (the template's ``fn``, ``filenameEscapeRegexp``): each of
``[\\x00-\\x1f%"*./:<>?\\\\|]`` becomes ``%`` and its byte in two upper-case hex digits, and so does the
``-`` of a ``-schema`` (any case) inside a name: database ``my.db`` is ``my%2Edb``, table ``100%`` is
``100%25``, table ``t-schema`` is ``t%2Dschema``; other characters, non-ASCII ones too, stay as they are.

The ``metadata`` file (``metadata.go``): for TiDB the ``Pos:`` under ``SHOW MASTER STATUS:`` (``SHOW
BINARY LOG STATUS:`` on newer servers) is the TSO of the consistent snapshot (``--snapshot`` when given).
A second block marked ``/* AFTER CONNECTION POOL ESTABLISHED */`` must name the same position.

CSV (``sql_type.go``, ``writer_util.go``; defaults ``--csv-separator ,``, ``--csv-delimiter '"'``,
``--csv-null-value \\N``, ``--escape-backslash``, a header line, ``--csv-line-terminator \\r\\n``):

- numbers (integer, float, DECIMAL types) are written bare; every other value is enclosed in the
  delimiter; NULL is the null value, bare.
- with backslash escaping (default), inside a value NUL, CR, LF and ``\\`` are written ``\\0 \\r \\n \\\\``
  and the delimiter's first character ``\\"`` (without a delimiter: the separator's); without it, the
  delimiter is doubled.
- binary columns (BLOB, BINARY, VARBINARY, BIT) are their raw bytes escaped like text (``--csv-output-
  dialect default``), or hex (``snowflake``/``redshift``), or base64 (``bigquery``): ``binary_format``.

SQL (``INSERT INTO `t` VALUES (...),(...);``): numbers bare, ``NULL``, strings in single quotes with
backslash escapes (``\\0 \\n \\r \\\\ \\' \\" \\Z``), binary columns ``x'hex'``.

TIMESTAMP text is in the export session's time zone: UTC unless Dumpling ran with ``--skip-tz-utc``.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence
from urllib.parse import unquote

import pyarrow as pa

from ..codec.model import TypeCode, is_binary_column
from ..delta.arrow_types import TypeParams, arrow_field_for, arrow_type_for, converter_for
from ..errors import SinkError, SnapshotFormatError
from ..locations import tidb_lower
from ..schema import ddl as d

__all__ = [
    "CsvDialect",
    "SnapshotColumn",
    "DataFile",
    "TableExport",
    "DumplingExport",
    "parse_metadata",
    "parse_schema_file",
    "parse_csv",
    "parse_sql",
    "read_export",
    "decompress",
    "data_file_batches",
    "BINARY_FORMATS",
]

log = logging.getLogger(__name__)

BINARY_FORMATS = ("utf8", "hex", "base64")
"""Dumpling's ``--csv-output-dialect``/``--binary-format`` encodings of binary columns in CSV."""


@dataclass(frozen=True)
class CsvDialect:
    """How Dumpling wrote its CSV files (its flags and defaults)."""

    separator: str = ","
    delimiter: str = '"'
    null_value: str = "\\N"
    escape_backslash: bool = True
    header: bool = True
    binary_format: str = "utf8"

    def __post_init__(self) -> None:
        if not self.separator:
            raise ValueError("the CSV separator must not be empty")
        if self.binary_format not in BINARY_FORMATS:
            raise ValueError(f"binary_format must be one of {BINARY_FORMATS}, got {self.binary_format!r}")


@dataclass(frozen=True)
class SnapshotColumn:
    """A target column: its name, TiCDC type code, flags and DDL parameters (as the stream would type it)."""

    name: str
    type_code: int
    flags: int
    params: TypeParams
    generated: bool = False

    @property
    def binary(self) -> bool:
        """Whether Dumpling writes the column as bytes (BLOB/BINARY/VARBINARY/BIT)."""
        return self.type_code == TypeCode.BIT or is_binary_column(self.type_code, self.flags)

    def field(self) -> pa.Field:
        return arrow_field_for(self.name, self.type_code, self.flags, self.params)


@dataclass(frozen=True)
class DataFile:
    """One data file of a table: its location, size, format (``csv``/``sql``) and compression."""

    path: str
    size: int
    format: str
    compression: str | None = None


@dataclass
class TableExport:
    """One table of the export: names, its CREATE TABLE (parsed), its schema file and data files."""

    schema: str
    table: str
    create: d.CreateTable
    schema_file: str
    files: list[DataFile] = field(default_factory=list)

    @property
    def columns(self) -> list[SnapshotColumn]:
        from ..delta.ddl_replay import column_params

        # (a VIRTUAL generated column has no Delta column: TiCDC never sends its values, see ddl_replay)
        return [SnapshotColumn(c.name, int(c.type.type_code), int(c.type.flags), column_params(c), c.generated)
                for c in self.create.columns if not c.virtual]

    @property
    def key(self) -> tuple[str, ...]:
        """TiCDC's handle key: the primary key, else the first unique key over NOT NULL columns (not VIRTUAL
        generated ones: TiCDC's rows leave those out)."""
        if self.create.primary_key:
            return tuple(self.create.primary_key)
        not_null = {tidb_lower(c.name) for c in self.create.columns if not c.nullable and not c.virtual}
        for cols in self.create.unique_keys:
            if all(tidb_lower(c) in not_null for c in cols):
                return tuple(cols)
        return ()

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)


@dataclass
class DumplingExport:
    """A whole export: where it is, the snapshot TSO and its tables."""

    location: str
    tso: int
    tables: list[TableExport]


# ------------------------------------------------------------------------------------------ metadata

_STATUS_HEADER = re.compile(r"^SHOW (?:MASTER|BINARY LOG) STATUS:(.*)$")
_POS = re.compile(r"^\s+Pos:\s*(\S*)\s*$")


def parse_metadata(text: str, where: str) -> int:
    """The snapshot TSO of a Dumpling ``metadata`` file.

    Raises:
        SnapshotFormatError: no ``SHOW MASTER STATUS`` block with a ``Pos:`` TSO, or two blocks that
            disagree (``where`` names the file).
    """
    positions: list[str] = []
    in_status = False
    for line in text.splitlines():
        if _STATUS_HEADER.match(line):
            in_status = True
            continue
        if not line.strip() or not line[:1].isspace():
            in_status = False
            continue
        m = _POS.match(line)
        if in_status and m:
            positions.append(m.group(1))
    if not positions:
        raise SnapshotFormatError(
            f"{where}: expected a 'SHOW MASTER STATUS:' block with a '\\tPos: <TSO>' line (Dumpling's metadata "
            f"of a TiDB export), found none"
        )
    if len(set(positions)) > 1:
        raise SnapshotFormatError(f"{where}: the snapshot positions disagree: {positions}; the export is not consistent")
    pos = positions[0]
    if not pos.isdigit() or int(pos) <= 0 or int(pos) >= 1 << 63:
        raise SnapshotFormatError(
            f"{where}: expected the snapshot TSO (a positive 64-bit integer) after 'Pos:', got {pos!r}; "
            "is this an export of TiDB (not MySQL)?"
        )
    return int(pos)


# ------------------------------------------------------------------------------------------ schema

_VERSIONED_COMMENT = re.compile(r"/\*!\d*.*?\*/\s*;?", re.DOTALL)


def parse_schema_file(text: str, schema: str, where: str) -> d.CreateTable:
    """The CREATE TABLE of a ``{db}.{table}-schema.sql`` file, read by the job's DDL parser.

    Raises:
        SnapshotFormatError: the file holds no CREATE TABLE the parser can read.
    """
    body = _VERSIONED_COMMENT.sub("", text).strip()
    if not body:
        raise SnapshotFormatError(f"{where}: expected a CREATE TABLE statement, the file is empty")
    changes = d.parse_ddl(body, default_schema=schema)
    tables = [c for c in changes if isinstance(c, d.CreateTable)]
    if len(tables) != 1 or tables[0].like is not None or not tables[0].columns:
        reasons = [getattr(c, "reason", type(c).__name__) for c in changes if not isinstance(c, d.CreateTable)]
        raise SnapshotFormatError(
            f"{where}: expected one CREATE TABLE statement with its columns, found "
            f"{[type(c).__name__ for c in changes]}{': ' + '; '.join(map(str, reasons)) if reasons else ''}"
        )
    return tables[0]


# ------------------------------------------------------------------------------------------ CSV

_UNESCAPE = {ord("0"): b"\x00", ord("r"): b"\r", ord("n"): b"\n", ord("Z"): b"\x1a"}


def _unescape_backslash(raw: bytes) -> bytes:
    if b"\\" not in raw:
        return raw
    return re.sub(rb"\\(.)", lambda m: _UNESCAPE.get(m.group(1)[0], m.group(1)), raw, flags=re.DOTALL)


class _CsvGrammar:
    def __init__(self, dialect: CsvDialect) -> None:
        self.dialect = dialect
        sep = re.escape(dialect.separator.encode())
        delim = dialect.delimiter.encode()
        self.sep = dialect.separator.encode()
        self.delim = delim
        self.null = dialect.null_value.encode()
        d_ = re.escape(delim)
        stop = rb"(?!" + sep + rb")[^\r\n"
        if dialect.escape_backslash:
            self.bare = re.compile(rb"(?:" + stop + rb"\\]|\\.)*", re.DOTALL)
            if delim:
                self.quoted = re.compile(d_ + rb"((?:(?!" + d_ + rb")[^\\]|\\.)*)" + d_, re.DOTALL)
        else:
            self.bare = re.compile(rb"(?:" + stop + rb"])*", re.DOTALL)
            if delim:
                self.quoted = re.compile(d_ + rb"((?:(?!" + d_ + rb").|" + d_ + d_ + rb")*)" + d_, re.DOTALL)

    def value(self, raw: bytes, quoted: bool) -> bytes:
        if self.dialect.escape_backslash:
            return _unescape_backslash(raw)
        if quoted:
            return raw.replace(self.delim + self.delim, self.delim)
        return raw


def parse_csv(data: bytes, dialect: CsvDialect, where: str) -> tuple[list[str] | None, list[list[bytes | None]]]:
    """The header (``None`` without one) and the rows of a Dumpling CSV file; a field is its unescaped
    bytes, or ``None`` for NULL (the bare null value).

    Raises:
        SnapshotFormatError: a value without its closing delimiter, a row that does not end with a line
            terminator (a truncated file), rows of different widths.
    """
    g = _CsvGrammar(dialect)
    rows: list[list[bytes | None]] = []
    pos, n, line = 0, len(data), 1
    width: int | None = None
    while pos < n:
        row: list[bytes | None] = []
        while True:
            if g.delim and data.startswith(g.delim, pos):
                m = g.quoted.match(data, pos)
                if m is None:
                    raise SnapshotFormatError(
                        f"{where}: line {line}: a value opened with {dialect.delimiter!r} at byte {pos} is never "
                        f"closed (the file is truncated or not in this CSV dialect)"
                    )
                row.append(g.value(m.group(1), True))
                line += m.group(1).count(b"\n")
            else:
                m = g.bare.match(data, pos)
                raw = m.group(0)  # type: ignore[union-attr]
                row.append(None if raw == g.null else g.value(raw, False))
            pos = m.end()  # type: ignore[union-attr]
            if data.startswith(g.sep, pos):
                pos += len(g.sep)
                continue
            if data.startswith(b"\r\n", pos):
                pos += 2
            elif data.startswith(b"\n", pos):
                pos += 1
            elif pos >= n:
                raise SnapshotFormatError(
                    f"{where}: line {line}: the last row does not end with a line terminator (the file is truncated)"
                )
            else:
                raise SnapshotFormatError(
                    f"{where}: line {line}: expected {dialect.separator!r} or a line end at byte {pos}, got "
                    f"{data[pos:pos + 20]!r}"
                )
            break
        if width is None:
            width = len(row)
        elif len(row) != width:
            raise SnapshotFormatError(f"{where}: line {line}: expected {width} fields, found {len(row)}")
        rows.append(row)
        line += 1
    header: list[str] | None = None
    if dialect.header:
        if not rows:
            raise SnapshotFormatError(f"{where}: expected a header line (Dumpling writes one unless --no-header)")
        header = [(v or b"").decode("utf-8", "replace") for v in rows.pop(0)]
    return header, rows


# ------------------------------------------------------------------------------------------ SQL

def _sql_token(string_body: bytes) -> re.Pattern[bytes]:
    """A value of a Dumpling INSERT: NULL, a string literal whose body is ``string_body``, x'hex' or a number."""
    return re.compile(
        rb"\s*(?:(?P<null>NULL)\b|'(?P<str>" + string_body + rb")'|[xX]'(?P<hex>[0-9a-fA-F]*)'"
        rb"|(?P<num>[-+]?[0-9.]+(?:[eE][-+]?[0-9]+)?))\s*",
        re.DOTALL,
    )


_SQL_TOKEN = _sql_token(rb"(?:[^'\\]|\\.|'')*")
_SQL_TOKEN_NO_ESCAPE = _sql_token(rb"(?:[^']|'')*")  # (--escape-backslash=false: a backslash is itself)
_INSERT = re.compile(rb"\s*INSERT\s+INTO\s+`(?:[^`]|``)+`\s*(?:\((?P<cols>[^)]*)\)\s*)?VALUES\s*", re.IGNORECASE)
_SKIP = re.compile(rb"\s*(?:/\*.*?\*/\s*;?|--[^\n]*\n)", re.DOTALL)


def _sql_string(raw: bytes, escape_backslash: bool = True) -> bytes:
    raw = raw.replace(b"''", b"'")
    return _unescape_backslash(raw) if escape_backslash else raw


def parse_sql(data: bytes, where: str, escape_backslash: bool = True
              ) -> tuple[list[str] | None, list[list[bytes | None]]]:
    """The column list (``None`` when the INSERTs give none) and the rows of a Dumpling SQL file; a value
    is its bytes (string literals unescaped, ``x'..'`` decoded, numbers as written) or ``None`` (NULL).
    ``escape_backslash=False``: the export ran with ``--escape-backslash=false`` (a backslash is itself, a
    quote is doubled).

    Raises:
        SnapshotFormatError: anything but INSERT statements and comments, or a statement cut short.
    """
    rows: list[list[bytes | None]] = []
    columns: list[str] | None = None
    token = _SQL_TOKEN if escape_backslash else _SQL_TOKEN_NO_ESCAPE
    pos, n = 0, len(data)
    while True:
        m = _SKIP.match(data, pos)
        while m:
            pos = m.end()
            m = _SKIP.match(data, pos)
        if not data[pos:].strip():
            break
        ins = _INSERT.match(data, pos)
        if ins is None:
            raise SnapshotFormatError(f"{where}: byte {pos}: expected INSERT INTO ... VALUES, got {data[pos:pos + 40]!r}")
        if ins.group("cols") is not None:
            columns = [c.strip().strip(b"`").replace(b"``", b"`").decode() for c in ins.group("cols").split(b",")]
        pos = ins.end()
        while True:
            if not data.startswith(b"(", pos):
                raise SnapshotFormatError(f"{where}: byte {pos}: expected '(' of a row, got {data[pos:pos + 40]!r}"
                                          + (" (the file is truncated)" if pos >= n else ""))
            pos += 1
            row: list[bytes | None] = []
            while True:
                t = token.match(data, pos)
                if t is None:
                    raise SnapshotFormatError(
                        f"{where}: byte {pos}: expected a value, got {data[pos:pos + 40]!r}"
                        + (" (the file is truncated)" if len(data) - pos < 40 else "")
                    )
                if t.group("null") is not None:
                    row.append(None)
                elif t.group("str") is not None:
                    row.append(_sql_string(t.group("str"), escape_backslash))
                elif t.group("hex") is not None:
                    row.append(binascii.unhexlify(t.group("hex")))
                else:
                    row.append(t.group("num"))
                pos = t.end()
                if data.startswith(b",", pos):
                    pos += 1
                    continue
                if data.startswith(b")", pos):
                    pos += 1
                    break
                raise SnapshotFormatError(f"{where}: byte {pos}: expected ',' or ')' in a row, got {data[pos:pos + 40]!r}"
                                          + (" (the file is truncated)" if pos >= n else ""))
            if rows and len(row) != len(rows[0]):
                raise SnapshotFormatError(f"{where}: row {len(rows) + 1} has {len(row)} values, expected {len(rows[0])}")
            rows.append(row)
            m2 = re.compile(rb"\s*([,;])\s*").match(data, pos)
            if m2 is None:
                raise SnapshotFormatError(f"{where}: byte {pos}: expected ',' or ';' after a row, got {data[pos:pos + 40]!r}"
                                          + (" (the file is truncated)" if pos >= n else ""))
            pos = m2.end()
            if m2.group(1) == b";":
                break
    return columns, rows


# ------------------------------------------------------------------------------------------ files

_COMPRESSIONS = {".gz": "gzip", ".gzip": "gzip", ".zst": "zstd", ".snappy": "snappy"}


def decompress(data: bytes, compression: str | None, where: str) -> bytes:
    """The file's bytes, gunzipped when ``compression`` is ``gzip``.

    Raises:
        SnapshotFormatError: a compression this reader does not support, or a corrupt/truncated stream.
    """
    if compression is None:
        return data
    if compression == "gzip":
        try:
            return gzip.decompress(data)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            raise SnapshotFormatError(f"{where}: expected a complete gzip stream: {exc}") from None
    raise SnapshotFormatError(
        f"{where}: {compression} compression is not supported; export with Dumpling's --compress gzip or none"
    )


def _filesystem(location: str) -> tuple[Any, str]:
    from pyarrow import fs

    if "://" not in location:
        import os

        return fs.LocalFileSystem(), os.path.abspath(location)
    return fs.FileSystem.from_uri(location)


def _join(location: str, name: str) -> str:
    return location.rstrip("/") + "/" + name


def read_file(location: str) -> bytes:
    """The bytes of one file (local path or object-store URI)."""
    filesystem, path = _filesystem(location)
    with filesystem.open_input_stream(path, compression=None) as fh:
        return fh.read()


def _unescape_name(escaped: str) -> str:
    """A database or table name as Dumpling's file names escape it (see the module doc), unescaped.

    Dumpling escapes ``%`` itself, so every ``%XX`` of its file names is an escape and undoing them all
    gives the name back; a name that needed none (the usual one) comes back as it is.
    """
    return unquote(escaped)


_DATA_NAME = re.compile(r"^\.(\d+)(?:\.\d+)?\.(csv|sql)((?:\.[a-z]+)?)$")


def read_export(location: str) -> DumplingExport:
    """List a Dumpling export and read its metadata and schema files (the driver's part of a load).

    Raises:
        SnapshotFormatError: no ``metadata`` file, a schema file that does not parse, a data file of no
            known table.
    """
    from pyarrow import fs

    filesystem, root = _filesystem(location)
    try:
        infos = filesystem.get_file_info(fs.FileSelector(root, recursive=False))
    except (FileNotFoundError, OSError) as exc:
        raise SnapshotFormatError(f"{location}: cannot list the export directory: {exc}") from None
    files = {i.base_name: i for i in infos if i.type == fs.FileType.File}
    meta_where = _join(location, "metadata")
    if "metadata" not in files:
        raise SnapshotFormatError(
            f"{meta_where}: missing: a Dumpling export holds a 'metadata' file with the snapshot TSO "
            "(was the export finished, and is this its directory?)"
        )
    tso = parse_metadata(read_file(meta_where).decode("utf-8", "replace"), meta_where)

    databases = {name[: -len("-schema-create.sql")] for name in files if name.endswith("-schema-create.sql")}
    tables: dict[str, TableExport] = {}
    for name in sorted(files):
        if not name.endswith("-schema.sql") or name.endswith("-schema-create.sql"):
            continue
        stem = name[: -len("-schema.sql")]
        # Split the escaped stem, then unescape: Dumpling escapes a "." inside a name, so its first "." ends
        # the database. An export whose names are not escaped (the simulator's writer) may hold a "." in a
        # database name: the longest database of a -schema-create.sql file that begins the stem is the one
        # (for escaped names, the same as the first ".").
        escaped_db = max((x for x in databases if stem.startswith(x + ".")), key=len, default=None)
        if escaped_db is None:
            escaped_db = stem.partition(".")[0]
        db = _unescape_name(escaped_db)
        where = _join(location, name)
        create = parse_schema_file(read_file(where).decode("utf-8", "replace"), db, where)
        tables[stem] = TableExport(create.schema or db, create.table, create, where)
    for name in sorted(files):
        if name == "metadata" or name.endswith("-schema.sql") or name.endswith("-schema-create.sql"):
            continue
        stem = max((s for s in tables if name.startswith(s + ".")), key=len, default=None)
        m = _DATA_NAME.match(name[len(stem):]) if stem is not None else None
        if m is None or stem is None:
            continue  # not a data file of a known table (Dumpling writes views as *-schema-view.sql)
        suffix = m.group(3)
        compression = None
        if suffix:
            compression = _COMPRESSIONS.get(suffix)
            if compression is None:
                raise SnapshotFormatError(f"{_join(location, name)}: unknown compression suffix {suffix!r}")
        tables[stem].files.append(DataFile(_join(location, name), int(files[name].size or 0), m.group(2), compression))
    return DumplingExport(location, tso, [tables[k] for k in sorted(tables)])


# ------------------------------------------------------------------------------------------ rows → Arrow


def _binary_value(raw: bytes, fmt: str, where: str) -> bytes:
    if fmt == "hex":
        try:
            return binascii.unhexlify(raw)
        except (binascii.Error, ValueError) as exc:
            raise SnapshotFormatError(f"{where}: expected hex (--csv-output-dialect), got {raw[:40]!r}: {exc}") from None
    if fmt == "base64":
        try:
            return base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise SnapshotFormatError(f"{where}: expected base64 (--csv-output-dialect), got {raw[:40]!r}: {exc}") from None
    return raw


def data_file_batches(
    file: DataFile,
    columns: Sequence[SnapshotColumn],
    *,
    dialect: CsvDialect,
    tz: str,
    extra: Sequence[tuple[pa.Field, Any]] = (),
    batch_rows: int = 65536,
) -> Iterator[pa.RecordBatch]:
    """The rows of one data file as Arrow batches of the table's Delta schema (``columns`` then the
    ``extra`` constant columns), values converted exactly as the stream converts them
    (:func:`~ticdc_delta.delta.arrow_types.converter_for`).

    Raises:
        SnapshotFormatError: the file is truncated or malformed, names a column the table does not
            have, or holds a value its column cannot take (naming the file, row and column).
    """
    where = file.path
    data = decompress(read_file(file.path), file.compression, where)
    if file.format == "csv":
        names, rows = parse_csv(data, dialect, where)
        binary_fmt = dialect.binary_format
    else:
        names, rows = parse_sql(data, where, dialect.escape_backslash)
        binary_fmt = "raw"
    by_name = {tidb_lower(c.name): i for i, c in enumerate(columns)}
    if names is None:
        order = list(range(len(columns)))
        if rows and len(rows[0]) != len(columns):
            raise SnapshotFormatError(f"{where}: rows have {len(rows[0])} values, the table has {len(columns)} columns")
    else:
        unknown = [n for n in names if tidb_lower(n) not in by_name]
        if unknown:
            raise SnapshotFormatError(
                f"{where}: columns {unknown} are not in the table's schema file (columns: {[c.name for c in columns]})"
            )
        order = [by_name[tidb_lower(n)] for n in names]
        given = set(order)
        missing = [c.name for i, c in enumerate(columns) if i not in given and not c.generated]
        if missing:
            raise SnapshotFormatError(
                f"{where}: no values for columns {missing} of the table's schema file (the file names {names})"
            )
        left_out = [c.name for i, c in enumerate(columns) if i not in given]
        if left_out:
            log.warning("%s: the generated column(s) %s are not in the export (Dumpling leaves them out): they "
                        "load as NULL; TiCDC sends STORED generated columns, so a row gets their value at its "
                        "next change", where, left_out)
    schema = pa.schema([c.field() for c in columns] + [f for f, _ in extra])
    converters = [converter_for(c.type_code, c.flags, c.params, tz) for c in columns]
    position = {target: source for source, target in enumerate(order)}
    for start in range(0, len(rows), batch_rows):
        chunk = rows[start : start + batch_rows]
        arrays = []
        for i, col in enumerate(columns):
            src = position.get(i)
            values: list[Any] = []
            for r, row in enumerate(chunk):
                raw = None if src is None else row[src]
                if raw is None:
                    values.append(None)
                    continue
                try:
                    if col.binary:
                        value: Any = _binary_value(raw, binary_fmt, where) if binary_fmt != "raw" else raw
                    else:
                        value = raw.decode("utf-8")  # (a FLOAT's converter rounds its text to the single)
                    values.append(converters[i](value))
                except UnicodeDecodeError:
                    raise SnapshotFormatError(
                        f"{where}: row {start + r + 1}, column {col.name!r}: expected UTF-8 text, got {raw[:60]!r}"
                    ) from None
                except SinkError as exc:
                    raise SnapshotFormatError(f"{where}: row {start + r + 1}, column {col.name!r}: {exc}") from None
            arrays.append(pa.array(values, type=arrow_type_for(col.type_code, col.flags, col.params)))
        for f, value in extra:
            arrays.append(pa.array([value] * len(chunk), type=f.type))
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)
