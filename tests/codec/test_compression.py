"""large-message-handle-compression (lz4 | snappy) for Open Protocol and Canal-JSON, as TiCDC writes it."""

from __future__ import annotations

import pickle
import struct

import pytest
from hypothesis import given, settings, strategies as st

from ticdc_delta.codec import decoder_for, encoder_for
from ticdc_delta.codec.compression import compress, compression_option, decompress
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
