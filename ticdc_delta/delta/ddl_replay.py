"""Replay upstream DDL on the Delta tables, under the YAML's per-class policies.

A DDL reaches the replayer exactly once, between the rows committed before it and the rows after it
(:mod:`ticdc_delta.core.batch_planner`). It is parsed with :func:`ticdc_delta.schema.ddl.parse_ddl` into
typed changes; each change belongs to a policy class (``create_table``, ``add_column``, …) whose policy is
``evolve`` (apply it), ``ignore`` (log and skip) or ``fail`` (stop with a terminal error naming the DDL
and its commit ts).

How each class is applied (``evolve``):

=========================  ======================================================================
DDL                        Delta
=========================  ======================================================================
CREATE DATABASE            nothing (tables appear as they are created)
DROP DATABASE              every table of the schema under the sink root is dropped (but one loaded
                           from a snapshot taken after the DROP)
CREATE TABLE [LIKE]        a new, empty table with the DDL's columns (or the source table's)
DROP TABLE                 the table is deleted
TRUNCATE TABLE             a new version with no rows
RENAME TABLE a TO b, ...   the table moves to b's location (a directory rename on local storage)
ADD COLUMN                 new nullable columns (in place); with a DEFAULT, existing rows get the
                           default as TiDB shows them — a table rewrite
DROP COLUMN                table rewrite without the column
RENAME / CHANGE COLUMN     table rewrite with the column renamed, values kept
MODIFY COLUMN              same Delta type (int→bigint, varchar length, float→double: all already
                           the widest Delta type): nothing, unless TiDB rounds the values (fewer
                           fractional digits of DATETIME/TIMESTAMP/TIME, DOUBLE→FLOAT): a table rewrite
                           rounding them the same way; a wider Delta type (decimal precision or scale
                           growth, a type that becomes text): table rewrite with a lossless cast (to
                           text: TiDB's text of the old values); a narrowing or incompatible change:
                           :class:`DDLPolicyError`
SET / DROP DEFAULT         nothing (row events carry every value)
ADD/DROP PRIMARY KEY,      nothing in the table; later merges use the key the row events flag
UNIQUE INDEX
index, partition, view,    nothing (logged)
sequence, TiFlash DDL
DROP / TRUNCATE /          refused (``ddl.partition_data``: ``fail``) or logged (``ignore``): rows
EXCHANGE PARTITION         go or come without row events, which nothing can follow
=========================  ======================================================================

The replayer asks the sink for each change (``add_columns``, ``drop_column``, ``rename_column``,
``change_column_type``, ``rewrite`` for defaults, ...); the table above is what the ``delta-rs`` engine's
:class:`~ticdc_delta.delta.sink.DeltaRsSink` does. The ``spark`` engine's
:class:`~ticdc_delta.spark.delta_sink.SparkDeltaSink` does DROP / RENAME COLUMN in place (column mapping)
and, with ``sink.type_widening``, widens types in place (Delta type widening); see there.

Every change to a table takes the next step of the batch's app transaction for that table
(:meth:`~ticdc_delta.delta.applier.DeltaApplier.next_txn`), whether or not it commits, so a batch run again
after a crash numbers its commits as the first run did. A change is skipped when the table has committed its
step or a later one: a batch that adds and then drops (or renames) a column does not add it again on a
re-run. Rewrites are one overwrite commit each (with the step's app transaction); the previous rows stay in the table's Delta history until VACUUM, so no column's data is
lost silently. Column positions (FIRST / AFTER) are not mirrored: Delta column order is the order columns
were added.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
from datetime import datetime, timezone
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any, Iterable

import pyarrow as pa

from ..codec.model import INTEGER_TYPES, TypeCode
from ..config import DDLPolicies
from ..core.records import DDLRecord
from ..errors import DDLPolicyError, IdentifierError
from ..locations import fold_name
from ..schema import ddl as d
from .arrow_types import (
    Narrowing,
    TextSource,
    TypeParams,
    arrow_field_for,
    arrow_type_for,
    converter_for,
    fraction_text,
    source_zone,
    widens,
)
from .sink import TableIdent, Txn, narrow_columns

if TYPE_CHECKING:  # pragma: no cover
    from .applier import DeltaApplier

__all__ = ["DDLReplayer", "column_params", "default_value", "ddl_tables"]

log = logging.getLogger(__name__)


# A policies object without a class (a partial one, as tests pass) gets the YAML's default for the classes whose
# default is not evolve (partition_data: fail), and evolve for the others.
_DEFAULT_POLICIES = {"partition_data": DDLPolicies().partition_data}

_NAME_CHANGES = (d.CreateTable, d.DropTable, d.RenameTable, d.DropDatabase)
# changes whose replay takes no commit step (see DDLReplayer._evolve)
_STEPLESS = (d.DropTable, d.RenameTable, d.DropDatabase, d.CreateDatabase, d.NoOp, d.SetDefault, d.DropDefault,
             d.AddPrimaryKey, d.DropPrimaryKey, d.AddUniqueKey, d.DropIndex)


def _changes(rec: DDLRecord) -> list[Any] | None:
    """``rec`` parsed, ``None`` when it does not parse (the replay reports that; to the callers here it
    means "could be any table")."""
    try:
        return list(d.parse_ddl(rec.query, default_schema=rec.schema, ddl_type=rec.ddl_type))
    except Exception:  # noqa: BLE001
        return None


def tables_removed(rec: DDLRecord, *, case_sensitive: bool = False) -> frozenset[tuple[str, str]] | None:
    """The (schema, table) names, folded unless ``case_sensitive``, that replaying ``rec`` may leave without
    a table (DROP TABLE, the old names of RENAME TABLE), or ``None`` when that may be any table of a schema
    (DROP DATABASE) or the statement does not parse; empty for any other DDL."""
    changes = _changes(rec)
    if changes is None or any(isinstance(change, d.DropDatabase) for change in changes):
        return None
    fold = functools.partial(fold_name, case_sensitive=case_sensitive)
    return frozenset((fold(change.schema or rec.schema), fold(change.table)) for change in changes
                     if isinstance(change, (d.DropTable, d.RenameTable)))


def ddl_tables(rec: DDLRecord, *, case_sensitive: bool = False) -> frozenset[tuple[str, str]] | None:
    """The (schema, table) names, folded unless ``case_sensitive``, that replaying ``rec`` can change or
    read (RENAME TABLE both names, CREATE TABLE ... LIKE its source), or ``None`` when it may touch any
    table: a database-level statement, one naming no table, one that does not parse."""
    changes = _changes(rec)
    if changes is None:
        return None
    fold = functools.partial(fold_name, case_sensitive=case_sensitive)
    names = {(fold(rec.schema), fold(rec.table))} if rec.table else set()
    for change in changes:
        table = getattr(change, "table", "")
        if not isinstance(table, str) or not table:
            return None
        names.add((fold(getattr(change, "schema", "") or rec.schema), fold(table)))
        new_table = getattr(change, "new_table", None)
        if new_table:
            names.add((fold(getattr(change, "new_schema", "") or rec.schema), fold(new_table)))
        like = getattr(change, "like", None)
        if like:
            names.add((fold(like[0]), fold(like[1])))
    return frozenset(names)


def column_params(col: "d.ColumnDef") -> TypeParams:
    """The type parameters the Delta mapping needs from a DDL column."""
    t = col.type
    return TypeParams(t.precision, t.scale, tuple(t.members) if t.members else None, t.fsp,
                      True if t.type_code == TypeCode.FLOAT else None)


def _unquote(text: str) -> str:
    body = text[1:-1]
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c == "'" and body[i + 1 : i + 2] == "'":
            out.append("'")
            i += 2
            continue
        if c == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            out.append({"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", "'": "'", '"': '"'}.get(nxt, nxt))
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def default_value(col: "d.ColumnDef", commit_ts: int | None, tz: str) -> Any:
    """The model value existing rows show for a column added with ``col.default``.

    ``CURRENT_TIMESTAMP`` is the DDL's own time (its commit ts), as TiDB fills existing rows with the
    time the column was added. Expression defaults cannot be evaluated here: ``None`` (logged).
    """
    text = col.default
    tc = col.type.type_code
    if text is None and not col.nullable:
        return _zero_value(col)
    if text is None or text.upper() == "NULL":
        return None
    if text.upper().startswith("CURRENT_TIMESTAMP"):
        if commit_ts is None:
            return None
        moment = datetime.fromtimestamp((commit_ts >> 18) / 1000.0, tz=timezone.utc)
        if tc == TypeCode.TIMESTAMP or tc == TypeCode.DATETIME:
            local = moment.astimezone(source_zone(tz)).replace(tzinfo=None)
            fsp = col.type.fsp or 0
            out = local.strftime("%Y-%m-%d %H:%M:%S")
            return out + fraction_text(f"{local.microsecond:06d}", fsp)
        return None
    if text.startswith("(") or not text:
        log.warning("cannot evaluate the expression default %s of column %s: existing rows get NULL", text, col.name)
        return None
    if text[:2].lower() in ("b'", "x'"):
        digits = text[2:-1]
        number = int(digits or "0", 2 if text[0] in "bB" else 16)
        if tc == TypeCode.BIT or tc in INTEGER_TYPES:
            return number
        return number.to_bytes(max(1, (number.bit_length() + 7) // 8), "big")
    quoted = text.startswith("'")
    raw = _unquote(text) if quoted else text
    if tc in INTEGER_TYPES or tc == TypeCode.BIT or tc in (TypeCode.FLOAT, TypeCode.DOUBLE):
        value = _number(raw)
        if value is None:
            log.warning("cannot read the default %s of column %s as a number: existing rows get NULL", text, col.name)
            return None
        if tc in (TypeCode.FLOAT, TypeCode.DOUBLE):
            return float(value)
        # exactly, rounded half away from zero as MySQL stores 1.5 in an INT (a float lost digits past 2^53)
        number = int(value.to_integral_value(rounding=ROUND_HALF_UP))
        if tc == TypeCode.YEAR and (0 < number < 100 or quoted and raw.strip() in ("0", "00")):
            number += 2000 if number < 70 else 1900  # two-digit years: 1..69 -> 20xx, 70..99 -> 19xx ('0': 2000)
        return number
    if tc in (TypeCode.ENUM, TypeCode.SET):
        return _member_labels(raw, col.type.members, tc == TypeCode.SET)  # the Delta column stores labels
    if tc in (TypeCode.DATE, TypeCode.NEWDATE, TypeCode.DATETIME, TypeCode.TIMESTAMP):
        return _canonical_date_time(raw, tc, col.type.fsp or 0)
    if tc == TypeCode.TIME:
        return _canonical_time(raw, col.type.fsp or 0)
    if col.type.binary:
        data = raw.encode("utf-8")
        if tc == TypeCode.STRING and col.type.length:  # BINARY(n) pads with zero bytes
            data = data.ljust(col.type.length, b"\0")
        return data
    return raw


_DATE_TIME = re.compile(r"(\d{1,4})-(\d{1,2})-(\d{1,2})(?:[ T](\d{1,2}):(\d{1,2}):(\d{1,2})(?:\.(\d{0,6}))?)?")
_TIME = re.compile(r"(-?)(?:(\d{1,3}):(\d{1,2})(?::(\d{1,2}))?|(\d{1,7}))(?:\.(\d{0,6}))?")


def _canonical_date_time(raw: str, tc: TypeCode, fsp: int) -> str:
    """A DATE/DATETIME/TIMESTAMP default in TiDB's own text ('2020-1-2' is '2020-01-02', a DATETIME's
    '2020-01-02' is '2020-01-02 00:00:00'); text of another shape as written (the write then judges it)."""
    m = _DATE_TIME.fullmatch(raw.strip())
    if m is None:
        return raw
    y, mo, d, h, mi, sec, frac = m.groups()
    date = f"{int(y):04d}-{int(mo):02d}-{int(d):02d}"
    if tc in (TypeCode.DATE, TypeCode.NEWDATE):
        return date
    return f"{date} {int(h or 0):02d}:{int(mi or 0):02d}:{int(sec or 0):02d}" + fraction_text(frac, fsp)


def _canonical_time(raw: str, fsp: int) -> str:
    """A TIME default in TiDB's own text: '1:2:3' is '01:02:03', 10 is '00:00:10', '1:2' is '01:02:00',
    112233 is '11:22:33'; text of another shape as written."""
    m = _TIME.fullmatch(raw.strip())
    if m is None:
        return raw
    sign, h, mi, sec, digits, frac = m.groups()
    if digits is not None:  # [[H]HMM]SS
        number = int(digits)
        h, mi, sec = str(number // 10000), str(number // 100 % 100), str(number % 100)
    return f"{sign}{int(h):02d}:{int(mi):02d}:{int(sec or 0):02d}" + fraction_text(frac, fsp)


def _member_labels(raw: str, members: tuple[str, ...], is_set: bool) -> str:
    """An ENUM/SET default as the column's members spell it (members compare ignoring case, as under the
    default collations; a SET's in definition order, each once); text that names no member as written."""
    by_name = {m.lower(): (i, m) for i, m in reversed(list(enumerate(members)))}
    if not is_set:
        found = by_name.get(raw.rstrip(" ").lower())
        return found[1] if found is not None else raw
    parts = [by_name.get(p.lower()) for p in raw.split(",")] if raw else []
    if any(p is None for p in parts):
        return raw
    return ",".join(m for _, m in sorted(set(p for p in parts if p is not None)))


