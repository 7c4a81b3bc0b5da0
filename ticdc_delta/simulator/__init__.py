"""A TiCDC stream simulator with an oracle: test data for the consumer, no TiDB needed.

It plays a TiDB cluster (:mod:`.workload`: tables of many column types, transactions, DDL) and a TiCDC
changefeed writing to Kafka (:mod:`.stream`: partitions, resolved ts, duplicates, a restart with
replay, encoded by the real codecs), and says what a correct consumer must end with (:mod:`.oracle`).
Everything follows from the seed: the same arguments give the same bytes.

Python API::

    from ticdc_delta.simulator import simulate, iter_messages
    from ticdc_delta.simulator.output import MemorySink

    result = simulate("open-protocol", {}, seed=1, events=10_000, tables=3, partitions=4, sink=MemorySink())
    result.oracle.tables["s1.t1"].rows          # expected final rows
    result.summary["duplicate_messages"]

    for partition, key, value in iter_messages("craft", {}, seed=1, events=1000, tables=2, partitions=2):
        ...

CLI: ``python -m ticdc_delta simulate --help`` (:mod:`.cli`).
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, NamedTuple

from .oracle import Oracle, build_oracle, load_oracle
from .output import FileSink, KafkaSink, MemorySink, MessageSink, read_messages
from .stream import OutMessage, TiCDCStream, partition_for, protocol_rules
from .workload import Workload

__all__ = [
    "Simulation",
    "SimulationResult",
    "simulate",
    "iter_messages",
    "Oracle",
    "load_oracle",
    "OutMessage",
    "MessageSink",
    "FileSink",
    "KafkaSink",
    "MemorySink",
    "read_messages",
    "partition_for",
]


class SimulationResult(NamedTuple):
    """What :func:`simulate` returns: the counts (also in ``oracle.counts``) and the oracle."""

    summary: dict[str, Any]
    oracle: Oracle


class Simulation:
    """One simulated changefeed: iterate :meth:`messages` once, then ask for :meth:`oracle`.

    Args:
        protocol: ``open-protocol``, ``craft``, ``canal-json`` or ``avro``.
        options: TiCDC sink-uri options (``max-batch-size``, ``enable-tidb-extension``, ...).
        seed: everything follows from it.
        events: upstream row changes to generate (inserts + updates + deletes, split PK updates count 2).
        tables: number of tables (over up to three schemas).
        partitions: Kafka partitions.
        duplicate_rate: probability that a message is sent twice.
        replay: simulate a TiCDC restart that re-sends everything since the checkpoint.
        schemas: Avro only: an :class:`~ticdc_delta.codec.avro.AvroSchemas` to register schemas in
            (default: a fresh local one, see :attr:`schemas`).
        topic: the Kafka topic (recorded in the oracle; Avro's subjects are ``<topic>-key/-value``).
        max_rows_per_table: cap on live rows per table (bounds memory; updates and deletes dominate
            once a table is full).
        resolved_interval: commits between resolved ts on the fastest partition.
        add_columns: some tables get ``ALTER TABLE ... ADD COLUMN`` at 30 % and 70 % of the stream; without
            it the only DDL are the ``CREATE`` statements at its start.

    Raises:
        ValueError: a bad argument or option.
    """

    def __init__(
        self,
        protocol: str,
        options: Mapping[str, str] | None = None,
        *,
        seed: int = 0,
        events: int = 1000,
        tables: int = 3,
        partitions: int = 3,
        duplicate_rate: float = 0.01,
        replay: bool = True,
        schemas: Any = None,
        topic: str | None = None,
        max_rows_per_table: int = 2000,
        resolved_interval: int = 6,
        add_columns: bool = True,
    ) -> None:
        self.protocol = protocol
        self.options = {str(k): str(v) for k, v in (options or {}).items()}
        self.seed = seed
        self.topic = topic
        rules = protocol_rules(protocol, self.options)  # validates protocol and the extension flag
        self._enum_as_label = rules.enum_as_label
        encoder_options = dict(self.options)
        if protocol == "avro":
            from ..codec.avro import AvroSchemas

            if schemas is None:
                schemas = AvroSchemas()
            if topic and "topic" not in encoder_options:
                encoder_options["topic"] = topic  # TopicNameStrategy subjects
        self.schemas = schemas
        self.workload = Workload(seed, events, tables, max_rows_per_table=max_rows_per_table, add_columns=add_columns)
        self.stream = TiCDCStream(
            self.workload, protocol, encoder_options, partitions, seed=seed, duplicate_rate=duplicate_rate,
            replay=replay, schemas=schemas, resolved_interval=resolved_interval,
        )
        self._done = False
        self._started = False

    def messages(self) -> Iterator[OutMessage]:
        """Every message of the stream in production order, with its duplicate/replay marks.

        Raises:
            RuntimeError: called a second time.
            EncodeError: an encoder refused an event (a codec bug: the workload only makes valid rows).
        """
        if self._started:
            raise RuntimeError("a Simulation can be iterated once")
        self._started = True
        yield from self.stream.messages()
        self._done = True

    def summary(self) -> dict[str, Any]:
        """Counts of what was committed upstream and what was sent."""
        w = self.workload.counts
        out: dict[str, Any] = {
            "row_events": {"insert": w.insert, "update": w.update, "delete": w.delete, "total": w.row_events},
            "pk_change_splits": w.pk_change_splits,
            "transactions": w.transactions,
            "ddl_events": w.ddl,
            "last_commit_ts": w.last_commit_ts,
        }
        out.update(self.stream.counts.as_dict())
        if self.protocol == "avro" and self.schemas is not None:
            out["avro_schema_ids"] = sorted(self.schemas.known_ids)
        return out

    def oracle(self) -> Oracle:
        """The expected final state (after :meth:`messages` has been exhausted).

        Raises:
            RuntimeError: the stream has not been fully iterated.
        """
        if not self._done:
            raise RuntimeError("iterate Simulation.messages() to the end before asking for the oracle")
        ddl = [
            {"commit_ts": d.commit_ts, "schema": d.schema, "table": d.table, "query": d.query,
             "ddl_type": d.ddl_type}
            for d in self.workload.ddl_log
        ]
        return build_oracle(self.workload, self.protocol, self.options, self.seed, self.stream.n_partitions,
                            enum_as_label=self._enum_as_label, ddl=ddl, counts=self.summary(), topic=self.topic)


def simulate(
    protocol: str,
    options: Mapping[str, str] | None = None,
    seed: int = 0,
    events: int = 1000,
    tables: int = 3,
    partitions: int = 3,
    sink: MessageSink | None = None,
    **kwargs: Any,
) -> SimulationResult:
    """Run a whole simulation into ``sink`` (closed at the end) and return the counts and the oracle.

    ``kwargs`` are :class:`Simulation`'s keyword arguments (``duplicate_rate``, ``replay``, ``schemas``,
    ``topic``, ...). With ``sink=None`` the messages are generated and dropped (counts only).

    Raises:
        ValueError: a bad argument or option.
        BrokerUnavailableError: (Kafka sink) a message was not acknowledged.
    """
    sim = Simulation(protocol, options, seed=seed, events=events, tables=tables, partitions=partitions, **kwargs)
    try:
        if sink is None:
            for _ in sim.messages():
                pass
        else:
            write = sink.write
            for m in sim.messages():
                write(m.partition, m.key, m.value)
    finally:
        if sink is not None:
            sink.close()
    oracle = sim.oracle()
    return SimulationResult(oracle.counts, oracle)


def iter_messages(
    protocol: str,
    options: Mapping[str, str] | None = None,
    seed: int = 0,
    events: int = 1000,
    tables: int = 3,
    partitions: int = 3,
    **kwargs: Any,
) -> Iterator[tuple[int, bytes | None, bytes | None]]:
    """``(partition, key, value)`` of every message, generated lazily (constant memory).

    Use :class:`Simulation` when you also want the oracle.

    Raises:
        ValueError: a bad argument or option.
    """
    sim = Simulation(protocol, options, seed=seed, events=events, tables=tables, partitions=partitions, **kwargs)
    for m in sim.messages():
        yield m.partition, m.key, m.value
