"""What follows the acknowledgements on RabbitMQ: each outcome counted and each told one
kept and published, through the Redis helper (``after_ack``), for all the worker's lanes
at once. A lane's finish only queues its acks here; a thread of its own sends what
gathered while its last call ran in one call (at most :data:`MOST` acks a call). Best
effort, as before: a call that fails (the helper down) leaves the counters short, a
waiting sender with a 202 and the outcome in the journal alone; it is logged and the
thread goes on. What is queued when the worker stops is sent before it exits."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence

from ...broker import Ack

log = logging.getLogger("keylane.rabbitmq")

#: The most acks one call carries (the script's arguments stay small).
MOST = 256


class AfterAcks:
    """The counting and telling of :class:`~.broker.RabbitLaneBroker`'s acknowledged
    outcomes, gathered across lanes (see the module docstring)."""

    def __init__(self, after_ack: Callable[[Sequence[Ack]], None]) -> None:
        self._after_ack = after_ack
        self._queue: queue.SimpleQueue[Sequence[Ack] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="keylane-after-ack", daemon=True)
        self._thread.start()

    def add(self, acks: Sequence[Ack]) -> None:
        """Queue ``acks`` (already acknowledged, or queued for the AMQP thread)."""
        self._queue.put(acks)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is None:
                return
            gathered = list(first)
            while len(gathered) < MOST:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stopping = True
                    break
                gathered.extend(more)
            self._send(gathered)

    def _send(self, acks: list[Ack]) -> None:
        try:
            self._after_ack(acks)
        except Exception as exc:
            log.warning("could not count or tell %d outcome(s): %s", len(acks), exc)

    def close(self, timeout_s: float) -> None:
        """Send what is queued, then stop (waiting at most ``timeout_s``)."""
        self._queue.put(None)
        self._thread.join(timeout_s)
