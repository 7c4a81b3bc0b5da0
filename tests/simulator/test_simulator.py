"""The TiCDC stream simulator: determinism, wire validity, TiCDC's stream rules, and the oracle.

The most important test is :func:`test_reference_consumer_reproduces_the_oracle`: a small pure-Python
consumer that follows TiCDC's consumer rules (seed 003 "协议约束", tiflow ``cmd/kafka-consumer``) reads
the decoded stream — duplicates, a restart replay and partition skew included — and must end with
exactly the oracle's tables.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple

import pytest
import sqlglot

from ticdc_delta.codec import DecodeContext, decoder_for
from ticdc_delta.codec.avro import AvroSchemas
from ticdc_delta.codec.model import (
    ColumnFlag,
    DDLEvent,
    DDLType,
    Event,
    Op,
    ResolvedEvent,
    RowChange,
    TypeCode,
)
from ticdc_delta.errors import ConfigError
from ticdc_delta.simulator import (
    FileSink,
    KafkaSink,
    MemorySink,
    Oracle,
    OutMessage,
    Simulation,
    iter_messages,
    load_oracle,
    partition_for,
    read_messages,
    simulate,
)
from ticdc_delta.simulator.cli import add_arguments, run
from ticdc_delta.simulator.workload import Workload, compose_tso

# (protocol, options): every protocol, Canal-JSON and Avro with and without the TiDB extension, and
# Open Protocol with small batches.
CONFIGS: list[tuple[str, dict[str, str]]] = [
    ("open-protocol", {}),
    ("open-protocol", {"max-batch-size": "4"}),
    ("craft", {}),
    ("canal-json", {"enable-tidb-extension": "true"}),
    ("canal-json", {}),
    ("avro", {"enable-tidb-extension": "true"}),
    ("avro", {}),
]
IDS = [p + "".join(f"/{k}={v}" for k, v in o.items()) for p, o in CONFIGS]
TS_ORDERED = [(p, o) for p, o in CONFIGS if p in ("open-protocol", "craft") or o.get("enable-tidb-extension")
              == "true" and p == "canal-json"]
TS_IDS = [p + "".join(f"/{k}={v}" for k, v in o.items()) for p, o in TS_ORDERED]

PARTITIONS = 3
EVENTS = 1200


class Decoded(NamedTuple):
    message: OutMessage
    events: list[Event]


class Run(NamedTuple):
    sim: Simulation
    decoded: list[Decoded]
    oracle: Oracle


@functools.lru_cache(maxsize=None)
def _run(protocol: str, options: tuple[tuple[str, str], ...], seed: int = 11, events: int = EVENTS,
         duplicate_rate: float = 0.05) -> Run:
    """Simulate once per configuration (cached across tests) and decode every message."""
    opts = dict(options)
    sim = Simulation(protocol, opts, seed=seed, events=events, tables=4, partitions=PARTITIONS,
                     duplicate_rate=duplicate_rate, topic="sim")
    messages = list(sim.messages())
    decoder = decoder_for(protocol, opts, schemas=sim.schemas)
    offsets = [0] * PARTITIONS
    decoded = []
    for m in messages:
        ctx = DecodeContext("sim", m.partition, offsets[m.partition])
        offsets[m.partition] += 1
        decoded.append(Decoded(m, decoder.decode(m.key, m.value, ctx)))
    return Run(sim, decoded, sim.oracle())


def run_of(protocol: str, options: dict[str, str], **kw: Any) -> Run:
    return _run(protocol, tuple(sorted(options.items())), **kw)


# --------------------------------------------------------------------------------------------------
# The reference consumer


def row_key(event: RowChange) -> tuple[tuple[str, Any], ...]:
    image = event.columns if event.columns is not None else event.old
    key = tuple(sorted((c.name, c.value) for c in image or () if c.is_key))
    assert key, f"row event without handle-key columns: {event}"
    return key


class ReferenceConsumer:
    """TiCDC's consumer rules, applied to decoded events in the order a partition delivers them.

    - Per partition, remember the highest resolved ts. A row or DDL at or below it was delivered
      before (a duplicate, or a replay after a TiCDC restart) and is dropped.
    - Hold rows until every partition has resolved past them (global watermark = the minimum over
      partitions), then apply them sorted by commit ts.
    - Per key, the last change wins; a delete removes the row.

    ``offset_order=True`` is for streams without commit ts and resolved ts (Avro, Canal-JSON without
    the TiDB extension): rows are applied in partition offset order, which is right because a key
    never leaves its partition and TiCDC writes each table's rows in commit order there.
    """

    def __init__(self, partitions: int, *, offset_order: bool = False, drop_stale: bool = True) -> None:
        self.offset_order = offset_order
        self.drop_stale = drop_stale
        self.resolved = [0] * partitions
        self.pending: list[tuple[int, int, int, RowChange]] = []
        self.seq = 0
        self.tables: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = defaultdict(dict)
        self.ddl: dict[tuple[int | None, str], DDLEvent] = {}
        self.dropped = 0
        self.held_for_slower = 0

    def feed(self, partition: int, events: Iterable[Event]) -> None:
        for e in events:
            if isinstance(e, ResolvedEvent):
                if e.commit_ts > self.resolved[partition]:
                    self.resolved[partition] = e.commit_ts
                    self._flush()
            elif isinstance(e, DDLEvent):
                if not self.offset_order and e.commit_ts <= self.resolved[partition]:
                    self.dropped += 1
                    continue
                self.ddl.setdefault((e.commit_ts, e.query), e)
            elif self.offset_order:
                self._apply(e)
            elif self.drop_stale and e.commit_ts <= self.resolved[partition]:
                self.dropped += 1
            else:
                self.pending.append((e.commit_ts, self.seq, partition, e))
                self.seq += 1

    def _flush(self) -> None:
        watermark = min(self.resolved)
        ready = [x for x in self.pending if x[0] <= watermark]
        if ready:
            self.pending = [x for x in self.pending if x[0] > watermark]
        # rows their own partition has resolved, waiting for a slower partition
        self.held_for_slower += sum(1 for ts, _, p, _ in self.pending if ts <= self.resolved[p])
        ready.sort(key=lambda x: (x[0], x[1]))
        for *_, e in ready:
            self._apply(e)

    def _apply(self, e: RowChange) -> None:
        rows = self.tables[f"{e.schema}.{e.table}"]
        key = row_key(e)
        if e.op == Op.DELETE:
            rows.pop(key, None)
        else:
            rows[key] = e.new_values()  # type: ignore[assignment]


def consume(decoded: Iterable[tuple[int, list[Event]]], *, offset_order: bool,
            partitions: int = PARTITIONS) -> ReferenceConsumer:
    consumer = ReferenceConsumer(partitions, offset_order=offset_order)
    for partition, events in decoded:
        consumer.feed(partition, events)
    return consumer


def assert_matches_oracle(tables: dict[str, dict[tuple[Any, ...], dict[str, Any]]], oracle: Oracle) -> None:
    for name, table in oracle.tables.items():
        expected = {tuple(sorted((k, r[k]) for k in table.key)): r for r in table.rows}
        actual = tables.get(name, {})
        missing = expected.keys() - actual.keys()
        extra = actual.keys() - expected.keys()
        assert not missing and not extra, f"{name}: {len(missing)} rows missing, {len(extra)} unexpected " \
                                          f"(e.g. {sorted(map(str, missing | extra))[:3]})"
        names = [c.name for c in table.columns]
        for key, row in expected.items():
            got = actual[key]
            assert set(got) <= set(names), f"{name} {key}: columns beyond the oracle's: {set(got) - set(names)}"
            got_full = {n: got.get(n) for n in names}  # a column added later and never written: NULL
            diff = {n: (got_full[n], row[n]) for n in names if got_full[n] != row[n]}
            assert not diff, f"{name} {key}: (got, expected) {diff}"
    assert {n for n, rows in tables.items() if rows} <= set(oracle.tables)


# --------------------------------------------------------------------------------------------------
# Determinism and wire validity


@pytest.mark.parametrize("protocol,options", CONFIGS, ids=IDS)
def test_same_seed_gives_the_same_bytes(protocol: str, options: dict[str, str]) -> None:
    def stream(seed: int) -> list[tuple[int, bytes | None, bytes | None]]:
        return list(iter_messages(protocol, options, seed=seed, events=300, tables=3, partitions=3))

    first = stream(5)
    assert first == stream(5)
    assert first != stream(6)


@pytest.mark.parametrize("protocol,options", CONFIGS, ids=IDS)
def test_every_message_decodes_with_the_matching_decoder(protocol: str, options: dict[str, str]) -> None:
    run = run_of(protocol, options)
    counts = run.sim.stream.counts
    rows_decoded = sum(1 for d in run.decoded for e in d.events if isinstance(e, RowChange))
    rows_in_duplicates = sum(
        1 for d in run.decoded if d.message.duplicate for e in d.events if isinstance(e, RowChange)
    )
    # every row the stream encoded comes back, once per copy of its message
    assert rows_decoded == counts.row_events_encoded + rows_in_duplicates
    assert all(d.events for d in run.decoded)
    kinds = {d.message.kind: {e.kind for e in d.events} for d in run.decoded}
    assert kinds.get("rows", {"row"}) == {"row"}
    if protocol == "canal-json" or protocol == "avro":
        assert all(len(d.events) == 1 for d in run.decoded)  # one event per message
    if protocol == "open-protocol" and options.get("max-batch-size") == "4":
        sizes = [len(d.events) for d in run.decoded if d.message.kind == "rows"]
        assert max(sizes) == 4 and min(sizes) >= 1
    if protocol in ("open-protocol", "craft") and not options:
        assert max(len(d.events) for d in run.decoded) > 1  # rows are batched
    if protocol == "avro":
        # deletes are tombstones: the key, no value; commit ts only with the extension
        for d in run.decoded:
            (e,) = d.events
            assert (e.op == Op.DELETE) == (d.message.value is None)
            assert d.message.key is not None
            if e.op != Op.DELETE:
                assert (e.commit_ts is not None) == (options.get("enable-tidb-extension") == "true")


def test_messages_are_generated_lazily() -> None:
    """Ten million events are asked for; taking 20 messages commits only a few hundred upstream."""
    sim = Simulation("open-protocol", {}, seed=1, events=10_000_000, tables=3, partitions=3)
    first = list(itertools.islice(sim.messages(), 20))
    assert len(first) == 20
    assert sim.workload.counts.row_events < 2000
    assert len(list(itertools.islice(iter_messages("craft", {}, seed=1, events=10_000_000), 5))) == 5


# --------------------------------------------------------------------------------------------------
# TiCDC's stream rules


@pytest.mark.parametrize("protocol,options", CONFIGS, ids=IDS)
def test_a_key_always_lands_on_the_same_partition(protocol: str, options: dict[str, str]) -> None:
    run = run_of(protocol, options)
    partitions_of: dict[tuple[Any, ...], set[int]] = defaultdict(set)
    for d in run.decoded:
        for e in d.events:
            if isinstance(e, RowChange):
                partitions_of[(e.schema, e.table, row_key(e))].add(d.message.partition)
                # the decoded key hashes to the partition it came from
                assert partition_for(e, PARTITIONS) == d.message.partition
    assert len(partitions_of) > 100
    assert all(len(ps) == 1 for ps in partitions_of.values())
    assert {p for ps in partitions_of.values() for p in ps} == set(range(PARTITIONS))


@pytest.mark.parametrize("protocol,options", CONFIGS, ids=IDS)
def test_ddl_goes_to_every_partition_except_canal_json_and_avro(protocol: str, options: dict[str, str]) -> None:
    run = run_of(protocol, options)
    upstream = [(d["commit_ts"], d["query"]) for d in run.oracle.ddl]
    kinds = Counter(d["ddl_type"] for d in run.oracle.ddl)
    assert kinds[DDLType.CREATE_SCHEMA] >= 1 and kinds[DDLType.CREATE_TABLE] == 4 and kinds[DDLType.ADD_COLUMN] >= 4
    per_partition: dict[int, list[tuple[int | None, str]]] = defaultdict(list)
    for d in run.decoded:
        if d.message.duplicate or d.message.replayed:
            continue
        for e in d.events:
            if isinstance(e, DDLEvent):
                per_partition[d.message.partition].append((e.commit_ts, e.query))
    has_ts = protocol != "canal-json" or options.get("enable-tidb-extension") == "true"
    expected = upstream if has_ts else [(None, q) for _, q in upstream]
    if protocol == "avro":
        assert not per_partition  # TiCDC's Avro sink sends no DDL
    elif protocol == "canal-json":
        assert dict(per_partition) == {0: expected}  # TiCDC sends Canal-JSON DDL to partition 0 only
    else:
        assert dict(per_partition) == {p: expected for p in range(PARTITIONS)}


@pytest.mark.parametrize("protocol,options", TS_ORDERED, ids=TS_IDS)
def test_resolved_ts_promise(protocol: str, options: dict[str, str]) -> None:
    """After resolved R on a partition, no new event with commit ts <= R follows there; an event at or
    below R (a duplicate or a replay) is always one the partition has carried before."""
    run = run_of(protocol, options)
    resolved = [0] * PARTITIONS
    seen: list[set[Any]] = [set() for _ in range(PARTITIONS)]
    resolved_count = Counter()
    stale = 0
    for d in run.decoded:
        p = d.message.partition
        for e in d.events:
            if isinstance(e, ResolvedEvent):
                if not d.message.duplicate and not d.message.replayed:
                    assert e.commit_ts > resolved[p], "first-time resolved ts go up"
                    resolved_count[p] += 1
                resolved[p] = max(resolved[p], e.commit_ts)
                continue
            sig = e._replace(source=None)
            if e.commit_ts <= resolved[p]:
                stale += 1
                assert sig in seen[p], f"partition {p}: new event at ts {e.commit_ts} <= resolved {resolved[p]}"
            if not d.message.duplicate and not d.message.replayed:
                assert e.commit_ts > resolved[p]
            seen[p].add(sig)
    assert stale > 0  # the replay re-sent events the partitions had resolved
    last = run.oracle.counts["last_commit_ts"]
    assert all(r > last for r in resolved)  # the final resolved ts closes every partition
    # partition skew: resolved ts come at different rates
    assert resolved_count[0] > 2 * resolved_count[PARTITIONS - 1]


@pytest.mark.parametrize("protocol,options", CONFIGS, ids=IDS)
def test_tables_in_commit_order_and_split_deletes_first(protocol: str, options: dict[str, str]) -> None:
    run = run_of(protocol, options)
    last: dict[tuple[int, str], tuple[int, str]] = {}
    n = 0
    for d in run.decoded:
        if d.message.duplicate or d.message.replayed:
            continue
        for e in d.events:
            if not isinstance(e, RowChange) or e.commit_ts is None:
                continue
            where = (d.message.partition, f"{e.schema}.{e.table}")
            prev = last.get(where)
            if prev is not None:
                assert prev[0] <= e.commit_ts, f"{where}: ts went back from {prev[0]} to {e.commit_ts}"
                if prev[0] == e.commit_ts:
                    # within a transaction, TiCDC sends the deletes (split PK updates) first
                    assert not (prev[1] != Op.DELETE and e.op == Op.DELETE)
            last[where] = (e.commit_ts, e.op)
            n += 1
    if run.sim.stream.rules.has_commit_ts:
        assert n > 500


def test_workload_transactions() -> None:
    """Each key at most once per transaction; deletes first; PK updates split into DELETE + INSERT;
    DDL never shares a commit ts with DML; commit ts are TSOs that only go up."""
    w = Workload(3, 2000, 4)
    last_ts = 0
    split_txns = 0
    for c in w.commits():
        assert c.commit_ts > last_ts
        last_ts = c.commit_ts
        assert c.commit_ts >> 18 > compose_tso(0, 0)  # physical part set (ms since the epoch)
        if c.ddl is not None:
            assert not c.rows and c.ddl.commit_ts == c.commit_ts
            continue
        keys = [(e.schema, e.table, row_key(e)) for e in c.rows]
        assert len(keys) == len(set(keys)), "a row changed twice in one transaction"
        ops = [e.op for e in c.rows]
        assert ops == sorted(ops, key=lambda o: o != Op.DELETE), "deletes come first"
        assert all(e.commit_ts == c.commit_ts for e in c.rows)
        tables_deleted = {(e.schema, e.table) for e in c.rows if e.op == Op.DELETE}
        if any(e.op == Op.INSERT and (e.schema, e.table) in tables_deleted for e in c.rows):
            split_txns += 1
        for e in c.rows:
            if e.op == Op.UPDATE:
                assert row_key(e) == tuple(sorted((x.name, x.value) for x in e.old if x.is_key))
    assert w.counts.pk_change_splits > 20 and split_txns > 0
    assert w.counts.row_events == 2000


def test_values_are_canonical_and_varied() -> None:
    """The workload covers the column types of the brief, in the model's canonical Python values."""
    w = Workload(8, 2000, 3)
    seen: dict[str, set[Any]] = defaultdict(set)
    types: dict[str, Any] = {}
    for c in w.commits():
        for e in c.rows:
            for col in e.columns or e.old:
                seen[col.name].add(col.value)
    for spec in w.tables:
        for col in spec.columns:
            types[col.name] = col
    assert None in seen["c_int"] and None in seen["c_json"]
    assert any(v is not None and v > (1 << 64) - 1000 for v in seen["c_bigint_u"])
    assert any(v is not None and v > (1 << 64) - 1000 for v in seen["id"] if isinstance(v, int))
    assert any(v is not None and v < 0 for v in seen["c_bigint"])
    for name, scale in (("c_decimal", 6), ("price", 10), ("amount", 0)):
        for v in seen[name] - {None}:
            assert isinstance(v, str)
            assert (len(v.partition(".")[2]) if "." in v else 0) == scale, v
            assert not v.startswith("-0") or v.startswith("-0.")
    assert all(isinstance(v, bytes) for v in (seen["c_blob"] | seen["c_varbinary"]) - {None})
    assert any(b"\xff" in v or b"\x00" in v for v in seen["c_blob"] - {None})
    assert any(any(ord(ch) > 0xFFFF for ch in v) for v in seen["c_varchar"] - {None})  # emoji
    assert any("测试" in v for v in seen["c_text"] - {None})
    assert seen["c_enum"] - {None} <= {1, 2, 3, 4} and len(seen["c_enum"]) > 3
    assert all(1901 <= v <= 2155 for v in seen["c_year"] - {None})
    assert all(len(v) == 19 for v in seen["c_datetime"] - {None})
    assert all(len(v) == 26 for v in seen["updated"] - {None})  # DATETIME(6)
    assert all(isinstance(v, float) for v in seen["c_double"] - {None})
    assert all(not v.endswith(" ") for v in seen["code"] - {None})  # CHAR drops trailing spaces
    assert types["c_bigint_u"].flags & ColumnFlag.UNSIGNED and types["c_blob"].flags & ColumnFlag.BINARY
    assert types["c_enum"].type_code == TypeCode.ENUM
    composite = [t for t in w.tables if len(t.key_names) == 2]
    assert composite and composite[0].key_names == ("region", "seq")


