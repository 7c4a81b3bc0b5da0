"""The orphan guard: the command it runs ends when the guard's starter dies (however it died), and only then
is the directory removed; signals reach the command and its status comes back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import ticdc_delta.orphan_guard as orphan_guard



def _command(pid_file: Path, *, trap_term: bool = False, exit_code: int | None = None) -> list[str]:
    """A Python command that writes its pid, then sleeps (or exits with ``exit_code``)."""
    body = [f"import os, signal, sys, time; open({str(pid_file)!r}, 'w').write(str(os.getpid()))"]
    if trap_term:  # as a JVM shuts down on SIGTERM: ends by itself with status 143
        body.append("signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))")
    body.append(f"sys.exit({exit_code})" if exit_code is not None else "time.sleep(120)")
    return [sys.executable, "-c", "; ".join(body)]


def _wait_for(predicate: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (dead, not yet reaped) counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return sys.platform != "linux"


def test_the_command_stops_and_the_directory_goes_when_the_starter_is_killed(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "data").write_text("x")
    pid_file = tmp_path / "pid"
    guarded = orphan_guard.guarded(_command(pid_file, trap_term=True), remove=work)
    # the starter: holds the guard's input pipe, as LocalBroker does, and is then killed
    starter = subprocess.Popen(
        [sys.executable, "-c",
         f"import subprocess, time; subprocess.Popen({guarded!r}, stdin=subprocess.PIPE, start_new_session=True); "
         "time.sleep(120)"],
    )
    try:
        _wait_for(lambda: pid_file.exists() and pid_file.read_text() != "", "the command to start")
        pid = int(pid_file.read_text())
        time.sleep(0.3)
        assert _alive(pid) and work.exists()  # the starter lives: nothing happens
        starter.kill()
        starter.wait()
        _wait_for(lambda: not _alive(pid), "the command to stop")
        _wait_for(lambda: not work.exists(), "the directory to go")
    finally:
        starter.kill()
        starter.wait()


def test_a_stopped_guard_stops_its_command_and_keeps_the_directory(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    pid_file = tmp_path / "pid"
    guard = subprocess.Popen(orphan_guard.guarded(_command(pid_file, trap_term=True), remove=work),
                             stdin=subprocess.PIPE, start_new_session=True)
    try:
        _wait_for(lambda: pid_file.exists() and pid_file.read_text() != "", "the command to start")
        pid = int(pid_file.read_text())
        guard.send_signal(signal.SIGTERM)  # passed on to the command, which exits 143 by itself
        assert guard.wait(timeout=20) == 143
        assert not _alive(pid)
        assert work.exists()  # the starter is alive: it may start the command on the directory again
    finally:
        assert guard.stdin is not None
        guard.stdin.close()
        if guard.poll() is None:
            guard.kill()
            guard.wait()


def test_a_command_killed_by_a_signal_reports_128_plus_its_number(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    guard = subprocess.Popen(orphan_guard.guarded(_command(pid_file)), stdin=subprocess.PIPE)
    try:
        _wait_for(lambda: pid_file.exists() and pid_file.read_text() != "", "the command to start")
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        assert guard.wait(timeout=20) == 128 + signal.SIGKILL
    finally:
        assert guard.stdin is not None
        guard.stdin.close()


def test_the_commands_own_exit_status_comes_back(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    guard = subprocess.Popen(orphan_guard.guarded(_command(tmp_path / "pid", exit_code=3), remove=work),
                             stdin=subprocess.PIPE)
    try:
        assert guard.wait(timeout=30) == 3
        assert work.exists()  # it ended by itself while its starter lived
    finally:
        assert guard.stdin is not None
        guard.stdin.close()


@pytest.mark.parametrize("argv, message", [
    ([], "usage"),
    (["sleep", "1"], "usage"),
    (["--"], "usage"),
    (["--remove"], "--remove needs a directory"),
    (["--remove", "/tmp/x", "sleep"], "usage"),
])
def test_a_wrong_command_line_is_refused(argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        orphan_guard.main(argv)
