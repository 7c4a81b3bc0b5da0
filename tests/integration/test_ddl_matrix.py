"""The DDL matrix end to end: a scripted upstream → real broker → real Spark job → Delta == expected state.

Each matrix row is a *case*: a script over its own database (``mx_<case>``) in three phases — setup
(tables and rows before the DDL), change (the DDL under test) and after (rows after it). All cases play
into one scenario (:class:`~ticdc_delta.simulator.scenario.Scenario`), phase by phase, so one job run
covers the whole matrix; the scenario's model says what every table must hold afterwards, and each case
is its own test against that run:

- the Delta table of every upstream table exists, with exactly the upstream's columns (names, and the
  Delta type each column's TiDB type maps to: a widened DECIMAL is a wider Delta decimal) and rows;
- a table that is gone upstream (dropped, renamed away) is gone from Delta, or kept as it was when the
  DDL came where the policy keeps it (``drop_table`` / ``drop_database``: ``ignore``, the defaults).

The matrix runs twice (Open Protocol): once in one micro-batch (rows on both sides of every DDL in the
same batch), once with a ``max_offsets_per_trigger`` chosen so that, for every case, the rows before the
DDL, the DDL and the rows after it land in three different micro-batches (checked on the computed batch
plan before the run). Canal-JSON (TiDB extension) and Craft run a subset once; Avro (no DDL on the wire)
checks that an added column and a widened DECIMAL are picked up from new schema versions. The policy
tests check ``fail``, ``ignore`` and ``unknown: ignore``.

Column order is not asserted: Delta does not mirror FIRST/AFTER.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pyarrow as pa
import pytest

from ticdc_delta.config import config_from_mapping
from ticdc_delta.delta.arrow_types import TypeParams, arrow_type_for
from ticdc_delta.delta.sink import TableIdent
from ticdc_delta.errors import DDLPolicyError
from ticdc_delta.simulator.oracle import Oracle, TableOracle
from ticdc_delta.simulator.scenario import Scenario, ScenarioMessage
from ticdc_delta.verify import compare_with_oracle
from tests.integration.conftest import job_engine

pytestmark = pytest.mark.integration

SETUP, CHANGE, AFTER = "setup", "change", "after"


def _t(schema: str, table: str) -> str:
    return f"`{schema}`.`{table}`"


def _create(sc: Scenario, s: str, table: str, body: str, options: str = "") -> None:
    sc.ddl(f"CREATE TABLE {_t(s, table)} ({body}){options}")


# ------------------------------------------------------------------------------------------ the cases


@dataclass(frozen=True)
class Case:
    """One matrix row: ``script(sc, schema, phase)`` plays each phase; ``check`` adds assertions."""

    name: str
    script: Callable[[Scenario, str, str], None]
    check: Callable[["Run", str], None] | None = None

    @property
    def schema(self) -> str:
        return f"mx_{self.name}"


def _create_table(sc: Scenario, s: str, phase: str) -> None:
    if phase == CHANGE:
        _create(sc, s, "t",
                "`id` BIGINT NOT NULL, `name` VARCHAR(20), `price` DECIMAL(10,2), `qty` INT UNSIGNED, "
                "`big` BIGINT UNSIGNED, `ratio` DOUBLE, `f32` FLOAT, `born` DATE, `at` DATETIME(3), "
                "`ts` TIMESTAMP NULL, `dur` TIME, `yr` YEAR, `kind` ENUM('a','b','c'), `tags` SET('x','y','z'), "
                "`doc` JSON, `raw` BLOB, `bits` BIT(8), `code` CHAR(4), `bin` VARBINARY(8), PRIMARY KEY (`id`)")
    elif phase == AFTER:
        sc.insert(s, "t", id=1, name="ünï", price="12.5", qty=4294967295, big=18446744073709551615, ratio=-2.5,
                  f32=0.75, born="2024-02-29", at="2024-01-02 03:04:05.123", ts="2024-01-02 03:04:05",
                  dur="12:34:56", yr=2024, kind="b", tags="x,z", doc='{"a": 1}', raw=b"\x00\xff", bits=5,
                  code="ab", bin=b"\x01\x02")
        sc.insert(s, "t", id=2)
        sc.insert(s, "t", id=3, name="gone")
        sc.update(s, "t", {"id": 2}, name="two", price="-0.01", kind="c")
        sc.delete(s, "t", id=3)


def _create_table_composite_pk(sc: Scenario, s: str, phase: str) -> None:
    if phase == CHANGE:
        _create(sc, s, "t", "`region` VARCHAR(8) NOT NULL, `seq` INT UNSIGNED NOT NULL, `v` VARCHAR(10), "
                            "PRIMARY KEY (`region`, `seq`)")
    elif phase == AFTER:
        sc.insert(s, "t", region="eu", seq=1, v="a")
        sc.insert(s, "t", region="us", seq=1, v="b")
        sc.insert(s, "t", region="eu", seq=2, v="c")
        sc.update(s, "t", {"region": "eu", "seq": 1}, v="a2")
        sc.update(s, "t", {"region": "us", "seq": 1}, seq=5)  # a key change: DELETE + INSERT
        sc.delete(s, "t", region="eu", seq=2)


def _create_table_unique_key(sc: Scenario, s: str, phase: str) -> None:
    if phase == CHANGE:
        _create(sc, s, "t", "`id` INT, `code` VARCHAR(10) NOT NULL, `v` INT, UNIQUE KEY `uk_code` (`code`)")
    elif phase == AFTER:
        sc.insert(s, "t", id=1, code="A", v=1)
        sc.insert(s, "t", id=2, code="B", v=2)
        sc.insert(s, "t", id=3, code="C", v=3)
        sc.update(s, "t", {"code": "A"}, v=10)
        sc.update(s, "t", {"code": "B"}, code="B2")
        sc.delete(s, "t", code="C")


def _create_table_like(sc: Scenario, s: str, phase: str) -> None:
    if phase == SETUP:
        _create(sc, s, "src", "`id` INT NOT NULL, `a` VARCHAR(10), `d` DECIMAL(8,3), PRIMARY KEY (`id`)")
        sc.insert(s, "src", id=1, a="x", d="1.5")
        sc.insert(s, "src", id=2, a="y")
    elif phase == CHANGE:
        sc.ddl(f"CREATE TABLE {_t(s, 'dst')} LIKE {_t(s, 'src')}")
        sc.ddl(f"CREATE TABLE {_t(s, 'dst_empty')} LIKE {_t(s, 'src')}")
    else:
        sc.insert(s, "dst", id=1, a="copy", d="2.25")
        sc.insert(s, "dst", id=5, a="five")
        sc.update(s, "src", {"id": 2}, d="9.999")


def _drop_table(sc: Scenario, s: str, phase: str) -> None:
    if phase == SETUP:
        for name in ("t", "keep"):
            _create(sc, s, name, "`id` INT NOT NULL, `a` VARCHAR(10), PRIMARY KEY (`id`)")
        sc.insert(s, "t", id=1, a="x")
        sc.insert(s, "t", id=2, a="y")
        sc.insert(s, "keep", id=1, a="k")
    elif phase == CHANGE:
        sc.ddl(f"DROP TABLE {_t(s, 't')}")
    else:
        sc.insert(s, "keep", id=2, a="k2")
        sc.update(s, "keep", {"id": 1}, a="k1")


def _truncate_table(sc: Scenario, s: str, phase: str) -> None:
    if phase == SETUP:
        _create(sc, s, "t", "`id` INT NOT NULL, `a` VARCHAR(10), PRIMARY KEY (`id`)")
        for i in (1, 2, 3):
            sc.insert(s, "t", id=i, a=f"old{i}")
    elif phase == CHANGE:
        sc.ddl(f"TRUNCATE TABLE {_t(s, 't')}")
    else:
        sc.insert(s, "t", id=2, a="new2")  # a key the truncated table had
        sc.insert(s, "t", id=4, a="new4")


def _rename_table(sc: Scenario, s: str, phase: str) -> None:
    if phase == SETUP:
        for name in ("a", "x"):
            _create(sc, s, name, "`id` INT NOT NULL, `v` VARCHAR(10), PRIMARY KEY (`id`)")
        for i in (1, 2, 3):
            sc.insert(s, "a", id=i, v=f"a{i}")
        sc.insert(s, "x", id=1, v="x1")
    elif phase == CHANGE:
        sc.ddl(f"RENAME TABLE {_t(s, 'a')} TO {_t(s, 'b')}")
        sc.ddl(f"ALTER TABLE {_t(s, 'x')} RENAME TO {_t(s, 'y')}")
    else:
        sc.insert(s, "b", id=4, v="b4")
        sc.update(s, "b", {"id": 1}, v="b1")  # a row written under the old name
        sc.delete(s, "b", id=2)
        sc.update(s, "y", {"id": 1}, v="y1")


def _rename_tables(split: bool) -> Callable[[Scenario, str, str], None]:
    def script(sc: Scenario, s: str, phase: str) -> None:
        if phase == SETUP:
            for name in ("a", "c"):
                _create(sc, s, name, "`id` INT NOT NULL, `v` VARCHAR(10), PRIMARY KEY (`id`)")
            sc.insert(s, "a", id=1, v="a1")
            sc.insert(s, "a", id=2, v="a2")
            sc.insert(s, "c", id=1, v="c1")
        elif phase == CHANGE:
            sc.ddl(f"RENAME TABLE {_t(s, 'a')} TO {_t(s, 'b')}, {_t(s, 'c')} TO {_t(s, 'd')}", split_renames=split)
        else:
            sc.insert(s, "b", id=3, v="b3")
            sc.update(s, "b", {"id": 1}, v="b1")
            sc.delete(s, "d", id=1)
            sc.insert(s, "d", id=2, v="d2")

    return script


def _rename_table_swap(sc: Scenario, s: str, phase: str) -> None:
    """The gh-ost / pt-osc cut-over: the shadow table takes the original's name in one statement."""
    if phase == SETUP:
        _create(sc, s, "t", "`id` INT NOT NULL, `v` VARCHAR(10), PRIMARY KEY (`id`)")
        _create(sc, s, "t_new", "`id` INT NOT NULL, `v` VARCHAR(10), `extra` INT, PRIMARY KEY (`id`)")
        sc.insert(s, "t", id=1, v="old1")
        sc.insert(s, "t", id=2, v="old2")
        sc.insert(s, "t_new", id=1, v="new1", extra=10)
        sc.insert(s, "t_new", id=3, v="new3", extra=30)
    elif phase == CHANGE:
        sc.ddl(f"RENAME TABLE {_t(s, 't')} TO {_t(s, 't_old')}, {_t(s, 't_new')} TO {_t(s, 't')}")
    else:
        sc.insert(s, "t", id=4, v="new4", extra=40)
        sc.update(s, "t", {"id": 1}, v="new1b")
        sc.delete(s, "t", id=3)
        sc.update(s, "t_old", {"id": 2}, v="old2b")


