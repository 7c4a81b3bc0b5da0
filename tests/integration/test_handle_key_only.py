"""``large-message-handle-option=handle-key-only`` with ``source.upstream``: rows read back from a real
upstream database as of their commit ts.

There is no TiDB here. The upstream is a MariaDB (Debian's package, started by this module) whose tables are
``WITH SYSTEM VERSIONING``: every statement of the scripted TiCDC stream (:class:`Scenario`) is run there too,
with ``SET @@timestamp`` at its commit ts' physical time, so ``FOR SYSTEM_TIME AS OF`` shows each row as it
was at any commit ts — what ``tidb_snapshot`` shows on TiDB. The lookup picks that dialect from
``SELECT VERSION()``; the TiDB statements are checked as text only (tests/codec/test_upstream_lookup.py).

Needs ``mariadb-server`` (``make mariadb``); skipped without it (a failure under CI=true).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterator

import pytest

from ticdc_delta.codec import decoder_for
from ticdc_delta.codec.model import DecodeContext, FailedEntry, RowChange
from ticdc_delta.codec.upstream_lookup import UpstreamLookup, UpstreamSettings
from ticdc_delta.errors import HandleKeyOnlyError, UpstreamRowError, UpstreamUnavailableError
from ticdc_delta.local_broker import free_port
from ticdc_delta.simulator.scenario import Scenario
from tests.integration.conftest import mariadb_programs, running_mariadb, job_engine

pytestmark = pytest.mark.integration

TABLE = ("CREATE TABLE `hk`.`{name}` (`id` BIGINT NOT NULL, `name` VARCHAR(20), `body` TEXT, "
         "`amount` DECIMAL(10,2), `at` DATETIME(3), `u` INT UNSIGNED, `e` ENUM('x','y'), `bin` VARBINARY(8), "
         "PRIMARY KEY (`id`))")



@pytest.fixture(scope="module")
def mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpstreamSettings]:
    programs = mariadb_programs("make mariadb")
    with running_mariadb(programs, tmp_path_factory.mktemp("upstream")) as db:
        yield UpstreamSettings(host="127.0.0.1", port=db.port, user="root")


class Twin:
    """A :class:`Scenario` (what TiCDC sends) and the MariaDB upstream it came from, written together: each
    statement runs in MariaDB at its commit ts' physical time (``SET @@timestamp``)."""

    def __init__(self, settings: UpstreamSettings, protocol: str, options: dict[str, str], db: str) -> None:
        import pymysql

        self.sc = Scenario(protocol, options, partitions=2, topic=f"hko-{db}")
        self.db = db
        self.conn = pymysql.connect(host=settings.host, port=settings.port, user=settings.user, autocommit=True,
                                    charset="utf8mb4", init_command="SET time_zone = '+00:00'")
        self._sql(f"DROP DATABASE IF EXISTS `{db}`")
        self.sc.ddl(f"CREATE DATABASE `{db}`")
        self._sql(f"CREATE DATABASE `{db}`")

    def _sql(self, sql: str, params: Any = None) -> None:
        with self.conn.cursor() as cur:
            cur.execute(sql, params)

    def _at(self, ts: int) -> None:
        ms = ts >> 18
        self._sql(f"SET @@timestamp = {ms // 1000}.{ms % 1000:03d}")

    def create(self, name: str) -> None:
        query = TABLE.replace("`hk`", f"`{self.db}`").format(name=name)
        self.sc.ddl(query)
        self._sql(query + " WITH SYSTEM VERSIONING")

    def insert(self, table: str, *, upstream: bool = True, **values: Any) -> int:
        ts = self.sc.insert(self.db, table, **values)
        if upstream:
            self._at(ts)
            cols = ", ".join(f"`{c}`" for c in values)
            self._sql(f"INSERT INTO `{self.db}`.`{table}` ({cols}) VALUES ({', '.join(['%s'] * len(values))})",
                      tuple(values.values()))
        return ts

    def update(self, table: str, key: int, **changes: Any) -> None:
        ts = self.sc.update(self.db, table, {"id": key}, **changes)
        assert ts is not None
        self._at(ts)
        sets = ", ".join(f"`{c}` = %s" for c in changes)
        self._sql(f"UPDATE `{self.db}`.`{table}` SET {sets} WHERE `id` = %s", (*changes.values(), key))

    def delete(self, table: str, key: int) -> None:
        self._at(self.sc.delete(self.db, table, id=key))
        self._sql(f"DELETE FROM `{self.db}`.`{table}` WHERE `id` = %s", (key,))


