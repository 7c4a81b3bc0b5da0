"""Latency benchmark: what one micro-batch costs, and how long a resolved ts takes to become visible.

For each engine (``sink.engine: delta-rs`` and ``spark``), on the local broker, with the job running
(``run_job(once=False)``, ``trigger_interval: "1 second"``) and the canal-json stream of
:class:`~ticdc_delta.bench_e2e.CanalStream` (commit ts taken from the clock, as a live cluster's are):

* **fixed cost** — after a warm-up, ``--batches`` rounds of one change + a ``TIDB_WATERMARK`` on every
  partition, each waited for until visible: the p50 of the batches' own ``seconds`` (the progress line's
  figure: decode, plan, write, state) and of each of its ``timings``, and of Spark's whole trigger (its
  ``triggerExecution``: the batch plus Kafka's latest offsets and the checkpoint's offsets and commit files,
  which the progress line does not see). Then ``--warm-batches`` more such
  rounds, not measured, and ``--batches`` measured again: the fixed cost once the JVM is warm. A fresh
  JVM's JIT keeps compiling Spark's and Delta's driver code for the first minutes of a job (here its
  compiler threads took ~0.9 of a core in the first minute of one-change batches and ~0.45 in the second),
  so the first figure is a fresh job's and the second what a job running for a few minutes pays;
* **steady state** — a producer thread sends ``--rate`` changes/s and a watermark every 200 ms for
  ``--seconds``. A watermark with ts ``W`` whose produce call was acknowledged by the broker at ``t_p`` is
  *visible* at ``t_v``, the moment the first progress line with ``watermark ≥ W`` is logged — that line
  is written after the batch committed its tables and its state, so every row up to ``W`` can be read.
  Printed: p50 / p95 / max of ``t_v − t_p``, batches/s, the p50 batch ``seconds``.

Each engine's table is then checked against the stream's expected rows (OK / MISMATCH, exit 1).
"""

from __future__ import annotations

import json
import logging
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .bench_e2e import ENGINES, CanalStream, PeakRss, jvm_pid
from .local_broker import LocalBroker

__all__ = ["run_latency", "percentile"]

_TICK = 0.2  # seconds between watermarks in the steady state


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0 < q ≤ 100) of ``values``.

    Raises:
        ValueError: ``values`` is empty or ``q`` is out of range.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 < q <= 100:
        raise ValueError(f"q must be in (0, 100], got {q}")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n * q / 100)
    return ordered[int(rank) - 1]


class _ProgressTap(logging.Handler):
    """Records each progress line (logger ``ticdc_delta.progress``) with the moment it was logged."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[float, dict[str, Any]]] = []
        self._cond = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        now = time.monotonic()
        try:
            line = json.loads(record.getMessage())
        except ValueError:
            return
        with self._cond:
            self.lines.append((now, line))
            self._cond.notify_all()

    def wait_for(self, watermark: int, timeout: float, failed: threading.Event) -> tuple[float, dict[str, Any]]:
        """The first line whose watermark ≥ ``watermark`` (waiting up to ``timeout`` seconds).

        Raises:
            TimeoutError: none came in time, or the job stopped (``failed``).
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for t, line in self.lines:
                    if line.get("watermark") is not None and line["watermark"] >= watermark:
                        return t, line
                left = deadline - time.monotonic()
                if left <= 0 or failed.is_set():
                    raise TimeoutError(f"watermark {watermark} not visible after {timeout:.0f} s")
                self._cond.wait(min(left, 0.5))

    def since(self, start: float) -> list[tuple[float, dict[str, Any]]]:
        with self._cond:
            return [(t, line) for t, line in self.lines if t >= start]


