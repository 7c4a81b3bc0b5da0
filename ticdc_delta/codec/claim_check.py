"""TiCDC's ``large-message-handle-option=claim-check``: rows too large for Kafka live in external storage.

What TiCDC does (tiflow ``pkg/sink/codec/open``, ``canal``, ``common.ClaimCheckMessage``):

- The Kafka message carries only a reference: Open Protocol's event key has ``"ccl": "<location>"``
  (the value holds the handle-key columns); Canal-JSON's value is ``{"_tidb": {"claimCheckLocation":
  "<location>"}}`` (newer releases also keep the key columns beside it).
- The object is stored under the changefeed's ``claim-check-storage-uri`` with the location's file name
  (``{schema}-{table}-{commitTs}-{uuid}.json``); the consumer reads ``path.Base(location)`` from *its*
  configured storage, never the location itself (which may name a host the consumer cannot reach).
- The object is the JSON ``{"key": base64, "value": base64}`` of the whole Kafka message that was too large
  (Go marshals ``[]byte`` as base64; Canal-JSON's key is ``null``), its value compressed as every other
  value is (``large-message-handle-compression``). With Canal-JSON's ``claim-check-raw-value=true`` the
  object is the raw (compressed) value itself.

:class:`ClaimCheckStorage` reads objects through ``pyarrow.fs`` (the filesystem layer of the Arrow stack the
job already uses: local paths, ``file://``, ``s3://`` — credentials from the usual AWS environment
variables, an S3-compatible endpoint with ``?endpoint_override=host:port&scheme=http`` —, ``gs://``,
``hdfs://``, ``abfs://``), with bounded retries. A missing object is a :class:`~ticdc_delta.errors.ClaimCheckError`
(decode error: the message goes to the dead-letter table); storage that stays unreachable after the
retries is a :class:`~ticdc_delta.errors.ClaimCheckUnavailableError` (transient: the batch is retried); a URI
pyarrow cannot open at all is a :class:`~ticdc_delta.errors.ConfigError` (terminal: no retry fixes it).
Messages show the URI without its user info and query (:func:`display_storage_uri`), which may hold
credentials.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import posixpath
import time
from typing import Any, Callable, Mapping
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

import orjson

from ..config import is_secret_key
from ..errors import ClaimCheckError, ClaimCheckUnavailableError, ConfigError, preview
from .backoff import retry_with_backoff

__all__ = [
    "STORAGE_OPTION",
    "RAW_VALUE_OPTION",
    "ClaimCheckStorage",
    "check_storage_uri",
    "display_storage_uri",
    "LargeMessagePolicy",
    "large_message_policy",
    "claim_check_file_name",
    "pack_claim_check_message",
    "unpack_claim_check_message",
]

STORAGE_OPTION = "claim-check-storage-uri"
RAW_VALUE_OPTION = "claim-check-raw-value"
HANDLE_OPTION = "large-message-handle-option"
MAX_MESSAGE_BYTES_OPTION = "max-message-bytes"
HANDLE_MODES = ("none", "handle-key-only", "claim-check")
DEFAULT_MAX_MESSAGE_BYTES = 10 * 1024 * 1024  # TiCDC's max-message-bytes default

ATTEMPTS = 4
"""Reads of one object before a storage failure counts as unavailable (missing objects are not retried)."""
BACKOFF_SECONDS = 0.2
"""First pause between attempts; doubled after each."""

#: The URI schemes pyarrow's ``FileSystem.from_uri`` opens (case-sensitive, as there).
STORAGE_SCHEMES = ("file", "local", "s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss")
#: The query parameters ``from_uri`` takes for a scheme (Arrow's ``S3Options::FromUri`` and
#: ``GcsOptions::FromUri``; any other is refused there). Checked offline because ``from_uri`` itself goes to
#: the network (an ``s3://`` URI without ``region`` asks the bucket's region); the other schemes' parameters
#: (Azure's SAS token, HDFS's free-form settings) are left to ``from_uri`` when the storage is opened.
_QUERY_PARAMETERS = {
    "s3": frozenset({"region", "scheme", "endpoint_override", "allow_delayed_open", "allow_bucket_creation",
                     "allow_bucket_deletion", "tls_ca_file_path", "tls_ca_dir_path", "tls_verify_certificates",
                     "smart_defaults"}),
    "gs": frozenset({"location", "scheme", "endpoint_override", "retry_limit_seconds"}),
}
_QUERY_PARAMETERS["gcs"] = _QUERY_PARAMETERS["gs"]


def check_storage_uri(uri: str) -> None:
    """Check a ``claim-check-storage-uri`` without opening it (no network): a local path, or a URI with a
    scheme pyarrow knows and, for ``s3://`` and ``gs://``, only query parameters pyarrow takes.

    Raises:
        ValueError: not so; the message shows the URI only as :func:`display_storage_uri` does.
    """
    if "://" not in uri:
        return
    scheme = uri.partition("://")[0]
    if scheme not in STORAGE_SCHEMES:
        raise ValueError(f"unknown storage scheme {scheme + '://'!r} (expected a path or one of "
                         f"{', '.join(s + '://' for s in STORAGE_SCHEMES)})")
    try:
        query = urlsplit(uri).query
    except ValueError:
        raise ValueError(f"{scheme}:// URI that does not parse (an unbalanced '[' or ']'?)") from None
    allowed = _QUERY_PARAMETERS.get(scheme)
    if allowed is None:
        return
    for name, _value in parse_qsl(query, keep_blank_values=True):
        if name not in allowed:
            raise ValueError(f"{display_storage_uri(uri)}: unknown query parameter {name!r} for {scheme}:// "
                             f"(expected one of: {', '.join(sorted(allowed))})")


def display_storage_uri(uri: str) -> str:
    """``uri`` as messages show it: without user info and query (credentials may be in them)."""
    try:
        return _location_base(uri)
    except ValueError:
        return uri.partition("://")[0] + "://…"


def claim_check_file_name(location: str, protocol: str) -> str:
    """The object name a claim-check ``location`` refers to: its last path component (TiCDC reads
    ``filepath.Split(location)``'s file part from the consumer's own storage).

    Raises:
        ClaimCheckError: no usable file name (empty, ``.``, ``..``, a control character, over 255 bytes: no
            storage holds such an object, so reading it would fail on every retry).
    """
    if type(location) is not str:
        raise ClaimCheckError(protocol, f"claim-check location must be a string, got {preview(location)}")
    name = posixpath.basename(location.replace("\\", "/"))
    if name in ("", ".", ".."):
        raise ClaimCheckError(protocol, f"claim-check location {preview(location)} names no file")
    if any(ord(c) < 32 or ord(c) == 127 for c in name) or len(name.encode("utf-8", "surrogatepass")) > 255:
        raise ClaimCheckError(protocol, f"claim-check location {preview(location)} names no file a storage can "
                                        "hold (a control character, or over 255 bytes)")
    return name


def pack_claim_check_message(key: bytes | None, value: bytes) -> bytes:
    """The object TiCDC stores for a message (``json.Marshal(ClaimCheckMessage{Key, Value})``)."""
    return orjson.dumps({
        "key": None if key is None else base64.b64encode(key).decode("ascii"),
        "value": base64.b64encode(value).decode("ascii"),
    })


def unpack_claim_check_message(data: bytes, protocol: str, name: str) -> tuple[bytes | None, bytes]:
    """``(key, value)`` of a stored claim-check object.

    Raises:
        ClaimCheckError: not the JSON of a ClaimCheckMessage.
    """
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ClaimCheckError(protocol, f"claim-check object {name!r} is not JSON: {exc}") from None
    if type(obj) is not dict or type(obj.get("value")) is not str:
        raise ClaimCheckError(protocol, f'claim-check object {name!r} must be {{"key": ..., "value": base64}}')
    key = obj.get("key")
    if key is not None and type(key) is not str:
        raise ClaimCheckError(protocol, f'claim-check object {name!r}: "key" must be base64 or null')
    try:
        return (None if key is None else base64.b64decode(key, validate=True)), base64.b64decode(
            obj["value"], validate=True)
    except (binascii.Error, ValueError):
        raise ClaimCheckError(protocol, f"claim-check object {name!r}: key or value is not base64") from None


class ClaimCheckStorage:
    """Reads claim-check objects from ``uri`` (a directory: local path, ``file://``, ``s3://``...).

    Picklable (Spark ships decoders to executors); the filesystem is opened lazily on first use.

    Raises:
        ValueError: ``uri`` is empty, or not a storage URI (:func:`check_storage_uri`).
    """

    def __init__(self, uri: str, *, attempts: int = ATTEMPTS, backoff: float = BACKOFF_SECONDS,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if not isinstance(uri, str) or not uri.strip():
            raise ValueError(f"option {STORAGE_OPTION} must be a storage URI, got {uri!r}")
        try:
            check_storage_uri(uri.strip())
        except ValueError as exc:
            raise ValueError(f"option {STORAGE_OPTION}: {exc}") from None
        self.uri = uri.strip()
        self.attempts = max(1, int(attempts))
        self.backoff = float(backoff)
        self._sleep = sleep
        self._fs: Any = None
        self._root = ""
        self._root_made = False

    def __getstate__(self) -> dict[str, Any]:
        return {"uri": self.uri, "attempts": self.attempts, "backoff": self.backoff}

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        self.__init__(state["uri"], attempts=state["attempts"], backoff=state["backoff"])  # type: ignore[misc]

    def _filesystem(self) -> tuple[Any, str]:
        if self._fs is None:
            from pyarrow import fs as pafs

            uri = self.uri
            if "://" not in uri:
                fs, root = pafs.LocalFileSystem(), uri
            else:
                fs, root = pafs.FileSystem.from_uri(uri)
            self._fs, self._root = fs, root.rstrip("/")
        return self._fs, self._root

    def write(self, name: str, data: bytes) -> str:
        """Store ``data`` as object ``name`` (what TiCDC's claim-check writer does); returns its location.
        Bounded attempts as for :meth:`read` (a slow or briefly failing object store).

        Raises:
            OSError: the storage failed on every attempt.
        """
        return retry_with_backoff(lambda: self._write_once(name, data), attempts=self.attempts,
                                  backoff=self.backoff, sleep=self._sleep, retry_on=(OSError,), reset=self._reopen)

    def _reopen(self) -> None:
        self._fs = None  # reopen: a broken connection pool must not stick

    def _write_once(self, name: str, data: bytes) -> str:
        fs, root = self._filesystem()
        if root and not self._root_made:
            fs.create_dir(root, recursive=True)
            self._root_made = True
        with fs.open_output_stream(f"{root}/{name}" if root else name) as stream:
            stream.write(data)
        return f"{_location_base(self.uri)}/{name}"

    def read(self, location: str, protocol: str) -> bytes:
        """The bytes of the object a claim-check ``location`` names.

        Raises:
            ClaimCheckError: the object does not exist (or the location names no file).
            ClaimCheckUnavailableError: the storage failed on every one of the bounded attempts.
            ConfigError: pyarrow cannot open the URI at all (``ArrowInvalid``: a query parameter or value it
                refuses); retrying cannot help.
        """
        name = claim_check_file_name(location, protocol)
        where = display_storage_uri(self.uri)

        def read_once() -> bytes:
            try:
                fs, root = self._filesystem()
            except ValueError as exc:  # pyarrow's ArrowInvalid; a network failure is an OSError, retried
                raise ConfigError(f"option {STORAGE_OPTION}: pyarrow cannot open {where}: "
                                  f"{preview(self._scrub(str(exc)))}") from None
            try:
                with fs.open_input_stream(f"{root}/{name}" if root else name) as stream:
                    return bytes(stream.read())
            except (OSError, ValueError) as exc:  # pyarrow raises OSError for network and permission errors
                if isinstance(exc, FileNotFoundError) or _is_not_found(exc):
                    raise ClaimCheckError(
                        protocol, f"claim-check object {name!r} (location {preview(location)}) is not in {where}"
                    ) from None
                if isinstance(exc, IsADirectoryError) or "is a directory" in str(exc).lower():
                    raise ClaimCheckError(
                        protocol, f"claim-check location {preview(location)} names a directory of {where}, not "
                                  "an object"
                    ) from None
                raise

        try:
            return retry_with_backoff(read_once, attempts=self.attempts, backoff=self.backoff, sleep=self._sleep,
                                      retry_on=(OSError, ValueError), reset=self._reopen)
        except (OSError, ValueError) as exc:
            raise ClaimCheckUnavailableError(
                f"{protocol}: claim-check storage {where} failed {self.attempts} times reading {name!r}: "
                f"{preview(self._scrub(str(exc)))}"
            ) from None

    def _scrub(self, text: str) -> str:
        """``text`` (pyarrow's error message) without the credentials of the URI: the URI itself becomes its
        display form; its user name, password and secret-looking query values (Azure's ``client_secret``, a
        SAS token's ``sig``) are masked."""
        if "://" not in self.uri:
            return text
        text = text.replace(self.uri, display_storage_uri(self.uri))
        try:
            parts = urlsplit(self.uri)
        except ValueError:
            return text
        userinfo = parts.netloc.rpartition("@")[0]
        secrets = {userinfo, *userinfo.split(":", 1),
                   *(v for k, v in parse_qsl(parts.query) if k == "sig" or is_secret_key(k))}
        for secret in sorted({s for s in secrets | {unquote(s) for s in secrets} if len(s) >= 3}, key=len,
                             reverse=True):
            text = text.replace(secret, "***")
        return text


def _location_base(uri: str) -> str:
    """``uri`` as the directory part of a location TiCDC would write: without the query
    (``?endpoint_override=...``) and user info, which are the writer's connection settings, not part of
    the object's name (a reader takes only the file name)."""
    if "://" not in uri:
        return uri.rstrip("/")
    parts = urlsplit(uri)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path.rstrip("/"), "", ""))


def _is_not_found(exc: Exception) -> bool:
    text = str(exc).lower()
    return "not found" in text or "no such file" in text or "does not exist" in text or "nosuchkey" in text


class LargeMessagePolicy:
    """What an encoder does with a row message above ``max-message-bytes`` (the simulator's TiCDC):
    ``none`` (send it anyway), ``handle-key-only`` (send only the handle key, flagged) or ``claim-check``
    (store it in ``claim-check-storage-uri``, send a reference)."""

    def __init__(self, mode: str, max_bytes: int, storage: ClaimCheckStorage | None, raw_value: bool) -> None:
        self.mode = mode
        self.max_bytes = max_bytes
        self.storage = storage
        self.raw_value = raw_value

    def too_large(self, size: int) -> bool:
        return self.mode != "none" and size > self.max_bytes

    def store(self, schema: str, table: str, commit_ts: int | None, data: bytes) -> str:
        """Store a too-large message's object under TiCDC's file name pattern; returns the location."""
        assert self.storage is not None
        digest = hashlib.sha256(data).hexdigest()[:16]  # TiCDC uses a UUID; a digest keeps runs reproducible
        return self.storage.write(f"{schema}-{table}-{commit_ts}-{digest}.json", data)


def large_message_policy(options: Mapping[str, str]) -> LargeMessagePolicy:
    """The :class:`LargeMessagePolicy` of sink-uri ``options``.

    Raises:
        ValueError: an unknown mode, a bad ``max-message-bytes``, or claim-check without a storage URI.
    """
    mode = str(options.get(HANDLE_OPTION, "none") or "none").strip().lower()
    if mode not in HANDLE_MODES:
        raise ValueError(f"option {HANDLE_OPTION} must be one of {', '.join(HANDLE_MODES)}, got {mode!r}")
    try:
        max_bytes = int(options.get(MAX_MESSAGE_BYTES_OPTION, DEFAULT_MAX_MESSAGE_BYTES))
    except ValueError:
        raise ValueError(f"option {MAX_MESSAGE_BYTES_OPTION} must be an integer") from None
    if max_bytes < 1:
        raise ValueError(f"option {MAX_MESSAGE_BYTES_OPTION} must be positive")
    uri = options.get(STORAGE_OPTION)
    if mode == "claim-check" and not uri:
        raise ValueError(f"{HANDLE_OPTION}=claim-check needs {STORAGE_OPTION}")
    raw = str(options.get(RAW_VALUE_OPTION, "false")).strip().lower() in ("true", "1", "yes", "on")
    return LargeMessagePolicy(mode, max_bytes, ClaimCheckStorage(uri) if mode == "claim-check" and uri else None, raw)