def _play(twin: Twin) -> None:
    """Rows small and large (a long ``body``: above max-message-bytes, sent as handle-key-only); updates
    that make a row large, later ones that make it small again (a lookup must see the row *then*, not now);
    a deleted large row; a row whose key changes (TiCDC: DELETE + INSERT)."""
    twin.create("t")
    for i in range(1, 13):
        twin.insert("t", id=i, name=f"n{i}", body=("long " * 60 if i % 3 == 0 else "short"), amount=f"{i}.50",
                    at=f"2024-01-0{1 + i % 9} 10:00:00.{i:03d}", u=4000000000 + i, e="y" if i % 2 else "x",
                    bin=bytes([i, 0, 255]))
    for i in (1, 3, 4):
        twin.update("t", i, body="grown " * 80, name=f"g{i}")
    twin.update("t", 3, body="small again", amount="0.01")
    twin.update("t", 6, name="renamed", body="still long " * 40)
    twin.update("t", 4, amount="99.99")
    twin.delete("t", 9)
    twin.update("t", 12, id=112)
    twin.sc.resolved()


def _events(protocol: str, options: dict[str, str], messages: list[Any], upstream: Any) -> list[Any]:
    """The row events of ``messages`` in commit order (the two databases' rows land on other partitions)."""
    decoder = decoder_for(protocol, options, upstream=upstream)
    out = []
    for _, key, value in messages:
        out.extend(e for e in decoder.decode(key, value, DecodeContext()) if isinstance(e, RowChange))
    return sorted(out, key=lambda e: (e.commit_ts, e.op, (e.columns or e.old)[0].value))


@pytest.mark.parametrize("protocol, options", [
    ("open-protocol", {"max-batch-size": "4"}),
    ("canal-json", {"enable-tidb-extension": "true"}),
])
def test_lookups_rebuild_the_rows_ticdc_would_have_sent_in_full(
        protocol: str, options: dict[str, str], mariadb: UpstreamSettings) -> None:
    """The same script twice: once sent in full, once above max-message-bytes as handle-key-only. Decoded
    with the upstream lookup, the second stream gives the first one's new images (names, types, flags and
    values as the decoder types a full row); a DELETE and an UPDATE's old image keep the message's key."""
    small = {**options, "large-message-handle-option": "handle-key-only", "max-message-bytes": "600"}
    full_twin, hko_twin = Twin(mariadb, protocol, options, "hk_full"), Twin(mariadb, protocol, small, "hk_hko")
    _play(full_twin)
    _play(hko_twin)
    # without the upstream: a key-only row is refused — its message, or (batched with whole rows in an Open
    # Protocol message) that entry alone
    refused, decoder = [], decoder_for(protocol, small)
    for _, key, value in hko_twin.sc.messages():
        try:
            refused += [e.error for e in decoder.decode(key, value, DecodeContext()) if isinstance(e, FailedEntry)]
        except HandleKeyOnlyError as exc:
            refused.append(str(exc))
    assert refused and all("set source.upstream" in error for error in refused)

    lookup = UpstreamLookup(mariadb)
    full = _events(protocol, options, full_twin.sc.messages(), None)
    got = _events(protocol, small, hko_twin.sc.messages(), lookup)
    lookup.close()
    assert lookup.dialect == "mariadb" and lookup.lookups >= 5
    assert len(got) == len(full)
    completed = 0
    for want, have in zip(full, got):
        assert (have.commit_ts, have.table, have.op) == (want.commit_ts, want.table, want.op)
        if have.columns is not None:
            assert tuple(have.columns) == tuple(want.columns), (want, have)
        if have.old is not None and tuple(have.old) != tuple(want.old):
            # handle-key-only: the old image is the key, as sent
            assert [c.name for c in have.old] == ["id"] and have.old[0] == want.old[0]
            completed += 1
    assert completed >= 3


def test_a_row_the_upstream_lacks_is_an_upstream_row_error(mariadb: UpstreamSettings) -> None:
    options = {"max-batch-size": "4", "large-message-handle-option": "handle-key-only", "max-message-bytes": "600"}
    twin = Twin(mariadb, "open-protocol", options, "hk_lost")
    twin.create("t")
    ts = twin.insert("t", upstream=False, id=7, body="never written upstream " * 40)
    twin.sc.resolved()
    with pytest.raises(UpstreamRowError, match=rf"hk_lost\.t at commit ts {ts} .*no such row at that snapshot"):
        _events("open-protocol", options, twin.sc.messages(), UpstreamLookup(mariadb))


