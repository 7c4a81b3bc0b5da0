"""TiCDC's large-message modes and newer types end to end: simulator → real broker → real Spark job → real
Delta tables, compared with the simulator's oracle (compression; VECTOR columns)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ticdc_delta.config import config_from_mapping
from ticdc_delta.simulator import simulate
from ticdc_delta.codec.model import DecodeContext
from ticdc_delta.simulator.output import KafkaSink, MemorySink
from ticdc_delta.spark.batch_handler import _ConfiguredSink
from ticdc_delta.spark.job import run_job
from ticdc_delta.verify import compare_with_oracle
from tests.integration.conftest import job_engine

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
    cfg = config_from_mapping({"changefeed": "lm", "source": source, "sink": {"path": str(tmp / "lake"), "engine": job_engine()},
                               "checkpoint": str(tmp / "ckpt")})
    run_job(cfg, once=True, spark=spark)
    return cfg, result.oracle


def _assert_matches(cfg: Any, oracle: Any) -> None:
    diffs = compare_with_oracle(_ConfiguredSink(cfg), oracle, tz=cfg.sink.source_timezone)
    bad = [d.describe() for d in diffs if not d.ok]
    assert not bad, "\n".join(bad)
    assert sum(d.actual_rows for d in diffs) > 0


@pytest.mark.parametrize("protocol, options", [
    # with only-output-updated-columns: the old images are rebuilt from the new ones
    ("open-protocol", {"max-batch-size": "4", "large-message-handle-compression": "lz4",
                       "only-output-updated-columns": "true"}),
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


@pytest.mark.parametrize("protocol, options", [
    ("open-protocol", {"max-batch-size": "4", "large-message-handle-compression": "snappy"}),
    ("canal-json", {"enable-tidb-extension": "true", "large-message-handle-compression": "lz4"}),
    ("canal-json", {"enable-tidb-extension": "true", "claim-check-raw-value": "true"}),
])
def test_claim_check_stream_lands_exactly(protocol: str, options: dict[str, str], broker: Any, spark: Any,
                                          tmp_path: Path, unique_name: Any) -> None:
    """Rows above max-message-bytes go to a local claim-check directory (the simulator plays TiCDC's
    claim-check writer); the executors read them back in place of the key-only references."""
    storage = tmp_path / "claim-check"
    opts = {**options, "large-message-handle-option": "claim-check", "max-message-bytes": "700",
            "claim-check-storage-uri": f"file://{storage}"}
    cfg, oracle = _run(broker, spark, tmp_path, unique_name(f"cc-{protocol}"), protocol, opts)
    assert len(list(storage.iterdir())) > 10  # many rows really went through the claim-check storage
    _assert_matches(cfg, oracle)
    assert not Path(cfg.dead_letter_path).exists()


def test_claim_check_missing_object_is_a_dead_letter(broker: Any, spark: Any, tmp_path: Path,
                                                     unique_name: Any) -> None:
    from ticdc_delta.delta.sink import read_table

    storage = tmp_path / "claim-check"
    opts = {"enable-tidb-extension": "true", "large-message-handle-option": "claim-check",
            "max-message-bytes": "700", "claim-check-storage-uri": str(storage)}
    topic = unique_name("cc-missing")
    simulate("canal-json", opts, seed=5, events=200, tables=2, partitions=2,
             sink=KafkaSink(broker.bootstrap_servers, topic, 2), topic=topic)
    victim = sorted(storage.iterdir())[0]
    victim.unlink()
    source = {"bootstrap_servers": broker.bootstrap_servers, "topic": topic, "protocol": "canal-json",
              "options": opts}
    cfg = config_from_mapping({"changefeed": "lm", "source": source, "sink": {"path": str(tmp_path / "lake"), "engine": job_engine()},
                               "checkpoint": str(tmp_path / "ckpt")})
    run_job(cfg, once=True, spark=spark)
    dead = read_table(cfg.dead_letter_path).to_pylist()
    assert len(dead) >= 1 and all(victim.name in row["error"] and "is not in" in row["error"] for row in dead)


@pytest.mark.parametrize("protocol, options", [
    ("open-protocol", {"max-batch-size": "4"}),
    ("canal-json", {"enable-tidb-extension": "true"}),
])
def test_handle_key_only_is_never_applied(protocol: str, options: dict[str, str], broker: Any, spark: Any,
                                          tmp_path: Path, unique_name: Any) -> None:
    """Without the upstream TiDB, a handle-key-only row goes to the dead-letter table (never a row of key
    columns and NULLs); under fail_on_error the job stops before committing anything, naming the option."""
    from ticdc_delta.codec import decoder_for
    from ticdc_delta.codec.model import FailedEntry
    from ticdc_delta.delta.sink import read_table
    from ticdc_delta.errors import DecodeError, HandleKeyOnlyError

    opts = {**options, "large-message-handle-option": "handle-key-only", "max-message-bytes": "700"}
    topic = unique_name(f"hko-{protocol}")
    result = simulate(protocol, opts, seed=5, events=300, tables=2, partitions=2,
                      sink=KafkaSink(broker.bootstrap_servers, topic, 2), topic=topic)
    # the same stream in memory: which messages hold a key-only INSERT/UPDATE (exactly those are refused)
    memory = MemorySink()
    simulate(protocol, opts, seed=5, events=300, tables=2, partitions=2, sink=memory, topic=topic)
    decoder = decoder_for(protocol, opts)
    refused = 0
    for _, key, value in memory.messages:
        try:
            events = decoder.decode(key, value, DecodeContext())
        except HandleKeyOnlyError:
            refused += 1
            continue
        # (batched with whole rows, a key-only row is refused by itself: the whole ones apply)
        refused += sum(1 for e in events if isinstance(e, FailedEntry))
    assert refused > 0
    source = {"bootstrap_servers": broker.bootstrap_servers, "topic": topic, "protocol": protocol, "options": opts}
    strict = config_from_mapping({"changefeed": "lm", "source": source, "sink": {"path": str(tmp_path / "strict"), "engine": job_engine()},
                                  "checkpoint": str(tmp_path / "strict-ckpt"), "dead_letter": {"fail_on_error": True}})
    with pytest.raises(DecodeError, match="fail_on_error.*large-message-handle-option=handle-key-only.*claim-check"):
        run_job(strict, once=True, spark=spark)
    assert not Path(strict.dead_letter_path).exists()
    assert not (tmp_path / "strict-ckpt" / "state").exists()

    cfg = config_from_mapping({"changefeed": "lm", "source": source, "sink": {"path": str(tmp_path / "lake"), "engine": job_engine()},
                               "checkpoint": str(tmp_path / "ckpt")})
    run_job(cfg, once=True, spark=spark)
    dead = read_table(cfg.dead_letter_path).to_pylist()
    assert dead and all("large-message-handle-option=handle-key-only" in row["error"] for row in dead)
    assert len(dead) == refused
    assert result.oracle.counts["messages"] > len({(row["partition"], row["offset"]) for row in dead})
