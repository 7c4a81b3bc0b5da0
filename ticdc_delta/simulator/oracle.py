"""The oracle: the final state of every table that a correct consumer of the stream must end with.

It is the upstream's true final state (:class:`~.workload.Workload`), in the values a correct consumer
of *that protocol* decodes: ENUM as the member label for Avro, the 1-based index otherwise (model
docstring, :mod:`ticdc_delta.codec.model`). Columns added by ``ADD COLUMN`` are present in every row,
NULL where the row was not written since.

JSON form (``oracle.json``), exactly reversible with :func:`load_oracle`::

    {"format": 1, "protocol": ..., "options": {...}, "seed": ..., "partitions": ..., "topic": ...,
     "tables": {"s1.t1": {"schema": "s1", "table": "t1", "key": ["id"],
                          "columns": [{"name", "type", "flags", "mysql_type", "precision", "scale",
                                       "enum_members"}, ...],
                          "rows": [{"id": 1, ...}, ...]}},            # sorted by key slot
     "ddl": [{"commit_ts", "schema", "table", "query", "ddl_type"}, ...],   # upstream order
     "counts": {...}}                                                # see simulate()

Values: integers are exact JSON integers (BIGINT UNSIGNED up to 18446744073709551615), floats JSON
numbers written as the shortest round-trip text, ``None`` is ``null``, bytes ``{"base64": "..."}``,
everything else a string — the ``decode`` CLI's value form (:mod:`ticdc_delta.codec.json_output`).
"""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass, field
from typing import Any, Iterable

import orjson

from ..codec.json_output import value_to_json
from .workload import ColumnSpec, Workload

__all__ = ["Oracle", "OracleColumn", "TableOracle", "build_oracle", "load_oracle", "FORMAT_VERSION"]

FORMAT_VERSION = 1


@dataclass(frozen=True)
class OracleColumn:
    """A column of an expected table: name, TiCDC type code, flags, MySQL type and its parameters."""

    name: str
    type: int
    flags: int
    mysql_type: str
    precision: int | None = None
    scale: int | None = None
    enum_members: tuple[str, ...] | None = None

    @classmethod
    def from_spec(cls, spec: ColumnSpec) -> "OracleColumn":
        return cls(spec.name, spec.type_code, int(spec.flags), spec.mysql_type, spec.precision, spec.scale,
                   spec.enum_members)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "type": self.type, "flags": self.flags, "mysql_type": self.mysql_type,
            "precision": self.precision, "scale": self.scale,
            "enum_members": list(self.enum_members) if self.enum_members is not None else None,
        }


@dataclass
class TableOracle:
    """The expected final state of one table."""

    schema: str
    table: str
    key: tuple[str, ...]
    columns: list[OracleColumn]
    rows: list[dict[str, Any]]

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    def rows_by_key(self) -> dict[tuple[Any, ...], dict[str, Any]]:
        """``{key values: row}``, the key values in :attr:`key` order."""
        return {tuple(r[k] for k in self.key): r for r in self.rows}


@dataclass
class Oracle:
    """Expected final tables plus what the stream held (counts, DDL, settings)."""

    protocol: str
    options: dict[str, str]
    seed: int
    partitions: int
    tables: dict[str, TableOracle]
    ddl: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, Any] = field(default_factory=dict)
    topic: str | None = None

    def to_json_object(self) -> dict[str, Any]:
        """The JSON-safe object (see the module docstring)."""
        return {
            "format": FORMAT_VERSION,
            "protocol": self.protocol,
            "options": dict(self.options),
            "seed": self.seed,
            "partitions": self.partitions,
            "topic": self.topic,
            "tables": {
                name: {
                    "schema": t.schema,
                    "table": t.table,
                    "key": list(t.key),
                    "columns": [c.to_json() for c in t.columns],
                    "rows": [{k: value_to_json(v) for k, v in r.items()} for r in t.rows],
                }
                for name, t in self.tables.items()
            },
            "ddl": list(self.ddl),
            "counts": self.counts,
        }

    def to_json_bytes(self) -> bytes:
        """The oracle as JSON (orjson: exact big integers, shortest round-trip floats)."""
        return orjson.dumps(self.to_json_object(), option=orjson.OPT_INDENT_2)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the oracle to ``path`` (written to a temporary name, then renamed).

        Raises:
            OSError: the file cannot be written.
        """
        tmp = f"{os.fspath(path)}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(self.to_json_bytes())
        os.replace(tmp, path)


def build_oracle(workload: Workload, protocol: str, options: dict[str, str], seed: int, partitions: int,
                 *, enum_as_label: bool, ddl: Iterable[dict[str, Any]] = (), counts: dict[str, Any] | None = None,
                 topic: str | None = None) -> Oracle:
    """The oracle of a finished workload, in the values a consumer of ``protocol`` decodes."""
    tables: dict[str, TableOracle] = {}
    for i, spec in enumerate(workload.tables):
        if not workload.created[i]:
            continue
        names = [c.name for c in spec.columns]
        enum_pos = [(j, c.enum_members) for j, c in enumerate(spec.columns)
                    if enum_as_label and c.enum_members is not None]
        rows = []
        for values in workload.final_rows(i):
            if enum_pos:
                lv = list(values)
                for j, members in enum_pos:
                    if lv[j] is not None:
                        lv[j] = members[lv[j] - 1]  # type: ignore[index]
                values = tuple(lv)
            rows.append(dict(zip(names, values)))
        tables[spec.qualified] = TableOracle(spec.schema, spec.table, spec.key_names,
                                             [OracleColumn.from_spec(c) for c in spec.columns], rows)
    return Oracle(protocol, dict(options), seed, partitions, tables, list(ddl), dict(counts or {}), topic)


def _value_from_json(v: Any, where: str) -> Any:
    if isinstance(v, dict):
        if set(v) != {"base64"} or not isinstance(v["base64"], str):
            raise ValueError(f"{where}: expected {{\"base64\": ...}} for bytes, got {sorted(v)}")
        try:
            return base64.b64decode(v["base64"], validate=True)
        except binascii.Error as exc:
            raise ValueError(f"{where}: bad base64: {exc}") from None
    if isinstance(v, list):
        raise ValueError(f"{where}: a column value cannot be a JSON array")
    return v


def load_oracle(path: str | os.PathLike[str]) -> Oracle:
    """Read an oracle written by :meth:`Oracle.save`, with canonical Python values again.

    Raises:
        OSError: the file cannot be read.
        ValueError: the file is not an oracle of this format (says which field).
    """
    with open(path, "rb") as fh:
        try:
            obj = orjson.loads(fh.read())
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"{os.fspath(path)}: not JSON: {exc}") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT_VERSION:
        raise ValueError(f"{os.fspath(path)}: not an oracle of format {FORMAT_VERSION}")
    try:
        tables = {}
        for name, t in obj["tables"].items():
            columns = [
                OracleColumn(c["name"], c["type"], c["flags"], c["mysql_type"], c.get("precision"),
                             c.get("scale"),
                             tuple(c["enum_members"]) if c.get("enum_members") is not None else None)
                for c in t["columns"]
            ]
            rows = [{k: _value_from_json(v, f"{name}.{k}") for k, v in r.items()} for r in t["rows"]]
            tables[name] = TableOracle(t["schema"], t["table"], tuple(t["key"]), columns, rows)
        return Oracle(obj["protocol"], dict(obj["options"]), obj["seed"], obj["partitions"], tables,
                      list(obj.get("ddl", [])), dict(obj.get("counts", {})), obj.get("topic"))
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{os.fspath(path)}: malformed oracle: {type(exc).__name__}: {exc}") from None