def _two_rows(sc: Scenario, s: str, body: str = "`id` INT NOT NULL, `a` VARCHAR(10), PRIMARY KEY (`id`)") -> None:
    _create(sc, s, "t", body)
    sc.insert(s, "t", id=1, a="x")
    sc.insert(s, "t", id=2, a="y")


def _add_column(sc: Scenario, s: str, phase: str) -> None:
    if phase == SETUP:
        _two_rows(sc, s)
    elif phase == CHANGE:
        sc.ddl(f"ALTER TABLE {_t(s, 't')} ADD COLUMN `c` INT")
    else:
        sc.update(s, "t", {"id": 1}, c=5)
        sc.insert(s, "t", id=3, a="z", c=7)


def _add_column_default(sc: Scenario, s: str, phase: str) -> None:
    if phase == SETUP:
        _two_rows(sc, s)
    elif phase == CHANGE:
        sc.ddl(f"ALTER TABLE {_t(s, 't')} ADD COLUMN `c` VARCHAR(10) NOT NULL DEFAULT 'x'")
        sc.ddl(f"ALTER TABLE {_t(s, 't')} ADD COLUMN `d` DECIMAL(6,2) DEFAULT 1.5")
        # existing rows read the moment of the DDL (its commit ts), later inserts their own
        sc.ddl(f"ALTER TABLE {_t(s, 't')} ADD COLUMN `at` DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)")
    else:
        sc.insert(s, "t", id=3, a="z")
        sc.update(s, "t", {"id": 1}, a="x1", c="y")


def _add_column_not_null(sc: Scenario, s: str, phase: str) -> None:
    if phase == SETUP:
        _two_rows(sc, s)
    elif phase == CHANGE:
        # NOT NULL without DEFAULT: existing rows read the type's zero value (TiDB's origin default)
        sc.ddl(f"ALTER TABLE {_t(s, 't')} ADD COLUMN `n` INT NOT NULL")
        sc.ddl(f"ALTER TABLE {_t(s, 't')} ADD COLUMN `s` VARCHAR(10) NOT NULL")
    else:
        sc.insert(s, "t", id=3, a="z", n=3, s="three")
        sc.update(s, "t", {"id": 1}, n=1)


def _add_columns_positions(sc: Scenario, s: str, phase: str) -> None:
    if phase == SETUP:
        _two_rows(sc, s)
    elif phase == CHANGE:
        sc.ddl(f"ALTER TABLE {_t(s, 't')} ADD COLUMN (`a1` INT, `a2` VARCHAR(5) DEFAULT 'q')")
        sc.ddl(f"ALTER TABLE {_t(s, 't')} ADD COLUMN `f0` INT FIRST, ADD COLUMN `f1` BIGINT DEFAULT 9 AFTER `id`")
    else:
        sc.insert(s, "t", id=3, a="z", f0=1, a1=2)
        sc.update(s, "t", {"id": 2}, a2="r")


def _drop_column(sc: Scenario, s: str, phase: str) -> None:
    if phase == SETUP:
        _create(sc, s, "t", "`id` INT NOT NULL, `a` VARCHAR(10), `v` VARCHAR(10), PRIMARY KEY (`id`)")
        sc.insert(s, "t", id=1, a="x", v="gone1")
        sc.insert(s, "t", id=2, a="y", v="gone2")
    elif phase == CHANGE:
        sc.ddl(f"ALTER TABLE {_t(s, 't')} DROP COLUMN `v`")
    else:
        sc.insert(s, "t", id=3, a="z")
        sc.update(s, "t", {"id": 1}, a="x1")


