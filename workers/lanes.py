"""Lanes: the coroutines of a worker process that take records from the shards it owns and
apply their events.

A lane asks the broker (:mod:`keylane.workers.broker`) for the next due record of a shard
this worker owns, handles the record's next message (or a batch of its waiting messages),
and acknowledges it in the same step as it takes the next one. Many lanes work on one shard
at once, each on a different record: the record, not the shard, is the unit of order and
of waiting. ``lanes`` of them run on one event loop in one thread of the process: a lane
waiting for an ``async def`` task or an HTTP forward holds no thread, and a blocking call
(a store transaction, a broker script, a plain ``def`` handler or task) runs in the
``lane_threads`` threads of :mod:`keylane.workers.blocking`.

What a lane does with the record it was handed, and with one it cannot finish now, is
:mod:`keylane.workers.lane_record`. A wait ends on a timer (:meth:`Doorbell.ring_in`), not
when a scan finds it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

import sentry_sdk

from ..routing.contract.errors import BrokerUnavailable, StoreUnavailable
from ..routing.contract.faults import Faults
from ..routing.contract.settings import Settings
from ..routing.contract.sources import Sources
from .blocking import BlockingPool
from .broker import Idle, MessageNotes, RecordQueue, Taken
from .dispatch import Dispatcher
from .doorbell import Doorbell
from .lane_record import OUTAGE_WAIT_S, LaneEvents, RecordLane
from .lane_steps import Step
from .ownership import Ownership
from .stores.sql import SqlStore

log = logging.getLogger("keylane.lanes")


#: Shards offered to one take: bounds the take script's cost whatever a worker owns.
TAKE_WINDOW = 16
#: How often the lanes look for records in flight that none of them holds, and how long
#: such a record must have been in flight to be made due again: longer than a broker
#: reply can take (the socket time-out), so a record being handed out is never reclaimed.
RECLAIM_EVERY_S = 5.0
RECLAIM_AFTER_S = 30.0


class Lanes:
    """The lanes of one worker process: an event loop in its own thread. They take records
    from ``queue`` and keep notes of their messages in ``notes`` (one broker's two roles),
    and open the store connections of their blocking pool with ``store_factory``."""

    def __init__(
        self,
        settings: Settings,
        queue: RecordQueue,
        notes: MessageNotes,
        ownership: Ownership,
        sources: Sources,
        store_factory: Callable[[], SqlStore],
        faults: Faults,
        dispatcher: Dispatcher,
        events: LaneEvents | None = None,
    ) -> None:
        self.settings = settings
        self.dispatcher = dispatcher
        self.queue = queue
        self.ownership = ownership
        self.io = BlockingPool(settings.lane_threads, store_factory)
        #: The record each lane works on now, by lane (shard, record key).
        self._holding: dict[int, tuple[int, str]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.doorbell = Doorbell(queue, ownership.owns, lambda: list(ownership.owned()))
        #: What a lane does with the record it took.
        self.records = RecordLane(
            settings,
            queue,
            notes,
            ownership,
            sources,
            faults,
            dispatcher,
            self.io,
            self.doorbell,
            self._stop,
            events,
        )
        # A shard that was just acquired may hold records a previous owner had in flight.
        ownership.on_acquired = self.doorbell.ring

    def start(self) -> None:
        """Start the blocking pool, the doorbell and the lanes' loop."""
        self.io.start()
        loop = asyncio.new_event_loop()
        self.doorbell.start(loop)
        self._thread = threading.Thread(
            target=self._serve, args=(loop,), name="keylane-lanes", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Let each lane finish its record, then stop."""
        self._stop.set()
        self.doorbell.stop()
        deadline = time.monotonic() + timeout_s
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.io.stop(max(0.0, deadline - time.monotonic()))

    # -- the loop ------------------------------------------------------------------------

    def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._main())
        finally:
            loop.close()

    async def _main(self) -> None:
        count = self.settings.lanes
        lanes = [asyncio.create_task(self._lane(n), name=f"lane-{n}") for n in range(count)]
        poker = asyncio.create_task(self._poke())
        reclaimer = asyncio.create_task(self._reclaim())
        counter = asyncio.create_task(self._flush_counts())
        await asyncio.gather(*lanes, return_exceptions=True)
        poker.cancel()
        reclaimer.cancel()
        counter.cancel()
        await self.dispatcher.aclose()
        await self._flush_counts_once()  # the lanes are done: what they counted last

    async def _flush_counts(self) -> None:
        """Every ``counts_flush_ms``, the counts the lanes' acknowledgements kept go to
        the deployment's counters in one pipeline (:mod:`keylane.routing.contract.tallies`)."""
        while True:
            await asyncio.sleep(self.settings.counts_flush_ms / 1000)
            await self._flush_counts_once()

    async def _flush_counts_once(self) -> None:
        try:
            await self.io.call(self.queue.flush_counts)
        except Exception as exc:  # Redis away: kept for the next flush
            log.debug("counts not flushed: %s", exc)

    async def _poke(self) -> None:
        """Every ``idle_poll_ms``, one idle lane looks at every shard (see the doorbell)."""
        while True:
            await asyncio.sleep(self.settings.idle_poll_ms / 1000)
            self.doorbell.poke()

    async def _reclaim(self) -> None:
        """Every ``RECLAIM_EVERY_S``, records of this worker's shards that are in flight
        but held by none of its lanes (a lane that could not return one while Redis was
        away, a reply that handed one out and was lost) become due again."""
        while True:
            await asyncio.sleep(RECLAIM_EVERY_S)
            try:
                for shard, lease in self.ownership.owned().items():
                    held = {key for s, key in self._holding.values() if s == shard}
                    busy = await self.io.call(self.queue.in_flight, shard)
                    orphans = [key for key in busy if key not in held]
                    if orphans:
                        found = await self.io.call(
                            self.queue.reclaim, lease, orphans, RECLAIM_AFTER_S
                        )
                        if found > 0:
                            log.warning("shard %s: %s record(s) made due again", shard, found)
                            self.doorbell.ring(shard)
            except Exception as exc:  # Redis away: look again next time
                log.debug("reclaim: %s", exc)

    async def _lane(self, lane: int) -> None:
        # Each lane its own Sentry isolation scope (a task's own copy of the context):
        # breadcrumbs and tags of one lane's events never end up on another lane's error.
        with sentry_sdk.isolation_scope():
            poked = False
            while not self._stop.is_set():
                try:
                    if not await self._step(lane, poked):
                        poked = await self.doorbell.wait()
                except StoreUnavailable as exc:
                    log.warning("store unavailable: %s", exc)
                    await self._pause(OUTAGE_WAIT_S)
                except BrokerUnavailable as exc:
                    log.warning("Redis unavailable: %s", exc)
                    await self._pause(OUTAGE_WAIT_S)
                except Exception:
                    log.exception("lane error")
                    await self._pause(OUTAGE_WAIT_S)

    async def _pause(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._stop.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(min(0.1, seconds))

    async def _step(self, lane: int, poked: bool = False) -> bool:
        """Take and handle one record; False when nothing was due.

        The shards offered to the take are reserved for this lane first (their handoff
        waits for it), at most ``TAKE_WINDOW`` at a time: the rung ones only, or, after a
        poke and only then, the others in rotation. A shard that gets a message is rung
        and a waiting record's shard rings when it is due, so a lane that was not poked
        and finds nothing rung takes nothing: looking at a window of shards costs the take
        script five Redis commands a shard, which a lane looking for more work after every
        record spent on shards with nothing to do (150 commands an event at a trickle).
        Shards with records waiting get a timer for when the first is due.
        """
        hints = self.doorbell.hints(TAKE_WINDOW)
        if not hints and not poked:
            return False
        window = len(hints) or TAKE_WINDOW
        leases = self.ownership.reserve(lane, hints, window)
        if not leases:
            return False
        first: Step | Idle | None = None
        try:
            first = await self.io.store(self.records.take, leases)
        finally:
            for lease in leases:
                if not isinstance(first, Step) or lease.shard != first.taken.shard:
                    self.ownership.end(lane, lease.shard)
        if not isinstance(first, Step):
            for shard, due_in_s in first.due_in_s.items() if first is not None else ():
                self.doorbell.ring_in(shard, due_in_s)
            return False
        got = first.taken
        # The take serves the first shard of the window that has a record due: the rung
        # shards after it were not looked at, and are rung again for another lane rather
        # than forgotten.
        looked_at = [lease.shard for lease in leases].index(got.shard)
        for lease in leases[looked_at + 1 :]:
            if lease.shard in hints:
                self.doorbell.ring(lease.shard)
        lease = next(lease for lease in leases if lease.shard == got.shard)
        try:
            step: Step | Idle | None = first
            while isinstance(step, Step):  # the shard's records, while they come at once
                self._arm(step.taken)
                self._holding[lane] = (lease.shard, step.taken.record_key)
                step = await self.records.handle(lane, lease, step)
        finally:
            self._holding.pop(lane, None)
            self.ownership.end(lane, got.shard)
        if isinstance(step, Idle):  # the acknowledgement looked: nothing due there now
            for shard, due_in_s in step.due_in_s.items():
                self.doorbell.ring_in(shard, due_in_s)
        else:
            self.doorbell.ring(got.shard)  # where there was one record there may be more
        return True

    def _arm(self, taken: Taken) -> None:
        """Set the shard's timer by the broker's word on its other records: one due now
        wakes another lane, one that waits gets its wake-up (a timer the shard had for a
        later time is brought forward)."""
        due_in_s = taken.next_due_in_s
        if due_in_s is None:
            return
        if due_in_s <= 0:
            self.doorbell.ring(taken.shard)
        else:
            self.doorbell.ring_in(taken.shard, due_in_s)
