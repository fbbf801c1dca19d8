"""Accepting an event into its shard queue and marking its id as seen: one Lua script.

Invariant 1 needs the two to be inseparable. If the mark came first, a receiver that dies
before pushing would leave a mark that swallows the sender's retry; if the push came
first, a receiver that dies before marking would let the retry enqueue a second copy.
In one script, Redis runs both or neither, and a concurrent duplicate waits behind the
first and then sees its mark. With ``appendfsync always`` (what ``keylane up`` configures)
Redis writes the script's effects to its append-only file before it replies, so a 202 is
sent only for an event that survives a Redis crash.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from keylane.routing.contract.errors import BrokerUnavailable
from keylane.routing.keys import RedisKeys

_ENQUEUE = """
local seen = redis.call('GET', KEYS[1])
if seen then
  local sep = string.find(seen, '\\n', 1, true)
  if string.sub(seen, 1, sep - 1) == ARGV[1] then
    redis.call('HINCRBY', KEYS[3], 'duplicate_deliveries', 1)
    return {'duplicate', string.sub(seen, sep + 1)}
  end
  redis.call('HINCRBY', KEYS[3], 'reused_ids', 1)
  return {'reused', string.sub(seen, sep + 1)}
end
local depth = redis.call('LLEN', KEYS[2])
if depth >= tonumber(ARGV[5]) then
  redis.call('HINCRBY', KEYS[3], 'refused_full', 1)
  return {'full', tostring(depth)}
end
redis.call('LPUSH', KEYS[2], ARGV[2])
redis.call('SET', KEYS[1], ARGV[1] .. '\\n' .. ARGV[3], 'PX', ARGV[4])
redis.call('PUBLISH', ARGV[6], ARGV[7])
redis.call('HINCRBY', KEYS[3], 'accepted', 1)
if ARGV[8] == '1' then redis.call('HINCRBY', KEYS[3], 'keyless', 1) end
return {'accepted', ARGV[3]}
"""

_REVIEW = """
if redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then
  redis.call('LPUSH', KEYS[2], ARGV[2])
  redis.call('PUBLISH', ARGV[3], ARGV[4])
  return 1
end
return 0
"""

Verdict = Literal["accepted", "duplicate", "reused", "full"]


@dataclass(frozen=True)
class EnqueueResult:
    """What Redis said: the verdict and, for ``accepted``/``duplicate``/``reused``, the
    answer given to the first delivery (``full``: the queue depth)."""

    verdict: Verdict
    detail: str


class Enqueuer:
    """Runs the accept script (asyncio)."""

    def __init__(self, client: aioredis.Redis, keys: RedisKeys) -> None:
        self.client = client
        self.keys = keys
        self._enqueue = client.register_script(_ENQUEUE)
        self._review = client.register_script(_REVIEW)

    async def accept(
        self,
        *,
        source: str,
        event_id: str,
        body_sha256: str,
        queue: str,
        shard: int,
        message: bytes,
        answer: str,
        retention_ms: int,
        high_water: int,
        key_missing: bool = False,
    ) -> EnqueueResult:
        """Push ``message`` and mark ``event_id`` seen, unless already seen or the shard
        queue is at its high-water mark."""
        result = await self._run(
            self._enqueue,
            [self.keys.dedupe(source, event_id), self.keys.queue(queue), self.keys.counters],
            [
                body_sha256,
                message,
                answer,
                retention_ms,
                high_water,
                self.keys.doorbell,
                shard,
                "1" if key_missing else "0",
            ],
        )
        verdict, detail = (_text(x) for x in result)
        return EnqueueResult(verdict, detail)  # type: ignore[arg-type]

    async def record_reuse(
        self,
        *,
        source: str,
        event_id: str,
        body_sha256: str,
        queue: str,
        shard: int,
        message: bytes,
        retention_ms: int,
    ) -> bool:
        """Queue one review message per distinct reused body (senders retry a 409)."""
        result = await self._run(
            self._review,
            [self.keys.reused(source, event_id, body_sha256), self.keys.queue(queue)],
            [retention_ms, message, self.keys.doorbell, shard],
        )
        return bool(result)

    async def ping(self) -> bool:
        """Whether Redis answers."""
        try:
            return bool(await self.client.ping())
        except RedisError:
            return False

    @staticmethod
    async def _run(script: Any, keys: list[str], args: list[Any]) -> Any:
        try:
            return await script(keys=keys, args=args)
        except RedisError as exc:
            raise BrokerUnavailable(f"Redis: {exc}") from exc


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
