"""TiDB DDL strings (as TiDB restores them and TiCDC streams them) -> typed schema changes."""

from __future__ import annotations

import pickle
from dataclasses import FrozenInstanceError
from typing import NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ticdc_delta.codec.model import DDLType
from ticdc_delta.schema.ddl import (
    DDL_CLASSES,
    FIRST,
    AddColumns,
    AddPrimaryKey,
    AddUniqueKey,
    ColumnDef,
    ColumnPosition,
    CreateDatabase,
    CreateTable,
    DropColumn,
    DropDatabase,
    DropDefault,
    DropIndex,
    DropPrimaryKey,
    DropTable,
    ModifyColumn,
    NoOp,
    RenameColumn,
    RenameTable,
    SchemaChange,
    SetDefault,
    TruncateTable,
    Unknown,
    ddl_class,
    parse_ddl,
    quote_ident,
)
from ticdc_delta.schema.mysql_types import parse_column_type

S = "test"  # the event's schema, used for unqualified names


def col(name: str, type_text: str, **kwargs: object) -> ColumnDef:
    return ColumnDef(name, parse_column_type(type_text), **kwargs)  # type: ignore[arg-type]


def add(table: str, *columns: ColumnDef, positions: tuple[ColumnPosition | None, ...] | None = None) -> AddColumns:
    return AddColumns(S, table, columns, positions or (None,) * len(columns))


def noop(kind: str, reason: str, table: str = "t", schema: str = S, affects_data: bool = False) -> NoOp:
    return NoOp(kind, reason, schema, table, affects_data)


class Case(NamedTuple):
    id: str
    query: str
    expected: list[SchemaChange]
    ddl_type: int | None = None


