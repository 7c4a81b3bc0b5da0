"""The streaming job: Kafka readStream → :class:`~ticdc_delta.spark.batch_handler.BatchHandler`.

The reader is Spark's Kafka source (:func:`~ticdc_delta.spark.kafka_source.read_kafka_stream`).
``run_job(cfg, once=True)`` processes everything available when it starts, then returns (the Airflow
mode: ``trigger(availableNow=True)``, in batches of at most ``max_offsets_per_trigger``). ``once=False``
runs until stopped, one micro-batch per ``trigger_interval``. After each committed batch the end offsets
are mirrored to the consumer group ``ticdc-delta-<changefeed>`` (a ``StreamingQueryListener`` sees
them once the batch is in the commit log). Failures come out typed (:func:`_unwrap`), so the CLI's exit
code follows them: 75 for a broker that went away, 1 for lost data or a missing filesystem jar.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ..config import JobConfig
from ..errors import TerminalError, one_line
from .batch_handler import BatchHandler, check_cleanup_policy
from .checkpoint import SparkCheckpoint, check_topics_kept
from .stop import POLL_S, StopRequest

__all__ = ["run_job", "build_handler", "spark_for", "drain_listener_bus", "json_progress_listener", "query_name"]

log = logging.getLogger(__name__)


def spark_for(cfg: JobConfig) -> Any:
    """The SparkSession for ``cfg``: the active one under spark-submit, else a local one."""
    from .session import get_or_create_spark, under_spark_submit

    # Under spark-submit the gateway is already up and --master decides; `run` defaults to local mode.
    master = cfg.spark.master or (None if under_spark_submit() else "local[2]")
    return get_or_create_spark(cfg.spark.app_name or f"ticdc-delta-{cfg.changefeed}", master, dict(cfg.spark.conf))


def query_name(changefeed: str) -> str:
    """The name of the changefeed's streaming query (``ticdc_delta_<changefeed>``, ``-`` and ``.`` as
    ``_``): what Spark's progress events and ``spark.streams.active`` call it."""
    return f"ticdc_delta_{changefeed}".replace("-", "_").replace(".", "_")


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
    """The typed error behind a Spark exception: the handler's own, else the source's or the JVM's
    (found in the text of the handler's error or of ``exc``), else ``exc`` itself.

    A storage failure on Spark's side (Hadoop's filesystems write the ``spark`` engine's tables, its staging
    and dead-letter tables, and the Spark checkpoint of either engine) that says the storage could not be
    reached or was overloaded — S3 throttling (503 SlowDown), a connection refused, a socket timeout, an
    HDFS NameNode away — is :class:`~ticdc_delta.errors.StorageUnavailableError` (exit 75), as the same
    failure through delta-rs is; it ended the job as terminal (exit 1).

    A table constraint refusing a row (a user's CHECK constraint, NOT NULL column or generated column: Delta
    Lake's ``DeltaInvariantViolationException``) is a :class:`~ticdc_delta.errors.SinkError` (exit 1), told
    before anything else: its text quotes the row's values, which may say anything ("503 Service
    Unavailable" made it a storage outage, retried for ever)."""
    from ..delta.sink import constraint_error, constraint_violated, storage_unreachable
    from ..errors import StorageUnavailableError, TicdcDeltaError
    from .checkpoint import concurrent_job_error
    from .kafka_source import unwrap_source_error

    if isinstance(handler.error, TicdcDeltaError):
        return handler.error
    for candidate in (handler.error, exc):
        if candidate is not None and constraint_violated(candidate):
            return constraint_error("a write to a Delta table failed", candidate)
    for candidate in (handler.error, exc):
        if candidate is None:
            continue
        typed = unwrap_source_error(candidate) or concurrent_job_error(candidate, handler.cfg.checkpoint)
        if typed is not None:
            return typed
    for candidate in (handler.error, exc):
        if candidate is not None and not isinstance(candidate, KeyboardInterrupt) and storage_unreachable(candidate):
            text = one_line(candidate)
            return StorageUnavailableError(
                f"the storage is unreachable or overloaded (retry later): {text[:400]}{'...' if len(text) > 400 else ''}")
    return handler.error if handler.error is not None else exc


def _check_checkpoint_filesystem(spark: Any, path: str) -> str:
    """Fail early, in one line, when Spark has no Hadoop filesystem for the checkpoint's scheme.

    Returns:
        The filesystem's scheme (``file`` for the local filesystem).

    Raises:
        ConfigError: the filesystem's jar is missing (``s3://``: it names hadoop-aws).
    """
    from .kafka_source import unwrap_source_error

    jvm = spark._jvm
    try:
        fs = jvm.org.apache.hadoop.fs.Path(path).getFileSystem(spark._jsc.hadoopConfiguration())
        return str(fs.getScheme())
    except Exception as exc:  # noqa: BLE001 - typed below when it is a missing filesystem
        typed = unwrap_source_error(exc)
        if typed is not None:
            raise typed from None
        raise


