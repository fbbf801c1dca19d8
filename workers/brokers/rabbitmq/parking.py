"""Parking: a record whose deliveries would be held longer than half
``amqp_hold_budget_s`` (a long wait, or a backlog) has its messages written to the store
(``ParkingStore.park``, fenced), then acknowledged, so no delivery outlives the broker's consumer
timeout; its later deliveries park behind them; lanes take parked messages from the store
when due and delete each once done (``ParkingStore.unpark``). Also this broker's one store
connection (its parking and holding, and the fencing tokens it claims)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from ....routing.contract.errors import StaleFence, StoreUnavailable
from ...broker import Ack, Counts, Lease, Taken
from ...store_rows import Fence
from ...stores.sql import SqlStore
from . import tries
from .acks import PendingAcks
from .amqp_thread import AmqpLink
from .consumers import HELD, Delivery, ShardConsumer

log = logging.getLogger("keylane.rabbitmq")

T = TypeVar("T")


class Parking(AmqpLink):
    """The parked records of :class:`RabbitLaneBroker`, and its store connection."""

    _store_factory: Callable[[], SqlStore]
    _store: SqlStore | None
    _store_lock: threading.Lock
    _acks: PendingAcks

    def _behind_parked(self, consumer: ShardConsumer) -> list[tuple[str, list[Delivery]]]:
        """(Under the lock.) Deliveries of parked records that are not parked yet, each
        record marked busy while they are."""
        found = []
        for key in consumer.in_store():
            tags = consumer.records.get(key)
            if tags and key not in consumer.busy:
                found.append(_to_park(consumer, key, tags))
        return found

    def _stale(self, consumer: ShardConsumer) -> list[tuple[str, list[Delivery]]]:
        """(Under the lock.) Records not in a lane whose first delivery is held longer
        than half the hold budget (a backlog): marked busy, to be parked due now."""
        limit = time.monotonic() - self.settings.amqp_hold_budget_s / 2
        found = []
        for key, tags in consumer.records.items():
            if tags and key not in consumer.busy and consumer.deliveries[tags[0]].received < limit:
                found.append(_to_park(consumer, key, tags))
        return found

    def park_stale(self) -> int:
        """Park every record whose deliveries are held too long (the heartbeat calls it):
        how many records were parked."""
        parked = 0
        with self._lock:
            work = [(c, self._stale(c)) for c in self._shards.values() if c.epoch and c.alive]
        for consumer, records in work:
            lease = Lease(consumer.shard, consumer.lease_value(self.worker_id), consumer.epoch)
            for key, deliveries in records:
                parked += self._park(consumer, lease, key, deliveries, time.time())
        return parked

    def _park(
        self,
        consumer: ShardConsumer,
        lease: Lease,
        key: str,
        deliveries: list[Delivery],
        due_at: float,
    ) -> bool:
        """Write ``deliveries`` (the record's, in order, marked busy by the caller) to the
        store behind what is parked, under the shard's fence, then acknowledge them (see
        :meth:`_park_in_turn`); the record is no longer busy after. On failure they stay
        here, and the record waits in memory."""
        try:
            return self._park_in_turn(consumer, lease, key, deliveries, due_at)
        finally:
            with self._lock:
                consumer.busy.pop(key, None)

    def _park_in_turn(
        self,
        consumer: ShardConsumer,
        lease: Lease,
        key: str,
        deliveries: list[Delivery],
        due_at: float,
    ) -> bool:
        """(The record busy.) Park ``deliveries``, in order (:class:`.holding.Holding`
        also acts on the releases among them)."""
        return self._park_messages(consumer, lease, key, deliveries, due_at)

    def _park_messages(
        self,
        consumer: ShardConsumer,
        lease: Lease,
        key: str,
        deliveries: list[Delivery],
        due_at: float,
    ) -> bool:
        """(The record busy.) Write ``deliveries`` to the store behind what is parked,
        fenced, due at ``due_at`` (a held record's: the store's hold decides), then
        acknowledge them. False (and nothing changed) when the store refused."""
        tries.settle(self._stored, lease.shard, deliveries)
        messages = [(d.raw, d.returned + d.taken) for d in deliveries]
        fence = Fence(lease.shard, lease.token)
        stored_due = due_at if due_at != HELD else time.time()
        try:
            self._stored(lambda store: store.park(lease.shard, key, messages, stored_due, fence))
        except StaleFence as exc:
            # Another consumer claimed the shard: holding on would strand what this one
            # was delivered (the broker gives it to no one else while this one stands).
            self._let_go([consumer], f"could not park {key}: {exc}")
            return False
        except Exception as exc:
            log.warning("shard %s: could not park %s: %s", lease.shard, key, exc)
            return False
        with self._lock:
            self._forget(consumer, key, deliveries)
            consumer.due.pop(key, None)
            consumer.parked[key] = stored_due
            alive = consumer.alive
        if alive:  # else the broker gives them back: parked again behind, the journal dedupes
            self._acks.add(consumer, [d.tag for d in deliveries])
        tries.forget(self._stored, lease.shard, deliveries)  # the parked rows count on
        log.info("shard %s: parked %s message(s) of %s", lease.shard, len(messages), key)
        return True

    @staticmethod
    def _forget(consumer: ShardConsumer, key: str, deliveries: list[Delivery]) -> None:
        """(Under the lock.) ``deliveries`` of ``key`` are no longer held here."""
        tags = consumer.records.get(key, [])
        for delivery in deliveries:
            consumer.deliveries.pop(delivery.tag, None)
            if delivery.tag in tags:
                tags.remove(delivery.tag)
        if not tags:
            consumer.records.pop(key, None)

    def _take_parked(self, consumer: ShardConsumer, lease: Lease, key: str) -> Taken | None:
        """Hand out the first parked message of ``key`` (marked busy by the caller),
        its delivery counted in the store."""
        try:
            rows = self._stored(lambda store: store.parked(lease.shard, key, limit=1))
            if rows:
                first = rows[0]
                self._stored(lambda s: s.count_parked(lease.shard, key, first.seq))
        except Exception:
            with self._lock:
                consumer.busy.pop(key, None)
            raise
        with self._lock:
            if not rows:
                consumer.parked.pop(key, None)
                consumer.busy.pop(key, None)
                return None
            consumer.busy[key] = ([-first.seq], time.monotonic())
        return Taken(lease.shard, key, first.raw, first.deliveries + 1)

    def _stored(self, fn: Callable[[SqlStore], T]) -> T:
        """Run ``fn`` on this broker's store connection (one at a time): its
        :class:`~keylane.workers.store.ParkingStore` and, for the ownership, its
        :class:`~keylane.workers.store.FenceStore`."""
        with self._store_lock:
            try:
                self._store = self._store or self._store_factory()
                return fn(self._store)
            except StoreUnavailable:
                if self._store is not None:
                    self._store.close()
                self._store = None
                raise

    def _finish_parked(
        self,
        consumer: ShardConsumer,
        lease: Lease,
        taken: Taken,
        seqs: list[int],
        acks: Sequence[Ack],
    ) -> bool:
        """A parked message done with: forget it in the store (fenced)."""
        key = taken.record_key
        remaining = 1
        if acks:
            fence = Fence(lease.shard, lease.token)
            try:
                remaining = self._stored(lambda s: s.unpark(lease.shard, key, seqs, fence))
            except StaleFence:
                return False
            finally:
                with self._lock:
                    consumer.busy.pop(key, None)
        with self._lock:
            consumer.busy.pop(key, None)
            if remaining == 0:
                consumer.parked.pop(key, None)
        return True

    def _wait_parked(
        self,
        consumer: ShardConsumer,
        lease: Lease,
        key: str,
        seq: int,
        delay_s: float,
        counts: Counts,
    ) -> bool:
        """A parked message's record waits again: its new due time in the store."""
        due_at = time.time() + delay_s
        fence = Fence(lease.shard, lease.token)
        try:
            if counts != "keep":
                self._stored(lambda s: s.count_parked(lease.shard, key, seq, -1))
            self._stored(lambda s: s.park(lease.shard, key, [], due_at, fence))
        except StaleFence:
            return False
        finally:
            with self._lock:
                consumer.busy.pop(key, None)
        with self._lock:
            consumer.parked[key] = due_at
        return True


def _to_park(consumer: ShardConsumer, key: str, tags: list[int]) -> tuple[str, list[Delivery]]:
    """(Under the lock.) ``key`` marked busy while its deliveries (``tags``, in order) are
    parked: the record and those deliveries."""
    consumer.busy[key] = ([], time.monotonic())
    return key, [consumer.deliveries[t] for t in tags]
