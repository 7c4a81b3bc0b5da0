"""Command line: ``python -m ticdc_delta {decode,simulate,run,status,reset,snapshot,demo}``.

Exit codes follow the error kinds (:mod:`ticdc_delta.errors`): 0 success, 1 terminal failure (bad
input, bad configuration, a DDL refused by policy — retrying will not help), 2 usage error,
75 (``EX_TEMPFAIL``) retryable failure (broker unreachable, commit conflict) — let Airflow retry; ``run``
stopped by SIGTERM or SIGINT: 128 + the signal (143, 130), after the micro-batch in flight.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from types import ModuleType
from typing import Sequence
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .errors import TicdcDeltaError, one_line

log = logging.getLogger(__name__)

__all__ = ["main", "entry", "EXIT_OK", "EXIT_TERMINAL", "EXIT_USAGE", "EXIT_RETRYABLE", "exit_code_for"]

EXIT_OK = 0
EXIT_TERMINAL = 1
EXIT_USAGE = 2
EXIT_RETRYABLE = 75


def exit_code_for(exc: BaseException) -> int:
    """The process exit code for an error: retryable ones get 75, a requested stop ``128 + signal``, everything
    else 1."""
    code = getattr(exc, "exit_code", None)
    if isinstance(code, int):
        return code
    return EXIT_RETRYABLE if getattr(exc, "retryable", False) else EXIT_TERMINAL


def _pairs(items: Sequence[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise argparse.ArgumentTypeError(f"{what} must look like NAME=VALUE, got {item!r}")
        out[name.strip()] = value
    return out


def _cmd_decode(args: argparse.Namespace) -> int:
    from .codec import DecodeContext, decoder_for
    from .codec.json_output import event_to_json_line

    options = _pairs(args.option, "--option")
    schemas = None
    if args.protocol == "avro":
        from .codec.avro import AvroSchemas

        files = _pairs(args.avro_schema, "--avro-schema")
        try:
            ids = {int(k): v for k, v in files.items()}
        except ValueError:
            raise argparse.ArgumentTypeError("--avro-schema ids must be integers (ID=FILE)") from None
        schemas = AvroSchemas.from_files(ids)
    elif args.avro_schema:
        raise argparse.ArgumentTypeError("--avro-schema only applies to --protocol avro")
    decoder = decoder_for(args.protocol, options, schemas=schemas)
    value = Path(args.value_file).read_bytes()
    key = Path(args.key_file).read_bytes() if args.key_file else None
    events = decoder.decode(key, value, DecodeContext(args.topic, args.partition, args.offset))
    out = sys.stdout
    for event in events:
        out.write(event_to_json_line(event))
        out.write("\n")
    out.flush()
    return EXIT_OK


def _setup_logging(level: str) -> None:
    """Progress lines (one JSON object per micro-batch) go to stdout as they are, whatever ``level``; the
    rest to stderr, from ``level`` on."""
    import logging

    root = logging.getLogger()
    root.setLevel(level)
    logging.getLogger("ticdc_delta.progress").setLevel(logging.INFO)  # a quiet log_level keeps them
    if not any(getattr(h, "_ticdc_delta", False) for h in root.handlers):
        err = logging.StreamHandler(sys.stderr)
        err.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        err.addFilter(lambda r: r.name != "ticdc_delta.progress")
        err._ticdc_delta = True  # type: ignore[attr-defined]
        root.addHandler(err)
        out = logging.StreamHandler(sys.stdout)
        out.setFormatter(logging.Formatter("%(message)s"))
        out.addFilter(lambda r: r.name == "ticdc_delta.progress")
        out._ticdc_delta = True  # type: ignore[attr-defined]
        root.addHandler(out)
    for noisy in ("py4j", "pyspark"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _cmd_run(args: argparse.Namespace) -> int:
    from .config import load_config

    cfg = load_config(args.config)
    _setup_logging(cfg.log_level)
    from .errors import StoppedBySignal
    from .spark.job import run_job
    from .spark.stop import StopRequest

    stop = StopRequest().install()  # SIGTERM / SIGINT: the batch in flight finishes, then the run stops
    try:
        batches = run_job(cfg, once=args.once, stop=stop)
    except StoppedBySignal as exc:
        print(f"ticdc-delta: changefeed {cfg.changefeed}: {exc}", file=sys.stderr)
        return exit_code_for(exc)
    finally:
        stop.uninstall()
    print(f"ticdc-delta: changefeed {cfg.changefeed}: {batches} micro-batch(es) committed", file=sys.stderr)
    return EXIT_OK


def _cmd_status(args: argparse.Namespace) -> int:
    from .config import load_config
    from .status import render_status

    cfg = load_config(args.config)
    sys.stdout.write(render_status(cfg, as_json=args.json))
    return EXIT_OK


def _offset_arg(items: Sequence[str]) -> dict[str, dict[int, int]]:
    out: dict[str, dict[int, int]] = {}
    for item in items:
        where, sep, offset = item.rpartition("=")
        topic, colon, partition = where.rpartition(":")
        if not sep or not colon or not topic or not partition.isdigit() or not offset.lstrip("-").isdigit() \
                or int(offset) < -2:
            raise argparse.ArgumentTypeError(
                f"--offset must look like TOPIC:PARTITION=OFFSET (OFFSET >= 0, -2 earliest, -1 latest), got {item!r}"
            )
        out.setdefault(topic, {})[int(partition)] = int(offset)
    return out


def _cmd_reset(args: argparse.Namespace) -> int:
    from .config import load_config
    from .reset import apply_reset, plan_reset

    if bool(args.start) == bool(args.offset):
        raise argparse.ArgumentTypeError("give exactly one of --from earliest|latest|state or --offset ...")
    cfg = load_config(args.config)
    _setup_logging(cfg.log_level)
    plan = plan_reset(cfg, args.start or _offset_arg(args.offset))
    print(plan.describe(), file=sys.stderr)
    if not args.yes:
        print("nothing changed: stop every job of this changefeed, then add --yes to reset", file=sys.stderr)
        return EXIT_USAGE
    apply_reset(cfg, plan)
    print(f"ticdc-delta: changefeed {cfg.changefeed} reset; the next run starts at batch 0", file=sys.stderr)
    return EXIT_OK


def _cmd_snapshot(args: argparse.Namespace) -> int:
    from .config import load_config
    from .snapshot.dumpling import CsvDialect

    try:
        dialect = CsvDialect(separator=args.csv_separator, delimiter=args.csv_delimiter,
                             null_value=args.csv_null_value, escape_backslash=not args.no_escape_backslash,
                             header=not args.no_header, binary_format=args.binary_format)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if args.kind == "dumpling" and (not args.source or args.dsn):
        raise argparse.ArgumentTypeError("--from dumpling takes the export's PATH (and no --dsn)")
    if args.kind == "tidb" and (args.source or not args.dsn):
        raise argparse.ArgumentTypeError("--from tidb takes --dsn jdbc:mysql://... and --table db.t|db.* (no PATH)")
    # the rest of the arguments too, before the Spark JVM starts
    if args.kind == "dumpling" and (args.table or args.tso is not None or args.partitions is not None):
        raise argparse.ArgumentTypeError("--table, --tso and --partitions are for --from tidb; a Dumpling export "
                                         "loads every table it holds, at its own TSO")
    if args.kind == "tidb":
        if not args.dsn.startswith("jdbc:mysql://"):
            raise argparse.ArgumentTypeError("--dsn must look like jdbc:mysql://host:port/?user=...&password=...")
        if not args.table:
            raise argparse.ArgumentTypeError("name the tables to read: --table db.table or --table 'db.*' (repeatable)")
        for pattern in args.table:
            db, sep, table = pattern.partition(".")
            if not sep or not db or not table:
                raise argparse.ArgumentTypeError(f"--table must look like db.table or db.*, got {pattern!r}")
        if args.partitions is not None and args.partitions < 1:
            raise argparse.ArgumentTypeError(f"--partitions must be >= 1, got {args.partitions}")
    try:
        ZoneInfo(args.timestamp_zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise argparse.ArgumentTypeError(f"--timestamp-zone: unknown time zone {args.timestamp_zone!r} "
                                         "(an IANA name such as UTC or Asia/Shanghai)") from None
    cfg = load_config(args.config)
    _setup_logging(cfg.log_level)
    from .snapshot.load import load_dumpling_snapshot, load_snapshot
    from .spark.job import spark_for

    spark = spark_for(cfg)
    if args.kind == "tidb":
        from .snapshot.jdbc import JdbcSource

        source = JdbcSource(spark, args.dsn, args.table, tso=args.tso,
                            partitions=4 if args.partitions is None else args.partitions)
        summary = load_snapshot(cfg, source, spark=spark, force=args.force)
    else:
        summary = load_dumpling_snapshot(cfg, args.source, spark=spark, force=args.force,
                                         dialect=dialect, timestamp_zone=args.timestamp_zone)
    print(f"ticdc-delta: changefeed {cfg.changefeed}: {summary.describe()}", file=sys.stderr)
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(protocol=args.protocol, events=args.events, workdir=args.workdir, seed=args.seed)


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ticdc_delta", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    dec = sub.add_parser("decode", help="decode one Kafka message and print its events as JSON lines")
    dec.add_argument("--protocol", required=True, choices=["open-protocol", "craft", "canal-json", "avro"])
    dec.add_argument("--value-file", required=True, help="file holding the message value")
    dec.add_argument("--key-file", help="file holding the message key")
    dec.add_argument("--option", action="append", metavar="NAME=VALUE",
                     help="TiCDC sink-uri option, e.g. enable-tidb-extension=true (repeatable)")
    dec.add_argument("--avro-schema", action="append", metavar="ID=FILE",
                     help="Avro schema id and its .avsc file (repeatable)")
    dec.add_argument("--topic", default=None, help=argparse.SUPPRESS)
    dec.add_argument("--partition", type=int, default=None, help=argparse.SUPPRESS)
    dec.add_argument("--offset", type=int, default=None, help=argparse.SUPPRESS)
    dec.set_defaults(func=_cmd_decode)

    run = sub.add_parser("run", help="run the streaming job (Kafka → Delta)")
    run.add_argument("--config", required=True, help="the job's YAML file")
    run.add_argument("--once", action="store_true",
                     help="process everything available at start, then exit 0 (the Airflow mode)")
    run.set_defaults(func=_cmd_run)

    st = sub.add_parser("status", help="per-table applied commit ts, lag and held rows")
    st.add_argument("--config", required=True, help="the job's YAML file")
    st.add_argument("--json", action="store_true", help="print JSON instead of a table")
    st.set_defaults(func=_cmd_status)

    rs = sub.add_parser("reset", help="start the changefeed over from chosen offsets (job state + Spark checkpoint)")
    rs.add_argument("--config", required=True, help="the job's YAML file")
    rs.add_argument("--from", dest="start", choices=["earliest", "latest", "state"],
                    help="earliest/latest offsets (state cleared), or state: right after the last batch the "
                         "job state committed (state kept; the recovery when Spark's checkpoint was lost)")
    rs.add_argument("--offset", action="append", metavar="TOPIC:PARTITION=OFFSET",
                    help="explicit starting offset, repeatable; name every partition (-2 earliest, -1 latest)")
    rs.add_argument("--yes", action="store_true", help="do it (without: print what would be done, change nothing)")
    rs.set_defaults(func=_cmd_reset)

    sn = sub.add_parser("snapshot", help="load a consistent TiDB snapshot (a Dumpling export) into the Delta tables")
    sn.add_argument("--config", required=True, help="the job's YAML file")
    sn.add_argument("--from", dest="kind", required=True, choices=["dumpling", "tidb"],
                    help="a Dumpling export (PATH), or TiDB itself read at a TSO over JDBC (--dsn)")
    sn.add_argument("source", metavar="PATH", nargs="?", help="the export directory (local path or object-store URI)")
    sn.add_argument("--dsn", help="--from tidb: jdbc:mysql://host:4000/?user=...&password=...")
    sn.add_argument("--table", action="append", metavar="DB.TABLE",
                    help="--from tidb: a table to read, or DB.* for every table of DB (repeatable)")
    sn.add_argument("--tso", type=int, help="--from tidb: the snapshot TSO (default: TiDB's current TSO)")
    sn.add_argument("--partitions", type=int, default=None,
                    help="--from tidb: parallel key ranges per table (tables with a one-column integer key; "
                         "default 4)")
    sn.add_argument("--force", action="store_true",
                    help="load even into tables the stream already advanced past, or over a newer snapshot")
    sn.add_argument("--csv-separator", default=",", help="Dumpling's --csv-separator (default ,)")
    sn.add_argument("--csv-delimiter", default='"', help="Dumpling's --csv-delimiter (default \")")
    sn.add_argument("--csv-null-value", default="\\N", help="Dumpling's --csv-null-value (default \\N)")
    sn.add_argument("--no-escape-backslash", action="store_true", help="the export ran with --escape-backslash=false")
    sn.add_argument("--no-header", action="store_true", help="the export ran with --no-header")
    sn.add_argument("--binary-format", default="utf8", choices=["utf8", "hex", "base64"],
                    help="binary columns in CSV: utf8 (--csv-output-dialect default), hex (snowflake, redshift), "
                         "base64 (bigquery)")
    sn.add_argument("--timestamp-zone", default="UTC",
                    help="zone of TIMESTAMP values in the export (UTC unless Dumpling ran with --skip-tz-utc)")
    sn.set_defaults(func=_cmd_snapshot)

    demo = sub.add_parser("demo", help="local broker + simulated TiCDC stream + job --once + oracle check")
    demo.add_argument("--protocol", default="canal-json", choices=["open-protocol", "craft", "canal-json", "avro"])
    demo.add_argument("--events", type=int, default=20000, help="upstream row changes to simulate")
    demo.add_argument("--seed", type=int, default=7)
    demo.add_argument("--workdir", default=None, help="where the lake, checkpoint and config go (default: a temp dir)")
    demo.set_defaults(func=_cmd_demo)

    simulator_cli: ModuleType | None
    try:
        from .simulator import cli as simulator_cli
    except ImportError:  # pragma: no cover - the simulator is part of the package
        simulator_cli = None
    if simulator_cli is not None:
        sim = sub.add_parser("simulate", help="generate a TiCDC stream and the expected final tables")
        simulator_cli.add_arguments(sim)
        sim.set_defaults(func=simulator_cli.run)
    return parser


def _stop_spark() -> None:
    """Stop the SparkSession a failed command left running, before the error line is printed: otherwise the
    JVM's listener bus may still post a progress event to the Python side as the process exits and log a
    stack trace after the one line the error is (an outage mid-run showed exactly that)."""
    if "pyspark.sql" not in sys.modules:
        return
    from pyspark.sql import SparkSession

    try:  # (asking for the session is a call into the JVM too, which may be gone: killed, out of memory)
        session = SparkSession.getActiveSession()
        if session is not None:
            session.stop()
    except Exception:  # noqa: BLE001 - the error being reported matters, not a failed stop
        log.debug("stopping the Spark session failed", exc_info=True)
    sys.stderr.flush()


def main(argv: Sequence[str] | None = None, *, process_exit: bool = False) -> int:
    """Run the CLI; returns the process exit code. ``process_exit``: the process ends right after this
    call (``python -m ticdc_delta``, the console script, spark-submit), so a failed command may stop the
    Spark session it leaves behind; callers in a longer-lived process keep their session."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except argparse.ArgumentTypeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except TicdcDeltaError as exc:
        if process_exit:
            _stop_spark()
        print(f"error: {exc}", file=sys.stderr)
        return exit_code_for(exc)
    except (OSError, ValueError) as exc:
        print(f"error: {one_line(exc) or type(exc).__name__}", file=sys.stderr)
        return EXIT_TERMINAL
    except Exception as exc:  # noqa: BLE001 - last resort: one error line, not a traceback
        # (KeyboardInterrupt and SystemExit are no Exception: they go on as they did)
        log.debug("%s failed", args.command, exc_info=True)
        if process_exit:
            _stop_spark()
        print(f"error: {type(exc).__name__}: {one_line(exc)}", file=sys.stderr)
        return EXIT_TERMINAL


def entry() -> int:
    """The console script and ``python -m ticdc_delta``: :func:`main` for a process that exits after it."""
    return main(process_exit=True)
