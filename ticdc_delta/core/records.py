"""Decoded events as they travel from the executors to the driver and into the held-rows state.

A :class:`ChangeRecord` is a row change plus its Kafka coordinates; a :class:`DDLRecord` a DDL plus its
coordinates. Column images are tuples of ``(name, type code, flags as int, value)`` — plain tuples, so
they pickle small and fast (``ColumnFlag`` members would be rebuilt one enum call per column). A decoded
:class:`~ticdc_delta.codec.model.Image` becomes one by zipping its layout with its values, without
building a Column.
"""

from __future__ import annotations

import gc
import pickle
from contextlib import contextmanager
from typing import Any, Iterator, NamedTuple, Union

from ..codec.model import DDLEvent, Image, RowChange

__all__ = [
    "ColumnTuple",
    "ChangeRecord",
    "DDLRecord",
    "Record",
    "record_from_event",
    "dump_record",
    "load_record",
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

    kind = "row"


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

    kind = "ddl"

    def identity(self) -> tuple[Any, ...]:
        """What makes two broadcast copies of one DDL the same DDL."""
        return (self.commit_ts, self.schema, self.table, self.query)


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
