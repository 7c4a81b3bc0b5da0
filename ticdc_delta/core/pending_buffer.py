"""Rows and DDL held until every partition of their topic has promised their commit ts.

The buffer is part of the job's durable state: it is saved with every micro-batch, so a held row survives
a crash and a restart (the Kafka offsets behind it are already past).
"""

from __future__ import annotations

from typing import Iterable, Iterator

from .records import Record

__all__ = ["PendingBuffer", "apply_order"]


def apply_order(record: Record) -> tuple[int, str, int, int, int]:
    """Sort key: commit ts, then the record's place in its partition (topic, partition, offset, idx).

    One row's changes always go to one partition, so for any key this is commit ts then offset order.
    """
    return (record.commit_ts or 0, record.topic, record.partition, record.offset, record.idx)


class PendingBuffer:
    """Held records, per topic."""

    def __init__(self, records: Iterable[Record] = ()) -> None:
        self._by_topic: dict[str, list[Record]] = {}
        for r in records:
            self.add(r)

    def add(self, record: Record) -> None:
        self._by_topic.setdefault(record.topic, []).append(record)

    def release(self, topic: str, upto: int | None) -> list[Record]:
        """Remove and return the records of ``topic`` with commit ts ≤ ``upto`` (none if ``upto`` is
        ``None``), in apply order."""
        held = self._by_topic.get(topic)
        if not held or upto is None:
            return []
        ready = [r for r in held if (r.commit_ts or 0) <= upto]
        if ready:
            self._by_topic[topic] = [r for r in held if (r.commit_ts or 0) > upto]
            ready.sort(key=apply_order)
        return ready

    def topics(self) -> list[str]:
        """The topics records are held of."""
        return sorted(t for t, held in self._by_topic.items() if held)

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_topic.values())

    def __iter__(self) -> Iterator[Record]:
        """Every held record, in a stable order (for the durable state)."""
        for topic in sorted(self._by_topic):
            yield from sorted(self._by_topic[topic], key=apply_order)
