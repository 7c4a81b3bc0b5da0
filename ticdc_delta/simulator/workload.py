"""The upstream side of the simulation: TiDB tables, transactions, DDL and the true table state.

A :class:`Workload` plays a TiDB cluster. It creates schemas and tables with ``CREATE DATABASE`` /
``CREATE TABLE`` DDL, runs transactions that insert, update and delete rows across several tables, adds
columns with ``ALTER TABLE ... ADD COLUMN`` mid-stream and keeps the true state of every table — the
oracle a correct consumer must reproduce. It yields :class:`Commit` objects in commit-ts order; what
TiCDC makes of them (partitions, resolved ts, duplicates) is :mod:`.stream`'s business.

Rules it follows, and why:

- Commit ts are TSOs, ``physical_ms << 18 | logical`` (TiDB's PD), strictly increasing; a DDL gets a ts
  of its own, never shared with DML (TiDB runs DDL in its own transaction).
- A transaction changes each row at most once. TiCDC sends one event per row per transaction (TiKV keeps
  one version per key and commit ts), so several statements on one row are already merged upstream; the
  workload simply never touches a key twice in one transaction (also counting both keys of a
  primary-key change).
- An update that changes the primary key becomes DELETE(old key) + INSERT(new key) with the same commit
  ts, deletes first: TiCDC's default for MQ sinks splits such updates so that each half is dispatched
  by its own key (TiCDC docs, "Split primary or unique key UPDATE events").
- Row images carry every column of the table as it is at the commit; a row written before an
  ``ADD COLUMN`` reads NULL for the new column (no DEFAULT in the DDL), as TiDB's row decoder fills it.

Values are the event model's canonical Python values (:mod:`ticdc_delta.codec.model`): ENUM is the
1-based member index here; a protocol that sends labels (Avro) maps it at rendering time.

Everything is drawn from one :class:`random.Random` seeded from the simulation seed, so the same seed
gives the same commits. The live rows of a table are capped (``max_rows_per_table``) so memory stays
bounded however many events are generated.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, NamedTuple, Sequence

from ..codec.model import Column, ColumnFlag, DDLEvent, DDLType, Op, RowChange, TypeCode, column_flag, format_vector

__all__ = [
    "ColumnSpec",
    "TableSpec",
    "TableState",
    "Commit",
    "TsoClock",
    "Workload",
    "WorkloadCounts",
    "compose_tso",
    "TABLE_TEMPLATES",
]

_U64_MAX = (1 << 64) - 1
_KEY_FLAGS = ColumnFlag.HANDLE_KEY | ColumnFlag.PRIMARY_KEY


def compose_tso(physical_ms: int, logical: int) -> int:
    """A TiDB TSO: milliseconds since the epoch shifted by 18 bits, plus the logical counter."""
    return (physical_ms << 18) | logical



def _ri(rng: random.Random, lo: int, hi: int) -> int:
    """A random int in [lo, hi] for spans below 2**52 (several times faster than ``randint``)."""
    return lo + int(rng.random() * (hi - lo + 1))


def _wide(rng: random.Random, lo: int, hi: int) -> int:
    """A random int in [lo, hi] for any span (a negligible modulo bias is fine for test data)."""
    span = hi - lo + 1
    return lo + rng.getrandbits(span.bit_length() + 16) % span


class TsoClock:
    """PD's timestamp oracle in miniature: strictly increasing TSOs with a drifting physical part."""

    # 2023-11-14 22:13:20 UTC: a realistic physical part (TiCDC's commit ts are ~4.5e17)
    START_MS = 1_700_000_000_000

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._physical = self.START_MS
        self._logical = 0
        self.last = 0

    def next(self) -> int:
        """Allocate the next TSO (greater than every one allocated before)."""
        rng = self._rng
        if rng.random() < 0.6:
            self._physical += _ri(rng, 1, 40)
            self._logical = _ri(rng, 0, 3)
        else:
            self._logical += _ri(rng, 1, 5)
        ts = compose_tso(self._physical, self._logical)
        self.last = ts
        return ts


# --------------------------------------------------------------------------------------------------
# Value generators: each returns the canonical Python value TiDB would print / TiCDC would carry.

Gen = Callable[[random.Random], Any]

