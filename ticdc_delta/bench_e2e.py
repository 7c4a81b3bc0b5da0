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

Both engines (``sink.engine: delta-rs`` and ``spark``) run in the same process, one after the other, each
on its own checkpoint and tables; for each, the driver's peak RSS growth during its run (``VmRSS`` of this
Python process, and of the Spark JVM it started, sampled every 50 ms; peak − before the run) and where a
full micro-batch's time went (:class:`BatchPhases`: the progress lines' ``timings``). Each engine
runs the stream ``runs`` times (2 by default, each on new tables): the first run of a fresh JVM pays for
its warm-up (the JIT), the later ones show the rate a long-running job settles at, compared with the
baseline run once more at the end, in the warm JVM. The Spark
master is fixed per JVM: :func:`run_cores` compares masters by running this benchmark in one subprocess
per master.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from .codec import DecodeContext, decoder_for
from .local_broker import LocalBroker

__all__ = ["ENGINES", "BatchPhases", "CanalStream", "PeakRss", "generate_stream", "run_cores", "run_e2e"]

#: the two values of ``sink.engine``, in the order they are measured
ENGINES = ("delta-rs", "spark")

_MYSQL = {"id": "bigint", "user_id": "int", "amount": "decimal", "price": "double", "status": "varchar",
          "note": "varchar", "created": "datetime", "day": "date", "qty": "smallint", "flag": "tinyint"}
_SQL = {"id": -5, "user_id": 4, "amount": 3, "price": 8, "status": 12, "note": 12, "created": 93, "day": 91,
        "qty": 5, "flag": -6}


def _json(obj: Any) -> bytes:
    """``obj`` as JSON bytes of their own size: ``orjson.dumps`` returns a buffer of at least 4 KiB (8 KiB
    past ~600 bytes) that it never shrinks, so the 1M messages the benchmark keeps took ~8 GiB of memory
    instead of ~0.8 GiB (measured with orjson 3.13)."""
    return bytes(memoryview(orjson.dumps(obj)))


def _row(i: int, version: int) -> dict[str, str]:
    return {"id": str(i), "user_id": str(i % 9973), "amount": f"{(i * 7 + version) % 100000}.{version % 100:02d}",
            "price": repr(i * 0.5 + version), "status": ("new", "paid", "shipped")[version % 3],
            "note": f"note {i} v{version}", "created": "2024-01-02 03:04:05", "day": "2024-01-02",
            "qty": str((i + version) % 300), "flag": str(version % 2)}


class CanalStream:
    """TiCDC canal-json changes of one 10-column table, generated one at a time.

    60 % inserts, 30 % updates, 10 % deletes over a growing key space; each change goes to the partition
    of its key's hash, as TiCDC's default dispatcher does. ``live`` holds the expected final rows
    (id → row) of everything generated so far.

    Args:
        partitions: the topic's partitions.
        seed: the random stream's seed.
        ts: the first commit ts (TSO); ``None`` takes commit ts from the clock (``now << 18``, strictly
            increasing), as a live TiDB cluster would.
        table: the table's name (schema ``bench``).
        first_id: the key of the first insert.
    """

    def __init__(self, partitions: int, *, seed: int = 1, ts: int | None = 446_000_000_000_000_000,
                 table: str = "orders", first_id: int = 0) -> None:
        import random

        self.partitions = partitions
        self.table = table
        self.live: dict[int, dict[str, str]] = {}
        self.ts = ts if ts is not None else 0
        self._clock = ts is None
        self._rnd = random.Random(seed)
        self._versions: dict[int, int] = {}
        self._keys: list[int] = []
        self._next_id = first_id
        self._base = {"id": 0, "database": "bench", "table": table, "pkNames": ["id"], "isDdl": False,
                      "es": 0, "ts": 0, "sql": "", "sqlType": _SQL, "mysqlType": _MYSQL}

    def change(self) -> tuple[int, bytes]:
        """The next change: (partition, canal-json message)."""
        if self._clock:
            self.ts = max(self.ts + 1, int(time.time() * 1000) << 18)
        else:
            self.ts += 1 << 18
        ts, base, keys, live, versions = self.ts, self._base, self._keys, self.live, self._versions
        r = self._rnd.random()
        if r < 0.6 or len(keys) < 100:
            i, self._next_id = self._next_id, self._next_id + 1
            versions[i] = 0
            row = _row(i, 0)
            msg = {**base, "type": "INSERT", "data": [row], "old": None}
            live[i] = row
            keys.append(i)
        else:
            pos = self._rnd.randrange(len(keys))
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
        return zlib.crc32(str(i).encode()) % self.partitions, _json(msg)

    def watermark(self) -> bytes:
        """A ``TIDB_WATERMARK`` message resolving everything generated so far (to send to every partition)."""
        ts = self.ts
        return _json({"id": 0, "database": "", "table": "", "pkNames": None, "isDdl": False,
                      "type": "TIDB_WATERMARK", "es": ts >> 18, "ts": ts >> 18, "sql": "",
                      "sqlType": None, "mysqlType": None, "data": None, "old": None,
                      "_tidb": {"watermarkTs": ts}})


