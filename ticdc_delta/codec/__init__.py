"""Wire protocols of TiCDC: decoders and encoders behind one contract, no Spark here.

Use :func:`decoder_for` / :func:`encoder_for` with a protocol name and TiCDC sink-uri options::

    dec = decoder_for("canal-json", {"enable-tidb-extension": "true"})
    events = dec.decode(key, value, DecodeContext("tidb-cdc", 0, 42))
"""

from __future__ import annotations

from typing import Any, Mapping

from .base import EventEncoder, Message, RowEventDecoder
from .model import (
    Column,
    ColumnFlag,
    DDLEvent,
    DDLType,
    DecodeContext,
    Event,
    Op,
    ResolvedEvent,
    RowChange,
    TypeCode,
)

__all__ = [
    "PROTOCOLS",
    "decoder_for",
    "encoder_for",
    "Column",
    "ColumnFlag",
    "DDLEvent",
    "DDLType",
    "DecodeContext",
    "Event",
    "EventEncoder",
    "Message",
    "Op",
    "ResolvedEvent",
    "RowChange",
    "RowEventDecoder",
    "TypeCode",
]

PROTOCOLS = ("open-protocol", "craft", "canal-json", "avro")


def _check_protocol(protocol: str) -> None:
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; expected one of {', '.join(PROTOCOLS)}")


def decoder_for(
    protocol: str, options: Mapping[str, str] | None = None, *, schemas: Any = None, upstream: Any = None
) -> RowEventDecoder:
    """A decoder for ``protocol`` configured with TiCDC sink-uri ``options``.

    ``schemas`` is only for Avro: an :class:`~ticdc_delta.codec.avro.AvroSchemas` (a Schema Registry
    client or local schema files) that resolves schema ids. ``upstream`` (an
    :class:`~ticdc_delta.codec.upstream_lookup.UpstreamLookup`) completes handle-key-only rows, which only
    Open Protocol and Canal-JSON carry (TiCDC allows the mode for no other protocol here).

    Raises:
        ValueError: unknown protocol or bad option value.
    """
    _check_protocol(protocol)
    opts = dict(options or {})
    if protocol == "open-protocol":
        from .open_protocol import OpenProtocolDecoder

        return OpenProtocolDecoder(opts, upstream=upstream)
    if protocol == "craft":
        from .craft import CraftDecoder

        return CraftDecoder(opts)
    if protocol == "canal-json":
        from .canal_json import CanalJsonDecoder

        return CanalJsonDecoder(opts, upstream=upstream)
    from .avro import AvroDecoder

    return AvroDecoder(opts, schemas=schemas)


def encoder_for(
    protocol: str, options: Mapping[str, str] | None = None, *, schemas: Any = None
) -> EventEncoder:
    """An encoder that writes ``protocol`` the way TiCDC does (used by the simulator and tests).

    ``schemas`` is only for Avro: where new schemas are registered (see :mod:`.avro`).

    Raises:
        ValueError: unknown protocol or bad option value.
    """
    _check_protocol(protocol)
    opts = dict(options or {})
    if protocol == "open-protocol":
        from .open_protocol import OpenProtocolEncoder

        return OpenProtocolEncoder(opts)
    if protocol == "craft":
        from .craft import CraftEncoder

        return CraftEncoder(opts)
    if protocol == "canal-json":
        from .canal_json import CanalJsonEncoder

        return CanalJsonEncoder(opts)
    from .avro import AvroEncoder

    return AvroEncoder(opts, schemas=schemas)
