"""The receiver's accepts in rounds (``producers/rounds.py`` through the gateway's accept
script), against a real Redis: deliveries that arrive at once go in one script call, each
decided on its own (all of its events or none), each told its own verdicts; a refused
delivery leaves nothing and does not touch the others of its round; a failed call fails
only the deliveries it carried."""

from __future__ import annotations

import asyncio
from pathlib import Path

import redis
import redis.asyncio as aioredis

from keylane.ops.embedded_redis import EmbeddedRedis
from keylane.producers.gateway import BatchResult, Enqueue, ReceiverGateway
from keylane.routing import ShardMap
from keylane.routing.contract.errors import BrokerUnavailable
from keylane.routing.contract.schedules import RunLease
from keylane.routing.redis_keys import RedisKeys
from tests.support.marks import remembered

SHARDS = ShardMap(4)


def event(n: int, shard: int = 0, body: str = "b", high_water: int = 1000) -> Enqueue:
    """Event ``n`` for ``shard``'s queue (``body`` stands for its body's digest)."""
    return Enqueue(
        source="s",
        event_id=f"e{n}",
        body_sha256=body,
        queue=SHARDS.queue_name(shard),
        shard=shard,
        message=f"message-{n}".encode(),
        record_key=f"k:{n}",
        retention_ms=60_000,
        answer=f'{{"status":"accepted","event_id":"e{n}"}}'.encode(),
        high_water=high_water,
    )


def accept_all(url: str, deliveries: list[tuple[list[Enqueue], RunLease | None]]) -> list[object]:
    async def main() -> list[object]:
        client = aioredis.Redis.from_url(url)
        gateway = ReceiverGateway(client, RedisKeys("ns"), SHARDS)
        try:
            return await asyncio.gather(
                *(gateway.accept_batch(items, lease) for items, lease in deliveries),
                return_exceptions=True,
            )
        finally:
            await gateway.close()

    return asyncio.run(main())


def verdicts(result: object) -> list[str]:
    assert isinstance(result, BatchResult), result
    return [r.verdict for r in result.results]


def test_many_deliveries_at_once_go_in_few_calls_and_each_is_told_its_own(
    private_redis: EmbeddedRedis,
) -> None:
    # Given 600 deliveries at once: singles, pairs, and repeats of earlier ones
    deliveries: list[tuple[list[Enqueue], RunLease | None]] = []
    for n in range(400):
        deliveries.append(([event(n, n % 4)], None))
    for n in range(100):
        deliveries.append(([event(1000 + n, 0), event(2000 + n, 1)], None))
    for n in range(100):
        deliveries.append(([event(n, n % 4)], None))  # the same as the first 100
    results = accept_all(private_redis.url, deliveries)
    # Then each delivery has its own verdicts
    assert [verdicts(r) for r in results[:400]] == [["accepted"]] * 400
    assert [verdicts(r) for r in results[400:500]] == [["accepted", "accepted"]] * 100
    assert [verdicts(r) for r in results[500:]] == [["duplicate"]] * 100
    # And what Redis holds adds up, in far fewer script calls than deliveries
    sync = redis.Redis.from_url(private_redis.url)
    queued = sum(sync.llen(f"ns:{SHARDS.queue_name(s)}") for s in range(4))
    assert queued == 600
    counters = {k.decode(): int(v) for k, v in sync.hgetall("ns:counters").items()}
    assert counters == {"accepted": 600, "duplicate_deliveries": 100}
    calls = sync.info("commandstats")["cmdstat_evalsha"]["calls"]
    sync.close()
    assert calls <= 600 // 10


def test_a_refused_delivery_leaves_nothing_and_its_round_mates_are_taken(
    private_redis: EmbeddedRedis,
) -> None:
    sync = redis.Redis.from_url(private_redis.url)
    sync.set("ns:lease", "other-run")
    lease = RunLease("job", "ns:lease", "my-run")
    # Given, at once: a delivery of three events for a shard that holds two, one whose
    # scheduled run lost its lease, and two that fit
    deliveries: list[tuple[list[Enqueue], RunLease | None]] = [
        ([event(1, 2, high_water=2), event(2, 2, high_water=2), event(3, 2, high_water=2)], None),
        ([event(4, 1, high_water=2)], lease),
        ([event(5, 1, high_water=2)], None),
        ([event(6, 3, high_water=2), event(6, 3, high_water=2)], None),  # one id twice
    ]
    results = accept_all(private_redis.url, deliveries)
    # Then the refused ones leave nothing, the others are taken
    full, fenced, single, twice = results
    assert isinstance(full, BatchResult)
    assert (full.refused, full.full_index, full.depth) == ("full", 2, 2)
    assert isinstance(fenced, BatchResult)
    assert fenced.refused == "fenced"
    assert verdicts(single) == ["accepted"]
    assert verdicts(twice) == ["accepted", "duplicate"]
    assert sync.llen(f"ns:{SHARDS.queue_name(2)}") == 0
    assert sync.llen(f"ns:{SHARDS.queue_name(1)}") == 1
    assert sync.llen(f"ns:{SHARDS.queue_name(3)}") == 1
    keys = RedisKeys("ns")
    assert [remembered(sync, keys, "s", f"e{n}") for n in (1, 4, 5, 6)] == [
        False,
        False,
        True,
        True,
    ]
    sync.close()


def test_a_failed_call_fails_the_deliveries_it_carried_only(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis")
    server.start()

    async def main() -> tuple[list[object], list[object]]:
        client = aioredis.Redis.from_url(server.url, socket_timeout=5)
        gateway = ReceiverGateway(client, RedisKeys("ns"), SHARDS)
        try:
            # Given a round sent while Redis is down
            server.stop()
            lost = await asyncio.gather(
                *(gateway.accept_batch([event(n)]) for n in range(20)),
                return_exceptions=True,
            )
            # When Redis is back (on its port, with its append-only file)
            server.start()
            later = await asyncio.gather(
                *(gateway.accept_batch([event(n)]) for n in range(20)),
                return_exceptions=True,
            )
            return lost, later
        finally:
            await gateway.close()

    try:
        lost, later = asyncio.run(main())
    finally:
        server.stop()
    # Then every delivery of the failed round failed, and nothing of it was kept
    assert all(isinstance(r, BrokerUnavailable) for r in lost), lost
    # And the next rounds take every delivery, as new
    assert [verdicts(r) for r in later] == [["accepted"]] * 20