def test_ddl_is_real_mysql() -> None:
    run = run_of("open-protocol", {})
    for d in run.oracle.ddl:
        tree = sqlglot.parse_one(d["query"], read="mysql")  # raises on a syntax error
        if d["ddl_type"] == DDLType.CREATE_TABLE:
            assert d["query"].startswith(f"CREATE TABLE `{d['schema']}`.`{d['table']}` (")
            assert "PRIMARY KEY (" in d["query"]
            assert isinstance(tree, sqlglot.exp.Create)
        elif d["ddl_type"] == DDLType.ADD_COLUMN:
            assert d["query"].startswith(f"ALTER TABLE `{d['schema']}`.`{d['table']}` ADD COLUMN `added_")
            assert "DEFAULT" not in d["query"]


# --------------------------------------------------------------------------------------------------
# The oracle


@pytest.mark.parametrize("protocol,options", CONFIGS, ids=IDS)
def test_reference_consumer_reproduces_the_oracle(protocol: str, options: dict[str, str]) -> None:
    run = run_of(protocol, options)
    offset_order = not run.sim.stream.rules.has_commit_ts or not run.sim.stream.rules.sends_resolved
    consumer = consume(((d.message.partition, d.events) for d in run.decoded), offset_order=offset_order)
    assert_matches_oracle(consumer.tables, run.oracle)
    counts = run.oracle.counts
    assert counts["duplicate_messages"] > 0 and counts["replayed_messages"] > 0
    assert counts["replayed_row_events"] > 50
    if not offset_order:
        assert not consumer.pending  # the final resolved ts released everything
        assert consumer.dropped > 0  # duplicates / replays at or below a partition's resolved ts
        assert consumer.held_for_slower > 0  # rows had to wait for the slowest partition
        if protocol != "canal-json":
            assert len(consumer.ddl) == len(run.oracle.ddl)
    # the stream really changed the tables: deletes, PK changes and columns added mid-stream
    assert counts["row_events"]["delete"] > 100 and counts["pk_change_splits"] > 10
    enum_values = {r["c_enum"] for t in run.oracle.tables.values() for r in t.rows if "c_enum" in r} - {None}
    assert enum_values <= ({"new", "paid", "shipped", "cancelled", "x", "y"} if protocol == "avro" else {1, 2, 3, 4})


