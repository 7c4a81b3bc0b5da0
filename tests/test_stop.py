"""StopRequest: the gate around micro-batches, the signal handlers, the exit code of a requested stop."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest

from ticdc_delta.cli import exit_code_for
from ticdc_delta.errors import StoppedBySignal
from ticdc_delta.spark.stop import StopRequest


def test_the_gate_runs_batches_until_closed_then_refuses_them() -> None:
    stop = StopRequest()
    ran: list[int] = []
    gated = stop.gate(lambda _df, batch_id: ran.append(batch_id))
    gated(None, 0)
    gated(None, 1)
    assert ran == [0, 1] and stop.finished == 1
    stop.request(signal.SIGTERM)  # (refused from the request on, not only once the driver closes the gate)
    with pytest.raises(StoppedBySignal, match="micro-batch 2 is left to the next start"):
        gated(None, 2)  # raised, not returned: Spark must not commit a batch nothing was applied for
    stop.close()
    with pytest.raises(StoppedBySignal, match="micro-batch 2 is left to the next start"):
        gated(None, 2)
    assert ran == [0, 1] and stop.finished == 1


def test_close_waits_for_the_batch_in_flight() -> None:
    stop = StopRequest()
    started, release = threading.Event(), threading.Event()

    def slow(_df: object, _batch_id: int) -> None:
        started.set()
        release.wait(10)

    batch = threading.Thread(target=stop.gate(slow), args=(None, 7))
    batch.start()
    assert started.wait(10)
    closer = threading.Thread(target=stop.close)
    closer.start()
    time.sleep(0.2)
    assert closer.is_alive()  # the batch is still running
    release.set()
    batch.join(10)
    closer.join(10)
    assert not closer.is_alive() and stop.finished == 7


def test_a_signal_requests_the_stop_and_the_handlers_are_put_back() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    stop = StopRequest().install()
    try:
        assert not stop.requested
        signal.raise_signal(signal.SIGTERM)
        assert stop.requested and stop.signum == signal.SIGTERM
    finally:
        stop.uninstall()
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_installing_again_keeps_the_handlers_found_first() -> None:
    before = signal.getsignal(signal.SIGINT)
    stop = StopRequest().install()
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a session's set-up puts its own in
        stop.install()
        assert getattr(signal.getsignal(signal.SIGINT), "__self__", None) is stop
    finally:
        stop.uninstall()
    assert signal.getsignal(signal.SIGINT) == before and not stop.installed


def test_a_second_signal_ends_the_process_at_once() -> None:
    script = (
        "import os, signal, time\n"
        "from ticdc_delta.spark.stop import StopRequest\n"
        "stop = StopRequest().install()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "assert stop.requested\n"
        "print('first', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "time.sleep(5)\n"
        "print('survived', flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr  # (by os._exit: PID 1 drops a default action)
    assert done.stdout.split() == ["first"]


def test_a_requested_stop_exits_128_plus_the_signal() -> None:
    exc = StoppedBySignal(signal.SIGTERM, 3)
    assert exit_code_for(exc) == 143 and exc.signal_name == "SIGTERM"
    assert str(exc) == ("stopped by SIGTERM after 3 micro-batch(es) committed by this run; the next start resumes "
                        "from the last committed batch")
    assert exit_code_for(StoppedBySignal(signal.SIGINT, 0)) == 130


class _Progress:
    def __init__(self, batch_id: int, *, executed: bool) -> None:
        self.batchId = batch_id
        self.durationMs = {"addBatch": 5, "triggerExecution": 9} if executed else {"triggerExecution": 1}


class _Query:
    """``lastProgress`` walks through ``seen`` (then stays on the last one)."""

    isActive = True

    def __init__(self, *seen: _Progress) -> None:
        self.seen = list(seen)

    @property
    def lastProgress(self) -> _Progress:  # noqa: N802 - pyspark's name
        return self.seen.pop(0) if len(self.seen) > 1 else self.seen[0]


def test_the_stop_waits_for_the_progress_of_the_batch_that_ran_not_an_idle_one() -> None:
    from ticdc_delta.spark.job import _wait_for_commit

    # Spark gives an idle trigger's progress the id of the batch to come: batch 5's own comes after it
    query = _Query(_Progress(5, executed=False), _Progress(5, executed=False), _Progress(5, executed=True))
    _wait_for_commit(query, 5, timeout_s=10)
    assert len(query.seen) == 1
    later = _Query(_Progress(6, executed=False))  # an idle trigger after batch 5: it was recorded
    _wait_for_commit(later, 5, timeout_s=0.5)
    assert len(later.seen) == 1