def _number(raw: str) -> Decimal | None:
    """A numeric default's value: a number, TRUE/FALSE (1/0), or empty (0); None for anything else."""
    text = raw.strip()
    if not text:
        return Decimal(0)
    if text.upper() in ("TRUE", "FALSE"):
        return Decimal(int(text.upper() == "TRUE"))
    try:
        number = Decimal(text)
    except InvalidOperation:
        return None
    return number if number.is_finite() else None


def _zero_value(col: "d.ColumnDef") -> Any:
    """What TiDB shows in existing rows for a NOT NULL column added without a DEFAULT: the type's zero
    value (``0``, ``''``, the first ENUM member, ...; zero dates, which Delta cannot hold, become null)."""
    tc = col.type.type_code
    if tc in INTEGER_TYPES or tc == TypeCode.BIT:
        return 0
    if tc in (TypeCode.FLOAT, TypeCode.DOUBLE):
        return 0.0
    if tc == TypeCode.DECIMAL:
        return "0"
    if tc == TypeCode.ENUM:
        return col.type.members[0] if col.type.members else ""
    if tc == TypeCode.TIME:
        return "00:00:00" + fraction_text(None, col.type.fsp or 0)
    if tc == TypeCode.JSON:
        return "null"
    if tc == TypeCode.VECTOR_FLOAT32:
        return "[]"
    if tc in (TypeCode.DATE, TypeCode.NEWDATE, TypeCode.DATETIME, TypeCode.TIMESTAMP, TypeCode.NULL):
        return None
    if col.type.binary:
        return b"\0" * (col.type.length or 0) if tc == TypeCode.STRING else b""  # BINARY(n): n zero bytes
    return ""