def test_an_unreachable_upstream_is_retried_then_transient(mariadb: UpstreamSettings) -> None:
    options = {"max-batch-size": "4", "large-message-handle-option": "handle-key-only", "max-message-bytes": "600"}
    twin = Twin(mariadb, "open-protocol", options, "hk_down")
    twin.create("t")
    twin.insert("t", id=1, body="long " * 200)
    pauses: list[float] = []
    gone = UpstreamLookup(UpstreamSettings(host="127.0.0.1", port=free_port(), connect_timeout=2),
                          attempts=3, backoff=0.01, sleep=pauses.append)
    with pytest.raises(UpstreamUnavailableError, match=r"failed 3 times reading the handle-key-only row of hk_down\.t"):
        _events("open-protocol", options, twin.sc.messages(), gone)
    assert pauses == [0.01, 0.02]


def test_a_connection_the_server_refuses_is_a_config_error(mariadb: UpstreamSettings) -> None:
    """A MariaDB without time zone tables refuses a named session time zone: every lookup would fail the
    same way, so the job stops (ConfigError) rather than dead-lettering each row."""
    from dataclasses import replace

    from ticdc_delta.errors import ConfigError

    bad = UpstreamLookup(replace(mariadb, time_zone="Mars/Olympus_Mons"), attempts=2, sleep=lambda s: None)
    with pytest.raises(ConfigError, match=r"refused the connection: .*(?i:time zone)"):
        bad.fetch("hk_full", "t", [("id", 1)], 1 << 18, "open-protocol")


def _produce(broker: Any, topic: str, messages: list[tuple[int, bytes | None, bytes | None]]) -> None:
    from ticdc_delta.local_broker import wait_for_high_watermarks

    broker.create_topic(topic, 2)
    broker.produce_many(topic, messages)
    counts: dict[tuple[str, int], int] = defaultdict(int)
    for p, _, _ in messages:
        counts[(topic, p)] += 1
    wait_for_high_watermarks(broker.bootstrap_servers, dict(counts))


def test_the_job_lands_handle_key_only_rows_read_from_the_upstream(
        mariadb: UpstreamSettings, broker: Any, spark: Any, tmp_path: Path, unique_name: Any) -> None:
    """Real broker, Spark and Delta: the handle-key-only stream lands as the oracle says; a row the upstream
    lacks goes to the dead-letter table (counted), never applied. With an upstream that does not answer the
    job stops with a retryable error and commits nothing. (Without source.upstream: test_large_messages.py's
    test_handle_key_only_is_never_applied runs the job; the message naming the option is checked above.)"""
    from ticdc_delta.config import config_from_mapping
    from ticdc_delta.delta.sink import read_table
    from ticdc_delta.spark.batch_handler import _ConfiguredSink
    from ticdc_delta.spark.job import run_job
    from ticdc_delta.verify import compare_with_oracle

    options = {"enable-tidb-extension": "true", "large-message-handle-option": "handle-key-only",
               "max-message-bytes": "600"}
    twin = Twin(mariadb, "canal-json", options, "hk_job")
    _play(twin)
    twin.create("lost")
    twin.insert("lost", upstream=False, id=1, body="not upstream " * 50)
    twin.sc.resolved()
    topic = unique_name("hko-job")
    _produce(broker, topic, twin.sc.messages())
    source = {"bootstrap_servers": broker.bootstrap_servers, "topic": topic, "protocol": "canal-json",
              "options": options}

    down = config_from_mapping({"changefeed": "hko", "sink": {"path": str(tmp_path / "down")},
                                "source": {**source, "upstream": f"mysql://root@127.0.0.1:{free_port()}/"},
                                "checkpoint": str(tmp_path / "down-ckpt")})
    with pytest.raises(UpstreamUnavailableError, match=r"failed 4 times reading the handle-key-only row"):
        run_job(down, once=True, spark=spark)  # retryable: the CLI exits 75
    assert not (tmp_path / "down-ckpt" / "state").exists() and not Path(down.dead_letter_path).exists()

    dsn = f"mysql://{mariadb.user}@{mariadb.host}:{mariadb.port}/?connect_timeout=5"
    cfg = config_from_mapping({"changefeed": "hko", "source": {**source, "upstream": dsn},
                               "sink": {"path": str(tmp_path / "lake"), "engine": job_engine()}, "checkpoint": str(tmp_path / "ckpt")})
    run_job(cfg, once=True, spark=spark)
    oracle = twin.sc.oracle()
    oracle = dataclasses.replace(oracle, tables={k: v for k, v in oracle.tables.items() if k == "hk_job.t"})
    diffs = compare_with_oracle(_ConfiguredSink(cfg), oracle, tz=cfg.sink.source_timezone)
    assert [d.describe() for d in diffs if not d.ok] == [] and sum(d.actual_rows for d in diffs) == 11
    dead = read_table(cfg.dead_letter_path).to_pylist()
    assert len(dead) == 1 and "hk_job.lost at commit ts" in dead[0]["error"]
    assert "no such row at that snapshot" in dead[0]["error"]
