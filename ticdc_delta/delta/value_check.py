"""Find the row changes whose values no Delta column can hold, before anything of the batch is written.

A value TiDB cannot hold either (a DATE ``2024-13-45``, a DECIMAL with more digits than its
``(p, s)``, an integer beyond 64 bits, a BIT wider than 64 bits, text with a lone surrogate, a column
name with NUL) reaches the job only from a corrupt or forged message. So does a MySQL zero or invalid
date (``0000-00-00``, ``2024-02-30``: written as null elsewhere) in a NOT NULL key column: as null it would
identify no row, and rows of different keys would merge into one. Without this check it would fail
the Delta conversion of its whole micro-batch, on every re-run, forever.

:class:`ValueScreen` is the planner's record screen (:func:`~ticdc_delta.core.batch_planner.plan_batch`):
it sees the released row changes in apply order, before they are collapsed per key, and keeps those
whose every value converts (:func:`~ticdc_delta.delta.arrow_types.converter_for`, the applier's own
conversion). A change with a value that does not is dropped whole and recorded as a :class:`Rejection`
(its coordinates, table, column, value and why); the job sends rejections to the dead-letter table, or
stops under ``dead_letter.fail_on_error``. The other changes of the same key apply in order, as if the
dropped one had never come: an update dropped after an insert leaves the inserted row.

The decision depends only on the records, the type parameters known at the start of the batch (the
job's :class:`~ticdc_delta.delta.applier.TableCatalog`, from its state) and the source time zone, so a
re-run of a crashed batch rejects exactly the same changes. DDL of the batch change type parameters
between its rows (``CREATE TABLE`` with a ``DECIMAL(5,2)`` and its first rows in one batch is common): the
screen follows them on its own copy of the catalog, as the DDL replay will (same parser, same policies).
Where it cannot (a DDL it cannot parse, ``DROP DATABASE``), DECIMAL values of that schema are from then on
checked only for being decimal numbers, and their exact ``(p, s)`` fit is left to the MERGE (a value that
does not fit there stops the batch with an error naming the table and column).

:class:`Rejection` is the general "this record is refused for this reason" shape: anything that must
keep a record out of the tables (an unwritable value, a table name no location can hold) can produce
one, and the job dead-letters them together in one append.
"""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation
from operator import itemgetter
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import pyarrow as pa

from ..codec.model import ColumnFlag, TypeCode
from ..core.records import ChangeRecord, DDLRecord
from ..errors import SinkError, preview
from .applier import TableCatalog
from .arrow_types import _to_int64, _to_text_decimal, arrow_type_for, common_type, converter_for
from .column_convert import DECIMAL, DECIMAL_TEXT, INT, convert_column, kind_of, register

__all__ = ["Rejection", "ValueScreen", "column_name_problem", "describe_rejections", "value_bytes"]

_DECIMAL = int(TypeCode.DECIMAL)
_UNSIGNED = int(ColumnFlag.UNSIGNED)
_INT_BITS = {int(TypeCode.TINYINT): 8, int(TypeCode.SMALLINT): 16, int(TypeCode.MEDIUMINT): 24, int(TypeCode.INT): 32}
_LABELS = frozenset({int(TypeCode.ENUM), int(TypeCode.SET)})
_DATES = frozenset({int(TypeCode.DATE), int(TypeCode.NEWDATE), int(TypeCode.DATETIME), int(TypeCode.TIMESTAMP)})
_KEY = int(ColumnFlag.HANDLE_KEY | ColumnFlag.PRIMARY_KEY | ColumnFlag.UNIQUE_KEY)
_NULLABLE = int(ColumnFlag.NULLABLE)
_COLUMN = itemgetter(0, 1, 2)


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


def _in_range(convert: Callable[[Any], Any], type_code: int, bits: int, unsigned: bool) -> Callable[[Any], Any]:
    """``convert``, refusing integers beyond the MySQL column's range: Delta stores every integer as a
    long, but a TINYINT holding 300 is corrupt input."""
    lo, hi = (0, (1 << bits) - 1) if unsigned else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    what = f"{'unsigned ' if unsigned else ''}{TypeCode(type_code).name} ({lo}..{hi})"

    def check(value: Any) -> Any:
        v = convert(value)
        if v is not None and not lo <= v <= hi:
            raise SinkError(f"cannot write {preview(value)} as a {what}")
        return v

    return register(check, (INT, lo, hi)) if convert is _to_int64 else check


