"""Collapse ordered row changes to one final change per key, as a MERGE needs them.

Changes arrive in (commit_ts, partition offset) order. Each key ends as an *upsert* of its last new image
or a *delete*. An update whose key changed deletes the old key (TiCDC splits such updates into
DELETE + INSERT by default; when it does not, the old image tells us the old key).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..codec.model import ColumnFlag, Op
from ..locations import tidb_lower
from .records import ChangeRecord, ColumnTuple

__all__ = ["FinalChange", "TableChanges", "KeyResolver", "collapse", "flagged_key", "spell_key", "UPSERT", "DELETE"]

UPSERT = "u"
DELETE = "d"

_HANDLE = int(ColumnFlag.HANDLE_KEY)
_PRIMARY = int(ColumnFlag.PRIMARY_KEY)
_UNIQUE = int(ColumnFlag.UNIQUE_KEY)
_NULLABLE = int(ColumnFlag.NULLABLE)
_COLUMN = itemgetter(0, 1, 2)


def flagged_key(columns: Sequence[Sequence[Any]]) -> tuple[str, ...] | None:
    """The key an image's columns (``(name, type, flags, ...)``) flag: the handle-key columns (TiCDC's
    choice of primary or unique key), else the primary-key, else the unique-key ones — unless one of those
    is nullable: TiCDC hands a NOT NULL unique key the handle, and a unique key with a nullable column
    identifies no row (any number of rows may hold NULL there: keyed by it, they collapsed into one);
    ``None``: none."""
    for mask in (_HANDLE, _PRIMARY, _UNIQUE):
        names = tuple(c[0] for c in columns if c[2] & mask)
        if names:
            if mask == _UNIQUE and any(c[2] & _NULLABLE for c in columns if c[2] & mask):
                return None
            return names
    return None


def spell_key(names: Sequence[str], columns: Iterable[Sequence[Any]]) -> tuple[str, ...]:
    """A configured key (``tables[].key``) as the columns (``(name, ...)``) spell it: MySQL's column names
    are case-insensitive, so ``ID`` names the column ``id``. A name the columns hold exactly stays; one
    that matches a single column in another case — TiDB's case (:func:`~ticdc_delta.locations.tidb_lower`),
    so ``STRASSE`` does not name ``straße`` — takes its spelling; any other stays as given (the image
    lacks it: :class:`MissingKeyError` where it is needed)."""
    have = [c[0] for c in columns]
    if all(n in have for n in names):
        return tuple(names)
    out = []
    for n in names:
        if n not in have:
            lower = tidb_lower(n)
            folded = [c for c in have if tidb_lower(c) == lower]
            if len(folded) == 1:
                n = folded[0]
        out.append(n)
    return tuple(out)


@dataclass(slots=True)
class FinalChange:
    """The last change of one key: ``kind`` is :data:`UPSERT` (``image`` = new row) or :data:`DELETE`
    (``image`` = the old row, possibly only its key columns)."""

    kind: str
    image: tuple[ColumnTuple, ...]
    commit_ts: int | None
    op: str  # the source operation that produced it (insert / update / delete)


@dataclass(slots=True)
class TableChanges:
    """Final changes of one table within one step, with the key column names used."""

    schema: str
    table: str
    key_columns: tuple[str, ...]
    changes: dict[tuple[Any, ...], FinalChange] = field(default_factory=dict)
    source_rows: int = 0


class KeyResolver:
    """Chooses the merge key of each table: the YAML override, else the columns the image flags as
    handle key (TiCDC's choice of primary or unique key), else primary-key, else unique-key flags, else
    the key last flagged for the table, else every column of the image (a table without any key: rows
    are identified by all their values).

    Flags on the image win over what was remembered, so after ADD/DROP PRIMARY KEY the next rows merge
    on the new key; a later image without flags still uses the last known key.

    A configured key is matched to the image's columns without regard to case (:func:`spell_key`).

    Args:
        overrides: exact ``(schema, table) -> key columns``.
        lookup: ``(schema, table) -> key columns or None``, asked once per table when ``overrides`` has no
            entry — the job passes the YAML mapping's resolution (exact entries, then wildcards such as
            ``test.*``), so the override is decided in one place.
    """

    def __init__(
        self,
        overrides: Mapping[tuple[str, str], Sequence[str]] | None = None,
        *,
        lookup: Callable[[str, str], Sequence[str] | None] | None = None,
    ) -> None:
        if lookup is not None and not callable(lookup):
            raise TypeError(f"lookup must be callable, got {type(lookup).__name__}")
        self._overrides = {k: tuple(v) for k, v in (overrides or {}).items()}
        self._lookup = lookup
        self._looked_up: dict[tuple[str, str], tuple[str, ...]] = {}
        self._known: dict[tuple[str, str], tuple[str, ...]] = {}
        self._flagged: dict[tuple[tuple[str, int, int], ...], tuple[str, ...] | None] = {}  # per image layout
        self._spelled: dict[tuple[tuple[str, ...], tuple[tuple[str, int, int], ...]], tuple[str, ...]] = {}

    def override(self, schema: str, table: str) -> tuple[str, ...]:
        """The configured key of a table, ``()`` when none is configured."""
        ident = (schema, table)
        found = self._overrides.get(ident)
        if found:
            return found
        if self._lookup is None:
            return ()
        cached = self._looked_up.get(ident)
        if cached is None:
            cached = self._looked_up[ident] = tuple(self._lookup(schema, table) or ())
        return cached

    def key_columns(self, schema: str, table: str, image: tuple[ColumnTuple, ...]) -> tuple[str, ...]:
        ident = (schema, table)
        found = self.override(schema, table)
        shape = tuple(map(_COLUMN, image))
        if found:  # as the image spells it (one lookup per row once the layout is known)
            try:
                return self._spelled[found, shape]
            except KeyError:
                spelled = self._spelled[found, shape] = spell_key(found, shape)
                return spelled
        # The image's own flags win: after a key-changing DDL the row events flag the new key.
        try:  # (one lookup per row once the layout is known)
            flagged = self._flagged[shape]
        except KeyError:
            flagged = self._flagged[shape] = flagged_key(shape)
        if flagged is not None:
            self._known[ident] = flagged
            return flagged
        known = self._known.get(ident)
        if known:
            return known
        return tuple(c[0] for c in image)

    def forget(self, schema: str, table: str) -> None:
        """Drop the remembered key of a table (its key changed by DDL)."""
        self._known.pop((schema, table), None)


def _key(image: tuple[ColumnTuple, ...], names: tuple[str, ...]) -> tuple[Any, ...] | None:
    if len(names) == 1:
        name = names[0]
        for c in image:
            if c[0] == name:
                return (c[3],)
        return None
    values = {c[0]: c[3] for c in image}
    try:
        return tuple(values[n] for n in names)
    except KeyError:
        return None


class MissingKeyError(ValueError):
    """A row image lacks a key column."""


def collapse(
    records: Iterable[ChangeRecord],
    keys: KeyResolver,
    into: dict[tuple[str, str], TableChanges] | None = None,
) -> dict[tuple[str, str], TableChanges]:
    """Fold ``records`` (already in apply order) into the final change per (table, key).

    Raises:
        MissingKeyError: an image without one of its table's key columns.
    """
    tables: dict[tuple[str, str], TableChanges] = {} if into is None else into
    for rec in records:
        ident = (rec.schema, rec.table)
        image = rec.new if rec.new is not None else rec.old
        if image is None:
            raise MissingKeyError(f"{rec.schema}.{rec.table}: a row change without any column image")
        names = keys.key_columns(rec.schema, rec.table, image)
        tc = tables.get(ident)
        if tc is None:
            tc = tables[ident] = TableChanges(rec.schema, rec.table, names)
        tc.source_rows += 1
        if rec.new is None:  # delete
            k = _key(rec.old, names)  # type: ignore[arg-type]
            if k is None:
                raise MissingKeyError(f"{rec.schema}.{rec.table}: delete image lacks key columns {names}")
            tc.changes[k] = FinalChange(DELETE, rec.old, rec.commit_ts, Op.DELETE)  # type: ignore[arg-type]
            continue
        k = _key(rec.new, names)
        if k is None:
            raise MissingKeyError(f"{rec.schema}.{rec.table}: row image lacks key columns {names}")
        if rec.old is not None:
            old_k = _key(rec.old, names)
            if old_k is not None and old_k != k:
                # the key changed: the row under the old key is gone
                tc.changes[old_k] = FinalChange(DELETE, rec.old, rec.commit_ts, Op.DELETE)
        tc.changes.pop(k, None)  # keep dict order = order of the final change
        tc.changes[k] = FinalChange(UPSERT, rec.new, rec.commit_ts, rec.op)
    return tables
