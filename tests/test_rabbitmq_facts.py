"""What RabbitMQ 3.10 does with quorum queues, single active consumer, delivery limits,
publisher confirms and consumer timeouts, driven through kombu 5.7 against a 3-node
cluster of the tests' own (``rabbitmq`` fixture). These are the ground truth a RabbitMQ
broker for the lanes relies on; ops/docs/rabbitmq.md says what each means for keylane.
A test that fails here means the broker's assumptions moved: re-read that document.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from amqp.exceptions import MessageNacked, PreconditionFailed
from kombu import Connection, Consumer, Queue

from tests.support.amqp_clients import AmqpClients, pump, pump_for
from tests.support.rabbitmq import RabbitCluster, wait_for

#: Each test here runs against a 3-node RabbitMQ cluster of the module's own: the slow tier.
pytestmark = pytest.mark.slow

SAC = {"x-single-active-consumer": True}


@pytest.fixture
def amqp(rabbitmq: RabbitCluster) -> Iterator[AmqpClients]:
    """Clients of the cluster; closed, their queues deleted, after the test."""
    clients = AmqpClients(rabbitmq)
    yield clients
    clients.close()


def publish_numbers(amqp: AmqpClients, queue: Queue, numbers: range) -> None:
    publisher = amqp.publisher(amqp.cluster.nodes[0])
    for i in numbers:
        publisher.publish(queue.name, {"i": i})


def consumers_of(cluster: RabbitCluster, queue: str) -> dict[str, tuple[bool, str]]:
    """Inbox name (the consumer tag's prefix) -> (active, activity status), as the
    broker reports them."""
    rows = cluster.ctl_json(
        "list_consumers", "queue_name", "consumer_tag", "active", "activity_status"
    )
    assert isinstance(rows, list)
    return {
        r["consumer_tag"].split("-")[0]: (r["active"], r["activity_status"])
        for r in rows
        if r["queue_name"] == queue
    }


def test_the_cluster_is_three_nodes_of_rabbitmq_3_10_of_its_own(rabbitmq: RabbitCluster) -> None:
    # The facts below were checked on 3.10 (Debian 12's package); another version may
    # behave otherwise (4.x changed delivery limits and consumer priorities with SAC).
    assert rabbitmq.version().startswith("3.10."), rabbitmq.version()
    # Its own nodes only: never the system's rabbit@localhost, its epmd or port 5672
    assert rabbitmq.running_nodes() == {n.name for n in rabbitmq.nodes}
    assert rabbitmq.epmd_port != 4369
    assert 5672 not in {n.amqp_port for n in rabbitmq.nodes}


# -- single active consumer ---------------------------------------------------------


def test_kombu_passes_queue_arguments_through_and_the_leader_is_where_declared(
    rabbitmq: RabbitCluster, amqp: AmqpClients
) -> None:
    # Given a quorum queue with single active consumer and a delivery limit, declared
    # through kombu's Queue(queue_arguments=...) on the second node
    second = rabbitmq.nodes[1]
    queue = amqp.queue("args", second, **SAC, **{"x-delivery-limit": 3})

    info = rabbitmq.queue_info(queue.name)

    # Then the broker holds exactly those arguments, three replicas, the leader local
    assert info["type"] == "quorum"
    arguments = {name: value for name, _type, value in info["arguments"]}
    assert arguments == {
        "x-delivery-limit": 3,
        "x-queue-type": "quorum",
        "x-single-active-consumer": True,
    }
    assert sorted(info["members"]) == sorted(n.name for n in rabbitmq.nodes)
    assert info["leader"] == second.name


def test_the_first_consumer_registered_is_the_active_one(
    rabbitmq: RabbitCluster, amqp: AmqpClients
) -> None:
    # Given three consumers of a SAC queue registered in the order third, first, second
    queue = amqp.queue("sac-first", **SAC)
    third, first, second = rabbitmq.nodes[2], rabbitmq.nodes[0], rabbitmq.nodes[1]
    boxes = [
        amqp.inbox(node, queue, name=name, action="ack")
        for name, node in (("c", third), ("a", first), ("b", second))
    ]

    publish_numbers(amqp, queue, range(6))
    pump(boxes, lambda: len(boxes[0].deliveries) == 6)
    pump_for(boxes, 0.5)

    # Then the one registered first got everything and the others wait (not random)
    assert boxes[0].numbers == list(range(6))
    assert boxes[1].deliveries == []
    assert boxes[2].deliveries == []
    assert consumers_of(rabbitmq, queue.name) == {
        "c": (True, "single_active"),
        "a": (False, "waiting"),
        "b": (False, "waiting"),
    }


def test_a_killed_active_consumer_fails_over_with_its_unacked_first_in_order(
    rabbitmq: RabbitCluster, amqp: AmqpClients
) -> None:
    # Given an active consumer in its own process holding 4 unacknowledged deliveries
    # and two consumers waiting behind it
    queue = amqp.queue("sac-kill", **SAC)
    dying = amqp.consumer_process(rabbitmq.nodes[1], queue, prefetch=4)
    nxt = amqp.inbox(rabbitmq.nodes[2], queue, name="next", action="ack")
    last = amqp.inbox(rabbitmq.nodes[0], queue, name="last", action="ack")
    publish_numbers(amqp, queue, range(8))
    wait_for(lambda: len(dying.bodies) == 4, 30, "the first four deliveries")
    pump_for([nxt, last], 0.3)
    assert nxt.deliveries == []
    assert last.deliveries == []

    # When it is killed with SIGKILL
    dying.kill()
    pump([nxt, last], lambda: len(nxt.deliveries) == 8)

    # Then the next consumer registered gets the dead one's deliveries again, first and
    # in their original order, marked redelivered and counted, then the rest
    assert [b["i"] for b in dying.bodies] == [0, 1, 2, 3]
    assert nxt.numbers == list(range(8))
    assert [d.delivery_count for d in nxt.deliveries] == [1, 1, 1, 1, 0, 0, 0, 0]
    assert [d.message.delivery_info["redelivered"] for d in nxt.deliveries] == [True] * 4 + [
        False
    ] * 4
    assert last.deliveries == []


def test_a_paused_consumer_loses_its_turn_after_missed_heartbeats(
    rabbitmq: RabbitCluster, amqp: AmqpClients
) -> None:
    # Given an active consumer process with 2 s AMQP heartbeats holding 2 deliveries
    queue = amqp.queue("sac-pause", **SAC)
    paused = amqp.consumer_process(rabbitmq.nodes[0], queue, prefetch=2, heartbeat_s=2)
    waiting = amqp.inbox(rabbitmq.nodes[1], queue, name="waiting", action="ack")
    publish_numbers(amqp, queue, range(4))
    wait_for(lambda: len(paused.bodies) == 2, 30, "two deliveries")

    # When it is paused (SIGSTOP): its TCP connection stays open, its heartbeats stop
    paused_at = time.monotonic()
    paused.pause()
    pump([waiting], lambda: len(waiting.deliveries) == 4, timeout_s=60)
    print(f"paused consumer replaced after {waiting.deliveries[0].at - paused_at:.1f} s")

    # Then the broker closes its connection after missed heartbeats, and the waiting
    # consumer gets the paused one's deliveries first, in order
    assert waiting.numbers == [0, 1, 2, 3]
    assert [d.delivery_count for d in waiting.deliveries] == [1, 1, 0, 0]
    # and the paused one, resumed, finds its connection gone (its acks cannot land)
    paused.resume()
    wait_for(lambda: paused.error is not None, 30, "the resumed consumer to see its end")


def test_cancelling_the_active_consumer_hands_over_before_its_unacked_are_settled(
    rabbitmq: RabbitCluster, amqp: AmqpClients
) -> None:
    # Given an active consumer holding deliveries 0 and 1, and one waiting consumer
    queue = amqp.queue("sac-cancel", **SAC)
    holder = amqp.inbox(rabbitmq.nodes[0], queue, name="holder", prefetch=2)
    waiting = amqp.inbox(rabbitmq.nodes[1], queue, name="waiting", action="ack")
    publish_numbers(amqp, queue, range(6))
    pump([holder, waiting], lambda: len(holder.deliveries) == 2)

    # When it cancels (basic.cancel) while still holding them
    holder.cancel()
    pump([holder, waiting], lambda: len(waiting.deliveries) == 4)

    # Then the next consumer is active at once and runs 2..5 while 0 and 1 are held
    assert waiting.numbers == [2, 3, 4, 5]
    # and a held delivery rejected afterwards comes back after them, not first
    holder.deliveries[1].message.requeue()
    holder.deliveries[0].message.ack()
    pump([holder, waiting], lambda: len(waiting.deliveries) == 5)
    assert waiting.numbers == [2, 3, 4, 5, 1]
    assert holder.numbers == [0, 1]


def test_closing_the_active_consumers_channel_returns_its_unacked_first_in_order(
    rabbitmq: RabbitCluster, amqp: AmqpClients
) -> None:
    # Given an active consumer holding deliveries 0 and 1, and one waiting consumer
    queue = amqp.queue("sac-close", **SAC)
    holder = amqp.inbox(rabbitmq.nodes[0], queue, name="holder", prefetch=2)
    waiting = amqp.inbox(rabbitmq.nodes[1], queue, name="waiting", action="ack")
    publish_numbers(amqp, queue, range(6))
    pump([holder, waiting], lambda: len(holder.deliveries) == 2)

    # When it closes its channel (not the connection) without settling them
    holder.channel.close()
    pump([waiting], lambda: len(waiting.deliveries) == 6)

    # Then the next consumer gets 0 and 1 again first, in order, then the rest
    assert waiting.numbers == [0, 1, 2, 3, 4, 5]
    assert [d.delivery_count for d in waiting.deliveries] == [1, 1, 0, 0, 0, 0]


def test_consumer_priorities_do_not_choose_the_single_active_consumer(
    rabbitmq: RabbitCluster, amqp: AmqpClients
) -> None:
    # Given consumers registered in the order: priority 0, priority 0, priority 10
    queue = amqp.queue("sac-prio", **SAC)
    first = amqp.inbox(rabbitmq.nodes[0], queue, name="first", action="ack", priority=0)
    second = amqp.inbox(rabbitmq.nodes[1], queue, name="second", action="ack", priority=0)
    high = amqp.inbox(rabbitmq.nodes[2], queue, name="high", action="ack", priority=10)
    boxes = [first, second, high]
    publish_numbers(amqp, queue, range(3))
    pump(boxes, lambda: len(first.deliveries) == 3)

    # When the active one cancels
    first.cancel()
    publish_numbers(amqp, queue, range(3, 6))
    pump(boxes, lambda: len(first.deliveries) + len(second.deliveries) + len(high.deliveries) == 6)

    # Then the next in registration order takes over; the priority 10 one never runs
    assert first.numbers == [0, 1, 2]
    assert second.numbers == [3, 4, 5]
    assert high.deliveries == []


def _consume_all(
    url: str, queues: list[Queue], worker: str, priority: int | None = None
) -> tuple[Connection, Any, dict[str, Consumer]]:
    """One worker: one connection, one channel, one consumer per queue (tags
    ``<worker>-<n>``)."""
    conn = Connection(url)
    channel = conn.channel()
    consumers = {q.name: _consume(channel, q, worker, priority) for q in queues}
    return conn, channel, consumers


def _consume(channel: Any, queue: Queue, worker: str, priority: int | None = None) -> Consumer:
    target = Queue(
        queue.name,
        queue.exchange,
        routing_key=queue.name,
        no_declare=True,
        consumer_arguments=None if priority is None else {"x-priority": priority},
    )
    consumer = Consumer(
        channel,
        queues=[target],
        callbacks=[lambda body, message: None],
        prefetch_count=1,
        tag_prefix=f"{worker}-",
    )
    consumer.consume()
    return consumer


def _eventually_active(cluster: RabbitCluster, queues: list[Queue], want: dict[str, int]) -> None:
    """Wait until the broker reports ``want`` active consumers per worker."""
    wait_for(lambda: _active_per_worker(cluster, queues) == want, 60, f"active {want}", 1.0)


def _active_per_worker(cluster: RabbitCluster, queues: list[Queue]) -> Counter[str]:
    names = {q.name for q in queues}
    rows = cluster.ctl_json("list_consumers", "queue_name", "consumer_tag", "active")
    assert isinstance(rows, list)
    return Counter(
        r["consumer_tag"].split("-")[0] for r in rows if r["active"] and r["queue_name"] in names
    )


def test_cancel_and_reconsume_spreads_64_queues_evenly_over_two_workers(
    rabbitmq: RabbitCluster, amqp: AmqpClients
) -> None:
    # Given 64 SAC queues, worker A consuming all of them first, then worker B with
    # consumer priority 10 on every one
    queues = amqp.many_queues("spread", 64, **SAC)
    a_conn, a_channel, a_consumers = _consume_all(rabbitmq.nodes[1].url, queues, "A")
    b_conn, _, _ = _consume_all(rabbitmq.nodes[2].url, queues, "B", priority=10)
    try:
        # Then A, registered first, is active on all 64: priorities do not move them
        _eventually_active(rabbitmq, queues, {"A": 64})

        # When A cancels its consumer of 32 queues and consumes them again
        for queue in queues[:32]:
            a_consumers[queue.name].cancel()
            a_consumers[queue.name] = _consume(a_channel, queue, "A")

        # Then B is active on those 32: 32 each
        _eventually_active(rabbitmq, queues, {"A": 32, "B": 32})

        # When B restarts (its connection goes, a new one consumes all 64)
        b_conn.close()
        b_conn, _, _ = _consume_all(rabbitmq.nodes[2].url, queues, "B")
        _eventually_active(rabbitmq, queues, {"A": 64})
        # and A hands back half the same way
        for queue in queues[32:]:
            a_consumers[queue.name].cancel()
            a_consumers[queue.name] = _consume(a_channel, queue, "A")
        _eventually_active(rabbitmq, queues, {"A": 32, "B": 32})
    finally:
        a_conn.close()
        b_conn.close()


# -- acknowledgements and prefetch ---------------------------------------------------


def test_a_consumer_holds_many_deliveries_and_acks_them_in_any_order(
    rabbitmq: RabbitCluster, amqp: AmqpClients
) -> None:
    # Given a SAC queue of 20 messages and an active consumer with prefetch 8
    queue = amqp.queue("acks", **SAC)
    publish_numbers(amqp, queue, range(20))
    inbox = amqp.inbox(rabbitmq.nodes[1], queue, name="many", prefetch=8)
    pump([inbox], lambda: len(inbox.deliveries) == 8)
    pump_for([inbox], 0.3)

    # Then it holds exactly 8 unacknowledged (prefetch counts per consumer)
    assert inbox.numbers == list(range(8))

    # When it acks them out of order, then the rest as they come
    for k in (5, 0, 7, 2, 6, 1, 4, 3):
        inbox.deliveries[k].message.ack()
    pump([inbox], lambda: len(inbox.deliveries) == 16)
    for delivery in inbox.deliveries[8:]:
        delivery.message.ack()
    pump([inbox], lambda: len(inbox.deliveries) == 20)
    for delivery in inbox.deliveries[16:][::-1]:
        delivery.message.ack()
    pump_for([inbox], 0.5)

    # Then each message came once, in order, and none is left
    assert inbox.numbers == list(range(20))
    assert all(d.delivery_count == 0 for d in inbox.deliveries)
    wait_for(lambda: rabbitmq.queue_info(queue.name)["messages"] == 0, 30, "an empty queue")


def test_prefetch_is_per_consumer_on_one_channel(
    rabbitmq: RabbitCluster, amqp: AmqpClients
) -> None:
    # Given two quorum queues of 10 messages each, consumed on ONE channel with
    # prefetch 3 per consumer (quorum queues have no global QoS)
    one, two = amqp.queue("prefetch-a"), amqp.queue("prefetch-b")
    publish_numbers(amqp, one, range(10))
    publish_numbers(amqp, two, range(10))
    conn = Connection(rabbitmq.nodes[0].url)
    held: list[tuple[str, int]] = []
    try:
        channel = conn.channel()
        for queue in (one, two):
            Consumer(
                channel,
                queues=[Queue(queue.name, no_declare=True)],
                callbacks=[lambda body, message, q=queue.name: held.append((q, body["i"]))],
                prefetch_count=3,
            ).consume()
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                conn.drain_events(timeout=0.1)
    finally:
        conn.close()

    # Then the channel holds 3 of each queue, 6 in all
    assert Counter(q for q, _ in held) == {one.name: 3, two.name: 3}


# -- delivery limit and dead letters -------------------------------------------------


def test_past_the_delivery_limit_a_message_is_dead_lettered_with_its_reason(
    rabbitmq: RabbitCluster, amqp: AmqpClients
) -> None:
    # Given a queue with x-delivery-limit 2 dead-lettering at least once to a DLQ
    dlq = amqp.queue("dlq")
    queue = amqp.queue(
        "limited",
        **{
            "x-delivery-limit": 2,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dlq.name,
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        },
    )
    dead = amqp.inbox(rabbitmq.nodes[1], dlq, name="dead", action="ack")
    rejecter = amqp.inbox(rabbitmq.nodes[1], queue, name="rejecter", action="requeue")

    # When a consumer rejects (requeue) every delivery of one message
    publish_numbers(amqp, queue, range(1))
    pump([rejecter, dead], lambda: len(dead.deliveries) == 1)

    # Then it was delivered limit + 1 times (x-delivery-count 0, 1, 2), then moved to
    # the dead-letter queue with the reason, and the queue is empty
    assert [d.delivery_count for d in rejecter.deliveries] == [0, 1, 2]
    headers = dead.deliveries[0].message.headers
    assert dead.numbers == [0]
    assert headers["x-first-death-reason"] == "delivery_limit"
    assert headers["x-first-death-queue"] == queue.name
    assert headers["x-death"][0]["reason"] == "delivery_limit"


def test_at_least_once_dead_lettering_needs_reject_publish_overflow(
    rabbitmq: RabbitCluster, amqp: AmqpClients
) -> None:
    # Given two queues with a delivery limit of 0 that dead-letter "at-least-once" to a
    # routing key no queue is bound to yet; only one has x-overflow reject-publish
    nowhere = "kltest-no-such-queue"
    common = {
        "x-delivery-limit": 0,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": nowhere,
        "x-dead-letter-strategy": "at-least-once",
    }
    kept = amqp.queue("alo", **common, **{"x-overflow": "reject-publish"})
    fallen = amqp.queue("amo", **common)
    boxes = [
        amqp.inbox(rabbitmq.nodes[0], q, name=f"r{k}", action="requeue")
        for k, q in enumerate((kept, fallen))
    ]

    # When each queue's one message passes the limit
    publish_numbers(amqp, kept, range(1))
    publish_numbers(amqp, fallen, range(1))
    pump(boxes, lambda: all(len(b.deliveries) == 1 for b in boxes))
    pump_for(boxes, 1.0)

    # Then at-least-once keeps it in the source queue until the target can take it
    # (retried every dead_letter_worker_publisher_confirm_timeout, 180 s), while the
    # queue without reject-publish fell back to at-most-once and dropped it, saying so
    # in the leader's log
    assert rabbitmq.ctl("eval", _num_messages(kept.name)).strip() == "1"
    assert rabbitmq.ctl("eval", _num_messages(fallen.name)).strip() == "0"
    log = rabbitmq.nodes[0].log_path.read_text()
    assert f"Falling back to dead-letter-strategy at-most-once for queue '{fallen.name}'" in log
    assert f"at-most-once for queue '{kept.name}'" not in log


def _num_messages(queue: str) -> str:
    """An Erlang expression: the quorum queue's message count (ready, checked out and
    held for at-least-once dead-lettering), read from its Raft state machine."""
    return (
        f'{{ok, Q}} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"/">>, queue, <<"{queue}">>)), '
        "{RaName, _} = amqqueue:get_pid(Q), "
        "{ok, {_, Overview}, _} = ra:local_query({RaName, node()}, fun rabbit_fifo:overview/1), "
        "maps:get(num_messages, Overview)."
    )


@pytest.mark.parametrize(
    ("arguments", "order"),
    [
        ({}, [0, 1, 2, 3, 0]),  # no limit set: a rejected message goes to the back
        ({"x-delivery-limit": 5}, [0, 0, 1, 2, 3]),  # with a limit: back at the head
    ],
    ids=["no-limit", "limit"],
)
def test_where_a_rejected_message_goes(
    rabbitmq: RabbitCluster, amqp: AmqpClients, arguments: dict[str, int], order: list[int]
) -> None:
    # Given a queue of messages 0..3 and a consumer (prefetch 1) that rejects 0 once
    queue = amqp.queue("requeue", **arguments)
    publish_numbers(amqp, queue, range(4))
    inbox = amqp.inbox(rabbitmq.nodes[0], queue, name="once", prefetch=1)

    def settle_next() -> None:
        delivery = inbox.deliveries[-1]
        if delivery.body["i"] == 0 and delivery.delivery_count == 0:
            delivery.message.requeue()
        else:
            delivery.message.ack()

    while len(inbox.deliveries) < 5:
        count = len(inbox.deliveries)
        pump([inbox], lambda count=count: len(inbox.deliveries) > count)
        settle_next()

    assert inbox.numbers == order


# -- publisher confirms ---------------------------------------------------------------


def test_every_confirmed_publish_survives_the_leaders_kill(
    rabbitmq: RabbitCluster, amqp: AmqpClients
) -> None:
    # Given a queue led by node 1 and a publisher with confirms connected to node 2
    leader, other, third = rabbitmq.nodes
    queue = amqp.queue("confirm-kill", leader)
    assert rabbitmq.leader_of(queue.name) == leader
    publisher = amqp.publisher(other)
    confirmed: list[int] = []
    confirmed_at: list[float] = []
    refused: list[int] = []
    stop = threading.Event()

    def publish_until_stopped() -> None:
        i = 0
        while not stop.is_set():
            try:
                publisher.publish(queue.name, {"i": i}, confirm_timeout=30)
                confirmed.append(i)
                confirmed_at.append(time.monotonic())
            except (MessageNacked, TimeoutError):  # none seen so far; allowed
                refused.append(i)
            i += 1

    thread = threading.Thread(target=publish_until_stopped)
    thread.start()
    try:
        # When the leader is killed in the middle of the stream
        wait_for(lambda: len(confirmed) >= 200, 60, "200 confirmed publishes")
        count_at_kill = len(confirmed)
        rabbitmq.kill(leader)
        wait_for(lambda: len(confirmed) >= count_at_kill + 200, 60, "publishes after the kill")
        longest = max(b - a for a, b in itertools.pairwise(confirmed_at))
        print(f"longest wait for a confirm while the leader changed: {longest:.2f} s")
    finally:
        stop.set()
        thread.join()

    # Then a new leader took over, and every confirmed message is in the queue, once
    # and in order (a publish that was refused, none so far, may be there or not)
    print(f"publishes refused while the leader changed: {refused}")
    assert rabbitmq.leader_of(queue.name) in (other, third)
    inbox = amqp.inbox(third, queue, name="check", action="ack", prefetch=500)
    pump([inbox], lambda: set(confirmed) <= set(inbox.numbers))
    pump_for([inbox], 0.5)
    assert inbox.numbers == sorted(set(inbox.numbers))
    assert set(confirmed) <= set(inbox.numbers) <= set(confirmed) | set(refused)


def test_without_a_quorum_a_publish_is_not_confirmed_yet_may_land_later(
    rabbitmq: RabbitCluster, amqp: AmqpClients
) -> None:
    # Given a queue led by node 1 and a publisher connected to node 1
    leader, follower, other = rabbitmq.nodes
    queue = amqp.queue("no-quorum", leader)
    publisher = amqp.publisher(leader)
    confirms: list[tuple[str, int, bool]] = []
    publisher.channel.events["basic_ack"].add(
        lambda tag, multiple: confirms.append(("ack", tag, multiple))
    )
    publisher.channel.events["basic_nack"].add(
        lambda tag, multiple: confirms.append(("nack", tag, multiple))
    )
    publisher.publish(queue.name, {"i": 0})

    # When both followers are killed, a publish gets no confirm within its timeout
    rabbitmq.kill(follower)
    rabbitmq.kill(other)
    with pytest.raises((TimeoutError, MessageNacked)) as refused:
        publisher.publish(queue.name, {"i": 1}, confirm_timeout=2)

    # and once a follower is back, the confirm for it still arrives on that channel,
    # after the publish gave up (py-amqp matches a confirm to no delivery tag)
    rabbitmq.restart(follower)
    if refused.type is TimeoutError:
        deadline = time.monotonic() + 30
        while not _confirmed(confirms, 2) and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                publisher.connection.drain_events(timeout=0.5)
        assert _confirmed(confirms, 2), confirms
    inbox = amqp.inbox(follower, queue, name="check", action="ack")
    pump([inbox], lambda: len(inbox.deliveries) >= 1)
    pump_for([inbox], 1.0)
    # Then the message the publisher was never told about is in the queue (a timeout
    # is not a refusal); a nack would have meant it is not
    assert inbox.numbers == ([0, 1] if refused.type is TimeoutError else [0])


def _confirmed(confirms: list[tuple[str, int, bool]], tag: int) -> bool:
    """Whether a basic.ack among ``confirms`` covers delivery tag ``tag``."""
    return any(
        kind == "ack" and (seen == tag or (multiple and seen > tag))
        for kind, seen, multiple in confirms
    )


# -- consumer acknowledgement timeout ------------------------------------------------


def test_the_consumer_timeout_closes_the_channel_and_requeues_its_deliveries_first(
    rabbitmq: RabbitCluster, amqp: AmqpClients
) -> None:
    # The node-wide default, as `rabbitmqctl eval` or `rabbitmqctl environment` show it
    assert (
        rabbitmq.ctl("eval", "application:get_env(rabbit, consumer_timeout).").strip()
        == "{ok,1800000}"
    )
    queue = amqp.queue("ack-timeout", **SAC)
    publish_numbers(amqp, queue, range(4))
    # Given a channel opened while the nodes' timeout is 2 s (a channel keeps the value
    # it read when it opened), checked every 0.5 s (read at each check; 60 s by default)
    _set_everywhere(rabbitmq, consumer_timeout=2000, channel_tick_interval=500)
    try:
        holder = amqp.inbox(rabbitmq.nodes[1], queue, name="slow", prefetch=2)
        _set_everywhere(rabbitmq, consumer_timeout=1_800_000)
        waiting = amqp.inbox(rabbitmq.nodes[2], queue, name="waiting", action="ack")

        # When it holds two deliveries past the timeout
        with pytest.raises(PreconditionFailed) as closed:
            pump([holder, waiting], lambda: False, timeout_s=60)
    finally:
        _set_everywhere(rabbitmq, consumer_timeout=1_800_000, channel_tick_interval=60_000)

    # Then the broker closes that channel with 406 and the next consumer gets both
    # deliveries again, first and in order
    assert closed.value.reply_code == 406
    assert "delivery acknowledgement on channel 1 timed out" in closed.value.reply_text
    assert holder.numbers == [0, 1]
    pump([waiting], lambda: len(waiting.deliveries) == 4)
    assert waiting.numbers == [0, 1, 2, 3]
    assert [d.delivery_count for d in waiting.deliveries] == [1, 1, 0, 0]


def _set_everywhere(cluster: RabbitCluster, **settings: int) -> None:
    """Set rabbit application settings on every node at run time (one CLI call)."""
    calls = ", ".join(
        f"{{[ok, ok, ok], []}} = rpc:multicall(application, set_env, [rabbit, {k}, {v}])"
        for k, v in settings.items()
    )
    cluster.ctl("eval", f"{calls}.")


# -- a killed leader -----------------------------------------------------------------


def test_a_killed_leader_loses_no_message_and_no_consumer(
    rabbitmq: RabbitCluster, amqp: AmqpClients
) -> None:
    # Given a SAC queue led by node 1, its active consumer on node 2 holding three
    # deliveries, a waiting consumer and a publisher on node 3
    leader, follower, other = rabbitmq.nodes
    queue = amqp.queue("leader-kill", leader, **SAC)
    publisher = amqp.publisher(other)
    for i in range(4):
        publisher.publish(queue.name, {"i": i})
    active = amqp.inbox(follower, queue, name="active", prefetch=3)
    waiting = amqp.inbox(other, queue, name="waiting", action="ack")
    pump([active, waiting], lambda: len(active.deliveries) == 3)

    # When the leader is killed
    killed_at = time.monotonic()
    rabbitmq.kill(leader)
    publisher.publish(queue.name, {"i": 4}, confirm_timeout=60)
    print(f"a new leader confirmed a publish {time.monotonic() - killed_at:.2f} s after the kill")

    # Then the consumer stays active: its acks of deliveries taken under the old leader
    # count, it gets the rest, and nothing is delivered twice or to anyone else
    for delivery in active.deliveries:
        delivery.message.ack()
    pump([active, waiting], lambda: len(active.deliveries) == 5)
    active.deliveries[3].message.ack()
    active.deliveries[4].message.ack()
    pump_for([active, waiting], 1.0)
    assert active.numbers == [0, 1, 2, 3, 4]
    assert all(d.delivery_count == 0 for d in active.deliveries)
    assert waiting.deliveries == []
    assert rabbitmq.leader_of(queue.name) in (follower, other)


def test_the_active_consumers_node_dying_fails_over_with_its_unacked_first(
    rabbitmq: RabbitCluster, amqp: AmqpClients
) -> None:
    # Given a SAC queue led by node 1 whose active consumer, connected to node 1 too,
    # holds two deliveries; a consumer waits on node 2, the publisher is on node 3
    doomed, survivor, other = rabbitmq.nodes
    queue = amqp.queue("node-death", doomed, **SAC)
    publisher = amqp.publisher(other)
    for i in range(6):
        publisher.publish(queue.name, {"i": i})
    active = amqp.inbox(doomed, queue, name="active", prefetch=2)
    waiting = amqp.inbox(survivor, queue, name="waiting", action="ack")
    pump([active, waiting], lambda: len(active.deliveries) == 2)

    # When node 1 (leader and the consumer's node) is killed
    killed_at = time.monotonic()
    rabbitmq.kill(doomed)
    pump([waiting], lambda: len(waiting.deliveries) == 6)
    print(f"waiting consumer served {waiting.deliveries[0].at - killed_at:.2f} s after the kill")

    # Then the waiting consumer gets the held deliveries first, in order, then the rest
    assert waiting.numbers == [0, 1, 2, 3, 4, 5]
    assert [d.delivery_count for d in waiting.deliveries] == [1, 1, 0, 0, 0, 0]
