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
    stop.request(signal.SIGTERM)
    stop.close()
    with pytest.raises(StoppedBySignal, match="micro-batch 2 is left to the next start"):
        gated(None, 2)  # raised, not returned: Spark must not commit a batch nothing was applied for
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
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert done.stdout.split() == ["first"]


def test_a_requested_stop_exits_128_plus_the_signal() -> None:
    exc = StoppedBySignal(signal.SIGTERM, 3)
    assert exit_code_for(exc) == 143 and exc.signal_name == "SIGTERM"
    assert str(exc) == ("stopped by SIGTERM after 3 micro-batch(es) committed by this run; the next start resumes "
                        "from the last committed batch")
    assert exit_code_for(StoppedBySignal(signal.SIGINT, 0)) == 130
