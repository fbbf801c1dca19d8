"""Lanes: the coroutines of a worker process that take shard messages and apply them.

A lane takes one message at a time from a shard this worker owns, into that shard's
in-flight slot (never two of one shard: the take script refuses while the slot is full
and a local mark keeps other lanes of the process off the shard), applies it, and only
then acknowledges it. ``lanes`` of them work on different shards at once, all on one
event loop in one thread of the process: a lane waiting for an ``async def`` task or an
HTTP forward holds no thread, and a blocking call (a store transaction, a Redis script,
a plain ``def`` handler or task) runs in the ``lane_threads`` threads of
:mod:`keylane.workers.blocking`. So a process keeps hundreds of records in flight with a
handful of threads.

What a lane does with a message it cannot finish:

* store or Redis unavailable: leave it in flight, back off, take it again (order kept);
* lease lost or fence refused: drop the shard, leave the message for the next owner;
* handler raised: count the delivery, back off, try again; after ``max_deliveries``
  starts (crashes included) the event becomes a ``poison`` dead letter and the shard
  moves on;
* bytes that are not a keylane task: a ``malformed`` dead letter, and move on;
* an event for a destination that must wait (throttled, paused, backing off after a
  failed call): leave it in flight, take back its delivery count, back off that shard
  only (:mod:`keylane.workers.dispatch`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import sentry_sdk
from pydantic import ValidationError

from ..routing.contract.errors import BrokerUnavailable, StaleFence, StoreUnavailable
from ..routing.contract.events import Event
from ..routing.contract.faults import Faults
from ..routing.contract.logcontext import event_context
from ..routing.contract.message import MalformedMessage, TaskMessage, parse_message
from ..routing.contract.settings import Settings
from ..routing.contract.sources import SourceConfig, Sources
from ..routing.router import APPLY_TASK, UNHOLD_TASK
from .alerts import alert_dead_letter
from .apply import (
    ApplyResult,
    SourceHandler,
    apply_events,
    dead_letter,
)
from .blocking import BlockingPool
from .dispatch import Dispatcher, Wait
from .doorbell import Doorbell
from .gateway import Ack, LaneGateway, Lease, Taken
from .group_commit import GroupCommit
from .ownership import Ownership
from .stores.base import DeadLetterDraft, DeadLetterFilter, Fence, Record, Store

log = logging.getLogger("keylane.lanes")

#: Called after each acknowledged event: (task id, event, result, seconds it took).
ResultCallback = Callable[[str, Event, ApplyResult, float], None]

MAX_BACKOFF_S = 5.0
#: Shards offered to one take: bounds the take script's cost whatever a worker owns.
TAKE_WINDOW = 16


@dataclass(frozen=True)
class Step:
    """A message for a lane to handle. When it was taken as the shard's previous message
    was acknowledged (one blocking call for the acknowledgement, the take and the read),
    also the message as parsed and its record as read right after the take: the first
    attempt's fresh read."""

    taken: Taken
    message: TaskMessage | None = None
    record: Record | None = None


@dataclass(frozen=True)
class Queued:
    """A message taken from a shard queue, and the event it carries."""

    raw: bytes
    event: Event
    task_id: str