class DDLReplayer:
    """Callable ``(ddl, applier, batch_id) -> bool`` for :class:`~ticdc_delta.delta.applier.DeltaApplier`.

    Args:
        policies: the YAML ``ddl:`` section (attributes named after the policy classes).
        source_timezone: the zone TIMESTAMP text (and CURRENT_TIMESTAMP defaults) are in.
    """

    def __init__(self, policies: Any, source_timezone: str = "UTC") -> None:
        self.policies = policies
        self.tz = source_timezone

    def policy(self, cls: str) -> str:
        return str(getattr(self.policies, cls, _DEFAULT_POLICIES.get(cls, "evolve")))

    def journaled(self, rec: DDLRecord) -> bool:
        """Whether replaying ``rec`` can change which Delta table a name refers to — CREATE / DROP / RENAME
        TABLE, DROP DATABASE, or a statement that does not parse — so the applier journals the batch's
        progress before it (:mod:`~ticdc_delta.delta.ddl_journal`)."""
        try:
            changes = d.parse_ddl(rec.query, default_schema=rec.schema, ddl_type=rec.ddl_type)
        except Exception:  # noqa: BLE001 - the replay reports it; here it only means "could be anything"
            return True
        return any(isinstance(c, _NAME_CHANGES) for c in changes)

    def stepped_tables(self, rec: DDLRecord, case_sensitive: bool = False) -> list[tuple[str, str]]:
        """The tables (folded names) replaying ``rec`` numbers a commit step of (``next_txn``) for, as the
        step bound of a batch counts them (:meth:`~ticdc_delta.delta.applier.DeltaApplier.check_steps`): each
        table-level change its policy replays (``evolve``) but those that move or drop whole tables and those
        that change nothing in Delta; all the tables it names when it does not parse."""
        changes = _changes(rec)
        if changes is None:  # counted as if it could touch them: the bound errs on the safe side
            return sorted(ddl_tables(rec, case_sensitive=case_sensitive) or ())
        out = []
        for change in changes:
            if isinstance(change, _STEPLESS) or self.policy(d.ddl_class(change)) != "evolve":
                continue
            table = getattr(change, "table", None)
            if isinstance(table, str) and table:
                schema = getattr(change, "schema", "") or rec.schema
                out.append((fold_name(schema, case_sensitive=case_sensitive),
                            fold_name(table, case_sensitive=case_sensitive)))
        return out

    def __call__(self, rec: DDLRecord, applier: "DeltaApplier", batch_id: int) -> bool:
        changes = d.parse_ddl(rec.query, default_schema=rec.schema, ddl_type=rec.ddl_type)
        if not applier.case_sensitive:
            changes = [_fold_names(c) for c in changes]
        self._refuse_crossing_renames(changes, rec, applier)
        changed = False
        for change in changes:
            cls = d.ddl_class(change)
            policy = self.policy(cls)
            if cls == "unknown":
                reason = getattr(change, "reason", "")
                if policy == "fail":
                    raise DDLPolicyError(
                        f"DDL at commit ts {rec.commit_ts} cannot be classified ({reason}) and ddl.unknown is "
                        f"fail: {rec.query!r}"
                    )
                log.warning("ignoring unclassified DDL at commit ts %s (%s): %s", rec.commit_ts, reason, rec.query)
                continue
            table, schema = getattr(change, "table", None), getattr(change, "schema", rec.schema)
            if table and not applier.options(schema, table).enabled:
                log.info("table %s.%s is disabled in the mapping: skipping %r", schema, table, rec.query)
                continue
            if cls == "partition_data":
                if policy == "fail":
                    raise DDLPolicyError(
                        f"partition_data DDL at commit ts {rec.commit_ts} refused by policy ddl.partition_data: "
                        f"fail: {rec.query!r} removes or swaps rows upstream without row events, so the Delta "
                        "table cannot follow it. Set ddl.partition_data: ignore to go on (the Delta table keeps "
                        "the rows the statement removed, and lacks any it swapped in), or re-load the table "
                        "with the snapshot command"
                    )
                log.warning("ddl.partition_data is ignore: the Delta table keeps the rows %r removed or swapped "
                            "upstream (commit ts %s)", rec.query, rec.commit_ts)
                continue
            if policy == "fail":
                raise DDLPolicyError(
                    f"{cls} DDL at commit ts {rec.commit_ts} refused by policy ddl.{cls}: fail: {rec.query!r}"
                )
            if policy == "ignore":
                log.info("ddl.%s is ignore: skipping %r (commit ts %s)", cls, rec.query, rec.commit_ts)
                continue
            try:
                changed |= self._evolve(change, cls, rec, applier, batch_id)
            except IdentifierError as exc:
                if isinstance(change, (d.CreateTable, d.RenameTable)):
                    raise DDLPolicyError(
                        f"{cls} DDL at commit ts {rec.commit_ts} cannot be replayed: {exc}; set ddl.{cls}: ignore "
                        f"to skip it: {rec.query!r}"
                    ) from exc
                # the table it names cannot have a Delta table (its rows went to the dead-letter table)
                log.warning("%s DDL at commit ts %s names no Delta table (%s): nothing to change: %r",
                            cls, rec.commit_ts, exc, rec.query)
        return changed

    def _refuse_crossing_renames(self, changes: list[Any], rec: DDLRecord, applier: "DeltaApplier") -> None:
        """Refuse, before any part of the statement runs, a RENAME TABLE to be replayed whose two names
        are not both enabled in ``tables[]``: the table a disabled name held upstream was never landed, so
        the enabled name cannot become it (a gh-ost / pt-osc cut-over renames its disabled ghost table so),
        and a landed table moved to a disabled name would sit where the job no longer writes. Skipping the
        statement, as a disabled old name did, left the landed table under the disabled name and started
        the enabled one anew from its next rows."""
        for change in changes:
            if not isinstance(change, d.RenameTable) or self.policy(d.ddl_class(change)) != "evolve":
                continue
            old = applier.options(change.schema, change.table).enabled
            new = applier.options(change.new_schema, change.new_table).enabled
            if old == new:
                continue
            names = f"{change.schema}.{change.table} to {change.new_schema}.{change.new_table}"
            why = ("the job never landed the disabled table's rows, so the enabled name cannot become that table"
                   if new else "the landed table would move to a name the job does not write")
            raise DDLPolicyError(
                f"rename_table DDL at commit ts {rec.commit_ts} renames {names}, and tables[] disables "
                f"{'the first' if new else 'the second'} name: {why}: {rec.query!r}. Enable both names in "
                "tables[] (and reset the changefeed to before the disabled table was created, see README, "
                "'Recovery'), or set ddl.rename_table: ignore to go on without it — the landed table keeps "
                "its name and rows, and the renamed table's later row events update it (after a gh-ost / "
                "pt-osc cut-over: the migrated table's rows, as the ghost table copied them)"
            )

    def _refuse_shared(self, ident: TableIdent, cls: str, rec: DDLRecord, applier: "DeltaApplier",
                       dropping: Iterable[TableIdent] = ()) -> None:
        """Refuse a statement that would remove or rename rows or columns of ``ident``'s Delta table when
        that location also holds the rows of other upstream tables (``tables[].path`` maps shards to one
        location): replayed, one shard's TRUNCATE emptied every shard, its DROP COLUMN dropped the others'
        values, its RENAME / DROP TABLE took their table away. ``dropping``: the tables a DROP DATABASE drops
        with it, whose sharing of the location does not matter."""
        gone = {f"{i.schema}.{i.table}" for i in dropping}
        others = [n for n in applier.sharing(ident) if n not in gone]
        if others:
            raise DDLPolicyError(
                f"{cls} DDL at commit ts {rec.commit_ts} on {ident.schema}.{ident.table} would change the Delta "
                f"table at {applier.sink.table_path(*ident)}, which also holds the rows of {', '.join(others)} "
                f"(tables[].path maps them to one location): {rec.query!r}. Set ddl.{cls}: ignore to go on "
                "without it (the table keeps every table's rows and columns), or give the tables locations "
                "of their own (and reset the changefeed, see README, 'Recovery')"
            )

    # --- evolve ----------------------------------------------------------------------------------------

    def _evolve(self, change: Any, cls: str, rec: DDLRecord, applier: "DeltaApplier", batch_id: int) -> bool:
        sink = applier.sink
        if isinstance(change, (d.CreateDatabase, d.NoOp, d.SetDefault, d.DropDefault)):
            log.info("DDL %s needs nothing on the Delta side: %r", cls, rec.query)
            return False
        if isinstance(change, (d.AddPrimaryKey, d.DropPrimaryKey, d.AddUniqueKey, d.DropIndex)):
            log.info("key change on %s.%s: later merges use the key the row events flag (%r)",
                     change.schema, change.table, rec.query)
            return False
        if isinstance(change, d.CreateTable):
            return self._create_table(change, applier, batch_id)
        if isinstance(change, d.DropDatabase):
            dropped = False
            # the schema's tables under sink.path, those a tables[].path puts elsewhere, and those the job
            # has written anywhere (a wildcard entry's path)
            idents = list(dict.fromkeys([*sink.tables_in_schema(change.name), *applier.written_in(change.name)]))
            for ident in idents:
                if not (applier.seam is not None and applier.seam.holds(ident.schema, ident.table, rec.commit_ts)):
                    self._refuse_shared(ident, cls, rec, applier, dropping=idents)
            for ident in idents:
                if applier.seam is not None and applier.seam.holds(ident.schema, ident.table, rec.commit_ts):
                    # loaded from a snapshot taken after the drop (the table was made again since)
                    log.info("DROP DATABASE at commit ts %s: %s.%s is kept, its snapshot is later",
                             rec.commit_ts, *ident)
                    continue
                applier.catalog.drop_table(*ident)
                applier.forget(ident)
                dropped |= bool(sink.drop(ident))
            return dropped
        ident = TableIdent(change.schema, change.table)
        if isinstance(change, (d.DropTable, d.RenameTable)):
            self._refuse_shared(ident, cls, rec, applier)
        if isinstance(change, d.DropTable):
            applier.catalog.drop_table(*ident)
            applier.forget(ident)
            return bool(sink.drop(ident))
        if isinstance(change, d.RenameTable):
            new = TableIdent(change.new_schema, change.new_table)
            sink.table_path(*new)  # IdentifierError before anything moves: no location can hold the new name
            applier.catalog.rename_table((ident.schema, ident.table), (new.schema, new.table))
            applier.forget(ident)
            moved = bool(sink.move(ident, new))
            applier.carry_steps(ident, new)
            return moved
        # A change to one table takes its step before it looks at the table, whether or not it then
        # commits: a re-run batch must number its commits as the first run did. Were a change the table
        # already shows skipped without its step, the next commit would get this step's version, which
        # the table has committed: that commit would be skipped as done.
        txn = applier.next_txn(ident, batch_id)
        existing = sink.table_schema(ident)
        if existing is None:
            # The table has no Delta table yet (created before the changefeed, no rows so far): the
            # first rows will create it from their images. Keep what the DDL says about types.
            for col in getattr(change, "columns", ()) or ((change.column,) if isinstance(change, d.ModifyColumn) else ()):
                applier.catalog.set_params(ident.schema, ident.table, col.name, column_params(col))
            log.info("%s on %s.%s before it has a Delta table: nothing to change", cls, *ident)
            return False
        if isinstance(change, (d.TruncateTable, d.DropColumn, d.RenameColumn)):
            self._refuse_shared(ident, cls, rec, applier)
        if isinstance(change, d.TruncateTable):
            return bool(sink.overwrite_empty(ident, txn))
        if isinstance(change, d.AddColumns):
            return self._add_columns(change, existing, rec, applier, txn)
        if isinstance(change, d.DropColumn):
            name = _find(existing, change.name)
            if name is None:
                return False
            applier.catalog.drop_column(ident.schema, ident.table, change.name)
            return bool(sink.drop_column(ident, name, txn))
        if isinstance(change, d.RenameColumn):
            old = _find(existing, change.old)
            if old is None or old == change.new:
                return False
            applier.catalog.rename_column(ident.schema, ident.table, change.old, change.new)
            return bool(sink.rename_column(ident, old, change.new, txn))
        if isinstance(change, d.ModifyColumn):
            return self._modify_column(change, existing, rec, applier, txn)
        log.warning("DDL class %s has no Delta replay; ignoring %r (commit ts %s)", cls, rec.query, rec.commit_ts)
        return False

    def _create_table(self, change: "d.CreateTable", applier: "DeltaApplier", batch_id: int) -> bool:
        sink = applier.sink
        ident = TableIdent(change.schema, change.table)
        sink.table_path(*ident)  # IdentifierError first: no location can hold the name
        txn = applier.next_txn(ident, batch_id)  # taken whatever the table shows (see _evolve)
        if change.like is not None:
            like = sink.table_schema(TableIdent(*change.like))
            if like is None:
                log.warning("CREATE TABLE %s.%s LIKE %s.%s: the source table has no Delta table yet; "
                            "the first rows will create it", *ident, *change.like)
                return False
            applier.catalog.copy_table(change.like, (ident.schema, ident.table))
            schema = like
        else:
            fields = []
            stored = _stored(change.columns, ident)
            applier.check_columns(ident, [c.name for c in stored])
            for col in stored:
                params = column_params(col)
                applier.catalog.set_params(ident.schema, ident.table, col.name, params)
                fields.append(arrow_field_for(col.name, col.type.type_code, col.type.flags, params))
            meta = applier.metadata_columns
            if meta:
                fields += [pa.field(meta[0], pa.int64()), pa.field(meta[1], pa.string())]
            schema = pa.schema(fields)
        existing = sink.table_schema(ident)
        # where the table is (as where a table's rows went): DROP DATABASE finds it there, wherever that is
        applier.locations[f"{ident.schema}.{ident.table}"] = sink.table_path(*ident)
        if existing is not None:
            have = {f.name.lower() for f in existing}
            missing = [f for f in schema if f.name.lower() not in have]
            if missing:
                sink.add_columns(ident, missing, txn)
            return bool(missing)
        opts = applier.options(*ident)
        parts = applier.check_columns(ident, [f.name for f in schema if f.name not in (applier.metadata_columns or ())],
                                      opts.partition_by)
        return bool(sink.ensure_table(ident, schema, parts, txn, dict(opts.properties)))

    def _add_columns(self, change: "d.AddColumns", existing: pa.Schema, rec: DDLRecord,
                     applier: "DeltaApplier", txn: Txn) -> bool:
        ident = TableIdent(change.schema, change.table)
        fields, defaults = [], {}
        for col in _stored(change.columns, ident):
            params = column_params(col)
            applier.catalog.set_params(ident.schema, ident.table, col.name, params)
            if _find(existing, col.name) is not None:
                continue
            field = arrow_field_for(col.name, col.type.type_code, col.type.flags, params)
            fields.append(field)
            value = default_value(col, rec.commit_ts, self.tz)
            if value is not None:
                convert = converter_for(col.type.type_code, int(col.type.flags), params, self.tz)
                defaults[col.name] = (field, convert(value))
        if not fields:
            return False
        if not defaults:
            return bool(applier.sink.add_columns(ident, fields, txn))

        def fill(table: pa.Table) -> pa.Table:
            for field in fields:
                if field.name in table.column_names:
                    continue
                if field.name in defaults:
                    f, v = defaults[field.name]
                    array = pa.array([v] * table.num_rows, type=f.type)
                else:
                    array = pa.nulls(table.num_rows, type=field.type)
                table = table.append_column(field, array)
            return table

        return bool(applier.sink.rewrite(ident, fill, txn))

    def _modify_column(self, change: "d.ModifyColumn", existing: pa.Schema, rec: DDLRecord,
                       applier: "DeltaApplier", txn: Txn) -> bool:
        ident = TableIdent(change.schema, change.table)
        name = _find(existing, change.name)
        col = change.column
        params = column_params(col)
        before = applier.catalog.params(ident.schema, ident.table, col.name)
        applier.catalog.set_params(ident.schema, ident.table, col.name, params)
        if name is None:
            return False
        old_type = existing.field(name).type
        new_type = arrow_type_for(col.type.type_code, col.type.flags, params)
        if old_type == new_type:
            how = _narrowing(col, before, old_type)
            if how is None:
                return False
            # the same Delta type, less precision: TiDB rounds the stored values (its reorg), so does this
            log.info("%s.%s.%s loses precision (%s): rounding its values as TiDB does", ident.schema, ident.table,
                     name, how)
            return bool(applier.sink.rewrite(ident, narrow_columns({name: how}), txn))
        if not widens(old_type, new_type):
            raise DDLPolicyError(
                f"modify_column DDL at commit ts {rec.commit_ts} changes {ident.schema}.{ident.table}.{name} from "
                f"{old_type} to {new_type}, which would lose data; set ddl.modify_column: ignore to keep the "
                f"Delta type: {rec.query!r}"
            )
        # (a column that becomes text keeps its old values as TiDB prints them: the DDL's own reorg does)
        return bool(applier.sink.change_column_type(ident, name, new_type, txn, TextSource(before, self.tz)))