def _check_drop_column_history(run: "Run", s: str) -> None:
    """The dropped column's values stay in the table's Delta history."""
    from deltalake import DeltaTable

    dt = DeltaTable(run.cfg.table_path(s, "t"))
    for version in range(dt.version() - 1, -1, -1):
        dt.load_as_version(version)
        if "v" in [f.name for f in dt.schema().fields]:
            values = pa.table(dt.scan(columns=["v"])).column("v").to_pylist()
            if {"gone1", "gone2"} <= set(values):
                return
    pytest.fail("no earlier Delta version of the table holds the dropped column's values")


def _rename_column(sc: Scenario, s: str, phase: str) -> None:
    if phase == SETUP:
        _two_rows(sc, s)
    elif phase == CHANGE:
        sc.ddl(f"ALTER TABLE {_t(s, 't')} RENAME COLUMN `a` TO `b`")
    else:
        sc.update(s, "t", {"id": 1}, b="x2")
        sc.insert(s, "t", id=3, b="z")


def _change_column(sc: Scenario, s: str, phase: str) -> None:
    if phase == SETUP:
        _create(sc, s, "t", "`id` INT NOT NULL, `a` INT, `c` VARCHAR(10), PRIMARY KEY (`id`)")
        sc.insert(s, "t", id=1, a=5, c="p")
        sc.insert(s, "t", id=2, a=6, c="q")
    elif phase == CHANGE:
        sc.ddl(f"ALTER TABLE {_t(s, 't')} CHANGE COLUMN `a` `b` BIGINT")  # rename and widen
        sc.ddl(f"ALTER TABLE {_t(s, 't')} CHANGE COLUMN `c` `c` VARCHAR(50)")  # same name
    else:
        sc.insert(s, "t", id=3, b=1 << 40, c="a much longer text than ten")
        sc.update(s, "t", {"id": 1}, b=-(1 << 50))


def _modify_int_bigint(sc: Scenario, s: str, phase: str) -> None:
    if phase == SETUP:
        _create(sc, s, "t", "`id` INT NOT NULL, `v` INT, PRIMARY KEY (`id`)")
        sc.insert(s, "t", id=1, v=2147483647)
        sc.insert(s, "t", id=2, v=-5)
    elif phase == CHANGE:
        sc.ddl(f"ALTER TABLE {_t(s, 't')} MODIFY COLUMN `v` BIGINT")
        sc.ddl(f"ALTER TABLE {_t(s, 't')} MODIFY COLUMN `id` BIGINT NOT NULL")  # the key column too
    else:
        sc.insert(s, "t", id=1 << 40, v=1 << 62)
        sc.update(s, "t", {"id": 1}, v=1 << 35)


def _modify_varchar_length(sc: Scenario, s: str, phase: str) -> None:
    if phase == SETUP:
        _create(sc, s, "t", "`id` INT NOT NULL, `s` VARCHAR(5), PRIMARY KEY (`id`)")
        sc.insert(s, "t", id=1, s="abcde")
        sc.insert(s, "t", id=2, s="ü")
    elif phase == CHANGE:
        sc.ddl(f"ALTER TABLE {_t(s, 't')} MODIFY COLUMN `s` VARCHAR(50)")
    else:
        sc.insert(s, "t", id=3, s="x" * 50)
        sc.update(s, "t", {"id": 1}, s="abcdefghij")


def _modify_decimal(sc: Scenario, s: str, phase: str) -> None:
    if phase == SETUP:
        _create(sc, s, "t", "`id` INT NOT NULL, `d` DECIMAL(6,2), PRIMARY KEY (`id`)")
        sc.insert(s, "t", id=1, d="1.5")
        sc.insert(s, "t", id=2, d="-9999.99")
    elif phase == CHANGE:
        sc.ddl(f"ALTER TABLE {_t(s, 't')} MODIFY COLUMN `d` DECIMAL(12,4)")
    else:
        sc.insert(s, "t", id=3, d="12345678.1234")
        sc.update(s, "t", {"id": 1}, d="2.0001")


def _modify_float_double(sc: Scenario, s: str, phase: str) -> None:
    if phase == SETUP:
        _create(sc, s, "t", "`id` INT NOT NULL, `f` FLOAT, PRIMARY KEY (`id`)")
        sc.insert(s, "t", id=1, f=1.5)
        sc.insert(s, "t", id=2, f=0.1)  # stored as the single-precision 0.10000000149011612
    elif phase == CHANGE:
        sc.ddl(f"ALTER TABLE {_t(s, 't')} MODIFY COLUMN `f` DOUBLE")
    else:
        sc.insert(s, "t", id=3, f=0.1)
        sc.update(s, "t", {"id": 1}, f=1e300)


def _modify_to_text(sc: Scenario, s: str, phase: str) -> None:
    """Columns that become VARCHAR keep their old values as TiDB prints them: the column's fractional
    digits, TIMESTAMP in the source zone, numbers in full (a FLOAT with its single-precision digits)."""
    cols = {"dt": "DATETIME(3)", "ts": "TIMESTAMP(2) NULL", "f": "FLOAT", "db": "DOUBLE", "i": "INT",
            "dec": "DECIMAL(6,2)", "day": "DATE"}
    if phase == SETUP:
        _create(sc, s, "t", "`id` INT NOT NULL, " + ", ".join(f"`{c}` {t}" for c, t in cols.items())
                + ", PRIMARY KEY (`id`)")
        sc.insert(s, "t", id=1, dt="2024-01-02 03:04:05.120", ts="2024-06-30 23:59:59.50", f=0.1, db=1e20, i=-5,
                  dec="1.50", day="2024-02-29")
        sc.insert(s, "t", id=2, dt="1999-12-31 00:00:00.000", ts="2024-01-01 00:00:00.00", f=3.4028234e38,
                  db=1e-7, i=0, dec="-0.01", day="0001-01-01")
        sc.insert(s, "t", id=3)
    elif phase == CHANGE:
        sc.ddl(f"ALTER TABLE {_t(s, 't')} " + ", ".join(f"MODIFY COLUMN `{c}` VARCHAR(64)" for c in cols))
    else:
        sc.insert(s, "t", id=4, dt="later", f="2.5")
        sc.update(s, "t", {"id": 1}, db="x")


def _virtual_generated(sc: Scenario, s: str, phase: str) -> None:
    """TiCDC's rows leave VIRTUAL generated columns out (STORED ones they carry): no Delta column holds
    one, whatever DDL names it later; a STORED one is an ordinary column."""
    if phase == SETUP:
        _create(sc, s, "t", "`id` INT NOT NULL, `a` INT, `v` INT AS (`a` * 2), `g` INT AS (`a` + 1) STORED, "
                            "PRIMARY KEY (`id`)")
        sc.insert(s, "t", id=1, a=1, g=2)
        sc.insert(s, "t", id=2, a=5, g=6)
    elif phase == CHANGE:
        t = _t(s, "t")
        sc.ddl(f"ALTER TABLE {t} ADD COLUMN `w` VARCHAR(9) GENERATED ALWAYS AS (CONCAT(`a`, 'x')), "
               "ADD COLUMN `n` INT DEFAULT 7")
        sc.ddl(f"ALTER TABLE {t} MODIFY COLUMN `v` BIGINT AS (`a` * 3) VIRTUAL")
        sc.ddl(f"ALTER TABLE {t} RENAME COLUMN `w` TO `w2`")
        sc.ddl(f"ALTER TABLE {t} DROP COLUMN `v`")
    else:
        sc.insert(s, "t", id=3, a=9, g=10, n=1)
        sc.update(s, "t", {"id": 1}, a=2, g=3)


