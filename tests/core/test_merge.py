"""KeyResolver: the configured key override, decided in one place (exact and wildcard mappings)."""

from __future__ import annotations

import pytest

from ticdc_delta.config import config_from_mapping
from ticdc_delta.core.merge import KeyResolver, collapse

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