def generate_stream(events: int, partitions: int, *, seed: int = 1) -> tuple[list[list[bytes]], dict[int, dict]]:
    """Per-partition canal-json messages (a watermark on every partition after each 2000 changes and at
    the end) and the expected final rows (id → row)."""
    stream = CanalStream(partitions, seed=seed)
    per_part: list[list[bytes]] = [[] for _ in range(partitions)]
    for n in range(events):
        part, msg = stream.change()
        per_part[part].append(msg)
        if n % 2000 == 1999 or n == events - 1:
            wm = stream.watermark()
            for p in range(partitions):
                per_part[p].append(wm)
    return per_part, stream.live


class PeakRss:
    """Samples the resident set (``VmRSS``) of this process and of ``pids`` every ``interval`` seconds
    from a thread, while in the ``with`` block; ``growth`` is peak − the value at entry, in bytes."""

    def __init__(self, pids: Sequence[int] = (), interval: float = 0.05) -> None:
        self._pids = ["self", *map(str, pids)]
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.before: dict[str, int] = {}
        self.peak: dict[str, int] = {}

    @staticmethod
    def _rss(pid: str) -> int:
        try:
            with open(f"/proc/{pid}/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def _sample(self) -> None:
        for pid in self._pids:
            self.peak[pid] = max(self.peak.get(pid, 0), self._rss(pid))

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def __enter__(self) -> "PeakRss":
        self.before = {pid: self._rss(pid) for pid in self._pids}
        self.peak = dict(self.before)
        self._thread = threading.Thread(target=self._loop, name="peak-rss", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()

    def growth(self, pid: int | str = "self") -> int:
        """Peak − before for ``pid`` (``"self"``: this process), in bytes."""
        key = str(pid)
        return self.peak.get(key, 0) - self.before.get(key, 0)


class BatchPhases:
    """The job's progress lines (logger ``ticdc_delta.progress``, one JSON line per micro-batch) while in
    the ``with`` block: each batch's row events and its ``timings`` (seconds per phase of the engine:
    ``read_decode``, ``plan``, ``apply``, ``state``...). The lines are kept here, not printed: the logger
    is set to ``INFO`` and stops propagating for the block, and is put back as it was after it."""

    def __init__(self) -> None:
        from .bench_latency import _ProgressTap  # (bench_latency imports this module)

        self._tap = _ProgressTap()
        self._log = logging.getLogger("ticdc_delta.progress")
        self._saved: tuple[int, bool] = (logging.NOTSET, True)

    @property
    def batches(self) -> list[dict[str, Any]]:
        """The batches logged in the block, in order: ``rows`` (row events), ``seconds``, ``timings`` and
        ``key_range`` (the tables whose MERGE took its key range)."""
        return [{"rows": (line.get("events") or {}).get("row", 0), "seconds": line.get("seconds", 0.0),
                 "timings": line["timings"], "key_range": line.get("key_range_tables", [])}
                for _, line in self._tap.lines if isinstance(line, dict) and isinstance(line.get("timings"), dict)]

    def __enter__(self) -> "BatchPhases":
        self._saved = (self._log.level, self._log.propagate)
        self._log.setLevel(logging.INFO)
        self._log.propagate = False
        self._log.addHandler(self._tap)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._log.removeHandler(self._tap)
        self._log.setLevel(self._saved[0])
        self._log.propagate = self._saved[1]

    def full(self) -> list[dict[str, Any]]:
        """The batches of a full size: at least 90 % of the row events of the run's largest batch (the
        last batch of a stream usually holds only what is left)."""
        batches = self.batches
        most = max((b["rows"] for b in batches), default=0)
        return [b for b in batches if most and b["rows"] >= 0.9 * most]

    def medians(self) -> dict[str, float]:
        """Per phase, the median seconds over :meth:`full` batches (phases in the order the job logs them),
        with ``batch``: a full batch's median seconds in all and ``rows``: its median row events."""
        full = self.full()
        if not full:
            return {}
        names = list(dict.fromkeys(name for b in full for name in b["timings"]))
        out = {name: statistics.median(b["timings"].get(name, 0.0) for b in full) for name in names}
        out["batch"] = statistics.median(b["seconds"] for b in full)
        out["rows"] = statistics.median(b["rows"] for b in full)
        return out


_PHASE_NAMES = {"read_decode": "read+decode", "unpack": "unpack", "plan": "rules", "apply": "MERGE",
                "state": "state", "compact": "compaction"}


def phases_line(phases: BatchPhases) -> str | None:
    """What a run's batches spent per phase: the median full batch (:meth:`BatchPhases.medians`), the
    phases of 0.01 s or more, and the first batch of the run with its phases (a fresh JVM's is the slowest); ``None``
    without a full batch."""
    med = phases.medians()
    if not med:
        return None
    n = len(phases.full())
    first = phases.batches[0]
    return (f"  phases : a batch of {med['rows']:,.0f} row events {med['batch']:.2f} s (median of {n}): "
            + _phase_parts(med, " s") + f"; the run's first batch {first['seconds']:.2f} s "
            f"({_phase_parts(first['timings'], '')})")


def _phase_parts(timings: Mapping[str, float], unit: str) -> str:
    """``timings``' phases of 0.01 s or more (not :meth:`BatchPhases.medians`' ``batch`` and ``rows``), named
    as the phases line names them, each followed by ``unit``."""
    return ", ".join(f"{_PHASE_NAMES.get(name, name)} {secs:.2f}{unit}" for name, secs in timings.items()
                     if name not in ("batch", "rows") and secs >= 0.01)


def jvm_pid(spark: Any) -> int | None:
    """The pid of the Spark JVM this Python process started (None under spark-submit or remote)."""
    proc = getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None)
    return getattr(proc, "pid", None)


def _mib(n: int) -> str:
    return f"{n / 2**20:+,.0f} MiB"


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


def _config(broker: LocalBroker, topic: str, work: Path, name: str, max_offsets: int, *,
            engine: str = "delta-rs", master: str | None = None, **extra: Any) -> Any:
    from .config import config_from_mapping

    return config_from_mapping({
        "changefeed": name,
        "source": {"bootstrap_servers": broker.bootstrap_servers, "topic": topic, "protocol": "canal-json",
                   "options": {"enable-tidb-extension": "true"}, "max_offsets_per_trigger": max_offsets},
        "sink": {"path": str(work / name / "lake"), "engine": engine},
        "checkpoint": str(work / name / "ckpt"),
        **({"spark": {"master": master}} if master else {}),
        **extra,
    })


class _AppendSink:
    """Wraps a sink so that the applier's MERGE becomes a plain append (the baseline)."""

    def __init__(self, sink: Any) -> None:
        self._sink = sink

    def merge(self, ident: Any, changes: Any, key_columns: Any, txn: Any) -> Any:
        from .delta.sink import OP_COLUMN

        return self._sink.append(ident, changes.drop_columns([OP_COLUMN]), txn)

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


def run_e2e(*, events: int = 1_000_000, partitions: int = 4, max_offsets: int = 250_000,
            engines: Sequence[str] = ENGINES, master: str | None = None, source: bool = True,
            baseline: bool = True, summary: str | None = None, runs: int = 2, cpus: int | None = None) -> int:
    """Run the benchmark and print the figures; returns 0, or 1 if an engine's table is wrong.

    Args:
        engines: the ``sink.engine`` values to measure, in this order, each on its own tables.
        master: the Spark master (``local[2]`` when None); fixed for the life of this process's JVM.
        source: also measure the raw Kafka read rate.
        baseline: also measure the append-only baseline (the ratio needs it).
        summary: write the figures as JSON to this path (for :func:`run_cores`).
        runs: how many times each engine runs the stream, each time on tables and a checkpoint of its own.
            The first run of the process pays for the JVM's warm-up (the JIT compiling Spark's, Delta's
            and the Kafka client's code paths as they get hot; the C2 compiler alone burns ~30 CPU-s of a
            1M-change run on 2 cores); the runs after it show what a long-running job settles at.
        cpus: pin this process, and so the Spark JVM it starts and that JVM's Python workers, to this many
            of the machine's cores once the broker runs (the broker keeps them all: it stands for a
            cluster's). ``local[N]`` only bounds the concurrent tasks: the driver's threads and the JIT
            still take the other cores, so a fair ``local[1]`` is pinned to one.

    Raises:
        ValueError: an unknown engine, fewer than one run, or more ``cpus`` than this process may use.
    """
    from .delta.sink import TableIdent
    from .spark.batch_handler import _ConfiguredSink
    from .spark.job import build_handler, spark_for

    for engine in engines:
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    allowed = sorted(os.sched_getaffinity(0))
    if cpus is not None and not 1 <= cpus <= len(allowed):
        raise ValueError(f"cpus must be between 1 and {len(allowed)} (this process's cores), got {cpus}")
    work = Path(tempfile.mkdtemp(prefix="ticdc-delta-bench-"))
    figures: dict[str, Any] = {"events": events, "master": master or "local[2]", "cpus": cpus, "engines": {}}
    try:
        t0 = time.monotonic()
        per_part, expected = generate_stream(events, partitions)
        sample = decoder_for("canal-json", {"enable-tidb-extension": "true"}).decode(
            None, per_part[0][0], DecodeContext("bench", 0, 0))
        if not sample or sample[0].kind != "row":
            raise RuntimeError("the generated canal-json layout no longer decodes as a row change")
        messages = sum(len(p) for p in per_part)
        print(f"generated {events:,} changes ({messages:,} messages, {partitions} partitions) "
              f"in {time.monotonic() - t0:.1f} s")
        with LocalBroker() as broker:
            topic = "bench-canal"
            secs = _produce(broker, topic, per_part)
            print(f"produced to the local broker in {secs:.1f} s ({messages / secs:,.0f} msg/s)")
            if cpus is not None:  # (this thread's affinity: the JVM forked from it inherits it)
                os.sched_setaffinity(0, allowed[:cpus])
                print(f"pinned   : the Spark driver, its JVM and workers to cores {allowed[:cpus]}")
            spark = spark_for(_config(broker, topic, work, "warm", max_offsets, master=master))
            jvm = jvm_pid(spark)
            print(f"spark    : master {spark.sparkContext.master}, {len(os.sched_getaffinity(0))} of this "
                  f"machine's {os.cpu_count()} cores")
            # warm up: JVM, Python workers and their imports, so the figures below are steady-state
            warm_topic = "bench-warmup"
            broker.create_topic(warm_topic, partitions=len(per_part))
            broker.produce_many(warm_topic, ((p, None, per_part[p][0]) for p in range(len(per_part))))
            _source_rate(spark, broker, warm_topic, work / "warm")
            if source:
                n, secs = _source_rate(spark, broker, topic, work)
                print(f"source   : {n:,} messages in {secs:.1f} s = {n / secs:,.0f} messages/s (raw Kafka read)")
            base_rate = None

            def measure_baseline(name: str, what: str = "") -> float:
                base_cfg = _config(broker, topic, work, name, max_offsets, master=master)
                handler = _baseline_handler(base_cfg)
                base_secs = _timed_run(base_cfg, spark, handler)
                rate = events / base_secs
                print(f"baseline : {handler.counts['rows']:,} rows in {base_secs:.1f} s = {rate:,.0f} changes/s "
                      f"(decode + plain append){what}")
                return rate

            if baseline:
                base_rate = figures["baseline_per_s"] = measure_baseline("baseline")
            ok_all = True
            for engine in engines:
                for run in range(1, runs + 1):
                    # each run on tables and a checkpoint of its own: the same work again, in a warmer JVM
                    name = f"job-{engine}" if run == 1 else f"job-{engine}-{run}"
                    cfg = _config(broker, topic, work, name, max_offsets, engine=engine, master=master)
                    with PeakRss([jvm] if jvm else []) as rss, BatchPhases() as phases:
                        job_secs = _timed_run(cfg, spark, build_handler(cfg))
                    job_rate = events / job_secs
                    got = _ConfiguredSink(cfg).read(TableIdent("bench", "orders"))
                    ok = got.num_rows == len(expected) and set(got.column("id").to_pylist()) == set(expected)
                    ok_all &= ok
                    if run == 1:
                        figures["engines"][engine] = {
                            "per_s": job_rate, "seconds": job_secs, "driver_rss_growth": rss.growth(),
                            "driver_rss_peak": rss.peak["self"],
                            "jvm_rss_growth": rss.growth(jvm) if jvm else None, "ok": ok,
                            "vs_baseline": job_rate / base_rate if base_rate else None, "runs_per_s": [],
                            "phases": []}
                    else:
                        figures["engines"][engine]["ok"] &= ok
                    figures["engines"][engine]["runs_per_s"].append(job_rate)
                    figures["engines"][engine]["phases"].append(phases.medians())
                    what = "" if runs == 1 else f" (run {run} of {runs}{', its JVM warmed by the runs before' if run > 1 else ''})"
                    print(f"job {engine:<8}: {events:,} changes in {job_secs:.1f} s = {job_rate:,.0f} changes/s "
                          f"(decode, gating, collapse, MERGE, state)"
                          + (f", {job_rate / base_rate:.2f} of the baseline" if base_rate and run == 1 else "") + what)
                    _print_memory_and_check(engine, rss, jvm, got.num_rows, len(expected), ok)
                    line = phases_line(phases)
                    if line:
                        print(line)
            if baseline and runs > 1:
                # the later runs against a baseline of the warm JVM too (the first baseline ran in a cold one)
                warm = figures["baseline_warm_per_s"] = measure_baseline("baseline-2", ", again after the jobs' runs")
                for engine in engines:
                    found = figures["engines"][engine]
                    best = max(found["runs_per_s"][1:])
                    found["warm_vs_baseline"] = best / warm
                    print(f"warm {engine:<7}: best run after the first {best:,.0f} changes/s = {best / warm:.2f} of "
                          f"the warm baseline")
            if summary:
                Path(summary).write_text(json.dumps(figures))
            return 0 if ok_all else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _print_memory_and_check(engine: str, rss: PeakRss, jvm: int | None, rows: int, expected: int, ok: bool) -> None:
    print(f"  memory : driver RSS peak − before {_mib(rss.growth())} "
          f"(peak {rss.peak['self'] / 2**20:,.0f} MiB)"
          + (f", Spark JVM RSS peak − before {_mib(rss.growth(jvm))} "
             f"(peak {rss.peak[str(jvm)] / 2**20:,.0f} MiB)" if jvm else ""))
    print(f"  check  : {engine} table has {rows:,} rows, expected {expected:,}: {'OK' if ok else 'MISMATCH'}")


def run_cores(*, events: int = 200_000, masters: Sequence[str] = ("local[1]", "local[2]"),
              engines: Sequence[str] = ("spark",), partitions: int = 4, max_offsets: int = 250_000,
              runs: int = 2, pin: bool = True) -> int:
    """The e2e benchmark once per Spark master, each in its own Python process (a JVM's master is fixed),
    then the figures side by side; returns 0, or 1 if a run failed or a table was wrong.

    ``runs``: the engines' runs per process (:func:`run_e2e`). The first run of a fresh JVM is largely its
    JIT compiler's, which takes the second core whatever the master, so how the work itself scales shows
    in the later runs, set against the baseline run again in the warm JVM. With ``pin``, ``local[N]`` runs
    on N cores (:func:`run_e2e`'s ``cpus``; ``local[*]`` and other masters unpinned): without it,
    ``local[1]`` bounds the tasks to one at a time while the driver and the JIT take the other cores."""
    rows: list[tuple[str, dict[str, Any] | None]] = []
    rc = 0
    with tempfile.TemporaryDirectory(prefix="ticdc-delta-bench-cores-") as tmp:
        for master in masters:
            out = Path(tmp) / "summary.json"
            out.unlink(missing_ok=True)
            print(f"--- e2e with master {master} (subprocess) ---", flush=True)
            cmd = [sys.executable, "-m", "ticdc_delta.bench", "e2e", "--master", master, "--events", str(events),
                   "--partitions", str(partitions), "--max-offsets", str(max_offsets), "--no-source",
                   "--runs", str(runs), "--engines", *engines, "--summary-json", str(out)]
            cores = _master_cores(master) if pin else None
            if cores is not None:
                cmd += ["--cpus", str(min(cores, len(os.sched_getaffinity(0))))]
            code = subprocess.call(cmd)
            rc = rc or int(code != 0)
            rows.append((master, json.loads(out.read_text()) if out.exists() else None))
    print(f"how it scales with cores ({events:,} changes; baseline = decode + plain append; "
          f"{'local[N] pinned to N cores' if pin else 'unpinned'}):")
    for label, base_key, pick in _core_views(runs):
        print(f"{label}:")
        print(f"  {'master':<10} {'baseline ch/s':>14} " + " ".join(f"{e + ' ch/s':>14} {'vs base':>8}" for e in engines))
        for master, fig in rows:
            if fig is None:
                print(f"  {master:<10} (failed)")
                continue
            base = fig.get(base_key) or 0
            cells = []
            for e in engines:
                rate = pick(fig["engines"].get(e, {}).get("runs_per_s") or [0])
                cells.append(f"{rate:>14,.0f} {rate / base if base else 0:>8.2f}")
            print(f"  {master:<10} {base:>14,.0f} " + " ".join(cells))
        if len(rows) >= 2 and all(f is not None for _, f in rows):
            first, last = rows[0][1], rows[-1][1]
            for e in engines:
                a = pick(first["engines"][e]["runs_per_s"])  # type: ignore[index]
                b = pick(last["engines"][e]["runs_per_s"])  # type: ignore[index]
                print(f"  {e}: {rows[-1][0]} / {rows[0][0]} = {b / a:.2f}x")
    return rc


def _core_views(runs: int) -> list[tuple[str, str, Callable[[list[float]], float]]]:
    """The tables :func:`run_cores` prints: the first run (a fresh JVM) against the first baseline, and
    with more runs the best later one against the baseline measured again in the warm JVM."""
    views: list[tuple[str, str, Callable[[list[float]], float]]] = [
        ("first run, fresh JVM", "baseline_per_s", lambda rates: rates[0])]
    if runs > 1:
        views.append(("best later run, warm JVM", "baseline_warm_per_s", lambda rates: max(rates[1:], default=0)))
    return views


def _master_cores(master: str) -> int | None:
    """N of a ``local[N]`` master (``None``: ``local[*]``, ``local``'s default of every core, or not local)."""
    m = re.fullmatch(r"local\[(\d+)(?:,\d+)?\]", master.strip())
    return int(m.group(1)) if m else None
