"""``make demo``: the whole chain on one machine, no TiDB needed.

1. start a single-node Apache Kafka broker (KRaft, from the jars ``make`` fetched) on a free port;
2. have the simulator play TiDB + TiCDC into a 3-partition topic: several tables, inserts, updates,
   primary-key changes, deletes, CREATE TABLE / ADD COLUMN, duplicated messages and a TiCDC restart
   that replays an already-sent range;
3. write a YAML config and run the job ``--once`` (real Spark with its Kafka source, real Delta tables);
4. print the tables and check them against the simulator's oracle.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from pathlib import Path

import yaml

from .config import load_config
from .delta.sink import TableIdent
from .local_broker import LocalBroker
from .simulator import simulate
from .simulator.output import KafkaSink
from .verify import compare_with_oracle

__all__ = ["run_demo", "DEMO_OPTIONS"]

DEMO_OPTIONS = {
    "open-protocol": {},
    "craft": {},
    "canal-json": {"enable-tidb-extension": "true"},
    "avro": {"enable-tidb-extension": "true"},
}


def _print_table(sink: object, name: str, limit: int = 5) -> None:
    schema, _, table = name.partition(".")
    data = sink.read(TableIdent(schema, table))  # type: ignore[attr-defined]
    cols = data.column_names
    print(f"\n{name}: {data.num_rows} rows, columns: {', '.join(cols)}")
    for row in data.slice(0, limit).to_pylist():
        shown = {k: (v if not isinstance(v, (bytes, bytearray)) else f"<{len(v)} bytes>") for k, v in row.items()}
        print("  ", shown)


def run_demo(*, protocol: str = "canal-json", events: int = 20000, workdir: str | None = None, seed: int = 7) -> int:
    """Run the demo; returns 0 when every table matches the oracle, 1 otherwise."""
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="ticdc-delta-demo-"))
    base.mkdir(parents=True, exist_ok=True)
    options = DEMO_OPTIONS[protocol]
    topic = "tidb-cdc"
    from .cli import _setup_logging

    _setup_logging("WARNING")
    with LocalBroker() as broker:
        print(f"broker: Apache Kafka (KRaft, single node) at {broker.bootstrap_servers}")
        t0 = time.monotonic()
        extra = {}
        schema_files: dict[int, str] = {}
        if protocol == "avro":
            from .codec.avro import AvroSchemas

            extra["schemas"] = AvroSchemas()
        sink = KafkaSink(broker.bootstrap_servers, topic, 3)
        result = simulate(protocol, options, seed=seed, events=events, tables=4, partitions=3, sink=sink,
                          topic=topic, **extra)
        del sink  # its producer would keep reconnecting (and logging) once the broker stops
        if protocol == "avro":
            schema_dir = base / "avro-schemas"
            schema_dir.mkdir(parents=True, exist_ok=True)
            for sid in sorted(extra["schemas"].known_ids):
                path = schema_dir / f"{sid}.avsc"
                path.write_text(extra["schemas"].get(sid))
                schema_files[sid] = str(path)
        counts = result.summary
        print(f"simulator: {counts.get('messages', '?')} messages ({protocol}, options {options}) in "
              f"{time.monotonic() - t0:.1f} s: {counts}")
        cfg_data = {
            "changefeed": "demo",
            "source": {
                "bootstrap_servers": broker.bootstrap_servers,
                "topic": topic,
                "protocol": protocol,
                "options": options,
                **({"avro_schemas": {int(k): str(v) for k, v in schema_files.items()}} if schema_files else {}),
            },
            "sink": {"path": str(base / "lake")},
            "checkpoint": str(base / "checkpoint"),
        }
        cfg_path = base / "demo.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg_data, sort_keys=False))
        print(f"config: {cfg_path}")
        cfg = load_config(cfg_path)
        from .spark.job import run_job

        logging.getLogger("ticdc_delta.progress").setLevel(logging.INFO)
        t1 = time.monotonic()
        batches = run_job(cfg, once=True)
        print(f"job: {batches} micro-batch(es) in {time.monotonic() - t1:.1f} s")
        from .spark.batch_handler import _ConfiguredSink

        delta = _ConfiguredSink(cfg)
        for name in sorted(result.oracle.tables):
            if delta.table_schema(TableIdent(*name.split(".", 1))) is not None:
                _print_table(delta, name)
        diffs = compare_with_oracle(delta, result.oracle, tz=cfg.sink.source_timezone)
        bad = [d for d in diffs if not d.ok]
        print()
        for d in diffs:
            print(("OK   " if d.ok else "DIFF ") + d.describe())
        if bad:
            print(f"{len(bad)} of {len(diffs)} tables differ from the oracle", file=sys.stderr)
            return 1
        print(f"all {len(diffs)} tables match the oracle")
        return 0
