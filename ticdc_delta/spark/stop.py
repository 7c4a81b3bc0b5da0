"""A requested stop (SIGTERM, SIGINT): the micro-batch in flight finishes, then the query stops.

A scheduler stops a job with SIGTERM (``docker stop``, Kubernetes, systemd, Airflow's ``on_kill``), an
operator with Ctrl-C. Without a handler Python ended at once — in the middle of a batch, which the next start
redoes (every stage of a batch is safe to cut) — and as PID 1 of a container it ignored SIGTERM until the
runtime's SIGKILL. With :class:`StopRequest` installed, the first signal lets the batch in flight commit,
stops the query before it starts another, and ends the run with :class:`~ticdc_delta.errors.StoppedBySignal`
(exit ``128 + signal``: 143 for SIGTERM, 130 for SIGINT). A second signal ends the process at once.

When the signal reaches the whole process group, Spark's JVM gets it too and shuts down by itself, failing
the batch in flight: the run still ends as stopped (the signal, not the failure, is the cause) and the next
start redoes that batch.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any, Callable

from ..errors import StoppedBySignal

log = logging.getLogger(__name__)

__all__ = ["POLL_S", "StopRequest"]

POLL_S = 1.0
"""How often the driver's main thread, waiting for the query, looks for a requested stop."""

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """Whether, and by which signal, the run was asked to stop; the gate every micro-batch passes.

    :meth:`gate` wraps the ``foreachBatch`` function: a batch runs under a lock, so :meth:`close` waits for the
    one in flight; a batch that starts once the stop is requested raises (Spark then commits nothing for it,
    and the next start runs it). :meth:`install` makes SIGTERM and SIGINT call :meth:`request` (main thread only).
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._requested = threading.Event()
        self._lock = threading.Lock()
        self._previous: dict[int, Any] = {}
        self.finished: int | None = None
        """The id of the last micro-batch that passed the gate and returned (Spark commits it after)."""

    @property
    def requested(self) -> bool:
        return self._requested.is_set()

    @property
    def installed(self) -> bool:
        """Whether :meth:`install` routed the signals here (and :meth:`uninstall` has not yet undone it)."""
        return bool(self._previous)

    def request(self, signum: int) -> None:
        """Ask the run to stop after the batch in flight (what the first signal does)."""
        if self.signum is None:
            self.signum = signum
        self._requested.set()

    def exception(self, batches: int) -> StoppedBySignal:
        """The error that ends a run stopped this way; ``batches``: micro-batches the run committed."""
        return StoppedBySignal(self.signum or signal.SIGTERM, batches)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.requested:  # a second signal: at once, as a crash would (the next start redoes the batch)
            self.uninstall()
            _exit_now(128 + signum)
        self.request(signum)
        log.warning("%s: stopping after the micro-batch in flight (a second signal stops at once)",
                    signal.Signals(signum).name)

    def install(self) -> "StopRequest":
        """Route SIGTERM and SIGINT to this request (a no-op outside the main thread, where Python cannot
        set handlers); :meth:`uninstall` puts back the handlers found at the first call.

        Call it again once the Spark session exists: pyspark's session set-up puts its own SIGINT handler
        in (it cancels every Spark job at once)."""
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                previous = signal.signal(signum, self._on_signal)
                self._previous.setdefault(signum, previous)
        return self

    def uninstall(self) -> None:
        for signum, previous in self._previous.items():
            try:
                signal.signal(signum, previous)
            except (TypeError, ValueError):  # a handler set from C, or not the main thread
                signal.signal(signum, signal.SIG_DFL)
        self._previous.clear()

    def gate(self, handler: Callable[[Any, int], None]) -> Callable[[Any, int], None]:
        """``handler`` (a ``foreachBatch`` function), refusing to start a batch once a stop is requested."""

        def call(batch_df: Any, batch_id: int) -> None:
            with self._lock:
                if self.requested:
                    # raised, not returned: a batch that returns is committed by Spark, with nothing applied
                    raise StoppedBySignal(self.signum or signal.SIGTERM, 0,
                                          f"micro-batch {batch_id} is left to the next start")
                handler(batch_df, batch_id)
                self.finished = batch_id

        return call

    def close(self) -> None:
        """Wait for the batch in flight to end (once a stop is requested, none starts after it)."""
        with self._lock:
            pass


def _exit_now(code: int) -> None:
    """End the process with ``code`` at once, the local Spark JVM first (a signal's default action would not
    do: the kernel drops it for PID 1 of a container, which is what the job is in its image)."""
    from .watchdog import kill_local_jvm

    kill_local_jvm()
    os._exit(code)
