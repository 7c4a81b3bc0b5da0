"""Benchmark of the ``ticdc-kafka`` source: messages per second read from a local broker.

Starts a tansu broker, produces ``--messages`` small messages over ``--partitions`` partitions, then
measures

* ``reader``: :meth:`KafkaStreamReader.read` in this process, one partition after the other (one core:
  librdkafka fetch + Python loop + Arrow batch building), and
* ``spark`` (with ``--spark``): a streaming query over the same data (``local[2]``, one task per
  partition), from ``start()`` to ``processAllAvailable()`` returning, foreachBatch counting rows —
  the source as a job sees it, including Spark's Arrow hand-over and scheduling.

Usage::

    python -m ticdc_delta.bench_source --messages 200000 --partitions 2 --spark

Prints one line per measurement. The reader line also gives the client's CPU per message: against tansu
the wall-clock rate is bound by the broker (it serves one record per batch and shares the 2 cores), so
the CPU figure says what the source itself costs. Producing is slow (tansu takes one record per produce
request: see :mod:`ticdc_delta.local_broker`), about 7k messages/s here, so 200k messages take about
half a minute to set up.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence

from ticdc_delta.local_broker import LocalBroker

__all__ = ["main", "bench_reader", "bench_spark", "produce_fixture"]


def produce_fixture(broker: LocalBroker, topic: str, messages: int, partitions: int, value_size: int) -> None:
    """Create ``topic`` and fill it with ``messages`` messages (key ~8 bytes, value ``value_size`` bytes).

    Raises:
        BrokerUnavailableError: a partition could not be filled.
    """
    broker.create_topic(topic, partitions=partitions)
    value = b"v" * value_size
    failures: list[BaseException] = []

    def fill(partition: int) -> None:
        count = len(range(partition, messages, partitions))
        batch = ((partition, b"k%07d" % i, value) for i in range(count))
        try:
            broker.produce_many(topic, batch, producer=broker.producer())  # own producer per thread
        except BaseException as exc:  # re-raised below, in the calling thread
            failures.append(exc)

    threads = [threading.Thread(target=fill, args=(p,)) for p in range(partitions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]


def bench_reader(bootstrap_servers: str, topic: str) -> tuple[int, float, float]:
    """Read the whole topic with the source's executor code in this process.

    Returns:
        (messages read, wall seconds, CPU seconds of this process: Python loop + librdkafka threads).
    """
    from ticdc_delta.spark.kafka_source import KafkaStreamReader, parse_options

    reader = KafkaStreamReader(
        parse_options(
            {"kafka.bootstrap.servers": bootstrap_servers, "subscribe": topic, "startingOffsets": "earliest"}
        )
    )
    try:
        start = reader.initialOffset()
        end = reader.latestOffset()
        partitions = reader.partitions(start, end)
    finally:
        reader.stop()
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    began = time.perf_counter()
    rows = 0
    for partition in partitions:
        for batch in reader.read(partition):
            rows += batch.num_rows
    wall = time.perf_counter() - began
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    return rows, wall, cpu


def bench_spark(bootstrap_servers: str, topic: str) -> tuple[int, float]:
    """Read the whole topic with a streaming query (one micro-batch, one task per partition).

    Returns:
        (messages counted by foreachBatch, seconds from start() to caught up).
    """
    from ticdc_delta.spark.kafka_source import read_kafka_stream
    from ticdc_delta.spark.session import get_or_create_spark

    spark = get_or_create_spark("ticdc-delta-bench-source")
    counted = [0]

    def count(df, _batch_id: int) -> None:  # type: ignore[no-untyped-def]
        counted[0] += df.count()

    checkpoint = tempfile.mkdtemp(prefix="ticdc-delta-bench-")
    try:
        df = read_kafka_stream(
            spark, bootstrap_servers=bootstrap_servers, topics=[topic], starting_offsets="earliest"
        )
        began = time.perf_counter()
        query = df.writeStream.foreachBatch(count).option("checkpointLocation", checkpoint).start()
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        return counted[0], time.perf_counter() - began
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; prints ``<what>: N messages in S s = R messages/s`` lines."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3, help="reader runs (best is reported too)")
    parser.add_argument("--spark", action="store_true", help="also measure a Spark streaming query")
    args = parser.parse_args(argv)

    with LocalBroker() as broker:
        began = time.perf_counter()
        produce_fixture(broker, "bench", args.messages, args.partitions, args.value_size)
        took = time.perf_counter() - began
        print(f"produce: {args.messages} messages in {took:.1f} s = {args.messages / took:,.0f} messages/s")
        rates = []
        for run in range(args.repeat):
            rows, secs, cpu = bench_reader(broker.bootstrap_servers, "bench")
            rates.append(rows / secs)
            print(
                f"reader run {run + 1}: {rows} messages in {secs:.2f} s = {rows / secs:,.0f} messages/s; "
                f"client CPU {cpu:.2f} s = {cpu / max(rows, 1) * 1e6:.1f} us/message"
            )
        print(f"reader best: {max(rates):,.0f} messages/s (one reader; the broker shares the 2 cores)")
        if args.spark:
            rows, secs = bench_spark(broker.bootstrap_servers, "bench")
            print(f"spark query: {rows} messages in {secs:.2f} s = {rows / secs:,.0f} messages/s (local[2])")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
