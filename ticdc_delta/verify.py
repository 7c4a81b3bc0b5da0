"""Compare Delta tables with a simulator oracle (used by ``make demo``, the tests and the benchmarks).

Both sides are compared in Delta's value space: each expected (model) value goes through the same
conversion the job uses to write it (:func:`~ticdc_delta.delta.arrow_types.converter_for`), so the check
is exact — decimals as decimals, timestamps as instants, bytes as bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .delta.arrow_types import TypeParams, converter_for
from .delta.sink import TableIdent, TableSink
from .simulator.oracle import Oracle, TableOracle

__all__ = ["TableDiff", "compare_with_oracle"]


@dataclass
class TableDiff:
    """How one Delta table differs from its oracle (empty lists: it matches)."""

    name: str
    expected_rows: int
    actual_rows: int
    missing: list[Any] = field(default_factory=list)
    unexpected: list[Any] = field(default_factory=list)
    different: list[tuple[Any, dict[str, tuple[Any, Any]]]] = field(default_factory=list)
    missing_columns: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.different or self.missing_columns)

    def describe(self, limit: int = 3) -> str:
        if self.ok:
            return f"{self.name}: {self.actual_rows} rows match"
        parts = [f"{self.name}: expected {self.expected_rows} rows, found {self.actual_rows}"]
        if self.missing_columns:
            parts.append(f"missing columns {self.missing_columns}")
        if self.missing:
            parts.append(f"{len(self.missing)} missing keys, e.g. {self.missing[:limit]}")
        if self.unexpected:
            parts.append(f"{len(self.unexpected)} unexpected keys, e.g. {self.unexpected[:limit]}")
        if self.different:
            parts.append(f"{len(self.different)} rows differ, e.g. {self.different[:limit]}")
        return "; ".join(parts)


def _expected(t: TableOracle, tz: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    converters = {}
    for c in t.columns:
        params = TypeParams(c.precision, c.scale, c.enum_members, None)
        converters[c.name] = converter_for(c.type, int(c.flags), params, tz)
    out = {}
    for row in t.rows:
        conv = {n: (None if v is None else converters[n](v)) for n, v in row.items() if n in converters}
        out[tuple(conv[k] for k in t.key)] = conv
    return out


def _compare_table(sink: TableSink, t: TableOracle, tz: str) -> TableDiff:
    expected = _expected(t, tz)
    ident = TableIdent(t.schema, t.table)
    if sink.table_schema(ident) is None:
        return TableDiff(t.qualified, len(expected), 0, missing=list(expected))
    data = sink.read(ident)
    have = {n.lower(): n for n in data.column_names}
    diff = TableDiff(t.qualified, len(expected), data.num_rows)
    diff.missing_columns = [c.name for c in t.columns if c.name.lower() not in have]
    if diff.missing_columns:
        return diff
    cols = {c.name: data.column(have[c.name.lower()]).to_pylist() for c in t.columns}
    actual: dict[tuple[Any, ...], dict[str, Any]] = {}
    for i in range(data.num_rows):
        row = {name: values[i] for name, values in cols.items()}
        key = tuple(row[k] for k in t.key)
        if key in actual:
            diff.unexpected.append(key)  # a duplicate key is as wrong as an extra row
        actual[key] = row
    for key, want in expected.items():
        got = actual.get(key)
        if got is None:
            diff.missing.append(key)
            continue
        delta = {n: (want.get(n), got.get(n)) for n in cols if want.get(n) != got.get(n)}
        if delta:
            diff.different.append((key, delta))
    diff.unexpected.extend(k for k in actual if k not in expected)
    return diff


def compare_with_oracle(sink: TableSink, oracle: Oracle, *, tz: str = "UTC") -> list[TableDiff]:
    """One :class:`TableDiff` per oracle table, in name order."""
    return [_compare_table(sink, oracle.tables[name], tz) for name in sorted(oracle.tables)]
