"""The calls other threads queue for a worker's AMQP thread (py-amqp connections are not
thread-safe, so the lanes and the ownership hand it what needs the broker), and the wait
that wakes that thread for a frame or a call, whichever comes first."""

from __future__ import annotations

import contextlib
import queue
import select
import socket
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

#: One queued call: the function, and the future its caller waits on (None: nobody waits).
Call = tuple[Callable[[], Any], Future[Any] | None]


class Calls:
    """The calls other threads queue for the AMQP thread, with a socket pair that wakes
    it when one is queued: it waits on the connection's socket and on this one together,
    so a call (an ack, a shard's round trip) runs at once, not after the next frame or
    the link's ``DRAIN_S``."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Call] = queue.SimpleQueue()
        self._wake_in, self._wake_out = socket.socketpair()
        self._wake_in.setblocking(False)
        self._wake_out.setblocking(False)
        # poll, not select: a worker with many sockets open (destinations' connections)
        # may hand the connection a descriptor past select's 1024
        self._poll = select.poll()
        self._poll.register(self._wake_in, select.POLLIN)
        self._watched: int | None = None

    def put(self, call: Call) -> None:
        self._queue.put(call)
        with contextlib.suppress(OSError):  # full: a wake is pending anyway; closed
            self._wake_out.send(b"\0")

    def get_nowait(self) -> Call:
        return self._queue.get_nowait()

    def wait(self, sock: Any, timeout_s: float) -> bool:
        """Wait until ``sock`` has bytes to read or a call is queued, at most
        ``timeout_s``; whether ``sock`` has bytes (TLS: some already decrypted count)."""
        pending = getattr(sock, "pending", None)
        if callable(pending) and pending() > 0:
            return True
        fd = sock.fileno()
        if fd != self._watched:  # a new connection
            if self._watched is not None:
                self._poll.unregister(self._watched)
            self._poll.register(fd, select.POLLIN)
            self._watched = fd
        ready = dict(self._poll.poll(timeout_s * 1000))
        if self._wake_in.fileno() in ready:
            with contextlib.suppress(OSError):
                while self._wake_in.recv(4096):
                    pass
        return bool(ready.get(fd, 0))

    def close(self) -> None:
        self._wake_in.close()
        self._wake_out.close()
