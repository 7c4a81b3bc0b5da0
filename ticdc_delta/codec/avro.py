"""TiCDC Avro: Confluent-framed Avro records, one row change per Kafka message.

Wire format (seed 002, "TiCDC Avro Protocol"; checked against tiflow ``pkg/sink/codec/avro``):

- key and value are each ``0x00`` (magic byte) + 4-byte big-endian schema id + Avro binary of one
  record (the Confluent wire format). Framing is validated before any Avro is read.
- The key record holds the handle-key (primary or unique key) columns; the value record holds every
  column and, with ``enable-tidb-extension=true``, ``_tidb_op`` (``"c"`` insert, ``"u"`` update),
  ``_tidb_commit_ts`` and ``_tidb_commit_physical_time`` (ms).
- A delete is the key with an empty value (a Kafka tombstone); inserts and updates carry both. Avro
  carries no old image, no DDL and no resolved ts.
- Record name = table, namespace = ``"<changefeed namespace>.<schema>"`` (``"default.test"``), both
  sanitized to Avro names (TiCDC's ``sanitizeName``: any character outside ``[A-Za-z0-9_]`` becomes
  ``_``, a leading digit gets a ``_`` prefix).
- A column is ``{"name", "type": {"type": <avro type>, "connect.parameters": {"tidb_type": ...}}}``,
  a nullable column ``["null", {...}]`` with ``"default": null`` (``[{...}, "null"]`` when TiCDC
  writes the column's non-null default; both are read). ``tidb_type`` is one of INT,
  INT UNSIGNED, BIGINT, BIGINT UNSIGNED, FLOAT, DOUBLE, DECIMAL, BIT, TEXT, BLOB, ENUM, SET, JSON,
  DATE, DATETIME, TIMESTAMP, TIME, YEAR.

Sink-uri options: ``enable-tidb-extension``, ``avro-decimal-handling-mode`` (``precise``: bytes with
``logicalType`` decimal, the default; ``string``) and ``avro-bigint-unsigned-handling-mode`` (``long``:
values above 2**63-1 wrap to negative longs, the default; ``string``). The decoder reads whichever form
the writer schema declares, so these two only steer the encoder.

Decoded model (lossy where Avro is): TINYINT..INT decode as ``INT`` (Avro cannot tell TINYINT from
INT), text types as ``VARCHAR``, binary types as ``BLOB`` with the binary flag; key columns
carry ``HANDLE_KEY | PRIMARY_KEY``, union-with-null columns ``NULLABLE``, ``... UNSIGNED`` types
``UNSIGNED``. ENUM and SET values are their labels (``str``).

Original names: real TiCDC loses a name like ``c-1`` (it becomes ``c_1``). Our encoder keeps the round
trip by writing the original name where sanitizing changed it, following Debezium's
``__debezium.source.column.name`` practice of carrying it in ``connect.parameters``: the column's type
gets ``"tidb_column_name"``, the record gets ``"connect.parameters": {"tidb_schema_name": ...,
"tidb_table_name": ...}``. The decoder prefers these when present; real TiCDC messages, which lack
them, decode to the sanitized names.

Column types beyond ``tidb_type``: Avro carries no DDL, so DECIMAL(p, s) and ENUM/SET members come from
the schemas. In precise mode TiCDC writes the declared precision and scale as the ``logicalType``
decimal's attributes; ENUM/SET carry their members in ``connect.parameters.allowed``. In string mode
tiflow writes only ``tidb_type`` for a DECIMAL (``columnToAvroSchema``), so precision and scale are
unknown there. :func:`table_params` / :meth:`AvroSchemas.table_params_for` read what is known; the
encoder writes it when given ``column_params``.

Schema ids resolve through :class:`AvroSchemas`: local ``.avsc`` files, a Schema Registry client, or a
picklable snapshot the driver ships to Spark executors (no network calls there;
:meth:`AvroSchemas.for_executors`). A message of an id missing from a job's shipped snapshot is no dead
letter: its schema is missing, not the message broken, so the job stops
(:class:`~ticdc_delta.errors.UnknownSchemaIdError`), or retries the batch when the registry could not be
listed (:class:`~ticdc_delta.errors.SchemaRegistryUnavailableError`).
"""

from __future__ import annotations

import inspect
import io
import json
import logging
import os
import re
import struct
import zlib
from operator import itemgetter
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence, cast

import orjson
from fastavro import parse_schema, schemaless_reader, schemaless_writer

from ..errors import (
    ConfigError,
    DecodeError,
    EncodeError,
    FramingError,
    SchemaNotFoundError,
    SchemaRegistryUnavailableError,
    TicdcDeltaError,
    TruncatedMessageError,
    UnknownSchemaIdError,
    preview,
)
from .base import Message, parse_bool_option
from .model import (
    Column,
    ColumnFlag,
    DecodeContext,
    Event,
    Image,
    ImageLayout,
    Op,
    RowChange,
    TypeCode,
    column_flag,
)

__all__ = [
    "AvroSchemas", "ShippedSchemas", "AvroDecoder", "AvroEncoder", "PROTOCOL", "sanitize_name", "table_params",
]

log = logging.getLogger(__name__)

PROTOCOL = "avro"

MAGIC_BYTE = 0
_HEADER = 5  # magic byte + 4-byte big-endian schema id (Confluent wire format)

# TiDB extension fields (tiflow avro.go). The checksum fields follow them with enable-row-checksum.
_OP, _COMMIT_TS, _PHYSICAL_TIME = "_tidb_op", "_tidb_commit_ts", "_tidb_commit_physical_time"
_EXTENSION_FIELDS = frozenset(
    {_OP, _COMMIT_TS, _PHYSICAL_TIME, "_tidb_row_level_checksum", "_tidb_corrupted", "_tidb_checksum_version"}
)
_INSERT_OP, _UPDATE_OP = "c", "u"

# Where the encoder keeps names that sanitizing changed (see the module docstring).
_PARAMS = "connect.parameters"
_COLUMN_NAME, _SCHEMA_NAME, _TABLE_NAME = "tidb_column_name", "tidb_schema_name", "tidb_table_name"

_DECIMAL_PRECISE, _DECIMAL_STRING = "precise", "string"
_BIGINT_LONG, _BIGINT_STRING = "long", "string"

_KEY_FLAGS = ColumnFlag.HANDLE_KEY | ColumnFlag.PRIMARY_KEY
_KEY_BITS = int(_KEY_FLAGS)  # Column.is_key, without IntFlag arithmetic (slow) in the encoder's loop
_U64_RANGE = 1 << 64
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
_MAX_DECIMAL_BYTES = 32  # DECIMAL(65) needs 28 bytes of two's complement; more is not a TiDB value
_MAX_DECIMAL_SCALE = 30  # MySQL's DECIMAL scale limit
_DECIMAL_PRECISION = 65  # when the declared precision is unknown (see AvroEncoder): MySQL's maximum
_BIT_LENGTH = "64"  # ditto for BIT(M): the widest BIT
_DECIMAL_TEXT = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
_UINT_TEXT = re.compile(r"[0-9]{1,20}")


class _Bad(Exception):
    """Internal: what was wrong with a value or schema, located by the caller."""


def _bad_exc(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def sanitize_name(name: str) -> str:
    """An Avro name for a TiDB identifier, as TiCDC's ``sanitizeName`` makes it.

    Every character outside ``[A-Za-z0-9_]`` becomes ``_``; a leading digit is prefixed with ``_``.
    """
    out = []
    for i, ch in enumerate(name):
        if ch == "_" or ("a" <= ch <= "z") or ("A" <= ch <= "Z") or ("0" <= ch <= "9"):
            if i == 0 and "0" <= ch <= "9":
                out.append("_")
            out.append(ch)
        else:
            out.append("_")
    return "".join(out)


def _sanitize_topic(topic: str) -> str:
    # tiflow sanitizeTopic: "." may mean something to sink connectors
    return topic.replace(".", "_")


def _plain_schema(node: Any) -> Any:
    """A copy of a schema without ``logicalType`` and ``default``: the same binary, read and written with
    this one schema (no reader schema to resolve against, where alone defaults count).

    Without ``logicalType`` fastavro reads and writes the raw bytes of a decimal, which we format exactly
    (fastavro would round through a decimal context). Without ``default``: fastavro refuses a whole-number
    default for a plain ``float``/``double`` field ("Default value <0> must match schema type: double"),
    which is what TiCDC writes for a ``DOUBLE NOT NULL DEFAULT 0`` column (Go prints the float64 0 as
    ``0``), and every row of such a table would be undecodable."""
    if isinstance(node, dict):
        return {k: _plain_schema(v) for k, v in node.items() if k not in ("logicalType", "default")}
    if isinstance(node, list):
        return [_plain_schema(v) for v in node]
    return node


# --------------------------------------------------------------------------------------------------
# Schema sources


class _PlainSchema(NamedTuple):
    """Stand-in for confluent-kafka's ``Schema`` when its schema-registry extras are not installed."""

    schema_str: str
    schema_type: str = "AVRO"
    references: tuple[Any, ...] = ()


def _registry_schema(schema_json: str) -> Any:
    try:
        from confluent_kafka.schema_registry import Schema
    except ImportError:  # the [schemaregistry] extras are missing; a duck-typed client still works
        return _PlainSchema(schema_json)
    return Schema(schema_json, "AVRO")


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "http_status_code", None)
    return status if isinstance(status, int) else None


_REFUSED = {
    401: "the credentials are missing or wrong (basic.auth.user.info, bearer.auth.*)",
    403: "the credentials lack the permission (the registry's ACLs)",
}


def _registry_failure(exc: BaseException, what: str) -> TicdcDeltaError:
    """The typed error for a registry call ``what`` (``"lookup of id 7"``) that failed with ``exc``, 404
    aside: HTTP 401/403 are bad credentials or a forbidden subject, which no retry mends (the message
    names the status, never the credentials nor what the registry answered); anything else (unreachable,
    a timeout, 5xx) is worth a retry."""
    status = _status(exc)
    if status in _REFUSED:
        return ConfigError(
            f"source.schema_registry: the schema registry refused the {what} with HTTP {status}: "
            f"{_REFUSED[status]}"
        )
    return SchemaRegistryUnavailableError(f"schema registry {what} failed: {_bad_exc(exc)}")


def _deleted_too(method: Callable[..., Any]) -> dict[str, bool]:
    """``{"deleted": True}`` when a registry client's ``get_versions``/``get_version`` takes it
    (confluent-kafka's client and its mock do); a duck-typed client without it lists what it lists."""
    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):  # a builtin or C method without a signature
        return {}
    takes = any(p.name == "deleted" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    return {"deleted": True} if takes else {}


_FILES, _REGISTRY = "files", "registry"


class ShippedSchemas(dict[int, str]):
    """The schemas a job's driver ships to its executors (the ``avro_schemas`` of
    :class:`~ticdc_delta.spark.decode.DecoderSpec`): id → schema JSON, and where they came from, so
    that an executor meeting an id that is not among them stops the job with the right advice instead of
    dead-lettering the message (see :meth:`AvroSchemas.for_executors`).

    ``source``: ``"files"`` (``source.avro_schemas``) or ``"registry"`` (``source.schema_registry``);
    ``registry_down``: the registry could not be listed for this batch, so the ids are those of an
    earlier one and an unknown id is worth a retry.
    """

    def __init__(self, schemas: Mapping[int, str], source: str, registry_down: bool = False) -> None:
        if source not in (_FILES, _REGISTRY):
            raise ValueError(f"source must be {_FILES!r} or {_REGISTRY!r}, got {source!r}")
        super().__init__(schemas)
        self.source = source
        self.registry_down = bool(registry_down)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ShippedSchemas, (dict(self), self.source, self.registry_down))


def _check_schema_json(text: str, where: str) -> str:
    """``text`` if it is a JSON object (an Avro record schema); unwraps a registry ``{"schema": ...}``.

    Raises:
        ValueError: not JSON, or not an object.
    """
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"{where}: not JSON ({exc})") from exc
    # `curl $REGISTRY/schemas/ids/7` answers {"schema": "<the schema as a string>"}
    if isinstance(doc, dict) and "type" not in doc and isinstance(doc.get("schema"), str):
        return _check_schema_json(doc["schema"], where)
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: expected a JSON object (an Avro record schema), got {type(doc).__name__}")
    return text


