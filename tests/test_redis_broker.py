"""The Redis lane broker's scheduling, call by call, on a real Redis (a private key
namespace): what a finish that also takes (``then_take``) answers, and that a shard whose
queue still holds messages is never reported idle."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from keylane.routing import ShardMap
from keylane.routing.contract.events import Change, Event
from keylane.routing.contract.message import build_event_message
from keylane.routing.redis_keys import RedisKeys
from keylane.workers.broker import Ack, Idle, Lease, Taken
from keylane.workers.brokers.redis import ADMIT_MAX, RedisLaneBroker
from keylane.workers.brokers.redis_leases import older_than_supported

SHARDS = ShardMap(1)


@pytest.fixture
def broker(redis_url: str, namespace: str) -> Iterator[RedisLaneBroker]:
    lane_broker = RedisLaneBroker.from_url(redis_url, RedisKeys(namespace), SHARDS)
    yield lane_broker
    lane_broker.close()


def message(record_key: str, n: int) -> bytes:
    """A real event message for shard 0."""
    event = Event(
        source="crm",
        event_id=f"{record_key}/{n}",
        event_type="update",
        record_key=record_key,
        changes={"n": Change(op="increment", value=1)},
        body_sha256="0" * 64,
        accepted_at=0.0,
        shard=0,
    )
    return build_event_message(event, SHARDS.queue_name(0))


def push(broker: RedisLaneBroker, *messages: bytes) -> None:
    """Enqueue in this order (kombu's Redis queues: LPUSH, the consumer takes the right end)."""
    for raw in messages:
        broker.client.lpush(broker.queue_key(0), raw)


def expect(got: object, record_key: str) -> Taken:
    """``got`` is a record handed out, and it is ``record_key``'s."""
    assert isinstance(got, Taken), got
    assert got.record_key == record_key
    return got


def owned(broker: RedisLaneBroker) -> Lease:
    acquired = broker.acquire(0, "w1", 60_000)
    assert acquired.lease is not None
    return acquired.lease


def test_a_finish_that_takes_hands_out_the_next_due_record_or_says_when_one_is(
    broker: RedisLaneBroker,
) -> None:
    # Given an owned shard with nothing in it: idle, nothing said of it
    lease = owned(broker)
    assert broker.take([lease]) == Idle({})
    # And records a and b with one event each
    push(broker, message("a", 1), message("b", 1))
    first = broker.take([lease])
    expect(first, "a")
    # When a's event is acknowledged with a take, Then b comes with it
    second = broker.finish(lease, first, [Ack(first.raw)], then_take=True)
    expect(second, "b")
    # When b waits 30 s, and a new event of a is acknowledged with a take
    assert broker.wait(lease, second, 30.0, {"why": "test"})
    push(broker, message("a", 2))
    third = broker.take([lease])
    expect(third, "a")
    idle = broker.finish(lease, third, [Ack(third.raw)], then_take=True)
    # Then nothing is due, and the answer says when b is
    assert isinstance(idle, Idle)
    assert 25.0 < idle.due_in_s[0] <= 30.0


def test_a_shard_whose_queue_still_holds_messages_is_never_reported_idle(
    broker: RedisLaneBroker,
) -> None:
    # Given a record held behind a dead letter, more of its events than one admission
    # moves (ADMIT_MAX), and a free record's event behind them in the shard queue
    lease = owned(broker)
    broker.client.hset(broker.keys.held, "h", "7")
    push(broker, message("a", 1), *(message("h", n) for n in range(2 * ADMIT_MAX)))
    push(broker, message("b", 1))
    first = broker.take([lease])
    expect(first, "a")
    # When a's event is acknowledged with a take, Then the shard is due again now (not
    # idle): the messages the admission has not reached yet may be due
    answer = broker.finish(lease, first, [Ack(first.raw)], then_take=True)
    assert answer == Idle({0: 0.0}), answer
    # And the takes that follow reach b, while h stays held
    for _ in range(4):
        got = broker.take([lease])
        if isinstance(got, Taken):
            break
        assert got == Idle({0: 0.0}), got
    expect(got, "b")
    assert json.loads(got.raw)["headers"]["keylane_record"] == "b"


def test_a_redis_older_than_6_2_is_refused_by_version_and_the_running_one_is_not(
    redis_url: str,
) -> None:
    # Given the versions Redis names in INFO server
    # Then one before 6.2 (no RPOP with a count) is too old, 6.2 and later are not
    assert older_than_supported("6.0.16")
    assert older_than_supported("5.0.14")
    assert not any(map(older_than_supported, ["6.2.14", "7.0.15", "7.2.4", "8.0.0"]))
    # And the Redis the tests run on passes the worker's check
    broker = RedisLaneBroker.from_url(redis_url, RedisKeys("keylane-version-check"), ShardMap(2))
    try:
        broker.check_server()
    finally:
        broker.close()
