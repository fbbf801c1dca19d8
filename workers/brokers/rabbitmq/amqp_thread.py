"""The connection thread of the RabbitMQ lane broker (``keylane-amqp``): py-amqp
connections are not thread-safe, so every call that needs the broker is queued to this
one thread (:mod:`.calls`), which connects, declares the topology, runs the calls, sends
the membership beat and reads frames, through :mod:`.link`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from ....routing.contract.amqp_names import topology
from ....routing.contract.errors import BrokerUnavailable
from ....routing.contract.settings import Settings
from .calls import Calls
from .consumers import ShardConsumer
from .link import (
    close_channel,
    connect,
    declare,
    host,
    is_connection_error,
    quiet_closing_channels,
)

log = logging.getLogger("keylane.rabbitmq")

#: How long the AMQP thread waits for a frame or a queued call before it checks the
#: heartbeat and the membership beat.
DRAIN_S = 0.05
#: How long a caller waits for the AMQP thread to run a call it needs the answer of.
CALL_TIMEOUT_S = 15.0
#: Pause between two connection attempts (each goes to the next node).
RECONNECT_S = 0.5


class AmqpLink(ABC):
    """The connection thread of :class:`RabbitLaneBroker`: connects (each attempt to the
    next node), declares the topology, runs the calls queued by other threads, sends the
    membership beat, reads frames; forgets every shard consumer when the connection ends."""

    settings: Settings
    urls: list[str]
    worker_id: str
    _lock: threading.RLock
    _shards: dict[int, ShardConsumer]
    _calls: Calls
    _connection: Any
    _node: int
    _generation: int
    _control: Any
    _stop: threading.Event
    _on_dead: Callable[[bytes, dict[str, Any]], None] | None

    @abstractmethod
    def _join_members(self) -> None:
        """(AMQP thread, on connect.) Start receiving the members' beats."""

    @abstractmethod
    def _beat(self, what: str) -> None:
        """(AMQP thread.) Tell the members this worker is ``alive`` or has ``left``."""

    @abstractmethod
    def _consume_dead(self, conn: Any) -> None:
        """(AMQP thread, on connect.) Consume the messages the broker dead-lettered."""

    def _run(self) -> None:
        quiet_closing_channels()
        while not self._stop.is_set():
            try:
                self._serve()
            except Exception as exc:
                if self._stop.is_set():
                    break
                log.warning("RabbitMQ connection lost: %s", exc)
            self._drop_connection()
            self._stop.wait(RECONNECT_S)
        self._drop_connection()

    def _serve(self) -> None:
        conn, self._node = connect(self.urls, self.settings.amqp_heartbeat_s, self._node + 1)
        with self._lock:
            self._connection = conn
            self._generation += 1
        self._control = declare(conn, topology(self.settings))
        self._join_members()
        if self._on_dead is not None:
            self._consume_dead(conn)
        log.info("connected to RabbitMQ at %s", host(self.urls[self._node]))
        beat_every = self.settings.heartbeat_ms / 1000
        next_beat = 0.0
        amqp_conn = conn.connection  # py-amqp's, whose socket the wait watches
        while not self._stop.is_set():
            self._run_calls()
            now = time.monotonic()
            if self.worker_id and now >= next_beat:
                self._beat("alive")
                next_beat = now + beat_every
            if self._calls.wait(amqp_conn.sock, DRAIN_S):
                with contextlib.suppress(TimeoutError):
                    conn.drain_events(timeout=DRAIN_S)
            conn.heartbeat_check()
        # Stopping: close properly, so the acknowledgements just sent are read before the
        # broker sees the connection end (what is still unacknowledged goes back in order).
        with contextlib.suppress(Exception):
            conn.release()

    def _run_calls(self) -> None:
        while True:
            try:
                fn, done = self._calls.get_nowait()
            except queue.Empty:
                return
            try:
                result = fn()
            except Exception as exc:
                if done is not None:
                    done.set_exception(exc)
                if is_connection_error(exc):
                    raise
                log.warning("AMQP call failed: %s", exc)
                continue
            if done is not None:
                done.set_result(result)

    def _drop_connection(self) -> None:
        """The connection is gone: the broker gives back everything it delivered on it,
        so every shard consumer and what it held is forgotten."""
        with self._lock:
            conn, self._connection = self._connection, None
            for consumer in self._shards.values():
                consumer.alive = False
            self._shards.clear()
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.collect()
        self._control = None

    def _let_go(self, consumers: Sequence[ShardConsumer], why: str) -> None:
        """Stop being these shards' consumers: forget them and close their channels (after
        the acknowledgements queued before), so what they held goes back to the head of
        each queue in order and the next consumer in line becomes the active one. A
        consumer already replaced or let go is left alone."""
        gone = []
        with self._lock:
            for consumer in consumers:
                if self._shards.get(consumer.shard) is consumer:
                    del self._shards[consumer.shard]
                if consumer.alive:
                    consumer.alive = False
                    gone.append(consumer)
        for consumer in gone:
            self._submit(functools.partial(close_channel, consumer.channel))
            log.log(
                logging.DEBUG if why == "released" else logging.INFO,
                "let go of shard %s (token %s): %s",
                consumer.shard,
                consumer.epoch,
                why,
            )

    def _submit(self, fn: Callable[[], Any], wait: bool = False) -> Any:
        """Run ``fn`` in the AMQP thread; with ``wait``, return its result."""
        if not wait:
            self._calls.put((fn, None))
            return None
        done: Future[Any] = Future()
        self._calls.put((fn, done))
        try:
            return done.result(CALL_TIMEOUT_S)
        except Exception as exc:
            raise BrokerUnavailable(f"RabbitMQ: {exc}") from exc
