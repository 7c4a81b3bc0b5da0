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
    image_dict,
    load_record,
    record_from_event,
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
