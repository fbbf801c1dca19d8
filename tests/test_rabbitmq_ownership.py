"""Shard ownership on RabbitMQ, driven through :class:`RabbitLaneBroker` itself against the
tests' own 3-node cluster and a PostgreSQL store: what a consumer must do when its lease
is gone. A consumer that keeps standing keeps its place as the queue's single active
consumer and its unacknowledged deliveries, and RabbitMQ gives them to no one else: the
shard's new owner would wait for good (seen after two of three nodes were killed and came
back: 61 accepted events stranded for over ten minutes)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kombu import Connection

from keylane.producers.amqp import AmqpPublisher
from keylane.routing.contract.amqp_names import dead_queue, probe_queue, shard_queue
from keylane.routing.contract.message import RECORD_HEADER
from keylane.routing.contract.settings import Settings
from keylane.routing.contract.settings_env import load_settings
from keylane.routing.redis_keys import message_digest
from keylane.workers.broker import Ack, Lease, Taken
from keylane.workers.brokers.rabbitmq import RabbitLaneBroker
from keylane.workers.store import FenceStore
from keylane.workers.stores import open_store
from keylane.workers.stores.sql import SqlStore
from tests.support.rabbitmq import RabbitCluster
from tests.support.stack import wait_until

pytestmark = pytest.mark.slow

SHARD = 0


@pytest.fixture
def settings(
    rabbitmq: RabbitCluster, redis_url: str, namespace: str, pg_store_url: str, tmp_path: Path
) -> Iterator[Settings]:
    """One shard on the cluster; its queues are deleted after the test."""
    hosts = ",".join(f"127.0.0.1:{node.amqp_port}" for node in rabbitmq.nodes)
    s = load_settings(
        data_dir=tmp_path / "d",
        redis_url=redis_url,
        store_url=pg_store_url,
        namespace=namespace,
        broker_url=f"amqp://guest:guest@{hosts}//",
        shard_count=1,
        lease_ttl_ms=3000,
        heartbeat_ms=500,
        amqp_heartbeat_s=2,
    )
    yield s
    with Connection(rabbitmq.nodes[0].url) as conn:
        channel = conn.channel()
        channel.queue_delete(shard_queue(s.namespace, s.shards, SHARD))
        channel.queue_delete(dead_queue(s.namespace))
        channel.queue_delete(probe_queue(s.namespace))
        channel.exchange_delete(dead_queue(s.namespace))


@pytest.fixture
def store(settings: Settings) -> Iterator[SqlStore]:
    store = open_store(settings.store_dsn())
    store.migrate()
    yield store
    store.close()


@pytest.fixture
def broker(settings: Settings) -> Iterator[Callable[[], RabbitLaneBroker]]:
    """Open a lane broker of the deployment (as a worker process does); all are closed
    after the test."""
    opened: list[RabbitLaneBroker] = []

    def open_one() -> RabbitLaneBroker:
        one = RabbitLaneBroker(settings, lambda: open_store(settings.store_dsn()))
        opened.append(one)
        return one

    yield open_one
    for one in opened:
        one.close()


def publish(settings: Settings, count: int) -> list[bytes]:
    """``count`` messages of one record to the shard's queue, each confirmed."""
    sent = [
        json.dumps({"headers": {RECORD_HEADER: "rec:1"}, "n": n}).encode() for n in range(count)
    ]

    async def publish_all() -> None:
        publisher = AmqpPublisher(settings)
        try:
            for raw in sent:
                name = shard_queue(settings.namespace, settings.shards, SHARD)
                await publisher.publish(name, raw, "rec:1")
        finally:
            await publisher.close()

    asyncio.run(publish_all())
    return sent


def acquired(broker: RabbitLaneBroker, worker: str, timeout_s: float = 60) -> Lease:
    """Ask for the shard as ownership's heartbeat does, until the broker hands out a lease
    (no membership beats: the test decides who wants the shard)."""
    found: list[Lease] = []

    def got() -> bool:
        lease = broker.acquire(SHARD, worker, 3000).lease
        if lease is not None:
            found.append(lease)
        return lease is not None

    wait_until(got, timeout_s, f"{worker} holds the shard", interval_s=0.2)
    return found[0]


def drained(broker: RabbitLaneBroker, lease: Lease, count: int) -> list[bytes]:
    """Take and finish the shard's messages until ``count`` were done, in order."""
    done: list[bytes] = []

    def one_more() -> bool:
        taken = broker.take([lease])
        if isinstance(taken, Taken):
            assert broker.finish(lease, taken, [Ack(raw) for raw in taken.messages]) is True
            done.extend(taken.messages)
        return len(done) >= count

    wait_until(one_more, 60, f"{count} messages taken", interval_s=0.05)
    return done


def test_a_consumer_whose_lease_is_lost_lets_go_and_the_next_in_line_gets_its_messages(
    settings: Settings, store: FenceStore, broker: Callable[[], RabbitLaneBroker]
) -> None:
    # Given worker a, the shard's active consumer, holding its messages unacknowledged,
    # and worker b's consumer waiting in line behind it
    sent = publish(settings, 5)
    a, b = broker(), broker()
    lease_a = acquired(a, "worker-a")
    assert lease_a.token == store.fence_of(SHARD)
    assert b.acquire(SHARD, "worker-b", 3000).lease is None
    # When another consumer claimed the shard's next token (as one does that believed
    # itself the queue's only consumer while a cluster recovered), and a's lane learns
    # that its lease is gone (the store refused its fence)
    store.claim_fence(SHARD)
    a.lose(lease_a, "worker-a", "the store refused its fence")
    # Then a stops being the active consumer, b becomes it, and gets every message in order
    lease_b = acquired(b, "worker-b")
    assert lease_b.token > lease_a.token
    assert drained(b, lease_b, len(sent)) == sent
    # And a's lease is no longer renewed
    assert a.renew([lease_a], 3000) == [False]