def test_the_oracle_comparison_can_fail() -> None:
    """Losing one delete is caught, and so is a consumer that does not drop replayed rows: the replay
    re-sends old versions after newer ones were applied, and applying them again regresses rows."""
    run = run_of("open-protocol", {})
    decoded = [(d.message.partition, d.events) for d in run.decoded]
    victim = next(e for _, evs in decoded for e in evs if isinstance(e, RowChange) and e.op == Op.DELETE)
    same = victim._replace(source=None)
    broken = [(p, [e for e in evs if not (isinstance(e, RowChange) and e._replace(source=None) == same)])
              for p, evs in decoded]
    with pytest.raises(AssertionError, match="1 unexpected"):
        assert_matches_oracle(consume(broken, offset_order=False).tables, run.oracle)
    careless = ReferenceConsumer(PARTITIONS, drop_stale=False)
    for p, evs in decoded:
        careless.feed(p, evs)
    with pytest.raises(AssertionError, match=r"\(got, expected\)|rows missing"):
        assert_matches_oracle(careless.tables, run.oracle)


def test_oracle_columns_and_added_columns() -> None:
    run = run_of("open-protocol", {})
    table = run.oracle.tables["s1.t1"]
    assert table.key == ("id",)
    names = [c.name for c in table.columns]
    added = [n for n in names if n.startswith("added_")]
    assert len(added) == 2 and names[-2:] == added
    assert any(r[added[0]] is None for r in table.rows) and any(r[added[0]] is not None for r in table.rows)
    col = {c.name: c for c in table.columns}
    assert col["c_decimal"].mysql_type == "decimal(20,6)" and (col["c_decimal"].precision, col["c_decimal"].scale) \
        == (20, 6)
    assert col["c_enum"].enum_members == ("new", "paid", "shipped", "cancelled")
    assert col["id"].flags & (ColumnFlag.HANDLE_KEY | ColumnFlag.PRIMARY_KEY) and not col["id"].flags & \
        ColumnFlag.NULLABLE
    assert col["c_bigint_u"].mysql_type == "bigint unsigned" and col["c_bigint_u"].type == TypeCode.BIGINT
    assert run.oracle.tables["s2.t2"].key == ("region", "seq")


