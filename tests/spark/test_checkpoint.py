"""The job state belongs to one Spark checkpoint: every way they can disagree is a terminal error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ticdc_delta.errors import CheckpointMismatchError
from ticdc_delta.spark.checkpoint import SparkCheckpoint, check_state_belongs

Q1, Q2 = "6d1f0c1e-0000-4000-8000-000000000001", "6d1f0c1e-0000-4000-8000-000000000002"


def belongs(state_q, state_b, q, b, adopt=False):
    return check_state_belongs(checkpoint="/ck", state_query_id=state_q, state_batch_id=state_b, adopt=adopt,
                               query_id=q, batch_id=b)


def test_consistent_states_go_on_or_skip() -> None:
    assert belongs(None, None, Q1, 0) is False  # first batch ever
    assert belongs(Q1, 4, Q1, 5) is False  # the next batch
    assert belongs(Q1, 5, Q1, 5) is True  # re-run after the state commit: already done
    assert belongs(None, 4, Q1, 5, adopt=True) is False  # a state from before query ids were recorded
    assert belongs(None, -1, Q1, 0, adopt=True) is False  # the first batch after a reset


@pytest.mark.parametrize(
    "state_q,state_b,q,b,adopt,match",
    [
        (None, None, Q1, 3, False, r"job state /ck/state is missing or empty, but the Spark checkpoint "
                                   r"/ck/spark is at batch 3: the state was deleted"),
        (Q1, 57, Q2, 0, False, rf"belongs to Spark query {Q1} \(after batch 57\) but the Spark checkpoint "
                               rf"/ck/spark is query {Q2} at batch 0: the Spark checkpoint was deleted"),
        (Q1, 9, None, 0, False, "is query None"),
        (None, -1, Q1, 7, True, "was reset, but the Spark checkpoint /ck/spark continues at batch 7"),
        (Q1, 9, Q1, 4, False, "ahead of the Spark checkpoint"),
        (Q1, 2, Q1, 9, False, r"batches 3\.\.8 ran without this state"),
        (None, 57, Q2, 0, True, "ahead of the Spark checkpoint"),
    ],
)
def test_mismatches_are_terminal_and_say_how_to_recover(state_q, state_b, q, b, adopt, match) -> None:
    with pytest.raises(CheckpointMismatchError, match=match) as info:
        belongs(state_q, state_b, q, b, adopt)
    assert "python -m ticdc_delta reset --config" in str(info.value)
    assert not info.value.retryable


@pytest.mark.parametrize(("state_q", "state_b", "q", "b"), [(Q1, 57, Q2, 0), (Q1, 9, Q1, 4)])
def test_a_lost_or_older_spark_checkpoint_points_to_reset_from_state(state_q, state_b, q, b) -> None:
    """Only the Spark checkpoint was lost, replaced or restored from an older copy: the state is whole, and
    `reset --from state` continues after its last batch (earliest/latest would read again or skip rows)."""
    with pytest.raises(CheckpointMismatchError) as info:
        belongs(state_q, state_b, q, b)
    assert "reset --config <your.yaml> --from state --yes" in str(info.value)


def test_every_recovery_command_the_errors_give_is_one_the_cli_takes(tmp_path: Path) -> None:
    import re

    from ticdc_delta.cli import _build_parser as build_parser
    from ticdc_delta.spark.checkpoint import RECOVERY_HINT, STATE_RECOVERY_HINT

    commands = re.findall(r"`python -m ticdc_delta (reset [^`]*)`", RECOVERY_HINT + STATE_RECOVERY_HINT)
    assert len(commands) == 2
    for command in commands:
        for choice in re.search(r"--from (\S+)", command).group(1).split("|"):  # type: ignore[union-attr]
            args = build_parser().parse_args(
                ["reset", "--config", str(tmp_path / "x.yaml"), "--from", choice, "--yes"])
            assert args.start == choice


def test_reads_query_id_and_batch_timestamp_in_sparks_format(tmp_path: Path) -> None:
    spark_dir = tmp_path / "spark"
    ckpt = SparkCheckpoint(str(spark_dir))
    assert ckpt.query_id() is None and ckpt.batch_timestamp_ms(0) is None
    (spark_dir / "offsets").mkdir(parents=True)
    (spark_dir / "metadata").write_text(json.dumps({"id": Q1}) + "\n")
    (spark_dir / "offsets" / "3").write_text(
        'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1763900000123,"conf":{"spark.sql.shuffle.partitions":"2"}}\n'
        '{"tidb-cdc":{"0":42}}\n'
    )
    assert ckpt.query_id() == Q1
    assert SparkCheckpoint(f"file://{spark_dir}/").batch_timestamp_ms(3) == 1763900000123
    (spark_dir / "metadata").write_text("not json")
    with pytest.raises(CheckpointMismatchError, match="is not Spark's query metadata"):
        ckpt.query_id()


@pytest.mark.parametrize(
    "spark_says",
    [
        "[CONCURRENT_STREAM_LOG_UPDATE] Concurrent update to the log. Multiple streaming jobs detected for 3.\n"
        "Please make sure only one streaming job runs on a specific checkpoint location at a time. SQLSTATE: 40000",
        "java.util.ConcurrentModificationException: Multiple streaming queries are concurrently using "
        "file:/ck/spark/offsets\n\tat org.apache.spark.sql.execution.streaming.HDFSMetadataLog.write(...)",
        "[CONCURRENT_QUERY] Another instance of this query was just started by a concurrent session. SQLSTATE: 0A000",
        "java.lang.IllegalStateException: Cannot start query with id 1 as another query with same id is already "
        "active. Perhaps you are attempting to restart a query from checkpoint that is already active.",
    ],
)
def test_sparks_concurrent_query_errors_become_one_terminal_line(spark_says: str) -> None:
    from ticdc_delta.errors import ConcurrentJobError
    from ticdc_delta.spark.checkpoint import concurrent_job_error

    err = concurrent_job_error(RuntimeError(spark_says), "/ck/")
    assert isinstance(err, ConcurrentJobError) and not err.retryable
    assert str(err).startswith("another job of this changefeed is running on checkpoint /ck (Spark: ")
    assert "\n" not in str(err)
    assert any(said in str(err) for said in ("CONCURRENT_", "Multiple streaming", "already active"))


def test_other_errors_are_not_taken_for_a_concurrent_job() -> None:
    from ticdc_delta.spark.checkpoint import concurrent_job_error

    assert concurrent_job_error(RuntimeError("Connection refused"), "/ck") is None


def _offsets(root: Path, batch_id: int, offsets: dict | None, lines: list[str] | None = None) -> None:
    folder = root / "offsets"
    folder.mkdir(parents=True, exist_ok=True)
    meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}})
    body = lines if lines is not None else ["v1", meta, json.dumps(offsets)]
    (folder / str(batch_id)).write_text("\n".join(body))


def test_a_batch_counts_its_messages_from_the_offset_log(tmp_path: Path) -> None:
    _offsets(tmp_path, 0, {"cdc": {"0": 10, "1": 5}})
    _offsets(tmp_path, 1, {"cdc": {"0": 13, "1": 5}})
    _offsets(tmp_path, 2, {"cdc": {"0": 13, "1": 9, "2": 4}})  # a partition the topic gained
    _offsets(tmp_path, 3, None, lines=["v1", "{}"])  # not Spark's form
    ck = SparkCheckpoint(str(tmp_path))
    assert ck.batch_messages(1) == 3
    assert ck.batch_messages(0) is None  # where the first batch starts is not in the offset log
    assert ck.batch_messages(2) is None  # unknown start for the new partition: not counted as small
    assert ck.batch_messages(3) is None and ck.batch_messages(4) is None
