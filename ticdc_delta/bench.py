"""Benchmarks that print figures (never timing assertions in tests).

``python -m ticdc_delta.bench decode`` — decode throughput per protocol for 10-column rows, one core, and
bytes per event on the wire, next to plain ``json.loads`` / ``orjson.loads`` of one 10-column canal-json
message measured in the same run (the machine may be shared: read the rates relative to those). Rates
are per second of this process's CPU time (``time.process_time``), so time spent descheduled on a busy
machine does not count; cache and frequency effects of other work still do. ``--records`` adds the
executor's per-event work (``record_from_event`` + ``dump_record``).

``python -m ticdc_delta.bench e2e`` — Kafka → Delta end to end for a canal-json stream (default 1M row
events) on the local broker: changes/s with gating + MERGE, the same job with a plain append of the
decoded rows instead (the limit for this source and decoder), their ratio, and the raw Kafka read rate of
the source — for both engines (``--engines delta-rs spark``), with each engine's driver peak RSS growth.

``python -m ticdc_delta.bench cores`` — the spark engine's e2e under ``local[1]`` and ``local[2]`` (one
subprocess per master, ``local[N]`` pinned to N cores), side by side: the first run in a fresh JVM and the
best later run in the warm one.

``python -m ticdc_delta.bench latency`` — per engine, the fixed cost of a micro-batch of one change, and
the time from a resolved ts being produced to its rows being visible under a steady load
(:mod:`ticdc_delta.bench_latency`).

``python -m ticdc_delta.bench heap`` — the driver's memory over many small micro-batches of several tables
in one query, per engine: the JVM's live heap and sessions, the Python driver's RSS
(:mod:`ticdc_delta.bench_heap`). Not part of ``all``: ``make bench-heap``.

``python -m ticdc_delta.bench bigtable`` — the spark engine's MERGEs into a big table (10M rows) with and
without the key range of ``sink.merge_key_range_rows`` (:mod:`ticdc_delta.bench_bigtable`). Not part of
``all``: ``make bench-bigtable``.

``python -m ticdc_delta.bench tables`` — the spark engine with many tables per micro-batch (small ones and
a busy one): batch and MERGE seconds per ``sink.merge_threads`` value, under Spark's ``FIFO`` and ``FAIR``
scheduler modes (one subprocess each) (:mod:`ticdc_delta.bench_tables`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Callable

from .codec import DecodeContext, decoder_for, encoder_for
from .codec.model import Column, ColumnFlag, Op, RowChange, TypeCode

__all__ = ["bench_decode", "bench_reference", "main"]

_COLUMNS = [
    ("id", TypeCode.BIGINT, ColumnFlag.HANDLE_KEY | ColumnFlag.PRIMARY_KEY),
    ("user_id", TypeCode.INT, ColumnFlag.NULLABLE),
    ("amount", TypeCode.DECIMAL, ColumnFlag.NULLABLE),
    ("price", TypeCode.DOUBLE, ColumnFlag.NULLABLE),
    ("status", TypeCode.VARCHAR, ColumnFlag.NULLABLE),
    ("note", TypeCode.VARCHAR, ColumnFlag.NULLABLE),
    ("created", TypeCode.DATETIME, ColumnFlag.NULLABLE),
    ("day", TypeCode.DATE, ColumnFlag.NULLABLE),
    ("qty", TypeCode.SMALLINT, ColumnFlag.NULLABLE),
    ("flag", TypeCode.TINYINT, ColumnFlag.NULLABLE),
]

PROTOCOL_OPTIONS = {
    "open-protocol": {"max-batch-size": "16"},
    "craft": {"max-batch-size": "16"},
    "canal-json": {"enable-tidb-extension": "true"},
    "avro": {"enable-tidb-extension": "true"},
}


def _events(n: int) -> list[RowChange]:
    out = []
    ts = 446_000_000_000_000_000
    for i in range(n):
        values = [i, i % 9973, f"{i % 100000}.{i % 100:02d}", i * 0.5, "paid", f"note {i}",
                  "2024-01-02 03:04:05", "2024-01-02", i % 300, i % 2]
        cols = tuple(Column(name, int(t), f, v) for (name, t, f), v in zip(_COLUMNS, values))
        out.append(RowChange(ts + i, "shop", "orders", Op.INSERT, cols, None))
    return out


def _messages(protocol: str, n: int) -> tuple[list[tuple[bytes | None, bytes | None]], Any]:
    """The encoded messages of ``n`` bench events, and the Avro schemas (None for other protocols)."""
    schemas = None
    if protocol == "avro":
        from .codec.avro import AvroSchemas

        schemas = AvroSchemas()
    enc = encoder_for(protocol, PROTOCOL_OPTIONS[protocol], schemas=schemas)
    msgs = enc.encode(_events(n))
    return [(m.key, m.value) for m in msgs], schemas


def _rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


def _time_parse(parse: Callable[[bytes], Any], values: list[bytes]) -> float:
    t0 = time.process_time()
    for v in values:
        parse(v)
    return time.process_time() - t0


def bench_reference(n: int = 20000, repeat: int = 5) -> dict[str, float]:
    """Best rates of plain ``json.loads`` and ``orjson.loads`` over ``n`` 10-column canal-json messages
    (one event each): what a JSON decoder costs on this machine right now, to read decode rates against
    (the machine may be shared)."""
    import json

    import orjson

    msgs, _ = _messages("canal-json", n)
    values = [v for _, v in msgs if v is not None]
    return {
        "json_per_s": max(_rate(len(values), _time_parse(json.loads, values)) for _ in range(repeat)),
        "orjson_per_s": max(_rate(len(values), _time_parse(orjson.loads, values)) for _ in range(repeat)),
    }


def bench_decode(protocol: str, n: int = 20000, repeat: int = 5, records: bool = False) -> dict[str, Any]:
    """Decode ``n`` 10-column insert events ``repeat`` times; the best and median rates.

    Each round also times ``orjson.loads`` over ``n`` canal-json messages of the same rows just before,
    so ``vs_orjson`` (median of the per-round ratios) stays comparable when the machine is loaded. With
    ``records``, each event also becomes the record the Spark executors ship to the driver
    (``record_from_event`` + ``dump_record``), the job's real per-event work.

    Raises:
        RuntimeError: the decoder yielded a different number of events than were encoded.
    """
    import orjson

    from .core.records import dump_record, record_from_event

    msgs, schemas = _messages(protocol, n)
    reference = [v for _, v in _messages("canal-json", n)[0] if v is not None]
    dec = decoder_for(protocol, PROTOCOL_OPTIONS[protocol], schemas=schemas)
    ctx = DecodeContext("bench", 0, 0)
    wire = sum(len(k or b"") + len(v or b"") for k, v in msgs)
    rates, ratios = [], []
    decode: Callable[..., Any] = dec.decode
    count = 0
    for _ in range(repeat):
        ref_rate = _rate(len(reference), _time_parse(orjson.loads, reference))
        t0 = time.process_time()
        count = 0
        if records:
            for k, v in msgs:
                for idx, ev in enumerate(decode(k, v, ctx)):
                    dump_record(record_from_event(ev, "bench", 0, 0, idx))
                    count += 1
        else:
            for k, v in msgs:
                count += len(decode(k, v, ctx))
        rate = _rate(count, time.process_time() - t0)
        rates.append(rate)
        ratios.append(rate / ref_rate)
    if count != n:
        raise RuntimeError(f"{protocol}: decoded {count} events, expected {n}")
    return {"protocol": protocol, "events": n, "best_per_s": max(rates), "median_per_s": statistics.median(rates),
            "vs_orjson": statistics.median(ratios), "bytes_per_event": wire / n, "messages": len(msgs)}


def _cmd_decode(args: argparse.Namespace) -> int:
    what = "decode + record_from_event + dump_record" if args.records else "decode"
    print(f"{what} throughput, 10-column row events, one core ({args.events} events x {args.repeat})")
    ref = bench_reference(args.events, args.repeat)
    print(f"reference (one 10-column canal-json message): json.loads {ref['json_per_s']:,.0f}/s, "
          f"orjson.loads {ref['orjson_per_s']:,.0f}/s (best of {args.repeat})")
    print(f"{'protocol':<14} {'best ev/s':>12} {'median ev/s':>12} {'vs orjson':>10} {'bytes/event':>12} "
          f"{'messages':>9}")
    for protocol in args.protocols:
        r = bench_decode(protocol, args.events, args.repeat, records=args.records)
        print(f"{protocol:<14} {r['best_per_s']:>12,.0f} {r['median_per_s']:>12,.0f} {r['vs_orjson']:>10.2f} "
              f"{r['bytes_per_event']:>12.1f} {r['messages']:>9}")
    print("vs orjson: median over rounds of (decode rate / orjson.loads rate measured just before it)")
    return 0


def _cmd_e2e(args: argparse.Namespace) -> int:
    from .bench_e2e import run_e2e

    return run_e2e(events=args.events, partitions=args.partitions, max_offsets=args.max_offsets,
                   engines=args.engines, master=args.master, source=not args.no_source,
                   baseline=not args.no_baseline, summary=args.summary_json, runs=args.runs, cpus=args.cpus)


def _cmd_cores(args: argparse.Namespace) -> int:
    from .bench_e2e import run_cores

    return run_cores(events=args.events, masters=args.masters, engines=args.engines,
                     partitions=args.partitions, max_offsets=args.max_offsets, runs=args.runs,
                     pin=not args.no_pin)


def _cmd_latency(args: argparse.Namespace) -> int:
    from .bench_latency import run_latency

    return run_latency(engines=args.engines, seconds=args.seconds, rate=args.rate, batches=args.batches,
                       partitions=args.partitions, master=args.master, warm_batches=args.warm_batches)


def _cmd_tables(args: argparse.Namespace) -> int:
    from .bench_tables import main_child, run_tables

    if args.summary_json:  # the measuring process of one scheduler mode
        return main_child(args)
    return run_tables(schedulers=args.schedulers, tables=args.tables, busy=args.busy, changes=args.changes,
                      rounds=args.rounds, threads=args.threads, partitions=args.partitions)


def _cmd_bigtable(args: argparse.Namespace) -> int:
    from .bench_bigtable import run_bigtable

    return run_bigtable(rows=args.rows, files=args.files, changes=args.changes, rounds=args.rounds,
                        partitions=args.partitions, layout=args.layout, key_range_rows=args.key_range_rows)


def _cmd_heap(args: argparse.Namespace) -> int:
    from .bench_heap import main_child, run_heap

    if args.summary_json:  # the measuring process of one engine
        return main_child(args)
    return run_heap(engines=args.engines, tables=args.tables, changes=args.changes, per_batch=args.per_batch,
                    every=args.every, partitions=args.partitions)


def main(argv: list[str] | None = None) -> int:
    from .bench_bigtable import LAYOUTS
    from .bench_e2e import ENGINES

    parser = argparse.ArgumentParser(prog="python -m ticdc_delta.bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    d = sub.add_parser("decode", help="decode throughput per protocol")
    d.add_argument("--events", type=int, default=20000)
    d.add_argument("--repeat", type=int, default=5)
    d.add_argument("--protocols", nargs="+", default=list(PROTOCOL_OPTIONS))
    d.add_argument("--records", action="store_true",
                   help="also turn each event into the executor -> driver record (pickled)")
    d.set_defaults(func=_cmd_decode)
    e = sub.add_parser("e2e", help="Kafka → Delta end to end (canal-json), both engines")
    e.add_argument("--events", type=int, default=1_000_000)
    e.add_argument("--partitions", type=int, default=4)
    e.add_argument("--max-offsets", type=int, default=250_000)
    e.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    e.add_argument("--master", default=None, help="Spark master (default local[2])")
    e.add_argument("--no-source", action="store_true", help="skip the raw Kafka read rate")
    e.add_argument("--no-baseline", action="store_true", help="skip the append-only baseline")
    e.add_argument("--runs", type=int, default=2,
                   help="runs per engine, each on new tables: the first pays for the JVM's warm-up")
    e.add_argument("--cpus", type=int, default=None,
                   help="pin the Spark driver, its JVM and workers to this many cores (the broker keeps all)")
    e.add_argument("--summary-json", default=None, help=argparse.SUPPRESS)
    e.set_defaults(func=_cmd_e2e)
    c = sub.add_parser("cores", help="e2e per Spark master (local[1] vs local[2]), one subprocess each")
    c.add_argument("--events", type=int, default=200_000)
    c.add_argument("--partitions", type=int, default=4)
    c.add_argument("--max-offsets", type=int, default=250_000)
    c.add_argument("--masters", nargs="+", default=["local[1]", "local[2]"])
    c.add_argument("--engines", nargs="+", choices=ENGINES, default=["spark"])
    c.add_argument("--runs", type=int, default=2,
                   help="runs per master: the first pays for the JVM's warm-up (its JIT takes the second core)")
    c.add_argument("--no-pin", action="store_true",
                   help="do not pin local[N] to N cores (its driver threads and JIT then use the others)")
    c.set_defaults(func=_cmd_cores)
    lat = sub.add_parser("latency", help="per-batch fixed cost and resolved-ts → visible latency")
    lat.add_argument("--engines", "--engine", nargs="+", choices=ENGINES, default=list(ENGINES))
    lat.add_argument("--seconds", type=float, default=60.0, help="steady-state phase per engine")
    lat.add_argument("--rate", type=int, default=2000, help="changes/s in the steady-state phase")
    lat.add_argument("--batches", type=int, default=10, help="single-change batches for the fixed cost")
    lat.add_argument("--warm-batches", type=int, default=100,
                     help="single-change batches between the fresh JVM's fixed cost and the warm one's (0: none)")
    lat.add_argument("--partitions", type=int, default=4)
    lat.add_argument("--master", default=None, help="Spark master (default local[2])")
    lat.set_defaults(func=_cmd_latency)
    t = sub.add_parser("tables", help="many tables per batch: spark engine MERGE threads × Spark scheduler mode")
    t.add_argument("--schedulers", nargs="+", choices=("FIFO", "FAIR"), default=["FIFO", "FAIR"])
    t.add_argument("--tables", type=int, default=8, help="small tables per round")
    t.add_argument("--changes", type=int, default=20, help="changes per small table per round")
    t.add_argument("--busy", type=int, default=20_000, help="changes of the busy table per round")
    t.add_argument("--rounds", type=int, default=4, help="measured rounds (one batch each) per thread count")
    t.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4], help="sink.merge_threads values")
    t.add_argument("--partitions", type=int, default=4)
    t.add_argument("--summary-json", default=None, help=argparse.SUPPRESS)
    t.set_defaults(func=_cmd_tables)
    bt = sub.add_parser("bigtable", help="spark engine MERGEs into a big table, with and without the key range")
    bt.add_argument("--rows", type=int, default=10_000_000, help="rows loaded into the table before the rounds")
    bt.add_argument("--files", type=int, default=40, help="files the loaded rows are written in (key order)")
    bt.add_argument("--changes", type=int, nargs="+", default=[1, 2000], help="changes per batch, per round")
    bt.add_argument("--rounds", type=int, default=3)
    bt.add_argument("--partitions", type=int, default=1)
    bt.add_argument("--layout", choices=LAYOUTS, default="key-order",
                    help="the loaded rows' files in key order, or each holding keys from the whole range")
    bt.add_argument("--key-range-rows", type=int, default=1,
                    help="the bounded changefeed's sink.merge_key_range_rows")
    bt.set_defaults(func=_cmd_bigtable)
    hp = sub.add_parser("heap", help="the driver's memory over many small micro-batches of several tables")
    hp.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    hp.add_argument("--tables", type=int, default=4)
    hp.add_argument("--changes", type=int, default=6_000, help="changes in the stream, over all tables")
    hp.add_argument("--per-batch", type=int, default=60, help="Kafka messages per micro-batch")
    hp.add_argument("--every", type=int, default=20, help="batches between two samples")
    hp.add_argument("--partitions", type=int, default=3)
    hp.add_argument("--summary-json", default=None, help=argparse.SUPPRESS)
    hp.set_defaults(func=_cmd_heap)
    a = sub.add_parser("all", help="decode, e2e (both engines), cores, latency, tables")
    a.add_argument("--events", type=int, default=1_000_000)
    a.add_argument("--cores-events", type=int, default=200_000)
    a.add_argument("--seconds", type=float, default=60.0)
    a.set_defaults(func=None)
    args = parser.parse_args(argv)
    if args.what == "all":
        rcs = [
            _cmd_decode(argparse.Namespace(events=20000, repeat=5, protocols=list(PROTOCOL_OPTIONS), records=False)),
            _cmd_e2e(argparse.Namespace(events=args.events, partitions=4, max_offsets=250_000, engines=list(ENGINES),
                                        master=None, no_source=False, no_baseline=False, summary_json=None,
                                        runs=2, cpus=None)),
            _cmd_cores(argparse.Namespace(events=args.cores_events, partitions=4, max_offsets=250_000,
                                          masters=["local[1]", "local[2]"], engines=["spark"], runs=2,
                                          no_pin=False)),
            _cmd_latency(argparse.Namespace(engines=list(ENGINES), seconds=args.seconds, rate=2000, batches=10,
                                            partitions=4, master=None, warm_batches=100)),
            _cmd_tables(argparse.Namespace(schedulers=["FIFO", "FAIR"], tables=8, changes=20, busy=20_000, rounds=4,
                                           threads=[1, 2, 4], partitions=4, summary_json=None)),
        ]
        return max(rcs)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
