"""The scripted upstream (:mod:`ticdc_delta.simulator.scenario`): its TiDB model and its TiCDC stream.

No Spark, no broker: the model's data effects of DDL (defaults, renames, drops, type changes, keys), the
split of key-changing updates, dispatch, where DDL and resolved ts go per protocol, and that every message
decodes back to the events the scenario says it holds.
"""

from __future__ import annotations

from typing import Any

import pytest

from ticdc_delta.codec import DecodeContext, decoder_for
from ticdc_delta.codec.model import ColumnFlag, DDLType, Op, RowChange, TypeCode
from ticdc_delta.simulator.scenario import Scenario
from ticdc_delta.simulator.stream import partition_for
from ticdc_delta.simulator.workload import TsoClock

T = "`s`.`t`"
CREATE_T = f"CREATE TABLE {T} (`id` INT NOT NULL, `a` VARCHAR(20), PRIMARY KEY (`id`))"

PROTOCOLS: list[tuple[str, dict[str, str]]] = [
    ("open-protocol", {}),
    ("open-protocol", {"max-batch-size": "2"}),
    ("craft", {}),
    ("canal-json", {"enable-tidb-extension": "true"}),
    ("canal-json", {}),
    ("avro", {"enable-tidb-extension": "true"}),
    ("avro", {}),
]


def _scenario(protocol: str = "open-protocol", options: dict[str, str] | None = None, **kw: Any) -> Scenario:
    sc = Scenario(protocol, options or {}, topic="scn", **kw)
    sc.ddl("CREATE DATABASE `s`")
    sc.ddl(CREATE_T)
    return sc


def _rows(sc: Scenario, table: str = "s.t") -> list[dict[str, Any]]:
    return sc.oracle().tables[table].rows


def _row_events(sc: Scenario) -> list[tuple[int, RowChange]]:
    return [(m.partition, e) for m in sc.records() for e in m.events if e.kind == "row"]


def _play(sc: Scenario) -> Scenario:
    """A script touching most of the model: every column type, DDL of each kind, a split update."""
    sc.ddl("CREATE TABLE `s`.`w` (`id` BIGINT NOT NULL, `u` BIGINT UNSIGNED, `f` FLOAT, `dbl` DOUBLE, "
           "`d` DECIMAL(10,3), `dt` DATE, `tm` DATETIME(6), `ts` TIMESTAMP NULL, `ti` TIME, `y` YEAR, "
           "`e` ENUM('a','b'), `st` SET('x','y'), `j` JSON, `b` BLOB, `vb` VARBINARY(4), `bt` BIT(3), "
           "`c` CHAR(3), `tx` TEXT, PRIMARY KEY (`id`))")
    sc.insert("s", "w", id=1, u=18446744073709551615, f=0.5, dbl=-1e300, d="-1.5", dt="2024-02-29",
              tm="2024-01-01 00:00:00.000001", ts="2038-01-19 03:14:07", ti="-838:59:59", y=1901, e="b",
              st="x,y", j='{"k": [1, 2]}', b=b"\x00\x01", vb=b"\xff", bt=5, c="ab", tx="测试 😀")
    sc.insert("s", "w", id=2)
    sc.insert("s", "t", id=1, a="x")
    sc.insert("s", "t", id=2, a="y")
    sc.resolved()
    sc.ddl(f"ALTER TABLE {T} ADD COLUMN `n` INT NOT NULL DEFAULT 7 FIRST")
    sc.update("s", "t", {"id": 1}, id=10, a="moved")
    sc.update("s", "w", {"id": 2}, e="a", d="3")
    sc.ddl(f"ALTER TABLE {T} RENAME COLUMN `a` TO `b`")
    sc.delete("s", "t", id=2)
    sc.ddl("RENAME TABLE `s`.`w` TO `s`.`w2`")
    sc.delete("s", "w2", id=1)
    return sc


# ------------------------------------------------------------------------------------------ the model


