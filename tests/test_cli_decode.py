"""The ``decode`` CLI contract, for every protocol (in-process, no Spark)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ticdc_delta.cli import main
from ticdc_delta.codec import encoder_for

from .codec import cases


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict], str]:
    rc = main(["decode", *args])
    out, err = capsys.readouterr()
    return rc, [json.loads(line) for line in out.splitlines()], err


@pytest.mark.parametrize("protocol, options", [
    ("open-protocol", {}),
    ("craft", {}),
    ("canal-json", {"enable-tidb-extension": "true"}),
])
def test_decode_prints_one_json_object_per_event(protocol: str, options: dict, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    (msg,) = encoder_for(protocol, {**options, "max-batch-size": "8"} if protocol != "canal-json" else options) \
        .encode([cases.UPDATE])
    (tmp_path / "v").write_bytes(msg.value or b"")
    args = ["--protocol", protocol, "--value-file", str(tmp_path / "v")]
    if msg.key is not None:
        (tmp_path / "k").write_bytes(msg.key)
        args += ["--key-file", str(tmp_path / "k")]
    for name, value in options.items():
        args += ["--option", f"{name}={value}"]
    rc, objs, err = _run(capsys, *args)
    assert rc == 0, err
    (obj,) = objs
    assert obj["kind"] == "row" and obj["op"] == "update" and obj["commit_ts"] == cases.TS2
    assert obj["columns"]["c_bigint_u"] == 9223372036854775808
    assert obj["old"]["c_bigint_u"] == 18446744073709551615  # exact JSON integer
    assert obj["columns"]["c_varbinary"] == {"base64": ""}
    assert obj["old"]["c_binary"] == {"base64": "iVBORw0KGgo="}
    assert obj["columns"]["c_decimal"] == "-0.0000001" and obj["columns"]["c_null"] is None


def test_decode_avro_with_local_schema_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ticdc_delta.codec.avro import AvroEncoder, AvroSchemas

    schemas = AvroSchemas()
    enc = AvroEncoder({"enable-tidb-extension": "true"}, schemas=schemas)
    row = cases.INSERT._replace(columns=tuple(c for c in cases.INSERT.columns if c.name not in ("c_enum", "c_set")))
    (msg,) = enc.encode([row])
    args = ["--protocol", "avro", "--option", "enable-tidb-extension=true"]
    for sid in sorted(schemas.known_ids):
        path = tmp_path / f"{sid}.avsc"
        path.write_text(schemas.get(sid))
        args += ["--avro-schema", f"{sid}={path}"]
    (tmp_path / "k").write_bytes(msg.key or b"")
    (tmp_path / "v").write_bytes(msg.value or b"")
    rc, objs, err = _run(capsys, *args, "--key-file", str(tmp_path / "k"), "--value-file", str(tmp_path / "v"))
    assert rc == 0, err
    assert objs[0]["op"] == "insert" and objs[0]["commit_ts"] == cases.TS1
    assert objs[0]["columns"]["c_bigint_u"] == 18446744073709551615


def test_decode_errors_are_one_line_and_non_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "v").write_bytes(b"\x07garbage")
    rc, objs, err = _run(capsys, "--protocol", "avro", "--value-file", str(tmp_path / "v"))
    assert rc != 0 and not objs
    assert err.count("\n") == 1 and "expected magic byte 0" in err
    rc, _, err = _run(capsys, "--protocol", "canal-json", "--value-file", str(tmp_path / "v"))
    assert rc != 0 and err.startswith("error: canal-json")


def _valid_message(protocol: str) -> tuple[bytes | None, bytes]:
    options = {"max-batch-size": "8"} if protocol in ("open-protocol", "craft") else {}
    msgs = encoder_for(protocol, options).encode(cases.ROW_EVENTS)
    return msgs[0].key, msgs[0].value or b""


_NESTED = b"[" * 1000 + b"]" * 1000


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), protocol=st.sampled_from(["open-protocol", "craft", "canal-json"]))
def test_fuzz_decode_cli_only_typed_errors(data: st.DataObject, protocol: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Mutated, truncated and deeply nested messages: the CLI prints events or one error line, never a
    traceback (an untyped exception would escape main() and fail the test)."""
    key, value = _valid_message(protocol)
    mode = data.draw(st.sampled_from(["mutate", "truncate", "nest"]))
    buf = bytearray(value)
    if mode == "truncate":
        buf = buf[: data.draw(st.integers(0, len(buf)))]
    elif mode == "mutate" and buf:
        for _ in range(data.draw(st.integers(1, 4))):
            buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
    elif mode == "nest":
        at = data.draw(st.integers(0, len(buf)))
        buf = buf[:at] + _NESTED + buf[at:]
    with tempfile.TemporaryDirectory() as tmp:
        args = ["--protocol", protocol, "--value-file", str(Path(tmp) / "v")]
        (Path(tmp) / "v").write_bytes(bytes(buf))
        if key is not None:
            (Path(tmp) / "k").write_bytes(key)
            args += ["--key-file", str(Path(tmp) / "k")]
        rc = main(["decode", *args])
    out, err = capsys.readouterr()
    if rc == 0:
        assert not err
        for line in out.splitlines():
            json.loads(line)
    else:
        assert rc == 1 and not out
        assert err.startswith(f"error: {protocol}") and err.count("\n") == 1 and len(err) < 2000


def test_decode_prints_integers_beyond_64_bits_exactly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An Open Protocol number of 30 digits stays exact through the decoder and the JSON line."""
    import struct

    entry = b'{"ts":1,"scm":"s","tbl":"t","t":1}'
    value = b'{"u":{"c":{"t":8,"f":0,"v":123456789012345678901234567890},"d":{"t":5,"f":0,"v":1.5}}}'
    (tmp_path / "k").write_bytes(struct.pack(">Q", 1) + struct.pack(">Q", len(entry)) + entry)
    (tmp_path / "v").write_bytes(struct.pack(">Q", len(value)) + value)
    rc, objs, err = _run(capsys, "--protocol", "open-protocol", "--key-file", str(tmp_path / "k"),
                         "--value-file", str(tmp_path / "v"))
    assert rc == 0, err
    assert objs[0]["columns"] == {"c": 123456789012345678901234567890, "d": 1.5}


def test_decode_prints_a_failed_entry_of_a_batch_and_the_others(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A handle-key-only row batched with a whole one: the whole row, then the failed entry and why."""
    from .codec.test_open_protocol import frame_key, frame_value

    whole = b'{"u":{"id":{"t":3,"h":true,"f":11,"v":7}}}'
    (tmp_path / "k").write_bytes(frame_key(b'{"ts":8,"scm":"s","tbl":"t","t":1}',
                                           b'{"ts":9,"scm":"s","tbl":"t","t":1,"ohk":true}'))
    (tmp_path / "v").write_bytes(frame_value(whole, whole))
    rc, objs, err = _run(capsys, "--protocol", "open-protocol", "--key-file", str(tmp_path / "k"),
                         "--value-file", str(tmp_path / "v"))
    assert rc == 0, err
    assert [o["kind"] for o in objs] == ["row", "failed"] and objs[1]["commit_ts"] == 9
    assert "entry 1 of 2" in objs[1]["error"] and "handle-key-only" in objs[1]["error"]
