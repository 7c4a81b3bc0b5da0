"""The TiCDC side of the simulation: what a changefeed writes to Kafka for the upstream commits.

:class:`TiCDCStream` takes the commits of a :class:`~.workload.Workload` and produces Kafka messages
per partition, encoded by the protocol's encoder (:func:`ticdc_delta.codec.encoder_for`; for Avro an
:class:`~ticdc_delta.codec.avro.AvroEncoder` that knows every table's DECIMAL precision/scale and ENUM
members, :func:`avro_column_params`), with the stream semantics of TiCDC's MQ sink (seeds 003 and 004):

- **Dispatch.** A row goes to the partition chosen by a stable hash (CRC-32) of its schema, table and
  handle-key values, as TiCDC's index-value dispatcher does: the same key always lands on the same
  partition. The two halves of a split primary-key update go to the partitions of their own keys.
- **Order.** Within a partition, each table's rows are in commit-ts order, but rows of different tables
  interleave freely (TiCDC sorts per table, not per partition). A DDL is a barrier: every row committed
  before it is written first, every row after it later.
- **DDL** is broadcast to every partition ("DDL Event 将被广播到各个 MQ Partition"), except with
  Canal-JSON, where TiCDC sends it to partition 0 only; Avro carries no DDL.
- **Resolved ts** is sent to each partition periodically, at a different rate per partition (partition
  skew: a consumer must hold rows until the slowest partition has resolved them). The promise: after
  resolved R on a partition, no *new* event with commit ts <= R follows on that partition. Canal-JSON
  sends it only with ``enable-tidb-extension=true`` (``TIDB_WATERMARK``); Avro never does. A final
  resolved ts above the last commit closes the stream on every partition.
- **At-least-once artefacts.** Some messages are sent twice (``duplicate_rate``), like the seed's
  "Log 8 是 Log 7 的重复 Event". Where events carry a commit ts and resolved ts are sent, half of
  the second copies come late: after a resolved ts of the partition, once every partition has resolved
  past the copy, so a consumer sees an old version again after it applied newer ones (the protocol only
  promises that each version's *first* copy is in order; a consumer drops what is at or below the
  partition's resolved ts). Where the stream has no
  ts (Avro, Canal-JSON without the extension) the copy follows at once: nothing downstream could tell a
  late copy from a newer version. And once per stream TiCDC "restarts": the rows it had not yet
  written are lost, a new encoder is made, and every partition gets everything since the checkpoint —
  a resolved ts every partition had reached a while before — re-sent (with the resolved ts of the
  replay, which are lower than ones already seen), then the stream goes on. Replayed rows have a commit
  ts the consumer already saw resolved on that partition, or are exact duplicates of rows it holds.

Memory stays bounded however long the stream: a partition writes its pending rows out when it has
``max_pending`` of them, and only the commits since the low-water resolved ts (or since the checkpoint,
until the restart) are kept for the replay.
"""

from __future__ import annotations

import random
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, NamedTuple

from ..codec import PROTOCOLS, encoder_for
from ..codec.base import EventEncoder, parse_bool_option
from ..codec.model import ColumnFlag, Event, ResolvedEvent, RowChange, TypeCode
from .workload import Commit, Workload

__all__ = [
    "OutMessage",
    "StreamCounts",
    "TiCDCStream",
    "partition_for",
    "ProtocolRules",
    "protocol_rules",
    "avro_column_params",
]

_HANDLE = int(ColumnFlag.HANDLE_KEY)
_and = int.__and__
_ENUM = int(TypeCode.ENUM)


class OutMessage(NamedTuple):
    """One Kafka message of the simulated stream, with what the simulator knows about it."""

    partition: int
    key: bytes | None
    value: bytes | None
    kind: str
    """``"rows"``, ``"ddl"`` or ``"resolved"``."""
    duplicate: bool = False
    """A second copy of the message before it (at-least-once delivery)."""
    replayed: bool = False
    """Sent during the replay after the simulated TiCDC restart."""


class ProtocolRules(NamedTuple):
    """What a protocol carries besides rows (TiCDC's MQ sink per protocol)."""

    sends_ddl: bool
    ddl_to_all_partitions: bool
    sends_resolved: bool
    enum_as_label: bool
    has_commit_ts: bool
    """Row events carry their commit ts (a consumer can order by it)."""


