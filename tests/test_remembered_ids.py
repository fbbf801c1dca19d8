"""The event ids a receiver remembers (``RedisKeys.seen_ids``, ``scripts/_seen.lua``) through
the gateway's accept script, against a real Redis: a few bytes an id, grouped in hashes that
expire whole; a duplicate told from a reused id; the window kept to the second; 0.1.0's marks
honoured until they expire; and a replay accepted longer ago than a told outcome is kept
queued again, for its lane to tell it anew from the journal."""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import replace

import redis
import redis.asyncio as aioredis

from keylane.ops.embedded_redis import EmbeddedRedis
from keylane.producers.gateway import Enqueue, EnqueueResult, ReceiverGateway
from keylane.routing import ShardMap
from keylane.routing.redis_keys import RedisKeys
from tests.support.marks import remembered

SHARDS = ShardMap(4)
KEYS = RedisKeys("ns")


def digest(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()


def event(
    event_id: str, body: str = "a", retention_ms: int = 60_000, keep_ms: int = 60_000
) -> Enqueue:
    return Enqueue(
        source="s",
        event_id=event_id,
        body_sha256=digest(body),
        queue=SHARDS.queue_name(0),
        shard=0,
        message=f"message-{event_id}-{body}".encode(),
        record_key="k:1",
        retention_ms=retention_ms,
        answer=f'{{"status":"accepted","event_id":"{event_id}"}}'.encode(),
        high_water=100_000,
        outcome_keep_ms=keep_ms,
    )


def accept_many(url: str, items: list[Enqueue], per_delivery: int = 500) -> list[EnqueueResult]:
    """``items`` accepted ``per_delivery`` at a time (each a batched delivery)."""

    async def main() -> list[EnqueueResult]:
        client = aioredis.Redis.from_url(url)
        gateway = ReceiverGateway(client, KEYS, SHARDS)
        try:
            results: list[EnqueueResult] = []
            for at in range(0, len(items), per_delivery):
                batch = await gateway.accept_batch(items[at : at + per_delivery])
                results += batch.results
            return results
        finally:
            await gateway.close()

    return asyncio.run(main())


def accept(url: str, *items: Enqueue) -> list[EnqueueResult]:
    """Each item accepted in turn (each its own round)."""

    async def main() -> list[EnqueueResult]:
        client = aioredis.Redis.from_url(url)
        gateway = ReceiverGateway(client, KEYS, SHARDS)
        try:
            return [await gateway.accept(item) for item in items]
        finally:
            await gateway.close()

    return asyncio.run(main())


def queued(sync: redis.Redis) -> int:
    return int(sync.llen(KEYS.queue(SHARDS.queue_name(0))))


def test_an_id_is_remembered_in_a_few_bytes_and_a_replay_is_told_from_a_reuse(
    private_redis: EmbeddedRedis,
) -> None:
    sync = redis.Redis.from_url(private_redis.url)
    # Given 20,000 events accepted (about ten ids a hash)
    first = accept_many(private_redis.url, [event(f"e{n}") for n in range(20_000)])
    assert [r.verdict for r in first] == ["accepted"] * 20_000
    # When one is sent again with its body, and with another
    again, other = accept(private_redis.url, event("e7"), event("e7", body="b"))
    # Then the first is a duplicate answered as the first delivery was, the second reused
    assert (again.verdict, again.detail, again.told, again.retold) == (
        "duplicate",
        '{"status":"accepted","event_id":"e7"}',
        None,
        False,
    )
    assert other.verdict == "reused"
    assert queued(sync) == 20_000
    # And Redis keeps no key of its own for an id: hashes of ids, compactly encoded, that
    # expire whole, each id in a few bytes (value and field, the hashes' keys shared)
    hashes = list(sync.scan_iter(match=f"{KEYS.seen_ids('s')}*", count=1000))
    assert not sync.exists(KEYS.dedupe("s", "e7"))
    assert sum(sync.hlen(key) for key in hashes) == 20_000
    encodings = {sync.object("encoding", key) for key in hashes}
    assert encodings in ({b"listpack"}, {b"ziplist"})  # (Redis 7, 6.2)
    assert all(sync.pttl(key) > 0 for key in hashes)
    size = sum(int(sync.memory_usage(key, samples=0)) for key in hashes)
    assert size / 20_000 < 60, size / 20_000
    assert remembered(sync, KEYS, "s", "e19999")
    assert not remembered(sync, KEYS, "s", "e20000")
    sync.close()


def test_an_id_past_its_window_is_forgotten_within_a_second(
    private_redis: EmbeddedRedis,
) -> None:
    # Given an event remembered for one second
    short = event("late", retention_ms=1000)
    assert accept(private_redis.url, short)[0].verdict == "accepted"
    # When it is sent again within the window, Then it is a duplicate
    assert accept(private_redis.url, short)[0].verdict == "duplicate"
    # When it is sent again two seconds later, Then it is new (its hash is still there)
    time.sleep(2.1)
    assert accept(private_redis.url, short)[0].verdict == "accepted"


def test_a_mark_of_0_1_0_is_honoured_until_it_expires(private_redis: EmbeddedRedis) -> None:
    sync = redis.Redis.from_url(private_redis.url)
    # Given a mark and a told outcome as keylane 0.1.0 wrote them (one key each)
    old = event("old")
    sync.set(KEYS.dedupe("s", "old"), old.body_sha256.encode() + b"\n" + old.answer, px=1500)
    sync.set(KEYS.outcome("s", "old"), b'{"status":"applied"}', px=1500)
    # When it is sent again, with its body and with another
    again, other = accept(private_redis.url, old, event("old", body="b"))
    # Then it is a duplicate told its stored outcome, and a reuse; nothing is queued
    assert (again.verdict, again.told) == ("duplicate", b'{"status":"applied"}')
    assert other.verdict == "reused"
    assert queued(sync) == 0
    assert not remembered(sync, KEYS, "s", "old")
    # When its mark expires, Then the id is new to this release (and remembered its way)
    time.sleep(1.6)
    assert accept(private_redis.url, old)[0].verdict == "accepted"
    assert remembered(sync, KEYS, "s", "old")
    sync.close()


def test_a_replay_older_than_a_kept_outcome_is_queued_again_to_be_retold(
    private_redis: EmbeddedRedis,
) -> None:
    sync = redis.Redis.from_url(private_redis.url)
    keep_3s = event("r1", keep_ms=3000)
    # Given an event accepted, and one of 0.1.0 whose outcome is no longer kept
    assert accept(private_redis.url, keep_3s)[0].verdict == "accepted"
    old = replace(event("r0"), outcome_keep_ms=3000)
    sync.set(KEYS.dedupe("s", "r0"), old.body_sha256.encode() + b"\n" + old.answer, px=60_000)
    sync.pexpire(KEYS.dedupe("s", "r0"), 59_000)  # accepted a second ago
    # When it is sent again within the time an outcome is kept, none told yet
    (soon,) = accept(private_redis.url, keep_3s)
    # Then it is a duplicate not decided yet: nothing queued again
    assert (soon.verdict, soon.retold, queued(sync)) == ("duplicate", False, 1)
    # When it is sent again later, no outcome kept (past its keep, or never told)
    time.sleep(4.1)
    late, old_late = accept(private_redis.url, keep_3s, old)
    # Then each is a duplicate queued again, for its lane to tell it from the journal,
    # counted in its source's backlog as the lane will take it off
    assert (late.verdict, late.retold, old_late.verdict, old_late.retold) == (
        "duplicate",
        True,
        "duplicate",
        True,
    )
    assert queued(sync) == 3
    assert int(sync.hget(KEYS.backlog, "s") or 0) == 3
    # When its lane told it (the outcome is kept), Then a replay is told that, not queued
    sync.set(KEYS.outcome("s", "r1"), b'{"status":"applied"}', px=60_000)
    (told,) = accept(private_redis.url, keep_3s)
    assert (told.told, told.retold, queued(sync)) == (b'{"status":"applied"}', False, 3)
    sync.close()