def _schema_id(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"schema id must be an int, got {type(value).__name__}")
    sid = int(value)
    if not 0 <= sid <= 0xFFFFFFFF:
        raise ValueError(f"schema id must fit 4 bytes unsigned, got {sid}")
    return sid


class AvroSchemas:
    """Resolves Avro schema ids to schema JSON: a dict, local ``.avsc`` files, or a Schema Registry.

    Build one with :meth:`from_files`, :meth:`from_registry` or ``AvroSchemas({id: schema_json})``.
    Resolved schemas are cached. A registry-backed source does network calls and does not pickle; on
    the driver, call :meth:`snapshot` for a dict-backed copy that pickles and resolves without network,
    or :meth:`for_executors` for what a job's Spark executors get each batch. :meth:`register` adds a
    schema (the encoder's side).

    Schemas are JSON strings; the decoder parses each id once and caches the result.
    """

    def __init__(self, schemas: Mapping[int, str] | None = None) -> None:
        """A dict-backed source (what :meth:`snapshot` returns). Given a :class:`ShippedSchemas` (on an
        executor), an unknown id raises what :meth:`unknown_id_error` says instead of
        :class:`SchemaNotFoundError`.

        Raises:
            TypeError, ValueError: an id that is not a 4-byte unsigned int, or a schema that is not a
                JSON object string.
        """
        self._known: dict[int, str] = {}
        self._subjects: dict[str, list[int]] = {}
        self._client: Any = None
        self._shipped: tuple[str, bool] | None = None  # (source, registry_down) of a ShippedSchemas
        if isinstance(schemas, ShippedSchemas):
            self._shipped = (schemas.source, schemas.registry_down)
        self._listed: dict[str, tuple[int, ...]] = {}  # for_executors: each subject's ids as last listed
        self._registry_down = False  # for_executors: the last call could not list some subject
        for sid, text in (schemas or {}).items():
            if not isinstance(text, str):
                raise TypeError(f"schema {sid!r} must be a JSON string, got {type(text).__name__}")
            self._known[_schema_id(sid)] = _check_schema_json(text, f"schema id {sid}")

    @classmethod
    def from_files(cls, files: Mapping[int, str | os.PathLike[str]]) -> "AvroSchemas":
        """Schemas from local files, ``{schema id: path}``: an ``.avsc`` file, or the registry's answer
        to ``GET /schemas/ids/<id>`` saved as is.

        Raises:
            ConfigError: a file that cannot be read or is not an Avro schema (names the path).
        """
        known: dict[int, str] = {}
        for sid, path in files.items():
            try:
                with open(path, encoding="utf-8") as fh:
                    text = fh.read()
                known[_schema_id(sid)] = _check_schema_json(text, os.fspath(path))
            except (OSError, UnicodeDecodeError, ValueError, TypeError) as exc:
                raise ConfigError(f"avro schema file for id {sid!r} ({os.fspath(path)}): {exc}") from exc
        return cls(known)

    @classmethod
    def from_registry(cls, client: Any) -> "AvroSchemas":
        """Schemas from a Schema Registry client, fetched lazily by id and cached.

        ``client`` is a confluent-kafka ``SchemaRegistryClient`` (``SchemaRegistryClient.new_client(
        {"url": "mock://..."})`` gives the in-process mock; since confluent-kafka 2.x the plain
        constructor builds an HTTP client even for ``mock://``) or anything with its ``get_schema(id)``
        / ``register_schema(subject, schema)`` (and, for :meth:`snapshot` by subject,
        ``get_versions`` / ``get_version``).

        Raises:
            TypeError: ``client`` has no ``get_schema``.
        """
        if not callable(getattr(client, "get_schema", None)):
            raise TypeError(f"client must be a SchemaRegistryClient, got {type(client).__name__}")
        source = cls()
        source._client = client
        return source

    @property
    def known_ids(self) -> frozenset[int]:
        """The ids this source resolves without a network call (all of them when dict-backed)."""
        return frozenset(self._known)

    def get(self, schema_id: int) -> str:
        """The schema JSON for ``schema_id``.

        Raises:
            SchemaNotFoundError: neither the cache/files nor the registry know the id (no message
                coordinates: the decoder adds them).
            DecodeError: the registry's schema for the id is not an Avro schema.
            ConfigError: the registry refused the credentials (HTTP 401/403).
            SchemaRegistryUnavailableError: the registry failed otherwise (unreachable, 5xx); worth
                retrying.
        """
        text = self._known.get(schema_id)
        if text is not None:
            return text
        if self._client is None:
            raise SchemaNotFoundError(
                PROTOCOL, f"unknown schema id {schema_id}: not among the {len(self._known)} local schemas"
            )
        try:
            found = self._client.get_schema(schema_id)
        except Exception as exc:  # noqa: BLE001 - the registry client's errors are untyped beyond status
            if _status(exc) == 404:
                raise SchemaNotFoundError(
                    PROTOCOL, f"unknown schema id {schema_id}: the schema registry has none ({exc})"
                ) from exc
            raise _registry_failure(exc, f"lookup of id {schema_id}") from exc
        kind = getattr(found, "schema_type", None) or "AVRO"
        text = getattr(found, "schema_str", None)
        if kind != "AVRO" or not isinstance(text, str):
            raise DecodeError(PROTOCOL, f"schema id {schema_id} is a {kind} schema, not an Avro one")
        self._known[schema_id] = text
        return text

    def register(self, subject: str, schema_json: str) -> int:
        """Register ``schema_json`` under ``subject``; the id (the same id for the same schema).

        Registry-backed: the registry's ``register_schema``. Dict-backed: the id is derived from the
        schema text (CRC-32, 31 bits, probing past collisions), so independent encoders agree.

        Raises:
            EncodeError: the registry refused the schema (e.g. 409, incompatible with the subject).
            ConfigError: the registry refused the credentials (HTTP 401/403).
            SchemaRegistryUnavailableError: the registry failed otherwise.
        """
        if self._client is not None:
            try:
                sid = int(self._client.register_schema(subject, _registry_schema(schema_json)))
            except Exception as exc:  # noqa: BLE001
                status = _status(exc)
                if status is not None and 400 <= status < 500 and status not in _REFUSED:
                    raise EncodeError(f"schema registry refused a schema for {subject}: {exc}") from exc
                raise _registry_failure(exc, f"registration for {subject}") from exc
        else:
            sid = zlib.crc32(schema_json.encode()) & 0x7FFFFFFF
            while self._known.get(sid, schema_json) != schema_json:
                sid = (sid + 1) & 0x7FFFFFFF
        self._known[sid] = schema_json
        versions = self._subjects.setdefault(subject, [])
        if sid not in versions:
            versions.append(sid)
        return sid

    def snapshot(self, ids: Iterable[int] | None = None, subjects: Iterable[str] = ()) -> "AvroSchemas":
        """A dict-backed, picklable copy holding ``ids`` and every version of ``subjects``.

        ``ids=None`` and no subjects: every schema resolved so far. Subjects are listed through the
        registry (``get_versions``/``get_version``, soft-deleted versions included) when registry-backed,
        else from :meth:`register`.

        Raises:
            SchemaNotFoundError: an id or subject that cannot be resolved.
            ConfigError: the registry refused the credentials (HTTP 401/403).
            SchemaRegistryUnavailableError: the registry failed.
        """
        wanted = set(self._known) if ids is None and not subjects else {_schema_id(i) for i in ids or ()}
        for subject in subjects:
            wanted.update(self._subject_ids(subject))
        return AvroSchemas({sid: self.get(sid) for sid in sorted(wanted)})

    def for_executors(self, subjects: Iterable[str] = ()) -> ShippedSchemas:
        """What a job's driver ships to its Spark executors for a batch: every schema resolved so far and
        every version of ``subjects`` (a registry's ``<topic>-key`` / ``<topic>-value``), as a picklable
        :class:`ShippedSchemas`.

        Versions are listed soft-deleted ones included: deleting a subject's versions (not permanently)
        is the usual way past a compatibility failure, and the registry still serves them by id to the
        old messages in Kafka that carry them. A subject the registry has nothing under ships nothing.

        A registry outage does not stop a job whose schemas are at hand: when a subject cannot be listed
        (unreachable, 5xx) but was listed by an earlier call, its ids of then are shipped, marked
        ``registry_down`` (a warning is logged once per outage); a message of a schema registered
        meanwhile then fails its batch with :class:`SchemaRegistryUnavailableError`, to be retried.

        Raises:
            SchemaRegistryUnavailableError: the registry failed for a subject never listed before.
            ConfigError: the registry refused the credentials (HTTP 401/403).
        """
        down: list[tuple[str, SchemaRegistryUnavailableError]] = []
        for subject in subjects:
            try:
                ids = tuple(self._subject_schemas(subject))
            except SchemaRegistryUnavailableError as exc:
                if subject not in self._listed:
                    raise
                down.append((subject, exc))
                continue
            self._listed[subject] = ids
        if down and not self._registry_down:
            held = {sid for subject, _ in down for sid in self._listed[subject]}
            log.warning(
                "the schema registry could not be listed (%s): going on with the %d schemas of %s listed "
                "before; a message of a schema registered since fails its batch, to be retried",
                down[0][1], len(held), ", ".join(repr(s) for s, _ in down),
            )
        elif self._registry_down and not down:
            log.info("the schema registry answers again")
        self._registry_down = bool(down)
        source = _REGISTRY if self._client is not None else _FILES
        return ShippedSchemas({sid: self._known[sid] for sid in sorted(self._known)}, source, bool(down))

    def _subject_schemas(self, subject: str) -> list[int]:
        """The ids of ``subject`` whose schemas are now in the cache (none when nothing is registered
        under it; an id the registry lists but does not serve is left out: a message of it stops the
        job as an unknown id).

        Raises:
            SchemaRegistryUnavailableError, ConfigError: see :meth:`get`.
        """
        try:
            ids = self._subject_ids(subject)
        except SchemaNotFoundError:
            return []  # nothing registered for this topic yet
        found = []
        for sid in ids:
            try:
                self.get(sid)
            except SchemaNotFoundError:
                continue
            found.append(sid)
        return found

    def unknown_id_error(self, schema_id: int, ctx: DecodeContext, part: str) -> TicdcDeltaError | None:
        """What an unknown ``schema_id`` of a message raises when this source is a job's
        :class:`ShippedSchemas` (``None`` otherwise: a :class:`SchemaNotFoundError`, a dead letter).

        :class:`UnknownSchemaIdError` (the job stops: add the schema to ``source.avro_schemas``, or the
        registry does not know it), or :class:`SchemaRegistryUnavailableError` when the registry could
        not be listed for the batch (it may know the id: retry). Names the id and the message's
        coordinates.
        """
        if self._shipped is None:
            return None
        source, registry_down = self._shipped
        topic, partition, offset = ctx
        where = f"{PROTOCOL}: {part} schema id {schema_id} of the message at {topic}[{partition}]@{offset}"
        if source == _FILES:
            return UnknownSchemaIdError(
                f"{where} is not among the {len(self._known)} schemas of source.avro_schemas: add its file "
                f"there (the registry's answer to GET /schemas/ids/{schema_id} saved as is will do) and start "
                "the job again; no message was dead-lettered for it"
            )
        if registry_down:
            return SchemaRegistryUnavailableError(
                f"{where} is not among the {len(self._known)} schemas the job holds, and the schema registry "
                "could not be listed for this batch: worth a retry once it answers"
            )
        subject = f"{_sanitize_topic(str(topic))}-{part}"
        return UnknownSchemaIdError(
            f"{where}: the schema registry does not know it (not registered under subject {subject!r}, "
            "soft-deleted versions included: deleted permanently, or another registry than the "
            "changefeed's; check source.schema_registry); no message was dead-lettered for it"
        )

    def table_params_for(self, ids: Iterable[int]) -> dict[tuple[str, str], dict[str, dict[str, Any]]]:
        """:func:`table_params` of the schemas ``ids``, merged per table: ``{(schema, table): {column:
        {"precision", "scale", "members"}}}``.

        Schemas are read in the order given (pass a subject's versions oldest first): a later schema's
        view of a column replaces an earlier one's, and a column a later schema declares with nothing
        known (say, retyped to INT) is dropped — except a DECIMAL's precision and scale, which hold the
        values of both: the larger integer digits and the larger scale (``DECIMAL(10,2)`` then
        ``DECIMAL(10,4)`` is ``DECIMAL(12,4)``). Messages of every version stay in Kafka and a batch mixes
        them; and a registry hands an earlier version's id back to a schema registered again (``(12,4)``,
        ``(10,2)``, then ``(12,4)`` again is ids 1, 2, 1), so no order of ids says which came last. Every
        table of ``ids`` has an entry, possibly empty.

        Raises:
            SchemaNotFoundError, SchemaRegistryUnavailableError, ConfigError: an id that cannot be resolved
                (see :meth:`get`).
            DecodeError: a schema that is not a TiCDC Avro schema (names the id).
            TypeError, ValueError: an id that is not a 4-byte unsigned int.
        """
        out: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
        for raw_id in ids:
            sid = _schema_id(raw_id)
            text = self.get(sid)
            try:
                schema, table, columns = _schema_columns(text)
            except _Bad as exc:
                raise DecodeError(PROTOCOL, f"schema id {sid} is not a TiCDC Avro schema: {exc}") from exc
            merged = out.setdefault((schema, table), {})
            for name, params in columns.items():
                if params is None:
                    merged.pop(name, None)
                    continue
                before = merged.get(name)
                if before is not None and None not in (before.get("precision"), before.get("scale"),
                                                       params.get("precision"), params.get("scale")):
                    scale = max(before["scale"], params["scale"])
                    digits = max(before["precision"] - before["scale"], params["precision"] - params["scale"])
                    params = {**params, "precision": digits + scale, "scale": scale}
                merged[name] = params
        return out

    def _subject_ids(self, subject: str) -> list[int]:
        if self._client is None:
            if subject not in self._subjects:
                raise SchemaNotFoundError(PROTOCOL, f"no schema registered under subject {subject!r}")
            return list(self._subjects[subject])
        # soft-deleted versions too: the registry still serves them by id (see for_executors)
        client = self._client
        try:
            versions = client.get_versions(subject, **_deleted_too(client.get_versions))
            deleted = _deleted_too(client.get_version)
            ids = [int(client.get_version(subject, v, **deleted).schema_id) for v in versions]
        except Exception as exc:  # noqa: BLE001
            if _status(exc) == 404:
                raise SchemaNotFoundError(PROTOCOL, f"the schema registry has no subject {subject!r}") from exc
            raise _registry_failure(exc, f"listing of {subject}") from exc
        if not ids:  # confluent's mock answers [] where the real registry answers 404
            raise SchemaNotFoundError(PROTOCOL, f"the schema registry has no subject {subject!r}")
        return ids

    def __reduce__(self) -> tuple[Any, ...]:
        if self._client is not None:
            raise TypeError(
                "a registry-backed AvroSchemas does not pickle; ship schemas.snapshot(...) to executors"
            )
        if self._shipped is not None:
            return (AvroSchemas, (ShippedSchemas(self._known, *self._shipped),))
        return (AvroSchemas, (dict(self._known),))

    def __repr__(self) -> str:
        where = "registry" if self._client is not None else "local"
        return f"AvroSchemas({where}, {len(self._known)} schemas)"


