"""large-message-handle-option=claim-check / handle-key-only for Open Protocol and Canal-JSON: the stored
message is read back from a local claim-check directory; nothing key-only is ever decoded as a row."""

from __future__ import annotations

import base64
import pickle
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings, strategies as st

from ticdc_delta.codec import decoder_for, encoder_for
from ticdc_delta.codec.claim_check import ClaimCheckStorage, pack_claim_check_message
from ticdc_delta.codec.model import DecodeContext, FailedEntry, RowChange
from ticdc_delta.errors import (
    ClaimCheckError,
    ClaimCheckUnavailableError,
    ConfigError,
    DecodeError,
    HandleKeyOnlyError,
)

from . import cases

CTX = DecodeContext("tidb-cdc", 1, 500)
BASE = {"open-protocol": {"max-batch-size": "4"}, "canal-json": {"enable-tidb-extension": "true"}}


def _plain(protocol: str) -> list:
    opts = BASE[protocol]
    dec = decoder_for(protocol, opts)
    return [e for m in encoder_for(protocol, opts).encode(cases.ALL_EVENTS) for e in dec.decode(m.key, m.value, CTX)]


def _claim_check_options(protocol: str, root: str, **extra: str) -> dict[str, str]:
    return {**BASE[protocol], "large-message-handle-option": "claim-check", "max-message-bytes": "600",
            "claim-check-storage-uri": root, **extra}


@pytest.mark.parametrize("protocol", sorted(BASE))
@pytest.mark.parametrize("compression", ["none", "lz4", "snappy"])
@pytest.mark.parametrize("scheme", ["file://", ""])
def test_claim_check_round_trip(protocol: str, compression: str, scheme: str, tmp_path: Path) -> None:
    opts = _claim_check_options(protocol, scheme + str(tmp_path), **{"large-message-handle-compression": compression})
    messages = encoder_for(protocol, opts).encode(cases.ALL_EVENTS)
    stored = sorted(p.name for p in tmp_path.iterdir())
    assert stored and all(name.startswith("test-all_types-") and name.endswith(".json") for name in stored)
    decoder = pickle.loads(pickle.dumps(decoder_for(protocol, opts)))  # as an executor gets it
    got = [e for m in messages for e in decoder.decode(m.key, m.value, CTX)]
    assert got == _plain(protocol)
    assert all(e.source == CTX for e in got)  # the events keep the reference message's coordinates


def test_canal_json_raw_value(tmp_path: Path) -> None:
    opts = _claim_check_options("canal-json", str(tmp_path), **{"claim-check-raw-value": "true"})
    messages = encoder_for("canal-json", opts).encode(cases.ALL_EVENTS)
    (one, *_) = sorted(tmp_path.iterdir())
    assert orjson.loads(one.read_bytes())["isDdl"] is False  # the raw Canal-JSON value itself
    got = [e for m in messages for e in decoder_for("canal-json", opts).decode(m.key, m.value, CTX)]
    assert got == _plain("canal-json")


def test_stored_object_is_ticdcs_claim_check_message() -> None:
    """json.Marshal(ClaimCheckMessage{Key, Value}): []byte as base64, a nil key as null."""
    assert orjson.loads(pack_claim_check_message(b"\x00\x01", b"v")) == {"key": "AAE=", "value": "dg=="}
    assert orjson.loads(pack_claim_check_message(None, b"v"))["key"] is None


@pytest.mark.parametrize("protocol", sorted(BASE))
def test_reference_without_storage_option_is_refused(protocol: str, tmp_path: Path) -> None:
    messages = encoder_for(protocol, _claim_check_options(protocol, str(tmp_path))).encode(cases.ROW_EVENTS[:1])
    with pytest.raises(ClaimCheckError, match=r"tidb-cdc\[1\]@500: .*claim-check-storage-uri"):
        decoder_for(protocol, BASE[protocol]).decode(messages[0].key, messages[0].value, CTX)