CASES: list[Case] = [
    # ------------------------------------------------------------------ CREATE TABLE
    Case(
        "create-tidb-restored-clustered-pk",
        "CREATE TABLE `test`.`t1` (`id` INT(11) NOT NULL,`val` VARCHAR(16) DEFAULT NULL,PRIMARY KEY (`id`) "
        "/*T![clustered_index] CLUSTERED */) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
        [
            CreateTable(
                "test",
                "t1",
                (col("id", "int(11)", nullable=False), col("val", "varchar(16)", default="NULL")),
                ("id",),
            )
        ],
        DDLType.CREATE_TABLE,
    ),
    Case(
        # from TiDB's executor tests (SHOW CREATE TABLE output replayed)
        "create-tidb-show-create-defaults",
        "CREATE TABLE `t1`(`c1` bigint(20) NOT NULL DEFAULT '-2312745469307452950', `c2` datetime DEFAULT "
        "'5316-02-03 06:54:49', `c3` tinyblob DEFAULT NULL, PRIMARY KEY (`c1`) /*T![clustered_index] CLUSTERED */) "
        "ENGINE=InnoDB DEFAULT CHARSET=utf8 COLLATE=utf8_bin;",
        [
            CreateTable(
                S,
                "t1",
                (
                    col("c1", "bigint(20)", nullable=False, default="'-2312745469307452950'"),
                    col("c2", "datetime", default="'5316-02-03 06:54:49'"),
                    col("c3", "tinyblob", default="NULL"),
                ),
                ("c1",),
            )
        ],
    ),
    Case(
        "create-set-default-and-plain-keys",
        "CREATE TABLE `t2`(`c1` set('kn8pu','7et','vekx6') DEFAULT '7et,vekx6', `c2` float DEFAULT '1.683167', "
        "KEY `k1` (`c2`,`c1`), KEY `k2` (`c2`)) ENGINE=InnoDB DEFAULT CHARSET=gbk COLLATE=gbk_chinese_ci",
        [
            CreateTable(
                S,
                "t2",
                (col("c1", "set('kn8pu','7et','vekx6')", default="'7et,vekx6'"), col("c2", "float", default="'1.683167'")),
            )
        ],
    ),
    Case(
        "create-composite-pk-partition-by-list-columns",
        "CREATE TABLE `t` (`a` varchar(150) NOT NULL,`b` varchar(100) NOT NULL,`c` int NOT NULL DEFAULT '0',"
        "PRIMARY KEY (`a`,`b`) /*T![clustered_index] CLUSTERED */) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 "
        "COLLATE=utf8mb4_general_ci PARTITION BY LIST COLUMNS(`b`)(PARTITION `p0` VALUES IN ('0'),"
        "PARTITION `p1` VALUES IN ('1'),PARTITION `p2` VALUES IN ('2'))",
        [
            CreateTable(
                S,
                "t",
                (
                    col("a", "varchar(150)", nullable=False),
                    col("b", "varchar(100)", nullable=False),
                    col("c", "int", nullable=False, default="'0'"),
                ),
                ("a", "b"),
            )
        ],
    ),
    Case(
        "create-composite-pk-three-columns",
        "CREATE TABLE `t1` (`pk` varchar(32) NOT NULL, `sk` varchar(32) NOT NULL, `ts` timestamp(6) NOT NULL, "
        "`v` varchar(10240) DEFAULT NULL, PRIMARY KEY (`pk`,`sk`,`ts`) /*T![clustered_index] CLUSTERED */) "
        "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
        [
            CreateTable(
                S,
                "t1",
                (
                    col("pk", "varchar(32)", nullable=False),
                    col("sk", "varchar(32)", nullable=False),
                    col("ts", "timestamp(6)", nullable=False),
                    col("v", "varchar(10240)", default="NULL"),
                ),
                ("pk", "sk", "ts"),
            )
        ],
    ),
    Case(
        "create-prefix-pk",
        "CREATE TABLE `PK_TCOLLATION10197` (`COL1` char(1) NOT NULL, PRIMARY KEY (`COL1`(1)) "
        "/*T![clustered_index] CLUSTERED */) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
        [CreateTable(S, "PK_TCOLLATION10197", (col("COL1", "char(1)", nullable=False),), ("COL1",))],
    ),
    Case(
        "create-unique-keys-without-pk",
        "CREATE TABLE `test`.`uk_only` (`a` INT(11) NOT NULL,`b` VARCHAR(10) DEFAULT NULL,`c` INT(11) DEFAULT NULL,"
        "UNIQUE KEY `uk_a` (`a`),UNIQUE KEY `uk_bc` (`b`(5),`c`),KEY `idx_b` (`b`),UNIQUE KEY `uk_f` ((`c` + 1)))",
        [
            CreateTable(
                "test",
                "uk_only",
                (
                    col("a", "int(11)", nullable=False),
                    col("b", "varchar(10)", default="NULL"),
                    col("c", "int(11)", default="NULL"),
                ),
                (),
                (("a",), ("b", "c")),
            )
        ],
    ),
    Case(
        "create-inline-keys-auto-increment-auto-random",
        "CREATE TABLE t (id BIGINT /*T![auto_rand] AUTO_RANDOM(5) */ NOT NULL PRIMARY KEY /*T![clustered_index] "
        "NONCLUSTERED */, seq INT UNSIGNED AUTO_INCREMENT UNIQUE KEY COMMENT 'it''s a \"seq\"', "
        "r BIGINT AUTO_RANDOM(5, 54), CONSTRAINT `uq` UNIQUE INDEX `uq_r` (`r`) GLOBAL)",
        [
            CreateTable(
                S,
                "t",
                (
                    col("id", "bigint", nullable=False),
                    col("seq", "int unsigned", auto_increment=True, comment='it\'s a "seq"'),
                    col("r", "bigint"),
                ),
                ("id",),
                (("seq",), ("r",)),
            )
        ],
    ),
    Case(
        "create-named-constraint-primary-key-makes-columns-not-null",
        "CREATE TABLE t (a INT, b INT NULL, CONSTRAINT pk PRIMARY KEY (a, b DESC) NONCLUSTERED)",
        [CreateTable(S, "t", (col("a", "int", nullable=False), col("b", "int", nullable=False)), ("a", "b"))],
    ),
    Case(
        "create-generated-columns",
        "CREATE TABLE t (a INT, g INT GENERATED ALWAYS AS (a + 1) STORED, v INT AS (a * 2) VIRTUAL, s SERIAL, "
        "w INT GENERATED ALWAYS AS (a) NOT NULL)",
        [
            CreateTable(
                S,
                "t",
                (
                    col("a", "int"),
                    col("g", "int", generated=True),
                    col("v", "int", generated=True, virtual=True),
                    col("s", "serial", nullable=False, auto_increment=True),
                    col("w", "int", nullable=False, generated=True, virtual=True),  # (VIRTUAL: the default)
                ),
                (),
                (("s",),),
            )
        ],
    ),
    Case(
        "create-defaults-of-every-kind",
        "CREATE TABLE t (a INT DEFAULT -1, b DOUBLE DEFAULT 1.5e3, c DECIMAL(5,2) DEFAULT 1.50, d INT DEFAULT +5, "
        "e VARCHAR(9) DEFAULT 'a\\'b', f VARCHAR(9) DEFAULT 'a''b', g VARCHAR(4) DEFAULT \"dq\", h VARCHAR(3) DEFAULT '', "
        "i VARCHAR(5) DEFAULT _UTF8MB4'x', j VARCHAR(9) DEFAULT 'a\\\\b\\nc', "
        "k DATETIME DEFAULT now(), l TIMESTAMP DEFAULT CURRENT_TIMESTAMP, m TIMESTAMP(3) NOT NULL DEFAULT "
        "CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3), n DATETIME DEFAULT LOCALTIMESTAMP, "
        "o DATETIME(6) DEFAULT CURRENT_TIMESTAMP(), p DATE DEFAULT '2020-01-01', "
        "q BIT(3) DEFAULT b'101', r BIT(1) DEFAULT b'0', s BIT(8) DEFAULT 0x1F, u BLOB DEFAULT X'ab', "
        "v ENUM('x','y') DEFAULT 'y', w SET('a','b') DEFAULT 'a,b', x TINYINT(1) DEFAULT TRUE, y INT NULL DEFAULT NULL, "
        "z VARCHAR(36) DEFAULT (UUID()), zz INT DEFAULT '7', nd INT)",
        [
            CreateTable(
                S,
                "t",
                (
                    col("a", "int", default="-1"),
                    col("b", "double", default="1.5e3"),
                    col("c", "decimal(5,2)", default="1.50"),
                    col("d", "int", default="5"),
                    col("e", "varchar(9)", default="'a''b'"),
                    col("f", "varchar(9)", default="'a''b'"),
                    col("g", "varchar(4)", default="'dq'"),
                    col("h", "varchar(3)", default="''"),
                    col("i", "varchar(5)", default="'x'"),
                    col("j", "varchar(9)", default="'a\\\\b\\nc'"),
                    col("k", "datetime", default="CURRENT_TIMESTAMP"),
                    col("l", "timestamp", default="CURRENT_TIMESTAMP"),
                    col("m", "timestamp(3)", nullable=False, default="CURRENT_TIMESTAMP(3)"),
                    col("n", "datetime", default="CURRENT_TIMESTAMP"),
                    col("o", "datetime(6)", default="CURRENT_TIMESTAMP"),
                    col("p", "date", default="'2020-01-01'"),
                    col("q", "bit(3)", default="b'101'"),
                    col("r", "bit(1)", default="b'0'"),
                    col("s", "bit(8)", default="x'1F'"),
                    col("u", "blob", default="x'ab'"),
                    col("v", "enum('x','y')", default="'y'"),
                    col("w", "set('a','b')", default="'a,b'"),
                    col("x", "tinyint(1)", default="TRUE"),
                    col("y", "int", default="NULL"),
                    col("z", "varchar(36)", default="(UUID())"),
                    col("zz", "int", default="'7'"),
                    col("nd", "int"),  # no DEFAULT clause: None, unlike DEFAULT NULL
                ),
            )
        ],
    ),
    Case(
        "create-quoted-identifiers",
        "CREATE TABLE `my db`.`my tbl` (`select` INT NOT NULL, `my col` VARCHAR(3), `表` INT, `a``b` INT, "
        "`列 名` TEXT, PRIMARY KEY (`a``b`, `select`), UNIQUE KEY `唯一` (`表`))",
        [
            CreateTable(
                "my db",
                "my tbl",
                (
                    col("select", "int", nullable=False),
                    col("my col", "varchar(3)"),
                    col("表", "int"),
                    col("a`b", "int", nullable=False),
                    col("列 名", "text"),
                ),
                ("a`b", "select"),
                (("表",),),
            )
        ],
    ),
    Case(
        "create-keyword-column-names-unquoted",
        "CREATE TABLE t (text INT, long INT, year INT, json INT, status INT, comment INT, date DATE)",
        [
            CreateTable(
                S,
                "t",
                tuple(col(n, "int") for n in ("text", "long", "year", "json", "status", "comment")) + (col("date", "date"),),
            )
        ],
    ),
    Case(
        "create-like",
        "CREATE TABLE `test`.`t_copy` LIKE `other`.`t`",
        [CreateTable("test", "t_copy", like=("other", "t"))],
    ),
    Case("create-like-unqualified-parenthesised", "CREATE TABLE t2 (LIKE t1)", [CreateTable(S, "t2", like=(S, "t1"))]),
    Case(
        "create-if-not-exists-with-tidb-options",
        "CREATE TABLE IF NOT EXISTS `d`.`t` (a INT) /*T! SHARD_ROW_ID_BITS=4 PRE_SPLIT_REGIONS=2 */ "
        "/*T![placement] PLACEMENT POLICY=`p1` */",
        [CreateTable("d", "t", (col("a", "int"),), if_not_exists=True)],
    ),
    Case(
        "create-partition-by-hash-options-sqlglot-rejects",
        "CREATE TABLE `t` (`a` int(11) DEFAULT NULL) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin "
        "PARTITION BY HASH (`a`) PARTITIONS 4",
        [CreateTable(S, "t", (col("a", "int(11)", default="NULL"),))],
    ),
    Case(
        "create-partition-by-range",
        "CREATE TABLE t (id INT PRIMARY KEY) PARTITION BY RANGE (id) (PARTITION p0 VALUES LESS THAN (10), "
        "PARTITION p1 VALUES LESS THAN (MAXVALUE))",
        [CreateTable(S, "t", (col("id", "int", nullable=False),), ("id",))],
    ),
    Case(
        "create-with-ttl",
        "CREATE TABLE t (id INT PRIMARY KEY, created_at TIMESTAMP) TTL = `created_at` + INTERVAL 3 MONTH TTL_ENABLE = 'ON'",
        [CreateTable(S, "t", (col("id", "int", nullable=False), col("created_at", "timestamp")), ("id",))],
    ),
    Case(
        "create-temporary",
        "CREATE TEMPORARY TABLE tmp (a INT)",
        [noop("temporary_table", "TiCDC does not replicate temporary tables", "tmp")],
    ),
    Case("create-unsupported-column-type", "CREATE TABLE t (v INET)", [Unknown("CREATE TABLE t (v INET)", "unsupported column type 'INET'")]),
    Case(
        "create-with-vector",
        "CREATE TABLE t (id INT PRIMARY KEY, v VECTOR(3), w VECTOR)",
        [CreateTable(S, "t", (col("id", "int", nullable=False), col("v", "vector(3)"), col("w", "vector")), ("id",))],
    ),
    # ---------------------------------------------------------------- DROP / TRUNCATE / RENAME
    Case("drop-table", "DROP TABLE `test`.`t1`", [DropTable("test", "t1")], DDLType.DROP_TABLE),
    Case(
        "drop-tables-if-exists",
        "DROP TABLE IF EXISTS `test`.`t1`, `t2`, other.t3",
        [DropTable("test", "t1"), DropTable(S, "t2"), DropTable("other", "t3")],
    ),
    Case("drop-temporary-table", "DROP TEMPORARY TABLE t", [NoOp("temporary_table", "TiCDC does not replicate temporary tables")]),
    Case("truncate", "TRUNCATE TABLE `test`.`t1`", [TruncateTable("test", "t1")], DDLType.TRUNCATE_TABLE),
    Case("truncate-without-table-keyword", "TRUNCATE `t`", [TruncateTable(S, "t")]),
    Case("rename-one", "RENAME TABLE `test`.`a` TO `test`.`b`", [RenameTable("test", "a", "test", "b")], DDLType.RENAME_TABLE),
    Case(
        "rename-many",
        "RENAME TABLE a TO b, `db`.c TO `db2`.d, `a``x` TO `表`",
        [RenameTable(S, "a", S, "b"), RenameTable("db", "c", "db2", "d"), RenameTable(S, "a`x", S, "表")],
    ),
    Case("alter-rename-to", "ALTER TABLE t RENAME TO t9", [RenameTable(S, "t", S, "t9")]),
    Case("alter-rename-as", "ALTER TABLE t RENAME AS `x y`", [RenameTable(S, "t", S, "x y")]),
    Case("alter-rename-bare-qualified", "ALTER TABLE `a`.`t` RENAME `db2`.`t2`", [RenameTable("a", "t", "db2", "t2")]),
    # ------------------------------------------------------------------------- columns
    Case("add-column", "ALTER TABLE `test`.`t` ADD COLUMN `c` INT(11) DEFAULT 1", [AddColumns("test", "t", (col("c", "int(11)", default="1"),), (None,))]),
    Case("add-column-first", "ALTER TABLE t ADD COLUMN a INT FIRST", [add("t", col("a", "int"), positions=(FIRST,))]),
    Case(
        "add-column-after-quoted",
        "ALTER TABLE t ADD COLUMN a INT DEFAULT 1 NOT NULL COMMENT 'x' AFTER `b c`",
        [add("t", col("a", "int", nullable=False, default="1", comment="x"), positions=(ColumnPosition(after="b c"),))],
    ),
    Case("add-without-column-keyword", "ALTER TABLE t ADD a INT", [add("t", col("a", "int"))]),
    Case(
        "add-column-list-tidb-restored",
        "ALTER TABLE `test`.`t` ADD COLUMN (`a` INT(11) NOT NULL DEFAULT 0, `b` TEXT, `c` BIGINT UNIQUE)",
        [
            AddColumns(
                "test",
                "t",
                (col("a", "int(11)", nullable=False, default="0"), col("b", "text"), col("c", "bigint")),
                (None, None, None),
            ),
            AddUniqueKey("test", "t", None, ("c",)),
        ],
        DDLType.ADD_COLUMN,
    ),
    Case(
        "add-several-clauses-with-index",
        "ALTER TABLE t ADD COLUMN a INT, DROP COLUMN b, ADD INDEX i(c)",
        [add("t", col("a", "int")), DropColumn(S, "t", "b"), noop("index", "ADD INDEX")],
    ),
    Case(
        "add-column-primary-key-inline",
        "ALTER TABLE t ADD COLUMN id BIGINT AUTO_INCREMENT PRIMARY KEY FIRST",
        [
            add("t", col("id", "bigint", nullable=False, auto_increment=True), positions=(FIRST,)),
            AddPrimaryKey(S, "t", ("id",)),
        ],
    ),
    Case(
        "add-columns-quoted-identifiers",
        "ALTER TABLE `my tbl` ADD COLUMN `select` INT, ADD COLUMN `表` VARCHAR(3), ADD COLUMN `a``b` INT",
        [
            AddColumns(S, "my tbl", (col("select", "int"),), (None,)),
            AddColumns(S, "my tbl", (col("表", "varchar(3)"),), (None,)),
            AddColumns(S, "my tbl", (col("a`b", "int"),), (None,)),
        ],
    ),
    Case("add-column-if-not-exists", "ALTER TABLE t ADD COLUMN IF NOT EXISTS a INT", [add("t", col("a", "int"))]),
    Case("drop-column", "ALTER TABLE `test`.`t` DROP COLUMN `c`", [DropColumn("test", "t", "c")], DDLType.DROP_COLUMN),
    Case("drop-column-bare-if-exists", "ALTER TABLE t DROP a, DROP COLUMN IF EXISTS b", [DropColumn(S, "t", "a"), DropColumn(S, "t", "b")]),
    Case("rename-column", "ALTER TABLE t RENAME COLUMN a TO `b c`", [RenameColumn(S, "t", "a", "b c")]),
    Case(
        "change-column-renames-and-modifies",
        "ALTER TABLE `test`.`t` CHANGE COLUMN `a` `b` BIGINT(20) NOT NULL",
        [
            RenameColumn("test", "t", "a", "b"),
            ModifyColumn("test", "t", "b", col("b", "bigint(20)", nullable=False)),
        ],
        DDLType.MODIFY_COLUMN,
    ),
    Case(
        "change-column-same-name-is-modify-only",
        "ALTER TABLE t CHANGE `a` `a` BIGINT UNSIGNED DEFAULT 0 AFTER c",
        [ModifyColumn(S, "t", "a", col("a", "bigint unsigned", default="0"), ColumnPosition(after="c"))],
    ),
    Case(
        "change-column-case-only-rename",
        "ALTER TABLE t CHANGE a A INT",
        [RenameColumn(S, "t", "a", "A"), ModifyColumn(S, "t", "A", col("A", "int"))],
    ),
    Case("modify-widen-int", "ALTER TABLE t MODIFY COLUMN a BIGINT", [ModifyColumn(S, "t", "a", col("a", "bigint"))]),
    Case(
        "modify-widen-varchar-with-charset",
        "ALTER TABLE `t` MODIFY COLUMN `v` VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT ''",
        [ModifyColumn(S, "t", "v", col("v", "varchar(64) character set utf8mb4 collate utf8mb4_bin", nullable=False, default="''"))],
    ),
    Case(
        "modify-widen-decimal-first",
        "ALTER TABLE t MODIFY d DECIMAL(12,4) COMMENT 'widened' FIRST",
        [ModifyColumn(S, "t", "d", col("d", "decimal(12,4)", comment="widened"), FIRST)],
    ),
    Case("set-default-number", "ALTER TABLE t ALTER COLUMN a SET DEFAULT 5", [SetDefault(S, "t", "a", "5")], DDLType.SET_DEFAULT_VALUE),
    Case("set-default-string", "ALTER TABLE t ALTER a SET DEFAULT 'it''s'", [SetDefault(S, "t", "a", "'it''s'")]),
    Case("set-default-null", "ALTER TABLE t ALTER COLUMN a SET DEFAULT NULL", [SetDefault(S, "t", "a", "NULL")]),
    Case("set-default-bit", "ALTER TABLE t ALTER COLUMN b SET DEFAULT b'1'", [SetDefault(S, "t", "b", "b'1'")]),
    Case("set-default-enum-label", "ALTER TABLE t ALTER COLUMN e SET DEFAULT 'b,c'", [SetDefault(S, "t", "e", "'b,c'")]),
    Case("drop-default", "ALTER TABLE t ALTER COLUMN a DROP DEFAULT", [DropDefault(S, "t", "a")]),
    # --------------------------------------------------------------------------- keys
    Case("add-primary-key", "ALTER TABLE t ADD PRIMARY KEY (a, b)", [AddPrimaryKey(S, "t", ("a", "b"))], DDLType.ADD_PRIMARY_KEY),
    Case("add-primary-key-constraint-named", "ALTER TABLE t ADD CONSTRAINT `pk` PRIMARY KEY (`id`) NONCLUSTERED", [AddPrimaryKey(S, "t", ("id",))]),
    Case("drop-primary-key", "ALTER TABLE t DROP PRIMARY KEY", [DropPrimaryKey(S, "t")], DDLType.DROP_PRIMARY_KEY),
    Case("drop-index-primary", "DROP INDEX `PRIMARY` ON t", [DropPrimaryKey(S, "t")]),
    Case("add-unique-index", "ALTER TABLE t ADD UNIQUE INDEX uk (a)", [AddUniqueKey(S, "t", "uk", ("a",))], DDLType.ADD_INDEX),
    Case("add-unique-key-unnamed", "ALTER TABLE t ADD UNIQUE KEY (b, c)", [AddUniqueKey(S, "t", None, ("b", "c"))]),
    Case("add-constraint-unique", "ALTER TABLE t ADD CONSTRAINT uk UNIQUE (a)", [AddUniqueKey(S, "t", "uk", ("a",))]),
    Case("add-unique-prefix", "ALTER TABLE t ADD UNIQUE `uk` (`v`(10))", [AddUniqueKey(S, "t", "uk", ("v",))]),
    Case("add-unique-functional", "ALTER TABLE t ADD UNIQUE uk ((a + 1))", [noop("index", "ADD UNIQUE over an expression")]),
    Case("create-unique-index", "CREATE UNIQUE INDEX `uk` ON `d`.`t` (`a`(5), `b`)", [AddUniqueKey("d", "t", "uk", ("a", "b"))]),
    Case("create-index", "CREATE INDEX idx ON t (a)", [noop("index", "CREATE INDEX")], DDLType.ADD_INDEX),
    Case("drop-index-on", "DROP INDEX uk ON `d`.`t`", [DropIndex("d", "t", "uk")], DDLType.DROP_INDEX),
    Case("alter-drop-index-and-key", "ALTER TABLE t DROP INDEX uk, DROP KEY k2", [DropIndex(S, "t", "uk"), DropIndex(S, "t", "k2")]),
    Case(
        "index-ddl-noops",
        "ALTER TABLE t ADD KEY k (a), ADD FULLTEXT ft (b), ADD INDEX idx ((a+1)), RENAME INDEX k TO k3, ALTER INDEX k3 INVISIBLE",
        [
            noop("index", "ADD INDEX"),
            noop("index", "ADD INDEX"),
            noop("index", "ADD INDEX"),
            noop("index", "RENAME INDEX"),
            noop("index", "ALTER INDEX"),
        ],
    ),
    Case("vector-index", "ALTER TABLE t ADD VECTOR INDEX idx ((VEC_COSINE_DISTANCE(v))) USING HNSW", [noop("index", "ADD VECTOR INDEX")]),
    # TiDB 8.4+: VECTOR / COLUMNAR indexes inline in CREATE TABLE (sqlglot read one as a column VECTOR)
    Case(
        "create-with-vector-and-columnar-indexes",
        "CREATE TABLE `s`.`t` (VECTOR INDEX `i0`((VEC_L2_DISTANCE(`v`))), `id` INT NOT NULL, `v` VECTOR(3), "
        "PRIMARY KEY (`id`) /*T![clustered_index] CLUSTERED */, COLUMNAR INDEX `c`(`v`) USING INVERTED, "
        "VECTOR INDEX `idx`((VEC_COSINE_DISTANCE(`v`))) USING HNSW)",
        [CreateTable("s", "t", (col("id", "int", nullable=False), col("v", "vector(3)")), ("id",))],
    ),
    Case(
        "foreign-keys",
        "ALTER TABLE t ADD CONSTRAINT fk FOREIGN KEY (a) REFERENCES p(id), DROP FOREIGN KEY fk2",
        [noop("foreign_key", "ADD FOREIGN KEY"), noop("foreign_key", "DROP FOREIGN KEY")],
    ),
    # a column with its own CHECK, added without the COLUMN keyword: a column, not a check constraint
    Case(
        "add-column-with-its-check",
        "ALTER TABLE `s`.`t` ADD `c` INT CHECK (`c` >= 0) NOT NULL DEFAULT 5",
        [AddColumns("s", "t", (col("c", "int", nullable=False, default="5"),), (None,))],
    ),
    Case(
        "add-unnamed-constraint-check",
        "ALTER TABLE t ADD CONSTRAINT CHECK (a > 0)",
        [noop("check_constraint", "ADD CHECK constraint")],
    ),
    Case(
        "check-constraints",
        "ALTER TABLE t ADD CONSTRAINT c1 CHECK (a > 0), DROP CHECK c1, ALTER CONSTRAINT c2 NOT ENFORCED",
        [
            noop("check_constraint", "ADD CHECK constraint"),
            noop("check_constraint", "DROP CHECK constraint"),
            noop("check_constraint", "ALTER CHECK constraint"),
        ],
    ),
    # FLOAT UNSIGNED (deprecated in MySQL, kept by TiDB) is a FLOAT
    Case(
        "float-unsigned",
        "CREATE TABLE t (id INT PRIMARY KEY, f FLOAT UNSIGNED, g FLOAT(7,3) UNSIGNED)",
        [CreateTable(S, "t", (col("id", "int", nullable=False), col("f", "float"), col("g", "float(7,3)")), ("id",))],
    ),
    # ------------------------------------------------------------------------ partitions
    Case(
        "partition-add",
        "ALTER TABLE t ADD PARTITION (PARTITION p1 VALUES LESS THAN (100))",
        [noop("partition", "ADD PARTITION")],
        DDLType.ADD_TABLE_PARTITION,
    ),
    Case("partition-drop", "ALTER TABLE t DROP PARTITION p1, p2", [noop("partition", "DROP PARTITION", affects_data=True)]),
    Case("partition-truncate", "ALTER TABLE `t` TRUNCATE PARTITION `p0`", [noop("partition", "TRUNCATE PARTITION", affects_data=True)]),
    Case("partition-exchange", "ALTER TABLE t EXCHANGE PARTITION p1 WITH TABLE t2", [noop("partition", "EXCHANGE PARTITION", affects_data=True)]),
    Case("partition-coalesce", "ALTER TABLE t COALESCE PARTITION 2", [noop("partition", "COALESCE PARTITION")]),
    Case(
        "partition-reorganize",
        "ALTER TABLE t REORGANIZE PARTITION p1, p2 INTO (PARTITION p3 VALUES LESS THAN (5), PARTITION p4 VALUES LESS THAN (9))",
        [noop("partition", "REORGANIZE PARTITION")],
    ),
    Case("partition-by", "ALTER TABLE t PARTITION BY HASH(a) PARTITIONS 4", [noop("partition", "PARTITION BY")]),
    Case("partition-remove", "ALTER TABLE t REMOVE PARTITIONING", [noop("partition", "REMOVE PARTITIONING")]),
    Case("partition-add-count", "ALTER TABLE t ADD PARTITION PARTITIONS 2", [noop("partition", "ADD PARTITION")]),
    # --------------------------------------------------------------------- views, sequences
    Case(
        "create-view-tidb-restored",
        "CREATE ALGORITHM=UNDEFINED DEFINER=`root`@`%` SQL SECURITY DEFINER VIEW `test`.`v` (`a`) AS SELECT `a` FROM `test`.`t`",
        [noop("view", "CREATE VIEW", "v", "test")],
        DDLType.CREATE_VIEW,
    ),
    Case("create-or-replace-view", "CREATE OR REPLACE VIEW v AS SELECT 1", [noop("view", "CREATE VIEW", "v")]),
    Case("drop-view", "DROP VIEW IF EXISTS `test`.`v`", [noop("view", "DROP VIEW", "v")], DDLType.DROP_VIEW),
    Case(
        "create-sequence-tidb-restored",
        "CREATE SEQUENCE IF NOT EXISTS `test`.`seq` START WITH 1 INCREMENT BY 1 CACHE 1000 NOCYCLE ENGINE=InnoDB",
        [noop("sequence", "CREATE SEQUENCE", "seq")],
        DDLType.CREATE_SEQUENCE,
    ),
    Case("alter-sequence", "ALTER SEQUENCE `test`.`seq` RESTART WITH 100", [NoOp("sequence", "ALTER SEQUENCE")], DDLType.ALTER_SEQUENCE),
    Case("drop-sequence", "DROP SEQUENCE `test`.`seq`", [noop("sequence", "DROP SEQUENCE", "seq")], DDLType.DROP_SEQUENCE),
    # ------------------------------------------------------------------- TiDB table options
    Case("tiflash-replica", "ALTER TABLE `test`.`t` SET TIFLASH REPLICA 1", [noop("tiflash", "SET TIFLASH REPLICA")], DDLType.SET_TIFLASH_REPLICA),
    Case(
        "tiflash-replica-location-labels",
        "ALTER TABLE t SET TIFLASH REPLICA 2 LOCATION LABELS 'zone', 'rack'",
        [noop("tiflash", "SET TIFLASH REPLICA")],
    ),
    Case(
        "tiflash-then-add-column",
        "ALTER TABLE t SET TIFLASH REPLICA 1, ADD COLUMN c INT",
        [noop("tiflash", "SET TIFLASH REPLICA"), add("t", col("c", "int"))],
    ),
    Case("tiflash-database", "ALTER DATABASE `test` SET TIFLASH REPLICA 1", [NoOp("tiflash", "ALTER DATABASE (tiflash)")]),
    Case("shard-row-id-bits", "ALTER TABLE t SHARD_ROW_ID_BITS=4", [noop("table_option", "table option SHARD_ROW_ID_BITS")], DDLType.SHARD_ROW_ID),
    Case("rebase-auto-id", "ALTER TABLE t AUTO_INCREMENT = 100", [noop("auto_id", "table option AUTO_INCREMENT")], DDLType.REBASE_AUTO_ID),
    Case("rebase-auto-id-force", "ALTER TABLE t FORCE AUTO_INCREMENT = 100", [noop("table_option", "FORCE (table rebuild)"), noop("auto_id", "table option AUTO_INCREMENT=100")]),
    Case("auto-random-base", "ALTER TABLE t AUTO_RANDOM_BASE = 100", [noop("auto_id", "table option AUTO_RANDOM_BASE")]),
    Case("auto-id-cache", "ALTER TABLE t AUTO_ID_CACHE 100", [noop("auto_id", "table option AUTO_ID_CACHE")]),
    Case("table-comment", "ALTER TABLE t COMMENT = 'new comment'", [noop("comment", "table option COMMENT='new comment'")], DDLType.MODIFY_TABLE_COMMENT),
    Case(
        "table-charset",
        "ALTER TABLE t DEFAULT CHARSET=utf8mb4 COLLATE utf8mb4_bin",
        [noop("charset", "table option DEFAULT CHARACTER SET=utf8mb4"), noop("charset", "table option COLLATE=utf8mb4_bin")],
        DDLType.MODIFY_TABLE_CHARSET_AND_COLLATE,
    ),
    Case("table-convert-charset", "ALTER TABLE t CONVERT TO CHARACTER SET utf8mb4", [noop("charset", "CONVERT TO CHARACTER SET")]),
    Case("database-charset", "ALTER DATABASE d CHARACTER SET utf8mb4", [NoOp("charset", "ALTER DATABASE (charset)")], DDLType.MODIFY_SCHEMA_CHARSET_AND_COLLATE),
    Case("cache-table", "ALTER TABLE t CACHE", [noop("cache", "CACHE")]),
    Case("nocache-table", "ALTER TABLE t NOCACHE", [noop("cache", "NOCACHE")]),
    Case("placement-table", "ALTER TABLE t PLACEMENT POLICY=p1", [noop("placement", "placement policy")]),
    Case("placement-policy", "CREATE PLACEMENT POLICY p1 PRIMARY_REGION='us-east-1' REGIONS='us-east-1'", [NoOp("placement", "CREATE PLACEMENT POLICY")]),
    Case("ttl", "ALTER TABLE t TTL = `ts` + INTERVAL 1 DAY", [noop("ttl", "TTL")]),
    Case("ttl-remove", "ALTER TABLE t REMOVE TTL", [noop("ttl", "REMOVE TTL")]),
    Case(
        "lock-and-algorithm-are-not-changes",
        "ALTER TABLE t LOCK=NONE, ALGORITHM=INPLACE, ADD COLUMN z INT",
        [add("t", col("z", "int"))],
    ),
    Case("engine", "ALTER TABLE t ENGINE=InnoDB", [noop("table_option", "table option ENGINE=InnoDB")]),
    # ---------------------------------------------------------------------- databases
    Case("create-database", "CREATE DATABASE `test`", [CreateDatabase("test")], DDLType.CREATE_SCHEMA),
    Case("create-database-if-not-exists", "CREATE DATABASE IF NOT EXISTS `d` DEFAULT CHARACTER SET = utf8mb4", [CreateDatabase("d")]),
    Case("create-schema", "CREATE SCHEMA `表 库`", [CreateDatabase("表 库")]),
    Case("drop-database", "DROP DATABASE IF EXISTS `test`", [DropDatabase("test")], DDLType.DROP_SCHEMA),
    Case("drop-schema", "DROP SCHEMA s", [DropDatabase("s")]),
    # ---------------------------------------------------------------------- statement lists
    Case(
        "two-statements",
        "CREATE DATABASE a; CREATE TABLE a.t (id INT PRIMARY KEY);",
        [CreateDatabase("a"), CreateTable("a", "t", (col("id", "int", nullable=False),), ("id",))],
    ),
    Case("create-sequence-without-name", "CREATE SEQUENCE", [NoOp("sequence", "CREATE SEQUENCE")], DDLType.CREATE_SEQUENCE),
    # ------------------------------------------------------------------------- unknown
    Case("recover-table", "RECOVER TABLE t", [Unknown("RECOVER TABLE t", "RECOVER TABLE brings back a dropped object and its rows")], DDLType.RECOVER_TABLE),
    Case("flashback-table", "FLASHBACK TABLE t TO t2", [Unknown("FLASHBACK TABLE t TO t2", "FLASHBACK TABLE brings back a dropped object and its rows")]),
    Case("not-ddl", "SELECT 1", [Unknown("SELECT 1", "not a DDL statement this module knows (Select)")]),
    Case("empty", "  ", [Unknown("  ", "no statement in the query")]),
    Case(
        "unknown-clause-among-known",
        "ALTER TABLE t ADD COLUMN a INT, ADD COLUMN v INET",
        [add("t", col("a", "int")), Unknown("ALTER TABLE t ADD COLUMN a INT, ADD COLUMN v INET", "unsupported column type 'INET'")],
    ),
    Case(
        "add-vector-column",
        "ALTER TABLE t ADD COLUMN v VECTOR(768)",
        [add("t", col("v", "vector(768)"))],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_parse_ddl(case: Case) -> None:
    assert parse_ddl(case.query, default_schema=S, ddl_type=case.ddl_type) == case.expected


# Statements whose SQL cannot be classified: the DDL type decides between NoOp (DDL that never changes
# columns or keys) and Unknown. (query, ddl_type, expected NoOp kind or None for Unknown, affects_data)
UNCLASSIFIED_SQL = ["ALTER TABLE t SET HYPO-TIFLASH ???", "@@@ not sql", "ALTER TABLE t"]
DDL_TYPE_CASES: list[tuple[int | None, str | None, bool]] = [
    (DDLType.SET_TIFLASH_REPLICA, "tiflash", False),
    (DDLType.CREATE_SEQUENCE, "sequence", False),
    (DDLType.REBASE_AUTO_ID, "auto_id", False),
    (DDLType.SHARD_ROW_ID, "table_option", False),
    (DDLType.MODIFY_TABLE_COMMENT, "comment", False),
    (DDLType.ADD_FOREIGN_KEY, "foreign_key", False),
    (DDLType.ADD_TABLE_PARTITION, "partition", False),
    (DDLType.DROP_TABLE_PARTITION, "partition", True),
    (DDLType.TRUNCATE_TABLE_PARTITION, "partition", True),
    (42, "partition", True),  # TiDB ActionExchangeTablePartition
    (56, "placement", False),  # TiDB ActionAlterTablePlacement
    (57, "cache", False),  # TiDB ActionAlterCacheTable
    (65, "ttl", False),  # TiDB ActionAlterTTLInfo
    (DDLType.CREATE_TABLE, None, False),
    (DDLType.ADD_COLUMN, None, False),
    (DDLType.ADD_INDEX, None, False),  # may be a unique index: never assumed harmless
    (DDLType.DROP_INDEX, None, False),
    (DDLType.RECOVER_TABLE, None, False),
    (61, None, False),  # TiDB ActionMultiSchemaChange
    (None, None, False),
    (9999, None, False),
]


@pytest.mark.parametrize("query", UNCLASSIFIED_SQL)
@pytest.mark.parametrize(("ddl_type", "kind", "affects_data"), DDL_TYPE_CASES)
def test_unclassified_sql_falls_back_to_ddl_type(query: str, ddl_type: int | None, kind: str | None, affects_data: bool) -> None:
    [change] = parse_ddl(query, default_schema=S, ddl_type=ddl_type)
    if kind is None:
        assert isinstance(change, Unknown)
        assert change.query == query
        assert change.reason
    else:
        assert isinstance(change, NoOp)
        assert (change.kind, change.affects_data) == (kind, affects_data)
        assert change.reason.startswith(f"classified by DDL type {ddl_type} (")


def test_ddl_type_does_not_override_classified_sql() -> None:
    assert parse_ddl("DROP TABLE t", default_schema=S, ddl_type=DDLType.SET_TIFLASH_REPLICA) == [DropTable(S, "t")]


def test_case_ids_unique() -> None:
    assert len({c.id for c in CASES}) == len(CASES)


def test_shared_codec_ddl_cases() -> None:
    from tests.codec.cases import CREATE, DROP_DB

    assert parse_ddl(CREATE.query, default_schema=CREATE.schema, ddl_type=CREATE.ddl_type) == [
        CreateTable("test", "all_types", (col("id", "bigint", nullable=False), col("c_varchar", "varchar(16)")), ("id",))
    ]
    assert parse_ddl(DROP_DB.query, default_schema=DROP_DB.schema, ddl_type=DROP_DB.ddl_type) == [DropDatabase("test")]


def test_parse_ddl_never_logs_sqlglot_warnings(caplog: pytest.LogCaptureFixture) -> None:
    parse_ddl("ALTER TABLE t EXCHANGE PARTITION p WITH TABLE t2 WITHOUT VALIDATION", default_schema=S)
    parse_ddl("GRANT ALL ON *.* TO u", default_schema=S)
    assert not [r for r in caplog.records if r.name.startswith("sqlglot")]


@pytest.mark.parametrize(
    ("change", "cls"),
    [
        (CreateTable(S, "t"), "create_table"),
        (DropTable(S, "t"), "drop_table"),
        (TruncateTable(S, "t"), "truncate_table"),
        (RenameTable(S, "a", S, "b"), "rename_table"),
        (add("t", col("a", "int")), "add_column"),
        (DropColumn(S, "t", "a"), "drop_column"),
        (RenameColumn(S, "t", "a", "b"), "rename_column"),
        (ModifyColumn(S, "t", "a", col("a", "int")), "modify_column"),
        (SetDefault(S, "t", "a", "1"), "set_default"),
        (DropDefault(S, "t", "a"), "set_default"),
        (AddPrimaryKey(S, "t", ("a",)), "key_change"),
        (DropPrimaryKey(S, "t"), "key_change"),
        (AddUniqueKey(S, "t", "u", ("a",)), "key_change"),
        (DropIndex(S, "t", "u"), "key_change"),
        (CreateDatabase("d"), "create_database"),
        (DropDatabase("d"), "drop_database"),
        (NoOp("index", "x"), "no_op"),
        (NoOp("partition", "ADD PARTITION"), "no_op"),
        (NoOp("partition", "TRUNCATE PARTITION", affects_data=True), "partition_data"),
        (Unknown("q", "r"), "unknown"),
    ],
)
def test_ddl_class(change: SchemaChange, cls: str) -> None:
    assert ddl_class(change) == cls


def test_ddl_class_covers_every_change_type() -> None:
    import ticdc_delta.schema.ddl as ddl

    change_types = {
        v for v in vars(ddl).values() if isinstance(v, type) and issubclass(v, SchemaChange) and v is not SchemaChange
    }
    assert change_types == set(DDL_CLASSES)


def test_ddl_class_rejects_non_change() -> None:
    with pytest.raises(TypeError, match="not a SchemaChange"):
        ddl_class("create_table")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "quoted"),
    [("a", "`a`"), ("my col", "`my col`"), ("a`b", "`a``b`"), ("select", "`select`"), ("表", "`表`"), ("``", "``````")],
)
def test_quote_ident(name: str, quoted: str) -> None:
    assert quote_ident(name) == quoted


