"""MERGEs into a big table: the ``spark`` engine with and without the key range (``sink.merge_key_range_rows``).

Two changefeeds read the same canal-json topic (TiDB extension, on the local broker) into tables of their
own: one bounds each MERGE to its changes' key range (``merge_key_range_rows``: ``--key-range-rows``, 1 by
default: whenever the bounds skip a file), the other never does (``0``). After a first batch has made both
tables, ``--rows`` rows are appended to each with Spark in ``--files`` files: of keys below the stream's,
in key order (``--layout key-order``: as an auto-increment key's inserts leave a table), or half of them of
keys far above the stream's and every file holding keys from the whole range (``shuffled``: as random keys
leave a table; every file overlaps any batch's key range). Then each round produces, per ``--changes``
value, that many changes of the stream's own (recent) keys — inserts, updates and deletes — and a
watermark, and runs both jobs once over it (``run_job(once=True)``: one micro-batch), in alternating order.
Printed: the median over ``--rounds`` of each batch's ``timings.apply`` (the MERGE) and its ``seconds``, how
many of the batches took the key range (bounds that would skip files of fewer rows than
``merge_key_range_rows`` are left out), and a check that both tables hold the same rows, those the stream
expects. Compaction is off in both (it would reorder the files between rounds).
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .bench_e2e import BatchPhases, CanalStream
from .local_broker import LocalBroker

__all__ = ["run_bigtable", "LAYOUTS"]

LAYOUTS = ("key-order", "shuffled")
"""How the loaded rows lie in the table's files (``--layout``)."""

HIGH = 1 << 40
"""``shuffled``: the keys of every other loaded row are moved up by this much, above the stream's keys."""

SETTINGS = {"bounded": 1, "unbounded": 0}
"""The two changefeeds: their ``sink.merge_key_range_rows`` (the bounded one's: ``key_range_rows``)."""


def _config(broker: LocalBroker, topic: str, work: Path, name: str, key_range_rows: int) -> Any:
    from .config import config_from_mapping

    return config_from_mapping({
        "changefeed": name,
        "source": {"bootstrap_servers": broker.bootstrap_servers, "topic": topic, "protocol": "canal-json",
                   "options": {"enable-tidb-extension": "true"}},
        "sink": {"path": str(work / name / "lake"), "engine": "spark", "merge_key_range_rows": key_range_rows,
                 "compaction": {"enabled": False}},
        "checkpoint": str(work / name / "ckpt"),
    })


def _produce(broker: LocalBroker, topic: str, stream: CanalStream, changes: int) -> None:
    """``changes`` changes of ``stream``, then a watermark past them on every partition."""
    batch = [(p, None, v) for p, v in (stream.change() for _ in range(changes))]
    batch += [(p, None, stream.watermark()) for p in range(stream.partitions)]
    broker.produce_many(topic, batch)


def _load(spark: Any, path: str, rows: int, files: int, layout: str) -> None:
    """Append rows of keys ``0 .. rows-1`` to the table at ``path`` in ``files`` files in key order (``layout``
    ``shuffled``: every other key moved up by :data:`HIGH`, the rows dealt round-robin to the files): the key
    ``id``, numbers and text derived from it in the other columns of a number or text type, nulls in the
    rest."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import NumericType, StringType

    schema = spark.read.format("delta").load(path).schema
    cols = []
    frame = spark.range(0, rows, 1, files)
    if layout == "shuffled":
        frame = frame.repartition(files).withColumn(
            "id", F.when(F.col("id") % 2 == 0, F.col("id")).otherwise(F.col("id") + HIGH))
    for field in schema:
        if field.name == "id":
            value = F.col("id")
        elif isinstance(field.dataType, NumericType):
            value = F.col("id") % 1000
        elif isinstance(field.dataType, StringType):
            value = F.concat(F.lit("loaded "), F.col("id").cast("string"))
        else:
            value = F.lit(None)
        cols.append(value.cast(field.dataType).alias(field.name))
    frame.select(*cols).write.format("delta").mode("append").save(path)


def run_bigtable(*, rows: int = 10_000_000, files: int = 40, changes: Sequence[int] = (1, 2000), rounds: int = 3,
                 partitions: int = 1, layout: str = "key-order", key_range_rows: int = 1) -> int:
    """Run the benchmark and print its figures; 0 when both tables hold the expected rows, else 1.

    Raises:
        ValueError: a count below 1 (``changes`` values, ``rounds``, ``partitions``, ``files``), ``rows``
            below 0 or an unknown ``layout``.
    """
    if (rows < 0 or files < 1 or rounds < 1 or partitions < 1 or not changes or min(changes) < 1
            or key_range_rows < 1):
        raise ValueError("rows must be at least 0; files, rounds, partitions, key_range_rows and every changes "
                         "value at least 1")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    from .spark.batch_handler import _ConfiguredSink
    from .spark.job import run_job, spark_for

    work = Path(tempfile.mkdtemp(prefix="ticdc-delta-bench-bigtable-"))
    try:
        with LocalBroker() as broker:
            topic = "bench-bigtable"
            broker.create_topic(topic, partitions=partitions)
            stream = CanalStream(partitions, first_id=rows)  # its keys above the loaded ones: the recent keys
            settings = {**SETTINGS, "bounded": key_range_rows}
            cfgs = {label: _config(broker, topic, work, label, n) for label, n in settings.items()}
            spark = spark_for(cfgs["bounded"])
            _produce(broker, topic, stream, 100)  # (inserts: the tables made by the job, with its types)
            for cfg in cfgs.values():
                run_job(cfg, once=True, spark=spark)
            for label, cfg in cfgs.items():
                t0 = time.monotonic()
                _load(spark, _ConfiguredSink(cfg).table_path("bench", "orders"), rows, files, layout)
                print(f"loaded   : {rows:,} rows in {files} files ({layout}) into the {label} table in "
                      f"{time.monotonic() - t0:.1f} s")
            figures: dict[tuple[int, str], list[tuple[float, float, bool]]] = {}
            for r in range(rounds):
                for n in changes:
                    _produce(broker, topic, stream, n)
                    order = list(cfgs) if r % 2 == 0 else list(reversed(cfgs))
                    for label in order:
                        with BatchPhases() as phases:
                            run_job(cfgs[label], once=True, spark=spark)
                        last = phases.batches[-1]
                        figures.setdefault((n, label), []).append(
                            (last["timings"].get("apply", 0.0), last["seconds"], bool(last["key_range"])))
            print(f"rounds   : {rounds}, each a batch of every size below per table (of {rows + 100:,} rows and "
                  f"more); medians:")
            for n in changes:
                parts = []
                for label in cfgs:
                    got = figures[(n, label)]
                    parts.append(f"{label} MERGE {statistics.median(a for a, _, _ in got):.2f} s "
                                 f"(batch {statistics.median(s for _, s, _ in got):.2f} s; key range in "
                                 f"{sum(b for _, _, b in got)} of {len(got)})")
                print(f"{n:>6,} changes: " + ", ".join(parts))
            expected = set(stream.live)
            ok = True
            for label, cfg in cfgs.items():
                table = spark.read.format("delta").load(_ConfiguredSink(cfg).table_path("bench", "orders"))
                count = table.count()
                ids = table["id"]
                recent = {r["id"] for r in table.where((ids >= rows) & (ids < HIGH)).select("id").collect()}
                good = count == rows + len(expected) and recent == expected
                ok &= good
                print(f"check    : {label} table has {count:,} rows, expected {rows + len(expected):,}: "
                      f"{'OK' if good else 'MISMATCH'}")
            return 0 if ok else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
