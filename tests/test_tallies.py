"""Counters kept in the process and written together (``routing/contract/tallies.py``): a
worker's acknowledgements and a receiver's accepts count nothing in Redis until a flush
writes their sums, one command per field; a failed flush keeps them for the next."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aioredis

from keylane.producers.gateway import Enqueue, ReceiverGateway
from keylane.routing.contract.errors import BrokerUnavailable
from keylane.routing.contract.tallies import Increment, Tally
from keylane.routing.redis_keys import RedisKeys, latency_bucket
from keylane.workers.broker import Ack
from keylane.workers.brokers.redis import RedisLaneBroker
from tests.test_redis_scripts import SHARDS, key_in, message, owned, taken


@pytest.fixture
def broker(redis_url: str, namespace: str) -> Iterator[RedisLaneBroker]:
    lane_broker = RedisLaneBroker.from_url(redis_url, RedisKeys(namespace), SHARDS)
    yield lane_broker
    lane_broker.close()


def hash_of(client: redis.Redis, key: str) -> dict[str, float]:
    return {k.decode(): float(v) for k, v in client.hgetall(key).items()}


def test_a_tally_sums_by_field_and_forgets_what_was_taken(redis_url: str, namespace: str) -> None:
    # Given a tally that counted some fields several times, an integer and a float
    tally = Tally()
    for _ in range(3):
        tally.add(f"{namespace}:c", "accepted")
    tally.add_all(
        [Increment(f"{namespace}:c", "conflicts", 2), Increment(f"{namespace}:l", "sum", 0.25)]
    )
    tally.add(f"{namespace}:l", "sum", 0.5)
    # When what it holds is taken and written in one pipeline
    taken_now = tally.take()
    client = redis.Redis.from_url(redis_url)
    pipe = client.pipeline(transaction=False)
    for inc in taken_now:  # as the gateways queue them
        if isinstance(inc.amount, float):
            pipe.hincrbyfloat(inc.key, inc.field, inc.amount)
        else:
            pipe.hincrby(inc.key, inc.field, inc.amount)
    replies = pipe.execute()
    # Then one command per field carried every count
    assert len(replies) == 3
    assert hash_of(client, f"{namespace}:c") == {"accepted": 3, "conflicts": 2}
    assert hash_of(client, f"{namespace}:l") == {"sum": 0.75}
    # And the tally holds nothing more
    assert not tally
    assert tally.take() == []
    client.close()


def test_a_workers_acknowledgements_are_counted_at_the_flush(broker: RedisLaneBroker) -> None:
    # Given two messages of a record taken and acknowledged, one applied after two
    # attempts and a conflict, one a duplicate
    k = broker.keys
    shard = SHARDS.shard_for_key(key_in(0))
    lease = owned(broker, shard)
    for n in (1, 2):
        broker.client.lpush(broker.queue_key(shard), message(key_in(0), n))
    first = taken(broker.take([lease]))
    nxt = broker.finish(
        lease,
        first,
        [Ack(first.raw, "applied", conflicts=1, attempts=2, latency_s=0.02)],
        None,
        True,
    )
    second = taken(nxt)
    assert broker.finish(lease, second, [Ack(second.raw, "duplicate")]) is True
    # Then nothing is counted in Redis yet
    assert broker.client.hgetall(k.counters) == {}
    assert broker.client.hgetall(k.drained) == {}
    assert broker.client.hgetall(k.latency) == {}
    # When the counts are flushed
    broker.flush_counts()
    # Then the counters, the drain count and the histogram hold what the acks said
    assert hash_of(broker.client, k.counters) == {
        "applied": 1,
        "duplicate": 1,
        "conflicts": 1,
        "attempts": 2,
    }
    assert hash_of(broker.client, k.drained) == {str(shard): 2}
    latency = hash_of(broker.client, k.latency)
    assert latency[latency_bucket(0.02)] == 1
    assert latency["count"] == 1
    assert latency["sum"] == pytest.approx(0.02)


def test_a_finish_whose_lease_is_gone_counts_nothing(broker: RedisLaneBroker) -> None:
    # Given a message taken under a lease that another worker then took
    shard = SHARDS.shard_for_key(key_in(1))
    lease = owned(broker, shard)
    broker.client.lpush(broker.queue_key(shard), message(key_in(1), 1))
    got = taken(broker.take([lease]))
    broker.client.set(broker.keys.lease(shard), "someone-else")
    # When it is acknowledged, and the counts flushed
    assert broker.finish(lease, got, [Ack(got.raw, "applied")]) is False
    broker.flush_counts()
    # Then nothing was counted
    assert broker.client.hgetall(broker.keys.counters) == {}
    assert broker.client.hgetall(broker.keys.drained) == {}


def test_a_failed_flush_keeps_the_counts_for_the_next(broker: RedisLaneBroker) -> None:
    # Given an acknowledged message, and the counters' key made unwritable (WRONGTYPE)
    k = broker.keys
    shard = SHARDS.shard_for_key(key_in(0))
    lease = owned(broker, shard)
    broker.client.lpush(broker.queue_key(shard), message(key_in(0), 1))
    got = taken(broker.take([lease]))
    broker.finish(lease, got, [Ack(got.raw, "applied")])
    broker.client.set(k.counters, "not a hash")
    # When a flush fails
    with pytest.raises(BrokerUnavailable):
        broker.flush_counts()
    # Then the next one, once the key is writable, carries the count once
    broker.client.delete(k.counters)
    broker.client.delete(k.drained)
    broker.flush_counts()
    assert hash_of(broker.client, k.counters) == {"applied": 1}
    assert hash_of(broker.client, k.drained) == {str(shard): 1}


def enqueue(n: int, key_missing: bool = False) -> Enqueue:
    shard = SHARDS.shard_for_key(f"r{n}")
    return Enqueue(
        source="crm",
        event_id=f"e{n}",
        body_sha256="0" * 64,
        queue=SHARDS.queue_name(shard),
        shard=shard,
        message=b"m",
        record_key=f"r{n}",
        retention_ms=60_000,
        answer=f"answer {n}".encode(),
        high_water=100,
        global_high_water=1000,
        key_missing=key_missing,
    )


def test_a_receivers_accepts_are_counted_within_a_flush_interval(
    redis_url: str, namespace: str
) -> None:
    # Given a receiver's gateway that writes its counts 50 ms after the first it keeps
    async def main() -> tuple[dict[str, float], dict[str, float]]:
        client = aioredis.Redis.from_url(redis_url)
        gateway = ReceiverGateway(client, RedisKeys(namespace), SHARDS, counts_flush_s=0.05)
        sync = redis.Redis.from_url(redis_url)
        counters = RedisKeys(namespace).counters
        expected = {"accepted": 3, "keyless": 1, "duplicate_deliveries": 1}
        try:
            # When three events are accepted (one keyless) and one is delivered again
            for n in range(3):
                await gateway.accept(enqueue(n, key_missing=n == 2))
            await gateway.accept(enqueue(0))
            # Then they are counted, without a close, once the interval has passed
            deadline = time.monotonic() + 30
            while hash_of(sync, counters) != expected and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            flushed = hash_of(sync, counters)
            # And a count kept at the close is written by it
            await gateway.accept(enqueue(1))
        finally:
            await gateway.close()
        closed = hash_of(sync, counters)
        sync.close()
        return flushed, closed

    flushed, closed = asyncio.run(main())
    assert flushed == {"accepted": 3, "keyless": 1, "duplicate_deliveries": 1}
    assert closed == {"accepted": 3, "keyless": 1, "duplicate_deliveries": 2}
