"""The receiver on RabbitMQ: publishing an accepted event to its shard's quorum queue with
a publisher confirm (the receiver side's one module that imports the AMQP client).

A 2xx is sent only after the broker confirmed the message: a quorum (2 of 3 nodes) has
written it, and it survives the loss of a minority of nodes. No confirm within
``KEYLANE_AMQP_CONFIRM_TIMEOUT_MS``, a nack (no quorum, or the shard at its high-water
mark: its ``x-max-length`` with ``reject-publish``), or a lost connection: 503 with
``Retry-After``, and the connection is closed before the next publish, since py-amqp
takes any confirm on a channel as the confirm of the publish it waits for, and a late one
of a timed-out publish would otherwise confirm the next.

Publishing and marking the event id seen are two steps here (on Redis they are one
script). The mark is written **after** the confirm, in Redis (an optional helper):

* a crash (or a Redis outage) between the confirm and the mark leaves no mark: the
  sender's retry is published again, and the store's journal, the authority for one
  effect per event id, makes the second copy a ``duplicate`` that changes nothing;
* a publish that got no confirm answers 503 and writes no mark, so the retry is never
  swallowed; the unconfirmed message may still land (a timed-out publish is kept by the
  leader and enqueued once a quorum is back): then two copies, and the journal again
  makes one of them a no-op;
* a mark exists only for a confirmed message, so it can only replay the 2xx of an event
  that is in a queue or already applied.

Redis down: no duplicate is answered 200 from a mark (each is published and the journal
absorbs it), counters and ``/metrics`` lag; no event is lost or applied twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import random
import threading
from typing import Any

from amqp import Message  # type: ignore[import-untyped]
from kombu.connection import Connection as _KombuConnection

from ..routing.contract.amqp_names import shard_queue, topology
from ..routing.contract.errors import BrokerUnavailable
from ..routing.contract.message import RECORD_HEADER
from ..routing.contract.replies import reply_text
from ..routing.contract.schedules import RunLease
from ..routing.contract.settings import Settings
from .gateway import EnqueueResult, ReceiverGateway, broker_errors

log = logging.getLogger("keylane.receiver")

#: kombu's connection is untyped: used as ``Any``.
Connection: Any = _KombuConnection


class ConfirmingPublisher:
    """One AMQP connection per receiver process, its channel in confirm mode; publishes
    one at a time (a confirm is matched to its publish only by order)."""

    def __init__(self, settings: Settings) -> None:
        self.urls = settings.amqp_urls()
        self.topology = topology(settings)
        self.heartbeat_s = settings.amqp_heartbeat_s
        self.confirm_timeout_s = settings.amqp_confirm_timeout_ms / 1000
        self._lock = threading.Lock()
        self._connection: Any = None
        self._channel: Any = None
        self._node = random.randrange(len(self.urls)) - 1  # receivers spread over the nodes

    def publish(self, queue: str, message: bytes, record_key: str) -> None:
        """Publish and wait for the confirm; :class:`BrokerUnavailable` when none came
        (the connection is then closed: a late confirm must not confirm the next one)."""
        with self._lock:
            try:
                channel = self._open()
                amqp_message = Message(
                    message,
                    delivery_mode=2,
                    content_type="application/json",
                    application_headers={RECORD_HEADER: record_key},
                )
                channel.basic_publish_confirm(
                    amqp_message,
                    exchange="",
                    routing_key=queue,
                    confirm_timeout=self.confirm_timeout_s,
                )
            except Exception as exc:
                self._close()
                raise BrokerUnavailable(
                    f"RabbitMQ: no confirm ({type(exc).__name__}: {exc})"
                ) from exc

    def alive(self) -> bool:
        """Whether a node answers (a connection opens, or the open one is up)."""
        with self._lock:
            try:
                self._open()
                self._connection.heartbeat_check()
                return True
            except Exception:
                self._close()
                return False

    def _open(self) -> Any:
        if self._channel is not None:
            return self._channel
        errors = []
        for _ in self.urls:
            self._node = (self._node + 1) % len(self.urls)
            conn = Connection(self.urls[self._node], heartbeat=self.heartbeat_s, connect_timeout=5)
            try:
                conn.connect()
                channel = conn.channel()
                self.topology.declare(channel)
                channel.confirm_select()
            except Exception as exc:
                errors.append(str(exc))
                with contextlib.suppress(Exception):
                    conn.release()
                continue
            self._connection, self._channel = conn, channel
            return channel
        raise BrokerUnavailable(f"RabbitMQ: no node answers ({'; '.join(errors)})")

    def _close(self) -> None:
        conn, self._connection, self._channel = self._connection, None, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.release()

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._close()


#: Confirming connections per receiver process: a publish waits for its confirm (a
#: quorum's write), so several let deliveries of different senders wait at once.
PUBLISHERS = 4


class PublisherPool:
    """:data:`PUBLISHERS` confirming publishers; each publish takes a free one."""

    def __init__(self, settings: Settings, size: int = PUBLISHERS) -> None:
        self._free: queue.SimpleQueue[ConfirmingPublisher] = queue.SimpleQueue()
        self._all = [ConfirmingPublisher(settings) for _ in range(size)]
        for publisher in self._all:
            self._free.put(publisher)

    def publish(self, queue_name: str, message: bytes, record_key: str) -> None:
        """:meth:`ConfirmingPublisher.publish` on a free connection."""
        publisher = self._free.get()
        try:
            publisher.publish(queue_name, message, record_key)
        finally:
            self._free.put(publisher)

    def alive(self) -> bool:
        """Whether a node answers."""
        publisher = self._free.get()
        try:
            return publisher.alive()
        finally:
            self._free.put(publisher)

    def close(self) -> None:
        """Close every connection."""
        for publisher in self._all:
            publisher.close()


class AmqpReceiverGateway(ReceiverGateway):
    """The receiver's gateway when the shard queues are on RabbitMQ: dedupe marks,
    counters and metrics stay in Redis (an optional helper), the events go to RabbitMQ."""

    def __init__(self, redis_gateway: ReceiverGateway, settings: Settings) -> None:
        super().__init__(redis_gateway.client, redis_gateway.keys, redis_gateway.shards)
        self.settings = settings
        self.publisher = PublisherPool(settings)

    async def accept(
        self,
        *,
        source: str,
        event_id: str,
        body_sha256: str,
        queue: str,
        shard: int,
        message: bytes,
        record_key: str,
        answer: bytes,
        retention_ms: int,
        high_water: int,
        key_missing: bool = False,
        lease: RunLease | None = None,
    ) -> EnqueueResult:
        """Answer a duplicate from its mark; else publish, wait for the confirm, then
        mark (see the module docstring). ``high_water`` is the shard queue's own
        ``x-max-length`` here. ``lease``: a scheduled run's, checked in Redis (where the
        scheduler keeps it) before the publish: ``fenced``, nothing published, once the
        run lost it (see :meth:`holds`)."""
        if lease is not None and not await self.holds(lease):
            return EnqueueResult("fenced", "")
        earlier = await self._seen(source, event_id, body_sha256)
        if earlier is not None:
            return earlier
        name = shard_queue(self.settings.namespace, self.shards, shard)
        await asyncio.to_thread(self.publisher.publish, name, message, record_key)
        try:
            await self.mark_seen(source, event_id, body_sha256, answer, retention_ms, key_missing)
        except BrokerUnavailable as exc:
            log.warning("event %s/%s accepted, not marked seen: %s", source, event_id, exc)
        return EnqueueResult("accepted", answer.decode())

    async def holds(self, lease: RunLease) -> bool:
        """Whether the run still holds its job's lease (a Redis outage raises
        :class:`BrokerUnavailable`: the run cannot tell, so it sends nothing).

        The check and the publish are two steps here (on Redis, one script): a run that
        pauses between them, past its lease, publishes one event after another scheduler
        took the job over. Its id is ``job@tick/key``: if the tick is run again, the same
        id comes twice and the journal applies it once (whichever lands first); what the
        ids do not cover is in README, "Scheduled runs and repairs on RabbitMQ"."""
        with broker_errors():
            value = await self.client.get(lease.key)
        return value is not None and reply_text(value) == lease.value

    async def push_once(self, marker: str, shard: int, message: bytes, marker_ttl_ms: int) -> bool:
        """Publish an operator's message (a dead letter's retry) unless ``marker`` says it
        was published before. As with the dedupe mark, the marker is written after the
        confirm: a crash (or a Redis outage) in between leaves none, the next retry
        publishes again, and the journal makes the second copy a duplicate."""
        key = self.keys.once(marker)
        try:
            with broker_errors():
                if await self.client.exists(key):
                    return False
        except BrokerUnavailable as exc:
            log.warning("marker %s unreadable, publishing: %s", marker, exc)
        name = shard_queue(self.settings.namespace, self.shards, shard)
        await asyncio.to_thread(self.publisher.publish, name, message, _record_key_of(message))
        try:
            with broker_errors():
                await self.client.set(key, "1", px=marker_ttl_ms)
        except BrokerUnavailable as exc:
            log.warning("message %s published, marker not written: %s", marker, exc)
        return True

    async def record_reuse(
        self,
        *,
        source: str,
        event_id: str,
        body_sha256: str,
        queue: str,
        shard: int,
        message: bytes,
        record_key: str,
        retention_ms: int,
    ) -> bool:
        """Publish the review message of a reused id (a repeat of it adds a second review
        row only when the mark of the first could not be read)."""
        name = shard_queue(self.settings.namespace, self.shards, shard)
        await asyncio.to_thread(self.publisher.publish, name, message, record_key)
        return True

    async def _seen(self, source: str, event_id: str, body_sha256: str) -> EnqueueResult | None:
        try:
            return await self.seen(source, event_id, body_sha256)
        except BrokerUnavailable as exc:
            log.warning("dedupe marks unreadable, publishing %s/%s: %s", source, event_id, exc)
            return None

    async def ping(self) -> bool:
        """Whether a RabbitMQ node answers (Redis is only a helper here)."""
        return await asyncio.to_thread(self.publisher.alive)

    async def close(self) -> None:
        await asyncio.to_thread(self.publisher.close)
        await super().close()


def _record_key_of(message: bytes) -> str:
    """The record key the message's headers carry (the lane broker reads it there)."""
    try:
        headers = json.loads(message).get("headers") or {}
        return str(headers.get(RECORD_HEADER) or "")
    except (ValueError, AttributeError):
        return ""