_TEXT_PIECES = (
    "a", "b", "xyz", "hello", "TiDB", " ", "测试", "数据", "Ünïcödé", "ß", "é", "😀", "🚀", "'", '"', "\\",
    "\n", "\t", "<&>", "0", "42", "null", "—", "ж", "ק",
)


def _text(max_chars: int, *, allow_empty: bool = True, pieces: Sequence[str] = _TEXT_PIECES) -> Gen:
    pieces = tuple(pieces)
    # pieces average ~2.5 characters; draw about enough for a random length up to max_chars
    most = max(1, max_chars // 2)

    def gen(rng: random.Random) -> str:
        if allow_empty and rng.random() < 0.05:
            return ""
        text = "".join(rng.choices(pieces, k=_ri(rng, 1, most)))[:max_chars]
        return text or "x"

    return gen


def _char(max_chars: int) -> Gen:
    # TiDB strips trailing spaces from CHAR(n) values when reading them (PAD CHAR semantics), so a
    # generated CHAR value never ends with one.
    base = _text(max_chars, pieces=tuple(p for p in _TEXT_PIECES if p not in (" ", "\n", "\t")))
    return lambda rng: base(rng).rstrip(" ")


def _bytes(max_len: int) -> Gen:
    def gen(rng: random.Random) -> bytes:
        r = rng.random()
        if r < 0.05:
            return b""
        if r < 0.15:
            return b"\x89PNG\r\n\x1a\n\x00\xff"[: max_len]
        return rng.randbytes(_ri(rng, 1, max_len))

    return gen


def _int(lo: int, hi: int, edges: Sequence[int] = ()) -> Gen:
    edges = tuple(edges) or (lo, hi, 0 if lo <= 0 <= hi else lo)
    pick = _ri if hi - lo < (1 << 52) else _wide

    def gen(rng: random.Random) -> int:
        if rng.random() < 0.1:
            return rng.choice(edges)
        return pick(rng, lo, hi)

    return gen


def _near_u64_max(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.5:
        return _U64_MAX - _ri(rng, 0, 1000)
    if r < 0.6:
        return 0
    return _wide(rng, 1 << 63, _U64_MAX)


def _double(rng: random.Random) -> float:
    r = rng.random()
    if r < 0.05:
        return rng.choice((0.0, 1e300, -2.5e-300, 1.7976931348623157e308, 5e-324, 0.1, -1.0))
    # shortest-repr friendly: a few decimals (every wire prints doubles as shortest round-trip text)
    return round(rng.uniform(-1e6, 1e6), _ri(rng, 0, 6))


def _float32(rng: random.Random) -> float:
    # FLOAT is single precision upstream; TiCDC widens it to float64. Quarter steps are exact in both.
    return _ri(rng, -4_000_000, 4_000_000) / 4


def _decimal(precision: int, scale: int) -> Gen:
    int_digits = precision - scale

    def gen(rng: random.Random) -> str:
        # TiDB prints DECIMAL(p, s) with exactly s fraction digits, no leading zeros, "-" for negatives
        # and never "-0" (a zero is "0.000").
        r = rng.random()
        if r < 0.05:
            ip, fp = 0, 0
        elif r < 0.1:
            ip, fp = 10**int_digits - 1, 10**scale - 1  # the maximum the column holds
        else:
            ip = _wide(rng, 0, 10 ** _ri(rng, 0, int_digits) - 1) if int_digits else 0
            fp = _wide(rng, 0, 10**scale - 1) if scale else 0
        neg = rng.random() < 0.3 and (ip or fp)
        text = str(ip) + ("." + str(fp).zfill(scale) if scale else "")
        return "-" + text if neg else text

    return gen


def _date(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.05:
        return rng.choice(("1000-01-01", "9999-12-31", "1970-01-01", "2000-02-29"))
    y, m = _ri(rng, 1000, 9999), _ri(rng, 1, 12)
    return f"{y:04d}-{m:02d}-{_ri(rng, 1, 28):02d}"


def _clock(rng: random.Random) -> str:
    return f"{_ri(rng, 0, 23):02d}:{_ri(rng, 0, 59):02d}:{_ri(rng, 0, 59):02d}"


def _datetime(fsp: int) -> Gen:
    def gen(rng: random.Random) -> str:
        text = f"{_date(rng)} {_clock(rng)}"
        if fsp:
            # TiDB prints exactly fsp fraction digits for DATETIME(fsp)
            text += "." + str(_ri(rng, 0, 10**fsp - 1)).zfill(fsp)
        return text

    return gen


def _timestamp(rng: random.Random) -> str:
    # TIMESTAMP's range: 1970-01-01 00:00:01 .. 2038-01-19 03:14:07 UTC (TiCDC prints it in UTC here)
    if rng.random() < 0.05:
        return rng.choice(("1970-01-01 00:00:01", "2038-01-19 03:14:07"))
    return f"{_ri(rng, 1971, 2037):04d}-{_ri(rng, 1, 12):02d}-{_ri(rng, 1, 28):02d} {_clock(rng)}"


def _json_text(rng: random.Random) -> str:
    # TiDB prints JSON with ", " and ": " separators and object keys sorted by length, then bytes.
    def scalar() -> str:
        r = rng.random()
        if r < 0.3:
            return str(_ri(rng, -1000, 1000))
        if r < 0.5:
            return rng.choice(("true", "false", "null"))
        s = _text(8)(rng).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
        return f'"{s}"'

    keys = sorted(set(rng.sample(("a", "id", "tag", "name", "list", "ünï", "k1", "k2"), _ri(rng, 0, 4))),
                  key=lambda k: (len(k.encode()), k.encode()))
    parts = []
    for k in keys:
        v = "[" + ", ".join(scalar() for _ in range(_ri(rng, 0, 3))) + "]" if k == "list" else scalar()
        parts.append(f'"{k}": {v}')
    if rng.random() < 0.1:
        return "[" + ", ".join(scalar() for _ in range(_ri(rng, 0, 3))) + "]"
    return "{" + ", ".join(parts) + "}"


def _vector(dims: int | None) -> Gen:
    # TiDB 8.4+ VECTOR(N) / VECTOR: float32 elements printed as TiDB prints them ("[1,-0.5,2.125]");
    # eighths are exact in float32, so the text survives the Delta array<float> round trip exactly.
    def gen(rng: random.Random) -> str:
        n = dims if dims is not None else _ri(rng, 0, 5)
        return format_vector([_ri(rng, -512, 512) / 8 for _ in range(n)])

    return gen


def _enum(n: int) -> Gen:
    return lambda rng: _ri(rng, 1, n)


def _year(rng: random.Random) -> int:
    return _ri(rng, 1901, 2155)


# --------------------------------------------------------------------------------------------------
# Table model


@dataclass(frozen=True)
class ColumnSpec:
    """One column of an upstream table: its DDL text, TiCDC type code, flags and value generator."""

    name: str
    sql_type: str
    """The MySQL type as written in the DDL, e.g. ``DECIMAL(20,6)``, ``BIGINT UNSIGNED``."""
    type_code: int
    flags: ColumnFlag
    gen: Gen = field(compare=False, repr=False)
    precision: int | None = None
    scale: int | None = None
    enum_members: tuple[str, ...] | None = None

    @property
    def nullable(self) -> bool:
        return bool(int(self.flags) & ColumnFlag.NULLABLE.value)

    @property
    def is_key(self) -> bool:
        return bool(int(self.flags) & ColumnFlag.HANDLE_KEY.value)

    @property
    def mysql_type(self) -> str:
        """The type as TiDB reports it in lower case (``decimal(20,6)``, ``bigint unsigned``)."""
        return self.sql_type.lower()

    def ddl(self) -> str:
        """The column definition inside CREATE TABLE / ADD COLUMN."""
        return f"`{self.name}` {self.sql_type} {'NULL' if self.nullable else 'NOT NULL'}"

    def as_key(self) -> "ColumnSpec":
        """This column as a primary-key column (NOT NULL, handle key)."""
        flags = (self.flags & ~ColumnFlag.NULLABLE) | _KEY_FLAGS
        return ColumnSpec(self.name, self.sql_type, self.type_code, column_flag(int(flags)), self.gen,
                          self.precision, self.scale, self.enum_members)


def _col(name: str, sql_type: str, code: TypeCode, gen: Gen, *, nullable: bool = True, unsigned: bool = False,
         binary: bool = False, precision: int | None = None, scale: int | None = None,
         members: tuple[str, ...] | None = None) -> ColumnSpec:
    flags = 0
    if nullable:
        flags |= ColumnFlag.NULLABLE
    if unsigned:
        flags |= ColumnFlag.UNSIGNED
    if binary:
        flags |= ColumnFlag.BINARY
    return ColumnSpec(name, sql_type, int(code), column_flag(int(flags)), gen, precision, scale, members)


T = TypeCode
_STATUS = ("new", "paid", "shipped", "cancelled")
_MOODS = ("ünï", "b", "c d", "it's")
_XY = ("x", "y")
_SWITCH = ("on", "off")


def _template_orders() -> list[ColumnSpec]:
    return [
        _col("id", "BIGINT", T.BIGINT, _int(-(1 << 63), (1 << 63) - 1)).as_key(),
        _col("c_tinyint", "TINYINT", T.TINYINT, _int(-128, 127)),
        _col("c_smallint_u", "SMALLINT UNSIGNED", T.SMALLINT, _int(0, 65535), unsigned=True),
        _col("c_mediumint", "MEDIUMINT", T.MEDIUMINT, _int(-8388608, 8388607)),
        _col("c_int", "INT", T.INT, _int(-2147483648, 2147483647)),
        _col("c_bigint_u", "BIGINT UNSIGNED", T.BIGINT, _near_u64_max, unsigned=True),
        _col("c_double", "DOUBLE", T.DOUBLE, _double),
        _col("c_float", "FLOAT", T.FLOAT, _float32),
        _col("c_decimal", "DECIMAL(20,6)", T.DECIMAL, _decimal(20, 6), precision=20, scale=6),
        _col("c_date", "DATE", T.DATE, _date),
        _col("c_datetime", "DATETIME", T.DATETIME, _datetime(0)),
        _col("c_timestamp", "TIMESTAMP", T.TIMESTAMP, _timestamp),
        _col("c_varchar", "VARCHAR(64)", T.VARCHAR, _text(64)),
        _col("c_text", "TEXT", T.BLOB, _text(200)),
        _col("c_blob", "BLOB", T.BLOB, _bytes(64), binary=True),
        _col("c_varbinary", "VARBINARY(32)", T.VARCHAR, _bytes(32), binary=True),
        _col("c_json", "JSON", T.JSON, _json_text),
        _col("c_enum", "ENUM('new','paid','shipped','cancelled')", T.ENUM, _enum(len(_STATUS)), members=_STATUS),
        _col("c_year", "YEAR", T.YEAR, _year, unsigned=True),
    ]


_REGIONS = ("eu", "us-west", "北京", "Zürich", "o'hare", "são paulo", "x", "🚀")


def _template_ledger() -> list[ColumnSpec]:
    return [
        _col("region", "VARCHAR(16)", T.VARCHAR, lambda rng: rng.choice(_REGIONS)).as_key(),
        _col("seq", "INT UNSIGNED", T.INT, _int(0, 4294967295), unsigned=True).as_key(),
        _col("amount", "DECIMAL(10,0)", T.DECIMAL, _decimal(10, 0), nullable=False, precision=10, scale=0),
        _col("price", "DECIMAL(38,10)", T.DECIMAL, _decimal(38, 10), precision=38, scale=10),
        _col("note", "VARCHAR(255)", T.VARCHAR, _text(255)),
        _col("mood", "ENUM('ünï','b','c d','it''s')", T.ENUM, _enum(len(_MOODS)), members=_MOODS),
        _col("updated", "DATETIME(6)", T.DATETIME, _datetime(6)),
        _col("flag", "TINYINT UNSIGNED", T.TINYINT, _int(0, 255), unsigned=True),
        _col("doc", "JSON", T.JSON, _json_text),
        _col("code", "CHAR(8)", T.STRING, _char(8)),
    ]


def _template_wide_keys() -> list[ColumnSpec]:
    return [
        _col("id", "BIGINT UNSIGNED", T.BIGINT, _near_u64_max, unsigned=True).as_key(),
        _col("c_int_u", "INT UNSIGNED", T.INT, _int(0, 4294967295), unsigned=True),
        _col("c_bigint", "BIGINT", T.BIGINT, _int(-(1 << 63), (1 << 63) - 1)),
        _col("c_double", "DOUBLE", T.DOUBLE, _double, nullable=False),
        _col("c_mediumtext", "MEDIUMTEXT", T.MEDIUMBLOB, _text(300)),
        _col("c_longblob", "LONGBLOB", T.LONGBLOB, _bytes(128), binary=True),
        _col("c_date", "DATE", T.DATE, _date),
        _col("c_year", "YEAR", T.YEAR, _year, unsigned=True),
        _col("c_enum", "ENUM('x','y')", T.ENUM, _enum(len(_XY)), members=_XY),
    ]


def _template_embeddings() -> list[ColumnSpec]:
    return [
        _col("id", "BIGINT", T.BIGINT, _int(-(1 << 63), (1 << 63) - 1)).as_key(),
        _col("label", "VARCHAR(32)", T.VARCHAR, _text(32)),
        _col("emb", "VECTOR(3)", T.VECTOR_FLOAT32, _vector(3)),
        _col("any_dims", "VECTOR", T.VECTOR_FLOAT32, _vector(None)),
    ]


TABLE_TEMPLATES: tuple[Callable[[], list[ColumnSpec]], ...] = (_template_orders, _template_ledger,
                                                               _template_wide_keys, _template_embeddings)
"""Column layouts, used round-robin: single signed BIGINT key; composite (unicode VARCHAR, INT UNSIGNED)
key; BIGINT UNSIGNED key near 2**64-1; BIGINT key with TiDB 8.4+ VECTOR columns."""

# Columns that ALTER TABLE ... ADD COLUMN adds (nullable, no DEFAULT: earlier rows read NULL).
_ADDED_COLUMNS: tuple[Callable[[int], ColumnSpec], ...] = (
    lambda n: _col(f"added_{n}_varchar", "VARCHAR(32)", T.VARCHAR, _text(32)),
    lambda n: _col(f"added_{n}_int", "INT", T.INT, _int(-2147483648, 2147483647)),
    lambda n: _col(f"added_{n}_decimal", "DECIMAL(12,4)", T.DECIMAL, _decimal(12, 4), precision=12, scale=4),
    lambda n: _col(f"added_{n}_json", "JSON", T.JSON, _json_text),
    lambda n: _col(f"added_{n}_enum", "ENUM('on','off')", T.ENUM, _enum(2), members=_SWITCH),
    lambda n: _col(f"added_{n}_varbinary", "VARBINARY(16)", T.VARCHAR, _bytes(16), binary=True),
    lambda n: _col(f"added_{n}_datetime", "DATETIME", T.DATETIME, _datetime(0)),
)


def _key_value(spec: ColumnSpec, idx: int, space: int) -> Any:
    """The key value of key slot ``idx`` (0 <= idx < space) for a key column: distinct per slot, spread
    over the interesting part of the type's range (negatives, values near 2**64 - 1, unicode)."""
    if spec.type_code == T.BIGINT and spec.flags & ColumnFlag.UNSIGNED:
        return _U64_MAX - idx * 7
    if spec.type_code == T.BIGINT:
        return (idx - space // 2) * 1_000_003_417
    if spec.type_code == T.INT:  # second column of the composite key: small values and ones near 2**32-1
        seq = idx // len(_REGIONS)
        return 4294967295 - seq if idx % 3 == 0 else seq
    if spec.type_code == T.VARCHAR:
        return _REGIONS[idx % len(_REGIONS)]
    raise ValueError(f"no key values for column {spec.name} ({spec.sql_type})")


class TableSpec:
    """An upstream table: name, current columns, key columns and how its rows look."""

    def __init__(self, schema: str, table: str, columns: list[ColumnSpec]) -> None:
        self.schema = schema
        self.table = table
        self.columns: list[ColumnSpec] = list(columns)
        self.key_names: tuple[str, ...] = tuple(c.name for c in columns if c.is_key)
        self.key_positions: tuple[int, ...] = tuple(i for i, c in enumerate(columns) if c.is_key)
        self.added = 0
        self._refresh()

    @property
    def qualified(self) -> str:
        """``schema.table``."""
        return f"{self.schema}.{self.table}"

    def _refresh(self) -> None:
        self.meta: tuple[tuple[str, int, ColumnFlag], ...] = tuple(
            (c.name, c.type_code, c.flags) for c in self.columns
        )
        # (is key, nullable, generator) per column, precomputed: flag tests on IntFlag are slow
        self.plan: tuple[tuple[bool, bool, Gen], ...] = tuple((c.is_key, c.nullable, c.gen) for c in self.columns)
        self.non_key_positions: tuple[int, ...] = tuple(i for i, c in enumerate(self.columns) if not c.is_key)

    def create_sql(self) -> str:
        """``CREATE TABLE`` as a MySQL client would send it."""
        cols = ", ".join(c.ddl() for c in self.columns)
        keys = ", ".join(f"`{k}`" for k in self.key_names)
        return f"CREATE TABLE `{self.schema}`.`{self.table}` ({cols}, PRIMARY KEY ({keys}))"

    def add_column(self, spec: ColumnSpec) -> str:
        """Add ``spec`` at the end; returns the ALTER TABLE statement."""
        self.columns.append(spec)
        self.added += 1
        self._refresh()
        return f"ALTER TABLE `{self.schema}`.`{self.table}` ADD COLUMN {spec.ddl()}"

    def image(self, values: tuple[Any, ...]) -> tuple[Column, ...]:
        """A row image (all current columns); missing trailing values (columns added later) are NULL."""
        n = len(self.meta)
        if len(values) < n:
            values = values + (None,) * (n - len(values))
        new = tuple.__new__  # skips Column's Python-level __new__; the result is an ordinary Column
        return tuple([new(Column, m + (v,)) for m, v in zip(self.meta, values)])


class TableState:
    """The live rows of one table, by key slot, with O(1) random choice."""

    def __init__(self, spec: TableSpec, key_space: int) -> None:
        self.spec = spec
        self.key_space = key_space
        self.rows: dict[int, tuple[Any, ...]] = {}
        self._slots: list[int] = []
        self._pos: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def put(self, slot: int, values: tuple[Any, ...]) -> None:
        if slot not in self.rows:
            self._pos[slot] = len(self._slots)
            self._slots.append(slot)
        self.rows[slot] = values

    def remove(self, slot: int) -> tuple[Any, ...]:
        values = self.rows.pop(slot)
        i = self._pos.pop(slot)
        last = self._slots.pop()
        if last != slot:
            self._slots[i] = last
            self._pos[last] = i
        return values

    def random_live(self, rng: random.Random, exclude: set[int]) -> int | None:
        for _ in range(8):
            if not self._slots:
                return None
            slot = self._slots[int(rng.random() * len(self._slots))]
            if slot not in exclude:
                return slot
        return None

    def random_free(self, rng: random.Random, exclude: set[int]) -> int | None:
        for _ in range(16):
            slot = int(rng.random() * self.key_space)
            if slot not in self.rows and slot not in exclude:
                return slot
        return None


class Commit(NamedTuple):
    """One upstream commit: a DML transaction (``rows``) or a DDL (``ddl``), with its commit ts."""

    commit_ts: int
    rows: tuple[RowChange, ...]
    ddl: DDLEvent | None = None


@dataclass
class WorkloadCounts:
    """What the workload committed (first-time events, before TiCDC's duplicates and replays)."""

    insert: int = 0
    update: int = 0
    delete: int = 0
    pk_change_splits: int = 0
    transactions: int = 0
    ddl: int = 0
    last_commit_ts: int = 0

    @property
    def row_events(self) -> int:
        return self.insert + self.update + self.delete


class Workload:
    """A deterministic upstream TiDB workload over ``tables`` tables producing ``events`` row changes.

    Iterate :meth:`commits` once; afterwards :attr:`tables` / :attr:`states` hold the final upstream
    state and :attr:`counts` what was committed.

    Raises:
        ValueError: ``events`` < 1, ``tables`` < 1 or ``max_rows_per_table`` < 4.
    """

    def __init__(self, seed: int, events: int, tables: int, *, max_rows_per_table: int = 2000,
                 max_txn_rows: int = 6, add_columns: bool = True) -> None:
        if events < 1:
            raise ValueError(f"events must be at least 1, got {events}")
        if tables < 1:
            raise ValueError(f"tables must be at least 1, got {tables}")
        if max_rows_per_table < 4:
            raise ValueError(f"max_rows_per_table must be at least 4, got {max_rows_per_table}")
        if max_txn_rows < 1:
            raise ValueError(f"max_txn_rows must be at least 1, got {max_txn_rows}")
        self.seed = seed
        self.target_events = events
        self.n_tables = tables
        self.max_rows = max_rows_per_table
        self.max_txn_rows = max_txn_rows
        self.rng = random.Random(f"ticdc-delta-workload/{seed}")
        self.clock = TsoClock(self.rng)
        n_schemas = max(1, min(3, (tables + 1) // 2))
        self.schemas = [f"s{i + 1}" for i in range(n_schemas)]
        self.tables: list[TableSpec] = [
            TableSpec(self.schemas[i % n_schemas], f"t{i + 1}", TABLE_TEMPLATES[i % len(TABLE_TEMPLATES)]())
            for i in range(tables)
        ]
        self.states: list[TableState] = [TableState(t, 2 * max_rows_per_table) for t in self.tables]
        self.created: list[bool] = [False] * tables
        self.counts = WorkloadCounts()
        self.ddl_log: list[DDLEvent] = []
        """Every DDL committed so far, in commit order."""
        # when (in row events committed so far) each table is created and gets its columns added
        spread = max(1, events // 10)
        self._create_at = [0 if i == 0 else (i * spread) // tables for i in range(tables)]
        # (row events committed, column) of every ADD COLUMN, planned up front so that the columns a
        # table will ever have are known before the stream starts (the Avro encoder wants ENUM members)
        self._planned: list[list[tuple[int, ColumnSpec]]] = []
        for i in range(tables):
            points = []
            if add_columns:
                if i % 2 == 0:
                    points.append(max(self._create_at[i] + 1, (events * 3) // 10))
                points.append(max(self._create_at[i] + 1, (events * 7) // 10))
            self._planned.append([
                (at, _ADDED_COLUMNS[(i + n * 3) % len(_ADDED_COLUMNS)](n + 1)) for n, at in enumerate(points)
            ])

    def enum_members(self) -> dict[tuple[str, str, str], tuple[str, ...]]:
        """``{(schema, table, column): members}`` of every ENUM column, including ones added later."""
        out: dict[tuple[str, str, str], tuple[str, ...]] = {}
        for table, planned in zip(self.tables, self._planned):
            for spec in [*table.columns, *(s for _, s in planned)]:
                if spec.enum_members is not None:
                    out[(table.schema, table.table, spec.name)] = spec.enum_members
        return out

    # ----------------------------------------------------------------------------------------------

    def commits(self) -> Iterator[Commit]:
        """The upstream commits in commit-ts order, until ``events`` row changes are committed."""
        for schema in self.schemas:
            yield self._ddl(DDLEvent(0, schema, "", f"CREATE DATABASE IF NOT EXISTS `{schema}`",
                                     int(DDLType.CREATE_SCHEMA)))
        while True:
            done = self.counts.row_events
            for i, table in enumerate(self.tables):
                if not self.created[i] and self._create_at[i] <= done:
                    self.created[i] = True
                    yield self._ddl(DDLEvent(0, table.schema, table.table, table.create_sql(),
                                             int(DDLType.CREATE_TABLE)))
                while self.created[i] and self._planned[i] and self._planned[i][0][0] <= done:
                    query = table.add_column(self._planned[i].pop(0)[1])
                    yield self._ddl(DDLEvent(0, table.schema, table.table, query, int(DDLType.ADD_COLUMN)))
            remaining = self.target_events - done
            if remaining <= 0:
                return
            commit = self._transaction(min(remaining, _ri(self.rng, 1, self.max_txn_rows)))
            if commit.rows:  # an empty transaction writes nothing TiCDC could see
                yield commit

    def _ddl(self, event: DDLEvent) -> Commit:
        ts = self.clock.next()
        self.counts.ddl += 1
        self.counts.last_commit_ts = ts
        event = event._replace(commit_ts=ts)
        self.ddl_log.append(event)
        return Commit(ts, (), event)

    def _transaction(self, budget: int) -> Commit:
        """One transaction of up to ``budget`` row events over the created tables (fewer only when tiny
        tables leave no untouched row to change; the caller then runs another transaction)."""
        rng = self.rng
        ts = self.clock.next()
        live = [i for i, c in enumerate(self.created) if c]
        touched: dict[int, set[int]] = {}
        deletes: list[RowChange] = []
        others: list[RowChange] = []
        attempts = 0
        while budget > 0 and attempts < 64:
            attempts += 1
            ti = rng.choice(live)
            state = self.states[ti]
            spec = state.spec
            seen = touched.setdefault(ti, set())
            full = len(state) >= self.max_rows
            r = rng.random()
            if len(state) < 3 and not full:
                r = 0.0  # grow small tables first
            elif full and r < 0.4:
                r = 0.4 + rng.random() * 0.6
            if r < 0.4:
                slot = state.random_free(rng, seen)
                if slot is None:
                    continue
                values = self._new_values(spec, slot, state.key_space)
                state.put(slot, values)
                seen.add(slot)
                others.append(RowChange(ts, spec.schema, spec.table, Op.INSERT, spec.image(values), None))
                self.counts.insert += 1
                budget -= 1
                continue
            slot = state.random_live(rng, seen)
            if slot is None:
                continue
            if r < 0.75:  # update in place
                old = state.rows[slot]
                values = self._updated_values(spec, old)
                state.put(slot, values)
                seen.add(slot)
                others.append(RowChange(ts, spec.schema, spec.table, Op.UPDATE, spec.image(values),
                                        spec.image(old)))
                self.counts.update += 1
                budget -= 1
            elif r < 0.9 or budget < 2:  # delete (TiCDC carries the whole old row with old value on)
                old = state.remove(slot)
                seen.add(slot)
                deletes.append(RowChange(ts, spec.schema, spec.table, Op.DELETE, None, spec.image(old)))
                self.counts.delete += 1
                budget -= 1
            else:  # update of the primary key: split into DELETE(old key) + INSERT(new key)
                new_slot = state.random_free(rng, seen | {slot})
                if new_slot is None:
                    continue
                old = state.remove(slot)
                values = self._updated_values(spec, old)
                values = self._with_key(spec, values, new_slot, state.key_space)
                state.put(new_slot, values)
                seen.update((slot, new_slot))
                deletes.append(RowChange(ts, spec.schema, spec.table, Op.DELETE, None, spec.image(old)))
                others.append(RowChange(ts, spec.schema, spec.table, Op.INSERT, spec.image(values), None))
                self.counts.delete += 1
                self.counts.insert += 1
                self.counts.pk_change_splits += 1
                budget -= 2
        if deletes or others:
            self.counts.transactions += 1
            self.counts.last_commit_ts = ts
        # TiCDC sends the DELETE halves of split updates before the INSERT halves of the transaction
        return Commit(ts, tuple(deletes + others))

    def _new_values(self, spec: TableSpec, slot: int, space: int) -> tuple[Any, ...]:
        rng = self.rng
        out = []
        for (is_key, nullable, gen), c in zip(spec.plan, spec.columns):
            if is_key:
                out.append(_key_value(c, slot, space))
            elif nullable and rng.random() < 0.1:
                out.append(None)
            else:
                out.append(gen(rng))
        return tuple(out)

    def _with_key(self, spec: TableSpec, values: tuple[Any, ...], slot: int, space: int) -> tuple[Any, ...]:
        out = list(values)
        for pos in spec.key_positions:
            out[pos] = _key_value(spec.columns[pos], slot, space)
        return tuple(out)

    def _updated_values(self, spec: TableSpec, old: tuple[Any, ...]) -> tuple[Any, ...]:
        """``old`` with one to three non-key columns changed (and padded to the current columns)."""
        rng = self.rng
        n = len(spec.columns)
        out = list(old) + [None] * (n - len(old))
        candidates = spec.non_key_positions
        for i in rng.sample(candidates, min(len(candidates), _ri(rng, 1, 3))):
            _, nullable, gen = spec.plan[i]
            out[i] = None if nullable and rng.random() < 0.15 else gen(rng)
        return tuple(out)

    # ----------------------------------------------------------------------------------------------

    def final_rows(self, index: int) -> list[tuple[Any, ...]]:
        """The final rows of table ``index``, padded to its columns, sorted by key slot."""
        state = self.states[index]
        n = len(state.spec.columns)
        return [v + (None,) * (n - len(v)) for _, v in sorted(state.rows.items())]