def _modify_narrower(sc: Scenario, s: str, phase: str) -> None:
    """Less precision in the same Delta type: TiDB rounds the stored values (half up, carrying into the
    seconds, the day, the year) and DOUBLE → FLOAT rounds to a single."""
    if phase == SETUP:
        _create(sc, s, "t", "`id` INT NOT NULL, `dt` DATETIME(6), `ts` TIMESTAMP(3) NULL, `tm` TIME(6), `d` DOUBLE, "
                            "PRIMARY KEY (`id`)")
        sc.insert(s, "t", id=1, dt="2024-12-31 23:59:59.995000", ts="2024-06-30 12:00:00.500", tm="-00:00:00.050000",
                  d=0.1)
        sc.insert(s, "t", id=2, dt="1969-12-31 23:59:59.004999", ts="2024-06-30 12:00:00.499", tm="12:34:56.789012",
                  d=1e300 / 1e290)
        sc.insert(s, "t", id=3)
    elif phase == CHANGE:
        t = _t(s, "t")
        sc.ddl(f"ALTER TABLE {t} MODIFY COLUMN `dt` DATETIME(2), MODIFY COLUMN `ts` TIMESTAMP NULL")
        sc.ddl(f"ALTER TABLE {t} MODIFY COLUMN `tm` TIME(1)")
        sc.ddl(f"ALTER TABLE {t} MODIFY COLUMN `d` FLOAT")
    else:
        sc.insert(s, "t", id=4, dt="2000-01-01 00:00:00.12", ts="2000-01-01 00:00:01", tm="01:02:03.4", d=2.5)
        sc.update(s, "t", {"id": 2}, d=0.2)


def _set_drop_default(sc: Scenario, s: str, phase: str) -> None:
    if phase == SETUP:
        _create(sc, s, "t", "`id` INT NOT NULL, `c` VARCHAR(5) DEFAULT 'a', `d` INT DEFAULT 5, PRIMARY KEY (`id`)")
        sc.insert(s, "t", id=1)
    elif phase == CHANGE:
        sc.ddl(f"ALTER TABLE {_t(s, 't')} ALTER COLUMN `c` SET DEFAULT 'z'")
        sc.ddl(f"ALTER TABLE {_t(s, 't')} ALTER COLUMN `d` DROP DEFAULT")
    else:
        sc.insert(s, "t", id=2)  # c = 'z', d = NULL
        sc.update(s, "t", {"id": 1}, c="b")


def _add_primary_key(sc: Scenario, s: str, phase: str) -> None:
    if phase == SETUP:
        _create(sc, s, "t", "`id` INT NOT NULL, `v` VARCHAR(10)")  # no key: keyed by every column
        sc.insert(s, "t", id=1, v="a")
        sc.insert(s, "t", id=2, v="b")
        sc.update(s, "t", {"id": 1}, v="a2")
    elif phase == CHANGE:
        sc.ddl(f"ALTER TABLE {_t(s, 't')} ADD PRIMARY KEY (`id`)")
    else:
        sc.update(s, "t", {"id": 2}, v="b2")
        sc.insert(s, "t", id=3, v="c")
        sc.delete(s, "t", id=1)
        sc.update(s, "t", {"id": 3}, id=4)


def _widen_primary_key(sc: Scenario, s: str, phase: str) -> None:
    if phase == SETUP:
        # TiDB drops only a NONCLUSTERED primary key (a clustered one is the row's storage key)
        _create(sc, s, "t", "`id` INT NOT NULL, `region` VARCHAR(8) NOT NULL, `v` INT, PRIMARY KEY (`id`) NONCLUSTERED")
        sc.insert(s, "t", id=1, region="eu", v=1)
        sc.insert(s, "t", id=2, region="eu", v=2)
    elif phase == CHANGE:
        sc.ddl(f"ALTER TABLE {_t(s, 't')} DROP PRIMARY KEY, ADD PRIMARY KEY (`id`, `region`) NONCLUSTERED")
    else:
        sc.insert(s, "t", id=1, region="us", v=3)  # the same id: only the new key tells the rows apart
        sc.update(s, "t", {"id": 2, "region": "eu"}, v=20)


def _drop_primary_key(sc: Scenario, s: str, phase: str) -> None:
    if phase == SETUP:
        _create(sc, s, "t", "`id` INT NOT NULL, `code` VARCHAR(8) NOT NULL, `v` INT, PRIMARY KEY (`id`) NONCLUSTERED, "
                            "UNIQUE KEY `uk` (`code`)")
        sc.insert(s, "t", id=1, code="A", v=1)
        sc.insert(s, "t", id=2, code="B", v=2)
    elif phase == CHANGE:
        sc.ddl(f"ALTER TABLE {_t(s, 't')} DROP PRIMARY KEY")  # the handle key becomes `code`
    else:
        sc.update(s, "t", {"code": "A"}, id=10)
        sc.insert(s, "t", id=2, code="D", v=4)  # id 2 again: only `code` identifies rows now


def _add_unique_index(sc: Scenario, s: str, phase: str) -> None:
    if phase == SETUP:
        _create(sc, s, "t", "`code` VARCHAR(8) NOT NULL, `v` INT")
        sc.insert(s, "t", code="A", v=1)
        sc.insert(s, "t", code="B", v=2)
    elif phase == CHANGE:
        sc.ddl(f"ALTER TABLE {_t(s, 't')} ADD UNIQUE INDEX `uk` (`code`)")
    else:
        sc.update(s, "t", {"code": "A"}, v=10)
        sc.update(s, "t", {"code": "B"}, code="B2")
        sc.insert(s, "t", code="C", v=3)


def _create_drop_database(sc: Scenario, s: str, phase: str) -> None:
    if phase == SETUP:
        _two_rows(sc, s)
    elif phase == CHANGE:
        sc.ddl(f"DROP DATABASE `{s}`")
        sc.ddl(f"CREATE DATABASE `{s}`")
        _create(sc, s, "t2", "`id` INT NOT NULL, `a` VARCHAR(10), PRIMARY KEY (`id`)")
    else:
        sc.insert(s, "t2", id=1, a="again")


def _no_op_index(sc: Scenario, s: str, phase: str) -> None:
    if phase == SETUP:
        _create(sc, s, "t", "`id` INT NOT NULL, `v` INT, `w` INT, PRIMARY KEY (`id`)")
        sc.insert(s, "t", id=1, v=1, w=1)
        sc.insert(s, "t", id=2, v=2, w=2)
    elif phase == CHANGE:
        t = _t(s, "t")
        sc.ddl(f"CREATE INDEX `idx_v` ON {t} (`v`)")
        sc.ddl(f"ALTER TABLE {t} ADD INDEX `idx_vw` (`v`, `w`)")
        sc.ddl(f"ALTER TABLE {t} RENAME INDEX `idx_vw` TO `idx_vw2`")
        sc.ddl(f"DROP INDEX `idx_v` ON {t}")
        sc.ddl(f"ALTER TABLE {t} COMMENT = 'hello'")
    else:
        sc.update(s, "t", {"id": 1}, v=10)
        sc.insert(s, "t", id=3, v=3, w=3)


