"""The event model's row images: a decoder's lazy :class:`Image` behaves as the tuple of its Columns."""

from __future__ import annotations

import copy
import pickle

import pytest
from hypothesis import given, settings, strategies as st

from ticdc_delta.codec.json_output import event_to_json_object
from ticdc_delta.codec.model import (
    Column,
    ColumnFlag as F,
    Image,
    ImageLayout,
    Op,
    RowChange,
    TypeCode as T,
    image_as_dict,
    image_parts,
)

from . import cases

KEY = F.HANDLE_KEY | F.PRIMARY_KEY
LAYOUT = ImageLayout(("id", "name", "price"), (T.BIGINT, T.VARCHAR, T.DOUBLE), (KEY, F.NULLABLE, 0))
COLUMNS = (
    Column("id", int(T.BIGINT), KEY, 7),
    Column("name", int(T.VARCHAR), F.NULLABLE, "x"),
    Column("price", int(T.DOUBLE), F.NONE, 1.5),
)


def image(values: tuple = (7, "x", 1.5), layout: ImageLayout = LAYOUT) -> Image:
    return Image(layout, values)


def test_image_is_the_sequence_of_its_columns() -> None:
    img = image()
    assert len(img) == 3 and bool(img)
    assert list(img) == list(COLUMNS)
    assert all(type(c) is Column and type(c.flags) is F and type(c.type) is int for c in img)
    assert img[0] == COLUMNS[0] and img[-1] == COLUMNS[-1] and img[1].is_key is False and img[0].is_key
    assert img[1:] == COLUMNS[1:] and type(img[1:]) is tuple
    assert list(reversed(img)) == list(reversed(COLUMNS))
    assert COLUMNS[1] in img and Column("name", int(T.VARCHAR), F.NULLABLE, "y") not in img
    assert img.index(COLUMNS[2]) == 2 and img.count(COLUMNS[0]) == 1
    with pytest.raises(IndexError):
        img[3]
    with pytest.raises(ValueError):
        img.index(Column("nope", 1, F.NONE, 1))


def test_image_parts_and_accessors() -> None:
    img = image()
    assert (img.names, img.types, img.flags, img.values) == (
        ("id", "name", "price"), (8, 15, 5), (KEY, F.NULLABLE, F.NONE), (7, "x", 1.5)
    )
    assert img.layout is LAYOUT and img.as_dict() == {"id": 7, "name": "x", "price": 1.5}
    assert image_parts(img) == (img.names, img.types, img.flags, img.values)
    assert image_parts(COLUMNS) == image_parts(img)
    assert image_parts(()) == ((), (), (), ())
    assert image_as_dict(img) == image_as_dict(COLUMNS) == img.as_dict()
    assert image_as_dict(None) is None


def test_image_equals_and_hashes_as_its_tuple() -> None:
    img = image()
    assert img == COLUMNS and COLUMNS == img and not img != COLUMNS
    assert hash(img) == hash(COLUMNS)
    assert img == Image(LAYOUT, (7, "x", 1.5)) and img == Image.from_columns(COLUMNS)
    other_layout = ImageLayout(LAYOUT.names, LAYOUT.types, LAYOUT.int_flags)
    assert other_layout == LAYOUT and other_layout is not LAYOUT and img == Image(other_layout, img.values)
    assert img != image((8, "x", 1.5)) and img != COLUMNS[:2] and img != COLUMNS + COLUMNS[:1]
    renamed = ImageLayout(("id", "name", "cost"), LAYOUT.types, LAYOUT.int_flags)
    assert img != Image(renamed, img.values)
    assert img != list(COLUMNS)  # as a tuple is not equal to a list
    assert {img: 1}[COLUMNS] == 1


def test_image_orders_adds_and_repeats_as_its_tuple() -> None:
    low, high = image((1, "x", 1.5)), image((2, "x", 1.5))
    assert low < high and low <= high and high > low and high >= low and low <= low
    assert low < tuple(high) and tuple(low) < high
    assert sorted([high, low]) == [low, high]
    assert low + COLUMNS == tuple(low) + COLUMNS and COLUMNS + low == COLUMNS + tuple(low)
    assert low * 2 == tuple(low) * 2 and 2 * low == tuple(low) * 2
    with pytest.raises(TypeError):
        low < [1]  # noqa: B015


