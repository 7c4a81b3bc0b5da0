"""Tests of :mod:`ticdc_delta.spark.watchdog` (``batch_timeout``): which batches it fires for, and that its
default action ends the process with exit 75 and one ``error:`` line (no Spark needed; the job under it:
tests/integration/test_batch_timeout.py)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ticdc_delta.cli import EXIT_RETRYABLE
from ticdc_delta.spark.watchdog import BatchWatchdog, watched

REPO = Path(__file__).resolve().parents[2]


def _recorder() -> tuple[list[tuple[int, float]], threading.Event, object]:
    fired: list[tuple[int, float]] = []
    event = threading.Event()

    def on_expire(batch_id: int, seconds: float) -> None:
        fired.append((batch_id, seconds))
        event.set()

    return fired, event, on_expire


def test_a_batch_that_ends_in_time_never_fires_one_that_does_not_fires_once() -> None:
    fired, event, on_expire = _recorder()
    dog = BatchWatchdog(0.4, on_expire)  # type: ignore[arg-type]
    try:
        for batch in range(3):  # each batch its own deadline: three short batches take longer than one timeout
            dog.arm(batch)
            time.sleep(0.2)
            dog.disarm()
        time.sleep(0.5)
        assert fired == []
        dog.arm(3)
        assert event.wait(5)
        time.sleep(0.5)  # still armed, long past the deadline: no second call
        assert [b for b, _ in fired] == [3]
        assert fired[0][1] >= 0.4
        event.clear()
        dog.arm(4)  # a later batch is watched again
        assert event.wait(5)
        assert [b for b, _ in fired] == [3, 4]
    finally:
        dog.stop()


def test_watched_arms_for_the_call_and_disarms_after_it_even_when_it_raises() -> None:
    fired, _, on_expire = _recorder()
    dog = BatchWatchdog(0.3, on_expire)  # type: ignore[arg-type]
    seen: list[int] = []

    def handler(df: object, batch_id: int) -> None:
        seen.append(batch_id)
        assert dog._armed is not None and dog._armed[0] == batch_id  # noqa: SLF001
        if batch_id == 1:
            raise RuntimeError("failed batch")

    call = watched(handler, dog)
    try:
        call(None, 0)
        with pytest.raises(RuntimeError, match="failed batch"):
            call(None, 1)
        assert dog._armed is None  # noqa: SLF001
        time.sleep(0.5)
        assert seen == [0, 1] and fired == []
    finally:
        dog.stop()


def test_a_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        BatchWatchdog(0)


def test_the_default_action_ends_the_process_with_75_and_one_error_line() -> None:
    """In a process of its own: the main thread is stuck (as in a hung micro-batch) and still the process
    ends, with exit 75 and stderr's last line the watchdog's."""
    code = (
        "import time\n"
        "from ticdc_delta.spark.watchdog import BatchWatchdog\n"
        "BatchWatchdog(0.5).arm(7)\n"
        "time.sleep(120)\n"
        "print('not reached')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(REPO), timeout=60)
    assert done.returncode == EXIT_RETRYABLE, done.stderr
    assert "not reached" not in done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: micro-batch 7 still running after ") and "batch_timeout 0.5 s" in last, done.stderr
