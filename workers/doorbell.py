"""The doorbell: which shards just got a message, so idle lanes wake up and look there
first instead of polling every shard.

The receiver's accept script publishes the shard number on ``<ns>:doorbell``. A listener
thread collects the numbers of shards this worker owns and wakes one lane per ring. A
ring can be missed (the subscription reconnects, a takeover restores a message): lanes
also look at every shard, a window at a time, when they wake up on their timeout.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from keylane.workers.gateway import LaneGateway

log = logging.getLogger("keylane.doorbell")


class Doorbell:
    """Shard hints for the lanes of one worker process."""

    def __init__(self, gateway: LaneGateway, is_mine: Callable[[int], bool]) -> None:
        self._gateway = gateway
        self._is_mine = is_mine
        self._cond = threading.Condition()
        self._rung: dict[int, None] = {}  # insertion-ordered set
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, name="keylane-doorbell", daemon=True)

    def start(self) -> None:
        """Start listening."""
        self._thread.start()

    def stop(self) -> None:
        """Stop listening and wake every waiter."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()

    def ring(self, shard: int) -> None:
        """Note that ``shard`` has (or may have) a message, and wake a lane."""
        with self._cond:
            if shard not in self._rung:
                self._rung[shard] = None
                self._cond.notify()

    def hints(self) -> list[int]:
        """The shards rung since the last call, oldest first (and forget them)."""
        with self._cond:
            rung, self._rung = list(self._rung), {}
            return rung

    def wait(self, timeout_s: float) -> None:
        """Sleep until a ring (or the timeout)."""
        with self._cond:
            if not self._rung and not self._stop.is_set():
                self._cond.wait(timeout_s)

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                pubsub = self._gateway.doorbell()
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=1.0)
                    if message is not None:
                        self._on_message(message.get("data"))
                pubsub.close()
            except Exception as exc:  # any connection error: lanes still look on timeouts
                log.debug("doorbell reconnecting: %s", exc)
                self._stop.wait(1.0)

    def _on_message(self, data: object) -> None:
        try:
            shard = int(data)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            return
        if self._is_mine(shard):
            self.ring(shard)
