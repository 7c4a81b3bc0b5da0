"""Fixtures of the integration tests (the broker and the Spark session are in ``tests/conftest.py``)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["ProgressLines"]


class ProgressLines(logging.Handler):
    """Collects the job's progress lines (logger ``ticdc_delta.progress``, one JSON object per
    micro-batch), parsed, in ``lines``."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(record.getMessage()))


@pytest.fixture
def progress() -> Iterator[ProgressLines]:
    """The progress lines the job logs during the test (``progress.lines``)."""
    handler = ProgressLines()
    log = logging.getLogger("ticdc_delta.progress")
    old = log.level
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    yield handler
    log.removeHandler(handler)
    log.setLevel(old)
