"""The spark engine's conflict handling (no JVM: the retry loop around a commit attempt)."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from ticdc_delta.config import config_from_mapping
from ticdc_delta.errors import ConcurrentCommitError, TransientError
from ticdc_delta.spark.engine import SparkEngine, is_conflict, staging_path


def _engine(tmp_path: Path, retries: int) -> SparkEngine:
    cfg = config_from_mapping({
        "changefeed": "cf", "source": {"bootstrap_servers": "127.0.0.1:1", "topic": "t", "protocol": "craft"},
        "sink": {"path": str(tmp_path / "lake"), "engine": "spark", "conflict_retries": retries},
        "checkpoint": str(tmp_path / "ckpt"),
    })
    return SparkEngine(types.SimpleNamespace(cfg=cfg))


class _JavaError(Exception):
    """Stands in for the Py4J error text Delta's conflicts arrive as."""


def test_conflicts_are_retried_then_retryable(tmp_path: Path) -> None:
    engine = _engine(tmp_path, 2)
    calls = []

    def lose() -> None:
        calls.append(1)
        raise _JavaError("io.delta.exceptions.ConcurrentAppendException: Files were added to the root of the table")

    with pytest.raises(ConcurrentCommitError, match="kept conflicting \\(3 attempts\\).*ConcurrentAppendException") as info:
        engine._retry("merge into s.t", lose)
    assert len(calls) == 3 and isinstance(info.value, TransientError)


def test_a_conflict_then_success_commits_once_and_other_errors_pass_through(tmp_path: Path) -> None:
    engine = _engine(tmp_path, 3)
    outcomes = [_JavaError("ConcurrentDeleteReadException: a file was removed"), "done"]

    def attempt() -> str:
        out = outcomes.pop(0)
        if isinstance(out, Exception):
            raise out
        return out

    assert engine._retry("merge", attempt) == "done" and outcomes == []
    with pytest.raises(ValueError, match="not a conflict"):
        engine._retry("merge", lambda: (_ for _ in ()).throw(ValueError("not a conflict")))
    assert not is_conflict(ValueError("cannot cast string to long"))
    assert is_conflict(_JavaError("[DELTA_CONCURRENT_APPEND] ConcurrentAppendException"))


def test_staging_lives_under_the_checkpoint(tmp_path: Path) -> None:
    assert staging_path(str(tmp_path / "ckpt")) == str(tmp_path / "ckpt" / "staging")
