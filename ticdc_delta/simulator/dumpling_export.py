"""Write the simulated upstream as a Dumpling export at a chosen TSO (the snapshot half of a bootstrap).

:func:`write_dumpling_export` takes a :class:`~ticdc_delta.simulator.scenario.Scenario` as it is now —
every statement so far committed, so the snapshot TSO is the scenario's last commit ts — and writes what
``dumpling --snapshot <TSO> --filetype csv|sql`` would: ``metadata``, ``{db}-schema-create.sql``,
``{db}.{table}-schema.sql`` and ``{db}.{table}.{NNNNNNNNN}.csv|.sql`` data files, byte for byte in
Dumpling's format (:mod:`ticdc_delta.snapshot.dumpling` documents it and reads it back). Keep playing the
scenario afterwards: its stream then overlaps the snapshot, and the scenario's final oracle is what
"snapshot, then stream" must end with.
"""

from __future__ import annotations

import base64
import gzip
import struct
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from ..codec.model import INTEGER_TYPES, TypeCode
from ..schema.ddl import quote_ident
from ..snapshot.dumpling import CsvDialect
from .scenario import ModelColumn, ModelTable, Scenario, _as_label

__all__ = ["write_dumpling_export", "show_create_table"]

_NUMBER_TYPES = frozenset(INTEGER_TYPES) | {TypeCode.FLOAT, TypeCode.DOUBLE, TypeCode.DECIMAL}


def _float32_text(value: float) -> str:
    """The shortest text that reads back as the same single-precision float (how TiDB prints a FLOAT)."""
    target = struct.pack("<f", value)
    for digits in range(1, 18):
        text = f"{value:.{digits}g}"
        if struct.pack("<f", float(text)) == target:
            return text
    return repr(value)


def _is_binary(col: ModelColumn) -> bool:
    return col.type_code == TypeCode.BIT or (col.type.binary and col.type_code in (
        TypeCode.VARCHAR, TypeCode.VAR_STRING, TypeCode.STRING, TypeCode.TINYBLOB, TypeCode.BLOB,
        TypeCode.MEDIUMBLOB, TypeCode.LONGBLOB))


