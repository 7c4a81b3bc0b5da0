"""What the job reads from Spark's checkpoint (``{checkpoint}/spark``), and the rule that the job state
(``{checkpoint}/state``) belongs to it.

Spark's checkpoint and the job state are two stores that must move together: Spark's offset log says
which Kafka offsets batch ``N`` covers, the state holds the watermarks, held rows and type catalog after
batch ``N - 1``. If one is deleted, replaced or restored from a backup alone, continuing would lose data
silently (a fresh checkpoint's batch 0 would be skipped as "already committed"; a fresh state would drop
held rows and re-type columns). So the state records the Spark query id it belongs to (the ``id`` in
``{checkpoint}/spark/metadata``, fixed for the life of a checkpoint) and its batch id, and every batch
checks both with :func:`check_state_belongs`.

Files read (Spark's formats since 2.x):

- ``metadata``: ``{"id":"<uuid>"}``.
- ``offsets/<N>``: ``v1``, then ``{"batchWatermarkMs":…,"batchTimestampMs":…,"conf":{…}}``, then one line
  per source. ``batchTimestampMs`` is the time Spark planned batch ``N``; it is written before the batch
  runs and re-used when the batch is re-run after a crash, so it is a deterministic clock for the batch.
"""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Any

from ..errors import CheckpointMismatchError, ConcurrentJobError, ConfigError
from ..locations import local_path

__all__ = ["SparkCheckpoint", "check_state_belongs", "check_topics_kept", "concurrent_job_error", "RECOVERY_HINT",
           "STATE_RECOVERY_HINT"]

log = logging.getLogger(__name__)

RECOVERY_HINT = (
    "To start over consistently, stop every job of this changefeed and run "
    "`python -m ticdc_delta reset --config <your.yaml> --from earliest|latest --yes` (or "
    "`--offset TOPIC:PARTITION=OFFSET ...` for every partition; see README, 'Recovery'); to keep the old "
    "state, restore the matching {checkpoint}/spark instead"
)
STATE_RECOVERY_HINT = (
    "The job state is whole: stop every job of this changefeed and run "
    "`python -m ticdc_delta reset --config <your.yaml> --from state --yes` to continue right after the last "
    "batch it committed, keeping its held rows and watermarks (see README, 'Recovery'), or restore the "
    "matching {checkpoint}/spark"
)
"""What to do when only the Spark checkpoint was lost, replaced or restored from an older copy."""


ENGINE_MARK = "ticdc-engine"
"""The job's file in Spark's checkpoint directory: the engine that began a batch when it is not the engine of
the state's last batch (see ``BatchHandler._check_engine_switch``)."""


