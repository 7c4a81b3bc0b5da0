"""Bounded retries with exponential backoff, for the executors' reads of external stores (claim-check
objects, the upstream database): one helper so that every such read retries the same way."""

from __future__ import annotations

from typing import Callable, TypeVar

__all__ = ["retry_with_backoff"]

T = TypeVar("T")


def retry_with_backoff(
    call: Callable[[], T],
    *,
    attempts: int,
    backoff: float,
    sleep: Callable[[float], None],
    retry_on: tuple[type[BaseException], ...],
    reset: Callable[[], None],
) -> T:
    """``call()``, tried up to ``attempts`` times while it raises one of ``retry_on``: after each such
    failure ``reset()`` (drop a connection that may be broken), then, if tries remain, ``sleep`` —
    ``backoff`` seconds, doubling each time. Any other exception goes straight through.

    Raises:
        ValueError: ``attempts`` < 1.
        the last ``retry_on`` exception, when every attempt failed.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    delay = backoff
    for _ in range(attempts - 1):
        try:
            return call()
        except retry_on:
            reset()
        sleep(delay)
        delay *= 2
    try:
        return call()
    except retry_on:
        reset()
        raise
