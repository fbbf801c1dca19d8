"""workers/doorbell.py: which shards have something due, so idle lanes wake and look there
first; rings come over the real Redis (a private namespace) and from timers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import redis

from keylane.workers.brokers.redis import RedisLaneBroker
from keylane.workers.doorbell import Doorbell
from tests.conftest import fast_settings

T = TypeVar("T")
MINE = {1, 2, 3}


@pytest.fixture
def broker(redis_url: str, namespace: str, tmp_path: Path) -> Iterator[RedisLaneBroker]:
    settings = fast_settings(redis_url, namespace, f"sqlite:///{tmp_path / 's.db'}", tmp_path)
    broker = RedisLaneBroker.from_settings(settings)
    yield broker
    broker.client.close()


def on_a_loop(broker: RedisLaneBroker, lanes: Callable[[Doorbell], Awaitable[T]]) -> T:
    """Run ``lanes`` on an event loop with a started doorbell for shards 1-3."""

    async def main() -> T:
        bell = Doorbell(broker, MINE.__contains__)
        bell.start(asyncio.get_running_loop())
        try:
            return await lanes(bell)
        finally:
            bell.stop()

    return asyncio.run(main())


async def woken(bell: Doorbell, within_s: float = 1.0) -> bool:
    """Whether a lane waiting now is woken within ``within_s``."""
    try:
        await asyncio.wait_for(bell.wait(), within_s)
    except TimeoutError:
        return False
    return True


def test_a_ring_wakes_a_waiting_lane_and_hints_each_shard_once_oldest_first(
    broker: RedisLaneBroker,
) -> None:
    async def lanes(bell: Doorbell) -> tuple[bool, list[int], list[int]]:
        waiter = asyncio.ensure_future(woken(bell))
        await asyncio.sleep(0.01)  # the lanes are waiting
        for shard in (3, 1, 3, 2):
            bell.ring(shard)
        return await waiter, bell.hints(), bell.hints()

    was_woken, hints, again = on_a_loop(broker, lanes)
    assert was_woken
    assert hints == [3, 1, 2]
    assert again == []


def test_a_lane_does_not_wait_while_rings_are_pending_and_waits_once_they_are_taken(
    broker: RedisLaneBroker,
) -> None:
    async def lanes(bell: Doorbell) -> tuple[bool, bool]:
        bell.ring(2)
        pending = await woken(bell, within_s=0.05)
        bell.hints()
        return pending, await woken(bell, within_s=0.05)

    assert on_a_loop(broker, lanes) == (True, False)


def test_a_ring_from_another_thread_wakes_a_lane(broker: RedisLaneBroker) -> None:
    async def lanes(bell: Doorbell) -> tuple[bool, list[int]]:
        waiter = asyncio.ensure_future(woken(bell))
        await asyncio.sleep(0.01)  # the lanes are waiting
        await asyncio.to_thread(bell.ring, 1)
        return await waiter, bell.hints()

    assert on_a_loop(broker, lanes) == (True, [1])


def test_a_ring_over_redis_wakes_a_lane_only_for_a_shard_of_this_worker(
    broker: RedisLaneBroker,
) -> None:
    async def lanes(bell: Doorbell) -> tuple[bool, list[int]]:
        publisher = redis.Redis(connection_pool=broker.client.connection_pool)
        waiter = asyncio.ensure_future(woken(bell, within_s=3.0))
        # Published until the listener has subscribed: only shard 2 is this worker's
        deadline = time.monotonic() + 3.0
        while not waiter.done() and time.monotonic() < deadline:
            for data in ("7", "not a shard", "2"):
                publisher.publish(broker.keys.doorbell, data)
            await asyncio.sleep(0.05)
        return await waiter, bell.hints()

    was_woken, hints = on_a_loop(broker, lanes)
    assert was_woken
    assert hints == [2]


def test_a_timer_rings_its_shard_when_due_keeping_the_earliest(broker: RedisLaneBroker) -> None:
    async def lanes(bell: Doorbell) -> tuple[bool, float, list[int]]:
        started = time.monotonic()
        bell.ring_in(3, 0.1)
        bell.ring_in(3, 5.0)  # later: the earlier timer stays
        bell.ring_in(2, 0.5)
        early = await woken(bell, within_s=0.05)
        await bell.wait()
        return early, time.monotonic() - started, bell.hints()

    early, waited_s, hints = on_a_loop(broker, lanes)
    assert not early
    # (by what rang, not by how soon: a busy machine may wake the loop late, but never
    # before the timer, and the 5 s timer of shard 3 would ring long after shard 2's)
    assert 0.09 <= waited_s < 4.5
    assert hints[0] == 3, hints


def test_an_earlier_timer_replaces_a_later_one(broker: RedisLaneBroker) -> None:
    async def lanes(bell: Doorbell) -> tuple[float, list[int]]:
        started = time.monotonic()
        bell.ring_in(1, 5.0)
        bell.ring_in(1, 0.05)
        await asyncio.wait_for(bell.wait(), 4.5)
        return time.monotonic() - started, bell.hints()

    # (the wait ends well before the 5 s timer would ring, however late the loop wakes)
    waited_s, hints = on_a_loop(broker, lanes)
    assert waited_s < 4.5
    assert hints == [1]


def test_a_poke_wakes_one_lane_with_no_hint(broker: RedisLaneBroker) -> None:
    async def lanes(bell: Doorbell) -> tuple[list[bool], list[int]]:
        waiters = [asyncio.ensure_future(woken(bell, within_s=0.2)) for _ in range(2)]
        await asyncio.sleep(0.01)  # the lanes are waiting
        bell.poke()
        return list(await asyncio.gather(*waiters)), bell.hints()

    answers, hints = on_a_loop(broker, lanes)
    assert sorted(answers) == [False, True]
    assert hints == []


def test_stop_wakes_every_lane_and_drops_the_timers(broker: RedisLaneBroker) -> None:
    async def lanes(bell: Doorbell) -> tuple[list[bool], bool, list[int]]:
        bell.ring_in(1, 0.05)
        waiters = [asyncio.ensure_future(woken(bell, within_s=1.0)) for _ in range(3)]
        await asyncio.sleep(0.01)  # the lanes are waiting
        bell.stop()
        answers = list(await asyncio.gather(*waiters))
        await asyncio.sleep(0.1)  # the timer would have rung by now
        return answers, await woken(bell, within_s=0.01), bell.hints()

    answers, after_stop, hints = on_a_loop(broker, lanes)
    assert answers == [True, True, True]
    assert after_stop  # a stopped doorbell never makes a lane wait
    assert hints == []


def test_more_rings_than_one_take_looks_at_stay_rung_for_the_next_take(
    broker: RedisLaneBroker,
) -> None:
    """A worker that starts on a backlog has all its shards rung at once: a take looks at
    a window of them, and the rest are there for the next take (a lane does not wait while
    any is) instead of being forgotten until a poke."""

    async def lanes(bell: Doorbell) -> tuple[list[int], bool, list[int], bool]:
        for shard in (1, 2, 3):
            bell.ring(shard)
        first = bell.hints(2)
        return first, await woken(bell, within_s=0.2), bell.hints(2), await woken(bell, 0.2)

    first, not_waiting, second, then_waiting = on_a_loop(broker, lanes)
    assert first == [1, 2]
    assert not_waiting
    assert second == [3]
    assert not then_waiting