class SparkCheckpoint:
    """A streaming query's checkpoint directory: Spark's files, read; the job's own mark (:data:`ENGINE_MARK`),
    read and written.

    Args:
        location: the query's ``checkpointLocation`` (``{checkpoint}/spark``).
        spark: a SparkSession, used (through Hadoop's FileSystem, as Spark itself reads it) for
            non-local locations; local paths are read directly.
    """

    def __init__(self, location: str, spark: Any = None) -> None:
        self.location = location.rstrip("/")
        self._spark = spark
        self._offsets: dict[int, list[str] | None] = {}

    def _hadoop(self, path: str) -> tuple[Any, Any]:
        """Hadoop's FileSystem for ``path`` and its Path (through the session's py4j gateway: any scheme Spark can)."""
        hpath = self._spark._jvm.org.apache.hadoop.fs.Path(path)  # noqa: SLF001
        return hpath.getFileSystem(self._spark._jsc.hadoopConfiguration()), hpath  # noqa: SLF001

    def _read(self, leaf: str) -> str | None:
        path = f"{self.location}/{leaf}"
        local = local_path(path)
        if local is not None:
            try:
                with open(local, encoding="utf-8") as fh:
                    return fh.read()
            except FileNotFoundError:
                return None
        if self._spark is None:
            return None
        fs, hpath = self._hadoop(path)
        if not fs.exists(hpath):
            return None
        stream = fs.open(hpath)
        try:
            return str(self._spark._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))  # noqa: SLF001
        finally:
            stream.close()

    def query_id(self) -> str | None:
        """The checkpoint's query id, ``None`` when there is no ``metadata`` file."""
        text = self._read("metadata")
        if text is None:
            return None
        try:
            return str(json.loads(text.strip().splitlines()[0])["id"])
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise CheckpointMismatchError(
                f"Spark checkpoint {self.location}/metadata is not Spark's query metadata: {exc}"
            ) from None

    def write(self, leaf: str, text: str) -> None:
        """Write a small file of the job's own (``leaf``) into the checkpoint directory, replacing it."""
        path = f"{self.location}/{leaf}"
        local = local_path(path)
        if local is not None:
            os.makedirs(os.path.dirname(local), exist_ok=True)
            tmp = f"{local}.tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, local)
            return
        if self._spark is None:
            raise CheckpointMismatchError(f"cannot write {path} without a Spark session")
        fs, hpath = self._hadoop(path)
        stream = fs.create(hpath, True)
        try:
            stream.write(bytearray(text.encode("utf-8")))
        finally:
            stream.close()

    def engine_mark(self) -> dict[str, Any] | None:
        """What :meth:`mark_engine` wrote, ``None`` when nothing (or not that)."""
        text = self._read(ENGINE_MARK)
        try:
            mark = json.loads(text) if text else None
        except ValueError:
            return None
        return mark if isinstance(mark, dict) else None

    def mark_engine(self, engine: str, batch_id: int) -> None:
        """Record that ``engine`` begins batch ``batch_id`` (a run on another engine than the state's last
        batch, before its first commit): a re-run of that batch after a crash knows which engine began it."""
        self.write(ENGINE_MARK, json.dumps({"engine": engine, "batch": batch_id}))

    def latest_batch(self) -> int | None:
        """The id of the last batch in the offset log (Spark writes it before the batch runs), ``None`` when
        there is none."""
        path = f"{self.location}/offsets"
        local = local_path(path)
        if local is not None:
            try:
                names = os.listdir(local)
            except FileNotFoundError:
                return None
        elif self._spark is None:
            return None
        else:
            fs, hpath = self._hadoop(path)
            if not fs.exists(hpath):
                return None
            names = [str(status.getPath().getName()) for status in fs.listStatus(hpath)]
        ids = [int(name) for name in names if name.isdigit()]
        return max(ids) if ids else None

    def source_topics(self, batch_id: int) -> set[str] | None:
        """The topics batch ``batch_id``'s offset log entry reads, ``None`` when absent or not in that form."""
        offsets = self._source_offsets(batch_id)
        return None if offsets is None else {topic for topic, _ in offsets}

    def _offset_lines(self, batch_id: int) -> list[str] | None:
        """The lines of batch ``batch_id``'s offset log entry (read once per instance), ``None`` when absent."""
        if batch_id not in self._offsets:
            text = self._read(f"offsets/{batch_id}")
            self._offsets[batch_id] = None if text is None else text.splitlines()
        return self._offsets[batch_id]

    def batch_timestamp_ms(self, batch_id: int) -> int | None:
        """``batchTimestampMs`` of batch ``batch_id`` from the offset log, ``None`` when absent."""
        lines = self._offset_lines(batch_id)
        if lines is None:
            return None
        try:
            value = json.loads(lines[1])["batchTimestampMs"]
        except (ValueError, KeyError, IndexError, TypeError):
            log.warning("Spark offset log %s/offsets/%d has no batchTimestampMs", self.location, batch_id)
            return None
        return int(value) if isinstance(value, int) and value >= 0 else None

    def _source_offsets(self, batch_id: int) -> dict[tuple[str, int], int] | None:
        """The end offsets per (topic, partition) of batch ``batch_id`` in the offset log (its one Kafka
        source), ``None`` when absent or not in that form."""
        lines = self._offset_lines(batch_id) or []
        if len(lines) != 3:  # "v1", the batch metadata, one line per source (the job has one)
            return None
        try:
            topics = json.loads(lines[2])
            return {(str(t), int(p)): int(o) for t, parts in topics.items() for p, o in parts.items()}
        except (ValueError, AttributeError, TypeError):
            return None

    def batch_messages(self, batch_id: int) -> int | None:
        """How many Kafka messages batch ``batch_id`` reads: its end offsets less the batch before's, from the
        offset log (Spark writes a batch's entry before it runs). ``None`` when that is not known: the first
        batch, a partition the batch before did not have, no such entries."""
        if batch_id <= 0:
            return None
        end, start = self._source_offsets(batch_id), self._source_offsets(batch_id - 1)
        if end is None or start is None or not set(end) <= set(start):
            return None
        return sum(max(0, offset - start[tp]) for tp, offset in end.items())