def _narrowing(col: "d.ColumnDef", before: TypeParams | None, stored: pa.DataType) -> Narrowing | None:
    """How MODIFY COLUMN to ``col`` rounds the values a column of Delta type ``stored`` holds, when it keeps
    that type: fewer fractional digits of DATETIME/TIMESTAMP/TIME than the column had (known from its DDL,
    ``before``), or DOUBLE → FLOAT (rounding a FLOAT's values again changes nothing); ``None`` otherwise."""
    tc = col.type.type_code
    if tc == TypeCode.FLOAT and pa.types.is_floating(stored):
        return None if before is not None and before.float32 else Narrowing(float32=True)
    if tc in (TypeCode.DATETIME, TypeCode.TIMESTAMP, TypeCode.TIME) and before is not None and before.fsp is not None:
        fsp = col.type.fsp or 0
        if fsp < before.fsp:
            return Narrowing(fsp=fsp)
    return None


_NAME_FIELDS = ("schema", "table", "new_schema", "new_table")


def _stored(columns: Iterable["d.ColumnDef"], ident: TableIdent) -> list["d.ColumnDef"]:
    """``columns`` but the VIRTUAL generated ones: TiDB computes those when a row is read and TiCDC never
    sends their values (its row events leave them out), so a Delta column of one would hold only NULLs.
    A later DDL naming such a column (DROP, RENAME, MODIFY) finds no Delta column and changes nothing."""
    out = []
    for col in columns:
        if col.virtual:
            log.info("%s.%s: the VIRTUAL generated column %s gets no Delta column (TiCDC never sends its "
                     "values; compute it in a view)", ident.schema, ident.table, col.name)
        else:
            out.append(col)
    return out


def _fold_names(change: Any) -> Any:
    """``change`` with the schema and table names it holds lower-cased (not column or index names):
    names in DDL text enter the job here, as those of records enter it in the planner."""
    updates: dict[str, Any] = {}
    if isinstance(change, (d.CreateDatabase, d.DropDatabase)):
        updates["name"] = fold_name(change.name)
    for f in _NAME_FIELDS:
        value = getattr(change, f, None)
        if isinstance(value, str):
            updates[f] = fold_name(value)
    like = getattr(change, "like", None)
    if like is not None:
        updates["like"] = (fold_name(like[0]), fold_name(like[1]))
    return dataclasses.replace(change, **updates) if updates else change


def _find(schema: pa.Schema, name: str) -> str | None:
    """The table's spelling of a column name (MySQL column names are case-insensitive)."""
    low = name.lower()
    for f in schema:
        if f.name.lower() == low:
            return f.name
    return None
