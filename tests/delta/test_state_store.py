"""StateStore: the job's state in one Delta table, one overwrite commit per micro-batch."""

from __future__ import annotations

import glob
import os
import re
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable, write_deltalake

from ticdc_delta.delta.sink import read_table
from ticdc_delta.delta.state_store import STATE_SCHEMA, PipelineState, StateStore
from ticdc_delta.errors import SinkError

pytestmark = pytest.mark.integration

APP = "job-1"


@pytest.fixture
def store(tmp_path: Path) -> StateStore:
    return StateStore(str(tmp_path / "_state"), APP)


def sample(batch_id: int, n_held: int = 3) -> PipelineState:
    return PipelineState(
        batch_id=batch_id,
        watermarks={
            ("tidb-cdc", 0): 415508878783938562 + batch_id,
            ("tidb-cdc", 1): 415508881418485761,
            ("other 表", 7): 0,
        },
        held=[f"row-{batch_id}-{i}".encode() + b"\x00\xff" for i in range(n_held)],
        meta={
            "applied_ddl": ["ddl-1", "ddl-2"],
            "table_ts": {"test.all_types": 415508878783938562},
            "rows": batch_id * 10,
        },
    )


def test_nothing_saved_yet(store: StateStore) -> None:
    assert store.load() is None
    assert store.committed_batch_id() is None


def test_save_load_round_trip(store: StateStore) -> None:
    state = sample(0)
    assert store.save(0, state) is True
    assert store.load() == state
    assert store.committed_batch_id() == 0
    # one commit, carrying the app transaction
    dt = DeltaTable(store.path)
    assert dt.version() == 0 and dt.transaction_version(APP) == 0


def test_resaving_the_same_batch_does_nothing(store: StateStore) -> None:
    store.save(4, sample(4))
    other = sample(4, n_held=9)
    other.meta["rows"] = -1
    assert store.save(4, other) is False
    assert store.save(3, sample(3)) is False  # older batches too
    assert store.load() == sample(4)
    assert DeltaTable(store.path).version() == 0


def test_a_later_batch_replaces_the_state(store: StateStore) -> None:
    store.save(1, sample(1, n_held=5))
    later = PipelineState(batch_id=2, watermarks={("tidb-cdc", 0): 99}, held=[b"only"], meta={})
    assert store.save(2, later) is True
    assert store.load() == later
    assert store.committed_batch_id() == 2


def test_empty_held_and_watermarks(store: StateStore) -> None:
    empty = PipelineState(batch_id=0)
    store.save(0, empty)
    assert store.load() == empty
    assert read_table(store.path).num_rows == 1  # just the 'state' row


def test_held_order_is_kept(store: StateStore) -> None:
    held = [bytes([i % 256]) * (i % 7) + i.to_bytes(4, "big") for i in range(2000)][::-1]
    store.save(0, PipelineState(batch_id=0, held=held))
    loaded = store.load()
    assert loaded is not None and loaded.held == held


def test_large_held_list(store: StateStore) -> None:
    held = [i.to_bytes(8, "big") * 12 for i in range(50_000)]  # 50k items of 96 bytes
    state = PipelineState(batch_id=1, watermarks={("t", p): p for p in range(64)}, held=held, meta={"n": 50_000})
    t0 = time.perf_counter()
    store.save(1, state)
    t1 = time.perf_counter()
    loaded = store.load()
    t2 = time.perf_counter()
    assert loaded == state
    print(f"\n50k held rows: save {t1 - t0:.3f}s, load {t2 - t1:.3f}s")


def test_vacuum_keeps_only_the_live_files(tmp_path: Path) -> None:
    store = StateStore(str(tmp_path / "_state"), APP, vacuum_every=3)
    for b in range(3):
        store.save(b, sample(b))
    assert len(glob.glob(os.path.join(store.path, "*.parquet"))) == 1
    assert store.load() == sample(2)
    assert store.save(3, sample(3)) is True  # the vacuum's own commits are not "another job"
    assert store.load() == sample(3)


def test_short_runs_vacuum_too(tmp_path: Path) -> None:
    """A job run ``--once`` saves a few times per process: the vacuum follows the table's versions, not
    one object's saves (each run here saves twice, below ``vacuum_every``)."""
    path = str(tmp_path / "_state")
    for run in range(6):
        store = StateStore(path, APP, vacuum_every=4)
        store.load()
        for b in (2 * run, 2 * run + 1):
            assert store.save(b, sample(b)) is True
    files = glob.glob(os.path.join(path, "*.parquet"))
    assert len(files) <= 4, files  # 12 saves: vacuumed along the way, not 12 files
    assert StateStore(path, APP).load() == sample(11)