CHECKPOINT_MANAGER_CONF = "spark.sql.streaming.checkpointFileManagerClass"
"""The Spark setting that names the class writing a query's checkpoint files (offsets, commits)."""

LOCAL_CHECKPOINT_MANAGER = "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager"
"""The checkpoint file manager the job's query gets when its checkpoint is on the local filesystem.

Spark's default writes through Hadoop's ``FileContext``, whose local filesystem starts a process for
every file link lookup (``readlink``: ~4 per file it renames) and permission it sets (``chmod``) when
Hadoop's native library is absent, as it is from the jars Spark ships: ~13 processes and ~30 ms for each
of the offsets and commit files a micro-batch writes (measured here: 35 and 30 ms against 11 and 8 ms for
this manager, per micro-batch, in Spark's ``walCommit`` and ``commitOffsets`` durations). On the local
filesystem both write a temporary file and rename it, and both check that the target is absent just
before the rename (``FileContext`` gives an atomic no-overwrite rename on HDFS only), so nothing is lost
by it. Other filesystems keep Spark's choice."""


@contextmanager
def _checkpoint_files_written_for(spark: Any, scheme: str) -> Iterator[None]:
    """Within it, a query started on ``spark`` writes its checkpoint files with
    :data:`LOCAL_CHECKPOINT_MANAGER` when ``scheme`` is the local filesystem's and the session does not
    name a manager already (a user's choice wins). The query reads the setting when it starts; the session
    gets its own value back at the end."""
    if scheme != "file" or spark.conf.get(CHECKPOINT_MANAGER_CONF, None) is not None:
        yield
        return
    spark.conf.set(CHECKPOINT_MANAGER_CONF, LOCAL_CHECKPOINT_MANAGER)
    try:
        yield
    finally:
        spark.conf.unset(CHECKPOINT_MANAGER_CONF)


class _ProgressAsJson:
    """Py4J's side of Spark's ``PythonStreamingQueryListener``: gives each progress event to ``on_progress``
    as the dict of its JSON, one call into the JVM per event.

    pyspark's own listener converts every event into a ``StreamingQueryProgress`` first, field by field:
    ~70 calls into the JVM per event, most of them resolving class names the JVM then searches every jar
    for, and a Java exception at the end of each collection it walks. Measured on a local job of one-change
    micro-batches: 0.15–0.4 s per event on two cores the next micro-batch was using, ~0.1 s of it CPU
    (~0.02 s Python's, the rest the JVM's listener thread, whose CPU per batch fell to a third with this
    class). The mirror reads two fields of the progress."""

    def __init__(self, on_progress: Any) -> None:
        self._on_progress = on_progress

    def onQueryStarted(self, jevent: Any) -> None:  # noqa: N802 - the Java interface's names
        pass

    def onQueryProgress(self, jevent: Any) -> None:  # noqa: N802
        import json

        self._on_progress(json.loads(jevent.progress().json()))

    def onQueryIdle(self, jevent: Any) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, jevent: Any) -> None:  # noqa: N802
        pass

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


