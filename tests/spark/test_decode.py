"""Executor-side decoding (``decode_messages``, no Spark needed): claim-check reads, dead letters, retries."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from ticdc_delta.codec import decoder_for, encoder_for
from ticdc_delta.errors import ClaimCheckUnavailableError
from ticdc_delta.spark.decode import decode_messages

from ..codec import cases


def _messages(tmp: Path) -> tuple[dict[str, str], list]:
    opts = {"enable-tidb-extension": "true", "large-message-handle-option": "claim-check",
            "max-message-bytes": "600", "claim-check-storage-uri": str(tmp)}
    return opts, encoder_for("canal-json", opts).encode(cases.ROW_EVENTS[:1])


def _decode(opts: dict[str, str], messages: list) -> dict[str, list]:
    n = len(messages)
    return decode_messages(decoder_for("canal-json", opts), ["t"] * n, [0] * n, list(range(n)),
                           [m.key for m in messages], [m.value for m in messages])


def test_claim_check_rows_are_read_on_the_executor(tmp_path: Path) -> None:
    opts, messages = _messages(tmp_path)
    out = _decode(opts, messages)
    assert out["kind"] == ["row"] and out["error"] == [None]


def test_missing_claim_check_object_is_a_dead_letter_row(tmp_path: Path) -> None:
    opts, messages = _messages(tmp_path)
    for p in tmp_path.iterdir():
        p.unlink()
    out = _decode(opts, messages)
    assert out["kind"] == ["error"] and "is not in" in out["error"][0] and out["value"] == [messages[0].value]


def test_unreachable_claim_check_storage_is_retried_not_dead_lettered(tmp_path: Path) -> None:
    opts, messages = _messages(tmp_path / "cc")
    (tmp_path / "blocker").write_bytes(b"")  # a file where the storage directory should be
    opts = {**opts, "claim-check-storage-uri": str(tmp_path / "blocker")}
    with pytest.raises(ClaimCheckUnavailableError, match="failed 4 times"):
        _decode(opts, messages)


def test_spark_ddl_is_derived_from_the_arrow_schema() -> None:
    import pyarrow as pa

    from ticdc_delta.spark.decode import DECODED_ARROW_SCHEMA, DECODED_SCHEMA, NAMED_SCHEMA, spark_ddl

    assert spark_ddl(pa.schema([("a", pa.string()), ("b", pa.int32()), ("c", pa.int64()), ("d", pa.binary()),
                                ("e", pa.bool_())])) == "a string, b int, c long, d binary, e boolean"
    assert DECODED_SCHEMA == spark_ddl(DECODED_ARROW_SCHEMA)
    assert NAMED_SCHEMA == DECODED_SCHEMA + ", schema string, table string, sig long, hashes array<long>"
    with pytest.raises(KeyError):
        spark_ddl(pa.schema([("f", pa.float64())]))


def test_span_rows_summarise_offsets_and_counts_per_partition_and_kind() -> None:
    from ticdc_delta.spark.decode import SPAN, span_rows

    out = {"topic": ["t", "t", "t", "t", "u"], "partition": [0, 0, 1, 0, 0], "offset": [7, 5, 9, 6, 1],
           "kind": ["row", "row", "row", "resolved", "error"], "idx": [0, 1, 0, 0, 0],
           "commit_ts": [1, 2, 3, 4, None], "payload": [b"a", b"b", b"c", None, None],
           "error": [None, None, None, None, "bad"]}
    spans = span_rows(out)
    got = sorted(zip(spans["topic"], spans["partition"], spans["error"], spans["offset"], spans["commit_ts"],
                     spans["idx"]))
    assert got == [("t", 0, "resolved", 6, 6, 1), ("t", 0, "row", 5, 7, 2), ("t", 1, "row", 9, 9, 1),
                   ("u", 0, "error", 1, 1, 1)]
    assert set(spans["kind"]) == {SPAN} and set(spans["payload"]) == {None}
    assert span_rows({name: [] for name in out}) == {name: [] for name in out}


def test_the_decoder_routes_rows_and_sums_their_layouts_per_table() -> None:
    """With the key columns, each row carries its key bucket routing (key_buckets.route of the folded
    record) and each output batch ends with one LAYOUT row per (table, layout): the rows' count."""
    import pyarrow as pa

    from ticdc_delta.core.key_buckets import route
    from ticdc_delta.core.merge import KeyResolver
    from ticdc_delta.codec import DecodeContext
    from ticdc_delta.core.records import dump_record, load_row, record_from_event
    from ticdc_delta.bench_e2e import CanalStream
    from ticdc_delta.spark.columnar import COORDS
    from ticdc_delta.spark.decode import LAYOUT, DecoderSpec, make_decode_fn

    stream = CanalStream(1, seed=3)
    values = [stream.change()[1] for _ in range(300)]
    batch = pa.RecordBatch.from_pydict({"topic": ["t"] * 300, "partition": [0] * 300, "offset": list(range(300)),
                                        "key": [None] * 300, "value": values})
    fn = make_decode_fn(DecoderSpec("canal-json", {"enable-tidb-extension": "true"}), names=str.lower, spans=True,
                        keys=lambda schema, table: None)
    out = next(iter(fn(iter([batch])))).to_pydict()
    rows = [i for i, k in enumerate(out["kind"]) if k == "row"]
    assert len(rows) == 300
    layouts = [i for i, k in enumerate(out["kind"]) if k == LAYOUT]
    assert [(out["schema"][i], out["table"][i], out["idx"][i]) for i in layouts] == [("bench", "orders", 300)]
    assert out["sig"][layouts[0]] == out["sig"][rows[0]]
    by_sig = {out["sig"][i]: pickle.loads(out["payload"][i]) for i in layouts}
    decoder = DecoderSpec("canal-json", {"enable-tidb-extension": "true"}).build()
    changed_key = 0
    for i in rows:
        # the row travels as its values; with its layout it is the record of the decoded event
        coords = tuple(out[c][i] for c in (*COORDS, "schema", "table"))
        rec = load_row(out["payload"][i], by_sig[out["sig"][i]], coords)
        [event] = decoder.decode(None, values[i], DecodeContext("t", 0, i))
        assert rec == record_from_event(event, "t", 0, i, 0)  # (names folded by str.lower: already lower)
        assert len(out["payload"][i]) < len(dump_record(rec))
        expected = route(rec._replace(schema=rec.schema.lower(), table=rec.table.lower()), KeyResolver())
        assert (out["sig"][i], out["hashes"][i]) == (expected.signature, expected.hashes)
        changed_key += len(out["hashes"][i]) == 2
    assert changed_key == 0  # the bench stream keeps its keys: one hash a row


