"""Holding: a record of a source whose policy is ``hold`` waits behind its dead letter until
an operator closes or retries the row. On RabbitMQ a held record is a parked record that
is never due (:data:`.consumers.HELD`) until released; the hold itself is a row of the
store's ``held`` table, written under the shard's fence before the dead-lettered message
is acknowledged, and read by every new consumer of the shard at takeover.

The releases travel through the shard queue, in the record's order, as on Redis: a
``keylane_unhold`` message naming the holding row (``keylane dlq discard/resolve``) lets
the parked messages go; the operator's retry of the holding row (``keylane_retry_of``)
is parked ahead of them and releases the record. A release that meets no hold (the record
was released already: a redelivery after a crash) is acknowledged and dropped, never
handed to a lane."""

from __future__ import annotations

import logging
import time

from ....routing.contract.errors import StaleFence
from ...broker import Lease
from ...store_rows import Fence
from .consumers import Delivery, ShardConsumer
from .parking import Parking

log = logging.getLogger("keylane.rabbitmq")


class Holding(Parking):
    """The held records of :class:`RabbitLaneBroker`."""

    def _hold(self, consumer: ShardConsumer, lease: Lease, key: str, dead_letter_id: int) -> None:
        """(The record busy, before its messages are acknowledged.) Hold ``key`` behind
        ``dead_letter_id`` in the store, fenced (:class:`StaleFence` when the lease is
        lost), then here: its deliveries are parked behind the hold from now on. A row
        already closed holds nothing."""
        fence = Fence(lease.shard, lease.token)
        holder = self._stored(lambda s: s.hold(lease.shard, key, dead_letter_id, fence))
        if holder is None:
            log.info(
                "shard %s: %s not held: dead letter %s is closed", lease.shard, key, dead_letter_id
            )
            return
        with self._lock:
            consumer.held[key] = holder
        log.info("shard %s: %s held behind dead letter %s", lease.shard, key, holder)

    def _park_in_turn(
        self,
        consumer: ShardConsumer,
        lease: Lease,
        key: str,
        deliveries: list[Delivery],
        due_at: float,
    ) -> bool:
        """(The record busy.) Park ``deliveries`` in order; a release among them acts
        where it stands: the messages before it are parked first (held), those after it
        behind the released ones."""
        run: list[Delivery] = []
        for delivery in deliveries:
            with self._lock:
                holder = consumer.held.get(key)
            retry = holder is not None and delivery.retry_of == holder
            if delivery.unhold is None and not retry:
                run.append(delivery)
                continue
            if run and not self._park_run(consumer, lease, key, run, due_at):
                return False
            run = []
            if not self._release(consumer, lease, key, delivery, holder, due_at):
                return False
        return not run or self._park_run(consumer, lease, key, run, due_at)

    def _park_run(
        self,
        consumer: ShardConsumer,
        lease: Lease,
        key: str,
        run: list[Delivery],
        due_at: float,
    ) -> bool:
        """Park ``run``, due when the record's parked messages are (never, while held),
        else at ``due_at``."""
        with self._lock:
            due_at = consumer.parked_due(key, due_at)
        return self._park_messages(consumer, lease, key, run, due_at)

    def _release(
        self,
        consumer: ShardConsumer,
        lease: Lease,
        key: str,
        delivery: Delivery,
        holder: int | None,
        due_at: float,
    ) -> bool:
        """(The record busy.) A release: if the row it names holds the record, release
        it in the store (fenced; an operator's retry goes ahead of the parked messages),
        then acknowledge it. A release that meets no hold is acknowledged and dropped."""
        retry = delivery.unhold is None
        names = delivery.retry_of if retry else delivery.unhold
        released = False
        if holder is not None and names == holder:
            first = (delivery.raw, delivery.returned + delivery.taken) if retry else None
            fence = Fence(lease.shard, lease.token)
            try:
                released = self._stored(
                    lambda s: s.release(lease.shard, key, holder, time.time(), fence, first)
                )
            except StaleFence as exc:
                self._let_go([consumer], f"could not release {key}: {exc}")
                return False
            except Exception as exc:
                log.warning("shard %s: could not release %s: %s", lease.shard, key, exc)
                return False
        if retry and not released:  # the store knows no such hold: an event like another
            return self._park_run(consumer, lease, key, [delivery], due_at)
        with self._lock:
            self._forget(consumer, key, [delivery])
            if released:
                consumer.held.pop(key, None)
                consumer.parked[key] = time.time()
            alive = consumer.alive
        if alive:  # else it comes back, and meets no hold
            self._acks.add(consumer, [delivery.tag])
        if released:
            log.info("shard %s: %s released (dead letter %s)", lease.shard, key, holder)
        else:
            log.info("shard %s: release of %s by %s met no hold", lease.shard, key, names)
        return True

    def _drop_strays(self, consumer: ShardConsumer, tags: list[int]) -> None:
        """(Under the lock; the record neither busy nor waiting in the store.) Releases
        at the head of a record's list meet no hold: out of the list, and acknowledged
        (the acknowledgement is only queued for the AMQP thread, never waited for)."""
        strays = []
        while tags and consumer.deliveries[tags[0]].unhold is not None:
            tag = tags.pop(0)
            del consumer.deliveries[tag]
            strays.append(tag)
        if strays and consumer.alive:
            self._acks.add(consumer, strays)
