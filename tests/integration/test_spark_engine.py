"""The ``spark`` engine (sink.engine: spark) on a real broker, real Spark and real Delta tables.

Parity with the ``delta-rs`` engine (same streams → identical tables and schemas, both equal to the
oracle), fault injection at every stage followed by a restart, and Delta's app transactions making a
re-run skip what was committed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ticdc_delta.config import config_from_mapping
from ticdc_delta.spark.batch_handler import FAULT_ENV, InjectedFault
from ticdc_delta.spark.job import build_handler, run_job

from .test_end_to_end import PROTOCOLS, _assert_matches, _snapshot, _stream, progress  # noqa: F401 - fixture

pytestmark = pytest.mark.integration


def _config(tmp: Path, name: str, source: dict[str, Any], engine: str, **extra: Any) -> Any:
    return config_from_mapping({
        "changefeed": "it",
        "source": source,
        "sink": {"path": str(tmp / name / "lake"), "engine": engine, **extra.pop("sink", {})},
        "checkpoint": str(tmp / name / "ckpt"),
        **extra,
    })


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_both_engines_land_identical_tables(protocol: str, broker: Any, spark: Any, tmp_path: Path,
                                            unique_name: Any, progress: Any) -> None:
    """Held rows, replays, duplicates, PK changes, CREATE TABLE / ADD COLUMN: the same tables (rows and
    schema) from both engines, and the oracle's."""
    topic = unique_name(f"parity-{protocol}")
    oracle, source = _stream(broker, topic, protocol, tmp_path, events=900, seed=21)
    source["max_offsets_per_trigger"] = max(50, oracle.counts["messages"] // 3)
    landed = {}
    for engine in ("delta-rs", "spark"):
        progress.lines.clear()
        cfg = _config(tmp_path, engine, dict(source), engine)
        assert run_job(cfg, once=True, spark=spark) >= 2
        _assert_matches(cfg, oracle)
        landed[engine] = _snapshot(cfg, oracle)
        if protocol != "avro":
            assert any(line["rows_held"] > 0 for line in progress.lines[:-1]), engine
            assert sum(line["replays_dropped"] for line in progress.lines) > 0, engine
    for name, (schema, rows) in landed["delta-rs"].items():
        got_schema, got_rows = landed["spark"][name]
        assert [(f.name, f.type) for f in got_schema] == [(f.name, f.type) for f in schema], name
        assert got_rows == rows, name


STAGES = ["after_decode", "after_dead_letter", "after_merge", "before_state", "after_state"]


@pytest.mark.parametrize("stage", STAGES)
def test_spark_engine_restart_after_a_fault_at_each_stage(stage: str, broker: Any, spark: Any, tmp_path: Path,
                                                          unique_name: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    topic = unique_name(f"sfault-{stage}")
    oracle, source = _stream(broker, topic, "open-protocol", tmp_path, events=800, seed=11)
    source["max_offsets_per_trigger"] = 300
    cfg = _config(tmp_path, "job", source, "spark")
    monkeypatch.setenv(FAULT_ENV, f"{stage}@1")
    with pytest.raises(InjectedFault, match=f"injected fault at {stage} of batch 1"):
        run_job(cfg, once=True, spark=spark, handler=build_handler(cfg))
    monkeypatch.delenv(FAULT_ENV)
    run_job(cfg, once=True, spark=spark, handler=build_handler(cfg))
    _assert_matches(cfg, oracle)
