"""The AMQP link: the one module of the worker side that imports the AMQP client (kombu /
py-amqp): connecting to the first node that answers, declaring and deleting the
deployment's topology, and the small channel calls (acknowledge, close,
a round trip, a queue's depth) the other modules use. The thread that runs them all is
:mod:`.amqp_thread`.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Sequence
from typing import Any

from amqp import Message  # type: ignore[import-untyped]
from amqp.abstract_channel import (  # type: ignore[import-untyped]
    IGNORED_METHOD_DURING_CHANNEL_CLOSE,
)
from amqp.exceptions import (  # type: ignore[import-untyped]
    ConnectionError as AmqpConnectionError,
)
from amqp.exceptions import NotFound, PreconditionFailed, RecoverableConnectionError
from kombu.connection import Connection as _KombuConnection

from ....routing.contract.amqp_names import (
    Topology,
    as_declared_before,
    members_exchange,
    topology,
)
from ....routing.contract.errors import BrokerUnavailable
from ....routing.contract.message import RECORD_HEADER
from ....routing.contract.settings import Settings
from .consumers import ShardConsumer

log = logging.getLogger("keylane.rabbitmq")

#: kombu's connection is untyped: used as ``Any``.
Connection: Any = _KombuConnection


def delete_topology(settings: Settings) -> None:
    """Delete the deployment's queues and exchanges (benchmarks and tools clean up)."""
    conn, _ = connect(settings.amqp_urls(), settings.amqp_heartbeat_s)
    try:
        channel = conn.channel()
        wanted = topology(settings)
        for name, _arguments in wanted.queues:
            channel.queue_delete(name)
        for exchange, _kind in wanted.exchanges:
            channel.exchange_delete(exchange)
        channel.exchange_delete(members_exchange(settings.namespace))
    finally:
        conn.release()


def connect(urls: Sequence[str], heartbeat_s: int, start: int = 0) -> tuple[Any, int]:
    """A connection to the first node of ``urls`` (from index ``start``) that answers;
    :class:`BrokerUnavailable` when none does."""
    errors = []
    for step in range(len(urls)):
        index = (start + step) % len(urls)
        conn = Connection(urls[index], heartbeat=heartbeat_s, connect_timeout=5)
        try:
            conn.connect()
            return conn, index
        except Exception as exc:
            errors.append(f"{host(urls[index])}: {exc}")
            with contextlib.suppress(Exception):
                conn.release()
    raise BrokerUnavailable(f"RabbitMQ: no node answers ({'; '.join(errors)})")


def declare(conn: Any, wanted: Topology) -> Any:
    """Declare ``wanted`` on a channel of ``conn`` and return that channel. A queue
    created before keylane asked for balanced leaders refuses the leader locator (and
    the channel with it): it is declared again, on a new channel, as it was created."""
    channel = conn.channel()
    for exchange, kind in wanted.exchanges:
        channel.exchange_declare(exchange, kind, durable=True, auto_delete=False)
    for name, arguments in wanted.queues:
        try:
            channel.queue_declare(name, durable=True, auto_delete=False, arguments=arguments)
        except PreconditionFailed:
            before = as_declared_before(arguments)
            if before == arguments:
                raise
            channel = conn.channel()
            channel.queue_declare(name, durable=True, auto_delete=False, arguments=before)
    for name, exchange in wanted.bindings:
        channel.queue_bind(name, exchange, name)
    return channel


def host(url: str) -> str:
    """The host:port part of an AMQP URL (for logs: never the credentials)."""
    return url.rpartition("@")[2].partition("/")[0]


def message_body(message: Any) -> bytes:
    """A delivered message's body as bytes."""
    body = message.body
    return body.encode() if isinstance(body, str) else bytes(body)


def queue_depth(conn: Any, name: str) -> tuple[int, int] | None:
    """A queue's ready messages and consumers, by a passive declare on a channel of its
    own (None: no such queue; the broker then closes that channel)."""
    channel = conn.channel()
    try:
        _, messages, consumers = channel.queue_declare(name, passive=True)
    except NotFound:
        return None
    close_channel(channel)
    return int(messages), int(consumers)


