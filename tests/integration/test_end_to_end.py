"""Simulator → real broker → real Spark job → real Delta tables, compared with the simulator's oracle.

Every protocol; several partitions and tables; duplicates, a TiCDC restart replay, primary-key changes,
deletes, CREATE TABLE / ADD COLUMN; small micro-batches so rows wait for the slowest partition; restarts
between batches and at every stage of a batch; garbage messages to the dead-letter table.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

from ticdc_delta.config import config_from_mapping
from ticdc_delta.delta.sink import TableIdent, read_table
from ticdc_delta.simulator import simulate
from ticdc_delta.simulator.output import KafkaSink
from ticdc_delta.spark.batch_handler import FAULT_ENV, InjectedFault, _ConfiguredSink
from ticdc_delta.spark.job import build_handler, run_job
from ticdc_delta.verify import compare_with_oracle
from tests.integration.conftest import job_engine

if TYPE_CHECKING:
    from tests.integration.conftest import ProgressLines

pytestmark = pytest.mark.integration

PROTOCOLS = {
    "open-protocol": {"max-batch-size": "4"},
    "craft": {"max-batch-size": "4"},
    "canal-json": {"enable-tidb-extension": "true"},
    "avro": {"enable-tidb-extension": "true"},
}


def _stream(broker: Any, topic: str, protocol: str, tmp: Path, *, events: int, seed: int = 3,
            partitions: int = 3, tables: int = 3, **extra: Any) -> tuple[Any, dict[str, Any]]:
    """Simulate into ``topic`` (``extra``: more of :class:`~ticdc_delta.simulator.Simulation`'s arguments);
    returns the oracle and the source section of the job config."""
    options = PROTOCOLS[protocol]
    if protocol == "avro":
        from ticdc_delta.codec.avro import AvroSchemas

        extra["schemas"] = AvroSchemas()
    result = simulate(protocol, options, seed=seed, events=events, tables=tables, partitions=partitions,
                      sink=KafkaSink(broker.bootstrap_servers, topic, partitions), topic=topic, **extra)
    source: dict[str, Any] = {
        "bootstrap_servers": broker.bootstrap_servers, "topic": topic, "protocol": protocol, "options": options,
    }
    if protocol == "avro":
        schemas = extra["schemas"]
        files = {}
        for sid in sorted(schemas.known_ids):
            path = tmp / f"schema-{sid}.avsc"
            path.write_text(schemas.get(sid))
            files[sid] = str(path)
        source["avro_schemas"] = files
    return result.oracle, source


def _config(tmp: Path, source: dict[str, Any], **extra: Any) -> Any:
    data = {
        "changefeed": "it",
        "source": source,
        "sink": {"path": str(tmp / "lake"), "engine": job_engine()},
        "checkpoint": str(tmp / "ckpt"),
        **extra,
    }
    return config_from_mapping(data)


def _assert_matches(cfg: Any, oracle: Any) -> None:
    diffs = compare_with_oracle(_ConfiguredSink(cfg), oracle, tz=cfg.sink.source_timezone)
    bad = [d.describe() for d in diffs if not d.ok]
    assert not bad, "\n".join(bad + _what_happened(cfg, [d.name for d in diffs if not d.ok]))
    assert sum(d.actual_rows for d in diffs) > 0


def _what_happened(cfg: Any, tables: list[str]) -> list[str]:
    """For a failed comparison: the job's dead letters and each differing table's commits (operation and
    schema), so that a failure met once in CI explains itself."""
    import json

    lines = []
    try:
        letters = read_table(cfg.dead_letter_path)
        lines.append(f"dead letters: {letters.num_rows}: "
                     f"{letters.select([c for c in ('partition', 'offset', 'error') if c in letters.column_names]).to_pylist()[:5]}")
    except Exception as exc:  # noqa: BLE001 - a diagnostic: no table is an answer too
        lines.append(f"dead letters: {str(exc).splitlines()[0][:200]}")
    for name in tables:
        schema, table = name.split(".", 1)
        log = Path(cfg.table_path(schema, table)) / "_delta_log"
        for commit in sorted(log.glob("*.json")):
            actions = [json.loads(line) for line in commit.read_text().splitlines() if line.strip()]
            info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
            meta = next((a["metaData"] for a in actions if "metaData" in a), None)
            txn = next((a["txn"] for a in actions if "txn" in a), None)
            fields = ("" if meta is None else " schema " + ", ".join(
                f"{f['name']}:{f['type']}" for f in json.loads(meta["schemaString"])["fields"]))
            lines.append(f"{name} {commit.stem}: {info.get('operation')} txn {txn}{fields}"[:1500])
    return lines


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_protocol_end_to_end(protocol: str, broker: Any, spark: Any, tmp_path: Path, unique_name: Any,
                             progress: ProgressLines) -> None:
    topic = unique_name(f"e2e-{protocol}")
    oracle, source = _stream(broker, topic, protocol, tmp_path, events=1500)
    counts = oracle.counts
    assert counts.get("duplicate_messages", 0) > 0 and counts.get("replayed_messages", 0) > 0
    source["max_offsets_per_trigger"] = max(50, counts["messages"] // 4)
    cfg = _config(tmp_path, source)
    batches = run_job(cfg, once=True, spark=spark)
    assert batches >= 3
    _assert_matches(cfg, oracle)
    _LANDED[protocol] = _snapshot(cfg, oracle)
    if protocol != "avro":  # watermark mode: rows waited for the slowest partition across batches
        assert any(line["rows_held"] > 0 for line in progress.lines[:-1])
        assert sum(line["replays_dropped"] for line in progress.lines) > 0
        assert progress.lines[-1]["watermark"] is not None
    # a second run finds nothing new and changes nothing
    assert run_job(cfg, once=True, spark=spark) == 0
    _assert_matches(cfg, oracle)


# Tables each protocol's run produced (same seed, same upstream workload): compared across protocols below.
_LANDED: dict[str, dict[str, tuple[pa.Schema, list[tuple[Any, ...]]]]] = {}


def _snapshot(cfg: Any, oracle: Any) -> dict[str, tuple[pa.Schema, list[tuple[Any, ...]]]]:
    sink = _ConfiguredSink(cfg)
    out = {}
    for name in sorted(oracle.tables):
        data = sink.read(TableIdent(*name.split(".", 1)))
        cols = sorted(data.column_names)
        rows = sorted((tuple(r[c] for c in cols) for r in data.select(cols).to_pylist()), key=repr)
        out[name] = (pa.schema([data.schema.field(c) for c in cols]), rows)
    return out


def test_all_protocols_land_identical_tables() -> None:
    """The same upstream rows through each protocol give the same Delta types and values."""
    if len(_LANDED) < len(PROTOCOLS):
        pytest.skip("needs every test_protocol_end_to_end case of this run")
    reference = _LANDED["open-protocol"]
    for protocol, tables in _LANDED.items():
        assert tables.keys() == reference.keys(), protocol
        for name, (schema, rows) in tables.items():
            ref_schema, ref_rows = reference[name]
            assert [(f.name, f.type) for f in schema] == [(f.name, f.type) for f in ref_schema], (protocol, name)
            assert rows == ref_rows, (protocol, name)


STAGES = ["after_decode", "after_dead_letter", "after_merge", "before_state", "after_state"]


@pytest.mark.parametrize("stage", STAGES)
def test_restart_after_a_fault_at_each_stage(stage: str, broker: Any, spark: Any, tmp_path: Path,
                                             unique_name: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    topic = unique_name(f"fault-{stage}")
    oracle, source = _stream(broker, topic, "open-protocol", tmp_path, events=800, seed=11)
    source["max_offsets_per_trigger"] = 300
    cfg = _config(tmp_path, source)
    monkeypatch.setenv(FAULT_ENV, f"{stage}@1")
    with pytest.raises(InjectedFault, match=f"injected fault at {stage} of batch 1"):
        run_job(cfg, once=True, spark=spark, handler=build_handler(cfg))
    monkeypatch.delenv(FAULT_ENV)
    run_job(cfg, once=True, spark=spark, handler=build_handler(cfg))
    _assert_matches(cfg, oracle)


def test_stop_between_batches_and_resume(broker: Any, spark: Any, tmp_path: Path, unique_name: Any,
                                        progress: ProgressLines) -> None:
    """Half the stream, a stopped job, the other half, a restarted job: the oracle, nothing twice."""
    from ticdc_delta.simulator.output import MemorySink

    topic = unique_name("resume")
    memory = MemorySink()
    oracle = simulate("craft", PROTOCOLS["craft"], seed=5, events=900, tables=3, partitions=3, sink=memory,
                      topic=topic).oracle
    broker.create_topic(topic, 3)
    half = len(memory.messages) // 2
    broker.produce_many(topic, memory.messages[:half])
    source = {"bootstrap_servers": broker.bootstrap_servers, "topic": topic, "protocol": "craft",
              "options": PROTOCOLS["craft"], "max_offsets_per_trigger": max(20, len(memory.messages) // 6)}
    cfg = _config(tmp_path, source)
    assert run_job(cfg, once=True, spark=spark) >= 2
    held_at_stop = progress.lines[-1]["rows_held"]
    broker.produce_many(topic, memory.messages[half:])
    assert run_job(cfg, once=True, spark=spark) >= 2
    _assert_matches(cfg, oracle)
    assert held_at_stop > 0  # rows were held across the restart, durably
    batch_ids = [line["batch_id"] for line in progress.lines]
    assert batch_ids == sorted(set(batch_ids))  # no batch committed twice



@pytest.mark.parametrize("chosen", [None, "org.apache.spark.sql.execution.streaming.FileContextBasedCheckpointFileManager"])
def test_a_local_checkpoint_is_written_through_the_filesystem_unless_the_session_chose(
        chosen: str | None, broker: Any, spark: Any, tmp_path: Path, unique_name: Any) -> None:
    """The query of a job whose checkpoint is local writes its offsets and commits through Hadoop's
    FileSystem (Spark's default FileContext starts a process for each link lookup and permission there);
    a manager the session names wins, and the session's setting is as it was after the run."""
    from ticdc_delta.spark.job import CHECKPOINT_MANAGER_CONF, LOCAL_CHECKPOINT_MANAGER, query_name

    topic = unique_name("ckptfs")
    oracle, source = _stream(broker, topic, "canal-json", tmp_path, events=200)
    cfg = _config(tmp_path, {**source, "max_offsets_per_trigger": 100})
    seen: list[tuple[str, str]] = []

    class Recording:
        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

        def __call__(self, batch_df: Any, batch_id: int) -> None:
            for query in spark.streams.active:
                if query.name == query_name(cfg.changefeed):
                    run = query._jsq.streamingQuery()
                    seen.append((run.offsetLog().fileManager().getClass().getName(),
                                 run.commitLog().fileManager().getClass().getName()))
            self._inner(batch_df, batch_id)

    if chosen is not None:
        spark.conf.set(CHECKPOINT_MANAGER_CONF, chosen)
    try:
        assert run_job(cfg, once=True, spark=spark, handler=Recording(build_handler(cfg))) >= 2
        assert spark.conf.get(CHECKPOINT_MANAGER_CONF, None) == chosen
    finally:
        spark.conf.unset(CHECKPOINT_MANAGER_CONF)
    expected = chosen or LOCAL_CHECKPOINT_MANAGER
    assert len(seen) >= 2 and set(seen) == {(expected, expected)}
    assert run_job(cfg, once=True, spark=spark) == 0  # the checkpoint it wrote reads back: nothing left to do
    _assert_matches(cfg, oracle)

def test_garbage_goes_to_the_dead_letter_table(broker: Any, spark: Any, tmp_path: Path,
                                               unique_name: Any) -> None:
    topic = unique_name("garbage")
    oracle, source = _stream(broker, topic, "canal-json", tmp_path, events=400, seed=9, partitions=2)
    garbage = [(0, None, b"{not json"), (1, b"k", b"\x00\x01\x02"), (1, None, b'{"isDdl": "yes"}')]
    broker.produce_many(topic, garbage)
    cfg = _config(tmp_path, source)
    run_job(cfg, once=True, spark=spark)
    _assert_matches(cfg, oracle)
    dead = read_table(cfg.dead_letter_path).to_pylist()
    assert sorted(bytes(r["value"]) for r in dead) == sorted(v for _, _, v in garbage)
    for row in dead:
        assert row["topic"] == topic and row["offset"] >= 0 and "canal-json" in row["error"]
        assert row["batch_id"] == 0


def test_fail_on_error_stops_before_committing(broker: Any, spark: Any, tmp_path: Path, unique_name: Any) -> None:
    from ticdc_delta.errors import DecodeError

    topic = unique_name("strict")
    broker.create_topic(topic, 1)
    broker.produce_many(topic, [(0, None, b"{not json")])
    source = {"bootstrap_servers": broker.bootstrap_servers, "topic": topic, "protocol": "canal-json",
              "options": {"enable-tidb-extension": "true"}}
    cfg = _config(tmp_path, source, dead_letter={"fail_on_error": True})
    with pytest.raises(DecodeError, match="fail_on_error"):
        run_job(cfg, once=True, spark=spark)
    assert not os.path.exists(cfg.dead_letter_path)
    assert not (tmp_path / "ckpt" / "state").exists()


def test_metadata_columns(broker: Any, spark: Any, tmp_path: Path, unique_name: Any) -> None:
    topic = unique_name("meta")
    oracle, source = _stream(broker, topic, "canal-json", tmp_path, events=300, seed=13, partitions=2, tables=2)
    cfg = _config(tmp_path, source, sink={"path": str(tmp_path / "lake"), "metadata_columns": True})
    run_job(cfg, once=True, spark=spark)
    _assert_matches(cfg, oracle)  # the oracle's columns are all there, with their values
    sink = _ConfiguredSink(cfg)
    for name in oracle.tables:
        data = sink.read(TableIdent(*name.split(".", 1)))
        if data.num_rows == 0:
            continue
        ts = data.column("_tidb_commit_ts").to_pylist()
        ops = set(data.column("_tidb_op").to_pylist())
        assert all(isinstance(t, int) and t > 0 for t in ts)
        assert ops <= {"insert", "update"} and ops
