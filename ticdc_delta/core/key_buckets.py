"""Split one table's rows into key buckets, so that its per-table rules run on several cores at once.

:meth:`~.table_rules.TableRules.apply_table` runs once per table, in one Python worker: a table with most
of a changefeed's traffic would be held to one core however large the cluster. The rules are per key
once the key columns are known: replay drop, release and the value screen decide each record alone, and
:func:`~.merge.collapse` folds each key's changes alone. So a table's rows can be cut by key, each bucket
collapsed on its own, and the buckets' final changes put together again — provided that

* every record of a key is in that key's bucket. An update that changes the key touches two keys (it
  deletes the old one): it goes to both buckets, as *primary* in its new key's bucket and as *secondary*
  (:attr:`Routing.hashes` ``[1]``) in the old key's, where it only completes that key's history
  (``apply_table(secondary=...)``), and each bucket keeps only the final changes of its own keys
  (``apply_table(owns=...)``);
* nothing else depends on other records of the table: :class:`~.merge.KeyResolver` falls back on the
  key last flagged for the table when an image flags none, :class:`~ticdc_delta.delta.value_check.ValueScreen`
  looks at every record of the table when a column comes with two types, and the MERGE's columns are
  named in the order the final changes first carry them. :func:`splittable` says, from the
  :func:`layout` of the table's records (new and held), when none of that can differ; only such tables
  are split, the others keep one bucket.

:func:`key_hash` must give equal keys equal hashes in every process: numbers hash by value (``1``,
``1.0`` and ``Decimal(1)`` are one key in a Python dict), text and bytes by their bytes (Python's own
``hash`` of ``str`` is salted per process).
"""

from __future__ import annotations

import hashlib
import zlib
from decimal import Decimal
from typing import Any, Callable, Hashable, Iterable, NamedTuple, Sequence

from .merge import _COLUMN, KeyResolver, _key, flagged_key, spell_key
from .records import ChangeRecord, _new_tuple

__all__ = ["Layout", "Router", "Routing", "key_hash", "layout", "owns", "route", "signature", "split", "splittable"]


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big", signed=True)


def _value_bytes(value: Any) -> bytes:
    cls = value.__class__
    if cls is int:
        return b"#%d" % hash(value)
    if cls is str:
        return b"s" + value.encode("utf-8", "surrogatepass")
    if value is None:
        return b"n"
    if isinstance(value, (int, float, Decimal)):  # bool is an int; equal numbers hash alike (not salted)
        try:
            return b"#" + str(hash(value)).encode()
        except TypeError:  # a signalling NaN: never equal to anything
            return b"r" + repr(value).encode()
    if isinstance(value, str):
        return b"s" + value.encode("utf-8", "surrogatepass")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return b"b" + bytes(value)
    return b"r" + repr(value).encode("utf-8", "surrogatepass")


def key_hash(key: tuple[Any, ...] | None) -> int:
    """A 32-bit hash of a key (the tuple :func:`~.merge.collapse` keys its changes by), the same in every
    process; ``None`` (no key: the record fails in the rules) hashes to 0."""
    if key is None:
        return 0
    if len(key) == 1:
        return zlib.crc32(_value_bytes(key[0]))
    return zlib.crc32(b"\x00".join(len(b).to_bytes(4, "big") + b for b in map(_value_bytes, key)))


Layout = tuple[tuple[tuple[str, int, int], ...], ...]
"""The column layout of a record: per image (new, then old; one when both are laid out alike) the
``(name, type, flags)`` of its columns, in order."""


def layout(record: ChangeRecord) -> Layout:
    """The record's :data:`Layout`."""
    layouts = [tuple(map(_COLUMN, image)) for image in (record.new, record.old) if image is not None]
    if len(layouts) == 2 and layouts[0] == layouts[1]:
        layouts.pop()
    return tuple(layouts)


def signature(record_layout: Layout) -> int:
    """A signed 64-bit hash of a :data:`Layout`."""
    return _digest(repr(record_layout).encode("utf-8", "surrogatepass"))


