"""Where things live: TiDB schema and table names as Delta table locations, and nothing outside its root.

One encoding maps an identifier to one path component and back (:func:`encode_component`,
:func:`decode_component`); every reader and writer of table locations goes through
:func:`table_location`, which also checks that the result is inside its root (:func:`check_inside`).

**The encoding.** A component keeps ASCII letters, digits, ``_``, ``-`` and ``.`` as they are, except a
leading ``.`` or ``_``; every other character — ``/``, ``\\``, ``%``, ``:``, spaces, control characters,
non-ASCII, and the escape character ``@`` itself — becomes ``@`` and four lower-case hex digits of its
code point (``a/b`` → ``a@002fb``, ``..`` → ``@002e.``), or ``@u`` and six hex digits above U+FFFF. It is
MySQL's own scheme for file names ("Mapping of Identifiers to File Names"), which also keeps names of
letters, digits and ``_`` unchanged. ``@`` rather than ``%``: delta-rs decodes ``%`` escapes in local
paths and object stores URL-encode them, so ``%2F`` would not survive; ``@`` means nothing to delta-rs,
S3/GCS/ADLS keys or Hadoop paths. Escaping a leading ``.`` or ``_`` keeps table locations apart from the
hidden and reserved names a lake holds (``_delta_log``, ``_ticdc_dead_letter``; Hadoop and Spark skip
``_``/``.``-prefixed entries when listing). The encoding is injective and :func:`decode_component` is its
exact inverse on every component it produces (anything else is refused).

**Names no location can hold** raise :class:`~ticdc_delta.errors.IdentifierError`: the empty name, NUL
(MySQL and TiDB refuse it in identifiers too), unpaired surrogates (not text), and names longer than
:data:`MAX_COMPONENT_BYTES` once encoded (the file-name limit of common file systems).

**Case.** TiDB compares schema and table names case-insensitively (``lower_case_table_names = 2``); a
changefeed's ``case-sensitive`` setting decides how its filters compare them. :func:`fold_name` is the
one rule: lower-case unless ``case_sensitive``. The caller applies it where names enter the job; the
lower-case spelling then names the Delta directory. Lower case is Python's :meth:`str.lower`, which differs
from TiDB's (:func:`tidb_lower`) only for a capital Σ ending a word and for İ: the tables and job states of
earlier versions are keyed by it, and a table whose folded name changed would be started anew elsewhere.

**Local or not.** :func:`file_path` turns a ``file:`` URL into the local path it names and
:func:`local_path` tells a local location from an object-store URI: the one reading of a location that
the config, the sink, the checkpoint and ``reset`` share.

Plain Python (no pyspark, no delta-rs): the config, the planner and the executors use it.
"""

from __future__ import annotations

import functools
import os
import re
from urllib.parse import unquote

from .errors import IdentifierError

__all__ = [
    "ESCAPE",
    "MAX_COMPONENT_BYTES",
    "tidb_lower",
    "fold_name",
    "check_name",
    "table_name_problem",
    "encode_component",
    "decode_component",
    "table_location",
    "child_location",
    "check_inside",
    "overlaps",
    "holds",
    "file_path",
    "local_path",
]

ESCAPE = "@"
MAX_COMPONENT_BYTES = 255
"""Longest path component (bytes) a location may have: NAME_MAX of ext4/xfs/APFS/NTFS, S3 is laxer."""

_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
_NOT_FIRST = frozenset("._")
_ESCAPED_RE = re.compile(r"@(?:u([0-9a-f]{6})|([0-9a-f]{4}))")
_SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_QUOTE_LIMIT = 80


def file_path(location: str) -> str:
    """``location`` with a ``file:`` URL written as the local path it names, anything else as it is.

    Hadoop writes ``file:/x``, others ``file:///x`` or ``file://localhost/x``, percent-encoded; all
    three name ``/x``.

    Raises:
        ValueError: a ``file:`` URL of another host (not a file of this machine) or with a relative path.
    """
    if location[:5].lower() != "file:":
        return location
    rest = location[5:]
    if rest.startswith("//"):
        host, slash, path = rest[2:].partition("/")
        if host.lower() not in ("", "localhost"):
            raise ValueError(f"a file: URL names a file of this machine, not of host {host!r}")
        rest = slash + path
    if not rest.startswith("/"):
        raise ValueError("a file: URL needs an absolute path (file:///x); write a relative path without file:")
    return unquote(rest)


def local_path(location: str) -> str | None:
    """The filesystem path of a local location (a path or a ``file:`` URL), ``None`` for an
    object-store or other URI (``s3://``, ``abfss://``...).

    Raises:
        ValueError: a ``file:`` URL :func:`file_path` refuses.
    """
    path = file_path(location)
    return None if _SCHEME_RE.match(path) else path


