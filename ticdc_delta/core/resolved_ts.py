"""Watermarks: the latest resolved ts seen on each (topic, partition).

TiCDC broadcasts resolved ts to every partition; a resolved ts R on a partition promises that every
event with commit ts ≤ R has been sent there (seed 004: "小于等于这个时间点提交的数据已经全部下发").
A row is therefore safe to apply once every partition has promised its commit ts: when commit ts ≤
the minimum watermark over the partitions of every topic the job reads (:meth:`WatermarkTracker.global_low`:
one changefeed's topics get the same resolved ts, and a DDL in one topic orders rows in another). Watermarks
never go back: a smaller
resolved ts (a replay after a TiCDC restart) is ignored and counted.
"""

from __future__ import annotations

from typing import Iterable, Mapping

__all__ = ["WatermarkTracker", "lowest", "live_topics", "resolved_topics", "seed_new_partitions"]


class WatermarkTracker:
    """Per-partition watermarks and the per-topic minimum over a known set of partitions."""

    def __init__(self, watermarks: Mapping[tuple[str, int], int] | None = None) -> None:
        self._wm: dict[tuple[str, int], int] = dict(watermarks or {})
        self._partitions: dict[str, set[int]] = {}
        for topic, partition in self._wm:
            self._partitions.setdefault(topic, set()).add(partition)
        self.regressions = 0

    def add_partitions(self, topic: str, partitions: Iterable[int]) -> None:
        """Declare partitions of ``topic`` (a partition that never sent a resolved ts holds everything)."""
        self._partitions.setdefault(topic, set()).update(partitions)

    def observe(self, topic: str, partition: int, ts: int) -> bool:
        """Record a resolved ts; returns False (and counts it) when it would move the watermark back."""
        key = (topic, partition)
        self._partitions.setdefault(topic, set()).add(partition)
        current = self._wm.get(key)
        if current is not None and ts < current:
            self.regressions += 1
            return False
        self._wm[key] = ts
        return True

    def partition_watermark(self, topic: str, partition: int) -> int | None:
        """The watermark of one partition, ``None`` before its first resolved ts."""
        return self._wm.get((topic, partition))

    def topic_watermark(self, topic: str) -> int | None:
        """The minimum watermark over every known partition of ``topic``; ``None`` while any partition
        has not sent a resolved ts yet."""
        parts = self._partitions.get(topic)
        if not parts:
            return None
        low: int | None = None
        for p in parts:
            wm = self._wm.get((topic, p))
            if wm is None:
                return None
            if low is None or wm < low:
                low = wm
        return low

    def global_low(self, topics: Iterable[str] | None = None) -> int | None:
        """The minimum over ``topics`` (all known topics when None; ``None`` if any of them has no
        watermark yet)."""
        return lowest(self.topic_watermark(t) for t in (self._partitions if topics is None else topics))

    def snapshot(self) -> dict[tuple[str, int], int]:
        """A copy of the watermarks, for the durable state."""
        return dict(self._wm)

    def topics(self) -> list[str]:
        return sorted(self._partitions)


def seed_new_partitions(watermarks: Mapping[tuple[str, int], int], partitions: Mapping[str, Iterable[int]] | None,
                        released_low: int | None) -> dict[tuple[str, int], int]:
    """``watermarks`` with each partition that has none, of a topic that has some, starting at
    ``released_low`` (the bound rows were last released up to): a partition added to the topic since.

    Rows were released up to that bound only once every partition known then had resolved past it, and no
    watermark is ever forgotten: a partition without one is new. TiCDC had sent every event up to the bound
    to the partitions of that time, so an event at or below it arriving on the new partition is a re-send
    (a TiCDC restart replaying from its checkpoint, with keys and DDL now dispatched to the new partition too):
    a replay, dropped as on any partition. Without the seed, its DDL (a TRUNCATE) and old row versions were
    applied again. A topic with no watermark at all (added to the job since) is not seeded: nothing of it was
    ever read."""
    out = dict(watermarks)
    if released_low is None or not partitions:
        return out
    resolved = resolved_topics(watermarks)
    for topic, parts in partitions.items():
        if topic in resolved:
            for p in parts:
                out.setdefault((topic, p), released_low)
    return out


def live_topics(partitions: Mapping[str, Iterable[int]], watermarks: Mapping[tuple[str, int], int]) -> list[str]:
    """The topics of ``partitions`` (each listed topic's partitions, as the broker has them) that bound the
    rows released: all but a topic that has no partitions (it does not exist yet: TiCDC creates a topic of a
    topic dispatcher when it first writes to it, so nothing of it can be missing) and no watermark (a topic
    once read and gone since still holds every row back: what it had may not have been read)."""
    resolved = resolved_topics(watermarks)
    return sorted(t for t, parts in partitions.items() if parts or t in resolved)


def resolved_topics(watermarks: Mapping[tuple[str, int], int]) -> set[str]:
    """The topics of which a partition has sent a resolved ts (a watermark is never forgotten)."""
    return {topic for topic, _ in watermarks}


def lowest(watermarks: Iterable[int | None]) -> int | None:
    """The least of some topics' watermarks: the bound every row is released up to; ``None`` when there
    is none, or when one of them has none yet (it has promised nothing)."""
    values = list(watermarks)
    if not values or any(v is None for v in values):
        return None
    return min(v for v in values if v is not None)
