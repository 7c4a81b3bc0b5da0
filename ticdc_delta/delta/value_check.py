"""Find the row changes whose values no Delta column can hold, before anything of the batch is written.

A value TiDB cannot hold either (a DATE ``2024-13-45``, a DECIMAL with more digits than its
``(p, s)``, an integer beyond 64 bits, a BIT wider than 64 bits, text with a lone surrogate, a column
name with NUL) reaches the job only from a corrupt or forged message. Without this check it would fail
the Delta conversion of its whole micro-batch, on every re-run, forever.

:class:`ValueScreen` is the planner's record screen (:func:`~ticdc_delta.core.batch_planner.plan_batch`):
it sees the released row changes in apply order, before they are collapsed per key, and keeps those
whose every value converts (:func:`~ticdc_delta.delta.arrow_types.converter_for`, the applier's own
conversion). A change with a value that does not is dropped whole and recorded as a :class:`Rejection`
(its coordinates, table, column, value and why); the job sends rejections to the dead-letter table, or
stops under ``dead_letter.fail_on_error``. The other changes of the same key apply in order, as if the
dropped one had never come: an update dropped after an insert leaves the inserted row.

The decision depends only on the records, the type parameters known at the start of the batch and the
source time zone, so a re-run of a crashed batch rejects exactly the same changes. A DDL applied in the
batch may change a table's DECIMAL precision and scale; DECIMAL values of that table after the DDL are
then checked only for being decimal numbers, and their exact ``(p, s)`` fit is left to the MERGE (a
value that does not fit there stops the batch with an error naming the table and column).

:class:`Rejection` is the general "this record is refused for this reason" shape: anything that must
keep a record out of the tables (an unwritable value, a table name no location can hold) can produce
one, and the job dead-letters them together in one append.
"""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, Iterable, NamedTuple, Sequence

from ..codec.model import TypeCode
from ..core.records import ChangeRecord, DDLRecord
from ..errors import SinkError, preview
from .arrow_types import TypeParams, converter_for

__all__ = ["Rejection", "ValueScreen", "column_name_problem", "describe_rejections", "value_bytes"]

_DECIMAL = int(TypeCode.DECIMAL)
_LABELS = frozenset({int(TypeCode.ENUM), int(TypeCode.SET)})


class Rejection(NamedTuple):
    """A record kept out of the tables: where it came from, what in it was wrong, and the record.

    ``column`` is ``None`` when the whole record is refused (not one of its values); ``value`` is the
    offending value as decoded (kept whole for the dead-letter table).
    """

    topic: str
    partition: int
    offset: int
    idx: int
    schema: str
    table: str
    column: str | None
    value: Any
    error: str
    record: ChangeRecord | None = None

    def where(self) -> str:
        """``topic[partition]@offset schema.table.column`` for messages."""
        col = "" if self.column is None else f" column {preview(self.column, 60)}"
        return (f"{self.topic}[{self.partition}]@{self.offset} table {preview(self.schema, 60)}."
                f"{preview(self.table, 60)}{col}")


def column_name_problem(name: Any) -> str | None:
    """Why ``name`` cannot be a Delta column name, or ``None``.

    MySQL identifiers are never empty and never hold NUL; a lone surrogate is not text at all.
    """
    if not isinstance(name, str):
        return f"a column name must be text, got {type(name).__name__}"
    if not name:
        return "an empty column name"
    if "\x00" in name:
        return "a column name with a NUL character"
    if not name.isascii():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            return "a column name with a lone surrogate"
    return None


def value_bytes(value: Any) -> bytes | None:
    """The full offending value as bytes for the dead-letter table: bytes as they are, text as UTF-8
    (a lone surrogate kept with ``surrogatepass``), anything else as its ``str``."""
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    text = value if isinstance(value, str) else str(value)
    return text.encode("utf-8", "surrogatepass")


def describe_rejections(rejections: Sequence[Rejection], limit: int = 5) -> str:
    """One line per rejection (at most ``limit``), each naming coordinates, table, column and error."""
    lines = [f"{r.where()}: {r.error}" for r in rejections[:limit]]
    if len(rejections) > limit:
        lines.append(f"… and {len(rejections) - limit} more")
    return "; ".join(lines)


def _is_decimal_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, Decimal):
        return value.is_finite()
    if not isinstance(value, str):
        return False
    try:
        return Decimal(value).is_finite()
    except (InvalidOperation, ValueError):
        return False


class ValueScreen:
    """The planner's record screen: drops row changes with a value no Delta column can hold.

    Args:
        params: ``(schema, table, column) -> TypeParams | None``, the type parameters known at the
            start of the batch (the applier's :class:`~ticdc_delta.delta.applier.TableCatalog`).
        source_timezone: the zone TIMESTAMP text is read in.
        table_problem: optional ``(schema, table) -> reason or None``: refuse every change of a table
            for that reason (e.g. a name no location can hold).

    After planning, :attr:`rejections` holds what was dropped, in apply order.
    """

    def __init__(
        self,
        params: Callable[[str, str, str], TypeParams | None],
        source_timezone: str = "UTC",
        *,
        table_problem: Callable[[str, str], str | None] | None = None,
    ) -> None:
        if not callable(params):
            raise TypeError(f"params must be callable, got {type(params).__name__}")
        self._params = params
        self._tz = source_timezone
        self._table_problem = table_problem
        self._changed_schemas: set[str] = set()
        self.rejections: list[Rejection] = []

    def ddl(self, record: DDLRecord) -> None:
        """A DDL comes before the next rows: type parameters of its table may change from here on."""
        # The statement is not parsed here (RENAME TABLE and CREATE TABLE ... LIKE name other tables
        # than the record's): any table of the schema may have new parameters after it.
        self._changed_schemas.add(record.schema)

    def rows(self, records: Iterable[ChangeRecord]) -> list[ChangeRecord]:
        """The changes of ``records`` whose every value converts; the others become rejections."""
        kept: list[ChangeRecord] = []
        for rec in records:
            found = self.check(rec)
            if found is None:
                kept.append(rec)
            else:
                self.rejections.append(found)
        return kept

    def check(self, rec: ChangeRecord) -> Rejection | None:
        """The rejection of ``rec``, or ``None`` when all of it can be written."""
        if self._table_problem is not None:
            reason = self._table_problem(rec.schema, rec.table)
            if reason:
                return self._reject(rec, None, None, reason)
        changed = rec.schema in self._changed_schemas
        for image in (rec.new, rec.old):
            if not image:
                continue
            for name, type_code, flags, value in image:
                problem = column_name_problem(name)
                if problem is not None:
                    return self._reject(rec, name, name, problem)
                if value is None:
                    continue
                try:
                    if type_code == _DECIMAL:
                        if not _is_decimal_number(value):
                            raise SinkError(f"cannot write {preview(value)} as a DECIMAL (not a decimal number)")
                        if changed:
                            continue
                    params = (
                        self._params(rec.schema, rec.table, name)
                        if type_code == _DECIMAL or type_code in _LABELS else None
                    )
                    converter_for(type_code, flags, params, self._tz)(value)
                except SinkError as exc:
                    return self._reject(rec, name, value, str(exc))
        return None

    @staticmethod
    def _reject(rec: ChangeRecord, column: str | None, value: Any, error: str) -> Rejection:
        return Rejection(rec.topic, rec.partition, rec.offset, rec.idx, rec.schema, rec.table, column, value,
                         error, rec)