def protocol_rules(protocol: str, options: Mapping[str, str] | None) -> ProtocolRules:
    """The stream rules of ``protocol`` with sink-uri ``options``.

    Raises:
        ValueError: unknown protocol or a bad ``enable-tidb-extension`` value.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; expected one of {', '.join(PROTOCOLS)}")
    extension = parse_bool_option(dict(options or {}), "enable-tidb-extension", False)
    if protocol == "canal-json":
        # TiCDC Canal-JSON: DDL to partition 0 only; WATERMARK and commitTs only with the extension
        return ProtocolRules(True, False, extension, False, extension)
    if protocol == "avro":
        # TiCDC Avro: no DDL, no resolved ts; ENUM/SET as labels; _tidb_commit_ts with the extension
        return ProtocolRules(False, False, False, True, extension)
    return ProtocolRules(True, True, True, False, True)


def partition_for(row: RowChange, partitions: int) -> int:
    """The partition of a row: CRC-32 of schema, table and handle-key values, modulo ``partitions``.

    Deterministic across processes (unlike ``hash()``), so the same key always maps to the same
    partition — TiCDC's index-value dispatcher hashes the same things.
    """
    image = row.columns if row.columns is not None else row.old
    parts = [row.schema, row.table]
    for c in image or ():
        if _and(c.flags, _HANDLE):  # int's own &: IntFlag's __and__ is a slow Python method
            v = c.value
            parts.append(v.hex() if isinstance(v, (bytes, bytearray)) else str(v))
    return zlib.crc32("\x00".join(parts).encode("utf-8", "surrogatepass")) % partitions


def avro_column_params(workload: Workload) -> dict[tuple[str, str, str], dict[str, Any]]:
    """``{(schema, table, column): {"precision", "scale", "members"}}`` of every DECIMAL, ENUM and SET
    column the workload's tables will ever have (columns added later included).

    What TiCDC's Avro encoder takes from the table's column info (tiflow ``columnToAvroSchema``: a
    DECIMAL's declared flen/decimal, an ENUM's elems), for :class:`~ticdc_delta.codec.avro.AvroEncoder`'s
    ``column_params``.
    """
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    # the workload plans its ADD COLUMNs up front (Workload._planned) so that they are known here
    for table, planned in zip(workload.tables, workload._planned):
        for spec in [*table.columns, *(s for _, s in planned)]:
            if spec.precision is None and spec.scale is None and spec.enum_members is None:
                continue
            members = list(spec.enum_members) if spec.enum_members is not None else None
            out[(table.schema, table.table, spec.name)] = {
                "precision": spec.precision, "scale": spec.scale, "members": members,
            }
    return out


@dataclass
class StreamCounts:
    """What the stream sent (every message counted once, duplicates and replays included)."""

    messages: int = 0
    row_messages: int = 0
    ddl_messages: int = 0
    resolved_messages: int = 0
    duplicate_messages: int = 0
    late_duplicate_messages: int = 0
    replayed_messages: int = 0
    row_events_encoded: int = 0
    replayed_row_events: int = 0
    lost_at_restart: int = 0
    checkpoint_ts: int | None = None
    restart_after_row_events: int | None = None
    final_resolved_ts: int | None = None
    messages_per_partition: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__, messages_per_partition=list(self.messages_per_partition))


class _Partition:
    """One Kafka partition's side of the changefeed: rows waiting to be written, resolved schedule."""

    __slots__ = ("index", "pending", "count", "period", "until_resolved", "flush_at", "resolved", "late")

    def __init__(self, index: int, period: int) -> None:
        self.index = index
        self.pending: dict[tuple[str, str], deque[RowChange]] = {}
        self.count = 0
        self.period = period
        self.until_resolved = period
        self.flush_at = 0
        self.resolved = 0  # the last resolved ts of this partition (sent or, for Avro, internal)
        self.late: list[tuple[int, OutMessage]] = []  # (release once all partitions resolved this, copy)


