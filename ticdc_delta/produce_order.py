"""Check that Kafka stored each partition's messages in the order they were produced.

A stream's meaning depends on each partition's order: a resolved ts covers what came before it on its
partition, and a message stored after a resolved ts that covers it is a replay, which the consumer drops.

One CI run of a fault test found a row missing against its oracle because the first request of a partition of a just-created
topic (48 messages) was stored after the requests that followed it, by a producer that was not
idempotent but had one request in flight (with which librdkafka documents ordered retries). The job
had done the right thing with what Kafka held: replaying the rules on the simulated stream with that
request moved gives that run's counts exactly (318 replays dropped instead of 235, the same 43 rows
held) and the one row it missed; the simulated stream in Kafka was simply not the one its oracle
described. The producers of the simulator and of :class:`~ticdc_delta.local_broker.LocalBroker` are
idempotent now (the broker refuses a write out of sequence). This ledger checks the offsets Kafka
reported for every message anyway, so that a stream stored in another order fails where it is
produced, not later as a difference from an oracle.
"""

from __future__ import annotations

from array import array
from typing import Any, Callable

from .errors import ProduceOrderError

__all__ = ["ProduceLedger"]


class ProduceLedger:
    """The offset Kafka gave each message of one topic, by partition, in produce order.

    :meth:`expect` before each produce gives the ``on_delivery`` callback of that message; :meth:`check`
    after the flush compares the offsets.
    """

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self._offsets: dict[int, array] = {}
        self.errors: list[Any] = []
        self.delivered = 0

    def expect(self, partition: int) -> Callable[[Any, Any], None]:
        """One more message to ``partition``: the ``on_delivery`` callback that records where it was stored."""
        found = self._offsets.get(partition)
        if found is None:
            found = self._offsets[partition] = array("q")
        index = len(found)
        found.append(-1)

        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                self.errors.append(err)
            else:
                found[index] = msg.offset()
                self.delivered += 1

        return on_delivery

    def check(self) -> None:
        """Raise unless, on every partition, each delivered message was stored after the ones produced
        before it (messages without a delivery are skipped: the caller reports those).

        Raises:
            ProduceOrderError: names the partition and the two messages.
        """
        for partition, offsets in sorted(self._offsets.items()):
            last, last_index = -1, -1
            for index, offset in enumerate(offsets):
                if offset < 0:
                    continue
                if offset <= last:
                    raise ProduceOrderError(
                        f"Kafka stored message #{index} to {self.topic!r}[{partition}] at offset {offset}, not "
                        f"after message #{last_index} (offset {last}), which was produced before it: the "
                        f"partition does not hold the messages in the order they were sent (a retried request "
                        f"of a producer that is not idempotent); produce them again into a new topic"
                    )
                last, last_index = offset, index
