"""Job configuration: the YAML file a user writes, validated once at start-up.

:func:`load_config` reads the file, substitutes ``${VAR}`` / ``${VAR:-default}`` from the environment,
validates it against the models below and returns a :class:`JobConfig`. Every problem is reported at once
in one :class:`~ticdc_delta.errors.ConfigError` whose lines name the YAML path of the bad value::

    invalid configuration in conf/demo.yaml:
      source.max_offsets_per_trigger: Input should be greater than 0
      tables[1].source: expected "schema.table" (a `*` matches any run of characters)

Unknown keys are rejected at every depth (every model is ``extra="forbid"``); the free-form mappings
(``source.options``, ``source.kafka``, ``sink.storage_options``, ``spark.conf``) take any key but only
scalar values. Error messages name keys (in the path) but never quote a value, so a secret cannot leak
through them; secrets — any key naming a password, passphrase, secret, token, key, credential, private key,
``jaas``, ``basic.auth`` or ``oauthbearer.config`` (:func:`is_secret_key`) — are replaced with ``"***"`` by
:meth:`JobConfig.redacted` and in the models' ``repr``, and so are the user info and secret-looking query
parameters of URL values (``s3://KEY:SECRET@bucket/...``, ``?secret_key=...``).
The full reference is ``docs/configuration.md``.

No pyspark import here: the CLI validates a config before any JVM starts.
"""

from __future__ import annotations

import math
import os
import re
import types
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, ClassVar, Iterator, Literal, Mapping, Sequence, Union, get_args, get_origin
from urllib.parse import unquote, urlsplit, urlunsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)

from .errors import ConfigError, IdentifierError
from .locations import child_location, file_path, fold_name, holds, overlaps, table_location

__all__ = [
    "JobConfig",
    "SourceConfig",
    "SchemaRegistryConfig",
    "SinkConfig",
    "CompactionConfig",
    "MetadataColumns",
    "TableMapping",
    "DeadLetterConfig",
    "SparkConfig",
    "DDLPolicies",
    "Protocol",
    "DDLPolicy",
    "REDACTED",
    "DEFAULT_DEAD_LETTER_DIR",
    "is_secret_key",
    "load_config",
    "config_from_mapping",
    "substitute_env",
]

Protocol = Literal["open-protocol", "craft", "canal-json", "avro"]
DDLPolicy = Literal["evolve", "ignore", "fail"]

REDACTED = "***"
DEFAULT_DEAD_LETTER_DIR = "_ticdc_dead_letter"

# What marks a setting's key as secret, for the config and the Kafka source alike: librdkafka's
# sasl.password, ssl.key.pem, sasl.oauthbearer.config; the Java client's sasl.jaas.config, ssl.keystore.key;
# the registry's basic.auth.user.info, bearer.auth.token; the object stores' AWS_SECRET_ACCESS_KEY,
# aws_access_key_id, azure_storage_account_key, fs.azure.account.key.<account>... A "key" word counts except
# in "....key.location" (librdkafka's ssl.key.location is the key file's path, not the key).
_SECRET_KEY_RE = re.compile(
    r"(?i)password|passphrase|secret|token|jaas|basic\.auth|credential|private|oauthbearer\.config"
    r"|(?<![a-z])key(?![a-z])(?!\.location$)"
)

_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_SETTING_KEY_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_IDENT_PATH_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Spark's processingTime trigger takes an interval string, e.g. "10 seconds", "1 minute 30 seconds".
_INTERVAL_UNITS = {
    "microsecond": 1e-6,
    "millisecond": 1e-3,
    "second": 1.0,
    "minute": 60.0,
    "hour": 3600.0,
    "day": 86400.0,
    "week": 604800.0,
}
_INTERVAL_PART_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+?)s?(?=\s|$)")
_BOOL_STRINGS = {
    **dict.fromkeys(("true", "yes", "on", "1"), True),
    **dict.fromkeys(("false", "no", "off", "0"), False),
}


def is_secret_key(key: object) -> bool:
    """Whether a setting's key names a secret (its value must never be shown). The one rule for every
    setting: the config's redaction and :func:`ticdc_delta.spark.kafka_source.redact` both use it."""
    return _SECRET_KEY_RE.search(str(key)) is not None


class _PathError(ValueError):
    """A validation error located below the value being validated (``subpath`` is appended to the
    YAML path pydantic reports), so cross-field checks can point at the exact key."""

    def __init__(self, subpath: Sequence[str | int], message: str) -> None:
        super().__init__(message)
        self.subpath = tuple(subpath)


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return f"a {type(value).__name__}"