def test_add_column_default_fills_existing_rows_as_tidb_shows_them() -> None:
    sc = _scenario()
    sc.insert("s", "t", id=1, a="x")
    sc.ddl(f"ALTER TABLE {T} ADD COLUMN `c` VARCHAR(5) NOT NULL DEFAULT 'it''s'")
    sc.ddl(f"ALTER TABLE {T} ADD COLUMN `d` DECIMAL(6,2) DEFAULT 1.5")
    sc.ddl(f"ALTER TABLE {T} ADD COLUMN `e` ENUM('p','q') DEFAULT 'q'")
    sc.ddl(f"ALTER TABLE {T} ADD COLUMN `n` INT NOT NULL")  # no DEFAULT: the type's zero value
    sc.ddl(f"ALTER TABLE {T} ADD COLUMN `z` INT")  # nullable, no DEFAULT: NULL
    ts = sc.ddl(f"ALTER TABLE {T} ADD COLUMN `at` DATETIME(3) DEFAULT CURRENT_TIMESTAMP(3)")
    ins = sc.insert("s", "t", id=2, n=5)
    rows = _rows(sc)
    assert rows[0] == {"id": 1, "a": "x", "c": "it's", "d": "1.50", "e": 2, "n": 0, "z": None,
                       "at": _clock_text(ts)}
    assert rows[1] == {"id": 2, "a": None, "c": "it's", "d": "1.50", "e": 2, "n": 5, "z": None,
                       "at": _clock_text(ins)}


def _clock_text(ts: int) -> str:
    from datetime import datetime, timedelta, timezone

    moment = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=ts >> 18)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}"


def test_set_and_drop_default_change_what_later_inserts_get() -> None:
    sc = _scenario()
    sc.ddl(f"ALTER TABLE {T} ADD COLUMN `c` VARCHAR(5) DEFAULT 'a'")
    sc.insert("s", "t", id=1)
    sc.ddl(f"ALTER TABLE {T} ALTER COLUMN `c` SET DEFAULT 'z'")
    sc.insert("s", "t", id=2)
    sc.ddl(f"ALTER TABLE {T} ALTER COLUMN `c` DROP DEFAULT")
    sc.insert("s", "t", id=3)
    assert [r["c"] for r in _rows(sc)] == ["a", "z", None]
    sc.ddl(f"ALTER TABLE {T} ADD COLUMN `m` INT NOT NULL DEFAULT 1")
    sc.ddl(f"ALTER TABLE {T} ALTER COLUMN `m` DROP DEFAULT")
    with pytest.raises(ValueError, match="column 'm' has no DEFAULT"):
        sc.insert("s", "t", id=4)


def test_rename_drop_and_modify_column_carry_the_values() -> None:
    sc = _scenario()
    sc.ddl(f"ALTER TABLE {T} ADD COLUMN `d` DECIMAL(6,2), ADD COLUMN `f` FLOAT, ADD COLUMN `v` INT")
    sc.insert("s", "t", id=1, a="x", d="1.5", f=0.1, v=2147483647)
    sc.ddl(f"ALTER TABLE {T} RENAME COLUMN `a` TO `b`")
    sc.ddl(f"ALTER TABLE {T} CHANGE COLUMN `v` `w` BIGINT")
    sc.ddl(f"ALTER TABLE {T} MODIFY COLUMN `d` DECIMAL(12,4)")
    sc.ddl(f"ALTER TABLE {T} MODIFY COLUMN `f` DOUBLE")
    sc.insert("s", "t", id=2, b="y", w=1 << 40, d="-2", f=0.1)
    sc.ddl(f"ALTER TABLE {T} DROP COLUMN `b`")
    rows = _rows(sc)
    # FLOAT is single precision upstream: 0.1 was stored as 0.10000000149011612, and stays so as DOUBLE
    assert rows == [{"id": 1, "d": "1.5000", "f": 0.10000000149011612, "w": 2147483647},
                    {"id": 2, "d": "-2.0000", "f": 0.1, "w": 1 << 40}]
    cols = {c.name: c for c in sc.oracle().tables["s.t"].columns}
    assert (cols["d"].precision, cols["d"].scale, cols["d"].type) == (12, 4, TypeCode.DECIMAL)
    assert cols["f"].type == TypeCode.DOUBLE and cols["w"].type == TypeCode.BIGINT
    # the row images follow the model: the insert after the renames carries the new names
    last = _row_events(sc)[-1][1]
    assert [c.name for c in last.columns] == ["id", "b", "d", "f", "w"]