def _no_op_partition(sc: Scenario, s: str, phase: str) -> None:
    if phase == SETUP:
        _create(sc, s, "p", "`id` INT NOT NULL, `v` INT, PRIMARY KEY (`id`)",
                " PARTITION BY RANGE (`id`) (PARTITION `p0` VALUES LESS THAN (100))")
        sc.insert(s, "p", id=1, v=1)
        sc.insert(s, "p", id=2, v=2)
    elif phase == CHANGE:
        sc.ddl(f"ALTER TABLE {_t(s, 'p')} ADD PARTITION (PARTITION `p1` VALUES LESS THAN (200))")
    else:
        sc.insert(s, "p", id=150, v=150)
        sc.update(s, "p", {"id": 1}, v=10)


def _no_op_view_sequence_tiflash(sc: Scenario, s: str, phase: str) -> None:
    if phase == SETUP:
        _two_rows(sc, s)
    elif phase == CHANGE:
        sc.ddl(f"CREATE VIEW {_t(s, 'v')} AS SELECT `id`, `a` FROM {_t(s, 't')}")
        sc.ddl(f"CREATE SEQUENCE {_t(s, 'seq')} START WITH 1")
        sc.ddl(f"ALTER TABLE {_t(s, 't')} SET TIFLASH REPLICA 1")
        sc.ddl(f"DROP VIEW {_t(s, 'v')}")
        sc.ddl(f"DROP SEQUENCE {_t(s, 'seq')}")
    else:
        sc.update(s, "t", {"id": 1}, a="x1")
        sc.insert(s, "t", id=3, a="z")


MATRIX: list[Case] = [
    Case("create_table", _create_table),
    Case("create_table_composite_pk", _create_table_composite_pk),
    Case("create_table_unique_key", _create_table_unique_key),
    Case("create_table_like", _create_table_like),
    Case("drop_table", _drop_table),
    Case("truncate_table", _truncate_table),
    Case("rename_table", _rename_table),
    Case("rename_tables_multi", _rename_tables(split=True)),
    Case("rename_tables_one_query", _rename_tables(split=False)),
    Case("rename_table_swap", _rename_table_swap),
    Case("add_column", _add_column),
    Case("add_column_default", _add_column_default),
    Case("add_column_not_null", _add_column_not_null),
    Case("add_columns_positions", _add_columns_positions),
    Case("drop_column", _drop_column, _check_drop_column_history),
    Case("rename_column", _rename_column),
    Case("change_column", _change_column),
    Case("modify_int_bigint", _modify_int_bigint),
    Case("modify_varchar_length", _modify_varchar_length),
    Case("modify_decimal", _modify_decimal),
    Case("modify_float_double", _modify_float_double),
    Case("modify_to_text", _modify_to_text),
    Case("modify_narrower", _modify_narrower),
    Case("virtual_generated", _virtual_generated),
    Case("set_drop_default", _set_drop_default),
    Case("add_primary_key", _add_primary_key),
    Case("widen_primary_key", _widen_primary_key),
    Case("drop_primary_key", _drop_primary_key),
    Case("add_unique_index", _add_unique_index),
    Case("create_drop_database", _create_drop_database),
    Case("no_op_index", _no_op_index),
    Case("no_op_partition", _no_op_partition),
    Case("no_op_view_sequence_tiflash", _no_op_view_sequence_tiflash),
]
CASES = {c.name: c for c in MATRIX}

# What Canal-JSON and Craft run: one case per kind of change.
PROTOCOL_SUBSET = ["create_table_like", "truncate_table", "rename_table", "add_column_default", "drop_column",
                   "rename_column", "modify_decimal", "widen_primary_key", "no_op_index"]


# ------------------------------------------------------------------------------------------ the runs


@dataclass
class Built:
    """A scenario played from cases, with the commit ts of each case's DDL under test."""

    scenario: Scenario
    cases: list[Case]
    ddl_ts: dict[str, set[int]] = field(default_factory=dict)


def _build(cases: list[Case], protocol: str, options: dict[str, str], topic: str, partitions: int = 2) -> Built:
    """Phase by phase over every case: setups, resolved, changes, resolved, afters (then the end)."""
    sc = Scenario(protocol, options, partitions=partitions, topic=topic)
    built = Built(sc, cases)
    for case in cases:
        sc.ddl(f"CREATE DATABASE `{case.schema}`")
        case.script(sc, case.schema, SETUP)
        sc.flush()  # each case's rows in messages of their own
    sc.resolved()
    for case in cases:
        before = len(sc.ddl_log)
        case.script(sc, case.schema, CHANGE)
        built.ddl_ts[case.name] = {e.commit_ts for e in sc.ddl_log[before:]}
    sc.resolved()
    for case in cases:
        case.script(sc, case.schema, AFTER)
        sc.flush()
    return built


def _batch_of_each(records: list[ScenarioMessage], partitions: int, limit: int | None) -> list[int]:
    """The micro-batch each message lands in, by the job's own planning rule (all produced up front)."""
    from ticdc_delta.spark.kafka_source import plan_end_offsets

    offsets: list[int] = []
    counts = [0] * partitions
    for m in records:
        offsets.append(counts[m.partition])
        counts[m.partition] += 1
    latest = {("t", p): counts[p] for p in range(partitions)}
    start = {("t", p): 0 for p in range(partitions)}
    ends: list[dict[tuple[str, int], int]] = []
    while start != latest:
        end = plan_end_offsets(start, latest, limit)
        ends.append(end)
        start = end
    out = []
    for m, off in zip(records, offsets):
        out.append(next(i for i, e in enumerate(ends) if off < e[("t", m.partition)]))
    return out


def _phase_batches(built: Built, batches: list[int], partition: int | None = None
                   ) -> dict[str, tuple[list[int], list[int], list[int]]]:
    """Per case: batches of the rows before its DDL, of the DDL's copies, of the rows after it (only the
    messages of ``partition`` when given)."""
    out: dict[str, tuple[list[int], list[int], list[int]]] = {}
    records = built.scenario.records()
    for case in built.cases:
        ts = built.ddl_ts[case.name]
        lo, hi = min(ts), max(ts)
        before: list[int] = []
        ddl: list[int] = []
        after: list[int] = []
        for m, b in zip(records, batches):
            if partition is not None and m.partition != partition:
                continue
            for e in m.events:
                if e.kind == "ddl" and e.commit_ts in ts:
                    ddl.append(b)
                elif e.kind == "row" and e.schema == case.schema:
                    (before if e.commit_ts < lo else after if e.commit_ts > hi else ddl).append(b)
        out[case.name] = (before, ddl, after)
    return out


def _separated(phases: dict[str, tuple[list[int], list[int], list[int]]]) -> bool:
    return all((not before or not ddl or max(before) < min(ddl)) and (not after or not ddl or max(ddl) < min(after))
               for before, ddl, after in phases.values())


