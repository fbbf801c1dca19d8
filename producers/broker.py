"""The producer side's broker: the one interface the accept path talks to, and the one
function that opens it from settings (the only place this side asks which broker it is).

* Redis (the default): :class:`~keylane.producers.gateway.ReceiverGateway`; dedupe,
  high-water mark and push are one script.
* RabbitMQ: :class:`~keylane.producers.amqp.AmqpEventQueue`; the event is published to
  its shard's quorum queue with a confirm, and Redis keeps only the dedupe marks and the
  counters.

On either, Redis holds what the receiver reads for backpressure and ``/metrics``
(:attr:`EventQueue.redis`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..routing.contract.schedules import RunLease
from ..routing.contract.settings import Settings
from .amqp import AmqpEventQueue
from .gateway import BatchResult, Enqueue, EnqueueResult, ReceiverGateway


class EventQueue(Protocol):
    """Where accepted events go (see the module docstring)."""

    @property
    def redis(self) -> ReceiverGateway:
        """The Redis behind the dedupe marks, counters and queue reads."""
        ...

    async def accept(self, item: Enqueue, share: int = 0) -> EnqueueResult:
        """Queue the item's message and mark its event id seen, unless seen before (the
        first answer, or the stored outcome), reused with another body, the shard is full,
        its lease was lost, or its source is over its ``share`` of the backlog."""
        ...

    async def accept_batch(
        self, items: Sequence[Enqueue], lease: RunLease | None = None, share: int = 0
    ) -> BatchResult:
        """Accept every event of one delivery, or none of them: a 2xx only when each is
        queued (or seen before); a full shard, a lost ``lease``, a source over its
        ``share`` of the backlog (0: none; Redis only) or an unreachable broker refuses
        the whole delivery, and no mark then swallows the sender's retry."""
        ...

    async def record_reuse(self, item: Enqueue) -> bool:
        """Queue the review message of an id reused with another body (True if queued)."""
        ...

    async def ping(self) -> bool:
        """Whether an event can be accepted now (``/readyz``)."""
        ...

    async def close(self) -> None:
        """Close every connection this queue opened."""
        ...


def open_event_queue(settings: Settings) -> EventQueue:
    """The event queue of ``settings``' broker (connections open on first use)."""
    if settings.broker_is_rabbitmq:
        return AmqpEventQueue(settings)
    return ReceiverGateway.from_settings(settings)