def test_positions_first_and_after_reorder_the_images() -> None:
    sc = _scenario()
    sc.ddl(f"ALTER TABLE {T} ADD COLUMN `f0` INT FIRST, ADD COLUMN `f1` INT DEFAULT 9 AFTER `id`")
    sc.insert("s", "t", id=1, f0=0)
    (_, row), = _row_events(sc)
    assert [c.name for c in row.columns] == ["f0", "id", "f1", "a"]
    assert row.new_values() == {"f0": 0, "id": 1, "f1": 9, "a": None}


def test_truncate_drop_and_rename_table() -> None:
    sc = _scenario()
    sc.insert("s", "t", id=1, a="x")
    sc.ddl("CREATE TABLE `s`.`u` LIKE `s`.`t`")
    sc.insert("s", "u", id=5, a="u")
    drop_ts = sc.ddl("DROP TABLE `s`.`u`")
    sc.ddl(f"TRUNCATE TABLE {T}")
    sc.insert("s", "t", id=2, a="after")
    sc.ddl(f"RENAME TABLE {T} TO `s`.`t2`")
    sc.update("s", "t2", {"id": 2}, a="renamed")
    with pytest.raises(ValueError, match="does not exist upstream"):
        sc.insert("s", "t", id=3)
    oracle = sc.oracle()
    assert sorted(oracle.tables) == ["s.t2"]
    assert oracle.tables["s.t2"].rows == [{"id": 2, "a": "renamed"}]
    assert sc.gone["s.u"].reason == "drop_table" and sc.gone["s.u"].commit_ts == drop_ts
    assert sc.gone["s.u"].last.rows == [{"id": 5, "a": "u"}]
    assert sc.gone["s.t"].reason == "rename_table" and sc.gone["s.t"].last.rows == [{"id": 2, "a": "after"}]
    assert oracle.counts["gone_tables"] == {"s.t": "rename_table", "s.u": "drop_table"}


def test_create_table_like_copies_columns_and_keys_without_rows() -> None:
    sc = _scenario()
    sc.ddl(f"ALTER TABLE {T} ADD UNIQUE KEY `uk` (`a`)")
    sc.insert("s", "t", id=1, a="x")
    sc.ddl("CREATE TABLE `s`.`copy` LIKE `s`.`t`")
    copy = sc.oracle().tables["s.copy"]
    assert copy.rows == [] and copy.key == ("id",)
    assert [(c.name, c.type, c.flags) for c in copy.columns] == \
        [(c.name, c.type, c.flags) for c in sc.oracle().tables["s.t"].columns]
    sc.insert("s", "copy", id=1, a="a")
    with pytest.raises(ValueError, match="duplicate entry .* for key 'uk'"):
        sc.insert("s", "copy", id=2, a="a")  # the unique key came along


def test_multi_table_rename_is_split_like_ticdc_or_sent_as_one_query() -> None:
    for split in (True, False):
        sc = Scenario("open-protocol", {}, partitions=1)
        sc.ddl("CREATE DATABASE `s`")
        for name in ("a", "b"):
            sc.ddl(f"CREATE TABLE `s`.`{name}` (`id` INT NOT NULL, PRIMARY KEY (`id`))")
            sc.insert("s", name, id=1 if name == "a" else 2)
        query = "RENAME TABLE `s`.`a` TO `s`.`tmp`, `s`.`b` TO `s`.`a`, `s`.`tmp` TO `s`.`b`"  # a swap
        ts = sc.ddl(query, split_renames=split)
        ddl = [e for e in sc.ddl_log if e.commit_ts == ts]
        if split:
            assert [e.query for e in ddl] == ["RENAME TABLE `s`.`a` TO `s`.`tmp`", "RENAME TABLE `s`.`b` TO `s`.`a`",
                                             "RENAME TABLE `s`.`tmp` TO `s`.`b`"]
            assert {e.ddl_type for e in ddl} == {DDLType.RENAME_TABLE}
        else:
            assert [e.query for e in ddl] == [query]
        oracle = sc.oracle()
        assert oracle.tables["s.a"].rows == [{"id": 2}] and oracle.tables["s.b"].rows == [{"id": 1}]
        assert "s.tmp" in sc.gone


