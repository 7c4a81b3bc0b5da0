"""TiCDC's ``large-message-handle-compression``: lz4 or snappy compressed message values.

What TiCDC compresses (tiflow ``pkg/compression``, the ``open`` and ``canal`` codecs):

- ``lz4`` is an LZ4 *frame* (``lz4.NewWriter``; magic ``04 22 4d 18``), ``snappy`` a raw snappy *block*
  (``snappy.Encode``; a varint of the uncompressed length, then the block) — not the framed snappy stream.
- Open Protocol: each row and DDL value entry inside the length-prefixed batch, one by one; the keys, the
  length prefixes and the (empty) resolved values are not compressed.
- Canal-JSON: the whole Kafka value of every message (rows, DDL, watermarks).
- A claim-check object holds the same compressed value.

Nothing in a message says it is compressed: the option must match the changefeed's, as with TiCDC's own
consumer. A value that does not decompress is a :class:`~ticdc_delta.errors.CompressionError` (a decode
error: the dead-letter table keeps the bytes), never a JSON error about UTF-8.
"""

from __future__ import annotations

from typing import Mapping

import cramjam

from ..errors import CompressionError

__all__ = ["OPTION", "ALGORITHMS", "compression_option", "compress", "decompress"]

OPTION = "large-message-handle-compression"
ALGORITHMS = ("none", "lz4", "snappy")

# A decompressed value larger than this is refused: a snappy block's declared length is checked before
# anything is allocated (a forged length must not take the executor's memory); an LZ4 frame is checked
# once decompressed (LZ4 expands at most ~255x). TiCDC's max-message-bytes default is 10 MB and
# claim-check objects are single rows.
MAX_DECOMPRESSED = 512 * 1024 * 1024


def compression_option(options: Mapping[str, str] | None) -> str:
    """The ``large-message-handle-compression`` of sink-uri ``options``: ``none``, ``lz4`` or ``snappy``.

    Raises:
        ValueError: another value.
    """
    raw = str((options or {}).get(OPTION, "none") or "none").strip().lower()
    if raw not in ALGORITHMS:
        raise ValueError(f"option {OPTION} must be one of {', '.join(ALGORITHMS)}, got {raw!r}")
    return raw


def compress(algorithm: str, data: bytes) -> bytes:
    """``data`` compressed as TiCDC's ``compression.Encode`` does (``none``: unchanged)."""
    if algorithm == "lz4":
        return bytes(cramjam.lz4.compress(data))
    if algorithm == "snappy":
        return bytes(cramjam.snappy.compress_raw(data))
    return data


def _snappy_length(data: bytes) -> int:
    """The uncompressed length a raw snappy block declares (its leading varint)."""
    length = shift = 0
    for i, byte in enumerate(data[:10]):
        length |= (byte & 0x7F) << shift
        if byte < 0x80:
            return length
        shift += 7
    raise ValueError("snappy block does not start with a valid length varint")


def decompress(algorithm: str, data: bytes, protocol: str, what: str = "value") -> bytes:
    """``data`` decompressed with ``algorithm`` (``none``: unchanged).

    Raises:
        CompressionError: not a valid frame / block of that algorithm, or larger than
            :data:`MAX_DECOMPRESSED` once decompressed. ``protocol`` and ``what`` name it in the message.
    """
    if algorithm == "none":
        return data
    try:
        if algorithm == "snappy":
            size = _snappy_length(data)
            if size > MAX_DECOMPRESSED:
                raise ValueError(f"declares {size} uncompressed bytes, more than the {MAX_DECOMPRESSED} allowed")
            out = bytes(cramjam.snappy.decompress_raw(data))
        else:
            out = bytes(cramjam.lz4.decompress(data))
    except (cramjam.DecompressionError, ValueError, TypeError) as exc:
        head = bytes(data[:8]).hex(" ")
        raise CompressionError(
            protocol,
            f"{what} is not {algorithm}-compressed as {OPTION}={algorithm} says ({len(data)} bytes starting "
            f"{head or '(empty)'}): {exc}",
        ) from None
    if len(out) > MAX_DECOMPRESSED:
        raise CompressionError(protocol, f"{what} decompresses to {len(out)} bytes, more than {MAX_DECOMPRESSED}")
    return out
