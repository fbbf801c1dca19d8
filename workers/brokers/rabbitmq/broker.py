"""The lanes' broker on RabbitMQ: quorum queues with a single active consumer, one per
shard. The AMQP client itself is imported by :mod:`.link` only.

What RabbitMQ gives, and what keylane adds (facts checked in ``ops/docs/rabbitmq.md``):

* **Ownership** is the broker's single active consumer (SAC): every shard queue has at
  most one consumer receiving, and when it dies (its process, its node, its connection
  after missed AMQP heartbeats) its unacknowledged deliveries go to the next consumer
  first, in their original order. A consumer learns that it is the active one when its
  first delivery arrives; only then does it hold a :class:`Lease`.
* **Fencing**: RabbitMQ has no token a consumer could show the store, so the store keeps
  one: at the first delivery of each consumer registration the worker claims the shard's
  next token (:meth:`FenceStore.claim_fence`, the same ``shard_fences`` row the Redis leases
  advance), then checks with one round trip on the same channel that its connection is
  still the one that received (a paused worker whose connection the broker dropped fails
  here). Every write transaction checks the token: a paused or partitioned consumer's
  late write is refused once the next consumer claimed its token.
* **Per-record order with many records in flight**: one channel per shard, ``prefetch``
  deliveries held in memory, grouped by record in delivery order; a record has at most one
  message (or one batch) with a lane, and the others wait behind it. Acknowledgements go
  in any order, gathered per channel (:mod:`.acks`): a contiguous run of delivery tags is
  one ``multiple`` ack.
* **No delivery held past the consumer timeout** (the broker would close the channel and
  redeliver): a record that would keep its deliveries longer than half
  ``amqp_hold_budget_s`` (a long wait, or a backlog) is **parked**: its messages are
  written to the store (``ParkingStore.park``, fenced), then acknowledged; its later deliveries
  are parked behind them; lanes take parked messages from the store when due and delete
  each once done (``ParkingStore.unpark``). A new consumer reads its shards' parked records
  before it hands anything out.
* **Hold policy**: a held record is a parked record that is never due until its dead
  letter's release (or the retry of that row) comes through the shard queue; the hold is
  a fenced row of the store's ``held`` table, written before the dead-lettered message is
  acknowledged (see :mod:`.holding`).
* **Graceful handoff** closes the shard's channel (never ``basic.cancel``, after which the
  next consumer would run later messages while this one still holds earlier ones): what
  it held returns to the head of the queue, in order.
* **Delivery limit**: ``x-delivery-limit`` is ``max_deliveries + amqp_delivery_margin``;
  the lanes count a message's tries (``x-delivery-count``, brought down to the tries
  noted in the store: a lost connection's untried deliveries count there too; see
  :mod:`.tries`) and dead-letter a message past ``max_deliveries`` themselves; a
  message that goes past the broker's limit anyway (a worker killed every time it was
  handed out, or more connections lost than the margin while it waited untried) is
  dead-lettered at least once to the ``<ns>.dead`` queue,
  which this broker consumes and hands to ``on_dead`` (a ``poison`` dead letter in the
  store): never dropped.
* **Even spread**: a worker consumes only the shards the rendezvous assignment over the
  live members gives it (membership: a fanout exchange of AMQP heartbeats), and hands a
  shard back (closes its channel) when the assignment moves it. The broker's own choice
  would be whoever registered first: one worker with every shard.

All AMQP traffic runs in one thread (``keylane-amqp``) per process: py-amqp connections
are not thread-safe. Lanes and ownership call from their threads; the calls that need the
broker (acks, consuming, closing a channel) are queued to that thread.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ....routing.contract.amqp_names import shard_queue
from ....routing.contract.errors import BrokerUnavailable, StaleFence
from ....routing.contract.settings import Settings
from ...broker import (
    Ack,
    Counts,
    Lease,
    MessageNotes,
    Outgoing,
    RecordQueue,
    ShardLeases,
    Taken,
)
from ...stores.sql import SqlStore
from . import tries
from .acks import PendingAcks
from .after_acks import AfterAcks
from .calls import Calls
from .consumers import ShardConsumer
from .dead_letters import DeadLetterConsumer
from .link import publish_confirmed
from .membership import Membership
from .notes import DeliveryNotes
from .ownership import DoorbellSubscription
from .taking import Taking

log = logging.getLogger("keylane.rabbitmq")


class RabbitLaneBroker(Membership, Taking, DeliveryNotes, RecordQueue, ShardLeases, MessageNotes):
    """The lane broker on a RabbitMQ cluster, every role of :mod:`keylane.workers.broker`
    (see the module docstring). It opens its own store connection (``store_factory``) and
    owns it: the RabbitMQ parking and holding (:class:`~keylane.workers.store.ParkingStore`)
    and the fencing tokens it claims (:class:`~keylane.workers.store.FenceStore`)."""

    def __init__(
        self,
        settings: Settings,
        store_factory: Callable[[], SqlStore],
        on_dead: Callable[[bytes, dict[str, Any]], None] | None = None,
        after_ack: Callable[[Sequence[Ack]], None] | None = None,
    ) -> None:
        self.settings = settings
        #: Where outcomes are counted and told after their ack (the Redis helper), if
        #: anywhere: gathered across lanes by a thread of its own.
        self._after_acks = AfterAcks(after_ack) if after_ack is not None else None
        self.urls = settings.amqp_urls()
        self._store_factory = store_factory
        self._store: SqlStore | None = None
        self._store_lock = threading.Lock()
        self._on_dead = on_dead
        self._lock = threading.RLock()
        self._shards: dict[int, ShardConsumer] = {}
        self._calls = Calls()
        self._acks = PendingAcks(self._submit)
        self._subscriptions: set[DoorbellSubscription] = set()
        self._members: dict[str, float] = {}
        self._member_ttl_s = settings.lease_ttl_ms / 1000
        self.worker_id = ""
        self._info: dict[str, Any] = {}
        self._connection: Any = None
        # Workers start on different nodes, so one node's loss is not every worker's.
        self._node = random.randrange(len(self.urls))
        self._generation = 0
        self._control: Any = None
        self._stop = threading.Event()
        self._dead = (
            None
            if on_dead is None
            else DeadLetterConsumer(
                settings, on_dead, self._submit, self._stored, lambda: self._generation
            )
        )
        self._thread = threading.Thread(target=self._run, name="keylane-amqp", daemon=True)
        self._thread.start()

    # -- records --------------------------------------------------------------------

    def finish(
        self,
        lease: Lease,
        taken: Taken,
        acks: Sequence[Ack],
        hold: int | None = None,
        then_take: bool = False,
    ) -> Taken | bool:
        done = self._finish(lease, taken, acks, hold, then_take)
        if done is not False and acks and self._after_acks is not None:
            self._after_acks.add(acks)  # counted and told after the ack (:mod:`.after_acks`)
        return done

    def _finish(
        self,
        lease: Lease,
        taken: Taken,
        acks: Sequence[Ack],
        hold: int | None,
        then_take: bool,
    ) -> Taken | bool:
        with self._lock:
            consumer = self._current(lease)
            if consumer is None:
                return False
            handed, _ = consumer.busy.get(taken.record_key, ([], 0.0))
        if hold is not None:
            # The hold is in the store before the message is acknowledged: a crash in
            # between redelivers it, and it parks behind the hold it caused.
            try:
                self._hold(consumer, lease, taken.record_key, hold)
            except StaleFence:
                return False
        if handed and handed[0] < 0:
            return self._finish_parked(consumer, lease, taken, [-t for t in handed], acks)
        with self._lock:
            if self._current(lease) is not consumer:
                return False
            consumer.busy.pop(taken.record_key, None)
            acked = {ack.raw for ack in acks}
            done = [d for t in handed if (d := consumer.deliveries.get(t)) and d.raw in acked]
            self._forget(consumer, taken.record_key, done)
            nxt = self._take_from(consumer, time.monotonic()) if then_take else None
        if done:
            self._acks.add(consumer, [d.tag for d in done])
            tries.forget(self._stored, consumer.shard, done)
        return self._tried(consumer, nxt) if isinstance(nxt, Taken) else True

    def wait(
        self,
        lease: Lease,
        taken: Taken,
        delay_s: float,
        why: dict[str, Any],
        counts: Counts = "keep",
        messages: Sequence[bytes] = (),
    ) -> bool:
        key = taken.record_key
        with self._lock:
            consumer = self._current(lease)
            if consumer is None:
                return False
            handed, _ = consumer.busy.get(key, ([], 0.0))
        if handed and handed[0] < 0:
            return self._wait_parked(consumer, lease, key, -handed[0], delay_s, counts)
        with self._lock:
            if self._current(lease) is not consumer:
                return False
            consumer.busy.pop(key, None)
            uncount = set(messages) if counts != "keep" else set()
            for tag in handed:
                delivery = consumer.deliveries.get(tag)
                if delivery is not None and delivery.raw in uncount:
                    delivery.taken = max(0, delivery.taken - 1)
            if counts == "forget":
                for tag in handed[1:]:
                    if tag in consumer.deliveries:
                        consumer.deliveries[tag].taken = 0
            tags = consumer.records.get(key, [])
            oldest = consumer.deliveries[tags[0]].received if tags else time.monotonic()
            held_s = time.monotonic() - oldest + delay_s
            if held_s <= self.settings.amqp_hold_budget_s / 2:
                consumer.due[key] = time.monotonic() + max(0.0, delay_s)
                return True
            # Too long to hold the deliveries: park them in the store.
            consumer.busy[key] = ([], time.monotonic())
            deliveries = [consumer.deliveries[t] for t in tags]
        if not self._park(consumer, lease, key, deliveries, time.time() + delay_s):
            with self._lock:
                consumer.due[key] = time.monotonic() + max(0.0, delay_s)
        return True

    def release_closed(self, lease: Lease, record_key: str, dead_letter_id: int) -> None:
        """Nothing to do: the hold reads its row with a share lock in the transaction that
        writes it, so a row closed first holds nothing, and a close that came after the
        hold found it and sent the release."""

    def send(self, messages: Sequence[Outgoing]) -> None:
        """Published with confirms from the AMQP thread (no markers here: a message sent
        again after a crash is queued again, and its lane's journal finds it applied)."""
        settings = self.settings
        items = [
            (shard_queue(settings.namespace, settings.shards, m.shard), m.record_key, m.raw)
            for m in messages
        ]
        timeout_s = settings.amqp_confirm_timeout_ms / 1000

        def publish() -> None:
            if self._connection is None:
                raise BrokerUnavailable("RabbitMQ: not connected")
            publish_confirmed(self._connection, items, timeout_s)

        self._submit(publish, wait=True)

    def in_flight(self, shard: int) -> list[str]:
        with self._lock:
            consumer = self._shards.get(shard)
            return list(consumer.busy) if consumer is not None else []

    def reclaim(self, lease: Lease, record_keys: Sequence[str], min_age_s: float) -> int:
        now = time.monotonic()
        with self._lock:
            consumer = self._current(lease)
            if consumer is None:
                return -1
            found = 0
            for key in record_keys:
                busy = consumer.busy.get(key)
                if busy is not None and now - busy[1] >= min_age_s:
                    del consumer.busy[key]
                    found += 1
            return found

    # -- dead letters past the broker's delivery limit ---------------------------------

    def _consume_dead(self, conn: Any) -> None:
        if self._dead is not None:
            self._dead.consume(conn)

    def close(self) -> None:
        """Send what is queued (acknowledgements, handoffs), then disconnect."""
        if self._connection is not None and self._thread.is_alive():
            self._submit(self._stop.set)
        else:
            self._stop.set()
        self._thread.join(10)
        if self._dead is not None:
            self._dead.close(5)
        if self._after_acks is not None:
            self._after_acks.close(5)
        if not self._thread.is_alive():
            self._calls.close()
        with self._store_lock:
            if self._store is not None:
                self._store.close()
                self._store = None