def test_drop_database_removes_its_tables() -> None:
    sc = _scenario()
    sc.insert("s", "t", id=1)
    sc.ddl("CREATE DATABASE `other`")
    sc.ddl("CREATE TABLE `other`.`x` (`id` INT NOT NULL, PRIMARY KEY (`id`))")
    sc.ddl("DROP DATABASE `s`")
    assert sorted(sc.oracle().tables) == ["other.x"]
    assert sc.gone["s.t"].reason == "drop_database" and sc.gone["s.t"].last.rows == [{"id": 1, "a": None}]


def test_no_op_and_unknown_ddl_change_nothing_but_are_sent() -> None:
    sc = _scenario()
    sc.insert("s", "t", id=1, a="x")
    before = sc.oracle().tables["s.t"]
    sc2 = _scenario()
    sc2.insert("s", "t", id=1, a="x")
    for query in [f"CREATE INDEX `i` ON {T} (`a`)", f"ALTER TABLE {T} ADD INDEX `j` (`a`, `id`)",
                  f"DROP INDEX `i` ON {T}", f"ALTER TABLE {T} SET TIFLASH REPLICA 1",
                  "CREATE VIEW `s`.`v` AS SELECT `id` FROM `s`.`t`", "CREATE SEQUENCE `s`.`q`",
                  f"ALTER TABLE {T} COMMENT = 'c'", f"ALTER TABLE {T} FROBNICATE"]:
        sc2.ddl(query)
    after = sc2.oracle().tables["s.t"]
    assert (after.columns, after.key, after.rows) == (before.columns, before.key, before.rows)
    assert sc2.unknown_ddl == [f"ALTER TABLE {T} FROBNICATE"]
    types = [e.ddl_type for e in sc2.ddl_log[2:]]
    assert types == [DDLType.ADD_INDEX, DDLType.ADD_INDEX, DDLType.DROP_INDEX, DDLType.SET_TIFLASH_REPLICA,
                     DDLType.CREATE_VIEW, DDLType.CREATE_SEQUENCE, DDLType.MODIFY_TABLE_COMMENT, None]


def test_key_changes_move_the_handle_key_flags() -> None:
    sc = Scenario("open-protocol", {}, partitions=1)
    sc.ddl("CREATE DATABASE `s`")
    sc.ddl("CREATE TABLE `s`.`k` (`id` INT NOT NULL, `code` VARCHAR(5) NOT NULL, `v` INT)")
    sc.insert("s", "k", id=1, code="A", v=1)
    assert sc.oracle().tables["s.k"].key == ("id", "code", "v")  # no key: every column
    sc.ddl("ALTER TABLE `s`.`k` ADD UNIQUE INDEX `uk` (`code`)")
    sc.insert("s", "k", id=2, code="B", v=2)
    sc.ddl("ALTER TABLE `s`.`k` ADD PRIMARY KEY (`id`)")
    sc.insert("s", "k", id=3, code="C", v=3)
    sc.ddl("ALTER TABLE `s`.`k` DROP PRIMARY KEY, ADD PRIMARY KEY (`id`, `code`)")
    sc.insert("s", "k", id=1, code="D", v=4)  # the same id: allowed under the wider key
    with pytest.raises(ValueError, match="duplicate entry"):
        sc.insert("s", "k", id=1, code="D", v=5)
    images = [e.columns for _, e in _row_events(sc)]
    handle = [tuple(c.name for c in img if c.flags & ColumnFlag.HANDLE_KEY) for img in images]
    assert handle == [(), ("code",), ("id",), ("id", "code")]
    flags = {c.name: c.flags for c in images[-1]}
    assert flags["id"] & ColumnFlag.PRIMARY_KEY and flags["code"] & ColumnFlag.UNIQUE_KEY
    assert not flags["v"] & (ColumnFlag.HANDLE_KEY | ColumnFlag.PRIMARY_KEY)
    assert flags["v"] & ColumnFlag.NULLABLE and not flags["id"] & ColumnFlag.NULLABLE
    assert sc.oracle().tables["s.k"].key == ("id", "code")


