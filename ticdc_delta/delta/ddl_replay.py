"""Replay upstream DDL on the Delta tables, under the YAML's per-class policies.

A DDL reaches the replayer exactly once, between the rows committed before it and the rows after it
(:mod:`ticdc_delta.core.batch_planner`). It is parsed with :func:`ticdc_delta.schema.ddl.parse_ddl` into
typed changes; each change belongs to a policy class (``create_table``, ``add_column``, …) whose policy is
``evolve`` (apply it), ``ignore`` (log and skip) or ``fail`` (stop with a terminal error naming the DDL
and its commit ts).

Applied here: CREATE DATABASE (nothing to do), CREATE TABLE (incl. ``LIKE``), ADD COLUMN, TRUNCATE TABLE
(a new, empty version), DROP TABLE (``evolve`` drops the Delta table), and the no-op classes (index,
partition, view, sequence, TiFlash DDL). Every schema commit is idempotent, so a re-run batch replays a
DDL again harmlessly.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..core.records import DDLRecord
from ..errors import DDLPolicyError
from ..schema import ddl as d
from .arrow_types import TypeParams, arrow_field_for
from .sink import TableIdent

if TYPE_CHECKING:  # pragma: no cover
    from .applier import DeltaApplier

__all__ = ["DDLReplayer", "column_params"]

log = logging.getLogger(__name__)


def column_params(col: "d.ColumnDef") -> TypeParams:
    """The type parameters the Delta mapping needs from a DDL column."""
    t = col.type
    return TypeParams(t.precision, t.scale, tuple(t.members) if t.members else None, t.fsp)


class DDLReplayer:
    """Callable ``(ddl, applier, batch_id) -> bool`` for :class:`~ticdc_delta.delta.applier.DeltaApplier`.

    Args:
        policies: the YAML ``ddl:`` section (attributes named after the policy classes).
    """

    def __init__(self, policies: Any) -> None:
        self.policies = policies

    def policy(self, cls: str) -> str:
        return str(getattr(self.policies, cls, "evolve"))

    def __call__(self, rec: DDLRecord, applier: "DeltaApplier", batch_id: int) -> bool:
        changes = d.parse_ddl(rec.query, default_schema=rec.schema, ddl_type=rec.ddl_type)
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
            if policy == "fail":
                raise DDLPolicyError(
                    f"{cls} DDL at commit ts {rec.commit_ts} refused by policy ddl.{cls}: fail: {rec.query!r}"
                )
            table = getattr(change, "table", None)
            if table and not applier.options(getattr(change, "schema", rec.schema), table).enabled:
                log.info("table %s.%s is disabled in the mapping: skipping %r", change.schema, table, rec.query)
                continue
            if policy == "ignore":
                log.info("ddl.%s is ignore: skipping %r (commit ts %s)", cls, rec.query, rec.commit_ts)
                continue
            changed |= self._evolve(change, cls, rec, applier, batch_id)
        return changed

    # --- evolve ----------------------------------------------------------------------------------------

    def _evolve(self, change: Any, cls: str, rec: DDLRecord, applier: "DeltaApplier", batch_id: int) -> bool:
        sink = applier.sink
        if isinstance(change, (d.CreateDatabase, d.NoOp)):
            log.info("DDL %s needs nothing on the Delta side: %r", cls, rec.query)
            return False
        if isinstance(change, d.CreateTable):
            return self._create_table(change, applier, batch_id)
        if isinstance(change, d.AddColumns):
            ident = TableIdent(change.schema, change.table)
            if sink.table_schema(ident) is None:
                log.info("ADD COLUMN on %s.%s before any row: the first rows will create the table", *ident)
                return False
            fields = []
            for col in change.columns:
                params = column_params(col)
                applier.catalog.set_params(ident.schema, ident.table, col.name, params)
                fields.append(arrow_field_for(col.name, col.type.type_code, col.type.flags, params))
            return bool(sink.add_columns(ident, fields, applier.schema_txn(batch_id)))
        if isinstance(change, d.TruncateTable):
            ident = TableIdent(change.schema, change.table)
            if sink.table_schema(ident) is None:
                return False
            return bool(sink.overwrite_empty(ident, applier.next_txn(ident, batch_id)))
        if isinstance(change, d.DropTable):
            ident = TableIdent(change.schema, change.table)
            applier.catalog.drop_table(*ident)
            return bool(sink.drop(ident))
        log.warning("DDL class %s is not replayed yet; ignoring %r (commit ts %s)", cls, rec.query, rec.commit_ts)
        return False

    def _create_table(self, change: "d.CreateTable", applier: "DeltaApplier", batch_id: int) -> bool:
        sink = applier.sink
        ident = TableIdent(change.schema, change.table)
        if change.like is not None:
            like = sink.table_schema(TableIdent(*change.like))
            if like is None:
                log.warning("CREATE TABLE %s.%s LIKE %s.%s: the source table has no Delta table yet; "
                            "the first rows will create it", *ident, *change.like)
                return False
            schema = like
        else:
            fields = []
            for col in change.columns:
                params = column_params(col)
                applier.catalog.set_params(ident.schema, ident.table, col.name, params)
                fields.append(arrow_field_for(col.name, col.type.type_code, col.type.flags, params))
            meta = applier.metadata_columns
            if meta:
                fields += [pa.field(meta[0], pa.int64()), pa.field(meta[1], pa.string())]
            schema = pa.schema(fields)
        existing = sink.table_schema(ident)
        if existing is not None:
            have = {f.name.lower() for f in existing}
            missing = [f for f in schema if f.name.lower() not in have]
            if missing:
                sink.add_columns(ident, missing, applier.schema_txn(batch_id))
            return bool(missing)
        opts = applier.options(*ident)
        return bool(sink.ensure_table(ident, schema, list(opts.partition_by), applier.schema_txn(batch_id)))
