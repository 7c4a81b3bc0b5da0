"""The reset command on a real state table and checkpoint directory (no broker, no Spark needed)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ticdc_delta.cli import EXIT_OK, EXIT_TERMINAL, EXIT_USAGE, main
from ticdc_delta.config import config_from_mapping
from ticdc_delta.delta.state_store import RESET_BATCH_ID, PipelineState, StateStore
from ticdc_delta.errors import CheckpointMismatchError
from ticdc_delta.reset import apply_reset, plan_reset

pytestmark = pytest.mark.integration  # real Delta tables

META = {
    "catalog": {"s.t": {"c": [10, 2, None]}},
    "applied_ddl": [[5, "s", "t", "CREATE TABLE t (id INT)"]],
    "checkpoint": {"query_id": "q-old"},
    "next_offsets": {"cdc": {"0": 12, "1": 7}},
    "tables": {"s.t": {"rows_applied": 3, "location": "/lake/s/t"}},
    "snapshots": {"s.t": {"tso": 3, "status": "done"}},
    "staging_batch": 4,
    "held_by_table": {"s.t": 1500},
    "topic_watermarks": {"cdc": 90},
}


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    # the broker's word on the topics' partitions (a reset to offsets must name each of them): two each
    monkeypatch.setattr("ticdc_delta.spark.batch_handler.kafka_partitions", lambda cfg, topic: [0, 1])
    data = {
        "changefeed": "rs",
        "source": {"bootstrap_servers": "127.0.0.1:9", "topic": "cdc", "protocol": "craft"},
        "sink": {"path": str(tmp_path / "lake")},
        "checkpoint": str(tmp_path / "ckpt"),
    }
    yaml_path = tmp_path / "job.yaml"
    yaml_path.write_text(json.dumps(data))
    StateStore(str(tmp_path / "ckpt" / "state"), "rs").save(
        4, PipelineState(4, {("cdc", 0): 100, ("cdc", 1): 90}, [b"held-row"], dict(META))
    )
    spark_dir = tmp_path / "ckpt" / "spark"
    (spark_dir / "offsets").mkdir(parents=True)
    (spark_dir / "metadata").write_text('{"id":"q-old"}')
    return yaml_path, spark_dir


def _state(tmp_path: Path) -> PipelineState:
    saved = StateStore(str(tmp_path / "ckpt" / "state"), "rs").load()
    assert saved is not None
    return saved


def test_without_yes_nothing_changes(job: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    yaml_path, spark_dir = job
    assert main(["reset", "--config", str(yaml_path), "--from", "earliest"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "after batch 4 (Spark query q-old)" in err and "add --yes" in err
    assert spark_dir.exists() and _state(tmp_path).batch_id == 4


def test_reset_from_earliest_clears_position_keeps_catalog_and_deletes_spark_checkpoint(
    job: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    yaml_path, spark_dir = job
    assert main(["reset", "--config", str(yaml_path), "--from", "earliest", "--yes"]) == EXIT_OK
    assert not spark_dir.exists()
    state = _state(tmp_path)
    assert state.batch_id == RESET_BATCH_ID and state.watermarks == {} and state.held == []
    assert state.meta["catalog"] == META["catalog"] and state.meta["applied_ddl"] == META["applied_ddl"]
    first_epoch = state.meta["epoch"]
    assert state.meta["resets"] == 1 and state.meta["starting_offsets"] == "earliest"
    assert state.meta["snapshots"] == META["snapshots"]  # the tables still hold the snapshots
    # the stream is read again: a table deleted to be built again is made anew (not refused as moved); where
    # its rows went stays known as an earlier location (which tables share one)
    assert state.meta["tables"] == {"s.t": {"rows_applied": 3, "earlier_location": "/lake/s/t"}}
    assert "checkpoint" not in state.meta and "next_offsets" not in state.meta and "staging_batch" not in state.meta
    assert "held_by_table" not in state.meta and "topic_watermarks" not in state.meta
    assert state.meta["reset"]["previous_batch"] == 4 and state.meta["reset"]["previous_query_id"] == "q-old"
    assert main(["status", "--config", str(yaml_path)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "last batch none since reset/snapshot" in out and "-1" not in out
    # again: a second epoch, still consistent
    assert main(["reset", "--config", str(yaml_path), "--offset", "cdc:0=5", "--offset", "cdc:1=-2", "--yes"]) == 0
    state = _state(tmp_path)
    assert state.meta["resets"] == 2 and state.meta["epoch"] != first_epoch
    assert state.meta["starting_offsets"] == {"cdc": {"0": 5, "1": -2}}


@pytest.mark.parametrize("start", ["earliest", "latest"])
def test_reset_that_reads_again_applies_again_the_ddl_that_removed_rows(job: tuple[Path, Path], tmp_path: Path,
                                                                       start: str) -> None:
    """Read again from earliest, the rows before a TRUNCATE / DROP come back, so the DDL must apply again:
    its identity is no longer "applied" (schema DDL stays applied; --from state reads nothing again, nor
    does --from latest: a copy of an applied DDL still to come on another partition stays applied)."""
    yaml_path, _ = job
    truncate = [7, "s", "t", "TRUNCATE TABLE `s`.`t`"]
    drop = [None, "s", "u", "DROP TABLE u", "cdc", 0, 3, 0]
    store = StateStore(str(tmp_path / "ckpt" / "state"), "rs")
    saved = store.load()
    assert saved is not None
    meta = {**saved.meta, "applied_ddl": [*META["applied_ddl"], truncate, drop]}
    store.save(saved.batch_id + 1, PipelineState(saved.batch_id + 1, saved.watermarks, saved.held, meta))
    assert main(["reset", "--config", str(yaml_path), "--from", start, "--yes"]) == EXIT_OK
    kept = META["applied_ddl"] if start == "earliest" else meta["applied_ddl"]
    assert _state(tmp_path).meta["applied_ddl"] == kept


def test_reset_from_state_keeps_position_and_starts_after_the_last_batch(
    job: tuple[Path, Path], tmp_path: Path
) -> None:
    yaml_path, _ = job
    cfg = config_from_mapping(json.loads(yaml_path.read_text()))
    # partitions_of: Kafka's partition list for the topic (partition 2 was never read by the job)
    plan = plan_reset(cfg, "state", partitions_of=lambda topic: [0, 1, 2])
    assert plan.starting_offsets == {"cdc": {0: 12, 1: 7, 2: -2}}
    apply_reset(cfg, plan)
    state = _state(tmp_path)
    assert state.watermarks == {("cdc", 0): 100, ("cdc", 1): 90} and state.held == [b"held-row"]
    assert state.meta["next_offsets"] == META["next_offsets"] and state.meta["staging_batch"] == 4
    # what `status` reads: the held rows per table (spark engine: in the staging table) and the low watermark
    assert state.meta["held_by_table"] == META["held_by_table"]
    assert state.meta["topic_watermarks"] == META["topic_watermarks"]
    assert state.meta["tables"] == META["tables"]  # (where each table is: a missing one is still refused)


def test_reset_to_offsets_names_every_source_topic(job: tuple[Path, Path], tmp_path: Path) -> None:
    """Spark's Kafka source refuses specific offsets for only some topics: reset refuses them first (before
    it deletes the Spark checkpoint), not the next run."""
    yaml_path, spark_dir = job
    data = json.loads(yaml_path.read_text())
    data["source"] = {**{k: v for k, v in data["source"].items() if k != "topic"}, "topics": ["cdc", "cdc2"]}
    with pytest.raises(ValueError, match=r"every partition of every source topic; none given for \['cdc2'\]"):
        plan_reset(config_from_mapping(data), {"cdc": {0: 5}})
    assert spark_dir.exists()


def test_reset_to_offsets_leaves_out_a_topic_that_does_not_exist_yet(job: tuple[Path, Path]) -> None:
    """A topic of a topic dispatcher that TiCDC has not created yet has no partition to name: it may be left
    out (or given as ``{}``), and is read from its start once it exists."""
    yaml_path, _ = job
    data = json.loads(yaml_path.read_text())
    data["source"] = {**{k: v for k, v in data["source"].items() if k != "topic"}, "topics": ["cdc", "later"]}
    broker = {"cdc": [0, 1], "later": []}
    for given in ({"cdc": {0: 5, 1: 6}}, {"cdc": {0: 5, 1: 6}, "later": {}}):
        plan = plan_reset(config_from_mapping(data), given, partitions_of=broker.__getitem__)
        assert plan.starting_offsets == {"cdc": {0: 5, 1: 6}}


def test_reset_refuses_when_the_state_moved_meanwhile(job: tuple[Path, Path], tmp_path: Path) -> None:
    yaml_path, spark_dir = job
    cfg = config_from_mapping(json.loads(yaml_path.read_text()))
    plan = plan_reset(cfg, "latest")
    StateStore(str(tmp_path / "ckpt" / "state"), "rs").save(5, PipelineState(5, meta=dict(META)))
    with pytest.raises(CheckpointMismatchError, match="moved from batch 4 to 5 while resetting"):
        apply_reset(cfg, plan)
    assert spark_dir.exists()


@pytest.mark.parametrize(
    "args,code,match",
    [
        (["--from", "earliest", "--offset", "cdc:0=1"], EXIT_USAGE, "exactly one of"),
        ([], EXIT_USAGE, "exactly one of"),
        (["--offset", "cdc=1"], EXIT_USAGE, "TOPIC:PARTITION=OFFSET"),
        (["--offset", "cdc:0=-3"], EXIT_USAGE, "TOPIC:PARTITION=OFFSET"),
        (["--offset", "other:0=1", "--yes"], EXIT_TERMINAL, r"topic\(s\) \['other'\] the job does not read"),
        # Spark's Kafka source refuses offsets for only some partitions: refused before the checkpoint goes
        (["--offset", "cdc:0=1", "--yes"], EXIT_TERMINAL,
         r"offsets must name every partition of cdc \(2 on the broker\): partition\(s\) \[1\] not named"),
        (["--offset", "cdc:0=1", "--offset", "cdc:1=1", "--offset", "cdc:7=1", "--yes"], EXIT_TERMINAL,
         r"partition\(s\) \[7\] do not exist"),
    ],
)
def test_bad_arguments(job: tuple[Path, Path], capsys: pytest.CaptureFixture, args: list[str], code: int,
                       match: str) -> None:
    yaml_path, spark_dir = job
    assert main(["reset", "--config", str(yaml_path), *args]) == code
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1  # one clear line
    assert re.search(match, err)
    assert spark_dir.exists()


def test_a_partition_quiet_since_a_reset_to_offsets_goes_on_from_its_offset(job: tuple[Path, Path],
                                                                            tmp_path: Path) -> None:
    """After `reset --offset cdc:0=5000 --offset cdc:1=7000`, a batch reads only partition 0: the state
    still says partition 1 goes on at 7000, so a later `reset --from state` does not send it back to
    earliest (offset-order mode reads its retained history again)."""
    from types import SimpleNamespace

    from ticdc_delta.delta.applier import ApplyResult, TableCatalog
    from ticdc_delta.spark.batch_handler import next_state_meta

    yaml_path, _ = job
    cfg = config_from_mapping(json.loads(yaml_path.read_text()))
    apply_reset(cfg, plan_reset(cfg, {"cdc": {0: 5000, 1: 7000}}))
    after_reset = _state(tmp_path).meta
    plan = SimpleNamespace(state=SimpleNamespace(applied_ddl=[]), topic_watermarks={})
    applier = SimpleNamespace(catalog=TableCatalog(), gone=set(), locations={})
    meta = next_state_meta(after_reset, plan, applier, ApplyResult(),
                           {("cdc", 0): (5000, 5000)}, "q-new", engine="delta-rs", totals={})
    assert meta["next_offsets"] == {"cdc": {"0": 5001, "1": 7000}}
    store = StateStore(str(tmp_path / "ckpt" / "state"), "rs")
    store.save(5, PipelineState(5, {}, [], meta))  # (the batch after the reset, as the job saves it)
    assert plan_reset(cfg, "state", partitions_of=lambda topic: [0, 1]).starting_offsets == {"cdc": {0: 5001, 1: 7000}}


def test_reset_from_state_refuses_a_batch_that_stopped_past_a_table_ddl(job: tuple[Path, Path],
                                                                        tmp_path: Path) -> None:
    """The batch after the state's wrote its DDL journal entry (it may have run the RENAME): read again
    under a new epoch, its rows before the RENAME would re-create the old table. Refused, naming the DDL;
    an entry of another batch changes nothing."""
    from ticdc_delta.delta.ddl_journal import DDLJournal, JournalEntry

    yaml_path, spark_dir = job
    cfg = config_from_mapping(json.loads(yaml_path.read_text()))
    journal = DDLJournal(str(tmp_path / "ckpt" / "ddl_journal"))
    journal.save(JournalEntry("rs", 4, 0, [400, "RENAME TABLE `s`.`a` TO `s`.`b`"]))  # batch 4: done
    assert plan_reset(cfg, "state", partitions_of=lambda topic: [0, 1]).keep_position
    journal.save(JournalEntry("rs", 5, 0, [401, "RENAME TABLE `s`.`a` TO `s`.`b`"]))
    with pytest.raises(ValueError, match=r"batch 5 stopped part-way.*RENAME TABLE `s`\.`a` TO `s`\.`b`.*commit ts "
                                         r"401.*Restore the matching"):
        plan_reset(cfg, "state", partitions_of=lambda topic: [0, 1])
    assert main(["reset", "--config", str(yaml_path), "--from", "state", "--yes"]) == EXIT_TERMINAL
    assert spark_dir.exists()


def test_a_damaged_state_table_is_one_error_line_and_nothing_changes(job: tuple[Path, Path], tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    """Regression: a damaged state table (a torn commit file) printed delta-rs' error as a Python and Rust
    traceback."""
    yaml_path, spark_dir = job
    log_dir = tmp_path / "ckpt" / "state" / "_delta_log"
    sorted(log_dir.glob("*.json"))[-1].write_text("{not json\n")
    assert main(["reset", "--config", str(yaml_path), "--from", "earliest", "--yes"]) == EXIT_TERMINAL
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.match(r"error: cannot read the job state table at .*/ckpt/state: .*Json error", err[0])
    assert spark_dir.exists()


def test_reset_from_state_refuses_offsets_past_a_partitions_end(job: tuple[Path, Path], tmp_path: Path) -> None:
    """A topic deleted and made again starts its offsets over, below where the state says the job stopped:
    continuing from the state, Spark's source either stops at the gap as lost data or, told to skip lost
    data, skips the new topic's messages up to the old offset. Refused, naming the partitions and the way
    on; a log that reaches the state's offsets is continued from them."""
    yaml_path, _ = job
    cfg = config_from_mapping(json.loads(yaml_path.read_text()))
    saved = _state(tmp_path)
    meta = {**saved.meta, "next_offsets": {"cdc": {"0": 5000, "1": 7000}}}
    StateStore(str(tmp_path / "ckpt" / "state"), "rs").save(saved.batch_id + 1,
                                                          PipelineState(saved.batch_id + 1, meta=meta))
    with pytest.raises(ValueError, match=r"--from state: cdc\[0\] ends at 200, the state stopped at 5000: the topic "
                                         r"was deleted and made again .*`reset --offset TOPIC:PARTITION=OFFSET"):
        plan_reset(cfg, "state", partitions_of=lambda topic: [0, 1], ends_of=lambda topic: {0: 200, 1: 7000})
    with pytest.raises(ValueError, match=r"--from state: cdc\[1\] is not on the broker, the state stopped at 7000"):
        plan_reset(cfg, "state", partitions_of=lambda topic: [0], ends_of=lambda topic: {0: 5100})
    plan = plan_reset(cfg, "state", partitions_of=lambda topic: [0, 1], ends_of=lambda topic: {0: 5000, 1: 7300})
    assert plan.starting_offsets == {"cdc": {0: 5000, 1: 7000}}
