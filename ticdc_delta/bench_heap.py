"""The driver's memory as micro-batches add up: many small batches of several tables in one long-running query.

A canal-json stream of ``--tables`` tables (``--changes`` changes in all, a watermark on every partition
after each 20 changes) is produced to the local broker first; then one job (``run_job(once=True)``, one
streaming query, like a long-running job's) reads it ``--per-batch`` Kafka messages per micro-batch. Every
``--every`` batches the driver JVM's live heap (after a full GC: :mod:`ticdc_delta.spark.jvm_heap`), its
live Spark sessions and the Python driver's RSS are recorded. Each engine runs in a Python process (and
JVM) of its own; printed side by side, with each engine's growth per 100 batches from its second sample to
its last (the first includes the JVM's warm-up) and a check of every table against the stream.

Taking a sample pauses the batch it follows for the full GC; the batches' timings are not the point here.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .bench_e2e import ENGINES, CanalStream, PeakRss, _config
from .local_broker import LocalBroker
from .spark.jvm_heap import BatchHeapSampler

__all__ = ["measure_heap", "run_heap"]

WATERMARK_EVERY = 20
"""Changes between two watermarks (on every partition): each micro-batch has rows to apply."""


class _Sampler(BatchHeapSampler):
    """The JVM's live heap and sessions every ``every`` batches, and this process's RSS."""

    def sample(self) -> dict[str, int]:
        return {**super().sample(), "rss": PeakRss._rss("self")}


def measure_heap(*, engine: str, tables: int, changes: int, per_batch: int, every: int,
                 partitions: int) -> dict[str, Any]:
    """One engine in this process's JVM (see the module docstring).

    Returns ``{"engine", "batches", "samples": [{"batch", "heap", "sessions", "rss"}], "ok"}``.

    Raises:
        ValueError: an unknown engine or a non-positive count.
    """
    from .delta.sink import TableIdent
    from .spark.batch_handler import _ConfiguredSink
    from .spark.job import build_handler, run_job, spark_for

    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if min(tables, changes, per_batch, every, partitions) <= 0:
        raise ValueError("tables, changes, per-batch, every and partitions must be positive")
    work = Path(tempfile.mkdtemp(prefix="ticdc-delta-bench-heap-"))
    progress_log = logging.getLogger("ticdc_delta.progress")
    level = progress_log.level
    try:
        with LocalBroker() as broker:
            topic = f"bench-heap-{engine}"
            broker.create_topic(topic, partitions=partitions)
            streams = [CanalStream(partitions, seed=i + 1, table=f"t{i}") for i in range(tables)]
            batch: list[tuple[int, None, bytes]] = []
            for n in range(changes):
                stream = streams[n % tables]
                part, msg = stream.change()
                batch.append((part, None, msg))
                for other in streams:  # one clock: every later change commits after this one
                    other.ts = stream.ts
                if n % WATERMARK_EVERY == WATERMARK_EVERY - 1 or n == changes - 1:
                    batch += [(p, None, stream.watermark()) for p in range(partitions)]
            broker.produce_many(topic, batch)
            cfg = _config(broker, topic, work, "heap", per_batch, engine=engine)
            spark = spark_for(cfg)
            sampler = _Sampler(spark, every)
            progress_log.setLevel(logging.INFO)
            progress_log.addHandler(sampler)
            try:
                batches = run_job(cfg, once=True, spark=spark, handler=build_handler(cfg))
            finally:
                progress_log.removeHandler(sampler)
            sink = _ConfiguredSink(cfg)
            ok = all(set(sink.read(TableIdent("bench", s.table)).column("id").to_pylist()) == set(s.live)
                     for s in streams)
    finally:
        progress_log.setLevel(level)
        shutil.rmtree(work, ignore_errors=True)
    return {"engine": engine, "batches": batches, "samples": sampler.samples, "ok": ok}


def _growth(samples: list[dict[str, int]], key: str) -> float | None:
    """``key``'s growth per 100 batches from the second sample to the last (None with fewer than 3)."""
    if len(samples) < 3:
        return None
    first, last = samples[1], samples[-1]
    return (last[key] - first[key]) * 100 / (last["batch"] - first["batch"])


def run_heap(*, engines: Sequence[str] = ENGINES, tables: int = 4, changes: int = 6_000, per_batch: int = 60,
             every: int = 20, partitions: int = 3) -> int:
    """:func:`measure_heap` once per engine, each in its own process, then side by side; returns 0, or 1
    when a run failed or a table was wrong."""
    results: list[tuple[str, dict[str, Any] | None]] = []
    rc = 0
    print(f"heap: {tables} tables, {changes:,} changes (a watermark every {WATERMARK_EVERY}), {per_batch} "
          f"Kafka messages per micro-batch, one query; a sample every {every} batches", flush=True)
    with tempfile.TemporaryDirectory(prefix="ticdc-delta-bench-heap-") as tmp:
        for engine in engines:
            out = Path(tmp) / f"{engine}.json"
            cmd = [sys.executable, "-m", "ticdc_delta.bench", "heap", "--engines", engine, "--tables", str(tables),
                   "--changes", str(changes), "--per-batch", str(per_batch), "--every", str(every),
                   "--partitions", str(partitions), "--summary-json", str(out)]
            code = subprocess.call(cmd)
            rc = rc or int(code != 0)
            results.append((engine, json.loads(out.read_text()) if out.exists() else None))
    print("driver JVM live heap MiB (live Spark sessions) / Python driver RSS MiB, after batch:")
    print(f"{'batch':>6} " + " ".join(f"{e:>26}" for e, _ in results))
    rows = sorted({s["batch"] for _, fig in results if fig for s in fig["samples"]})
    for b in rows:
        cells = []
        for _, fig in results:
            s = next((s for s in (fig or {}).get("samples", []) if s["batch"] == b), None)
            cells.append(f"{s['heap'] / 2**20:>9.0f} ({s['sessions']:>3}) / {s['rss'] / 2**20:>6.0f}" if s
                         else f"{'':>26}")
        print(f"{b:>6} " + " ".join(cells))
    for engine, fig in results:
        if fig is None:
            print(f"  {engine}: failed")
            rc = 1
            continue
        heap, sessions, rss = (_growth(fig["samples"], k) for k in ("heap", "sessions", "rss"))
        growth = ("too few samples" if heap is None or sessions is None or rss is None else
                  f"JVM heap {heap / 2**20:+.1f} MiB, sessions {sessions:+.1f}, Python RSS {rss / 2**20:+.1f} MiB "
                  f"per 100 batches")
        print(f"  {engine}: {fig['batches']} batches; {growth}; tables {'OK' if fig['ok'] else 'MISMATCH'}")
        rc = rc or int(not fig["ok"])
    return rc


def main_child(args: Any) -> int:
    """``bench heap`` with one engine and ``--summary-json``: the measuring process."""
    summary = measure_heap(engine=args.engines[0], tables=args.tables, changes=args.changes,
                           per_batch=args.per_batch, every=args.every, partitions=args.partitions)
    Path(args.summary_json).write_text(json.dumps(summary))
    return 0 if summary["ok"] else 1
