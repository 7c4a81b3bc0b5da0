"""Avro schema ids the job cannot resolve, a schema registry that refuses or fails, and a changefeed
without the TiDB extension: the job stops or retries, it never dead-letters messages that are fine.

The executors' side runs through :func:`~ticdc_delta.spark.decode.decode_messages` (what Spark's
``mapInArrow`` calls), the driver's through ``BatchHandler._decoder_spec`` on a stand-in handler; no JVM.
"""

from __future__ import annotations

import json
import logging
import pickle
from types import SimpleNamespace
from typing import Any

import pytest

from ticdc_delta.codec.avro import AvroDecoder, AvroSchemas, ShippedSchemas
from ticdc_delta.errors import (
    ConfigError,
    SchemaRegistryUnavailableError,
    UnknownSchemaIdError,
)
from ticdc_delta.spark.batch_handler import BatchHandler
from ticdc_delta.spark.decode import DecoderSpec, decode_messages

SECRET = "alice:s3cr3t"  # what a registry error must never repeat


def frame(schema_id: int, body: bytes) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + body


def value_schema(*extra: str) -> str:
    """A TiCDC value schema of table ``test.t``: an INT ``id`` and INT columns ``extra``."""
    int_type = {"type": "int", "connect.parameters": {"tidb_type": "INT"}}
    fields = [{"name": n, "type": int_type} for n in ("id", *extra)]
    return json.dumps({"type": "record", "name": "t", "namespace": "default.test", "fields": fields})


class Registry:
    """confluent-kafka's ``SchemaRegistryClient`` as far as the job uses it, with the real registry's
    soft deletes (which confluent's mock does not track): a soft-deleted version is listed, and read by
    version, only with ``deleted=True``; ``GET /schemas/ids/<id>`` still serves it. ``failure`` makes
    every call raise it (an outage, refused credentials)."""

    class Error(Exception):
        def __init__(self, status: int, message: str) -> None:
            super().__init__(f"{message} (HTTP status code {status})")
            self.http_status_code = status

    def __init__(self) -> None:
        self.by_id: dict[int, str] = {}
        self.versions: dict[str, list[tuple[int, bool]]] = {}  # subject -> [(id, soft-deleted)]
        self.failure: Exception | None = None

    def add(self, subject: str, text: str) -> int:
        sid = len(self.by_id) + 1
        self.by_id[sid] = text
        self.versions.setdefault(subject, []).append((sid, False))
        return sid

    def soft_delete(self, subject: str, version: int) -> None:
        sid, _ = self.versions[subject][version - 1]
        self.versions[subject][version - 1] = (sid, True)

    def _check(self) -> None:
        if self.failure is not None:
            raise self.failure

    def register_schema(self, subject_name: str, schema: Any, normalize_schemas: bool = False) -> int:
        self._check()
        return self.add(subject_name, schema.schema_str)

    def get_schema(self, schema_id: int, subject_name: str | None = None, fmt: str | None = None) -> Any:
        self._check()
        if schema_id not in self.by_id:
            raise self.Error(404, "Schema not found")
        return SimpleNamespace(schema_str=self.by_id[schema_id], schema_type="AVRO")

    def get_versions(self, subject_name: str, deleted: bool = False, deleted_only: bool = False,
                     offset: int = 0, limit: int = -1) -> list[int]:
        self._check()
        if subject_name not in self.versions:
            raise self.Error(404, f"Subject '{subject_name}' not found")
        return [v for v, (_, gone) in enumerate(self.versions[subject_name], 1) if deleted or not gone]

    def get_version(self, subject_name: str, version: int, deleted: bool = False, fmt: str | None = None) -> Any:
        self._check()
        sid, gone = self.versions[subject_name][version - 1]
        if gone and not deleted:
            raise self.Error(404, f"Version {version} not found")
        return SimpleNamespace(schema_id=sid)