def _render(col: ModelColumn, value: Any) -> tuple[str, bytes] | None:
    """``None`` for NULL, else (kind, bytes): kind ``num`` (bare), ``bin`` (binary column) or ``str``."""
    if value is None:
        return None
    tc = col.type_code
    if tc == TypeCode.BIT:
        width = max(1, ((col.type.length or 1) + 7) // 8)
        return "bin", int(value).to_bytes(width, "big")
    if tc in (TypeCode.ENUM, TypeCode.SET):
        return "str", str(_as_label(col, value)).encode()
    if tc == TypeCode.FLOAT:
        return "num", _float32_text(float(value)).encode()
    if tc == TypeCode.DOUBLE:
        return "num", repr(float(value)).encode()
    if tc in _NUMBER_TYPES:
        return "num", str(value).encode()
    if _is_binary(col):
        return "bin", bytes(value)
    return "str", str(value).encode("utf-8")


def _escape_csv(raw: bytes, dialect: CsvDialect) -> bytes:
    delim = dialect.delimiter.encode()
    if dialect.escape_backslash:
        special = delim[:1] or dialect.separator.encode()[:1]
        out = bytearray()
        for b in raw:
            c = bytes([b])
            if c == b"\x00":
                out += b"\\0"
            elif c == b"\r":
                out += b"\\r"
            elif c == b"\n":
                out += b"\\n"
            elif c == b"\\":
                out += b"\\\\"
            elif c == special:
                out += b"\\" + c
            else:
                out += c
        return bytes(out)
    if delim:
        return raw.replace(delim, delim + delim)
    return raw


def _csv_field(rendered: tuple[str, bytes] | None, dialect: CsvDialect) -> bytes:
    if rendered is None:
        return dialect.null_value.encode()
    kind, raw = rendered
    if kind == "num":
        return raw
    delim = dialect.delimiter.encode()
    if kind == "bin" and dialect.binary_format == "hex":
        body = raw.hex().encode()
    elif kind == "bin" and dialect.binary_format == "base64":
        body = base64.b64encode(raw)
    else:
        body = _escape_csv(raw, dialect)
    return delim + body + delim


_SQL_ESCAPES = {0: b"\\0", 10: b"\\n", 13: b"\\r", 92: b"\\\\", 39: b"\\'", 34: b'\\"', 26: b"\\Z"}


def _sql_value(rendered: tuple[str, bytes] | None) -> bytes:
    if rendered is None:
        return b"NULL"
    kind, raw = rendered
    if kind == "num":
        return raw
    if kind == "bin":
        return b"x'" + raw.hex().encode() + b"'"
    return b"'" + b"".join(_SQL_ESCAPES.get(b, bytes([b])) for b in raw) + b"'"


def show_create_table(t: ModelTable) -> str:
    """The table's ``SHOW CREATE TABLE`` text, as Dumpling writes it into ``{db}.{table}-schema.sql``."""
    lines = []
    for col in t.columns:
        text = f"  {quote_ident(col.name)} {col.mysql_type}"
        if not col.nullable:
            text += " NOT NULL"
        if col.auto_increment:
            text += " AUTO_INCREMENT"
        if col.default is not None:
            text += f" DEFAULT {col.default}"
        lines.append(text)
    if t.primary_key:
        lines.append(f"  PRIMARY KEY ({','.join(quote_ident(c) for c in t.primary_key)})")
    for name, cols in t.unique_keys.items():
        lines.append(f"  UNIQUE KEY {quote_ident(name)} ({','.join(quote_ident(c) for c in cols)})")
    body = ",\n".join(lines)
    return (f"/*!40101 SET NAMES binary*/;\nCREATE TABLE {quote_ident(t.table)} (\n{body}\n) "
            "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;\n")


def _chunks(rows: list[Any], size: int) -> Iterable[list[Any]]:
    if not rows:
        yield []
        return
    for i in range(0, len(rows), size):
        yield rows[i : i + size]


def write_dumpling_export(
    scenario: Scenario,
    directory: str | Path,
    *,
    filetype: str = "csv",
    dialect: CsvDialect = CsvDialect(),
    rows_per_file: int = 1000,
    compress: bool = False,
    line_terminator: str = "\r\n",
) -> int:
    """Write the scenario's tables as they are now as a Dumpling export in ``directory``; returns the
    snapshot TSO (the scenario's last commit ts).

    Raises:
        ValueError: an unknown ``filetype`` or ``rows_per_file`` < 1.
    """
    if filetype not in ("csv", "sql"):
        raise ValueError(f"filetype must be csv or sql, got {filetype!r}")
    if rows_per_file < 1:
        raise ValueError(f"rows_per_file must be >= 1, got {rows_per_file}")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tso = scenario.last_ts
    started = datetime.fromtimestamp((tso >> 18) / 1000.0, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    terminator = line_terminator.encode()
    schemas = sorted({t.schema for t in scenario.tables.values()})
    for db in schemas:
        (out / f"{db}-schema-create.sql").write_text(
            f"/*!40101 SET NAMES binary*/;\nCREATE DATABASE {quote_ident(db)} /*!40100 DEFAULT CHARACTER SET utf8mb4 */;\n"
        )
    for (_, _), t in sorted(scenario.tables.items()):
        (out / f"{t.schema}.{t.table}-schema.sql").write_text(show_create_table(t))
        for index, chunk in enumerate(_chunks(t.rows, rows_per_file)):
            rendered = [[_render(c, row[c.name]) for c in t.columns] for row in chunk]
            if filetype == "csv":
                lines = []
                if dialect.header:
                    lines.append(dialect.separator.encode().join(
                        _csv_field(("str", c.name.encode()), dialect) for c in t.columns))
                lines += [dialect.separator.encode().join(_csv_field(v, dialect) for v in row) for row in rendered]
                data = b"".join(line + terminator for line in lines)
            else:
                data = b"/*!40101 SET NAMES binary*/;\n/*!40014 SET FOREIGN_KEY_CHECKS=0*/;\n"
                if rendered:
                    data += b"INSERT INTO " + quote_ident(t.table).encode() + b" VALUES\n"
                    data += b",\n".join(b"(" + b",".join(_sql_value(v) for v in row) + b")" for row in rendered)
                    data += b";\n"
            name = f"{t.schema}.{t.table}.{index:09d}.{filetype}"
            if compress:
                data, name = gzip.compress(data, mtime=0), name + ".gz"
            (out / name).write_bytes(data)
    (out / "metadata").write_text(
        f"Started dump at: {started}\nSHOW MASTER STATUS:\n\tLog: tidb-binlog\n\tPos: {tso}\n\tGTID:\n\n"
        f"Finished dump at: {started}\n"
    )
    return tso