def test_refused_ddl_sends_nothing_and_leaves_the_model() -> None:
    sc = _scenario()
    sc.insert("s", "t", id=1, a="x")
    sc.insert("s", "t", id=2, a="x")
    n = len(sc.ddl_log)
    for query, error in [("ALTER TABLE `s`.`nope` ADD COLUMN `c` INT", "does not exist"),
                         (f"ALTER TABLE {T} ADD COLUMN `a` INT", "duplicate column"),
                         (f"ALTER TABLE {T} DROP COLUMN `id`", "primary key"),
                         (f"ALTER TABLE {T} ADD UNIQUE KEY (`a`)", "duplicate entry"),
                         (f"ALTER TABLE {T} ADD COLUMN `c` INT, DROP COLUMN `zz`", "no column 'zz'"),
                         (f"ALTER TABLE {T} ADD COLUMN `c` INT DEFAULT (UUID())", "cannot evaluate")]:
        with pytest.raises(ValueError, match=error):
            sc.ddl(query)
    assert len(sc.ddl_log) == n
    assert [c.name for c in sc.oracle().tables["s.t"].columns] == ["id", "a"]


def test_bad_dml_is_refused() -> None:
    sc = _scenario()
    sc.insert("s", "t", id=1, a="x")
    with pytest.raises(ValueError, match="duplicate entry"):
        sc.insert("s", "t", id=1)
    with pytest.raises(ValueError, match="is NOT NULL"):
        sc.insert("s", "t", id=None)
    with pytest.raises(ValueError, match="has no column 'nope'"):
        sc.insert("s", "t", id=2, nope=1)
    with pytest.raises(ValueError, match="0 rows match"):
        sc.update("s", "t", {"id": 9}, a="y")
    with pytest.raises(ValueError, match="not a value of column 'id'"):
        sc.insert("s", "t", id="x")
    assert sc.update("s", "t", {"id": 1}, a="x") is None  # nothing changed: TiDB writes nothing
    with pytest.raises(RuntimeError, match="inside a transaction"):
        with sc.transaction():
            sc.ddl(f"ALTER TABLE {T} ADD COLUMN `c` INT")
    sc.messages()
    with pytest.raises(RuntimeError, match="finished"):
        sc.insert("s", "t", id=3)


def test_decimal_values_are_printed_with_the_column_scale() -> None:
    sc = _scenario()
    sc.ddl(f"ALTER TABLE {T} ADD COLUMN `d` DECIMAL(5,2)")
    sc.insert("s", "t", id=1, d="1.5")
    sc.insert("s", "t", id=2, d=-0.0)
    sc.insert("s", "t", id=3, d=999)
    with pytest.raises(ValueError, match=r"does not fit DECIMAL\(5,2\)"):
        sc.insert("s", "t", id=4, d="1000")
    assert [r["d"] for r in _rows(sc)] == ["1.50", "0.00", "999.00"]


# ------------------------------------------------------------------------------------------ TiCDC


def test_commit_ts_are_tsos_in_order_one_per_statement_and_per_ddl() -> None:
    sc = _scenario()
    a = sc.insert("s", "t", id=1)
    b = sc.insert("s", "t", id=2)
    c = sc.ddl(f"ALTER TABLE {T} ADD COLUMN `c` INT")
    d = sc.delete("s", "t", id=1)
    assert a < b < c < d
    assert (a >> 18) >= TsoClock.START_MS
    assert [e.commit_ts for _, e in _row_events(sc)] == [a, b, d]


