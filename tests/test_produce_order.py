"""The produce-order ledger: a partition whose messages Kafka stored in another order than they were produced
fails where they are produced (the simulator's KafkaSink, LocalBroker.produce_many), naming the messages."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ticdc_delta.errors import ProduceOrderError
from ticdc_delta.produce_order import ProduceLedger


class _Stored:
    """What a delivery report gives the ledger: where the message was stored."""

    def __init__(self, offset: int) -> None:
        self._offset = offset

    def offset(self) -> int:
        return self._offset


def test_messages_stored_in_produce_order_pass() -> None:
    ledger = ProduceLedger("t")
    callbacks = [(p, ledger.expect(p)) for p in (0, 1, 0, 1, 0)]
    stored = {0: iter([10, 11, 15]), 1: iter([3, 4])}  # (another producer's messages in between: fine)
    reports = [(on_delivery, _Stored(next(stored[p]))) for p, on_delivery in callbacks]
    for on_delivery, msg in reversed(reports):  # reports may come in any order
        on_delivery(None, msg)
    ledger.check()
    assert ledger.delivered == 5 and not ledger.errors


def test_a_partition_stored_out_of_order_is_refused_naming_the_messages() -> None:
    ledger = ProduceLedger("orders")
    first, second, third = ledger.expect(2), ledger.expect(2), ledger.expect(2)
    other = ledger.expect(0)
    # the first request was retried after the next ones had been stored
    second(None, _Stored(0))
    third(None, _Stored(1))
    first(None, _Stored(2))
    other(None, _Stored(0))
    with pytest.raises(ProduceOrderError, match=r"message #1 to 'orders'\[2\] at offset 0, not after message #0 "
                                                r"\(offset 2\)"):
        ledger.check()


def test_failed_and_missing_deliveries_are_left_to_the_caller() -> None:
    ledger = ProduceLedger("t")
    failed, lost, kept = ledger.expect(0), ledger.expect(0), ledger.expect(0)
    failed("broker said no", None)
    kept(None, _Stored(7))
    del lost  # never reported
    ledger.check()  # nothing stored out of order among what was stored
    assert ledger.errors == ["broker said no"] and ledger.delivered == 1


@pytest.mark.integration
def test_the_ledger_reads_the_offsets_a_real_broker_gives(broker: Any, unique_name: Callable[[str], str]) -> None:
    """Two messages produced in the opposite order to the one the ledger expected (as a retried first
    request would store them) are refused; the idempotent producers keep the order."""
    from ticdc_delta.simulator.output import KafkaSink

    topic = unique_name("order")
    broker.create_topic(topic, 1)
    producer = broker.producer()
    ledger = ProduceLedger(topic)
    expected_first, expected_second = ledger.expect(0), ledger.expect(0)
    producer.produce(topic, value=b"second", partition=0, on_delivery=expected_second)
    producer.flush(30)
    producer.produce(topic, value=b"first", partition=0, on_delivery=expected_first)
    producer.flush(30)
    assert ledger.delivered == 2
    with pytest.raises(ProduceOrderError, match=r"message #1 to '.*'\[0\] at offset 0, not after message #0"):
        ledger.check()

    # both producers of the project check what they sent
    assert broker.produce_many(topic, [(0, None, str(i).encode()) for i in range(50)]) == 50
    sink = KafkaSink(broker.bootstrap_servers, topic, 1)
    for i in range(50):
        sink.write(0, None, str(i).encode())
    sink.close()
    assert broker.high_watermarks(topic, [0]) == {0: 102}
