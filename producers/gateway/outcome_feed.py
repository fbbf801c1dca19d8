"""The outcome feed: the told outcomes the lanes publish, heard by a receiver's waiting
requests through one subscription (:mod:`keylane.producers.outcome_waits` hands them out)."""

from __future__ import annotations

import contextlib
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from .redis_calls import broker_errors


class OutcomeFeed:
    """One subscription to the channel the lanes publish told outcomes on: one
    connection of its own (pub/sub holds it), whatever the number of waiters."""

    def __init__(self, client: aioredis.Redis, channel: str) -> None:
        self._pubsub = client.pubsub(ignore_subscribe_messages=True)
        self._channel = channel

    async def open(self) -> None:
        """Subscribe (the caller waits for nothing it may have missed before this)."""
        with broker_errors():
            await self._pubsub.subscribe(self._channel)

    async def next(self, timeout_s: float) -> bytes | None:
        """The next told outcome heard, or None after ``timeout_s`` without one;
        :class:`BrokerUnavailable` once the subscription is lost (outcomes may have been
        missed)."""
        with broker_errors():
            message = await self._pubsub.get_message(timeout=timeout_s)
        if message is None or message.get("type") != "message":
            return None
        data: bytes = message["data"]
        return data

    async def close(self) -> None:
        """Unsubscribe and release the connection."""
        # Typed through Any: redis-py 6.4, the oldest keylane allows, left it untyped.
        aclose: Any = self._pubsub.aclose
        with contextlib.suppress(RedisError):  # already lost
            await aclose()
