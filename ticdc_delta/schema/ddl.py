"""TiDB DDL statements, as TiCDC streams them, parsed into typed schema changes.

:func:`parse_ddl` turns the query of one DDL event into a list of :class:`SchemaChange` values, in
statement order: ``ALTER TABLE t ADD COLUMN a INT, DROP COLUMN b, ADD INDEX i (c)`` is three changes
(:class:`AddColumns`, :class:`DropColumn`, :class:`NoOp`). Nothing here touches Delta: the caller applies
the changes under its policies, which name a change's class with :func:`ddl_class`.

How a statement is read:

* The query is split into statements, and an ``ALTER TABLE`` into its clauses, at top-level ``;`` and
  ``,`` tokens of sqlglot's MySQL tokenizer (``TiDBDialect``), so each clause is classified on its own and
  the changes keep the statement's order.
* Each statement or clause is parsed by sqlglot's MySQL grammar, extended where TiDB needs it (see
  :class:`~ticdc_delta.schema.mysql_types.TiDBDialect`).
* Clauses that only TiDB has and sqlglot cannot parse (``SET TIFLASH REPLICA``, partition management,
  ``CACHE``, placement policies, TTL, ``ADD COLUMN (a INT, b INT)``...) are recognised by their leading
  keyword tokens. ``CREATE TABLE`` statements whose table options sqlglot rejects (``PARTITION BY HASH``,
  ``TTL``) are parsed again without the options, which never change the columns or keys.
* Whatever is still unclassified becomes a :class:`NoOp` when the event's DDL type (``ddl_type``, TiDB's
  ``model.ActionType``) names a DDL that never changes columns or keys (TiFlash replicas, sequences,
  auto-id rebases...), otherwise an :class:`Unknown` that says why.

:func:`parse_ddl` never raises for a bad query: a statement it cannot read is an :class:`Unknown`.

Identifiers are kept exactly as written (backticks removed, doubled backticks undone): ```my col```,
```select```, ```表```, ```a``b``` become ``my col``, ``select``, ``表``, ``a`b``. Names that the statement
does not qualify with a database take ``default_schema`` (TiCDC's schema of the event). TiDB resolves
them against the session's current database, which the event does not carry: for a cross-database
``RENAME TABLE a TO db2.b`` the unqualified side may be resolved differently than upstream did.

Each ``ADD COLUMN`` clause is its own :class:`AddColumns`; ``ADD COLUMN (a INT, b INT)`` is one with both
columns. ``CHANGE COLUMN a b ...`` is a :class:`RenameColumn` followed by a :class:`ModifyColumn` (only the
latter when the name stays). Keys declared inline (``ADD COLUMN id INT PRIMARY KEY``) follow the column as
:class:`AddPrimaryKey` / :class:`AddUniqueKey`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence, TypeVar

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.tokens import Token, TokenType

from ticdc_delta.codec.model import DDLType
from ticdc_delta.schema.mysql_types import (
    ColumnType,
    RenameTables,
    TiDBDialect,
    UnsupportedColumnTypeError,
    column_type_from_sqlglot,
)

__all__ = [
    "ColumnDef",
    "ColumnPosition",
    "FIRST",
    "SchemaChange",
    "CreateDatabase",
    "DropDatabase",
    "CreateTable",
    "DropTable",
    "TruncateTable",
    "RenameTable",
    "AddColumns",
    "DropColumn",
    "RenameColumn",
    "ModifyColumn",
    "SetDefault",
    "DropDefault",
    "AddPrimaryKey",
    "DropPrimaryKey",
    "AddUniqueKey",
    "DropIndex",
    "NoOp",
    "Unknown",
    "DDL_CLASSES",
    "parse_ddl",
    "ddl_class",
    "quote_ident",
]


def quote_ident(name: str) -> str:
    """``name`` as a MySQL identifier: in backticks, with embedded backticks doubled (```a``b```).

    Raises:
        TypeError: ``name`` is not a string.
    """
    if not isinstance(name, str):
        raise TypeError(f"identifier must be str, not {type(name).__name__}")
    return "`" + name.replace("`", "``") + "`"


# ----------------------------------------------------------------------------------------------- values


@dataclass(frozen=True)
class ColumnDef:
    """One column definition of a DDL statement.

    ``default`` is the MySQL literal of the DEFAULT clause in canonical spelling, or ``None`` when the
    statement gives no DEFAULT: ``DEFAULT NULL`` is the text ``"NULL"``, a string is single-quoted with
    quotes doubled (``"'it''s'"``), numbers keep their digits (``"1.50"``, ``"-1"``), bit and hex values
    are ``"b'101'"`` / ``"x'1F'"``, ``NOW()``/``LOCALTIMESTAMP``/``CURRENT_TIMESTAMP()`` are
    ``"CURRENT_TIMESTAMP"`` (``"CURRENT_TIMESTAMP(3)"`` with a precision), charset introducers are dropped
    (``_utf8mb4'x'`` is ``"'x'"``) and expression defaults are their parenthesised SQL (``"(UUID())"``).
    ``nullable`` is ``False`` for ``NOT NULL`` and for primary-key columns. ``generated`` is true for
    ``GENERATED ALWAYS AS (...)`` columns, ``virtual`` for those of them TiDB computes when a row is read
    (``VIRTUAL``, the default; not ``STORED``): TiCDC never sends their values.
    """

    name: str
    type: ColumnType
    nullable: bool = True
    default: str | None = None
    auto_increment: bool = False
    comment: str | None = None
    generated: bool = False
    virtual: bool = False


@dataclass(frozen=True)
class ColumnPosition:
    """Where ``ADD``/``MODIFY``/``CHANGE COLUMN`` puts a column: ``FIRST`` or ``AFTER <after>``."""

    first: bool = False
    after: str | None = None


FIRST = ColumnPosition(first=True)
"""The ``FIRST`` position."""


@dataclass(frozen=True)
class SchemaChange:
    """Base of every change :func:`parse_ddl` returns."""


@dataclass(frozen=True)
class CreateDatabase(SchemaChange):
    """``CREATE DATABASE``/``CREATE SCHEMA``."""

    name: str


@dataclass(frozen=True)
class DropDatabase(SchemaChange):
    """``DROP DATABASE``/``DROP SCHEMA``."""

    name: str


@dataclass(frozen=True)
class CreateTable(SchemaChange):
    """``CREATE TABLE``: columns and keys, or ``like = (schema, table)`` for ``CREATE TABLE ... LIKE``.

    ``primary_key`` is empty when the table has none; ``unique_keys`` lists the column names of each
    UNIQUE key over plain columns, in statement order (keys over expressions are left out: they cannot
    identify rows).
    """

    schema: str
    table: str
    columns: tuple[ColumnDef, ...] = ()
    primary_key: tuple[str, ...] = ()
    unique_keys: tuple[tuple[str, ...], ...] = ()
    like: tuple[str, str] | None = None
    if_not_exists: bool = False


@dataclass(frozen=True)
class DropTable(SchemaChange):
    """``DROP TABLE`` of one table (``DROP TABLE a, b`` is two changes)."""

    schema: str
    table: str


@dataclass(frozen=True)
class TruncateTable(SchemaChange):
    """``TRUNCATE TABLE``."""

    schema: str
    table: str


@dataclass(frozen=True)
class RenameTable(SchemaChange):
    """``RENAME TABLE schema.table TO new_schema.new_table`` (one per pair), ``ALTER TABLE ... RENAME``."""

    schema: str
    table: str
    new_schema: str
    new_table: str


@dataclass(frozen=True)
class AddColumns(SchemaChange):
    """``ADD COLUMN`` (one column) or ``ADD COLUMN (a ..., b ...)``.

    ``positions[i]`` is where ``columns[i]`` goes: ``None`` (after the last column), :data:`FIRST` or
    ``ColumnPosition(after=name)``.
    """

    schema: str
    table: str
    columns: tuple[ColumnDef, ...]
    positions: tuple[ColumnPosition | None, ...]


@dataclass(frozen=True)
class DropColumn(SchemaChange):
    """``DROP COLUMN``."""

    schema: str
    table: str
    name: str


@dataclass(frozen=True)
class RenameColumn(SchemaChange):
    """``RENAME COLUMN old TO new``, or the renaming part of ``CHANGE COLUMN old new ...``."""

    schema: str
    table: str
    old: str
    new: str


@dataclass(frozen=True)
class ModifyColumn(SchemaChange):
    """``MODIFY COLUMN`` or ``CHANGE COLUMN``: ``name`` (the new name after a CHANGE) gets ``column``."""

    schema: str
    table: str
    name: str
    column: ColumnDef
    position: ColumnPosition | None = None


@dataclass(frozen=True)
class SetDefault(SchemaChange):
    """``ALTER COLUMN name SET DEFAULT <default>`` (``default`` as in :class:`ColumnDef`)."""

    schema: str
    table: str
    name: str
    default: str


@dataclass(frozen=True)
class DropDefault(SchemaChange):
    """``ALTER COLUMN name DROP DEFAULT``."""

    schema: str
    table: str
    name: str


@dataclass(frozen=True)
class AddPrimaryKey(SchemaChange):
    """``ADD PRIMARY KEY (columns)`` (or a column added with ``PRIMARY KEY``)."""

    schema: str
    table: str
    columns: tuple[str, ...]


@dataclass(frozen=True)
class DropPrimaryKey(SchemaChange):
    """``DROP PRIMARY KEY`` (also ``DROP INDEX `PRIMARY```)."""

    schema: str
    table: str


@dataclass(frozen=True)
class AddUniqueKey(SchemaChange):
    """``ADD UNIQUE [KEY|INDEX] [name] (columns)``, ``CREATE UNIQUE INDEX``. ``name`` is ``None`` when the
    statement gives none (MySQL then names the key after its first column)."""

    schema: str
    table: str
    name: str | None
    columns: tuple[str, ...]


@dataclass(frozen=True)
class DropIndex(SchemaChange):
    """``DROP INDEX``/``DROP KEY``/``DROP INDEX name ON table``: the caller knows whether it was a key."""

    schema: str
    table: str
    name: str


@dataclass(frozen=True)
class NoOp(SchemaChange):
    """A DDL that does not change the columns or keys of a replicated table.

    ``kind`` says which: ``index``, ``partition``, ``view``, ``sequence``, ``tiflash``, ``comment``,
    ``charset``, ``auto_id``, ``foreign_key``, ``check_constraint``, ``placement``, ``cache``, ``ttl``,
    ``table_option``, ``temporary_table``, ``lock``, ``resource_group``. ``affects_data`` is true for the
    partition DDL that removes or swaps rows without row events (``DROP``/``TRUNCATE``/``EXCHANGE
    PARTITION``): the replica diverges from upstream there, which a policy may want to refuse.
    """

    kind: str
    reason: str
    schema: str = ""
    table: str = ""
    affects_data: bool = False


@dataclass(frozen=True)
class Unknown(SchemaChange):
    """A statement (or one clause of it) that neither the SQL nor the DDL type classifies."""

    query: str
    reason: str


DDL_CLASSES: dict[type[SchemaChange], str] = {
    CreateTable: "create_table",
    DropTable: "drop_table",
    TruncateTable: "truncate_table",
    RenameTable: "rename_table",
    AddColumns: "add_column",
    DropColumn: "drop_column",
    RenameColumn: "rename_column",
    ModifyColumn: "modify_column",
    SetDefault: "set_default",
    DropDefault: "set_default",
    AddPrimaryKey: "key_change",
    DropPrimaryKey: "key_change",
    AddUniqueKey: "key_change",
    DropIndex: "key_change",
    CreateDatabase: "create_database",
    DropDatabase: "drop_database",
    NoOp: "no_op",
    Unknown: "unknown",
}
"""The policy class of each change type, as the YAML policies name them."""


def ddl_class(change: SchemaChange) -> str:
    """The policy class of ``change``: ``create_table``, ``add_column``, ..., ``no_op``, ``unknown``.

    A :class:`NoOp` that removes or swaps rows without row events (``DROP``/``TRUNCATE``/``EXCHANGE
    PARTITION``) is ``partition_data``: the Delta table cannot follow it, so it has a policy of its own.

    Raises:
        TypeError: ``change`` is not a :class:`SchemaChange`.
    """
    cls = DDL_CLASSES.get(type(change))
    if cls is None:
        raise TypeError(f"not a SchemaChange: {change!r}")
    if isinstance(change, NoOp) and change.affects_data:
        return "partition_data"
    return cls


# ------------------------------------------------------------------------------- DDL type fallback

# TiDB model.ActionType codes above DDLType's range (pkg/meta/model/job.go).
_ACTION_MODIFY_TABLE_AUTO_ID_CACHE = 39
_ACTION_REBASE_AUTO_RANDOM_BASE = 40
_ACTION_ALTER_INDEX_VISIBILITY = 41
_ACTION_EXCHANGE_TABLE_PARTITION = 42
_ACTION_ADD_CHECK_CONSTRAINT = 43
_ACTION_DROP_CHECK_CONSTRAINT = 44
_ACTION_ALTER_CHECK_CONSTRAINT = 45
_ACTION_ALTER_TABLE_ATTRIBUTES = 49
_ACTION_ALTER_TABLE_PARTITION_ATTRIBUTES = 50
_ACTION_CREATE_PLACEMENT_POLICY = 51
_ACTION_ALTER_PLACEMENT_POLICY = 52
_ACTION_DROP_PLACEMENT_POLICY = 53
_ACTION_ALTER_TABLE_PARTITION_PLACEMENT = 54
_ACTION_MODIFY_SCHEMA_DEFAULT_PLACEMENT = 55
_ACTION_ALTER_TABLE_PLACEMENT = 56
_ACTION_ALTER_CACHE_TABLE = 57
_ACTION_ALTER_TABLE_STATS_OPTIONS = 58
_ACTION_ALTER_NO_CACHE_TABLE = 59
_ACTION_REORGANIZE_PARTITION = 64
_ACTION_ALTER_TTL_INFO = 65
_ACTION_ALTER_TTL_REMOVE = 67
_ACTION_CREATE_RESOURCE_GROUP = 68
_ACTION_ALTER_RESOURCE_GROUP = 69
_ACTION_DROP_RESOURCE_GROUP = 70
_ACTION_ALTER_TABLE_PARTITIONING = 71
_ACTION_REMOVE_PARTITIONING = 72

# DDL types that never change a replicated table's columns or keys, with the NoOp kind they get when
# their SQL cannot be classified. ADD_INDEX/DROP_INDEX are not here: a unique index may be the merge key.
_NOOP_DDL_TYPES: dict[int, str] = {
    DDLType.ADD_FOREIGN_KEY: "foreign_key",
    DDLType.DROP_FOREIGN_KEY: "foreign_key",
    DDLType.REBASE_AUTO_ID: "auto_id",
    DDLType.SHARD_ROW_ID: "table_option",
    DDLType.MODIFY_TABLE_COMMENT: "comment",
    DDLType.RENAME_INDEX: "index",
    DDLType.ADD_TABLE_PARTITION: "partition",
    DDLType.DROP_TABLE_PARTITION: "partition",
    DDLType.CREATE_VIEW: "view",
    DDLType.MODIFY_TABLE_CHARSET_AND_COLLATE: "charset",
    DDLType.TRUNCATE_TABLE_PARTITION: "partition",
    DDLType.DROP_VIEW: "view",
    DDLType.MODIFY_SCHEMA_CHARSET_AND_COLLATE: "charset",
    DDLType.LOCK_TABLE: "lock",
    DDLType.UNLOCK_TABLE: "lock",
    DDLType.SET_TIFLASH_REPLICA: "tiflash",
    DDLType.UPDATE_TIFLASH_REPLICA_STATUS: "tiflash",
    DDLType.CREATE_SEQUENCE: "sequence",
    DDLType.ALTER_SEQUENCE: "sequence",
    DDLType.DROP_SEQUENCE: "sequence",
    _ACTION_MODIFY_TABLE_AUTO_ID_CACHE: "auto_id",
    _ACTION_REBASE_AUTO_RANDOM_BASE: "auto_id",
    _ACTION_ALTER_INDEX_VISIBILITY: "index",
    _ACTION_EXCHANGE_TABLE_PARTITION: "partition",
    _ACTION_ADD_CHECK_CONSTRAINT: "check_constraint",
    _ACTION_DROP_CHECK_CONSTRAINT: "check_constraint",
    _ACTION_ALTER_CHECK_CONSTRAINT: "check_constraint",
    _ACTION_ALTER_TABLE_ATTRIBUTES: "table_option",
    _ACTION_ALTER_TABLE_PARTITION_ATTRIBUTES: "partition",
    _ACTION_CREATE_PLACEMENT_POLICY: "placement",
    _ACTION_ALTER_PLACEMENT_POLICY: "placement",
    _ACTION_DROP_PLACEMENT_POLICY: "placement",
    _ACTION_ALTER_TABLE_PARTITION_PLACEMENT: "placement",
    _ACTION_MODIFY_SCHEMA_DEFAULT_PLACEMENT: "placement",
    _ACTION_ALTER_TABLE_PLACEMENT: "placement",
    _ACTION_ALTER_CACHE_TABLE: "cache",
    _ACTION_ALTER_TABLE_STATS_OPTIONS: "table_option",
    _ACTION_ALTER_NO_CACHE_TABLE: "cache",
    _ACTION_REORGANIZE_PARTITION: "partition",
    _ACTION_ALTER_TTL_INFO: "ttl",
    _ACTION_ALTER_TTL_REMOVE: "ttl",
    _ACTION_CREATE_RESOURCE_GROUP: "resource_group",
    _ACTION_ALTER_RESOURCE_GROUP: "resource_group",
    _ACTION_DROP_RESOURCE_GROUP: "resource_group",
    _ACTION_ALTER_TABLE_PARTITIONING: "partition",
    _ACTION_REMOVE_PARTITIONING: "partition",
}

# Partition DDL that removes or swaps rows without emitting row events.
_DATA_CHANGING_DDL_TYPES = frozenset(
    {DDLType.DROP_TABLE_PARTITION, DDLType.TRUNCATE_TABLE_PARTITION, _ACTION_EXCHANGE_TABLE_PARTITION}
)


# ------------------------------------------------------------------------------------------ parsing

_DIALECT = TiDBDialect()
_T = TypeVar("_T")


class _Unclassified(Exception):
    """Internal: this statement/clause cannot be classified; the message says why."""


@dataclass
class _Context:
    query: str
    default_schema: str
    ddl_type: int | None

    def unclassified(self, reason: str, schema: str = "", table: str = "") -> SchemaChange:
        """A NoOp when the DDL type says the statement never changes columns or keys, else an Unknown."""
        if self.ddl_type is not None and self.ddl_type in _NOOP_DDL_TYPES:
            return NoOp(
                _NOOP_DDL_TYPES[self.ddl_type],
                f"classified by DDL type {self.ddl_type} ({reason})",
                schema,
                table,
                affects_data=self.ddl_type in _DATA_CHANGING_DDL_TYPES,
            )
        return Unknown(self.query, reason)

    def table_ref(self, node: exp.Expr | None) -> tuple[str, str]:
        """(schema, table) of a sqlglot table reference, unqualified names in the default schema."""
        if not isinstance(node, exp.Table) or not node.name or node.catalog:
            raise _Unclassified(f"expected a table name, found {_sql(node)!r}")
        return (node.db or self.default_schema, node.name)


def parse_ddl(query: str, *, default_schema: str, ddl_type: int | None = None) -> list[SchemaChange]:
    """Parse the query of a TiDB DDL event into schema changes, in statement order.

    Args:
        query: the DDL text as TiCDC sends it (one statement; several separated by ``;`` also work).
        default_schema: the database of names the statement does not qualify (the event's schema).
        ddl_type: the event's DDL type code (TiDB ``model.ActionType``, :class:`DDLType`), when the protocol
            carries one; it classifies statements whose SQL cannot be.

    Returns:
        At least one change. Statements or clauses that cannot be classified are :class:`Unknown`
        (or :class:`NoOp` when ``ddl_type`` names a DDL that never changes columns or keys).

    Raises:
        TypeError: ``query`` or ``default_schema`` is not a string, or ``ddl_type`` not an int or None.
    """
    if not isinstance(query, str):
        raise TypeError(f"query must be str, not {type(query).__name__}")
    if not isinstance(default_schema, str):
        raise TypeError(f"default_schema must be str, not {type(default_schema).__name__}")
    if ddl_type is not None and (not isinstance(ddl_type, int) or isinstance(ddl_type, bool)):
        raise TypeError(f"ddl_type must be int or None, not {type(ddl_type).__name__}")
    ctx = _Context(query, default_schema, ddl_type)
    try:
        tokens = _sqlglot(_DIALECT.tokenize, query)
    except SqlglotError as err:
        return [ctx.unclassified(f"cannot tokenize the statement: {_first_line(err)}")]
    except _Unclassified as err:
        return [ctx.unclassified(str(err))]
    changes: list[SchemaChange] = []
    for statement in _split(tokens, TokenType.SEMICOLON):
        changes.extend(_parse_statement(ctx, statement))
    return changes or [ctx.unclassified("no statement in the query")]


def _parse_statement(ctx: _Context, tokens: list[Token]) -> list[SchemaChange]:
    try:
        words = _words(tokens, 3)
        if words[0] == "ALTER" and "TABLE" in words[1:3]:
            return _alter_table(ctx, tokens)
        text = _text(ctx, tokens)
        if words[0] == "CREATE" and "TABLE" in words[1:3]:
            text = _without_tidb_indexes(ctx, tokens)
        try:
            node: exp.Expr | None = _parse_one(text)
            error = ""
        except (SqlglotError, _Unclassified) as err:
            node, error = None, _first_line(err)
        changes = _from_statement(ctx, node) if node is not None and not isinstance(node, exp.Command) else None
        if changes is None:
            changes = _from_keywords(ctx, tokens)
        if changes is None:
            if error:
                reason = f"sqlglot cannot parse it: {error}"
            elif isinstance(node, exp.Command):
                reason = f"unsupported statement {node.name.upper()} ..."
            else:
                reason = f"not a DDL statement this module knows ({type(node).__name__})"
            changes = [ctx.unclassified(reason)]
        return changes
    except _Unclassified as err:
        return [ctx.unclassified(str(err))]
    except (SqlglotError, UnsupportedColumnTypeError) as err:
        return [ctx.unclassified(_first_line(err))]
    except RecursionError:
        return [ctx.unclassified("statement nested too deeply to parse")]
    except Exception as err:  # noqa: BLE001 - a DDL stream must not stop on a classifier bug
        return [ctx.unclassified(f"internal error while classifying: {type(err).__name__}: {_first_line(err)}")]


def _parse_one(text: str) -> exp.Expr:
    statements = [s for s in _sqlglot(_DIALECT.parse, text) if s is not None]
    if len(statements) != 1:
        raise _Unclassified(f"expected one statement, found {len(statements)}")
    return statements[0]


def _from_statement(ctx: _Context, node: exp.Expr) -> list[SchemaChange] | None:
    """Changes of one parsed statement, or None when the node is not a statement this module knows."""
    if isinstance(node, RenameTables):
        out: list[SchemaChange] = []
        for pair in node.expressions:
            old, new = pair.expressions
            out.append(RenameTable(*ctx.table_ref(old), *ctx.table_ref(new)))
        return out
    if isinstance(node, exp.Create):
        return _create(ctx, node)
    if isinstance(node, exp.Drop):
        return _drop(ctx, node)
    if isinstance(node, exp.TruncateTable):
        if node.args.get("is_database"):
            return None
        return [TruncateTable(*ctx.table_ref(t)) for t in node.expressions]
    if isinstance(node, exp.Alter):
        kind = str(node.args.get("kind") or "").upper()
        if kind == "TABLE":
            schema, table = ctx.table_ref(node.this)
            return _alter_node(ctx, node, schema, table)
        if kind == "VIEW":
            return [NoOp("view", "ALTER VIEW")]
        if kind == "SEQUENCE":
            return [NoOp("sequence", "ALTER SEQUENCE")]
        return None
    return None


def _create(ctx: _Context, node: exp.Create) -> list[SchemaChange] | None:
    kind = str(node.args.get("kind") or "").upper()
    target = node.this
    if kind in ("DATABASE", "SCHEMA"):
        return [CreateDatabase(_database_name(target))]
    if kind == "VIEW":
        return [NoOp("view", "CREATE VIEW", *_maybe_ref(ctx, target))]
    if kind == "SEQUENCE":
        return [NoOp("sequence", "CREATE SEQUENCE", *_maybe_ref(ctx, target))]
    if kind == "INDEX" and isinstance(target, exp.Index):
        schema, table = ctx.table_ref(target.args.get("table"))
        params = target.args.get("params")
        parts = params.args.get("columns") if params is not None else None
        columns = _key_columns(parts or [])
        if node.args.get("unique") and columns:
            return [AddUniqueKey(schema, table, _name_or_none(target.this), columns)]
        what = "CREATE UNIQUE INDEX over an expression" if node.args.get("unique") else "CREATE INDEX"
        return [NoOp("index", what, schema, table)]
    if kind != "TABLE":
        return None
    return [_create_table(ctx, node)]


def _create_table(ctx: _Context, node: exp.Create) -> SchemaChange:
    properties = node.args.get("properties")
    props = list(properties.expressions) if properties is not None else []
    target = node.this
    elements = list(target.expressions) if isinstance(target, exp.Schema) else []
    table_node = target.this if isinstance(target, exp.Schema) else target
    schema, table = ctx.table_ref(table_node)
    if any(isinstance(p, exp.TemporaryProperty) for p in props):
        return NoOp("temporary_table", "TiCDC does not replicate temporary tables", schema, table)
    if node.args.get("expression") is not None:
        raise _Unclassified("CREATE TABLE ... AS SELECT")
    if_not_exists = bool(node.args.get("exists"))
    like = next((p for p in [*elements, *props] if isinstance(p, exp.LikeProperty)), None)
    if like is not None:
        return CreateTable(schema, table, like=ctx.table_ref(like.this), if_not_exists=if_not_exists)

    columns: list[ColumnDef] = []
    primary_key: tuple[str, ...] = ()
    unique_keys: list[tuple[str, ...]] = []
    for element in elements:
        if isinstance(element, exp.ColumnDef):
            column, in_pk, in_unique = _column_def(element)
            columns.append(column)
            if in_pk:
                primary_key = (column.name,)
            if in_unique:
                unique_keys.append((column.name,))
            continue
        key = _table_key(element)
        if key is None:
            continue  # plain index, foreign key, check constraint: no effect on replication keys
        is_primary, _name, key_columns = key
        if key_columns is None:
            continue  # key over an expression
        if is_primary:
            primary_key = key_columns
        elif key_columns not in unique_keys:
            unique_keys.append(key_columns)
    if not columns:
        raise _Unclassified("CREATE TABLE without columns")
    if primary_key:
        columns = [dataclasses.replace(c, nullable=False) if c.name in primary_key else c for c in columns]
    return CreateTable(
        schema, table, tuple(columns), primary_key, tuple(unique_keys), None, if_not_exists
    )


def _drop(ctx: _Context, node: exp.Drop) -> list[SchemaChange] | None:
    kind = str(node.args.get("kind") or "").upper()
    tables = node.args.get("tables") or []
    if kind in ("DATABASE", "SCHEMA"):
        return [DropDatabase(_database_name(t)) for t in tables]
    if kind == "TABLE":
        if node.args.get("temporary"):
            return [NoOp("temporary_table", "TiCDC does not replicate temporary tables")]
        return [DropTable(*ctx.table_ref(t)) for t in tables]
    if kind == "VIEW":
        return [NoOp("view", "DROP VIEW", *ctx.table_ref(t)) for t in tables]
    if kind == "SEQUENCE":
        return [NoOp("sequence", "DROP SEQUENCE", *ctx.table_ref(t)) for t in tables]
    if kind == "INDEX":
        on = node.args.get("cluster")
        schema, table = ctx.table_ref(on.this if isinstance(on, exp.OnProperty) else None)
        return [_drop_index(schema, table, t.name) for t in tables]
    return None


def _drop_index(schema: str, table: str, name: str) -> SchemaChange:
    # MySQL: the primary key is the index named PRIMARY; `DROP INDEX `PRIMARY`` drops it.
    if name.upper() == "PRIMARY":
        return DropPrimaryKey(schema, table)
    return DropIndex(schema, table, name)


# ------------------------------------------------------------------------------------- ALTER TABLE


def _alter_table(ctx: _Context, tokens: list[Token]) -> list[SchemaChange]:
    """ALTER TABLE: split into clauses at top-level commas and classify each on its own."""
    index = next((i for i, t in enumerate(tokens) if t.token_type == TokenType.TABLE), len(tokens)) + 1
    if index >= len(tokens):
        raise _Unclassified("ALTER TABLE without a table name")
    name_end = index + 2 if index + 2 < len(tokens) and tokens[index + 1].token_type == TokenType.DOT else index
    name_text = _text(ctx, tokens[index : name_end + 1])
    schema, table = _table_name(ctx, name_text)
    if name_end + 1 < len(tokens) and tokens[name_end + 1].token_type == TokenType.DOT:
        raise _Unclassified(f"not a table name: {_text(ctx, tokens[index : name_end + 3])!r}")
    clauses = _alter_clauses(tokens[name_end + 1 :])
    if not clauses:
        raise _Unclassified("ALTER TABLE without a clause")
    changes: list[SchemaChange] = []
    for clause in clauses:
        try:
            changes.extend(_alter_clause(ctx, name_text, schema, table, clause))
        except _Unclassified as err:
            changes.append(ctx.unclassified(str(err), schema, table))
        except (SqlglotError, UnsupportedColumnTypeError) as err:
            changes.append(ctx.unclassified(_first_line(err), schema, table))
        except RecursionError:
            changes.append(ctx.unclassified("statement nested too deeply to parse", schema, table))
        except Exception as err:  # noqa: BLE001 - a DDL stream must not stop on a classifier bug
            reason = f"internal error while classifying: {type(err).__name__}: {_first_line(err)}"
            changes.append(ctx.unclassified(reason, schema, table))
    return changes


def _alter_clauses(tokens: list[Token]) -> list[list[Token]]:
    clauses: list[list[Token]] = []
    for clause in _split(tokens, TokenType.COMMA):
        if not clauses:
            clauses.append(clause)
            continue
        previous = _words(clauses[-1], 4)
        # `SET TIFLASH REPLICA 1 LOCATION LABELS 'a', 'b'`: the label list continues the clause.
        # MySQL: `ALTER TABLE t [alter_option, ...] [partition_options]`: partition options come last,
        # so whatever follows one (`DROP PARTITION p1, p2`) is part of it.
        if _is_partition_clause(previous) or (
            previous[:2] == ["SET", "TIFLASH"] and clause[0].token_type == TokenType.STRING
        ):
            clauses[-1] = clauses[-1] + clause
        else:
            clauses.append(clause)
    return clauses


def _alter_clause(
    ctx: _Context, name_text: str, schema: str, table: str, clause: list[Token]
) -> list[SchemaChange]:
    special = _tidb_clause(ctx, schema, table, clause)
    if special is not None:
        return special
    clause_text = _text(ctx, clause)
    try:
        node = _parse_one(f"ALTER TABLE {name_text} {clause_text}")
    except SqlglotError as err:
        raise _Unclassified(f"sqlglot cannot parse clause {clause_text!r}: {_first_line(err)}") from None
    if not isinstance(node, exp.Alter):
        raise _Unclassified(f"unsupported ALTER TABLE clause {clause_text!r}")
    return _alter_node(ctx, node, schema, table)


def _tidb_clause(ctx: _Context, schema: str, table: str, clause: list[Token]) -> list[SchemaChange] | None:
    """Clauses only TiDB has (or sqlglot cannot parse), recognised by their leading keywords."""
    w = _words(clause, 4)

    def noop(kind: str, reason: str, affects_data: bool = False) -> list[SchemaChange]:
        return [NoOp(kind, reason, schema, table, affects_data)]

    if w[0] == "SET" and "TIFLASH" in w[1:3]:
        return noop("tiflash", " ".join(w[:3]))
    if _is_partition_clause(w):
        return noop("partition", " ".join(x for x in w[:2] if x), w[0] in ("DROP", "TRUNCATE", "EXCHANGE"))
    if w[0] in ("CACHE", "NOCACHE"):
        return noop("cache", w[0])
    if w[0] == "PLACEMENT" or w[:2] == ["DEFAULT", "PLACEMENT"]:
        return noop("placement", "placement policy")
    if w[0] in ("TTL", "TTL_ENABLE", "TTL_JOB_INTERVAL") or w[:2] == ["REMOVE", "TTL"]:
        return noop("ttl", w[0] if w[0] != "REMOVE" else "REMOVE TTL")
    if w[0] == "CONVERT":
        return noop("charset", "CONVERT TO CHARACTER SET")
    # ADD CHECK (...) / ADD CONSTRAINT [name] CHECK (...); not ADD c INT CHECK (...), a column with its check
    if (w[0] == "ADD" and (w[1] == "CHECK" or (w[1] == "CONSTRAINT" and "CHECK" in w[2:4]))) or (
            w[0] in ("DROP", "ALTER") and w[1] in ("CHECK", "CONSTRAINT")):
        return noop("check_constraint", f"{w[0]} CHECK constraint")
    if w[0] in ("AUTO_INCREMENT", "AUTO_ID_CACHE", "AUTO_RANDOM_BASE"):
        return noop("auto_id", f"table option {w[0]}")
    if w[0] in ("SHARD_ROW_ID_BITS", "PRE_SPLIT_REGIONS"):
        return noop("table_option", f"table option {w[0]}")
    if w[0] == "ADD" and w[1] in ("VECTOR", "COLUMNAR") and w[2] in ("INDEX", "KEY"):
        return noop("index", f"ADD {w[1]} INDEX")
    if w[0] in ("LOCK", "ALGORITHM"):
        return []  # execution hints (LOCK=NONE, ALGORITHM=INPLACE), not schema changes
    if w[0] == "ADD" and (w[1] == "(" or (w[1] == "COLUMN" and w[2] == "(")):
        return _add_column_list(ctx, schema, table, clause)
    if w[0] == "RENAME" and w[1] == "AS":  # sqlglot knows RENAME [TO] only
        return [RenameTable(schema, table, *_table_name(ctx, _text(ctx, clause[2:])))]
    return None


def _is_partition_clause(words: list[str]) -> bool:
    # ADD/DROP/TRUNCATE/COALESCE/REORGANIZE/EXCHANGE/ANALYZE/... PARTITION, PARTITION BY, REMOVE
    # PARTITIONING, and TiDB's interval partitioning FIRST/LAST PARTITION LESS THAN (...).
    return "PARTITION" in words[:2] or "PARTITIONING" in words[:2]


def _add_column_list(ctx: _Context, schema: str, table: str, clause: list[Token]) -> list[SchemaChange]:
    """``ADD [COLUMN] (a INT, b TEXT)``: sqlglot has no grammar for it, so the list is parsed as the
    column list of a CREATE TABLE."""
    open_at = next((i for i, t in enumerate(clause) if t.token_type == TokenType.L_PAREN), len(clause))
    if clause[-1].token_type != TokenType.R_PAREN or open_at + 1 >= len(clause) - 1:
        raise _Unclassified("ADD COLUMN (...) without a column list")
    inner = ctx.query[clause[open_at].end + 1 : clause[-1].start]
    node = _parse_one(f"CREATE TABLE _t ({inner})")
    target = node.this if isinstance(node, exp.Create) else None
    elements = target.expressions if isinstance(target, exp.Schema) else []
    if not elements or not all(isinstance(e, exp.ColumnDef) for e in elements):
        raise _Unclassified("ADD COLUMN (...) with something other than column definitions")
    columns, keys = [], []
    for element in elements:
        column, in_pk, in_unique = _column_def(element)
        columns.append(column)
        keys.extend(_inline_keys(schema, table, column.name, in_pk, in_unique))
    return [AddColumns(schema, table, tuple(columns), (None,) * len(columns)), *keys]


def _alter_node(ctx: _Context, node: exp.Alter, schema: str, table: str) -> list[SchemaChange]:
    changes: list[SchemaChange] = []
    for action in node.args.get("actions") or []:
        changes.extend(_alter_action(ctx, action, schema, table))
    for option in node.args.get("options") or []:
        change = _table_option(option, schema, table)
        if change is not None:
            changes.append(change)
    return changes


def _alter_action(ctx: _Context, action: exp.Expr, schema: str, table: str) -> list[SchemaChange]:
    if isinstance(action, exp.ColumnDef):
        column, in_pk, in_unique = _column_def(action)
        position = _position(action.args.get("position"))
        return [
            AddColumns(schema, table, (column,), (position,)),
            *_inline_keys(schema, table, column.name, in_pk, in_unique),
        ]
    if isinstance(action, exp.ModifyColumn):
        definition = action.this
        if not isinstance(definition, exp.ColumnDef):
            raise _Unclassified(f"unsupported column change {_sql(action)!r}")
        column, in_pk, in_unique = _column_def(definition)
        position = _position(definition.args.get("position"))
        out: list[SchemaChange] = []
        old = action.args.get("rename_from")
        if old is not None and old.name != column.name:
            out.append(RenameColumn(schema, table, old.name, column.name))
        out.append(ModifyColumn(schema, table, column.name, column, position))
        out.extend(_inline_keys(schema, table, column.name, in_pk, in_unique))
        return out
    if isinstance(action, exp.RenameColumn):
        return [RenameColumn(schema, table, action.this.name, action.args["to"].name)]
    if isinstance(action, exp.AlterColumn):
        name = action.this.name
        if action.args.get("drop"):
            return [DropDefault(schema, table, name)]
        if action.args.get("default") is not None:
            return [SetDefault(schema, table, name, _default_text(action.args["default"]))]
        if action.args.get("visible"):
            return [NoOp("table_option", f"ALTER COLUMN SET {action.args['visible']}", schema, table)]
        raise _Unclassified(f"unsupported ALTER COLUMN {_sql(action)!r}")
    if isinstance(action, exp.Drop):
        kind = str(action.args.get("kind") or "").upper()
        names = [t.name for t in action.args.get("tables") or []]
        if kind == "COLUMN":
            return [DropColumn(schema, table, name) for name in names]
        if kind in ("INDEX", "KEY"):
            return [_drop_index(schema, table, name) for name in names]
        if kind == "FOREIGN KEY":
            return [NoOp("foreign_key", "DROP FOREIGN KEY", schema, table)]
        raise _Unclassified(f"unsupported DROP {kind} clause")
    if isinstance(action, exp.DropPrimaryKey):
        return [DropPrimaryKey(schema, table)]
    if isinstance(action, exp.AddConstraint):
        return [_add_constraint(c, schema, table) for c in action.expressions]
    if isinstance(action, exp.AlterRename):
        return [RenameTable(schema, table, *ctx.table_ref(action.this))]
    if isinstance(action, (exp.RenameIndex, exp.AlterIndex)):
        return [NoOp("index", "RENAME INDEX" if isinstance(action, exp.RenameIndex) else "ALTER INDEX", schema, table)]
    if isinstance(action, exp.ForceProperty):
        return [NoOp("table_option", "FORCE (table rebuild)", schema, table)]
    raise _Unclassified(f"unsupported ALTER TABLE clause {_sql(action)!r}")


def _add_constraint(node: exp.Expr, schema: str, table: str) -> SchemaChange:
    key = _table_key(node)
    if key is None:
        inner = node.expressions if isinstance(node, exp.Constraint) else [node]
        if any(isinstance(e, exp.ForeignKey) for e in inner):
            return NoOp("foreign_key", "ADD FOREIGN KEY", schema, table)
        return NoOp("index", "ADD INDEX", schema, table)
    is_primary, name, columns = key
    if columns is None:
        return NoOp("index", "ADD UNIQUE over an expression", schema, table)
    if is_primary:
        return AddPrimaryKey(schema, table, columns)
    return AddUniqueKey(schema, table, name, columns)


_OPTION_KINDS: dict[type[exp.Expr], str] = {
    exp.SchemaCommentProperty: "comment",
    exp.AutoIncrementProperty: "auto_id",
    exp.CharacterSetProperty: "charset",
    exp.CollateProperty: "charset",
    exp.EngineProperty: "table_option",
    exp.SequenceProperties: "cache",  # sqlglot reads TiDB's `ALTER TABLE t CACHE` as sequence options
}
_PROPERTY_KINDS = {"AUTO_ID_CACHE": "auto_id", "AUTO_RANDOM_BASE": "auto_id"}


def _table_option(option: exp.Expr, schema: str, table: str) -> SchemaChange | None:
    if isinstance(option, (exp.LockProperty, exp.AlgorithmProperty)):
        return None  # LOCK=..., ALGORITHM=...: how to run the ALTER, not what it changes
    if isinstance(option, exp.Property) and type(option) is exp.Property:
        name = option.name.upper()
        return NoOp(_PROPERTY_KINDS.get(name, "table_option"), f"table option {name}", schema, table)
    kind = _OPTION_KINDS.get(type(option), "table_option")
    return NoOp(kind, f"table option {_sql(option)}", schema, table)


# ----------------------------------------------------------------------------- column definitions


def _column_def(node: exp.ColumnDef) -> tuple[ColumnDef, bool, bool]:
    """A ColumnDef, and whether the definition makes it the primary key / a unique key on its own."""
    kind = node.args.get("kind")
    if not isinstance(kind, exp.DataType):
        raise _Unclassified(f"column {node.name!r} has no type")
    constraints = node.args.get("constraints") or []
    nullable = True
    default: str | None = None
    auto_increment = generated = virtual = in_pk = in_unique = False
    comment: str | None = None
    for constraint in constraints:
        item = constraint.args.get("kind") if isinstance(constraint, exp.ColumnConstraint) else constraint
        if isinstance(item, exp.NotNullColumnConstraint):
            nullable = bool(item.args.get("allow_null"))
        elif isinstance(item, exp.DefaultColumnConstraint):
            default = _default_text(item.this)
        elif isinstance(item, exp.AutoIncrementColumnConstraint):
            auto_increment = True
        elif isinstance(item, exp.CommentColumnConstraint):
            comment = item.this.this if isinstance(item.this, exp.Literal) else _sql(item.this)
        elif isinstance(item, exp.ComputedColumnConstraint):
            generated, virtual = True, not item.args.get("persisted")
        elif isinstance(item, exp.GeneratedAsIdentityColumnConstraint):
            # (``GENERATED ALWAYS AS (expr)`` with neither STORED nor VIRTUAL: MySQL's default is VIRTUAL)
            generated, virtual = True, item.args.get("expression") is not None
        elif isinstance(item, exp.PrimaryKeyColumnConstraint):
            in_pk = True
        elif isinstance(item, exp.UniqueColumnConstraint):
            in_unique = True
    if kind.this == exp.DataType.Type.SERIAL:
        # SERIAL = BIGINT UNSIGNED NOT NULL AUTO_INCREMENT UNIQUE
        nullable, auto_increment, in_unique = False, True, True
    if in_pk:
        nullable = False  # MySQL: primary-key columns are NOT NULL
    column_type = column_type_from_sqlglot(kind, constraints)
    column = ColumnDef(node.name, column_type, nullable, default, auto_increment, comment, generated, virtual)
    return column, in_pk, in_unique


def _inline_keys(schema: str, table: str, name: str, in_pk: bool, in_unique: bool) -> list[SchemaChange]:
    keys: list[SchemaChange] = []
    if in_pk:
        keys.append(AddPrimaryKey(schema, table, (name,)))
    if in_unique:
        keys.append(AddUniqueKey(schema, table, None, (name,)))
    return keys


def _position(node: exp.Expr | None) -> ColumnPosition | None:
    if not isinstance(node, exp.ColumnPosition):
        return None
    where = str(node.args.get("position") or "").upper()
    if where == "FIRST":
        return FIRST
    if where == "AFTER" and node.this is not None:
        return ColumnPosition(after=node.this.name)
    raise _Unclassified(f"unsupported column position {_sql(node)!r}")


_NOW_FUNCTIONS = ("NOW", "CURRENT_TIMESTAMP", "LOCALTIME", "LOCALTIMESTAMP")


def _default_text(node: exp.Expr) -> str:
    """The canonical MySQL text of a DEFAULT value (see :class:`ColumnDef`)."""
    if isinstance(node, exp.Introducer):  # _utf8mb4'abc': the charset does not change the value
        node = node.expression
    if isinstance(node, exp.National):  # N'abc': the national character set, the same text
        node = exp.Literal.string(node.this)
    if isinstance(node, exp.Concat) and node.expressions and all(
            isinstance(e, exp.Literal) and e.is_string for e in node.expressions):
        node = exp.Literal.string("".join(e.this for e in node.expressions))  # 'a' 'b' is 'ab'
    fsp: exp.Expr | None = None
    if isinstance(node, (exp.CurrentTimestamp, exp.Localtime, exp.Localtimestamp)):
        fsp = node.this
    elif isinstance(node, exp.Anonymous) and str(node.this).upper() in _NOW_FUNCTIONS:
        fsp = node.expressions[0] if node.expressions else None
    else:
        return node.sql(dialect=_DIALECT)
    # MySQL prints NOW(), LOCALTIME and LOCALTIMESTAMP defaults as CURRENT_TIMESTAMP.
    if isinstance(fsp, exp.Literal) and fsp.this not in ("", "0"):
        return f"CURRENT_TIMESTAMP({fsp.this})"
    return "CURRENT_TIMESTAMP"


# ------------------------------------------------------------------------------------------- keys


def _table_key(node: exp.Expr) -> tuple[bool, str | None, tuple[str, ...] | None] | None:
    """(is primary, name, columns or None for an expression key) of a PRIMARY/UNIQUE key element."""
    name: str | None = None
    if isinstance(node, exp.Constraint):
        name = _name_or_none(node.this)
        inner = list(node.expressions)
        if any(isinstance(e, exp.PrimaryKeyColumnConstraint) for e in inner):
            # CONSTRAINT pk PRIMARY KEY CLUSTERED (a): sqlglot keeps the columns on the CLUSTERED part.
            clustered = next((e for e in inner if isinstance(e, exp.ClusteredColumnConstraint)), None)
            parts = clustered.this if clustered is not None else []
            return True, name, _key_columns(parts if isinstance(parts, list) else [parts])
        node = next((e for e in inner if isinstance(e, (exp.PrimaryKey, exp.UniqueColumnConstraint))), node)
    if isinstance(node, exp.PrimaryKey):
        return True, name, _key_columns(node.expressions)
    if isinstance(node, exp.UniqueColumnConstraint):
        schema = node.this
        if not isinstance(schema, exp.Schema):
            return None
        return False, _name_or_none(schema.this) or name, _key_columns(schema.expressions)
    return None


def _key_columns(parts: Sequence[exp.Expr]) -> tuple[str, ...] | None:
    names = []
    for part in parts:
        name = _key_part(part)
        if name is None:
            return None
        names.append(name)
    return tuple(names) or None


def _key_part(node: exp.Expr) -> str | None:
    while isinstance(node, exp.Ordered):
        node = node.this
    if isinstance(node, exp.ColumnPrefix):  # a(10): unique on a prefix is unique on the column too
        node = node.this
    elif isinstance(node, exp.Anonymous) and len(node.expressions) == 1:  # CREATE INDEX ... (`a`(10))
        node = node.this if isinstance(node.this, exp.Identifier) else exp.to_identifier(str(node.this))
    if isinstance(node, (exp.Identifier, exp.Column)):
        return node.name
    return None  # a functional key part: `((a + 1))`


# ------------------------------------------------------------------------ statements sqlglot rejects


def _from_keywords(ctx: _Context, tokens: list[Token]) -> list[SchemaChange] | None:
    """TiDB statements sqlglot cannot parse (or reads as an opaque Command), by their leading keywords."""
    w = _words(tokens, 6)
    if w[0] == "CREATE" and "TABLE" in w[1:4]:
        return _create_table_without_options(ctx, tokens)
    if w[0] == "ALTER" and w[1] in ("DATABASE", "SCHEMA"):
        rest = set(_words(tokens, len(tokens)))
        kind = "tiflash" if "TIFLASH" in rest else "placement" if "PLACEMENT" in rest else "charset"
        return [NoOp(kind, f"ALTER DATABASE ({kind})")]
    if w[0] in ("CREATE", "ALTER", "DROP"):
        if "PLACEMENT" in w[1:4]:
            return [NoOp("placement", f"{w[0]} PLACEMENT POLICY")]
        if "RESOURCE" in w[1:4]:
            return [NoOp("resource_group", f"{w[0]} RESOURCE GROUP")]
        if "SEQUENCE" in w[1:4]:
            return [NoOp("sequence", f"{w[0]} SEQUENCE")]
        if "VIEW" in w:
            return [NoOp("view", f"{w[0]} VIEW")]
        if w[1] in ("VECTOR", "COLUMNAR") and w[2] in ("INDEX", "KEY"):
            return [NoOp("index", f"{w[0]} {w[1]} INDEX")]
    if w[0] in ("LOCK", "UNLOCK") or w[0].startswith(("LOCK ", "UNLOCK ")):
        return [NoOp("lock", "LOCK/UNLOCK TABLES")]
    if w[0] in ("RECOVER", "FLASHBACK"):
        return [ctx.unclassified(f"{w[0]} {w[1]} brings back a dropped object and its rows")]
    return None


def _without_tidb_indexes(ctx: _Context, tokens: list[Token]) -> str:
    """The text of a CREATE TABLE without the elements of its column list that are TiDB's VECTOR or
    COLUMNAR indexes (``VECTOR INDEX idx((VEC_COSINE_DISTANCE(v))) USING HNSW``, TiDB 8.4+), which sqlglot
    reads as a column named VECTOR; an index never changes columns or keys."""
    start, end = tokens[0].start, tokens[-1].end + 1
    open_at = next((i for i, t in enumerate(tokens) if t.token_type == TokenType.L_PAREN), None)
    if open_at is None:
        return ctx.query[start:end]
    cuts: list[tuple[int, int]] = []
    depth, first = 0, open_at + 1
    for i in range(open_at, len(tokens)):
        kind = tokens[i].token_type
        if kind == TokenType.L_PAREN:
            depth += 1
            continue
        if depth == 1 and kind in (TokenType.COMMA, TokenType.R_PAREN):
            element = tokens[first:i]
            if (len(element) > 2 and element[0].text.upper() in ("VECTOR", "COLUMNAR")
                    and element[1].text.upper() in ("INDEX", "KEY")):
                before = tokens[first - 1]
                if before.token_type == TokenType.COMMA:  # ", VECTOR INDEX ..." (the comma before it goes)
                    cuts.append((before.start, element[-1].end + 1))
                elif kind == TokenType.COMMA:  # the first element: the comma after it goes
                    cuts.append((element[0].start, tokens[i].end + 1))
            first = i + 1
        if kind == TokenType.R_PAREN:
            depth -= 1
            if depth == 0:
                break
    text, at = [], start
    for cut_start, cut_end in cuts:
        text.append(ctx.query[at:cut_start])
        at = cut_end
    text.append(ctx.query[at:end])
    return "".join(text)


def _create_table_without_options(ctx: _Context, tokens: list[Token]) -> list[SchemaChange] | None:
    """CREATE TABLE whose table options sqlglot rejects (PARTITION BY ..., TTL = ...): the options never
    change columns or keys, so the statement is parsed again up to the end of its column list."""
    open_at = next((i for i, t in enumerate(tokens) if t.token_type == TokenType.L_PAREN), None)
    if open_at is None:
        return None
    depth = 0
    for i in range(open_at, len(tokens)):
        kind = tokens[i].token_type
        depth += (kind == TokenType.L_PAREN) - (kind == TokenType.R_PAREN)
        if depth == 0:
            if i == len(tokens) - 1:
                return None  # nothing was cut: the column list itself is what sqlglot rejects
            node = _parse_one(_text(ctx, tokens[: i + 1]))
            if isinstance(node, exp.Create) and str(node.args.get("kind") or "").upper() == "TABLE":
                return [_create_table(ctx, node)]
            return None
    return None


# ---------------------------------------------------------------------------------------- helpers


def _split(tokens: list[Token], separator: TokenType) -> Iterator[list[Token]]:
    """Runs of tokens between top-level separators (not inside parentheses); empty runs skipped."""
    depth = 0
    current: list[Token] = []
    for token in tokens:
        kind = token.token_type
        if kind == TokenType.L_PAREN:
            depth += 1
        elif kind == TokenType.R_PAREN:
            depth = max(depth - 1, 0)
        elif kind == separator and (depth == 0 or separator == TokenType.SEMICOLON):
            if current:
                yield current
            current = []
            depth = 0
            continue
        current.append(token)
    if current:
        yield current


def _words(tokens: Sequence[Token], n: int) -> list[str]:
    """The first ``n`` upper-cased words of the tokens, padded with "" (quoted identifiers and strings
    are never keywords: they come back as "")."""
    words: list[str] = []
    for token in tokens[:n]:
        if token.token_type in (TokenType.IDENTIFIER, TokenType.STRING):
            words.append("")
        else:
            # sqlglot has multi-word tokens ("PARTITION BY", "CHARACTER SET"): one word each here.
            words.extend(token.text.upper().split() or [""])
    words = words[:n]
    return words + [""] * (n - len(words))


def _text(ctx: _Context, tokens: Sequence[Token]) -> str:
    if not tokens:
        raise _Unclassified("a clause ends too early")
    return ctx.query[tokens[0].start : tokens[-1].end + 1]


def _table_name(ctx: _Context, text: str) -> tuple[str, str]:
    """(schema, table) of a table name text such as ```db`.`t``` (sqlglot's table-name grammar)."""
    try:
        node = _sqlglot(lambda sql: sqlglot.maybe_parse(sql, into=exp.Table, dialect=_DIALECT), text)
    except SqlglotError as err:
        raise _Unclassified(f"cannot read the table name {text!r}: {_first_line(err)}") from None
    if not isinstance(node, exp.Table) or node.alias or node.catalog:
        raise _Unclassified(f"not a table name: {text!r}")
    return ctx.table_ref(node)


def _database_name(node: exp.Expr | None) -> str:
    # sqlglot keeps `CREATE DATABASE d` as Table(this=d) and `CREATE SCHEMA s` as Table(db=s).
    if isinstance(node, exp.Table) and (node.name or node.db):
        return node.name or node.db
    raise _Unclassified(f"expected a database name, found {_sql(node)!r}")


def _maybe_ref(ctx: _Context, node: exp.Expr | None) -> tuple[str, str]:
    if isinstance(node, exp.Schema):
        node = node.this
    return ctx.table_ref(node) if isinstance(node, exp.Table) and node.name else ("", "")


def _name_or_none(node: exp.Expr | None) -> str | None:
    return node.name or None if isinstance(node, exp.Expr) else None


def _sql(node: exp.Expr | None) -> str:
    return node.sql(dialect=_DIALECT) if isinstance(node, exp.Expr) else repr(node)


def _sqlglot(call: Callable[[str], _T], text: str) -> _T:
    """Run a sqlglot entry point; its failures other than SqlglotError (sqlglot 30 raises e.g. a
    TypeError for `ALTER TABLE t DEFAULT CLUSTERED`) become _Unclassified with the error as reason."""
    try:
        return call(text)
    except SqlglotError:
        raise
    except RecursionError:
        raise _Unclassified("statement nested too deeply to parse") from None
    except Exception as err:  # noqa: BLE001 - recorded as the reason of the Unknown change
        raise _Unclassified(f"sqlglot failed: {type(err).__name__}: {_first_line(err)}") from None


def _first_line(err: Exception) -> str:
    return str(err).split("\n", 1)[0]

