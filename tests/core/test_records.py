"""Records: what the executors ship to the driver, the same whether the event's images are Images or
tuples of Columns."""

from __future__ import annotations

import pytest

from ticdc_delta.codec import decoder_for, encoder_for
from ticdc_delta.codec.model import DecodeContext, Image, RowChange
from ticdc_delta.core.records import (
    ChangeRecord,
    DDLRecord,
    dump_record,
    dump_row_values,
    image_dict,
    load_record,
    load_row,
    record_from_event,
    row_values,
)

from ..codec import cases

PROTOCOLS = {
    "open-protocol": {},
    "craft": {},
    "canal-json": {"enable-tidb-extension": "true"},
}


@pytest.mark.parametrize("event", cases.ROW_EVENTS, ids=lambda e: e.op)
def test_record_of_an_image_equals_the_record_of_its_tuple(event: RowChange) -> None:
    as_images = event._replace(
        columns=None if event.columns is None else Image.from_columns(event.columns),
        old=None if event.old is None else Image.from_columns(event.old),
    )
    from_tuple = record_from_event(event, "t", 1, 2, 3)
    from_image = record_from_event(as_images, "t", 1, 2, 3)
    assert from_image == from_tuple
    assert isinstance(from_image, ChangeRecord) and from_image.op == event.op
    for image in (from_image.new, from_image.old):
        if image is None:
            continue
        # plain tuples of plain values: (name, int type code, int flags, value)
        assert type(image) is tuple
        assert all(type(c) is tuple and type(c[1]) is int and type(c[2]) is int for c in image)
    assert load_record(dump_record(from_image)) == from_tuple


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_records_of_decoded_events_round_trip(protocol: str) -> None:
    options = PROTOCOLS[protocol]
    messages = encoder_for(protocol, options).encode(cases.ALL_EVENTS)
    decoder = decoder_for(protocol, options)
    ctx = DecodeContext("topic", 0, 5)
    rows = [e for m in messages for e in decoder.decode(m.key, m.value, ctx) if isinstance(e, RowChange)]
    assert rows and all(isinstance(e.columns or e.old, Image) for e in rows)
    assert len(rows) == len(cases.ROW_EVENTS)
    for decoded in rows:
        as_tuples = decoded._replace(
            columns=None if decoded.columns is None else tuple(decoded.columns),
            old=None if decoded.old is None else tuple(decoded.old),
        )
        record = load_record(dump_record(record_from_event(decoded, "topic", 0, 5, 0)))
        assert record == record_from_event(as_tuples, "topic", 0, 5, 0)
        assert image_dict(record.new) == decoded.new_values()
        assert image_dict(record.old) == decoded.old_values()


def test_ddl_record() -> None:
    record = record_from_event(cases.CREATE, "t", 0, 1, 0)
    assert isinstance(record, DDLRecord) and record.query == cases.CREATE.query
    assert load_record(dump_record(record)) == record


def test_load_record_refuses_garbage() -> None:
    with pytest.raises(ValueError, match="not a dumped record"):
        load_record(b"not a pickle")


def _values_of(rec: ChangeRecord) -> tuple:
    return (*rec[:8], *(None if i is None else tuple(c[3] for c in i) for i in (rec.new, rec.old)))


@pytest.mark.parametrize("event", cases.ROW_EVENTS, ids=lambda e: e.op)
def test_a_row_in_flight_is_its_values_and_with_its_layout_its_record(event: RowChange) -> None:
    """dump_row_values (the spark engine's decoder: the op and each image as its values) with the row's
    coordinates and layout gives the record back, as dump_record's bytes do without them; both read as
    values by row_values."""
    from ticdc_delta.core.key_buckets import layout

    rec = record_from_event(event, "t", 1, 2, 3)
    values = _values_of(rec)
    data = dump_row_values(*values[7:])
    coords = values[:7]
    assert len(data) < len(dump_record(rec)) - 20  # (the coordinates and names are not in it)
    assert load_row(data, layout(rec), coords) == rec
    assert load_row(dump_record(rec)) == rec  # a whole record needs no layout or coordinates
    assert row_values(data, coords) == (values, None)
    assert row_values(dump_record(rec)) == (values, rec)
    assert row_values(dump_record(rec), ("ignored",) * 7) == (values, rec)  # its own coordinates
    with pytest.raises(ValueError, match="no layout"):
        load_row(data, None, coords)
    with pytest.raises(ValueError, match="without its coordinates"):
        load_row(data, layout(rec))
    with pytest.raises(ValueError, match="without its coordinates"):
        row_values(data)
    if rec.new is not None and rec.old is not None and len(layout(rec)) == 2:
        with pytest.raises(ValueError, match="no layout"):
            load_row(data, layout(rec)[:1] * 3, coords)
    if rec.new is not None:
        shorter = (tuple(layout(rec)[0][:-1]), *layout(rec)[1:])
        with pytest.raises(ValueError, match="values for a layout"):
            load_row(data, shorter, coords)


def test_a_row_in_flight_takes_one_layout_for_images_alike() -> None:
    """An update whose images have the same columns has one layout for both (key_buckets.layout)."""
    from ticdc_delta.core.key_buckets import layout

    image = (("id", 8, 2, 1), ("v", 15, 0, "a"))
    rec = ChangeRecord(5, "t", 0, 1, 0, "s", "x", "update", image, (image[0], ("v", 15, 0, "b")))
    assert len(layout(rec)) == 1
    assert load_row(dump_row_values(*_values_of(rec)[7:]), layout(rec), rec[:7]) == rec
    bare = ChangeRecord(5, "t", 0, 1, 0, "s", "x", "delete", None, None)
    assert load_row(dump_row_values(*_values_of(bare)[7:]), layout(bare), bare[:7]) == bare


@pytest.mark.parametrize("data", [b"not a pickle", dump_record(DDLRecord(1, "t", 0, 0, 0, "s", "x", "q", 3)),
                                  __import__("pickle").dumps((1, 2, 3))])
def test_bytes_that_hold_no_row_are_refused(data: bytes) -> None:
    with pytest.raises(ValueError, match="not a dumped row"):
        row_values(data)
