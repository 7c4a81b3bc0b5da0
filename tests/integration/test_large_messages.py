"""TiCDC's large-message modes and newer types end to end: simulator → real broker → real Spark job → real
Delta tables, compared with the simulator's oracle (compression; VECTOR columns)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ticdc_delta.config import config_from_mapping
from ticdc_delta.simulator import simulate
from ticdc_delta.simulator.output import KafkaSink
from ticdc_delta.spark.batch_handler import _ConfiguredSink
from ticdc_delta.spark.job import run_job
from ticdc_delta.verify import compare_with_oracle

pytestmark = pytest.mark.integration


def _run(broker: Any, spark: Any, tmp: Path, topic: str, protocol: str, options: dict[str, str],
         *, events: int = 600, tables: int = 2, **source_extra: Any) -> tuple[Any, Any]:
    extra: dict[str, Any] = {}
    if protocol == "avro":
        from ticdc_delta.codec.avro import AvroSchemas

        extra["schemas"] = AvroSchemas()
    result = simulate(protocol, options, seed=5, events=events, tables=tables, partitions=2,
                      sink=KafkaSink(broker.bootstrap_servers, topic, 2), topic=topic, **extra)
    source = {"bootstrap_servers": broker.bootstrap_servers, "topic": topic, "protocol": protocol,
              "options": options, **source_extra}
    if protocol == "avro":
        files = {}
        for sid in sorted(extra["schemas"].known_ids):
            path = tmp / f"schema-{sid}.avsc"
            path.write_text(extra["schemas"].get(sid))
            files[sid] = str(path)
        source["avro_schemas"] = files
    cfg = config_from_mapping({"changefeed": "lm", "source": source, "sink": {"path": str(tmp / "lake")},
                               "checkpoint": str(tmp / "ckpt")})
    run_job(cfg, once=True, spark=spark)
    return cfg, result.oracle


def _assert_matches(cfg: Any, oracle: Any) -> None:
    diffs = compare_with_oracle(_ConfiguredSink(cfg), oracle, tz=cfg.sink.source_timezone)
    bad = [d.describe() for d in diffs if not d.ok]
    assert not bad, "\n".join(bad)
    assert sum(d.actual_rows for d in diffs) > 0


@pytest.mark.parametrize("protocol, options", [
    ("open-protocol", {"max-batch-size": "4", "large-message-handle-compression": "lz4"}),
    ("canal-json", {"enable-tidb-extension": "true", "large-message-handle-compression": "snappy"}),
])
def test_compressed_stream_lands_exactly(protocol: str, options: dict[str, str], broker: Any, spark: Any,
                                         tmp_path: Path, unique_name: Any) -> None:
    cfg, oracle = _run(broker, spark, tmp_path, unique_name(f"lz-{protocol}"), protocol, options)
    _assert_matches(cfg, oracle)


@pytest.mark.parametrize("protocol, options", [
    ("open-protocol", {"max-batch-size": "4"}),
    ("avro", {"enable-tidb-extension": "true"}),
])
def test_vector_columns_land_as_float_arrays(protocol: str, options: dict[str, str], broker: Any, spark: Any,
                                             tmp_path: Path, unique_name: Any) -> None:
    """The fourth simulated table has VECTOR(3) and VECTOR columns: CREATE TABLE (Open Protocol DDL) or
    Avro schemas type them, rows MERGE into them, and they read back exactly as TiDB printed them."""
    import pyarrow as pa

    from ticdc_delta.delta.sink import TableIdent

    cfg, oracle = _run(broker, spark, tmp_path, unique_name(f"vec-{protocol}"), protocol, options, tables=4)
    _assert_matches(cfg, oracle)
    (name,) = [n for n in oracle.tables if n.endswith(".t4")]
    data = _ConfiguredSink(cfg).read(TableIdent(*name.split(".", 1)))
    assert data.schema.field("emb").type == pa.list_(pa.float32())
    assert data.schema.field("any_dims").type == pa.list_(pa.float32())
    assert any(len(v) == 3 for v in data.column("emb").to_pylist() if v is not None)