def test_a_key_change_is_split_into_delete_then_insert_at_one_ts() -> None:
    sc = _scenario(partitions=4)
    sc.insert("s", "t", id=1, a="x")
    ts = sc.update("s", "t", {"id": 1}, id=2, a="y")
    events = [e for _, e in _row_events(sc) if e.commit_ts == ts]
    assert [e.op for e in events] == [Op.DELETE, Op.INSERT]
    assert events[0].old_values() == {"id": 1, "a": "x"} and events[1].new_values() == {"id": 2, "a": "y"}
    assert sc.counts["pk_change_splits"] == 1
    # each half goes to the partition of its own key
    for partition, e in _row_events(sc):
        assert partition == partition_for(e, 4)
    # an update that keeps the key carries the full old image
    sc2 = _scenario()
    sc2.ddl(f"ALTER TABLE {T} ADD COLUMN `n` INT")
    sc2.insert("s", "t", id=1, a="x", n=1)
    sc2.update("s", "t", {"id": 1}, a="y")
    (_, upd), = [(p, e) for p, e in _row_events(sc2) if e.op == Op.UPDATE]
    assert upd.old_values() == {"id": 1, "a": "x", "n": 1} and upd.new_values() == {"id": 1, "a": "y", "n": 1}


def test_unique_key_change_splits_too() -> None:
    sc = _scenario()
    sc.ddl(f"ALTER TABLE {T} ADD COLUMN `code` VARCHAR(5) NOT NULL DEFAULT ''")
    sc.insert("s", "t", id=1, code="A")
    sc.ddl(f"ALTER TABLE {T} ADD UNIQUE KEY `uk` (`code`)")
    sc.update("s", "t", {"id": 1}, code="B")
    assert [e.op for _, e in _row_events(sc)] == [Op.INSERT, Op.DELETE, Op.INSERT]


def test_a_transaction_has_one_ts_and_sends_deletes_first() -> None:
    sc = _scenario()
    sc.insert("s", "t", id=1)
    sc.insert("s", "t", id=2)
    with sc.transaction() as ts:
        sc.insert("s", "t", id=3)
        sc.update("s", "t", {"id": 1}, a="u")
        sc.delete("s", "t", id=2)
        with pytest.raises(ValueError, match="at most once"):
            sc.update("s", "t", {"id": 1}, a="again")
    with pytest.raises(KeyError):
        with sc.transaction():
            sc.insert("s", "t", id=9)
            raise KeyError("rolled back")
    assert [r["id"] for r in _rows(sc)] == [1, 3]
    events = [e for _, e in _row_events(sc) if e.commit_ts == ts]
    assert [e.op for e in events] == [Op.DELETE, Op.INSERT, Op.UPDATE]
    assert all(e.new_values() != {"id": 9, "a": None} for _, e in _row_events(sc))


def test_dispatch_is_stable_and_the_stream_deterministic() -> None:
    def script() -> Scenario:
        sc = _scenario(partitions=3)
        for i in range(20):
            sc.insert("s", "t", id=i, a=str(i))
        for i in range(0, 20, 3):
            sc.update("s", "t", {"id": i}, a="u")
        return sc

    one, two = script(), script()
    assert one.messages() == two.messages()
    by_key: dict[int, set[int]] = {}
    for partition, e in _row_events(one):
        by_key.setdefault(e.new_values()["id"], set()).add(partition)
    assert all(len(p) == 1 for p in by_key.values())
    assert len({p for ps in by_key.values() for p in ps}) == 3  # the keys spread over the partitions


