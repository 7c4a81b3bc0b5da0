"""The bounded retry shared by the executors' reads of external stores."""

from __future__ import annotations

import pytest

from ticdc_delta.codec.backoff import retry_with_backoff


def test_retries_then_raises_the_last_error_resetting_after_every_failure() -> None:
    pauses: list[float] = []
    calls: list[int] = []
    resets: list[int] = []

    def call() -> int:
        calls.append(1)
        raise OSError(f"down {len(calls)}")

    with pytest.raises(OSError, match="down 3"):
        retry_with_backoff(call, attempts=3, backoff=0.5, sleep=pauses.append, retry_on=(OSError,),
                           reset=lambda: resets.append(1))
    assert len(calls) == 3 and len(resets) == 3 and pauses == [0.5, 1.0]


def test_a_success_after_failures_and_other_errors_go_straight_through() -> None:
    outcomes = iter([OSError("once"), 7])

    def call() -> int:
        got = next(outcomes)
        if isinstance(got, Exception):
            raise got
        return got

    pauses: list[float] = []
    assert retry_with_backoff(call, attempts=4, backoff=1.0, sleep=pauses.append, retry_on=(OSError,),
                              reset=lambda: None) == 7
    assert pauses == [1.0]

    def bad() -> int:
        raise KeyError("not retried")

    with pytest.raises(KeyError):
        retry_with_backoff(bad, attempts=4, backoff=1.0, sleep=pauses.append, retry_on=(OSError,), reset=lambda: None)
    assert pauses == [1.0]
    with pytest.raises(ValueError, match="attempts must be >= 1, got 0"):
        retry_with_backoff(bad, attempts=0, backoff=1.0, sleep=pauses.append, retry_on=(OSError,), reset=lambda: None)
