"""The remembered event ids as a test looks at them (``RedisKeys.seen_ids``): whether an id
is remembered, and forgetting one as its expiry would."""

from __future__ import annotations

from collections.abc import Iterator

import redis

from keylane.routing.redis_keys import RedisKeys, seen_id


def _holding(client: redis.Redis, keys: RedisKeys, source: str, event_id: str) -> Iterator[str]:
    """The hashes that remember ``event_id`` of ``source`` (any period)."""
    seen = seen_id(event_id)
    for key in client.scan_iter(match=f"{keys.seen_ids(source)}*:{seen.slot}", count=1000):
        if client.hexists(key, seen.field):
            yield key.decode()


def remembered(client: redis.Redis, keys: RedisKeys, source: str, event_id: str) -> bool:
    """Whether ``event_id`` of ``source`` is remembered (in the compact layout)."""
    return any(_holding(client, keys, source, event_id))


def forget(client: redis.Redis, keys: RedisKeys, source: str, event_id: str) -> None:
    """Forget ``event_id`` of ``source``, in either layout, as its expiry would."""
    field = seen_id(event_id).field
    for key in list(_holding(client, keys, source, event_id)):
        client.hdel(key, field)
    client.delete(keys.dedupe(source, event_id))