@pytest.mark.parametrize("protocol,options,ddl_partitions,resolved", [
    ("open-protocol", {}, [0, 1, 2], True),
    ("craft", {}, [0, 1, 2], True),
    ("canal-json", {"enable-tidb-extension": "true"}, [0], True),
    ("canal-json", {}, [0], False),
    ("avro", {}, [], False),
])
def test_where_ddl_and_resolved_ts_go(protocol: str, options: dict[str, str], ddl_partitions: list[int],
                                      resolved: bool) -> None:
    sc = _scenario(protocol, options, partitions=3)
    sc.insert("s", "t", id=1)
    ts = sc.ddl(f"ALTER TABLE {T} ADD COLUMN `c` INT")
    sc.resolved()
    records = sc.records()
    ddl = [m.partition for m in records if m.kind == "ddl" and m.events[0].commit_ts == ts]
    assert ddl == ddl_partitions
    resolved_parts = [m.partition for m in records if m.kind == "resolved"]
    assert resolved_parts == ([0, 1, 2] * 2 if resolved else [])  # resolved() and the end
    # the DDL is a barrier: rows committed before it are written before it on every partition
    first_ddl = next((i for i, m in enumerate(records) if m.kind == "ddl" and m.events[0].commit_ts == ts), None)
    if first_ddl is not None:
        rows_before = [i for i, m in enumerate(records) if m.kind == "rows" and m.events[0].commit_ts < ts]
        assert all(i < first_ddl for i in rows_before)


@pytest.mark.parametrize("protocol,options", PROTOCOLS, ids=[f"{p}-{'-'.join(o.values()) or 'plain'}"
                                                             for p, o in PROTOCOLS])
def test_every_message_decodes_to_its_events(protocol: str, options: dict[str, str]) -> None:
    sc = _play(_scenario(protocol, options, partitions=3))
    dec = decoder_for(protocol, options, schemas=sc.schemas)
    has_ts = protocol != "avro" and (protocol != "canal-json" or options)
    kinds = set()
    for offset, m in enumerate(sc.records()):
        decoded = dec.decode(m.key, m.value, DecodeContext("scn", m.partition, offset))
        assert len(decoded) == len(m.events), m
        for got, want in zip(decoded, m.events):
            kinds.add(want.kind)
            assert got.kind == want.kind
            if want.kind == "row":
                # Avro without the extension cannot tell an update from an insert (no _tidb_op)
                op_known = protocol != "avro" or options or want.op == Op.DELETE
                assert (got.schema, got.table, got.op if op_known else None, got.new_values()) == \
                    (want.schema, want.table, want.op if op_known else None, want.new_values())
                assert [(c.name, c.value) for c in got.columns or got.old or ()] == \
                    [(c.name, c.value) for c in want.columns or want.old or ()] or protocol == "avro"
                if protocol != "avro":
                    assert got.old_values() == want.old_values()
                if has_ts:
                    assert got.commit_ts == want.commit_ts
            elif want.kind == "ddl":
                assert (got.query, got.commit_ts if has_ts else None) == \
                    (want.query, want.commit_ts if has_ts else None)
            else:
                assert got.commit_ts == want.commit_ts
    assert "row" in kinds


def test_avro_renders_enum_and_set_as_labels_in_events_and_oracle() -> None:
    sc = Scenario("avro", {}, partitions=1, topic="scn")
    sc.ddl("CREATE DATABASE `s`")
    sc.ddl("CREATE TABLE `s`.`e` (`id` INT NOT NULL, `e` ENUM('a','b'), `st` SET('x','y'), PRIMARY KEY (`id`))")
    sc.insert("s", "e", id=1, e="b", st="x,y")
    assert _row_events(sc)[0][1].new_values() == {"id": 1, "e": "b", "st": "x,y"}
    assert sc.oracle().tables["s.e"].rows == [{"id": 1, "e": "b", "st": "x,y"}]
    other = Scenario("open-protocol", {}, partitions=1)
    other.ddl("CREATE DATABASE `s`")
    other.ddl("CREATE TABLE `s`.`e` (`id` INT NOT NULL, `e` ENUM('a','b'), `st` SET('x','y'), PRIMARY KEY (`id`))")
    other.insert("s", "e", id=1, e="b", st="x,y")
    assert other.oracle().tables["s.e"].rows == [{"id": 1, "e": 2, "st": 3}]


def test_take_returns_the_stream_in_parts() -> None:
    sc = _scenario()
    sc.insert("s", "t", id=1)
    first = sc.take()
    sc.insert("s", "t", id=2)
    rest = sc.rest()
    assert first and rest and first + rest == sc.messages()