def json_progress_listener(on_progress: Callable[[dict[str, Any]], None]) -> Any:
    """A :class:`StreamingQueryListener` (for ``spark.streams.addListener``) that gives ``on_progress``
    each query's progress event as the dict of its JSON (:class:`_ProgressAsJson`) instead of through
    pyspark's conversion: ``spark.streams`` registers a listener by its ``_jlistener``, which is
    overridden here. Spark posts a progress event once the batch is in the commit log."""
    import json

    from pyspark import SparkContext
    from pyspark.sql.streaming import StreamingQueryListener

    class JsonProgressListener(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:  # (pyspark's path, which _jlistener replaces)
            on_progress(json.loads(event.progress.json))

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

        @property
        def _jlistener(self) -> Any:  # what spark.streams.addListener / removeListener hand to the JVM
            found = self.__dict__.get("_json_listener")
            if found is None:
                jvm = SparkContext._jvm  # noqa: SLF001 - no public API takes a listener of our own
                assert jvm is not None  # noqa: S101 - spark.streams exists: so does the gateway
                found = self.__dict__["_json_listener"] = jvm.PythonStreamingQueryListenerWrapper(
                    _ProgressAsJson(on_progress))
            return found

    return JsonProgressListener()


def _group_mirror_listener(mirror: Any, name: str) -> Any:
    """A :func:`json_progress_listener` that mirrors each finished batch of the query called ``name`` to
    the consumer group."""

    def on_progress(progress: dict[str, Any]) -> None:
        if progress.get("name") == name:
            commit_progress(mirror, progress)

    return json_progress_listener(on_progress)


LISTENER_DRAIN_S = 10.0
"""How long :func:`run_job` waits, after its query stopped, for Spark's listener bus to deliver the events
already posted (the last progress event to the group mirror) before it removes the listener."""


def drain_listener_bus(spark: Any, timeout_s: float = LISTENER_DRAIN_S) -> bool:
    """Wait until Spark's listener bus has delivered every event posted so far (to Python listeners too),
    at most ``timeout_s``; whether it did.

    The bus is asynchronous: removing a listener does not stop a delivery already under way, and a
    Python process that exits during one leaves the JVM to log its failed call into Python (the listener
    "threw an exception") at the end of a `run --once`."""
    try:
        bus = spark.sparkContext._jsc.sc().listenerBus()  # noqa: SLF001 - no public API drains the bus
        bus.waitUntilEmpty(int(timeout_s * 1000))
    except Exception:  # noqa: BLE001 - a timeout, or a JVM without the method: the job is done either way
        log.debug("Spark's listener bus did not drain within %.0f s", timeout_s, exc_info=True)
        return False
    return True


def final_progress(query: Any) -> dict[str, Any] | None:
    """The last progress of a (stopped) query as the dict of its JSON, ``None`` before its first batch.

    Not ``query.lastProgress`` itself: pyspark 4.0 builds it from the JSON but keeps a source's offsets as
    the text of a Python dict (``"{'topic': {'0': 15}}"``), which is not JSON; its ``json`` is."""
    import json

    last = query.lastProgress
    return None if last is None else json.loads(last.json)


def commit_progress(mirror: Any, progress: Mapping[str, Any]) -> None:
    """Mirror the end offsets of a query progress (the dict of its JSON, :class:`_ProgressAsJson`) to the
    consumer group."""
    import json

    ends: dict[tuple[str, int], int] = {}
    for source in progress.get("sources") or ():
        text = source.get("endOffset")
        try:
            offsets = json.loads(text) if isinstance(text, str) else text
        except ValueError:
            continue
        if not isinstance(offsets, dict):
            continue
        for topic, parts in offsets.items():
            if isinstance(parts, dict):
                for part, offset in parts.items():
                    if isinstance(offset, int) and offset >= 0:
                        ends[(str(topic), int(part))] = offset
    if ends:
        mirror.commit(ends)


def run_job(cfg: JobConfig, *, once: bool, spark: Any = None, handler: BatchHandler | None = None,
            stop: StopRequest | None = None) -> int:
    """Run the job; returns the number of micro-batches this run committed.

    ``stop``: a :class:`~ticdc_delta.spark.stop.StopRequest` the run watches (the CLI's routes SIGTERM and
    SIGINT to it): once requested, the micro-batch in flight finishes and the query stops.

    Raises:
        StoppedBySignal: ``stop`` was requested (also when the failure it caused ended the query first).
        TicdcDeltaError: typed failures (transient ones are worth a retry).
    """
    from .kafka_source import ConsumerGroupMirror, read_kafka_stream
    from .watchdog import BatchWatchdog, watched

    spark = spark or spark_for(cfg)
    if stop is not None and stop.installed:
        stop.install()  # again: pyspark's session set-up put its own SIGINT handler in
    scheme = _check_checkpoint_filesystem(spark, cfg.checkpoint.rstrip("/") + "/spark")
    if cfg.source.fail_on_data_loss:  # (otherwise Spark's source drops a topic no longer listed itself)
        check_topics_kept(SparkCheckpoint(cfg.checkpoint.rstrip("/") + "/spark", spark), cfg.topics)
    check_cleanup_policy(cfg)
    handler = handler or build_handler(cfg)
    df = read_kafka_stream(
        spark,
        bootstrap_servers=cfg.source.bootstrap_servers,
        topics=cfg.topics,
        starting_offsets=handler.starting_offsets(cfg.source.starting_offsets),  # a reset's choice wins
        max_offsets_per_trigger=cfg.source.max_offsets_per_trigger,
        client_conf=dict(cfg.source.kafka),
        fail_on_data_loss=cfg.source.fail_on_data_loss,
    )
    name = query_name(cfg.changefeed)
    timeout = cfg.batch_timeout_seconds
    watchdog = BatchWatchdog(timeout) if timeout is not None else None
    batch_fn: Any = handler if watchdog is None else watched(handler, watchdog)
    if stop is not None:
        batch_fn = stop.gate(batch_fn)
    writer = (
        df.writeStream.foreachBatch(batch_fn)
        .option("checkpointLocation", cfg.checkpoint.rstrip("/") + "/spark")
        .queryName(name)
    )
    writer = writer.trigger(availableNow=True) if once else writer.trigger(processingTime=cfg.trigger_interval)
    group = cfg.consumer_group_id
    mirror = ConsumerGroupMirror(cfg.source.bootstrap_servers, group, dict(cfg.source.kafka)) if group else None
    listener = _group_mirror_listener(mirror, name) if mirror is not None else None
    if listener is not None:
        spark.streams.addListener(listener)
    try:
        if stop is not None and stop.requested:  # (a signal while the session was starting)
            raise stop.exception(0)
        try:
            with _checkpoint_files_written_for(spark, scheme):
                query = writer.start()
        except BaseException as exc:  # noqa: BLE001 - rethrown typed
            err = _unwrap(exc, handler)
            if err is exc:
                raise
            raise err from None
        stopped = False
        try:
            stopped = _await(query, stop)
        except BaseException as exc:  # noqa: BLE001 - rethrown typed
            if stop is not None and stop.requested:
                # the gate refused a batch, or the signal reached Spark's JVM too (a process group's) and
                # it failed the batch in flight: the stop, not the failure, ended the run
                raise _stopped(stop, handler, exc) from None
            err = _unwrap(exc, handler)
            if err is exc:
                raise
            raise err from None
        finally:
            try:
                query.stop()
            except Exception:  # noqa: BLE001 - stopping a failed query may fail again; the cause is raised
                log.debug("stopping the query failed", exc_info=True)
            close = getattr(handler, "close", None)  # (a handler of the bench's baseline has none)
            if close is not None:
                close()
        last = final_progress(query) if mirror is not None else None
        if last is not None:
            # the listener bus is asynchronous: the last batch's progress may not have reached it yet
            commit_progress(mirror, last)
    finally:
        if watchdog is not None:
            watchdog.stop()
        if listener is not None:
            try:  # (the JVM may be gone: the error that ended the run is what matters)
                drain_listener_bus(spark)
                spark.streams.removeListener(listener)
            except Exception:  # noqa: BLE001
                log.debug("removing the consumer-group listener failed", exc_info=True)
        if mirror is not None:
            mirror.close()
    if stop is not None and stopped:
        raise _stopped(stop, handler)
    if handler.error is not None:
        raise handler.error
    return handler.batches


def _stopped(stop: StopRequest, handler: BatchHandler, failure: BaseException | None = None) -> BaseException:
    """What ends a run the requested ``stop`` ended: the batch in flight's terminal error (a human must see
    why), else :class:`~ticdc_delta.errors.StoppedBySignal`, with any other failure of the batch or of the
    query (``failure``) logged — the next start does that batch again."""
    if isinstance(handler.error, TerminalError):
        return handler.error
    cause = handler.error if handler.error is not None else failure
    if cause is not None and "StoppedBySignal" not in str(cause):  # (not the gate's own refusal)
        log.warning("the micro-batch in flight failed after the stop was requested (the next start does it "
                    "again): %s", one_line(cause))
    return stop.exception(handler.batches)


def _await(query: Any, stop: StopRequest | None) -> bool:
    """Wait for ``query`` to end; once ``stop`` is requested, let the batch in flight finish and stop the
    query. Whether the request stopped it (``False``: it ended by itself, e.g. ``--once`` done)."""
    if stop is None:
        query.awaitTermination()
        return False
    while not query.awaitTermination(POLL_S):
        if stop.requested:
            stop.close()  # waits for the batch in flight; none starts after it
            _wait_for_commit(query, stop.finished)
            query.stop()
            return True
    return False


COMMIT_WAIT_S = 60.0
"""How long a requested stop waits for Spark to record the micro-batch that finished in flight."""


def _wait_for_commit(query: Any, batch_id: int | None, timeout_s: float = COMMIT_WAIT_S) -> None:
    """Wait until Spark has recorded batch ``batch_id``: its progress (posted after the commit log entry), or
    a later batch's. The handler returning is not enough: a query stopped in between does that batch again
    at the next start."""
    if batch_id is None:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and query.isActive:
        last = query.lastProgress
        # (an idle trigger's progress carries the id of the batch to come, without an addBatch duration)
        if last is not None and (last.batchId > batch_id
                                 or (last.batchId == batch_id and "addBatch" in (last.durationMs or {}))):
            return
        time.sleep(0.05)