def test_quote_ident_rejects_non_string() -> None:
    with pytest.raises(TypeError, match="identifier must be str"):
        quote_ident(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"query": b"DROP TABLE t", "default_schema": S}, "query must be str"),
        ({"query": "DROP TABLE t", "default_schema": None}, "default_schema must be str"),
        ({"query": "DROP TABLE t", "default_schema": S, "ddl_type": "4"}, "ddl_type must be int or None"),
        ({"query": "DROP TABLE t", "default_schema": S, "ddl_type": True}, "ddl_type must be int or None"),
    ],
)
def test_parse_ddl_argument_checks(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(TypeError, match=match):
        parse_ddl(**kwargs)  # type: ignore[arg-type]


def test_changes_are_frozen_hashable_and_picklable() -> None:
    changes = parse_ddl(CASES[0].query, default_schema=S) + parse_ddl("ALTER TABLE t ADD COLUMN a INT FIRST", default_schema=S)
    for change in changes:
        assert pickle.loads(pickle.dumps(change)) == change
        assert hash(change) == hash(pickle.loads(pickle.dumps(change)))
    with pytest.raises(FrozenInstanceError):
        changes[0].table = "x"  # type: ignore[misc]


_names = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=10)


@settings(max_examples=150, deadline=None)
@given(_names, _names, _names, _names)
def test_quoted_identifiers_survive_exactly(db: str, table: str, column: str, new: str) -> None:
    target = f"{quote_ident(db)}.{quote_ident(table)}"
    changes = parse_ddl(
        f"ALTER TABLE {target} ADD COLUMN {quote_ident(column)} INT AFTER {quote_ident(new)}, "
        f"RENAME COLUMN {quote_ident(column)} TO {quote_ident(new)}, DROP COLUMN {quote_ident(new)}",
        default_schema=S,
    )
    assert changes == [
        AddColumns(db, table, (col(column, "int"),), (ColumnPosition(after=new),)),
        RenameColumn(db, table, column, new),
        DropColumn(db, table, new),
    ]
    assert parse_ddl(f"RENAME TABLE {target} TO {quote_ident(new)}", default_schema=S) == [RenameTable(db, table, S, new)]
    assert parse_ddl(f"CREATE TABLE {quote_ident(table)} ({quote_ident(column)} INT PRIMARY KEY)", default_schema=db) == [
        CreateTable(db, table, (col(column, "int", nullable=False),), (column,))
    ]


