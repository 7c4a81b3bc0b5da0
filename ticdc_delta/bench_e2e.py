"""End-to-end benchmark: a canal-json stream (TiDB extension on) from the local broker into Delta tables.

Prints, on this machine:

* **job**: changes/s from Kafka to Delta tables with the real job (decode, replay drop, watermark gating,
  per-key collapse, MERGE, durable state);
* **baseline**: the same source and decoder with gating + MERGE replaced by a plain append of every
  decoded row (the limit for this source and decoder); and the ratio job / baseline;
* **source**: the raw read rate of Spark's Kafka source (a query that only counts the rows).

The stream is generated here, straight in TiCDC's canal-json layout (checked by decoding a sample with the
real decoder), because the full simulator encodes far slower than the job reads: 60 % inserts, 30 %
updates, 10 % deletes over a growing key space of one 10-column table, rows dispatched by key hash,
``TIDB_WATERMARK`` broadcast every 2000 changes.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import orjson

from .codec import DecodeContext, decoder_for
from .local_broker import LocalBroker

__all__ = ["run_e2e", "generate_stream"]

_MYSQL = {"id": "bigint", "user_id": "int", "amount": "decimal", "price": "double", "status": "varchar",
          "note": "varchar", "created": "datetime", "day": "date", "qty": "smallint", "flag": "tinyint"}
_SQL = {"id": -5, "user_id": 4, "amount": 3, "price": 8, "status": 12, "note": 12, "created": 93, "day": 91,
        "qty": 5, "flag": -6}


def _row(i: int, version: int) -> dict[str, str]:
    return {"id": str(i), "user_id": str(i % 9973), "amount": f"{(i * 7 + version) % 100000}.{version % 100:02d}",
            "price": repr(i * 0.5 + version), "status": ("new", "paid", "shipped")[version % 3],
            "note": f"note {i} v{version}", "created": "2024-01-02 03:04:05", "day": "2024-01-02",
            "qty": str((i + version) % 300), "flag": str(version % 2)}


def generate_stream(events: int, partitions: int, *, seed: int = 1) -> tuple[list[list[bytes]], dict[int, dict]]:
    """Per-partition canal-json messages and the expected final rows (id → row)."""
    import random

    rnd = random.Random(seed)
    per_part: list[list[bytes]] = [[] for _ in range(partitions)]
    live: dict[int, dict[str, str]] = {}
    versions: dict[int, int] = {}
    keys: list[int] = []
    next_id = 0
    ts = 446_000_000_000_000_000
    base = {"id": 0, "database": "bench", "table": "orders", "pkNames": ["id"], "isDdl": False,
            "es": 0, "ts": 0, "sql": "", "sqlType": _SQL, "mysqlType": _MYSQL}
    for n in range(events):
        ts += 1 << 18
        r = rnd.random()
        if r < 0.6 or len(keys) < 100:
            i, next_id = next_id, next_id + 1
            versions[i] = 0
            row = _row(i, 0)
            msg = {**base, "type": "INSERT", "data": [row], "old": None}
            live[i] = row
            keys.append(i)
        else:
            pos = rnd.randrange(len(keys))
            i = keys[pos]
            if r < 0.9:
                old = live[i]
                versions[i] += 1
                row = _row(i, versions[i])
                msg = {**base, "type": "UPDATE", "data": [row], "old": [old]}
                live[i] = row
            else:
                msg = {**base, "type": "DELETE", "data": [live.pop(i)], "old": None}
                keys[pos] = keys[-1]
                keys.pop()
        msg["_tidb"] = {"commitTs": ts}
        msg["es"] = msg["ts"] = ts >> 18
        per_part[zlib.crc32(str(i).encode()) % partitions].append(orjson.dumps(msg))
        if n % 2000 == 1999 or n == events - 1:
            wm = orjson.dumps({"id": 0, "database": "", "table": "", "pkNames": None, "isDdl": False,
                               "type": "TIDB_WATERMARK", "es": ts >> 18, "ts": ts >> 18, "sql": "",
                               "sqlType": None, "mysqlType": None, "data": None, "old": None,
                               "_tidb": {"watermarkTs": ts}})
            for p in range(partitions):
                per_part[p].append(wm)
    return per_part, live


def _produce(broker: LocalBroker, topic: str, per_part: list[list[bytes]]) -> float:
    broker.create_topic(topic, partitions=len(per_part))
    t0 = time.monotonic()

    def fill(p: int) -> None:
        broker.produce_many(topic, ((p, None, v) for v in per_part[p]), producer=broker.producer())

    threads = [threading.Thread(target=fill, args=(p,)) for p in range(len(per_part))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - t0


def _config(broker: LocalBroker, topic: str, work: Path, name: str, max_offsets: int) -> Any:
    from .config import config_from_mapping

    return config_from_mapping({
        "changefeed": name,
        "source": {"bootstrap_servers": broker.bootstrap_servers, "topic": topic, "protocol": "canal-json",
                   "options": {"enable-tidb-extension": "true"}, "max_offsets_per_trigger": max_offsets},
        "sink": {"path": str(work / name / "lake")},
        "checkpoint": str(work / name / "ckpt"),
    })


class _AppendSink:
    """Wraps a sink so that the applier's MERGE becomes a plain append (the baseline)."""

    def __init__(self, sink: Any) -> None:
        self._sink = sink

    def merge(self, ident: Any, changes: Any, key_columns: Any, txn: Any) -> Any:
        return self._sink.append(ident, changes.drop_columns(["_op"]), txn)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sink, name)