def check_topics_kept(checkpoint: SparkCheckpoint, topics: list[str]) -> None:
    """Refuse to start a query whose checkpoint reads a topic ``source.topics`` no longer lists: Spark's
    Kafka source takes a topic gone from the list for partitions deleted from Kafka, and stops as if data
    were lost (``failOnDataLoss``), with nothing that says why. ``reset --from state`` starts Spark's
    checkpoint again from the state, right after the last batch committed, without that topic.

    Raises:
        ConfigError: the last batch in the offset log reads a topic not in ``topics``.
    """
    latest = checkpoint.latest_batch()
    read = checkpoint.source_topics(latest) if latest is not None else None
    dropped = sorted((read or set()) - set(topics))
    if dropped:
        raise ConfigError(
            f"source.topics no longer lists {', '.join(dropped)}, which the Spark checkpoint "
            f"{checkpoint.location} reads; Spark's Kafka source cannot drop a topic from a query (it stops as if "
            "the topic's data were lost). To go on without it, stop every job of this changefeed and run "
            "`python -m ticdc_delta reset --config <your.yaml> --from state --yes` (the job continues right after "
            "the last batch it committed, keeping its held rows and watermarks); or list the topic again"
        )


def check_state_belongs(
    *,
    checkpoint: str,
    state_query_id: str | None,
    state_batch_id: int | None,
    adopt: bool,
    query_id: str | None,
    batch_id: int,
) -> bool:
    """Check that a state saved after batch ``state_batch_id`` of query ``state_query_id`` may go on
    with batch ``batch_id`` of query ``query_id``. Returns ``True`` when batch ``batch_id`` is already
    in the state (a re-run after a crash that followed the state commit: nothing to do).

    ``state_batch_id`` is ``None`` when there is no state at all, ``adopt`` is true when the state does not
    name its query yet (written by :meth:`~ticdc_delta.delta.state_store.StateStore.reset`, or by a
    version before this check: the first batch records it).

    Raises:
        CheckpointMismatchError: the state and the checkpoint do not belong together; the message says
            what was found and how to recover.
    """
    where = f"job state {checkpoint}/state"
    spark = f"Spark checkpoint {checkpoint}/spark"
    if state_batch_id is None:
        if batch_id == 0:
            return False
        raise CheckpointMismatchError(
            f"{where} is missing or empty, but the {spark} is at batch {batch_id}: the state was deleted. "
            "Its held rows, watermarks and type catalog are gone, so going on would lose rows and re-type "
            f"columns. {RECOVERY_HINT}"
        )
    if not adopt and state_query_id != query_id:
        raise CheckpointMismatchError(
            f"{where} belongs to Spark query {state_query_id} (after batch {state_batch_id}) but the {spark} "
            f"is query {query_id} at batch {batch_id}: the Spark checkpoint was deleted or replaced, and its "
            f"new batches would be skipped as already committed. {STATE_RECOVERY_HINT}"
        )
    if state_batch_id < 0:  # reset: Spark must start over too
        if batch_id == 0:
            return False
        raise CheckpointMismatchError(
            f"{where} was reset, but the {spark} continues at batch {batch_id}: delete {checkpoint}/spark "
            f"(the reset command does) before running. {RECOVERY_HINT}"
        )
    if state_batch_id == batch_id:
        return True
    if state_batch_id == batch_id - 1:
        return False
    if state_batch_id > batch_id:
        raise CheckpointMismatchError(
            f"{where} is at batch {state_batch_id}, ahead of the {spark} (batch {batch_id}): the Spark "
            f"checkpoint was restored from an older copy. {STATE_RECOVERY_HINT}"
        )
    raise CheckpointMismatchError(
        f"{where} is at batch {state_batch_id}, but the {spark} is at batch {batch_id}: batches "
        f"{state_batch_id + 1}..{batch_id - 1} ran without this state (it was restored from an older copy). "
        f"{RECOVERY_HINT}"
    )


# What Spark says when two queries use one checkpoint: in one session at start (the query name, made from
# the changefeed, or the query id is already active; Spark 4: CONCURRENT_QUERY), across processes when both
# write the offset log
# (CONCURRENT_STREAM_LOG_UPDATE, or HDFSMetadataLog's "Multiple streaming queries are concurrently using").
_SPARK_CONCURRENT = re.compile(
    r"\[?CONCURRENT_STREAM_LOG_UPDATE[^\n]*|\[?CONCURRENT_QUERY[^\n]*|Multiple streaming (?:jobs|queries)[^\n]*"
    r"|[^\n]*another query with same id is already active[^\n]*"
    r"|[^\n]*as a query with that name is already active[^\n]*"
)


def concurrent_job_error(exc: BaseException, checkpoint: str) -> ConcurrentJobError | None:
    """The one-line terminal error for Spark's "two queries on one checkpoint" failures, else ``None``."""
    found = _SPARK_CONCURRENT.search(str(exc))
    if found is None:
        return None
    said = found.group(0).strip()
    if len(said) > 300:
        said = said[:300] + "…"
    return ConcurrentJobError(
        f"another job of this changefeed is running on checkpoint {checkpoint.rstrip('/')} (Spark: {said}). "
        "One checkpoint, one job: stop the other one, then run this one again"
    )
