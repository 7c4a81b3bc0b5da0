"""`status` on a real state table (no broker, no Spark): what it says of the dead-letter table."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ticdc_delta.cli import EXIT_TERMINAL, main
from ticdc_delta.config import config_from_mapping
from ticdc_delta.delta.state_store import PipelineState, StateStore
from ticdc_delta.status import collect_status, render_status

pytestmark = pytest.mark.integration  # real Delta tables


def _cfg(tmp_path: Path, meta: dict) -> object:
    cfg = config_from_mapping({
        "changefeed": "st", "checkpoint": str(tmp_path / "ckpt"), "sink": {"path": str(tmp_path / "lake")},
        "source": {"bootstrap_servers": "127.0.0.1:9", "topic": "cdc", "protocol": "canal-json"},
    })
    StateStore(str(tmp_path / "ckpt" / "state"), "st").save(7, PipelineState(7, {}, [], meta))
    return cfg


def test_status_counts_every_dead_letter_and_the_table_compactions(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, {
        "totals": {"dead_letters": 3, "dead_letter_values": 1, "implausible_ts": 2},
        "compaction": {"tables": {"_ticdc.dead_letter": {"compactions": 2}, "s.t": {"compactions": 5}}},
        "tables": {"s.t": {"rows_applied": 9}},
    })
    dead = collect_status(cfg)["dead_letter"]
    assert dead == {"path": cfg.dead_letter_path, "rows": 5, "compactions": 2}
    assert collect_status(cfg)["tables"]["s.t"]["compactions"] == 5
    assert f"dead letters: 5 in {cfg.dead_letter_path} (compactions 2)" in render_status(cfg)


def test_status_says_nothing_of_dead_letters_when_there_are_none(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, {"totals": {"dead_letters": 0}, "tables": {}})
    assert collect_status(cfg)["dead_letter"]["rows"] == 0
    assert "dead letters" not in render_status(cfg)


def test_status_json_has_the_same_keys_before_the_first_state(tmp_path: Path) -> None:
    """A monitor reads one shape: the keys of a job that has not committed a batch yet are those of one
    that has (empty or null values)."""
    cfg = _cfg(tmp_path / "a", {"totals": {}, "tables": {}})
    fresh = config_from_mapping({
        "changefeed": "st", "checkpoint": str(tmp_path / "none"), "sink": {"path": str(tmp_path / "lake")},
        "source": {"bootstrap_servers": "127.0.0.1:9", "topic": "cdc", "protocol": "canal-json"},
    })
    before = collect_status(fresh)
    assert before.keys() == collect_status(cfg).keys()
    assert before["batch_id"] is None and before["dead_letter"] == {"path": fresh.dead_letter_path, "rows": 0,
                                                                    "compactions": 0}


def test_the_watermark_is_none_while_a_topic_has_none(tmp_path: Path) -> None:
    """Rows wait for the least watermark of the topics, none while one of them has none (a topic that has never
    resolved: every row is held). The least of the others kept moving and hid that stall."""
    cfg = _cfg(tmp_path, {"topic_watermarks": {"a": 446_000_000_000_000_000, "b": None}})
    assert collect_status(cfg)["watermark"] is None and collect_status(cfg)["watermark_lag_s"] is None
    cfg = _cfg(tmp_path / "later", {"topic_watermarks": {"a": 446_000_000_000_000_000, "b": 445_000_000_000_000_000}})
    assert collect_status(cfg)["watermark"] == 445_000_000_000_000_000


def test_status_of_a_damaged_state_table_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Regression: a damaged state table (a torn commit file) printed delta-rs' error as a Python and Rust
    traceback."""
    _cfg(tmp_path, {"tables": {}})
    (tmp_path / "job.yaml").write_text(json.dumps({
        "changefeed": "st", "checkpoint": str(tmp_path / "ckpt"), "sink": {"path": str(tmp_path / "lake")},
        "source": {"bootstrap_servers": "127.0.0.1:9", "topic": "cdc", "protocol": "canal-json"},
    }))
    sorted((tmp_path / "ckpt" / "state" / "_delta_log").glob("*.json"))[-1].write_text("{not json\n")
    assert main(["status", "--config", str(tmp_path / "job.yaml")]) == EXIT_TERMINAL
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.match(r"error: cannot read the job state table at .*/ckpt/state: .*Json error", err[0])


def test_a_held_ddl_is_no_table_and_a_topic_without_resolved_ts_is_named(tmp_path: Path) -> None:
    """A held CREATE DATABASE showed as a table ``shop.`` with a held row; a stall for a topic that has never
    resolved showed only as a null watermark."""
    from ticdc_delta.core.records import ChangeRecord, DDLRecord, dump_record

    held = [dump_record(DDLRecord(5, "cdc", 0, 1, 0, "shop", "", "CREATE DATABASE shop", 0)),
            dump_record(ChangeRecord(6, "cdc", 0, 2, 0, "shop", "t", "insert", (("id", 8, 2, 1),), None))]
    cfg = config_from_mapping({
        "changefeed": "st", "checkpoint": str(tmp_path / "ckpt"), "sink": {"path": str(tmp_path / "lake")},
        "source": {"bootstrap_servers": "127.0.0.1:9", "topic": "cdc", "protocol": "canal-json"},
    })
    StateStore(str(tmp_path / "ckpt" / "state"), "st").save(
        7, PipelineState(7, {}, held, {"topic_watermarks": {"cdc": 446_000_000_000_000_000, "other": None}}))
    st = collect_status(cfg)
    assert set(st["tables"]) == {"shop.t"} and st["tables"]["shop.t"]["rows_held"] == 1
    assert (st["rows_held"], st["ddl_held"]) == (2, 1)  # the total as the progress line counts it
    assert st["waiting_for"] == ["other"]
    text = render_status(cfg)
    assert "DDL held 1" in text and "waiting for the first resolved ts of topic(s) other" in text


def test_status_reads_again_when_the_running_job_vacuumed_the_version_it_found(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's state save vacuums now and then: files of the version `status` found can go before it reads
    them (it ended with a terminal error line); a new read finds the next version."""
    from ticdc_delta.errors import SinkError

    cfg = _cfg(tmp_path, {"totals": {}, "tables": {}})
    real, calls = StateStore.load, []

    def flaky(self: StateStore) -> object:
        calls.append(1)
        if len(calls) == 1:
            raise SinkError(f"cannot read Delta table {tmp_path}/ckpt/state: Object at location part-0.parquet not found")
        return real(self)

    monkeypatch.setattr(StateStore, "load", flaky)
    assert collect_status(cfg)["batch_id"] == 7 and len(calls) == 2