def test_oracle_json_round_trip(tmp_path: Path) -> None:
    oracle = run_of("avro", {}).oracle
    path = tmp_path / "oracle.json"
    oracle.save(path)
    back = load_oracle(path)
    assert back == oracle
    rows = [r for t in back.tables.values() for r in t.rows]
    assert any(isinstance(v, bytes) for r in rows for v in r.values())
    assert any(isinstance(v, int) and v > (1 << 63) for r in rows for v in r.values())
    assert any(isinstance(v, float) for r in rows for v in r.values())
    (tmp_path / "bad.json").write_text('{"format": 1, "protocol": "x"}')
    with pytest.raises(ValueError, match="malformed oracle"):
        load_oracle(tmp_path / "bad.json")
    (tmp_path / "bad2.json").write_text('{"format": 99}')
    with pytest.raises(ValueError, match="not an oracle of format 1"):
        load_oracle(tmp_path / "bad2.json")


def test_avro_registers_a_new_schema_version_after_add_column() -> None:
    """A duck-typed Schema Registry client (confluent's needs extras this environment lacks)."""

    class Registry:
        def __init__(self) -> None:
            self.by_id: dict[int, Any] = {}
            self.versions: dict[str, list[int]] = defaultdict(list)

        def register_schema(self, subject: str, schema: Any) -> int:
            for sid, known in self.by_id.items():
                if known.schema_str == schema.schema_str:
                    break
            else:
                sid = len(self.by_id) + 1
                self.by_id[sid] = schema
            if sid not in self.versions[subject]:
                self.versions[subject].append(sid)
            return sid

        def get_schema(self, schema_id: int) -> Any:
            return self.by_id[schema_id]

    registry = Registry()
    schemas = AvroSchemas.from_registry(registry)
    sink = MemorySink()
    summary, oracle = simulate("avro", {"enable-tidb-extension": "true"}, seed=4, events=600, tables=3,
                               partitions=2, sink=sink, schemas=schemas, topic="orders")
    assert set(registry.versions) == {"orders-key", "orders-value"}
    value_ids_by_table: dict[str, set[int]] = defaultdict(set)
    decoder = decoder_for("avro", {"enable-tidb-extension": "true"},
                          schemas=AvroSchemas.from_registry(registry))  # a consumer with its own cache
    decoded = []
    for i, (p, key, value) in enumerate(sink.messages):
        events = decoder.decode(key, value, DecodeContext("orders", p, i))
        decoded.append((p, events))
        if value is not None:
            value_ids_by_table[events[0].table].add(int.from_bytes(value[1:5], "big"))
    assert all(len(ids) >= 2 for ids in value_ids_by_table.values())  # ADD COLUMN: new version
    assert_matches_oracle(consume(decoded, offset_order=True, partitions=2).tables, oracle)
    assert summary["avro_schema_ids"] == sorted(registry.by_id)


