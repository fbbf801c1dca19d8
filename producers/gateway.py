"""The receiver's one gateway to Redis: the accept script, the review message of a reused
id, and the reads behind backpressure and ``/metrics``.

Accepting an event into its shard queue and marking its id as seen is ONE Lua script
(:data:`~keylane.routing.contract.redis_scripts.ACCEPT_EVENT`). Invariant 1 needs the two
to be inseparable. If the mark came first, a receiver that dies before pushing would
leave a mark that swallows the sender's retry; if the push came first, a receiver that
dies before marking would let the retry enqueue a second copy. In one script, Redis runs
both or neither, and a concurrent duplicate waits behind the first and then sees its
mark. With ``appendfsync always`` (what ``keylane up`` configures) Redis writes the
script's effects to its append-only file before it replies, so a 202 is sent only for an
event that survives a Redis crash.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, RedisError

from ..routing import ShardMap
from ..routing.contract import redis_scripts as scripts
from ..routing.contract.destinations import FlowState, flow_states, queue_flow_reads
from ..routing.contract.redis_calls import broker_errors, reply_text
from ..routing.keys import RedisKeys

Verdict = Literal["accepted", "duplicate", "reused", "full"]


@dataclass(frozen=True)
class EnqueueResult:
    """What Redis said: the verdict and, for ``accepted``/``duplicate``/``reused``, the
    answer given to the first delivery (``full``: the queue depth)."""

    verdict: Verdict
    detail: str


@dataclass(frozen=True)
class QueueSnapshot:
    """Every shard queue at one instant: depth and head message by shard, and the drain
    counts the lanes keep."""

    depths: list[int]
    heads: list[bytes | None]
    drained: dict[int, int]


@dataclass(frozen=True)
class MetricSnapshot:
    """The deployment's counters and latency histogram, live workers and held keys."""

    counters: dict[str, float]
    latency: dict[str, float]
    members: int
    held: int
    destinations: list[FlowState] = field(default_factory=list)


class ReceiverGateway:
    """Typed access to Redis for the receiver (asyncio)."""

    def __init__(self, client: aioredis.Redis, keys: RedisKeys, shards: ShardMap) -> None:
        self.client = client
        self.keys = keys
        self.shards = shards
        self._accept_event = LoadedScript(scripts.ACCEPT_EVENT)
        self._record_id_reuse = LoadedScript(scripts.RECORD_ID_REUSE)

    @classmethod
    def from_url(cls, url: str, keys: RedisKeys, shards: ShardMap) -> ReceiverGateway:
        """Connect to Redis at ``url``, with timeouts so a dead server is an error."""
        client = aioredis.Redis.from_url(
            url, socket_timeout=5, socket_connect_timeout=5, health_check_interval=15
        )
        return cls(client, keys, shards)

    async def accept(
        self,
        *,
        source: str,
        event_id: str,
        body_sha256: str,
        queue: str,
        shard: int,
        message: bytes,
        answer: bytes,
        retention_ms: int,
        high_water: int,
        key_missing: bool = False,
    ) -> EnqueueResult:
        """Push ``message`` and mark ``event_id`` seen, unless already seen or the shard
        queue is at its high-water mark."""
        result = await self._run(
            self._accept_event,
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
        verdict, detail = (reply_text(x) for x in result)
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
        """Queue ``message`` (the event, marked for review only) once per distinct body
        sent under a reused id (senders retry a 409)."""
        result = await self._run(
            self._record_id_reuse,
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

    async def queues(self) -> QueueSnapshot:
        """Depth and head message of every shard queue, and the drain counts."""
        pipe = self.client.pipeline(transaction=False)
        for shard in range(self.shards.count):
            queue = self.keys.queue(self.shards.queue_name(shard))
            pipe.llen(queue)
            pipe.lindex(queue, -1)
        pipe.hgetall(self.keys.drained)
        with broker_errors():
            replies = await pipe.execute()
        n = self.shards.count
        return QueueSnapshot(
            depths=[int(replies[2 * s]) for s in range(n)],
            heads=[replies[2 * s + 1] for s in range(n)],
            drained={int(k): int(v) for k, v in replies[-1].items()},
        )

    async def metrics(self) -> MetricSnapshot:
        """Counters, latency histogram, live workers and held keys."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(self.keys.counters)
        pipe.hgetall(self.keys.latency)
        pipe.zcard(self.keys.members)
        pipe.hlen(self.keys.held)
        pipe.smembers(self.keys.destinations)
        with broker_errors():
            counters, latency, members, held, names = await pipe.execute()
            names = sorted(reply_text(n) for n in names)
            flow = self.client.pipeline(transaction=False)
            queue_flow_reads(flow, self.keys, names)
            destinations = flow_states(await flow.execute(), names)
        return MetricSnapshot(
            counters={reply_text(k): float(v) for k, v in counters.items()},
            latency={reply_text(k): float(v) for k, v in latency.items()},
            members=int(members),
            held=int(held),
            destinations=destinations,
        )

    async def close(self) -> None:
        """Release the connection pool."""
        await self.client.aclose()

    async def _run(self, script: LoadedScript, keys: list[str], args: list[Any]) -> Any:
        """``EVALSHA`` of ``script``; on ``NOSCRIPT`` (a restarted or flushed Redis),
        ``SCRIPT LOAD`` it and run it again."""
        evalsha: Any = self.client.evalsha  # its reply type differs between redis releases
        with broker_errors():
            try:
                return await evalsha(script.sha, len(keys), *keys, *args)
            except NoScriptError:
                await self.client.script_load(script.source)
                return await evalsha(script.sha, len(keys), *keys, *args)


@dataclass(frozen=True)
class LoadedScript:
    """A Lua script called by its SHA1 (``EVALSHA``): the body crosses the wire only
    when Redis does not have it yet."""

    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        digest = hashlib.sha1(self.source.encode(), usedforsecurity=False).hexdigest()
        object.__setattr__(self, "sha", digest)