class TiCDCStream:
    """The Kafka messages a TiCDC changefeed writes for ``workload``'s commits.

    Iterate :meth:`messages` once; :attr:`counts` then says what was sent.

    Args:
        workload: the upstream (iterated by this stream).
        protocol: ``open-protocol``, ``craft``, ``canal-json`` or ``avro``.
        options: TiCDC sink-uri options for the encoder (``max-batch-size``, ``enable-tidb-extension``, ...).
        partitions: number of Kafka partitions.
        seed: seed of the stream's own choices (interleaving, resolved rates, duplicates).
        duplicate_rate: probability that a message is sent twice.
        replay: simulate one TiCDC restart with a replay from the checkpoint.
        schemas: Avro only: the :class:`~ticdc_delta.codec.avro.AvroSchemas` to register schemas in.
        resolved_interval: commits between two resolved ts on the fastest partition; the slowest
            partition gets them four times less often.
        max_pending: a partition writes its rows out when this many are waiting.

    Raises:
        ValueError: a bad argument or option.
    """

    def __init__(
        self,
        workload: Workload,
        protocol: str,
        options: Mapping[str, str] | None,
        partitions: int,
        *,
        seed: int,
        duplicate_rate: float = 0.01,
        replay: bool = True,
        schemas: Any = None,
        resolved_interval: int = 6,
        max_pending: int = 64,
    ) -> None:
        if partitions < 1:
            raise ValueError(f"partitions must be at least 1, got {partitions}")
        if not 0.0 <= duplicate_rate < 1.0:
            raise ValueError(f"duplicate_rate must be in [0, 1), got {duplicate_rate}")
        if resolved_interval < 1 or max_pending < 1:
            raise ValueError("resolved_interval and max_pending must be at least 1")
        self.workload = workload
        self.protocol = protocol
        self.options = dict(options or {})
        self.rules = protocol_rules(protocol, self.options)
        self.n_partitions = partitions
        self.duplicate_rate = duplicate_rate
        self.replay = replay
        self.schemas = schemas
        self.max_pending = max_pending
        self._rng = random.Random(f"ticdc-delta-stream/{seed}")
        self._enums = workload.enum_members()
        self._enum_tables = {(s, t) for s, t, _ in self._enums}
        self._avro_params = avro_column_params(workload) if protocol == "avro" else {}
        self._encoder = self._new_encoder()
        self._parts: list[_Partition] = []
        spread = max(1, partitions - 1)
        for p in range(partitions):
            # partition skew: resolved ts every `period` commits, from 1x (first) to 4x (last) the interval
            part = _Partition(p, resolved_interval * (spread + 3 * p) // spread)
            part.flush_at = self._rng.randint(max(1, max_pending // 4), max_pending)
            self._parts.append(part)
        self._replaying = False
        self._current_ts = 0
        self.counts = StreamCounts(messages_per_partition=[0] * partitions)
        total = workload.target_events
        self._restart_at = (total * 6) // 10
        self._freeze_at = max(0, self._restart_at - max(1, min(total // 5, 20_000)))

    # ----------------------------------------------------------------------------------------------

    def _new_encoder(self) -> EventEncoder:
        if self.protocol == "avro":
            from ..codec.avro import AvroEncoder

            # the DDL's DECIMAL(p,s) and ENUM members go into the schemas, as TiCDC writes them
            return AvroEncoder(self.options, schemas=self.schemas, column_params=self._avro_params)
        return encoder_for(self.protocol, self.options)

    def _render(self, row: RowChange) -> RowChange:
        """The row as the protocol carries it: Avro sends ENUM labels, the others the 1-based index."""
        if not self.rules.enum_as_label or (row.schema, row.table) not in self._enum_tables:
            return row
        return row._replace(columns=self._labels(row, row.columns), old=self._labels(row, row.old))

    def _labels(self, row: RowChange, image: Any) -> Any:
        if image is None:
            return None
        out = []
        for c in image:
            if c.type == _ENUM and isinstance(c.value, int):
                members = self._enums[(row.schema, row.table, c.name)]
                c = c._replace(value=members[c.value - 1])
            out.append(c)
        return tuple(out)

    def _send(self, partition: int, events: list[Event], kind: str) -> list[OutMessage]:
        if kind == "rows":
            events = [self._render(e) for e in events]  # type: ignore[arg-type]
            self.counts.row_events_encoded += len(events)
            if self._replaying:
                self.counts.replayed_row_events += len(events)
        out = []
        rng = self._rng
        late_ok = self.rules.has_commit_ts and self.rules.sends_resolved
        for key, value in self._encoder.encode(events):
            out.append(OutMessage(partition, key, value, kind, False, self._replaying))
            if self.duplicate_rate and rng.random() < self.duplicate_rate:
                copy = OutMessage(partition, key, value, kind, True, self._replaying)
                if late_ok and rng.random() < 0.5:
                    self._parts[partition].late.append((self._current_ts, copy))
                    self.counts.late_duplicate_messages += 1
                else:
                    out.append(copy)
        return out

    def _flush(self, part: _Partition) -> list[OutMessage]:
        """Write out a partition's pending rows, tables interleaved, each table in commit-ts order."""
        if not part.count:
            return []
        rng = self._rng
        queues = [q for q in part.pending.values() if q]
        events: list[Event] = []
        while queues:
            i = rng.randrange(len(queues))
            q = queues[i]
            for _ in range(min(len(q), rng.randint(1, 4))):
                events.append(q.popleft())
            if not q:
                queues[i] = queues[-1]
                queues.pop()
        part.pending.clear()
        part.count = 0
        part.flush_at = rng.randint(max(1, self.max_pending // 4), self.max_pending)
        return self._send(part.index, events, "rows")

    def _resolve(self, part: _Partition, ts: int) -> list[OutMessage]:
        out = self._flush(part)  # the promise: everything <= ts on this partition is written first
        part.resolved = ts
        if self.rules.sends_resolved:
            out += self._send(part.index, [ResolvedEvent(ts)], "resolved")
            if part.late:
                low = min(p.resolved for p in self._parts)
                out += [m for ts, m in part.late if ts <= low]
                part.late = [(ts, m) for ts, m in part.late if ts > low]
        return out

    def _dispatch(self, commit: Commit) -> list[OutMessage]:
        self._current_ts = commit.commit_ts
        out: list[OutMessage] = []
        parts = self._parts
        if commit.ddl is not None:
            # DDL barrier: TiCDC writes every row committed before the DDL first
            for part in parts:
                out += self._flush(part)
            if self.rules.sends_ddl:
                targets = parts if self.rules.ddl_to_all_partitions else parts[:1]
                for part in targets:
                    out += self._send(part.index, [commit.ddl], "ddl")
        else:
            n = self.n_partitions
            for row in commit.rows:
                part = parts[partition_for(row, n)]
                key = (row.schema, row.table)
                q = part.pending.get(key)
                if q is None:
                    q = part.pending[key] = deque()
                q.append(row)
                part.count += 1
        rng = self._rng
        for part in parts:
            part.until_resolved -= 1
            if part.until_resolved <= 0:
                out += self._resolve(part, commit.commit_ts)
                part.until_resolved = rng.randint(max(1, part.period // 2), part.period + part.period // 2)
            elif part.count >= part.flush_at:
                out += self._flush(part)
        return out

    def _count(self, messages: Iterable[OutMessage]) -> Iterator[OutMessage]:
        c = self.counts
        for m in messages:
            c.messages += 1
            c.messages_per_partition[m.partition] += 1
            if m.kind == "rows":
                c.row_messages += 1
            elif m.kind == "ddl":
                c.ddl_messages += 1
            else:
                c.resolved_messages += 1
            if m.duplicate:
                c.duplicate_messages += 1
            if m.replayed:
                c.replayed_messages += 1
            yield m

    def _restart(self, log: deque[Commit]) -> Iterator[OutMessage]:
        """TiCDC restarts: unwritten rows are lost, everything since the checkpoint is sent again."""
        for part in self._parts:
            self.counts.lost_at_restart += part.count
            part.pending.clear()
            part.count = 0
        self._encoder = self._new_encoder()
        self.counts.restart_after_row_events = self.workload.counts.row_events
        self._replaying = True
        for commit in log:
            yield from self._dispatch(commit)
        for part in self._parts:
            yield from self._flush(part)
        self._replaying = False

    def messages(self) -> Iterator[OutMessage]:
        """The messages of the whole stream, in the order TiCDC writes them (all partitions mixed)."""
        log: deque[Commit] | None = deque() if self.replay else None
        frozen = False
        restarted = False
        parts = self._parts
        for commit in self.workload.commits():
            if log is not None:
                log.append(commit)
            yield from self._count(self._dispatch(commit))
            if log is None:
                continue
            done = self.workload.counts.row_events
            if not frozen:
                # keep only what the replay could need: commits above the lowest resolved ts
                low = min(p.resolved for p in parts)
                while log and log[0].commit_ts <= low:
                    log.popleft()
                if done >= self._freeze_at:
                    frozen = True
                    self.counts.checkpoint_ts = low
            if frozen and not restarted and done >= self._restart_at:
                restarted = True
                yield from self._count(self._restart(log))
                log = None
        for part in parts:
            yield from self._count(self._flush(part))
        final = self.workload.clock.next()
        self.counts.final_resolved_ts = final
        for part in parts:
            yield from self._count(self._resolve(part, final))