@pytest.mark.parametrize("protocol", sorted(BASE))
def test_missing_object_is_a_claim_check_error(protocol: str, tmp_path: Path) -> None:
    opts = _claim_check_options(protocol, str(tmp_path))
    messages = encoder_for(protocol, opts).encode(cases.ROW_EVENTS[:1])
    for p in tmp_path.iterdir():
        p.unlink()
    with pytest.raises(ClaimCheckError, match=r"tidb-cdc\[1\]@500: .*claim-check object 'test-all_types-.*is not in"):
        decoder_for(protocol, opts).decode(messages[0].key, messages[0].value, CTX)


def test_location_outside_the_storage_is_never_read(tmp_path: Path) -> None:
    """Only the location's file name is looked up, in the configured storage (as TiCDC's consumer does)."""
    root = tmp_path / "cc"
    root.mkdir()
    opts = _claim_check_options("canal-json", str(root))
    (message,) = encoder_for("canal-json", opts).encode(cases.ROW_EVENTS[:1])
    (stored,) = root.iterdir()
    (tmp_path / "outside.json").write_bytes(stored.read_bytes())
    stored.unlink()
    forged = orjson.dumps({"_tidb": {"claimCheckLocation": "../outside.json"}})
    with pytest.raises(ClaimCheckError, match="'outside.json'.* is not in"):
        decoder_for("canal-json", opts).decode(None, forged, CTX)
    for location in ("", "..", "dir/"):
        with pytest.raises(ClaimCheckError, match="names no file"):
            decoder_for("canal-json", opts).decode(None, orjson.dumps({"_tidb": {"claimCheckLocation": location}}), CTX)


def test_object_of_another_row_is_refused(tmp_path: Path) -> None:
    opts = _claim_check_options("open-protocol", str(tmp_path))
    first, second = (encoder_for("open-protocol", opts).encode([e])[0] for e in cases.ROW_EVENTS[:2])
    a, b = sorted(tmp_path.iterdir(), key=lambda p: p.stat().st_mtime_ns)
    a.write_bytes(b.read_bytes())
    with pytest.raises(ClaimCheckError, match="holds a row of .* not the referenced row 0"):
        decoder_for("open-protocol", opts).decode(first.key, first.value, CTX)


def test_corrupt_object_is_a_claim_check_error(tmp_path: Path) -> None:
    opts = _claim_check_options("open-protocol", str(tmp_path))
    (message,) = encoder_for("open-protocol", opts).encode(cases.ROW_EVENTS[:1])
    (stored,) = tmp_path.iterdir()
    for content in (b"not json", b'{"key": 1, "value": "x"}', b'{"key": null, "value": "!!"}',
                    orjson.dumps({"key": base64.b64encode(b"\x00" * 8).decode(), "value": ""})):
        stored.write_bytes(content)
        with pytest.raises(ClaimCheckError, match=r"tidb-cdc\[1\]@500: .*claim-check object"):
            decoder_for("open-protocol", opts).decode(message.key, message.value, CTX)


