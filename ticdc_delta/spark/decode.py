"""Decode Kafka messages on the executors (``mapInArrow``) into compact records for the driver.

Every input message becomes one output row per event it holds, or one ``error`` row carrying the message
itself (key, value and what was wrong) for the dead-letter table. Rows and DDL travel as
:func:`~ticdc_delta.core.records.dump_record` bytes — rows for the ``spark`` engine (given the key
columns) as :func:`~ticdc_delta.core.records.dump_row_values` bytes (op and values: their coordinates and
names are the row's columns), their layouts in the ``LAYOUT`` rows —; resolved marks as their commit ts.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import pyarrow as pa

from ..codec import DecodeContext, decoder_for
from ..codec.model import DDLEvent, FailedEntry, Image, ResolvedEvent, RowChange
from ..core.key_buckets import Layout, Router, Routing, layout
from ..core.records import dump_record, dump_row_values, gc_paused, record_from_event
from ..codec.upstream_lookup import UpstreamLookup, UpstreamSettings
from ..errors import ConfigError, DecodeError, TransientError
from ..locations import table_name_problem

__all__ = [
    "DECODED_SCHEMA", "DECODED_ARROW_SCHEMA", "NAMED_SCHEMA", "NAMED_ARROW_SCHEMA", "DecoderSpec", "make_decode_fn",
    "decode_messages", "spark_ddl", "SPAN", "span_rows", "LAYOUT", "layout_rows", "ONE_DECODE_TASK", "few_tasks",
]

_SPARK_TYPES = {pa.string(): "string", pa.int32(): "int", pa.int64(): "long", pa.binary(): "binary",
                pa.bool_(): "boolean", pa.list_(pa.int64()): "array<long>"}


ONE_DECODE_TASK = 5_000
"""Kafka messages up to which a micro-batch is decoded in one Spark task (all its partitions), not one task
per Kafka partition: a small batch's decode costs one task's start, not several waves of them."""


def few_tasks(batch_df: Any, messages: int | None) -> Any:
    """``batch_df`` (a micro-batch of the Kafka source) as the decoder reads it: only the columns it reads
    (``mapInArrow`` ships every column of its input to Python: not the Kafka timestamp), and in one
    partition when it reads at most :data:`ONE_DECODE_TASK` messages (``messages``: the count from Spark's
    offset log, ``None`` when unknown): a resolved ts broadcast to every partition and a change or two take
    one Python task, not a wave of tasks per pair of cores. The decoder takes any mix of partitions (each
    row carries its own coordinates)."""
    batch_df = batch_df.select(*_INPUT_COLUMNS)
    if messages is not None and messages <= ONE_DECODE_TASK:
        return batch_df.coalesce(1)
    return batch_df


def spark_ddl(schema: pa.Schema) -> str:
    """The Spark DDL string of an Arrow schema of plain columns (``mapInArrow``/``applyInArrow`` output):
    one definition per schema, the Arrow one.

    Raises:
        KeyError: a type other than string, int32, int64, binary, bool or a list of int64.
    """
    return ", ".join(f"{f.name} {_SPARK_TYPES[f.type]}" for f in schema)


DECODED_ARROW_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("idx", pa.int32()),
        ("kind", pa.string()),
        ("commit_ts", pa.int64()),
        ("payload", pa.binary()),
        ("error", pa.string()),
        ("key", pa.binary()),
        ("value", pa.binary()),
    ]
)
DECODED_SCHEMA = spark_ddl(DECODED_ARROW_SCHEMA)

NAMED_ARROW_SCHEMA = pa.schema([*DECODED_ARROW_SCHEMA, pa.field("schema", pa.string()), pa.field("table", pa.string()),
                                pa.field("sig", pa.int64()), pa.field("hashes", pa.list_(pa.int64()))])
NAMED_SCHEMA = spark_ddl(NAMED_ARROW_SCHEMA)
"""The decoded rows with their (folded) table names and, for rows, their :class:`~ticdc_delta.core.key_buckets.Routing`
(``sig``, ``hashes``) when the decoder is given the key columns."""
""":data:`DECODED_SCHEMA` plus the schema and table name of each row change (``None`` for other kinds), folded as the job compares names (``make_decode_fn(spec, names=...)``): what the ``spark`` engine
groups by without reading the records again."""

_MAX_LONG = (1 << 63) - 1
_INPUT_COLUMNS = ("topic", "partition", "offset", "key", "value")  # what decoding reads of a Kafka batch


@dataclass(frozen=True)
class DecoderSpec:
    """Everything an executor needs to build the decoder: picklable, no network clients.

    ``avro_schemas`` is the id → schema JSON snapshot resolved on the driver (executors are separate
    processes and cannot reach an in-process mock registry; a real registry would work, but resolving on
    the driver keeps executors off the registry's back). ``upstream`` is ``source.upstream`` (its password
    travels inside, never printed): handle-key-only rows are read there.
    """

    protocol: str
    options: dict[str, str] = field(default_factory=dict)
    avro_schemas: dict[int, str] = field(default_factory=dict)
    upstream: UpstreamSettings | None = None

    def build(self, upstream: UpstreamLookup | None = None) -> Any:
        schemas = None
        if self.protocol == "avro":
            from ..codec.avro import AvroSchemas

            schemas = AvroSchemas(self.avro_schemas)
        if upstream is not None:
            return decoder_for(self.protocol, self.options, schemas=schemas, upstream=upstream)
        return decoder_for(self.protocol, self.options, schemas=schemas)


def decode_messages(
    decoder: Any,
    topics: list[Any],
    partitions: list[Any],
    offsets: list[Any],
    keys: list[Any],
    values: list[Any],
    fold: Callable[[str], str] | None = None,
    route: Router | None = None,
    layouts: dict[int, Layout] | None = None,
) -> dict[str, list[Any]]:
    """Decode a column batch of messages into the columns of :data:`DECODED_ARROW_SCHEMA`, or with ``fold``
    (how names are compared) into those of :data:`NAMED_ARROW_SCHEMA`, with each row's routing when
    ``route`` is given (it gets the record, its images' shared layouts and its folded names);
    ``layouts`` collects the layout of each signature.

    The executors' hot loop: each output row is one tuple (the schema's columns in order), turned into
    columns once at the end; a table's folded names and whether a location can hold it are worked out once
    per batch."""
    schema = NAMED_ARROW_SCHEMA if fold else DECODED_ARROW_SCHEMA
    out: list[tuple[Any, ...]] = []
    emit = out.append
    tail: tuple[Any, ...] = (None,) * 4 if fold is not None else ()  # schema, table, sig, hashes
    names: dict[tuple[Any, Any], tuple[str | None, tuple[str, str]]] = {}  # -> (problem, folded names)

    for topic, part, off, key, value in zip(topics, partitions, offsets, keys, values):
        rows: list[tuple[Any, ...]] = []
        try:
            events = decoder.decode(key, value, DecodeContext(topic, part, off))
            for idx, ev in enumerate(events):
                ts = ev.commit_ts
                if ts is not None and not 0 <= ts <= _MAX_LONG:
                    raise DecodeError(decoder.protocol, f"commit ts {ts} out of range", topic, part, off)
                if isinstance(ev, ResolvedEvent):
                    rows.append((topic, part, off, idx, "resolved", ts, None, None, None, None, *tail))
                elif isinstance(ev, RowChange):
                    ident = (ev.schema, ev.table)
                    found = names.get(ident)
                    if found is None:
                        bad = table_name_problem(ev.schema, ev.table)
                        folded = ident if fold is None or bad else (fold(ev.schema), fold(ev.table))
                        found = names[ident] = (bad, folded)
                    if found[0]:  # no Delta location can hold the table: the row goes to the dead-letter table
                        rows.append((topic, part, off, idx, "error", None, None,
                                     str(DecodeError(decoder.protocol, found[0], topic, part, off)), key, value,
                                     *tail))
                        continue
                    name = found[1]
                    if route is None:
                        rows.append((topic, part, off, idx, ev.kind, ts,
                                     dump_record(record_from_event(ev, topic, part, off, idx)), None, None, None,
                                     *((*name, None, None) if fold is not None else ())))
                        continue
                    # the spark engine: the values travel, the layout once
                    (new, new_id), (old, old_id) = _values(ev.columns), _values(ev.old)
                    routing = route.of_values(new, old, new_id, old_id, name, _layout_of_event, ev)
                    if layouts is not None:
                        layouts.setdefault(routing.signature, routing.layout)
                    rows.append((topic, part, off, idx, "row", ts,
                                 dump_row_values(ev.op, new, old),
                                 None, None, None, *name, routing.signature, routing.hashes))
                elif isinstance(ev, FailedEntry):  # one entry of a batch: the others apply
                    rows.append((topic, part, off, idx, "error", None, None, ev.error, key, value, *tail))
                elif isinstance(ev, DDLEvent):
                    rows.append((topic, part, off, idx, ev.kind, ts,
                                 dump_record(record_from_event(ev, topic, part, off, idx)), None, None, None, *tail))
        except DecodeError as exc:
            emit((topic, part, off, 0, "error", None, None, str(exc), key, value, *tail))
            continue
        except (TransientError, ConfigError):
            # e.g. the claim-check storage or the upstream is unreachable: the batch is retried, the message
            # kept; the upstream refused the credentials: the job stops
            raise
        except Exception as exc:  # noqa: BLE001 - a decoder bug must not kill the job: dead-letter it
            emit((topic, part, off, 0, "error", None, None,
                  f"{decoder.protocol}: unexpected {type(exc).__name__}: {exc}", key, value, *tail))
            continue
        if rows:
            out.extend(rows)
        else:  # a message without events (e.g. an empty Open Protocol batch): keep its offset
            emit((topic, part, off, 0, "empty", None, None, None, None, None, *tail))
    columns = list(map(list, zip(*out))) if out else [[] for _ in schema]
    return dict(zip(schema.names, columns))


def _values(image: Any) -> tuple[tuple[Any, ...] | None, Any]:
    """An event's image as its values and what identifies its layout: the decoders' shared
    :class:`~ticdc_delta.codec.model.ImageLayout`, else its columns' ``(name, type, flags)`` (``None``,
    ``None``: no image)."""
    if image is None:
        return None, None
    if image.__class__ is Image:
        return image.values, image.layout
    return tuple(c[3] for c in image), tuple((c[0], int(c[1]), int(c[2])) for c in image)


def _layout_of_event(event: RowChange) -> Layout:
    """The :data:`~ticdc_delta.core.key_buckets.Layout` of a row event (as of its record)."""
    return layout(record_from_event(event, "", 0, 0, 0))  # type: ignore[arg-type]


SPAN = "span"
"""The ``kind`` of a summary row (``make_decode_fn(spans=True)``): per (topic, partition, kind) of one input
batch, the kind in ``error``, the first and last offset in ``offset`` and ``commit_ts``, the count in ``idx``."""


def span_rows(out: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """The :data:`SPAN` rows of decoded columns ``out`` (same columns), in first-seen order."""
    spans: dict[tuple[Any, Any, str], list[int]] = {}
    for topic, part, off, kind in zip(out["topic"], out["partition"], out["offset"], out["kind"]):
        span = spans.get((topic, part, kind))
        if span is None:
            spans[(topic, part, kind)] = [off, off, 1]
        else:
            if off < span[0]:
                span[0] = off
            if off > span[1]:
                span[1] = off
            span[2] += 1
    rows: dict[str, list[Any]] = {name: [None] * len(spans) for name in out}
    for i, ((topic, part, kind), (lo, hi, n)) in enumerate(spans.items()):
        rows["topic"][i], rows["partition"][i], rows["kind"][i] = topic, part, SPAN
        rows["error"][i], rows["offset"][i], rows["commit_ts"][i], rows["idx"][i] = kind, lo, hi, n
    return rows


LAYOUT = "layout"
"""The ``kind`` of a summary row (``make_decode_fn(keys=...)``): per (schema, table, layout) of one input
batch's rows, the layout's signature in ``sig``, the layout itself pickled in ``payload`` and the count in
``idx``."""


def layout_rows(out: dict[str, list[Any]], layouts: dict[int, Layout]) -> dict[str, list[Any]]:
    """The :data:`LAYOUT` rows of decoded columns ``out`` (those of :data:`NAMED_ARROW_SCHEMA`);
    ``layouts``: signature -> layout."""
    counts: dict[tuple[Any, Any, int], int] = {}
    for kind, schema, table, sig in zip(out["kind"], out["schema"], out["table"], out["sig"]):
        if kind == "row" and sig is not None:
            counts[(schema, table, sig)] = counts.get((schema, table, sig), 0) + 1
    rows: dict[str, list[Any]] = {name: [None] * len(counts) for name in out}
    for i, ((schema, table, sig), n) in enumerate(counts.items()):
        rows["kind"][i], rows["schema"][i], rows["table"][i], rows["sig"][i], rows["idx"][i] = LAYOUT, schema, table, sig, n
        rows["payload"][i] = pickle.dumps(layouts[sig])
    return rows


def make_decode_fn(spec: DecoderSpec, *, names: Callable[[str], str] | None = None, spans: bool = False,
                   keys: Callable[[str, str], Any] | None = None,
                   ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function for ``spec`` (output :data:`DECODED_SCHEMA`, or :data:`NAMED_SCHEMA`
    with the names folded by ``names``, a picklable function); the decoder is built once per partition
    task, with one upstream connection (``source.upstream``) opened on its first handle-key-only row and
    closed at the end. With ``spans``, each output batch ends with its :data:`SPAN` rows: what the ``spark``
    engine's driver needs of the rows (offsets and counts) without another pass over them. With ``keys``
    (the configured key columns, as :class:`~ticdc_delta.core.merge.KeyResolver`'s ``lookup``; with
    ``names``), each row carries its :class:`~ticdc_delta.core.key_buckets.Routing`, travels as its values
    (:func:`~ticdc_delta.core.records.dump_row_values`: its layout is in the ``LAYOUT`` row of its
    signature) and each output batch ends with its :data:`LAYOUT` rows too."""
    schema = NAMED_ARROW_SCHEMA if names is not None else DECODED_ARROW_SCHEMA

    def decode_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        upstream = UpstreamLookup(spec.upstream) if spec.upstream is not None else None
        decoder = spec.build(upstream)
        route = Router(keys) if keys is not None and names is not None else None
        try:
            for batch in batches:
                with gc_paused():  # (records hold no cycles: see gc_paused)
                    # only the columns decoding reads (not e.g. the Kafka timestamp: a datetime per message)
                    cols = {name: batch.column(name).to_pylist() for name in _INPUT_COLUMNS}
                    layouts: dict[int, Layout] = {}
                    out = decode_messages(
                        decoder, cols["topic"], cols["partition"], cols["offset"], cols["key"], cols["value"], names,
                        route, layouts,
                    )
                    extra = [span_rows(out)] if spans else []
                    if route is not None:
                        extra.append(layout_rows(out, layouts))
                    for rows in extra:
                        for name, values in rows.items():
                            out[name].extend(values)
                    decoded = pa.RecordBatch.from_pydict(out, schema=schema)
                yield decoded
        finally:
            if upstream is not None:
                upstream.close()

    return decode_batches