def _as_decimal_text(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``convert`` of a DECIMAL stored as text, refusing text that is not a decimal number."""

    def check(value: Any) -> Any:
        _decimal_number(value)
        return convert(value)

    return register(check, (DECIMAL_TEXT,)) if convert is _to_text_decimal else check


def _key_value(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A NOT NULL key column's check: a value the table would hold as null (a zero or invalid date) is
    refused. Written as null, it would identify no row: the rows of distinct upstream keys would merge into
    one (a later one replacing an earlier one, one delete removing both)."""

    def check(value: Any) -> Any:
        out = convert(value)
        if out is None:
            raise SinkError(f"key column value {preview(value)} has no Delta value (a zero or invalid date is "
                            "written as null, and a null key would merge rows of different keys)")
        return out

    return check


def _fits(convert: Callable[[Any], Any], target: pa.DataType, into: pa.DataType) -> Callable[[Any], Any]:
    """``convert``, refusing values the MERGE could not cast from ``target`` to the table's ``into``."""

    def check(value: Any) -> Any:
        converted = convert(value)
        if converted is None:
            return None
        try:
            pa.array([converted], type=target).cast(into)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OverflowError, ValueError):
            raise SinkError(
                f"cannot write {preview(value)} into the Delta table's {into} column (the table kept that "
                f"type: a type-changing DDL was ignored or never seen)"
            ) from None
        return converted

    return check


def _plain(t: pa.DataType) -> pa.DataType:
    """Delta reads strings and bytes back as large / view types; they hold the same values."""
    if t in (pa.large_string(), pa.string_view()):
        return pa.string()
    if t in (pa.large_binary(), pa.binary_view()):
        return pa.binary()
    return t


def _fold(name: str) -> str:
    from ..locations import fold_name

    return fold_name(name)