def handler(source: AvroSchemas, topics: tuple[str, ...] = ("t",), options: dict[str, str] | None = None) -> Any:
    """What ``BatchHandler._decoder_spec`` reads of a handler."""
    cfg = SimpleNamespace(
        topics=list(topics),
        source=SimpleNamespace(protocol="avro", options=options or {}, upstream_settings=lambda tz: None),
        sink=SimpleNamespace(source_timezone="UTC"),
    )
    return SimpleNamespace(_avro=source, _avro_registry=source._client is not None, cfg=cfg)


def spec_of(job: Any) -> tuple[DecoderSpec, ShippedSchemas]:
    """The driver's decoder spec for a batch, and the schemas it ships."""
    spec = BatchHandler._decoder_spec(job)
    assert isinstance(spec.avro_schemas, ShippedSchemas)
    return spec, spec.avro_schemas


def decode(spec: DecoderSpec, *values: bytes, topic: str = "t", partition: int = 3) -> dict[str, list[Any]]:
    """The executors' decode of value-only messages at offsets 40, 41, ... (the spec and the decoder
    pickled on the way, as Spark ships them)."""
    decoder = pickle.loads(pickle.dumps(pickle.loads(pickle.dumps(spec)).build()))
    n = len(values)
    return decode_messages(decoder, [topic] * n, [partition] * n, list(range(40, 40 + n)), [None] * n, list(values))


# --------------------------------------------------------------------------------------------------
# 1. enable-tidb-extension=true, the changefeed without the extension


def test_extension_mismatch_stops_the_job_instead_of_dead_lettering_every_row() -> None:
    spec = DecoderSpec("avro", {"enable-tidb-extension": "true"}, {2: value_schema()})
    with pytest.raises(ConfigError, match=r"source\.options: enable-tidb-extension is 'true', but the value schema "
                       r"id 2 \(test\.t\) of the message at t\[3\]@40 has no _tidb_op/_tidb_commit_ts fields: the "
                       r"changefeed does not send the TiDB extension; set enable-tidb-extension to false"):
        decode(spec, frame(2, b"\x02"), frame(2, b"\x04"))
    assert decode(DecoderSpec("avro", {}, {2: value_schema()}), frame(2, b"\x02"))["kind"] == ["row"]


# --------------------------------------------------------------------------------------------------
# 2. HTTP 401/403: configuration, not an outage


@pytest.mark.parametrize("status, why", [(401, "credentials are missing or wrong"),
                                         (403, "credentials lack the permission")])
def test_refused_credentials_are_a_config_error(status: int, why: str) -> None:
    registry = Registry()
    registry.add("t-value", value_schema())
    registry.failure = Registry.Error(status, f"Unauthorized for {SECRET}")
    source = AvroSchemas.from_registry(registry)
    with pytest.raises(ConfigError, match=rf"source\.schema_registry: the schema registry refused the lookup of "
                       rf"id 1 with HTTP {status}: the {why}") as info:
        source.get(1)
    assert not info.value.retryable and SECRET not in str(info.value)
    with pytest.raises(ConfigError, match=rf"refused the listing of t-key with HTTP {status}") as info:
        BatchHandler._decoder_spec(handler(source))
    assert SECRET not in str(info.value)
    with pytest.raises(ConfigError, match=rf"refused the registration for t-value with HTTP {status}"):
        source.register("t-value", value_schema("v"))


def test_refused_credentials_after_an_earlier_listing_are_no_outage() -> None:
    registry = Registry()
    registry.add("t-value", value_schema())
    source = AvroSchemas.from_registry(registry)
    BatchHandler._decoder_spec(handler(source))
    registry.failure = Registry.Error(401, "Unauthorized")
    with pytest.raises(ConfigError, match="HTTP 401"):
        BatchHandler._decoder_spec(handler(source))