def publish(channel: Any, body: str, exchange: str) -> None:
    """Publish ``body`` to ``exchange`` on ``channel`` (no confirm: membership beats)."""
    channel.basic_publish(Message(body), exchange=exchange)


def publish_confirmed(
    conn: Any, messages: Sequence[tuple[str, str, bytes]], confirm_timeout_s: float
) -> None:
    """Publish each (queue, record key, message), in order, on a channel of its own, each
    waiting for its confirm (a nack or no confirm in time raises)."""
    channel = conn.channel()
    try:
        for queue_name, record_key, raw in messages:
            message = Message(
                raw,
                delivery_mode=2,
                content_type="application/json",
                application_headers={RECORD_HEADER: record_key},
            )
            channel.basic_publish_confirm(
                message,
                exchange="",
                routing_key=queue_name,
                mandatory=True,
                confirm_timeout=confirm_timeout_s,
            )
    finally:
        close_channel(channel)


def ack(channel: Any, tags: Sequence[int]) -> None:
    """Acknowledge the deliveries ``tags`` on ``channel``, one message at a time."""
    # A channel closed since (a handoff, a lost connection) gave its deliveries back: an
    # ack there is void, and raising would take the new connection down.
    if not channel.is_open:
        return
    for tag in tags:
        channel.basic_ack(tag)


def ack_upto(channel: Any, tag: int) -> None:
    """Acknowledge every outstanding delivery on ``channel`` up to ``tag`` (``multiple``):
    one frame for a run (:mod:`.acks` says when that is safe)."""
    if channel.is_open:
        channel.basic_ack(tag, multiple=True)


#: ``basic.deliver``: (class, method) as py-amqp names it.
BASIC_DELIVER = (60, 60)


class DeliveriesToAClosingChannel(logging.Filter):
    """Drops py-amqp's warning about each delivery that reaches a channel being closed: a
    shard let go while its queue still sends (a handover, a lost lease) meets some every
    time, and the broker gives them back to the queue by design. Any other method
    ignored on a closing channel is still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (
            record.msg == IGNORED_METHOD_DURING_CHANNEL_CLOSE
            and isinstance(args, tuple)
            and args[:1] == (BASIC_DELIVER,)
        )


_CLOSING_FILTER = DeliveriesToAClosingChannel()


def quiet_closing_channels() -> None:
    """Install :class:`DeliveriesToAClosingChannel` on py-amqp's logger (once)."""
    amqp_log = logging.getLogger("amqp")
    if _CLOSING_FILTER not in amqp_log.filters:
        amqp_log.addFilter(_CLOSING_FILTER)


def close_channel(channel: Any) -> None:
    """Close ``channel``: what it held goes back to its queue, in order."""
    with contextlib.suppress(Exception):
        channel.close()


def round_trip(consumer: ShardConsumer, prefetch: int) -> None:
    """One round trip on the shard's channel: :class:`BrokerUnavailable` if it is gone."""
    if not consumer.alive or not consumer.channel.is_open:
        raise BrokerUnavailable("RabbitMQ: the shard's channel is gone")
    consumer.channel.basic_qos(0, prefetch, False)  # answered by qos-ok: a round trip


def only_consumer(consumer: ShardConsumer, queue: str) -> bool:
    """Whether the shard's consumer is its queue's only one (a passive declare answers
    the count): then it is the single active consumer, delivery or not."""
    if not consumer.alive or not consumer.channel.is_open:
        return False
    return int(consumer.channel.queue_declare(queue, passive=True).consumer_count) == 1


def is_connection_error(exc: BaseException) -> bool:
    """Whether ``exc`` means the connection is lost (the AMQP thread reconnects)."""
    return isinstance(
        exc, (AmqpConnectionError, RecoverableConnectionError, OSError, socket.timeout)
    )