def expected_avro_params(oracle: Oracle, decimals: bool) -> dict[tuple[str, str], dict[str, dict[str, Any]]]:
    """The column params a sink must read from the Avro schemas: the DDL's DECIMAL(p,s) (unless
    ``decimals`` is false) and ENUM members, per table."""
    out: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for t in oracle.tables.values():
        cols: dict[str, dict[str, Any]] = {}
        for c in t.columns:
            if c.enum_members is not None:
                cols[c.name] = {"precision": None, "scale": None, "members": list(c.enum_members)}
            elif c.precision is not None and decimals:
                cols[c.name] = {"precision": c.precision, "scale": c.scale, "members": None}
        out[(t.schema, t.table)] = cols
    return out


@pytest.mark.parametrize("mode", ["precise", "string"])
def test_avro_schemas_carry_the_declared_decimal_and_enum_params(mode: str) -> None:
    """Avro carries no DDL, so a sink types DECIMAL(p,s) and ENUM columns from the schemas: they hold the
    tables' declared params (added columns included), as TiCDC writes them. String mode: TiCDC writes
    no precision/scale for a DECIMAL, so none is known."""
    if mode == "precise":
        sim = run_of("avro", {}).sim
    else:
        sim = Simulation("avro", {"avro-decimal-handling-mode": "string"}, seed=11, events=EVENTS, tables=4,
                         partitions=PARTITIONS, topic="sim")
        for _ in sim.messages():
            pass
    got = sim.schemas.table_params_for(sorted(sim.schemas.known_ids))
    assert got == expected_avro_params(sim.oracle(), decimals=mode == "precise")
    declared = {name: (p["precision"], p["scale"]) for cols in got.values() for name, p in cols.items()
                if p["precision"] is not None}
    if mode == "precise":
        assert declared["c_decimal"] == (20, 6) and declared["price"] == (38, 10)
        assert any(name.startswith("added_") for name in declared)
    else:
        assert not declared


