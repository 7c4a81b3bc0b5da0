"""Forged resolved ts, and the job state vs Spark's checkpoint: real broker, real Spark, real Delta tables,
compared with the simulator's oracle.

- A forged ``TIDB_WATERMARK`` (``watermarkTs`` 2^63-1) must not make later rows replays: it goes to the
  dead-letter table and the tables still match the oracle.
- Spark's checkpoint deleted (state kept), or the state deleted (checkpoint kept): a terminal error that
  says so — never a silent skip — and ``reset`` is the documented way on.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ticdc_delta.cli import EXIT_OK, EXIT_USAGE, main
from ticdc_delta.config import config_from_mapping
from ticdc_delta.delta.sink import read_table
from ticdc_delta.delta.state_store import RESET_BATCH_ID, StateStore
from ticdc_delta.errors import CheckpointMismatchError, ImplausibleTimestampError
from ticdc_delta.simulator import simulate
from ticdc_delta.simulator.output import MemorySink
from ticdc_delta.spark.batch_handler import _ConfiguredSink
from ticdc_delta.spark.job import run_job
from ticdc_delta.verify import compare_with_oracle
from tests.integration.conftest import job_engine

if TYPE_CHECKING:
    from tests.integration.conftest import ProgressLines

pytestmark = pytest.mark.integration

CANAL = {"enable-tidb-extension": "true"}
FORGED = (1 << 63) - 1


def _setup(broker: Any, topic: str, tmp: Path, *, events: int = 500, seed: int = 21,
           **source: Any) -> tuple[Any, list[tuple[int, bytes | None, bytes | None]], Any, Path]:
    memory = MemorySink()
    oracle = simulate("canal-json", CANAL, seed=seed, events=events, tables=2, partitions=2, sink=memory,
                      topic=topic).oracle
    broker.create_topic(topic, 2)
    data = {
        "changefeed": "ck",
        "source": {"bootstrap_servers": broker.bootstrap_servers, "topic": topic, "protocol": "canal-json",
                   "options": CANAL, **source},
        "sink": {"path": str(tmp / "lake"), "engine": job_engine("spark")},
        "checkpoint": str(tmp / "ckpt"),
    }
    cfg = config_from_mapping(data)
    yaml_path = tmp / "job.yaml"
    yaml_path.write_text(json.dumps(data))  # JSON is YAML
    return oracle, memory.messages, cfg, yaml_path


def _assert_matches(cfg: Any, oracle: Any) -> None:
    diffs = compare_with_oracle(_ConfiguredSink(cfg), oracle, tz=cfg.sink.source_timezone)
    bad = [d.describe() for d in diffs if not d.ok]
    assert not bad, "\n".join(bad)
    assert sum(d.actual_rows for d in diffs) > 0


def _watermark(ts: int) -> bytes:
    return json.dumps({
        "id": 0, "database": "", "table": "", "pkNames": None, "isDdl": False, "type": "TIDB_WATERMARK",
        "es": 1640007049196, "ts": 1640007050284, "sql": "", "sqlType": None, "mysqlType": None, "data": None,
        "old": None, "_tidb": {"watermarkTs": ts},
    }).encode()


def test_forged_watermark_is_dead_lettered_and_later_rows_still_apply(
    broker: Any, spark: Any, tmp_path: Path, unique_name: Any, progress: ProgressLines
) -> None:
    topic = unique_name("forged-wm")
    oracle, messages, cfg, _ = _setup(broker, topic, tmp_path)
    third = len(messages) // 3
    broker.produce_many(topic, messages[:third])
    broker.produce_many(topic, [(0, None, _watermark(FORGED))])
    broker.produce_many(topic, messages[third:])
    run_job(cfg, once=True, spark=spark)
    _assert_matches(cfg, oracle)  # without the check: every later row of partition 0 was a "replay"
    dead = read_table(cfg.dead_letter_path).to_pylist()
    assert len(dead) == 1
    assert dead[0]["partition"] == 0 and dead[0]["offset"] == sum(1 for m in messages[:third] if m[0] == 0)
    assert bytes(dead[0]["value"]) == _watermark(FORGED)
    assert f"resolved ts {FORGED}" in dead[0]["error"] and "1h ahead of the reference clock" in dead[0]["error"]
    assert sum(line["implausible_ts"] for line in progress.lines) == 1


def test_row_with_forged_commit_ts_stops_under_fail_on_error_then_is_dead_lettered(
    broker: Any, spark: Any, tmp_path: Path, unique_name: Any, progress: ProgressLines
) -> None:
    topic = unique_name("forged-row")
    oracle, messages, cfg, yaml_path = _setup(broker, topic, tmp_path)
    # a second copy of a row change, its commit ts forged (the original still applies)
    n, original = next((i, m) for i, m in enumerate(messages) if m[2] and b'"isDdl":false' in m[2])
    body = json.loads(original[2])
    body["_tidb"]["commitTs"] = FORGED
    forged = json.dumps(body).encode()
    broker.produce_many(topic, messages[: n + 1] + [(original[0], original[1], forged)] + messages[n + 1:])
    strict = config_from_mapping({**json.loads(yaml_path.read_text()), "dead_letter": {"fail_on_error": True}})
    with pytest.raises(ImplausibleTimestampError, match=r"1 event\(s\) with an implausible ts .* first at "):
        run_job(strict, once=True, spark=spark)
    assert not Path(cfg.dead_letter_path).exists()  # nothing of the batch was committed
    run_job(cfg, once=True, spark=spark)
    _assert_matches(cfg, oracle)
    dead = read_table(cfg.dead_letter_path).to_pylist()
    assert len(dead) == 1
    assert dead[0]["partition"] == original[0] and bytes(dead[0]["value"]) == forged
    assert f"commit ts {FORGED}" in dead[0]["error"] and "ahead of the reference clock" in dead[0]["error"]
    assert sum(line["implausible_ts"] for line in progress.lines) == 1


def test_spark_checkpoint_deleted_stops_then_reset_from_state_loses_nothing(
    broker: Any, spark: Any, tmp_path: Path, unique_name: Any
) -> None:
    topic = unique_name("ckpt-gone")
    oracle, messages, cfg, yaml_path = _setup(broker, topic, tmp_path, max_offsets_per_trigger=150)
    half = len(messages) // 2
    broker.produce_many(topic, messages[:half])
    assert run_job(cfg, once=True, spark=spark) >= 2
    held = StateStore(str(tmp_path / "ckpt" / "state"), "ck").load()
    # rows wait for the other partition: they must survive (spark engine: in the staging table)
    assert held is not None and (held.held or held.meta["rows_held"])

    shutil.rmtree(tmp_path / "ckpt" / "spark")
    broker.produce_many(topic, messages[half:])
    with pytest.raises(CheckpointMismatchError, match="the Spark checkpoint was deleted or replaced") as info:
        run_job(cfg, once=True, spark=spark)
    assert "reset --config" in str(info.value)

    assert main(["reset", "--config", str(yaml_path), "--from", "state"]) == EXIT_USAGE  # no --yes: nothing
    assert (tmp_path / "ckpt" / "state").exists()
    assert main(["reset", "--config", str(yaml_path), "--from", "state", "--yes"]) == EXIT_OK
    assert not (tmp_path / "ckpt" / "spark").exists()
    after = StateStore(str(tmp_path / "ckpt" / "state"), "ck").load()
    assert after is not None and after.batch_id == RESET_BATCH_ID and after.held == held.held
    assert after.meta.get("staging_batch") == held.meta.get("staging_batch")
    assert after.meta["resets"] == 1 and after.meta["epoch"] != held.meta["epoch"]

    assert run_job(cfg, once=True, spark=spark) >= 1
    _assert_matches(cfg, oracle)
    staging = tmp_path / "ckpt" / "staging"
    if held.meta.get("staging_batch") is not None and staging.exists():  # spark engine
        # the old epoch's held rows are cleaned up by the first batch after the reset (batch 0 again)
        old_app = f"{cfg.changefeed}~{held.meta['epoch']}"
        assert held.meta["staging_app"] == old_app
        assert [r for r in read_table(str(staging)).to_pylist() if r["app"] == old_app] == []
        # and their files are gone too (VACUUM after the clean-up): only the live ones stay
        from deltalake import DeltaTable as RsTable

        live = {Path(f).name for f in RsTable(str(staging)).file_uris()}
        assert {p.name for p in staging.rglob("*.parquet")} == live


def test_state_deleted_stops_then_reset_from_earliest_rebuilds(
    broker: Any, spark: Any, tmp_path: Path, unique_name: Any
) -> None:
    topic = unique_name("state-gone")
    oracle, messages, cfg, yaml_path = _setup(broker, topic, tmp_path, max_offsets_per_trigger=200)
    half = len(messages) // 2
    broker.produce_many(topic, messages[:half])
    assert run_job(cfg, once=True, spark=spark) >= 2

    shutil.rmtree(tmp_path / "ckpt" / "state")
    broker.produce_many(topic, messages[half:])
    with pytest.raises(CheckpointMismatchError, match="is missing or empty, but the Spark checkpoint .* the state "
                                                      "was deleted"):
        run_job(cfg, once=True, spark=spark)

    # the documented rebuild: drop the tables, start over from the earliest offsets
    shutil.rmtree(tmp_path / "lake")
    assert main(["reset", "--config", str(yaml_path), "--from", "earliest", "--yes"]) == EXIT_OK
    assert run_job(cfg, once=True, spark=spark) >= 2
    _assert_matches(cfg, oracle)


def test_reset_to_explicit_offsets_starts_there_in_a_new_epoch(
    broker: Any, spark: Any, tmp_path: Path, unique_name: Any, progress: ProgressLines
) -> None:
    topic = unique_name("reset-offsets")
    oracle, messages, cfg, yaml_path = _setup(broker, topic, tmp_path, events=200)
    broker.produce_many(topic, messages)
    run_job(cfg, once=True, spark=spark)
    _assert_matches(cfg, oracle)
    ends = {p: sum(1 for m in messages if m[0] == p) for p in (0, 1)}

    assert main(["reset", "--config", str(yaml_path), "--offset", f"{topic}:0={ends[0] - 1}",
                 "--offset", f"{topic}:1={ends[1]}", "--yes"]) == EXIT_OK
    progress.lines.clear()
    assert run_job(cfg, once=True, spark=spark) == 1
    (line,) = progress.lines
    assert line["batch_id"] == 0  # a new query, batch 0 — and it was not skipped as "already committed"
    assert line["offsets"] == {f"{topic}[0]": {"first": ends[0] - 1, "last": ends[0] - 1}}
    _assert_matches(cfg, oracle)
    state = StateStore(str(tmp_path / "ckpt" / "state"), "ck").load()
    assert state is not None and state.batch_id == 0 and state.meta["resets"] == 1
    assert "reset" not in state.meta and "starting_offsets" not in state.meta


def test_two_jobs_on_one_checkpoint_is_one_clear_terminal_error(
    broker: Any, spark: Any, tmp_path: Path, unique_name: Any
) -> None:
    import threading

    from ticdc_delta.cli import exit_code_for
    from ticdc_delta.errors import ConcurrentJobError

    topic = unique_name("two-jobs")
    _, messages, cfg, _ = _setup(broker, topic, tmp_path, events=100)
    broker.produce_many(topic, messages)
    first_error: list[BaseException] = []

    def continuous() -> None:
        try:
            run_job(cfg, once=False, spark=spark)
        except BaseException as exc:  # noqa: BLE001 - checked below
            first_error.append(exc)

    runner = threading.Thread(target=continuous, daemon=True)
    runner.start()
    name = "ticdc_delta_ck"
    try:
        import time

        def running() -> Any:
            return next((q for q in spark.streams.active if q.name == name), None)

        deadline = time.monotonic() + 180
        # the first job is up and has committed its batch (stopping it mid-batch would be another test)
        while (running() is None or running().lastProgress is None) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert running() is not None and running().lastProgress is not None, first_error
        with pytest.raises(ConcurrentJobError, match=f"another job of this changefeed is running on checkpoint {tmp_path / 'ckpt'}") as info:
            run_job(cfg, once=True, spark=spark)
        assert "\n" not in str(info.value) and exit_code_for(info.value) == 1
    finally:
        for q in spark.streams.active:
            if q.name == name:
                q.stop()
        runner.join(60)
    assert not first_error


def test_whole_checkpoint_deleted_starts_over_without_skipping_batch_0(
    broker: Any, spark: Any, tmp_path: Path, unique_name: Any
) -> None:
    """Checkpoint and state deleted together, the lake kept: the new run's batch 0 must not be taken for
    the old run's batch 0 (the tables hold its Delta app transactions)."""
    topic = unique_name("fresh-again")
    oracle, messages, cfg, _ = _setup(broker, topic, tmp_path)
    half = len(messages) // 2
    broker.produce_many(topic, messages[:half])
    run_job(cfg, once=True, spark=spark)
    shutil.rmtree(tmp_path / "ckpt")
    broker.produce_many(topic, messages[half:])
    run_job(cfg, once=True, spark=spark)
    _assert_matches(cfg, oracle)
