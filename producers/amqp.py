"""The receiver on RabbitMQ: publishing an accepted event to its shard's quorum queue with
a publisher confirm (the receiver side's one module that imports an AMQP client: aiormq,
on the receiver's own event loop).

A 2xx is sent only after the broker confirmed the message: a quorum (2 of 3 nodes) has
written it, and it survives the loss of a minority of nodes. One connection per receiver
process, its channel in confirm mode, carries many publishes at once: each has its own
delivery tag, and each request waits only for the confirm of its own tag. No confirm within
``KEYLANE_AMQP_CONFIRM_TIMEOUT_MS`` (connecting and declaring included), a nack (no
quorum, or the shard at its high-water mark: its ``x-max-length`` with
``reject-publish``), a message the broker returned (no such queue), or a lost connection:
503 with ``Retry-After``. A confirm that comes after its request gave up confirms nothing
else (it carries its own tag).

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

The marks' reads and writes of requests that run at once share round trips to Redis
(:mod:`keylane.producers.mark_batches`): under load those two calls a request had cost the
receiver more CPU than its publish.

Redis down: no duplicate is answered 200 from a mark (each is published and the journal
absorbs it), counters and ``/metrics`` lag; no event is lost or applied twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import Sequence
from typing import Any, cast
from urllib.parse import parse_qsl, urlencode, urlsplit

import aiormq
from aiormq.abc import AbstractChannel, AbstractConnection
from aiormq.exceptions import ChannelInvalidStateError
from pamqp.commands import Basic

from ..routing.contract.amqp_names import (
    as_declared_before,
    probe_queue,
    shard_queue,
    topology,
)
from ..routing.contract.errors import BrokerUnavailable
from ..routing.contract.message import RECORD_HEADER
from ..routing.contract.replies import reply_text
from ..routing.contract.schedules import RunLease
from ..routing.contract.settings import Settings
from .gateway import (
    BatchResult,
    Enqueue,
    EnqueueResult,
    ReceiverGateway,
    Verdict,
    broker_errors,
)

log = logging.getLogger("keylane.receiver")

#: What a publish meets when the broker or the network fails (anything else is logged
#: with its traceback as well; either way the sender gets a 503, never a 500).
EXPECTED = (TimeoutError, aiormq.exceptions.AMQPError, ChannelInvalidStateError, OSError)

#: How a receiver's connection is named to RabbitMQ (its management UI, ``rabbitmqctl
#: list_connections client_properties``).
CONNECTION_NAME = "keylane receiver"


class AmqpPublisher:
    """The receiver's connection to RabbitMQ: one channel in confirm mode, many publishes
    in flight. Opened on first use and again after it was lost, each time on the next node
    (receivers spread over the nodes); an open is shared by the requests that wait for it,
    and each of them waits no longer than its own confirm timeout."""

    def __init__(self, settings: Settings) -> None:
        self.urls = [
            with_query(url, heartbeat=settings.amqp_heartbeat_s, name=CONNECTION_NAME)
            for url in settings.amqp_urls()
        ]
        self.topology = topology(settings)
        self.probe = probe_queue(settings.namespace)
        self.confirm_timeout_s = settings.amqp_confirm_timeout_ms / 1000
        self._node = random.randrange(len(self.urls)) - 1
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._opening: asyncio.Task[AbstractChannel] | None = None

    async def publish(self, queue: str, message: bytes, record_key: str) -> None:
        """Publish and wait for its confirm; :class:`BrokerUnavailable` when none came in
        time, the broker refused it, or the connection is gone."""
        properties = Basic.Properties(
            delivery_mode=2,
            content_type="application/json",
            headers={RECORD_HEADER: record_key},
        )
        channel: AbstractChannel | None = None
        try:
            async with asyncio.timeout(self.confirm_timeout_s):
                channel = await self._open()
                # wait=False: the publish is queued for the connection's writer and the
                # channel's lock let go at once, so the publishes of requests that run
                # together go out together; the confirm is still awaited (below).
                confirm = await cast(aiormq.Channel, channel).basic_publish(
                    message, routing_key=queue, properties=properties, mandatory=True, wait=False
                )
        except Exception as exc:
            # Any failure ends this connection (the requests still waiting on it answer
            # 503 too, and their senders send again): a channel whose publishes to a
            # quorum queue were refused can go on refusing them after the queue has a new
            # leader (seen for minutes after a node's loss), and a new one does not.
            if not isinstance(exc, EXPECTED):
                log.warning("publish failed unexpectedly", exc_info=True)
            self._drop(channel)
            raise BrokerUnavailable(_failure(queue, exc, self.confirm_timeout_s)) from None
        except asyncio.CancelledError:
            # The connection closed under this publish (aiormq cancels the confirms it
            # still waited for) unless this request itself is being cancelled.
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            self._drop(channel)
            raise BrokerUnavailable("RabbitMQ: no confirm (the connection closed)") from None
        if not isinstance(confirm, Basic.Ack):
            self._drop(channel)
            raise BrokerUnavailable(f"RabbitMQ: publish refused ({type(confirm).__name__})")

    async def ready(self) -> bool:
        """Whether a publish is confirmed now: one to the probe queue (it keeps one
        message), within the confirm timeout."""
        try:
            await self.publish(self.probe, b"{}", "")
        except BrokerUnavailable as exc:
            log.info("not ready: %s", exc)
            return False
        return True

    async def _open(self) -> AbstractChannel:
        """The open channel, or the one being opened (shared: a caller that gives up does
        not stop it for the others)."""
        channel = self._channel
        if channel is not None and not channel.is_closed:
            return channel
        if self._opening is None or self._opening.done():
            self._opening = asyncio.create_task(self._connect())
        return await asyncio.shield(self._opening)

    async def _connect(self) -> AbstractChannel:
        """Connect to the next node that answers, declare the topology (a receiver need not
        wait for a worker to have declared it), open the confirm channel. Each node gets
        at most the confirm timeout."""
        self._drop(self._channel)
        errors = []
        for _ in self.urls:
            self._node = (self._node + 1) % len(self.urls)
            url = self.urls[self._node]
            connection: AbstractConnection | None = None
            try:
                async with asyncio.timeout(self.confirm_timeout_s):
                    connection = await aiormq.connect(url)
                    channel = await connection.channel(publisher_confirms=True)
                    channel = await self._declare(connection, channel)
            except (TimeoutError, aiormq.exceptions.AMQPError, OSError) as exc:
                errors.append(f"{urlsplit(url).hostname}:{urlsplit(url).port}: {exc!r}")
                if connection is not None:
                    with contextlib.suppress(Exception):
                        await connection.close()
                continue
            self._connection, self._channel = connection, channel
            return channel
        raise BrokerUnavailable(f"RabbitMQ: no node answers ({'; '.join(errors)})")

    async def _declare(
        self, connection: AbstractConnection, channel: AbstractChannel
    ) -> AbstractChannel:
        """The deployment's topology (the same the workers declare: a queue declared
        twice with other arguments is refused). A queue created before keylane asked for
        balanced leaders refuses the leader locator (and the channel with it): declared
        again, on a new channel, as it was created. Returns the channel, still open."""
        wanted = self.topology
        for exchange, kind in wanted.exchanges:
            await channel.exchange_declare(
                exchange=exchange, exchange_type=kind, durable=True, auto_delete=False
            )
        for name, arguments in wanted.queues:
            try:
                await channel.queue_declare(
                    queue=name, durable=True, auto_delete=False, arguments=arguments
                )
            except aiormq.exceptions.ChannelPreconditionFailed:
                before = as_declared_before(arguments)
                if before == arguments:
                    raise
                channel = await connection.channel(publisher_confirms=True)
                await channel.queue_declare(
                    queue=name, durable=True, auto_delete=False, arguments=before
                )
        for name, exchange in wanted.bindings:
            await channel.queue_bind(queue=name, exchange=exchange, routing_key=name)
        return channel

    def _drop(self, channel: AbstractChannel | None) -> None:
        """Forget the connection of ``channel`` (if it is still the current one): the
        next publish opens another, on the next node."""
        if channel is None or channel is not self._channel:
            return
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            task = asyncio.ensure_future(connection.close())
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def close(self) -> None:
        """Close the connection."""
        if self._opening is not None and not self._opening.done():
            self._opening.cancel()
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()


class AmqpEventQueue:
    """The event queue when the shard queues are on RabbitMQ (see the module docstring):
    the events go to RabbitMQ; dedupe marks, counters and metrics stay in its Redis (an
    optional helper)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.shards = settings.shards
        self.redis = ReceiverGateway.from_settings(settings)
        self.publisher = AmqpPublisher(settings)

    async def accept(self, item: Enqueue, share: int = 0) -> EnqueueResult:
        """Answer a duplicate from its mark; else publish, wait for the confirm, then
        mark (see the module docstring). The high-water mark is the shard queue's own
        ``x-max-length`` here. A scheduled run's lease is checked in Redis (where the
        scheduler keeps it) before the publish: ``fenced``, nothing published, once the
        run lost it (see :meth:`holds`)."""
        return (await self.accept_batch([item], item.lease)).single()

    async def accept_batch(
        self, items: Sequence[Enqueue], lease: RunLease | None = None, share: int = 0
    ) -> BatchResult:
        """:meth:`accept` for every event of a delivery: their marks read in one round,
        the new ones published at once (each with its own confirm), and marked once every
        confirm came. One publish refused or unconfirmed refuses the delivery (503, no
        mark written): those of its events that did land are published again by the
        sender's retry, and the journal makes the second copies duplicates. (``share``:
        the shard queues' own length bounds a flood here; fair admission across sources
        is the Redis broker's.)"""
        if lease is not None and not await self.holds(lease):
            return BatchResult([], "fenced")
        earlier = await self._seen_all(items)
        results: list[EnqueueResult] = []
        new: list[Enqueue] = []
        first: dict[tuple[str, str], Enqueue] = {}
        for item, seen in zip(items, earlier, strict=True):
            mine = first.get((item.source, item.event_id))
            if seen is None and mine is not None:  # twice in this delivery
                verdict: Verdict = "duplicate" if mine.body_sha256 == item.body_sha256 else "reused"
                seen = EnqueueResult(verdict, mine.answer.decode())
            if seen is not None:
                results.append(seen)
                continue
            first[(item.source, item.event_id)] = item
            new.append(item)
            results.append(EnqueueResult("accepted", item.answer.decode()))
        await asyncio.gather(*(self._publish(item) for item in new))
        await self._mark_all(new)
        return BatchResult(results)

    async def _publish(self, item: Enqueue) -> None:
        name = shard_queue(self.settings.namespace, self.shards, item.shard)
        await self.publisher.publish(name, item.message, item.record_key)

    async def _mark_all(self, items: Sequence[Enqueue]) -> None:
        """Mark ``items`` seen (their marks share a round), each failure logged: the
        events are queued whatever Redis does (see the module docstring)."""
        marked = await asyncio.gather(
            *(
                self.redis.mark_seen(
                    item.source,
                    item.event_id,
                    item.body_sha256,
                    item.answer,
                    item.retention_ms,
                    item.key_missing,
                )
                for item in items
            ),
            return_exceptions=True,
        )
        for item, outcome in zip(items, marked, strict=True):
            if isinstance(outcome, BrokerUnavailable):
                ref = f"{item.source}/{item.event_id}"
                log.warning("event %s accepted, not marked seen: %s", ref, outcome)
            elif isinstance(outcome, BaseException):
                raise outcome

    async def holds(self, lease: RunLease) -> bool:
        """Whether the run still holds its job's lease (a Redis outage raises
        :class:`BrokerUnavailable`: the run cannot tell, so it sends nothing).

        The check and the publish are two steps here (on Redis, one script): a run that
        pauses between them, past its lease, publishes one event after another scheduler
        took the job over. Its id is ``job@tick/key``: if the tick is run again, the same
        id comes twice and the journal applies it once (whichever lands first); what the
        ids do not cover is in the docs page "The RabbitMQ broker" (ops/docs/rabbitmq.md),
        "Scheduled runs and repairs on RabbitMQ"."""
        with broker_errors():
            value = await self.redis.client.get(lease.key)
        return value is not None and reply_text(value) == lease.value

    async def push_once(self, marker: str, shard: int, message: bytes, marker_ttl_ms: int) -> bool:
        """Publish an operator's message (a dead letter's retry) unless ``marker`` says it
        was published before. As with the dedupe mark, the marker is written after the
        confirm: a crash (or a Redis outage) in between leaves none, the next retry
        publishes again, and the journal makes the second copy a duplicate."""
        key = self.redis.keys.once(marker)
        try:
            with broker_errors():
                if await self.redis.client.exists(key):
                    return False
        except BrokerUnavailable as exc:
            log.warning("marker %s unreadable, publishing: %s", marker, exc)
        name = shard_queue(self.settings.namespace, self.shards, shard)
        await self.publisher.publish(name, message, _record_key_of(message))
        try:
            with broker_errors():
                await self.redis.client.set(key, "1", px=marker_ttl_ms)
        except BrokerUnavailable as exc:
            log.warning("message %s published, marker not written: %s", marker, exc)
        return True

    async def record_reuse(self, item: Enqueue) -> bool:
        """Publish the review message of a reused id (a repeat of it adds a second review
        row only when the mark of the first could not be read)."""
        name = shard_queue(self.settings.namespace, self.shards, item.shard)
        await self.publisher.publish(name, item.message, item.record_key)
        return True

    async def _seen_all(self, items: Sequence[Enqueue]) -> list[EnqueueResult | None]:
        """What each item's dedupe mark says (None: unseen); all None when the marks cannot
        be read (each is published, and the journal absorbs a second copy)."""
        try:
            return await self.redis.seen_all(
                [(item.source, item.event_id, item.body_sha256) for item in items]
            )
        except BrokerUnavailable as exc:
            names = ", ".join(f"{item.source}/{item.event_id}" for item in items)
            log.warning("dedupe marks unreadable, publishing %s: %s", names, exc)
            return [None] * len(items)

    async def ping(self) -> bool:
        """Whether a publish is confirmed now (Redis is only a helper here)."""
        return await self.publisher.ready()

    async def close(self) -> None:
        await self.publisher.close()
        await self.redis.close()


def _failure(queue: str, exc: BaseException, timeout_s: float) -> str:
    """Why a publish got no confirm, for the 503 and the log."""
    if isinstance(exc, TimeoutError):
        return f"RabbitMQ: no confirm within {timeout_s:g} s"
    if isinstance(exc, aiormq.exceptions.PublishError):
        return f"RabbitMQ: {queue} does not exist (the message was returned)"
    return f"RabbitMQ: no confirm ({type(exc).__name__}: {exc})"


def with_query(url: str, **params: Any) -> str:
    """``url`` with ``params`` added to (or replacing those in) its query string."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    query.update({name: str(value) for name, value in params.items()})
    return parts._replace(query=urlencode(query)).geturl()


def _record_key_of(message: bytes) -> str:
    """The record key the message's headers carry (the lane broker reads it there)."""
    try:
        headers = json.loads(message).get("headers") or {}
        return str(headers.get(RECORD_HEADER) or "")
    except (ValueError, AttributeError):
        return ""