def test_unreachable_storage_is_transient_after_bounded_retries(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    pauses: list[float] = []
    storage = ClaimCheckStorage(str(tmp_path / "file"), attempts=3, backoff=0.5, sleep=pauses.append)
    with pytest.raises(ClaimCheckUnavailableError, match="failed 3 times reading 'x.json'"):
        storage.read("s3://elsewhere/x.json", "open-protocol")  # a file where a directory should be
    assert pauses == [0.5, 1.0]
    assert ClaimCheckUnavailableError.retryable


def test_writes_are_retried_a_bounded_number_of_times(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    pauses: list[float] = []
    storage = ClaimCheckStorage(str(tmp_path / "file"), attempts=3, backoff=0.5, sleep=pauses.append)
    with pytest.raises(OSError):
        storage.write("x.json", b"{}")  # a file where the directory should be: every attempt fails
    assert pauses == [0.5, 1.0]
    (tmp_path / "file").unlink()
    assert storage.write("x.json", b"{}").endswith("/x.json") and (tmp_path / "file" / "x.json").read_bytes() == b"{}"


@pytest.mark.parametrize("protocol", sorted(BASE))
def test_handle_key_only_rows_are_never_decoded(protocol: str) -> None:
    opts = {**BASE[protocol], "large-message-handle-option": "handle-key-only", "max-message-bytes": "600"}
    messages = encoder_for(protocol, opts).encode(cases.ALL_EVENTS)
    decoder = decoder_for(protocol, opts)
    refused = 0
    for m in messages:
        try:
            events = decoder.decode(m.key, m.value, CTX)
        except HandleKeyOnlyError as exc:
            assert "large-message-handle-option=handle-key-only" in str(exc) and exc.offset == 500
            refused += 1
            continue
        for e in events:  # what decodes is complete: the small events, and key-only deletes
            if isinstance(e, RowChange) and e.op != "delete":
                assert e in _plain(protocol)
            if isinstance(e, FailedEntry):  # (a key-only row batched with whole ones: refused by itself)
                assert "large-message-handle-option=handle-key-only" in e.error and "@500: entry " in e.error
                refused += 1
    assert refused >= 1


@settings(max_examples=150, deadline=None)
@given(data=st.data(), protocol=st.sampled_from(sorted(BASE)))
def test_fuzz_claim_check_objects_give_only_decode_errors(data: st.DataObject, protocol: str) -> None:
    """Whatever the storage holds (mutated, truncated, other JSON), a reference decodes to the row or to a
    typed decode error carrying the message's coordinates."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        opts = _claim_check_options(protocol, tmp, **{"large-message-handle-compression": "lz4"})
        (message, *_) = encoder_for(protocol, opts).encode(cases.ROW_EVENTS[:1])
        (stored,) = Path(tmp).iterdir()
        buf = bytearray(stored.read_bytes())
        if data.draw(st.booleans()):
            buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
        else:
            buf = buf[: data.draw(st.integers(0, len(buf)))]
        stored.write_bytes(bytes(buf))
        try:
            events = decoder_for(protocol, opts).decode(message.key, message.value, CTX)
        except DecodeError as exc:
            assert exc.offset == 500
        else:
            assert all(isinstance(e, RowChange) for e in events)


@pytest.mark.parametrize("name", ["a" * 256 + ".json", "a\x00b.json", "a\nb.json", "sub"])
def test_a_location_no_object_can_have_is_a_claim_check_error_not_a_storage_outage(name: str,
                                                                                     tmp_path: Path) -> None:
    """A name no storage can hold (too long, a control character) or a directory of the storage: the
    message is a dead letter — retried as an outage, it failed the batch on every restart."""
    (tmp_path / "sub").mkdir()
    storage = ClaimCheckStorage(str(tmp_path), attempts=3, backoff=0.5, sleep=lambda _s: None)
    with pytest.raises(ClaimCheckError, match="claim-check location"):
        storage.read(f"s3://elsewhere/{name}", "open-protocol")


# -- the storage URI: checked up front, never shown with its credentials ---------------------------------

CREDENTIALED_URI = "s3://AKIAEXAMPLE:S3CR3T-CC@bucket/cc?endpoint_override=minio:9000&scheme=http"


class _FailingFileSystem:
    """A filesystem whose reads fail with pyarrow's kind of message: one that quotes the whole URI."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def open_input_stream(self, path: str) -> object:
        raise self.error


def _assert_no_credentials(text: str) -> None:
    assert "AKIAEXAMPLE" not in text and "S3CR3T-CC" not in text


def test_a_missing_object_names_the_storage_without_its_credentials(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The message becomes a dead-letter row's ``error``: it must not carry the storage's access key."""
    from pyarrow import fs as pafs

    storage = ClaimCheckStorage(CREDENTIALED_URI)
    monkeypatch.setattr(storage, "_filesystem", lambda: (pafs.LocalFileSystem(), str(tmp_path)))
    with pytest.raises(ClaimCheckError, match=r"is not in s3://bucket/cc$") as exc:
        storage.read("shop-orders-1-x.json", "canal-json")
    _assert_no_credentials(str(exc.value))


def test_an_unavailable_storage_names_it_without_its_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither the URI the job holds nor pyarrow's own text of it reaches the error (logs, ``error:`` line)."""
    storage = ClaimCheckStorage(CREDENTIALED_URI, attempts=2, backoff=0.0, sleep=lambda _s: None)
    failing = _FailingFileSystem(OSError(f"cannot reach {CREDENTIALED_URI} as user AKIAEXAMPLE"))
    monkeypatch.setattr(storage, "_filesystem", lambda: (failing, "bucket/cc"))
    with pytest.raises(ClaimCheckUnavailableError, match=r"claim-check storage s3://bucket/cc failed 2 times") as exc:
        storage.read("x.json", "canal-json")
    assert "cannot reach s3://bucket/cc as user ***" in str(exc.value)
    _assert_no_credentials(str(exc.value))


def test_a_uri_pyarrow_refuses_is_terminal_not_retried() -> None:
    """``ArrowInvalid`` (a ``ValueError``) from opening the URI is a bad setting, not an outage: retried as
    ``ClaimCheckUnavailableError`` the job exited 75 forever. (Offline: pyarrow refuses it while parsing.)"""
    pauses: list[float] = []
    storage = ClaimCheckStorage(
        "s3://AKIAEXAMPLE:S3CR3T-CC@bucket/cc?endpoint_override=127.0.0.1:1&allow_bucket_creation=maybe",
        sleep=pauses.append)
    with pytest.raises(ConfigError, match=r"claim-check-storage-uri: pyarrow cannot open s3://bucket/cc: .*boolean") \
            as exc:
        storage.read("x.json", "canal-json")
    assert pauses == [] and not exc.value.retryable
    _assert_no_credentials(str(exc.value))


@pytest.mark.parametrize(
    ("uri", "match"),
    [
        ("sss3://bucket/cc", r"unknown storage scheme 'sss3://'"),
        ("S3://bucket/cc", r"unknown storage scheme 'S3://'"),
        ("s3://AKIAEXAMPLE:S3CR3T-CC@bucket/cc?region=us-east-1&endpiont_override=minio:9000",
         r"s3://bucket/cc: unknown query parameter 'endpiont_override' for s3://"),
        ("s3://bucket/cc?access_key=AKIAEXAMPLE&secret_key=S3CR3T-CC", r"unknown query parameter 'access_key'"),
        ("gs://bucket/cc?region=us", r"unknown query parameter 'region' for gs://"),
    ],
)
def test_a_storage_uri_pyarrow_cannot_open_is_refused_up_front(uri: str, match: str) -> None:
    with pytest.raises(ValueError, match="option claim-check-storage-uri: .*" + match) as exc:
        ClaimCheckStorage(uri)
    _assert_no_credentials(str(exc.value))


@pytest.mark.parametrize(
    "uri",
    [
        "/var/claim-check",
        "file:///var/claim-check",
        "s3://bucket/cc?region=us-east-1&endpoint_override=minio:9000&scheme=http&allow_bucket_creation=true",
        "gs://bucket/cc?endpoint_override=gcs:4443&scheme=http",
        "abfs://container@account.dfs.core.windows.net/cc?sv=2024-01-01&sig=abc",
        "hdfs://namenode:8020/cc?replication=2",
    ],
)
def test_storage_uris_pyarrow_takes_are_accepted(uri: str) -> None:
    assert ClaimCheckStorage(uri).uri == uri
