"""Decoded events as they travel from the executors to the driver and into the held-rows state.

A :class:`ChangeRecord` is a row change plus its Kafka coordinates; a :class:`DDLRecord` a DDL plus its
coordinates. Column images are tuples of ``(name, type code, flags as int, value)`` — plain tuples, so
they pickle small and fast (``ColumnFlag`` members would be rebuilt one enum call per column). A decoded
:class:`~ticdc_delta.codec.model.Image` becomes one by zipping its layout with its values, without
building a Column. Between the ``spark`` engine's passes over one micro-batch a row travels lighter still,
as its images' values alone (:func:`dump_row_values`), its layout beside it once per layout.
"""

from __future__ import annotations

import gc
import pickle
from contextlib import contextmanager
from typing import Any, Iterator, Literal, NamedTuple, Union

from ..codec.model import DDLEvent, Image, RowChange

__all__ = [
    "ColumnTuple",
    "ChangeRecord",
    "Coords",
    "DDLRecord",
    "Record",
    "record_from_event",
    "dump_record",
    "load_record",
    "dump_row_values",
    "load_row",
    "row_values",
    "image_dict",
    "gc_paused",
]

ColumnTuple = tuple  # (name: str, type_code: int, flags: int, value: Any)

_new_tuple = tuple.__new__


class ChangeRecord(NamedTuple):
    """A row change with the coordinates that order it: (commit_ts, topic, partition, offset, idx)."""

    commit_ts: int | None
    topic: str
    partition: int
    offset: int
    idx: int  # position of the event inside its Kafka message (batching protocols)
    schema: str
    table: str
    op: str
    new: tuple[ColumnTuple, ...] | None
    old: tuple[ColumnTuple, ...] | None

    @property
    def kind(self) -> Literal["row"]:
        """``"row"`` (a class attribute: see below the class)."""
        return "row"


ChangeRecord.kind = "row"  # type: ignore[assignment]  # faster than the property mypy reads


class DDLRecord(NamedTuple):
    """A DDL with its coordinates."""

    commit_ts: int | None
    topic: str
    partition: int
    offset: int
    idx: int
    schema: str
    table: str
    query: str
    ddl_type: int | None

    @property
    def kind(self) -> Literal["ddl"]:
        """``"ddl"`` (a class attribute: see below the class)."""
        return "ddl"

    def identity(self) -> tuple[Any, ...]:
        """What makes two broadcast copies of one DDL the same DDL: its commit ts and statement (TiCDC
        writes a copy to every partition). Without a commit ts (Canal-JSON without the TiDB extension,
        which writes a DDL to partition 0 only: no copies) the message it came in, after the statement:
        one statement run twice upstream (``TRUNCATE TABLE t`` every night) is two DDL."""
        if self.commit_ts is None:
            return (None, self.schema, self.table, self.query, self.topic, self.partition, self.offset, self.idx)
        return (self.commit_ts, self.schema, self.table, self.query)


DDLRecord.kind = "ddl"  # type: ignore[assignment]  # faster than the property mypy reads


Record = Union[ChangeRecord, DDLRecord]


def _columns(cols: Any) -> tuple[ColumnTuple, ...] | None:
    if cols is None:
        return None
    if cols.__class__ is Image:
        # the decoders' images: zip the shared layout with the values, no Column is ever built
        layout = cols.layout
        return tuple(zip(layout.names, layout.types, layout.int_flags, cols.values))
    return tuple((c[0], int(c[1]), int(c[2]), c[3]) for c in cols)


def record_from_event(event: RowChange | DDLEvent, topic: str, partition: int, offset: int, idx: int) -> Record:
    """The record for a decoded row change or DDL at the given coordinates."""
    if isinstance(event, RowChange):
        # tuple.__new__ skips the NamedTuple's Python-level __new__: this runs once per row event
        return _new_tuple(ChangeRecord, (
            event.commit_ts, topic, partition, offset, idx, event.schema, event.table, event.op,
            _columns(event.columns), _columns(event.old),
        ))
    return DDLRecord(
        event.commit_ts, topic, partition, offset, idx, event.schema, event.table, event.query, event.ddl_type
    )


def dump_record(record: Record) -> bytes:
    """Bytes for the held-rows state and the executor → driver transport."""
    return pickle.dumps((record.kind, tuple(record)), protocol=pickle.HIGHEST_PROTOCOL)


def load_record(data: bytes) -> Record:
    """The record :func:`dump_record` wrote.

    Raises:
        ValueError: the bytes are not a dumped record.
    """
    try:
        kind, fields = pickle.loads(data)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means corrupt state
        raise ValueError(f"not a dumped record: {exc}") from exc
    if kind == "row":
        return ChangeRecord(*fields)
    if kind == "ddl":
        return DDLRecord(*fields)
    raise ValueError(f"not a dumped record: kind {kind!r}")