def test_a_renewal_finds_the_stores_newer_token_and_lets_the_consumer_go(
    settings: Settings, store: FenceStore, broker: Callable[[], RabbitLaneBroker]
) -> None:
    # Given worker a, the shard's active consumer, and worker b waiting in line
    sent = publish(settings, 3)
    a, b = broker(), broker()
    lease_a = acquired(a, "worker-a")
    assert a.renew([lease_a], 3000) == [True]
    assert b.acquire(SHARD, "worker-b", 3000).lease is None
    # When the store has a newer token for the shard, and no lane of a wrote since
    store.claim_fence(SHARD)
    # Then a's next renewal fails, a lets go, and b receives the messages a held
    assert a.renew([lease_a], 3000) == [False]
    lease_b = acquired(b, "worker-b")
    assert drained(b, lease_b, len(sent)) == sent


def test_a_lost_lease_of_a_consumer_already_replaced_closes_nothing_else(
    settings: Settings, store: SqlStore, broker: Callable[[], RabbitLaneBroker]
) -> None:
    # Given worker a lost the shard and took it again under a new token
    publish(settings, 2)
    a = broker()
    first = acquired(a, "worker-a")
    a.lose(first, "worker-a", "lost")
    second = acquired(a, "worker-a")
    assert second.token > first.token
    # When the old lease is reported lost again (a late lane)
    a.lose(first, "worker-a", "late")
    # Then the new consumer stands
    assert a.renew([second], 3000) == [True]
    assert isinstance(a.take([second]), Taken)


def taken_after_lost_connections(
    settings: Settings, broker: Callable[[], RabbitLaneBroker], losses: int
) -> tuple[list[bytes], RabbitLaneBroker, Lease, Taken]:
    """Two messages of one record delivered to ``losses`` workers in turn, each of which
    lost its connection before a lane took either; then the next worker's lane takes the
    first: what was sent, that worker, its lease and what its lane took."""
    sent = publish(settings, 2)
    for n in range(losses):
        lost = broker()
        acquired(lost, f"worker-{n}")
        lost.close()
    return (sent, *head_taken(broker, f"worker-{losses}", sent[0]))


def head_taken(
    broker: Callable[[], RabbitLaneBroker], name: str, head: bytes
) -> tuple[RabbitLaneBroker, Lease, Taken]:
    """A new worker ``name`` that holds the shard, its lease, and what its lane took:
    the shard's ``head`` message."""
    worker = broker()
    lease = acquired(worker, name)
    taken = worker.take([lease])
    assert isinstance(taken, Taken)
    assert taken.raw == head
    return worker, lease, taken


def test_deliveries_a_lost_connection_took_back_untried_count_as_no_tries(
    settings: Settings, store: SqlStore, broker: Callable[[], RabbitLaneBroker]
) -> None:
    # Given the head message of a shard delivered to five workers in turn, each of which
    # lost its connection before a lane took it (RabbitMQ counts each such return)
    # When a sixth worker's lane takes it
    sent, worker, lease, taken = taken_after_lost_connections(settings, broker, 5)
    # Then it is counted as its second try at most (its first delivery may have been
    # tried), not its sixth: past max_deliveries (5) it would be a poison dead letter
    assert taken.deliveries == 2, taken.deliveries
    # And a try that kills its worker counts: each next worker sees one more (until the
    # broker's own limit, max_deliveries + amqp_delivery_margin returns, which counts them
    # all)
    seen = [taken.deliveries]
    for n in range(6, 8):
        worker.close()
        worker, lease, taken = head_taken(broker, f"worker-{n}", sent[0])
        seen.append(taken.deliveries)
    assert seen == [2, 3, 4], seen
    # And once the message is acknowledged its note leaves the store
    assert worker.finish(lease, taken, [Ack(taken.raw)]) is True
    wait_until(
        lambda: not store.noted_tries(SHARD, [message_digest(sent[0])]),
        30,
        "the acknowledged message's note is gone",
    )


def test_parked_messages_carry_their_tries_not_the_returns_of_lost_connections(
    settings: Settings, store: SqlStore, broker: Callable[[], RabbitLaneBroker]
) -> None:
    # Given a record's two messages, each returned untried by five lost connections
    # When a lane takes the first and must then wait longer than the broker may hold a
    # delivery, so the record's messages are parked in the store
    sent, worker, lease, taken = taken_after_lost_connections(settings, broker, 5)
    assert taken.deliveries == 2
    assert worker.wait(lease, taken, settings.amqp_hold_budget_s, {"reason": "test"}) is True

    def both_parked() -> bool:
        worker.take([lease])  # parks a delivery that came after the wait behind the first
        return len(store.parked(SHARD, "rec:1")) == 2

    wait_until(both_parked, 30, "both messages parked")
    # Then each parked row counts its tries: the first tried once here (and maybe once on
    # its first delivery), the second never, not the five returns
    parked = store.parked(SHARD, "rec:1")
    assert [(p.raw, p.deliveries) for p in parked] == [(sent[0], 2), (sent[1], 1)]
    # And the first one's note left the store with it (the parked row counts on)
    assert store.noted_tries(SHARD, [message_digest(raw) for raw in sent]) == {}