def test_row_changes_with_images_equal_those_with_tuples() -> None:
    with_tuple = RowChange(1, "s", "t", Op.UPDATE, COLUMNS, COLUMNS[:1])
    with_image = RowChange(1, "s", "t", Op.UPDATE, image(), Image.from_columns(COLUMNS[:1]))
    assert with_image == with_tuple and hash(with_image) == hash(with_tuple)
    assert with_image.new_values() == with_tuple.new_values() == {"id": 7, "name": "x", "price": 1.5}
    assert with_image.old_values() == with_tuple.old_values() == {"id": 7}
    assert with_image.key_columns() == with_tuple.key_columns() == ("id",)
    assert event_to_json_object(with_image) == event_to_json_object(with_tuple)


def test_image_and_layout_pickle_and_copy() -> None:
    img = image()
    back = pickle.loads(pickle.dumps(img))
    assert back == img and type(back) is Image and back.layout == LAYOUT
    assert type(back.flags[0]) is F
    pair = pickle.loads(pickle.dumps([img, image((8, None, None))]))
    assert pair[0].layout is pair[1].layout  # one shared layout stays one object
    assert copy.copy(img) == img and copy.deepcopy(img) == img
    assert pickle.loads(pickle.dumps(LAYOUT)) == LAYOUT


def test_layout_is_immutable_and_checked() -> None:
    with pytest.raises(AttributeError, match="immutable"):
        LAYOUT.names = ("a",)  # type: ignore[misc]
    with pytest.raises(AttributeError, match="immutable"):
        del LAYOUT.names
    with pytest.raises(ValueError, match="2 names, 1 type codes and 2 flags"):
        ImageLayout(("a", "b"), (1,), (0, 0))
    with pytest.raises(ValueError, match="2 values for a layout of 3 columns"):
        Image(LAYOUT, (1, 2))
    assert LAYOUT.key_names == ("id",) and len(LAYOUT) == 3
    assert type(LAYOUT.types[0]) is int and LAYOUT.int_flags == (10, 64, 0)
    assert "ImageLayout(('id', 'name', 'price')" in repr(LAYOUT)
    assert repr(image()) == f"Image({COLUMNS!r})"


def test_image_has_no_instance_dict() -> None:
    with pytest.raises(AttributeError):
        image().extra = 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("event", cases.ROW_EVENTS, ids=lambda e: e.op)
def test_shared_case_images(event: RowChange) -> None:
    for columns in (event.columns, event.old):
        if columns is None:
            continue
        img = Image.from_columns(columns)
        assert img == columns and hash(img) == hash(columns) and tuple(img) == columns
        assert pickle.loads(pickle.dumps(img)) == columns


_COLUMN = st.builds(
    Column,
    st.text(max_size=4),
    st.sampled_from([int(t) for t in T]),
    st.sampled_from([F(0), KEY, F.NULLABLE, F.BINARY | F.UNSIGNED]),
    st.none() | st.integers() | st.text(max_size=4) | st.binary(max_size=4) | st.floats(allow_nan=False),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(_COLUMN, max_size=6), st.lists(_COLUMN, max_size=6))
def test_image_compares_as_its_tuple(a: list[Column], b: list[Column]) -> None:
    ia, ib, ta, tb = Image.from_columns(a), Image.from_columns(b), tuple(a), tuple(b)
    assert (ia == ib) == (ta == tb) == (ia == tb) == (ta == ib)
    assert _less(ia, ib) == _less(ta, tb) == _less(ia, tb) == _less(ta, ib)
    assert tuple(ia) == ta and hash(ia) == hash(ta)


def _less(x: object, y: object) -> object:
    """``x < y``, or the type of what it raised (tuples of mixed values may not order)."""
    try:
        return x < y  # type: ignore[operator]
    except TypeError as exc:
        return type(exc)
