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

import struct
from typing import Mapping

import cramjam

from ..errors import CompressionError

__all__ = ["OPTION", "ALGORITHMS", "MAX_DECOMPRESSED", "compression_option", "compress", "decompress"]

OPTION = "large-message-handle-compression"
ALGORITHMS = ("none", "lz4", "snappy")

# A decompressed value larger than this is refused before anything is allocated, so a small forged value
# (a "bomb") cannot take an executor's memory: a snappy block's declared length is checked against this
# and against what its size can expand to; an LZ4 frame's declared content size and the most its blocks
# can produce (counted from the frame's block headers) are checked before it is decompressed. TiCDC's
# max-message-bytes default is 10 MB, claim-check objects are single rows, and TiDB's
# txn-entry-size-limit is at most 120 MB per row (JSON escaping can multiply that).
MAX_DECOMPRESSED = 512 * 1024 * 1024

# The most one compressed byte can expand to. Snappy: a 3-byte copy (tag + 2-byte offset) writes at most
# 64 bytes, literals 1 per byte. LZ4: a match length extension byte of 255 adds 255 bytes, and no sequence
# (token, offset, extension bytes) produces more than 255 bytes per byte of it.
_SNAPPY_MAX_RATIO = 64 / 3
_LZ4_MAX_RATIO = 255

# LZ4 frame format (lz4/doc/lz4_Frame_format.md)
_LZ4_MAGIC = 0x184D2204
_LZ4_SKIPPABLE = 0x184D2A50  # ..0x184D2A5F: skippable frames, a 4-byte size and data the decoder skips
_LZ4_BLOCK_MAX = {4: 64 * 1024, 5: 256 * 1024, 6: 1024 * 1024, 7: 4 * 1024 * 1024}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


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


class _Oversized(ValueError):
    """A compressed value that would decompress to more than :data:`MAX_DECOMPRESSED` bytes."""


def _snappy_length(data: bytes, limit: int = MAX_DECOMPRESSED) -> int:
    """The uncompressed length a raw snappy block declares (its leading varint).

    Raises:
        _Oversized: more than :data:`MAX_DECOMPRESSED`.
        ValueError: no valid varint, or more than a block of ``len(data)`` bytes can expand to.
    """
    length = shift = 0
    for byte in data[:10]:
        length |= (byte & 0x7F) << shift
        if byte < 0x80:
            break
        shift += 7
    else:
        raise ValueError("snappy block does not start with a valid length varint")
    if length > limit:
        raise _Oversized(f"declares {length} uncompressed bytes, more than the {limit} allowed")
    if length > len(data) * _SNAPPY_MAX_RATIO:
        raise ValueError(f"declares {length} uncompressed bytes, more than a snappy block of {len(data)} "
                         f"bytes can hold")
    return length


def _lz4_check_size(data: bytes, limit: int = MAX_DECOMPRESSED) -> None:
    """Refuse LZ4 frames that could decompress to more than :data:`MAX_DECOMPRESSED` bytes, before any is
    decompressed: the frame's declared content size (the decoder checks it only at the end), then the most
    its blocks can produce, read from the block headers: an uncompressed block its size, a compressed one
    ``min(block maximum, 255 x its size)`` (the decoder never writes more than the block maximum). A
    writer fills every block but a frame's last, so for a real frame the bound exceeds the output by less
    than one block. Concatenated and skippable frames are walked as the decoder reads them.

    Raises:
        _Oversized: the frames declare or hold more than :data:`MAX_DECOMPRESSED` bytes.
        ValueError: not a well-formed LZ4 frame (magic, version, block maximum, truncated blocks).
    """
    size = len(data)
    bound = 0
    pos = 0
    while pos < size:
        if pos + 4 > size:
            raise ValueError(f"truncated LZ4 frame magic at byte {pos}")
        (magic,) = _U32.unpack_from(data, pos)
        if magic & 0xFFFFFFF0 == _LZ4_SKIPPABLE:
            if pos + 8 > size:
                raise ValueError(f"truncated skippable frame at byte {pos}")
            pos += 8 + _U32.unpack_from(data, pos + 4)[0]
            continue
        if magic != _LZ4_MAGIC:
            raise ValueError(f"no LZ4 frame magic at byte {pos}")
        if pos + 7 > size:
            raise ValueError("truncated LZ4 frame header")
        flg, bd = data[pos + 4], data[pos + 5]
        if flg >> 6 != 1:
            raise ValueError(f"LZ4 frame version {flg >> 6}, expected 1")
        block_max = _LZ4_BLOCK_MAX.get((bd >> 4) & 7)
        if block_max is None:
            raise ValueError(f"LZ4 frame block maximum size id {(bd >> 4) & 7}, expected 4 to 7")
        pos += 6
        if flg & 0x08:  # content size
            if pos + 8 > size:
                raise ValueError("truncated LZ4 frame header")
            (declared,) = _U64.unpack_from(data, pos)
            if declared > limit:
                raise _Oversized(f"is an LZ4 frame that declares {declared} uncompressed bytes, more than the "
                                 f"{limit} allowed")
            pos += 8
        if flg & 0x01:  # dictionary id
            pos += 4
        pos += 1  # header checksum (the decoder checks it)
        block_checksum = 4 if flg & 0x10 else 0
        while True:
            if pos + 4 > size:
                raise ValueError("truncated LZ4 frame: no end mark")
            (word,) = _U32.unpack_from(data, pos)
            pos += 4
            if word == 0:
                break
            length = word & 0x7FFFFFFF
            if length > block_max:
                raise ValueError(f"LZ4 block of {length} bytes, more than the frame's {block_max} maximum")
            if pos + length + block_checksum > size:
                raise ValueError("truncated LZ4 block")
            bound += length if word & 0x80000000 else min(block_max, _LZ4_MAX_RATIO * length)
            if bound > limit:
                raise _Oversized(f"holds LZ4 blocks that can decompress to more than the {limit} "
                                 f"bytes allowed (counted from the block headers before decompressing)")
            pos += length + block_checksum
        if flg & 0x04:  # content checksum
            pos += 4


def decompress(algorithm: str, data: bytes, protocol: str, what: str = "value", *,
               limit: int = MAX_DECOMPRESSED) -> bytes:
    """``data`` decompressed with ``algorithm`` (``none``: unchanged). ``limit``: the most bytes it may
    decompress to (at most :data:`MAX_DECOMPRESSED`; a caller decompressing several values of one message
    passes what is left of that budget).

    Raises:
        CompressionError: not a valid frame / block of that algorithm, or larger than
            ``limit`` (refused before it is decompressed). ``protocol`` and ``what`` name it
            in the message; the caller adds the message's coordinates.
    """
    if algorithm == "none":
        return data
    try:
        if algorithm == "snappy":
            _snappy_length(data, limit)
            out = bytes(cramjam.snappy.decompress_raw(data))
        else:
            _lz4_check_size(data, limit)
            out = bytes(cramjam.lz4.decompress(data))
    except _Oversized as exc:
        raise CompressionError(protocol, f"{what} ({len(data)} bytes, {OPTION}={algorithm}) {exc}") from None
    except (cramjam.DecompressionError, ValueError, TypeError) as exc:
        head = bytes(data[:8]).hex(" ")
        raise CompressionError(
            protocol,
            f"{what} is not {algorithm}-compressed as {OPTION}={algorithm} says ({len(data)} bytes starting "
            f"{head or '(empty)'}): {exc}",
        ) from None
    if len(out) > limit:
        raise CompressionError(protocol, f"{what} decompresses to {len(out)} bytes, more than {limit}")
    return out
