"""Tests of the Delta edge (types, sink, state store)."""

from __future__ import annotations

from ticdc_delta.delta.arrow_types import TypeParams

# What a DDL tells about the shared all-types table (tests/codec/cases.py) beyond its type codes.
ALL_TYPES_PARAMS: dict[str, TypeParams] = {
    "c_decimal": TypeParams(precision=20, scale=7),
    "c_enum": TypeParams(members=("a", "b", "c")),
    "c_set": TypeParams(members=("x", "y", "z")),
}