def _shown(name: str) -> str:
    """``name`` quoted for an error message, cut short (names can be arbitrarily long)."""
    return repr(name if len(name) <= _QUOTE_LIMIT else name[:_QUOTE_LIMIT] + "...")


class _RuneLower(dict[int, str]):
    """Code point → Go's ``unicode.ToLower`` of it, for :meth:`str.translate`; filled as characters are
    first seen.

    Go maps each code point to one code point by the simple case mapping of UnicodeData.txt. Python's
    single-character :meth:`str.lower` gives the same for every code point but U+0130 ``İ``, whose full
    mapping (SpecialCasing.txt) is ``i`` + U+0307 COMBINING DOT ABOVE and whose simple one is ``i``
    (checked over all code points against Go 1.26, Unicode 15.0; Python's tables are Unicode 14.0, which
    has the same case pairs). Lowering one character at a time also leaves out Python's context rule
    (Final_Sigma: ``Σ`` at a word's end → ``ς``) that Go does not have.
    """

    def __missing__(self, code: int) -> str:
        lower = self[code] = "i" if code == 0x130 else chr(code).lower()
        return lower


_RUNE_LOWER = _RuneLower()


def tidb_lower(name: str) -> str:
    """``name`` in lower case as TiDB lower-cases identifiers to compare them (``model.CIStr.L``: Go's
    ``strings.ToLower``, one code point for one). Python's :meth:`str.lower` differs outside ASCII:
    ``ΟΔΟΣ`` → ``οδος`` where TiDB gives ``οδοσ`` (so it would take TiDB's two tables ``ΟΔΟΣ`` and
    ``οδος`` for one), ``İ`` → two code points; :meth:`str.casefold` differs further (``ß`` → ``ss``)."""
    # ASCII names (nearly all, and folded for every batch) are lowered alike by both, and fast
    return name.lower() if name.isascii() else name.translate(_RUNE_LOWER)


def fold_name(name: str, *, case_sensitive: bool = False) -> str:
    """A schema or table name as the job compares and stores it: lower-case unless ``case_sensitive``.

    Python's lower case, not TiDB's (:func:`tidb_lower`): the two differ only where a capital Σ ends a word
    (``ΟΔΟΣ`` → ``οδος``, TiDB ``οδοσ``) and for ``İ``, and the Delta tables and job states that earlier
    versions wrote are keyed by Python's — folded anew, such a table's rows would go to a new table. So
    TiDB's tables ``ΟΔΟΣ`` and ``οδος`` land in one Delta table (a documented limitation)."""
    return name if case_sensitive else name.lower()


def _escape(c: str) -> str:
    code = ord(c)
    return f"{ESCAPE}{code:04x}" if code <= 0xFFFF else f"{ESCAPE}u{code:06x}"


def _encode(name: str) -> str:
    out = []
    for i, c in enumerate(name):
        if c in _SAFE and not (i == 0 and c in _NOT_FIRST):
            out.append(c)
        else:
            out.append(_escape(c))
    return "".join(out)


def check_name(name: str, what: str = "name") -> str:
    """``name``'s path component (see :func:`encode_component`), or why no location can hold it.

    Raises:
        IdentifierError: ``name`` is empty, holds NUL or an unpaired surrogate, or is longer than
            :data:`MAX_COMPONENT_BYTES` once encoded; the message says which and names ``what``.
    """
    if not isinstance(name, str):
        raise TypeError(f"{what} must be str, not {type(name).__name__}")
    if not name:
        raise IdentifierError(f"{what} is empty: an empty name has no Delta location")
    if "\x00" in name:
        raise IdentifierError(f"{what} {_shown(name)} holds NUL, which no identifier or location may hold")
    if any("\ud800" <= c <= "\udfff" for c in name):
        raise IdentifierError(f"{what} {_shown(name)} holds an unpaired surrogate: it is not valid text")
    encoded = _encode(name)
    if len(encoded) > MAX_COMPONENT_BYTES:
        raise IdentifierError(
            f"{what} {_shown(name)} needs {len(encoded)} bytes as a path component; "
            f"at most {MAX_COMPONENT_BYTES} fit"
        )
    return encoded


def table_name_problem(schema: str, table: str) -> str | None:
    """Why no location can hold table ``schema.table`` (in either case folding), or ``None`` when one
    can. Cached: it runs once per row event on the executors, where the same names repeat. Names too long
    for any location are answered without the cache, which holds its entries in Spark's reused Python
    workers for their lifetime: 4,096 names of 64 KiB each (corrupt or hostile input) held 258 MiB."""
    if not isinstance(schema, str) or not isinstance(table, str):
        return f"table {schema!r}.{table!r}: schema and table names must be text"
    if len(schema) > MAX_COMPONENT_BYTES or len(table) > MAX_COMPONENT_BYTES:  # (no character encodes shorter)
        return _table_name_problem(schema, table)
    return _cached_table_name_problem(schema, table)


