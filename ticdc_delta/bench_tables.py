"""Many tables in one micro-batch: how the ``spark`` engine's MERGE threads and Spark's scheduler share the cores.

Each round produces ``--changes`` changes to each of ``--tables`` small tables and ``--busy`` changes to one
busy table (canal-json with the TiDB extension, on the local broker), then a watermark on every partition,
and runs the job once over it (``run_job(once=True)``: one micro-batch per round). For each ``--threads``
value (``sink.merge_threads``) a fresh changefeed runs one warm-up round and ``--rounds`` measured ones
(after a first changefeed that only warms the JVM up);
printed: the p50 of the batches' ``seconds`` and of their ``timings.apply`` (the MERGEs and DDL), and a
check of every table against the stream's expected rows.

Spark's scheduler mode (``spark.scheduler.mode``: ``FIFO``, Spark's default, or ``FAIR``) is fixed when
the JVM starts, so each mode runs in a Python process of its own; the figures are printed side by side.
Under ``FAIR`` each MERGE thread submits its jobs to a pool of its own (the engine sets
``spark.scheduler.pool`` per thread), so a small table's MERGE is not queued behind the busy one's tasks.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .bench_e2e import CanalStream
from .local_broker import LocalBroker

__all__ = ["run_tables", "measure_tables"]

SCHEDULERS = ("FIFO", "FAIR")


def _round(broker: LocalBroker, topic: str, streams: Sequence[CanalStream], counts: Sequence[int],
           partitions: int) -> None:
    """Produce ``counts[i]`` changes of ``streams[i]``, then one watermark past all of them per partition."""
    batch = []
    for stream, n in zip(streams, counts):
        batch += [(p, None, v) for p, v in (stream.change() for _ in range(n))]
    last = max(streams, key=lambda s: s.ts)
    batch += [(p, None, last.watermark()) for p in range(partitions)]
    broker.produce_many(topic, batch)


def measure_tables(*, scheduler: str, tables: int, busy: int, changes: int, rounds: int,
                   threads: Sequence[int], partitions: int) -> dict[str, Any]:
    """One scheduler mode (this process's JVM): per ``threads`` value, the p50 batch and apply seconds.

    Returns ``{"scheduler": ..., "runs": {threads: {"seconds": p50, "apply": p50, "ok": bool}}}``.

    Raises:
        ValueError: an unknown scheduler mode or a non-positive count.
    """
    import logging

    from .bench_e2e import _config
    from .bench_latency import _ProgressTap
    from .delta.sink import TableIdent
    from .spark.batch_handler import _ConfiguredSink
    from .spark.job import build_handler, run_job, spark_for

    if scheduler not in SCHEDULERS:
        raise ValueError(f"scheduler must be one of {', '.join(SCHEDULERS)}, got {scheduler!r}")
    if min(tables, busy, changes, rounds, partitions, *threads) <= 0:
        raise ValueError("tables, busy, changes, rounds, partitions and threads must be positive")
    work = Path(tempfile.mkdtemp(prefix="ticdc-delta-bench-tables-"))
    tap = _ProgressTap()
    progress_log = logging.getLogger("ticdc_delta.progress")
    level = progress_log.level
    progress_log.setLevel(logging.INFO)
    progress_log.addHandler(tap)
    runs: dict[str, Any] = {}
    try:
        with LocalBroker() as broker:
            conf: dict[str, Any] = {"spark": {"conf": {"spark.scheduler.mode": scheduler}}}
            spark = spark_for(_config(broker, "unused", work, "session", 1, **conf))
            mode = spark.sparkContext.getConf().get("spark.scheduler.mode", "FIFO")
            print(f"tables: scheduler {mode}, master {spark.sparkContext.master}; per round {tables} tables × "
                  f"{changes} changes + 1 table × {busy:,} changes, {rounds} rounds", flush=True)
            # a first changefeed of its own warms the JVM up (its code paths compile), so the order of the
            # measured ones does not count
            for warm, n_threads in [(True, threads[0])] + [(False, n) for n in threads]:
                name = f"tables-{'warm' if warm else n_threads}"
                topic = f"bench-{name}-{scheduler.lower()}"
                broker.create_topic(topic, partitions=partitions)
                cfg = _config(broker, topic, work, name, 10_000_000, engine="spark",
                              sink={"path": str(work / name / "lake"), "engine": "spark",
                                    "merge_threads": n_threads}, **conf)
                streams = [CanalStream(partitions, seed=i + 1, ts=None, table=f"t{i}") for i in range(tables)]
                streams.append(CanalStream(partitions, seed=99, ts=None, table="busy"))
                counts = [changes] * tables + [busy]
                start = len(tap.lines)
                for r in range(1 if warm else rounds + 1):
                    _round(broker, topic, streams, counts, partitions)
                    run_job(cfg, once=True, spark=spark, handler=build_handler(cfg))
                if warm:
                    continue
                lines = [line for _, line in tap.lines[start:]][1:]  # the warm-up round's batch left out
                sink = _ConfiguredSink(cfg)
                ok = all(
                    set(sink.read(TableIdent("bench", s.table)).column("id").to_pylist()) == set(s.live)
                    for s in streams
                )
                seconds = statistics.median(line["seconds"] for line in lines)
                apply = statistics.median(line["timings"].get("apply", 0.0) for line in lines)
                runs[str(n_threads)] = {"seconds": seconds, "apply": apply, "ok": ok, "batches": len(lines)}
                print(f"  merge_threads {n_threads}: {len(lines)} batches, p50 batch {seconds:.2f} s, "
                      f"apply {apply:.2f} s; tables {'OK' if ok else 'MISMATCH'}", flush=True)
    finally:
        progress_log.removeHandler(tap)
        progress_log.setLevel(level)
        shutil.rmtree(work, ignore_errors=True)
    return {"scheduler": scheduler, "runs": runs}


def run_tables(*, schedulers: Sequence[str] = SCHEDULERS, tables: int = 8, busy: int = 20_000, changes: int = 20,
               rounds: int = 4, threads: Sequence[int] = (1, 2, 4), partitions: int = 4) -> int:
    """:func:`measure_tables` once per scheduler mode, each in its own process, then side by side; returns 0,
    or 1 when a run failed or a table was wrong."""
    results: list[tuple[str, dict[str, Any] | None]] = []
    rc = 0
    with tempfile.TemporaryDirectory(prefix="ticdc-delta-bench-tables-") as tmp:
        for scheduler in schedulers:
            out = Path(tmp) / f"{scheduler}.json"
            cmd = [sys.executable, "-m", "ticdc_delta.bench", "tables", "--schedulers", scheduler, "--tables",
                   str(tables), "--busy", str(busy), "--changes", str(changes), "--rounds", str(rounds),
                   "--threads", *map(str, threads), "--partitions", str(partitions), "--summary-json", str(out)]
            code = subprocess.call(cmd)
            rc = rc or int(code != 0)
            results.append((scheduler, json.loads(out.read_text()) if out.exists() else None))
    print(f"many tables per batch ({tables} × {changes} changes + 1 × {busy:,}); p50 batch / apply seconds:")
    print(f"{'merge_threads':>13} " + " ".join(f"{s:>16}" for s, _ in results))
    for n in threads:
        cells = []
        for _, fig in results:
            run = (fig or {}).get("runs", {}).get(str(n))
            cells.append(f"{run['seconds']:>7.2f} / {run['apply']:>5.2f}" if run else f"{'(failed)':>16}")
            rc = rc or int(run is None or not run["ok"])
        print(f"{n:>13} " + " ".join(cells))
    return rc


def main_child(args: Any) -> int:
    """``bench tables`` with one scheduler and ``--summary-json``: the measuring process."""
    summary = measure_tables(scheduler=args.schedulers[0], tables=args.tables, busy=args.busy,
                             changes=args.changes, rounds=args.rounds, threads=args.threads,
                             partitions=args.partitions)
    Path(args.summary_json).write_text(json.dumps(summary))
    return 0 if all(r["ok"] for r in summary["runs"].values()) else 1