def _coerce_schemas(schemas: Any, required: bool) -> AvroSchemas:
    if schemas is None:
        if required:
            raise ValueError(
                "the avro decoder needs schemas=AvroSchemas.from_registry(...), .from_files(...) or a snapshot"
            )
        return AvroSchemas()
    if not isinstance(schemas, AvroSchemas):
        raise TypeError(f"schemas must be an AvroSchemas, got {type(schemas).__name__}")
    return schemas


def _choice(options: Mapping[str, str], name: str, allowed: tuple[str, str]) -> str:
    value = str(options.get(name, allowed[0])).strip().lower()
    if value not in allowed:
        raise ValueError(f"option {name} must be one of {', '.join(allowed)}, got {options[name]!r}")
    return value


# --------------------------------------------------------------------------------------------------
# Decoding


def _wrap_u64(value: int) -> int:
    # avro-bigint-unsigned-handling-mode=long: TiCDC writes int64(uint64), so values > 2**63-1 wrap
    return value + _U64_RANGE if value < 0 else value


def _parse_u64(value: str) -> int:
    if _UINT_TEXT.fullmatch(value) is None or int(value) >= _U64_RANGE:
        raise _Bad(f"expected a BIGINT UNSIGNED as decimal digits, got {value[:40]!r}")
    return int(value)


def _bit_value(value: bytes) -> int:
    if len(value) > 8:
        raise _Bad(f"expected at most 8 bytes for a BIT, got {len(value)}")
    return int.from_bytes(value, "big")


def _decimal_text(value: str) -> str:
    if _DECIMAL_TEXT.fullmatch(value) is None:
        raise _Bad(f"expected a decimal number, got {value[:40]!r}")
    return value


def _format_unscaled(unscaled: int, scale: int) -> str:
    """``unscaled * 10**-scale`` printed with exactly ``scale`` fractional digits (TiDB's form)."""
    sign = "-" if unscaled < 0 else ""
    digits = str(abs(unscaled))
    if scale == 0:
        return sign + digits
    digits = digits.rjust(scale + 1, "0")
    return f"{sign}{digits[:-scale]}.{digits[-scale:]}"


class _DecimalReader:
    """A bytes DECIMAL of one scale as TiDB prints it; the generated readers inline it (by :attr:`scale`)."""

    __slots__ = ("scale",)

    def __init__(self, scale: int) -> None:
        self.scale = int(scale)

    def __call__(self, value: bytes) -> str:
        """Raises: _Bad: no bytes, or more than a DECIMAL(65) needs."""
        if len(value) > _MAX_DECIMAL_BYTES:
            raise _Bad(f"expected at most {_MAX_DECIMAL_BYTES} bytes for a DECIMAL, got {len(value)}")
        if not value:
            raise _Bad("expected at least 1 byte for a DECIMAL, got 0")
        return _format_unscaled(int.from_bytes(value, "big", signed=True), self.scale)


# tidb_type -> (type code, flags, {avro type accepted: converter or None})
_Conv = Callable[[Any], Any] | None
_TIDB_TYPES: dict[str, tuple[TypeCode, ColumnFlag, dict[str, _Conv]]] = {
    "INT": (TypeCode.INT, ColumnFlag.NONE, {"int": None, "long": None}),
    "INT UNSIGNED": (TypeCode.INT, ColumnFlag.UNSIGNED, {"int": None, "long": None}),
    "BIGINT": (TypeCode.BIGINT, ColumnFlag.NONE, {"long": None}),
    "BIGINT UNSIGNED": (TypeCode.BIGINT, ColumnFlag.UNSIGNED, {"long": _wrap_u64, "string": _parse_u64}),
    # tiflow writes FLOAT as Avro "float", the seed's table says "double": read both
    "FLOAT": (TypeCode.FLOAT, ColumnFlag.NONE, {"float": None, "double": None}),
    "DOUBLE": (TypeCode.DOUBLE, ColumnFlag.NONE, {"double": None, "float": None}),
    "DECIMAL": (TypeCode.DECIMAL, ColumnFlag.NONE, {"string": _decimal_text}),  # bytes: per scale
    "BIT": (TypeCode.BIT, ColumnFlag.NONE, {"bytes": _bit_value}),
    "TEXT": (TypeCode.VARCHAR, ColumnFlag.NONE, {"string": None}),
    "BLOB": (TypeCode.BLOB, ColumnFlag.BINARY, {"bytes": None}),
    "ENUM": (TypeCode.ENUM, ColumnFlag.NONE, {"string": None}),
    "SET": (TypeCode.SET, ColumnFlag.NONE, {"string": None}),
    "JSON": (TypeCode.JSON, ColumnFlag.NONE, {"string": None}),
    "DATE": (TypeCode.DATE, ColumnFlag.NONE, {"string": None}),
    "DATETIME": (TypeCode.DATETIME, ColumnFlag.NONE, {"string": None}),
    "TIMESTAMP": (TypeCode.TIMESTAMP, ColumnFlag.NONE, {"string": None}),
    "TIME": (TypeCode.TIME, ColumnFlag.NONE, {"string": None}),
    "YEAR": (TypeCode.YEAR, ColumnFlag.NONE, {"int": None, "long": None}),
    # TiDB 8.4+ VECTOR: tiflow's type2TiDBType names it so; the value is its text form "[1,2,3]"
    "TiDBVECTORFloat32": (TypeCode.VECTOR_FLOAT32, ColumnFlag.NONE, {"string": None}),
}


class _FieldSpec(NamedTuple):
    field: str  # the Avro field name
    column: str  # the TiDB column name
    type: int
    flags: ColumnFlag
    conv: _Conv


class _Layout(NamedTuple):
    """The columns of a record, laid out for building :class:`Column` tuples in C (``map``)."""

    names: tuple[str, ...]
    types: tuple[int, ...]
    flags: tuple[ColumnFlag, ...]
    getter: Callable[[dict[str, Any]], Any]  # record -> the field values, in order
    convs: tuple[tuple[int, str, Callable[[Any], Any]], ...]  # (position, field, converter)
    image: ImageLayout  # names, types and flags, shared by every Image of this layout


def _layout(specs: Sequence[_FieldSpec], key_columns: frozenset[str] | None) -> _Layout:
    """``specs`` laid out; columns in ``key_columns`` (all of them when ``None``) get the key flags."""
    flags = tuple(
        column_flag(int(s.flags | _KEY_FLAGS)) if key_columns is None or s.column in key_columns else s.flags
        for s in specs
    )
    fields = [s.field for s in specs]
    # itemgetter of one field returns the bare value, of none a constant: normalise to a tuple
    getter: Callable[[dict[str, Any]], Any]
    if len(fields) == 1:
        only = fields[0]
        getter = lambda record: (record[only],)  # noqa: E731
    elif not fields:
        getter = lambda record: ()  # noqa: E731
    else:
        getter = itemgetter(*fields)
    convs = tuple((i, s.field, s.conv) for i, s in enumerate(specs) if s.conv is not None)
    names, types = tuple(s.column for s in specs), tuple(s.type for s in specs)
    return _Layout(names, types, flags, getter, convs, ImageLayout(names, types, flags))


class _Plan:
    """Everything the decoder needs for one schema id, computed once."""

    __slots__ = (
        "schema_id", "parsed", "schema", "table", "specs", "layout", "key_layout", "names", "extension", "wire"
    )

    def __init__(
        self,
        schema_id: int,
        parsed: Any,
        schema: str,
        table: str,
        specs: tuple[_FieldSpec, ...],
        extension: bool,
        wire: tuple[tuple[str, str, int | None], ...] | None = None,
    ) -> None:
        self.schema_id = schema_id
        self.parsed = parsed  # fastavro's parsed schema, logical types and defaults stripped (_plain_schema)
        self.schema = schema
        self.table = table
        self.specs = specs
        self.layout = _layout(specs, frozenset())  # flags as the schema alone says
        self.key_layout = _layout(specs, None)  # read as a key schema: every column is a key column
        self.names = frozenset(s.column for s in specs)
        self.extension = extension
        self.wire = wire  # (field, Avro primitive, null branch or None) per field, for the fast reader


def _param_str(params: Mapping[str, Any], key: str, default: str, where: str) -> str:
    value = params.get(key, default)
    if not isinstance(value, str) or not value:
        raise _Bad(f"{where}: connect.parameters {key} must be a non-empty string, got {preview(value)}")
    return value


def _field_spec(field: Any) -> _FieldSpec | None:
    """The column behind one Avro field, or ``None`` for a TiDB extension field."""
    if not isinstance(field, dict) or not isinstance(field.get("name"), str):
        raise _Bad(f"a field must be an object with a name, got {str(field)[:80]}")
    name = field["name"]
    ftype = field.get("type")
    nullable = False
    if isinstance(ftype, list):
        branches = [b for b in ftype if b != "null"]
        if len(ftype) != 2 or len(branches) != 1:
            raise _Bad(f"field {name}: expected a union of null and one type, got {str(ftype)[:80]}")
        nullable, ftype = True, branches[0]
    if not isinstance(ftype, dict) or not isinstance(ftype.get(_PARAMS), dict):
        if name in _EXTENSION_FIELDS:
            return None
        raise _Bad(f"field {name}: no connect.parameters.tidb_type (not a TiCDC schema?)")
    params = ftype[_PARAMS]
    tidb_type = params.get("tidb_type")
    entry = _TIDB_TYPES.get(tidb_type) if isinstance(tidb_type, str) else None
    if entry is None:
        raise _Bad(f"field {name}: unknown tidb_type {preview(tidb_type)}")
    code, flags, accepted = entry
    avro_type = ftype.get("type")
    if not isinstance(avro_type, str):
        raise _Bad(f"field {name}: expected a primitive Avro type, got {str(avro_type)[:80]}")
    conv: _Conv
    if tidb_type == "DECIMAL" and avro_type == "bytes":
        scale = ftype.get("scale", 0)
        scale_ok = isinstance(scale, int) and 0 <= scale <= _MAX_DECIMAL_SCALE
        if ftype.get("logicalType") != "decimal" or not scale_ok:
            raise _Bad(f"field {name}: a bytes DECIMAL needs logicalType decimal and a scale 0..30")
        conv = _DecimalReader(scale)
    elif avro_type in accepted:
        conv = accepted[avro_type]
    else:
        raise _Bad(f"field {name}: tidb_type {tidb_type} cannot be Avro {preview(avro_type)}")
    column = _param_str(params, _COLUMN_NAME, name, f"field {name}")
    if nullable:
        flags |= ColumnFlag.NULLABLE
    return _FieldSpec(name, column, int(code), column_flag(int(flags)), conv)


