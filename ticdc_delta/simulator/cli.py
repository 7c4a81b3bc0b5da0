"""``python -m ticdc_delta simulate``: write a simulated TiCDC stream and its oracle.

Examples::

    python -m ticdc_delta simulate --protocol open-protocol --seed 7 --events 100000 --tables 4 \\
        --partitions 3 --out /tmp/sim --oracle /tmp/sim/oracle.json

    python -m ticdc_delta simulate --protocol canal-json --option enable-tidb-extension=true \\
        --topic tidb-cdc --bootstrap-servers 127.0.0.1:9092 --partitions 3 --oracle oracle.json

Avro schemas go to the Schema Registry given with ``--schema-registry`` (``mock://name`` is the
in-process mock), or else to ``<id>.avsc`` files (``--avro-schema-dir``, default ``avro-schemas/`` next
to the messages or the oracle), which ``decode --avro-schema ID=FILE`` and the pipeline can read.

Prints the counts as one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

from ..codec import PROTOCOLS
from ..errors import ConfigError

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``simulate`` options to ``parser``."""
    parser.add_argument("--protocol", required=True, choices=list(PROTOCOLS), help="wire protocol to write")
    parser.add_argument("--option", action="append", metavar="NAME=VALUE",
                        help="TiCDC sink-uri option, e.g. max-batch-size=16 or enable-tidb-extension=true "
                             "(repeatable)")
    parser.add_argument("--seed", type=int, default=0, help="everything follows from the seed (default 0)")
    parser.add_argument("--events", type=_positive, default=10_000,
                        help="upstream row changes to generate (default 10000)")
    parser.add_argument("--tables", type=_positive, default=3, help="number of tables (default 3)")
    parser.add_argument("--partitions", type=_positive, default=3, help="Kafka partitions (default 3)")
    parser.add_argument("--topic", help="Kafka topic to produce to (created if missing)")
    parser.add_argument("--bootstrap-servers", help="Kafka bootstrap servers, host:port[,...]")
    parser.add_argument("--out", metavar="DIR", help="write messages.jsonl (and the oracle) to DIR instead of Kafka")
    parser.add_argument("--oracle", metavar="FILE",
                        help="where to write the expected final tables (default DIR/oracle.json with --out)")
    parser.add_argument("--duplicate-rate", type=_rate, default=0.01,
                        help="probability that a message is sent twice (default 0.01)")
    parser.add_argument("--replay", action=argparse.BooleanOptionalAction, default=True,
                        help="simulate a TiCDC restart that re-sends everything since the checkpoint (default on)")
    parser.add_argument("--max-rows-per-table", type=_positive, default=2000,
                        help="cap on live rows per table (default 2000)")
    parser.add_argument("--schema-registry", metavar="URL", help="avro: register schemas here (mock://NAME: in-process)")
    parser.add_argument("--avro-schema-dir", metavar="DIR", help="avro without a registry: where to write <id>.avsc")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


def _options(items: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise argparse.ArgumentTypeError(f"--option must look like NAME=VALUE, got {item!r}")
        out[name.strip()] = value
    return out


def run(args: argparse.Namespace) -> int:
    """Run ``simulate`` with parsed ``args``; returns the exit code (0).

    Raises:
        argparse.ArgumentTypeError: inconsistent options (the CLI exits with 2).
        BrokerUnavailableError: Kafka unreachable or a message not acknowledged (exit 75).
        ConfigError: the topic exists with too few partitions.
        OSError: files cannot be written.
    """
    from . import simulate
    from .output import FileSink, KafkaSink

    options = _options(args.option)
    to_kafka = args.topic is not None or args.bootstrap_servers is not None
    if to_kafka and args.out is not None:
        raise argparse.ArgumentTypeError("give either --out DIR or --topic with --bootstrap-servers, not both")
    if to_kafka and (not args.topic or not args.bootstrap_servers):
        raise argparse.ArgumentTypeError("--topic and --bootstrap-servers go together")
    if not to_kafka and args.out is None:
        raise argparse.ArgumentTypeError("say where the messages go: --out DIR, or --topic and --bootstrap-servers")
    oracle_path = Path(args.oracle) if args.oracle else (Path(args.out) / "oracle.json" if args.out else None)
    if oracle_path is None:
        raise argparse.ArgumentTypeError("--oracle FILE is required when producing to Kafka")
    if args.protocol != "avro" and (args.schema_registry or args.avro_schema_dir):
        raise argparse.ArgumentTypeError("--schema-registry / --avro-schema-dir only apply to --protocol avro")

    schemas: Any = None
    schema_dir: Path | None = None
    if args.protocol == "avro":
        from ..codec.avro import AvroSchemas

        if args.schema_registry:
            try:
                from confluent_kafka.schema_registry import SchemaRegistryClient
            except ImportError as exc:  # the [schemaregistry] extras (certifi, httpx, ...) are missing
                raise ConfigError(
                    f"--schema-registry needs confluent-kafka's schema-registry extras: {exc}"
                ) from exc
            # new_client() gives the in-process mock for mock://; since confluent-kafka 2.x the
            # constructor builds an HTTP client for any URL
            schemas = AvroSchemas.from_registry(SchemaRegistryClient.new_client({"url": args.schema_registry}))
        else:
            schemas = AvroSchemas()
            base = Path(args.out) if args.out else oracle_path.parent
            schema_dir = Path(args.avro_schema_dir) if args.avro_schema_dir else base / "avro-schemas"

    sink: Any
    if to_kafka:
        sink = KafkaSink(args.bootstrap_servers, args.topic, args.partitions)
    else:
        sink = FileSink(args.out)
    summary, oracle = simulate(
        args.protocol, options, args.seed, args.events, args.tables, args.partitions, sink,
        duplicate_rate=args.duplicate_rate, replay=args.replay, schemas=schemas, topic=args.topic,
        max_rows_per_table=args.max_rows_per_table,
    )
    summary = dict(summary)  # the oracle keeps its own copy of the counts
    if schema_dir is not None:
        schema_dir.mkdir(parents=True, exist_ok=True)
        for sid in sorted(schemas.known_ids):
            (schema_dir / f"{sid}.avsc").write_text(schemas.get(sid), encoding="utf-8")
        summary["avro_schema_dir"] = str(schema_dir)
    oracle_path.parent.mkdir(parents=True, exist_ok=True)
    oracle.save(oracle_path)
    summary["oracle"] = str(oracle_path)
    if args.out:
        summary["messages_file"] = str(sink.path)
    sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    sys.stdout.flush()
    return 0
