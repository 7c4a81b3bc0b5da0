"""What the ``spark`` engine (sink.engine: spark) promises beyond landing the right final tables (issue 9).

- Every Delta version of every target table is the upstream table after some upstream transaction, in
  upstream order: no version shows half a transaction or half a primary-key change.
- The driver's Python heap does not grow with the micro-batch: the rows stay on the executors.
- SIGKILL of the driver (and its JVM) at random moments, then a restart: the oracle, no transaction twice.
- A commit by another writer between a MERGE's snapshot and its commit is a conflict the engine retries:
  observed, and nothing lost or doubled.

``make test`` runs the version and conflict tests; ``make soak`` (``TICDC_DELTA_SOAK=1``) runs all four,
bigger: the driver-memory test at 10k → 200k changes, more and smaller micro-batches in the version test,
six kills (each test takes minutes on 2 cores: a fresh job process and JVM per kill, two large batches).
"""

from __future__ import annotations

import json
import os
import random
import time
import tracemalloc
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable

from ticdc_delta.config import load_config
from ticdc_delta.delta.sink import STEPS_PER_BATCH
from ticdc_delta.simulator import simulate
from ticdc_delta.simulator.oracle import OracleColumn, TableOracle
from ticdc_delta.simulator.output import KafkaSink
from ticdc_delta.simulator.workload import Workload
from ticdc_delta.spark import engine as spark_engine
from ticdc_delta.spark.batch_handler import _ConfiguredSink
from ticdc_delta.spark.job import run_job
from ticdc_delta.spark.jvm_heap import BatchHeapSampler
from ticdc_delta.verify import _expected

from .conftest import capture_logs
from .test_crash_restart import _kill_group, _start
from .test_end_to_end import _assert_matches, _stream
from .test_spark_engine import _assert_each_txn_committed_once, _config

pytestmark = pytest.mark.integration

SOAK = os.environ.get("TICDC_DELTA_SOAK") == "1"


# --- 1. every Delta version is the upstream table after some transaction --------------------------------


def _upstream_history(seed: int, events: int, tables: int) -> dict[str, list[TableOracle]]:
    """Per table, its upstream state after every commit that touched it (creation, DDL, transactions),
    in commit order: the same workload the simulator streamed (same seed and sizes, deterministic)."""
    workload = Workload(seed, events, tables)
    index = {spec.qualified: i for i, spec in enumerate(workload.tables)}
    raw: dict[str, list[list[tuple[Any, ...]]]] = {}
    for commit in workload.commits():
        touched = {f"{r.schema}.{r.table}" for r in commit.rows}
        if commit.ddl is not None and commit.ddl.table:
            touched.add(f"{commit.ddl.schema}.{commit.ddl.table}")
        for name in sorted(touched):
            rows = [values for _, values in sorted(workload.states[index[name]].rows.items())]
            raw.setdefault(name, []).append(rows)
    history: dict[str, list[TableOracle]] = {}
    for name, states in raw.items():
        spec = workload.tables[index[name]]
        columns = [OracleColumn.from_spec(c) for c in spec.columns]  # the final columns; NULL before added
        names = [c.name for c in spec.columns]
        history[name] = [
            TableOracle(spec.schema, spec.table, spec.key_names, columns,
                        [dict(zip(names, v + (None,) * (len(names) - len(v)))) for v in rows])
            for rows in states
        ]
    return history


def _same_form(value: Any) -> Any:
    """One spelling per value (an instant in UTC whatever its tzinfo object), so ``repr`` compares values."""
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(timezone.utc)
    return value


def _canonical(rows: dict[tuple[Any, ...], dict[str, Any]], names: list[str]) -> tuple[str, ...]:
    """A table's rows as one comparable value (sorted, order-free)."""
    return tuple(sorted(repr(tuple(_same_form(row.get(n)) for n in names)) for row in rows.values()))