class Lanes:
    """The lanes of one worker process: an event loop in its own thread."""

    def __init__(
        self,
        settings: Settings,
        gateway: LaneGateway,
        ownership: Ownership,
        sources: Sources,
        store_factory: Callable[[], Store],
        faults: Faults,
        on_result: ResultCallback | None = None,
        dispatcher: Dispatcher | None = None,
    ) -> None:
        self.settings = settings
        self.dispatcher = dispatcher or Dispatcher(settings, gateway, {})
        self.gateway = gateway
        self.ownership = ownership
        self.sources = sources
        self.faults = faults
        self.io = BlockingPool(settings.lane_threads, store_factory)
        self.commits = GroupCommit(self.io)
        self._on_result = on_result
        self._handlers: dict[str, SourceHandler | None] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.doorbell = Doorbell(gateway, ownership.owns)
        # A shard that was just acquired may hold a restored message: look there first.
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
        """Let each lane finish its message, then stop."""
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
        lanes = [asyncio.create_task(self._lane(), name=f"lane-{n}") for n in range(count)]
        poker = asyncio.create_task(self._poke())
        await asyncio.gather(*lanes, return_exceptions=True)
        poker.cancel()
        await self.dispatcher.aclose()

    async def _poke(self) -> None:
        """Every ``idle_poll_ms``, one idle lane looks at every shard (see the doorbell)."""
        while True:
            await asyncio.sleep(self.settings.idle_poll_ms / 1000)
            self.doorbell.poke()

    async def _lane(self) -> None:
        # Each lane its own Sentry isolation scope (a task's own copy of the context):
        # breadcrumbs and tags of one lane's events never end up on another lane's error.
        with sentry_sdk.isolation_scope():
            while not self._stop.is_set():
                try:
                    if not await self._step():
                        await self.doorbell.wait()
                except StoreUnavailable as exc:
                    log.warning("store unavailable: %s", exc)
                    await self._pause(1.0)
                except BrokerUnavailable as exc:
                    log.warning("Redis unavailable: %s", exc)
                    await self._pause(1.0)
                except Exception:
                    log.exception("lane error")
                    await self._pause(1.0)

    async def _pause(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._stop.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(min(0.1, seconds))

    async def _step(self) -> bool:
        """Take and handle one message; False when there was nothing to take.

        The shards offered to the take script are reserved first (no other lane of this
        process can take from them meanwhile), at most ``TAKE_WINDOW`` at a time: the
        rung ones first, then the others in rotation.
        """
        hints = self.doorbell.hints()
        leases = self.ownership.reserve(hints, TAKE_WINDOW)
        if not leases:
            return False
        taken = None
        try:
            taken = await self.io.call(self.gateway.take, leases)
        finally:
            for lease in leases:
                if taken is None or lease.shard != taken.shard:
                    self.ownership.end(lease.shard)
        if taken is None:
            return False
        # The take serves the first shard of the window that has a message: the rung
        # shards after it (waits that ended together) were not looked at, and are rung
        # again for another lane rather than forgotten.
        looked_at = [lease.shard for lease in leases].index(taken.shard)
        for lease in leases[looked_at + 1 :]:
            if lease.shard in hints:
                self.doorbell.ring(lease.shard)
        lease = next(lease for lease in leases if lease.shard == taken.shard)
        try:
            step: Step | None = Step(taken)
            while step is not None:  # the shard's messages, while they come at once
                step = await self._handle(lease, step)
        finally:
            self.ownership.end(taken.shard)
        self.doorbell.ring(taken.shard)  # where there was one message there may be more
        return True

    async def _handle(self, lease: Lease, step: Step) -> Step | None:
        """Handle one message; the shard's next one when it was taken with the ack."""
        taken = step.taken
        try:
            message = step.message or parse_message(taken.raw)
            if message.task_name == UNHOLD_TASK:
                await self._unhold(lease, taken, message.kwargs)
                return None
            if message.task_name != APPLY_TASK:
                raise MalformedMessage(f"unexpected task {message.task_name!r}")
            event = Event.model_validate(message.kwargs.get("event"))
        except (MalformedMessage, ValidationError, KeyError, TypeError, ValueError) as exc:
            await self._malformed(lease, taken, str(exc))
            return None
        batch = [Queued(taken.raw, event, message.task_id)]
        if taken.batch:
            batch += self._followers(taken, event)
            rest = taken.batch[len(batch) - 1 :]
            if rest:  # left in flight, to be taken one by one
                await self.io.call(self.gateway.uncount_delivery, lease.shard, *rest)
        context = {
            "source": event.source,
            "event_id": event.event_id,
            "record_key": event.record_key,
            "shard": lease.shard,
            "attempt": taken.deliveries,
        }
        if len(batch) > 1:
            context["batch"] = len(batch)
        with event_context(**context):
            return await self._route(lease, taken, batch, step.record)

    def _followers(self, taken: Taken, first: Event) -> list[Queued]:
        """The messages taken behind ``first`` that may be applied (or sent to a batch
        task) together with it: its record's next events, while they parse and the source
        (or the task) still takes that many."""
        if first.retry_of is not None or first.review is not None:
            return []
        if first.destination is not None:
            limit = self.dispatcher.batch_limit(first.destination)
        else:
            source = self.sources.get(first.source)
            limit = 1 if source is None else source.batch_limit(self.settings)
        out: list[Queued] = []
        for raw in taken.batch[: limit - 1]:
            try:
                message = parse_message(raw)
                event = Event.model_validate(message.kwargs.get("event"))
            except (MalformedMessage, ValidationError, TypeError, ValueError):
                break
            same = (event.source, event.record_key, event.destination) == (
                first.source,
                first.record_key,
                first.destination,
            )
            if not same or event.retry_of or event.review:
                break
            out.append(Queued(raw, event, message.task_id))
        return out

    async def _route(
        self, lease: Lease, taken: Taken, batch: list[Queued], record: Record | None
    ) -> Step | None:
        event = batch[0].event
        if taken.any_held or event.retry_of is not None:
            verdict = await self.io.call(
                self.gateway.park, lease, taken.raw, event.record_key, event.retry_of
            )
            if verdict == "parked":
                log.info(
                    "parked %s/%s: %s is held behind an open dead letter",
                    event.source,
                    event.event_id,
                    event.record_key,
                )
                return None
            if verdict == "lost":
                self.ownership.lost(lease, "lease changed before the message could be parked")
                return None
        return await self._apply(lease, taken, batch, record)

    async def _unhold(self, lease: Lease, taken: Taken, kwargs: dict[str, object]) -> None:
        record_key = str(kwargs["record_key"])
        dead_letter_id = int(str(kwargs["dead_letter_id"]))
        released = await self.io.call(
            self.gateway.unhold_key, lease, taken.raw, record_key, dead_letter_id
        )
        if released < 0:
            self.ownership.lost(lease, "lease changed before a release could run")
        else:
            log.info(
                "released %s (dead letter %s): %s parked event(s) go next",
                record_key,
                dead_letter_id,
                released,
            )

    async def _apply(
        self, lease: Lease, taken: Taken, batch: list[Queued], record: Record | None
    ) -> Step | None:
        """Apply the batch, acknowledge what was done; the shard's next message when the
        lane may go on with it at once (taken and read with the acknowledgement)."""
        first = batch[0]
        ref = f"{first.event.source}/{first.event.event_id}"
        deliveries = taken.deliveries
        followers = [queued.raw for queued in batch[1:]]
        started = time.monotonic()
        try:
            results = await self._outcome(lease, taken, batch, record)
        except StaleFence as exc:
            log.warning("write of %s refused, the shard has a newer owner: %s", ref, exc)
            self.ownership.lost(lease, str(exc))
            return None
        except StoreUnavailable:
            # an outage is not the events' fault
            await self.io.call(self.gateway.uncount_delivery, lease.shard, taken.raw, *followers)
            self.ownership.back_off(lease.shard, 1.0)
            raise
        except Exception as exc:
            log.exception("handler error on %s (delivery %s)", ref, deliveries)
            sentry_sdk.capture_exception(exc)
            error = f"{type(exc).__name__}: {exc}"
            await self.io.call(self.gateway.note_failure, lease.shard, taken.raw, error)
            if followers:  # they go again one by one, behind the first
                await self.io.call(self.gateway.uncount_delivery, lease.shard, *followers)
            self.ownership.back_off(lease.shard, min(MAX_BACKOFF_S, 0.05 * 2**deliveries))
            return None
        if results is None:
            return None  # the lease ran out before the write: the next owner takes it on
        if isinstance(results, Wait):  # waiting is not a failure
            if results.requeue:  # a batch: taken together again, with what came meanwhile
                await self.io.call(self.gateway.requeue, lease, [q.raw for q in batch])
            else:
                await self.io.call(self.gateway.uncount_delivery, lease.shard, taken.raw)
            self.ownership.back_off(lease.shard, results.seconds)
            # The wait ends on a timer, not when an idle scan happens to reach the shard.
            asyncio.get_running_loop().call_later(results.seconds, self.doorbell.ring, lease.shard)
            return None
        done = list(zip(batch, results, strict=False))
        acks = []
        for queued, result in done:
            await self._after(queued.event, result)
            if self.faults:
                await self.io.call(self.faults.hit, "worker.before_ack", queued.event.record_key)
            applied = result.outcome == "applied"
            latency = max(0.0, time.time() - queued.event.accepted_at) if applied else None
            acks.append(Ack(queued.raw, result.outcome, result.conflicts, result.attempts, latency))
        rest = [queued.raw for queued in batch[len(done) :]]
        step = None
        if not rest and not self._stop.is_set() and self.ownership.keep(lease):
            step = await self.io.store(self._ack_and_take, lease, acks)
        else:
            await self.io.call(self.gateway.ack_all, lease, acks)
            if rest:  # left in flight, to be taken one by one
                await self.io.call(self.gateway.uncount_delivery, lease.shard, *rest)
        if self._on_result is not None:
            runtime = time.monotonic() - started
            for queued, result in done:
                self._on_result(queued.task_id, queued.event, result, runtime)
        return step

    def _ack_and_take(self, store: Store, lease: Lease, acks: list[Ack]) -> Step | None:
        """(In a pool thread.) Acknowledge, take the shard's next message, read its record."""
        taken = self.gateway.ack_all(lease, acks, then_take=True)
        if taken is None:
            return None
        try:
            message = parse_message(taken.raw)
            event = message.kwargs["event"]
            if event.get("destination"):  # its record is not in keylane's store
                return Step(taken, message)
            record = store.read(str(event["record_key"]))
        except (MalformedMessage, StoreUnavailable, KeyError, TypeError, AttributeError):
            return Step(taken)  # the lane parses it again and meets the error there
        return Step(taken, message, record)

    async def _outcome(
        self, lease: Lease, taken: Taken, batch: list[Queued], record: Record | None
    ) -> list[ApplyResult] | Wait | None:
        fence = Fence(lease.shard, lease.token)
        event = batch[0].event
        deliveries = taken.deliveries
        if deliveries > self.settings.max_deliveries:
            # Started this often without finishing: failing every time (handler_error) or
            # killing its worker every time (poison). Record it and let the shard move on.
            last_error = await self.io.call(self.gateway.last_failure, lease.shard, taken.raw)
            reason = "handler_error" if last_error else "poison"
            detail = last_error or "the worker died each time (killed, crashed or stuck)"
            row = await self.io.store(
                dead_letter,
                event,
                fence,
                reason,
                deliveries - 1,
                f"started {deliveries - 1} times without finishing; last: {detail}",
            )
            return [row]
        if not self.ownership.valid(lease):
            return None
        if event.destination is not None:
            return await self.dispatcher.deliver(
                self.io, fence, taken, [queued.event for queued in batch]
            )
        source = self.sources.get(event.source)
        return await apply_events(
            self.io,
            self.commits,
            [queued.event for queued in batch],
            fence,
            source,
            self.settings.max_attempts,
            self.faults,
            self._handler(source),
            self.settings.handler_time_limit_ms / 1000,
            record,
        )

    def _handler(self, source: SourceConfig | None) -> SourceHandler | None:
        if source is None:
            return None
        if source.name not in self._handlers:
            batch_fn = source.load_batch_handler()
            fn = source.load_handler()
            self._handlers[source.name] = (
                SourceHandler(batch_fn, batched=True)
                if batch_fn is not None
                else None
                if fn is None
                else SourceHandler(fn)
            )
        return self._handlers[source.name]

    async def _after(self, event: Event, result: ApplyResult) -> None:
        """Alert on a new dead letter and, for a source whose policy is ``hold``, hold
        the record key behind it (again, when a crash came between the two)."""
        source = self.sources.get(event.source)
        holds = source is not None and source.on_dead_letter == "hold"
        if result.outcome == "dead_lettered":
            alert_dead_letter(event, result)
            if holds and result.reason != "id_reused" and result.dead_letter_id is not None:
                await self.io.call(self.gateway.hold, event.record_key, result.dead_letter_id)
        elif result.outcome == "duplicate" and holds and event.review is None:
            row = await self.io.store(_open_dead_letter, event)
            if row is not None:
                await self.io.call(self.gateway.hold, event.record_key, row)

    async def _malformed(self, lease: Lease, taken: Taken, error: str) -> None:
        digest = hashlib.sha256(taken.raw).hexdigest()
        draft = DeadLetterDraft(
            source="",
            event_id=f"sha256:{digest}",
            record_key="",
            shard=lease.shard,
            reason="malformed",
            event={"raw": taken.raw[:4096].decode("utf-8", "replace")},
            attempted_change={},
            revision_read=None,
            revision_found=None,
            attempts=1,
            error=error[:2000],
        )
        fence = Fence(lease.shard, lease.token)
        try:
            await self.io.store(_commit_dead_letter, draft, fence)
        except StaleFence as exc:
            self.ownership.lost(lease, str(exc))
            return
        await self.io.call(self.gateway.ack, lease, taken.raw, "dead_lettered")


def _open_dead_letter(store: Store, event: Event) -> int | None:
    """The open dead letter of ``event`` when the journal closed it as dead-lettered."""
    entry = store.journal(event.source, event.event_id)
    if entry is None or entry.outcome != "dead_lettered":
        return None
    rows = store.dead_letters(
        DeadLetterFilter(statuses=("open",), sources=(event.source,), record_key=event.record_key)
    )
    return next((row.id for row in rows if row.event_id == event.event_id), None)


def _commit_dead_letter(store: Store, draft: DeadLetterDraft, fence: Fence) -> int:
    return store.commit_dead_letter(draft, fence, close_event=False)
