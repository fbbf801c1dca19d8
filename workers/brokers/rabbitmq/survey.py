"""What an operator sees of the lanes on RabbitMQ, read without taking anything: each shard
queue's ready messages and consumers (a passive declare), the dead-letter queue's, and the
members' beats heard over a couple of heartbeats (each names the shards its worker leads,
with their fencing tokens). ``keylane status`` and ``check`` read a deployment through it.
"""

from __future__ import annotations

import contextlib
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any

from ....routing.contract.amqp_names import dead_queue, members_exchange, shard_queue
from ....routing.contract.settings import Settings
from .link import connect, message_body, queue_depth
from .membership import Beat, read_beat


@dataclass(frozen=True)
class QueueDepth:
    """A queue's ready messages (not yet delivered) and its consumers; None for both when
    the queue does not exist (nothing declared it yet)."""

    name: str
    messages: int | None
    consumers: int | None


@dataclass(frozen=True)
class Survey:
    """One look at a RabbitMQ deployment."""

    #: Every shard queue, by shard.
    queues: list[QueueDepth]
    dead: QueueDepth
    #: The live workers: each one's last beat, and when it was heard (epoch seconds).
    beats: dict[str, tuple[Beat, float]]


def survey(settings: Settings, listen_s: float | None = None) -> Survey:
    """Read every shard queue's depth while listening to the members' beats for
    ``listen_s`` (default: two heartbeats, so each live worker is heard at least once)."""
    listen = 2 * settings.heartbeat_ms / 1000 if listen_s is None else listen_s
    ns = settings.namespace
    conn, _ = connect(settings.amqp_urls(), settings.amqp_heartbeat_s)
    try:
        deadline = time.monotonic() + listen
        beats = _listen(conn, members_exchange(ns))
        names = [shard_queue(ns, settings.shards, s) for s in range(settings.shard_count)]
        queues = [_depth(conn, name) for name in names]
        dead = _depth(conn, dead_queue(ns))
        while (left := deadline - time.monotonic()) > 0:
            with contextlib.suppress(TimeoutError, socket.timeout):
                conn.drain_events(timeout=left)
        return Survey(queues, dead, dict(beats))
    finally:
        with contextlib.suppress(Exception):
            conn.release()


def _listen(conn: Any, exchange: str) -> dict[str, tuple[Beat, float]]:
    """An inbox of this connection's own on the members' exchange; the beats it gets
    land in the returned map (as :meth:`conn.drain_events` reads them)."""
    heard: dict[str, tuple[Beat, float]] = {}
    channel = conn.channel()
    channel.exchange_declare(exchange, "fanout", durable=False, auto_delete=False)
    inbox = f"{exchange}:survey:{uuid.uuid4().hex[:12]}"
    channel.queue_declare(inbox, exclusive=True, auto_delete=True)
    channel.queue_bind(inbox, exchange, "")

    def delivered(message: Any) -> None:
        beat = read_beat(message_body(message))
        if beat is None:
            return
        if beat.what == "left":
            heard.pop(beat.worker, None)
        else:
            heard[beat.worker] = (beat, time.time())

    channel.basic_consume(inbox, no_ack=True, callback=delivered)
    return heard


def _depth(conn: Any, name: str) -> QueueDepth:
    found = queue_depth(conn, name)
    return QueueDepth(name, *found) if found is not None else QueueDepth(name, None, None)


__all__ = ["QueueDepth", "Survey", "survey"]
