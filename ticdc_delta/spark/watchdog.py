"""The micro-batch watchdog (``batch_timeout``): a batch that runs longer ends the process with exit 75.

A micro-batch that never ends is worse than one that fails: a scheduler restarts a job that exited, never
one that hangs. Hangs happen below the job — a Python worker's socket that stops moving (seen here with
Linux 6.18: both ends of a JVM ↔ Python worker connection waiting on retransmissions the other side's
full receive queue drops), a fetch from a broker that half-answers, a commit to an object store that
never returns — and nothing in the job can interrupt a thread stuck in the JVM or in a socket call. So the
watchdog does not try: it prints one ``error:`` line and ends the process at once (``os._exit``), as a
crash would, killing the JVM of a local session first; under spark-submit (the JVM is the driver's parent)
its exit code becomes spark-submit's. The next start resumes from the checkpoint: every
stage of a batch is safe to cut (the tests kill the job at random moments).

Off unless configured: a batch that legitimately takes longer than the timeout (a first batch over a long
backlog without ``source.max_offsets_per_trigger``) would be cut at every start, and never finish.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any, Callable

from ..cli import EXIT_RETRYABLE

log = logging.getLogger(__name__)

__all__ = ["BatchWatchdog", "exit_retryable", "kill_local_jvm", "watched"]


def kill_local_jvm() -> None:
    """Kill the Spark JVM this process started (a local session; under spark-submit the JVM is the parent
    and there is none): left alone it would print its failed calls into the gone driver after our line."""
    try:
        from pyspark import SparkContext

        gateway = SparkContext._gateway  # noqa: SLF001 - where pyspark keeps the JVM it launched
        proc = getattr(gateway, "proc", None)
        if proc is not None:
            proc.kill()
            proc.wait(timeout=30)
    except Exception:  # noqa: BLE001 - the process ends either way; the JVM then ends on its stdin's EOF
        log.debug("could not kill the Spark JVM", exc_info=True)


def exit_retryable(message: str) -> None:
    """End the process with exit 75 now, its local Spark JVM first, stderr's last line ``error: <message>``.

    Once the line is decided nothing else reaches stderr: the calls into the killed JVM that other threads
    are making fail, and their tracebacks would bury the line (they go to ``/dev/null``)."""
    log.error("%s", message)
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001, S110 - the process ends either way
            pass
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        err = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        kill_local_jvm()
        os.write(err, f"error: {message}\n".encode())
    finally:
        os._exit(EXIT_RETRYABLE)


class BatchWatchdog:
    """Calls ``on_expire(batch_id, seconds)`` once when a batch stays armed for ``timeout_s``.

    :meth:`arm` when a batch starts, :meth:`disarm` when it ends (each batch its own deadline); one daemon
    thread, started on the first :meth:`arm`.
    """

    def __init__(self, timeout_s: float, on_expire: Callable[[int, float], None] | None = None) -> None:
        if timeout_s <= 0:
            raise ValueError("the batch timeout must be positive")
        self.timeout_s = timeout_s
        self._on_expire = on_expire or self._exit
        self._cond = threading.Condition()
        self._armed: tuple[int, float] | None = None  # (batch id, its monotonic start)
        self._thread: threading.Thread | None = None
        self._stopped = False

    def arm(self, batch_id: int) -> None:
        with self._cond:
            self._armed = (batch_id, time.monotonic())
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._watch, name="ticdc-delta-batch-watchdog", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def disarm(self) -> None:
        with self._cond:
            self._armed = None
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._armed = None
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _watch(self) -> None:
        with self._cond:
            while not self._stopped:
                if self._armed is None:
                    self._cond.wait()
                    continue
                batch_id, started = self._armed
                left = started + self.timeout_s - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self._armed = None
                break
            else:
                return
        self._on_expire(batch_id, time.monotonic() - started)

    def _exit(self, batch_id: int, seconds: float) -> None:
        exit_retryable(
            f"micro-batch {batch_id} still running after {seconds:.0f} s (batch_timeout {self.timeout_s:g} s): "
            "ending the job to be restarted; the next start resumes from the checkpoint"
        )


def watched(handler: Any, watchdog: BatchWatchdog) -> Callable[[Any, int], None]:
    """``handler`` (a ``foreachBatch`` function) with each call under ``watchdog``."""

    def call(batch_df: Any, batch_id: int) -> None:
        watchdog.arm(batch_id)
        try:
            handler(batch_df, batch_id)
        finally:
            watchdog.disarm()

    return call
