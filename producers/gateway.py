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

from dataclasses import dataclass, field
from typing import Any, Literal

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from ..routing import ShardMap
from ..routing.contract import redis_scripts as scripts
from ..routing.contract.destinations import FlowState, flow_states, queue_flow_reads
from ..routing.contract.events import Event
from ..routing.contract.message import build_apply_message
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
    """The deployment's counters and latency histogram, live workers, held keys, flow
    control, and the figures of the last prune."""

    counters: dict[str, float]
    latency: dict[str, float]
    members: int
    held: int
    destinations: list[FlowState] = field(default_factory=list)
    retention: dict[str, float] = field(default_factory=dict)  # the last prune's figures


def accepted_answer(event: Event, queue: str) -> dict[str, Any]:
    """The answer to an accepted event, kept with its dedupe mark and replayed to
    duplicates."""
    answer: dict[str, Any] = {
        "status": "accepted",
        "source": event.source,
        "event_id": event.event_id,
        "record_key": event.record_key,
        "shard": event.shard,
        "queue": queue,
    }
    if event.key_missing:
        answer["key_missing"] = True
    return answer


class ReceiverGateway:
    """Typed access to Redis for the receiver (asyncio)."""

    def __init__(self, client: aioredis.Redis, keys: RedisKeys, shards: ShardMap) -> None:
        self.client = client
        self.keys = keys
        self.shards = shards
        self._accept_event = client.register_script(scripts.ACCEPT_EVENT)
        self._record_id_reuse = client.register_script(scripts.RECORD_ID_REUSE)

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
        answer: str,
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

    async def accept_event(
        self,
        event: Event,
        queue: str,
        answer: str,
        retention_ms: int,
        high_water: int,
        batch: int = 1,
    ) -> EnqueueResult:
        """:meth:`accept` for ``event``, as the apply message of ``queue`` (``batch``: the
        source's batch limit, see :func:`build_apply_message`)."""
        return await self.accept(
            source=event.source,
            event_id=event.event_id,
            body_sha256=event.body_sha256,
            queue=queue,
            shard=event.shard,
            message=build_apply_message(event, queue, batch=batch),
            answer=answer,
            retention_ms=retention_ms,
            high_water=high_water,
            key_missing=event.key_missing,
        )

    async def record_reuse(self, event: Event, queue: str, retention_ms: int) -> bool:
        """Queue one review message per distinct body sent under ``event``'s reused id
        (senders retry a 409): the event, marked for review only."""
        review = event.model_copy(update={"review": "id_reused"})
        result = await self._run(
            self._record_id_reuse,
            [
                self.keys.reused(event.source, event.event_id, event.body_sha256),
                self.keys.queue(queue),
            ],
            [retention_ms, build_apply_message(review, queue), self.keys.doorbell, event.shard],
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
        """Counters, latency histogram, live workers, held keys, destinations, and the
        store's sizes and last prune as the prune recorded them."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(self.keys.counters)
        pipe.hgetall(self.keys.latency)
        pipe.zcard(self.keys.members)
        pipe.hlen(self.keys.held)
        pipe.smembers(self.keys.destinations)
        pipe.hgetall(self.keys.retention)
        with broker_errors():
            counters, latency, members, held, names, retention = await pipe.execute()
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
            retention={reply_text(k): float(v) for k, v in retention.items()},
        )

    async def close(self) -> None:
        """Release the connection pool."""
        await self.client.aclose()

    @staticmethod
    async def _run(script: Any, keys: list[str], args: list[Any]) -> Any:
        with broker_errors():
            return await script(keys=keys, args=args)