def _setting_value(value: Any) -> Any:
    """A scalar setting value as the string librdkafka / TiCDC / delta-rs expect: YAML ``true`` →
    ``"true"``, ``1`` → ``"1"``. Never quotes the value in its error (it may be a secret)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return value
    raise ValueError(f"expected a string, number or boolean, got {_kind(value)}")


def _no_bool(value: Any) -> Any:
    # pydantic's lax int accepts true/false as 1/0; a boolean where a count belongs is a mistake
    if isinstance(value, bool):
        raise ValueError("expected an integer, got a boolean")
    return value


def _non_empty(value: Any) -> Any:
    if isinstance(value, str) and not value.strip():
        raise ValueError("must not be empty")
    return value


SettingValue = Annotated[str, BeforeValidator(_setting_value)]
NonEmptyStr = Annotated[str, BeforeValidator(_non_empty)]
Location = Annotated[str, BeforeValidator(_non_empty), AfterValidator(file_path)]
"""A table, lake, checkpoint or dead-letter location: a path or a URI (a ``file:`` URL becomes its path)."""
Settings = dict[str, SettingValue]

_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")


def _topic_name(value: str) -> str:
    """A Kafka topic name: ASCII letters, digits, ``.``, ``_`` and ``-``, at most 249 of them (what Kafka
    accepts; a comma or a ``|`` would make Spark read other topics)."""
    if not _TOPIC.fullmatch(value):
        raise ValueError(f"{value!r} is not a Kafka topic name (letters, digits, '.', '_', '-'; at most 249)")
    return value


def _check_setting_keys(settings: Mapping[str, str], reserved: Mapping[str, str] | None = None) -> None:
    for key in settings:
        if not _SETTING_KEY_RE.match(key):
            raise _PathError((key,), "a setting name may only hold letters, digits, '.', '_' and '-'")
        if reserved and key in reserved:
            raise _PathError((key,), reserved[key])


# Delta Lake drops its protocol keys (minReaderVersion, minWriterVersion, ignoreProtocolDefaults and every
# delta.feature.<name>) from the properties it stores (TableFeatureProtocolUtils.isTableProtocolProperty):
# the job, which sets a listed property whenever the table's value differs, would find one unset and
# commit a SET TBLPROPERTIES before every write to the table; delta-rs refuses them ("Error parsing
# property").
_PROTOCOL_KEY = ("a protocol setting, not a table property: Delta Lake does not keep it among the table's "
                 "properties, so the job would set it again before every write (and delta-rs refuses it)")

TABLE_PROPERTIES_THE_JOB_SETS: dict[str, str] = {
    "delta.columnMapping.mode": "set by the job from sink.column_mapping",
    "delta.columnMapping.maxColumnId": "Delta Lake keeps it itself",
    "delta.enableTypeWidening": "set by the job from sink.type_widening",
    "delta.appendOnly": "the job updates and deletes rows: an append-only table would refuse its MERGEs",
    "delta.minReaderVersion": "Delta Lake derives it from the table's features",
    "delta.minWriterVersion": "Delta Lake derives it from the table's features",
    "delta.ignoreProtocolDefaults": f"{_PROTOCOL_KEY}; leave it out: Delta Lake derives the protocol from the "
                                    "table's features",
}
"""Delta table properties ``table_properties`` refuses, with why."""

TABLE_FEATURE_PREFIX = "delta.feature."
"""``delta.feature.<name>: supported``, Delta Lake's protocol key that adds a table feature: refused by
``table_properties``, with what to do instead (:data:`TABLE_FEATURE_INSTEAD`)."""

_PROPERTY_ADDS_IT = "set {} instead (it adds the feature)"

TABLE_FEATURE_INSTEAD: dict[str, str] = {
    "deletionVectors": _PROPERTY_ADDS_IT.format("delta.enableDeletionVectors: true"),
    "changeDataFeed": _PROPERTY_ADDS_IT.format("delta.enableChangeDataFeed: true"),
    "rowTracking": _PROPERTY_ADDS_IT.format("delta.enableRowTracking: true"),
    "inCommitTimestamp": _PROPERTY_ADDS_IT.format("delta.enableInCommitTimestamps: true"),
    "v2Checkpoint": _PROPERTY_ADDS_IT.format("delta.checkpointPolicy: v2"),
    "icebergCompatV1": _PROPERTY_ADDS_IT.format("delta.enableIcebergCompatV1: true"),
    "icebergCompatV2": _PROPERTY_ADDS_IT.format("delta.enableIcebergCompatV2: true"),
    "columnMapping": "set sink.column_mapping instead (the job sets delta.columnMapping.mode from it)",
    "typeWidening": "set sink.type_widening instead (the job sets delta.enableTypeWidening from it)",
    "typeWidening-preview": "set sink.type_widening instead (the job sets delta.enableTypeWidening from it)",
    "appendOnly": TABLE_PROPERTIES_THE_JOB_SETS["delta.appendOnly"],
}
"""What to do instead of ``delta.feature.<name>`` (by the feature's name): the setting that adds the
feature, where one does. Any other feature Delta Lake adds itself when a table uses it (``timestampNtz``
for a TIMESTAMP_NTZ column, ``checkConstraints`` for a CHECK constraint), or it is added to a table once by
hand: the job leaves the properties it does not list alone."""


def _check_table_properties(value: Mapping[str, str]) -> None:
    _check_setting_keys(value)
    refused = {key.lower(): why for key, why in TABLE_PROPERTIES_THE_JOB_SETS.items()}
    instead = {name.lower(): what for name, what in TABLE_FEATURE_INSTEAD.items()}
    for key in value:
        why = refused.get(key.lower())  # (Delta Lake compares its properties' names ignoring case)
        if why is not None:
            raise _PathError((key,), why)
        if key.lower().startswith(TABLE_FEATURE_PREFIX):
            feature = key[len(TABLE_FEATURE_PREFIX):]
            what = instead.get(  # (and its features' names)
                feature.lower(), f"leave it out: Delta Lake adds the feature {feature!r} when a table uses it, "
                "or add it to a table once with ALTER TABLE ... SET TBLPROPERTIES (the job leaves the "
                "properties it does not list alone)")
            raise _PathError((key,), f"{_PROTOCOL_KEY}; {what}")


def _redact_url(url: str) -> str:
    """``url`` with any ``user:password@`` replaced by ``***@`` and the value of every secret query parameter
    (:func:`is_secret_key`: ``secret_key=``, ``access_key=``, ``token=``) by ``***`` (each of a
    comma-separated list)."""
    out = []
    for part in url.split(","):
        try:
            split = urlsplit(part.strip())
        except ValueError:
            out.append(REDACTED)
            continue
        if "@" in split.netloc:
            split = split._replace(netloc=f"{REDACTED}@{split.netloc.rpartition('@')[2]}")
        if split.query:
            split = split._replace(query="&".join(_redact_query_item(item) for item in split.query.split("&")))
        out.append(urlunsplit(split))
    return ",".join(out)


def _redact_query_item(item: str) -> str:
    name, sep, _value = item.partition("=")
    return f"{name}={REDACTED}" if sep and is_secret_key(unquote(name)) else item


def _redact_setting(key: Any, value: Any) -> Any:
    """A free-form setting's value as it may be shown: ``***`` for a secret key, a URL value (e.g.
    ``claim-check-storage-uri``) without its credentials (:func:`_redact_url`), any other value as it is."""
    if value is None:
        return None
    if is_secret_key(key):
        return REDACTED
    if isinstance(value, str) and "://" in value:
        redacted = _redact_url(value)
        return redacted if REDACTED in redacted else value
    return value


def _redact_mapping(values: Mapping[Any, Any]) -> dict[Any, Any]:
    return {k: _redact_setting(k, v) for k, v in values.items()}


class _Model(BaseModel):
    """Base of every config model: unknown keys rejected, immutable, secrets kept out of ``repr``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Free-form settings whose secret keys are redacted in repr (the values themselves are plain str).
    _SETTING_FIELDS: ClassVar[frozenset[str]] = frozenset()
    # URL fields shown without their credentials in repr (:func:`_redact_url`).
    _URL_FIELDS: ClassVar[frozenset[str]] = frozenset()

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        for name, value in super().__repr_args__():
            if name in self._SETTING_FIELDS and isinstance(value, Mapping):
                value = _redact_mapping(value)
            elif name in self._URL_FIELDS and isinstance(value, str):
                value = _redact_url(value)
            yield name, value


