"""The streaming job: Kafka readStream → :class:`~ticdc_delta.spark.batch_handler.BatchHandler`.

``run_job(cfg, once=True)`` processes everything available when it starts, then returns (the Airflow
mode: Python streaming sources ignore ``trigger(availableNow=True)``, so it is
``processAllAvailable()`` then ``stop()``). ``once=False`` runs until stopped, one micro-batch per
``trigger_interval``.
"""

from __future__ import annotations

import logging
from typing import Any

from ..config import JobConfig
from .batch_handler import BatchHandler

__all__ = ["run_job", "build_handler", "spark_for"]

log = logging.getLogger(__name__)


def spark_for(cfg: JobConfig) -> Any:
    """The SparkSession for ``cfg``: the active one under spark-submit, else a local one."""
    import os

    from .session import get_or_create_spark

    # Under spark-submit the gateway is already up and --master decides; `run` defaults to local mode.
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    master = cfg.spark.master or (None if under_submit else "local[2]")
    return get_or_create_spark(cfg.spark.app_name or f"ticdc-delta-{cfg.changefeed}", master, dict(cfg.spark.conf))


def build_handler(cfg: JobConfig) -> BatchHandler:
    """The foreachBatch handler for ``cfg`` (Avro schemas and the DDL replayer wired in)."""
    avro = None
    if cfg.source.protocol == "avro":
        from ..codec.avro import AvroSchemas

        if cfg.source.avro_schemas:
            avro = AvroSchemas.from_files({int(k): v for k, v in cfg.source.avro_schemas.items()})
        elif cfg.source.schema_registry is not None:
            from confluent_kafka.schema_registry import SchemaRegistryClient

            conf = cfg.source.schema_registry.client_conf()
            # new_client() returns confluent's in-process registry for mock:// URLs (tests, demos)
            make = getattr(SchemaRegistryClient, "new_client", SchemaRegistryClient)
            avro = AvroSchemas.from_registry(make(conf))
    ddl_handler = None
    try:
        from ..delta.ddl_replay import DDLReplayer

        ddl_handler = DDLReplayer(cfg.ddl, cfg.sink.source_timezone)
    except ImportError:  # pragma: no cover - the replayer ships with the package
        pass
    return BatchHandler(cfg, avro_schema_source=avro, ddl_handler=ddl_handler)


def _unwrap(exc: BaseException, handler: BatchHandler) -> BaseException:
    """The typed error behind a Spark exception: the handler's own, or the source's."""
    if handler.error is not None:
        return handler.error
    from .kafka_source import unwrap_source_error

    typed = unwrap_source_error(exc)
    return typed if typed is not None else exc


def run_job(cfg: JobConfig, *, once: bool, spark: Any = None, handler: BatchHandler | None = None) -> int:
    """Run the job; returns the number of micro-batches this run committed.

    Raises:
        TicdcDeltaError: typed failures (transient ones are worth a retry).
    """
    from .kafka_source import read_kafka_stream

    spark = spark or spark_for(cfg)
    handler = handler or build_handler(cfg)
    df = read_kafka_stream(
        spark,
        bootstrap_servers=cfg.source.bootstrap_servers,
        topics=cfg.topics,
        starting_offsets=cfg.source.starting_offsets,
        max_offsets_per_trigger=cfg.source.max_offsets_per_trigger,
        client_conf=dict(cfg.source.kafka),
        reader=cfg.source.reader,
        commit_group_id=cfg.consumer_group_id if cfg.source.reader == "python" else None,
    )
    writer = (
        df.writeStream.foreachBatch(handler)
        .option("checkpointLocation", cfg.checkpoint.rstrip("/") + "/spark")
        .queryName(f"ticdc_delta_{cfg.changefeed}".replace("-", "_").replace(".", "_"))
    )
    if not once:
        writer = writer.trigger(processingTime=cfg.trigger_interval)
    query = writer.start()
    try:
        if once:
            query.processAllAvailable()
        else:
            query.awaitTermination()
    except BaseException as exc:  # noqa: BLE001 - rethrown typed
        err = _unwrap(exc, handler)
        if err is exc:
            raise
        raise err from None
    finally:
        try:
            query.stop()
        except Exception:  # noqa: BLE001 - stopping a failed query may fail again; the cause is raised
            log.debug("stopping the query failed", exc_info=True)
    if handler.error is not None:
        raise handler.error
    return handler.batches