def _version_rows(path: str, version: int, names: list[str], key: tuple[str, ...]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The rows of one Delta version in the oracle's column names (a column the version lacks reads NULL)."""
    data = pa.table(DeltaTable(path, version=version).scan())
    have = {n.lower(): n for n in data.column_names}
    extra = set(have) - {n.lower() for n in names}
    assert not extra, f"{path}@{version}: columns the upstream table never had: {sorted(extra)}"
    cols = {n: (data.column(have[n.lower()]).to_pylist() if n.lower() in have else [None] * data.num_rows)
            for n in names}
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for i in range(data.num_rows):
        row = {n: cols[n][i] for n in names}
        k = tuple(row[c] for c in key)
        assert k not in out, f"{path}@{version}: key {k} twice"
        out[k] = row
    return out


def test_every_delta_version_is_an_upstream_state(broker: Any, spark: Any, tmp_path: Path, unique_name: Any,
                                                  progress: Any) -> None:
    """Small micro-batches (rows held for the slowest partition, duplicates, a replay, PK changes split
    into DELETE + INSERT, ADD COLUMN): each version of each table equals the upstream table after one of
    its transactions, and the versions follow the upstream order."""
    seed, tables = 17, 3
    events, per_batch = (400, 10) if SOAK else (250, 4)  # stream size, its share per micro-batch
    topic = unique_name("versions")
    oracle, source = _stream(broker, topic, "open-protocol", tmp_path, events=events, seed=seed, tables=tables)
    assert oracle.counts["pk_change_splits"] > 0
    source["max_offsets_per_trigger"] = max(10, oracle.counts["messages"] // per_batch)
    # batches that apply no DDL on the columnar path (collapsed by Spark), the others on the record path
    cfg = _config(tmp_path, "job", source, "spark", sink={"columnar_rows": 1})
    assert run_job(cfg, once=True, spark=spark) >= per_batch
    _assert_matches(cfg, oracle)
    assert any(line.get("columnar_tables") for line in progress.lines)

    history = _upstream_history(seed, events, tables)
    assert sorted(history) == sorted(oracle.tables)
    sink = _ConfiguredSink(cfg)
    tz = cfg.sink.source_timezone
    checked = 0
    for name, states in sorted(history.items()):
        t = oracle.tables[name]
        assert states[-1].rows == t.rows, f"{name}: the replayed workload is not the simulated one"
        names = [c.name for c in t.columns]
        positions: dict[tuple[str, ...], list[int]] = {}
        for i, state in enumerate(states):
            positions.setdefault(_canonical(_expected(state, tz), names), []).append(i)
        path = sink.table_path(t.schema, t.table)
        latest = DeltaTable(path).version()
        at = 0
        for version in range(latest + 1):
            got = _canonical(_version_rows(path, version, names, t.key), names)
            later = [i for i in positions.get(got, []) if i >= at]
            assert later, (f"{name} version {version} ({len(got)} rows) is no upstream state at or after "
                           f"transaction {at} of the table")
            at = later[0]
            checked += 1
    assert checked > 3 * len(history)  # many versions, not just the final ones


# --- 2. the driver's heap does not grow with the micro-batch ---------------------------------------------


def _driver_peak(broker: Any, spark: Any, tmp: Path, topic: str, events: int) -> int:
    """Bytes of the driver's peak Python heap above its start while one micro-batch of ``events`` row
    changes (tables as large as the batch: the MERGE sources grow with it) is applied.

    A resolved ts every 60 transactions rather than the simulator's 6: the driver takes every resolved
    mark of a batch (coordination, a few hundred bytes each; TiCDC sends one a second per partition), and
    with one every 6 transactions they grow with the batch as the rows would (measured: 0.5 MiB at 5k
    changes, 2.8 MiB at 50k)."""
    options = {"max-batch-size": "64"}
    result = simulate("open-protocol", options, seed=5, events=events, tables=3, partitions=3,
                      sink=KafkaSink(broker.bootstrap_servers, topic, 3), topic=topic, max_rows_per_table=events,
                      resolved_interval=60)
    source = {"bootstrap_servers": broker.bootstrap_servers, "topic": topic, "protocol": "open-protocol",
              "options": options}
    cfg = _config(tmp, topic, source, "spark")
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        batches = run_job(cfg, once=True, spark=spark)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert batches == 1  # the whole stream in one micro-batch
    _assert_matches(cfg, result.oracle)
    return peak


@pytest.mark.skipif(not SOAK, reason="minutes on 2 cores: make soak runs it")
def test_driver_heap_bounded_as_the_batch_grows(broker: Any, spark: Any, tmp_path: Path, unique_name: Any) -> None:
    small, large = (10_000, 200_000) if SOAK else (5_000, 50_000)
    _driver_peak(broker, spark, tmp_path, unique_name("heap-warmup"), 300)  # imports, caches, the JVM's warm-up
    peak_small = _driver_peak(broker, spark, tmp_path, unique_name("heap-small"), small)
    peak_large = _driver_peak(broker, spark, tmp_path, unique_name("heap-large"), large)
    print(f"driver Python heap peak: {small} changes {peak_small / 2**20:.1f} MiB, "
          f"{large} changes {peak_large / 2**20:.1f} MiB")
    ratio = large // small
    assert peak_large < 3 * peak_small + 8 * 2**20, (
        f"driver heap grew with the batch: {peak_small} B at {small} changes, {peak_large} B at {large} "
        f"({ratio}x the changes)")


# --- 2b. the driver's JVM heap does not grow with the number of micro-batches ---------------------------


def test_driver_jvm_keeps_no_session_per_batch(broker: Any, spark: Any, tmp_path: Path, unique_name: Any) -> None:
    """Many micro-batches of three tables (so MERGEs in threads, frames persisted, staging appends): the
    driver's JVM holds as many sessions after the 16th batch as after the 4th. Spark's cache manager used to
    copy the session for every ``persist`` and Delta's re-cache after every commit, and each batch's merge
    threads made new sessions: ~5 sessions that were never freed, per batch, and a heap that grew until a
    long-running job ran out of it (~20 more sessions after the 8th batch than after the 4th)."""
    topic = unique_name("sessions")
    oracle, source = _stream(broker, topic, "canal-json", tmp_path, events=300, seed=11, tables=3)
    source["max_offsets_per_trigger"] = max(10, oracle.counts["messages"] // 10)
    cfg = _config(tmp_path, "job", source, "spark", sink={"merge_threads": 3})
    sampler = BatchHeapSampler(spark, 4)
    with capture_logs("ticdc_delta.progress", sampler):
        assert run_job(cfg, once=True, spark=spark) >= 8
    _assert_matches(cfg, oracle)
    sessions = {s["batch"]: s["sessions"] for s in sampler.samples}
    print(f"live SparkSession objects in the driver's JVM after batches 4, 8, ...: {sessions}")
    assert sessions[8] - sessions[4] <= 2, (
        f"the driver's JVM gained {sessions[8] - sessions[4]} sessions in 4 micro-batches")


# --- 3. SIGKILL at random moments, then restart -----------------------------------------------------------


@pytest.mark.skipif(not SOAK, reason="minutes on 2 cores: make soak runs it")
def test_spark_engine_sigkill_at_random_moments_then_restart(broker: Any, tmp_path: Path, unique_name: Any) -> None:
    rnd = random.Random(int(os.environ.get("TICDC_DELTA_SOAK_SEED", "20261123")))
    topic = unique_name("skill")
    events, kills_wanted = (6000, 6) if SOAK else (600, 1)
    options = {"max-batch-size": "4"}
    result = simulate("open-protocol", options, seed=23, events=events, tables=3, partitions=3,
                      sink=KafkaSink(broker.bootstrap_servers, topic, 3), topic=topic)
    cfg_path = tmp_path / "job.yaml"
    lake = tmp_path / "lake"
    cfg_path.write_text(yaml.safe_dump({
        "changefeed": "skill",
        "source": {"bootstrap_servers": broker.bootstrap_servers, "topic": topic, "protocol": "open-protocol",
                   "options": options, "max_offsets_per_trigger": max(20, result.summary["messages"] // 6)},
        "sink": {"path": str(lake), "engine": "spark"},
        "checkpoint": str(tmp_path / "ckpt"),
        "log_level": "WARNING",
    }))
    log = tmp_path / "driver.log"
    kills = 0
    for _attempt in range(kills_wanted + 6):
        proc = _start(cfg_path, log)
        try:
            if kills < kills_wanted:
                # a random moment once this run commits something (a JVM start takes the first seconds)
                before = _commits(lake)
                while proc.poll() is None and _commits(lake) == before:
                    time.sleep(0.1)
                deadline = time.monotonic() + rnd.uniform(0.0, 4.0)
                while time.monotonic() < deadline and proc.poll() is None:
                    time.sleep(0.05)
                if proc.poll() is None:
                    _kill_group(proc)
                    kills += 1
                    continue
            assert proc.wait(timeout=1800) == 0, log.read_text()[-4000:]  # a hang guard only
            break
        finally:
            if proc.poll() is None:  # the test failed with the job running: it must not outlive the test
                _kill_group(proc)
    else:
        pytest.fail("the job never completed")
    assert kills >= 1, "no run was killed: the test proved nothing"
    cfg = load_config(cfg_path)
    _assert_matches(cfg, result.oracle)
    _assert_each_txn_committed_once(lake)


def _commits(lake: Path) -> int:
    return sum(1 for _ in lake.rglob("_delta_log/*.json")) if lake.exists() else 0


# --- 4. another writer's commit during a MERGE -----------------------------------------------------------


@pytest.mark.parametrize("path", ["records", "columnar"])
def test_spark_engine_retries_a_conflict_with_another_writer(path: str, broker: Any, spark: Any, tmp_path: Path,
                                                             unique_name: Any, monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture, progress: Any) -> None:
    """Another writer (delta-rs) changes a target table's metadata while a MERGE into it runs (the engine's
    test hook, on the executor, between the MERGE's snapshot and its commit): Delta refuses the MERGE's
    commit, the engine retries it, and the tables equal the oracle with every transaction once — whether
    the MERGE's source comes from the record path or the columnar path."""
    topic = unique_name("conflict")
    # no ADD COLUMN: the batches after the CREATE TABLEs apply no DDL (the columnar path takes only those)
    oracle, source = _stream(broker, topic, "canal-json", tmp_path, events=300, seed=31, add_columns=False)
    source["max_offsets_per_trigger"] = max(50, oracle.counts["messages"] // 3)
    cfg = _config(tmp_path, "job", source, "spark", sink={"columnar_rows": 1 if path == "columnar" else 0})
    marker_dir = tmp_path / "other-writer"
    marker_dir.mkdir()
    marker = str(marker_dir / "committed")

    def other_writer(table: str, source: str) -> None:  # on an executor: once, on the first MERGE with data to
        import os as _os                                # read whose source comes from the path under test

        from deltalake import DeltaTable as _DeltaTable

        if source != path:
            return
        try:
            fd = _os.open(marker, _os.O_CREAT | _os.O_EXCL | _os.O_WRONLY)
        except FileExistsError:
            return
        _os.write(fd, table.encode())
        _os.close(fd)
        _DeltaTable(table).alter.set_table_description("changed by another writer during a MERGE")

    monkeypatch.setattr(spark_engine, "MERGE_SOURCE_HOOK", other_writer)
    with caplog.at_level("WARNING", logger="ticdc_delta.spark.engine"):
        assert run_job(cfg, once=True, spark=spark) >= 2
    assert os.path.exists(marker), "the other writer never ran"
    conflicts = [r.getMessage() for r in caplog.records if "conflict with another writer" in r.getMessage()]
    assert conflicts, "no conflict was observed: the test proved nothing"
    assert any("merge into" in c for c in conflicts), conflicts
    _assert_matches(cfg, oracle)
    _assert_each_txn_committed_once(tmp_path / "job" / "lake")
    # the retried MERGE is the commit after the other writer's: its batch took the path under test
    table = Path(Path(marker).read_text())
    commits = [[json.loads(line) for line in c.read_text().splitlines()]
               for c in sorted((table / "_delta_log").glob("*.json"))]
    other = next(i for i, actions in enumerate(commits) if any(
        a.get("metaData", {}).get("description") for a in actions))
    txn = next(a["txn"] for a in commits[other + 1] if "txn" in a)
    line = next(line for line in progress.lines if line["batch_id"] == txn["version"] // STEPS_PER_BATCH)
    name = f"{table.parent.name}.{table.name}"
    assert (name in line.get("columnar_tables", [])) == (path == "columnar"), (name, line)