def _decimal_number(value: Any) -> None:
    if not _is_decimal_number(value):
        raise SinkError(f"cannot write {preview(value)} as a DECIMAL (not a decimal number)")


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
        catalog: the type parameters known at the start of the batch (copied: DDL of the batch change
            the copy, never the job's catalog).
        source_timezone: the zone TIMESTAMP text is read in.
        ddl_policy: ``DDL class -> policy`` (the job's ``ddl:`` section); a DDL whose policy is not
            ``evolve`` changes no type parameter. ``None``: every DDL evolves.
        case_sensitive: the job's ``case_sensitive``; names in DDL text are folded as the replay folds them.
        table_problem: optional ``(schema, table) -> reason or None``: refuse every change of a table
            for that reason (e.g. a name no location can hold).
        delta_type: optional ``(schema, table, column) -> Arrow type or None``, the type of the column in
            the existing Delta table. A value whose Delta type differs from the table's, and that the
            MERGE cannot cast to it (the table kept its type because a DDL was ignored: a BIGINT
            column, a DOUBLE value ``1.5``), is refused too. Give it only for a batch without DDL (records
            nor held) and screen such a batch in one :meth:`rows` call: a re-run after a crash may see
            tables the first attempt changed, and must still decide the same (a column with two types in
            the batch is therefore not checked against the table).

    After planning, :attr:`rejections` holds what was dropped, in apply order.
    """

    def __init__(
        self,
        catalog: TableCatalog,
        source_timezone: str = "UTC",
        *,
        ddl_policy: Callable[[str], str] | None = None,
        case_sensitive: bool = False,
        table_problem: Callable[[str, str], str | None] | None = None,
        delta_type: Callable[[str, str, str], pa.DataType | None] | None = None,
    ) -> None:
        if not isinstance(catalog, TableCatalog):
            raise TypeError(f"catalog must be a TableCatalog, got {type(catalog).__name__}")
        self._catalog = TableCatalog(catalog.to_json())
        self._params = self._catalog.params
        self._tz = source_timezone
        self._policy = ddl_policy
        self._delta_type = delta_type
        self._case_sensitive = case_sensitive
        self._table_problem = table_problem
        self._changed_schemas: set[str] = set()
        self._checks: dict[tuple[Any, ...], Any] = {}
        self._layouts: dict[tuple[Any, ...], list[Any]] = {}
        self._screening: list[ChangeRecord] = []
        self.rejections: list[Rejection] = []

    def ddl(self, record: DDLRecord) -> None:
        """A DDL comes before the next rows: follow what it does to type parameters."""
        self._checks.clear()
        self._layouts.clear()
        from ..schema import ddl as d
        from .ddl_replay import column_params

        try:
            changes = d.parse_ddl(record.query, default_schema=record.schema, ddl_type=record.ddl_type)
        except Exception:  # noqa: BLE001 - the replay reports it; here: parameters unknown from now on
            self._changed_schemas.add(record.schema)
            return
        fold = (lambda n: n) if self._case_sensitive else _fold
        cat = self._catalog
        for change in changes:
            cls = d.ddl_class(change)
            if cls == "unknown" or isinstance(change, d.DropDatabase):
                self._changed_schemas.add(fold(getattr(change, "name", record.schema)))
                continue
            if self._policy is not None and self._policy(cls) != "evolve":
                continue
            schema, table = fold(getattr(change, "schema", record.schema)), fold(getattr(change, "table", "") or "")
            if isinstance(change, d.CreateTable):
                if change.like is not None:
                    cat.copy_table((fold(change.like[0]), fold(change.like[1])), (schema, table))
                for col in change.columns:
                    cat.set_params(schema, table, col.name, column_params(col))
            elif isinstance(change, d.AddColumns):
                for col in change.columns:
                    cat.set_params(schema, table, col.name, column_params(col))
            elif isinstance(change, d.ModifyColumn):
                cat.set_params(schema, table, change.column.name, column_params(change.column))
            elif isinstance(change, d.DropColumn):
                cat.drop_column(schema, table, change.name)
            elif isinstance(change, d.RenameColumn):
                cat.rename_column(schema, table, change.old, change.new)
            elif isinstance(change, d.RenameTable):
                cat.rename_table((schema, table), (fold(change.new_schema), fold(change.new_table)))
            elif isinstance(change, d.DropTable):
                cat.drop_table(schema, table)

    def rows(self, records: Iterable[ChangeRecord]) -> list[ChangeRecord]:
        """The changes of ``records`` whose every value converts; the others become rejections."""
        kept: list[ChangeRecord] = []
        self._screening = records = list(records)
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
        schema, table = rec.schema, rec.table
        for image in (rec.new, rec.old):
            if not image:
                continue
            # the checks of an image's columns, looked up once per layout (the images of a table share a few)
            layout = (schema, table, tuple(map(_COLUMN, image)))
            checks = self._layouts.get(layout)
            if checks is None:
                checks = self._layouts[layout] = [self._column_check(schema, table, c[0], c[1], c[2]) for c in image]
            for check, column in zip(checks, image):
                if check.__class__ is str:
                    return self._reject(rec, column[0], column[0], check)
                value = column[3]
                if value is None:
                    continue
                try:
                    check(value)
                except SinkError as exc:
                    return self._reject(rec, column[0], value, str(exc))
        return None

    def images_converter(
        self, schema: str, table: str, columns: Sequence[tuple[str, int, int]], types: Sequence[pa.DataType],
    ) -> Callable[[Sequence[tuple]], tuple[list[pa.Array], dict[int, SinkError]]]:
        """For a table whose every image lists a prefix of ``columns`` (``(name, type code, flags)``): a
        function from images (each as its values alone) to the table's Delta columns as the MERGE writes
        them — Arrow arrays of ``types``, an image's missing columns null — and the images :meth:`check`
        refuses, by position, each with the first error found (the caller drops their values). The columnar
        path's screen and conversion, without working out each image's layout.

        It converts a column at a time. A column whose values Arrow converts exactly as the checks would
        (:func:`~.column_convert.convert_column`: ints in range, plain text, TiDB's date text, ...) costs
        one Arrow call; any other column is converted value by value by the screen's checks, which convert
        as they check (:func:`~.arrow_types.converter_for` of each value).

        Raises:
            SinkError: here, when the function is built: a DECIMAL column whose type parameters a DDL the
                screen could not follow made unknown (only a batch that applies DDL has one; its values
                only the MERGE converts).
        """
        checks = [self._column_check(schema, table, name, t, f) for name, t, f in columns]
        if any(check is _decimal_number for check in checks):
            raise SinkError(f"{schema}.{table}: DECIMAL type parameters unknown until the DDL replay")
        problem = self._table_problem(schema, table) if self._table_problem is not None else None
        refused = -1 if problem else next((i for i, c in enumerate(checks) if c.__class__ is str), len(checks))
        kinds = [kind_of(check) for check in checks]
        width = len(columns)
        pad = (None,) * width

        def convert(images: Sequence[tuple]) -> tuple[list[pa.Array], dict[int, SinkError]]:
            failed = {i: SinkError(f"{schema}.{table}: refused") for i, image in enumerate(images)
                      if len(image) > refused} if refused < width else {}
            if refused < 0:
                return [pa.nulls(len(images), t) for t in types], failed
            full = [image if len(image) == width else (*image, *pad[len(image):]) for image in images]
            arrays = []
            for check, kind, target, values in zip(checks, kinds, types, zip(*full) if full else [()] * width):
                if check.__class__ is str:  # a column that cannot be written: its images failed above
                    arrays.append(pa.nulls(len(images), target))
                    continue
                array = convert_column(kind, values, target) if kind is not None else None
                if array is None:
                    out: list[Any] = []
                    for i, value in enumerate(values):
                        if value is None:
                            out.append(None)
                            continue
                        try:
                            out.append(check(value))  # type: ignore[operator]
                        except SinkError as exc:
                            failed.setdefault(i, exc)
                            out.append(None)
                    array = pa.array(out, type=target)
                arrays.append(array)
            return arrays, failed

        return convert

    def _column_check(self, schema: str, table: str, name: Any, type_code: int, flags: int) -> Callable[[Any], Any] | str:
        key = (schema, table, name, type_code, flags)
        check = self._checks.get(key)
        if check is None:
            check = self._checks[key] = self._check_for(schema, table, name, type_code, flags)
        return check

    def _check_for(self, schema: str, table: str, name: Any, type_code: int, flags: int) -> Callable[[Any], Any] | str:
        """The check of one column's values (a function raising SinkError), or why the column itself
        cannot be written (a str). Cached per column until the next DDL."""
        problem = column_name_problem(name)
        if problem is not None:
            return problem
        if type_code == _DECIMAL and schema in self._changed_schemas:
            return _decimal_number
        params = self._params(schema, table, name) if type_code == _DECIMAL or type_code in _LABELS else None
        try:
            convert = converter_for(type_code, int(flags), params, self._tz)
        except SinkError as exc:  # an unknown type code, impossible DECIMAL parameters
            error = str(exc)

            def refuse(value: Any) -> None:
                raise SinkError(error)

            return refuse
        target = arrow_type_for(type_code, int(flags), params)
        if type_code == _DECIMAL and pa.types.is_decimal(target):
            register(convert, (DECIMAL,))
        check: Callable[[Any], Any] = convert
        bits = _INT_BITS.get(type_code)
        if bits is not None:
            check = _in_range(convert, type_code, bits, bool(int(flags) & _UNSIGNED))
        elif type_code == _DECIMAL and not pa.types.is_decimal(target):
            check = _as_decimal_text(convert)
        elif type_code in _DATES and flags & _KEY and not flags & _NULLABLE:
            check = _key_value(convert)
        existing = self._delta_type(schema, table, name) if self._delta_type is not None else None
        if existing is None or _plain(existing) == target or common_type(_plain(existing), target) is not None:
            return check  # the MERGE writes it as it is, or the applier widens the table first
        if not self._one_type(schema, table, name, type_code, flags):
            # Two types for one column in one batch (Avro schema drift): the applier types the column by
            # the first; a crash after it added the column would show a re-run another table type than
            # the first attempt saw. Leave the fit to the MERGE, so that both attempts decide alike.
            return check
        return _fits(check, target, existing)

    def _one_type(self, schema: str, table: str, name: str, type_code: int, flags: int) -> bool:
        """Whether every change being screened that carries the column gives it this type."""
        for rec in self._screening:
            if rec.schema != schema or rec.table != table:
                continue
            for image in (rec.new, rec.old):
                for col in image or ():
                    if col[0] == name and (col[1] != type_code or col[2] != flags):
                        return False
        return True

    @staticmethod
    def _reject(rec: ChangeRecord, column: str | None, value: Any, error: str) -> Rejection:
        return Rejection(rec.topic, rec.partition, rec.offset, rec.idx, rec.schema, rec.table, column, value,
                         error, rec)
