"""Acknowledgements gathered per shard channel (``workers/brokers/rabbitmq/acks.py``): a
contiguous run of delivery tags goes as one ``multiple`` ack, the tags past a gap one by
one. What must hold, whatever order the lanes finish in: every delivery a lane finished is
acknowledged, once; none that a lane still holds is; and the broker refuses none of the
acknowledgements (a refused one closes the shard's channel and gives back all it held)."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import pytest
from amqp import Message  # type: ignore[import-untyped]
from amqp.exceptions import PreconditionFailed  # type: ignore[import-untyped]
from hypothesis import given
from hypothesis import strategies as st
from kombu import Connection

from keylane.workers.brokers.rabbitmq.consumers import Settled
from keylane.workers.brokers.rabbitmq.link import ack, ack_upto
from tests.support.rabbitmq import RabbitCluster


def batches(order: list[int], sizes: list[int]) -> Iterator[list[int]]:
    """``order`` cut into batches of ``sizes`` (cycled), the last one what is left."""
    start, n = 0, 0
    while start < len(order):
        size = sizes[n % len(sizes)]
        yield order[start : start + size]
        start, n = start + size, n + 1


@given(
    order=st.integers(1, 60).flatmap(lambda n: st.permutations(list(range(1, n + 1)))),
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=5),
)
def test_a_plan_acknowledges_what_was_finished_once_and_nothing_still_held(
    order: list[int], sizes: list[int]
) -> None:
    # Given deliveries 1..n on a channel, finished by the lanes in any order and gathered
    # in batches of any size
    outstanding = set(order)
    finished: set[int] = set()
    settled = Settled()
    for batch in batches(order, sizes):
        finished.update(batch)
        # When each batch is planned
        upto, single = settled.plan(batch)
        # Then a run's ack names an outstanding tag (the broker refuses one acknowledged
        # before) and covers only finished deliveries
        if upto:
            assert upto in outstanding
            covered = {tag for tag in outstanding if tag <= upto}
            assert covered <= finished
            outstanding -= covered
        # and each single ack names a finished delivery still outstanding
        for tag in single:
            assert tag in outstanding
            assert tag in finished
            outstanding.discard(tag)
        # and every finished delivery is acknowledged by now
        assert not (finished & outstanding)
    assert not outstanding


@contextlib.contextmanager
def _delivered(
    rabbitmq: RabbitCluster, name: str, count: int
) -> Iterator[tuple[Any, Any, list[int]]]:
    """``count`` messages published to a new quorum queue ``name`` and delivered on one
    channel of one connection (prefetch ``count``): the connection's control channel, that
    channel and the delivery tags in order. The queue is deleted after."""
    with Connection(rabbitmq.nodes[0].url) as conn:
        control = conn.channel()
        control.queue_declare(
            name, durable=True, auto_delete=False, arguments={"x-queue-type": "quorum"}
        )
        try:
            for n in range(count):
                control.basic_publish(Message(str(n)), exchange="", routing_key=name)
            channel = conn.channel()
            channel.basic_qos(0, count, False)
            tags: list[int] = []
            channel.basic_consume(name, callback=lambda m: tags.append(m.delivery_tag))
            while len(tags) < count:
                conn.drain_events(timeout=10)
            yield control, channel, tags
        finally:
            control.queue_delete(name)


@pytest.mark.slow
def test_acks_in_any_order_are_all_taken_by_the_broker_and_settle_every_delivery(
    rabbitmq: RabbitCluster, namespace: str
) -> None:
    # Given 60 messages delivered on one channel of a quorum queue (prefetch 60)
    name = f"{namespace}.acks"
    with _delivered(rabbitmq, name, 60) as (control, channel, tags):
        # When they are acknowledged in a scrambled order, in batches, as planned (the
        # first batches leave gaps: some runs end on a tag acknowledged singly before)
        order = list(tags)
        random.Random(48).shuffle(order)
        order = [tags[2], tags[0], tags[1], *[t for t in order if t not in tags[:3]]]
        settled = Settled()
        for batch in batches(order, [1, 1, 1, 7, 3]):
            upto, single = settled.plan(batch)
            if upto:
                ack_upto(channel, upto)
            ack(channel, single)
        # Then the broker refused none (a round trip on the channel after them: a
        # refusal would have closed it) ...
        channel.basic_qos(0, 60, False)
        assert channel.is_open
        channel.close()
        # ... and none came back to the queue when the channel closed
        _, ready, _ = control.queue_declare(name, passive=True)
        assert ready == 0


@pytest.mark.slow
def test_a_multiple_ack_naming_a_tag_acknowledged_before_is_refused(
    rabbitmq: RabbitCluster, namespace: str
) -> None:
    # Given 3 deliveries on one channel, the second acknowledged on its own
    with _delivered(rabbitmq, f"{namespace}.acks-refused", 3) as (_, channel, tags):
        channel.basic_ack(tags[1])
        # When a multiple ack names that tag (the first delivery still open below it)
        channel.basic_ack(tags[1], multiple=True)
        # Then the broker refuses it and closes the channel (seen at the next round trip)
        with pytest.raises(PreconditionFailed, match="unknown delivery tag"):
            channel.basic_qos(0, 3, False)
