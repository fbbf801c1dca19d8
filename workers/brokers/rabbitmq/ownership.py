"""Shard ownership on RabbitMQ: a consumer of the shard queue on a channel of its own; it
becomes the owner when the broker makes it the single active consumer (its first delivery
comes), and holds a lease once it claimed the store's next fencing token and checked its
channel still stands. Deliveries go into the consumer's records in order, and ring the
doorbell. Handing over closes the channel, so what it held returns to the head in order."""

from __future__ import annotations

import logging
import queue
import uuid
from collections.abc import Sequence
from typing import Any

from ....routing.contract.amqp_names import shard_queue
from ....routing.contract.message import (
    BATCH_HEADER,
    RETRY_OF_HEADER,
    UNHOLD_HEADER,
)
from ...broker import Acquired, Lease
from .consumers import (
    Delivery,
    ShardConsumer,
    dead_letter_id,
    delivery_headers,
    record_key_of,
)
from .holding import Holding
from .link import message_body, only_consumer, round_trip

log = logging.getLogger("keylane.rabbitmq")


class DoorbellSubscription:
    """The doorbell as :meth:`~keylane.workers.broker.RecordQueue.doorbell` hands it out:
    shards that just got messages."""

    def __init__(self, owner: Ownership) -> None:
        self._owner = owner
        self.queue: queue.SimpleQueue[int] = queue.SimpleQueue()

    def get_message(self, timeout: float = 0.0) -> dict[str, Any] | None:
        try:
            return {"data": self.queue.get(timeout=timeout)}
        except queue.Empty:
            return None

    def close(self) -> None:
        self._owner._subscriptions.discard(self)