def _load_record(text: str) -> dict[str, Any]:
    """The parsed record schema.

    Raises:
        _Bad: not JSON, or not an Avro record schema.
    """
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise _Bad(f"not JSON ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("type") != "record" or not isinstance(doc.get("fields"), list):
        raise _Bad("expected an Avro record schema")
    return doc


def _table_names(doc: dict[str, Any]) -> tuple[str, str]:
    """The (schema, table) of a record: the original names where the encoder kept them.

    Raises:
        _Bad: names that are not strings.
    """
    name, namespace = doc.get("name"), doc.get("namespace", "")
    if not isinstance(name, str) or not isinstance(namespace, str):
        raise _Bad("the record's name and namespace must be strings")
    # namespace "<changefeed namespace>.<schema>" (tiflow getAvroNamespace); a full name
    # "ns.schema.table" in "name" is legal Avro too
    full = name if "." in name or not namespace else f"{namespace}.{name}"
    namespace, _, table = full.rpartition(".")
    record_params = doc.get(_PARAMS)
    if not isinstance(record_params, dict):
        record_params = {}
    schema = record_params.get(_SCHEMA_NAME, namespace.rpartition(".")[2])
    table = _param_str(record_params, _TABLE_NAME, table, "record")
    if not isinstance(schema, str):
        raise _Bad(f"record: connect.parameters {_SCHEMA_NAME} must be a string, got {preview(schema)}")
    return schema, table


def _compile(schema_id: int, text: str) -> _Plan:
    """The decoding plan of one TiCDC key or value schema.

    Raises:
        _Bad: not a TiCDC record schema.
    """
    doc = _load_record(text)
    schema, table = _table_names(doc)
    specs = [s for s in map(_field_spec, doc["fields"]) if s is not None]
    field_names = {f.get("name") for f in doc["fields"]}
    extension = _OP in field_names or _COMMIT_TS in field_names
    if extension:
        types = {f["name"]: f.get("type") for f in doc["fields"]}
        if types.get(_OP) != "string" or types.get(_COMMIT_TS) != "long":
            raise _Bad(f"expected {_OP} (string) and {_COMMIT_TS} (long) together")
    try:
        parsed = parse_schema(_plain_schema(doc))
    except Exception as exc:  # noqa: BLE001 - fastavro's SchemaParseException and friends
        raise _Bad(f"fastavro cannot parse it ({_bad_exc(exc)})") from exc
    return _Plan(schema_id, parsed, schema, table, tuple(specs), extension, _wire_fields(doc["fields"]))


# --------------------------------------------------------------------------------------------------
# The fast reader: Avro binary read by code generated per schema pair
#
# fastavro builds a dict per record that the decoder then takes apart; for the usual TiCDC record (flat
# primitives and unions with null) a function written for the schemas reads the values straight into the
# Image's tuple. It is only ever a shortcut: it accepts the plainest encodings (canonical union branch
# bytes, varints of at most 10 bytes, lengths that fit) and raises on anything else, and then the message
# is read again by fastavro (``AvroDecoder._decode_general``), which raises the typed error or reads what
# the shortcut declined. So both paths give the same events and the same errors, which a test checks.

_PRIMITIVES = frozenset({"int", "long", "float", "double", "string", "bytes", "boolean"})
_MAX_GENERATED_FIELDS = 512
_FAST_READERS_LIMIT = 4096  # (value, key) schema pairs with a reader; a full cache is cleared


class _Decline(Exception):
    """Internal: the fast reader does not read this message; fastavro does."""


def _primitive(ftype: Any) -> str | None:
    if isinstance(ftype, dict):
        ftype = ftype.get("type")
    return ftype if isinstance(ftype, str) and ftype in _PRIMITIVES else None


def _wire_fields(fields: list[Any]) -> tuple[tuple[str, str, int | None], ...] | None:
    """``(field, primitive, null branch)`` per field of a record, or ``None`` if one is not a primitive or
    a union of null and a primitive (the fast reader reads nothing else)."""
    out: list[tuple[str, str, int | None]] = []
    for field in fields:
        ftype = field.get("type")
        null_branch = None
        if isinstance(ftype, list):
            if len(ftype) != 2 or "null" not in ftype:
                return None
            null_branch = ftype.index("null")
            ftype = ftype[1 - null_branch]
        kind = _primitive(ftype)
        if kind is None or len(out) >= _MAX_GENERATED_FIELDS:
            return None
        out.append((field["name"], kind, null_branch))
    return tuple(out)


_M64 = (1 << 64) - 1


_UNPACK_U64 = struct.Struct("<Q").unpack_from
_HIGH_BITS = 0x8080808080808080
_LOW_BITS = 0x7F7F7F7F7F7F7F7F


def _read_varint(data: bytes, p: int) -> tuple[int, int]:
    """A zigzag varint at ``p`` (whose first two bytes have the continuation bit) and the position after it.

    Raises:
        _Decline: more than 10 bytes. IndexError: the data ends first.
    """
    b = data[p + 2]  # IndexError: the data ends first
    if b < 0x80:  # three bytes (the generated code reads one and two itself)
        n = (data[p] - 0x80) | (data[p + 1] - 0x80) << 7 | b << 14
        return (n >> 1) ^ -(n & 1), p + 3
    # up to 9 bytes at once: the 7-bit groups of 8 little-endian bytes packed together in three steps
    try:
        (x,) = _UNPACK_U64(data, p)
    except struct.error:
        return _read_varint_bytewise(data, p)
    stop = ~x & _HIGH_BITS  # the high bit of each byte that ends a varint
    if stop:
        low = stop & -stop
        x &= (low - 1) & _LOW_BITS
        end = p + (low.bit_length() >> 3)
        top = 0
    else:
        top = data[p + 8]
        if top >= 0x80:
            return _read_varint_bytewise(data, p)
        x &= _LOW_BITS
        end = p + 9
    x = (x & 0x007F007F007F007F) | ((x >> 1) & 0x3F803F803F803F80)
    x = (x & 0x00003FFF00003FFF) | ((x >> 2) & 0x0FFFC0000FFFC000)
    n = (x & 0x0FFFFFFF) | ((x >> 4) & 0x00FFFFFFF0000000) | top << 56
    return (n >> 1) ^ -(n & 1), end


def _read_varint_bytewise(data: bytes, p: int) -> tuple[int, int]:
    """:func:`_read_varint` a byte at a time (near the end of the data, or 10 bytes).

    fastavro reads a long into 64 unsigned bits: a 10th byte's high bits are dropped, as here.

    Raises:
        _Decline: more than 10 bytes. IndexError: the data ends first.
    """
    n = data[p] & 0x7F
    shift = 7
    while True:
        p += 1
        b = data[p]
        n |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift > 63:
            raise _Decline
    n &= _M64
    return (n >> 1) ^ -(n & 1), p + 1


def _read_length(data: bytes, p: int) -> tuple[int, int]:
    """A bytes/string length at ``p`` that is not a one-byte varint of a length, and the position after.

    Raises:
        _Decline: a negative length, or a varint :func:`_read_varint` declines. IndexError: the data
            ends first.
    """
    b = data[p]
    if b < 0x80:  # a negative one-byte length
        raise _Decline
    c = data[p + 1]
    if c < 0x80:
        n = b - 0x80 | c << 7
        n, p = (n >> 1) ^ -(n & 1), p + 2
    else:
        n, p = _read_varint(data, p)
    if n < 0:
        raise _Decline
    return n, p


# zigzag value of a one-byte varint (None: the continuation bit is set); bytes/string length of a one-byte
# varint (-1: negative or more bytes)
_SKIP_VARINT = re.compile(rb"[\x80-\xff]{1,9}[\x00-\x7f]").match
_ZIGZAG = tuple((b >> 1) ^ -(b & 1) if b < 0x80 else None for b in range(256))
_LENGTH = tuple(b >> 1 if b < 0x80 and not b & 1 else -1 for b in range(256))


_MEMO_CONV = "MEMO"  # a converter "name" that asks for a long read with its high bytes memoised (commit ts)
_MEMO_LIMIT = 1024  # high parts remembered per reader; a full memo is cleared


def _varint_high(memo: dict[bytes, tuple[int, int]], high: bytes, tail: int) -> tuple[int, int]:
    """The bits of bytes 2..8 of a varint whose first two bytes continue (``high``: the bytes from its
    third on), shifted into place, and the varint's length; remembered in ``memo``. TiCDC commit ts are
    9-byte varints whose high bytes repeat from one event to the next (the rows of a transaction share
    one), so the generated reader looks them up there. With ``tail``, ``high`` runs to the end of the data
    and must hold exactly that many more varints (1..10 bytes each, as :data:`_SKIP_VARINT` reads) after
    this one; the length returned then reaches the end of the data.

    Raises:
        _Decline: no last byte in ``high``'s first 7 (the data ends first, or a 10-byte varint: fastavro
            reads it), or not ``tail`` varints after it.
    """
    n, shift = 0, 14
    for i, b in enumerate(high[:7]):
        n |= (b & 0x7F) << shift
        if b < 0x80:
            end = i + 1
            if tail:
                for _ in range(tail):
                    match = _SKIP_VARINT(high, end) if high[end:end + 1] >= b"\x80" else None
                    end = match.end() if match is not None else end + 1
                if end != len(high) or high[-1] >= 0x80:
                    raise _Decline
            if len(memo) >= _MEMO_LIMIT:
                memo.clear()
            memo[high] = entry = (n, end + 2)
            return entry
        shift += 7
    raise _Decline


_DECIMAL_CONV = "DECIMAL "  # a converter "name" that asks for the decimal formatting inline, then the scale


def _decimal_source(t: str, scale: int) -> list[str]:
    """Lines turning the bytes DECIMAL in ``t`` into its text: :class:`_DecimalReader` inline, giving
    exactly :func:`_format_unscaled`'s text (a test compares them); a length it rejects is declined."""
    lines = [f"if not 0 < len({t}) <= {_MAX_DECIMAL_BYTES}:", "    raise DECLINE", f"x = FB({t}, 'big', signed=True)"]
    if scale == 0:
        return lines + [f"{t} = '%d' % x"]
    # divmod by 10**scale: the integer part, then the fraction zero-padded to scale digits
    form, unit = f"%d.%0{scale}d", 10**scale
    return lines + [
        "if x < 0:", f"    {t} = '-{form}' % divmod(-x, {unit})", "else:", f"    {t} = '{form}' % divmod(x, {unit})"
    ]


def _field_source(
    kind: str, null_branch: int | None, target: str | None, conv: str | None, tail: int = 0
) -> list[str]:
    """Lines (indented by 4) reading one field at ``data[p]`` into ``target`` (``None``: read and drop);
    with ``tail``, a memoised long followed by that many dropped longs that end the data."""
    t = target or "_"
    # the bodies read at p + o: o = 1 past a union's branch byte (saves a ``p += 1``), except the memo's
    o = 1 if null_branch is not None and conv != _MEMO_CONV else 0

    def at(k: int) -> str:
        return f"p + {k + o}" if k + o else "p"

    if kind == "long" and conv == _MEMO_CONV:
        # a one- or two-byte value: the dropped longs after it are read here (the memo has them otherwise)
        skip = [line for _ in range(tail) for line in _field_source("long", None, None, None)]
        body = [
            "b = data[p]",
            "if b < 128:",
            f"    {t} = Z[b]",
            "    p += 1",
            *("    " + line for line in skip),
            "else:",
            "    c = data[p + 1]",
            "    if c < 128:",
            "        n = b - 128 | c << 7",
            f"        {t} = n >> 1 ^ -(n & 1)",
            "        p += 2",
            *("        " + line for line in skip),
            "    else:",  # bytes 2.. from the memo (the low 14 bits change from one event to the next)
            f"        h = MEMO.get(data[p + 2:{'' if tail else 'p + 9'}])",
            "        if h is None:",
            f"            h = HIGH(MEMO, data[p + 2:{'' if tail else 'p + 9'}], {tail})",
            "        n = b - 128 | (c - 128) << 7 | h[0]",
            f"        {t} = n >> 1 ^ -(n & 1)",
            "        p += h[1]",
        ]
        conv = None
    elif kind in ("int", "long"):
        if target is None and conv is None:
            # a varint of 1..10 bytes, value dropped (fastavro reads one of more bytes too: declined)
            body = [f"if data[{at(0)}] < 128:", f"    p += {o + 1}", "else:", f"    p = SKIP(data, {at(0)}).end()"]
        else:
            body = [
                f"b = data[{at(0)}]",
                "if b < 128:",
                f"    {t} = Z[b]",
                f"    p += {o + 1}",
                "else:",
                f"    c = data[{at(1)}]",
                "    if c < 128:",  # two bytes
                "        n = b - 128 | c << 7",
                f"        {t} = n >> 1 ^ -(n & 1)",
                f"        p += {o + 2}",
                "    else:",
                f"        {t}, p = RV(data, {at(0)})",
            ]
    elif kind in ("float", "double"):
        size, unpack = (4, "UF") if kind == "float" else (8, "UD")
        body = [f"{t}, = {unpack}(data, {at(0)})", f"p += {size + o}"]
    elif kind in ("string", "bytes"):
        decode = ".decode()" if kind == "string" and conv != "RAW" else ""
        body = [
            f"n = L[data[{at(0)}]]",
            "if n < 0:",
            f"    n, p = RN(data, {at(0)})",
            "else:",
            f"    p += {o + 1}",
            # a length beyond the end leaves p past it: the record's end check declines
            f"{t} = data[p:(p := p + n)]{decode}",
        ]
        if conv == "RAW":
            conv = None
    else:  # boolean: fastavro reads any nonzero byte as True; only 0 and 1 are taken here
        body = [f"{t} = data[{at(0)}]", f"if {t} > 1:", "    raise DECLINE", f"{t} = {t} == 1", f"p += {o + 1}"]
    if conv is not None and conv.startswith(_DECIMAL_CONV):
        body += _decimal_source(t, int(conv[len(_DECIMAL_CONV):]))
    elif conv is not None:
        body.append(f"{t} = {conv}({t})")
    if null_branch is None:
        return body
    value_byte, null_byte = (2, 0) if null_branch == 0 else (0, 2)  # branch index as a zigzag varint
    lines = ["u = data[p]", f"if u == {value_byte}:"] + (["    p += 1"] if o == 0 else [])
    lines += ["    " + line for line in body]
    lines += [f"elif u == {null_byte}:", "    p += 1"]
    if target is not None:
        lines.append(f"    {target} = None")
    lines += ["else:", "    raise DECLINE"]
    return lines


def _record_source(plan: _Plan, data: str, targets: Mapping[str, tuple[str, str | None]]) -> list[str] | None:
    """Lines reading one whole record of ``plan`` from the bytes ``data``; ``targets`` maps a field to its
    variable and converter (fields not in it are read and dropped). ``None``: not readable this way."""
    if plan.wire is None:
        return None
    lines = [f"data = {data}", f"p = {_HEADER}"]
    for i, (field, kind, null_branch) in enumerate(plan.wire):
        target, conv = targets.get(field, (None, None))
        rest = plan.wire[i + 1:]
        if conv == _MEMO_CONV and null_branch is None and all(
            k in ("int", "long") and nb is None and f not in targets for f, k, nb in rest
        ):
            # the memo's key takes the dropped longs after it too (TiCDC: _tidb_commit_physical_time)
            lines += _field_source(kind, null_branch, target, conv, tail=len(rest))
            break
        lines += _field_source(kind, null_branch, target, conv)
    lines += ["if p != len(data):", "    raise DECLINE"]
    return lines


def _column_targets(plan: _Plan, env: dict[str, Any]) -> tuple[dict[str, tuple[str, str | None]], str]:
    """Variables (and converters, bound in ``env``) for the columns of ``plan``; the values tuple source."""
    targets: dict[str, tuple[str, str | None]] = {}
    for i, spec in enumerate(plan.specs):
        conv = None
        if isinstance(spec.conv, _DecimalReader):
            conv = f"{_DECIMAL_CONV}{spec.conv.scale}"
        elif spec.conv is not None:
            conv = f"C{i}"
            env[conv] = spec.conv
        targets[spec.field] = (f"v{i}", conv)
    return targets, "(" + "".join(f"v{i}, " for i in range(len(plan.specs))) + ")"


_new_object = object.__new__
_set_layout = Image._layout.__set__  # type: ignore[attr-defined,misc]  # (a slot's descriptor)
_set_values = Image._values.__set__  # type: ignore[attr-defined,misc]
# ``Image(layout, values)`` without its length check and Python-level ``__init__`` (about 40 % of an
# Image's cost), for values the generated readers build from that very layout
_IMAGE_SOURCE = ["image = ONEW(Image)", "SETL(image, LAYOUT)", "SETV(image, {values})"]


def _generated(name: str, params: str, lines: list[str], env: dict[str, Any]) -> Callable[..., list[Event]]:
    env.update(
        DECLINE=_Decline, FB=int.from_bytes, Z=_ZIGZAG, SKIP=_SKIP_VARINT, L=_LENGTH, RV=_read_varint, RN=_read_length,
        UF=struct.Struct("<f").unpack_from, UD=struct.Struct("<d").unpack_from,
        NEW=tuple.__new__, RowChange=RowChange, Image=Image, ONEW=_new_object, SETL=_set_layout, SETV=_set_values,
    )
    source = "\n".join([f"def {name}({params}):", *("    " + line for line in lines)])
    # the source holds only field positions and byte constants; names and converters are in ``env``
    exec(compile(source, f"<avro {name}>", "exec"), env)  # noqa: S102
    return env[name]  # type: ignore[no-any-return]


def _row_reader(vplan: _Plan, kplan: _Plan | None, layout: _Layout) -> Callable[..., list[Event]] | None:
    """``read(key, value, ctx) -> [RowChange]`` for an insert/update of these schemas, or ``None``.

    ``layout`` is the value's layout with the key columns flagged. It raises :class:`_Decline` (or
    whatever reading garbage trips) where the message needs fastavro's reading.
    """
    env: dict[str, Any] = {"LAYOUT": layout.image, "SCHEMA": vplan.schema, "TABLE": vplan.table}
    targets, values = _column_targets(vplan, env)
    if vplan.extension:
        targets[_OP] = ("op", "RAW")  # compared as bytes: b"c" and b"u" are valid UTF-8 either way
        targets[_COMMIT_TS] = ("ts", _MEMO_CONV)
        env.update(MEMO={}, HIGH=_varint_high)
    lines = _record_source(vplan, "value", targets)
    if lines is None:
        return None
    if kplan is not None:
        key_lines = _record_source(kplan, "key", {})
        if key_lines is None:
            return None
        lines += key_lines
    if vplan.extension:
        env.update(INSERT=Op.INSERT, UPDATE=Op.UPDATE, U64=_U64_RANGE)
        lines += [
            'if op == b"c":',
            "    op = INSERT",
            'elif op == b"u":',
            "    op = UPDATE",
            "else:",
            "    raise DECLINE",
            "if ts < 0:",
            "    ts += U64",  # int64(commitTs): see _wrap_u64
        ]
    else:
        env.update(op=Op.INSERT)
        lines += ["ts = None"]
    lines += [line.format(values=values) for line in _IMAGE_SOURCE]
    lines.append("return [NEW(RowChange, (ts, SCHEMA, TABLE, op, image, None, ctx))]")
    return _generated("read_row", "key, value, ctx", lines, env)


def _delete_reader(kplan: _Plan) -> Callable[..., list[Event]] | None:
    """``read(key, value, ctx) -> [RowChange]`` for a delete (key, tombstone) of this key schema, or
    ``None``."""
    env: dict[str, Any] = {
        "LAYOUT": kplan.key_layout.image, "SCHEMA": kplan.schema, "TABLE": kplan.table, "DELETE": Op.DELETE,
    }
    targets, values = _column_targets(kplan, env)
    lines = _record_source(kplan, "key", targets)
    if lines is None:
        return None
    lines += [line.format(values=values) for line in _IMAGE_SOURCE]
    lines.append("return [NEW(RowChange, (None, SCHEMA, TABLE, DELETE, None, image, ctx))]")
    return _generated("read_delete", "key, value, ctx", lines, env)


# --------------------------------------------------------------------------------------------------
# Column parameters: what a Delta column type needs beyond the tidb_type (Avro carries no DDL)

_MAX_DECIMAL_PRECISION = 65  # MySQL's DECIMAL precision limit
_PRECISION, _SCALE, _MEMBERS = "precision", "scale", "members"
_ALLOWED = "allowed"
_ALLOWED_SEPARATOR = re.compile(r"(?<!\\),")  # a "," that tiflow's escapeEnumAndSetOptions left bare


def _decimal_params(where: str, ftype: dict[str, Any]) -> dict[str, Any]:
    """Precision and scale of a ``logicalType`` decimal (the Avro spec's attributes).

    Raises:
        _Bad: a precision outside 1..65, a scale outside 0..30 or above the precision.
    """
    precision, scale = ftype.get(_PRECISION), ftype.get(_SCALE, 0)
    if precision is not None and (
        type(precision) is not int or not 1 <= precision <= _MAX_DECIMAL_PRECISION
    ):
        raise _Bad(f"{where}: a DECIMAL precision must be an int in 1..65, got {preview(precision)}")
    if type(scale) is not int or not 0 <= scale <= min(_MAX_DECIMAL_SCALE, precision or _MAX_DECIMAL_SCALE):
        raise _Bad(f"{where}: a DECIMAL scale must be an int in 0..30 and at most the precision, got {preview(scale)}")
    return {_PRECISION: precision, _SCALE: scale, _MEMBERS: None}


def _split_allowed(allowed: str) -> list[str]:
    """The ENUM/SET members of a ``connect.parameters.allowed`` list: ``,``-separated, a ``,`` inside a
    member escaped as ``\\,`` (tiflow ``escapeEnumAndSetOptions``, after Debezium)."""
    return [m.replace("\\,", ",") for m in _ALLOWED_SEPARATOR.split(allowed)]


def _field_params(field: dict[str, Any]) -> dict[str, Any] | None:
    """What the schema declares about a (validated) column field beyond its tidb_type, or ``None``.

    Raises:
        _Bad: a malformed precision, scale or ``allowed``.
    """
    ftype = field["type"]
    if isinstance(ftype, list):
        ftype = next(b for b in ftype if b != "null")
    params = ftype[_PARAMS]
    tidb_type = params["tidb_type"]
    where = f"field {field['name']}"
    if tidb_type == "DECIMAL":
        # precise mode: the logicalType's precision/scale (tiflow: the column's declared flen/decimal);
        # string mode: tiflow writes only the tidb_type, so nothing is known
        return _decimal_params(where, ftype) if ftype.get("type") == "bytes" else None
    if tidb_type in ("ENUM", "SET") and _ALLOWED in params:
        allowed = params[_ALLOWED]
        if not isinstance(allowed, str):
            raise _Bad(f"{where}: connect.parameters allowed must be a string, got {preview(allowed)}")
        return {_PRECISION: None, _SCALE: None, _MEMBERS: _split_allowed(allowed)}
    return None


def _schema_columns(text: str) -> tuple[str, str, dict[str, dict[str, Any] | None]]:
    """(schema, table, {column: params or None}) for every column of a TiCDC key or value schema.

    Raises:
        _Bad: not a TiCDC record schema, or malformed parameters.
    """
    doc = _load_record(text)
    schema, table = _table_names(doc)
    columns: dict[str, dict[str, Any] | None] = {}
    for field in doc["fields"]:
        spec = _field_spec(field)  # validates the field; None for the TiDB extension fields
        if spec is not None:
            columns[spec.column] = _field_params(field)
    return schema, table, columns


def table_params(schema_json: str) -> tuple[str, str, dict[str, dict[str, Any]]]:
    """What a TiCDC Avro schema says about its table's column types beyond each ``tidb_type``.

    Avro carries no DDL, so a sink learns DECIMAL(p, s) and ENUM/SET members from the schemas:
    returns ``(schema, table, {column: {"precision": p, "scale": s, "members": [...]}})`` with the
    original names (as the decoder restores them) and only the columns where something is known:

    - DECIMAL in precise mode: the ``logicalType`` decimal's ``precision`` and ``scale`` (TiCDC writes
      the declared ones; ``precision`` is ``None`` if a hand-written schema leaves it out);
      ``members`` is ``None``.
    - DECIMAL in string mode: nothing (TiCDC writes only ``tidb_type``), so the column is left out.
    - ENUM/SET: ``members`` from ``connect.parameters.allowed``; ``precision``/``scale`` ``None``.

    Works for key and value schemas (the TiDB extension fields are skipped).

    Raises:
        DecodeError: not a TiCDC Avro record schema, or a malformed precision, scale or ``allowed``.
    """
    try:
        schema, table, columns = _schema_columns(schema_json)
    except _Bad as exc:
        raise DecodeError(PROTOCOL, f"not a TiCDC Avro schema: {exc}") from exc
    return schema, table, {name: params for name, params in columns.items() if params is not None}


class AvroDecoder:
    """Decodes TiCDC Avro messages (Confluent framing on key and value) into row changes.

    One message is one row change: key + value is an insert or an update (``_tidb_op``; an insert
    without the TiDB extension, since Avro does not tell an upsert from an insert), key + empty value a
    delete whose old image is the key columns. Commit ts comes from ``_tidb_commit_ts`` or is ``None``.
    """

    protocol = PROTOCOL

    def __init__(self, options: Mapping[str, str] | None = None, *, schemas: AvroSchemas | None = None) -> None:
        """
        Args:
            options: sink-uri options. ``enable-tidb-extension=true`` makes the extension fields
                mandatory (a value schema without them is an error); when false they are still read if
                present. The two handling modes are accepted and checked but not needed: the writer
                schema says which form each column has.
            schemas: where schema ids resolve (required).

        Raises:
            ValueError: a bad option value, or no ``schemas``.
            TypeError: ``schemas`` is not an :class:`AvroSchemas`.
        """
        opts = dict(options or {})
        self._options = opts
        self._require_extension = parse_bool_option(opts, "enable-tidb-extension", False)
        _choice(opts, "avro-decimal-handling-mode", (_DECIMAL_PRECISE, _DECIMAL_STRING))
        _choice(opts, "avro-bigint-unsigned-handling-mode", (_BIGINT_LONG, _BIGINT_STRING))
        self._schemas = _coerce_schemas(schemas, required=True)
        self._plans: dict[int, _Plan] = {}
        self._broken: dict[int, str] = {}
        self._joined: dict[tuple[int, int], _Layout] = {}
        # generated readers by the messages' headers (value header + key header, or key header alone for
        # a delete); a header met for the first time is read by fastavro, then gets a reader
        self._fast: dict[bytes, Callable[..., list[Event]]] = {}
        self._fast_deletes: dict[bytes, Callable[..., list[Event]]] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        # ships to Spark executors as options + schemas; the per-schema caches are rebuilt there
        return (_new_decoder, (self._options, self._schemas))

    # -- framing and schema resolution

    def _plan(self, data: bytes, ctx: DecodeContext, part: str) -> _Plan:
        """The plan for a framed key or value, after checking the framing.

        Raises:
            FramingError, TruncatedMessageError, SchemaNotFoundError, DecodeError.
        """
        if data[0] != MAGIC_BYTE:
            raise FramingError(PROTOCOL, f"{part}: expected magic byte 0, got 0x{data[0]:02x}", *ctx)
        if len(data) < _HEADER:
            raise TruncatedMessageError(
                PROTOCOL, f"{part}: expected at least {_HEADER} bytes (magic byte, 4-byte schema id), "
                f"found {len(data)}", *ctx,
            )
        sid = int.from_bytes(data[1:_HEADER], "big")
        plan = self._plans.get(sid)
        if plan is not None:
            return plan
        return self._resolve(sid, ctx, part)

    def _resolve(self, sid: int, ctx: DecodeContext, part: str) -> _Plan:
        if sid in self._broken:
            raise DecodeError(PROTOCOL, f"{part}: schema id {sid} {self._broken[sid]}", *ctx)
        try:
            text = self._schemas.get(sid)
        except SchemaNotFoundError as exc:
            # a well-framed message of a schema the job's driver did not ship: its schema is missing, not
            # the message broken; stop (or retry) rather than dead-letter every message of that schema
            unknown = self._schemas.unknown_id_error(sid, ctx, part)
            if unknown is not None:
                raise unknown from exc
            raise exc.with_context(*ctx) from exc
        except DecodeError as exc:
            raise exc.with_context(*ctx) from exc
        try:
            plan = _compile(sid, text)
        except Exception as exc:  # noqa: BLE001 - _Bad, or whatever an odd registry schema trips
            self._broken[sid] = f"is not a TiCDC Avro schema: {exc if isinstance(exc, _Bad) else _bad_exc(exc)}"
            raise DecodeError(PROTOCOL, f"{part}: schema id {sid} {self._broken[sid]}", *ctx) from exc
        self._plans[sid] = plan
        return plan

    def _read(self, plan: _Plan, data: bytes, ctx: DecodeContext, part: str) -> dict[str, Any]:
        """The record after the header, which must end exactly at the end of ``data``.

        Raises:
            TruncatedMessageError, DecodeError.
        """
        fo = io.BytesIO(data)
        fo.seek(_HEADER)
        try:
            record = schemaless_reader(fo, plan.parsed, None)
        # fastavro raises whatever its readers hit on garbage: EOFError (a length beyond the end),
        # IndexError (a varint cut at the end: "string index ...", a union branch: "list index ..."),
        # ValueError, UnicodeDecodeError, OverflowError, KeyError, StopIteration: all terminal here
        except Exception as exc:  # noqa: BLE001
            if isinstance(exc, EOFError) or (isinstance(exc, IndexError) and "string index" in str(exc)):
                raise TruncatedMessageError(
                    PROTOCOL, f"{part}: the record of schema id {plan.schema_id} ends early "
                    f"({len(data) - _HEADER} bytes after the header; {_bad_exc(exc)})", *ctx,
                ) from exc
            raise DecodeError(
                PROTOCOL, f"{part}: invalid Avro for schema id {plan.schema_id}: {_bad_exc(exc)}", *ctx
            ) from exc
        end = fo.tell()
        if end != len(data):
            raise DecodeError(
                PROTOCOL, f"{part}: {len(data) - end} trailing bytes after the record of schema id "
                f"{plan.schema_id} (record ends at byte {end} of {len(data)})", *ctx,
            )
        if not isinstance(record, dict):
            raise DecodeError(PROTOCOL, f"{part}: schema id {plan.schema_id} did not give a record", *ctx)
        return record

    def _key_layout(self, vplan: _Plan, kplan: _Plan, ctx: DecodeContext) -> _Layout:
        """The value's layout with the key columns flagged, checked against the key schema."""
        joined = self._joined.get((vplan.schema_id, kplan.schema_id))
        if joined is not None:
            return joined
        if (vplan.schema, vplan.table) != (kplan.schema, kplan.table):
            raise DecodeError(
                PROTOCOL, f"key schema {kplan.schema_id} is for {kplan.schema}.{kplan.table}, value schema "
                f"{vplan.schema_id} for {vplan.schema}.{vplan.table}", *ctx,
            )
        missing = kplan.names - vplan.names
        if missing:
            raise DecodeError(
                PROTOCOL, f"key columns {sorted(missing)} of schema {kplan.schema_id} are not in value schema "
                f"{vplan.schema_id}", *ctx,
            )
        joined = _layout(vplan.specs, kplan.names)
        self._joined[(vplan.schema_id, kplan.schema_id)] = joined
        return joined

    # -- decoding

    def decode(self, key: bytes | None, value: bytes | None, ctx: DecodeContext) -> list[Event]:
        """The one row change of a message (a list, per the decoder contract).

        Messages of schemas seen before are read by code generated for them (see :func:`_row_reader`);
        whatever that code declines, and every error, comes from reading with fastavro.

        Raises:
            FramingError: a key or value without the magic byte.
            TruncatedMessageError: shorter than the header, or a record that ends early.
            SchemaNotFoundError: an unknown schema id.
            UnknownSchemaIdError: an unknown schema id, with a job's shipped schemas
                (:meth:`AvroSchemas.unknown_id_error`).
            DecodeError: invalid Avro, trailing bytes, a key/value mismatch, a bad extension field.
            ConfigError: ``enable-tidb-extension=true`` and a value schema without the extension fields.
            SchemaRegistryUnavailableError: the schema registry failed (registry-backed schemas only), or
                an unknown schema id while a job's registry could not be listed.
        """
        if value:
            reader = self._fast.get(value[:_HEADER] + key[:_HEADER] if key else value[:_HEADER])
        else:
            reader = self._fast_deletes.get(key[:_HEADER]) if key else None
        if reader is not None:
            try:
                return reader(key, value, ctx)
            except Exception:  # noqa: BLE001, S110 - declined or invalid: fastavro reads it, raising the typed error
                pass
            return self._decode_general(key, value, ctx)
        events = self._decode_general(key, value, ctx)
        self._learn(key, value)
        return events

    def _learn(self, key: bytes | None, value: bytes | None) -> None:
        """Generate the reader for the schemas of a message that fastavro just read."""
        kplan = self._plans[int.from_bytes(key[1:_HEADER], "big")] if key else None
        if value:
            vplan = self._plans[int.from_bytes(value[1:_HEADER], "big")]
            layout = vplan.layout if kplan is None else self._joined[(vplan.schema_id, kplan.schema_id)]
            cache, header = self._fast, value[:_HEADER] + (key[:_HEADER] if key else b"")
            reader = _row_reader(vplan, kplan, layout)
        else:
            cache, header = self._fast_deletes, key[:_HEADER]  # type: ignore[index]
            reader = _delete_reader(kplan)  # type: ignore[arg-type]
        if reader is not None:
            if len(cache) >= _FAST_READERS_LIMIT:
                cache.clear()
            cache[header] = reader

    def _decode_general(self, key: bytes | None, value: bytes | None, ctx: DecodeContext) -> list[Event]:
        """:meth:`decode` by fastavro: the reference for the generated readers, and their errors."""
        if not value:  # None or b"": TiCDC writes a delete as the key and an empty value (tombstone)
            return [self._delete(key, ctx)]
        vplan = self._plan(value, ctx, "value")
        record = self._read(vplan, value, ctx, "value")
        layout = vplan.layout
        if key:
            kplan = self._plan(key, ctx, "key")
            self._read(kplan, key, ctx, "key")
            layout = self._key_layout(vplan, kplan, ctx)
        columns = self._columns(layout, record, ctx, "value")
        commit_ts = None
        op = Op.INSERT
        if vplan.extension:
            tidb_op = record[_OP]
            if tidb_op == _UPDATE_OP:
                op = Op.UPDATE
            elif tidb_op != _INSERT_OP:
                raise DecodeError(PROTOCOL, f"value: expected {_OP} \"c\" or \"u\", got {tidb_op[:20]!r}", *ctx)
            commit_ts = _wrap_u64(record[_COMMIT_TS])
        elif self._require_extension:
            # the changefeed sends no TiDB extension: a setting that does not match it, not a bad message
            # (each message would be dead-lettered and its row lost while the job goes on)
            topic, partition, offset = ctx
            raise ConfigError(
                f"source.options: enable-tidb-extension is {self._options['enable-tidb-extension']!r}, but the "
                f"value schema id {vplan.schema_id} ({vplan.schema}.{vplan.table}) of the message at "
                f"{topic}[{partition}]@{offset} has no {_OP}/{_COMMIT_TS} fields: the changefeed does not "
                "send the TiDB extension; set enable-tidb-extension to false (the fields are still read "
                "where a schema has them) or make it match the changefeed's sink URI"
            )
        event = _tuple_new(RowChange, (commit_ts, vplan.schema, vplan.table, op, columns, None, ctx))
        return [cast(RowChange, event)]

    def _delete(self, key: bytes | None, ctx: DecodeContext) -> RowChange:
        if not key:
            raise DecodeError(PROTOCOL, "neither key nor value: a delete needs the key columns", *ctx)
        kplan = self._plan(key, ctx, "key")
        record = self._read(kplan, key, ctx, "key")
        if kplan.extension:
            raise DecodeError(PROTOCOL, f"key: schema id {kplan.schema_id} is a value schema (has {_OP})", *ctx)
        if not kplan.specs:
            raise DecodeError(PROTOCOL, f"key: schema id {kplan.schema_id} has no key columns", *ctx)
        old = self._columns(kplan.key_layout, record, ctx, "key")
        return RowChange(None, kplan.schema, kplan.table, Op.DELETE, None, old, ctx)

    @staticmethod
    def _columns(layout: _Layout, record: dict[str, Any], ctx: DecodeContext, part: str) -> Image:
        values = layout.getter(record)
        if layout.convs:
            values = list(values)
            for i, field, conv in layout.convs:
                v = values[i]
                if v is not None:
                    try:
                        values[i] = conv(v)
                    except _Bad as exc:
                        raise DecodeError(PROTOCOL, f"{part}: field {field}: {exc}", *ctx) from exc
        return Image(layout.image, tuple(values))


_tuple_new = tuple.__new__


def _new_decoder(options: dict[str, str], schemas: AvroSchemas) -> AvroDecoder:
    return AvroDecoder(options, schemas=schemas)


# --------------------------------------------------------------------------------------------------
# Encoding

_TEXT_TYPES = frozenset(
    {TypeCode.VARCHAR, TypeCode.VAR_STRING, TypeCode.STRING, TypeCode.TINYBLOB, TypeCode.BLOB,
     TypeCode.MEDIUMBLOB, TypeCode.LONGBLOB}
)
_SMALL_INT_TYPES = frozenset({TypeCode.TINYINT, TypeCode.SMALLINT, TypeCode.MEDIUMINT})
# tiflow type2TiDBType for the types whose value is a string as TiDB prints it
_STRING_TIDB_TYPES = {
    TypeCode.DATE: "DATE",
    TypeCode.DATETIME: "DATETIME",
    TypeCode.TIMESTAMP: "TIMESTAMP",
    TypeCode.TIME: "TIME",
    TypeCode.JSON: "JSON",
    TypeCode.VECTOR_FLOAT32: "TiDBVECTORFloat32",
}


def _int_writer(lo: int, hi: int) -> Callable[[Any], int]:
    def write(value: Any) -> int:
        if not isinstance(value, int) or not lo <= value <= hi:
            raise _Bad(f"expected an integer in [{lo}, {hi}], got {str(value)[:40]!r}")
        return int(value)

    return write


def _u64_as_long(value: Any) -> int:
    # TiCDC writes int64(uint64): values above 2**63-1 wrap to negative longs
    if not isinstance(value, int) or not 0 <= value < _U64_RANGE:
        raise _Bad(f"expected a BIGINT UNSIGNED, got {str(value)[:40]!r}")
    return value - _U64_RANGE if value > _I64_MAX else int(value)


def _u64_as_string(value: Any) -> str:
    if not isinstance(value, int) or not 0 <= value < _U64_RANGE:
        raise _Bad(f"expected a BIGINT UNSIGNED, got {str(value)[:40]!r}")
    return str(int(value))


def _float_writer(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Bad(f"expected a float, got {type(value).__name__}")
    return float(value)


def _str_writer(value: Any) -> str:
    if not isinstance(value, str):
        raise _Bad(f"expected str, got {type(value).__name__}")
    return value


def _bytes_writer(value: Any) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise _Bad(f"expected bytes, got {type(value).__name__}")
    return bytes(value)


def _bit_writer(value: Any) -> bytes:
    # tiflow: types.NewBinaryLiteralFromUint(v, -1), big endian without leading zero bytes (at least 1)
    if not isinstance(value, int) or not 0 <= value < _U64_RANGE:
        raise _Bad(f"expected a BIT value in [0, 2**64), got {str(value)[:40]!r}")
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


def _decimal_scale(value: Any) -> int:
    """Fractional digits of a DECIMAL value (TiDB prints every value with the column's scale).

    Raises:
        _Bad: not a decimal number.
    """
    if not isinstance(value, str) or _DECIMAL_TEXT.fullmatch(value) is None:
        raise _Bad(f"expected a DECIMAL as a decimal number string, got {str(value)[:40]!r}")
    _, dot, frac = value.partition(".")
    return len(frac) if dot else 0


def _decimal_unscaled(value: Any, precision: int | None, scale: int | None) -> int:
    """The unscaled integer of a DECIMAL value, checked against the declared precision and scale.

    Raises:
        _Bad: not a decimal number, other fractional digits than ``scale``, more digits than
            ``precision`` (``None``: not checked).
    """
    if _decimal_scale(value) != scale and scale is not None:
        raise _Bad(f"expected {scale} fractional digits, got {preview(value)}")
    unscaled = int(value.replace(".", ""))
    if precision is not None and abs(unscaled) >= 10**precision:
        declared = f"DECIMAL({precision},{scale})" if scale is not None else f"DECIMAL({precision})"
        raise _Bad(f"{value[:70]!r} has more digits than {declared} holds")
    return unscaled


def _decimal_string_writer(precision: int | None, scale: int | None) -> Callable[[Any], str]:
    def write(value: Any) -> str:
        _decimal_unscaled(value, precision, scale)
        return str(value)

    return write


def _decimal_bytes_writer(precision: int | None, scale: int) -> Callable[[Any], bytes]:
    def write(value: Any) -> bytes:
        unscaled = _decimal_unscaled(value, precision, scale)
        # two's complement, big endian, as few bytes as hold the sign (Avro decimal)
        size = ((unscaled + (unscaled < 0)).bit_length() + 8) // 8
        if size > _MAX_DECIMAL_BYTES:
            raise _Bad(f"a DECIMAL has at most 65 digits, got {value[:40]!r}...")
        return unscaled.to_bytes(size, "big", signed=True)

    return write


def _enum_writer(elements: Sequence[str] | None) -> Callable[[Any], str]:
    def write(value: Any) -> str:
        if isinstance(value, str):
            return value
        if elements is None or isinstance(value, bool) or not isinstance(value, int):
            raise _Bad(f"expected the ENUM label (str), got {str(value)[:40]!r}; an index needs the column's members")
        if value == 0:  # MySQL's "invalid value" member
            return ""
        if not 1 <= value <= len(elements):
            raise _Bad(f"ENUM index {value} is outside 1..{len(elements)}")
        return elements[value - 1]

    return write


def _set_writer(elements: Sequence[str] | None) -> Callable[[Any], str]:
    def write(value: Any) -> str:
        if isinstance(value, str):
            return value
        if elements is None or isinstance(value, bool) or not isinstance(value, int):
            raise _Bad(f"expected the SET labels (str), got {str(value)[:40]!r}; a bit mask needs the column's members")
        if not 0 <= value < (1 << len(elements)):
            raise _Bad(f"SET bit mask {value} has bits beyond the {len(elements)} members")
        return ",".join(e for i, e in enumerate(elements) if value >> i & 1)

    return write


class _ColumnParams(NamedTuple):
    """What the encoder knows about one column beyond its type code (see ``column_params``)."""

    precision: int | None
    scale: int | None
    members: tuple[str, ...] | None


def _params_key(key: Any, where: str) -> tuple[str, str, str]:
    if not (isinstance(key, tuple) and len(key) == 3 and all(isinstance(k, str) for k in key)):
        raise TypeError(f"{where} keys must be (schema, table, column) tuples of str, got {key!r}")
    return key


def _members(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not all(
        isinstance(m, str) for m in value
    ):
        raise TypeError(f"{where} must be a sequence of str (the ENUM/SET members), got {str(value)[:80]}")
    return tuple(value)


def _bounded_int(value: Any, lo: int, hi: int, where: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int:
        raise TypeError(f"{where} must be an int or None, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise ValueError(f"{where} must be in {lo}..{hi}, got {value}")
    return value


def _column_params(
    column_params: Mapping[tuple[str, str, str], Mapping[str, Any]] | None,
    enum_elements: Mapping[tuple[str, str, str], Sequence[str]] | None,
) -> dict[tuple[str, str, str], _ColumnParams]:
    """The encoder's arguments, checked and merged (``column_params`` members win over ``enum_elements``).

    Raises:
        TypeError: a key that is not a (schema, table, column) tuple, a params entry that is not a
            mapping, or a value of the wrong type.
        ValueError: an unknown params key, a precision outside 1..65, a scale outside 0..30 or above
            the precision.
    """
    out: dict[tuple[str, str, str], _ColumnParams] = {}
    members: tuple[str, ...] | None
    for key, elements in (enum_elements or {}).items():
        members = _members(elements, f"enum_elements[{key!r}]")
        out[_params_key(key, "enum_elements")] = _ColumnParams(None, None, members)
    for key, params in (column_params or {}).items():
        key = _params_key(key, "column_params")
        where = f"column_params[{key!r}]"
        if not isinstance(params, Mapping):
            raise TypeError(f"{where} must be a mapping, got {type(params).__name__}")
        unknown = set(params) - {_PRECISION, _SCALE, _MEMBERS}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(map(str, unknown))}; expected precision, scale, members")
        precision = _bounded_int(params.get(_PRECISION), 1, _MAX_DECIMAL_PRECISION, f"{where} precision")
        scale = _bounded_int(params.get(_SCALE), 0, min(_MAX_DECIMAL_SCALE, precision or _MAX_DECIMAL_SCALE),
                             f"{where} scale")
        raw_members = params.get(_MEMBERS)
        members = None if raw_members is None else _members(raw_members, f"{where} members")
        if members is None and key in out:
            members = out[key].members  # the same column's enum_elements
        out[key] = _ColumnParams(precision, scale, members)
    return out


class _Writer(NamedTuple):
    """How one record of one table is written, for one column signature."""

    schema_id: int
    header: bytes
    parsed: Any
    fields: tuple[tuple[str, str, bool, Callable[[Any], Any]], ...]  # field, column, nullable, conv


class AvroEncoder:
    """Writes row changes the way TiCDC's Avro sink does (used by the simulator and tests).

    Each row change becomes one message: insert/update = key + value, delete = key + ``None`` value.
    Key and value schemas are built from the event's columns and registered under
    ``"<topic>-key"`` / ``"<topic>-value"`` (TopicNameStrategy; ``.`` in the topic becomes ``_``); a
    changed column set registers a new version. DDL and resolved events raise :class:`EncodeError`.

    What the model does not carry is chosen so that every decoded value round-trips:

    - DECIMAL precise: ``logicalType`` decimal with the declared ``precision`` and ``scale`` when
      ``column_params`` gives them (what TiCDC writes: the column's flen/decimal); otherwise
      ``precision`` 65 (MySQL's maximum) and ``scale`` = the value's fractional digits (TiDB prints
      every value of a column with the column's scale), remembered per column for NULL values;
    - DECIMAL string: ``{"type": "string", "connect.parameters": {"tidb_type": "DECIMAL"}}`` as tiflow
      writes it: the declared precision and scale are not in the schema (they only check values);
    - BIT: ``"length": "64"``;
    - ENUM/SET: values must be labels; an int index / bit mask is mapped only when the column's members
      are known (``column_params`` ``members`` or ``enum_elements``), which also fills ``"allowed"``;
    - FLOAT: Avro ``double``, as the seed's table says (tiflow writes ``float``; the decoder reads both).

    ``column_params={(schema, table, column): {"precision": p, "scale": s, "members": [...]}}`` (each
    key optional, ``None`` = unknown; :func:`table_params` returns this shape) declares what the DDL
    says; ``enum_elements={(schema, table, column): members}`` is the older spelling of ``members``.
    A value that does not fit the declared precision or scale is an :class:`EncodeError`.

    Options: ``enable-tidb-extension``, ``avro-decimal-handling-mode``,
    ``avro-bigint-unsigned-handling-mode`` (see the module docstring), ``topic`` (default
    ``tidb-cdc``) and ``namespace`` (the changefeed namespace, default ``default``).

    ``schemas`` (default: a fresh dict-backed :class:`AvroSchemas`, kept as ``encoder.schemas``) is
    where schemas are registered; a decoder given the same object, or a snapshot of it, reads the
    messages.
    """

    protocol = PROTOCOL

    def __init__(
        self,
        options: Mapping[str, str] | None = None,
        *,
        schemas: AvroSchemas | None = None,
        enum_elements: Mapping[tuple[str, str, str], Sequence[str]] | None = None,
        column_params: Mapping[tuple[str, str, str], Mapping[str, Any]] | None = None,
    ) -> None:
        """
        Raises:
            ValueError: a bad option value, or a bad ``column_params`` value (unknown key, precision
                outside 1..65, scale outside 0..30 or above the precision).
            TypeError: ``schemas`` is not an :class:`AvroSchemas` (``None``: a fresh dict-backed one),
                or ``column_params`` / ``enum_elements`` of the wrong shape.
        """
        opts = dict(options or {})
        self._extension = parse_bool_option(opts, "enable-tidb-extension", False)
        self._decimal_mode = _choice(opts, "avro-decimal-handling-mode", (_DECIMAL_PRECISE, _DECIMAL_STRING))
        self._bigint_mode = _choice(opts, "avro-bigint-unsigned-handling-mode", (_BIGINT_LONG, _BIGINT_STRING))
        topic = str(opts.get("topic", "tidb-cdc"))
        if not topic:
            raise ValueError("option topic must not be empty")
        self._subject = _sanitize_topic(topic)
        self._namespace = sanitize_name(str(opts.get("namespace", "default")))
        if not self._namespace:
            raise ValueError("option namespace must not be empty")
        self.schemas = _coerce_schemas(schemas, required=False)
        self._params = _column_params(column_params, enum_elements)
        self._writers: dict[tuple[Any, ...], _Writer] = {}
        self._scales: dict[tuple[str, str, str], int] = {}

    def encode(self, events: Sequence[Event]) -> list[Message]:
        """One message per row change.

        Raises:
            EncodeError: a DDL or resolved event, a value the column's type cannot carry, a delete
                without key columns, a registry that refuses a schema.
            ConfigError: the schema registry refused the credentials (HTTP 401/403).
            SchemaRegistryUnavailableError: the schema registry failed otherwise (registry-backed schemas
                only).
        """
        out: list[Message] = []
        for event in events:
            if not isinstance(event, RowChange):
                raise EncodeError(
                    f"avro carries only row changes, not {getattr(event, 'kind', type(event).__name__)} "
                    "events (TiCDC's Avro sink sends no DDL and no resolved ts)"
                )
            out.append(self._encode_row(event))
        return out

    def _encode_row(self, event: RowChange) -> Message:
        where = f"{event.schema}.{event.table}"
        if event.op == Op.DELETE:
            if not event.old:
                raise EncodeError(f"avro: delete on {where} has no old image")
            keys = [c for c in event.old if int(c.flags) & _KEY_BITS]
            if not keys:
                raise EncodeError(f"avro: delete on {where} has no handle-key column; a tombstone needs the key")
            return Message(self._record(event, keys, "key", None), None)
        if event.op not in (Op.INSERT, Op.UPDATE) or not event.columns:
            raise EncodeError(f"avro: {event.op} on {where} has no new image")
        extension: dict[str, Any] | None = None
        if self._extension:
            if event.commit_ts is None or not 0 <= event.commit_ts < _U64_RANGE:
                raise EncodeError(f"avro: enable-tidb-extension needs a commit ts, {where} has {event.commit_ts}")
            ts = event.commit_ts
            extension = {
                _OP: _INSERT_OP if event.op == Op.INSERT else _UPDATE_OP,
                _COMMIT_TS: ts - _U64_RANGE if ts > _I64_MAX else ts,  # int64(commitTs)
                _PHYSICAL_TIME: ts >> 18,  # oracle.ExtractPhysical: the high bits are ms
            }
        keys = [c for c in event.columns if int(c.flags) & _KEY_BITS]
        # no handle key: TiCDC writes no key (since v7.3 it refuses such tables for Avro)
        key = self._record(event, keys, "key", None) if keys else None
        return Message(key, self._record(event, list(event.columns), "value", extension))

    def _record(
        self, event: RowChange, columns: list[Column], part: str, extension: dict[str, Any] | None
    ) -> bytes:
        writer = self._writer(event, columns, part)
        datum: dict[str, Any] = {}
        field = ""
        try:
            for (field, name, nullable, conv), col in zip(writer.fields, columns):
                if col.value is None:
                    if not nullable:
                        raise _Bad("NULL in a column without the nullable flag")
                    datum[field] = None
                else:
                    datum[field] = conv(col.value)
        except _Bad as exc:
            raise EncodeError(f"avro: {event.schema}.{event.table} column {field}: {exc}") from exc
        if extension is not None:
            datum.update(extension)
        fo = io.BytesIO()
        fo.write(writer.header)
        try:
            schemaless_writer(fo, writer.parsed, datum)
        except Exception as exc:  # noqa: BLE001 - fastavro's ValueError/TypeError/OverflowError
            raise EncodeError(
                f"avro: cannot write {part} of {event.schema}.{event.table}: {_bad_exc(exc)}"
            ) from exc
        return fo.getvalue()

    def _writer(self, event: RowChange, columns: list[Column], part: str) -> _Writer:
        scales: list[int | None] = []
        for col in columns:
            scale = None
            if col.type == TypeCode.DECIMAL:
                known = self._params.get((event.schema, event.table, col.name))
                scale = known.scale if known is not None else None
            if scale is None and col.type == TypeCode.DECIMAL and self._decimal_mode == _DECIMAL_PRECISE:
                # no declared scale: the value's (see the class docstring)
                remembered = (event.schema, event.table, col.name)
                if col.value is None:
                    scale = self._scales.get(remembered, 0)
                else:
                    try:
                        scale = _decimal_scale(col.value)
                    except _Bad as exc:
                        raise EncodeError(f"avro: {event.schema}.{event.table} column {col.name}: {exc}") from exc
                    self._scales[remembered] = scale
            scales.append(scale)
        signature = (
            part, event.schema, event.table,
            tuple((c.name, c.type, int(c.flags), s) for c, s in zip(columns, scales)),
        )
        writer = self._writers.get(signature)
        if writer is None:
            writer = self._new_writer(event, columns, scales, part)
            self._writers[signature] = writer
        return writer

    def _new_writer(self, event: RowChange, columns: list[Column], scales: list[int | None], part: str) -> _Writer:
        where = f"{event.schema}.{event.table}"
        if not event.schema or not event.table:
            raise EncodeError(f"avro: a record needs a schema and a table name, got {where!r}")
        table = sanitize_name(event.table)
        top: dict[str, Any] = {
            "type": "record",
            "name": table,
            "namespace": f"{self._namespace}.{sanitize_name(event.schema)}",
            "fields": [],
        }
        if table != event.table or sanitize_name(event.schema) != event.schema:
            top[_PARAMS] = {_SCHEMA_NAME: event.schema, _TABLE_NAME: event.table}
        fields = []
        taken = set(_EXTENSION_FIELDS) if part == "value" and self._extension else set()
        for col, scale in zip(columns, scales):
            name = sanitize_name(col.name)
            if name in taken or not name:
                raise EncodeError(
                    f"avro: column {col.name!r} of {where} is {name!r} as an Avro name, which is taken"
                )
            taken.add(name)
            avro_type, conv = self._column_type(event, col, scale)
            if name != col.name:
                avro_type[_PARAMS] = dict(sorted({**avro_type[_PARAMS], _COLUMN_NAME: col.name}.items()))
            nullable = bool(col.flags & ColumnFlag.NULLABLE)
            # Go marshals the field map with sorted keys: default, name, type
            if nullable:
                top["fields"].append({"default": None, "name": name, "type": ["null", avro_type]})
            else:
                top["fields"].append({"name": name, "type": avro_type})
            fields.append((name, col.name, nullable, conv))
        if part == "value" and self._extension:
            top["fields"] += [
                {"default": "", "name": _OP, "type": "string"},
                {"default": 0, "name": _COMMIT_TS, "type": "long"},
                {"default": 0, "name": _PHYSICAL_TIME, "type": "long"},
            ]
        schema_json = json.dumps(top, separators=(",", ":"), ensure_ascii=False)
        try:
            parsed = parse_schema(_plain_schema(top))
        except Exception as exc:  # noqa: BLE001
            raise EncodeError(f"avro: the {part} schema of {where} is not valid Avro: {_bad_exc(exc)}") from exc
        sid = self.schemas.register(f"{self._subject}-{part}", schema_json)
        header = bytes([MAGIC_BYTE]) + sid.to_bytes(4, "big")
        return _Writer(sid, header, parsed, tuple(fields))

    def _column_type(
        self, event: RowChange, col: Column, scale: int | None
    ) -> tuple[dict[str, Any], Callable[[Any], Any]]:
        """The column's Avro type (tiflow ``columnToAvroSchema``) and its value writer."""
        code, unsigned = col.type, bool(col.flags & ColumnFlag.UNSIGNED)
        params: dict[str, str] = {}
        extra: dict[str, Any] = {}
        conv: Callable[[Any], Any]
        if code in _SMALL_INT_TYPES or code == TypeCode.INT:
            tidb_type = "INT UNSIGNED" if unsigned else "INT"
            # INT UNSIGNED needs a long; TINYINT..MEDIUMINT UNSIGNED fit an int
            avro = "long" if unsigned and code == TypeCode.INT else "int"
            conv = _int_writer(0, (1 << 32) - 1) if unsigned else _int_writer(_I32_MIN, _I32_MAX)
        elif code == TypeCode.BIGINT:
            tidb_type = "BIGINT UNSIGNED" if unsigned else "BIGINT"
            avro = "long"
            conv = _int_writer(_I64_MIN, _I64_MAX)
            if unsigned and self._bigint_mode == _BIGINT_STRING:
                avro, conv = "string", _u64_as_string
            elif unsigned:
                conv = _u64_as_long
        elif code == TypeCode.YEAR:
            tidb_type, avro, conv = "YEAR", "int", _int_writer(_I32_MIN, _I32_MAX)
        elif code in (TypeCode.FLOAT, TypeCode.DOUBLE):
            tidb_type, avro, conv = ("FLOAT" if code == TypeCode.FLOAT else "DOUBLE"), "double", _float_writer
        elif code == TypeCode.DECIMAL:
            tidb_type = "DECIMAL"
            known = self._params.get((event.schema, event.table, col.name))
            precision = known.precision if known is not None else None
            if self._decimal_mode == _DECIMAL_STRING or scale is None:
                # tiflow's string mode writes only the tidb_type: no precision, no scale
                avro, conv = "string", _decimal_string_writer(precision, scale)
            else:
                # tiflow: precision/scale = the column's declared flen/decimal (the defaults when unset)
                avro, conv = "bytes", _decimal_bytes_writer(precision, scale)
                extra = {"logicalType": "decimal", "precision": precision or _DECIMAL_PRECISION, "scale": scale}
        elif code == TypeCode.BIT:
            tidb_type, avro, conv = "BIT", "bytes", _bit_writer
            params["length"] = _BIT_LENGTH
        elif code in _TEXT_TYPES:
            if col.flags & ColumnFlag.BINARY:
                tidb_type, avro, conv = "BLOB", "bytes", _bytes_writer
            else:
                tidb_type, avro, conv = "TEXT", "string", _str_writer
        elif code in (TypeCode.ENUM, TypeCode.SET):
            known = self._params.get((event.schema, event.table, col.name))
            elements = known.members if known is not None else None
            tidb_type, avro = ("ENUM", "string") if code == TypeCode.ENUM else ("SET", "string")
            conv = _enum_writer(elements) if code == TypeCode.ENUM else _set_writer(elements)
            if elements is not None:
                params["allowed"] = ",".join(e.replace(",", "\\,") for e in elements)
        elif code in _STRING_TIDB_TYPES:
            tidb_type, avro, conv = _STRING_TIDB_TYPES[TypeCode(code)], "string", _str_writer
        else:
            raise EncodeError(
                f"avro: column {col.name} of {event.schema}.{event.table} has type code {code}, "
                "which TiCDC's Avro sink does not map"
            )
        params["tidb_type"] = tidb_type
        # Go marshals the map with sorted keys ("allowed"/"length" before "tidb_type")
        return {"type": avro, _PARAMS: dict(sorted(params.items())), **extra}, conv
