"""producers/mark_batches.py, through the receiver's gateway (which sends each round), against
a real Redis: many requests' dedupe-mark reads and writes in one round trip, each request
told its own values and only its own errors."""

from __future__ import annotations

import asyncio

import redis
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from keylane.ops.embedded_redis import EmbeddedRedis
from keylane.producers.gateway import ReceiverGateway
from keylane.producers.mark_batches import MAX_REQUESTS, Mark, MarkBatches
from keylane.routing import ShardMap
from keylane.routing.redis_keys import RedisKeys


def batches(client: aioredis.Redis, namespace: str) -> MarkBatches:
    """The marks of a gateway on ``client`` for ``namespace`` (its counters:
    ``<namespace>:counters``)."""
    return ReceiverGateway(client, RedisKeys(namespace), ShardMap()).marks


def test_a_thousand_requests_at_once_each_get_their_values_and_the_counts_add_up(
    private_redis: EmbeddedRedis,
) -> None:
    n = 1000

    async def main() -> tuple[list[list[object]], list[list[object]]]:
        client = aioredis.Redis.from_url(private_redis.url)
        marks = batches(client, "ns")
        try:
            before = await asyncio.gather(*(marks.read(f"ns:m{i}") for i in range(n)))
            # Every other key marked twice at once: the first mark stays (NX).
            writes = [
                marks.mark(Mark(f"ns:m{i}", f"first-{i}".encode(), 60_000, {"accepted": 1}))
                for i in range(n)
            ]
            writes += [
                marks.mark(Mark(f"ns:m{i}", b"second", 60_000, {"accepted": 1, "keyless": 1}))
                for i in range(0, n, 2)
            ]
            await asyncio.gather(*writes)
            after = await asyncio.gather(*(marks.read(f"ns:m{i}", "ns:none") for i in range(n)))
            return before, after
        finally:
            await marks.close()
            await client.aclose()

    before, after = asyncio.run(main())
    assert before == [[None]] * n
    assert after == [[f"first-{i}".encode(), None] for i in range(n)]
    sync = redis.Redis.from_url(private_redis.url)
    counters = {k.decode(): int(v) for k, v in sync.hgetall("ns:counters").items()}
    assert counters == {"accepted": 1500, "keyless": 500}
    assert 0 < sync.pttl("ns:m7") <= 60_000
    # 1,500 marks and 2,000 reads went out in a handful of calls, not one each.
    stats = sync.info("commandstats")
    sync.close()
    assert stats["cmdstat_evalsha"]["calls"] <= 1500 // 10
    assert stats["cmdstat_mget"]["calls"] <= 2000 // 10


def test_more_requests_than_one_pipeline_takes_all_answered(redis_url: str, namespace: str) -> None:
    n = 3 * MAX_REQUESTS + 5

    async def main() -> list[list[object]]:
        client = aioredis.Redis.from_url(redis_url)
        marks = batches(client, namespace)
        try:
            await asyncio.gather(
                *(
                    marks.mark(Mark(f"{namespace}:k{i}", str(i).encode(), 60_000, {}))
                    for i in range(n)
                )
            )
            return await asyncio.gather(*(marks.read(f"{namespace}:k{i}") for i in range(n)))
        finally:
            await marks.close()
            await client.aclose()

    assert asyncio.run(main()) == [[str(i).encode()] for i in range(n)]


def test_a_failed_mark_fails_the_marks_only_and_the_reads_beside_them_are_answered(
    redis_url: str, namespace: str
) -> None:
    sync = redis.Redis.from_url(redis_url)
    sync.set(f"{namespace}:counters", "not a hash")  # the script's HINCRBY fails: WRONGTYPE
    sync.set(f"{namespace}:there", "v")
    sync.close()

    async def main() -> list[object]:
        client = aioredis.Redis.from_url(redis_url)
        marks = batches(client, namespace)
        try:
            calls = [marks.read(f"{namespace}:there") for _ in range(20)]
            calls += [
                marks.mark(Mark(f"{namespace}:x{i}", b"m", 60_000, {"a": 1})) for i in range(20)
            ]
            return await asyncio.gather(*calls, return_exceptions=True)
        finally:
            await marks.close()
            await client.aclose()

    results = asyncio.run(main())
    assert results[:20] == [[b"v"]] * 20
    assert all(isinstance(r, ResponseError) and "WRONGTYPE" in str(r) for r in results[20:])


def test_a_redis_that_forgot_the_script_gets_it_again(private_redis: EmbeddedRedis) -> None:
    async def main() -> None:
        client = aioredis.Redis.from_url(private_redis.url)
        marks = batches(client, "ns")
        try:
            await marks.mark(Mark("ns:a", b"1", 60_000, {"accepted": 1}))
            await client.script_flush()  # as a restarted Redis without the script
            await asyncio.gather(
                *(marks.mark(Mark(f"ns:b{i}", b"2", 60_000, {"accepted": 1})) for i in range(10))
            )
            assert await client.hget("ns:counters", "accepted") == b"11"
            assert await client.get("ns:b9") == b"2"
        finally:
            await marks.close()
            await client.aclose()

    asyncio.run(main())


def test_a_lost_redis_fails_every_request_of_its_pipeline_and_none_hangs(
    private_redis: EmbeddedRedis,
) -> None:
    async def main() -> list[object]:
        client = aioredis.Redis.from_url(private_redis.url, socket_timeout=5)
        marks = batches(client, "ns")
        try:
            await marks.read("ns:warm")
            private_redis.stop()
            calls = [marks.read("ns:a") for _ in range(10)]
            calls += [
                marks.mark(Mark(f"ns:m{i}", b"1", 60_000, {"accepted": 1})) for i in range(10)
            ]
            async with asyncio.timeout(30):
                return await asyncio.gather(*calls, return_exceptions=True)
        finally:
            await marks.close()
            await client.aclose()

    results = asyncio.run(main())
    assert len(results) == 20
    assert all(isinstance(r, RedisConnectionError) for r in results), results


def test_closing_cancels_what_still_waits(redis_url: str, namespace: str) -> None:
    async def main() -> list[object]:
        client = aioredis.Redis.from_url(redis_url)
        marks = batches(client, namespace)
        try:
            waiting = [asyncio.ensure_future(marks.read(f"{namespace}:a")) for _ in range(5)]
            await asyncio.sleep(0)  # queued, the sender not run yet
            await marks.close()
            return await asyncio.gather(*waiting, return_exceptions=True)
        finally:
            await client.aclose()

    results = asyncio.run(main())
    assert all(isinstance(r, asyncio.CancelledError) for r in results), results