class Ownership(Holding):
    """The shard consumers of :class:`RabbitLaneBroker` and their leases."""

    _subscriptions: set[DoorbellSubscription]

    def acquire(self, shard: int, worker_id: str, ttl_ms: int) -> Acquired:
        """Consume the shard (a new consumer is last in line); once this consumer is the
        active one (its first delivery came), claim the store's next token for it and
        hand out the lease."""
        self.worker_id = worker_id
        with self._lock:
            consumer = self._shards.get(shard)
            connected = self._connection is not None
        if consumer is None:
            if connected:
                self._submit(lambda: self._consume(shard), wait=True)
            return Acquired(None, "", 0)
        if not consumer.active and consumer.alive and connected:
            # No delivery yet: an empty queue never says who is active. Alone on the
            # queue, this consumer is the active one: it must own the shard all the same,
            # for the records parked in the store behind an empty queue.
            name = shard_queue(self.settings.namespace, self.settings.shards, shard)
            if self._submit(lambda: only_consumer(consumer, name), wait=True):
                with self._lock:
                    consumer.active = consumer.alive
        if not consumer.active or not consumer.alive:
            return Acquired(None, "", 0)
        if consumer.epoch == 0:
            epoch = self._stored(lambda store: store.claim_fence(shard))
            # One round trip on the channel that received: if the broker dropped this
            # connection (and another consumer took over), this fails and no lane writes
            # under the token just claimed.
            prefetch = self.settings.amqp_prefetch
            self._submit(lambda: round_trip(consumer, prefetch), wait=True)
            # Records parked by earlier consumers: their deliveries wait behind them; held
            # records are never due until released (also with nothing parked yet).
            parked = {row.record_key: row.due_at for row in self._stored(lambda s: s.parked(shard))}
            holds: dict[str, int] = self._stored(lambda s: s.held(shard))
            with self._lock:
                if self._shards.get(shard) is not consumer or not consumer.alive:
                    return Acquired(None, "", 0)
                consumer.epoch = epoch
                consumer.parked = parked
                consumer.held = holds
        value = consumer.lease_value(worker_id)
        restored = sum(1 for d in consumer.deliveries.values() if d.returned)
        return Acquired(Lease(shard, value, consumer.epoch), value, restored)

    def _consume(self, shard: int) -> None:
        """(AMQP thread.) Register a consumer of the shard on a channel of its own."""
        with self._lock:
            if shard in self._shards or self._connection is None:
                return
            channel = self._connection.channel()
        channel.basic_qos(0, self.settings.amqp_prefetch, False)
        tag = f"{self.worker_id}/{shard}/{uuid.uuid4().hex[:8]}"
        consumer = ShardConsumer(shard, channel, tag)
        with self._lock:
            self._shards[shard] = consumer
        name = shard_queue(self.settings.namespace, self.settings.shards, shard)

        def delivered(message: Any) -> None:
            self._delivered(consumer, message)

        channel.basic_consume(name, consumer_tag=tag, callback=delivered)

    def _delivered(self, consumer: ShardConsumer, message: Any) -> None:
        """(AMQP thread.) A delivery: into its record's list, in order."""
        raw = message_body(message)
        headers = message.headers or {}
        embedded = delivery_headers(raw, headers)
        record_key = record_key_of(headers, embedded)
        batch = str(embedded.get(BATCH_HEADER) or "")
        tag = int(message.delivery_tag)
        returned = int(headers.get("x-delivery-count") or 0)
        delivery = Delivery(tag, raw, record_key, batch, returned)
        delivery.unhold = dead_letter_id(embedded.get(UNHOLD_HEADER))
        delivery.retry_of = dead_letter_id(embedded.get(RETRY_OF_HEADER))
        with self._lock:
            if not consumer.alive:
                return
            consumer.active = True
            consumer.deliveries[tag] = delivery
            consumer.records.setdefault(record_key, []).append(tag)
            subscriptions = list(self._subscriptions)
        for subscription in subscriptions:
            subscription.queue.put(consumer.shard)

    def renew(self, leases: Sequence[Lease], ttl_ms: int) -> list[bool]:
        """Each lease still held: its consumer stands, and the store has claimed no newer
        token for the shard (another consumer that believed itself active did: this one
        lets go, so that one receives). Without the store the check waits a beat: no
        write goes through without it either."""
        try:
            fences: dict[int, int] = self._stored(lambda store: store.fences()) if leases else {}
        except Exception as exc:
            log.warning("cannot read the shards' fences to renew: %s", exc)
            fences = {}
        renewed, stale = [], []
        with self._lock:
            for lease in leases:
                consumer = self._current(lease)
                if consumer is not None and fences.get(lease.shard, 0) > lease.token:
                    stale.append(consumer)
                    consumer = None
                renewed.append(consumer is not None)
        self._let_go(stale, "the store has a newer fencing token")
        return renewed

    def _current(self, lease: Lease) -> ShardConsumer | None:
        consumer = self._shards.get(lease.shard)
        if (
            consumer is None
            or not consumer.alive
            or consumer.epoch != lease.token
            or consumer.lease_value(self.worker_id) != lease.value
        ):
            return None
        return consumer

    def release_lease(self, lease: Lease, worker_id: str, reason: str = "released") -> bool:
        """Hand the shard over: close its channel (after the acks queued before), so what
        this worker held goes back to the head of the queue in order."""
        with self._lock:
            consumer = self._shards.get(lease.shard)
            if consumer is None or consumer.lease_value(worker_id) != lease.value:
                return False
        self._let_go([consumer], reason)
        return True

    def lose(self, lease: Lease, worker_id: str, why: str) -> None:
        """Let go of the lost lease's consumer at once: kept, it would keep its place as
        the queue's single active consumer and its unacknowledged deliveries, and the
        shard's new owner would never receive them."""
        self.release_lease(lease, worker_id, f"lost: {why}")

    def bump_fence(self, shard: int, at_least: int) -> int:
        # Tokens come from the store itself: there is no second counter to move.
        return at_least

    # -- the doorbell -----------------------------------------------------------------

    def doorbell(self) -> Any:
        subscription = DoorbellSubscription(self)
        self._subscriptions.add(subscription)
        return subscription