def splittable(layouts: Iterable[Layout], override: Sequence[str] | None) -> bool:
    """Whether a table whose records have these layouts can be split into key buckets with the outcome of
    the table unsplit: every image gives the same key columns alone (``override``, else its flags; an
    image without flags would fall back on the key remembered from other records), every column keeps
    one type and flags (the value screen looks across records otherwise), and every image's columns are
    a prefix of the longest one's (so the buckets' final changes name the table's columns in one order:
    the Avro delete that carries only the key, columns added at the end), none of them twice."""
    names: set[tuple[str, ...]] = set()
    types: dict[str, tuple[int, int]] = {}
    longest: tuple[str, ...] = ()
    for record_layout in layouts:
        for image in record_layout:
            if override:
                names.add(spell_key(override, image))
            else:
                found = flagged_key(image)
                if found is None:
                    return False
                names.add(found)
            for name, type_code, flags in image:
                if types.setdefault(name, (type_code, flags)) != (type_code, flags):
                    return False
            columns = tuple(c[0] for c in image)
            if len(set(columns)) != len(columns):
                return False
            short, long_ = sorted((columns, longest), key=len)
            if long_[:len(short)] != short:
                return False
            longest = long_
    return len(names) == 1


def owns(bucket: int, buckets: int) -> Callable[[tuple[Any, ...]], bool]:
    """Whether a key belongs to ``bucket`` of ``buckets`` (as Spark's ``pmod(hash, buckets)`` places it)."""
    return lambda key: key_hash(key) % buckets == bucket


class Routing(NamedTuple):
    """Where a record goes: its layout :func:`signature` and the :func:`key_hash` of the key it writes,
    then, for an update that changes the key, of the key it deletes; and the :data:`Layout` itself."""

    signature: int
    hashes: list[int]
    layout: Layout


class Router:
    """:func:`route` for many records: the layouts' signatures and key positions are worked out once.

    Args:
        override: ``(schema, table) -> key columns or None`` (the YAML mapping, as
            :class:`~.merge.KeyResolver`'s ``lookup``).
    """

    def __init__(self, override: Callable[[str, str], Sequence[str] | None] | None = None) -> None:
        self._override = override
        self._overrides: dict[tuple[str, str], tuple[str, ...]] = {}
        self._shapes: dict[tuple[Any, Any], _Shape] = {}

    def __call__(self, record: ChangeRecord, new_layout: Hashable = None, old_layout: Hashable = None,
                 table: tuple[str, str] | None = None) -> Routing:
        """The :class:`Routing` of a row (its schema and table already folded as the rules fold them), with
        the key columns :func:`~.merge.collapse` takes for a :func:`splittable` table: the configured
        ones, else those the image flags (else all its columns: such a table is never split).
        ``new_layout``/``old_layout``: what identifies the images' layouts, when the caller has it (the
        decoders' shared :class:`~ticdc_delta.codec.model.ImageLayout`, which hashes once): the columns
        are then read once per layout, not per row. ``table``: the record's (folded) schema and table,
        when they differ from the record's."""
        new, old = record.new, record.old
        new_id = None if new is None else (new_layout if new_layout is not None else tuple(map(_COLUMN, new)))
        old_id = None if old is None else (old_layout if old_layout is not None else tuple(map(_COLUMN, old)))
        return self._route(new, old, new_id, old_id, table or (record.schema, record.table), layout, record, 3)

    def of_values(self, new: tuple[Any, ...] | None, old: tuple[Any, ...] | None, new_layout: Hashable,
                  old_layout: Hashable, table: tuple[str, str],
                  columns: Callable[[Any], Layout], source: Any) -> Routing:
        """:meth:`__call__` for a row given as its images' values (``new``, ``old``; ``None``: no such
        image), what identifies their layouts (as there; required) and its (folded) ``table``;
        ``columns(source)`` gives the row's :data:`Layout` (called once per pair of layouts)."""
        return self._route(new, old, None if new is None else new_layout, None if old is None else old_layout,
                           table, columns, source, None)

    def _route(self, new: Any, old: Any, new_id: Hashable, old_id: Hashable, ident: tuple[str, str],
               columns: Callable[[Any], Layout], source: Any, at: int | None) -> Routing:
        """The routing of a row whose images are ``new``/``old``: sequences of columns, whose value is at
        ``at`` (3: records' column tuples), or of values (``at`` ``None``); ``columns(source)``: its layout.
        The executors' decoder routes every row with it."""
        shape = self._shapes.get((new_id, old_id))
        if shape is None:
            found = columns(source)
            shape = self._shapes[(new_id, old_id)] = _Shape(signature(found), found, {})
        image = new if new is not None else old
        if image is None:
            return _new_tuple(Routing, (shape.signature, [0], shape.layout))
        positions = shape.positions.get(ident)
        if positions is None:
            positions = shape.positions[ident] = self._positions(ident, shape.layout[0],
                                                                 shape.layout[-1] if old is not None else None)
        new_at, old_at = positions
        if new_at is None:
            return _new_tuple(Routing, (shape.signature, [0], shape.layout))
        if at is None:
            key = (image[new_at[0]],) if len(new_at) == 1 else tuple([image[i] for i in new_at])
        else:
            key = tuple([image[i][at] for i in new_at])
        hashes = [key_hash(key)]
        if new is not None and old is not None and old_at is not None:
            if at is None:
                old_key = (old[old_at[0]],) if len(old_at) == 1 else tuple([old[i] for i in old_at])
            else:
                old_key = tuple([old[i][at] for i in old_at])
            if old_key != key:
                hashes.append(key_hash(old_key))
        return _new_tuple(Routing, (shape.signature, hashes, shape.layout))

    def _positions(self, ident: tuple[str, str], first: tuple[tuple[str, int, int], ...],
                   old: tuple[tuple[str, int, int], ...] | None) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        """Where the key columns are in the (first) image and in the old one (``None``: not all there)."""
        names = self._overrides.get(ident)
        if names is None:
            names = self._overrides[ident] = tuple((self._override(*ident) if self._override else None) or ())
        names = spell_key(names, first) if names else flagged_key(first) or tuple(c[0] for c in first)

        def at(columns: tuple[tuple[str, int, int], ...] | None) -> tuple[int, ...] | None:
            if columns is None:
                return None
            where = {c[0]: i for i, c in enumerate(columns)}  # (a splittable layout repeats no name)
            return tuple(where[n] for n in names) if all(n in where for n in names) else None

        return at(first), at(old)


