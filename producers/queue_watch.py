"""What the receiver knows about the queues: depths, drain rates, oldest messages, and the
Prometheus metrics built from them and from the lanes' counters.

A :class:`QueueWatch` reads every shard's depth and head message once every ten seconds
(two commands a shard, one pipelined round trip), and the drain counts and the sources'
backlog once a second while deliveries come (two commands: at a trickle, reading every
shard each second cost 2.6 Redis commands an event at 50 events/s, 13 at 10/s). It gives
the receiver a global depth (the backlog, between full polls) and a drain rate per shard
for ``Retry-After``: the time the shard needs to drain to half its high-water mark at the
rate it drained lately, or the ceiling when it drained nothing lately (a sender told "1 s"
would hammer a shard that does not move). A ``/metrics`` scrape reads the queues afresh
when the last full poll is older than a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass, field

from ..routing.contract.errors import BrokerUnavailable
from ..routing.contract.message import event_of
from .gateway import ReceiverGateway

log = logging.getLogger("keylane.queue_watch")

MIN_RETRY_AFTER_S = 1
MAX_RETRY_AFTER_S = 120
#: Weight of the newest sample in the drain-rate average (per poll, ~1 s).
RATE_SMOOTHING = 0.3
#: A shard that acknowledged nothing for this long is not draining.
DRAINING_WITHIN_S = 5.0


@dataclass
class ShardView:
    """One shard as last seen."""

    depth: int = 0
    oldest_accepted_at: float | None = None
    drained: int = 0
    rate_per_s: float = 0.0
    drained_at: float | None = None  # when a poll last saw the drain count rise

    def draining(self, now: float) -> bool:
        """Whether the shard acknowledged anything lately."""
        return self.drained_at is not None and now - self.drained_at <= DRAINING_WITHIN_S


@dataclass
class QueueWatch:
    """Polls the shard queues (see the module docstring)."""

    gateway: ReceiverGateway
    interval_s: float = 1.0
    #: How often it polls while no delivery comes.
    idle_interval_s: float = 10.0
    views: dict[int, ShardView] = field(default_factory=dict)
    #: When every shard was last read (:meth:`poll`), and the drain counts (either poll).
    polled_at: float = 0.0
    drains_at: float = 0.0
    #: Events waiting in all shard queues, as last seen (summed once per poll: every
    #: delivery reads it).
    total_depth: int = 0
    #: The last full poll's depth less the backlog then (see :meth:`poll`).
    _backlog_offset: int = 0
    #: Whether a delivery asked for the depths since the last poll (:meth:`asked`).
    wanted: bool = False
    _stopped: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def total_rate(self) -> float:
        """Events per second drained over all shards, lately."""
        return sum(v.rate_per_s for v in self.views.values())

    def retry_after(self, shard: int, depth: int, high_water: int) -> int:
        """Seconds for ``shard``, ``depth`` deep (as the accept script just saw it), to
        drain to half its high-water mark at its recent rate; the ceiling when it did not
        drain lately."""
        view = self.views.get(shard, ShardView())
        if not view.draining(time.monotonic()):
            return MAX_RETRY_AFTER_S
        return _seconds_to_drain(max(depth, view.depth) - high_water // 2, view.rate_per_s)

    def retry_after_global(self, high_water: int) -> int:
        """Seconds for all shards together to drain to half the global high-water mark;
        the ceiling when none drained lately."""
        now = time.monotonic()
        if not any(view.draining(now) for view in self.views.values()):
            return MAX_RETRY_AFTER_S
        return _seconds_to_drain(self.total_depth - high_water // 2, self.total_rate)

    async def run(self) -> None:
        """Read the drains every ``interval_s`` while deliveries come, every shard every
        ``idle_interval_s``, until :meth:`stop`."""
        while not self._stopped.is_set():
            self.wanted = False
            try:
                if time.monotonic() - self.polled_at >= self.idle_interval_s:
                    await self.poll()
                else:
                    await self.poll_drains()
            except BrokerUnavailable as exc:
                log.debug("queue poll failed: %s", exc)
            idle_until = time.monotonic() + self.idle_interval_s
            while not self._stopped.is_set() and time.monotonic() < idle_until:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.interval_s):
                        await self._stopped.wait()
                if self.wanted:
                    break

    async def fresh(self) -> None:
        """Poll now unless the last poll is younger than ``interval_s`` (a scrape)."""
        if time.monotonic() - self.polled_at >= self.interval_s:
            await self.poll()

    def stop(self) -> None:
        """End :meth:`run` once the poll under way, if any, returns. (Not a cancel: one
        that lands inside a Redis call can come out of it as a Redis error, a failed poll
        like any other, and the loop polled on: a receiver hung on SIGTERM, 6 times in
        25 stops.)"""
        self._stopped.set()

    async def poll(self) -> None:
        """Read every shard once."""
        snapshot = await self.gateway.reads.queues()
        now = time.monotonic()
        for shard, depth in enumerate(snapshot.depths):
            view = self.views.setdefault(shard, ShardView(drained=snapshot.drained.get(shard, 0)))
            view.depth = depth
            view.oldest_accepted_at = _accepted_at(snapshot.heads[shard])
        self._drained(snapshot.drained, now)
        self.total_depth = sum(snapshot.depths)
        # What the backlog does not count of the depth (held records' events are counted
        # there, in-flight ones not in the depth): the light polls keep this difference,
        # so the global depth moves with the backlog between full polls, not jumps to it.
        self._backlog_offset = self.total_depth - snapshot.waiting
        self.polled_at = now

    async def poll_drains(self) -> None:
        """Read the drain counts and the backlog (the depths stay as last polled)."""
        drained, waiting = await self.gateway.reads.drains()
        self._drained(drained, time.monotonic())
        self.total_depth = max(0, waiting + self._backlog_offset)

    def _drained(self, drained: dict[int, int], now: float) -> None:
        """Each shard's drain rate from its count, since the counts were last read."""
        elapsed = now - self.drains_at if self.drains_at else 0.0
        for shard, view in self.views.items():
            count = drained.get(shard, 0)
            if elapsed > 0:
                rate = max(0, count - view.drained) / elapsed
                view.rate_per_s += RATE_SMOOTHING * (rate - view.rate_per_s)
                if count > view.drained:
                    view.drained_at = now
            view.drained = count
        self.drains_at = now


def _seconds_to_drain(excess: int, rate_per_s: float) -> int:
    if rate_per_s <= 0.01:  # not draining at all (destination down): ask for a long wait
        return MAX_RETRY_AFTER_S
    if excess <= 0:
        return MIN_RETRY_AFTER_S
    return max(MIN_RETRY_AFTER_S, min(MAX_RETRY_AFTER_S, math.ceil(excess / rate_per_s)))


def _accepted_at(raw: bytes | None) -> float | None:
    event = event_of(raw)
    value = None if event is None else event.get("accepted_at")
    return float(value) if isinstance(value, int | float) else None