def test_other_registry_failures_stay_retryable() -> None:
    registry = Registry()
    registry.failure = Registry.Error(503, "Service Unavailable")
    with pytest.raises(SchemaRegistryUnavailableError, match="schema registry lookup of id 1 failed") as info:
        AvroSchemas.from_registry(registry).get(1)
    assert info.value.retryable


# --------------------------------------------------------------------------------------------------
# 3. schema ids the driver did not ship


def test_soft_deleted_versions_are_shipped_to_the_executors() -> None:
    registry = Registry()
    old = registry.add("t-value", value_schema("v"))
    registry.soft_delete("t-value", 1)  # the usual way past a compatibility failure
    new = registry.add("t-value", value_schema("v", "w"))
    spec = BatchHandler._decoder_spec(handler(AvroSchemas.from_registry(registry)))
    assert sorted(spec.avro_schemas) == [old, new]
    out = decode(spec, frame(old, b"\x02\x04"), frame(new, b"\x02\x04\x06"))  # old messages still in Kafka
    assert out["kind"] == ["row", "row"] and out["error"] == [None, None]


def test_the_confluent_mock_lists_with_deleted_versions() -> None:
    try:
        from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    except ImportError as exc:  # confluent-kafka without its [schemaregistry] extras
        pytest.skip(f"confluent_kafka.schema_registry unavailable: {exc}")
    client = SchemaRegistryClient.new_client({"url": "mock://ticdc-delta-registry-errors"})
    sid = client.register_schema("mock_t-value", Schema(value_schema(), "AVRO"))
    shipped = AvroSchemas.from_registry(client).for_executors(["mock_t-key", "mock_t-value"])
    assert dict(shipped) == {sid: value_schema()} and shipped.source == "registry" and not shipped.registry_down


def test_an_id_missing_from_local_schemas_stops_the_job() -> None:
    spec = BatchHandler._decoder_spec(handler(AvroSchemas({1: value_schema(), 2: value_schema("v")})))
    assert decode(spec, frame(2, b"\x02\x04"))["kind"] == ["row"]
    with pytest.raises(UnknownSchemaIdError, match=r"avro: value schema id 7 of the message at t\[3\]@41 is not "
                       r"among the 2 schemas of source\.avro_schemas: add its file there") as info:
        decode(spec, frame(2, b"\x02\x04"), frame(7, b"\x02"))
    assert isinstance(info.value, ConfigError) and not info.value.retryable


def test_an_id_the_registry_does_not_know_stops_the_job() -> None:
    registry = Registry()
    registry.add("t.x-value", value_schema())
    spec = BatchHandler._decoder_spec(handler(AvroSchemas.from_registry(registry), topics=("t.x",)))
    with pytest.raises(UnknownSchemaIdError, match=r"avro: value schema id 9 of the message at t\.x\[3\]@40: the "
                       r"schema registry does not know it \(not registered under subject 't_x-value', "
                       r"soft-deleted versions included"):
        decode(spec, frame(9, b"\x02"), topic="t.x")


def test_unknown_id_errors_pickle() -> None:
    for err in (UnknownSchemaIdError("avro: value schema id 7 ..."), SchemaRegistryUnavailableError("down")):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err)


@pytest.mark.parametrize("value, error", [
    (b"\x01\x00\x00\x00\x07\x02", "expected magic byte 0, got 0x01"),
    (b"\x00\x00\x07", "expected at least 5 bytes"),
    (frame(1, b""), "the record of schema id 1 ends early"),
])
def test_corrupt_framing_is_still_a_dead_letter(value: bytes, error: str) -> None:
    spec = BatchHandler._decoder_spec(handler(AvroSchemas({1: value_schema()})))
    out = decode(spec, value)
    assert out["kind"] == ["error"] and error in out["error"][0]


def test_a_plain_snapshot_keeps_unknown_ids_as_decode_errors() -> None:
    # (the `decode` command and library users: no job to stop)
    shipped = pickle.loads(pickle.dumps(AvroSchemas({1: value_schema()}).snapshot()))
    out = decode_messages(AvroDecoder({}, schemas=shipped), ["t"], [0], [5], [None], [frame(7, b"\x02")])
    assert out["kind"] == ["error"] and "unknown schema id 7" in out["error"][0]


