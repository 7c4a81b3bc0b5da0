"""Run a command and end it when the process that started it dies, however that process died.

Usage: ``python -I -S orphan_guard.py [--remove DIR] -- COMMAND...``, a script of the standard library
alone; :func:`guarded` builds that command line.

:class:`~ticdc_delta.local_broker.LocalBroker` starts its Kafka JVM through this guard (the tests start
their MariaDB and S3 servers through it too). The broker runs in a process group of its own (so that a
signal meant for the broker never reaches the caller), so nothing stopped it when the caller was killed
(SIGKILL, the OOM killer, a CI job's timeout) rather than left normally: the JVM ran on, an orphan
holding its ports, its heap and its temporary directory.

The caller gives the guard a pipe as its standard input and never writes to it. End of file there means
that every holder of the pipe's other end is gone: the guard then stops the command as
:meth:`~ticdc_delta.local_broker.LocalBroker.stop` would (SIGTERM, SIGKILL after a grace period) and
removes ``DIR`` (the broker's temporary directory, which nobody can start it on again). SIGTERM or
SIGINT to the guard is passed on to the command; the guard exits when the command does, with its status
(128 + the signal's number when a signal ended it), so waiting for the guard is waiting for the command.

Pyspark's own gateway JVM ends the same way, on end of file on its standard input, when the Python
process that started it dies.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading

__all__ = ["guarded", "main", "GRACE_S"]

GRACE_S = 30.0
"""Seconds the command gets to stop after SIGTERM, once its starter is gone, before SIGKILL."""


def guarded(command: list[str], *, remove: str | os.PathLike[str] | None = None) -> list[str]:
    """The command line that runs ``command`` under this guard (start it with ``stdin=subprocess.PIPE``
    and keep that pipe open for as long as the command may run; close it after the command ends).

    The guard runs as a script of the standard library alone (``-I -S``: no site packages, no
    ``PYTHON*`` variables to slow or change it). ``remove``: a directory to remove if the starter dies.
    """
    prefix = [sys.executable, "-I", "-S", os.path.abspath(__file__)]
    return [*prefix, *(["--remove", os.fspath(remove)] if remove is not None else []), "--", *command]


def _parse(argv: list[str]) -> tuple[str | None, list[str]]:
    remove = None
    args = list(argv)
    if args[:1] == ["--remove"]:
        if len(args) < 2:
            raise SystemExit("orphan_guard: --remove needs a directory")
        remove, args = args[1], args[2:]
    if args[:1] != ["--"] or len(args) < 2:
        raise SystemExit("usage: orphan_guard.py [--remove DIR] -- COMMAND [ARG...]")
    return remove, args[1:]


def _stop(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is not None:
        return
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def main(argv: list[str] | None = None) -> int:
    """Run the command; returns its exit status (128 + N when signal N ended it)."""
    remove, command = _parse(sys.argv[1:] if argv is None else argv)
    orphaned = threading.Event()
    # the command gets no standard input: only the guard holds the pipe from its starter
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL)

    def forward(signum: int, _frame: object) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)

    def watch_starter() -> None:
        # os.read, not sys.stdin: a daemon thread blocked in a buffered read aborts the interpreter's exit
        try:
            while os.read(0, 65536):
                pass  # the starter never writes; anything read is ignored
        except OSError:
            pass
        orphaned.set()
        _stop(child)

    threading.Thread(target=watch_starter, name="starter-watch", daemon=True).start()
    status = child.wait()
    if orphaned.is_set() and remove:
        shutil.rmtree(remove, ignore_errors=True)
    return 128 - status if status < 0 else status


if __name__ == "__main__":
    sys.exit(main())