@pytest.mark.parametrize(
    "batch_id,state,error,match",
    [
        (1, sample(2), ValueError, "differs from batch_id 1"),
        (-1, sample(-1), ValueError, "batch_id must be an int >= 0"),
        (0, PipelineState(0, held=["text"]), TypeError, r"held\[0\] must be bytes"),  # type: ignore[list-item]
        (0, PipelineState(0, watermarks={"t": 1}), TypeError, "watermark keys"),  # type: ignore[dict-item]
        (0, PipelineState(0, watermarks={("t", 0): -5}), ValueError, "must be an int in"),
        (0, PipelineState(0, meta={"x": {1, 2}}), ValueError, "not JSON-able"),
    ],
)
def test_save_argument_checks(
    store: StateStore, batch_id: int, state: PipelineState, error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        store.save(batch_id, state)
    assert store.load() is None


def test_a_table_without_one_state_row_is_refused(store: StateStore) -> None:
    write_deltalake(store.path, STATE_SCHEMA.empty_table(), mode="overwrite")
    assert store.load() is None
    rows = PipelineState(0)
    store.save(0, rows)
    table = read_table(store.path)
    write_deltalake(store.path, table, mode="append")  # two 'state' rows
    with pytest.raises(SinkError, match="expected 1 'state' row, found 2"):
        store.load()


def test_a_damaged_state_table_is_a_sink_error_naming_it(store: StateStore) -> None:
    """Regression: a state table whose latest commit file is damaged (a torn upload) made delta-rs' own error,
    with a Rust backtrace, reach ``status`` and ``reset`` as a traceback. It is a one-line SinkError naming the
    state table, from every way in."""
    store.save(0, sample(0))
    latest = sorted(glob.glob(os.path.join(store.path, "_delta_log", "*.json")))[-1]
    Path(latest).write_text("{not json\n")
    damaged = StateStore(store.path, APP)
    for call in (damaged.load, damaged.committed_batch_id, lambda: damaged.save(1, sample(1))):
        where = re.escape(store.path)
        with pytest.raises(SinkError, match=rf"^cannot read the job state table at {where}: .*Json error") as e:
            call()
        assert "\n" not in str(e.value)


def test_constructor_checks(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="app_id"):
        StateStore(str(tmp_path), "")


def test_a_second_writer_is_a_terminal_error_not_an_interleaving(tmp_path: Path) -> None:
    from ticdc_delta.errors import ConcurrentJobError

    path = str(tmp_path / "_state")
    job_a, job_b = StateStore(path, APP), StateStore(path, APP)
    job_a.save(0, sample(0))
    assert job_a.load() == job_b.load() == sample(0)
    assert job_a.save(1, sample(1)) is True
    with pytest.raises(ConcurrentJobError, match="expected version 0 .* found version 1: another job is running") as info:
        job_b.save(1, sample(1))
    assert not info.value.retryable
    with pytest.raises(ConcurrentJobError, match="another job"):
        job_b.save(2, sample(2))  # not a later batch either
    assert job_a.save(2, sample(2)) is True  # the first job goes on
    assert StateStore(path, APP).load() == sample(2)


def test_a_store_that_created_nothing_sees_a_table_created_by_another(tmp_path: Path) -> None:
    from ticdc_delta.errors import ConcurrentJobError

    path = str(tmp_path / "_state")
    job_a, job_b = StateStore(path, APP), StateStore(path, APP)
    assert job_a.load() is None and job_b.load() is None
    job_a.save(0, sample(0))
    with pytest.raises(ConcurrentJobError, match="expected no table"):
        job_b.save(0, sample(0))


def test_reset_replaces_the_state_and_a_running_job_notices(tmp_path: Path) -> None:
    from ticdc_delta.delta.state_store import RESET_BATCH_ID
    from ticdc_delta.errors import ConcurrentJobError

    path = str(tmp_path / "_state")
    running = StateStore(path, APP)
    running.save(0, sample(0))
    StateStore(path, APP).reset(PipelineState(RESET_BATCH_ID, meta={"epoch": 1}))
    assert StateStore(path, APP).load() == PipelineState(RESET_BATCH_ID, meta={"epoch": 1})
    with pytest.raises(ConcurrentJobError, match="reset"):
        running.save(1, sample(1))
    fresh = StateStore(path, APP)
    fresh.load()
    assert fresh.save(0, sample(0), app_id=APP + "~1") is True  # a new epoch starts at batch 0 again
    assert fresh.load() == sample(0)


def test_the_state_table_checkpoints_often_and_keeps_little_history(tmp_path: Path) -> None:
    """Made with STATE_TABLE_PROPERTIES: a checkpoint every 10 saves, so a load replays at most 9 commits."""
    from ticdc_delta.delta.state_store import STATE_TABLE_PROPERTIES

    store = StateStore(str(tmp_path / "_state"), APP, vacuum_every=0)
    for b in range(12):
        store.save(b, sample(b))
    assert STATE_TABLE_PROPERTIES.items() <= DeltaTable(store.path).metadata().configuration.items()
    assert glob.glob(os.path.join(store.path, "_delta_log", "*.checkpoint.parquet"))
    assert store.load() == sample(11)


def test_a_state_table_made_without_the_properties_gets_them_before_its_next_save(tmp_path: Path) -> None:
    """A state table an earlier version made (Delta's defaults) gets STATE_TABLE_PROPERTIES in one commit of
    their own; a property somebody set stays; neither store takes that commit for another job's."""
    from ticdc_delta.delta.state_store import STATE_TABLE_PROPERTIES

    path = str(tmp_path / "_state")
    old = StateStore(path, APP)
    old.save(0, sample(0))
    # as an earlier version made it (Delta's defaults), with a setting of somebody's
    rows = read_table(path)
    (tmp_path / "_state").rename(tmp_path / "_moved")
    write_deltalake(path, rows, configuration={"delta.logRetentionDuration": "interval 2 days"})
    assert "delta.checkpointInterval" not in DeltaTable(path).metadata().configuration
    store = StateStore(path, APP)
    assert store.load() == sample(0)
    before = DeltaTable(path).version()
    assert store.save(1, sample(1)) is True
    assert DeltaTable(path).version() == before + 2  # the properties, then the state
    found = DeltaTable(path).metadata().configuration
    assert found["delta.logRetentionDuration"] == "interval 2 days"  # somebody's setting stays
    assert {k: v for k, v in STATE_TABLE_PROPERTIES.items() if k != "delta.logRetentionDuration"}.items() \
        <= found.items()
    assert store.save(2, sample(2)) is True  # its own properties commit is not "another job"
    assert StateStore(path, APP).load() == sample(2)
