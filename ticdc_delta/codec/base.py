"""The decoder and encoder contract every wire protocol meets.

A Kafka message can hold many events (Open Protocol and Craft batch them), so a decoder returns a list.
A decoder either returns valid events or raises a :class:`~ticdc_delta.errors.DecodeError` subclass that
names the protocol, the message's coordinates and what was wrong; it never hangs and never returns a
half-decoded event.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

from .model import DecodeContext, Event

__all__ = ["Message", "RowEventDecoder", "EventEncoder", "parse_bool_option", "CompileGate", "COMPILE_AT"]


class Message(tuple):  # noqa: D101 - a (key, value) pair, documented below
    """A Kafka message as (key, value); either may be ``None``."""

    __slots__ = ()

    def __new__(cls, key: bytes | None, value: bytes | None) -> "Message":
        return tuple.__new__(cls, (key, value))

    @property
    def key(self) -> bytes | None:
        return self[0]  # type: ignore[no-any-return]

    @property
    def value(self) -> bytes | None:
        return self[1]  # type: ignore[no-any-return]


@runtime_checkable
class RowEventDecoder(Protocol):
    """Turns one Kafka message into the events it carries."""

    protocol: str

    def decode(self, key: bytes | None, value: bytes | None, ctx: DecodeContext) -> list[Event]:
        """All events of one message, in message order.

        Raises:
            DecodeError: the message is not valid for this protocol (a subclass says how).
        """
        ...


@runtime_checkable
class EventEncoder(Protocol):
    """Turns events into Kafka messages the way TiCDC would write them."""

    protocol: str

    def encode(self, events: Sequence[Event]) -> list[Message]:
        """Messages for ``events`` (all bound for one partition), in order.

        Batching protocols (Open Protocol, Craft) may pack several events into one message.

        Raises:
            EncodeError: an event this protocol cannot carry.
        """
        ...


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}


def parse_bool_option(options: dict[str, str] | None, name: str, default: bool = False) -> bool:
    """A boolean sink-uri option (``enable-tidb-extension=true``).

    Raises:
        ValueError: the value is not a boolean word.
    """
    if not options or name not in options:
        return default
    raw = str(options[name]).strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ValueError(f"option {name} must be true or false, got {options[name]!r}")


COMPILE_AT = 32
"""The sighting of a row shape at which a decoder writes code for it (:class:`CompileGate`)."""


class CompileGate:
    """When a row shape (a table's columns, types and flags) has been met often enough to write code for.

    Generating and compiling a shape's decoder costs what decoding a few hundred of its rows the plain way
    does (about 1 ms for 10 columns, 13 ms for 256): worth it for a table's stream of rows, not for a shape
    met once. A producer writing a new shape per message (a corrupt or hostile one) made every message pay
    the compile; now a shape decodes the plain way until its ``at``-th sighting, which bounds what that
    costs to about the plain decode's. The counts are bounded (``limit`` shapes; a full table starts over).
    ``at``: :data:`COMPILE_AT` as it is when the gate is made.
    """

    __slots__ = ("_counts", "_at", "_limit")

    def __init__(self, at: int | None = None, limit: int = 4096) -> None:
        self._counts: dict[Any, int] = {}
        self._at = COMPILE_AT if at is None else at
        self._limit = limit

    def due(self, shape: Any) -> bool:
        """Count a sighting of ``shape`` (hashable); True once it is due to be compiled (then forgotten:
        the caller keeps what it compiles)."""
        n = self._counts.get(shape, 0) + 1
        if n >= self._at:
            self._counts.pop(shape, None)
            return True
        if len(self._counts) >= self._limit:
            self._counts.clear()
        self._counts[shape] = n
        return False
