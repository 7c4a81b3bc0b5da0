"""Forged or corrupt timestamps: a resolved ts or commit ts implausibly far in the future is not taken."""

from __future__ import annotations

import pytest

from ticdc_delta.core.batch_planner import OFFSET_ORDER, WATERMARK, ConsumerState, RejectedTs, plan_batch
from ticdc_delta.core.merge import KeyResolver
from ticdc_delta.core.ts_guard import TsGuard, tso_physical_ms

from .test_batch_planner import ddl, final, rm, row

NOW_MS = 1_763_900_000_000  # 2025-11-23
HOUR_MS = 3_600_000
FORGED = (1 << 63) - 1


def tso(ms: int, logical: int = 0) -> int:
    return ms << 18 | logical


def plan(state, records, resolved, guard=None, mode=WATERMARK):
    return plan_batch(state, records, resolved, mode=mode, keys=KeyResolver(), partitions={"cdc": (0, 1)},
                      guard=guard)


GUARD = TsGuard(NOW_MS, HOUR_MS)


def test_bound_is_reference_plus_tolerance_with_any_logical_part() -> None:
    assert tso_physical_ms(GUARD.max_ts) == NOW_MS + HOUR_MS
    assert GUARD.check(tso(NOW_MS + HOUR_MS, (1 << 18) - 1)) is None
    assert GUARD.check(tso(NOW_MS - 86_400_000)) is None  # the past is always fine
    assert GUARD.check(None) is None
    reason = GUARD.check(tso(NOW_MS + HOUR_MS + 1), "resolved ts")
    assert reason is not None
    assert f"resolved ts {tso(NOW_MS + HOUR_MS + 1)}" in reason and "1h ahead" in reason
    assert str(GUARD.max_ts) in reason and "2025-11-23" in reason
    assert "beyond year 9999" not in reason
    assert "physical time" in GUARD.check(FORGED, "resolved ts")  # type: ignore[operator]


@pytest.mark.parametrize("reference,tolerance", [(-1, 0), (0, -1), (True, 0), (1.5, 0)])
def test_guard_argument_checks(reference: object, tolerance: object) -> None:
    with pytest.raises(ValueError, match="must be an int >= 0"):
        TsGuard(reference, tolerance)  # type: ignore[arg-type]


def _forged_watermark_batches(guard):
    """Partition 0 gets a forged watermark 2^63-1 between two rows; partition 1 is honest."""
    now = tso(NOW_MS)
    first = plan(ConsumerState(), [row(now, 0, 0, "insert", {"id": 1, "v": "a"})],
                 [rm(0, 1, FORGED), rm(1, 0, now + 10)], guard)
    later = [row(now + 5, 0, 2, "insert", {"id": 2, "v": "b"}), row(now + 15, 1, 1, "insert", {"id": 3, "v": "c"})]
    second = plan(first.state, later, [rm(0, 3, now + 20), rm(1, 2, now + 20)], guard)
    return first, second


def test_forged_watermark_without_the_guard_drops_every_later_row_as_a_replay() -> None:
    """The reproduction: the unguarded rule takes the forged watermark and drops the next row."""
    _, second = _forged_watermark_batches(None)
    assert second.replays_dropped == 1
    assert second.state.watermarks[("cdc", 0)] == FORGED


def test_forged_watermark_is_rejected_and_later_rows_apply() -> None:
    first, second = _forged_watermark_batches(GUARD)
    assert first.rejected == [RejectedTs("cdc", 0, 1, 0, "resolved", FORGED, GUARD.check(FORGED, "resolved ts"))]
    assert ("cdc", 0) not in first.state.watermarks  # the forged ts moved nothing
    assert second.rejected == [] and second.replays_dropped == 0
    applied = {}
    for p in (first, second):
        for step in p.steps:
            applied.update(final(step))
    assert sorted(applied) == [(1,), (2,), (3,)]
    assert second.state.watermarks[("cdc", 0)] == tso(NOW_MS) + 20


@pytest.mark.parametrize("mode", [WATERMARK, OFFSET_ORDER])
def test_rows_and_ddl_from_the_future_are_neither_applied_nor_held(mode: str) -> None:
    now = tso(NOW_MS)
    future = tso(NOW_MS + 2 * HOUR_MS)
    records = [
        row(now, 0, 0, "insert", {"id": 1, "v": "a"}),
        row(future, 0, 1, "insert", {"id": 2, "v": "forged"}),
        ddl(future, 1, 0),
    ]
    p = plan(ConsumerState(), records, [rm(0, 2, now + 1), rm(1, 1, now + 1)], GUARD, mode=mode)
    assert [(r.partition, r.offset, r.kind, r.ts) for r in p.rejected] == [(0, 1, "row", future), (1, 0, "ddl", future)]
    assert "row commit ts" in p.rejected[0].reason and "ddl commit ts" in p.rejected[1].reason
    assert p.held == 0
    assert [final(s) for s in p.steps] == [{(1,): ("u", {"id": 1, "v": "a"})}]


def test_same_state_batch_and_clock_give_the_same_plan() -> None:
    a, _ = _forged_watermark_batches(GUARD)
    b, _ = _forged_watermark_batches(TsGuard(NOW_MS, HOUR_MS))
    assert a.rejected == b.rejected and a.state == b.state
