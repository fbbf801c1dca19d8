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

from typing import Protocol

from ..routing.contract.schedules import RunLease
from ..routing.contract.settings import Settings
from .amqp import AmqpEventQueue
from .gateway import EnqueueResult, ReceiverGateway


class EventQueue(Protocol):
    """Where accepted events go (see the module docstring)."""

    @property
    def redis(self) -> ReceiverGateway:
        """The Redis behind the dedupe marks, counters and queue reads."""
        ...

    async def accept(
        self,
        *,
        source: str,
        event_id: str,
        body_sha256: str,
        queue: str,
        shard: int,
        message: bytes,
        record_key: str,
        answer: bytes,
        retention_ms: int,
        high_water: int,
        key_missing: bool = False,
        lease: RunLease | None = None,
    ) -> EnqueueResult:
        """Queue ``message`` and mark ``event_id`` seen, unless seen before (the first
        answer), reused with another body, the shard is full, or ``lease`` was lost."""
        ...

    async def record_reuse(
        self,
        *,
        source: str,
        event_id: str,
        body_sha256: str,
        queue: str,
        shard: int,
        message: bytes,
        record_key: str,
        retention_ms: int,
    ) -> bool:
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
