"""Handing a shard's next due record to a lane: from the deliveries held in memory (a
record's first message and the followers that may go with it in one batch), or the key
of a due record parked in the store, which the lane's broker call reads from there. A
redelivered message's try is noted in the store before its lane starts it (:mod:`.tries`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from ...broker import Idle, Lease, Taken
from . import tries
from .consumers import ShardConsumer, batch_limit
from .ownership import Ownership


class Taking(Ownership):
    """The taking of records of :class:`~.broker.RabbitLaneBroker` (its
    :meth:`~keylane.workers.broker.RecordQueue.take`)."""

    def take(self, leases: Sequence[Lease]) -> Taken | Idle:
        now = time.monotonic()
        due_in: dict[int, float] = {}
        for lease in leases:
            with self._lock:
                consumer = self._current(lease)
                behind = self._behind_parked(consumer) if consumer is not None else []
            if consumer is None:
                continue
            for key, deliveries in behind:
                self._park(consumer, lease, key, deliveries, consumer.parked_due(key, 0.0))
            with self._lock:
                if self._current(lease) is not consumer:
                    continue
                taken = self._take_from(consumer, now, parked_ok=True)
                if taken is None:
                    waits = [at - now for k, at in consumer.due.items() if k not in consumer.busy]
                    waits += [
                        at - time.time()
                        for k, at in consumer.due_parked()
                        if k not in consumer.busy
                    ]
                    if waits:
                        due_in[lease.shard] = max(0.0, min(waits))
            if taken is None:
                continue
            if isinstance(taken, Taken):
                return self._tried(consumer, taken)
            unparked = self._take_parked(consumer, lease, taken)
            if unparked is not None:
                return unparked
        return Idle(due_in)

    def _tried(self, consumer: ShardConsumer, taken: Taken) -> Taken:
        """``taken`` as its lane gets it: a redelivered message's try noted in the store
        before it starts, and counted from the notes (:mod:`.tries`)."""
        with self._lock:
            handed, _ = consumer.busy.get(taken.record_key, ([], 0.0))
            first = consumer.deliveries.get(handed[0]) if handed else None
        if first is None or not first.returned or first.noted:
            return taken
        tries.note_try(self._stored, consumer.shard, first)
        with self._lock:
            return dataclasses.replace(taken, deliveries=first.returned + first.taken)

    def _take_from(
        self, consumer: ShardConsumer, now: float, parked_ok: bool = False
    ) -> Taken | str | None:
        """(Under the lock.) The next due record: handed out from memory, or (with
        ``parked_ok``) the key of a due parked record, marked busy for the caller to read
        from the store."""
        if parked_ok:
            wall = time.time()
            for key, due_at in consumer.due_parked():
                if key not in consumer.busy and due_at <= wall:
                    consumer.busy[key] = ([], now)
                    return key
        emptied: list[str] = []
        try:
            return self._take_in_memory(consumer, now, emptied)
        finally:
            for key in emptied:
                consumer.records.pop(key, None)

    def _take_in_memory(
        self, consumer: ShardConsumer, now: float, emptied: list[str]
    ) -> Taken | None:
        """(Under the lock.) The next due record held in memory, handed out; the records
        whose list only held releases that met no hold in ``emptied``."""
        for key, tags in consumer.records.items():
            if key in consumer.busy or consumer.waits_in_store(key) or not tags:
                continue
            if consumer.deliveries[tags[0]].unhold is not None:
                self._drop_strays(consumer, tags)
                if not tags:
                    emptied.append(key)
                    continue
            if consumer.due.get(key, 0.0) > now:
                continue
            consumer.due.pop(key, None)
            first = consumer.deliveries[tags[0]]
            handed = [first]
            limit = batch_limit(first.batch)
            for tag in tags[1:limit]:
                follower = consumer.deliveries[tag]
                if follower.batch != first.batch or follower.returned or follower.taken:
                    break
                handed.append(follower)
            for delivery in handed:
                delivery.taken += 1
            consumer.busy[key] = ([d.tag for d in handed], now)
            return Taken(
                consumer.shard,
                key,
                first.raw,
                first.returned + first.taken,
                False,
                tuple(d.raw for d in handed[1:]),
            )
        return None