def _baseline_handler(cfg: Any) -> Any:
    """decode on the executors → every decoded row appended as it is (no gating, no collapse, no MERGE)."""
    from .core.batch_planner import RowsStep
    from .core.merge import UPSERT, FinalChange, TableChanges
    from .core.records import ChangeRecord, load_record
    from .delta.applier import DeltaApplier
    from .spark.batch_handler import _ConfiguredSink
    from .spark.decode import DECODED_SCHEMA, DecoderSpec, make_decode_fn

    sink = _AppendSink(_ConfiguredSink(cfg))
    spec = DecoderSpec("canal-json", dict(cfg.source.options))
    counts = {"rows": 0, "batches": 0}

    class Handler:
        error: BaseException | None = None
        batches = 0

        def starting_offsets(self, configured: Any) -> Any:
            return configured  # no reset state in the baseline

        def __call__(self, batch_df: Any, batch_id: int) -> None:
            try:
                handle(batch_df, batch_id)
                self.batches += 1
            except BaseException as exc:
                self.error = exc
                raise

    def handle(batch_df: Any, batch_id: int) -> None:
        decoded = batch_df.mapInArrow(make_decode_fn(spec), DECODED_SCHEMA).toArrow()
        tables: dict[tuple[str, str], TableChanges] = {}
        for kind, payload in zip(decoded.column("kind").to_pylist(), decoded.column("payload").to_pylist()):
            if kind != "row":
                continue
            rec = load_record(payload)
            assert isinstance(rec, ChangeRecord)  # noqa: S101 - kind says so
            tc = tables.setdefault((rec.schema, rec.table), TableChanges(rec.schema, rec.table, ("_pos",)))
            image = rec.new if rec.new is not None else rec.old
            tc.changes[(len(tc.changes),)] = FinalChange(UPSERT, image, rec.commit_ts, rec.op)  # type: ignore[arg-type]
        DeltaApplier(sink, cfg.changefeed).apply([RowsStep(tables)], batch_id)
        counts["rows"] += sum(len(t.changes) for t in tables.values())
        counts["batches"] += 1

    handler = Handler()
    handler.counts = counts  # type: ignore[attr-defined]
    return handler


def _timed_run(cfg: Any, spark: Any, handler: Any) -> float:
    from .spark.job import run_job

    t0 = time.monotonic()
    run_job(cfg, once=True, spark=spark, handler=handler)
    return time.monotonic() - t0


def _source_rate(spark: Any, broker: LocalBroker, topic: str, work: Path) -> tuple[int, float]:
    from .spark.kafka_source import read_kafka_stream

    df = read_kafka_stream(spark, bootstrap_servers=broker.bootstrap_servers, topics=[topic])
    seen = [0]

    def count(batch_df: Any, _batch_id: int) -> None:
        seen[0] += batch_df.count()

    t0 = time.monotonic()
    q = (df.writeStream.foreachBatch(count).option("checkpointLocation", str(work / "src-ckpt"))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    q.stop()
    return seen[0], time.monotonic() - t0


def run_e2e(*, events: int = 1_000_000, partitions: int = 4, max_offsets: int = 250_000) -> int:
    """Run the benchmark and print the figures; returns 0, or 1 if the job's tables are wrong."""
    from .spark.batch_handler import _ConfiguredSink
    from .spark.job import build_handler, spark_for
    from .delta.sink import TableIdent

    work = Path(tempfile.mkdtemp(prefix="ticdc-delta-bench-"))
    try:
        t0 = time.monotonic()
        per_part, expected = generate_stream(events, partitions)
        sample = decoder_for("canal-json", {"enable-tidb-extension": "true"}).decode(
            None, per_part[0][0], DecodeContext("bench", 0, 0))
        assert sample and sample[0].kind == "row"  # noqa: S101 - the layout is the real one
        messages = sum(len(p) for p in per_part)
        print(f"generated {events:,} changes ({messages:,} messages, {partitions} partitions) "
              f"in {time.monotonic() - t0:.1f} s")
        with LocalBroker() as broker:
            topic = "bench-canal"
            secs = _produce(broker, topic, per_part)
            print(f"produced to the local broker in {secs:.1f} s ({messages / secs:,.0f} msg/s)")
            cfg = _config(broker, topic, work, "job", max_offsets)
            spark = spark_for(cfg)
            # warm up: JVM, Python workers and their imports, so the figures below are steady-state
            warm = "bench-warmup"
            broker.create_topic(warm, partitions=len(per_part))
            broker.produce_many(warm, ((p, None, per_part[p][0]) for p in range(len(per_part))))
            _source_rate(spark, broker, warm, work / "warm")
            n, secs = _source_rate(spark, broker, topic, work)
            print(f"source   : {n:,} messages in {secs:.1f} s = {n / secs:,.0f} messages/s (raw Kafka read)")
            job_secs = _timed_run(cfg, spark, build_handler(cfg))
            job_rate = events / job_secs
            print(f"job      : {events:,} changes in {job_secs:.1f} s = {job_rate:,.0f} changes/s "
                  f"(decode, gating, collapse, MERGE, state)")
            base_cfg = _config(broker, topic, work, "baseline", max_offsets)
            handler = _baseline_handler(base_cfg)
            base_secs = _timed_run(base_cfg, spark, handler)
            base_rate = events / base_secs
            print(f"baseline : {handler.counts['rows']:,} rows in {base_secs:.1f} s = {base_rate:,.0f} changes/s "
                  f"(decode + plain append)")
            print(f"ratio    : {job_rate / base_rate:.2f} (job / baseline)")
            got = _ConfiguredSink(cfg).read(TableIdent("bench", "orders"))
            ok = got.num_rows == len(expected) and set(got.column("id").to_pylist()) == set(expected)
            print(f"check    : job table has {got.num_rows:,} rows, expected {len(expected):,}: "
                  f"{'OK' if ok else 'MISMATCH'}")
            return 0 if ok else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
