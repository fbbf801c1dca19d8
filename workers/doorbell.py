"""The doorbell: which shards have something due, so idle lanes wake up and look there
first instead of polling every shard.

The receiver's accept script publishes the shard number on ``<ns>:doorbell``. A listener
thread collects the numbers of shards this worker owns and wakes one waiting lane per
ring. A record that waits (a back-off, a debounce, a destination's limit) is due at a known
time: a timer rings its shard then (:meth:`Doorbell.ring_in`), so the wait ends on time
whatever the shard count. A ring published while the subscription was down is missed:
each time it subscribes (again) it rings every shard this worker owns. The lanes also poke
one idle lane every ``idle_poll_ms`` (2 s by default) to look at every shard, a window at
a time, for what nothing rings (a task sent with Celery's own ``send_task``): hundreds of
idle lanes cost one look per interval, not hundreds.

Rings come from any thread (the listener, the heartbeat's acquisitions) and from the lanes'
own event loop; waiting happens on that loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable

from .broker import RecordQueue

log = logging.getLogger("keylane.doorbell")


class Doorbell:
    """Shard hints for the lanes of one worker process."""

    def __init__(
        self,
        broker: RecordQueue,
        is_mine: Callable[[int], bool],
        mine: Callable[[], Iterable[int]] = tuple,
    ) -> None:
        self._broker = broker
        self._is_mine = is_mine
        self._mine = mine
        self._lock = threading.Lock()
        self._rung: dict[int, None] = {}  # insertion-ordered set
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: deque[asyncio.Future[bool]] = deque()  # touched on the loop only
        self._timers: dict[int, asyncio.TimerHandle] = {}  # on the loop only
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, name="keylane-doorbell", daemon=True)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start listening; lanes wait on ``loop``."""
        self._loop = loop
        self._thread.start()

    def stop(self) -> None:
        """Stop listening, drop the timers and wake every waiter."""
        self._stop.set()
        self._on_loop(self._wake_all)

    def _cancel_timers(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def ring(self, shard: int) -> None:
        """Note that ``shard`` has (or may have) a message, and wake a lane. Any thread."""
        with self._lock:
            if shard in self._rung:
                return
            self._rung[shard] = None
        self._on_loop(self._wake_one)

    def ring_in(self, shard: int, seconds: float) -> None:
        """Ring ``shard`` in ``seconds`` (a waiting record of it is due then). On the loop.
        A shard keeps its earliest timer: when it rings, the take there answers when the
        next waiting record is due, and a new timer is set for that one."""
        loop = asyncio.get_running_loop()
        when = loop.time() + max(0.0, seconds)
        timer = self._timers.get(shard)
        if timer is not None:
            if timer.when() <= when:
                return
            timer.cancel()
        self._timers[shard] = loop.call_at(when, self._fire, shard)

    def _fire(self, shard: int) -> None:
        self._timers.pop(shard, None)
        self.ring(shard)

    def hints(self, limit: int | None = None) -> list[int]:
        """The shards rung and not handed out yet, oldest first, at most ``limit`` (and
        forget those). The others stay rung for the next take (a worker that starts on a
        backlog has every shard rung at once, more than one take looks at): a lane that
        would wait finds them and takes again."""
        with self._lock:
            rung = list(self._rung)
            given = rung if limit is None else rung[:limit]
            self._rung = dict.fromkeys(rung[len(given) :])
        return given

    async def wait(self) -> bool:
        """Sleep until a ring or a :meth:`poke`: True when it was a poke (the lane looks
        at every shard, a window at a time), False for a ring (it looks where it rang)."""
        with self._lock:
            if self._rung or self._stop.is_set():
                return False
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        finally:
            if not waiter.done():  # cancelled
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)

    def poke(self) -> None:
        """Wake one waiting lane to look at every shard, a window at a time (rings can
        be missed, and a shard's back-off ends without one). On the loop."""
        self._wake_one(poked=True)

    def _wake_one(self, poked: bool = False) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(poked)
                return

    def _wake_all(self) -> None:
        self._cancel_timers()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(False)

    def _on_loop(self, fn: Callable[[], None]) -> None:
        loop = self._loop
        if loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            fn()
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
            loop.call_soon_threadsafe(fn)

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                pubsub = self._broker.doorbell()
                for shard in self._mine():  # what rang while it was not subscribed
                    self.ring(shard)
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=1.0)
                    if message is not None:
                        self._on_message(message.get("data"))
                pubsub.close()
            except Exception as exc:  # any connection error: lanes still look on timeouts
                log.debug("doorbell reconnecting: %s", exc)
                self._stop.wait(1.0)

    def _on_message(self, data: object) -> None:
        if not isinstance(data, bytes | str | int):
            return
        try:
            shard = int(data)
        except ValueError:
            return
        if self._is_mine(shard):
            self.ring(shard)
