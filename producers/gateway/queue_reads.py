"""The receiver's reads of the deployment's state in Redis, behind backpressure,
``/metrics`` and the wire version it writes: every shard queue's depth and head at one
instant, the counters and latency histogram the lanes keep, flow control and schedules,
and what each live worker says of itself. Read-only: over the receiver gateway's
connections (:class:`~keylane.producers.gateway.ReceiverGateway` holds one)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from ...routing import ShardMap
from ...routing.contract.destinations import FlowState
from ...routing.contract.replies import reply_text
from ...routing.contract.schedule_state import ScheduleState
from ...routing.redis_keys import RedisKeys
from ..state_reads import flow_states, queue_flow_reads, queue_schedule_reads, schedule_states
from .redis_calls import broker_errors


@dataclass(frozen=True)
class QueueSnapshot:
    """Every shard queue at one instant: depth and head message by shard, and the drain
    counts the lanes keep."""

    depths: list[int]
    heads: list[bytes | None]
    drained: dict[int, int]
    #: The events waiting as the sources' backlog counts them, at the same instant.
    waiting: int = 0


@dataclass(frozen=True)
class MetricSnapshot:
    """The deployment's counters and latency histogram, live workers, held keys, flow
    control, and the figures of the last prune."""

    counters: dict[str, float]
    latency: dict[str, float]
    members: int
    held: int
    destinations: list[FlowState] = field(default_factory=list)
    schedules: list[ScheduleState] = field(default_factory=list)
    retention: dict[str, float] = field(default_factory=dict)  # the last prune's figures
    #: Each source's events accepted and not finished (fair admission).
    backlog: dict[str, int] = field(default_factory=dict)


class QueueReads:
    """Read-only views of one deployment in Redis (see the module docstring)."""

    def __init__(self, client: aioredis.Redis, keys: RedisKeys, shards: ShardMap) -> None:
        self.client = client
        self.keys = keys
        self.shards = shards

    async def queues(self) -> QueueSnapshot:
        """Depth and head message of every shard queue, and the drain counts, at one
        instant (a transaction: the lanes' admission moves messages between the queue and
        the admitted count)."""
        pipe = self.client.pipeline(transaction=True)
        for shard in range(self.shards.count):
            queue = self.keys.queue(self.shards.queue_name(shard))
            pipe.llen(queue)
            pipe.lindex(queue, -1)
        pipe.hgetall(self.keys.drained)
        pipe.hgetall(self.keys.depth)
        pipe.hgetall(self.keys.backlog)
        with broker_errors():
            replies = await pipe.execute()
        n = self.shards.count
        admitted = {int(k): int(v) for k, v in replies[-2].items()}
        return QueueSnapshot(
            depths=[int(replies[2 * s]) + admitted.get(s, 0) for s in range(n)],
            heads=[replies[2 * s + 1] for s in range(n)],
            drained={int(k): int(v) for k, v in replies[-3].items()},
            waiting=_waiting(replies[-1]),
        )

    async def drains(self) -> tuple[dict[int, int], int]:
        """The drain counts the lanes keep, by shard, and the events waiting over all
        shards as the sources' backlog counts them: two commands, where :meth:`queues`
        reads two a shard."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(self.keys.drained)
        pipe.hgetall(self.keys.backlog)
        with broker_errors():
            drained, backlog = await pipe.execute()
        return {int(k): int(v) for k, v in drained.items()}, _waiting(backlog)

    async def metrics(self) -> MetricSnapshot:
        """Counters, latency histogram, live workers, held keys, destinations, and the
        store's sizes and last prune as the prune recorded them."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(self.keys.counters)
        pipe.hgetall(self.keys.latency)
        pipe.zcard(self.keys.members)
        pipe.hlen(self.keys.held)
        pipe.smembers(self.keys.destinations)
        pipe.smembers(self.keys.schedules)
        pipe.hgetall(self.keys.retention)
        pipe.hgetall(self.keys.backlog)
        with broker_errors():
            counters, latency, members, held, names, jobs, retention, backlog = await pipe.execute()
            names = sorted(reply_text(n) for n in names)
            jobs = sorted(reply_text(n) for n in jobs)
            flow = self.client.pipeline(transaction=False)
            queue_flow_reads(flow, self.keys, names)
            queue_schedule_reads(flow, self.keys, jobs)
            replies = await flow.execute()
            split = 1 + 3 * len(names)
            destinations = flow_states(replies[:split], names)
            schedules = schedule_states(replies[split:], jobs)
        return MetricSnapshot(
            counters={reply_text(k): float(v) for k, v in counters.items()},
            latency={reply_text(k): float(v) for k, v in latency.items()},
            members=int(members),
            held=int(held),
            destinations=destinations,
            schedules=schedules,
            retention={reply_text(k): float(v) for k, v in retention.items()},
            backlog={reply_text(k): max(0, int(v)) for k, v in backlog.items()},
        )

    async def member_infos(self, member_ttl_ms: int) -> list[dict[str, Any]]:
        """What each live worker says of itself in its membership beat (host, pid, lanes,
        the wire version it reads), those that beat within ``member_ttl_ms``."""
        now_ms = int(time.time() * 1000)
        with broker_errors():
            live = await self.client.zrangebyscore(
                self.keys.members, now_ms - member_ttl_ms, "+inf"
            )
            pipe = self.client.pipeline(transaction=False)
            for worker in live:
                pipe.hget(self.keys.member(reply_text(worker)), "info")
            infos = await pipe.execute()
        return [_info(raw) for raw in infos]


def _info(raw: Any) -> dict[str, Any]:
    """A member's info as its worker wrote it (JSON); empty when it is gone or unreadable
    (its beat is there: a worker, of whatever release)."""
    try:
        info = json.loads(raw) if raw is not None else {}
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def _waiting(backlog: dict[Any, Any]) -> int:
    """The events waiting over all sources (a count below zero counts as none)."""
    return sum(max(0, int(v)) for v in backlog.values())
