"""large-message-handle-compression (lz4 | snappy) for Open Protocol and Canal-JSON, as TiCDC writes it."""

from __future__ import annotations

import pickle
import struct

import cramjam
import pytest
from hypothesis import given, settings, strategies as st

from ticdc_delta.codec import decoder_for, encoder_for
from ticdc_delta.codec.compression import MAX_DECOMPRESSED, compress, compression_option, decompress
from ticdc_delta.codec.model import DecodeContext
from ticdc_delta.errors import CompressionError, DecodeError

from . import cases

CTX = DecodeContext("tidb-cdc", 2, 77)
EXT = {"enable-tidb-extension": "true"}


def test_wire_formats_are_tiflows() -> None:
    """snappy: a raw block (snappy.Encode: varint length, then a literal); lz4: an LZ4 frame (lz4.NewWriter)."""
    assert compress("snappy", b"hello") == bytes([5, 0x10]) + b"hello"
    assert compress("lz4", b"hello")[:4] == bytes.fromhex("04224d18")
    assert decompress("lz4", compress("lz4", b"x" * 10000), "p") == b"x" * 10000
    assert compress("none", b"abc") == b"abc"


def test_option_values() -> None:
    assert compression_option({}) == "none" and compression_option({"large-message-handle-compression": "LZ4"}) == "lz4"
    with pytest.raises(ValueError, match="must be one of none, lz4, snappy, got 'zstd'"):
        compression_option({"large-message-handle-compression": "zstd"})


@pytest.mark.parametrize("algorithm", ["lz4", "snappy"])
@pytest.mark.parametrize("protocol, options", [("open-protocol", {"max-batch-size": "4"}), ("canal-json", EXT)])
def test_compressed_stream_round_trip(protocol: str, options: dict[str, str], algorithm: str) -> None:
    opts = {**options, "large-message-handle-compression": algorithm}
    messages = encoder_for(protocol, opts).encode(cases.ALL_EVENTS)
    plain = encoder_for(protocol, options).encode(cases.ALL_EVENTS)
    assert [m.value for m in messages] != [m.value for m in plain]
    decoder = pickle.loads(pickle.dumps(decoder_for(protocol, opts)))  # as shipped to an executor
    got = [e for m in messages for e in decoder.decode(m.key, m.value, CTX)]
    want = [e for m in plain for e in decoder_for(protocol, options).decode(m.key, m.value, CTX)]
    assert got == want and len(got) == len(cases.ALL_EVENTS)


def test_open_protocol_compresses_each_value_entry_not_the_framing() -> None:
    opts = {"max-batch-size": "4", "large-message-handle-compression": "snappy"}
    (message,) = encoder_for("open-protocol", opts).encode(cases.ROW_EVENTS[:2])
    (length,) = struct.unpack_from(">Q", message.value, 0)
    entry = message.value[8 : 8 + length]
    assert decompress("snappy", entry, "p").startswith(b'{"')