class _TriggerTap:
    """Spark's durations (``durationMs``) of each micro-batch of one query, by batch id, from its progress
    events: the whole trigger (``triggerExecution``) is the batch itself plus what Spark does around it
    (asking Kafka for the latest offsets, writing the batch's offsets before it and its commit after)."""

    def __init__(self, query_name: str) -> None:
        from .spark.job import json_progress_listener

        self._query_name = query_name
        self._durations: dict[int, dict[str, float]] = {}
        self._cond = threading.Condition()
        self.listener = json_progress_listener(self._on_progress)

    def _on_progress(self, progress: dict[str, Any]) -> None:
        if progress.get("name") == self._query_name and isinstance(progress.get("batchId"), int):
            with self._cond:
                self._durations[progress["batchId"]] = {k: v / 1000 for k, v in progress["durationMs"].items()}
                self._cond.notify_all()

    def durations(self, batch_ids: Sequence[int], timeout: float = 10.0) -> list[dict[str, float]]:
        """The durations (seconds) of the batches ``batch_ids`` that Spark reported within ``timeout``
        (a batch's event comes after its commit, a little after its progress line)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while any(b not in self._durations for b in batch_ids) and time.monotonic() < deadline:
                self._cond.wait(0.2)
            return [self._durations[b] for b in batch_ids if b in self._durations]


class _Feed:
    """Produces changes and watermarks of one stream to one topic (every watermark to every partition)."""

    def __init__(self, broker: LocalBroker, topic: str, partitions: int) -> None:
        self.broker, self.topic, self.partitions = broker, topic, partitions
        self.stream = CanalStream(partitions, ts=None)
        self.producer = broker.producer(**{"linger.ms": 1})
        self.changes = 0

    def send(self, n: int) -> tuple[float, int]:
        """Produce ``n`` changes then a watermark resolving them; returns (acknowledged at, watermark ts)."""
        msgs = [self.stream.change() for _ in range(n)]
        wm = self.stream.watermark()
        batch = [(p, None, v) for p, v in msgs] + [(p, None, wm) for p in range(self.partitions)]
        self.broker.produce_many(self.topic, batch, producer=self.producer)
        self.changes += n
        return time.monotonic(), self.stream.ts


def _p50_timings(lines: Sequence[dict[str, Any]]) -> dict[str, float]:
    keys = sorted({k for line in lines for k in line.get("timings", {})})
    return {k: statistics.median(line["timings"].get(k, 0.0) for line in lines) for k in keys}


def _measure(engine: str, broker: LocalBroker, spark: Any, work: Path, *, seconds: float, rate: int,
             batches: int, partitions: int, master: str | None, warm_batches: int) -> bool:
    """One engine's fixed cost and steady-state latency, printed; returns whether its table is right."""
    from .bench_e2e import _config
    from .delta.sink import TableIdent
    from .spark.batch_handler import _ConfiguredSink
    from .spark.job import build_handler, query_name, run_job

    name = f"lat-{engine}"
    topic = f"bench-latency-{engine}"
    broker.create_topic(topic, partitions=partitions)
    cfg = _config(broker, topic, work, name, 100_000, engine=engine, master=master,
                  trigger_interval="1 second")
    tap = _ProgressTap()
    progress_log = logging.getLogger("ticdc_delta.progress")
    level = progress_log.level
    progress_log.setLevel(logging.INFO)
    progress_log.addHandler(tap)
    qname = query_name(name)
    triggers = _TriggerTap(qname)
    spark.streams.addListener(triggers.listener)
    failed = threading.Event()
    errors: list[BaseException] = []

    def job() -> None:
        try:
            run_job(cfg, once=False, spark=spark, handler=build_handler(cfg))
        except BaseException as exc:  # reported by the caller
            errors.append(exc)
        finally:
            failed.set()

    feed = _Feed(broker, topic, partitions)
    runner = threading.Thread(target=job, name=f"job-{engine}", daemon=True)
    runner.start()
    try:
        # warm-up: the query starts, Python workers import, the table is created
        _, w = feed.send(200)
        tap.wait_for(w, 300, failed)
        for _ in range(2):
            _, w = feed.send(1)
            tap.wait_for(w, 120, failed)

        def single_batches(n: int) -> tuple[list[dict[str, Any]], list[float]]:
            """``n`` rounds of one change + a watermark, each waited for: their progress lines and the
            seconds from each change's acknowledgement to its batch's line."""
            start = time.monotonic()
            single: list[float] = []
            for _ in range(n):
                t_p, w = feed.send(1)
                t_v, _line = tap.wait_for(w, 120, failed)
                single.append(t_v - t_p)
            return [line for _, line in tap.since(start)], single

        def report(label: str, lines: list[dict[str, Any]], single: list[float], what: str) -> None:
            costs = [line["seconds"] for line in lines]
            print(f"{engine:<8} {label}: {len(lines)} batches of one change{what}: batch seconds p50 "
                  f"{percentile(costs, 50):.2f} s (min {min(costs):.2f}, max {max(costs):.2f}); produced → "
                  f"visible p50 {percentile(single, 50):.2f} s (includes waiting for the 1 s trigger)")
            timings = _p50_timings(lines)
            if timings:
                print(f"{'':<8}   p50 timings: " + ", ".join(f"{k} {v:.2f}" for k, v in timings.items()))
            spark_says = triggers.durations([line["batch_id"] for line in lines])
            if spark_says:
                def p50(key: str) -> float:
                    return percentile([d.get(key, 0.0) for d in spark_says], 50)

                print(f"{'':<8}   Spark's whole trigger p50 {p50('triggerExecution'):.2f} s: the batch "
                      f"{p50('addBatch'):.2f}, Kafka's latest offsets {p50('latestOffset'):.2f}, the checkpoint's "
                      f"offsets {p50('walCommit'):.2f} and commit {p50('commitOffsets'):.2f} "
                      f"({len(spark_says)} of the {len(lines)} batches reported)")

        # (a) fixed cost: one change + a watermark, waited for, `batches` times; then, after `warm_batches`
        # more, again (the JIT has compiled the driver's hot paths by then)
        report("fixed cost ", *single_batches(batches), "")
        if warm_batches > 0:
            single_batches(warm_batches)
            report("fixed, warm", *single_batches(batches), f" after {warm_batches} more")

        # (b) steady state: `rate` changes/s, a watermark every 200 ms
        produced: list[tuple[float, int]] = []
        stop = threading.Event()

        def producer() -> None:
            t0, k, carry = time.monotonic(), 0, 0.0
            while not stop.is_set() and not failed.is_set():
                carry += rate * _TICK
                n, carry = int(carry), carry - int(carry)
                produced.append(feed.send(n))
                k += 1
                delay = t0 + k * _TICK - time.monotonic()
                if delay > 0:
                    stop.wait(delay)

        before = feed.changes
        steady_start = time.monotonic()
        thread = threading.Thread(target=producer, name="bench-producer", daemon=True)
        with PeakRss([p for p in [jvm_pid(spark)] if p]) as rss:
            thread.start()
            time.sleep(seconds)
            stop.set()
            thread.join()
            produce_secs = time.monotonic() - steady_start
            tap.wait_for(produced[-1][1], 300, failed)
        latencies = [tap.wait_for(w, 1, failed)[0] - t_p for t_p, w in produced]
        last_visible = tap.wait_for(produced[-1][1], 1, failed)[0]
        steady = [(t, line) for t, line in tap.since(steady_start) if t <= last_visible]
        span = last_visible - steady_start
        changes = feed.changes - before
        print(f"{engine:<8} steady     : {changes:,} changes in {produce_secs:.1f} s = "
              f"{changes / produce_secs:,.0f} changes/s offered, {len(produced)} watermarks; "
              f"{len(steady)} batches in {span:.1f} s = {len(steady) / span:.2f} batches/s, batch seconds p50 "
              f"{percentile([line['seconds'] for _, line in steady], 50):.2f}")
        print(f"{'':<8}   resolved ts produced → visible in Delta: p50 {percentile(latencies, 50):.2f} s, "
              f"p95 {percentile(latencies, 95):.2f} s, max {max(latencies):.2f} s; driver RSS peak − before "
              f"{(rss.growth()) / 2**20:+,.0f} MiB")
    finally:
        for query in spark.streams.active:
            if query.name == qname:
                # the progress line is logged before Spark writes the batch to its commit log: stopping
                # then interrupts that write (a harmless but loud trace), so wait for the trigger to end
                deadline = time.monotonic() + 30
                while query.status.get("isTriggerActive") and time.monotonic() < deadline:
                    time.sleep(0.1)
                query.stop()
        runner.join(120)
        spark.streams.removeListener(triggers.listener)
        progress_log.removeHandler(tap)
        progress_log.setLevel(level)
    if errors:
        raise errors[0]
    got = _ConfiguredSink(cfg).read(TableIdent("bench", "orders"))
    expected = feed.stream.live
    ok = got.num_rows == len(expected) and set(got.column("id").to_pylist()) == set(expected)
    print(f"{'':<8}   check: {engine} table has {got.num_rows:,} rows, expected {len(expected):,}: "
          f"{'OK' if ok else 'MISMATCH'}")
    return ok


