"""KeyResolver: the configured key override, decided in one place (exact and wildcard mappings)."""

from __future__ import annotations

import pytest

from ticdc_delta.config import config_from_mapping
from ticdc_delta.core.merge import KeyResolver, collapse
from ticdc_delta.core.records import ChangeRecord

from .test_batch_planner import row

CFG = config_from_mapping({
    "changefeed": "k",
    "source": {"bootstrap_servers": "127.0.0.1:9", "topic": "t", "protocol": "craft"},
    "sink": {"path": "/tmp/lake"},
    "checkpoint": "/tmp/ckpt",
    "tables": [{"source": "s.*", "key": ["v"]}, {"source": "s.exact", "key": ["id", "v"]}],
})


def _lookup(schema: str, table: str) -> list[str] | None:
    mapping = CFG.table_mapping_for(schema, table)
    return mapping.key if mapping is not None else None


def test_wildcard_mapping_key_overrides_the_flagged_key() -> None:
    keys = KeyResolver(lookup=_lookup)
    records = [row(1, 0, 0, "insert", {"id": 1, "v": "same"}), row(2, 0, 1, "insert", {"id": 2, "v": "same"})]
    tables = collapse(records, keys)
    assert tables[("s", "t")].key_columns == ("v",)
    assert list(tables[("s", "t")].changes) == [("same",)]  # one key: the override, not the flagged id


def test_exact_entry_wins_over_the_wildcard_and_unmapped_tables_use_flags() -> None:
    keys = KeyResolver(lookup=_lookup)
    image = row(1, 0, 0, "insert", {"id": 1, "v": "x"}).new
    assert keys.key_columns("s", "exact", image) == ("id", "v")
    assert keys.key_columns("other", "t", image) == ("id",)
    assert keys.key_columns("S", "T", image) == ("v",)  # names compare case-insensitively


def test_lookup_must_be_callable() -> None:
    with pytest.raises(TypeError, match="lookup must be callable"):
        KeyResolver(lookup={"s": "t"})  # type: ignore[arg-type]


def test_a_unique_key_with_a_nullable_column_is_no_key() -> None:
    """TiCDC flags a NOT NULL unique key as the handle; a unique key over a nullable column (a table replicated
    with force-replicate) identifies no row: any number of rows hold NULL there. Keyed by it, they collapsed
    into one (each new one replaced the last, one delete removed them all); the rows are keyed by all
    their columns, as a table without a key."""
    from ticdc_delta.codec.model import ColumnFlag as F
    from ticdc_delta.core.records import ChangeRecord

    unique, plain = int(F.UNIQUE_KEY | F.NULLABLE), int(F.NULLABLE)

    def insert(offset: int, u: int | None, v: int) -> ChangeRecord:
        return ChangeRecord(10 + offset, "cdc", 0, offset, 0, "s", "t", "insert",
                            (("u", 3, unique, u), ("v", 3, plain, v)), None)

    tables = collapse([insert(0, None, 1), insert(1, None, 2), insert(2, 5, 3)], KeyResolver())
    assert tables[("s", "t")].key_columns == ("u", "v")
    assert sorted(tables[("s", "t")].changes, key=str) == [(5, 3), (None, 1), (None, 2)]
    not_null = (("u", 3, int(F.UNIQUE_KEY), 5), ("v", 3, plain, 3))
    assert KeyResolver().key_columns("s", "t", not_null) == ("u",)  # (a NOT NULL one keys the rows)


def test_a_configured_key_takes_the_image_spelling_of_its_columns() -> None:
    """MySQL's column names are case-insensitive: a ``key: [ID]`` override names the column ``id``."""
    from ticdc_delta.core.merge import spell_key

    columns = [("id", 8, 0), ("Code", 15, 0), ("code2", 15, 0)]
    assert spell_key(("ID", "code"), columns) == ("id", "Code")
    assert spell_key(("id",), columns) == ("id",)
    assert spell_key(("nope",), columns) == ("nope",)  # missing: stays as given (MissingKeyError later)
    assert spell_key(("a",), [("A", 8, 0), ("a ", 8, 0)]) == ("A",)
    assert spell_key(("x",), [("X", 8, 0), ("x2", 8, 0), ("X", 8, 0)]) == ("x",)  # ambiguous: as given
    keys = KeyResolver({("s", "t"): ("ID",)})
    image = (("id", 8, 0, 1), ("v", 15, 0, "a"))
    assert keys.key_columns("s", "t", image) == ("id",)
    assert collapse([ChangeRecord(1, "c", 0, 0, 0, "s", "t", "insert", image, None)], keys)[("s", "t")].key_columns == ("id",)


def test_a_configured_key_names_the_column_tidb_would() -> None:
    """Column names compare in TiDB's case (Go's ``strings.ToLower``), not Python's ``casefold``: ``ΟΔΟΣ``
    names ``οδοσ`` and not ``οδος`` (one column each in TiDB), ``İD`` names ``id``, ``STRASSE`` not ``straße``."""
    from ticdc_delta.core.merge import spell_key

    assert spell_key(("ΟΔΟΣ",), [("οδος", 15, 0), ("οδοσ", 15, 0)]) == ("οδοσ",)
    assert spell_key(("ΟΔΟΣ",), [("οδος", 15, 0)]) == ("ΟΔΟΣ",)  # no such column: MissingKeyError later
    assert spell_key(("İD",), [("id", 8, 0)]) == ("id",)
    assert spell_key(("STRASSE",), [("straße", 15, 0)]) == ("STRASSE",)
