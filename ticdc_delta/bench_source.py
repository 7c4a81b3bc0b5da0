"""Benchmark of Spark's Kafka source: messages per second read from the local Kafka broker.

Starts the local broker (Apache Kafka, KRaft), produces ``--messages`` small messages over
``--partitions`` partitions, then reads the whole topic with a streaming query (``local[2]``, one task
per partition, ``trigger(availableNow=True)``, foreachBatch counting rows), ``--repeat`` times on fresh
checkpoints — the raw read rate a job sees, including Spark's scheduling, before any decoding.

Usage::

    python -m ticdc_delta.bench_source --messages 200000 --partitions 2

Prints one line per measurement.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence

from ticdc_delta.local_broker import LocalBroker

__all__ = ["main", "bench_spark", "produce_fixture"]


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


def bench_spark(bootstrap_servers: str, topic: str) -> tuple[int, float]:
    """Read the whole topic with a streaming query (``availableNow``: one micro-batch, one task per partition).

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
        query = (
            df.writeStream.foreachBatch(count)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        try:
            query.awaitTermination()
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
    parser.add_argument("--repeat", type=int, default=2, help="query runs (best is reported too)")
    args = parser.parse_args(argv)

    with LocalBroker() as broker:
        began = time.perf_counter()
        produce_fixture(broker, "bench", args.messages, args.partitions, args.value_size)
        took = time.perf_counter() - began
        print(f"produce: {args.messages} messages in {took:.1f} s = {args.messages / took:,.0f} messages/s")
        rates = []
        for run in range(args.repeat):
            rows, secs = bench_spark(broker.bootstrap_servers, "bench")
            rates.append(rows / secs)
            print(f"spark query run {run + 1}: {rows} messages in {secs:.2f} s = {rows / secs:,.0f} messages/s")
        print(f"spark query best: {max(rates):,.0f} messages/s (local[2]; the broker shares the 2 cores)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