def dump_row_values(op: str, new: tuple[Any, ...] | None, old: tuple[Any, ...] | None) -> bytes:
    """Bytes for a row change in flight between the ``spark`` engine's passes of one micro-batch: its op and
    each image as its values alone. The row's coordinates and (folded) names are columns of the frame it
    travels in, and its images' columns are its layout (:data:`~.key_buckets.Layout`), which travels once
    per layout, not once per row: a fraction of the bytes of :func:`dump_record` and of the time to write
    and read them. Never stored: the staging table and the state hold :func:`dump_record` bytes."""
    return pickle.dumps((op, new, old), protocol=pickle.HIGHEST_PROTOCOL)


Coords = tuple[Any, ...]
"""A row's ``(commit ts, topic, partition, offset, idx, schema, table)``: the fields of its
:class:`ChangeRecord` before its op, which :func:`dump_row_values` bytes do not hold."""


def _row_fields(data: bytes, coords: Coords | None) -> tuple[tuple[Any, ...], bool]:
    """The fields of :func:`dump_row_values` (after ``coords``) or :func:`dump_record` row bytes, and
    whether they are the former's (each image as its values) rather than a whole record's.

    Raises:
        ValueError: the bytes are neither, or values without ``coords``.
    """
    try:
        fields = pickle.loads(data)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means corrupt bytes
        raise ValueError(f"not a dumped row: {exc}") from exc
    if len(fields) == 3 and fields[0].__class__ is str:
        if coords is None:
            raise ValueError("a row in flight without its coordinates")
        return (*coords, *fields), True
    if len(fields) != 2 or fields[0] != "row":
        raise ValueError(f"not a dumped row: {fields[0]!r}")
    return fields[1], False


def row_values(data: bytes, coords: Coords | None = None) -> tuple[tuple[Any, ...], ChangeRecord | None]:
    """The fields of the row change in :func:`dump_row_values` bytes (its ``coords`` before them) or in
    :func:`dump_record` bytes (which hold their own), with each image as its values, and the record itself
    when the bytes held a whole one (else ``None``).

    Raises:
        ValueError: the bytes are neither, or values without ``coords``.
    """
    fields, values = _row_fields(data, coords)
    if values:
        return fields, None
    rec = ChangeRecord(*fields)
    new, old = rec.new, rec.old
    return (*rec[:8], None if new is None else tuple(c[3] for c in new),
            None if old is None else tuple(c[3] for c in old)), rec


def load_row(data: bytes, layout: Any = None, coords: Coords | None = None) -> ChangeRecord:
    """The row change of :func:`dump_record` or :func:`dump_row_values` bytes; ``layout``: the row's
    :data:`~.key_buckets.Layout` (the columns of its images, new then old, one when they are alike) and
    ``coords`` (:data:`Coords`), which the latter need.

    Raises:
        ValueError: the bytes are neither, or the layout or coordinates are missing, or the layout does
            not fit the values.
    """
    fields, values = _row_fields(data, coords)
    return record_of_values(fields, layout) if values else ChangeRecord(*fields)


def record_of_values(fields: tuple[Any, ...], layout: Any) -> ChangeRecord:
    """The :class:`ChangeRecord` of :func:`row_values`' fields (each image its values) and the row's
    :data:`~.key_buckets.Layout`.

    Raises:
        ValueError: the layout is missing or does not fit the values.
    """
    new, old = fields[8], fields[9]
    n = (new is not None) + (old is not None)
    if layout is None or not (len(layout) == n or (n == 2 and len(layout) == 1)):
        raise ValueError(f"row {fields[:5]}: no layout of its images")
    images: list[tuple[ColumnTuple, ...] | None] = []
    for values, at in ((new, 0), (old, -1)):
        if values is None:
            images.append(None)
            continue
        columns = layout[at]
        if len(values) != len(columns):
            raise ValueError(f"row {fields[:5]}: {len(values)} values for a layout of {len(columns)} columns")
        images.append(tuple((n, t, f, v) for (n, t, f), v in zip(columns, values)))
    return _new_tuple(ChangeRecord, (*fields[:8], *images))


def image_dict(image: tuple[ColumnTuple, ...] | None) -> dict[str, Any] | None:
    """A record's column image as ``{name: value}``."""
    return None if image is None else {c[0]: c[3] for c in image}


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off inside the block (back as it was after it).

    Records are trees of tuples that reference no container holding them back, so reference counting frees
    every one of them and the cyclic collector never finds anything among them; yet it scans every live
    container each time it runs, and a loop that keeps a batch's records, images and values alive makes it
    run again and again (a third of the time of the per-row rules, measured). Wrap such loops — not code
    that waits or yields: the block should end before anything else runs in the process."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