class SchemaRegistryConfig(_Model):
    """Confluent Schema Registry client settings (``source.schema_registry``), under the names
    confluent-kafka's ``SchemaRegistryClient`` takes. :meth:`client_conf` is that client's dict."""

    url: NonEmptyStr
    basic_auth_user_info: str | None = Field(default=None, alias="basic.auth.user.info")
    ssl_ca_location: str | Literal[False] | None = Field(default=None, alias="ssl.ca.location")
    ssl_certificate_location: str | None = Field(default=None, alias="ssl.certificate.location")
    ssl_key_location: str | None = Field(default=None, alias="ssl.key.location")
    ssl_key_password: str | None = Field(default=None, alias="ssl.key.password")
    proxy: str | None = None
    timeout: Annotated[float, BeforeValidator(_no_bool), Field(gt=0)] | None = None
    cache_capacity: Annotated[int, BeforeValidator(_no_bool), Field(gt=0)] | None = Field(
        default=None, alias="cache.capacity"
    )
    cache_latest_ttl_sec: Annotated[float, BeforeValidator(_no_bool), Field(gt=0)] | None = Field(
        default=None, alias="cache.latest.ttl.sec"
    )
    max_retries: Annotated[int, BeforeValidator(_no_bool), Field(ge=0)] | None = Field(
        default=None, alias="max.retries"
    )
    retries_wait_ms: Annotated[int, BeforeValidator(_no_bool), Field(ge=0)] | None = Field(
        default=None, alias="retries.wait.ms"
    )
    retries_max_wait_ms: Annotated[int, BeforeValidator(_no_bool), Field(ge=0)] | None = Field(
        default=None, alias="retries.max.wait.ms"
    )
    bearer_auth_credentials_source: (
        Literal["STATIC_TOKEN", "OAUTHBEARER", "OAUTHBEARER_AZURE_IMDS"] | None
    ) = Field(default=None, alias="bearer.auth.credentials.source")
    bearer_auth_token: str | None = Field(default=None, alias="bearer.auth.token")
    bearer_auth_logical_cluster: str | None = Field(default=None, alias="bearer.auth.logical.cluster")
    bearer_auth_identity_pool_id: str | None = Field(default=None, alias="bearer.auth.identity.pool.id")
    bearer_auth_client_id: str | None = Field(default=None, alias="bearer.auth.client.id")
    bearer_auth_client_secret: str | None = Field(default=None, alias="bearer.auth.client.secret")
    bearer_auth_scope: str | None = Field(default=None, alias="bearer.auth.scope")
    bearer_auth_issuer_endpoint_url: str | None = Field(default=None, alias="bearer.auth.issuer.endpoint.url")
    bearer_auth_issuer_endpoint_query: str | None = Field(
        default=None, alias="bearer.auth.issuer.endpoint.query"
    )

    _URL_FIELDS = frozenset({"url"})

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        # confluent-kafka takes a comma-separated list of http(s):// (or mock:// for tests) URLs
        for part in url.split(","):
            scheme = part.strip().partition("://")[0].lower()
            if scheme not in ("http", "https", "mock"):
                raise ValueError("expected http://, https:// (or mock://) URLs, comma-separated")
        return url

    @field_validator(
        "basic_auth_user_info",
        "ssl_certificate_location",
        "ssl_key_location",
        "ssl_key_password",
        "proxy",
        "bearer_auth_token",
        "bearer_auth_client_secret",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        # "${SR_AUTH:-}" in the YAML: an empty value means the setting is not used
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("ssl_ca_location", mode="plain")
    @classmethod
    def _check_ca(cls, value: Any) -> Any:
        # confluent-kafka: a CA file or directory, or false to skip certificate verification
        if value is None or value is False or (isinstance(value, str) and value.strip()):
            return value
        raise ValueError("expected a CA file or directory path, or false (do not verify certificates)")

    @field_validator("basic_auth_user_info")
    @classmethod
    def _check_user_info(cls, value: str | None) -> str | None:
        if value is not None and ":" not in value:
            raise ValueError("expected USER:PASSWORD")  # never quote it: it is a secret
        return value

    @model_validator(mode="after")
    def _check_combinations(self) -> "SchemaRegistryConfig":
        if self.basic_auth_user_info is not None and "@" in urlsplit(self.url.split(",")[0].strip()).netloc:
            raise _PathError(("basic.auth.user.info",), "give credentials either here or in the url, not both")
        if (self.ssl_key_location or self.ssl_key_password) and not self.ssl_certificate_location:
            raise _PathError(("ssl.certificate.location",), "required with ssl.key.location / ssl.key.password")
        return self

    def client_conf(self) -> dict[str, Any]:
        """The dict to build a confluent-kafka ``SchemaRegistryClient`` with (unset keys left out)."""
        return self.model_dump(by_alias=True, exclude_none=True)

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        for name, value in super().__repr_args__():
            field = type(self).model_fields.get(name or "")
            alias = (field.alias if field else None) or name
            if value is not None and is_secret_key(alias):
                value = REDACTED
            yield name, value


def _starting_offsets(value: Any) -> Any:
    """``earliest`` | ``latest`` | ``{topic: {partition: offset}}`` (offset -2 = earliest, -1 = latest,
    as in Spark's ``startingOffsets`` JSON)."""
    if value in ("earliest", "latest"):
        return value
    if not isinstance(value, Mapping):
        raise ValueError("expected earliest, latest or a mapping {topic: {partition: offset}}")
    if not value:
        raise ValueError("the mapping {topic: {partition: offset}} must name at least one topic")
    out: dict[str, dict[int, int]] = {}
    for topic, partitions in value.items():
        if not isinstance(topic, str) or not topic:
            raise _PathError((str(topic),), "a topic name must be a non-empty string")
        if not isinstance(partitions, Mapping) or not partitions:
            raise _PathError((topic,), "expected a mapping {partition: offset} with at least one partition")
        offsets: dict[int, int] = {}
        for partition, offset in partitions.items():
            try:
                number = int(partition)
            except (TypeError, ValueError):
                number = -1
            if isinstance(partition, bool) or number < 0:
                raise _PathError((topic, str(partition)), "a partition must be an integer >= 0")
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < -2:
                raise _PathError(
                    (topic, number), "an offset must be an integer >= 0 (or -2 for earliest, -1 for latest)"
                )
            offsets[number] = offset
        out[topic] = offsets
    return out


def _consumer_group(value: Any) -> Any:
    if isinstance(value, str) and value.strip().lower() in _BOOL_STRINGS:
        value = _BOOL_STRINGS[value.strip().lower()]  # e.g. "${GROUP:-false}": no group named "false"
    if value is None or value is True:
        return None  # the default group
    if value is False:
        return False
    if isinstance(value, str) and value.strip():
        return value
    raise ValueError("expected a group name, null (the default ticdc-delta-<changefeed>) or false (no commits)")


#: ``source.kafka`` settings only the Kafka Java client (Spark's Kafka source) knows; librdkafka (the
#: broker probe, the consumer-group mirror, metadata look-ups) would refuse them.
_JAVA_CLIENT_ONLY = frozenset({"default.api.timeout.ms", "max.poll.records", "sasl.jaas.config",
                               "retry.backoff.max.ms", "reconnect.backoff.max.ms", "connections.max.idle.ms"})
_JAVA_CLIENT_ONLY_PREFIXES = ("ssl.truststore.", "ssl.keystore.", "sasl.login.", "sasl.client.callback.")
#: Java keystore settings librdkafka reads under the same names (a PKCS#12 file only: librdkafka's
#: ``ssl.keystore.location`` / ``ssl.keystore.password``), so its clients present the Java client's certificate.
_KEYSTORE_SHARED = ("ssl.keystore.location", "ssl.keystore.password")
#: The JAAS login modules whose ``username``/``password`` options librdkafka takes as ``sasl.username`` /
#: ``sasl.password`` (either serves PLAIN and SCRAM: the Java client reads the credentials off the login
#: subject, whichever of the two modules put them there).
_JAAS_PASSWORD_MODULES = frozenset({"org.apache.kafka.common.security.plain.PlainLoginModule",
                                    "org.apache.kafka.common.security.scram.ScramLoginModule"})
# Kafka's JaasConfig grammar: `<LoginModule class> <control flag> (<option>=<value>)* ;`, a value a word or a
# quoted string (Java's StreamTokenizer: backslash escapes inside the quotes)
_JAAS_MODULE_RE = re.compile(r"\s*([\w.$]+)\s+(?:required|requisite|sufficient|optional)\b")
_JAAS_OPTION_RE = re.compile(r"\s*([\w.$-]+)\s*=\s*(?:\"((?:[^\"\\]|\\.)*)\"|'((?:[^'\\]|\\.)*)'|([\w.$-]+))")
_JAAS_END_RE = re.compile(r"\s*;\s*")


def _jaas_credentials(jaas: str) -> tuple[str, str]:
    """The ``username`` and ``password`` of a ``sasl.jaas.config`` of the PLAIN or SCRAM login module.

    Raises:
        ValueError: not one such login module with both options (the message never quotes the value).
    """
    syntax = ('expected one login module, `<LoginModule class> required username="..." password="...";`; '
              "give sasl.username/sasl.password instead")
    head = _JAAS_MODULE_RE.match(jaas)
    if head is None:
        raise ValueError(syntax)
    module = head.group(1)
    if module not in _JAAS_PASSWORD_MODULES:
        raise ValueError(
            f"login module {module} is not supported: the job's librdkafka clients (broker probe, consumer-group "
            "mirror) can only log in with the username and password of a PlainLoginModule or ScramLoginModule "
            "(SASL PLAIN or SCRAM)"
        )
    options: dict[str, str] = {}
    pos = head.end()
    while (option := _JAAS_OPTION_RE.match(jaas, pos)) is not None:
        name, double, single, word = option.groups()
        quoted = double if double is not None else single
        options[name] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else word
        pos = option.end()
    if _JAAS_END_RE.fullmatch(jaas, pos) is None:
        raise ValueError(syntax)
    missing = [name for name in ("username", "password") if not options.get(name)]
    if missing:
        raise ValueError(f"{module} has no {' and no '.join(missing)}; give sasl.username/sasl.password instead")
    return options["username"], options["password"]


def _jaas_logs_in(conf: Mapping[str, str]) -> bool:
    """Whether the job's librdkafka clients must take their SASL PLAIN/SCRAM credentials from ``sasl.jaas.config``
    (given, and no ``sasl.username``/``sasl.password``). Another mechanism (OAUTHBEARER, GSSAPI) has librdkafka
    settings of its own beside the Java client's JAAS, which is left to the Java client."""
    mechanism = str(conf.get("sasl.mechanism", conf.get("sasl.mechanisms", ""))).strip().upper()
    return ("sasl.jaas.config" in conf and "sasl.username" not in conf and "sasl.password" not in conf
            and (mechanism == "PLAIN" or mechanism.startswith("SCRAM-")))


def _check_java_client_credentials(conf: Mapping[str, str]) -> None:
    """Refuse Java client settings the job's librdkafka clients could not follow, at the key.

    Raises:
        _PathError: a ``sasl.jaas.config`` without PLAIN/SCRAM credentials, a keystore that is not PKCS#12.
    """
    if _jaas_logs_in(conf):
        try:
            _jaas_credentials(conf["sasl.jaas.config"])
        except ValueError as exc:
            raise _PathError(("sasl.jaas.config",), str(exc)) from None
    store_type = conf.get("ssl.keystore.type", "PKCS12").strip().upper()
    if "ssl.keystore.location" in conf and store_type != "PKCS12":
        raise _PathError(
            ("ssl.keystore.type",),
            f"the job's librdkafka clients (broker probe, consumer-group mirror) read only a PKCS12 keystore, "
            f"not {store_type} (convert it: keytool -importkeystore -deststoretype PKCS12)",
        )


def librdkafka_settings(conf: Mapping[str, Any]) -> dict[str, str]:
    """``conf`` as the job's librdkafka clients (broker probe, consumer-group mirror, metadata) are given it:
    without the settings only the Kafka Java client knows (``default.api.timeout.ms``, ``ssl.truststore.*``,
    ...), but with the credentials of Java client settings librdkafka has its own names for: a PKCS#12
    keystore's ``ssl.keystore.location``/``ssl.keystore.password`` (the same client certificate), and the
    ``username``/``password`` of a PLAIN/SCRAM ``sasl.jaas.config`` as ``sasl.username``/``sasl.password``
    (another login module is left out: the configuration loader refuses it)."""
    src = {str(k): str(v) for k, v in conf.items()}
    out = {
        k: v
        for k, v in src.items()
        if k not in _JAVA_CLIENT_ONLY and (k in _KEYSTORE_SHARED or not k.startswith(_JAVA_CLIENT_ONLY_PREFIXES))
    }
    if _jaas_logs_in(src):
        try:
            out["sasl.username"], out["sasl.password"] = _jaas_credentials(src["sasl.jaas.config"])
        except ValueError:
            pass  # (refused with the reason at config load; librdkafka then says what it misses)
    return out


class SourceConfig(_Model):
    """The Kafka topic(s) a TiCDC changefeed writes to, and how to read and decode them."""

    bootstrap_servers: NonEmptyStr
    topic: NonEmptyStr | None = None
    topics: list[NonEmptyStr] | None = None
    protocol: Protocol
    options: Settings = {}
    starting_offsets: Literal["earliest", "latest"] | dict[str, dict[int, int]] = "earliest"
    max_offsets_per_trigger: Annotated[int, BeforeValidator(_no_bool), Field(gt=0)] | None = None
    # Spark's failOnDataLoss: offsets the checkpoint needs that Kafka no longer has stop the job (terminal)
    fail_on_data_loss: bool = True
    # how far a resolved ts / commit ts may be ahead of the batch's clock; null = no check
    max_future_ts: Annotated[str, BeforeValidator(_trigger_interval)] | None = "1 hour"
    kafka: Settings = {}
    consumer_group: str | Literal[False] | None = None
    schema_registry: SchemaRegistryConfig | None = None
    avro_schemas: dict[Annotated[int, BeforeValidator(_no_bool), Field(ge=0, le=0xFFFFFFFF)], NonEmptyStr] = {}
    # the upstream TiDB (mysql://user@host:4000/): handle-key-only rows are read there at their commit ts
    upstream: str | None = None

    _SETTING_FIELDS = frozenset({"options", "kafka"})
    _URL_FIELDS = frozenset({"upstream"})

    @field_validator("bootstrap_servers", mode="before")
    @classmethod
    def _join_servers(cls, value: Any) -> Any:
        # a YAML list of host:port is accepted and joined the way librdkafka wants it
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return ",".join(v.strip() for v in value)
        return value

    @field_validator("bootstrap_servers")
    @classmethod
    def _check_servers(cls, value: str) -> str:
        for server in value.split(","):
            host, sep, port = server.strip().rpartition(":")
            if not server.strip() or not sep or not host or not port.isdigit():
                raise ValueError("expected a comma-separated list of host:port")
        return value

    @field_validator("starting_offsets", mode="plain")
    @classmethod
    def _check_offsets(cls, value: Any) -> Any:
        return _starting_offsets(value)

    @field_serializer("starting_offsets")
    def _dump_offsets(self, value: Any) -> Any:
        # the validator is "plain", so serialize by value rather than through the union annotation
        return value if isinstance(value, str) else {t: dict(p) for t, p in value.items()}

    @field_validator("consumer_group", mode="plain")
    @classmethod
    def _check_group(cls, value: Any) -> Any:
        return _consumer_group(value)

    @field_validator("upstream")
    @classmethod
    def _check_upstream(cls, value: str | None) -> str | None:
        if value is not None:
            from .codec.upstream_lookup import parse_upstream_dsn

            parse_upstream_dsn(value, env={})  # ValueError: its message never quotes the DSN
        return value

    def upstream_settings(self, time_zone: str = "UTC", env: Mapping[str, str] | None = None) -> Any:
        """The :class:`~ticdc_delta.codec.upstream_lookup.UpstreamSettings` of ``upstream`` (``None`` when
        unset): the password from the DSN or the environment (``TICDC_DELTA_UPSTREAM_PASSWORD``); the
        session time zone ``time_zone`` (``sink.source_timezone``) unless the DSN sets one."""
        if self.upstream is None:
            return None
        from .codec.upstream_lookup import parse_upstream_dsn

        return parse_upstream_dsn(self.upstream, env=env, time_zone=time_zone)

    @field_validator("options")
    @classmethod
    def _check_options(cls, value: dict[str, str]) -> dict[str, str]:
        _check_setting_keys(value)
        return value

    @field_validator("kafka")
    @classmethod
    def _check_kafka(cls, value: dict[str, str]) -> dict[str, str]:
        _check_setting_keys(
            value,
            {
                "bootstrap.servers": "set it as source.bootstrap_servers",
                "group.id": "set it as source.consumer_group",
            },
        )
        # what Spark's Kafka source is given (and refuses) is known now, not after the JVM has started
        from .errors import ConfigError
        from .spark.kafka_source import java_client_conf

        try:
            java_client_conf(value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        _check_java_client_credentials(value)
        return value

    @field_validator("topic")
    @classmethod
    def _check_topic(cls, value: str | None) -> str | None:
        return None if value is None else _topic_name(value)

    @field_validator("topics")
    @classmethod
    def _check_topics(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else [_topic_name(v) for v in value]

    @model_validator(mode="after")
    def _check_source(self) -> "SourceConfig":
        if (self.topic is None) == (self.topics is None):
            where = ("topics",) if self.topic is not None else ()
            raise _PathError(where, "set exactly one of topic (one name) or topics (a list)")
        if self.topics is not None:
            if not self.topics:
                raise _PathError(("topics",), "must name at least one topic")
            seen: set[str] = set()
            for i, name in enumerate(self.topics):
                if name in seen:
                    raise _PathError(("topics", i), "this topic is listed twice")
                seen.add(name)
        if isinstance(self.starting_offsets, dict):
            topics = self.topic_list
            for name in self.starting_offsets:
                if name not in topics:
                    raise _PathError(("starting_offsets", name), "not one of the source topics")
            missing = [t for t in topics if t not in self.starting_offsets]
            if missing:  # (Spark's Kafka source refuses to start with specific offsets for only some of them)
                raise _PathError(("starting_offsets",), f"name every source topic's partitions: {missing} missing")
        if self.protocol == "avro":
            if self.schema_registry is None and not self.avro_schemas:
                raise ValueError("protocol avro needs schema_registry (a registry URL) or avro_schemas (local files)")
        else:
            if self.schema_registry is not None:
                raise _PathError(("schema_registry",), f"only used with protocol avro, not {self.protocol}")
            if self.avro_schemas:
                raise _PathError(("avro_schemas",), f"only used with protocol avro, not {self.protocol}")
        if self.upstream is not None and self.protocol not in ("open-protocol", "canal-json"):
            raise _PathError(("upstream",), "handle-key-only rows exist only with open-protocol and canal-json, "
                             f"not {self.protocol}")
        from .codec import decoder_for
        from .codec.base import parse_bool_option
        from .codec.claim_check import STORAGE_OPTION, check_storage_uri

        if self.protocol == "avro" and parse_bool_option(dict(self.options), "avro-enable-watermark"):
            raise _PathError(("options", "avro-enable-watermark"),
                             "not supported: TiCDC's watermark and DDL messages of this mode are no Avro (TiCDC keeps "
                             "it for its own tests); create the changefeed without it, or use enable-tidb-extension "
                             "with canal-json for watermarks")
        if STORAGE_OPTION in self.options:
            try:  # offline: pyarrow's from_uri would already go to the network (an s3:// bucket's region)
                check_storage_uri(self.options[STORAGE_OPTION].strip())
            except ValueError as exc:
                raise _PathError(("options", STORAGE_OPTION), str(exc)) from None
        if "partition-num" in self.options:
            raw = str(self.options["partition-num"]).strip()
            if not raw.isdigit() or int(raw) < 1:
                raise _PathError(("options", "partition-num"), f"expected a number of partitions >= 1, got {raw!r}")
        # the decoder's options as the executors will read them (a bad value failed the first batch)
        schemas = None
        if self.protocol == "avro":
            from .codec.avro import AvroSchemas

            schemas = AvroSchemas({})
        try:
            decoder_for(self.protocol, self.options, schemas=schemas)
        except ValueError as exc:
            raise _PathError(("options",), str(exc)) from None
        return self

    @property
    def max_future_ts_ms(self) -> int | None:
        """``max_future_ts`` in milliseconds, ``None`` when the check is off."""
        return None if self.max_future_ts is None else int(_interval_seconds(self.max_future_ts) * 1000)

    @property
    def partition_num(self) -> int | None:
        """The sink URI's ``partition-num`` (``options``): TiCDC writes rows and resolved ts only to the first
        that many partitions of each topic; ``None`` when not given (every partition)."""
        raw = self.options.get("partition-num")
        return None if raw is None else int(str(raw).strip())

    @property
    def topic_list(self) -> list[str]:
        """The topic names to read, whether given as ``topic`` or ``topics``."""
        return [self.topic] if self.topic is not None else list(self.topics or ())


def _metadata_columns(value: Any) -> Any:
    if isinstance(value, str) and value.strip().lower() in _BOOL_STRINGS:
        value = _BOOL_STRINGS[value.strip().lower()]  # e.g. "${WITH_META:-false}"
    if value is True:
        return {}
    if value is False or value is None:
        return None
    return value


class MetadataColumns(_Model):
    """Names of the metadata columns added to every Delta table (``sink.metadata_columns``)."""

    commit_ts: NonEmptyStr = "_tidb_commit_ts"
    op: NonEmptyStr = "_tidb_op"

    @model_validator(mode="after")
    def _distinct(self) -> "MetadataColumns":
        if self.commit_ts.lower() == self.op.lower():
            raise _PathError(("op",), "must differ from commit_ts")
        return self


def _timezone(value: Any) -> Any:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("expected an IANA time zone name such as UTC or Asia/Shanghai")
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError("unknown time zone; expected an IANA name such as UTC or Asia/Shanghai") from None
    return value


_SIZE_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3,
               "kib": 1024, "mib": 1024**2, "gib": 1024**3}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([a-z]*)\s*$")


def _byte_size(value: Any) -> Any:
    """A byte count: an integer, or a string with a unit (``"128 MiB"``, ``"100MB"``, ``"512 KiB"``)."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 134217728 or \"128 MiB\", got a boolean")
    if isinstance(value, str):
        match = _SIZE_RE.match(value.lower())
        if match is None or match.group(2) not in _SIZE_UNITS:
            raise ValueError('expected a size such as 134217728 or "128 MiB" (units: B, KB, MB, GB, KiB, MiB, GiB)')
        return int(match.group(1)) * _SIZE_UNITS[match.group(2)]
    return value


class CompactionConfig(_Model):
    """``sink.compaction``: small-file compaction of the tables a micro-batch wrote (both engines)."""

    enabled: bool = True
    # compact a table once it has this many files smaller than half of target_file_size that can be combined
    # (two or more in one partition); Delta's auto compaction uses 50 (minNumFiles)
    min_files: Annotated[int, BeforeValidator(_no_bool), Field(ge=2, le=100_000)] = 50
    # the size compaction writes files up to; files this large or larger are left alone
    target_file_size: Annotated[int, BeforeValidator(_byte_size), Field(ge=1024**2, le=16 * 1024**3)] = 128 * 1024**2


class SinkConfig(_Model):
    """Where and how the Delta tables are written."""

    path: Location
    storage_options: Settings = {}
    metadata_columns: Annotated[MetadataColumns | None, BeforeValidator(_metadata_columns)] = None
    source_timezone: Annotated[str, BeforeValidator(_timezone)] = "UTC"
    # how micro-batches are applied: `delta-rs` (rows planned on the driver, written with delta-rs) or
    # `spark` (rules on the executors, Delta Lake's MERGE; ticdc_delta/spark/engine.py)
    engine: Literal["delta-rs", "spark"] = "spark"
    # spark engine: MERGEs of one DDL segment run concurrently, one Spark session per thread
    merge_threads: Annotated[int, BeforeValidator(_no_bool), Field(ge=1, le=64)] = 2
    # spark engine: a table with this many rows in a batch runs its rules in several tasks (key buckets,
    # ticdc_delta/core/key_buckets.py); 0: never
    split_rows: Annotated[int, BeforeValidator(_no_bool), Field(ge=0)] = 4096
    # spark engine: in a batch that applies no DDL, a table with this many rows (new and held) whose rows allow it
    # is converted to its typed columns row by row and collapsed per key by Spark instead of running its
    # rules in Python per table (ticdc_delta/spark/columnar.py); 0: never
    columnar_rows: Annotated[int, BeforeValidator(_no_bool), Field(ge=0)] = 4096
    # spark engine: a MERGE into a table of this many rows or more (its files' statistics) matches only
    # target rows within its source's key range (least-greatest of each integer, decimal or string key
    # column), so Delta skips the files outside it, when those files hold this many rows too; 0: never
    merge_key_range_rows: Annotated[int, BeforeValidator(_no_bool), Field(ge=0)] = 2_000_000
    # spark engine: retries of a MERGE/append that lost to another writer before exit 75
    conflict_retries: Annotated[int, BeforeValidator(_no_bool), Field(ge=0, le=100)] = 5
    # spark engine: MODIFY COLUMN widens in place with Delta type widening (tables get the typeWidening
    # feature, which delta-rs 1.x readers cannot scan) instead of a rewrite
    type_widening: bool = False
    # spark engine: create tables with column mapping `name` (DROP / RENAME COLUMN in place); delta-rs 1.x
    # cannot OPTIMIZE such tables
    column_mapping: bool = True
    # small-file compaction after each micro-batch of the tables it wrote (docs/configuration.md)
    compaction: CompactionConfig = CompactionConfig()
    # Delta table properties of every target table: set when the job creates one, and on an existing one
    # before the job's next write to it when a listed value differs (tables[].table_properties add to them)
    table_properties: Settings = {}

    _SETTING_FIELDS = frozenset({"storage_options"})

    @model_validator(mode="after")
    def _check_engine_options(self) -> "SinkConfig":
        if self.type_widening and self.engine != "spark":
            raise _PathError(("type_widening",), "needs engine: spark (delta-rs cannot write type-widened tables)")
        _check_engine_properties(self.table_properties, self.engine, ("table_properties",))
        return self

    @field_validator("table_properties")
    @classmethod
    def _check_table_properties(cls, value: dict[str, str]) -> dict[str, str]:
        _check_table_properties(value)
        return value

    @field_validator("storage_options")
    @classmethod
    def _check_storage_options(cls, value: dict[str, str]) -> dict[str, str]:
        _check_setting_keys(value)
        return value


# Delta properties delta-rs 1.6.6 cannot parse ("Error parsing property"): a table made with one fails at
# its creation, so the delta-rs engine refuses them when the file is loaded
_DELTA_RS_UNWRITABLE = frozenset(name.lower() for name in (
    "delta.enableRowTracking", "delta.enableInCommitTimestamps", "delta.enableIcebergCompatV2",
    "delta.universalFormat.enabledFormats", "delta.compatibility.symlinkFormatManifest.enabled"))


def _check_engine_properties(value: Mapping[str, str], engine: str, where: tuple[Any, ...]) -> None:
    if engine == "delta-rs":
        for key in value:
            if not key.startswith("delta."):
                raise _PathError((*where, key), "engine delta-rs creates tables with Delta's own properties "
                                                "(delta.*) only: delta-rs refuses any other")
            if key.lower() in _DELTA_RS_UNWRITABLE:
                raise _PathError((*where, key), "engine delta-rs cannot create a table with this property "
                                                "(delta-rs does not know it): use engine spark, or leave it out")


def _pattern_regex(part: str) -> re.Pattern[str]:
    # TiDB compares schema and table names case-insensitively; `*` matches any run of characters
    return re.compile(".*".join(re.escape(p) for p in part.split("*")), re.IGNORECASE | re.DOTALL)


class TableMapping(_Model):
    """One ``tables:`` entry: which source table(s) it covers and where/how they land."""

    source: str
    path: Location | None = None
    key: list[NonEmptyStr] | None = None
    partition_by: list[NonEmptyStr] = []
    enabled: bool = True
    # Delta table properties of this entry's tables, over sink.table_properties
    table_properties: Settings = {}

    _schema_re: re.Pattern[str] = PrivateAttr()
    _table_re: re.Pattern[str] = PrivateAttr()

    @field_validator("source")
    @classmethod
    def _check_source(cls, value: str) -> str:
        schema, sep, table = value.partition(".")
        if not sep or not schema.strip() or not table.strip() or "." in table:
            raise ValueError(
                'expected "schema.table" (a `*` matches any run of characters, e.g. "test.*")'
            )
        # spellings that match nothing TiDB can name, so that an entry (enabled: false, a path) would do nothing
        for part in (schema, table):
            if part != part.rstrip():
                raise ValueError(f"{part!r} ends with a space: names are matched as written, and TiDB's do "
                                 "not end with one")
            if len(part) > 1 and part[0] == part[-1] and part[0] in "`\"'":
                raise ValueError(f"{part!r} is quoted: write the names without quotes (schema.table)")
        return value

    @field_validator("key")
    @classmethod
    def _check_key(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            if not value:
                raise ValueError("must name at least one column (leave it out to use the table's key)")
            _check_unique(value)
        return value

    @field_validator("partition_by")
    @classmethod
    def _check_partition_by(cls, value: list[str]) -> list[str]:
        _check_unique(value)
        return value

    @field_validator("table_properties")
    @classmethod
    def _check_table_properties(cls, value: dict[str, str]) -> dict[str, str]:
        _check_table_properties(value)
        return value

    def model_post_init(self, context: Any, /) -> None:
        schema, _, table = self.source.partition(".")
        self._schema_re = _pattern_regex(schema)
        self._table_re = _pattern_regex(table)

    @property
    def is_wildcard(self) -> bool:
        """Whether ``source`` holds a ``*``."""
        return "*" in self.source

    def matches(self, schema: str, table: str, *, case_sensitive: bool = False) -> bool:
        """Whether this entry covers ``schema.table`` (``*`` wildcards; case-insensitive unless
        ``case_sensitive``)."""
        if case_sensitive:
            want_schema, _, want_table = self.source.partition(".")
            return bool(
                re.fullmatch(_pattern_regex(want_schema).pattern, schema, re.DOTALL)
                and re.fullmatch(_pattern_regex(want_table).pattern, table, re.DOTALL)
            )
        return bool(self._schema_re.fullmatch(schema) and self._table_re.fullmatch(table))


def _check_unique(names: Sequence[str]) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name.lower() in seen:
            raise _PathError((i,), "this column is listed twice")
        seen.add(name.lower())


class DeadLetterConfig(_Model):
    """Where undecodable messages go, or whether they stop the job."""

    path: Location | None = None
    fail_on_error: bool = False


class SparkConfig(_Model):
    """Spark session settings; anything spark-submit sets wins over these."""

    master: NonEmptyStr | None = None
    app_name: NonEmptyStr | None = None
    conf: Settings = {}

    _SETTING_FIELDS = frozenset({"conf"})

    @field_validator("conf")
    @classmethod
    def _check_conf(cls, value: dict[str, str]) -> dict[str, str]:
        _check_setting_keys(value)
        return value


class DDLPolicies(_Model):
    """What to do with each kind of DDL: ``evolve`` (apply it to the Delta table), ``ignore`` (keep the
    table as is and go on) or ``fail`` (stop the job with a terminal error naming the DDL)."""

    create_table: DDLPolicy = "evolve"
    drop_table: DDLPolicy = "ignore"
    truncate_table: DDLPolicy = "evolve"
    rename_table: DDLPolicy = "evolve"
    add_column: DDLPolicy = "evolve"
    drop_column: DDLPolicy = "evolve"
    rename_column: DDLPolicy = "evolve"
    modify_column: DDLPolicy = "evolve"
    set_default: DDLPolicy = "evolve"
    key_change: DDLPolicy = "evolve"
    create_database: DDLPolicy = "evolve"
    drop_database: DDLPolicy = "ignore"
    no_op: DDLPolicy = "ignore"
    partition_data: Literal["fail", "ignore"] = "fail"
    unknown: Literal["fail", "ignore"] = "fail"


def _trigger_interval(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError('expected an interval such as "10 seconds"')
    if isinstance(value, str) and _PLAIN_NUMBER.fullmatch(value):
        value = float(value)  # a number of seconds given as text (an environment variable's value)
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(f"expected a finite number of seconds, got {value}")
        if value < 0:
            raise ValueError("must not be negative")
        # (in plain digits: 1e-07 is no interval Spark or this loader reads)
        text = f"{int(value) if float(value).is_integer() else format(Decimal(repr(value)), 'f')} seconds"
        _interval_seconds(text)
        return text
    if isinstance(value, str):
        _interval_seconds(value)  # raises ValueError when malformed
        return value.strip()
    raise ValueError(f'expected an interval such as "10 seconds", got {_kind(value)}')


_PLAIN_NUMBER = re.compile(r"\s*\d+(?:\.\d+)?\s*")


def _interval_seconds(text: str) -> float:
    body = text.strip().lower()
    if body.startswith("interval "):
        body = body[len("interval ") :].strip()
    total = 0.0
    pos = 0
    for match in _INTERVAL_PART_RE.finditer(body):
        if body[pos : match.start()].strip() or match.group(2) not in _INTERVAL_UNITS:
            break
        total += float(match.group(1)) * _INTERVAL_UNITS[match.group(2)]
        pos = match.end()
    else:
        if pos and not body[pos:].strip():
            return total
    units = ", ".join(_INTERVAL_UNITS)
    raise ValueError(
        f'expected an interval such as "10 seconds" or "1 minute 30 seconds" (units: {units})'
    )


def _log_level(value: Any) -> Any:
    if isinstance(value, str):
        upper = value.strip().upper()
        return "WARNING" if upper == "WARN" else upper
    return value


class JobConfig(_Model):
    """The whole job configuration (one changefeed → Delta tables). Build it with :func:`load_config`."""

    changefeed: str
    source: SourceConfig
    sink: SinkConfig
    tables: list[TableMapping] = []
    dead_letter: DeadLetterConfig = DeadLetterConfig()
    checkpoint: Location
    trigger_interval: Annotated[str, BeforeValidator(_trigger_interval)] = "10 seconds"
    batch_timeout: Annotated[str, BeforeValidator(_trigger_interval)] | None = None
    log_level: Annotated[Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], BeforeValidator(_log_level)] = (
        "INFO"
    )
    spark: SparkConfig = SparkConfig()
    ddl: DDLPolicies = DDLPolicies()
    case_sensitive: bool = False

    @field_validator("changefeed")
    @classmethod
    def _check_changefeed(cls, value: str) -> str:
        if not _NAME_RE.match(value):
            raise ValueError("must be non-empty and hold only letters, digits, '_', '.' and '-'")
        return value

    @field_validator("batch_timeout")
    @classmethod
    def _check_batch_timeout(cls, value: str | None) -> str | None:
        if value is not None and _interval_seconds(value) <= 0:
            raise ValueError("must be longer than 0 (null turns the watchdog off)")
        return value

    @model_validator(mode="after")
    def _check_tables(self) -> "JobConfig":
        seen: dict[str, int] = {}
        for i, mapping in enumerate(self.tables):
            lowered = fold_name(mapping.source, case_sensitive=self.case_sensitive)
            if lowered in seen:
                raise _PathError(("tables", i, "source"), f"already mapped by tables[{seen[lowered]}]")
            seen[lowered] = i
            _check_engine_properties(mapping.table_properties, self.sink.engine, ("tables", i, "table_properties"))
        # the job's own locations and the explicit table locations: a table there would write into the job
        # state, the dead-letter table, Spark's checkpoint, or nest in another table's directory
        own = self._own_locations()
        for what, location in own[1:]:
            if overlaps(self.dead_letter_path, location):
                raise _PathError(("dead_letter", "path"), f"overlaps {what} ({location}): give it a location of its own")
        explicit = [(i, m.path) for i, m in enumerate(self.tables) if m.path]
        for n, (i, path) in enumerate(explicit):
            if holds(path, self.sink.path):
                raise _PathError(("tables", i, "path"), f"is or holds sink.path ({self.sink.path}), where every "
                                 "table without a path of its own lands: give the table a location of its own")
            for what, location in own:
                if overlaps(path, location):
                    raise _PathError(("tables", i, "path"), f"overlaps {what} ({location}): give the table a "
                                     "location of its own")
            for j, other in explicit[:n]:
                # (the same path is allowed: tables merged into one, as a wildcard entry merges shards)
                if path != other and overlaps(path, other):
                    raise _PathError(("tables", i, "path"), f"lies inside or holds tables[{j}].path ({other}): "
                                     "one Delta table cannot hold another")
        return self

    # -- helpers -----------------------------------------------------------------------------------

    @property
    def topics(self) -> list[str]:
        """The Kafka topics to read (``source.topic`` or ``source.topics``)."""
        return self.source.topic_list

    @property
    def dead_letter_path(self) -> str:
        """``dead_letter.path``, by default ``{sink.path}/_ticdc_dead_letter`` (no table location can be
        that: encoded names never start with ``_``, see :mod:`ticdc_delta.locations`)."""
        return self.dead_letter.path or child_location(self.sink.path, DEFAULT_DEAD_LETTER_DIR)

    @property
    def consumer_group_id(self) -> str | None:
        """The Kafka consumer group offsets are committed to, ``None`` when commits are disabled."""
        group = self.source.consumer_group
        if group is False:
            return None
        return group or f"ticdc-delta-{self.changefeed}"

    @property
    def trigger_interval_seconds(self) -> float:
        """``trigger_interval`` in seconds."""
        return _interval_seconds(self.trigger_interval)

    @property
    def batch_timeout_seconds(self) -> float | None:
        """``batch_timeout`` in seconds, ``None`` when the watchdog is off."""
        return None if self.batch_timeout is None else _interval_seconds(self.batch_timeout)

    def table_mapping_for(self, schema: str, table: str) -> TableMapping | None:
        """The ``tables:`` entry for ``schema.table``: the first exact entry, else the first wildcard
        entry that matches (in file order), else ``None``. Names compare case-insensitively, as in TiDB,
        unless ``case_sensitive``."""
        cs = self.case_sensitive
        for mapping in self.tables:
            if not mapping.is_wildcard and mapping.matches(schema, table, case_sensitive=cs):
                return mapping
        for mapping in self.tables:
            if mapping.is_wildcard and mapping.matches(schema, table, case_sensitive=cs):
                return mapping
        return None

    def table_properties_for(self, schema: str, table: str) -> dict[str, str]:
        """The Delta table properties of ``schema.table``: ``sink.table_properties``, then those of its
        ``tables:`` entry over them."""
        mapping = self.table_mapping_for(schema, table)
        return {**self.sink.table_properties, **(mapping.table_properties if mapping is not None else {})}

    def fold_name(self, name: str) -> str:
        """A schema or table name as the job stores it: lower-case unless ``case_sensitive``."""
        return fold_name(name, case_sensitive=self.case_sensitive)

    def explicit_table_path(self, schema: str, table: str) -> str | None:
        """The ``tables[].path`` that places ``schema.table``, or ``None`` when none does."""
        mapping = self.table_mapping_for(schema, table)
        return mapping.path if mapping is not None and mapping.path else None

    def table_path(self, schema: str, table: str) -> str:
        """The Delta table path of ``schema.table``: the mapping's ``path``, else
        ``{sink.path}/{schema}/{table}`` with the names folded (:meth:`fold_name`) and encoded as path
        components (:func:`~ticdc_delta.locations.table_location`: ``a/b`` → ``a@002fb``).

        A default location must not be, hold or lie inside a location configured for something else
        (another table's ``tables[].path``, ``dead_letter.path``, ``checkpoint``): that table would merge
        into, nest in or wrap the other's files.

        Raises:
            IdentifierError: a name no location can hold (empty, NUL, too long once encoded), or a default
                location that overlaps a configured one (the message names both and the fix).
        """
        explicit = self.explicit_table_path(schema, table)
        if explicit is not None:
            return explicit
        location = table_location(self.sink.path, self.fold_name(schema), self.fold_name(table))
        for what, other in self._configured_locations():
            if overlaps(location, other):
                raise IdentifierError(
                    f"table {schema!r}.{table!r} would land at {location}, which overlaps {what} ({other}); "
                    f"give the table its own location with a tables[].path entry, or move {what}"
                )
        return location

    def _own_locations(self) -> list[tuple[str, str]]:
        """The job's own locations: the dead-letter table, then what the checkpoint directory holds — the job
        state, its DDL journal, the spark engine's staging table and Spark's checkpoint (nothing else in it
        is the job's)."""
        return [("dead_letter.path", self.dead_letter_path)] + [
            ("checkpoint", child_location(self.checkpoint, leaf)) for leaf in ("state", "ddl_journal", "staging", "spark")]

    def _configured_locations(self) -> list[tuple[str, str]]:
        """Locations the configuration names for something other than a default table location."""
        return self._own_locations() + [(f"tables[{i}].path", m.path) for i, m in enumerate(self.tables) if m.path]

    def librdkafka_conf(self) -> dict[str, str]:
        """librdkafka settings for a consumer: ``bootstrap.servers`` plus ``source.kafka`` without the
        Kafka Java client's own settings (:func:`librdkafka_settings`)."""
        return {"bootstrap.servers": self.source.bootstrap_servers, **librdkafka_settings(self.source.kafka)}

    def redacted(self) -> dict[str, Any]:
        """The configuration as a plain dict (YAML key names) with every secret replaced by ``"***"``:
        secret keys of ``source.kafka``, ``source.options``, ``source.schema_registry``,
        ``sink.storage_options`` and ``spark.conf``, and credentials inside URLs (the registry's,
        ``upstream``, URL values of those mappings such as ``claim-check-storage-uri``). Safe to log."""
        data = self.model_dump(mode="json", by_alias=True)
        source = data["source"]
        source["kafka"] = _redact_mapping(source["kafka"])
        source["options"] = _redact_mapping(source["options"])
        if source.get("upstream") is not None:
            source["upstream"] = _redact_url(source["upstream"])
        registry = source.get("schema_registry")
        if registry is not None:
            registry = _redact_mapping(registry)
            registry["url"] = _redact_url(registry["url"])
            source["schema_registry"] = registry
        data["sink"]["storage_options"] = _redact_mapping(data["sink"]["storage_options"])
        data["spark"]["conf"] = _redact_mapping(data["spark"]["conf"])
        return data

    def __repr__(self) -> str:
        return f"JobConfig({self.redacted()!r})"

    def __str__(self) -> str:
        return repr(self)


# -- errors ------------------------------------------------------------------------------------------


def _format_path(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _IDENT_PATH_RE.match(str(part)):
            out += f".{part}" if out else str(part)
        else:
            out += f'["{part}"]'
    return out or "(top level)"


def _unwrap(annotation: Any) -> list[Any]:
    """The concrete types an annotation may hold (Annotated/Optional/Union peeled off)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _unwrap(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [t for arg in get_args(annotation) for t in _unwrap(arg)]
    return [annotation]


def _model_at(loc: Sequence[Any]) -> type[BaseModel] | None:
    """The model class found by following ``loc`` from :class:`JobConfig` (for "allowed keys" hints)."""
    current: list[Any] = [JobConfig]
    for part in loc:
        following: list[Any] = []
        for typ in current:
            if isinstance(typ, type) and issubclass(typ, BaseModel):
                for name, field in typ.model_fields.items():
                    if part in (name, field.alias):
                        following.extend(_unwrap(field.annotation))
            elif get_origin(typ) is list and isinstance(part, int):
                following.extend(_unwrap(get_args(typ)[0]))
            elif get_origin(typ) is dict:
                following.extend(_unwrap(get_args(typ)[1]))
        current = following
    for typ in current:
        if isinstance(typ, type) and issubclass(typ, BaseModel):
            return typ
    return None


def _allowed_keys(model: type[BaseModel]) -> str:
    return ", ".join(field.alias or name for name, field in model.model_fields.items())


_MESSAGES = {
    "missing": "required key is missing",
    "dict_type": "expected a mapping (key: value)",
    "model_type": "expected a mapping (key: value)",
    "model_attributes_type": "expected a mapping (key: value)",
    "list_type": "expected a list",
    "string_type": "expected a string",
}


def _problems(exc: ValidationError) -> list[str]:
    """One ``path: message`` line per pydantic error; never quotes the input (it may be a secret)."""
    lines: list[str] = []
    for err in exc.errors(include_input=False, include_url=False):
        loc = list(err["loc"])
        kind = err["type"]
        message = err["msg"]
        is_key = bool(loc) and loc[-1] == "[key]"
        if is_key:
            loc.pop()
        error = (err.get("ctx") or {}).get("error")
        if isinstance(error, _PathError):
            loc.extend(error.subpath)
        if kind in ("value_error", "assertion_error") and error is not None:
            message = str(error)
        elif kind == "extra_forbidden":
            model = _model_at(loc[:-1])
            message = "unknown key" + (f" (expected one of: {_allowed_keys(model)})" if model else "")
        elif kind in _MESSAGES:
            message = _MESSAGES[kind]
        if is_key:
            message = f"invalid key: {message}"
        line = f"{_format_path(loc)}: {message}"
        if line not in lines:
            lines.append(line)
    return lines


def _error(where: str, lines: Sequence[str]) -> ConfigError:
    return ConfigError(f"invalid configuration in {where}:\n" + "\n".join(f"  {line}" for line in lines))


# -- environment substitution ------------------------------------------------------------------------

_REF_RE = re.compile(r"\$\$\{|\$\{([^}]*)\}|\$\{")


def _substitute_text(text: str, env: Mapping[str, str], path: Sequence[Any], problems: list[str]) -> str:
    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == "$${":
            return "${"  # escaped: a literal ${
        if match.group(1) is None:
            problems.append(f"{_format_path(path)}: unclosed ${{ (write $${{ for a literal ${{)")
            return ""
        name, sep, default = match.group(1).partition(":-")
        if not _ENV_NAME_RE.match(name):
            problems.append(
                f"{_format_path(path)}: bad reference ${{{name}...}}; expected ${{NAME}} or ${{NAME:-default}}"
            )
            return ""
        if "${" in default:
            problems.append(f"{_format_path(path)}: nested references are not supported in ${{{name}:-...}}")
            return ""
        value = env.get(name)
        if value is None or (sep and value == ""):
            if sep:
                return default
            problems.append(
                f"{_format_path(path)}: environment variable {name} is not set"
                f" (write ${{{name}:-default}} to give a default)"
            )
            return ""
        return value

    return _REF_RE.sub(replace, text) if "${" in text else text


def _substitute(value: Any, env: Mapping[str, str], path: list[Any], problems: list[str]) -> Any:
    if isinstance(value, str):
        return _substitute_text(value, env, path, problems)
    if isinstance(value, dict):
        return {k: _substitute(v, env, [*path, k], problems) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, env, [*path, i], problems) for i, v in enumerate(value)]
    return value


def substitute_env(data: Any, env: Mapping[str, str] | None = None, *, where: str = "configuration") -> Any:
    """``data`` (parsed YAML) with ``${VAR}`` / ``${VAR:-default}`` in every string value replaced from
    ``env`` (default ``os.environ``). ``:-`` uses the default when the variable is unset or empty;
    ``$${`` is a literal ``${``. Keys are not substituted; substituted text is not parsed again.

    Raises:
        ConfigError: a variable without default is unset, or a reference is malformed; names the YAML
            path and the variable of each (never a value).
    """
    problems: list[str] = []
    out = _substitute(data, os.environ if env is None else env, [], problems)
    if problems:
        raise _error(where, problems)
    return out


# -- loading -----------------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing duplicate keys (PyYAML silently keeps the last one)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # unhashable key: the base class reports it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, f"duplicate key {key!r}", key_node.start_mark
                )
        return super().construct_mapping(node, deep=deep)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
    return str(getattr(exc, "problem", None) or type(exc).__name__)


def config_from_mapping(
    data: Any, env: Mapping[str, str] | None = None, *, where: str = "configuration"
) -> JobConfig:
    """Validate already-parsed YAML (a mapping) after ``${VAR}`` substitution.

    Raises:
        ConfigError: unset variable, unknown key, missing key or bad value; one line per problem, each
            naming its YAML path.
    """
    if not isinstance(data, Mapping):
        raise _error(where, [f"(top level): expected a mapping (key: value lines), got {_kind(data)}"])
    substituted = substitute_env(dict(data), env, where=where)
    try:
        return JobConfig.model_validate(substituted)
    except ValidationError as exc:
        # `from None`: the pydantic error's text quotes input values, which may be secrets
        raise _error(where, _problems(exc)) from None


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> JobConfig:
    """Read, substitute and validate the YAML job configuration at ``path``.

    ``env`` replaces ``os.environ`` for ``${VAR}`` substitution (tests pass their own).

    Raises:
        ConfigError: the file cannot be read, is not valid YAML (line and column given), or holds an
            invalid configuration (every bad value named by its YAML path, e.g.
            ``source.max_offsets_per_trigger: Input should be greater than 0``).
    """
    where = os.fspath(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read configuration file {where}: {exc}") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid configuration in {where}: not valid YAML: {_yaml_problem(exc)}") from None
    if data is None:
        raise _error(where, ["(top level): the file is empty; see docs/configuration.md"])
    return config_from_mapping(data, env, where=where)