# --------------------------------------------------------------------------------------------------
# 4. a registry outage with the schemas at hand


def test_a_registry_outage_goes_on_with_the_schemas_listed_before(caplog: pytest.LogCaptureFixture) -> None:
    registry = Registry()
    first = registry.add("t-value", value_schema())
    source = AvroSchemas.from_registry(registry)
    job = handler(source)
    assert not spec_of(job)[1].registry_down

    registry.failure = ConnectionError("connection refused")
    with caplog.at_level(logging.WARNING, logger="ticdc_delta.codec.avro"):
        specs = [spec_of(job) for _ in range(3)]
    warned = [r.getMessage() for r in caplog.records if "could not be listed" in r.getMessage()]
    assert len(warned) == 1
    assert "connection refused" in warned[0] and "the 1 schemas of 't-key', 't-value'" in warned[0]
    assert all(sorted(shipped) == [first] and shipped.registry_down for _, shipped in specs)
    assert decode(specs[-1][0], frame(first, b"\x02"))["kind"] == ["row"]

    # a schema registered during the outage: the batch is retried, nothing dead-lettered
    newer = registry.add("t-value", value_schema("v"))
    with pytest.raises(SchemaRegistryUnavailableError, match=rf"avro: value schema id {newer} of the message at "
                       r"t\[3\]@40 is not among the 1 schemas the job holds, and the schema registry could not be "
                       r"listed for this batch") as info:
        decode(specs[-1][0], frame(newer, b"\x02\x04"))
    assert info.value.retryable

    registry.failure = None  # back: the retried batch gets the new schema
    spec, shipped = spec_of(job)
    assert sorted(shipped) == [first, newer] and not shipped.registry_down
    assert decode(spec, frame(newer, b"\x02\x04"))["kind"] == ["row"]

    registry.failure = ConnectionError("connection refused")  # a new outage warns again
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ticdc_delta.codec.avro"):
        BatchHandler._decoder_spec(job)
    assert len([r for r in caplog.records if "could not be listed" in r.getMessage()]) == 1


def test_a_registry_outage_before_any_listing_fails_the_batch() -> None:
    registry = Registry()
    registry.add("t-value", value_schema())
    registry.failure = ConnectionError("connection refused")
    with pytest.raises(SchemaRegistryUnavailableError, match="schema registry listing of t-key failed: "
                       "ConnectionError: connection refused"):
        BatchHandler._decoder_spec(handler(AvroSchemas.from_registry(registry)))


def test_shipped_schemas_pickle_with_where_they_came_from() -> None:
    shipped = ShippedSchemas({1: value_schema()}, "registry", registry_down=True)
    back = pickle.loads(pickle.dumps(shipped))
    assert back == {1: value_schema()} and (back.source, back.registry_down) == ("registry", True)
    with pytest.raises(ValueError, match="source must be 'files' or 'registry', got 'nfs'"):
        ShippedSchemas({}, "nfs")


def test_the_driver_gets_the_executors_schema_errors_typed() -> None:
    """Spark hands an executor's error to the driver as text: the job's exit code (1 or 75) needs the type."""
    from ticdc_delta.errors import SchemaRegistryUnavailableError, UnknownSchemaIdError
    from ticdc_delta.spark.kafka_source import unwrap_source_error

    for cls, retryable in ((UnknownSchemaIdError, False), (SchemaRegistryUnavailableError, True)):
        text = f"[STREAM_FAILED] ...\n  File \"decode.py\", line 1\nticdc_delta.errors.{cls.__name__}: avro: value schema id 9\n"
        found = unwrap_source_error(RuntimeError(text))
        assert type(found) is cls and found.retryable is retryable and str(found) == "avro: value schema id 9"