class _Shape(NamedTuple):
    signature: int
    layout: Layout
    positions: dict[tuple[str, str], tuple[tuple[int, ...] | None, tuple[int, ...] | None]]


def route(record: ChangeRecord, keys: KeyResolver) -> Routing:
    """The :class:`Routing` of one row with the key columns ``keys`` gives, the way :func:`~.merge.collapse`
    takes them (:class:`Router` does the same for many rows, for :func:`splittable` tables)."""
    shape = layout(record)
    image = record.new if record.new is not None else record.old
    if image is None:
        return Routing(signature(shape), [0], shape)
    names = tuple(keys.key_columns(record.schema, record.table, image))
    key = _key(image, names)
    hashes = [key_hash(key)]
    if record.new is not None and record.old is not None and key is not None:
        old_key = _key(record.old, names)
        if old_key is not None and old_key != key:
            hashes.append(key_hash(old_key))
    return Routing(signature(shape), hashes, shape)


def split(records: Sequence[ChangeRecord], buckets: int, keys: KeyResolver,
          ) -> dict[int, tuple[list[ChangeRecord], set[tuple[str, int, int, int]]]]:
    """One table's records by bucket, as the ``spark`` engine groups them: per bucket its records and the
    coordinates of those that are there as secondary (:meth:`~.table_rules.TableRules.apply_table`'s
    ``secondary``)."""
    out: dict[int, tuple[list[ChangeRecord], set[tuple[str, int, int, int]]]] = {}
    for rec in records:
        hashes = route(rec, keys).hashes
        first = hashes[0] % buckets
        for i, h in enumerate(hashes):
            b = h % buckets
            if i and b == first:
                continue
            recs, secondary = out.setdefault(b, ([], set()))
            recs.append(rec)
            if i:
                secondary.add((rec.topic, rec.partition, rec.offset, rec.idx))
    return out