@pytest.mark.parametrize("algorithm", ["lz4", "snappy"])
@pytest.mark.parametrize("protocol, options", [("open-protocol", {"max-batch-size": "4"}), ("canal-json", EXT)])
def test_uncompressed_or_corrupt_values_are_compression_errors(protocol: str, options: dict[str, str],
                                                               algorithm: str) -> None:
    (plain,) = encoder_for(protocol, options).encode(cases.ROW_EVENTS[:1])
    decoder = decoder_for(protocol, {**options, "large-message-handle-compression": algorithm})
    with pytest.raises(CompressionError, match=rf"tidb-cdc\[2\]@77: .*not {algorithm}-compressed as "
                                               rf"large-message-handle-compression={algorithm} says"):
        decoder.decode(plain.key, plain.value, CTX)
    (packed,) = encoder_for(protocol, {**options, "large-message-handle-compression": algorithm}).encode(
        cases.ROW_EVENTS[:1])
    value = bytearray(packed.value or b"")
    cut = bytes(value[: len(value) // 2]) if protocol == "canal-json" else None
    if cut is not None:
        with pytest.raises(CompressionError):
            decoder.decode(None, cut, CTX)


def test_forged_snappy_length_is_refused_before_allocation() -> None:
    forged = bytes([0xFF, 0xFF, 0xFF, 0xFF, 0x0F]) + b"\x00" * 10  # declares 4 GiB
    with pytest.raises(CompressionError, match="declares 4294967295 uncompressed bytes"):
        decompress("snappy", forged, "canal-json")


def test_forged_snappy_length_beyond_what_the_block_can_hold_is_refused() -> None:
    """A length under the limit, but more than 20 bytes of snappy can expand to (64 bytes per 3-byte copy)."""
    forged = bytes([0x80, 0x80, 0x80, 0x40]) + b"\x00" * 16  # declares 128 MiB in 20 bytes
    with pytest.raises(CompressionError, match="declares 134217728 uncompressed bytes, more than a snappy "
                                               "block of 20 bytes can hold"):
        decompress("snappy", forged, "canal-json")


@pytest.mark.parametrize("algorithm", ["lz4", "snappy"])
def test_most_compressible_values_still_decompress(algorithm: str) -> None:
    """The size checks are upper bounds: zeros, the best case of both algorithms, pass them."""
    data = b"\x00" * (8 << 20)
    assert decompress(algorithm, compress(algorithm, data), "p") == data


def _xxh32(data: bytes) -> int:
    """xxHash32 with seed 0 of fewer than 16 bytes: the LZ4 frame header checksum, for hand-made frames."""
    p1, p2, p3, p4, p5, m = 2654435761, 2246822519, 3266489917, 668265263, 374761393, 0xFFFFFFFF
    rotl = lambda x, r: ((x << r) | (x >> (32 - r))) & m  # noqa: E731
    h, i = (p5 + len(data)) & m, 0
    while i + 4 <= len(data):
        h = (rotl((h + struct.unpack_from("<I", data, i)[0] * p3) & m, 17) * p4) & m
        i += 4
    for byte in data[i:]:
        h = (rotl((h + byte * p5) & m, 11) * p1) & m
    h = ((h ^ (h >> 15)) * p2) & m
    h = ((h ^ (h >> 13)) * p3) & m
    return h ^ (h >> 16)


def _lz4_frame(blocks: list[bytes], *, content_size: int | None = None, raw: bool = False) -> bytes:
    """An LZ4 frame of independent 4 MiB-maximum ``blocks`` (compressed, or stored with ``raw``), as
    pierrec/lz4's writer (TiCDC's) makes them."""
    flg = 0x40 | 0x20 | (0x08 if content_size is not None else 0)
    descriptor = bytes([flg, 0x70]) + (b"" if content_size is None else struct.pack("<Q", content_size))
    body = b"".join(struct.pack("<I", len(b) | (0x80000000 if raw else 0)) + b for b in blocks)
    return struct.pack("<I", 0x184D2204) + descriptor + bytes([(_xxh32(descriptor) >> 8) & 0xFF]) + body + bytes(4)


# one 4 MiB block of zeros: 16 KiB compressed
_ZEROS_BLOCK = bytes(cramjam.lz4.compress_block(b"\x00" * (4 << 20), store_size=False))


def test_hand_made_lz4_frames_are_real_frames() -> None:
    assert _xxh32(b"") == 0x02CC5D05 and _xxh32(b"abc") == 0x32D153FF  # xxHash's published values
    assert decompress("lz4", _lz4_frame([_ZEROS_BLOCK] * 2, content_size=8 << 20), "p") == b"\x00" * (8 << 20)
    assert decompress("lz4", _lz4_frame([b"abc", b"de"], raw=True), "p") == b"abcde"


def _message(protocol: str, value: bytes) -> tuple[bytes | None, bytes]:
    """A Kafka message of ``protocol`` whose (only) compressed value is ``value``."""
    if protocol == "canal-json":
        return None, value
    (real,) = encoder_for(protocol, {"max-batch-size": "4", "large-message-handle-compression": "lz4"}).encode(
        cases.ROW_EVENTS[:1])
    return real.key, struct.pack(">Q", len(value)) + value


@pytest.mark.parametrize("protocol, options", [("open-protocol", {"max-batch-size": "4"}), ("canal-json", EXT)])
def test_lz4_bomb_is_refused_from_its_block_headers(protocol: str, options: dict[str, str]) -> None:
    """2 MiB of blocks that would decompress to 520 MiB: refused before decompressing (were it decompressed,
    the error would say how many bytes came out), a decode error at the message's coordinates."""
    bomb = _lz4_frame([_ZEROS_BLOCK] * 130)
    assert len(bomb) < 2200 * 1024 and 130 * (4 << 20) > MAX_DECOMPRESSED
    decoder = decoder_for(protocol, {**options, "large-message-handle-compression": "lz4"})
    with pytest.raises(CompressionError, match=rf"tidb-cdc\[2\]@77: .*\({len(bomb)} bytes, "
                                               r"large-message-handle-compression=lz4\) holds LZ4 blocks that can "
                                               r"decompress to more than the 536870912 bytes allowed \(counted "
                                               r"from the block headers before decompressing\)"):
        decoder.decode(*_message(protocol, bomb), CTX)


def test_lz4_declared_content_size_is_refused_before_decompressing() -> None:
    tiny = _lz4_frame([b"x"], content_size=4 << 30, raw=True)  # 24 bytes declaring 4 GiB
    with pytest.raises(CompressionError, match=r"claim-check object 'o' \(24 bytes, large-message-handle-"
                                               r"compression=lz4\) is an LZ4 frame that declares 4294967296 "
                                               r"uncompressed bytes, more than the 536870912 allowed"):
        decompress("lz4", tiny, "canal-json", "claim-check object 'o'")


def test_lz4_frame_structure_is_checked() -> None:
    frame = compress("lz4", b"abc")
    skippable = struct.pack("<II", 0x184D2A55, 3) + b"xyz"
    assert decompress("lz4", skippable + frame + frame, "p") == b"abcabc"  # what the lz4 decoder accepts
    with pytest.raises(CompressionError, match=rf"no LZ4 frame magic at byte {len(frame)}"):
        decompress("lz4", frame + b"junk", "p")
    oversized = _lz4_frame([b"y" * ((4 << 20) + 1)], raw=True)
    with pytest.raises(CompressionError, match="LZ4 block of 4194305 bytes, more than the frame's 4194304 maximum"):
        decompress("lz4", oversized, "p")
    with pytest.raises(CompressionError, match="truncated LZ4 block"):
        decompress("lz4", _lz4_frame([b"abc"], raw=True)[:-6], "p")
    with pytest.raises(CompressionError, match="LZ4 frame version 0, expected 1"):
        decompress("lz4", frame[:4] + bytes([frame[4] & 0x3F]) + frame[5:], "p")


@settings(max_examples=200, deadline=None)
@given(data=st.data(), algorithm=st.sampled_from(["lz4", "snappy"]),
       protocol=st.sampled_from(["open-protocol", "canal-json"]))
def test_fuzz_mutated_compressed_values_give_only_decode_errors(data: st.DataObject, algorithm: str,
                                                               protocol: str) -> None:
    options = {"max-batch-size": "4"} if protocol == "open-protocol" else EXT
    opts = {**options, "large-message-handle-compression": algorithm}
    message = encoder_for(protocol, opts).encode(cases.ROW_EVENTS[:2])[0]
    buf = bytearray(message.value or b"")
    for _ in range(data.draw(st.integers(1, 3))):
        if data.draw(st.booleans()):
            buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
        else:
            buf = buf[: data.draw(st.integers(0, len(buf)))]
            if not buf:
                break
    try:
        decoder_for(protocol, opts).decode(message.key, bytes(buf), CTX)
    except DecodeError as exc:
        assert exc.offset == 77 and len(str(exc)) < 2000


def test_open_protocol_entries_of_one_message_share_one_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each value entry of an Open Protocol batch is compressed on its own; together they may not decompress
    past the limit either (a 10 MB batch of entries just under the limit each would otherwise add up to
    gigabytes). Here the limit is lowered to 12 MiB and two entries of 8 MiB each come."""
    monkeypatch.setattr("ticdc_delta.codec.open_protocol.MAX_DECOMPRESSED", 12 << 20)
    opts = {"max-batch-size": "4", "large-message-handle-compression": "lz4"}
    (real,) = encoder_for("open-protocol", opts).encode(cases.ROW_EVENTS[:2])
    entry = _lz4_frame([_ZEROS_BLOCK] * 2)  # 8 MiB of zeros (not JSON: it would fail later, if at all)
    value = b"".join(struct.pack(">Q", len(entry)) + entry for _ in range(2))
    with pytest.raises(CompressionError, match=r"tidb-cdc\[2\]@77: .*value entry 1 \(\d+ bytes, large-message-"
                                               r"handle-compression=lz4\) holds LZ4 blocks that can decompress to "
                                               r"more than the 4194304 bytes allowed"):
        decoder_for("open-protocol", opts).decode(real.key, value, CTX)
