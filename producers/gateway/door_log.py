"""The deliveries the receiver turned away, kept in a bounded Redis stream per source
(``RedisKeys.door``; what an entry holds: ``routing/contract/door.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis

from ...routing.redis_keys import RedisKeys
from .redis_calls import broker_errors

#: One kept refusal: its source and its fields.
DoorEntry = tuple[str, Mapping[str, bytes | str | int]]


class DoorLog:
    """Appends kept refusals to their source's stream, trimmed to the newest ``keep``."""

    def __init__(self, client: aioredis.Redis, keys: RedisKeys) -> None:
        self.client = client
        self.keys = keys

    async def keep(self, entries: Sequence[DoorEntry], keep: int) -> int:
        """``XADD`` each entry (``MAXLEN keep``, exact) in one round trip; how many Redis
        refused (a key of another type, ``OOM``). :class:`BrokerUnavailable` when Redis
        cannot be reached at all."""
        pipe = self.client.pipeline(transaction=False)
        for source, fields in entries:
            entry: dict[Any, Any] = dict(fields)
            pipe.xadd(self.keys.door(source), entry, maxlen=keep, approximate=False)
        with broker_errors():
            replies = await pipe.execute(raise_on_error=False)
        return sum(1 for reply in replies if isinstance(reply, Exception))
