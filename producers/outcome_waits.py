"""Requests waiting for their events' outcomes (``Prefer: wait``): one Redis subscription
per receiver process, a future per waiting request.

A waiting request holds no thread and no connection of its own: it registers a future
under its ``(source, event_id)`` and awaits it. One task reads the subscription
(:class:`~keylane.producers.gateway.OutcomeFeed`) and resolves the futures of each told
outcome it hears. The subscription is opened when the first request waits and closed once
none has waited for a while, so a receiver nobody asks to wait reads nothing more than
before.

No lost wake-up: a request registers, and waits until the subscription is live, before
its event is accepted (or, for a ``GET``, before it reads the outcome key): an outcome
told after that is heard, one told before it is read. No wrong answer: a request is only
ever resolved with a told outcome of its own event; when the subscription is lost (Redis
gone, a network cut) every waiting request is resolved with None (the receiver answers
202, "not known in time") and the next one subscribes again. A receiver restart ends its
requests as any restart does: their senders retry or ask later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

from ..routing.contract.outcomes import told_names
from .gateway import OutcomeFeed

log = logging.getLogger("keylane.receiver")

#: How long the subscription stays open after the last request stopped waiting (a
#: sender that waits once usually waits again soon).
LINGER_S = 30.0
#: How long a request waits for the subscription to be live; past it, it does not wait
#: for its outcome (answered as without ``Prefer: wait``).
SUBSCRIBE_TIMEOUT_S = 2.0
#: How often the reader looks at the clock when nothing is heard.
POLL_S = 1.0

Key = tuple[str, str]


class Waiter:
    """One waiting request: its outcome once told, or None (not in time, or the
    subscription was lost)."""

    __slots__ = ("future", "key", "live")

    def __init__(self, key: Key, future: asyncio.Future[bytes | None]) -> None:
        self.key = key
        self.future = future
        #: Whether the subscription was live when the request registered: if not, no
        #: outcome can be heard for it, and it does not wait.
        self.live = False

    async def outcome(self, timeout_s: float) -> bytes | None:
        """The told outcome of the request's event, within ``timeout_s``, else None."""
        if not self.live or timeout_s <= 0 or self.future.done():
            return self.future.result() if self.future.done() else None
        try:
            async with asyncio.timeout(timeout_s):  # no task of its own, as wait_for makes
                return await self.future
        except TimeoutError:
            return None


class OutcomeWaits:
    """Every request of this process that waits for an outcome (see the module docstring)."""

    def __init__(self, open_feed: Callable[[], OutcomeFeed], linger_s: float = LINGER_S) -> None:
        self._open_feed = open_feed
        self._linger_s = linger_s
        self._waiters: dict[Key, list[Waiter]] = {}
        self._live = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._idle_since = time.monotonic()
        self._closing = False

    @property
    def waiting(self) -> int:
        """How many requests wait now."""
        return sum(len(w) for w in self._waiters.values())

    @contextlib.asynccontextmanager
    async def waiting_for(self, source: str, event_id: str) -> AsyncIterator[Waiter]:
        """Register a request waiting for ``(source, event_id)``'s outcome, for the time of
        the block; the subscription is live on entry (or the waiter says it is not)."""
        key = (source, event_id)
        future: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        waiter = Waiter(key, future)
        self._waiters.setdefault(key, []).append(waiter)
        try:
            if self._reader is None:
                self._reader = asyncio.create_task(self._read())
            if not self._live.is_set():  # (live: the common case, nothing to wait for)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(SUBSCRIBE_TIMEOUT_S):
                        await self._live.wait()
            waiter.live = self._live.is_set() and not future.done()
            yield waiter
        finally:
            self._forget(waiter)

    def _forget(self, waiter: Waiter) -> None:
        waiters = self._waiters.get(waiter.key)
        if waiters is not None:
            with contextlib.suppress(ValueError):
                waiters.remove(waiter)
            if not waiters:
                del self._waiters[waiter.key]
        if not self._waiters:
            self._idle_since = time.monotonic()
        if not waiter.future.done():
            waiter.future.cancel()

    def _tell(self, body: bytes) -> None:
        names = told_names(body)
        if names is None:
            return
        for waiter in self._waiters.get(names, ()):
            if not waiter.future.done():
                waiter.future.set_result(body)

    def _lose_all(self) -> None:
        """The subscription is gone: outcomes may have been missed, so no one may go on
        waiting for one (each is answered 202)."""
        self._live.clear()
        for waiters in self._waiters.values():
            for waiter in waiters:
                if not waiter.future.done():
                    waiter.future.set_result(None)

    def _idle(self) -> bool:
        """Whether the reader should end: the receiver is stopping (a cancel of the reader
        can land in a Redis read and come out as a lost subscription, which would
        subscribe again), or no one has waited for ``linger_s``."""
        if self._closing:
            return True
        return not self._waiters and time.monotonic() - self._idle_since >= self._linger_s

    async def _read(self) -> None:
        """The one reader: subscribe, resolve futures, and after a loss subscribe again
        while anyone waits; end once no one has waited for ``linger_s``."""
        backoff_s = 0.1
        try:
            while not self._idle():
                feed = self._open_feed()
                try:
                    await feed.open()
                    self._live.set()
                    backoff_s = 0.1
                    while not self._idle():
                        body = await feed.next(POLL_S)
                        if body is not None:
                            self._tell(body)
                except Exception as exc:  # BrokerUnavailable, or anything else: a loss all the same
                    log.warning("outcome subscription lost (waits answer 202): %s", exc)
                    self._lose_all()
                    await asyncio.sleep(backoff_s)
                    backoff_s = min(2.0, backoff_s * 2)
                finally:
                    self._live.clear()
                    await feed.close()
        finally:
            self._reader = None
            if self._closing or not self._waiters:
                self._lose_all()
            else:  # a request came while the reader was leaving: it needs one
                self._reader = asyncio.create_task(self._read())

    async def close(self) -> None:
        """Stop the reader (the receiver is stopping): whoever still waits gets None."""
        self._closing = True
        reader = self._reader
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