def test_a_handle_key_only_row_of_a_batch_is_its_own_dead_letter_and_the_others_apply() -> None:
    """TiCDC's Open Protocol batches a handle-key-only row with whole rows of any table: without an upstream
    to complete it, that row alone becomes an ``error`` row (entry index kept); the others decode as rows."""
    from ..codec.test_open_protocol import frame_key, frame_value

    whole = b'{"u":{"id":{"t":3,"h":true,"f":11,"v":7}}}'
    key = frame_key(b'{"ts":8,"scm":"s","tbl":"t","t":1}', b'{"ts":9,"scm":"s","tbl":"t","t":1,"ohk":true}',
                    b'{"ts":10,"scm":"s","tbl":"u","t":1}')
    value = frame_value(whole, whole, whole)
    out = decode_messages(decoder_for("open-protocol"), ["t"], [0], [5], [key], [value])
    assert out["kind"] == ["row", "error", "row"] and out["idx"] == [0, 1, 2]
    assert out["error"][0] is None and "entry 1 of 3" in out["error"][1] and "handle-key-only" in out["error"][1]
    assert out["value"][1] == value and out["offset"] == [5, 5, 5]


def test_a_row_of_a_table_no_location_can_hold_is_its_own_dead_letter() -> None:
    """A row whose table name no Delta location can hold (256 bytes) is refused by itself: the other rows of
    its batch apply."""
    from ..codec.test_open_protocol import frame_key, frame_value

    whole = b'{"u":{"id":{"t":3,"h":true,"f":11,"v":7}}}'
    key = frame_key(b'{"ts":8,"scm":"s","tbl":"t","t":1}', b'{"ts":9,"scm":"s","tbl":"' + b"x" * 256 + b'","t":1}')
    out = decode_messages(decoder_for("open-protocol"), ["t"], [0], [5], [key], [frame_value(whole, whole)])
    assert out["kind"] == ["row", "error"] and out["idx"] == [0, 1] and "at most 255 fit" in out["error"][1]
