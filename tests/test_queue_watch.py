"""The receiver's queue watch (``producers/queue_watch.py``) against a real Redis of its
own: a full poll reads every shard's depth and head, the poll a second while deliveries
come reads only the drain counts and the backlog, and the drain rates and the global
depth follow what the lanes count."""

from __future__ import annotations

import asyncio

import redis
import redis.asyncio as aioredis

from keylane.ops.embedded_redis import EmbeddedRedis
from keylane.producers.gateway import ReceiverGateway
from keylane.producers.queue_watch import QueueWatch
from keylane.routing import ShardMap
from keylane.routing.redis_keys import RedisKeys

SHARDS = ShardMap(8)
KEYS = RedisKeys("ns")


def commands(client: redis.Redis) -> int:
    """Every command the server ran so far, but INFO (this test's own reads)."""
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def test_between_full_polls_the_watch_reads_two_commands_and_follows_the_drains(
    private_redis: EmbeddedRedis,
) -> None:
    sync = redis.Redis.from_url(private_redis.url)
    # Given three events queued in shard 2 and a source with 5 events in the backlog
    queue = KEYS.queue(SHARDS.queue_name(2))
    sync.lpush(queue, b"m1", b"m2", b"m3")
    sync.hset(KEYS.backlog, mapping={"crm": 5, "forms": -1})

    async def main() -> tuple[int, int, QueueWatch, int]:
        client = aioredis.Redis.from_url(private_redis.url)
        gateway = ReceiverGateway(client, KEYS, SHARDS)
        try:
            watch = QueueWatch(gateway)
            # When the watch polls every shard
            before = commands(sync)
            await watch.poll()
            full = commands(sync) - before
            # And, after the lanes drained 4 events of shard 2, reads the drains only
            sync.hincrby(KEYS.drained, "2", 4)
            before = commands(sync)
            await watch.poll_drains()
            light = commands(sync) - before
            # And, after 4 more events of the source were accepted, reads them again
            sync.hincrby(KEYS.backlog, "crm", 4)
            unchanged = watch.total_depth
            await watch.poll_drains()
            return full, light, watch, unchanged
        finally:
            await gateway.close()

    full, light, watch, unchanged = asyncio.run(main())
    # Then the full poll read each shard (two commands a shard, besides the hashes) and
    # saw shard 2's depth
    assert full >= 2 * SHARDS.count
    assert watch.views[2].depth == 3
    # And the drains cost two commands, kept the depths, and gave shard 2 a drain rate; the
    # global depth is the full poll's while the backlog stays as it was, and moves with the
    # backlog after (a negative count counting as none), not jumping between the two counts
    assert light == 2
    assert watch.views[2].depth == 3
    assert watch.views[2].rate_per_s > 0
    assert watch.views[2].drained_at is not None
    assert watch.views[1].rate_per_s == 0
    assert unchanged == 3
    assert watch.total_depth == 3 + 4
