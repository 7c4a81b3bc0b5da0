"""SIGTERM (a scheduler) or SIGINT (Ctrl-C) to a running job (``run``): the micro-batch in flight commits, no
other starts, the run ends with exit 128 + signal and one line saying so, and the next start lands the rest
exactly."""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from ticdc_delta.cli import main
from ticdc_delta.config import load_config
from ticdc_delta.simulator import simulate
from ticdc_delta.simulator.output import KafkaSink
from ticdc_delta.spark.batch_handler import FAULT_ENV, _ConfiguredSink
from ticdc_delta.spark.job import run_job
from ticdc_delta.verify import compare_with_oracle
from tests.integration.conftest import capture_logs, job_engine

pytestmark = pytest.mark.integration


class _Paused(logging.Handler):
    """Set once the ``pause`` fault holds its batch."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("injected pause"):
            self.event.set()


def _batches(log_dir: Path) -> set[int]:
    return {int(p.name) for p in log_dir.iterdir() if p.name.isdigit()} if log_dir.is_dir() else set()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_lets_the_batch_in_flight_commit_then_stops_with_128_plus_it(
        signum: signal.Signals, broker: Any, spark: Any, tmp_path: Path, unique_name: Any,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    topic = unique_name("stop")
    foreign: list[int] = []

    def stop_queries(sig: int, _frame: Any) -> None:  # a handler that is not the job's: the test fails
        foreign.append(sig)
        for query in spark.streams.active:
            query.stop()

    def session_as_pyspark_starts_it(_cfg: Any) -> Any:
        signal.signal(signal.SIGINT, stop_queries)  # as pyspark's SparkContext set-up does (its own handler)
        return spark

    monkeypatch.setattr("ticdc_delta.spark.job.spark_for", session_as_pyspark_starts_it)
    result = simulate("open-protocol", {}, seed=12, events=600, tables=2, partitions=2,
                      sink=KafkaSink(broker.bootstrap_servers, topic, 2), topic=topic)
    cfg_path = tmp_path / "job.yaml"
    cfg_path.write_text(yaml.safe_dump({
        "changefeed": "stop",
        "source": {"bootstrap_servers": broker.bootstrap_servers, "topic": topic, "protocol": "open-protocol",
                   "max_offsets_per_trigger": max(20, result.summary["messages"] // 6)},
        "sink": {"path": str(tmp_path / "lake"), "engine": job_engine()},
        "checkpoint": str(tmp_path / "ckpt"),
        "trigger_interval": "1 second",
    }))
    monkeypatch.setenv(FAULT_ENV, "after_decode@1:pause")  # batch 1 is in flight when the signal comes
    paused = _Paused()

    def signal_when_paused() -> None:
        if not paused.event.wait(240):
            return
        if type(getattr(signal.getsignal(signum), "__self__", None)).__name__ != "StopRequest":
            stop_queries(signum, None)  # not the job's handler: the signal could end the test run
            return
        os.kill(os.getpid(), signum)

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    sender = threading.Thread(target=signal_when_paused, daemon=True)
    sender.start()
    with capture_logs("ticdc_delta.spark.batch_handler", paused):
        rc = main(["run", "--config", str(cfg_path)])  # continuous: only the signal ends it
    sender.join(5)
    assert paused.event.is_set(), "batch 1 never paused"
    err = capsys.readouterr().err.strip().splitlines()
    assert not foreign and rc == 128 + signum, err[-20:]
    assert err[-1] == (f"ticdc-delta: changefeed stop: stopped by {signum.name} after 2 micro-batch(es) committed "
                       "by this run; the next start resumes from the last committed batch")
    # the batch in flight was committed, and none started after it
    assert _batches(tmp_path / "ckpt" / "spark" / "commits") == {0, 1}
    assert {sig: signal.getsignal(sig) for sig in before} == before  # the handlers are put back

    monkeypatch.delenv(FAULT_ENV)
    cfg = load_config(cfg_path)
    assert run_job(cfg, once=True, spark=spark) >= 1
    diffs = compare_with_oracle(_ConfiguredSink(cfg), result.oracle, tz=cfg.sink.source_timezone)
    bad = [d.describe() for d in diffs if not d.ok]
    assert not bad, "\n".join(bad)
