"""Events as the JSON objects the ``decode`` CLI prints (one per line, in message order).

The shape is a contract other tools depend on:

- row: ``{"kind": "row", "commit_ts", "schema", "table", "op", "columns", "old"}``
- ddl: ``{"kind": "ddl", "commit_ts", "schema", "table", "query"}``
- resolved / watermark: ``{"kind": "resolved", "commit_ts"}``

Values: integers stay exact JSON integers (18446744073709551615 included), floats are JSON numbers,
``None`` is ``null``, bytes become ``{"base64": "..."}`` and everything else is a JSON string.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any, Sequence

import orjson

from .model import Column, DDLEvent, Event, FailedEntry, ResolvedEvent, RowChange, image_parts

__all__ = ["event_to_json_object", "event_to_json_line", "value_to_json"]


def value_to_json(value: Any) -> Any:
    """One column value in the CLI's JSON form."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"base64": base64.b64encode(bytes(value)).decode("ascii")}
    return str(value)


def _image(columns: Sequence[Column] | None) -> dict[str, Any] | None:
    if columns is None:
        return None
    names, _types, _flags, values = image_parts(columns)
    return dict(zip(names, map(value_to_json, values)))


def event_to_json_object(event: Event) -> dict[str, Any]:
    """The CLI's JSON object for one event."""
    if isinstance(event, RowChange):
        return {
            "kind": "row",
            "commit_ts": event.commit_ts,
            "schema": event.schema,
            "table": event.table,
            "op": event.op,
            "columns": _image(event.columns),
            "old": _image(event.old),
        }
    if isinstance(event, DDLEvent):
        return {
            "kind": "ddl",
            "commit_ts": event.commit_ts,
            "schema": event.schema,
            "table": event.table or "",
            "query": event.query,
        }
    if isinstance(event, ResolvedEvent):
        return {"kind": "resolved", "commit_ts": event.commit_ts}
    if isinstance(event, FailedEntry):
        return {"kind": "failed", "commit_ts": event.commit_ts, "error": event.error}
    raise TypeError(f"not an event: {type(event).__name__}")


def event_to_json_line(event: Event) -> str:
    """One line of ``decode`` output (no trailing newline).

    orjson writes big unsigned integers exactly (BIGINT UNSIGNED max prints as ``18446744073709551615``)
    but refuses integers beyond 64 bits (an Open Protocol DECIMAL or BIGINT sent as a 30-digit JSON
    number): such a line is written by the standard library, which keeps every integer exact (and,
    like orjson, writes a non-finite float as ``null``).
    """
    obj = event_to_json_object(event)
    try:
        return orjson.dumps(obj, option=orjson.OPT_PASSTHROUGH_DATACLASS).decode()
    except TypeError:
        return json.dumps(_finite(obj), ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by ``None`` (as orjson writes them)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
