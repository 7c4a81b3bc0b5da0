"""The plausibility rule for TiDB timestamps (TSO) read from Kafka: a resolved ts or commit ts from the
future is forged or corrupt, and is not taken.

Why: a resolved ts raises its partition's watermark for good, and every later row below it is dropped as a
replay. One canal-json ``TIDB_WATERMARK`` with ``watermarkTs`` 2^63-1 (or a bit-flipped Craft message:
Craft carries no checksum) would silently drop every later row of its partition. A row whose commit ts is
from the future would be held forever (or, once applied, stamp a wrong ``_tidb_commit_ts``).

The rule: a TSO is ``physical_ms << 18 | logical`` (PD's layout); it is plausible when its physical time
is at most ``tolerance`` after a *reference clock*. Anything later is rejected (the caller dead-letters it
with the message from :meth:`TsGuard.check`).

The reference clock must be deterministic: the batch plan is a pure function of (previous state, batch),
so that a re-run after a crash decides the same. Plain wall-clock time at re-run is not: a resolved ts
rejected by the first attempt could be taken by the re-run. The Spark job uses the micro-batch's
``batchTimestampMs``, which Spark writes to its offset log before the batch runs and re-uses when the
batch is re-run (see :mod:`ticdc_delta.spark.batch_handler`); any engine can use another durable clock.

Plain Python, no Spark: a DataFrame engine uses :attr:`TsGuard.max_ts` as a literal in a filter.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

__all__ = ["LOGICAL_BITS", "tso_physical_ms", "TsGuard"]

LOGICAL_BITS = 18
"""A TiDB TSO keeps 18 bits of logical counter below the physical milliseconds."""


def tso_physical_ms(ts: int) -> int:
    """The wall-clock milliseconds of a TiDB TSO (physical << 18 | logical)."""
    return ts >> LOGICAL_BITS


def _iso(ms: int) -> str:
    try:
        return datetime.fromtimestamp(ms / 1000.0, tz=timezone.utc).isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return "beyond year 9999"


def _duration(ms: int) -> str:
    seconds = ms / 1000.0
    for unit, size in (("h", 3600.0), ("min", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


@dataclass(frozen=True)
class TsGuard:
    """TSOs whose physical time is more than ``tolerance_ms`` after ``reference_ms`` are implausible.

    Args:
        reference_ms: the reference clock, milliseconds since the epoch (deterministic per batch).
        tolerance_ms: how far ahead of it a TSO may be (clock skew between PD and the job's driver).

    Raises:
        ValueError: a negative ``reference_ms`` or ``tolerance_ms``.
    """

    reference_ms: int
    tolerance_ms: int

    def __post_init__(self) -> None:
        for name in ("reference_ms", "tolerance_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")

    @property
    def max_ts(self) -> int:
        """The largest plausible TSO: the bound's physical time with the largest logical counter."""
        return ((self.reference_ms + self.tolerance_ms + 1) << LOGICAL_BITS) - 1

    def check(self, ts: int | None, what: str = "commit ts") -> str | None:
        """``None`` when ``ts`` is plausible (or absent), else the reason it is not, naming the ts, its
        physical time and the bound."""
        if ts is None or ts <= self.max_ts:
            return None
        return (
            f"{what} {ts} (physical time {_iso(tso_physical_ms(ts))}) is more than "
            f"{_duration(self.tolerance_ms)} ahead of the reference clock {_iso(self.reference_ms)} "
            f"(largest plausible ts {self.max_ts}, source.max_future_ts): forged or corrupt, not taken"
        )
