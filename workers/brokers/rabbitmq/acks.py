"""Acknowledgements on their way to the AMQP thread, gathered per shard channel.

Lanes finish in their own threads, each record on its own; the acknowledgement of what
they finished is only ever *queued* here (it never waits for the broker), and the AMQP
thread sends what gathered since its last round: one wake of that thread for all of
them, and for each channel a **contiguous run** of delivery tags as one ``basic.ack``
with ``multiple`` (it acknowledges every outstanding delivery up to its tag), the tags
past a gap one by one.

Why ``multiple`` is safe here: a channel numbers its deliveries 1, 2, 3, ... and every
delivery is acknowledged once, by this module, or never (its channel closes and the
broker gives it back). So the run sent with ``multiple`` covers only tags that are asked
for now or were acknowledged one by one before (:class:`~.consumers.Settled` keeps both), and none
that a lane still holds. An acknowledgement still goes only after the lane's outcome is
durable: it is queued by the broker's ``finish`` (or after a park or a hold is written),
never earlier. A channel closed meanwhile (a handoff, a lost connection) gave its
deliveries back: its acknowledgements are dropped, as before.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from .consumers import ShardConsumer
from .link import ack, ack_upto, is_connection_error

log = logging.getLogger("keylane.rabbitmq")


class PendingAcks:
    """The acknowledgements queued for the AMQP thread (see the module docstring).
    ``submit`` queues a call for that thread."""

    def __init__(self, submit: Callable[[Callable[[], Any]], Any]) -> None:
        self._submit = submit
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[ShardConsumer, list[int]]] = {}
        self._queued = False

    def add(self, consumer: ShardConsumer, tags: Sequence[int]) -> None:
        """Queue the acknowledgement of ``tags`` on ``consumer``'s channel (any thread)."""
        if not tags:
            return
        with self._lock:
            _, queued = self._pending.setdefault(id(consumer), (consumer, []))
            queued.extend(tags)
            if self._queued:
                return
            self._queued = True
        self._submit(self._send)

    def _send(self) -> None:
        """(AMQP thread.) Send what gathered, channel by channel."""
        with self._lock:
            pending, self._pending = self._pending, {}
            self._queued = False
        for consumer, tags in pending.values():
            if not consumer.channel.is_open:
                continue  # gave its deliveries back: nothing to acknowledge
            upto, single = consumer.settled.plan(tags)
            try:
                if upto:
                    ack_upto(consumer.channel, upto)
                ack(consumer.channel, single)
            except Exception as exc:
                if is_connection_error(exc):
                    raise  # every channel is gone: the AMQP thread reconnects
                # This channel is closed by the error: its deliveries go back.
                log.warning("shard %s: acknowledgements failed: %s", consumer.shard, exc)