def _separating_limit(built: Built, *, per_partition: bool = False) -> int:
    """The largest max_offsets_per_trigger that puts, for every case, the rows before the DDL, the DDL
    and the rows after it in three different micro-batches — over all partitions, or (``per_partition``,
    for Canal-JSON whose DDL is on partition 0 only) within each partition."""
    records = built.scenario.records()
    partitions = built.scenario.partitions
    for limit in range(len(records) // 2, 1, -1):
        batches = _batch_of_each(records, partitions, limit)
        if per_partition:
            ok = all(_separated(_phase_batches(built, batches, p)) for p in range(partitions))
        else:
            ok = _separated(_phase_batches(built, batches))
        if ok:
            return limit
    raise AssertionError("no max_offsets_per_trigger separates every case's DDL from its rows")


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class Run:
    """One job run over a built scenario: the config, the sink, and what happened."""

    built: Built
    cfg: Any
    sink: Any
    batches: int | None
    error: BaseException | None
    logs: list[logging.LogRecord]
    limit: int | None

    @property
    def scenario(self) -> Scenario:
        return self.built.scenario

    def messages(self) -> list[str]:
        return [r.getMessage() for r in self.logs if r.name != "ticdc_delta.progress"]


@pytest.fixture(scope="module")
def job_logs() -> Iterator[_Collect]:
    from tests.integration.conftest import capture_logs

    with capture_logs("ticdc_delta", _Collect()) as handler:
        yield handler  # type: ignore[misc]


def _produce(broker: Any, topic: str, partitions: int, messages: list[tuple[int, bytes | None, bytes | None]],
             *, create: bool = True) -> None:
    from ticdc_delta.local_broker import wait_for_high_watermarks

    if create:
        broker.create_topic(topic, partitions)
    broker.produce_many(topic, messages)
    counts: dict[tuple[str, int], int] = defaultdict(int)
    for p, _, _ in messages:
        counts[(topic, p)] += 1
    wait_for_high_watermarks(broker.bootstrap_servers, dict(counts))


def _config(tmp: Path, broker: Any, topic: str, protocol: str, options: dict[str, str], *,
            limit: int | None, ddl: dict[str, str] | None = None, **source: Any) -> Any:
    src: dict[str, Any] = {"bootstrap_servers": broker.bootstrap_servers, "topic": topic, "protocol": protocol,
                           "options": options, **source}
    if limit is not None:
        src["max_offsets_per_trigger"] = limit
    data: dict[str, Any] = {"changefeed": "ddl-matrix", "source": src, "sink": {"path": str(tmp / "lake"), "engine": job_engine()},
                            "checkpoint": str(tmp / "ckpt")}
    if ddl:
        data["ddl"] = ddl
    return config_from_mapping(data)


def _run(built: Built, broker: Any, spark: Any, tmp: Path, logs: _Collect, *, limit: int | None,
         ddl: dict[str, str] | None = None) -> Run:
    sc = built.scenario
    topic = sc.topic or "ddl-matrix"
    _produce(broker, topic, sc.partitions, sc.messages())
    cfg = _config(tmp, broker, topic, sc.protocol, sc.options, limit=limit, ddl=ddl)
    return _run_job(built, cfg, spark, logs, limit=limit)


def _run_job(built: Built, cfg: Any, spark: Any, logs: _Collect, *, limit: int | None) -> Run:
    """One ``run --once`` of the job over the produced scenario; an exception is kept for the checks."""
    from ticdc_delta.spark.batch_handler import _ConfiguredSink
    from ticdc_delta.spark.job import run_job

    first = len(logs.records)
    batches: int | None = None
    error: BaseException | None = None
    try:
        batches = run_job(cfg, once=True, spark=spark)
    except Exception as exc:  # noqa: BLE001 - each case's test reports it
        error = exc
    return Run(built, cfg, _ConfiguredSink(cfg), batches, error, logs.records[first:], limit)


# ------------------------------------------------------------------------------------------ checks


def _plain(t: pa.DataType) -> pa.DataType:
    if t in (pa.string_view(), pa.large_string()):
        return pa.string()
    if t in (pa.binary_view(), pa.large_binary()):
        return pa.binary()
    return t


def _sub_oracle(run: Run, tables: dict[str, TableOracle]) -> Oracle:
    sc = run.scenario
    return Oracle(sc.protocol, sc.options, 0, sc.partitions, tables)


def _assert_table(run: Run, t: TableOracle, *, what: str = "") -> None:
    """The Delta table of ``t`` exists with exactly its columns (names and Delta types) and rows."""
    label = f"{what}{t.qualified}"
    schema = run.sink.table_schema(TableIdent(t.schema, t.table))
    assert schema is not None, f"{label}: no Delta table at {run.cfg.table_path(t.schema, t.table)}"
    have = {f.name.lower(): _plain(f.type) for f in schema}
    want = {c.name.lower(): arrow_type_for(c.type, c.flags, TypeParams(c.precision, c.scale, c.enum_members))
            for c in t.columns}
    assert sorted(have) == sorted(want), f"{label}: Delta columns {sorted(have)}, upstream {sorted(want)}"
    wrong = {n: f"{have[n]} (want {want[n]})" for n in want if have[n] != want[n]}
    assert not wrong, f"{label}: Delta column types differ: {wrong}"
    diffs = compare_with_oracle(run.sink, _sub_oracle(run, {t.qualified: t}), tz=run.cfg.sink.source_timezone)
    bad = [d.describe() for d in diffs if not d.ok]
    assert not bad, f"{label}: " + "\n".join(bad)


def _kept(run: Run, reason: str) -> bool:
    """Whether the job's policy keeps a table that ``reason`` (a policy class) removed upstream."""
    return getattr(run.cfg.ddl, reason) in ("ignore", "fail")


def _check_schemas(run: Run, schemas: set[str]) -> None:
    """Every upstream table of ``schemas`` matches; every gone one is gone (or kept as it was)."""
    if run.error is not None:
        raise AssertionError(f"the job failed: {type(run.error).__name__}: {run.error}") from run.error
    oracle = run.scenario.oracle()
    tables = [t for t in oracle.tables.values() if t.schema in schemas]
    gone = [g for g in run.scenario.gone.values() if g.schema in schemas]
    assert tables or gone, f"no tables in {sorted(schemas)}"
    for t in tables:
        _assert_table(run, t)
    for g in gone:
        if _kept(run, g.reason):
            _assert_table(run, g.last, what=f"kept after {g.reason} (policy {getattr(run.cfg.ddl, g.reason)}): ")
        else:
            path = run.cfg.table_path(g.schema, g.table)
            assert run.sink.table_schema(TableIdent(g.schema, g.table)) is None, (
                f"{g.schema}.{g.table} is gone upstream ({g.reason}) but its Delta table is still at {path}"
            )


def _check_case(run: Run, case: Case) -> None:
    _check_schemas(run, {case.schema})
    if case.check is not None:
        case.check(run, case.schema)


def _check_cases(run: Run, cases: list[Case]) -> None:
    """Every case checked; one assertion naming each case that failed."""
    failures = []
    for case in cases:
        try:
            _check_case(run, case)
        except AssertionError as exc:
            failures.append(f"[{case.name}] {exc}")
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------------------------------ the matrix


@pytest.fixture(scope="module", params=["one_batch", "tiny_batches"])
def matrix_run(request: pytest.FixtureRequest, broker: Any, spark: Any, tmp_path_factory: pytest.TempPathFactory,
               job_logs: _Collect) -> Run:
    mode = request.param
    topic = f"ddl-matrix-{mode}-{uuid.uuid4().hex[:8]}".replace("_", "-")
    built = _build(MATRIX, "open-protocol", {}, topic)
    limit = None if mode == "one_batch" else _separating_limit(built)
    run = _run(built, broker, spark, tmp_path_factory.mktemp(mode), job_logs, limit=limit)
    if run.error is None:
        if mode == "one_batch":
            assert run.batches == 1, f"expected one micro-batch, the job ran {run.batches}"
        else:
            assert run.batches is not None and run.batches >= 3
    return run


@pytest.mark.parametrize("case", [c.name for c in MATRIX])
def test_ddl_matrix(matrix_run: Run, case: str) -> None:
    _check_case(matrix_run, CASES[case])


def test_tiny_batches_separate_every_ddl_from_its_rows() -> None:
    """The harness's own promise: the tiny-batch run puts each DDL between batches (no Spark needed)."""
    built = _build(MATRIX, "open-protocol", {}, "plan-check")
    limit = _separating_limit(built)
    records = built.scenario.records()
    phases = _phase_batches(built, _batch_of_each(records, built.scenario.partitions, limit))
    for name, (before, ddl, after) in phases.items():
        assert ddl, f"{name}: no DDL message"
        assert after, f"{name}: no rows after the DDL"
        if before:
            assert max(before) < min(ddl), name
        assert max(ddl) < min(after), name
    assert sum(1 for _, _, a in phases.values() if a) == len(MATRIX)
    assert max(_batch_of_each(records, built.scenario.partitions, None)) == 0  # the other mode: one batch


# ------------------------------------------------------------------------------------------ protocols


@pytest.mark.parametrize("protocol,options", [
    ("canal-json", {"enable-tidb-extension": "true"}),
    ("craft", {"max-batch-size": "4"}),
])
def test_protocol_ddl_cases(protocol: str, options: dict[str, str], broker: Any, spark: Any, tmp_path: Path,
                            job_logs: _Collect) -> None:
    """A subset of the matrix on Canal-JSON (DDL on partition 0 only) and Craft, DDL between batches."""
    topic = f"ddl-{protocol}-{uuid.uuid4().hex[:8]}"
    cases = [CASES[name] for name in PROTOCOL_SUBSET]
    built = _build(cases, protocol, options, topic)
    limit = _separating_limit(built, per_partition=protocol == "canal-json")
    run = _run(built, broker, spark, tmp_path, job_logs, limit=limit)
    _check_cases(run, cases)


def test_avro_schema_evolution(broker: Any, spark: Any, tmp_path: Path, job_logs: _Collect) -> None:
    """Avro carries no DDL: an added column and a widened DECIMAL arrive as new schema versions, and the
    Delta table follows them. The job runs before and after the change (a registry only knows a version
    once TiCDC has written it). Through a Schema Registry, where ids grow with versions — local schema
    files have content-derived ids, whose order says nothing about which version is newer."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    from ticdc_delta.codec.avro import AvroSchemas
    from ticdc_delta.delta.ddl_replay import DDLReplayer
    from ticdc_delta.spark.batch_handler import BatchHandler, _ConfiguredSink
    from ticdc_delta.spark.job import run_job

    topic = f"ddl-avro-{uuid.uuid4().hex[:8]}"
    url = f"mock://{topic}"
    schemas = AvroSchemas.from_registry(SchemaRegistryClient.new_client({"url": url}))
    options = {"enable-tidb-extension": "true"}
    sc = Scenario("avro", options, partitions=2, topic=topic, schemas=schemas)
    s, t = "av", _t("av", "t")
    sc.ddl(f"CREATE DATABASE `{s}`")
    _create(sc, s, "t", "`id` INT NOT NULL, `a` VARCHAR(10), `d` DECIMAL(6,2), `n` INT, PRIMARY KEY (`id`)")
    sc.insert(s, "t", id=1, a="x", d="1.5", n=1)
    sc.insert(s, "t", id=2, a="y", d="-9999.99", n=2)
    sc.insert(s, "t", id=3, a="z", d="0.01", n=3)
    sc.delete(s, "t", id=3)
    first_part = sc.take()
    cfg = _config(tmp_path, broker, topic, "avro", options, limit=None, schema_registry={"url": url})

    def handler() -> Any:
        return BatchHandler(cfg, avro_schema_source=schemas, ddl_handler=DDLReplayer(cfg.ddl))

    _produce(broker, topic, 2, first_part)
    assert run_job(cfg, once=True, spark=spark, handler=handler()) >= 1
    sink = _ConfiguredSink(cfg)
    before = sink.table_schema(TableIdent(s, "t"))
    assert before is not None and before.field("d").type == pa.decimal128(6, 2)

    # The DDL reaches no Kafka message; the next rows' images carry the new schema.
    sc.ddl(f"ALTER TABLE {t} ADD COLUMN `c` VARCHAR(10)")
    sc.ddl(f"ALTER TABLE {t} MODIFY COLUMN `d` DECIMAL(12,4)")
    sc.ddl(f"ALTER TABLE {t} MODIFY COLUMN `n` BIGINT")
    sc.insert(s, "t", id=4, a="w", d="12345678.1234", n=1 << 40, c="new")
    sc.update(s, "t", {"id": 1}, a="x1", c="c1")
    rest = sc.rest()
    assert not any(m.kind == "ddl" for m in sc.records())
    _produce(broker, topic, 2, rest, create=False)
    run_job(cfg, once=True, spark=spark, handler=handler())
    run = Run(Built(sc, []), cfg, sink, None, None, [], None)
    _check_schemas(run, {s})
    after = sink.table_schema(TableIdent(s, "t"))
    assert after is not None and after.field("d").type == pa.decimal128(12, 4)


# ------------------------------------------------------------------------------------------ policies


def _policy_scenario(topic: str) -> tuple[Scenario, dict[str, int]]:
    """One database per policy under test; returns the scenario and the commit ts of each DDL."""
    sc = Scenario("open-protocol", {}, partitions=2, topic=topic)
    ts: dict[str, int] = {}
    for s in ("p_drop_column", "p_unknown", "p_drop_table", "p_drop_database"):
        sc.ddl(f"CREATE DATABASE `{s}`")
        _create(sc, s, "t", "`id` INT NOT NULL, `a` VARCHAR(10), `v` VARCHAR(10), PRIMARY KEY (`id`)")
        for i in (1, 2, 3):
            sc.insert(s, "t", id=i, a=f"a{i}", v=f"v{i}")
    _create(sc, "p_drop_table", "other", "`id` INT NOT NULL, PRIMARY KEY (`id`)")
    sc.resolved()
    ts["drop_column"] = sc.ddl(f"ALTER TABLE {_t('p_drop_column', 't')} DROP COLUMN `v`")
    ts["unknown"] = sc.ddl(f"ALTER TABLE {_t('p_unknown', 't')} FROBNICATE THE WIDGETS")
    ts["drop_table"] = sc.ddl(f"DROP TABLE {_t('p_drop_table', 't')}")
    ts["drop_database"] = sc.ddl("DROP DATABASE `p_drop_database`")
    sc.resolved()
    sc.insert("p_drop_column", "t", id=4, a="a4")
    sc.update("p_drop_column", "t", {"id": 1}, a="a1b")
    sc.insert("p_unknown", "t", id=4, a="a4", v="v4")
    sc.update("p_unknown", "t", {"id": 1}, v="v1b")
    sc.insert("p_drop_table", "other", id=1)
    return sc, ts


IGNORE_POLICIES = {"drop_column": "ignore", "unknown": "ignore", "drop_table": "evolve", "drop_database": "evolve"}


@pytest.fixture(scope="module")
def policy_run(broker: Any, spark: Any, tmp_path_factory: pytest.TempPathFactory, job_logs: _Collect) -> Run:
    sc, ts = _policy_scenario(f"ddl-policies-{uuid.uuid4().hex[:8]}")
    run = _run(Built(sc, []), broker, spark, tmp_path_factory.mktemp("policies"), job_logs, limit=None,
               ddl=IGNORE_POLICIES)
    run.built.ddl_ts = {k: {v} for k, v in ts.items()}
    return run


def _logged(run: Run, query: str, ts: int) -> bool:
    return any(query in m or repr(query) in m or str(ts) in m for m in run.messages())


def test_drop_column_ignore_keeps_the_column(policy_run: Run) -> None:
    run = policy_run
    assert run.error is None, f"the job failed: {run.error!r}"
    s = "p_drop_column"
    (ts,) = run.built.ddl_ts["drop_column"]
    query = f"ALTER TABLE {_t(s, 't')} DROP COLUMN `v`"
    assert _logged(run, query, ts), f"nothing logged about the ignored DDL {query!r} (commit ts {ts})"
    schema = run.sink.table_schema(TableIdent(s, "t"))
    assert schema is not None and "v" in schema.names, "ddl.drop_column: ignore must keep the column"
    # the upstream columns match (the kept column is extra) ...
    t = run.scenario.oracle().tables[f"{s}.t"]
    diffs = compare_with_oracle(run.sink, _sub_oracle(run, {t.qualified: t}))
    assert all(d.ok for d in diffs), [d.describe() for d in diffs]
    # ... and the kept column still holds what rows untouched since the drop had; new rows have none
    rows = {r["id"]: r["v"] for r in run.sink.read(TableIdent(s, "t")).to_pylist()}
    assert rows[2] == "v2" and rows[3] == "v3"
    assert rows[4] is None


def test_unknown_ignore_skips_an_unparseable_ddl(policy_run: Run) -> None:
    run = policy_run
    (ts,) = run.built.ddl_ts["unknown"]
    _check_schemas(run, {"p_unknown"})
    assert _logged(run, "FROBNICATE THE WIDGETS", ts), "nothing logged about the ignored unknown DDL"


def test_drop_table_evolve_drops_the_delta_table(policy_run: Run) -> None:
    _check_schemas(policy_run, {"p_drop_table"})
    assert policy_run.scenario.gone["p_drop_table.t"].reason == "drop_table"
    assert policy_run.sink.table_schema(TableIdent("p_drop_table", "t")) is None


def test_drop_database_evolve_drops_its_tables(policy_run: Run) -> None:
    _check_schemas(policy_run, {"p_drop_database"})
    assert policy_run.sink.table_schema(TableIdent("p_drop_database", "t")) is None


@pytest.mark.parametrize("cls", ["drop_column", "partition_data"])
def test_a_fail_policy_stops_the_job(cls: str, broker: Any, spark: Any, tmp_path: Path, job_logs: _Collect
                                     ) -> None:
    """``ddl.drop_column: fail``, and ``ddl.partition_data``'s default (``fail``: a TRUNCATE PARTITION
    removes rows without row events): a terminal DDLPolicyError naming the DDL and its commit ts — again on
    a re-run (the batch is not skipped), and the table is as it was before the DDL."""
    from ticdc_delta.spark.job import run_job

    topic = f"ddl-fail-{uuid.uuid4().hex[:8]}"
    sc = Scenario("open-protocol", {}, partitions=2, topic=topic)
    sc.ddl("CREATE DATABASE `f`")
    _create(sc, "f", "t", "`id` INT NOT NULL, `v` VARCHAR(10), PRIMARY KEY (`id`)",
            " PARTITION BY RANGE (`id`) (PARTITION `p0` VALUES LESS THAN (100))")
    sc.insert("f", "t", id=1, v="a")
    sc.resolved()
    query = (f"ALTER TABLE {_t('f', 't')} DROP COLUMN `v`" if cls == "drop_column"
             else f"ALTER TABLE {_t('f', 't')} TRUNCATE PARTITION `p0`")
    ts = sc.ddl(query)
    sc.insert("f", "t", id=2)
    run = _run(Built(sc, []), broker, spark, tmp_path, job_logs, limit=None,
               ddl={"drop_column": "fail"} if cls == "drop_column" else {})
    for attempt in range(2):
        if attempt:
            try:
                run_job(run.cfg, once=True, spark=spark)
                error: BaseException | None = None
            except Exception as exc:  # noqa: BLE001 - asserted below
                error = exc
        else:
            error = run.error
        assert isinstance(error, DDLPolicyError), f"attempt {attempt + 1}: expected DDLPolicyError, got {error!r}"
        assert str(ts) in str(error), f"the error does not name the commit ts {ts}: {error}"
        assert query in str(error), f"the error does not name the DDL {query!r}: {error}"
        assert f"ddl.{cls}: fail" in str(error), error
    schema = run.sink.table_schema(TableIdent("f", "t"))
    assert schema is not None and "v" in schema.names
    assert sorted(r["id"] for r in run.sink.read(TableIdent("f", "t")).to_pylist()) == [1]


# ------------------------------------------------------------------------------------------ a crash


@pytest.mark.parametrize("stage", ["before_state", "before_journal_entry_9", "after_journal_entry_9"])
def test_ddl_matrix_across_a_crash_after_the_delta_commits(stage: str, broker: Any, spark: Any, tmp_path: Path,
                                                          job_logs: _Collect, monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """The whole matrix in one micro-batch, and the job dies after some of its Delta commits: after all of
    them (before the state), or around the 9th table-level DDL (just before or just after its journal
    entry is written, the DDL not run). The re-run of the batch finds tables created, moved, dropped and
    altered, and must end in the same tables (no stale table under a name renamed away, no move refused,
    nothing twice)."""
    from ticdc_delta.delta.ddl_journal import DDLJournal
    from ticdc_delta.spark.batch_handler import FAULT_ENV, InjectedFault
    from ticdc_delta.spark.job import run_job

    topic = f"ddl-crash-{uuid.uuid4().hex[:8]}"
    built = _build(MATRIX, "open-protocol", {}, topic)
    sc = built.scenario
    _produce(broker, topic, sc.partitions, sc.messages())
    cfg = _config(tmp_path, broker, topic, sc.protocol, sc.options, limit=None)
    if stage == "before_state":
        monkeypatch.setenv(FAULT_ENV, f"{stage}@0")
    else:  # the journal's real save, with the fault on one side of it
        saves, real_save = [], DDLJournal.save

        def save(journal: DDLJournal, entry: Any) -> None:
            saves.append(entry.ddl_ordinal)
            if len(saves) == 9 and stage.startswith("before"):
                raise InjectedFault(f"injected fault at {stage} of batch 0")
            real_save(journal, entry)
            if len(saves) == 9:
                raise InjectedFault(f"injected fault at {stage} of batch 0")

        monkeypatch.setattr(DDLJournal, "save", save)
    with pytest.raises(InjectedFault, match=f"injected fault at {stage} of batch 0"):
        run_job(cfg, once=True, spark=spark)
    monkeypatch.delenv(FAULT_ENV, raising=False)
    monkeypatch.undo()
    run = _run_job(built, cfg, spark, job_logs, limit=None)
    _check_cases(run, MATRIX)
    assert run.batches == 1, f"the restart re-ran {run.batches} micro-batches, not the one"