# --------------------------------------------------------------------------------------------------
# CLI and sinks


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize("protocol,options", [("craft", []), ("avro", ["enable-tidb-extension=true"])],
                         ids=["craft", "avro"])
def test_cli_writes_messages_and_oracle(tmp_path: Path, capsys: pytest.CaptureFixture[str], protocol: str,
                                        options: list[str]) -> None:
    out = tmp_path / "sim"
    argv = ["--protocol", protocol, "--seed", "9", "--events", "400", "--tables", "3", "--partitions", "2",
            "--out", str(out), "--duplicate-rate", "0.05"]
    for o in options:
        argv += ["--option", o]
    assert run(_parse(argv)) == 0
    summary = __import__("json").loads(capsys.readouterr().out)
    assert summary["row_events"]["total"] == 400 and summary["oracle"] == str(out / "oracle.json")
    oracle = load_oracle(out / "oracle.json")
    schemas = None
    if protocol == "avro":
        files = {int(p.stem): p for p in (out / "avro-schemas").glob("*.avsc")}
        assert sorted(files) == summary["avro_schema_ids"]
        schemas = AvroSchemas.from_files(files)
    decoder = decoder_for(protocol, dict(o.split("=", 1) for o in options), schemas=schemas)
    messages = list(read_messages(out))
    assert len(messages) == summary["messages"]
    decoded = [(p, decoder.decode(k, v, DecodeContext("sim", p, i))) for i, (p, k, v) in enumerate(messages)]
    assert_matches_oracle(consume(decoded, offset_order=protocol == "avro", partitions=2).tables, oracle)
    # same seed, same files
    out2 = tmp_path / "again"
    assert run(_parse([a if a != str(out) else str(out2) for a in argv])) == 0
    assert (out2 / "messages.jsonl").read_bytes() == (out / "messages.jsonl").read_bytes()