_SQL_WORDS = [
    "ALTER", "TABLE", "t", "`a b`", "ADD", "COLUMN", "(", ")", ",", ";", "DROP", "INDEX", "PRIMARY", "KEY",
    "UNIQUE", "CREATE", "RENAME", "TO", "AS", "INT", "VARCHAR(3)", "DEFAULT", "'x'", "NULL", "PARTITION", "SET",
    "TIFLASH", "CHANGE", "MODIFY", "FIRST", "AFTER", "DATABASE", "VIEW", "SELECT", "1", "ENUM('a')", "`", "'",
    "/*", "*/", "--", "LIKE", "ON", "CONSTRAINT", "CHECK", "FOREIGN", "TRUNCATE", "IF", "EXISTS", "NOT", ".",
    "=", "CACHE", "TTL", "b'1'", "SEQUENCE", "TEMPORARY", "AUTO_RANDOM", "GLOBAL", "DESC",
]  # fmt: skip


_PREFIXES = [
    "", "ALTER TABLE t ", "ALTER TABLE `d`.`t` ADD ", "CREATE TABLE t (", "CREATE TABLE t (a INT ", "RENAME TABLE ",
    "DROP ", "CREATE ", "ALTER TABLE t ADD COLUMN (", "ALTER TABLE t CHANGE a b ", "CREATE UNIQUE INDEX u ON t (",
]  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(_PREFIXES),
    st.one_of(st.text(max_size=60), st.lists(st.sampled_from(_SQL_WORDS), max_size=15).map(" ".join)),
    st.one_of(st.none(), st.integers(0, 80)),
)
def test_parse_ddl_never_raises(prefix: str, rest: str, ddl_type: int | None) -> None:
    """Any text gives changes (Unknown at worst), never an exception."""
    changes = parse_ddl(prefix + rest, default_schema=S, ddl_type=ddl_type)
    assert changes
    assert all(isinstance(c, SchemaChange) for c in changes)


def test_deeply_nested_statement_is_unknown() -> None:
    query = "ALTER TABLE t ADD COLUMN a INT DEFAULT " + "(" * 3000 + "1" + ")" * 3000
    [change] = parse_ddl(query, default_schema=S)
    assert isinstance(change, Unknown)
    assert change.reason == "statement nested too deeply to parse"


def test_sqlglot_internal_errors_become_unknown() -> None:
    # sqlglot 30 raises TypeError (not a ParseError) on this clause
    [change] = parse_ddl("ALTER TABLE t DEFAULT CLUSTERED", default_schema=S)
    assert isinstance(change, Unknown)
    assert change.reason.startswith("sqlglot failed: TypeError")