def _table_name_problem(schema: str, table: str) -> str | None:
    try:
        for s, t in {(schema, table), (schema.lower(), table.lower())}:
            table_location("/", s, t)
    except IdentifierError as exc:
        return str(exc)
    return None


_cached_table_name_problem = functools.lru_cache(maxsize=4096)(_table_name_problem)


def encode_component(name: str) -> str:
    """``name`` as one path component: the same name always gives the same component, distinct names
    give distinct components, and the component is never empty, ``.``, ``..``, nor starts with ``.``/``_``.

    Raises:
        IdentifierError: a name no location can hold (see :func:`check_name`).
    """
    return check_name(name)


def decode_component(component: str) -> str:
    """The name :func:`encode_component` turned into ``component``.

    Raises:
        ValueError: ``component`` is not something :func:`encode_component` produces (a directory the
            job did not create, or one from another encoding).
    """

    def unescape(m: re.Match[str]) -> str:
        code = int(m.group(1) or m.group(2), 16)
        if code > 0x10FFFF:
            raise ValueError(f"{component!r}: escape {m.group(0)} is not a code point")
        return chr(code)

    try:
        name = _ESCAPED_RE.sub(unescape, component)
        again = encode_component(name)
    except (IdentifierError, ValueError) as exc:
        raise ValueError(f"{component!r} is not an encoded schema or table name: {exc}") from None
    if again != component:
        raise ValueError(f"{component!r} is not an encoded schema or table name (it would be {again!r})")
    return name


def _split(location: str) -> tuple[str, list[str]]:
    """``(scheme://authority or "" or "/", path components)`` of a local path or object-store URI."""
    match = _SCHEME_RE.match(location)
    if match:
        rest = location[match.end() :]
        authority, _, path = rest.partition("/")
        prefix = match.group(0) + authority
        parts = path.split("/")
    else:
        prefix = "/" if location.startswith("/") else ""
        parts = location.split("/")
    return prefix, [p for p in parts if p not in ("", ".")]


def check_inside(root: str, location: str) -> str:
    """``location``, after checking it lies strictly below ``root``: same scheme and bucket, the root's
    own components first, then at least one more, none of them ``..`` or holding ``\\`` or NUL. (The
    root is the operator's and may itself hold ``..``, e.g. ``../lake``.)

    Raises:
        IdentifierError: ``location`` is not inside ``root``.
    """
    root_prefix, root_parts = _split(root)
    prefix, parts = _split(location)
    below = parts[len(root_parts) :]
    if (
        prefix != root_prefix
        or parts[: len(root_parts)] != root_parts
        or not below
        or any(p == ".." or "\\" in p or "\x00" in p for p in below)
    ):
        raise IdentifierError(f"location {location!r} is not inside its root {root!r}; refusing to use it")
    return location


def _absolute(location: str) -> tuple[str, list[str]]:
    prefix, parts = _split(location)
    if not prefix:  # a relative local path: compare it as the absolute path it means
        prefix, parts = _split(os.path.abspath(location))
    return prefix, parts


def overlaps(a: str, b: str) -> bool:
    """Whether locations ``a`` and ``b`` are the same or one lies inside the other (so a Delta table at
    one would share, nest in or hold the files of whatever lives at the other)."""
    prefix_a, parts_a = _absolute(a)
    prefix_b, parts_b = _absolute(b)
    n = min(len(parts_a), len(parts_b))
    return prefix_a == prefix_b and parts_a[:n] == parts_b[:n]


def holds(outer: str, inner: str) -> bool:
    """Whether location ``outer`` is ``inner`` or holds it."""
    prefix_o, parts_o = _absolute(outer)
    prefix_i, parts_i = _absolute(inner)
    return prefix_o == prefix_i and parts_i[: len(parts_o)] == parts_o


def table_location(root: str, schema: str, table: str) -> str:
    """``{root}/{schema}/{table}`` with both names through :func:`encode_component`, checked to be
    inside ``root``.

    Raises:
        IdentifierError: a name no location can hold (the message names the schema and table).
    """
    try:
        components = (check_name(schema, "schema name"), check_name(table, "table name"))
    except IdentifierError as exc:
        raise IdentifierError(f"table {_shown(schema)}.{_shown(table)}: {exc}") from None
    return child_location(root, *components)


def child_location(root: str, *components: str) -> str:
    """``root`` joined with fixed, already safe components (``state``, ``_ticdc_dead_letter``), checked
    to be inside ``root``.

    Raises:
        IdentifierError: a component is empty, ``.``/``..`` or holds a separator.
    """
    for c in components:
        if not c or c in (".", "..") or "/" in c or "\\" in c:
            raise IdentifierError(f"{c!r} cannot be a path component under {root!r}")
    return check_inside(root, "/".join([root.rstrip("/"), *components]))
