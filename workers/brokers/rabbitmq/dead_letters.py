"""The messages the broker dead-lettered past its own delivery limit (``x-delivery-limit``):
consumed from the deployment's ``<ns>.dead`` queue, each recorded in the store as a
``poison`` dead letter (``on_dead``, in a thread of its own: a store write), then
acknowledged. Never dropped: one that could not be recorded stays unacknowledged, and
the broker delivers it again later."""

from __future__ import annotations

import functools
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from ....routing.contract.amqp_names import dead_queue
from ....routing.contract.settings import Settings
from . import tries
from .consumers import message_headers, record_key_of
from .link import message_body

log = logging.getLogger("keylane.rabbitmq")

#: One delivery to record: (the connection's generation, delivery tag, body, headers).
DeadWork = tuple[int, int, bytes, dict[str, Any]]


class DeadLetterConsumer:
    """The consumer of ``<ns>.dead`` of :class:`~.broker.RabbitLaneBroker`. It is handed
    what it needs: ``submit`` runs a call in the AMQP thread, ``stored`` runs one on the
    broker's store connection, ``generation`` tells the connection's generation now (an
    acknowledgement for an earlier connection's delivery is void: the broker gave it back
    when that connection ended)."""

    def __init__(
        self,
        settings: Settings,
        on_dead: Callable[[bytes, dict[str, Any]], None],
        submit: Callable[[Callable[[], Any]], Any],
        stored: tries.Stored[None],
        generation: Callable[[], int],
    ) -> None:
        self.settings = settings
        self._on_dead = on_dead
        self._submit = submit
        self._stored = stored
        self._generation = generation
        self._channel: Any = None
        self._work: queue.SimpleQueue[DeadWork | None] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._record_all, name="keylane-amqp-dead", daemon=True
        )
        self._thread.start()

    def consume(self, conn: Any) -> None:
        """(AMQP thread, on connect.) Consume ``<ns>.dead`` on a channel of ``conn``."""
        channel = self._channel = conn.channel()
        channel.basic_qos(0, 16, False)
        generation = self._generation()

        def delivered(message: Any) -> None:
            tag, headers = int(message.delivery_tag), message.headers or {}
            self._work.put((generation, tag, message_body(message), headers))

        channel.basic_consume(dead_queue(self.settings.namespace), callback=delivered)

    def forget(self) -> None:
        """(AMQP thread.) The connection is gone, and the channel with it."""
        self._channel = None

    def _record_all(self) -> None:
        """(Its own thread: a store write.) Each message the broker dead-lettered becomes
        a ``poison`` dead letter, then is acknowledged."""
        while (work := self._work.get()) is not None:
            generation, tag, raw, headers = work
            try:
                self._on_dead(raw, headers)
            except Exception:
                log.exception("a message past the delivery limit could not be recorded")
                continue  # not acknowledged: the broker delivers it again later
            record_key = record_key_of(headers, message_headers(raw))
            shard = self.settings.shards.shard_for_key(record_key)
            tries.forget_dead(self._stored, shard, raw)
            self._submit(functools.partial(self._ack, tag, generation))

    def _ack(self, tag: int, generation: int) -> None:
        if self._channel is not None and generation == self._generation():
            self._channel.basic_ack(tag)

    def close(self, timeout_s: float) -> None:
        """Stop recording (what is queued is recorded first), waiting at most
        ``timeout_s``."""
        self._work.put(None)
        self._thread.join(timeout_s)