def test_cli_registers_avro_schemas_in_the_mock_registry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``mock://`` is confluent-kafka's in-process registry (``SchemaRegistryClient.new_client``; the plain
    constructor would try HTTP)."""
    pytest.importorskip("confluent_kafka.schema_registry")
    argv = ["--protocol", "avro", "--seed", "3", "--events", "200", "--tables", "2", "--partitions", "2",
            "--out", str(tmp_path), "--schema-registry", "mock://ticdc-delta-sim-cli"]
    assert run(_parse(argv)) == 0
    summary = __import__("json").loads(capsys.readouterr().out)
    assert len(summary["avro_schema_ids"]) >= 4  # key + value per table, new versions after ADD COLUMN
    assert "avro_schema_dir" not in summary and not (tmp_path / "avro-schemas").exists()


def test_cli_rejects_inconsistent_destinations(tmp_path: Path) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="either --out DIR or --topic"):
        run(_parse(["--protocol", "craft", "--out", str(tmp_path), "--topic", "t", "--bootstrap-servers", "h:1"]))
    with pytest.raises(argparse.ArgumentTypeError, match="--topic and --bootstrap-servers go together"):
        run(_parse(["--protocol", "craft", "--topic", "t", "--oracle", "o.json"]))
    with pytest.raises(argparse.ArgumentTypeError, match="--oracle FILE is required"):
        run(_parse(["--protocol", "craft", "--topic", "t", "--bootstrap-servers", "h:1"]))
    with pytest.raises(argparse.ArgumentTypeError, match="only apply to --protocol avro"):
        run(_parse(["--protocol", "craft", "--out", str(tmp_path), "--avro-schema-dir", str(tmp_path)]))
    with pytest.raises(SystemExit):
        _parse(["--protocol", "craft", "--duplicate-rate", "1.5"])


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown protocol"):
        Simulation("json", {})
    with pytest.raises(ValueError, match="partitions must be at least 1"):
        Simulation("craft", {}, partitions=0)
    with pytest.raises(ValueError, match="events must be at least 1"):
        Simulation("craft", {}, events=0)
    with pytest.raises(ValueError, match="duplicate_rate"):
        Simulation("craft", {}, duplicate_rate=1.0)
    with pytest.raises(ValueError, match="enable-tidb-extension must be true or false"):
        Simulation("canal-json", {"enable-tidb-extension": "maybe"})
    sim = Simulation("craft", {}, events=5)
    with pytest.raises(RuntimeError, match="iterate Simulation.messages"):
        sim.oracle()


def test_file_sink_round_trip(tmp_path: Path) -> None:
    sink = FileSink(tmp_path)
    sent = [(0, None, b"v"), (2, b"k", None), (1, b"\x00\xff", b"")]
    for m in sent:
        sink.write(*m)
    sink.close()
    assert list(read_messages(tmp_path / "messages.jsonl")) == sent
    (tmp_path / "messages.jsonl").write_text('{"partition": 0}\n')
    with pytest.raises(ValueError, match="messages.jsonl:1: not a message line"):
        list(read_messages(tmp_path))


@pytest.mark.integration
def test_kafka_sink_on_the_local_broker(broker: Any, unique_name: Callable[[str], str]) -> None:
    from confluent_kafka import Consumer, TopicPartition

    topic = unique_name("sim")
    sink = KafkaSink(broker.bootstrap_servers, topic, 3)  # creates the topic
    summary, oracle = simulate("open-protocol", {}, seed=2, events=300, tables=3, partitions=3, sink=sink,
                               topic=topic, duplicate_rate=0.05)
    per_partition = summary["messages_per_partition"]
    assert broker.high_watermarks(topic, [0, 1, 2]) == dict(enumerate(per_partition))
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": unique_name("g"),
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
    decoder = decoder_for("open-protocol", {})
    decoded = []
    deadline = time.monotonic() + 30
    try:
        while len(decoded) < sum(per_partition) and time.monotonic() < deadline:
            for msg in consumer.consume(200, timeout=0.5):
                assert msg.error() is None
                ctx = DecodeContext(topic, msg.partition(), msg.offset())
                decoded.append((msg.partition(), decoder.decode(msg.key(), msg.value(), ctx)))
    finally:
        consumer.close()
    assert len(decoded) == sum(per_partition)
    assert_matches_oracle(consume(decoded, offset_order=False).tables, oracle)
    # an existing topic with too few partitions is refused
    with pytest.raises(ConfigError, match="has 3 partitions, the stream needs 4"):
        KafkaSink(broker.bootstrap_servers, topic, 4)
