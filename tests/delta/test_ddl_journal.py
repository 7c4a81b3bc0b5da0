"""The DDL journal's own table: one entry, read back only by the batch and app id that wrote it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ticdc_delta.delta.ddl_journal import DDLJournal, JournalEntry
from ticdc_delta.errors import SinkError


def _entry(batch_id: int, ordinal: int, app_id: str = "cf~1") -> JournalEntry:
    return JournalEntry(app_id, batch_id, ordinal, [400 + ordinal, "RENAME TABLE `d`.`a` TO `d`.`b`"],
                        {("d", "a"): 2, ("d", "b"): 1}, {"d\x00a": {"x": {"precision": 10, "scale": 2,
                                                                        "members": None, "fsp": None}}},
                        {"rows": {"d.a": 3}, "deleted": {}, "ddl_applied": 1, "ddl_ignored": 0, "commit_ts": {}})


def test_an_entry_comes_back_only_to_its_batch_and_app(tmp_path: Path) -> None:
    journal = DDLJournal(str(tmp_path / "ddl_journal"))
    assert journal.load("cf~1", 7) is None  # no table yet
    journal.save(_entry(7, 2))
    assert journal.load("cf~1", 7) == _entry(7, 2)
    assert journal.load("cf~1", 8) is None
    assert journal.load("cf~2", 7) is None  # a reset's new epoch
    journal.save(_entry(8, 0))  # the next batch replaces it
    assert journal.load("cf~1", 7) is None and journal.load("cf~1", 8) == _entry(8, 0)


def test_replaced_entries_files_are_vacuumed(tmp_path: Path) -> None:
    path = tmp_path / "ddl_journal"
    journal = DDLJournal(str(path), vacuum_every=4)
    for i in range(8):
        journal.save(_entry(i, 0))
    parquet = [n for n in os.listdir(path) if n.endswith(".parquet")]
    assert len(parquet) == 1, parquet
    assert journal.load("cf~1", 7) == _entry(7, 0)


def test_a_journal_written_by_short_runs_is_vacuumed_too(tmp_path: Path) -> None:
    path = tmp_path / "ddl_journal"
    for i in range(12):  # a new object (a new `--once` run) for each entry
        DDLJournal(str(path), vacuum_every=4).save(_entry(i, 0))
    parquet = [n for n in os.listdir(path) if n.endswith(".parquet")]
    assert len(parquet) <= 4, parquet
    assert DDLJournal(str(path)).load("cf~1", 11) == _entry(11, 0)


def test_a_journal_of_another_format_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ticdc_delta.delta.ddl_journal as mod

    journal = DDLJournal(str(tmp_path / "ddl_journal"))
    monkeypatch.setattr(mod, "JOURNAL_FORMAT", 99)
    journal.save(_entry(1, 0))
    monkeypatch.setattr(mod, "JOURNAL_FORMAT", 1)
    with pytest.raises(SinkError, match="format 99"):
        journal.load("cf~1", 1)