def run_latency(*, engines: Sequence[str] = ENGINES, seconds: float = 60.0, rate: int = 2000, batches: int = 10,
                partitions: int = 4, master: str | None = None, warm_batches: int = 100) -> int:
    """Run the latency benchmark for each engine and print the figures; returns 0, or 1 on a wrong table.

    Raises:
        ValueError: an unknown engine, a non-positive ``seconds``, ``rate`` or ``batches``, or a negative
            ``warm_batches``.
    """
    from .bench_e2e import _config
    from .spark.job import spark_for

    for engine in engines:
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if seconds <= 0 or rate <= 0 or batches <= 0:
        raise ValueError(f"seconds, rate and batches must be positive, got {seconds}, {rate}, {batches}")
    if warm_batches < 0:
        raise ValueError(f"warm_batches must not be negative, got {warm_batches}")
    work = Path(tempfile.mkdtemp(prefix="ticdc-delta-bench-latency-"))
    try:
        with LocalBroker() as broker:
            spark = spark_for(_config(broker, "unused", work, "session", 1, master=master))
            print(f"latency: trigger 1 s, {partitions} partitions, master {spark.sparkContext.master}; "
                  f"steady state {rate:,} changes/s for {seconds:.0f} s, a watermark every {_TICK * 1000:.0f} ms")
            ok = True
            for engine in engines:
                ok &= _measure(engine, broker, spark, work, seconds=seconds, rate=rate, batches=batches,
                               partitions=partitions, master=master, warm_batches=warm_batches)
            return 0 if ok else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
